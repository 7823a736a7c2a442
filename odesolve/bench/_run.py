"""Running a selection of workloads: which to run, in what order, and collecting rows."""

import time

import jax

from ._measure import add_ratios, measure_case, progress
from ._peers import load_peers
from ._spec import Workload
from ._workloads import WORKLOADS

# Medians over many interleaved rounds: these machines are shared and noisy, and a round
# of the small workloads costs milliseconds.
REPEATS = dict(smoke=1, quick=21, full=21)
# Seconds of timed calls a case may take; full mode always makes every repeat.
BUDGET_S = dict(smoke=None, quick=10.0, full=None)


def selection(only: str | None) -> list[Workload]:
    """The workloads named in `only` ("W2,W4"; all when None), plus those a derived one
    needs, in W1..W7 order."""
    ids = {w.upper(): w for w in WORKLOADS}  # "w3p" names W3p
    names = set(WORKLOADS)
    if only:
        names = {ids.get(n.strip().upper(), n.strip()) for n in only.split(",")}
    unknown = names - set(WORKLOADS)
    if unknown:
        raise ValueError(
            f"--only: unknown workloads {sorted(unknown)}; choose from {list(WORKLOADS)}"
        )
    for name in list(names):
        names |= set(WORKLOADS[name].needs)
    return [w for w in WORKLOADS.values() if w.id in names]


def missing_requirements(workload: Workload, odesolve_module) -> list[str]:
    """The odesolve names `workload` needs that this odesolve does not have."""
    return [name for name in workload.requires if not hasattr(odesolve_module, name)]


def run_workload(
    workload: Workload, mode: str, repeats: int, peers: dict, cache: dict | None = None
) -> list[dict]:
    """Rows of every case of one (non-derived) workload; `cache` holds the run's
    executables, so a function two workloads share is compiled once."""
    size = workload.size(mode, jax.default_backend())
    progress(f"{workload.id}: {workload.title}" + ("" if size is None else f" (size {size})"))
    assert workload.cases is not None  # a derived workload is not run on its own
    cases = workload.cases(size, peers)
    progress(f"  {workload.id}: problems and reference solutions ready")
    rows = []
    for case in cases:
        rows += add_ratios(measure_case(case, repeats, BUDGET_S[mode], cache))
    return rows


def run(only: str | None = None, mode: str = "quick", repeats: int | None = None) -> dict:
    """Measure the selected workloads; everything the report needs, as one dict."""
    repeats = REPEATS[mode] if repeats is None else repeats
    peers, notes = load_peers()
    for note in notes:
        progress(note)
    rows: list[dict] = []
    skipped: dict = {}
    cache: dict = {}
    start = time.perf_counter()
    for workload in selection(only):
        missing = missing_requirements(workload, peers["odesolve"])
        if missing:
            skipped[workload.id] = f"{workload.id} skipped: odesolve has no {', '.join(missing)}"
            progress(skipped[workload.id])
        elif workload.derive is not None:
            rows += workload.derive(rows)
        else:
            rows += run_workload(workload, mode, repeats, peers, cache)
    return dict(
        rows=rows,
        notes=notes + list(skipped.values()),
        skipped=skipped,
        peers=peers,
        mode=mode,
        repeats=repeats,
        seconds=time.perf_counter() - start,
    )


SMOKE_NOTE = (
    "smoke run: tiny sizes and 1 repeat, to check that the bench runs; not a measurement, "
    "so no target is judged"
)


def targets(rows: list[dict], skipped: dict, judge: bool = True) -> dict:
    """Per measured workload: its target text, ratio, whether it is met, and the figures.
    With `judge` False (a smoke run) `met` is None: tiny sizes say nothing about a target."""
    verdicts = {}
    for workload in WORKLOADS.values():
        own = [row for row in rows if row["workload"] == workload.id]
        if not own or workload.id in skipped:
            continue
        met, detail = workload.target.check(own) if judge else (None, "not judged: smoke run")
        verdicts[workload.id] = dict(
            target=workload.target.text, ratio=workload.target.ratio, met=met, detail=detail
        )
    return verdicts
