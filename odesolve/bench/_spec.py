"""The vocabulary of the bench: a workload produces cases; a case holds the entries (one
per library) that solve the same problem on the same inputs and are timed side by side."""

import dataclasses
from collections.abc import Callable
from typing import Any

MODES = ("smoke", "quick", "full")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One library's function for a case.

    - `library`: the label in the table, e.g. "odesolve (tape)".
    - `build`: given the rows measured so far in this case (by label), a pure function of
      the case's inputs returning `(result, num_steps)`; num_steps may be None. Builders
      see earlier rows so a fixed-step limit can take as many steps as odesolve did.
    - `evals`: vector-field evaluations of one forward solve from its step count, or None
      where they are not a function of it (implicit solvers: Newton iterations).
    - `comparable`: whether `result` is the same quantity as the other entries' (a limit
      that saves nothing is not), so its error against the reference means something.
    - `eager`: the function runs as called, outside XLA (the PyTorch peers): nothing is
      compiled, its compile time is its first call minus the median, it has no XLA temp
      memory, and it may return a `Work` in place of num_steps.
    """

    library: str
    build: Callable[[dict], Callable]
    evals: Callable[[int], int] | None = None
    comparable: bool = True
    eager: bool = False


@dataclasses.dataclass(frozen=True)
class Work:
    """Steps and vector-field evaluations of one forward solve as a library counted them
    (torchode's `sol.stats`, calls to torchdiffeq's field); an eager entry returns it in
    place of num_steps."""

    steps: int
    vf_evals: int


@dataclasses.dataclass(frozen=True)
class Case:
    """Entries timed against each other on `inputs` (a tuple of arrays and PyTrees).

    - `error`: maps an entry's result to its error against a tight reference (a float).
    - `error_of`: what that error measures, for the report.
    - `batch`: the number of independent solves per call, when the case reports solves/s.
    """

    workload: str
    label: str
    inputs: tuple
    entries: tuple[Entry, ...]
    error: Callable[[Any], float] | None
    error_of: str
    batch: int | None = None


@dataclasses.dataclass(frozen=True)
class Target:
    """A workload's target (benchmarks/README.md). `check(rows)` returns (met, detail);
    met is None when the rows needed to decide are missing. `ratio`: the ratio to Diffrax
    that odesolve's time must reach, drawn on the plot."""

    text: str
    check: Callable[[list], tuple[bool | None, str]]
    ratio: float | None = None


@dataclasses.dataclass(frozen=True)
class Workload:
    """A named benchmark workload.

    - `dtype`: the precision its states are in (stated explicitly, whatever jax's default).
    - `differentiates`: what reverse mode differentiates, or "" for a forward solve.
    - `sizes`: the size parameter per mode ("smoke", "quick", "full"); `gpu_sizes` override
      them when JAX runs on a GPU.
    - `cases`: `(size, peers) -> list[Case]`, with peers the loaded modules by name.
    - `requires`: odesolve names it needs; without them the workload is skipped.
    - `derive`: for a workload computed from others' rows (W7), `rows -> rows`; it then
      runs the workloads in `needs` instead of cases of its own.
    """

    id: str
    title: str
    dtype: str
    differentiates: str
    sizes: dict
    target: Target
    cases: Callable[[Any, dict], list[Case]] | None = None
    gpu_sizes: dict = dataclasses.field(default_factory=dict)
    requires: tuple[str, ...] = ()
    derive: Callable[[list], list] | None = None
    needs: tuple[str, ...] = ()

    def size(self, mode: str, backend: str) -> Any:
        """The size parameter for `mode` on `backend` ("cpu", "gpu", ...)."""
        if backend == "gpu" and mode in self.gpu_sizes:
            return self.gpu_sizes[mode]
        return self.sizes[mode]
