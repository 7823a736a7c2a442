"""The public API around a solve: PyTree states, dtypes, vmap, forward-mode derivatives,
jit, the step-size controllers and their options (against Diffrax, a test-only reference),
progress meters and `throw=False`."""

import functools

import diffrax
import equinox as eqx
import helpers
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odesolve as ode


def decay(t, y, args):
    return jax.tree.map(lambda leaf: -args * leaf, y)


# ---------------------------------------------------------------- states and dtypes


def test_pytree_state_of_differently_shaped_leaves():
    def field(t, y, args):
        return {"a": -y["a"], "b": (-2.0 * y["b"][0], -3.0 * y["b"][1])}

    y0 = {"a": jnp.arange(1.0, 4.0), "b": (jnp.ones((2, 2)), jnp.asarray(2.0))}
    ts = jnp.array([0.5, 1.0])
    sol = ode.diffeqsolve(
        ode.ODETerm(field), ode.Tsit5(), 0.0, 1.0, 0.01, y0, saveat=ode.SaveAt(ts=ts)
    )
    assert jax.tree.structure(sol.ys) == jax.tree.structure(y0)
    assert sol.ys["a"].shape == (2, 3)
    assert sol.ys["b"][0].shape == (2, 2, 2)
    assert sol.ys["b"][1].shape == (2,)
    decays = np.exp(-np.asarray(ts))
    np.testing.assert_allclose(sol.ys["a"], decays[:, None] * np.arange(1.0, 4.0), rtol=1e-9)
    np.testing.assert_allclose(
        sol.ys["b"][0], np.ones((2, 2, 2)) * decays[:, None, None] ** 2, rtol=1e-9
    )
    np.testing.assert_allclose(sol.ys["b"][1], 2.0 * decays**3, rtol=1e-9)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_output_dtype_is_the_state_dtype(dtype):
    y0 = jnp.array([1.0, 2.0], dtype)
    sol = ode.diffeqsolve(
        ode.ODETerm(decay),
        ode.Tsit5(),
        0.0,
        1.0,
        0.1,
        y0,
        jnp.asarray(1.0, dtype),
        saveat=ode.SaveAt(t0=True, ts=jnp.array([0.5, 1.0], dtype), dense=True),
        max_steps=16,
    )
    assert sol.ys.dtype == dtype
    assert sol.ts.dtype == dtype
    assert eqx.filter_jit(lambda s: s.evaluate(0.5))(sol).dtype == dtype
    np.testing.assert_allclose(sol.ys[2], np.exp(-1.0) * np.array([1.0, 2.0]), rtol=1e-4)


def test_mixed_precision_leaves_keep_their_dtypes():
    y0 = {"single": jnp.ones(2, jnp.float32), "double": jnp.ones(3, jnp.float64)}
    sol = ode.diffeqsolve(
        ode.ODETerm(lambda t, y, args: jax.tree.map(jnp.negative, y)),
        ode.Tsit5(),
        0.0,
        1.0,
        0.1,
        y0,
    )
    assert sol.ys["single"].dtype == jnp.float32
    assert sol.ys["double"].dtype == jnp.float64
    np.testing.assert_allclose(sol.ys["double"][0], np.exp(-1.0) * np.ones(3), rtol=1e-6)


def test_integer_state_is_promoted_to_float():
    sol = ode.diffeqsolve(
        ode.ODETerm(decay), ode.Tsit5(), 0, 1, 0.1, jnp.array([1, 2]), jnp.asarray(1.0)
    )
    assert sol.ys.dtype == jnp.float64
    np.testing.assert_allclose(sol.ys[0], np.exp(-1.0) * np.array([1.0, 2.0]), rtol=1e-6)


# -------------------------------------------------------------------------- vmap


def cubic_decay(t, y, args):
    return -args * y**3


def solve_to_5(y0, rate):
    sol = ode.diffeqsolve(
        ode.ODETerm(cubic_decay),
        ode.Tsit5(),
        0.0,
        5.0,
        None,
        y0,
        rate,
        saveat=ode.SaveAt(ts=jnp.array([1.0, 5.0])),
        stepsize_controller=ode.PIDController(rtol=1e-7, atol=1e-7),
    )
    return sol.ys, sol.stats["num_steps"]


adaptive_solve = jax.jit(solve_to_5)

