"""Terminating events: located crossings, which condition wins, saved output after the
event, gradients of the event time, vmap, and bad input."""

import math

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx
import pytest

import odesolve as ode

HEIGHT = 10.0
PID = ode.PIDController(rtol=1e-8, atol=1e-8)


def falling(t, y, g):
    """Height and velocity of a body falling under gravity g."""
    return jnp.stack([y[1], -g])


def height(t, y, args, **kwargs):
    return y[0]


def drop(g, event, saveat=ode.SaveAt(t1=True), **kwargs):
    kwargs.setdefault("stepsize_controller", PID)
    return ode.diffeqsolve(
        ode.ODETerm(falling),
        ode.Tsit5(),
        0.0,
        kwargs.pop("t1", jnp.inf),
        kwargs.pop("dt0", 0.1),
        jnp.array([HEIGHT, 0.0]),
        g,
        event=event,
        saveat=saveat,
        **kwargs,
    )


def landing_time(g):
    return math.sqrt(2 * HEIGHT / g)


def test_falling_body_stops_at_the_ground():
    sol = drop(9.81, ode.Event(height))
    assert sol.result == ode.RESULTS.event_occurred
    assert sol.event_mask
    np.testing.assert_allclose(sol.ts[-1], landing_time(9.81), rtol=1e-12)
    np.testing.assert_allclose(sol.t1, landing_time(9.81), rtol=1e-12)
    assert abs(sol.ys[-1, 0]) < 1e-12
    np.testing.assert_allclose(sol.ys[-1, 1], -9.81 * landing_time(9.81), rtol=1e-10)


@pytest.mark.parametrize(
    "adjoint",
    [
        ode.RecursiveCheckpointAdjoint(),
        # Online checkpoints under an event: the composition matrix's, and -m matrix.
        pytest.param(ode.RecursiveCheckpointAdjoint(checkpoints=4), marks=pytest.mark.matrix),
        pytest.param(ode.DirectAdjoint(), marks=pytest.mark.matrix),
    ],
    ids=["taped", "checkpointed", "direct"],
)
def test_event_time_gradient_matches_the_analytic_one(adjoint):
    grad = jax.grad(lambda g: drop(g, ode.Event(height), adjoint=adjoint).ts[-1])(9.81)
    analytic = -0.5 * math.sqrt(2 * HEIGHT) * 9.81**-1.5
    np.testing.assert_allclose(grad, analytic, rtol=1e-9)


def test_event_state_gradient_matches_finite_differences():
    """d(velocity at impact)/dg = -sqrt(2 h / g) / 2 ... checked numerically."""
    speed = lambda g: drop(g, ode.Event(height)).ys[-1, 1]
    eps = 1e-5
    # Arrays, not Python numbers (which a solve fixes in its program): one compilation.
    fd = (speed(jnp.asarray(9.81 + eps)) - speed(jnp.asarray(9.81 - eps))) / (2 * eps)
    grad = jax.grad(speed)(9.81)
    np.testing.assert_allclose(grad, fd, rtol=1e-7)
    np.testing.assert_allclose(grad, -0.5 * math.sqrt(2 * HEIGHT / 9.81), rtol=1e-9)


def test_earliest_crossing_wins_not_pytree_order():
    # Passing 8 m happens before passing 2 m although it is second in the PyTree.
    event = ode.Event(
        {"low": lambda t, y, a, **k: y[0] - 2.0, "high": lambda t, y, a, **k: y[0] - 8.0}
    )
    sol = drop(9.81, event)
    assert sol.event_mask == {"low": False, "high": True} or (
        not sol.event_mask["low"] and sol.event_mask["high"]
    )
    np.testing.assert_allclose(sol.ts[-1], math.sqrt(2 * 2.0 / 9.81), rtol=1e-12)


def test_both_conditions_on_one_step_earliest_wins():
    # One big fixed step crosses both thresholds: the earlier crossing is reported.
    event = ode.Event((lambda t, y, a, **k: y[0] - 2.0, lambda t, y, a, **k: y[0] - 8.0))
    sol = drop(9.81, event, t1=2.0, dt0=2.0, stepsize_controller=ode.ConstantStepSize())
    assert [bool(m) for m in sol.event_mask] == [False, True]
    np.testing.assert_allclose(sol.ts[-1], math.sqrt(2 * 2.0 / 9.81), rtol=1e-12)


