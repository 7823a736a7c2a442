"""Empirical convergence orders of every explicit solver, and the accuracy of the dense
output, on y' = y cos(t), y(0) = 1, whose solution is exp(sin t).

The problem is non-autonomous, so stage times matter, and unlike a linear autonomous one it
does not let Dopri8 show a spurious ninth order.
"""

import functools

import equinox as eqx
import helpers
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odesolve as ode

T1 = 8.0
MAX_STEPS = 1024  # 8 / (1/128): the smallest step below


def vector_field(t, y, args):
    return y * jnp.cos(t)


def exact(t):
    return np.exp(np.sin(t))


def exact_derivative(t):
    return np.cos(t) * np.exp(np.sin(t))


# Step sizes (a halving ladder) in each method's asymptotic range: large enough that
# round-off does not dominate, small enough that higher-order terms do not.
FIRST_DT = {1: 1 / 16, 2: 1 / 8, 3: 1 / 4, 5: 1 / 16, 8: 1.0}
DTS = {order: dt / 2.0 ** np.arange(4) for order, dt in FIRST_DT.items()}
# Off the step grid, so the interpolant (not the step's endpoint) is measured.
DENSE_TS = np.linspace(0.013, T1 - 0.017, 301)


@functools.cache
def fixed_step_solve(solver):
    @jax.jit
    def solve(dt):
        sol = ode.diffeqsolve(
            ode.ODETerm(vector_field),
            solver,
            0.0,
            T1,
            dt,
            jnp.asarray(1.0),
            saveat=ode.SaveAt(steps=True, dense=True),
            max_steps=MAX_STEPS,
        )
        ts = jnp.asarray(DENSE_TS)
        return sol.ts, sol.ys, sol.evaluate(ts), sol.derivative(ts)

    return solve


def slope(dts, errors):
    return np.polyfit(np.log(dts), np.log(errors), 1)[0]


@pytest.mark.parametrize("entry", helpers.EXPLICIT_SOLVERS, ids=helpers.solver_id)
def test_constant_step_error_converges_at_the_method_order(entry):
    solver, order = entry
    dts = DTS[order]
    errors = []
    for dt in dts:
        ts, ys, _, _ = fixed_step_solve(solver)(dt)
        ts, ys = helpers.finite(ts, ys)
        assert ts[-1] == T1
        errors.append(np.max(np.abs(ys - exact(ts))))
    assert slope(dts, errors) == pytest.approx(order, abs=0.3), errors


@pytest.mark.parametrize("entry", helpers.EXPLICIT_SOLVERS, ids=helpers.solver_id)
def test_dense_output_converges_at_the_interpolant_order(entry):
    solver, order = entry
    dense_order = min(order, helpers.DENSE_ORDER[type(solver).__name__])
    dts = DTS[order]
    errors = [np.max(np.abs(fixed_step_solve(solver)(dt)[2] - exact(DENSE_TS))) for dt in dts]
    assert slope(dts, errors) > dense_order - 0.3, errors


@pytest.mark.parametrize("entry", helpers.EXPLICIT_SOLVERS, ids=helpers.solver_id)
def test_dense_derivative_converges_to_the_exact_derivative(entry):
    solver, order = entry
    dense_order = min(order, helpers.DENSE_ORDER[type(solver).__name__])
    dts = DTS[order]
    errors = [
        np.max(np.abs(fixed_step_solve(solver)(dt)[3] - exact_derivative(DENSE_TS))) for dt in dts
    ]
    # One order is lost by differentiating the interpolant; the linear interpolant of
    # Euler still has a first-order slope.
    assert slope(dts, errors) > max(dense_order - 1, 1) - 0.3, errors


# Tolerances at which each order takes a few hundred steps or fewer on [0, 8].
ADAPTIVE_TOL = {2: 1e-5, 3: 1e-7, 5: 1e-9, 8: 1e-11}


@pytest.mark.parametrize("entry", helpers.ADAPTIVE_SOLVERS, ids=helpers.solver_id)
def test_adaptive_dense_output_matches_the_analytic_solution(entry):
    solver, order = entry
    tol = ADAPTIVE_TOL[order]
    ts = np.linspace(0.0, T1, 401)

    @jax.jit
    def solve():
        sol = ode.diffeqsolve(
            ode.ODETerm(vector_field),
            solver,
            0.0,
            T1,
            None,
            jnp.asarray(1.0),
            saveat=ode.SaveAt(dense=True, t1=True),
            stepsize_controller=ode.PIDController(rtol=tol, atol=tol),
        )
        return sol.ys[0], sol.evaluate(ts), sol.derivative(ts)

    y1, ys, slopes = solve()
    # Global error accumulates over the steps: tens of times the local tolerance.
    np.testing.assert_allclose(ys, exact(ts), rtol=0, atol=100 * tol)
    assert ys[0] == 1.0
    np.testing.assert_allclose(ys[-1], y1, rtol=1e-13)
    np.testing.assert_allclose(slopes, vector_field(ts, ys, None), rtol=0, atol=1e4 * tol)


def rotation_and_decay(t, y, args):
    return {"x": -y["v"], "v": y["x"], "decay": -y["decay"]}


@jax.jit
def pytree_dense_solution():
    y0 = {"x": jnp.asarray(1.0), "v": jnp.asarray(0.0), "decay": jnp.ones((2, 2))}
    return ode.diffeqsolve(
        ode.ODETerm(rotation_and_decay),
        ode.Tsit5(),
        0.0,
        3.0,
        0.1,
        y0,
        saveat=ode.SaveAt(dense=True),
        stepsize_controller=ode.PIDController(rtol=1e-9, atol=1e-9),
    )


def test_dense_output_of_a_pytree_state_matches_the_analytic_solution():
    sol = pytree_dense_solution()
    ts = np.linspace(0.0, 3.0, 50)
    ys = eqx.filter_jit(lambda s: s.evaluate(ts))(sol)
    assert ys["decay"].shape == (50, 2, 2)
    np.testing.assert_allclose(ys["x"], np.cos(ts), atol=1e-7)
    np.testing.assert_allclose(ys["v"], np.sin(ts), atol=1e-7)
    decay = np.exp(-ts)[:, None, None] * np.ones((2, 2))
    np.testing.assert_allclose(ys["decay"], decay, atol=1e-7)


def test_evaluate_and_derivative_at_a_scalar_time_drop_the_time_axis():
    sol = pytree_dense_solution()
    y, dy, increment = eqx.filter_jit(
        lambda s: (s.evaluate(1.5), s.derivative(1.5), s.evaluate(1.0, 2.5))
    )(sol)
    assert y["decay"].shape == (2, 2) and y["x"].shape == ()
    np.testing.assert_allclose(y["x"], np.cos(1.5), atol=1e-7)
    np.testing.assert_allclose(dy["x"], -np.sin(1.5), atol=1e-5)
    np.testing.assert_allclose(increment["v"], np.sin(2.5) - np.sin(1.0), atol=1e-7)