# `vmap` of a jitted solve batches the traced loop afterwards (JAX's while-loop batching);
# `vmap` directly around `diffeqsolve` runs the samples in lockstep (`adjoints._loop`),
# where a sample that has finished must be left exactly as it is.
BATCHED_SOLVES = [
    pytest.param(adaptive_solve, id="vmap-of-jit"),
    pytest.param(solve_to_5, id="lockstep"),
]


def assert_matches_unbatched(batched, y0s, rates):
    ys, num_steps = batched
    for i in range(len(y0s)):
        one_ys, one_steps = adaptive_solve(y0s[i], rates[i])
        np.testing.assert_allclose(ys[i], one_ys, rtol=1e-12)
        assert num_steps[i] == one_steps
    assert len(set(np.asarray(num_steps).tolist())) == len(y0s)  # own step sizes


@pytest.mark.parametrize("solve", BATCHED_SOLVES)
def test_vmap_over_y0_takes_each_samples_own_steps(solve):
    y0s = jnp.array([0.5, 2.0, 8.0])
    rates = jnp.full(3, 1.0)
    batched = jax.jit(jax.vmap(solve, in_axes=(0, None)))(y0s, rates[0])
    assert_matches_unbatched(batched, y0s, rates)


@pytest.mark.parametrize("solve", BATCHED_SOLVES)
def test_vmap_over_args_takes_each_samples_own_steps(solve):
    rates = jnp.array([0.1, 1.0, 10.0])
    y0s = jnp.full(3, 2.0)
    batched = jax.jit(jax.vmap(solve, in_axes=(None, 0)))(y0s[0], rates)
    assert_matches_unbatched(batched, y0s, rates)


# ------------------------------------------------------------ forward-mode derivatives

ADJOINTS = [
    pytest.param(ode.ForwardMode(), id="ForwardMode"),
    pytest.param(ode.DirectAdjoint(), id="DirectAdjoint"),
]
LV_TS = jnp.array([0.5, 1.0, 2.0])


@functools.cache
def lotka_volterra_solve(adjoint):
    @jax.jit
    def solve(y0, scale):
        # `scale` stretches time, so it is a parameter the solution depends on smoothly.
        field = lambda t, y, args: args * helpers.lotka_volterra(t, y, None)
        sol = ode.diffeqsolve(
            ode.ODETerm(field),
            ode.Tsit5(),
            0.0,
            2.0,
            0.02,
            y0,
            scale,
            saveat=ode.SaveAt(ts=LV_TS),
            adjoint=adjoint,
        )
        return sol.ys

    return solve


def central_difference(fn, x, dx, h):
    return (fn(x + h * dx) - fn(x - h * dx)) / (2 * h)


@pytest.mark.parametrize("adjoint", ADJOINTS)
def test_jvp_matches_finite_differences(adjoint):
    solve = lotka_volterra_solve(adjoint)
    y0, scale = jnp.array([1.0, 0.8]), jnp.asarray(1.0)
    dy0, dscale = jnp.array([0.3, -0.7]), jnp.asarray(0.5)
    primal, tangent = jax.jvp(solve, (y0, scale), (dy0, dscale))
    # The same steps; the values to rounding (the jvp's program is fused apart).
    np.testing.assert_allclose(primal, solve(y0, scale), rtol=1e-14, atol=0)
    # Fixed steps: the discrete solution is smooth in its inputs, so a central difference
    # with h ~ eps^(1/3) agrees to ~1e-9.
    h = 1e-5
    fd = central_difference(
        lambda x: solve(x[:2], x[2]), jnp.append(y0, scale), jnp.append(dy0, dscale), h
    )
    np.testing.assert_allclose(tangent, fd, rtol=1e-7, atol=1e-9)


def test_the_default_adjoint_is_reverse_mode_only():
    """As in Diffrax: a custom VJP, which JAX refuses to forward-differentiate (the fix
    is adjoint=ForwardMode() or DirectAdjoint())."""
    solve = lotka_volterra_solve(ode.RecursiveCheckpointAdjoint())
    y0, scale = jnp.array([1.0, 0.8]), jnp.asarray(1.0)
    with pytest.raises(TypeError, match="custom_vjp"):
        jax.jvp(solve, (y0, scale), (y0, scale))


