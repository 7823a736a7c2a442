"""Bad inputs fail loudly: at trace time with an error naming the argument and showing the
value, at run time with a `RESULTS` code (raised when throw=True)."""

import os
import subprocess
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odesolve as ode


def decay(t, y, args):
    return -y


def solve(**overrides):
    kwargs = dict(
        terms=ode.ODETerm(decay),
        solver=ode.Tsit5(),
        t0=0.0,
        t1=1.0,
        dt0=0.1,
        y0=jnp.ones(3),
    )
    kwargs.update(overrides)
    return ode.diffeqsolve(**kwargs)


# ------------------------------------------------------------------- trace time


@pytest.mark.parametrize("t0, t1, dt0", [(0.0, 1.0, -0.1), (1.0, 0.0, 0.1), (0.0, 1.0, 0.0)])
def test_dt0_pointing_the_wrong_way(t0, t1, dt0):
    with pytest.raises(ValueError, match=rf"dt0={dt0}.*t0={t0}.*t1={t1}"):
        solve(t0=t0, t1=t1, dt0=dt0)


def test_dt0_none_with_constant_step_size():
    with pytest.raises(ValueError, match=r"dt0=None.*ConstantStepSize"):
        solve(dt0=None)


def test_dt0_with_step_to():
    with pytest.raises(ValueError, match=r"dt0=0.1.*StepTo"):
        solve(stepsize_controller=ode.StepTo(jnp.array([0.0, 0.5, 1.0])))


def test_step_to_times_not_spanning_t0_to_t1():
    with pytest.raises(ValueError, match=r"StepTo.*t1=1.0.*ts\[-1\]=0.5"):
        solve(dt0=None, stepsize_controller=ode.StepTo(jnp.array([0.0, 0.5])))


def test_vector_field_output_of_the_wrong_shape():
    with pytest.raises(ValueError, match=r"vector field.*\(2,\).*y0.*\(3,\)"):
        solve(terms=ode.ODETerm(lambda t, y, args: y[:2]))


def test_vector_field_output_of_the_wrong_structure():
    with pytest.raises(ValueError, match=r"vector field.*structure.*y0 has structure"):
        solve(terms=ode.ODETerm(lambda t, y, args: (y, y)))


def test_vector_field_that_cannot_be_called():
    with pytest.raises(TypeError, match=r"vector field f\(t0, y0, args\)"):
        solve(terms=ode.ODETerm(lambda t, y: -y))


# ------------------------------------------------- a newcomer's first mistakes


def test_y0_as_a_python_list_of_floats_names_the_array_to_pass():
    stacked = ode.ODETerm(lambda t, y, args: jnp.stack([y[1], -y[0]]))
    with pytest.raises(ValueError, match=r"Python list of 2 numbers.*y0=jnp.array\(\[1.0, 0.0\]\)"):
        solve(terms=stacked, y0=[1.0, 0.0])
    with pytest.raises(TypeError, match=r"unary -.*Python list of 3 numbers.*y0=jnp.array"):
        solve(y0=[1.0, 2.0, 3.0])
    # A list the field treats as one (indexes it, returns a list) is a valid PyTree state.
    listed = ode.ODETerm(lambda t, y, args: [y[1], -y[0]])
    y1 = solve(terms=listed, y0=[1.0, 0.0]).ys[0][0]
    np.testing.assert_allclose(float(y1), np.cos(1.0), rtol=1e-4)


def test_a_field_reading_args_when_none_were_passed():
    def unpacks(t, y, args):
        rate, shift = args
        return -rate * y + shift

    pattern = r"cannot unpack.*`rate, shift = args`.*args=None.*args=\.\.\."
    with pytest.raises(TypeError, match=pattern) as info:
        solve(terms=ode.ODETerm(unpacks))
    assert info.value.__cause__ is None and info.value.__suppress_context__
    for field in (lambda t, y, args: -args["rate"] * y, lambda t, y, args: -args.rate * y):
        with pytest.raises(TypeError, match=r"uses `args`.*no args were passed"):
            solve(terms=ode.ODETerm(field))


