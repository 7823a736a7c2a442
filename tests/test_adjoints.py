"""Gradients of solves, cross-checked three ways: autodiff through an unrolled loop of
`solver.step` (the discretise-then-optimise gradient, exactly), central finite differences,
and each adjoint against the others; under grad, jacfwd, jvp, hessian, vmap and scan.

Step-size choices are not differentiated (the controller stops their gradient), so for an
adaptive solve the unrolled reference is the same steps taken with fixed sizes.
"""

import contextlib
import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

import odesolve as ode
from odesolve._solver._runge_kutta import StagesInput

EPS = float(np.finfo(np.float64).eps)

PARAMS = jnp.array([1.5, 1.0, 3.0, 1.0])  # (a, b, c, d)
Y0 = jnp.array([1.0, 1.0])
SAVE_TS = (0.25, 0.9, 1.5, 2.2, 3.0)
# Fixed, unequal weights for the loss: a plain sum of squares could hide a wrong sign in a
# symmetric pair of components.
WEIGHTS = 1.0 + jnp.arange(12.0).reshape(6, 2) / 7
PID = ode.PIDController(rtol=1e-8, atol=1e-8)
MAX_STEPS = 256


def lotka_volterra(t, y, p):
    x, z = y[0], y[1]
    return jnp.stack([p[0] * x - p[1] * x * z, -p[2] * z + p[3] * x * z])


def lotka_volterra_dict(t, y, args):
    a, b, c, d = args
    x, z = y["prey"], y["predator"]
    return {"prey": a * x - b * x * z, "predator": -c * z + d * x * z}


def relative_error(got, want) -> float:
    got, want = ravel_pytree(got)[0], ravel_pytree(want)[0]
    return float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want))


def central_differences(f, x):
    """Derivatives of f: (n,) -> (...) along each coordinate of x by central differences,
    step sqrt(eps) scaled: shape (..., n)."""
    x = np.asarray(x, dtype=np.float64)
    columns = []
    for i in range(x.size):
        h = np.sqrt(EPS) * max(1.0, abs(x[i]))
        up, down = x.copy(), x.copy()
        up[i] += h
        down[i] -= h
        columns.append(
            (np.asarray(f(jnp.asarray(up))) - np.asarray(f(jnp.asarray(down)))) / (2 * h)
        )
    return np.stack(columns, axis=-1)


@contextlib.contextmanager
def checking_leaks():
    """`jax.checking_leaks()`, starting from empty JAX caches. The leak checker runs a full
    garbage collection after every trace, whose cost grows with everything earlier tests
    left cached (several times slower by the end of the suite)."""
    jax.clear_caches()
    with jax.checking_leaks():
        yield


# --------------------------------------------------------------- unrolled reference


@functools.cache
def _reference_pieces(solver):
    """One step of `solver` and its dense output, each jitted once (they are called per
    step from the Python loop below; the loop itself is unrolled by `jax.grad`)."""
    tableau = solver.tableau

    @jax.jit
    def step(t, h, y, k, p):
        given = StagesInput(
            vf=lotka_volterra, t0=t, h=h, y0=y, k0=k, args=p, with_error=False, context=None
        )
        return solver.stages(given)

    @jax.jit
    def interpolate(y, h, theta, stages):
        weights = [sum(c * theta ** (j + 1) for j, c in enumerate(row)) for row in tableau.interp]
        return y + h * sum(w * k for w, k in zip(weights, stages))

    return step, interpolate


def unrolled(solver, step_ends, y0, p, save_ts=(), t0=0.0):
    """(ys at save_ts, y at the last step end) for Lotka-Volterra, by applying
    `solver.stages` over the given steps in a Python loop: y0 and p are differentiable."""
    step, interpolate = _reference_pieces(solver)
    t, y, k = t0, y0, lotka_volterra(t0, y0, p)
    pending, saved = list(save_ts), []
    for t_end in step_ends:
        h = t_end - t
        result = step(t, h, y, k, p)
        while pending and pending[0] <= t_end:  # save times in (t, t_end]
            saved.append(interpolate(y, h, (pending.pop(0) - t) / h, result.ks))
        t, y = t_end, result.y1
        k = result.ks[-1] if solver.tableau.fsal else lotka_volterra(t, y, p)
    assert not pending
    return (jnp.stack(saved) if saved else None), y


def constant_step_ends(t0, t1, n):
    """Where `ConstantStepSize` ends its steps: t0 + (t1 - t0) (k / n), then t1."""
    return [t0 + (t1 - t0) * (k / n) for k in range(1, n)] + [t1]


def _pid_solve(y0, p, adjoint, saveat, max_steps=MAX_STEPS):
    """Lotka-Volterra on [0, 3], Tsit5, PID 1e-8, dt0 chosen by the controller."""
    return ode.diffeqsolve(
        ode.ODETerm(lotka_volterra),
        ode.Tsit5(),
        0.0,
        3.0,
        None,
        y0,
        p,
        saveat=saveat,
        stepsize_controller=PID,
        adjoint=adjoint,
        max_steps=max_steps,
    )


@pytest.fixture(scope="module")
def pid_reference():
    """Accepted step ends of the adaptive solve, and the unrolled gradient of the loss."""
    sol = _pid_solve(Y0, PARAMS, ode.ForwardMode(), ode.SaveAt(steps=True))
    ends = [float(t) for t in sol.ts if np.isfinite(t)]
    assert len(ends) > 30 and ends[-1] == 3.0

    def loss(y0, p):
        ys, y1 = unrolled(ode.Tsit5(), ends, y0, p, SAVE_TS)
        return jnp.sum(WEIGHTS * jnp.concatenate([ys, y1[None]]))

    value, grads = jax.value_and_grad(loss, argnums=(0, 1))(Y0, PARAMS)
    return value, grads


ADAPTIVE_ADJOINTS = {
    "default": ode.RecursiveCheckpointAdjoint(),  # tapes every step
    "online-4": ode.RecursiveCheckpointAdjoint(checkpoints=4),  # n unknown: online
    # Online slots that never thin (bound 261 ticks, ~40 taken): reversed from the
    # residuals kept beside each state, nothing recomputed.
    "online-200": ode.RecursiveCheckpointAdjoint(checkpoints=200),
    "direct": ode.DirectAdjoint(),
}


