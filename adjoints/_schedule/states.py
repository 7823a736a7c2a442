"""States only: online thinning of bare loop states, each tick's VJP recomputed from the
state before it.

Taping stores a step's residuals, whose size depends on how the field is written (a
field that differentiates itself, `jacfwd` inside it, stores every tangent it made) and
can be many times a state's. Within a fixed budget such rows leave only a few slots, so
online slots with residuals thin almost at once and recompute ticks several times over.
Bare states are small: many more fit, a solve of up to `slots` ticks recomputes no tick
forwards, and each tick's VJP (the step linearised again from its state, as Diffrax's
reverse sweep does) costs the same however the field is written.
"""

from typing import ClassVar

import equinox as eqx
from jaxtyping import Array, ArrayLike, Bool, Int, PyTree

from .._loop import Buffers, Loop, Write
from .._packing import Packing
from .._reverse_recompute import reverse_recompute
from .._sweep import Cotangents, SlotIndex, Sweep
from ._base import AbstractSchedule, Stored
from .online import Online


class States(AbstractSchedule):
    """Keep at most `slots` (>= 2) bare states of a loop of unknown length, placed and
    thinned as `Online` places them."""

    slots: int = eqx.field(static=True)
    keeps_residuals: ClassVar[bool] = False

    def __check_init__(self) -> None:
        if self.slots < 2:
            raise ValueError(f"States(slots={self.slots}): keep at least 2 states.")

    def init(self) -> PyTree:
        return Online(self.slots).init()

    def store(
        self,
        k: Int[Array, ""],
        state: PyTree,
        slot_index: SlotIndex | None,
        active: Bool[ArrayLike, ""] = True,
    ) -> Stored:
        return Online(self.slots).store(k, state, slot_index, active)

    def reverse(
        self,
        loop: Loop,
        params: PyTree,
        diff: PyTree[bool],
        init: PyTree,
        sweep: Sweep,
        scratch: tuple[Write, ...],
        start: Cotangents,
        ct_buffers: Buffers,
        batched: bool,
    ) -> Cotangents:
        rest = (scratch, Packing.of(init), batched)
        return reverse_recompute(loop, params, diff, sweep, start, ct_buffers, *rest)[0]