@pytest.mark.parametrize(
    "field, shown",
    [
        (lambda y: -y, r"\(y\)"),
        (lambda t, y: -y, r"\(t, y\)"),
        (lambda t, y, args, extra: -y, r"\(t, y, args, extra\)"),
    ],
)
def test_a_field_with_the_wrong_signature(field, shown):
    pattern = rf"called as f\(t, y, args\), but <lambda>{shown}.*def f\(t, y, args\)"
    with pytest.raises(TypeError, match=pattern):
        solve(terms=ode.ODETerm(field))


def test_an_event_condition_without_keyword_arguments():
    event = ode.Event(lambda t, y, args: y[0] - 0.5)
    with pytest.raises(TypeError, match=r"cond\(t, y, args, \*\*kwargs\).*terms, solver.*def cond"):
        solve(event=event)


@pytest.mark.parametrize("returned", [None, (1.0, 2.0), "stop", {"y": 1.0}])
def test_an_event_condition_returning_no_array(returned):
    event = ode.Event(lambda t, y, args, **kwargs: returned)
    pattern = r"event condition.*return.*scalar bool or a scalar float"
    with pytest.raises((ValueError, TypeError), match=pattern):
        solve(event=event)


def _end_value(adjoint):
    term = ode.ODETerm(lambda t, y, k: -k * y)
    return lambda k: solve(terms=term, adjoint=adjoint, y0=jnp.ones(()), args=k).ys[0]


@pytest.mark.parametrize("adjoint", [ode.RecursiveCheckpointAdjoint(), ode.BacksolveAdjoint()])
def test_forward_mode_through_a_reverse_mode_adjoint_names_the_fix(adjoint):
    # (Through a function jitted before jax.jvp sees it, JAX's own refusal stands: the
    # solve is traced without the JVP, which meets the custom VJP only afterwards.)
    with pytest.raises(TypeError, match=r"jax.jvp.*ForwardMode\(\).*DirectAdjoint\(\)"):
        jax.jvp(_end_value(adjoint), (1.0,), (1.0,))
    with pytest.raises(TypeError, match=r"jax.jacfwd.*ForwardMode\(\)"):
        jax.jacfwd(_end_value(adjoint))(1.0)


def test_forward_mode_under_grad_names_the_fix():
    value = _end_value(ode.ForwardMode())
    tangent = jax.jvp(value, (1.0,), (1.0,))[1]  # what ForwardMode() is for
    np.testing.assert_allclose(float(tangent), -np.exp(-1.0), rtol=1e-5)
    pattern = r"ForwardMode\(\) gives forward-mode derivatives only.*RecursiveCheckpointAdjoint"
    with pytest.raises(RuntimeError, match=pattern):
        jax.grad(value)(1.0)


def test_save_ts_not_sorted():
    with pytest.raises(ValueError, match=r"SaveAt\(ts=...\).*ts\[1\]=0.7 then ts\[2\]=0.2"):
        solve(saveat=ode.SaveAt(ts=jnp.array([0.1, 0.7, 0.2])))


def test_save_ts_sorted_the_wrong_way_for_a_backwards_solve():
    with pytest.raises(ValueError, match=r"decreasing"):
        solve(t0=1.0, t1=0.0, dt0=-0.1, saveat=ode.SaveAt(ts=jnp.array([0.2, 0.7])))


@pytest.mark.parametrize("ts", [[-0.5, 0.5], [0.5, 1.5]])
def test_save_ts_outside_the_interval(ts):
    bad = ts[0] if ts[0] < 0 else ts[1]
    with pytest.raises(ValueError, match=rf"ts\[\d\]={bad} outside \[t0, t1\]"):
        solve(saveat=ode.SaveAt(ts=jnp.array(ts)))


def test_save_ts_not_finite():
    with pytest.raises(ValueError, match=r"ts\[1\]=nan: save times must be finite"):
        solve(saveat=ode.SaveAt(ts=jnp.array([0.5, jnp.nan])))


def test_vector_field_returning_complex_values():
    with pytest.raises(TypeError, match=r"complex value \(complex128\) for a real state"):
        solve(terms=ode.ODETerm(lambda t, y, args: y.astype(jnp.complex128)))


@pytest.mark.parametrize("name", ["t0", "t1", "dt0"])
def test_non_finite_times(name):
    with pytest.raises(ValueError, match=rf"{name}=nan is not finite"):
        solve(**{name: float("nan")})