def _pid_loss(y0, p, adjoint, max_steps=MAX_STEPS):
    """The loss of the adaptive solve that `pid_reference` unrolls."""
    sol = _pid_solve(y0, p, adjoint, ode.SaveAt(ts=jnp.array(SAVE_TS), t1=True), max_steps)
    return jnp.sum(WEIGHTS * sol.ys)


# Online slots that never thin are reversed as a tape, as "default" is: with -m matrix.
# DirectAdjoint's gradients, and thinning online slots' (`online` with 3 checkpoints),
# are also in the composition suite: these with -m matrix too.
_ADAPTIVE_CASES = [
    pytest.param(name, marks=pytest.mark.matrix)
    if name in ("online-200", "online-4", "direct")
    else name
    for name in ADAPTIVE_ADJOINTS
]


@pytest.mark.parametrize("name", _ADAPTIVE_CASES)
def test_adaptive_gradient_matches_unrolled_loop(name, pid_reference):
    loss = functools.partial(_pid_loss, adjoint=ADAPTIVE_ADJOINTS[name])
    ref_value, ref_grads = pid_reference
    value, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(Y0, PARAMS)
    assert abs(float(value - ref_value)) <= 1e-12 * abs(float(ref_value))
    assert relative_error(grads, ref_grads) <= 1e-10


# Covered by the composition matrix (test_composition.py); kept for -m matrix.
@pytest.mark.matrix
@pytest.mark.parametrize(
    "checkpoints", [None, 200, 4], ids=["tape", "online-slots", "online-recompute"]
)
def test_gradient_through_a_field_with_branches_matches_direct(checkpoints):
    # A field with a comparison (a boolean residual on the tape) and a clipped rate.
    def field(t, y, p):
        rate = jnp.where(y > 0.5, p[0] * y, p[1] * jnp.sin(y))
        return jnp.clip(rate, -3.0, 3.0) - p[2] * y * jnp.cos(t)

    def loss(p, adjoint):
        sol = ode.diffeqsolve(
            ode.ODETerm(field),
            ode.Tsit5(),
            0.0,
            2.0,
            0.05,
            jnp.array([0.3, 1.2, -0.4]),
            p,
            saveat=ode.SaveAt(ts=jnp.linspace(0.1, 2.0, 7)),
            stepsize_controller=PID,
            adjoint=adjoint,
            max_steps=MAX_STEPS,
        )
        return jnp.sum(sol.ys**2)

    p = jnp.array([0.8, -0.6, 0.3])
    adjoint = ode.RecursiveCheckpointAdjoint(checkpoints=checkpoints)
    grad = jax.jit(jax.grad(lambda p: loss(p, adjoint)))(p)
    direct = jax.grad(lambda p: loss(p, ode.DirectAdjoint()))(p)
    assert relative_error(grad, direct) <= 1e-10


def _constant_steps_loss(n, adjoint):
    """Weighted y(3) of n constant Tsit5 steps on [0, 3], as a function of (y0, p), and
    its reference: the same steps unrolled in Python."""

    def loss(y0, p):
        sol = ode.diffeqsolve(
            ode.ODETerm(lotka_volterra),
            ode.Tsit5(),
            0.0,
            3.0,
            3.0 / n,
            y0,
            p,
            adjoint=adjoint,
            max_steps=n,
        )
        return jnp.sum(WEIGHTS[-1] * sol.ys[-1])

    def reference(y0, p):
        return jnp.sum(
            WEIGHTS[-1] * unrolled(ode.Tsit5(), constant_step_ends(0.0, 3.0, n), y0, p)[1]
        )

    return loss, reference


def test_revolve_gradient_matches_unrolled_loop():
    # Fixed steps and static times: the binomial schedule, recomputing.
    loss, reference = _constant_steps_loss(20, ode.RecursiveCheckpointAdjoint(checkpoints=3))
    grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(Y0, PARAMS)
    ref = jax.grad(reference, argnums=(0, 1))(Y0, PARAMS)
    assert relative_error(grads, ref) <= 1e-10


def test_direct_adjoint_under_vmap_runs_the_ticks_its_slowest_sample_takes():
    # Adaptive steps, max_steps 4,096: the gradients of a batch of two solves of a few
    # dozen steps, saved at 3 times, evaluate the field for the blocks of 64 ticks the
    # slowest sample reaches (forward, and again in reverse), not for every tick of the
    # bound; and they are the exact solution's, to the tolerance.
    calls = []

    def field(t, y, k):
        jax.debug.callback(lambda: calls.append(1))
        return -k * y

    ts = jnp.array([1.0, 2.0, 3.0])

    def loss(k):
        sol = ode.diffeqsolve(
            ode.ODETerm(field), ode.Tsit5(), 0.0, 3.0, 0.1, jnp.array([1.0, 2.0]), k,
            stepsize_controller=ode.PIDController(rtol=1e-8, atol=1e-8),
            saveat=ode.SaveAt(ts=ts), adjoint=ode.DirectAdjoint(),
        )  # fmt: skip
        return jnp.sum(sol.ys**2), sol.stats["num_steps"]

    ks = jnp.array([0.5, 2.0])
    grads, steps = jax.jit(jax.vmap(jax.grad(loss, has_aux=True)))(ks)
    jax.effects_barrier()
    assert 0 < int(steps.max()) < 64
    assert len(calls) <= 2 * 2 * 7 * 64  # two samples, twice, 7 evaluations a tick
    exact = lambda k: jnp.sum(5.0 * -2 * ts * jnp.exp(-2 * k * ts))
    assert relative_error(grads, jax.vmap(exact)(ks)) <= 1e-6


