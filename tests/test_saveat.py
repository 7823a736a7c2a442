"""What `SaveAt` returns: layout, padding, t1 handling, agreement with Diffrax (a test-only
reference), save times at the interval's ends and inside one step, backwards solves."""

import functools

import diffrax
import equinox as eqx
import helpers
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odesolve as ode

Y0 = jnp.array([1.0, 1.0])
TOL = 1e-8
ARGS = jnp.asarray(2.0)  # unused by the vector field; seen by SaveAt(fn=...)


def lv_solve(library, saveat, t0=0.0, t1=10.0, max_steps=256):
    """Lotka-Volterra with Tsit5 and PID(rtol = atol = 1e-8) in odesolve or Diffrax."""
    return library.diffeqsolve(
        library.ODETerm(helpers.lotka_volterra),
        library.Tsit5(),
        t0,
        t1,
        0.1 if t1 > t0 else -0.1,
        Y0,
        ARGS,
        saveat=saveat,
        stepsize_controller=library.PIDController(rtol=TOL, atol=TOL),
        max_steps=max_steps,
    )


@functools.cache
def lv_every_step():
    """All accepted steps of the forward solve (saving does not change the steps)."""
    return lv_solve(ode, ode.SaveAt(steps=True))


# Two solves that save differently are two compiled programs, and XLA may fuse (and so
# round) their arithmetic differently. The step-size controller magnifies a last-bit
# difference in the error estimate, so their step times agree to about 1e-10, not bitwise.
ACROSS_PROGRAMS = 1e-9

ORDERED_TS = jnp.array([0.5, 2.0, 7.5])
ORDERED = dict(t0=True, ts=ORDERED_TS, steps=3, t1=True)


@functools.cache
def lv_ordered():
    return lv_solve(ode, ode.SaveAt(**ORDERED))


def assert_same_stats(sol, reference):
    for key in ("num_steps", "num_accepted_steps", "num_rejected_steps", "max_steps"):
        assert int(sol.stats[key]) == int(reference.stats[key]), key


# (steps, t1, max_steps, t0, t1): the forward solve takes 196 accepted steps, so the
# last step is saved by steps=4 but not by 3 or 5. As in Diffrax the output has
# max_steps // steps rows, plus one for t1 when steps does not divide max_steps
# (256 % 3 != 0; 255 % 5 == 0).
STEPS_CASES = [
    pytest.param(3, True, 256, 0.0, 10.0, id="every-3rd-t1-adds-a-row"),
    pytest.param(5, True, 255, 0.0, 10.0, id="every-5th-t1-fits", marks=pytest.mark.matrix),
    pytest.param(4, False, 256, 0.0, 10.0, id="every-4th-ends-on-t1"),
    pytest.param(True, False, 256, 10.0, 0.0, id="backwards"),
]