def test_string_leaf_in_y0():
    with pytest.raises(TypeError, match=r"y0\['b'\] = 'oops'.*not an array"):
        solve(y0={"a": jnp.ones(2), "b": "oops"}, terms=ode.ODETerm(lambda t, y, a: y))


@pytest.mark.parametrize("max_steps", [0, -3, 2.5])
def test_max_steps_not_a_positive_int(max_steps):
    with pytest.raises(ValueError, match=rf"max_steps={max_steps}"):
        solve(max_steps=max_steps)


def test_saving_steps_needs_max_steps():
    with pytest.raises(ValueError, match=r"max_steps=None.*SaveAt\(steps"):
        solve(max_steps=None, saveat=ode.SaveAt(steps=True))


def test_reverse_mode_without_a_bound_on_the_steps_says_to_pass_one():
    # A ValueError, and the RuntimeError Diffrax raises (`except RuntimeError` catches it).
    # Adaptive steps: nothing bounds their number (fixed ones are counted when traced).
    field = ode.ODETerm(lambda t, y, k: -k * y)
    pid = ode.PIDController(rtol=1e-6, atol=1e-6)
    loss = lambda k: jnp.sum(solve(terms=field, args=k, max_steps=None, stepsize_controller=pid).ys)
    with pytest.raises(RuntimeError, match=r"needs a bound on the number of steps.*max_steps"):
        jax.grad(loss)(1.0)
    with pytest.raises(ValueError, match=r"needs a bound"):
        jax.grad(loss)(1.0)


def test_solver_without_error_estimate_under_pid():
    with pytest.raises(ValueError, match=r"Euler has no error estimate.*PIDController"):
        solve(solver=ode.Euler(), stepsize_controller=ode.PIDController(rtol=1e-3, atol=1e-3))


def test_terms_not_an_ode_term():
    with pytest.raises(TypeError, match=r"terms=.*ODETerm\(f\)"):
        solve(terms=decay)
    # As Diffrax: a ValueError too, with its words, for terms the solver does not take.
    term = ode.ODETerm(lambda t, y, args: -y)
    incompatible = r"^Terms are not compatible with solver! terms="
    with pytest.raises(ode.TermAndSolverIncompatible, match=incompatible) as caught:
        solve(terms=(term, term), y0=(jnp.ones(1), jnp.ones(1)))
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, TypeError)
    with pytest.raises(ValueError, match=incompatible):
        solve(terms=term, solver=ode.SemiImplicitEuler())


def test_solver_not_a_solver():
    with pytest.raises(TypeError, match=r"solver='tsit5'"):
        solve(solver="tsit5")


@pytest.mark.parametrize(
    "name, value",
    [
        ("solver", ode.Tsit5),
        ("stepsize_controller", ode.PIDController),
        ("saveat", ode.SaveAt),
        ("adjoint", ode.BacksolveAdjoint),
        ("progress_meter", ode.TextProgressMeter),
    ],
)
def test_a_class_where_an_instance_is_needed(name, value):
    with pytest.raises(
        TypeError, match=rf"{name}={value.__name__} is a class.*{value.__name__}\(\.\.\.\)"
    ):
        solve(**{name: value})


@pytest.mark.parametrize("name", ["stepsize_controller", "saveat", "adjoint", "progress_meter"])
def test_none_or_a_foreign_object_where_an_odesolve_one_is_needed(name):
    with pytest.raises(TypeError, match=rf"{name}=None .*pass e\.g\. odesolve\."):
        solve(**{name: None})

    class Foreign:  # as a Diffrax object looks to odesolve
        __module__ = "diffrax._solver"

    with pytest.raises(TypeError, match=rf"{name}=.*diffrax\.Foreign.*does not mix"):
        solve(**{name: Foreign()})


@pytest.mark.parametrize("name", ["t0", "t1", "dt0"])
def test_times_must_be_real_scalars(name):
    with pytest.raises(ValueError, match=rf"{name} has shape \(2,\): pass a scalar"):
        solve(**{name: jnp.array([0.5, 0.7])})
    with pytest.raises(TypeError, match=rf"{name}='0.5': pass a real number"):
        solve(**{name: "0.5"})