@pytest.mark.parametrize(
    "lengths",
    [
        pytest.param((6,), marks=pytest.mark.matrix),  # 10 s
        pytest.param((8, 3), marks=pytest.mark.matrix),
        pytest.param((12, 4, 2), marks=pytest.mark.matrix),
    ],
    ids=["1-level", "2", "3"],
)
def test_nested_segments_gradient_matches_unrolled_loop(lengths):
    """Nested segments (the default adjoint's choice for a known step count when taping
    does not fit), one to three levels, on a count no level divides; under jit, and
    under vmap with a shared and a per-sample parameter."""
    n = 23
    adjoint = ode.RecursiveCheckpointAdjoint(schedule=ode.Nested(lengths=lengths))
    loss, reference = _constant_steps_loss(n, adjoint)
    direct = _constant_steps_loss(n, ode.DirectAdjoint())[0]

    with checking_leaks():
        grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(Y0, PARAMS)
    assert relative_error(grads, jax.grad(reference, argnums=(0, 1))(Y0, PARAMS)) <= 1e-10
    y0s = Y0 * jnp.array([[1.0], [1.3], [0.7]])
    batch = lambda f: lambda p, y0s: jnp.sum(jax.vmap(lambda y0: f(y0, p))(y0s))
    got = jax.jit(jax.grad(batch(loss), argnums=(0, 1)))(PARAMS, y0s)
    want = jax.grad(batch(direct), argnums=(0, 1))(PARAMS, y0s)
    assert relative_error(got, want) <= 1e-10
    if len(lengths) == 2:  # forward over reverse: the nested sweeps under jvp

        def hvp(f):
            grad = jax.grad(lambda p: f(Y0, p))
            return jax.jit(lambda p, v: jax.jvp(grad, (p,), (v,))[1])(PARAMS, jnp.ones(4))

        assert relative_error(hvp(loss), hvp(direct)) <= 1e-9


@pytest.mark.parametrize(
    "length, starts",
    [
        pytest.param(3, None, marks=pytest.mark.matrix),
        # Thinned segments run in the suite in test_decision_record.py (a longer solve).
        pytest.param(3, 2, marks=pytest.mark.matrix),
        (100, None),
    ],
    ids=["re-taped", "thinned", "one-segment"],
)
def test_taped_segments_gradient_matches_unrolled_loop(length, starts, pid_reference):
    """Taped segments (the default adjoint's choice for adaptive steps when a tape of the
    bound does not fit): segments of 3 ticks, every one but the last run again from its
    state with the step sizes replayed; the same with only 2 states kept, thinned as the
    solve runs, so that most segments are first reached by bare steps from an earlier
    state; and one segment holding the whole solve. Under jit with leak checks; thinned,
    also under vmap (each sample thinning its own states: the re-taping is the same
    without); re-taped, also forward over reverse."""
    schedule = ode.Segments(length=length, starts=starts)
    adjoint = ode.RecursiveCheckpointAdjoint(schedule=schedule)
    value_and_grad = jax.jit(jax.value_and_grad(_pid_loss, argnums=(0, 1)), static_argnums=2)
    with checking_leaks():
        value, grads = value_and_grad(Y0, PARAMS, adjoint)
    ref_value, ref_grads = pid_reference
    assert abs(float(value - ref_value)) <= 1e-12 * abs(float(ref_value))
    assert relative_error(grads, ref_grads) <= 1e-10
    if length != 3:
        return
    if starts is not None:
        # Under vmap the samples end at different ticks, and each thins its own states;
        # the rates are shared (summed over the batch), the initial states per sample.
        # The per-sample gradients reuse the executable compiled above.
        y0s = Y0 * jnp.array([[1.0], [1.3], [0.7]])
        per_sample = [value_and_grad(y0, PARAMS, adjoint)[1] for y0 in y0s]
        batch_loss = lambda y0s, p: jnp.sum(jax.vmap(lambda y0: _pid_loss(y0, p, adjoint))(y0s))
        by_sample, shared = jax.jit(jax.grad(batch_loss, argnums=(0, 1)))(y0s, PARAMS)
        assert relative_error(shared, sum(g[1] for g in per_sample)) <= 1e-10
        assert relative_error(by_sample, jnp.stack([g[0] for g in per_sample])) <= 1e-10
        return
    # Forward over reverse (the re-taping loop under jvp), against central differences
    # of the gradient (float64, step 1e-5; the differences see the controller's
    # discrete choices move, about 1e-6).
    v, eps = jnp.ones(4), 1e-5
    grad = jax.grad(lambda p: _pid_loss(Y0, p, adjoint))
    hvp = jax.jit(lambda p: jax.jvp(grad, (p,), (v,))[1])(PARAMS)
    g = lambda p: value_and_grad(Y0, p, adjoint)[1][1]
    assert relative_error(hvp, (g(PARAMS + eps * v) - g(PARAMS - eps * v)) / (2 * eps)) <= 1e-5


# Traced twice (11 s); `test_schedules.py` checks the default's choice by direct calls.
@pytest.mark.matrix
def test_default_adjoint_tapes_segments_when_the_bound_does_not_fit(monkeypatch):
    """16 vmapped adaptive solves with max_steps=4096: a tape of the bound would need
    more than the 4 MiB budget, so the default adjoint tapes segments; with
    max_steps=256 the tape fits. (Traced, not compiled: the gradients through segments
    are checked above.)"""
    chosen = []
    fit = ode.Segments.fit
    monkeypatch.setattr(
        ode.Segments, "fit", classmethod(lambda cls, *a: chosen.append(fit(*a)) or chosen[-1])
    )
    batch = PARAMS * jnp.linspace(0.8, 1.2, 16)[:, None]
    adjoint = ode.RecursiveCheckpointAdjoint()

    def loss(batch, max_steps):
        losses = jax.vmap(lambda p: _pid_loss(Y0, p, adjoint, max_steps))(batch)
        return jnp.sum(losses)

    jax.jit(jax.grad(loss), static_argnums=1).lower(batch, 4096)
    assert chosen and all(isinstance(c, ode.Segments) for c in chosen)
    # The longest segments that fit: far more than this solve's ~50 ticks.
    assert 50 < chosen[0].length < 4096
    count = len(chosen)
    jax.jit(jax.grad(loss), static_argnums=1).lower(batch, MAX_STEPS)
    assert len(chosen) == count