@pytest.mark.parametrize("steps, t1_flag, max_steps, t0, t1", STEPS_CASES)
def test_saved_steps_match_diffrax(steps, t1_flag, max_steps, t0, t1):
    ours = lv_solve(ode, ode.SaveAt(steps=steps, t1=t1_flag), t0, t1, max_steps)
    theirs = lv_solve(diffrax, diffrax.SaveAt(steps=steps, t1=t1_flag), t0, t1, max_steps)
    assert ours.ts.shape == theirs.ts.shape
    assert ours.ys.shape == theirs.ys.shape
    # The same rows are padding (inf, in both directions of integration), and the written
    # rows agree.
    np.testing.assert_array_equal(np.isinf(ours.ts), np.isinf(theirs.ts))
    np.testing.assert_array_equal(ours.ts[np.isinf(ours.ts)], theirs.ts[np.isinf(theirs.ts)])
    # Step times agree to rounding amplified by step-size control: an error estimate is a
    # difference of nearly equal numbers, so a last-bit difference in evaluation order
    # moves later steps by ~1e-8 relative over a couple of hundred steps.
    np.testing.assert_allclose(ours.ts, theirs.ts, rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(ours.ys, theirs.ys, rtol=1e-7, atol=1e-8)
    assert_same_stats(ours, theirs)


def test_save_ts_match_diffrax():
    ts = jnp.linspace(0.0, 10.0, 21)
    ours = lv_solve(ode, ode.SaveAt(t0=True, ts=ts, t1=True))
    theirs = lv_solve(diffrax, diffrax.SaveAt(t0=True, ts=ts, t1=True))
    np.testing.assert_array_equal(ours.ts, theirs.ts)
    np.testing.assert_allclose(ours.ys, theirs.ys, rtol=1e-8, atol=1e-8)
    assert_same_stats(ours, theirs)


def test_outputs_are_ordered_t0_ts_steps_then_t1():
    sol = lv_ordered()
    step_ts, step_ys = helpers.finite(lv_every_step().ts, lv_every_step().ys)
    every_third = step_ts[2::3]
    assert len(step_ts) % 3 != 0  # so t1 is not among the saved steps
    expected = np.concatenate([[0.0], ORDERED_TS, every_third, [10.0]])
    n = len(expected)
    assert sol.ts.shape == (1 + 3 + 256 // 3 + 1,)
    np.testing.assert_allclose(sol.ts[:n], expected, rtol=ACROSS_PROGRAMS)
    assert np.all(np.isinf(sol.ts[n:])) and np.all(np.isinf(sol.ys[n:]))
    np.testing.assert_array_equal(sol.ys[0], Y0)
    np.testing.assert_allclose(sol.ys[4 : n - 1], step_ys[2::3], rtol=ACROSS_PROGRAMS)
    np.testing.assert_allclose(sol.ys[n - 1], step_ys[-1], rtol=ACROSS_PROGRAMS)


def test_unused_step_rows_are_inf():
    sol = lv_every_step()
    accepted = int(sol.stats["num_accepted_steps"])
    assert sol.ts.shape == (256,) and sol.ys.shape == (256, 2)
    assert np.all(np.isfinite(sol.ts[:accepted])) and np.all(np.isfinite(sol.ys[:accepted]))
    assert np.all(sol.ts[accepted:] == np.inf) and np.all(sol.ys[accepted:] == np.inf)
    assert np.all(np.diff(sol.ts[:accepted]) > 0)
    assert sol.ts[accepted - 1] == 10.0


@pytest.mark.parametrize("t0, t1", [(0.0, 3.0), (3.0, 0.0)])
def test_save_times_a_stopped_solve_did_not_reach_are_inf(t0, t1):
    """max_steps reached with throw=False: the save times after the last step are unused
    rows, inf in ts as in ys (as Diffrax pads them); the reached ones are kept."""
    field = lambda t, y, args: jnp.stack([y[1], -2.0 * y[0] - 0.3 * y[1] + jnp.sin(t)])
    ts = jnp.linspace(t0, t1, 5)
    sol = ode.diffeqsolve(
        ode.ODETerm(field),
        ode.Tsit5(),
        t0,
        t1,
        0.1 if t1 > t0 else -0.1,
        jnp.array([1.0, 0.0]),
        saveat=ode.SaveAt(ts=ts),
        stepsize_controller=ode.PIDController(rtol=1e-6, atol=1e-8),
        max_steps=5,
        throw=False,
    )
    assert sol.result == ode.RESULTS.max_steps_reached
    reached = np.isfinite(np.asarray(sol.ys[:, 0]))
    assert 0 < reached.sum() < 5 and np.all(reached[: reached.sum()])
    np.testing.assert_array_equal(np.asarray(sol.ts)[reached], np.asarray(ts)[reached])
    assert np.all(np.asarray(sol.ts)[~reached] == np.inf)


def test_steps_fill_the_output_when_max_steps_is_exactly_the_step_count():
    sol = ode.diffeqsolve(
        ode.ODETerm(lambda t, y, args: -y),
        ode.Tsit5(),
        0.0,
        1.0,
        0.1,
        jnp.asarray(1.0),
        saveat=ode.SaveAt(t0=True, steps=True, t1=True),
        max_steps=10,
    )
    np.testing.assert_allclose(sol.ts, np.linspace(0.0, 1.0, 11), rtol=1e-15, atol=1e-15)
    np.testing.assert_allclose(sol.ys, np.exp(-np.linspace(0.0, 1.0, 11)), rtol=1e-6)


def test_save_ts_may_contain_t0_and_t1_exactly():
    save_ts = jnp.array([0.0, 1.0, 10.0])
    sol = lv_solve(ode, ode.SaveAt(ts=save_ts, t1=True))
    np.testing.assert_array_equal(sol.ts, [0.0, 1.0, 10.0, 10.0])
    np.testing.assert_array_equal(sol.ys[0], Y0)
    np.testing.assert_allclose(sol.ys[2], sol.ys[3], rtol=1e-13)
    assert int(sol.stats["num_steps"]) == int(lv_every_step().stats["num_steps"])


def test_many_save_times_inside_one_step():
    save_ts = jnp.linspace(0.0, 0.5, 200)
    sol = ode.diffeqsolve(
        ode.ODETerm(lambda t, y, args: jnp.cos(t)),
        ode.Tsit5(),
        0.0,
        1.0,
        0.5,
        jnp.asarray(0.0),
        saveat=ode.SaveAt(ts=save_ts, dense=True),
    )
    assert int(sol.stats["num_steps"]) == 2
    # Tsit5's interpolant over a step of 0.5: error ~ h^5 / 100.
    np.testing.assert_allclose(sol.ys, np.sin(save_ts), rtol=0, atol=1e-5)
    dense = eqx.filter_jit(lambda s: s.evaluate(save_ts))(sol)
    np.testing.assert_allclose(sol.ys, dense, rtol=1e-14, atol=1e-15)
    assert len(np.unique(np.asarray(sol.ys))) == 200


def test_save_times_may_repeat():
    save_ts = jnp.array([0.25, 0.25, 0.75, 0.75, 0.75])
    sol = ode.diffeqsolve(
        ode.ODETerm(lambda t, y, args: jnp.cos(t)),
        ode.Tsit5(),
        0.0,
        1.0,
        0.1,
        jnp.asarray(0.0),
        saveat=ode.SaveAt(ts=save_ts),
    )
    np.testing.assert_allclose(sol.ys, np.sin(save_ts), atol=1e-8)


def decay_cos(t, y, args):
    return y * jnp.cos(t)


@functools.cache
def backwards_solution():
    """y' = y cos t from t0 = 2 back to t1 = 0, so y(t) = exp(sin t - sin 2)."""
    save_ts = jnp.array([2.0, 1.5, 0.7, 0.0])
    return ode.diffeqsolve(
        ode.ODETerm(decay_cos),
        ode.Tsit5(),
        2.0,
        0.0,
        -0.1,
        jnp.asarray(1.0),
        saveat=ode.SaveAt(ts=save_ts, steps=True, dense=True),
        stepsize_controller=ode.PIDController(rtol=1e-9, atol=1e-9),
        max_steps=64,
    )


def backwards_exact(t):
    return np.exp(np.sin(t) - np.sin(2.0))


def test_backwards_solve_saves_decreasing_ts():
    sol = backwards_solution()
    np.testing.assert_array_equal(sol.ts[:4], [2.0, 1.5, 0.7, 0.0])
    np.testing.assert_allclose(sol.ys[:4], backwards_exact(sol.ts[:4]), rtol=1e-7)


def test_backwards_steps_decrease_to_t1_and_pad_with_inf():
    sol = backwards_solution()
    accepted = int(sol.stats["num_accepted_steps"])
    step_ts, step_ys = sol.ts[4:], sol.ys[4:]
    assert np.all(np.diff(step_ts[:accepted]) < 0)
    assert step_ts[accepted - 1] == 0.0
    np.testing.assert_allclose(step_ys[:accepted], backwards_exact(step_ts[:accepted]), rtol=1e-7)
    # As documented (SaveAt, Solution) and as Diffrax does: +inf, whatever the direction.
    assert np.all(step_ts[accepted:] == np.inf)
    assert np.all(step_ys[accepted:] == np.inf)


def test_backwards_dense_output():
    sol = backwards_solution()
    ts = np.linspace(2.0, 0.0, 41)
    ys, slopes = eqx.filter_jit(lambda s: (s.evaluate(ts), s.derivative(ts)))(sol)
    np.testing.assert_allclose(ys, backwards_exact(ts), rtol=1e-7)
    np.testing.assert_allclose(slopes, np.cos(ts) * backwards_exact(ts), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "backwards", [False, pytest.param(True, marks=pytest.mark.matrix)], ids=["fwd", "bwd"]
)
def test_a_save_time_at_t0_has_its_derivative_in_time(backwards):
    """ys[0] at ts[0] == t0 is y0, and moves with ts[0] (by f(t0, y0)) and with t0 (by
    -f(t0, y0), ts held): the saved value before the first step carries the solve's
    initial slope, as the first step's interpolant does in Diffrax. It was zero."""
    t0, t1 = (1.0, 0.0) if backwards else (0.0, 1.0)
    ts, y0 = jnp.linspace(t0, t1, 4), jnp.array([1.0, 2.0])

    def first(t0, ts, adjoint):
        sol = ode.diffeqsolve(
            ode.ODETerm(lambda t, y, a: -0.5 * y), ode.Tsit5(), t0, t1, t1 - t0, y0,
            saveat=ode.SaveAt(ts=ts), stepsize_controller=ode.PIDController(rtol=1e-8, atol=1e-8),
            adjoint=adjoint,
        )  # fmt: skip
        return sol.ys[0]

    slope, at_t0 = -0.5 * y0, jnp.zeros(4).at[0].set(1.0)
    by_ts = jax.jacrev(lambda ts: first(t0, ts, ode.RecursiveCheckpointAdjoint()))(ts)
    np.testing.assert_allclose(by_ts, slope[:, None] * at_t0, atol=1e-12)
    tangent = jax.jvp(lambda ts: first(t0, ts, ode.ForwardMode()), (ts,), (at_t0,))[1]
    np.testing.assert_allclose(tangent, slope, rtol=1e-12)
    by_t0 = jax.jacrev(lambda t0: first(t0, ts, ode.RecursiveCheckpointAdjoint()))(t0)
    np.testing.assert_allclose(by_t0, -slope, rtol=1e-12)


def _dense_beside_ts(lib, k, adjoint=None):
    kwargs = {} if adjoint is None else dict(adjoint=adjoint)
    saveat = lib.SaveAt(ts=jnp.array([0.5, 1.0]), dense=True)
    sol = lib.diffeqsolve(lib.ODETerm(lambda t, y, k: -k * y), lib.Tsit5(), 0.0, 3.0, 0.05,
                          jnp.array([1.0, 0.5]), k, saveat=saveat, **kwargs)  # fmt: skip
    # Diffrax's `derivative` takes one time at a time.
    slopes = sum(jnp.sum(sol.derivative(t)) for t in (0.3, 2.9))
    return jnp.sum(sol.ys) + jnp.sum(sol.evaluate(2.5)) + slopes


@pytest.mark.matrix
@pytest.mark.parametrize("order", ["jacrev", "vmap(grad)", "jit(vmap(grad))", "jvp", "hessian"])
def test_dense_output_beside_save_times_in_every_order(order):
    """Save times, `evaluate` and `derivative` of one solve, differentiated in each order
    users write, against Diffrax."""
    ks = jnp.array([0.5, 0.7])
    run = {
        "jacrev": lambda lib: jax.jacrev(lambda k: _dense_beside_ts(lib, k))(ks),
        "vmap(grad)": lambda lib: jax.vmap(jax.grad(lambda k: _dense_beside_ts(lib, k)))(ks),
        "jit(vmap(grad))": lambda lib: jax.jit(
            jax.vmap(jax.grad(lambda k: _dense_beside_ts(lib, k)))
        )(ks),
        "jvp": lambda lib: jax.jvp(
            lambda k: _dense_beside_ts(lib, k, lib.ForwardMode()), (0.5,), (1.0,)
        ),
        "hessian": lambda lib: jax.hessian(lambda k: _dense_beside_ts(lib, k, lib.DirectAdjoint()))(
            0.5
        ),
    }[order]
    for ours, theirs in zip(jax.tree.leaves(run(ode)), jax.tree.leaves(run(diffrax))):
        np.testing.assert_allclose(ours, theirs, rtol=1e-12)


@pytest.mark.parametrize("solver", [ode.Tsit5(), ode.Dopri5(), ode.Dopri8()], ids=type)
def test_float32_dense_output_is_its_interpolant_to_rounding(solver):
    """`evaluate` and `derivative` in float32 against the same interpolant (the float32
    rows) evaluated in float64: a few ulps. Summed as monomials, the interpolants' large
    alternating weights lost 300 ulps of the derivative (Tsit5) and 2,000 (Dopri8)."""

    def field(t, y, args):
        return jnp.stack([1.5 * y[0] - y[0] * y[1], y[0] * y[1] - 3.0 * y[1]])

    sol = ode.diffeqsolve(
        ode.ODETerm(field), solver, 0.0, 10.0, 0.1, jnp.array([5.0, 1.0], jnp.float32),
        stepsize_controller=ode.PIDController(rtol=1e-6, atol=1e-6),
        saveat=ode.SaveAt(dense=True), max_steps=1000,
    )  # fmt: skip
    wide = jax.tree_util.tree_map(
        lambda x: x.astype(jnp.float64) if eqx.is_inexact_array(x) else x, sol
    )
    ts = jnp.linspace(0.0, 10.0, 997, dtype=jnp.float32)
    for read in ("evaluate", "derivative"):
        narrow = np.asarray(getattr(sol, read)(ts), np.float64)
        exact = np.asarray(getattr(wide, read)(ts.astype(jnp.float64)))
        error = np.max(np.abs(narrow - exact)) / np.max(np.abs(exact))
        assert error < 1.5e-6 if read == "derivative" else error < 2e-7, (read, error)


# (solver, vectors a dense-output row keeps): the interpolant's control points where
# fewer than the step's dense vectors (Tsit5 7 -> 4, Dopri8 10 -> 6), else those.
DENSE_ROWS = [
    ("Tsit5", 4),
    pytest.param("Dopri5", 4, marks=pytest.mark.matrix),
    ("Dopri8", 6),
    pytest.param("Bosh3", 3, marks=pytest.mark.matrix),
    ("Heun", 2),
]


@pytest.mark.parametrize("name, width", DENSE_ROWS)
def test_dense_rows_keep_the_fewest_vectors_and_give_diffraxs_values(name, width):
    """A dense-output row keeps the interpolant's control points where they are fewer
    than the step's dense vectors (the buffer of max_steps rows is most of such a solve's
    memory); `evaluate` and `derivative` are Diffrax's, from its rows of dense vectors."""

    def field(t, y, args):
        return jnp.stack([jnp.sin(3 * t) - 0.5 * y[0], y[0] - y[1]])

    def solve(lib):
        return lib.diffeqsolve(
            lib.ODETerm(field), getattr(lib, name)(), 0.0, 5.0, 0.02, jnp.array([5.0, 1.0]),
            saveat=lib.SaveAt(dense=True), max_steps=4096,
        )  # fmt: skip

    ours, theirs = solve(ode), solve(diffrax)  # the same 250 steps
    assert ours.interpolation.rows.stages.shape[1] == width
    ts = jnp.linspace(0.0, 5.0, 499)
    for read in ("evaluate", "derivative"):
        got, expected = getattr(ours, read)(ts), jax.vmap(getattr(theirs, read))(ts)
        scale = np.max(np.abs(expected))
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-11 * scale, err_msg=read)


def test_dense_output_outside_the_interval_is_nan_on_both_sides():
    """As in Diffrax: no extrapolation before t0 or after t1, forwards and backwards."""
    sol = backwards_solution()  # from t = 2 down to 0
    outside = np.array([2.5, 2.0 + 1e-9, -1e-9, -1.0])
    assert np.all(np.isnan(sol.evaluate(outside))) and np.all(np.isnan(sol.derivative(outside)))
    inside = np.array([2.0, 1.0, 0.0])
    assert np.all(np.isfinite(sol.evaluate(inside)))


def summary(t, y, args):
    return {"total": jnp.sum(y), "t": t, "scaled": args * y}


def test_fn_is_applied_to_every_kind_of_output():
    plain = lv_ordered()
    summed = lv_solve(ode, ode.SaveAt(**ORDERED, fn=summary))
    np.testing.assert_allclose(summed.ts, plain.ts, rtol=ACROSS_PROGRAMS)
    np.testing.assert_allclose(summed.ys["total"], plain.ys.sum(axis=1), rtol=ACROSS_PROGRAMS)
    np.testing.assert_allclose(summed.ys["scaled"], 2.0 * plain.ys, rtol=ACROSS_PROGRAMS)
    np.testing.assert_array_equal(summed.ys["t"], summed.ts)


def test_dense_only_saves_no_ts_or_ys():
    sol = ode.diffeqsolve(
        ode.ODETerm(decay_cos),
        ode.Tsit5(),
        0.0,
        1.0,
        0.1,
        jnp.asarray(1.0),
        saveat=ode.SaveAt(dense=True),
        max_steps=16,
    )
    assert sol.ts is None and sol.ys is None
    assert eqx.filter_jit(lambda s: s.evaluate(0.0))(sol) == 1.0


def test_t0_only_saves_y0():
    y0 = {"a": jnp.arange(3.0), "b": jnp.asarray(2.0)}
    sol = ode.diffeqsolve(
        ode.ODETerm(lambda t, y, args: jax.tree.map(jnp.negative, y)),
        ode.Tsit5(),
        0.0,
        1.0,
        0.1,
        y0,
        saveat=ode.SaveAt(t0=True),
    )
    np.testing.assert_array_equal(sol.ts, [0.0])
    np.testing.assert_array_equal(sol.ys["a"], [[0.0, 1.0, 2.0]])
    np.testing.assert_array_equal(sol.ys["b"], [2.0])


def test_traced_save_ts_change_values_without_retracing():
    traces = []

    def field(t, y, args):
        traces.append(None)
        return jnp.cos(t) * jnp.ones_like(y)

    @jax.jit
    def solve(save_ts):
        return ode.diffeqsolve(
            ode.ODETerm(field),
            ode.Tsit5(),
            0.0,
            2.0,
            0.05,
            jnp.asarray(0.0),
            saveat=ode.SaveAt(ts=save_ts),
        ).ys

    first = solve(jnp.array([0.3, 1.0, 1.9]))
    count = len(traces)
    second = solve(jnp.array([0.1, 0.2, 2.0]))
    assert len(traces) == count
    np.testing.assert_allclose(first, np.sin([0.3, 1.0, 1.9]), atol=1e-7)
    np.testing.assert_allclose(second, np.sin([0.1, 0.2, 2.0]), atol=1e-7)


def test_a_float32_grid_ending_at_a_rounded_t1_is_accepted():
    """float32(pi) > pi: save times are compared with t0 and t1 in the time dtype, as the
    solve uses them, so a float32 grid built with t1 as its end lies within [t0, t1]."""
    ts = jnp.linspace(0.0, jnp.pi, 4, dtype=jnp.float32)
    sol = ode.diffeqsolve(
        ode.ODETerm(lambda t, y, args: -y), ode.Tsit5(), 0.0, np.pi, 0.1,
        jnp.asarray(1.0, jnp.float32), saveat=ode.SaveAt(ts=ts),
    )  # fmt: skip
    np.testing.assert_allclose(sol.ys, np.exp(-np.asarray(ts)), rtol=1e-3)


@pytest.mark.parametrize(
    "batched", [False, pytest.param(True, marks=pytest.mark.matrix)], ids=["one", "vmap"]
)
def test_dense_output_beside_save_times_differentiates(batched):
    # With dense output every step emits; past the last save time the next one is the inf
    # sentinel, whose scratch write had an infinite derivative (0 x inf = NaN gradients).
    ts, y0 = jnp.array([0.5, 1.0, 2.5]), jnp.array([1.0, 0.5])

    def loss(k):
        def one(k):
            saveat = ode.SaveAt(ts=ts[:2], dense=True)
            sol = ode.diffeqsolve(ode.ODETerm(lambda t, y, k: -k * y), ode.Tsit5(), 0.0, 3.0,
                                  0.05, y0, k, saveat=saveat)  # fmt: skip
            return jnp.sum(sol.ys) + jnp.sum(sol.evaluate(ts[2]))

        return jnp.sum(jax.vmap(one)(k)) if batched else one(k)

    k = jnp.array([0.5, 0.7]) if batched else jnp.array(0.5)
    # y = y0 exp(-k t): the loss's derivative is -sum over the times of t y(t).
    exact = jax.vmap(lambda k: -jnp.sum(ts[:, None] * y0 * jnp.exp(-k * ts[:, None])))(
        jnp.atleast_1d(k)
    )
    np.testing.assert_allclose(jax.grad(loss)(k), exact.reshape(k.shape), rtol=1e-7)


def test_new_save_times_of_the_same_shape_reuse_the_compiled_solve():
    """As in Diffrax, `SaveAt(ts=...)` holds its times as an array, which `eqx.filter_jit`
    traces: a list or NumPy array of new times traces (and compiles) the solve once, where
    a list held static would compile it again for every new value. The values match the
    exact solution's."""
    traces = []

    @eqx.filter_jit
    def solve(saveat):
        traces.append(saveat)
        term = ode.ODETerm(lambda t, y, args: -y)
        return ode.diffeqsolve(term, ode.Tsit5(), 0.0, 2.0, 0.1, 1.0, saveat=saveat).ys

    for ts in ([0.5, 1.0], [0.7, 1.9], np.array([0.1, 0.2]), (1.5, 2.0)):
        ys = solve(ode.SaveAt(ts=ts))
        np.testing.assert_allclose(ys, np.exp(-np.asarray(ts)), rtol=1e-5)
    assert len(traces) == 1


def test_a_list_of_save_times_may_hold_traced_times():
    """`SaveAt(ts=[t, 2.0])` with `t` traced (as Diffrax takes it)."""

    @jax.jit
    def solve(t):
        term = ode.ODETerm(lambda s, y, args: -y)
        saveat = ode.SaveAt(ts=[t, 2.0])
        return ode.diffeqsolve(term, ode.Tsit5(), 0.0, 2.0, 0.1, 1.0, saveat=saveat).ys

    np.testing.assert_allclose(solve(0.5), np.exp([-0.5, -2.0]), rtol=1e-5)


def test_eager_calls_with_new_lists_of_save_times_compile_the_solve_once():
    """Called outside `jit`, as a script calls it: new lists of save times of one length
    reuse the compiled solve, where each new list had compiled it again (about 0.3 s a
    call). Compilations are counted through `jax.monitoring`."""
    compiles = []

    def listen(event, duration, **kwargs):
        if "backend_compile" in event:
            compiles.append(event)

    term = ode.ODETerm(lambda t, y, args: -y)
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        for ts in ([0.5, 1.0], [0.6, 1.1], [0.7, 1.2]):
            compiled_before = len(compiles)
            sol = ode.diffeqsolve(term, ode.Tsit5(), 0.0, 2.0, 0.1, 1.0, saveat=ode.SaveAt(ts=ts))
            np.testing.assert_allclose(sol.ys, np.exp(-np.asarray(ts)), rtol=1e-5)
        assert len(compiles) == compiled_before  # the last call compiled nothing
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