def test_non_event_and_a_foreign_state_to_resume_from_are_refused():
    with pytest.raises(TypeError, match=r"event=<object.*odesolve.Event"):
        solve(event=object())
    pattern = r"controller_state=\.\.\. does not match.*SaveAt\(controller_state=True\)"
    with pytest.raises(ValueError, match=pattern):
        solve(controller_state=object())


@pytest.mark.parametrize(
    "make, pattern",
    [
        (lambda: ode.SaveAt(fn=lambda t, y, args: t), r"SaveAt\(fn=...\) saves nothing"),
        (lambda: ode.SaveAt(steps=-1), r"SaveAt\(steps=-1\)"),
        (lambda: ode.SaveAt(ts=jnp.ones((2, 2))), r"1-D.*shape \(2, 2\)"),
        (lambda: ode.PIDController(rtol=-1.0, atol=1e-6), r"rtol=-1.0"),
        (lambda: ode.PIDController(rtol=0.0, atol=0.0), r"rtol=0, atol=0"),
        (lambda: ode.PIDController(rtol=np.float32(-1e-3), atol=1e-6), r"rtol=-0.001\): .*>= 0"),
        (lambda: ode.PIDController(rtol=1e-3, atol=-jnp.float32(1e-6)), r"atol=-1e-06\)"),
        (lambda: ode.PIDController(rtol=float("nan"), atol=1e-6), r"rtol=nan"),
        (lambda: ode.PIDController(1e-3, 1e-6, dtmin=0.5, dtmax=0.1), r"dtmin=0.5, dtmax=0.1"),
        (lambda: ode.PIDController(1e-3, 1e-6, dtmax=0.0), r"dtmax=0.0\): .*> 0"),
        (lambda: ode.PIDController(1e-3, 1e-6, factormin=2.0), r"factormin=2.0\): .*\(0, 1\]"),
        (lambda: ode.PIDController(1e-3, 1e-6, factormax=0.5), r"factormax=0.5\): .*>= 1"),
        (lambda: ode.PIDController(1e-3, 1e-6, safety=1.5), r"safety=1.5"),
        (lambda: ode.StepTo(jnp.array([0.0])), r"StepTo\(ts\).*shape \(1,\)"),
    ],
)
def test_bad_strategy_objects(make, pattern):
    with pytest.raises(ValueError, match=pattern):
        make()


def test_a_tolerance_given_as_a_string():
    with pytest.raises(TypeError, match=r"PIDController\(rtol='1e-3'\): pass a number"):
        ode.PIDController(rtol="1e-3", atol=1e-6)


def test_evaluate_without_dense_output():
    sol = solve()
    with pytest.raises(ValueError, match=r"SaveAt\(dense=True\)"):
        sol.evaluate(0.5)
    with pytest.raises(ValueError, match=r"SaveAt\(dense=True\)"):
        sol.derivative(0.5)


# -------------------------------------------------------------------- run time


def nan_at_start(t, y, args):
    return y * jnp.nan


def nan_after_half(t, y, args):
    return jnp.where(t > 0.5, jnp.nan, -y)


def test_nan_at_t0_raises():
    with pytest.raises(ode.SolveError, match=r"NaN or inf.*\(t0, y0\)"):
        solve(terms=ode.ODETerm(nan_at_start))


def test_nan_at_t0_is_reported_with_throw_false():
    sol = solve(terms=ode.ODETerm(nan_at_start), throw=False)
    assert sol.result == ode.RESULTS.nonfinite_initial_derivative