def test_pytree_state_gradient_matches_unrolled_loop():
    n = 20
    y0 = {"prey": jnp.asarray(1.0), "predator": jnp.asarray(1.0)}
    args = tuple(PARAMS)

    def loss(y0, args):
        sol = ode.diffeqsolve(
            ode.ODETerm(lotka_volterra_dict),
            ode.Tsit5(),
            0.0,
            3.0,
            3.0 / n,
            y0,
            args,
            saveat=ode.SaveAt(ts=jnp.array(SAVE_TS)),
            max_steps=n,
        )
        return jnp.sum(WEIGHTS[:5, 0] * sol.ys["prey"] + WEIGHTS[:5, 1] * sol.ys["predator"])

    def reference(y0_flat, p):
        ys, _ = unrolled(ode.Tsit5(), constant_step_ends(0.0, 3.0, n), y0_flat, p, SAVE_TS)
        return jnp.sum(WEIGHTS[:5] * ys)

    g_y0, g_args = jax.jit(jax.grad(loss, argnums=(0, 1)))(y0, args)
    r_y0, r_p = jax.grad(reference, argnums=(0, 1))(Y0, PARAMS)
    got = (jnp.stack([g_y0["prey"], g_y0["predator"]]), jnp.stack(g_args))
    assert relative_error(got, (r_y0, r_p)) <= 1e-10


# --------------------------------------------------------------- finite differences

# 3 / dt0 = 40.5, so 41 equal steps; perturbing t0 or t1 by ~1e-8 keeps 41 steps.
FD_DT0 = 3.0 / 40.5


def _fixed_step_loss(y0, p, t0, t1):
    sol = ode.diffeqsolve(
        ode.ODETerm(lotka_volterra), ode.Tsit5(), t0, t1, FD_DT0, y0, p, max_steps=64
    )
    return jnp.sum(WEIGHTS[-1] * sol.ys[-1])


def test_finite_differences_for_y0_args_t0_and_t1():
    t0, t1 = jnp.asarray(0.0), jnp.asarray(3.0)
    grads = jax.jit(jax.grad(_fixed_step_loss, argnums=(0, 1, 2, 3)))(Y0, PARAMS, t0, t1)
    flat_loss = jax.jit(lambda x: _fixed_step_loss(x[:2], x[2:6], x[6], x[7]))
    fd = central_differences(flat_loss, jnp.concatenate([Y0, PARAMS, jnp.stack([t0, t1])]))
    got = np.concatenate([np.ravel(g) for g in grads])
    assert np.all(np.abs(fd[6:]) > 0.1)  # the time derivatives are not trivially zero
    np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-6 * np.max(np.abs(fd)))


# ------------------------------------------------- parameters inside the vector field


class MLPField(eqx.Module):
    mlp: eqx.nn.MLP

    def __call__(self, t, y, args):
        return self.mlp(y) - y


def _heun_solve(field, y0, adjoint):
    sol = ode.diffeqsolve(
        ode.ODETerm(field),
        ode.Heun(),
        0.0,
        1.0,
        0.1,
        y0,
        saveat=ode.SaveAt(ts=jnp.array([0.5, 1.0])),
        adjoint=adjoint,
        max_steps=16,
    )
    return jnp.sum(jnp.array([[1.0, -2.0], [0.5, 3.0]]) * sol.ys)


def _check_against_direct_and_fd(loss, params):
    """loss(params, adjoint): default adjoint vs DirectAdjoint vs central differences."""
    grad_default = jax.jit(jax.grad(lambda x: loss(x, ode.RecursiveCheckpointAdjoint())))(params)
    grad_direct = jax.jit(jax.grad(lambda x: loss(x, ode.DirectAdjoint())))(params)
    assert relative_error(grad_default, grad_direct) <= 1e-10
    flat, unflatten = ravel_pytree(params)
    fd = central_differences(jax.jit(lambda x: loss(unflatten(x), ode.ForwardMode())), flat)
    got = np.asarray(ravel_pytree(grad_default)[0])
    assert np.max(np.abs(fd)) > 1e-2
    np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-6 * np.max(np.abs(fd)))


# A Module field's gradient runs in the suite in test_composition.py (module cases).
@pytest.mark.matrix
def test_gradient_wrt_module_vector_field():
    mlp = eqx.nn.MLP(2, 2, width_size=4, depth=1, activation=jnp.tanh, key=jax.random.PRNGKey(0))
    field = MLPField(mlp)
    assert ravel_pytree(eqx.filter(field, eqx.is_array))[0].dtype == jnp.float64

    def loss(params, adjoint):
        return _heun_solve(eqx.combine(params, static), jnp.array([0.5, -1.0]), adjoint)

    params, static = eqx.partition(field, eqx.is_array)
    _check_against_direct_and_fd(loss, params)


# A closure's gradient runs in the suite in test_composition.py (closure cases).
@pytest.mark.matrix
def test_gradient_wrt_array_the_vector_field_closes_over():
    def loss(w, adjoint):
        def field(t, y, args):  # a closure over w, which is traced here
            return jnp.tanh(w @ y) - 0.5 * y

        return _heun_solve(field, jnp.array([0.5, -1.0]), adjoint)

    w = jnp.array([[0.3, -1.2], [0.8, 0.1]])
    _check_against_direct_and_fd(loss, w)


# --------------------------------------------------------------- jit and vmap


def _vmap_loss(p, adjoint):
    sol = ode.diffeqsolve(
        ode.ODETerm(lotka_volterra),
        ode.Heun(),
        0.0,
        3.0,
        None,
        Y0,
        p,
        stepsize_controller=ode.PIDController(rtol=1e-3, atol=1e-3),
        adjoint=adjoint,
        max_steps=MAX_STEPS,
    )
    return jnp.sum(WEIGHTS[-1] * sol.ys[-1]), sol.stats["num_steps"]


