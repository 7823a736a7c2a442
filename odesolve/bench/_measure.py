"""Measuring one case: compile each entry, check its result, time all of them interleaved.

- Compile time: wall time of `jax.jit(f).lower(*inputs).compile()` (trace, lower and XLA
  compile; the first call of a jitted function pays exactly this on top of a run). A
  function that two cases share (the same object on inputs of the same shapes: W6's
  gradient at W3's batch) is compiled once per run and reports that one compile time.
- Run time: median over `repeats` rounds; each round calls every entry once, in turn, and
  blocks on its result, so load from other users of the machine hits all entries alike.
  A compiled entry's timed call follows an untimed call of the same entry: a call right
  after another entry's pays for what that one left (XLA:CPU's temp buffer is allocated
  per call, and after a larger one is freed it can come back as fresh pages: see
  benchmarks/README.md), where a training loop calls one function over and over.
  The compiled (XLA) entries' rounds run first, then the eager (PyTorch) entries' (see
  `interleaved_medians`).
  With a time budget, slow cases get fewer rounds (at least 3; the row says how many);
  eager entries are budgeted apart, and sit out the rounds past their own count.
- Memory: XLA's temp buffer size from the compiled executable (deterministic).
- Kernels per step: operations launched per iteration of the compiled step loop, and the
  predicates (loop conditions, conditionals) a GPU reads on the host per step, from the
  executable's HLO text (`_kernels`).
- Work: steps from the solver's stats (largest over a batch: a vmapped loop runs that many
  iterations), vector-field evaluations from the steps.
- Eager entries (PyTorch) are called as they are: no compile, no XLA memory; their
  "compile time" is, by the same definition, their first call minus the median (warm-up:
  allocations, lazy initialisation), and they count their own steps and evaluations.
"""

import dataclasses
import statistics
import sys
import time
from collections.abc import Callable

import jax
import numpy as np

from ._kernels import kernel_counts
from ._spec import Case, Entry, Work


@dataclasses.dataclass
class Compiled:
    """An entry's executable and what compiling it told us."""

    executable: Callable
    compile_s: float
    temp_bytes: int | None
    reused: bool = False  # from the run's cache: compile_s is that of the first compile
    kernels: dict | None = None  # `_kernels.kernel_counts` of the executable


def _signature(fn: Callable, inputs: tuple) -> tuple:
    """What identifies an executable: the function object and its inputs' structure and
    abstract values (shape, dtype, weak type)."""
    leaves, treedef = jax.tree_util.tree_flatten(inputs)
    return fn, treedef, tuple(jax.typeof(x) for x in leaves)


def compile_function(fn: Callable, inputs: tuple, cache: dict | None = None) -> Compiled:
    """Compile `fn` for `inputs`, timing trace + lower + XLA compile; with `cache` (a dict
    kept for one run), a function already compiled for such inputs is not compiled again."""
    key = None if cache is None else _signature(fn, inputs)
    if cache is not None and key in cache:
        return dataclasses.replace(cache[key], reused=True)
    start = time.perf_counter()
    executable = jax.jit(fn).lower(*inputs).compile()
    compile_s = time.perf_counter() - start
    analysis = executable.memory_analysis()
    # Some backends return no analysis (or a list of one per device).
    if isinstance(analysis, list | tuple):
        analysis = analysis[0] if analysis else None
    temp = None if analysis is None else int(analysis.temp_size_in_bytes)
    compiled = Compiled(executable, compile_s, temp, kernels=kernel_counts(executable))
    if cache is not None:
        cache[key] = compiled
    return compiled


def prepare(entry: Entry, rows: dict, inputs: tuple, cache: dict | None = None) -> Compiled:
    """The callable to time for `entry` (built given the case's `rows` so far): compiled by
    XLA, or as built for an eager entry (its compile time is set once its median is known)."""
    function = entry.build(rows)
    if entry.eager:
        return Compiled(function, compile_s=0.0, temp_bytes=None)
    return compile_function(function, inputs, cache)


def timed_call(executable: Callable, inputs: tuple) -> float:
    """Seconds for one call, including waiting for the result."""
    start = time.perf_counter()
    jax.block_until_ready(executable(*inputs))
    return time.perf_counter() - start


def interleaved_medians(
    executables: list,
    inputs: tuple,
    repeats: list[int],
    groups: list | None = None,
    settle: list[bool] | None = None,
) -> list[float]:
    """Median seconds per call of each executable, calling them in turn, round after round;
    executable i takes part in the first `repeats[i]` rounds. With `groups` (a key per
    executable), each group's rounds run apart, one group after another. The bench groups
    the XLA entries apart from the eager PyTorch ones, so that the ratio to Diffrax
    compares calls made close together: a round with the eager entries lasts up to
    seconds (W1, W2), and on one 2-core run W3's odesolve and Diffrax measured 30.5 and
    30.5 ms interleaved with the PyTorch peers, 18.2 and 23.0 ms without them. Where
    `settle[i]`, each timed call of executable i follows an untimed one."""
    groups = groups or [None] * len(executables)
    settle = settle or [False] * len(executables)
    samples: list[list[float]] = [[] for _ in executables]
    for group in dict.fromkeys(groups):
        members = [i for i, g in enumerate(groups) if g == group]
        for round_index in range(max(repeats[i] for i in members)):
            for i in members:
                if round_index < repeats[i]:
                    if settle[i]:
                        jax.block_until_ready(executables[i](*inputs))
                    samples[i].append(timed_call(executables[i], inputs))
    return [statistics.median(times) for times in samples]


