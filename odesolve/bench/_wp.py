"""WP: work-precision. Each solver with an error estimate swept over rtol 1e-4..1e-10 on the
standard stiff and non-stiff problems (`_test_set`), beside Diffrax's same solver and scipy
(Radau for stiff problems, DOP853 for non-stiff ones), all at the same tolerances. The error
is max |y - ref| / (atol + rtol |ref|) over the save times against scipy at rtol 1e-13.

`python -m odesolve.bench --only WP` measures it; `python -m odesolve.bench._wp RESULTS.json
OUT.png` draws error against run time and against vector-field evaluations, one panel per
problem, as Hairer & Wanner and SciMLBenchmarks draw work-precision diagrams.
"""

import functools
import sys

import jax.numpy as jnp
import numpy as np

from ._limit import evals_per_step, tableau_of
from ._spec import Case, Entry, Target, Work, Workload
from ._test_set import PROBLEMS, scaled_error
from ._workloads import _cases, _row

RTOLS = (1e-4, 1e-6, 1e-8, 1e-10)
STIFF_SOLVERS = ("Kvaerno3", "Kvaerno4", "Kvaerno5")
NON_STIFF_SOLVERS = ("Bosh3", "Tsit5", "Dopri5", "Dopri8", "Kvaerno5")
# Per mode: (problems, solvers per problem kind, tolerances). Quick keeps to a couple of
# minutes: every solver compiles once per problem and library, the tolerance is an input.
SIZES = dict(
    smoke=(("Robertson", "LotkaVolterra"), (("Kvaerno5",), ("Tsit5",)), (1e-4, 1e-6)),
    quick=(
        ("Robertson", "HIRES", "LotkaVolterra", "Pleiades"),
        (("Kvaerno5",), ("Tsit5", "Dopri8")),
        (1e-4, 1e-6, 1e-8),
    ),
    full=(tuple(PROBLEMS), (STIFF_SOLVERS, NON_STIFF_SOLVERS), RTOLS),
)
PROMISE = 3.0


@functools.cache
def _solve_function(lib, problem: str, solver: str):
    """(rtol) -> (ys at the save times, num_steps) with `lib`'s solver: one function per
    problem, solver and library, so one compile serves every tolerance."""
    p = PROBLEMS[problem]
    field, ts, y0 = p.jax_field(), jnp.asarray(p.ts), jnp.asarray(p.y0)

    def solve(rtol):
        sol = lib.diffeqsolve(
            lib.ODETerm(field),
            getattr(lib, solver)(),
            0.0,
            p.t1,
            None,
            y0,
            stepsize_controller=lib.PIDController(rtol=rtol, atol=rtol * p.atol_ratio),
            saveat=lib.SaveAt(ts=ts),
            max_steps=100_000,
        )
        return sol.ys, sol.stats["num_steps"]

    return solve


def _build(lib, problem: str, solver: str, rows: dict):
    return _solve_function(lib, problem, solver)


def _scipy_entry(problem: str, rtol: float) -> Entry:
    """scipy's Radau (stiff) or DOP853 at the same tolerances, with its own evaluation count."""
    from scipy.integrate import solve_ivp

    p = PROBLEMS[problem]
    method = "Radau" if p.stiff else "DOP853"

    def solve(_rtol):
        sol = solve_ivp(
            p.numpy_field(), (0.0, p.t1), np.array(p.y0), method=method,
            rtol=rtol, atol=rtol * p.atol_ratio, dense_output=True,
        )  # fmt: skip
        return sol.sol(np.array(p.ts)).T, Work(steps=len(sol.t) - 1, vf_evals=int(sol.nfev))

    return Entry(f"scipy {method}", lambda rows: solve, eager=True)


def _evals(solver_class):
    """Evaluations from steps for an explicit method (an implicit one's depend on its
    Newton iterations: not counted)."""
    if solver_class.__name__.startswith(("Kvaerno", "Implicit")):
        return None
    per_step = evals_per_step(tableau_of(solver_class))
    return lambda steps: per_step * steps + 1