@pytest.mark.parametrize("adjoint", ADJOINTS)
def test_jacfwd_of_adaptive_solve_matches_analytic_derivative(adjoint):
    ts = jnp.array([0.5, 1.0, 3.0])

    def solve(params):
        y0, rate = params[0], params[1]
        return ode.diffeqsolve(
            ode.ODETerm(decay),
            ode.Dopri5(),
            0.0,
            3.0,
            None,
            y0,
            rate,
            saveat=ode.SaveAt(ts=ts),
            adjoint=adjoint,
            stepsize_controller=ode.PIDController(rtol=1e-10, atol=1e-10),
        ).ys

    jac = jax.jit(jax.jacfwd(solve))(jnp.array([2.0, 0.7]))
    # y = y0 exp(-rate t): dy/dy0 = exp(-rate t), dy/drate = -t y.
    expected = np.stack([np.exp(-0.7 * ts), -ts * 2.0 * np.exp(-0.7 * ts)], axis=1)
    np.testing.assert_allclose(jac, expected, rtol=1e-7)


# --------------------------------------------------------------------------- jit


def counting_field(traces):
    def field(t, y, args):
        traces.append(None)
        return -args * y

    return field


def test_jit_does_not_retrace_when_only_values_change():
    traces = []
    field = counting_field(traces)

    @jax.jit
    def solve(y0, rate, t1):
        return ode.diffeqsolve(
            ode.ODETerm(field),
            ode.Tsit5(),
            0.0,
            t1,
            0.1,
            y0,
            rate,
            stepsize_controller=ode.PIDController(rtol=1e-6, atol=1e-6),
        ).ys

    solve(jnp.ones(2), jnp.asarray(1.0), jnp.asarray(1.0))
    count = len(traces)
    out = solve(jnp.array([3.0, 4.0]), jnp.asarray(0.5), jnp.asarray(2.0))
    assert len(traces) == count
    np.testing.assert_allclose(out[0], np.exp(-1.0) * np.array([3.0, 4.0]), rtol=1e-5)


def test_repeated_eager_solves_do_not_recompile():
    traces = []
    term = ode.ODETerm(counting_field(traces))
    kwargs = dict(stepsize_controller=ode.PIDController(rtol=1e-6, atol=1e-6))
    ode.diffeqsolve(term, ode.Tsit5(), 0.0, 1.0, 0.1, jnp.ones(2), jnp.asarray(1.0), **kwargs)
    assert len(traces) == 1  # the field runs once per solve (see below)
    for value in (2.0, 3.0):
        ode.diffeqsolve(term, ode.Tsit5(), 0.0, 1.0, 0.1, jnp.ones(2), jnp.asarray(value), **kwargs)
    assert len(traces) == 1


TRANSFORMS = ["jit", "jit(grad)", "grad", "vmap(grad)", "jacfwd"]


@pytest.mark.parametrize(
    "solver, transform",
    # (An eager grad traces as jit(grad) does: with -m matrix.)
    [(ode.Tsit5(), t) for t in TRANSFORMS if t != "grad"]
    + [pytest.param(ode.Tsit5(), "grad", marks=pytest.mark.matrix)]
    + [(ode.Kvaerno5(), "jit(grad)")]
    + [
        pytest.param(ode.Kvaerno5(), t, marks=pytest.mark.matrix)
        for t in TRANSFORMS
        if t != "jit(grad)"
    ],
    ids=lambda x: x if isinstance(x, str) else type(x).__name__,
)
def test_the_field_runs_once_per_solve(solver, transform):
    """The user's Python runs once per solve: every step, sweep and transformation
    evaluates its trace (Diffrax runs it 3 times for one `jit(grad)`)."""
    traces = []
    field = counting_field(traces)
    adjoint = ode.ForwardMode() if transform == "jacfwd" else ode.RecursiveCheckpointAdjoint()

    def loss(rate):
        sol = ode.diffeqsolve(
            ode.ODETerm(field), solver, 0.0, 1.0, 0.1, jnp.ones(2), rate,
            saveat=ode.SaveAt(ts=jnp.linspace(0.0, 1.0, 4)), adjoint=adjoint,
            stepsize_controller=ode.PIDController(rtol=1e-6, atol=1e-6),
        )  # fmt: skip
        return jnp.sum(sol.ys)

    fn = {
        "jit": jax.jit(loss),
        "jit(grad)": jax.jit(jax.grad(loss)),
        "grad": jax.grad(loss),
        "vmap(grad)": jax.vmap(jax.grad(loss)),
        "jacfwd": jax.jacfwd(loss),
    }[transform]
    rate = jnp.ones(3) if transform == "vmap(grad)" else jnp.asarray(1.0)
    fn(rate)
    assert len(traces) == 1


