"""Inputs Diffrax accepts and solves: each gives Diffrax's answer here too, against Diffrax
itself or a closed form (each was once refused, or solved differently)."""

import warnings

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odesolve as ode

Y0 = jnp.array([1.0, 2.0])


def decay(lib, **kwargs):
    """y' = -y from t = 0 to 1 with `lib` (odesolve or Diffrax)."""
    arguments = dict(terms=lib.ODETerm(lambda t, y, args: -y), solver=lib.Tsit5(), t0=0.0)
    arguments.update(t1=1.0, dt0=0.1, y0=Y0)
    arguments.update(kwargs)
    return lib.diffeqsolve(**arguments)


def test_a_saveat_of_nothing_returns_the_statistics():
    # `SaveAt()`: a solve for its result and statistics, as in Diffrax.
    pid = dict(stepsize_controller=ode.PIDController(rtol=1e-6, atol=1e-6))
    sol = decay(ode, saveat=ode.SaveAt(), **pid)
    assert sol.ts is None and sol.ys is None
    assert sol.result == ode.RESULTS.successful
    assert int(sol.stats["num_steps"]) == int(decay(ode, **pid).stats["num_steps"])


def test_an_empty_list_of_save_times_saves_none():
    sol = decay(ode, saveat=ode.SaveAt(ts=[], t1=True))
    np.testing.assert_allclose(sol.ys, np.exp(-1.0) * Y0[None], rtol=1e-5)


@pytest.mark.parametrize(
    "ts, step_ts, expected",
    [
        ([0.0, 0.5, 1.0], [0.3], [0.3, 0.5, 1.0]),
        ([0.0, 0.25, 0.5, 0.75, 1.0], [0.5, 0.6], [0.25, 0.5, 0.6, 0.75, 1.0]),
        ([1.0, 0.5, 0.0], [0.3], [0.5, 0.3, 0.0]),
    ],
)
def test_clipping_step_to_times_keeps_every_one_of_them(ts, step_ts, expected):
    controller = ode.ClipStepSizeController(ode.StepTo(ts=jnp.array(ts)), step_ts=step_ts)
    sol = decay(ode, t0=ts[0], t1=ts[-1], dt0=None, stepsize_controller=controller,
                saveat=ode.SaveAt(steps=True))  # fmt: skip
    times = np.asarray(sol.ts)
    np.testing.assert_allclose(times[np.isfinite(times)], expected)


@pytest.mark.parametrize(
    "y0, atol",
    [
        (jnp.ones((3, 2)), jnp.array([1e-6, 1e-3])),
        pytest.param(
            jnp.ones((3, 2)), jnp.array([[1e-6], [1e-3], [1e-4]]), marks=pytest.mark.matrix
        ),
    ],
    ids=["per-column", "per-row"],
)
def test_array_tolerances_broadcast_against_each_leaf(y0, atol):
    # As Diffrax's: rtol + atol |y| per leaf, so an atol of shape (2,) suits a (3, 2) state.
    solve = lambda lib: decay(
        lib, y0=y0, stepsize_controller=lib.PIDController(rtol=1e-5, atol=atol),
        saveat=lib.SaveAt(t1=True),
    )  # fmt: skip
    ours, theirs = solve(ode), solve(diffrax)
    np.testing.assert_allclose(ours.ys, theirs.ys, rtol=1e-5)
    np.testing.assert_allclose(ours.ys[0], np.exp(-1.0) * y0, rtol=1e-5)
    # The per-column tolerance steers the error control: a loose column takes fewer steps.
    loose = decay(ode, y0=y0, stepsize_controller=ode.PIDController(rtol=1e-5, atol=1e-3))
    tight = decay(ode, y0=y0, stepsize_controller=ode.PIDController(rtol=1e-5, atol=1e-6))
    assert int(loose.stats["num_steps"]) <= int(ours.stats["num_steps"])
    assert int(ours.stats["num_steps"]) <= int(tight.stats["num_steps"])


@pytest.mark.parametrize("controller", [None, "pid"])
def test_direct_adjoint_without_a_step_bound_solves_and_runs_forward_mode(controller):
    kwargs = dict(adjoint=ode.DirectAdjoint(), max_steps=None)
    if controller:
        kwargs["stepsize_controller"] = ode.PIDController(rtol=1e-8, atol=1e-8)
    solve = lambda y0: decay(ode, y0=y0, **kwargs).ys[0]
    np.testing.assert_allclose(solve(Y0), np.exp(-1.0) * Y0, rtol=1e-6)
    _, tangent = jax.jvp(solve, (Y0,), (jnp.ones(2),))
    np.testing.assert_allclose(tangent, np.exp(-1.0) * np.ones(2), rtol=1e-6)
    grad = jax.grad(lambda y0: jnp.sum(solve(y0)))
    if controller:
        # Reverse mode through an unbounded loop is refused, as Diffrax's is (JAX's error).
        with pytest.raises(ValueError, match="Reverse-mode differentiation does not work"):
            grad(Y0)
    else:
        # Fixed steps are counted when traced: that count bounds the loop.
        np.testing.assert_allclose(grad(Y0), np.exp(-1.0) * np.ones(2), rtol=1e-6)