def test_event_on_the_first_step():
    sol = drop(9.81, ode.Event(height), dt0=5.0, t1=5.0, stepsize_controller=ode.ConstantStepSize())
    assert sol.stats["num_steps"] == 1
    np.testing.assert_allclose(sol.ts[-1], landing_time(9.81), rtol=1e-12)


def test_event_that_never_fires():
    sol = drop(9.81, ode.Event(lambda t, y, a, **k: y[0] + 1e3), t1=2.0)
    assert sol.result == ode.RESULTS.successful
    assert not sol.event_mask
    assert sol.ts[-1] == 2.0
    np.testing.assert_allclose(sol.ys[-1, 0], HEIGHT - 0.5 * 9.81 * 4.0, rtol=1e-10)


def test_boolean_condition_stops_at_the_end_of_the_step():
    sol = drop(
        9.81,
        ode.Event(lambda t, y, a, **k: y[0] < 5.0),
        t1=2.0,
        dt0=0.25,
        stepsize_controller=ode.ConstantStepSize(),
    )
    crossing = math.sqrt(2 * 5.0 / 9.81)
    assert sol.ts[-1] == 0.25 * math.ceil(crossing / 0.25)
    assert sol.ys[-1, 0] < 5.0


def test_direction_selects_the_crossing():
    # Height rises then falls through 1 m: only the downward crossing counts.
    thrown = lambda t, y, a: jnp.stack([y[1], -9.81 * jnp.ones_like(y[0])])
    solve = lambda direction: ode.diffeqsolve(
        ode.ODETerm(thrown),
        ode.Tsit5(),
        0.0,
        10.0,
        0.05,
        jnp.array([0.0, 10.0]),
        event=ode.Event(lambda t, y, a, **k: y[0] - 1.0, direction=direction),
        stepsize_controller=PID,
    )
    roots = np.roots([-9.81 / 2, 10.0, -1.0])
    np.testing.assert_allclose(solve(None).ts[-1], roots.min(), rtol=1e-10)
    np.testing.assert_allclose(solve(True).ts[-1], roots.min(), rtol=1e-10)
    np.testing.assert_allclose(solve(False).ts[-1], roots.max(), rtol=1e-10)


def test_saved_values_after_the_event_are_inf():
    ts = jnp.linspace(0.0, 3.0, 7)
    sol = drop(9.81, ode.Event(height), saveat=ode.SaveAt(ts=ts, t1=True))
    before = np.asarray(ts) <= landing_time(9.81)
    n = int(before.sum())  # the event's row comes right after them, as in Diffrax
    np.testing.assert_allclose(sol.ys[:n, 0], HEIGHT - 0.5 * 9.81 * ts[before] ** 2)
    np.testing.assert_allclose(sol.ts[n], landing_time(9.81), rtol=1e-12)
    assert np.all(np.isinf(sol.ts[n + 1 :])) and np.all(np.isinf(sol.ys[n + 1 :]))


def test_saved_steps_end_at_the_event():
    sol = drop(9.81, ode.Event(height), saveat=ode.SaveAt(steps=True), max_steps=64)
    count = int(jnp.sum(jnp.isfinite(sol.ts)))
    assert count == sol.stats["num_accepted_steps"]
    np.testing.assert_allclose(sol.ts[count - 1], landing_time(9.81), rtol=1e-12)
    assert np.all(np.diff(sol.ts[:count]) > 0)


def test_dense_output_ends_at_the_event():
    sol = drop(9.81, ode.Event(height), saveat=ode.SaveAt(dense=True, t1=True), max_steps=64)
    np.testing.assert_allclose(sol.t1, landing_time(9.81), rtol=1e-12)
    np.testing.assert_allclose(sol.evaluate(1.0)[0], HEIGHT - 9.81 / 2, rtol=1e-10)