# Covered by the composition matrix (test_composition.py); kept for -m matrix.
@pytest.mark.matrix
def test_vmap_of_grad_and_grad_of_vmap_match_per_sample():
    batch = PARAMS * jnp.array([[1.0], [1.2], [0.8]])
    default = ode.RecursiveCheckpointAdjoint()
    online = ode.RecursiveCheckpointAdjoint(checkpoints=4)
    with checking_leaks():
        one = jax.jit(jax.grad(lambda p: _vmap_loss(p, default), has_aux=True))
        per_sample = [one(p) for p in batch]
        vmapped, steps = jax.jit(
            jax.vmap(jax.grad(lambda p: _vmap_loss(p, default), has_aux=True))
        )(batch)
        through_vmap = jax.jit(
            jax.grad(lambda b: jnp.sum(jax.vmap(lambda p: _vmap_loss(p, online)[0])(b)))
        )(batch)
    expected = jnp.stack([g for g, _ in per_sample])
    # Each sample took its own steps.
    assert len({int(s) for _, s in per_sample}) == 3
    np.testing.assert_array_equal(steps, [int(s) for _, s in per_sample])
    assert relative_error(vmapped, expected) <= 1e-10
    assert relative_error(through_vmap, expected) <= 1e-10


def _scaled_loss(shared, scale, y0, adjoint):
    """`shared` (the LV rates) is the same for every sample of a vmap; `scale` and `y0`
    may be per sample. Saves at several times, so the sweeps have emits as well."""
    field = lambda t, y, args: args[1] * lotka_volterra(t, y, args[0])
    sol = ode.diffeqsolve(
        ode.ODETerm(field),
        ode.Tsit5(),
        0.0,
        3.0,
        0.1,
        y0,
        (shared, scale),
        saveat=ode.SaveAt(ts=jnp.linspace(0.5, 3.0, 6)),
        stepsize_controller=ode.PIDController(rtol=1e-6, atol=1e-6),
        adjoint=adjoint,
        max_steps=MAX_STEPS,
    )
    return jnp.sum(sol.ys**2)


# Covered by the composition matrix (test_composition.py); kept for -m matrix.
@pytest.mark.matrix
@pytest.mark.parametrize("checkpoints", [None, 4], ids=["tape", "online-recompute"])
def test_shared_parameters_under_vmap_get_the_sum_of_per_sample_gradients(checkpoints):
    """A parameter shared by a vmap's samples gets its cotangent summed over the batch
    inside the reverse sweep; one that is batched must not be summed. Both in one field,
    with the sweep taping (under one and two nested vmaps) and recomputing."""
    adjoint = ode.RecursiveCheckpointAdjoint(checkpoints=checkpoints)
    y0s = Y0 * jnp.array([[1.0], [1.3], [0.7], [1.1]])
    scales = jnp.array([1.0, 0.9, 1.1, 1.05])
    grad = jax.jit(jax.grad(lambda *a: _scaled_loss(*a, adjoint), argnums=(0, 1)))
    per_sample = [grad(PARAMS, s, y0) for s, y0 in zip(scales, y0s)]
    want_shared = sum(g[0] for g in per_sample)
    want_scales = jnp.stack([g[1] for g in per_sample])

    def batch_loss(shared, scales, y0s):
        losses = jax.vmap(_scaled_loss, (None, 0, 0, None))(shared, scales, y0s, adjoint)
        return jnp.sum(losses)

    def nested_loss(shared, scales, y0s):
        inner = jax.vmap(_scaled_loss, (None, 0, 0, None))
        outer = jax.vmap(inner, (None, 0, 0, None))
        return jnp.sum(outer(shared, scales.reshape(2, 2), y0s.reshape(2, 2, 2), adjoint))

    # Nested vmaps on the taping sweep only: the recomputing one compiles slowly.
    for loss in (batch_loss, nested_loss) if checkpoints is None else (batch_loss,):
        shared, by_sample = jax.jit(jax.grad(loss, argnums=(0, 1)))(PARAMS, scales, y0s)
        assert relative_error(shared, want_shared) <= 1e-10, loss.__name__
        assert relative_error(by_sample, want_scales) <= 1e-10, loss.__name__


@pytest.mark.matrix  # batched outputs and gradients, every output, stay in the suite
def test_outputs_that_read_shared_parameters_under_vmap_taping_and_recomputing():
    """A state saved after every step through a function of the shared rates
    (`SaveAt(steps=True, fn=...)`), so that the emits read the parameters: their
    cotangents are taken per sample, the steps' for the batch at once; both sweeps'
    sums over the batch equal the sum of per-sample gradients."""

    def loss(p, y0, adjoint):
        sol = ode.diffeqsolve(
            ode.ODETerm(lotka_volterra),
            ode.Heun(),
            0.0,
            2.0,
            0.1,
            y0,
            p,
            saveat=ode.SaveAt(steps=True, fn=lambda t, y, p: y * p[0] + p[3]),
            adjoint=adjoint,
            max_steps=32,
        )
        return jnp.sum(jnp.where(jnp.isfinite(sol.ys), sol.ys, 0.0) ** 2)

    y0s = Y0 * jnp.array([[1.0], [1.2], [0.8]])
    tape, online = ode.RecursiveCheckpointAdjoint(), ode.RecursiveCheckpointAdjoint(checkpoints=2)
    grad = jax.jit(jax.grad(loss), static_argnums=2)
    want = sum(grad(PARAMS, y0, tape) for y0 in y0s)
    batch = lambda p, adjoint: jnp.sum(jax.vmap(lambda y0: loss(p, y0, adjoint))(y0s))
    for adjoint in (tape, online):
        got = jax.jit(jax.grad(batch), static_argnums=1)(PARAMS, adjoint)
        assert relative_error(got, want) <= 1e-10


# --------------------------------------------------------------- forward mode, Hessians

JAC_TS = jnp.array([1.0, 2.0])


def _outputs(theta, adjoint):
    """Heun, 20 fixed steps: ys at two times as a (4,) vector of (y0, params) = theta."""
    sol = ode.diffeqsolve(
        ode.ODETerm(lotka_volterra),
        ode.Heun(),
        0.0,
        2.0,
        0.1,
        theta[:2],
        theta[2:],
        saveat=ode.SaveAt(ts=JAC_TS),
        adjoint=adjoint,
        max_steps=32,
    )
    return sol.ys.ravel()


