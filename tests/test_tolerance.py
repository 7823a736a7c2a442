"""The tolerance as a promise: on standard stiff and non-stiff problems, the global error at
the save times, in units of the tolerance asked for (max |y - ref| / (atol + rtol |ref|)),
stays within a small constant at rtol 1e-4 to 1e-10, for every solver with an error
estimate. References: scipy's Radau (stiff) or DOP853 (non-stiff) at rtol 1e-13
(`odesolve.bench._test_set`).

A step-size controller bounds each step's local error; the global error is that summed
and carried along by the problem's dynamics. Where the dynamics amplify it, no solver
with local error control reaches a factor 3, and the bound below says by how much it is
exceeded (measured identically for Diffrax's solvers at the same tolerances: same steps,
same errors). The default run checks a fast subset; `-m matrix` the whole table.
"""

import functools

import jax.numpy as jnp
import numpy as np
import pytest

import odesolve as ode
from odesolve.bench._test_set import PROBLEMS, scaled_error

STIFF = ("Robertson", "VanDerPol", "HIRES")
NON_STIFF = ("LotkaVolterra", "Arenstorf", "Pleiades")
IMPLICIT = ("Kvaerno3", "Kvaerno4", "Kvaerno5", "ImplicitEuler")
EXPLICIT = ("Heun", "Midpoint", "Ralston", "Bosh3", "Tsit5", "Dopri5", "Dopri8")
RTOLS = (1e-4, 1e-6, 1e-8, 1e-10)
PROMISE = 3.0

# Where the global error exceeds PROMISE, by how much and why (problem-wide or per solver).
AMPLIFIED = {
    # Arenstorf's orbit passes close to the Moon and Pleiades has close encounters: a
    # local error there grows by orders of magnitude before the next save time, in every
    # explicit method (Diffrax's at the same tolerances: the same ratios, 1e3 to 6e4).
    "Arenstorf": 1e5,
    "Pleiades": 5e3,
}
SOLVER_AMPLIFIED = {
    # Lotka-Volterra over six periods: a phase error grows linearly with time. The
    # lower-order and the Dormand-Prince estimates let more of it through at loose
    # tolerances (Diffrax: the same ratios).
    ("Dopri5", "LotkaVolterra"): 150.0,
    ("Bosh3", "LotkaVolterra"): 120.0,
    ("Tsit5", "LotkaVolterra"): 15.0,
    ("Dopri8", "LotkaVolterra"): 12.0,
    ("Midpoint", "LotkaVolterra"): 8.0,
    ("Ralston", "LotkaVolterra"): 8.0,
    # Kvaerno3's published second-order embedding bounds its error less tightly; the only
    # L-stable first-order alternative on its stages costs 10x the steps.
    ("Kvaerno3", "LotkaVolterra"): 60.0,
    ("Kvaerno3", "HIRES"): 20.0,
}
# Low-order methods at tight tolerances take 1e5-1e6 steps: not how they are used.
LOOSEST = {"Heun": 1e-6, "Midpoint": 1e-6, "Ralston": 1e-6, "ImplicitEuler": 1e-6, "Bosh3": 1e-8}


def bound(solver: str, problem: str, rtol: float) -> float:
    if solver == "ImplicitEuler":
        # First order with an error estimate per step: the global error is ~ sqrt(tol),
        # not ~ tol (so the ratio grows 10x per 100x tighter tolerance; Diffrax: the same).
        return 5.0 / rtol**0.5
    return SOLVER_AMPLIFIED.get((solver, problem), AMPLIFIED.get(problem, PROMISE))


def cases():
    fast = {
        ("Kvaerno5", "Robertson", 1e-6),
        ("Kvaerno5", "Robertson", 1e-8),
        ("Tsit5", "LotkaVolterra", 1e-8),
        ("Kvaerno5", "LotkaVolterra", 1e-6),
    }
    out = []
    for problem in STIFF + NON_STIFF:
        # Implicit Euler is for stiff problems: on these its error, ~ sqrt(tol) (below),
        # is also amplified (Lotka-Volterra at rtol 1e-6: 8e4 tol; Pleiades does not end
        # within 2e5 steps at 1e-4).
        solvers = IMPLICIT if problem in STIFF else EXPLICIT + IMPLICIT[:-1]
        for solver in solvers:
            for rtol in RTOLS:
                if rtol < LOOSEST.get(solver, 0.0):
                    continue
                if solver == "KenCarp3" and (problem, rtol) in KENCARP3_SPREAD:
                    continue  # checked as a spread (below)
                marks = () if (solver, problem, rtol) in fast else (pytest.mark.matrix,)
                out.append(pytest.param(solver, problem, rtol, marks=marks))
    return out


