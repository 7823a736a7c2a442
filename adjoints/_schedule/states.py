"""States only: online thinning of bare loop states, each tick's VJP recomputed from the
state before it.

Taping stores a step's residuals, whose size depends on how the field is written (a
field that differentiates itself, `jacfwd` inside it, stores every tangent it made) and
can be many times a state's. Within a fixed budget such rows leave only a few slots, so
online slots with residuals thin almost at once and recompute ticks several times over.
Bare states are small: many more fit, a solve of up to `slots` ticks recomputes no tick
forwards, and each tick's VJP (the step linearised again from its state, as Diffrax's
reverse sweep does) costs the same however the field is written. States are kept before
steps only, without what a step never reads (see `_slots`).
"""

import equinox as eqx
from jaxtyping import Array, Bool

from .._arguments import check_count
from .._keeping import bare_step
from .._loop import Write
from .._reverse_recompute import reverse_recompute
from .._sweep import Backward, Cotangents, Kept, Run, Tick
from ._base import AbstractSchedule, Sizing
from ._slots import emit_passing, empty_slots, keep_before, record_after
from .online import Online


class States(AbstractSchedule):
    """Keep at most `slots` (>= 2) bare states of a loop of unknown length, placed and
    thinned as `Online` places them. `checkpoints`: states of the step loop, a slot per
    emit added (None: as the adjoint says, else as many as its budget holds)."""

    slots: int | None = eqx.field(static=True, default=None)
    checkpoints: int | None = eqx.field(static=True, default=None)

    def __check_init__(self) -> None:
        if self.slots is not None and self.slots < 2:
            raise ValueError(f"States(slots={self.slots}): keep at least 2 states.")
        check_count("States", "checkpoints", self.checkpoints, 1, "states")

    def sized(self, sizing: Sizing) -> "States":
        if self.slots is not None:
            return States(min(self.slots, sizing.bound))
        if self.checkpoints is None and sizing.checkpoints is None:
            bare = sizing.budget // max(sizing.bare, 1)
        else:
            bare = sizing.slots(self.checkpoints)
        return States(max(2, min(bare, sizing.bound)))

    def _online(self) -> Online:
        assert self.slots is not None  # sized
        return Online(self.slots)

    def empty(self, run: Run) -> Kept:
        assert self.slots is not None  # sized
        slots = run.step_packing.empty(self.slots + 1)
        return empty_slots(run, slots, self._online().init(), keeps_last=False)

    def step(self, run: Run, at: Tick, kept: Kept, active: Bool[Array, ""]) -> tuple[Tick, Kept]:
        kept, _ = keep_before(self._online().store, run, at, kept, active, run.step_packing)
        after = bare_step(run, at, active)
        return after, record_after(run, kept, at, after, active)

    def emit(
        self, run: Run, at: Tick, kept: Kept, active: Bool[Array, ""]
    ) -> tuple[Tick, tuple[Write, ...], Kept]:
        return emit_passing(run, at, kept, active)

    def reverse(self, back: Backward) -> Cotangents:
        return reverse_recompute(back, before_steps=True)[0]
