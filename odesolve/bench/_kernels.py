"""Kernels per step: how many separate operations a compiled loop body launches, read from
the compiled HLO text (`jax.jit(f).lower(*inputs).compile().as_text()`).

On a GPU every fusion, library call (a matrix product) or unfused operation left in a
`while` body is one kernel launch per iteration, and each iteration also runs the loop's
condition and brings its predicate back to the host. For a small field the launches, not
the arithmetic, set the time of a step. XLA decides fusion per backend, so the count is
that of the backend the function was compiled for.

What counts: every instruction of a computation except those that only name or regroup
buffers (parameters, constants, tuples, bitcasts). A nested loop with a trip count that
XLA knows (a `scan` over the stages) counts its body that many times; a conditional
counts one for its predicate and its largest branch. A nested loop with no known trip
count is a loop of its own: it is reported apart, and counts in its parent only its
condition, evaluated at least once.
"""

import dataclasses
import re
from collections.abc import Callable

import jax

# Instructions that launch nothing: they name, regroup or reinterpret buffers.
_FREE = frozenset(
    {
        "parameter",
        "constant",
        "get-tuple-element",
        "tuple",
        "bitcast",
        "after-all",
        "opt-barrier",
        "partition-id",
        "replica-id",
    }
)
_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_TRIP_COUNT = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"')


@dataclasses.dataclass(frozen=True)
class Instruction:
    name: str
    opcode: str
    text: str  # the rest of the line: operands and attributes


@dataclasses.dataclass(frozen=True)
class Loop:
    """A `while` loop with no known trip count, as XLA compiled it.

    - `body`: kernels per iteration of its body (known-trip loops inside expanded).
    - `condition`: kernels per evaluation of its condition.
    - `callbacks`: host callbacks its body or condition may make per iteration (a branch
      that makes one counts), each a round trip to Python.
    - `depth`: how many such loops enclose it (0: at the top of the program).
    """

    name: str
    body: int
    condition: int
    callbacks: int
    depth: int

    @property
    def per_iteration(self) -> int:
        return self.body + self.condition


def _opcode(rest: str) -> str:
    """The opcode after an instruction's result type (a shape, or a tuple of shapes)."""
    if rest.startswith("("):
        depth = 0
        for i, char in enumerate(rest):
            depth += {"(": 1, ")": -1}.get(char, 0)
            if depth == 0:
                rest = rest[i + 1 :]
                break
    else:
        rest = rest.split(" ", 1)[1] if " " in rest else ""
    return rest.strip().split("(", 1)[0].strip()


def parse(text: str) -> dict[str, list[Instruction]]:
    """The computations of an HLO module's text by name; the entry one also as "ENTRY"."""
    computations: dict[str, list[Instruction]] = {}
    current: list[Instruction] | None = None
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header and not line.startswith(" "):
            current = computations.setdefault(header.group(1), [])
            if line.startswith("ENTRY"):
                computations["ENTRY"] = current
            continue
        if line.startswith("}"):
            current = None
            continue
        match = _INSTRUCTION.match(line)
        if current is not None and match:
            rest = match.group(2)
            current.append(Instruction(match.group(1), _opcode(rest), rest))
    return computations


def _called(instruction: Instruction, attribute: str) -> list[str]:
    """Computation names in `attribute=%a` or `attribute={%a, %b}`."""
    found = re.search(r"\b" + attribute + r"=(\{[^}]*\}|[^\s,]+)", instruction.text)
    if found is None:
        return []
    names = found.group(1).strip("{}").split(",")
    return [name.strip().lstrip("%") for name in names]


def _trip_count(instruction: Instruction) -> int | None:
    found = _TRIP_COUNT.search(instruction.text)
    return None if found is None else int(found.group(1))


def _is_callback(instruction: Instruction) -> bool:
    """A custom call into Python (`jax.debug.callback`, `pure_callback`, `io_callback`)."""
    target = re.search(r'custom_call_target="([^"]*)"', instruction.text)
    return instruction.opcode == "custom-call" and target is not None and "callback" in target[1]


class _Counter:
    """Kernels and host callbacks of computations, as `(kernels, callbacks)` pairs,
    collecting the loops with no known trip count."""

    def __init__(self, computations: dict[str, list[Instruction]]):
        self.computations = computations
        self.loops: list[Loop] = []

    def cost(self, name: str, depth: int) -> tuple[int, int]:
        costs = [self._cost_of(i, depth) for i in self.computations.get(name, [])]
        return sum(k for k, _ in costs), sum(c for _, c in costs)

    def _cost_of(self, instruction: Instruction, depth: int) -> tuple[int, int]:
        opcode = instruction.opcode
        if opcode in _FREE:
            return 0, 0
        if opcode == "while":
            return self._while(instruction, depth)
        if opcode == "conditional":
            branches = _called(instruction, "branch_computations")
            branches += _called(instruction, "true_computation")
            branches += _called(instruction, "false_computation")
            costs = [self.cost(branch, depth) for branch in branches]
            return 1 + max((k for k, _ in costs), default=0), sum(c for _, c in costs)
        if opcode == "call":
            costs = [self.cost(c, depth) for c in _called(instruction, "to_apply")]
            return sum(k for k, _ in costs), sum(c for _, c in costs)
        # A fusion, a library call, or an unfused operation.
        return 1, int(_is_callback(instruction))

    def _while(self, instruction: Instruction, depth: int) -> tuple[int, int]:
        (body,) = _called(instruction, "body")
        (condition,) = _called(instruction, "condition")
        trips = _trip_count(instruction)
        if trips is not None:
            (k_body, c_body), (k_cond, c_cond) = (
                self.cost(body, depth),
                self.cost(condition, depth),
            )
            return trips * (k_body + k_cond), trips * (c_body + c_cond)
        (k_body, c_body), (k_cond, c_cond) = (
            self.cost(body, depth + 1),
            self.cost(condition, depth + 1),
        )
        self.loops.append(Loop(instruction.name, k_body, k_cond, c_body + c_cond, depth))
        # Its parent runs its condition at least once per iteration, even when the
        # nested loop then takes no iteration.
        return k_cond, c_cond


def loops(text: str) -> list[Loop]:
    """Every loop with no known trip count in compiled HLO text, outermost first."""
    counter = _Counter(parse(text))
    counter.cost("ENTRY", 0)
    return sorted(counter.loops, key=lambda loop: loop.depth)


def step_loop(found: list[Loop]) -> Loop | None:
    """The loop that takes the steps: of the loops with no known trip count, the one with
    the most kernels per iteration (a loop over save times around it launches fewer)."""
    return max(found, key=lambda loop: loop.per_iteration, default=None)


def kernel_counts(executable) -> dict | None:
    """Kernels per step of a compiled executable's step loop, of every loop (per
    iteration, depth), and the host callbacks inside loops: a dict for a bench row, or None when the program has no loop (a fixed-step `scan` is unrolled
    or has a known trip count) or its text cannot be read."""
    try:
        text = executable.as_text()
    except Exception:  # some backends or wrappers give no text; the count is then unknown
        return None
    found = loops(text)
    step = step_loop(found)
    if step is None:
        return None
    return dict(
        per_step=step.per_iteration,
        body=step.body,
        condition=step.condition,
        callbacks=sum(loop.callbacks for loop in found),
        loops=[[loop.per_iteration, loop.depth] for loop in found],
    )


def count(fn: Callable, *inputs) -> dict | None:
    """`kernel_counts` of `jax.jit(fn)` compiled for `inputs`."""
    return kernel_counts(jax.jit(fn).lower(*inputs).compile())
