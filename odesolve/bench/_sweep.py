"""Ensemble scaling: W6 (the neural field, forward and gradient) and W10 (Lorenz, forward)
measured at growing batch sizes, solves per second of odesolve, Diffrax and the fixed-step
scan limit at each, and a plot of the curves.

The error against a reference is measured at the first size only (W10 measures it on its
first samples at every size): a scipy reference of 2^18 neural solves would take minutes.
A size is skipped, and every larger one, when the previous size's time, doubled, would
run past the deadline; a size that fails (out of memory) is reported and ends the sweep.
"""

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

from . import _w10
from ._limit import tableau_of
from ._measure import add_ratios, measure_case
from ._spec import Case
from ._workloads import (
    _neural_functions,
    _neural_problem,
    _w6_cases,
    _w6_limit,
    _with_each_api,
)

# Library rows drawn on the scaling plot, with their colours.
CURVES = {
    "odesolve": "tab:blue",
    "diffrax": "tab:orange",
    "lax.scan Tsit5 (limit)": "tab:gray",
    _w10.LIMIT_ROW: "tab:gray",
}


def w6_cases(batch: int, peers: dict, with_error: bool) -> list[Case]:
    """W6's forward and gradient cases at `batch`; without their error unless asked."""
    if with_error:
        return _w6_cases(batch, peers)
    params, field, y0s, ts = _neural_problem(batch)
    tableau = tableau_of(peers["odesolve"].Tsit5)
    cases = []
    for index, kind in enumerate(("forward", "gradient")):
        # The entries are built later: bind this kind's function now.
        make = lambda lib, index=index: _neural_functions(lib, batch)[index]
        entries = _with_each_api(peers, make)
        entries.append(_w6_limit(tableau, field, ts, kind == "gradient"))
        label = f"W6 {kind} B={batch}"
        cases.append(Case("W6", label, (params, y0s), tuple(entries), None, "", batch))
    return cases


def w10_cases(batch: int, peers: dict, with_error: bool) -> list[Case]:
    """W10's case at `batch` (its error is cheap at any size)."""
    return _w10.cases(batch, peers, same_method=False)


SWEEPS: dict[str, Callable[[int, dict, bool], list[Case]]] = {"W6": w6_cases, "W10": w10_cases}


@dataclasses.dataclass(frozen=True)
class Budget:
    """Timed rounds per case, seconds of timed calls per case, and the deadline of the
    sweep on `time.perf_counter()`."""

    repeats: int
    case_s: float | None
    deadline: float


def _size_rows(cases: list[Case], budget: Budget, cache: dict) -> list[dict]:
    rows = []
    for case in cases:
        rows += add_ratios(measure_case(case, budget.repeats, budget.case_s, cache))
    return rows


def sweep(
    workload: str, sizes: list[int], peers: dict, budget: Budget, log: Callable[[str], None]
) -> tuple[list[dict], list[str]]:
    """Rows of `workload` at each of `sizes` (smallest first) and notes on sizes skipped
    or failed."""
    rows: list[dict] = []
    notes: list[str] = []
    last_s = 0.0
    for index, size in enumerate(sizes):
        left = budget.deadline - time.perf_counter()
        if 2 * last_s > left:
            notes.append(f"{workload} sweep: sizes {sizes[index:]} skipped ({left:.0f} s left)")
            log(notes[-1])
            break
        start = time.perf_counter()
        log(f"{workload} sweep: {size} samples")
        try:
            # A fresh cache per size: each size compiles anew anyway.
            rows += _size_rows(SWEEPS[workload](size, peers, index == 0), budget, {})
        except Exception as error:  # out of memory at a large size ends the sweep there
            failure = f"{type(error).__name__}: {str(error)[:300]}"
            notes.append(f"{workload} sweep at {size} samples failed: {failure}")
            log(notes[-1])
            break
        last_s = time.perf_counter() - start
    return rows, notes


def _kind(case: str) -> str:
    """A case's label without its batch size: "W6 forward B=1024" -> "W6 forward"."""
    return case.rsplit(" B=", 1)[0]


def curves(rows: list[dict]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """{case kind: {library: [(batch, solves per second), ...]}} from a sweep's rows."""
    found: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for row in rows:
        if row.get("solves_per_s") is None or row["library"] not in CURVES:
            continue
        points = found.setdefault(_kind(row["case"]), {}).setdefault(row["library"], [])
        points.append((row["batch"], row["solves_per_s"]))
    return found


def write_plot(path: Path, rows: list[dict], title: str) -> bool:
    """Solves per second against batch size, one panel per case kind, log-log. False
    without matplotlib or without rows."""
    try:
        import matplotlib
    except ImportError:
        return False
    found = curves(rows)
    if not found:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(found), figsize=(4.2 * len(found), 3.6), squeeze=False)
    for ax, (kind, libraries) in zip(axes[0], found.items()):
        for library, points in libraries.items():
            sizes, rates = zip(*sorted(points))
            style = "--" if "limit" in library else "-"
            ax.plot(sizes, rates, style, marker="o", color=CURVES[library], label=library)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("samples (vmap)")
        ax.set_ylabel("solves per second")
        ax.set_title(kind, fontsize=10)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True

