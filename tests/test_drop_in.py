"""Diffrax behaviour that Diffrax code relies on: an empty interval, root finders on
implicit solvers, the `RESULTS` lookups."""

import inspect

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import odesolve as ode

Y0 = jnp.array([1.0, 2.0])
DECAY = ode.ODETerm(lambda t, y, args: -y)
PID = ode.PIDController(rtol=1e-8, atol=1e-8)


# ---------------------------------------------------------------- t0 == t1


def test_a_result_reads_as_its_name_and_compares_as_its_code():
    short = lambda y0: ode.diffeqsolve(
        DECAY, ode.Tsit5(), 0.0, 1.0, 0.1, y0, max_steps=3, throw=False
    )  # fmt: skip
    sol = short(Y0)
    assert repr(sol.result) == "RESULTS.max_steps_reached"
    assert "result=RESULTS.max_steps_reached" in repr(sol)
    assert sol.result.name == "max_steps_reached"
    assert sol.result.message == ode.RESULTS.max_steps_reached.message
    assert int(sol.result) == np.asarray(sol.result) == ode.RESULTS.max_steps_reached.value
    assert sol.result == ode.RESULTS.max_steps_reached and sol.result != 0
    assert sol.result == short(2 * Y0).result  # one result against another
    assert sol.result._value.dtype == jnp.int32  # the array, named as in Diffrax
    assert ode.RESULTS.max_steps_reached._value == sol.result._value
    with pytest.raises(TypeError, match="is_successful"):
        bool(sol.result)  # 0 means success: a truth value would read the wrong way round
    # A batch: names and messages per sample; comparisons elementwise.
    batch = jax.vmap(lambda y0, n: ode.diffeqsolve(
        DECAY, ode.Tsit5(), 0.0, n, 0.1, y0, max_steps=3, throw=False
    ))(jnp.stack([Y0, Y0]), jnp.array([1.0, 0.1]))  # fmt: skip
    assert list(batch.result.name) == ["max_steps_reached", "successful"]
    assert list(ode.RESULTS[batch.result]) == [ode.RESULTS.max_steps_reached.message, ""]
    np.testing.assert_array_equal(batch.result == ode.RESULTS.successful, [False, True])
    # Inside jit the code is not known yet: the lookup says so; comparisons still work.
    seen = []

    def traced(y0):
        result = short(y0).result
        seen.append((repr(result), ode.RESULTS[result]))
        return result == ode.RESULTS.max_steps_reached, result

    same, returned = jax.jit(traced)(Y0)
    assert bool(same) and returned == ode.RESULTS.max_steps_reached
    assert seen[0][0].startswith("Result(") and seen[0][1] == "traced"