@functools.cache
def _solve(solver: str, problem: str, rtol: float):
    p = PROBLEMS[problem]
    return ode.diffeqsolve(
        ode.ODETerm(p.jax_field()),
        getattr(ode, solver)(),
        0.0,
        p.t1,
        None,
        jnp.array(p.y0),
        stepsize_controller=ode.PIDController(rtol=rtol, atol=rtol * p.atol_ratio),
        saveat=ode.SaveAt(ts=jnp.array(p.ts)),
        max_steps=200_000,
    )


@pytest.mark.parametrize("solver,problem,rtol", cases())
def test_global_error_within_tolerance(solver, problem, rtol):
    sol = _solve(solver, problem, rtol)
    error = scaled_error(problem, sol.ys, rtol)
    limit = bound(solver, problem, rtol)
    steps = int(sol.stats["num_steps"])
    print(f"{solver} {problem} rtol {rtol:g}: error {error:.3g} tol, {steps} steps")
    assert error <= limit, (error, limit)


# IMEX solvers take MultiTerm(non-stiff, stiff): each problem's field split into an
# explicit part (below) and the rest, stepped implicitly. Robertson: the slow reaction
# (rate 0.04) explicit; Van der Pol: the harmonic oscillator explicit, the stiff damping
# implicit; HIRES stiff as a whole; Lotka-Volterra non-stiff as a whole (the explicit
# method and its error estimate alone).
def _robertson_slow(t, y, xp):
    slow = 0.04 * y[0]
    return [-slow, slow, 0.0 * y[2]]


def _oscillator(t, y, xp):
    return [y[1], -y[0]]


EXPLICIT_PART = {
    "Robertson": _robertson_slow,
    "VanDerPol": _oscillator,
    "HIRES": lambda t, y, xp: [0.0 * y[i] for i in range(8)],
    "LotkaVolterra": lambda t, y, xp: PROBLEMS["LotkaVolterra"].rhs(t, y, xp),
}
IMEX = ("KenCarp3", "KenCarp4", "KenCarp5")
IMEX_BOUND = {
    # The dense output of order 3 between long steps (the steps themselves: 0.02 tol).
    ("KenCarp4", "HIRES"): 6.0,
    # Loose tolerances on Lotka-Volterra let a phase error through (as Tsit5's above).
    ("KenCarp4", "LotkaVolterra"): 8.0,
    ("KenCarp5", "LotkaVolterra"): 8.0,
}
# KenCarp3 keeps its published second-order embedding (the only L-stable one on its four
# stages is of order 1 and takes 10 to 30 times the steps): its bounds as measured.
KENCARP3_BOUND = {"Robertson": 20.0, "VanDerPol": 25.0, "HIRES": 40.0, "LotkaVolterra": 60.0}
# At rtol 1e-6 its error on the split Van der Pol oscillator depends chaotically on
# rounding in the step sizes: rtol x (1 + 1e-3 k), k = 0..7, gave 13 to 104 times the
# tolerance (a median of 31), and the same spread whether the step factor is raised by
# XLA's power or as exp(c log x). It is checked as that spread (Diffrax's KenCarp3 does
# not finish this problem within 200,000 steps).
KENCARP3_SPREAD = {("VanDerPol", 1e-6): (40.0, 120.0)}  # (median, largest) over 8 rtols
# A split Van der Pol at rtol 1e-8 takes 1e5 steps: the oscillator's explicit part is
# stiff in the fast transitions, where its velocity is of order mu.
IMEX_TIGHTEST = {"VanDerPol": 1e-6}


def imex_cases():
    fast = {
        ("KenCarp4", "Robertson", 1e-6),
        ("KenCarp5", "Robertson", 1e-8),
        ("KenCarp4", "LotkaVolterra", 1e-8),
    }
    out = []
    for problem in EXPLICIT_PART:
        for solver in IMEX:
            for rtol in RTOLS:
                if rtol < IMEX_TIGHTEST.get(problem, 0.0):
                    continue
                if solver == "KenCarp3" and (problem, rtol) in KENCARP3_SPREAD:
                    continue  # checked as a spread (below)
                marks = () if (solver, problem, rtol) in fast else (pytest.mark.matrix,)
                out.append(pytest.param(solver, problem, rtol, marks=marks))
    return out