# ------------------------------------------------------------ fixed-step controllers


def every_step(controller, t0, t1, dt0, max_steps=16):
    return ode.diffeqsolve(
        ode.ODETerm(lambda t, y, args: jnp.cos(t)),
        ode.Tsit5(),
        t0,
        t1,
        dt0,
        jnp.asarray(0.0),
        saveat=ode.SaveAt(steps=True),
        stepsize_controller=controller,
        max_steps=max_steps,
    )


def test_step_to_steps_exactly_to_its_times():
    times = jnp.array([0.0, 0.1, 0.35, 0.7, 1.0])
    sol = every_step(ode.StepTo(times), 0.0, 1.0, None)
    assert int(sol.stats["num_steps"]) == 4
    assert int(sol.stats["num_rejected_steps"]) == 0
    np.testing.assert_array_equal(sol.ts[:4], times[1:])
    assert np.all(np.isinf(sol.ts[4:]))
    np.testing.assert_allclose(sol.ys[:4], np.sin(times[1:]), atol=1e-6)


def test_step_to_backwards():
    times = jnp.array([1.0, 0.6, 0.0])
    sol = every_step(ode.StepTo(times), 1.0, 0.0, None)
    np.testing.assert_array_equal(sol.ts[:2], times[1:])
    np.testing.assert_allclose(sol.ys[:2], np.sin(times[1:]) - np.sin(1.0), atol=1e-5)


@pytest.mark.parametrize(
    "t0, t1, dt0, n", [(0.0, 1.0, 0.1, 10), (0.0, 1.0, 0.3, 4), (2.0, 0.5, -0.25, 6)]
)
def test_constant_step_size_takes_ceil_of_span_over_dt0_equal_steps(t0, t1, dt0, n):
    sol = every_step(ode.ConstantStepSize(), t0, t1, dt0)
    assert int(sol.stats["num_steps"]) == int(sol.stats["num_accepted_steps"]) == n
    np.testing.assert_allclose(sol.ts[:n], np.linspace(t0, t1, n + 1)[1:], rtol=1e-15, atol=1e-15)
    assert sol.ts[n - 1] == t1


def test_constant_step_size_takes_diffrax_steps():
    ours = every_step(ode.ConstantStepSize(), 0.0, 1.0, 0.1)
    theirs = diffrax.diffeqsolve(
        diffrax.ODETerm(lambda t, y, args: jnp.cos(t)),
        diffrax.Tsit5(),
        0.0,
        1.0,
        0.1,
        jnp.asarray(0.0),
        saveat=diffrax.SaveAt(steps=True),
        max_steps=16,
    )
    np.testing.assert_allclose(ours.ts, theirs.ts, rtol=1e-15)  # up to the last bit
    np.testing.assert_allclose(ours.ys, theirs.ys, rtol=1e-14)


# ------------------------------------------------------------------ PIDController

STEP_TS = (1.2345, 5.4321)
DTMIN, DTMAX = 0.08, 0.15


def max_norm(tree):
    return jnp.max(jnp.stack([jnp.max(jnp.abs(leaf)) for leaf in jax.tree.leaves(tree)]))


# Options that Diffrax's PIDController also has: the same settings take the same steps.
# Grouped to keep the number of compilations down.
PID_OPTIONS = {
    "pcoeff-icoeff-dcoeff": dict(pcoeff=0.3, icoeff=0.4, dcoeff=0.2),
    "dtmin-dtmax": dict(dtmin=DTMIN, dtmax=DTMAX),
    "step_ts-norm-factors": dict(
        step_ts=jnp.array(STEP_TS), norm=max_norm, factormin=0.3, factormax=3.0, safety=0.8
    ),
}


def lv_steps(library, dt0=0.1, t1=10.0, **options):
    return library.diffeqsolve(
        library.ODETerm(helpers.lotka_volterra),
        library.Tsit5(),
        0.0,
        t1,
        dt0,
        jnp.array([1.0, 1.0]),
        saveat=library.SaveAt(steps=True),
        stepsize_controller=library.PIDController(rtol=1e-6, atol=1e-6, **options),
        max_steps=512,
    )


@functools.cache
def lv_steps_with(name):
    return lv_steps(ode, **PID_OPTIONS[name])


