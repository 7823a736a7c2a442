"""Time inputs: derivatives with respect to a declared discontinuity time (`jump_ts`), and
times given as integers or lists.

y' = -y + H(s - t), a forcing that switches on at time t, declared to the controller as a
jump; S = integral of y over [0, 1], carried as a second state. dS/dt = -(1 - e^(t - 1)):
the derivative flows through the step that ends at the jump and the one that starts after
it, whose lengths move with t.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np

import odesolve as ode

T = 0.5
EXACT = -(1 - np.exp(T - 1))


def _integral(t, solver, adjoint):
    field = lambda s, y, args: (-y[0] + jnp.where(s < t, 0.0, 1.0), y[0])
    controller = ode.PIDController(rtol=1e-8, atol=1e-8, jump_ts=jnp.asarray(t)[None])
    sol = ode.diffeqsolve(
        ode.ODETerm(field),
        solver,
        0.0,
        1.0,
        None,
        (1.0, 0.0),
        stepsize_controller=controller,
        adjoint=adjoint or ode.RecursiveCheckpointAdjoint(),
        max_steps=512,
    )
    return sol.ys[1][0]


def test_derivative_with_respect_to_a_jump_time_dopri8():
    # (The other solvers and the adjoints: test_time_derivative_table.py.)
    solver = ode.Dopri8()
    derivative = jax.jit(jax.grad(lambda t: _integral(t, solver, None)))(T)
    # The computed solution's own derivative: central differences of our solves agree to
    # their truncation error, and the exact derivative to the solver's (rtol 1e-8).
    h = 1e-6
    solve = jax.jit(lambda t: _integral(t, solver, None))
    central = (solve(T + h) - solve(T - h)) / (2 * h)
    np.testing.assert_allclose(derivative, central, rtol=1e-6)
    np.testing.assert_allclose(derivative, EXACT, rtol=1e-6)


def _decay(t0, t1, y0, **kwargs):
    return ode.diffeqsolve(
        ode.ODETerm(lambda t, y, args: -y), ode.Tsit5(), t0, t1, None, y0, **kwargs
    )


def test_integer_step_times_under_strict_promotion():
    # conftest sets jax_numpy_dtype_promotion="strict": an int64 step time beside float64
    # times was a TypePromotionError.
    pid = ode.PIDController(rtol=1e-8, atol=1e-8, step_ts=[3, 4])
    sol = _decay(0.0, 10.0, jnp.array([1.0]), stepsize_controller=pid)
    np.testing.assert_allclose(sol.ys[-1], np.exp(-10.0), atol=1e-8)
    sol = _decay(0, 4, jnp.array([1.0]), stepsize_controller=ode.StepTo([0, 1, 2, 3, 4]))
    assert sol.ys.dtype == jnp.float64


def test_step_times_take_the_solves_time_dtype():
    pid = ode.PIDController(rtol=1e-5, atol=1e-5, step_ts=[0.5])  # Python floats: float64
    y0 = jnp.array([1.0], jnp.float32)
    sol = _decay(jnp.float32(0), jnp.float32(1), y0, stepsize_controller=pid)
    np.testing.assert_allclose(sol.ys[-1], np.exp(-1.0), rtol=1e-4)


def test_save_times_as_a_list_raise_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        saveat = ode.SaveAt(ts=[0.5, 1.0])
        pid = ode.PIDController(rtol=1e-8, atol=1e-8)
        sol = _decay(0.0, 1.0, jnp.array([1.0]), saveat=saveat, stepsize_controller=pid)
    np.testing.assert_allclose(sol.ys[:, 0], np.exp(-np.array([0.5, 1.0])), rtol=1e-5)


def test_a_time_in_both_jump_ts_and_step_ts_solves_as_a_jump():
    field = lambda t, y, args: jnp.stack([y[1], -y[0] + jnp.where(t < 7.5, 0.0, 1.0)])
    for t0, t1 in [(0.0, 10.0), (10.0, 0.0)]:
        ends = []
        for times in [dict(jump_ts=[7.5]), dict(jump_ts=[7.5], step_ts=[7.5])]:
            pid = ode.PIDController(rtol=1e-6, atol=1e-6, **times)
            sol = ode.diffeqsolve(
                ode.ODETerm(field), ode.Dopri5(), t0, t1, None, jnp.array([1.0, 0.0]),
                stepsize_controller=pid,
            )  # fmt: skip
            ends.append(sol.ys[-1])
        np.testing.assert_array_equal(ends[0], ends[1])
