"""Solves inside Optimistix's solvers, as parameter fitting writes them: the solve's
derivatives are taken by Optimistix, not by the caller."""

import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

import odesolve as ode

optx = pytest.importorskip("optimistix")

TS = jnp.linspace(0.5, 1.0, 4)
Y0 = jnp.array([1.0, 2.0])
RATES = jnp.array([0.7, 1.3])
TARGET = jnp.exp(-TS[:, None] * RATES) * Y0


def residuals(rates, args):
    term = ode.ODETerm(lambda t, y, a: -a * y)
    sol = ode.diffeqsolve(
        term, ode.Tsit5(), 0.0, 1.0, 0.1, Y0, args=rates,
        stepsize_controller=ode.PIDController(rtol=1e-10, atol=1e-10),
        saveat=ode.SaveAt(ts=TS), adjoint=ode.ForwardMode(),
    )  # fmt: skip
    return sol.ys - TARGET


def test_levenberg_marquardt_fits_through_forward_mode():
    # Levenberg-Marquardt applies the linearised solve of its all-zero initial state once
    # (see the next test).
    solver = optx.LevenbergMarquardt(rtol=1e-10, atol=1e-10)
    fit = optx.least_squares(residuals, solver, jnp.zeros(2), max_steps=50)
    np.testing.assert_allclose(fit.value, RATES, rtol=1e-7)


def test_a_linearised_solve_applied_to_zeroed_residuals_ends():
    # What Levenberg-Marquardt does at its first step: the linearised solve, held
    # closure-converted as Lineax holds it, with every array it closes over zero (so
    # are the save times), applied to a tangent. Its loop must end whatever those arrays
    # hold. Run apart, so that a loop that never ends fails this test, not the suite.
    script = """
import equinox as eqx, jax, jax.numpy as jnp, jax.tree_util as jtu
import odesolve as ode
ts = jnp.linspace(0.5, 1.0, 4)
def solve(rates):
    sol = ode.diffeqsolve(ode.ODETerm(lambda t, y, a: -a * y), ode.Tsit5(), 0.0, 1.0, 0.1,
        jnp.array([1.0, 2.0]), args=rates, saveat=ode.SaveAt(ts=ts), adjoint=ode.ForwardMode())
    return sol.ys
_, linear = jax.linearize(solve, jnp.ones(2))
closed = eqx.filter_closure_convert(linear, jnp.ones(2))
zeroed = jtu.tree_map(lambda x: jnp.zeros_like(x) if eqx.is_array(x) else x, closed)
print(eqx.filter_jit(lambda f, v: f(v))(zeroed, jnp.ones(2)).shape)
"""
    try:
        run = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the linearised solve of zeroed residuals did not end in 120 s")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["(4,", "2)"]