def step_sizes(sol):
    return np.diff(np.concatenate([[0.0], helpers.finite(sol.ts, sol.ys)[0]]))


@pytest.mark.parametrize("name", PID_OPTIONS)
def test_pid_options_take_the_steps_diffrax_takes(name):
    ours = lv_steps_with(name)
    theirs = lv_steps(diffrax, **PID_OPTIONS[name])
    for key in ("num_steps", "num_accepted_steps", "num_rejected_steps"):
        assert int(ours.stats[key]) == int(theirs.stats[key]), key
    # Step sizes agree to rounding, which accumulates over ~100 steps.
    np.testing.assert_allclose(ours.ts, theirs.ts, rtol=1e-9)
    np.testing.assert_allclose(ours.ys, theirs.ys, rtol=1e-8)


@pytest.mark.parametrize("name", ["Bosh3", "Tsit5", "Dopri5", "Dopri8"])
def test_adaptive_explicit_solvers_take_the_steps_diffrax_takes(name):
    """Same tableau, same error estimate, same controller: the same steps (Dopri5's
    embedded weights are the ones Diffrax and torchdiffeq use)."""

    def solve(library):
        return library.diffeqsolve(
            library.ODETerm(helpers.lotka_volterra),
            getattr(library, name)(),
            0.0,
            10.0,
            0.1,
            jnp.array([1.0, 1.0]),
            stepsize_controller=library.PIDController(rtol=1e-6, atol=1e-6),
        )

    ours, theirs = solve(ode), solve(diffrax)
    for key in ("num_steps", "num_accepted_steps", "num_rejected_steps"):
        assert int(ours.stats[key]) == int(theirs.stats[key]), key
    np.testing.assert_allclose(ours.ys, theirs.ys, rtol=1e-9)


def test_pid_takes_diffrax_s_short_last_step():
    """As in Diffrax, a last step shorter than 1% of the one before is taken: only a
    step ending within 100 ulps of t1 is stretched onto it."""
    reference = lv_steps(diffrax)
    full = helpers.finite(reference.ts, reference.ys)[0]
    k = len(full) // 2
    t1 = full[k] + 0.005 * (full[k] - full[k - 1])  # step k + 1 is 0.5% of step k
    ours, theirs = (lv_steps(lib, t1=t1) for lib in (ode, diffrax))
    for key in ("num_steps", "num_accepted_steps", "num_rejected_steps"):
        assert int(ours.stats[key]) == int(theirs.stats[key]), key
    np.testing.assert_allclose(ours.ts, theirs.ts, rtol=1e-9)
    sizes = step_sizes(ours)
    assert len(sizes) == k + 2 and sizes[-1] < 0.01 * sizes[-2]


def test_pid_dtmin_and_dtmax_bound_the_steps():
    sizes = step_sizes(lv_steps_with("dtmin-dtmax"))
    assert np.all(sizes <= DTMAX * (1 + 1e-12))
    assert np.all(sizes[:-1] >= DTMIN * (1 - 1e-12))  # the last step ends on t1
    assert np.any(sizes < 0.99 * DTMAX)  # dtmax does not decide every step


def test_pid_first_step_is_at_least_dtmin():
    """As in Diffrax: dt0 below dtmin starts at dtmin, and the steps follow Diffrax's."""
    ours, theirs = (lv_steps(lib, dt0=0.01, dtmin=0.2) for lib in (ode, diffrax))
    assert float(ours.ts[0]) == 0.2
    assert int(ours.stats["num_steps"]) == int(theirs.stats["num_steps"])
    np.testing.assert_allclose(ours.ts, theirs.ts, rtol=1e-9)


def test_pid_lands_on_step_ts():
    sol = lv_steps_with("step_ts-norm-factors")
    for t in STEP_TS:
        assert t in np.asarray(sol.ts)


def test_pid_dtmin_not_forced_reports_dt_min_reached():
    sol = ode.diffeqsolve(
        ode.ODETerm(helpers.lotka_volterra),
        ode.Tsit5(),
        0.0,
        10.0,
        0.1,
        jnp.array([1.0, 1.0]),
        throw=False,
        stepsize_controller=ode.PIDController(rtol=1e-6, atol=1e-6, dtmin=DTMIN, force_dtmin=False),
    )
    assert sol.result == ode.RESULTS.dt_min_reached


