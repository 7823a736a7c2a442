"""Taping: keep the state before every tick, so the reverse sweep recomputes nothing but
the vector-Jacobian product of each tick (one forward evaluation inside it). Memory grows
linearly with the loop's bound; the default adjoint uses this when it fits its budget."""

from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Int, PyTree

from .._loop import Buffers, Loop, Write
from .._residuals import tape_rows
from .._reverse_tape import reverse_tape
from .._sweep import Cotangents, SlotIndex, Sweep
from ._base import AbstractSchedule, Stored


class Tape(AbstractSchedule):
    """Store every tick's row: `slots` is the loop's bound on ticks."""

    slots: int = eqx.field(static=True)
    tapes: ClassVar[bool] = True
    recomputes: ClassVar[bool] = False

    def init(self) -> Int[Array, ""]:
        return jnp.zeros((), jnp.int32)

    def store(
        self,
        k: Int[Array, ""],
        unused: PyTree,
        slot_index: SlotIndex | None,
        active: Bool[ArrayLike, ""] = True,
    ) -> Stored:
        return jnp.asarray(True), k.astype(jnp.int32), slot_index, unused

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
        rows = tape_rows(loop, params, diff, init)
        span = (jnp.int32(0), sweep.n - 1)
        taped = (loop, params, diff, sweep.slots)
        return reverse_tape(*taped, span, start, ct_buffers, rows, batched)[0]
