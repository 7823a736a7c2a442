"""Taping: keep the state before every tick, so the reverse sweep recomputes nothing but
the vector-Jacobian product of each tick (one forward evaluation inside it). Memory grows
linearly with the loop's bound; the default adjoint uses this when it fits its budget."""

from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp

from .._residuals import tape_rows
from .._reverse_tape import reverse_tape
from ._base import AbstractSchedule


class Tape(AbstractSchedule):
    """Store every tick's row: `slots` is the loop's bound on ticks."""

    slots: int = eqx.field(static=True)
    tapes: ClassVar[bool] = True
    recomputes: ClassVar[bool] = False

    def init(self):
        return jnp.zeros((), jnp.int32)

    def store(self, k, unused, slot_index, active=True):
        return jnp.asarray(True), k.astype(jnp.int32), slot_index, unused

    def reverse(self, loop, params, diff, init, sweep, scratch, start, ct_buffers, batched):
        rows = tape_rows(loop, params, diff, init)
        span = (jnp.int32(0), sweep.n - 1)
        taped = (loop, params, diff, sweep.slots)
        return reverse_tape(*taped, span, start, ct_buffers, rows, batched)[0]
