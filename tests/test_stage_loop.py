"""Explicit stages in a loop, for a field that reads a large state at other positions (a
stencil): which fields loop, and that the loop changes neither the solution, nor the
steps, nor any derivative, each checked against an independent reference."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate
from helpers import EXPLICIT_SOLVERS, equations, solver_id

import odesolve as ode
from odesolve._solver import _stage_loop
from odesolve.bench._test_set import PROBLEMS

# Points of the discretised field, both above the size from which stages loop.
SIZES = {"small": 96, "large": 1536}
# Cases run with the heavy matrices (`-m matrix`), not in the default suite.
_HEAVY = pytest.mark.matrix
N = SIZES["small"]
T1 = 0.05
ARGS = (jnp.asarray(30.0), jnp.asarray(2.0))


def heat(t, y, args):
    """Reaction-diffusion on a periodic grid: the stencil reads each point's neighbours."""
    d, r = args
    return d * (jnp.roll(y, 1) - 2 * y + jnp.roll(y, -1)) + r * y * (1 - y)


def initial(n: int = N):
    x = jnp.linspace(0.0, 1.0, n)
    return jnp.exp(-30 * (x - 0.5) ** 2)


def _loops(field, y, args=ARGS) -> bool:
    return _stage_loop.loops_stages(field, jnp.zeros(()), y, args)