def split_terms(problem: str) -> ode.MultiTerm:
    """MultiTerm(explicit part, the rest) of the problem's field."""
    rhs, explicit = PROBLEMS[problem].rhs, EXPLICIT_PART[problem]
    rest = lambda t, y, xp: [f - e for f, e in zip(rhs(t, y, xp), explicit(t, y, xp))]
    as_term = lambda part: ode.ODETerm(lambda t, y, args: jnp.stack(part(t, y, jnp)))
    return ode.MultiTerm(as_term(explicit), as_term(rest))


@pytest.mark.parametrize("solver,problem,rtol", imex_cases())
def test_imex_global_error_within_tolerance(solver, problem, rtol):
    p = PROBLEMS[problem]
    sol = ode.diffeqsolve(
        split_terms(problem), getattr(ode, solver)(), 0.0, p.t1, None, jnp.array(p.y0),
        stepsize_controller=ode.PIDController(rtol=rtol, atol=rtol * p.atol_ratio),
        saveat=ode.SaveAt(ts=jnp.array(p.ts)), max_steps=200_000,
    )  # fmt: skip
    error = scaled_error(problem, sol.ys, rtol)
    if solver == "KenCarp3":
        limit = KENCARP3_BOUND[problem]
    else:
        limit = IMEX_BOUND.get((solver, problem), PROMISE)
    steps = int(sol.stats["num_steps"])
    print(f"{solver} {problem} (split) rtol {rtol:g}: error {error:.3g} tol, {steps} steps")
    assert error <= limit, (error, limit)


@pytest.mark.matrix
@pytest.mark.parametrize("problem, rtol", list(KENCARP3_SPREAD))
def test_kencarp3_error_spread_within_its_measured_bounds(problem, rtol):
    p = PROBLEMS[problem]
    errors = []
    for k in range(8):
        tol = rtol * (1 + 1e-3 * k)
        sol = ode.diffeqsolve(
            split_terms(problem), ode.KenCarp3(), 0.0, p.t1, None, jnp.array(p.y0),
            stepsize_controller=ode.PIDController(rtol=tol, atol=tol * p.atol_ratio),
            saveat=ode.SaveAt(ts=jnp.array(p.ts)), max_steps=200_000,
        )  # fmt: skip
        errors.append(scaled_error(problem, sol.ys, tol))
    median_bound, largest_bound = KENCARP3_SPREAD[(problem, rtol)]
    errors.sort()
    median = (errors[3] + errors[4]) / 2
    assert median <= median_bound and errors[-1] <= largest_bound, errors


# At rtol = atol = 1e-3 the Newton iterations decide the steps as much as the error
# estimate: a stage that needed a fresh Jacobian to converge once let HIRES take one step
# from t = 242 to 322 (Kvaerno4: 6.4 tol off, its dense output midway) and Robertson's
# y2 leave the basin where the solution stays positive (Kvaerno4 lost it). Ten save
# times over HIRES's interval; Robertson to t = 1e5.
LOOSE_TIMES = {
    "HIRES": tuple(float(t) for t in np.linspace(0.0, 321.8122, 11)[1:]),
    "Robertson": (1e-3, 1e-1, 10.0, 1e3, 1e5),
}


@functools.cache
def _loose_reference(problem: str) -> np.ndarray:
    from scipy.integrate import solve_ivp

    p, ts = PROBLEMS[problem], np.array(LOOSE_TIMES[problem])
    ref = solve_ivp(
        p.numpy_field(), (0.0, ts[-1]), np.array(p.y0), method="Radau", t_eval=ts,
        rtol=1e-12, atol=1e-16,
    )  # fmt: skip
    return ref.y.T


@pytest.mark.parametrize(
    "solver, problem",
    [
        pytest.param(solver, problem, marks=() if solver == "Kvaerno4" else pytest.mark.matrix)
        for solver in ("Kvaerno3", "Kvaerno4", "Kvaerno5")
        for problem in LOOSE_TIMES
    ],
)
def test_stiff_problems_at_a_loose_tolerance(solver, problem):
    p, ts, tol = PROBLEMS[problem], jnp.array(LOOSE_TIMES[problem]), 1e-3
    sol = ode.diffeqsolve(
        ode.ODETerm(p.jax_field()), getattr(ode, solver)(), 0.0, ts[-1], None,
        jnp.array(p.y0), stepsize_controller=ode.PIDController(rtol=tol, atol=tol),
        saveat=ode.SaveAt(ts=ts),
    )  # fmt: skip
    ref = _loose_reference(problem)
    error = float(np.max(np.abs(np.asarray(sol.ys) - ref) / (tol + tol * np.abs(ref))))
    print(f"{solver} {problem} rtol=atol=1e-3: error {error:.3g} tol")
    assert error <= PROMISE, error