THETA = jnp.concatenate([Y0, PARAMS])


@pytest.fixture(scope="module")
def reverse_jacobian():
    return jax.jit(jax.jacrev(lambda x: _outputs(x, ode.RecursiveCheckpointAdjoint())))(THETA)


@pytest.mark.parametrize(
    "adjoint", [ode.ForwardMode(), ode.DirectAdjoint()], ids=["forward", "direct"]
)
def test_forward_mode_matches_reverse_jacobian(adjoint, reverse_jacobian):
    assert reverse_jacobian.shape == (4, 6)
    tangent = jnp.array([1.0, -0.5, 0.25, 2.0, -1.0, 0.75])
    outputs = lambda x: _outputs(x, adjoint)  # noqa: E731
    _, jvp = jax.jit(lambda v: jax.jvp(outputs, (THETA,), (v,)))(tangent)
    assert relative_error(jvp, reverse_jacobian @ tangent) <= 1e-10
    jacobian = jax.jit(jax.jacfwd(outputs))(THETA)
    assert relative_error(jacobian, reverse_jacobian) <= 1e-10


# Covered by the composition matrix (test_composition.py); kept for -m matrix.
@pytest.mark.matrix
@pytest.mark.parametrize("checkpoints", [None, 4], ids=["tape", "online-recompute"])
def test_hessian_vector_product_under_vmap_through_the_checkpointed_adjoint(checkpoints):
    """Forward over reverse: the checkpointed sweeps (and their batch sums) are
    differentiated in forward mode, under vmap, and agree with DirectAdjoint."""
    y0s = Y0 * jnp.array([[1.0], [1.2]])

    def loss(p, adjoint):
        def final(y0):
            sol = ode.diffeqsolve(
                ode.ODETerm(lotka_volterra),
                ode.Tsit5(),
                0.0,
                2.0,
                0.1,
                y0,
                p,
                stepsize_controller=PID,
                adjoint=adjoint,
                max_steps=256,
            )
            return sol.ys[-1]

        return jnp.sum(jax.vmap(final)(y0s) ** 2)

    def hvp(adjoint):
        grad = jax.grad(lambda p: loss(p, adjoint))
        return jax.jit(lambda p, v: jax.jvp(grad, (p,), (v,))[1])(PARAMS, jnp.ones(4))

    got = hvp(ode.RecursiveCheckpointAdjoint(checkpoints=checkpoints))
    assert relative_error(got, hvp(ode.DirectAdjoint())) <= 1e-9


# Forward over reverse through DirectAdjoint is also the composition suite's default
# `direct-jvp(grad)` case.
@pytest.mark.matrix
def test_hessian_through_direct_adjoint():
    def loss(theta):
        return jnp.sum(jnp.array([1.0, -2.0, 0.5, 3.0]) * _outputs(theta, ode.DirectAdjoint()) ** 2)

    hessian = jax.jit(jax.hessian(loss))(THETA)
    assert hessian.shape == (6, 6)
    assert float(jnp.max(jnp.abs(hessian - hessian.T))) <= 1e-10 * float(jnp.max(jnp.abs(hessian)))
    fd = central_differences(jax.jit(jax.grad(loss)), THETA)  # fd[i, j] = d g_i / d x_j
    np.testing.assert_allclose(hessian, fd, rtol=1e-5, atol=1e-6 * np.max(np.abs(fd)))


def _relaxation_loss(rates, adjoint):
    """sum of y(1)^2 for dy/dt = -a y + b, y(0) = (1, 2): (a, b) = rates."""
    sol = ode.diffeqsolve(
        ode.ODETerm(lambda t, y, r: -r[0] * y + r[1]),
        ode.Tsit5(),
        0.0,
        1.0,
        0.1,
        jnp.array([1.0, 2.0]),
        rates,
        stepsize_controller=ode.PIDController(rtol=1e-10, atol=1e-10),
        adjoint=adjoint,
    )
    return jnp.sum(sol.ys[-1] ** 2)


def _relaxation_exact(rates):
    a, b = rates
    return jnp.sum(((jnp.array([1.0, 2.0]) - b / a) * jnp.exp(-a) + b / a) ** 2)


def test_backsolve_gradient_differentiated_in_reverse_mode():
    """grad of grad through the adjoint ODE, its two solves run by the adjoint it is
    given, against the Hessian of the closed-form solution."""
    rates = jnp.array([0.7, 0.3])
    adjoint = ode.BacksolveAdjoint(adjoint=ode.RecursiveCheckpointAdjoint())
    loss = functools.partial(_relaxation_loss, adjoint=adjoint)
    got = jax.jit(jax.grad(lambda r: jax.grad(loss)(r)[0]))(rates)
    np.testing.assert_allclose(got, jax.hessian(_relaxation_exact)(rates)[0], rtol=1e-7)


@pytest.mark.matrix
@pytest.mark.parametrize(
    "nested",
    [ode.RecursiveCheckpointAdjoint(), ode.DirectAdjoint()],
    ids=["checkpointed", "direct"],
)
def test_backsolve_gradient_jacobian_in_reverse_mode(nested):
    rates = jnp.array([0.7, 0.3])
    loss = functools.partial(_relaxation_loss, adjoint=ode.BacksolveAdjoint(adjoint=nested))
    got = jax.jit(jax.jacrev(jax.grad(loss)))(rates)
    np.testing.assert_allclose(got, jax.hessian(_relaxation_exact)(rates), rtol=1e-7)