def test_which_fields_loop():
    y = jnp.ones(N)
    assert _loops(heat, y) and _loops(heat, jnp.ones(SIZES["large"]))
    assert not _loops(heat, jnp.ones(8)), "a small state keeps unrolled stages"
    pleiades = PROBLEMS["Pleiades"]
    bodies = lambda t, y, a: jnp.stack(pleiades.rhs(t, y, jnp))
    assert _loops(bodies, jnp.asarray(pleiades.y0)), "each body reads every other"
    assert not _loops(heat, jnp.ones(8192)), "and so does a state of 64 KiB"
    assert _loops(heat, jnp.ones(8192, jnp.float32)), "32 KiB of float32"
    assert not _loops(lambda t, y, a: a[0] * y * (1 - y) - jnp.sin(y), y), "elementwise"
    assert not _loops(lambda t, y, a: jnp.tanh(a @ y), y, jnp.eye(N)), "a matrix product"
    # Slicing the parameters, not the state, reads no element of the state elsewhere.
    assert not _loops(lambda t, y, a: jnp.sum(a[: N // 2]) * y, y, jnp.ones(N))
    assert _loops(lambda t, y, a: y.at[1:].add(-y[:-1]), y), "indexed update"
    assert _loops(lambda t, y, a: jax.jit(heat)(t, y, a), y), "inside a jit"
    scaled = lambda t, y, a: jax.jit(lambda c, y: c * jnp.roll(y, 1))(2.0, y)
    assert _loops(scaled, y), "inside a jit given a number (a literal)"
    branchy = lambda t, y, a: jax.lax.cond(t > 0, heat, lambda t, y, a: -y, t, y, a)
    assert _loops(branchy, y), "inside a cond"


def _solve(solver, y0, adjoint=ode.RecursiveCheckpointAdjoint(), args=ARGS, lib=ode):
    adaptive = solver.adaptive if lib is ode else True
    controller = lib.PIDController(rtol=1e-8, atol=1e-8) if adaptive else lib.ConstantStepSize()
    return lib.diffeqsolve(
        lib.ODETerm(heat), solver, 0.0, T1, 1e-4 if adaptive else T1 / 400, y0, args,
        stepsize_controller=controller, saveat=lib.SaveAt(ts=jnp.linspace(0.0, T1, 5)),
        adjoint=adjoint, max_steps=100_000,
    )  # fmt: skip


@pytest.fixture(scope="module")
def reference():
    d, r = (float(a) for a in ARGS)
    ys = scipy.integrate.solve_ivp(
        lambda t, y: d * (np.roll(y, 1) - 2 * y + np.roll(y, -1)) + r * y * (1 - y),
        (0.0, T1), np.asarray(initial()), method="DOP853", rtol=1e-13, atol=1e-13,
        t_eval=np.linspace(0.0, T1, 5),
    ).y.T  # fmt: skip
    return ys


def _scans(solver, y0) -> int:
    jaxpr = jax.make_jaxpr(lambda y: _solve(solver, y).ys)(y0)
    return sum(e.primitive.name == "scan" for e in equations(jaxpr))


def _unrolled(monkeypatch) -> None:
    """Stages unrolled from here on, traces made before forgotten."""
    monkeypatch.setattr(_stage_loop, "MIN_LOOPED_ELEMENTS", 10**9)
    jax.clear_caches()


def _light(solver) -> bool:
    # One- and two-stage solvers never loop; Bosh3's third order takes the most steps at
    # this tolerance, and its stages loop in the code Tsit5's, Dopri5's and Dopri8's do.
    return len(solver.tableau.a) >= 2 and not isinstance(solver, ode.Bosh3)


@pytest.mark.parametrize(
    "entry",
    [pytest.param(e, marks=() if _light(e[0]) else _HEAVY) for e in EXPLICIT_SOLVERS],
    ids=solver_id,
)
def test_looped_stages_keep_the_solution_and_steps(entry, reference, monkeypatch):
    solver, order = entry
    looped, loops = _solve(solver, initial()), _scans(solver, initial())
    _unrolled(monkeypatch)
    unrolled = _solve(solver, initial())
    if len(solver.tableau.a) > 1:  # two stages or one: nothing worth a loop
        assert _scans(solver, initial()) < loops
    assert int(looped.stats["num_steps"]) == int(unrolled.stats["num_steps"])
    np.testing.assert_allclose(looped.ys, unrolled.ys, rtol=1e-12, atol=1e-14)
    error = float(jnp.max(jnp.abs(looped.ys - reference)))
    assert error < (1e-6 if order >= 3 else 1e-2 if order == 1 else 2e-4), error


def test_the_solve_runs_its_stages_in_a_loop():
    assert _scans(ode.Tsit5(), initial()) > _scans(ode.Tsit5(), initial(8))


def _loss(y0, adjoint=ode.RecursiveCheckpointAdjoint(), lib=ode):
    solver = lib.Tsit5()
    return lambda args: jnp.sum(_solve(solver, y0, adjoint, args, lib).ys ** 2)


@pytest.mark.parametrize(
    "n", [SIZES["small"], pytest.param(SIZES["large"], marks=_HEAVY)], ids=SIZES.keys()
)
def test_gradient_against_diffrax_and_differences(n):
    ours = jax.jit(jax.grad(_loss(initial(n))))(ARGS)
    theirs = jax.grad(_loss(initial(n), diffrax.RecursiveCheckpointAdjoint(), diffrax))(ARGS)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-9)
    loss = _loss(initial(n))
    for i in range(2):
        step = 1e-5 * float(ARGS[i])
        up = tuple(a + step * (j == i) for j, a in enumerate(ARGS))
        down = tuple(a - step * (j == i) for j, a in enumerate(ARGS))
        central = (loss(up) - loss(down)) / (2 * step)
        np.testing.assert_allclose(ours[i], central, rtol=1e-6)


# The default suite runs the smaller state with each adjoint but `DirectAdjoint`;
# `-m matrix` the rest.
@pytest.mark.parametrize(
    "n", [SIZES["small"], pytest.param(SIZES["large"], marks=_HEAVY)], ids=SIZES.keys()
)
@pytest.mark.parametrize(
    "adjoint",
    [
        pytest.param(ode.DirectAdjoint(), marks=_HEAVY),
        # (Its batched backward solves: test_backward_solves_under_vmap_...)
        pytest.param(ode.BacksolveAdjoint(), marks=_HEAVY),
        ode.ForwardMode(),
    ],
    ids=["direct", "backsolve", "forward"],
)
def test_every_adjoint_and_order_agrees(adjoint, n):
    expected = jax.grad(_loss(initial(n)))(ARGS)
    loss = _loss(initial(n), adjoint)
    if isinstance(adjoint, ode.ForwardMode):
        got = jax.jit(jax.jacfwd(loss))(ARGS)
    else:
        got = jax.grad(jax.jit(loss))(ARGS)
    rtol = 1e-5 if isinstance(adjoint, ode.BacksolveAdjoint) else 1e-9
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=rtol)


SCALES = jnp.asarray([0.5, 1.0])  # two samples: initial states s * initial()
RATES = jnp.asarray([1.0, 1.5])  # two samples: reaction rates


def _gradient(scale, rate):
    """One sample's gradient in the parameters (d, r) at r = ARGS[1] * rate, alone: stages
    looped (checked against Diffrax and differences above)."""
    args = (ARGS[0], ARGS[1] * rate)
    return jnp.stack(jax.grad(_loss(scale * initial()))(args))


# Every order users write, each against the looped gradient one sample at a time; under
# `vmap` stages stay unrolled. (name, batched result, [expected per sample] or summed.)
ORDERS = {
    "vmap(grad) shared": lambda: (
        jax.vmap(lambda s: _gradient(s, 1.0))(SCALES),
        [_gradient(s, 1.0) for s in SCALES],
    ),
    "vmap(grad) batched": lambda: (
        jax.vmap(_gradient)(SCALES, RATES),
        [_gradient(s, c) for s, c in zip(SCALES, RATES)],
    ),
    "grad(vmap)": lambda: (
        jnp.stack(jax.grad(lambda a: jnp.sum(_batched_args(a)))(ARGS))[None],
        [sum(_gradient(s, 1.0) for s in SCALES)],
    ),
    "vmap(vmap(grad))": lambda: (
        jax.vmap(jax.vmap(_gradient, (0, None)), (None, 0))(SCALES, RATES).reshape(4, 2),
        [_gradient(s, c) for c in RATES for s in SCALES],
    ),
    "jacrev": lambda: (
        jnp.stack(jax.jacrev(_loss(initial()))(ARGS))[None],
        [_gradient(1.0, 1.0)],
    ),
    "jit(jvp) ForwardMode": lambda: (
        jnp.stack([_jvp(direction) for direction in ((1.0, 0.0), (0.0, 1.0))])[None],
        [_gradient(1.0, 1.0)],
    ),
}


def _batched_args(args):
    return jax.vmap(lambda s: _loss(s * initial())(args))(SCALES)


@jax.jit
def _jvp(direction):
    loss = _loss(initial(), ode.ForwardMode())
    tangent = tuple(jnp.asarray(d, a.dtype) for d, a in zip(direction, ARGS))
    return jax.jvp(loss, (ARGS,), (tangent,))[1]


@pytest.mark.parametrize(
    "order",
    # Batched solves unroll their stages: the orders under `vmap` run with the heavy
    # matrices (test_composition checks every order in the default suite).
    [pytest.param(name, marks=_HEAVY if "vmap" in name else ()) for name in ORDERS],
)
def test_every_transformation_order(order):
    got, expected = ORDERS[order]()
    for k, want in enumerate(expected):
        np.testing.assert_allclose(got[k], want, rtol=1e-9)


@pytest.mark.parametrize(
    "n", [SIZES["small"], pytest.param(SIZES["large"], marks=_HEAVY)], ids=SIZES.keys()
)
def test_second_derivatives_and_leaks(n):
    """Forward over reverse through looped stages, traced with the leak checker on,
    against central differences of the gradient."""
    loss = _loss(initial(n))
    with jax.checking_leaks():
        hessian = jax.jit(jax.hessian(loss))(ARGS)
    gradient = jax.jit(jax.grad(loss))
    scale = max(abs(float(h)) for row in hessian for h in row)
    step = 1e-4
    for i in range(2):
        up = tuple(a + step * float(ARGS[i]) * (j == i) for j, a in enumerate(ARGS))
        down = tuple(a - step * float(ARGS[i]) * (j == i) for j, a in enumerate(ARGS))
        central = [
            (u - d) / (2 * step * float(ARGS[i])) for u, d in zip(gradient(up), gradient(down))
        ]
        for j in range(2):  # (differences of a near-zero entry carry the others' noise)
            np.testing.assert_allclose(hessian[j][i], central[j], rtol=1e-5, atol=1e-7 * scale)


def test_backward_solves_under_vmap_keep_their_stages_unrolled():
    # BacksolveAdjoint's backward solves are traced in the body of a scan over the save
    # times, where the `vmap` around the gradient is not seen; looped there, each stage
    # transposed the batch's stage buffer (a training step of 32 samples took 2.4 times
    # Diffrax's time). Told the batch, they unroll their stages as a batched solve does.
    adjoint = ode.BacksolveAdjoint()
    y0s = jnp.stack([initial(32), 0.9 * initial(32)])
    one = lambda args, y0: jnp.sum(_solve(ode.Tsit5(), y0, adjoint, args).ys ** 2)
    batched_loss = lambda args: jnp.sum(jax.vmap(lambda y0: one(args, y0))(y0s))

    def stage_loops(f) -> int:  # scans over a tableau's rows: (m, m + 1) weights
        loops = lambda e: any(v.aval.shape == (e.params["length"], e.params["length"] + 1)
                              for v in e.invars)  # fmt: skip
        jaxpr = jax.make_jaxpr(jax.grad(f))(ARGS)
        return sum(e.primitive.name == "scan" and loops(e) for e in equations(jaxpr))

    assert stage_loops(lambda args: one(args, y0s[0])) > 0
    assert stage_loops(batched_loss) == 0
    # (The batched gradients, in every transformation order, are checked against
    # references in test_composition.)