def hairer_initial_step(f, y0, tol, order):
    """Hairer, Norsett & Wanner I, sec. II.4, in numpy (RMS norm, rtol = atol = tol)."""
    norm = lambda x: np.sqrt(np.mean(np.square(x)))
    scale = tol + tol * np.abs(y0)
    f0 = f(y0)
    d0, d1 = norm(y0 / scale), norm(f0 / scale)
    h0 = 1e-6 if min(d0, d1) < 1e-5 else 0.01 * d0 / d1
    d2 = norm((f(y0 + h0 * f0) - f0) / scale) / h0
    h1 = (0.01 / max(d1, d2)) ** (1 / order)
    return min(100 * h0, h1)


def test_pid_picks_the_first_step_by_hairers_algorithm():
    # (Diffrax does not: it wraps the term and then falls back to 0.01.)
    sol = lv_steps(ode, dt0=None)
    f = lambda y: np.asarray(helpers.lotka_volterra(0.0, jnp.asarray(y), None))
    expected = hairer_initial_step(f, np.array([1.0, 1.0]), 1e-6, order=5)
    np.testing.assert_allclose(sol.ts[0], expected, rtol=1e-12)


# Right-continuous (`t < 1`) is how a switch is usually written; left-continuous
# (`t <= 1`) also needs the derivative re-evaluated after the jump.
SWITCHES = {
    "right-continuous": lambda t: jnp.where(t < 1.0, 1.0, -1.0),
    "left-continuous": lambda t: jnp.where(t <= 1.0, 1.0, -1.0),
}


@pytest.mark.parametrize("switch", SWITCHES)
def test_pid_jump_ts_steps_over_a_discontinuity_without_rejections(switch):
    sol = ode.diffeqsolve(
        ode.ODETerm(lambda t, y, args: SWITCHES[switch](t) * jnp.ones_like(y)),
        ode.Tsit5(),
        0.0,
        2.0,
        0.1,
        jnp.asarray(0.0),
        stepsize_controller=ode.PIDController(rtol=1e-8, atol=1e-8, jump_ts=jnp.array([1.0])),
    )
    # y = t up to 1, then 2 - t: piecewise linear, so every step is exact. Without
    # jump_ts the same solve takes 55 steps, 35 of them rejected (as in Diffrax).
    np.testing.assert_allclose(sol.ys[0], 0.0, atol=1e-12)
    assert int(sol.stats["num_rejected_steps"]) == 0
    assert int(sol.stats["num_steps"]) <= 5


# ---------------------------------------------------------------- progress, throw


def test_text_progress_meter_reports_to_stdout(capfd):
    sol = ode.diffeqsolve(
        ode.ODETerm(decay),
        ode.Tsit5(),
        0.0,
        1.0,
        0.01,
        jnp.asarray(1.0),
        jnp.asarray(1.0),
        progress_meter=ode.TextProgressMeter(),
    )
    jax.block_until_ready(sol)
    jax.effects_barrier()
    out, err = capfd.readouterr()
    lines = out.split()
    assert lines[0] == "0.00%" and lines[-1] == "100.00%"
    percents = [float(line.rstrip("%")) for line in lines]
    assert percents == sorted(percents)
    assert len(percents) > 10  # every 2% of 100 steps
    assert lines.count("100.00%") == 1  # the last step lands on a report: said once
    np.testing.assert_allclose(sol.ys[0], np.exp(-1.0), rtol=1e-9)


def test_text_progress_meter_reports_when_due_in_the_time_dtype(capfd):
    # After 30 steps of 0.01 on [2, 5] the progress is 0.0999...: not yet the 10% due (it
    # would be, rounded to float32). As Diffrax, the first report comes a step later.
    ode.diffeqsolve(
        ode.ODETerm(decay), ode.Euler(), 2.0, 5.0, 0.01, jnp.asarray(1.0), jnp.asarray(1.0),
        progress_meter=ode.TextProgressMeter(minimum_increase=0.1),
    )  # fmt: skip
    jax.effects_barrier()
    lines = capfd.readouterr().out.split()
    assert lines[:3] == ["0.00%", "10.33%", "20.67%"], lines