def test_backsolve_gradient_names_how_to_differentiate_it_in_reverse_mode():
    """Its default differentiates the gradient in forward mode: reverse over reverse is
    refused with a message naming BacksolveAdjoint's `adjoint`, not JAX's `while_loop`."""
    loss = functools.partial(_relaxation_loss, adjoint=ode.BacksolveAdjoint())
    rates = jnp.array([0.7, 0.3])
    hessian = jax.jit(jax.hessian(loss))(rates)  # forward over reverse: what it is for
    np.testing.assert_allclose(hessian, jax.hessian(_relaxation_exact)(rates), rtol=1e-7)
    with pytest.raises(RuntimeError, match=r"BacksolveAdjoint\(adjoint=DirectAdjoint\(\)\)"):
        jax.grad(lambda r: jax.grad(loss)(r)[0])(rates)
    # Given a reverse-only adjoint, forward over reverse is what it cannot do.
    reverse = ode.BacksolveAdjoint(adjoint=ode.RecursiveCheckpointAdjoint())
    pattern = r"adjoint=BacksolveAdjoint\(adjoint=RecursiveCheckpointAdjoint\(\)\).*jax.hessian"
    with pytest.raises(TypeError, match=pattern):
        jax.hessian(functools.partial(_relaxation_loss, adjoint=reverse))(rates)


# --------------------------------------------------------------- custom JVPs, scan


# Covered by the composition matrix (test_composition.py); kept for -m matrix.
@pytest.mark.matrix
def test_custom_jvp_field_with_symbolic_zero_tangents_under_scan():
    seen = []  # (x tangent is None, w tangent is None), recorded at trace time

    @eqx.filter_custom_jvp
    def squash(x, w):
        return jnp.tanh(w * x)

    @squash.def_jvp
    def squash_jvp(primals, tangents):
        (x, w), (tx, tw) = primals, tangents
        seen.append((tx is None, tw is None))
        out = jnp.tanh(w * x)
        slope = 1 - out**2
        t_out = jnp.zeros_like(out)
        if tx is not None:
            t_out = t_out + slope * w * tx
        if tw is not None:
            t_out = t_out + slope * x * tw
        return out, t_out

    width = jnp.array([2.0, 0.5])  # the second argument, never differentiated by the user

    def train(adjoint):
        # A field of its own for each adjoint: a solve keeps the trace of a field it has
        # seen, and the rule is called only when the field is traced.
        def field(t, y, k):
            return -k * squash(y, width)

        def loss(k, y0, adjoint):
            sol = ode.diffeqsolve(
                ode.ODETerm(field), ode.Heun(), 0.0, 1.0, 0.1, y0, k, adjoint=adjoint,
                max_steps=16,
            )  # fmt: skip
            return jnp.sum(sol.ys[-1] ** 2)

        def body(k, y0):
            g = jax.grad(loss)(k, y0, adjoint)
            return k - 0.1 * g, g

        return jax.jit(lambda k, batch: jax.lax.scan(body, k, batch))

    batch = jnp.array([[1.0, -1.0], [0.5, 2.0], [-0.3, 0.7]])
    k0 = jnp.asarray(1.3)
    with checking_leaks():
        seen.clear()
        k_default, g_default = train(ode.RecursiveCheckpointAdjoint())(k0, batch)
        assert seen  # the rule was used by the reverse sweep
        seen.clear()
        k_direct, g_direct = train(ode.DirectAdjoint())(k0, batch)
        # Differentiating through the scan, JAX passes w's tangent as a symbolic zero.
        assert (False, True) in seen
    assert relative_error(g_default, g_direct) <= 1e-10
    assert relative_error(k_default, k_direct) <= 1e-12
    assert np.all(np.abs(np.asarray(g_default)) > 1e-2)


# --------------------------------------------------------------- memory


def temp_bytes(n, adjoint, controller=None):
    """XLA's temporary buffers for d sum(y(t1)^2) / d params over n steps of 10 / n (or
    up to n adaptive steps), compiled, never run."""

    def loss(p):
        sol = ode.diffeqsolve(
            ode.ODETerm(lotka_volterra),
            ode.Tsit5(),
            0.0,
            10.0,
            10.0 / n,
            Y0,
            p,
            stepsize_controller=controller or ode.ConstantStepSize(),
            adjoint=adjoint,
            max_steps=n,
        )
        return jnp.sum(sol.ys[-1] ** 2)

    analysis = jax.jit(jax.grad(loss)).lower(PARAMS).compile().memory_analysis()
    if analysis is None:
        pytest.skip("this backend gives no memory analysis")
    return analysis.temp_size_in_bytes


@pytest.mark.matrix  # a memory budget's bound on a gradient stays in the suite
def test_checkpointed_memory_grows_sublinearly():
    fixed = ode.RecursiveCheckpointAdjoint(checkpoints=64)
    checkpointed = {n: temp_bytes(n, fixed) for n in (1_000, 100_000)}
    assert checkpointed[100_000] / checkpointed[1_000] < 10, checkpointed  # 100x the steps
    taped = {n: temp_bytes(n, ode.RecursiveCheckpointAdjoint()) for n in (1_000, 10_000)}
    assert taped[10_000] / taped[1_000] > 5, taped  # one state per step
    assert checkpointed[1_000] < taped[1_000]


def test_a_memory_budget_bounds_a_known_step_count_gradient():
    # Too small to tape: nested segments, whose memory hardly grows with the step count.
    budget = ode.RecursiveCheckpointAdjoint(memory_budget=16 * 2**10)
    within = {n: temp_bytes(n, budget) for n in (1_000, 100_000)}
    assert max(within.values()) <= 24 * 2**10, within  # the budget plus XLA's scalars
    assert within[1_000] < temp_bytes(1_000, ode.RecursiveCheckpointAdjoint()) / 4


@pytest.mark.parametrize(
    "controller",
    [pytest.param(None, marks=pytest.mark.matrix), pytest.param(PID, marks=pytest.mark.matrix)],
    ids=["revolve", "online"],  # 9 s each
)
def test_each_checkpoint_is_stored_once(controller):
    """An extra checkpoint costs what an extra taped state costs: one stored carry. (A
    `cond` around a sweep that writes to the slots used to make XLA copy them: twice
    that.) An adaptive step's carry is larger than a fixed step's by its controller's
    state (where the next step ends, its verdict, the accepted steps): 181 bytes here
    against the fixed-step state's 128."""
    tape = ode.RecursiveCheckpointAdjoint()  # 2000 states fit the default budget
    per_state = (temp_bytes(2_000, tape) - temp_bytes(1_000, tape)) / 1_000
    few, many = (ode.RecursiveCheckpointAdjoint(checkpoints=c) for c in (40, 80))
    per_checkpoint = (temp_bytes(1_000, many, controller) - temp_bytes(1_000, few, controller)) / 40
    larger_carry = 1.0 if controller is None else 1.45
    assert per_checkpoint < 1.25 * larger_carry * per_state, (per_checkpoint, per_state)