def test_backwards_solve_with_event():
    # Run the fall backwards from the impact: it passed 5 m at t = -T + sqrt(2 * 5 / g).
    impact = jnp.array([0.0, -9.81 * landing_time(9.81)])
    sol = ode.diffeqsolve(
        ode.ODETerm(falling),
        ode.Tsit5(),
        0.0,
        -5.0,
        -0.1,
        impact,
        9.81,
        event=ode.Event(lambda t, y, a, **k: y[0] - 5.0),
        stepsize_controller=PID,
    )
    expected = -landing_time(9.81) + math.sqrt(2 * 5.0 / 9.81)
    np.testing.assert_allclose(sol.ts[-1], expected, rtol=1e-12)


def test_each_sample_stops_at_its_own_time_under_vmap():
    gs = jnp.array([2.0, 9.81, 30.0])
    times = jax.vmap(lambda g: drop(g, ode.Event(height)).ts[-1])(gs)
    np.testing.assert_allclose(times, [landing_time(float(g)) for g in gs], rtol=1e-12)


# Events under vmap(grad) are also in the composition suite's default cases.
@pytest.mark.matrix
def test_each_samples_stop_time_differentiates_under_vmap():
    gs = jnp.array([2.0, 9.81, 30.0])
    grads = jax.vmap(jax.grad(lambda g: drop(g, ode.Event(height)).ts[-1]))(gs)
    np.testing.assert_allclose(grads, -0.5 * math.sqrt(2 * HEIGHT) * gs**-1.5, rtol=1e-9)


def test_condition_closing_over_a_traced_threshold_is_leak_free():
    def stop_time(level):
        event = ode.Event(lambda t, y, a, **k: y[0] - level)
        return drop(9.81, event).ts[-1]

    with jax.checking_leaks():
        value, grad = jax.jit(jax.value_and_grad(stop_time))(4.0)
    fall = HEIGHT - 4.0
    np.testing.assert_allclose(value, math.sqrt(2 * fall / 9.81), rtol=1e-12)
    np.testing.assert_allclose(grad, -1 / (9.81 * math.sqrt(2 * fall / 9.81)), rtol=1e-9)


def test_condition_receives_the_solve_as_keyword_arguments():
    seen = {}

    def cond(t, y, args, *, solver, stepsize_controller, t0, **kwargs):
        seen.update(solver=solver, controller=stepsize_controller)
        return y[0]

    drop(9.81, ode.Event(cond))
    assert isinstance(seen["solver"], ode.Tsit5)
    assert isinstance(seen["controller"], ode.PIDController)


def test_root_finder_tolerance_is_used():
    class Loose:
        rtol, atol = 1e-3, 1e-3

    sol = drop(9.81, ode.Event(height, root_finder=Loose()))
    assert abs(sol.ts[-1] - landing_time(9.81)) < 2e-3


# ---------------------------------------------------------------------- bad input


def test_condition_must_return_a_scalar():
    with pytest.raises(ValueError, match="scalar bool or a scalar float"):
        drop(9.81, ode.Event(lambda t, y, a, **k: y))


def test_event_needs_callables():
    with pytest.raises(TypeError, match="cond_fn"):
        ode.Event(3.0)


def test_direction_structure_must_match():
    with pytest.raises(ValueError, match="direction"):
        ode.Event((height, height), direction=(True,))


def test_backsolve_rejects_events():
    with pytest.raises(ValueError, match="BacksolveAdjoint"):
        drop(9.81, ode.Event(height), t1=3.0, adjoint=ode.BacksolveAdjoint())


def test_infinite_t1_needs_an_event_or_max_steps():
    with pytest.raises(ValueError, match="t1=inf needs an event or an integer max_steps"):
        drop(9.81, None, max_steps=None)