def _work(entry: Entry, num_steps) -> tuple[int | None, int | None]:
    """(steps, vector-field evaluations) from what an entry returned: a `Work`, or a step
    count (the largest over a batch), or None."""
    if isinstance(num_steps, Work):
        return num_steps.steps, num_steps.vf_evals
    steps = None if num_steps is None else int(np.max(np.asarray(num_steps)))
    return steps, None if steps is None or entry.evals is None else int(entry.evals(steps))


_STARTED = time.perf_counter()


def progress(message: str) -> None:
    """One line of progress on stderr, so stdout stays the table; prefixed by the seconds
    since the bench started, to show where a run's time goes."""
    print(f"[{time.perf_counter() - _STARTED:6.1f} s] {message}", file=sys.stderr, flush=True)


def _first_row(case: Case, entry: Entry, compiled: Compiled) -> dict:
    """Run a freshly compiled entry once (warm-up) and record everything but its run time."""
    start = time.perf_counter()
    result, num_steps = jax.block_until_ready(compiled.executable(*case.inputs))
    warm_s = time.perf_counter() - start
    steps, vf_evals = _work(entry, num_steps)
    error = case.error(result) if case.error is not None and entry.comparable else None
    return dict(
        workload=case.workload,
        case=case.label,
        library=entry.library,
        compile_s=compiled.compile_s,
        compile_reused=compiled.reused,
        compiled=not entry.eager,
        temp_bytes=compiled.temp_bytes,
        kernels_per_step=_count(compiled, "per_step"),
        predicates_per_step=_count(compiled, "predicates_per_step"),
        inner_loops_per_step=_count(compiled, "inner_loops"),
        steps=steps,
        vf_evals=vf_evals,
        error=error,
        error_of=case.error_of if error is not None else None,
        batch=case.batch,
        warm_s=warm_s,
    )


def _count(compiled: Compiled, name: str) -> int | None:
    """One of `_kernels.kernel_counts`' figures for the compiled step loop, or None."""
    return None if compiled.kernels is None else compiled.kernels[name]


def _prepared(row: dict, compiled: Compiled) -> str:
    """How an entry got ready, for the progress line."""
    first = f"first call {row['warm_s']:.2f} s"
    if not row["compiled"]:
        return f"called as is, outside jit, {first}"
    how = "compiled earlier in this run, in" if compiled.reused else "compiled in"
    return f"{how} {compiled.compile_s:.2f} s, {first}"


def affordable_repeats(repeats: int, seconds_per_round: float, budget_s: float | None) -> int:
    """`repeats`, or fewer (never under 3) when a round of calls is so slow that they
    would take more than `budget_s` (quick mode: it has minutes, not hours)."""
    if budget_s is None or seconds_per_round * repeats <= budget_s:
        return repeats
    return max(min(repeats, 3), int(budget_s / seconds_per_round))


def repeats_per_entry(
    compiled: list[bool], first_calls: list[float], repeats: int, budget_s: float | None
) -> list[int]:
    """Timed calls of each entry: `affordable_repeats` of the compiled (JAX) entries
    together, and of the eager ones apart, so that slow PyTorch peers cost the JAX rows
    none of their repeats."""
    counts = {}
    for kind in (True, False):
        seconds = sum(first for first, c in zip(first_calls, compiled) if c == kind)
        counts[kind] = affordable_repeats(repeats, seconds, budget_s)
    return [counts[c] for c in compiled]


def _record_time(row: dict, seconds: float, first_s: float, repeats: int, batch) -> None:
    """Set a row's median run time (and solves/s for a batch); for an eager entry also its
    compile time, the first call minus the median."""
    row["run_ms"], row["repeats"] = 1e3 * seconds, repeats
    row["solves_per_s"] = None if batch is None else batch / seconds
    if not row["compiled"]:
        row["compile_s"] = max(first_s - seconds, 0.0)


def measure_case(
    case: Case, repeats: int, budget_s: float | None = None, cache: dict | None = None
) -> list[dict]:
    """One row per entry of `case`: compile time, run time, memory, steps, error."""
    rows: dict = {}
    executables = []
    for entry in case.entries:
        compiled = prepare(entry, rows, case.inputs, cache)
        rows[entry.library] = _first_row(case, entry, compiled)
        executables.append(compiled.executable)
        progress(f"  {case.label}: {entry.library} {_prepared(rows[entry.library], compiled)}")
    first_calls = [row.pop("warm_s") for row in rows.values()]
    is_compiled = [row["compiled"] for row in rows.values()]
    counts = repeats_per_entry(is_compiled, first_calls, repeats, budget_s)
    medians = interleaved_medians(executables, case.inputs, counts, is_compiled, is_compiled)
    for row, seconds, first_s, count in zip(rows.values(), medians, first_calls, counts):
        _record_time(row, seconds, first_s, count, case.batch)
    progress(
        f"  {case.label}: {max(counts)} timed rounds: "
        + ", ".join(f"{name} {row['run_ms']:.3g} ms" for name, row in rows.items())
    )
    return list(rows.values())


def add_ratios(rows: list[dict], key: str = "run_ms", base: str = "diffrax") -> list[dict]:
    """Set each row's `ratio`: its `key` over that of `base` in the same case (lower is
    better); None where the case has no `base` row (Diffrax not installed)."""
    reference = {row["case"]: row[key] for row in rows if row["library"] == base}
    for row in rows:
        denominator = reference.get(row["case"])
        row["ratio"] = None if not denominator else row[key] / denominator
    return rows