def test_tqdm_progress_meter_runs(capfd):
    sol = ode.diffeqsolve(
        ode.ODETerm(decay),
        ode.Tsit5(),
        0.0,
        1.0,
        0.01,
        jnp.asarray(1.0),
        jnp.asarray(1.0),
        stepsize_controller=ode.PIDController(rtol=1e-8, atol=1e-8),
        progress_meter=ode.TqdmProgressMeter(),
    )
    jax.block_until_ready(sol)
    jax.effects_barrier()
    _, err = capfd.readouterr()
    assert "100.0/100%" in err
    np.testing.assert_allclose(sol.ys[0], np.exp(-1.0), rtol=1e-7)


def test_throw_false_returns_the_result():
    def solve(max_steps):
        return ode.diffeqsolve(
            ode.ODETerm(decay),
            ode.Tsit5(),
            0.0,
            1.0,
            0.01,
            jnp.asarray(1.0),
            jnp.asarray(1.0),
            max_steps=max_steps,
            throw=False,
        )

    assert solve(100).result == ode.RESULTS.successful
    assert solve(10).result == ode.RESULTS.max_steps_reached


def test_progress_meter_under_vmap_reports_the_slowest_sample():
    """One report per step of the batch, never going backwards (a callback per sample
    would interleave the samples' progress)."""
    seen, closed = [], []

    class Recording(ode.TextProgressMeter):
        def _update(self, key, progress):
            seen.append(progress)

        def _close(self, key):
            closed.append(key)

    def solve(rate):
        return ode.diffeqsolve(
            ode.ODETerm(lambda t, y, a: -a * y),
            ode.Tsit5(),
            0.0,
            10.0,
            0.1,
            jnp.ones(2),
            rate,
            stepsize_controller=ode.PIDController(rtol=1e-6, atol=1e-6),
            progress_meter=Recording(),
        ).ys

    jax.block_until_ready(jax.jit(jax.vmap(solve))(jnp.array([0.1, 1.0, 5.0, 20.0])))
    jax.effects_barrier()
    assert len(seen) > 5
    assert all(b >= a for a, b in zip(seen, seen[1:]))
    # Every 2%, also once samples have finished (each keeps the last report it saw), and
    # one close for the batch.
    assert all(b - a >= 0.02 - 1e-6 for a, b in zip(seen, seen[1:])) and len(seen) <= 50
    assert len(closed) == 1


@pytest.mark.parametrize(
    "adjoint", [ode.RecursiveCheckpointAdjoint(), ode.DirectAdjoint(), ode.BacksolveAdjoint()]
)
def test_a_float32_state_with_float64_times_is_promoted(adjoint):
    """As in Diffrax: float64 time arrays promote a float32 state (it crashed in the
    closure conversion); float32 parameters keep float32 cotangents, also through the
    continuous adjoint's integration of them."""

    def loss(rate):
        sol = ode.diffeqsolve(
            ode.ODETerm(lambda t, y, a: -a.astype(y.dtype) * y),  # strict promotion
            ode.Tsit5(),
            jnp.float64(0.0),
            jnp.float64(1.0),
            0.1,
            jnp.ones(2, jnp.float32),
            rate,
            adjoint=adjoint,
            saveat=ode.SaveAt(ts=jnp.linspace(0.0, 1.0, 3)),
        )
        return jnp.sum(sol.ys), sol.ys.dtype

    (value, dtype), grad = jax.value_and_grad(loss, has_aux=True)(jnp.float32(1.0))
    assert dtype == jnp.float64 and grad.dtype == jnp.float32
    ts = np.linspace(0.0, 1.0, 3)
    np.testing.assert_allclose(value, 2 * np.sum(np.exp(-ts)), rtol=1e-6)
    np.testing.assert_allclose(grad, -2 * np.sum(ts * np.exp(-ts)), rtol=1e-5)


def test_tqdm_progress_meter_redraws_every_refresh_steps(monkeypatch):
    # 100 steps, redrawn every 25: four updates (and the final close).
    updates = []
    monkeypatch.setattr(
        ode.TqdmProgressMeter, "_update", lambda self, key, progress: updates.append(progress)
    )
    sol = ode.diffeqsolve(
        ode.ODETerm(decay), ode.Tsit5(), 0.0, 1.0, 0.01, jnp.asarray(1.0), jnp.asarray(1.0),
        progress_meter=ode.TqdmProgressMeter(refresh_steps=25),
    )  # fmt: skip
    jax.block_until_ready(sol)
    jax.effects_barrier()
    np.testing.assert_allclose(updates, [0.25, 0.5, 0.75, 1.0], rtol=1e-6)
