"""Standard non-stiff problems (DETEST classes A-E, the Arenstorf orbit) solved with the
adaptive high-order solvers at tight tolerance, against closed forms where they exist and
otherwise against scipy's DOP853 at rtol = atol = 1e-12.

Several problems are solved at once as one PyTree state (a dict keyed by problem name): one
compile for many problems, and the state is a mixed-shape PyTree as users write them. Tsit5
solves every problem; Dopri5 and Dopri8 three each, which between them cover every class
(compiling each problem costs a fraction of a second per solver).
"""

import functools

import helpers
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate

import odesolve as ode

SAVE_TS = np.linspace(0.0, 20.0, 9)
# (solver, rtol = atol of the solve, rtol = atol of the comparison). The comparison allows
# for global error accumulating over ~1e2-1e3 steps, and for D5's near-collision.
TSIT5 = (ode.Tsit5(), 1e-10, 3e-6)
DOPRI5 = (ode.Dopri5(), 1e-10, 3e-6)
DOPRI8 = (ode.Dopri8(), 1e-12, 1e-8)
# Between them, Dopri5 and Dopri8 see every class.
SUBSETS = {"Dopri5": ("A2", "B5", "D3"), "Dopri8": ("C1", "D5", "E2")}


def scipy_reference(rhs, y0, t1, ts):
    sol = scipy.integrate.solve_ivp(
        rhs,
        (0.0, t1),
        np.asarray(y0, float),
        method="DOP853",
        rtol=1e-12,
        atol=1e-12,
        t_eval=ts,
    )
    assert sol.success, sol.message
    return sol.y.T


PROBLEMS = {p.name: p for ps in helpers.DETEST.values() for p in ps}


@functools.cache
def reference(name):
    problem = PROBLEMS[name]
    if problem.exact is not None:
        return problem.exact(SAVE_TS)
    return scipy_reference(problem.numpy_vector_field, problem.y0, problem.t1, SAVE_TS)


def solve_class(problems, solver, tol):
    def vector_field(t, y, args):
        return {p.name: p.vector_field(t, y[p.name], args) for p in problems}

    y0 = {p.name: jnp.asarray(p.y0) for p in problems}
    return ode.diffeqsolve(
        ode.ODETerm(vector_field),
        solver,
        0.0,
        20.0,
        None,
        y0,
        saveat=ode.SaveAt(ts=SAVE_TS),
        stepsize_controller=ode.PIDController(rtol=tol, atol=tol),
        max_steps=16384,
    )


def assert_matches_references(sol, problems, compare):
    assert sol.result == ode.RESULTS.successful
    np.testing.assert_array_equal(sol.ts, SAVE_TS)
    for p in problems:
        np.testing.assert_allclose(
            sol.ys[p.name], reference(p.name), rtol=compare, atol=compare, err_msg=p.name
        )


@pytest.mark.parametrize("cls", sorted(helpers.DETEST))
def test_tsit5_solves_every_detest_problem_of_a_class(cls):
    solver, tol, compare = TSIT5
    problems = helpers.DETEST[cls]
    assert_matches_references(solve_class(problems, solver, tol), problems, compare)


@pytest.mark.parametrize("entry", [DOPRI5, DOPRI8], ids=helpers.solver_id)
def test_solver_solves_detest_problems_of_several_classes(entry):
    solver, tol, compare = entry
    problems = [PROBLEMS[name] for name in SUBSETS[type(solver).__name__]]
    assert_matches_references(solve_class(problems, solver, tol), problems, compare)


# Arenstorf (1963); Hairer, Norsett & Wanner I, sec. II.0: a periodic orbit of a light
# body around the Earth-Moon system, with near-collisions that need adaptive steps.
MU = 0.012277471
ARENSTORF_Y0 = (0.994, 0.0, 0.0, -2.00158510637908252240537862224)
ARENSTORF_PERIOD = 17.0652165601579625588917206249


def arenstorf_rhs(t, y, xp):
    x, z, vx, vz = y[0], y[1], y[2], y[3]
    d1 = ((x + MU) ** 2 + z**2) ** 1.5
    d2 = ((x - (1 - MU)) ** 2 + z**2) ** 1.5
    ax = x + 2 * vz - (1 - MU) * (x + MU) / d1 - MU * (x - (1 - MU)) / d2
    az = z - 2 * vx - (1 - MU) * z / d1 - MU * z / d2
    return [vx, vz, ax, az]


ARENSTORF_TS = np.linspace(0.0, ARENSTORF_PERIOD, 7)


@functools.cache
def arenstorf_reference():
    return scipy_reference(
        lambda t, y: np.array(arenstorf_rhs(t, y, np)),
        ARENSTORF_Y0,
        ARENSTORF_PERIOD,
        ARENSTORF_TS,
    )


@pytest.mark.parametrize("entry", [TSIT5, DOPRI8], ids=helpers.solver_id)
def test_arenstorf_orbit_matches_reference_and_closes(entry):
    solver, tol, compare = entry
    sol = ode.diffeqsolve(
        ode.ODETerm(lambda t, y, args: jnp.stack(arenstorf_rhs(t, y, jnp))),
        solver,
        0.0,
        ARENSTORF_PERIOD,
        None,
        jnp.asarray(ARENSTORF_Y0),
        saveat=ode.SaveAt(ts=ARENSTORF_TS, t1=True),
        stepsize_controller=ode.PIDController(rtol=tol, atol=tol),
        max_steps=16384,
    )
    # The orbit is sensitive: errors grow through each near-collision with the Moon.
    loose = 10 * compare
    np.testing.assert_allclose(sol.ys[:-1], arenstorf_reference(), rtol=0, atol=loose)
    np.testing.assert_allclose(sol.ys[-1], ARENSTORF_Y0, rtol=0, atol=loose)
    # ts[-1] is t1 exactly: the interpolant there is the step's end, up to round-off.
    np.testing.assert_allclose(sol.ys[-1], sol.ys[-2], rtol=1e-13, atol=1e-15)


def test_arenstorf_reference_itself_closes():
    # Guards the transcription of the equations: scipy must also return to y0.
    np.testing.assert_allclose(arenstorf_reference()[-1], ARENSTORF_Y0, atol=1e-6)