@pytest.mark.parametrize("controller, dt0", [(ode.ConstantStepSize(), 0.1), (PID, None)])
def test_an_empty_interval_returns_y0(controller, dt0):
    saveat = ode.SaveAt(t0=True, t1=True, ts=jnp.array([1.0]), dense=True)
    sol = ode.diffeqsolve(
        DECAY, ode.Tsit5(), 1.0, 1.0, dt0, Y0, saveat=saveat, stepsize_controller=controller
    )
    np.testing.assert_array_equal(sol.ts, [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(sol.ys, np.stack([Y0] * 3))
    np.testing.assert_array_equal(sol.evaluate(1.0), Y0)  # dense output of a point
    assert sol.result == ode.RESULTS.successful


@pytest.mark.matrix  # heavy: runs with -m matrix
def test_one_sample_with_an_empty_interval_under_vmap():
    def final(t1):
        return ode.diffeqsolve(DECAY, ode.Tsit5(), 0.0, t1, None, Y0, stepsize_controller=PID)

    t1s = jnp.array([0.0, 1.0])
    np.testing.assert_allclose(jax.vmap(final)(t1s).ys[:, -1, 0], np.exp(-t1s), rtol=1e-7)
    grads = jax.vmap(jax.grad(lambda t1: final(t1).ys[-1, 0]))(t1s)
    np.testing.assert_allclose(grads, [0.0, -np.exp(-1.0)], rtol=1e-7)


# ---------------------------------------------------------------- root finders


class _OptimistixLike:
    """What an optimistix root finder offers here: its tolerances."""

    rtol = 1e-10
    atol = 1e-10


STIFF = ode.ODETerm(
    lambda t, y, args: jnp.stack([-1000 * (y[0] - jnp.cos(t)) - 300 * y[0] ** 3, -(y[1] ** 2)])
)  # nonlinear: chord iterations take more than one step to converge


@pytest.mark.parametrize(
    "root_finder",
    [
        # With Diffrax's default linear solver spelled out, as Diffrax's signature has it.
        ode.VeryChord(rtol=1e-10, atol=1e-10, linear_solver=lx.AutoLinearSolver(well_posed=None)),
        ode.with_stepsize_controller_tols(ode.VeryChord)(),
        _OptimistixLike(),
    ],
    ids=["VeryChord", "controller-tols", "optimistix-like"],
)
def test_implicit_solvers_take_a_root_finder(root_finder):
    solver = ode.Kvaerno5(root_finder=root_finder)
    pid = ode.PIDController(rtol=1e-8, atol=1e-8)
    sol = ode.diffeqsolve(STIFF, solver, 0.0, 1.0, None, Y0, stepsize_controller=pid)
    reference = ode.diffeqsolve(STIFF, ode.Kvaerno5(), 0.0, 1.0, None, Y0, stepsize_controller=pid)
    np.testing.assert_allclose(sol.ys[-1], reference.ys[-1], rtol=1e-7)


def test_a_root_finder_without_tolerances_is_refused():
    with pytest.raises(TypeError, match=r"root_finder=3: pass odesolve.VeryChord"):
        ode.Kvaerno5(root_finder=3)
    with pytest.raises(ValueError, match=r"pass one of them"):
        ode.Kvaerno5(root_finder=ode.VeryChord(1e-6, 1e-6), newton_rtol=1e-6, newton_atol=1e-6)
    with pytest.raises(TypeError, match=r"VeryChord\(linear_solver='lu'\): pass a Lineax"):
        ode.VeryChord(linear_solver="lu")


def test_the_root_finders_tolerances_are_used():
    # A loose root finder changes the answer of fixed implicit Euler steps; a tight one
    # agrees with the default (100 ulp).
    solve = lambda solver: ode.diffeqsolve(STIFF, solver, 0.0, 0.1, 0.01, Y0).ys[-1]
    default = solve(ode.ImplicitEuler())
    tight = solve(ode.ImplicitEuler(root_finder=ode.VeryChord(rtol=1e-13, atol=1e-13)))
    loose = solve(ode.ImplicitEuler(root_finder=ode.VeryChord(rtol=1e-1, atol=1e-1)))
    np.testing.assert_allclose(tight, default, rtol=1e-11)
    assert np.max(np.abs(loose - default)) > 1e-9


def test_diffrax_solver_arguments_are_taken():
    # root_find_max_steps bounds the chord iterations, as Diffrax's: one iteration with
    # no fresh Jacobian cannot converge on a nonlinear stage.
    solve = lambda solver: ode.diffeqsolve(
        STIFF, solver, 0.0, 0.1, 0.01, Y0, throw=False, stepsize_controller=ode.ConstantStepSize()
    )  # fmt: skip
    assert solve(ode.Kvaerno5(root_find_max_steps=1, max_refreshes=0)).result == (
        ode.RESULTS.nonlinear_divergence
    )
    assert solve(ode.Kvaerno5(root_find_max_steps=10)).result == ode.RESULTS.successful
    with pytest.raises(ValueError, match="name the same limit"):
        ode.Kvaerno5(root_find_max_steps=5, max_iterations=5)
    # scan_kind changes how Diffrax compiles, never the result.
    plain = ode.diffeqsolve(DECAY, ode.Tsit5(), 0.0, 1.0, 0.1, Y0).ys
    bounded = ode.diffeqsolve(DECAY, ode.Tsit5(scan_kind="bounded"), 0.0, 1.0, 0.1, Y0).ys
    np.testing.assert_array_equal(plain, bounded)
    # A plain field, as Diffrax's: a solver given to a filtered `jit` (its string a
    # static input) or differentiated through solves as before.
    solve = lambda solver, y0: ode.diffeqsolve(DECAY, solver, 0.0, 1.0, 0.1, y0).ys
    jitted = eqx.filter_jit(solve)(ode.Tsit5(scan_kind="lax", scan_stages=True), Y0)
    np.testing.assert_array_equal(plain, jitted)
    grads = jax.grad(lambda y0: jnp.sum(solve(ode.Tsit5(scan_kind="lax"), y0)))(Y0)
    np.testing.assert_array_equal(grads, jax.grad(lambda y0: jnp.sum(solve(ode.Tsit5(), y0)))(Y0))
    with pytest.raises(ValueError, match=r"scan_kind='while'"):
        ode.Tsit5(scan_kind="while")


def test_controller_arguments_by_position_are_diffraxs():
    # Diffrax's PIDController(rtol, atol, norm, pcoeff, ...): a third positional argument
    # is the norm. The step and jump times, which Diffrax 0.7 moved out, come last.
    names = lambda cls: list(inspect.signature(cls).parameters)
    theirs = names(diffrax.PIDController)
    assert names(ode.PIDController)[: len(theirs)] == theirs
    max_norm = lambda x: jnp.max(jnp.abs(x))
    solve = lambda lib: lib.diffeqsolve(
        lib.ODETerm(lambda t, y, a: -y), lib.Tsit5(), 0.0, 1.0, 0.1, jnp.array([1.0, 2.0]),
        stepsize_controller=lib.PIDController(1e-6, 1e-8, max_norm, 0.2, 0.4),
    )  # fmt: skip
    ours, reference = solve(ode), solve(diffrax)
    assert int(ours.stats["num_steps"]) == int(reference.stats["num_steps"])
    np.testing.assert_allclose(ours.ys, reference.ys, rtol=1e-12)


def test_very_chord_is_an_optimistix_root_finder_of_its_own():
    optx = pytest.importorskip("optimistix")
    solver = ode.VeryChord(rtol=1e-8, atol=1e-8)
    pair = lambda x, args: (x[0] - x[1] ** 3, jnp.sin(x[1]) + x[1] - args)  # root: sin b + b = a
    x0 = (jnp.array(1.0), jnp.array(0.2))
    sol = optx.root_find(pair, solver, x0, 0.5, max_steps=100)
    assert sol.result == optx.RESULTS.successful
    np.testing.assert_allclose(pair(sol.value, 0.5), (0.0, 0.0), atol=1e-8)
    # A state's factorised Jacobian is reused through options, as Diffrax's tests do.
    state = optx.root_find(pair, solver, x0, 0.5, max_steps=0, throw=False).state
    again = optx.root_find(pair, solver, x0, 0.5, max_steps=100, options=dict(init_state=state))
    np.testing.assert_allclose(again.value, sol.value, rtol=1e-8)
    # Its derivative (optimistix's implicit function theorem): db/da = 1 / (cos b + 1).
    root = lambda a: optx.root_find(pair, solver, x0, a).value[1]
    b = root(0.5)
    np.testing.assert_allclose(jax.grad(root)(0.5), 1 / (jnp.cos(b) + 1), rtol=1e-8)
    # No real root: divergence is reported, not a wrong value.
    none = optx.root_find(lambda x, args: x**2 + 1, solver, jnp.array(0.5), throw=False)
    assert none.result == optx.RESULTS.nonlinear_divergence
    with pytest.raises(ValueError, match=r"VeryChord\(rtol=1e-8, atol=1e-8\)"):
        optx.root_find(pair, ode.VeryChord(), x0, 0.5)


# ---------------------------------------------------------------- RESULTS


def test_results_lookups():
    sol = ode.diffeqsolve(DECAY, ode.Tsit5(), 0.0, 1.0, 0.1, Y0, max_steps=3, throw=False)
    assert ode.RESULTS[sol.result] == ode.RESULTS.max_steps_reached.message
    assert ode.RESULTS["max_steps_reached"] is ode.RESULTS.max_steps_reached
    assert not ode.is_okay(sol.result) and not ode.is_successful(sol.result)
    ok = ode.diffeqsolve(DECAY, ode.Tsit5(), 0.0, 1.0, 0.1, Y0)
    assert ode.is_okay(ok.result) and ode.is_successful(ok.result)
    assert not ode.is_event(ok.result)


@pytest.mark.parametrize("controller, dt0", [(ode.ConstantStepSize(), 0.1), (PID, None)])
def test_solves_under_disable_jit(controller, dt0):
    # (conftest sets strict dtype promotion: an enum member read as a strong int64 there
    # was a TypePromotionError against the int32 result code.)
    with jax.disable_jit():
        sol = ode.diffeqsolve(
            DECAY, ode.Tsit5(), 0.0, 1.0, dt0, Y0, stepsize_controller=controller, max_steps=64
        )
    np.testing.assert_allclose(sol.ys[-1], np.exp(-1.0) * Y0, rtol=1e-5)


def test_errors_are_also_the_types_diffrax_raises():
    with pytest.raises(RuntimeError, match=r"StepTo\(ts\) must start at t0=0.0"):
        ode.diffeqsolve(
            DECAY, ode.Tsit5(), 0.0, 1.0, None, Y0, stepsize_controller=ode.StepTo([0.1, 1.0])
        )
    with pytest.raises(NotImplementedError, match=r"BacksolveAdjoint supports SaveAt"):
        ode.diffeqsolve(
            DECAY, ode.Tsit5(), 0.0, 1.0, 0.1, Y0,
            saveat=ode.SaveAt(steps=True), adjoint=ode.BacksolveAdjoint(),
        )  # fmt: skip
    for ts in ([-0.5], [1.5]):
        with pytest.raises(RuntimeError, match=r"outside \[t0, t1\]"):
            ode.diffeqsolve(DECAY, ode.Tsit5(), 0.0, 1.0, 0.1, Y0, saveat=ode.SaveAt(ts=ts))


def test_a_boolean_event_true_at_t0_stops_before_the_first_step():
    event = ode.Event(lambda t, y, args, **kwargs: y[0] < 2.0)
    saveat = ode.SaveAt(t0=True, t1=True)
    sol = ode.diffeqsolve(DECAY, ode.Tsit5(), 0.0, 1.0, 0.1, Y0, saveat=saveat, event=event)
    np.testing.assert_array_equal(sol.ts, [0.0, 0.0])
    np.testing.assert_array_equal(sol.ys, np.stack([Y0, Y0]))
    assert sol.result == ode.RESULTS.event_occurred and int(sol.stats["num_steps"]) == 0


@pytest.mark.parametrize("y0", [None, {}, ()], ids=["None", "empty-dict", "empty-tuple"])
def test_an_empty_state_returns_its_structure(y0):
    saveat = ode.SaveAt(ts=jnp.array([0.5, 1.0]))
    field = ode.ODETerm(lambda t, y, args: y)
    sol = ode.diffeqsolve(field, ode.Tsit5(), 0.0, 1.0, 0.1, y0, saveat=saveat)
    assert sol.ys == y0 and sol.result == ode.RESULTS.successful
    np.testing.assert_array_equal(sol.ts, [0.5, 1.0])
    # SaveAt(fn=...) and events see the empty state.
    saveat = ode.SaveAt(ts=jnp.array([0.5, 1.0]), fn=lambda t, y, args: t * 2)
    event = ode.Event(lambda t, y, args, **kwargs: t > 0.55)
    sol = ode.diffeqsolve(field, ode.Tsit5(), 0.0, 1.0, 0.1, y0, saveat=saveat, event=event)
    assert sol.ys[0] == 1.0 and sol.result == ode.RESULTS.event_occurred


@pytest.mark.parametrize(
    "solver, controller",
    [
        (ode.Tsit5(), ode.PIDController(rtol=1e-5, atol=1e-8, pcoeff=0.3, icoeff=0.3)),
        (ode.ImplicitEuler(), ode.ConstantStepSize()),
        (ode.Kvaerno5(), ode.ConstantStepSize()),
    ],
    ids=["pi-controller", "implicit-euler", "kvaerno5"],
)
def test_an_array_with_no_components_is_solved(solver, controller):
    # A float32 state's (empty) error norm keeps its dtype in the controller's history,
    # and Newton iterations on no components converge at once.
    y0 = jnp.ones((0,), jnp.float32)
    sol = ode.diffeqsolve(DECAY, solver, 0.0, 1.0, 0.01, y0, stepsize_controller=controller)
    assert sol.ys.shape == (1, 0) and sol.result == ode.RESULTS.successful


@pytest.mark.parametrize("controller", [ode.ConstantStepSize(), PID], ids=["constant", "pid"])
def test_an_event_ends_a_solve_to_infinity(controller):
    event = ode.Event(lambda t, y, args, **kwargs: y[0] - 0.5)
    sol = ode.diffeqsolve(
        DECAY, ode.Tsit5(), 0.0, jnp.inf, 0.1, Y0, event=event, stepsize_controller=controller
    )
    np.testing.assert_allclose(sol.ts, [np.log(2.0)], rtol=1e-6)
    assert sol.result == ode.RESULTS.event_occurred


# ---------------------------------------------------------------- ClipStepSizeController


def _switched_integral(t, controller_of):
    field = lambda s, y, args: (-y[0] + jnp.where(s < t, 0.0, 1.0), y[0])
    sol = ode.diffeqsolve(
        ode.ODETerm(field), ode.Tsit5(), 0.0, 1.0, None, (1.0, 0.0),
        stepsize_controller=controller_of(jnp.asarray(t)[None]), max_steps=2048,
    )  # fmt: skip
    return sol.ys[1][-1]


@pytest.mark.parametrize("times", ["jump_ts", pytest.param("step_ts", marks=pytest.mark.matrix)])
def test_clip_controller_matches_the_pid_controllers_own_times(times):
    pid = lambda ts: ode.PIDController(rtol=1e-8, atol=1e-8, **{times: ts})
    clip = lambda ts: ode.ClipStepSizeController(
        ode.PIDController(rtol=1e-8, atol=1e-8), **{times: ts}
    )
    for controller_of in (pid, clip):
        value = _switched_integral(0.5, controller_of)
        derivative = jax.grad(_switched_integral)(0.5, controller_of)
        np.testing.assert_allclose(derivative, -(1 - np.exp(-0.5)), rtol=1e-5)
    np.testing.assert_array_equal(value, _switched_integral(0.5, pid))


def test_clip_controller_around_constant_steps_keeps_the_grid():
    controller = ode.ClipStepSizeController(ode.ConstantStepSize(), step_ts=jnp.array([0.25]))
    sol = ode.diffeqsolve(
        DECAY, ode.Tsit5(), 0.0, 1.0, 0.1, Y0,
        stepsize_controller=controller, saveat=ode.SaveAt(steps=True),
    )  # fmt: skip
    ts = np.asarray(sol.ts)[np.isfinite(sol.ts)]
    np.testing.assert_allclose(ts, [0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0])


SWITCH = ode.ODETerm(lambda t, y, args: jnp.where(t < 0.5, -y, 2 * y))  # y(1) = e^0.5


@pytest.mark.parametrize(
    "controller",
    [
        ode.PIDController(rtol=1e-6, atol=1e-6, jump_ts=[0.5]),
        # A time that is both a step time and a jump time is a jump.
        ode.PIDController(rtol=1e-6, atol=1e-6, step_ts=[0.5], jump_ts=[0.5]),
        ode.ClipStepSizeController(
            ode.ClipStepSizeController(ode.PIDController(rtol=1e-6, atol=1e-6), jump_ts=[0.5]),
            step_ts=[0.5],
        ),
    ],
    ids=["jump", "step-and-jump", "nested"],
)
def test_a_jump_time_is_stepped_over_without_evaluating_across_it(controller):
    # Stages at c = 1 sit on the step's end, just below the jump: no stage may round up
    # onto the jump time, where the field belongs to the other side. If one did, every
    # step ending there would be rejected and shrunk (75 steps instead of 8).
    sol = ode.diffeqsolve(
        SWITCH, ode.Tsit5(), 0.0, 1.0, 0.01, 1.0, stepsize_controller=controller
    )  # fmt: skip
    assert int(sol.stats["num_steps"]) <= 10
    np.testing.assert_allclose(sol.ys[-1], np.exp(0.5), rtol=1e-7)


def test_the_controllers_low_level_api_steps_across_nested_jumps():
    pid = ode.PIDController(rtol=0, atol=1.0)  # an error of 0: every step grows tenfold
    inner = ode.ClipStepSizeController(pid, jump_ts=[3.0, 13.0], step_ts=[23.0])
    outer = ode.ClipStepSizeController(inner, step_ts=[2.0, 13.0], jump_ts=[23.0])
    func = lambda terms, t, y, args: -y
    end, state = outer.init(DECAY, -1.0, 0.0, 0.0, 4.0, None, func, 5)
    assert end == 2.0  # -1 + 4, capped at the step time 2
    below, above = lambda t: np.nextafter(t, -np.inf), lambda t: np.nextafter(t, np.inf)

    def adapt(t0, t1):
        keep, t0, t1, jumped, new_state, result = outer.adapt_step_size(
            t0, t1, 0.0, 0.0, None, 0.0, 5, state
        )
        assert keep and result == ode.RESULTS.successful
        return float(t0), float(t1), bool(jumped)

    assert adapt(0.0, 1.0) == (1.0, 2.0, False)
    assert adapt(1.0, 2.0) == (2.0, below(3.0), False)
    assert adapt(10.0, 11.0) == (11.0, below(13.0), False)
    # 13 is a jump of the inner controller and a step time of the outer: a jump. The
    # next step starts just past it and runs to the outer controller's jump at 23.
    t0, t1, jumped = adapt(11.0, below(13.0))
    assert t0 == above(above(below(13.0))) and t1 == below(23.0) and jumped
    keep, *_ = outer.adapt_step_size(0.0, 1.0, 0.0, 0.0, None, 2.0, 5, state)
    assert not keep  # an error above the tolerance rejects the step


def test_manual_steps_take_their_first_stage_from_the_first_steps_own_args():
    # A loop of `solver.step` in a `lax.scan` whose args change each step (a controller's
    # input, as an arm model trained by feedbax steps): the first step of a first-same-as-
    # last method evaluates its first stage with its own args, as Diffrax's does, not with
    # those `init` was given; later steps carry it on.
    def steps(lib, solver):
        term = lib.ODETerm(lambda t, y, args: args * y + 1.0)
        state = solver.init(term, 0.0, 0.1, jnp.array([1.0]), jnp.array(0.0))

        def one(carry, a):
            y, state = carry
            y, _, _, state, _ = solver.step(term, 0.0, 0.1, y, a, state, made_jump=False)
            return (y, state), y

        return jax.jit(lambda: jax.lax.scan(one, (jnp.array([1.0]), state), jnp.array(
            [1.0, -2.0, 3.0])))()[1]  # fmt: skip

    for name in ("Tsit5", "Dopri5", "Bosh3"):
        ours, theirs = steps(ode, getattr(ode, name)()), steps(diffrax, getattr(diffrax, name)())
        np.testing.assert_allclose(ours, theirs, rtol=1e-14)
    first = steps(ode, ode.Tsit5())[0]
    np.testing.assert_allclose(first, 2 * np.exp(0.1) - 1, rtol=1e-8)  # y' = y + 1


def test_clip_controller_refuses_a_non_controller():
    with pytest.raises(TypeError, match=r"pass a step-size controller"):
        ode.ClipStepSizeController(ode.Tsit5(), step_ts=jnp.array([0.5]))


# ---------------------------------------------------------------- steady_state_event


def test_steady_state_event_runs_to_the_steady_state():
    relax = ode.ODETerm(lambda t, y, args: args - y)  # y -> args
    target = jnp.array([2.0, 3.0])
    event = ode.Event(ode.steady_state_event())
    pid = ode.PIDController(rtol=1e-6, atol=1e-6)
    sol = ode.diffeqsolve(relax, ode.Tsit5(), 0.0, jnp.inf, None, Y0, target, event=event,
                          stepsize_controller=pid)  # fmt: skip
    assert sol.result == ode.RESULTS.event_occurred
    # Stopped once |dy/dt| = |target - y| < atol + rtol |y|.
    assert np.sqrt(np.mean((target - sol.ys[-1]) ** 2)) < 1e-6 + 1e-6 * np.sqrt(
        np.mean(sol.ys[-1] ** 2)
    )
    with pytest.raises(ValueError, match=r"ConstantStepSize has none: pass rtol and atol"):
        ode.diffeqsolve(relax, ode.Tsit5(), 0.0, jnp.inf, 0.1, Y0, target, event=event)


def test_a_failed_newton_iteration_on_a_fixed_step_is_nonlinear_divergence():
    field = ode.ODETerm(lambda t, y, args: -100 * y**3)
    solver = ode.ImplicitEuler(max_iterations=1, max_refreshes=0)
    sol = ode.diffeqsolve(field, solver, 0.0, 1.0, 0.5, jnp.array([10.0]), throw=False)
    assert sol.result == ode.RESULTS.nonlinear_divergence
    with pytest.raises(ode.SolveError, match=r"nonlinear_divergence.*Newton iterations"):
        ode.diffeqsolve(field, solver, 0.0, 1.0, 0.5, jnp.array([10.0]))


# ---------------------------------------------------------------- Diffrax's kinds


def test_diffrax_kinds_of_solver_controller_and_term():
    from typing import Any

    adaptive = [
        ode.Heun(),
        ode.Tsit5(),
        ode.ImplicitEuler(),
        ode.Kvaerno5(),
        ode.ReversibleHeun(),
        ode.HalfSolver(ode.Euler()),
        ode.Reversible(ode.Tsit5()),
    ]
    fixed = [ode.Euler(), ode.LeapfrogMidpoint(), ode.Reversible(ode.Euler())]  # fmt: skip
    assert all(isinstance(s, ode.AbstractAdaptiveSolver) for s in adaptive)
    assert not any(isinstance(s, ode.AbstractAdaptiveSolver) for s in fixed)
    assert isinstance(ode.HalfSolver(ode.Euler()), ode.AbstractWrappedSolver)
    assert isinstance(ode.Reversible(ode.Tsit5()), ode.AbstractWrappedSolver)
    assert not isinstance(ode.Tsit5(), ode.AbstractWrappedSolver)
    assert isinstance(PID, ode.AbstractAdaptiveStepSizeController)
    assert isinstance(ode.ClipStepSizeController(PID), ode.AbstractAdaptiveStepSizeController)
    assert not isinstance(ode.ConstantStepSize(), ode.AbstractAdaptiveStepSizeController)
    assert isinstance(DECAY, ode.AbstractTerm)
    # Generic, as in Diffrax: subscripting names a type for annotations.
    assert ode.ODETerm[Any] is not None and ode.AbstractTerm[Any, Any] is not None


def test_backsolve_takes_the_adjoint_seminorm_by_name():
    def gradient(norm):
        controller = ode.PIDController(rtol=1e-6, atol=1e-6, norm=norm)

        def loss(y0):
            sol = ode.diffeqsolve(
                DECAY, ode.Tsit5(), 0.0, 1.0, None, y0, stepsize_controller=PID,
                adjoint=ode.BacksolveAdjoint(stepsize_controller=controller),
            )  # fmt: skip
            return jnp.sum(sol.ys[-1])

        return jax.grad(loss)(Y0)

    seminorm = gradient(ode.adjoint_rms_seminorm)
    default = gradient(None)
    np.testing.assert_allclose(seminorm, default, rtol=1e-12)  # the default is the seminorm
    np.testing.assert_allclose(seminorm, np.exp(-1.0) * np.ones(2), rtol=1e-5)
    np.testing.assert_allclose(gradient(ode.rms_norm), seminorm, rtol=1e-5)


def test_backsolve_takes_diffraxs_arguments_for_the_backward_solve():
    # Diffrax's BacksolveAdjoint(**kwargs) takes dt0, solver, stepsize_controller,
    # adjoint, max_steps and throw for the backward solve.
    def gradient(adjoint):
        def loss(y0):
            sol = ode.diffeqsolve(
                DECAY, ode.Tsit5(), 0.0, 1.0, None, y0, stepsize_controller=PID, adjoint=adjoint
            )
            return jnp.sum(sol.ys[-1])

        return jax.grad(loss)(Y0)

    given = ode.BacksolveAdjoint(dt0=0.01, max_steps=8192, throw=True, adjoint=ode.DirectAdjoint())
    np.testing.assert_allclose(gradient(given), np.exp(-1.0) * np.ones(2), rtol=1e-5)
    # Two backward steps cannot reach t0: with throw=False the gradient is what they give.
    short = gradient(ode.BacksolveAdjoint(max_steps=2, throw=False))
    assert np.all(np.abs(short - np.exp(-1.0)) > 1e-3)


def test_backsolve_takes_one_subsaveat_of_save_times():
    sub = ode.SaveAt(subs=ode.SubSaveAt(t0=True, ts=jnp.array([0.5, 1.0])))
    plain = ode.SaveAt(t0=True, ts=jnp.array([0.5, 1.0]))

    def loss(rate, saveat, adjoint):
        sol = ode.diffeqsolve(
            ode.ODETerm(lambda t, y, a: -a * y), ode.Tsit5(), 0.0, 1.0, None, Y0, rate,
            saveat=saveat, stepsize_controller=PID, adjoint=adjoint,
        )  # fmt: skip
        return jnp.sum(sol.ys**2)

    expected = jax.grad(loss)(0.5, plain, ode.RecursiveCheckpointAdjoint())
    np.testing.assert_allclose(
        jax.grad(loss)(0.5, sub, ode.BacksolveAdjoint()), expected, rtol=1e-6
    )
    several = ode.SaveAt(subs=(ode.SubSaveAt(t1=True), ode.SubSaveAt(steps=True)))
    with pytest.raises(NotImplementedError, match="several subs"):
        loss(0.5, several, ode.BacksolveAdjoint())


# ---------------------------------------------------------------- Diffrax's forms


def test_saveat_holds_its_times_as_one_subsaveat():
    ts = jnp.array([0.25, 0.5])
    saveat = ode.SaveAt(t0=True, ts=ts)
    assert isinstance(saveat.subs, ode.SubSaveAt)
    assert saveat.subs.t0 and not saveat.subs.t1
    np.testing.assert_array_equal(saveat.subs.ts, ts)
    assert ode.SaveAt(dense=True).subs is None
    # The same output as the SubSaveAt given explicitly.
    run = lambda s: ode.diffeqsolve(DECAY, ode.Tsit5(), 0.0, 1.0, 0.1, Y0, saveat=s)
    flat, sub = run(saveat), run(ode.SaveAt(subs=ode.SubSaveAt(t0=True, ts=ts)))
    np.testing.assert_array_equal(flat.ts, sub.ts)
    np.testing.assert_array_equal(flat.ys, sub.ys)
    with pytest.raises(ValueError, match="saves nothing"):
        ode.SaveAt(fn=lambda t, y, args: y)
    assert ode.SaveAt(dense=True, fn=lambda t, y, args: t).subs is None  # as Diffrax
    with pytest.raises(ValueError, match="subs"):
        ode.SaveAt(t1=True, subs=ode.SubSaveAt(t0=True))


@pytest.mark.parametrize(
    "controller, dt0",
    [(ode.ConstantStepSize(), 0.1), pytest.param(PID, None, marks=pytest.mark.matrix)],
)
def test_saveat_returns_the_final_solver_and_controller_state(controller, dt0):
    def run(**flags):
        saveat = ode.SaveAt(t1=True, **flags)
        return ode.diffeqsolve(
            DECAY, ode.Tsit5(), 0.0, 1.0, dt0, Y0, saveat=saveat, stepsize_controller=controller
        )

    plain = run()
    assert plain.solver_state is None and plain.controller_state is None
    assert plain.made_jump is None
    full = run(solver_state=True, controller_state=True, made_jump=True)
    np.testing.assert_array_equal(full.ys, plain.ys)
    # Tsit5 carries its last derivative (first same as last): f(t1, y1) = -y1.
    np.testing.assert_allclose(full.solver_state, -full.ys[-1], rtol=1e-6)
    assert full.controller_state is not None
    assert full.made_jump is False  # no jump times: a Python False, as Diffrax's
    jumped = ode.diffeqsolve(
        DECAY, ode.Tsit5(), 0.0, 1.0, None, Y0, saveat=ode.SaveAt(t1=True, made_jump=True),
        stepsize_controller=ode.PIDController(rtol=1e-6, atol=1e-6, jump_ts=[0.5]),
    )  # fmt: skip
    assert jumped.made_jump.dtype == bool and not jumped.made_jump  # the last step did not
    # Differentiated where the adjoint differentiates the loop; refused where it cannot.
    loss = lambda a, adjoint: jnp.sum(
        ode.diffeqsolve(
            ode.ODETerm(lambda t, y, a: -a * y),
            ode.Tsit5(),
            0.0,
            1.0,
            dt0,
            Y0,
            a,
            stepsize_controller=controller,
            adjoint=adjoint,
            saveat=ode.SaveAt(t1=True, solver_state=True),
        ).solver_state  # fmt: skip
    )
    by_differences = (
        loss(2.0 + 1e-6, ode.DirectAdjoint()) - loss(2.0 - 1e-6, ode.DirectAdjoint())
    ) / 2e-6
    for adjoint in (ode.RecursiveCheckpointAdjoint(), ode.DirectAdjoint()):
        np.testing.assert_allclose(jax.grad(loss)(2.0, adjoint), by_differences, rtol=1e-6)
    with pytest.raises(NotImplementedError, match="state"):
        jax.grad(loss)(2.0, ode.BacksolveAdjoint())
    with pytest.raises(ValueError, match=r"solver_state=\.\.\. does not match"):
        ode.diffeqsolve(DECAY, ode.Tsit5(), 0.0, 1.0, 0.1, Y0, solver_state=jnp.zeros(7))


def test_a_wrapper_passes_for_the_solver_it_wraps():
    assert isinstance(ode.HalfSolver(ode.Euler()), ode.Euler)
    assert not isinstance(ode.HalfSolver(ode.Euler()), ode.Heun)
    assert isinstance(ode.Reversible(ode.Tsit5()), ode.Tsit5)
    # Not for abstract kinds: a step loop asks those of the wrapper itself.
    assert not isinstance(ode.HalfSolver(ode.ReversibleHeun()), ode.AbstractReversibleSolver)
    assert not isinstance(ode.HalfSolver(ode.Tsit5()), ode.AbstractRungeKutta)


def test_a_pid_with_step_or_jump_times_is_a_clip_controller():
    ts = jnp.array([3.0, 4.0])
    assert not isinstance(PID, ode.ClipStepSizeController)
    for pid in (
        ode.PIDController(rtol=1e-4, atol=1e-6, step_ts=ts),
        ode.PIDController(rtol=1e-4, atol=1e-6, jump_ts=ts),
    ):
        assert isinstance(pid, ode.ClipStepSizeController)
        assert isinstance(pid, ode.PIDController)
    # The wrapper reads its controller's tolerances and norm, as Diffrax's.
    clip = ode.ClipStepSizeController(PID, step_ts=ts)
    assert (clip.rtol, clip.atol, clip.norm) == (PID.rtol, PID.atol, PID.norm)
    # Backsolve's own controller is unwrapped to its PID, clipped or not.
    grads = [
        jax.grad(
            lambda y0, c=c: jnp.sum(ode.diffeqsolve(
                DECAY, ode.Tsit5(), 0.0, 1.0, None, y0, stepsize_controller=PID,
                adjoint=ode.BacksolveAdjoint(stepsize_controller=c),
            ).ys[-1])  # fmt: skip
        )(Y0)
        for c in (ode.PIDController(rtol=1e-6, atol=1e-6, step_ts=[0.5]),
                  ode.ClipStepSizeController(ode.PIDController(rtol=1e-6, atol=1e-6)))
    ]  # fmt: skip
    for g in grads:
        np.testing.assert_allclose(g, np.exp(-1.0) * np.ones(2), rtol=1e-5)


def _after_ten(state, **kwargs):
    return state.tprev > 10


def test_a_discrete_terminating_event_is_a_boolean_event():
    grow = ode.ODETerm(lambda t, y, args: y)
    with pytest.warns(DeprecationWarning, match="discrete_terminating_event"):
        sol = ode.diffeqsolve(
            grow, ode.Tsit5(), 0, jnp.inf, 1, 1.0,
            discrete_terminating_event=ode.DiscreteTerminatingEvent(_after_ten),
        )  # fmt: skip
    event = ode.diffeqsolve(
        grow, ode.Tsit5(), 0, jnp.inf, 1, 1.0, event=ode.Event(lambda t, y, args, **kw: t > 10)
    )
    np.testing.assert_array_equal(sol.ts, event.ts)
    np.testing.assert_array_equal(sol.ys, event.ys)
    assert sol.ts[0] == 11 and sol.result == ode.RESULTS.event_occurred
    with pytest.warns(DeprecationWarning):
        steady = ode.diffeqsolve(
            DECAY, ode.Tsit5(), 0, jnp.inf, None, Y0, stepsize_controller=PID,
            discrete_terminating_event=ode.SteadyStateEvent(rtol=1e-4, atol=1e-4),
        )  # fmt: skip
    assert np.all(np.abs(steady.ys[-1]) < 1e-3)
    with pytest.warns(DeprecationWarning), pytest.raises(NotImplementedError, match="event"):
        ode.diffeqsolve(
            grow, ode.Tsit5(), 0, jnp.inf, 1, 1.0, adjoint=ode.BacksolveAdjoint(),
            discrete_terminating_event=ode.DiscreteTerminatingEvent(_after_ten),
        )  # fmt: skip
    with pytest.raises(ValueError, match="both"):
        ode.diffeqsolve(
            grow, ode.Tsit5(), 0, 1, 0.1, 1.0, event=ode.Event(lambda t, y, args, **kw: t > 10),
            discrete_terminating_event=ode.DiscreteTerminatingEvent(_after_ten),
        )  # fmt: skip


def _solve_storing_rejected(store, a=50.0, adjoint=ode.RecursiveCheckpointAdjoint()):
    field = ode.ODETerm(lambda t, y, a: -a * (y - jnp.cos(t)))
    controller = ode.ClipStepSizeController(
        ode.PIDController(rtol=1e-6, atol=1e-6), store_rejected_steps=store
    )
    return ode.diffeqsolve(
        field, ode.Tsit5(), 0.0, 3.0, 1.0, 0.0, a, stepsize_controller=controller,
        saveat=ode.SaveAt(steps=True), adjoint=adjoint, throw=False, max_steps=512,
    )  # fmt: skip


def test_rejected_steps_are_stored_and_landed_on():
    solve = _solve_storing_rejected
    plain, stored = solve(None), solve(100)
    assert stored.result == ode.RESULTS.successful
    last = lambda sol: sol.ys[sol.stats["num_accepted_steps"] - 1]
    np.testing.assert_allclose(last(stored), last(plain), atol=1e-5)
    # The first step (dt0 = 1) is rejected: a later step ends exactly where it would have.
    assert np.any(stored.ts == 1.0) and not np.any(plain.ts == 1.0)
    assert solve(3).result == ode.RESULTS.too_many_rejected_steps
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="store_rejected_steps"):
            ode.ClipStepSizeController(PID, store_rejected_steps=bad)


@pytest.mark.matrix
def test_gradients_through_stored_rejected_steps():
    # Gradients through the stored times, as the direct adjoint's.
    def loss(a, adjoint):
        ys = _solve_storing_rejected(100, a, adjoint).ys
        return jnp.sum(jnp.where(jnp.isfinite(ys), ys, 0.0))

    # Each adjoint differentiates the solve its own compiled program takes. On this stiff
    # field a rounding difference between two programs moves an accept/reject verdict now
    # and then, and the solves then differ by about 1e-7 (seen with LLVM's optimisation
    # off: gradients 2.6e-8 apart, each exact for its own solve); with the same
    # discretisation they agree to 1e-15. A missing path through the stored times would
    # be off in the leading digits.
    np.testing.assert_allclose(
        jax.grad(loss)(50.0, ode.RecursiveCheckpointAdjoint()),
        jax.grad(loss)(50.0, ode.DirectAdjoint()),
        rtol=1e-6,
    )


def test_paths_and_control_terms_are_generic_as_in_diffrax():
    """Diffrax's own tests annotate a path as `AbstractPath[Shaped[Array, "2"]]`."""
    from jaxtyping import Array, Shaped

    class Control(ode.AbstractPath[Shaped[Array, "2"]]):
        t0 = 0.0
        t1 = 1.0

        def evaluate(self, t0, t1=None, left=True):
            return jnp.array([1.0, 2.0]) * (t0 if t1 is None else t1 - t0)

    term = ode.ControlTerm[Array, Array](lambda t, y, args: jnp.ones((3, 2)), Control())
    y = jnp.array([1.0, 2.0, 3.0])
    np.testing.assert_allclose(term.vf_prod(0.0, y, None, term.contr(0.0, 0.5)), [1.5] * 3)
    with pytest.raises(TypeError):
        ode.ControlTerm[Array]  # two parameters, as Diffrax's


class _Decay(ode.AbstractTerm):
    """dy = -rate * y dt written with its own control, as Diffrax's users write terms."""

    rate: jax.Array

    def vf(self, t, y, args):
        return {"f": -self.rate * y * jnp.cos(t)}

    def contr(self, t0, t1, **kwargs):
        return {"t": t1 - t0}

    def prod(self, vf, control):
        return vf["f"] * control["t"]


def _own_term_loss(rate, own, adjoint):
    """The same decay as a term of one's own (`own`) or as an ODETerm."""
    term = _Decay(rate) if own else ode.ODETerm(lambda t, y, a: -rate * y * jnp.cos(t))
    sol = ode.diffeqsolve(
        term, ode.Tsit5(), 0.0, 2.0, 0.1, jnp.array([1.0, 0.5]), adjoint=adjoint,
        saveat=ode.SaveAt(ts=jnp.linspace(0.0, 2.0, 5)),
        stepsize_controller=ode.PIDController(rtol=1e-8, atol=1e-8),
    )  # fmt: skip
    return jnp.sum(sol.ys**2)


@pytest.mark.matrix  # 16 s
def test_a_term_of_ones_own_differentiates_as_the_ode_it_writes():
    loss = _own_term_loss
    rates = jnp.array([0.5, 1.0, 2.0])
    for adjoint in (ode.RecursiveCheckpointAdjoint(), ode.DirectAdjoint()):
        ode_grads = jax.vmap(jax.grad(loss), in_axes=(0, None, None))(rates, False, adjoint)
        own = jax.jit(jax.vmap(jax.grad(loss), in_axes=(0, None, None)), static_argnums=(1, 2))
        np.testing.assert_allclose(own(rates, True, adjoint), ode_grads, rtol=1e-12)
    # And against the exact one: y(t) = y0 exp(-rate sin t), so d loss / d rate is
    # sum over the save times of -2 sin t |y0|^2 exp(-2 rate sin t).
    ts = np.linspace(0.0, 2.0, 5)
    exact = np.sum(-2 * np.sin(ts) * 1.25 * np.exp(-2 * 1.0 * np.sin(ts)))
    gradient = jax.grad(loss)(1.0, True, ode.RecursiveCheckpointAdjoint())
    np.testing.assert_allclose(gradient, exact, rtol=1e-6)


@pytest.mark.matrix  # vmap(grad) and jit, by both adjoints, stay in the suite
def test_a_term_of_ones_own_in_every_transformation_order():
    loss = _own_term_loss
    rates = jnp.array([0.5, 1.0, 2.0])
    default = ode.RecursiveCheckpointAdjoint()
    per_rate = lambda own: lambda r: jax.vmap(lambda x: loss(x, own, default))(r)
    orders = {
        "grad(vmap)": lambda own: jax.grad(lambda r: jnp.sum(per_rate(own)(r)))(rates),
        "jacrev": lambda own: jnp.diag(jax.jacrev(per_rate(own))(rates)),
        "vmap(vmap(grad))": lambda own: jax.vmap(
            jax.vmap(jax.grad(loss), in_axes=(0, None, None)), in_axes=(0, None, None)
        )(rates.reshape(3, 1), own, default).ravel(),
        "jit(jvp)": lambda own: jax.jit(
            lambda r: jax.jvp(lambda x: loss(x, own, ode.ForwardMode()), (r,), (1.0,))[1]
        )(rates[1]),
    }
    for name, order in orders.items():
        np.testing.assert_allclose(order(True), order(False), rtol=1e-12, err_msg=name)


def test_step_counts_are_jax_default_integers():
    """As Diffrax gives them (int64 under x64): a `lax.cond` branch returning one beside
    an integer array of the default type has one output type."""
    sol = ode.diffeqsolve(ode.ODETerm(lambda t, y, args: -y), ode.Tsit5(), 0.0, 1.0, 0.1, 1.0)
    for name in ("num_steps", "num_accepted_steps", "num_rejected_steps"):
        assert sol.stats[name].dtype == jnp.asarray(0).dtype, name
    steps = jax.lax.cond(True, lambda: sol.stats["num_steps"], lambda: jnp.array(0))
    assert int(steps) == 10
