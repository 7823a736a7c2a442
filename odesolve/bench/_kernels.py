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
condition, evaluated at least once. Predicates: each loop condition and conditional
evaluated, whose result the GPU runtime reads on the host before going on.
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
class Cost:
    """What running a computation once launches.

    - `kernels`: fusions, library calls and unfused operations.
    - `callbacks`: host callbacks it may make (a branch that makes one counts).
    - `predicates`: loop conditions and conditionals it evaluates: on a GPU each brings a
      predicate back to the host, a wait on the device.
    """

    kernels: int = 0
    callbacks: int = 0
    predicates: int = 0

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(
            self.kernels + other.kernels,
            self.callbacks + other.callbacks,
            self.predicates + other.predicates,
        )

    def times(self, count: int) -> "Cost":
        return Cost(self.kernels * count, self.callbacks * count, self.predicates * count)


@dataclasses.dataclass(frozen=True)
class Loop:
    """A `while` loop with no known trip count, as XLA compiled it.

    - `body`, `condition`: what one iteration of its body, and one evaluation of its
      condition, launch (known-trip loops inside expanded).
    - `depth`: how many such loops enclose it (0: at the top of the program).
    - `inner`: how many such loops it encloses, at any depth. Their kernels are launched
      at each of their iterations, which the text does not tell: counted per iteration
      of this loop, they are left out (Diffrax's stage loop runs six or seven times a
      step), so its count is then a lower bound.
    """

    name: str
    body: Cost
    condition: Cost
    depth: int
    inner: int = 0

    @property
    def per_iteration(self) -> Cost:
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
    """The `Cost` of computations, collecting the loops with no known trip count."""

    def __init__(self, computations: dict[str, list[Instruction]]):
        self.computations = computations
        self.loops: list[Loop] = []

    def cost(self, name: str, depth: int) -> Cost:
        return sum((self._cost_of(i, depth) for i in self.computations.get(name, [])), Cost())

    def _cost_of(self, instruction: Instruction, depth: int) -> Cost:
        opcode = instruction.opcode
        if opcode in _FREE:
            return Cost()
        if opcode == "while":
            return self._while(instruction, depth)
        if opcode == "conditional":
            branches = _called(instruction, "branch_computations")
            branches += _called(instruction, "true_computation")
            branches += _called(instruction, "false_computation")
            costs = [self.cost(branch, depth) for branch in branches]
            largest = max((c.kernels for c in costs), default=0)
            callbacks = sum(c.callbacks for c in costs)
            predicates = max((c.predicates for c in costs), default=0)
            return Cost(1 + largest, callbacks, 1 + predicates)
        if opcode == "call":
            return sum((self.cost(c, depth) for c in _called(instruction, "to_apply")), Cost())
        # A fusion, a library call, or an unfused operation.
        return Cost(1, int(_is_callback(instruction)))

    def _while(self, instruction: Instruction, depth: int) -> Cost:
        (body,) = _called(instruction, "body")
        (condition,) = _called(instruction, "condition")
        trips = _trip_count(instruction)
        if trips is not None:
            return (self.cost(body, depth) + self.cost(condition, depth)).times(trips)
        own = Cost(predicates=1)  # the condition's result, read by the host
        found_before = len(self.loops)
        body_cost = self.cost(body, depth + 1)
        condition_cost = self.cost(condition, depth + 1) + own
        loop = Loop(
            instruction.name, body_cost, condition_cost, depth, len(self.loops) - found_before
        )
        self.loops.append(loop)
        # Its parent runs its condition at least once per iteration, even when the
        # nested loop then takes no iteration.
        return loop.condition


def loops(text: str) -> list[Loop]:
    """Every loop with no known trip count in compiled HLO text, outermost first."""
    counter = _Counter(parse(text))
    counter.cost("ENTRY", 0)
    return sorted(counter.loops, key=lambda loop: loop.depth)


def step_loop(found: list[Loop]) -> Loop | None:
    """The loop that takes the steps: of the loops with no known trip count, the one with
    the most kernels per iteration (a loop over save times around it launches fewer)."""
    return max(found, key=lambda loop: loop.per_iteration.kernels, default=None)


def kernel_counts(executable) -> dict | None:
    """For a bench row: per step of a compiled executable's step loop, its kernels (of
    its body and condition) and predicates read by the host, and the loops of unknown
    trip count inside it (their kernels not counted); the host callbacks inside
    any loop; and every loop's kernels per iteration and depth. None when the program
    has no loop (a fixed-step `scan` has a known trip count) or gives no text."""
    try:
        text = executable.as_text()
    except Exception:  # some backends or wrappers give no text; the count is then unknown
        return None
    found = loops(text)
    step = step_loop(found)
    if step is None:
        return None
    return dict(
        per_step=step.per_iteration.kernels,
        body=step.body.kernels,
        condition=step.condition.kernels,
        predicates_per_step=step.per_iteration.predicates,
        inner_loops=step.inner,
        callbacks=sum(loop.per_iteration.callbacks for loop in found),
        loops=[[loop.per_iteration.kernels, loop.depth] for loop in found],
    )


def count(fn: Callable, *inputs) -> dict | None:
    """`kernel_counts` of `jax.jit(fn)` compiled for `inputs`."""
    return kernel_counts(jax.jit(fn).lower(*inputs).compile())
