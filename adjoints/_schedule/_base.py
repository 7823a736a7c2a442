"""What a checkpoint schedule is: a whole strategy for reversing a loop. It says what it
keeps at each tick of the forward sweep, and runs the reverse sweep from what it kept.

The forward sweep (`adjoints._forward`) knows no schedule: it runs the ticks in the
order `_ticks` gives and asks the schedule to take each one (`step`, `emit`), starting
from what `empty` returns. What a schedule keeps is a pair (`Kept`): a part selected per
sample under `vmap` (a schedule's counters, the carry before the last tick) and a part
written only through scratch rows (slots, a tape, a decision record).

A schedule is written by the user without the loop's size (`Revolve(checkpoints=8)`) and
sized for the loop by `sized` when the loop is differentiated.
"""

import abc
from collections.abc import Callable

import equinox as eqx
from jaxtyping import Array, Bool

from .._loop import Write
from .._sweep import Backward, Cotangents, Kept, Run, Tick

# The fewest states a recomputing schedule keeps: `checkpoints=1` (Diffrax's least) is
# taken as 2, the initial state and one more to recompute from.
MIN_SLOTS = 2


class Sizing(eqx.Module):
    """What sizing a schedule for a loop may read.

    - `bound`: the most ticks the loop can take; `num_steps`: its exact number of steps
      when known at trace time (else None); `max_emits`: the most emit ticks.
    - `state`, `row`, `slot`: bytes of a stored state, of a tape row (a step's residuals
      or a state, the larger), of an online slot (a state and residuals beside it);
      `bare`: of a state stored before a step (`Run.step_packing`: without what a step
      never reads).
    - `budget`: bytes each solve may keep. `checkpoints`: the adjoint's count of states
      of the step loop, or None (then sized by `budget`).
    """

    bound: int
    num_steps: int | None
    max_emits: int
    state: int
    row: int
    slot: int
    budget: int
    checkpoints: int | None
    bare: int

    @property
    def offline(self) -> bool:
        """Whether the number of steps is known and nothing is emitted between them."""
        return self.num_steps is not None and self.max_emits == 0

    def slots(self, checkpoints: int | None = None) -> int:
        """States to keep: `checkpoints` (else the adjoint's) states of the step loop and
        a slot per emit, or as many online slots as the budget holds."""
        count = self.checkpoints if checkpoints is None else checkpoints
        if count is None:
            return max(MIN_SLOTS, self.budget // max(self.slot, 1))
        return max(MIN_SLOTS, count + self.max_emits)


class AbstractSchedule(eqx.Module):
    """A checkpoint schedule: what the forward sweep keeps, and the reverse sweep."""

    @abc.abstractmethod
    def sized(self, sizing: Sizing) -> "AbstractSchedule":
        """This schedule sized for a loop (its fields left as None filled in)."""

    @abc.abstractmethod
    def empty(self, run: Run) -> Kept:
        """What the forward sweep keeps before its first tick."""

    @abc.abstractmethod
    def step(self, run: Run, at: Tick, kept: Kept, active: Bool[Array, ""]) -> tuple[Tick, Kept]:
        """Take the step at `at` (one, or a run of steps known to keep nothing, then one),
        keeping what the reverse sweep needs of it. Where not `active` (see `_ticks`),
        nothing changes but scratch rows."""

    @abc.abstractmethod
    def emit(
        self, run: Run, at: Tick, kept: Kept, active: Bool[Array, ""]
    ) -> tuple[Tick, tuple[Write, ...], Kept]:
        """Take the emit at `at`, keeping what the reverse sweep needs of it; also returns
        the emit's writes."""

    def run_of_steps(self, run: Run) -> Callable[[Tick, Kept], tuple[Tick, Kept]] | None:
        """Unbatched: how to take the steps before the next emit at once (from a tick
        where one is due), or None: `step` after `step`."""
        return None

    @abc.abstractmethod
    def reverse(self, back: Backward) -> Cotangents:
        """The reverse sweep: cotangents of (the initial carry, the differentiated
        parameters)."""