ADAPTIVE = ode.PIDController(rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("controller", [ode.ConstantStepSize(), ADAPTIVE], ids=["constant", "pid"])
def test_nan_later_in_the_solve_raises(controller):
    with pytest.raises(ode.SolveError, match=r"NaN or inf"):
        solve(terms=ode.ODETerm(nan_after_half), stepsize_controller=controller)


@pytest.mark.parametrize(
    "controller, result",
    [
        (ode.ConstantStepSize(), ode.RESULTS.nonfinite_state),
        (ADAPTIVE, ode.RESULTS.step_size_underflow),
    ],
    ids=["constant", "pid"],
)
def test_nan_later_in_the_solve_is_reported_with_throw_false(controller, result):
    sol = solve(terms=ode.ODETerm(nan_after_half), stepsize_controller=controller, throw=False)
    assert sol.result == result
    assert sol.result != ode.RESULTS.successful


def test_steps_at_the_times_resolution_end_the_solve_as_step_size_underflow():
    # float32 times near t = 1000 are 6e-5 apart. At rtol 1e-7 the steps shrink until a
    # shorter retry rounds to the step just rejected: that step would be tried and
    # rejected again until max_steps (20,000 steps, 19 of them accepted).
    def wave(t, y, args):
        return jnp.cos(1e3 * t) * jnp.ones_like(y)

    kwargs = dict(
        terms=ode.ODETerm(wave), t0=1000.0, t1=1000.1, dt0=1e-3, y0=jnp.zeros(1, jnp.float32),
        stepsize_controller=ode.PIDController(rtol=1e-7, atol=1e-7), max_steps=20_000,
    )  # fmt: skip
    sol = solve(**kwargs, throw=False)
    assert sol.result == ode.RESULTS.step_size_underflow
    assert int(sol.stats["num_steps"]) < 100
    with pytest.raises(ode.SolveError, match=r"resolution of the times' dtype.*float64"):
        solve(**kwargs)


def test_max_steps_reached_raises():
    with pytest.raises(ode.SolveError, match=r"maximum number of solver steps"):
        solve(max_steps=5)


def test_max_steps_reached_is_reported_with_throw_false():
    sol = solve(max_steps=5, throw=False, saveat=ode.SaveAt(t1=True, steps=True))
    assert sol.result == ode.RESULTS.max_steps_reached
    assert int(sol.stats["num_steps"]) == 5
    assert sol.ts[-1] < 1.0  # the state where it stopped, not t1


def test_a_failing_sample_under_vmap_raises_and_the_check_is_one_callback():
    # Sample 1 has ten times the horizon: it runs out of steps, sample 0 does not.
    solve_to = lambda t1: solve(t1=t1, max_steps=20, saveat=ode.SaveAt(t1=True)).ys
    with pytest.raises(RuntimeError, match=r"maximum number of solver steps"):
        jax.vmap(solve_to)(jnp.array([1.0, 10.0]))
    # However large the batch, the failure check is one host callback, not one per sample.
    unbatched = jax.jit(solve_to).lower(1.0).as_text()
    for batch in (2, 64):
        batched = jax.jit(jax.vmap(solve_to)).lower(jnp.ones(batch)).as_text()
        assert batched.count("callback") == unbatched.count("callback")


@pytest.mark.parametrize("transform", ["vmap", "vmap(grad)"])
def test_a_failure_under_an_eager_vmap_is_our_exception_alone(transform):
    # Evaluated as traced, the host callback's failure comes wrapped in JAX's runtime
    # error, a host traceback with our message at its end: it is raised as ours.
    loss = lambda t1: jnp.sum(solve(t1=t1, max_steps=20, saveat=ode.SaveAt(t1=True)).ys)
    fn = jax.vmap(loss) if transform == "vmap" else jax.vmap(jax.grad(loss))
    with pytest.raises(ode.SolveError) as info:
        fn(jnp.array([1.0, 10.0]))
    assert str(info.value).startswith("diffeqsolve failed (max_steps_reached): The maximum")
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_every_result_has_a_message():
    for result in ode.RESULTS:
        assert (result == ode.RESULTS.successful) != bool(result.message)


# ------------------------------------------------------- traced inputs, run time


@jax.jit
def traced_solve(t1, dt0, save_ts):
    sol = ode.diffeqsolve(
        ode.ODETerm(decay),
        ode.Tsit5(),
        0.0,
        t1,
        dt0,
        jnp.ones(2),
        saveat=ode.SaveAt(ts=save_ts),
        throw=False,
    )
    return sol.result, sol.ys


GOOD_TS = jnp.array([0.2, 0.5])


def test_traced_inputs_that_are_valid_succeed():
    result, ys = traced_solve(jnp.asarray(1.0), jnp.asarray(0.1), GOOD_TS)
    assert result == ode.RESULTS.successful
    np.testing.assert_allclose(ys[:, 0], np.exp(-np.asarray(GOOD_TS)), rtol=1e-6)


# A wrong input raises whatever `throw` is, as in Diffrax: there is no solution to hand
# back (with `throw=False` it had returned rows of inf, silently, inside a `lax.scan`).
# (A failed callback reaches the caller as JAX's `JaxRuntimeError`, or as a ValueError
# when it surfaces while waiting for the result.)
WRONG_INPUT = (ode.SolveError, jax.errors.JaxRuntimeError, ValueError)


@pytest.mark.parametrize("t1, dt0", [(1.0, -0.1), (1.0, 0.0), (-1.0, 0.1)])
def test_traced_dt0_pointing_the_wrong_way_is_invalid_dt0(t1, dt0):
    save_ts = jnp.array([0.0, 0.0]) if t1 > 0 else jnp.array([-0.2, -0.5])
    with pytest.raises(WRONG_INPUT, match=r"invalid_dt0.*wrong way") as caught:
        jax.block_until_ready(traced_solve(jnp.asarray(t1), jnp.asarray(dt0), save_ts))
    assert "throw=False" not in str(caught.value)


@pytest.mark.parametrize("save_ts", [[0.5, 0.2], [0.5, 1.5], [-0.1, 0.5]])
def test_traced_bad_save_ts_are_invalid_save_times(save_ts):
    with pytest.raises(WRONG_INPUT, match=r"invalid_save_times"):
        jax.block_until_ready(traced_solve(jnp.asarray(1.0), jnp.asarray(0.1), jnp.array(save_ts)))


def test_traced_bad_dt0_raises_at_run_time_with_throw_true():
    @jax.jit
    def run(dt0):
        return ode.diffeqsolve(ode.ODETerm(decay), ode.Tsit5(), 0.0, 1.0, dt0, jnp.ones(2)).ys

    with pytest.raises(jax.errors.JaxRuntimeError, match=r"invalid_dt0.*points the wrong way"):
        run(jnp.asarray(-0.1))


def test_a_failure_is_one_exception_with_our_message_and_nothing_printed(capfd):
    with pytest.raises(ode.SolveError) as info:
        solve(max_steps=5)
    assert str(info.value) == (
        "diffeqsolve failed (max_steps_reached): The maximum number of solver steps was "
        "reached before t1. Increase `max_steps`, loosen the tolerances, or use an "
        "implicit solver if the problem is stiff. Tolerances near the state's precision "
        "(float32 holds about 7 digits) need float64 (jax.config.update('jax_enable_x64', "
        "True)); with t1=inf, only an Event ends the solve before max_steps. Pass "
        "throw=False to get the solution back with sol.result set instead."
    )
    assert info.value.__cause__ is None and info.value.__context__ is None
    assert isinstance(info.value, eqx.EquinoxRuntimeError)  # as Diffrax's failures
    out, err = capfd.readouterr()
    assert out == "" and err == ""


# Reverse mode drops the primal solution, with it any check that reads only the primal:
# the failure must still raise, for every adjoint and however the gradient is composed.
_COMPOSED = {
    "jit(grad)": lambda loss: jax.jit(jax.grad(loss)),
    "jit(vmap(grad))": lambda loss: jax.jit(jax.vmap(jax.grad(loss))),
    "jit(grad(vmap))": lambda loss: jax.jit(jax.grad(lambda y: jax.vmap(loss)(y).sum())),
    "jit(jacrev)": lambda loss: jax.jit(jax.jacrev(loss)),
    "jit(vmap(vmap(grad)))": lambda loss: jax.jit(jax.vmap(jax.vmap(jax.grad(loss)))),
}
# Every order with the default adjoint; the first three with the other reverse-mode ones.
_CASES = [(ode.RecursiveCheckpointAdjoint(), compose) for compose in _COMPOSED] + [
    pytest.param(adjoint, compose, marks=pytest.mark.matrix)
    for adjoint in (ode.DirectAdjoint(), ode.BacksolveAdjoint())
    for compose in list(_COMPOSED)[:3]
]


def _failing_loss(adjoint):
    def loss(y0):
        sol = ode.diffeqsolve(
            ode.ODETerm(decay), ode.Tsit5(), 0.0, 10.0, 0.1, y0, max_steps=4,
            stepsize_controller=ode.PIDController(rtol=1e-8, atol=1e-8), adjoint=adjoint,
        )  # fmt: skip
        return jnp.sum(sol.ys)

    return loss


@pytest.mark.parametrize("adjoint, compose", _CASES, ids=lambda x: getattr(x, "__name__", str(x)))
def test_a_failed_solve_raises_under_reverse_mode_of_a_jitted_loss(adjoint, compose):
    batch = (2, 2) if "vmap(vmap" in compose else (2,) if "vmap" in compose else ()
    y0 = jnp.ones((*batch, 2))
    with pytest.raises(RuntimeError, match=r"diffeqsolve failed \(max_steps_reached\)"):
        jax.block_until_ready(_COMPOSED[compose](_failing_loss(adjoint))(y0))


def test_a_failed_solve_raises_under_jit_of_jvp_through_forward_mode():
    loss = _failing_loss(ode.ForwardMode())
    jvp = jax.jit(lambda y, t: jax.jvp(loss, (y,), (t,)))
    with pytest.raises(RuntimeError, match=r"diffeqsolve failed \(max_steps_reached\)"):
        jax.block_until_ready(jvp(jnp.ones(2), jnp.ones(2)))


@pytest.mark.parametrize("transform", [jax.jacfwd, jax.grad])
def test_a_wrong_traced_input_raises_under_a_jitted_derivative(transform):
    adjoint = ode.ForwardMode() if transform is jax.jacfwd else ode.RecursiveCheckpointAdjoint()
    term, y0 = ode.ODETerm(decay), jnp.ones(2)
    loss = lambda dt0: jnp.sum(
        ode.diffeqsolve(term, ode.Tsit5(), 0.0, 1.0, dt0, y0, adjoint=adjoint).ys
    )
    with pytest.raises(RuntimeError, match=r"invalid_dt0"):
        jax.block_until_ready(jax.jit(transform(loss))(jnp.asarray(-0.1)))


def test_a_failure_inside_filter_jit_is_a_runtime_error_with_our_message():
    with pytest.raises(RuntimeError, match=r"diffeqsolve failed \(max_steps_reached\)"):
        eqx.filter_jit(lambda y0: solve(y0=y0, max_steps=5).ys)(jnp.array([1.0]))


_FAILING_SOLVES = """
import jax, jax.numpy as jnp, numpy as np, odesolve as ode
solve = lambda y0: ode.diffeqsolve(
    ode.ODETerm(lambda t, y, args: -y), ode.Tsit5(), 0.0, 10.0, 0.01, y0, max_steps=5
)
for name, run in (("eager", solve), ("jit", jax.jit(solve))):
    sol = run(jnp.ones(2))
    print(name, bool(np.all(np.isnan(sol.ys))), int(sol.result._value), int(sol.stats["num_steps"]))
batch = jax.vmap(solve)(jnp.ones((3, 2)))
print("vmap", bool(np.all(np.isnan(batch.ys))), int(batch.stats["num_steps"][0]))
"""


@pytest.mark.parametrize("mode", ["nan", pytest.param("off", marks=pytest.mark.matrix)])
def test_equinox_on_error_chooses_what_a_failed_solve_gives(mode):
    # As for Diffrax, whose check is Equinox's: EQX_ON_ERROR=nan turns a failed solve's
    # arrays into NaN instead of raising, EQX_ON_ERROR=off returns it as with
    # throw=False. Read when odesolve is imported, so each runs in its own interpreter.
    env = dict(os.environ, EQX_ON_ERROR=mode)
    done = subprocess.run(
        [sys.executable, "-c", _FAILING_SOLVES], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    nan = str(mode == "nan")
    code = int(ode.RESULTS.max_steps_reached)
    assert done.stdout.split("\n")[:3] == [
        f"eager {nan} {code} 5",
        f"jit {nan} {code} 5",
        f"vmap {nan} 5",
    ]


def test_progress_meter_in_diffraxs_interface_is_named():
    with pytest.raises(TypeError, match=r"Counting defines init, step, close: .*Diffrax's"):

        class Counting(ode.AbstractProgressMeter):
            def init(self):
                return 0

            def step(self, state, progress):
                return state + 1

            def close(self, state):
                del state  # never called: the class is refused where it is written