def test_infinite_t1_runs_max_steps_steps():
    # Diffrax's way to take a given number of steps (its maintainer's answer in
    # patrick-kidger/diffrax#737): t1=inf, max_steps=n, throw=False.
    def run(lib, saveat):
        return lib.diffeqsolve(
            lib.ODETerm(lambda t, y, args: -y), lib.Tsit5(), 0.0, jnp.inf, 0.1,
            jnp.array([1.0]), stepsize_controller=lib.PIDController(rtol=1e-6, atol=1e-6),
            saveat=saveat, max_steps=20, throw=False,
        )  # fmt: skip

    for saveat in ("steps",):  # every step's time and state, the last one included
        ours = run(ode, ode.SaveAt(**{saveat: True}))
        theirs = run(diffrax, diffrax.SaveAt(**{saveat: True}))
        assert ours.result == ode.RESULTS.max_steps_reached
        assert int(ours.stats["num_steps"]) == int(theirs.stats["num_steps"]) == 20
        finite = np.isfinite(np.asarray(theirs.ts))
        np.testing.assert_allclose(ours.ts[finite], theirs.ts[finite], rtol=1e-9)
        np.testing.assert_allclose(ours.ys[finite], theirs.ys[finite], rtol=1e-9)
    with pytest.raises(ode.SolveError, match="max_steps_reached"):
        drop(9.81, None, max_steps=16)


def test_event_is_not_reached_within_max_steps():
    sol = drop(9.81, ode.Event(lambda t, y, a, **k: y[1] - 1.0), max_steps=16, throw=False)
    assert sol.result == ode.RESULTS.max_steps_reached


_LANDING_DERIVATIVE = -0.5 * math.sqrt(2 * HEIGHT) * 9.81**-1.5  # d(landing time)/dg


def test_event_time_under_jvp():
    stop = lambda g: drop(g, ode.Event(height), t1=5.0, adjoint=ode.ForwardMode()).ts[-1]
    _, tangent = jax.jvp(stop, (9.81,), (1.0,))
    np.testing.assert_allclose(tangent, _LANDING_DERIVATIVE, rtol=1e-9)


@pytest.mark.matrix  # 9 s, most of it compiling Kvaerno5's gradient
def test_event_time_with_a_stiff_solver():
    stiff = lambda g: ode.diffeqsolve(
        ode.ODETerm(falling),
        ode.Kvaerno5(),
        0.0,
        5.0,
        0.1,
        jnp.array([HEIGHT, 0.0]),
        g,
        event=ode.Event(height),
        stepsize_controller=PID,
    ).ts[-1]
    np.testing.assert_allclose(stiff(9.81), landing_time(9.81), rtol=1e-12)
    np.testing.assert_allclose(jax.grad(stiff)(9.81), _LANDING_DERIVATIVE, rtol=1e-9)


@pytest.mark.matrix  # heavy: runs with -m matrix
def test_an_early_stop_saves_its_final_row_after_the_save_times_reached():
    # As Diffrax writes them: with SaveAt(ts=..., t1=True), the final row comes right
    # after the save times reached, so `ys[n - 1]` (n the finite times) is where a solve
    # stopped by an event or by max_steps (throw=False) ended; under `vmap` each sample
    # at its own row.
    def run(lib, g, **kwargs):
        return lib.diffeqsolve(
            lib.ODETerm(falling), lib.Tsit5(), 0.0, 2.0, 0.01, jnp.array([HEIGHT, 0.0]), g,
            saveat=lib.SaveAt(ts=jnp.linspace(0.0, 2.0, 5), t1=True), throw=False, **kwargs,
        )  # fmt: skip

    newton = optx.Newton(rtol=1e-12, atol=1e-12)  # Diffrax's event time, located
    landing = lambda lib: lib.Event(lambda t, y, args, **kw: y[0], root_finder=newton)
    ours = jax.vmap(lambda g: run(ode, g, event=landing(ode)))(jnp.array([9.81, 20.0]))
    stopped = (run(ode, 9.81, max_steps=3), run(diffrax, 9.81, max_steps=3))
    for i, g in enumerate((9.81, 20.0)):
        landed = jax.tree_util.tree_map(lambda x, i=i: x[i], ours)
        stopped += (landed, run(diffrax, g, event=landing(diffrax)))
    for mine, theirs in zip(stopped[::2], stopped[1::2]):
        np.testing.assert_allclose(mine.ts, theirs.ts, rtol=1e-9)
        np.testing.assert_allclose(mine.ys, theirs.ys, rtol=1e-9, atol=1e-12)
