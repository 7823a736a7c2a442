"""Times given as Python ints or int arrays to the low-level API (solver.init / step /
func, a controller's init / adapt_step_size, Solution.evaluate / derivative) are
promoted to the float time dtype, as diffeqsolve promotes them: no step is truncated."""

import diffrax
import jax.numpy as jnp
import numpy as np
import pytest

import odesolve as ode


def _manual_stepping(lib, t0=0, dt0=0.05, t1=1):
    """The loop of Diffrax's "manual stepping" page, as written there (t0 a Python int)."""
    term = lib.ODETerm(lambda t, y, args: -y)
    solver = lib.Tsit5()
    tprev, tnext, y = t0, t0 + dt0, jnp.array(1.0)
    state = solver.init(term, tprev, tnext, y, None)
    times, values = [], []
    while tprev < t1:
        y, _, _, state, _ = solver.step(term, tprev, tnext, y, None, state, made_jump=False)
        times.append(tnext)
        values.append(float(y))
        tprev = tnext
        tnext = min(tprev + dt0, t1)
    return np.array(times), np.array(values)


def test_the_manual_stepping_page_gives_diffrax_values():
    times, ours = _manual_stepping(ode)
    _, theirs = _manual_stepping(diffrax)
    assert len(times) == 20
    np.testing.assert_allclose(ours, theirs, rtol=1e-12)
    np.testing.assert_allclose(ours, np.exp(-times), rtol=1e-8)  # y(1) = exp(-1), no lag


def test_an_int_end_time_in_a_step():
    term, solver = ode.ODETerm(lambda t, y, args: -y), ode.Euler()
    y0 = jnp.array(1.0)
    state = solver.init(term, 0, 1, y0, None)
    y1, *_ = solver.step(term, jnp.array(0), jnp.array(1), y0, None, state, False)
    assert y1.dtype == jnp.float64 and float(y1) == 0.0  # y0 - 1 * y0


def test_func_receives_a_float_time():
    seen = []
    term = ode.ODETerm(lambda t, y, args: seen.append(jnp.result_type(t)) or t * y)
    out = ode.Tsit5().func(term, 2, jnp.array(3.0, jnp.float32), None)
    assert seen == [jnp.float32] and float(out) == 6.0


@pytest.mark.parametrize("controller", [ode.PIDController(rtol=1e-6, atol=1e-6)])
def test_a_controller_takes_int_times(controller):
    term, solver = ode.ODETerm(lambda t, y, args: -y), ode.Tsit5()
    y0 = jnp.array([1.0, 2.0])
    t1, state = controller.init(term, 0, 1, y0, 0.1, None, solver.func, 5)
    assert t1.dtype == jnp.float64 and float(t1) == pytest.approx(0.1)
    y1, y_error, *_ = solver.step(term, 0, 1, y0, None, solver.init(term, 0, 1, y0, None), False)
    accept, next_t0, next_t1, *_ = controller.adapt_step_size(
        0, 1, y0, y1, None, y_error, 5, state
    )
    assert not bool(accept)  # a whole unit step of Tsit5 misses 1e-6
    assert next_t0.dtype == next_t1.dtype == jnp.float64 and float(next_t0) == 0.0
    assert 0 < float(next_t1) < 1


def test_a_solution_evaluated_at_int_times():
    sol = ode.diffeqsolve(
        ode.ODETerm(lambda t, y, args: -y), ode.Tsit5(), 0, 2, 0.01, jnp.array(1.0),
        saveat=ode.SaveAt(dense=True),
    )  # fmt: skip
    np.testing.assert_allclose(sol.evaluate(jnp.arange(3)), np.exp(-np.arange(3)), rtol=1e-8)
    np.testing.assert_allclose(sol.evaluate(1), np.exp(-1), rtol=1e-8)
    np.testing.assert_allclose(sol.derivative(1), -np.exp(-1), rtol=1e-6)
    np.testing.assert_allclose(sol.evaluate(0, 2), np.exp(-2) - 1, rtol=1e-8)