@pytest.mark.parametrize(
    "controller, saveat",
    [pytest.param("pid", "ts", marks=pytest.mark.matrix)]  # 18 s: with the others
    + [
        pytest.param(c, s, marks=pytest.mark.matrix)
        for c, s in [("pid", "t1"), ("pid", "steps"), ("constant", "t1"), ("constant", "ts")]
        + [("constant", "steps")]
    ],
)
def test_one_checkpoint_differentiates_exactly(controller, saveat):
    # Diffrax's least count: taken as 2 states, the fewest a schedule here keeps.
    saveat = dict(
        t1=ode.SaveAt(t1=True),
        ts=ode.SaveAt(ts=jnp.linspace(0, 1, 5)),
        steps=ode.SaveAt(steps=True),
    )[saveat]
    kwargs = dict(saveat=saveat, max_steps=64)
    if controller == "pid":
        kwargs["stepsize_controller"] = ode.PIDController(rtol=1e-8, atol=1e-8)

    def loss(rate, checkpoints):
        adjoint = ode.RecursiveCheckpointAdjoint(checkpoints=checkpoints)
        terms = ode.ODETerm(lambda t, y, args: -args * y)
        ys = decay(ode, terms=terms, args=rate, adjoint=adjoint, **kwargs).ys
        return jnp.sum(jnp.where(jnp.isfinite(ys), ys, 0.0))

    one = jax.grad(loss)(1.5, 1)
    np.testing.assert_allclose(one, jax.grad(loss)(1.5, None), rtol=1e-10)
    np.testing.assert_allclose(one, jax.grad(loss)(1.5, 3), rtol=1e-10)


def test_results_where_picks_a_code_per_element_also_inside_jit():
    pick = lambda p: ode.RESULTS.where(p, ode.RESULTS.successful, ode.RESULTS.max_steps_reached)
    assert pick(jnp.array(True)) == ode.RESULTS.successful
    assert int(jax.jit(lambda p: pick(p)._value)(False)) == int(
        diffrax.RESULTS.max_steps_reached._value
    )


def test_an_empty_interval_far_from_zero_returns_y0():
    # No step is taken, so dt0 below the resolution of time there does not matter.
    sol = decay(ode, t0=1e20, t1=1e20, stepsize_controller=ode.PIDController(1e-5, 1e-5))
    np.testing.assert_array_equal(sol.ys[0], Y0)


def test_interpolation_knots_given_as_a_list():
    path = ode.LinearInterpolation([0.0, 0.5, 1.0], jnp.array([0.0, 1.0, 0.0]))
    np.testing.assert_allclose(path.evaluate(0.25), 0.5)


def test_a_rate_that_broadcasts_to_its_state_is_broadcast():
    # A scalar rate for a vector of states (a flow's log-density rate, as generax writes
    # it): Diffrax's steps add it to the state by broadcasting.
    def field(t, y, args):
        x, log_density = y
        return -args * x, -jnp.sum(x)

    def loss(lib, a):
        y0 = (Y0, jnp.zeros(2))
        sol = lib.diffeqsolve(lib.ODETerm(field), lib.Tsit5(), 0.0, 1.0, 0.1, y0, a)
        return jnp.sum(sol.ys[1] ** 2), sol.ys

    gradient = lambda lib: jax.value_and_grad(lambda a: loss(lib, a), has_aux=True)(0.7)
    (_, ys), grad = gradient(ode)
    (_, ref_ys), ref_grad = gradient(diffrax)
    assert ys[1].shape == (1, 2)
    np.testing.assert_allclose(ys[1], ref_ys[1], rtol=1e-12)
    np.testing.assert_allclose(float(grad), float(ref_grad), rtol=1e-12)


@pytest.mark.parametrize(
    "controller",
    [
        lambda ts: ode.StepTo([0.0, *ts, 1.0]),
        lambda ts: ode.PIDController(rtol=1e-6, atol=1e-6, step_ts=list(ts)),
        lambda ts: ode.PIDController(rtol=1e-6, atol=1e-6, jump_ts=list(ts)),
    ],
    ids=["StepTo", "step_ts", "jump_ts"],
)
def test_times_given_as_lists_are_traced_by_filter_jit(controller):
    """As Diffrax makes them, `StepTo(ts)`, `step_ts` and `jump_ts` hold their times as
    arrays, which `eqx.filter_jit` traces: new lists of one length trace the solve once
    (a list held static would compile it again for each value)."""
    traces = []

    @eqx.filter_jit
    def solve(stepsize_controller):
        traces.append(stepsize_controller)
        dt0 = None if isinstance(stepsize_controller, ode.StepTo) else 0.1
        return decay(ode, dt0=dt0, stepsize_controller=stepsize_controller).ys

    for ts in ([0.25, 0.5], [0.3, 0.9]):
        np.testing.assert_allclose(solve(controller(ts))[-1], Y0 * np.exp(-1.0), rtol=1e-3)
    assert len(traces) == 1