# --------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "adjoint, words",
    [
        (ode.RecursiveCheckpointAdjoint(), "max_steps"),
        # DirectAdjoint runs an unbounded loop forward (as Diffrax's does: forward mode
        # works, see test_accepted_inputs.py); JAX refuses its reverse mode.
        (ode.DirectAdjoint(), "Reverse-mode differentiation does not work for lax.while_loop"),
    ],
    ids=["default", "direct"],
)
def test_reverse_mode_without_max_steps_is_a_clear_error(adjoint, words):
    def loss(p):
        sol = ode.diffeqsolve(
            ode.ODETerm(lotka_volterra),
            ode.Tsit5(),
            0.0,
            1.0,
            None,
            Y0,
            p,
            stepsize_controller=PID,
            adjoint=adjoint,
            max_steps=None,
        )
        return jnp.sum(sol.ys)

    with pytest.raises(ValueError, match=words):
        jax.grad(loss)(PARAMS)


@pytest.mark.matrix  # every output under vmap: 9 s
def test_batched_outputs_and_gradients_match_per_sample_with_every_output():
    """Under vmap the loops run in lockstep (samples emit at different ticks, and
    finished samples write scratch rows only): every kind of output and its gradient
    must equal the per-sample solve."""
    saveat = ode.SaveAt(ts=jnp.array(SAVE_TS), steps=True, dense=True)

    def outputs(p):
        sol = ode.diffeqsolve(
            ode.ODETerm(lotka_volterra),
            ode.Tsit5(),
            0.0,
            3.0,
            0.1,
            Y0,
            p,
            saveat=saveat,
            stepsize_controller=PID,
            max_steps=MAX_STEPS,
        )
        finite = lambda x: jnp.where(jnp.isfinite(x), x, 0.0)
        return finite(sol.ys), finite(sol.ts), sol.evaluate(jnp.array([0.5, 2.5]))

    def loss(p):
        return jnp.sum(outputs(p)[0] ** 2)

    batch = PARAMS * jnp.array([[1.3], [0.7]])
    batched = jax.jit(jax.vmap(outputs))(batch)
    grads = jax.jit(jax.vmap(jax.grad(loss)))(batch)
    one_outputs, one_grad = jax.jit(outputs), jax.jit(jax.grad(loss))
    # Equal up to rounding: the batched loop steps inside a `cond` (skipped in a round
    # where no sample steps), which XLA compiles and rounds a little differently; the
    # gradients of these outputs differ as much (1.5e-10 seen).
    for i, p in enumerate(batch):
        for got, want in zip(batched, one_outputs(p)):
            np.testing.assert_allclose(got[i], want, rtol=5e-9, atol=1e-10)  # 6e-10 seen
        assert relative_error(grads[i], one_grad(p)) <= 5e-9


def decay_past_a_jump(y0, rate, jump=1.0, adjoint=ode.RecursiveCheckpointAdjoint()):
    """y(2) of y' = -rate y, with `jump` declared in `jump_ts` (f is smooth there: the
    gradient is that of exp(-2 rate) y0 whatever the jump does to the steps)."""
    return ode.diffeqsolve(
        ode.ODETerm(lambda t, y, a: -a * y),
        ode.Tsit5(),
        0.0,
        2.0,
        0.1,
        y0,
        rate,
        adjoint=adjoint,
        saveat=ode.SaveAt(ts=jnp.linspace(0.0, 2.0, 5)),
        stepsize_controller=ode.PIDController(rtol=1e-8, atol=1e-8, jump_ts=jnp.array([jump])),
        max_steps=256,
    ).ys[-1]


@pytest.mark.parametrize(
    "adjoint",
    [
        # tapes every step (with -m matrix: the default adjoint's jump times run in the
        # suite in test_composition.py, pid_jump)
        pytest.param(ode.RecursiveCheckpointAdjoint(), marks=pytest.mark.matrix),
        ode.RecursiveCheckpointAdjoint(memory_budget=2048),  # taped segments
        # online slots, whose rows are packed as the tape's (with -m matrix)
        pytest.param(ode.RecursiveCheckpointAdjoint(checkpoints=3), marks=pytest.mark.matrix),
    ],
    ids=["tape", "segments", "online"],
)
@pytest.mark.parametrize(
    "jump", [1.0, pytest.param(5.0, marks=pytest.mark.matrix)], ids=["jump-inside", "jump-outside"]
)
def test_gradients_with_jump_ts(adjoint, jump):
    """With `jump_ts` the step re-evaluates f after a jump (a `cond` on a carried flag).
    The reverse sweep is handed that flag as a Python bool: the step's residual layout
    must not treat the `cond`'s branch as a constant there, or the sweeps pack their
    tape rows differently (the gradient came out 0.87 or 1.0 for exp(-2))."""
    y_end = functools.partial(decay_past_a_jump, jump=jump, adjoint=adjoint)
    grads = jax.grad(y_end, argnums=(0, 1))(1.0, 1.0)
    np.testing.assert_allclose(grads, [np.exp(-2.0), -2.0 * np.exp(-2.0)], rtol=1e-7)


def test_gradients_with_jump_ts_of_a_vmapped_solve():
    """`vmap` directly around the solve (the samples stepped in lockstep) under `grad`:
    the jump's re-evaluation must be transposable when batched."""
    loss = lambda y0s, rate: jnp.sum(jax.vmap(decay_past_a_jump, in_axes=(0, None))(y0s, rate))
    y0s = jnp.array([1.0, 2.0])
    d_y0s, d_rate = jax.grad(loss, argnums=(0, 1))(y0s, 1.0)
    np.testing.assert_allclose(d_y0s, np.exp(-2.0) * np.ones(2), rtol=1e-7)
    np.testing.assert_allclose(d_rate, -2.0 * np.exp(-2.0) * 3.0, rtol=1e-7)