def _case(problem: str, solver: str, rtol: float, peers: dict, with_scipy: bool) -> Case:
    evals = _evals(getattr(peers["odesolve"], solver))
    entries = [
        Entry(name, functools.partial(_build, peers[name], problem, solver), evals)
        for name in ("odesolve", "diffrax")
        if name in peers
    ]
    if with_scipy:
        entries.append(_scipy_entry(problem, rtol))
    error = lambda ys: scaled_error(problem, ys, rtol)
    label = f"WP {problem} {solver} rtol {rtol:g}"
    return Case("WP", label, (jnp.asarray(rtol),), tuple(entries), error, "error / tolerance")


def _wp_cases(size, peers: dict) -> list[Case]:
    problems, (stiff_solvers, non_stiff_solvers), rtols = size
    cases = []
    for problem in problems:
        solvers = stiff_solvers if PROBLEMS[problem].stiff else non_stiff_solvers
        for i, solver in enumerate(solvers):
            cases += [_case(problem, solver, rtol, peers, with_scipy=i == 0) for rtol in rtols]
    return cases


def _wp_check(rows: list[dict]):
    """odesolve's error within PROMISE times the tolerance on the problems that do not
    amplify errors (Robertson, Van der Pol, HIRES, Lotka-Volterra), for the solvers whose
    estimate bounds their error; the cases past it are named."""
    missed = []
    for case in _cases(rows):
        ours = _row(rows, case, "odesolve")
        bounded = any(name in case for name in ("Robertson", "VanDerPol", "HIRES"))
        bounded = bounded or ("LotkaVolterra" in case and "Kvaerno5" in case)
        if ours is not None and ours["error"] is not None and bounded:
            if ours["error"] > PROMISE:
                missed.append(f"{case} ({ours['error']:.2g})")
    if missed:
        return False, "past 3x the tolerance: " + "; ".join(missed)
    return True, "within 3x the tolerance on the stiff problems and Kvaerno5 on Lotka-Volterra"


WP: Workload = Workload(
    "WP",
    "work-precision, rtol 1e-4..1e-10, against Diffrax and scipy",
    "float64",
    "",
    sizes=SIZES,
    cases=_wp_cases,
    target=Target("error <= 3x the tolerance (stiff problems)", _wp_check),
)


def plot(rows: list[dict], path: str) -> None:
    """Error / tolerance against run time (top) and evaluations (bottom), per problem."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r["workload"] == "WP" and r["error"] is not None]
    problems = list(dict.fromkeys(r["case"].split()[1] for r in rows))
    # One colour per series across every panel; implicit solvers count no evaluations
    # (their Newton iterations vary), so only the others appear in the lower panels.
    colours = {name: f"C{i}" for i, name in enumerate(sorted({_series(r) for r in rows}))}
    fig, axes = plt.subplots(2, len(problems), figsize=(4 * len(problems), 7), squeeze=False)
    for column, problem in enumerate(problems):
        own = [r for r in rows if r["case"].split()[1] == problem]
        for series in sorted({_series(r) for r in own}):
            points = sorted((r for r in own if _series(r) == series), key=_rtol)
            errors = [r["error"] * _rtol(r) for r in points]
            for row_index, key in enumerate(("run_ms", "vf_evals")):
                xs = [r[key] for r in points]
                if all(x is not None for x in xs):
                    axes[row_index, column].loglog(
                        xs, errors, "o-", label=series, color=colours[series]
                    )
        axes[0, column].set_title(problem)
        axes[0, column].set_xlabel("run time (ms)")
        axes[1, column].set_xlabel("vector-field evaluations")
        for ax in axes[:, column]:
            if ax.lines:
                ax.legend(fontsize=7)
    for ax in axes[:, 0]:
        ax.set_ylabel("error (max |y - ref| / (atol/rtol + |ref|))")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _series(row: dict) -> str:
    solver = row["case"].split()[2]
    return row["library"] if row["library"].startswith("scipy") else f"{row['library']} {solver}"


def _rtol(row: dict) -> float:
    return float(row["case"].split()[-1])


if __name__ == "__main__":
    import json

    plot(json.load(open(sys.argv[1]))["rows"], sys.argv[2])