# Saving every step and a function of the state, each alone (-m matrix) and together.
@pytest.mark.parametrize(
    "output",
    [
        pytest.param("steps", marks=pytest.mark.matrix),
        pytest.param("fn", marks=pytest.mark.matrix),
        "subs",
    ],
)
def test_args_holding_functions_save_every_step_or_a_function_of_the_state(output):
    # `args` may be any PyTree, as a model passed to the field: an `eqx.nn.MLP` holds its
    # activation functions, which are not arrays. Saving every step or `fn(t, y, args)`
    # once traced `fn` with `args` as an input, and refused them.
    mlp = eqx.nn.MLP(2, 2, 8, 1, activation=jax.nn.softplus, key=jax.random.key(0))
    ts = jnp.linspace(0.0, 1.0, 5)

    def loss(lib, model):
        saveat = {
            "steps": lib.SaveAt(steps=True),
            "fn": lib.SaveAt(ts=ts, fn=lambda t, y, m: m(y)),
            "subs": lib.SaveAt(
                subs=(lib.SubSaveAt(steps=True), lib.SubSaveAt(ts=ts, fn=lambda t, y, m: m(y)))
            ),
        }[output]
        sol = lib.diffeqsolve(
            lib.ODETerm(lambda t, y, m: m(y) - y), lib.Tsit5(), 0.0, 1.0, 0.1, Y0, model,
            saveat=saveat, stepsize_controller=lib.PIDController(rtol=1e-8, atol=1e-8),
            max_steps=64,
        )  # fmt: skip
        leaves = jax.tree_util.tree_leaves(sol.ys)
        return sum(jnp.sum(jnp.where(jnp.isfinite(x), x, 0.0) ** 2) for x in leaves)

    grad = lambda lib: eqx.filter_jit(eqx.filter_value_and_grad(lambda m: loss(lib, m)))(mlp)
    (value, grads), (ref_value, ref_grads) = grad(ode), grad(diffrax)
    np.testing.assert_allclose(value, ref_value, rtol=1e-10)
    for ours, theirs in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(ref_grads)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("adaptive", [False, True])
def test_an_empty_interval_takes_any_dt0(adaptive):
    # No step is taken, so dt0 = 0 points nowhere wrong (Diffrax returns y0).
    pid = dict(stepsize_controller=ode.PIDController(rtol=1e-6, atol=1e-6)) if adaptive else {}
    sol = decay(ode, t0=0.5, t1=0.5, dt0=0.0, **pid)
    np.testing.assert_array_equal(sol.ys, Y0[None])


def test_a_saveat_of_no_subs_saves_nothing():
    ours, theirs = (decay(lib, saveat=lib.SaveAt(subs=[])) for lib in (ode, diffrax))
    assert ours.ys == theirs.ys == [] and ours.ts == theirs.ts == []


def test_the_state_solver_init_returns_starts_a_solve():
    # Diffrax's low-level API's state, (first step, f(t0, y0)), given to diffeqsolve.
    term = ode.ODETerm(lambda t, y, args: -y)
    state = ode.Tsit5().init(term, 0.0, 0.1, Y0, None)
    np.testing.assert_array_equal(decay(ode, solver_state=state).ys, decay(ode).ys)


def test_a_control_term_with_an_ode_solver_is_solved_as_diffrax_solves_it():
    def solve(lib, **kwargs):
        path = lib.LinearInterpolation(ts=jnp.linspace(0.0, 1.0, 5), ys=jnp.linspace(0.0, 2.0, 5))
        return decay(lib, terms=lib.ControlTerm(lambda t, y, args: -y, path), **kwargs).ys

    pid = lambda lib: dict(
        solver=lib.Dopri5(), stepsize_controller=lib.PIDController(rtol=1e-6, atol=1e-6)
    )
    np.testing.assert_allclose(solve(ode), solve(diffrax), rtol=1e-6)
    np.testing.assert_allclose(solve(ode, **pid(ode)), solve(diffrax, **pid(diffrax)), rtol=1e-5)


def test_a_numpy_integer_max_steps_is_an_int():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sol = decay(ode, max_steps=np.int64(100), saveat=ode.SaveAt(steps=True))
    assert sol.ys.shape == (100, 2)


def test_a_control_term_inside_a_multiterm_is_solved_as_diffrax_solves_it():
    def solve(lib):
        path = lib.LinearInterpolation(ts=jnp.linspace(0.0, 1.0, 5), ys=jnp.linspace(0.0, 2.0, 5))
        terms = lib.MultiTerm(
            lib.ODETerm(lambda t, y, a: -y), lib.ControlTerm(lambda t, y, a: -y, path)
        )
        return decay(lib, terms=terms).ys

    np.testing.assert_allclose(solve(ode), solve(diffrax), rtol=1e-6)
    np.testing.assert_allclose(solve(ode), np.exp(-3.0) * Y0[None], rtol=1e-5)
