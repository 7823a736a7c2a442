"""Taping: keep every tick's row, so the reverse sweep recomputes nothing: a step's row
holds its residuals (its VJP is their pullback, no evaluation of the step), an emit's the
carry before it. Memory grows linearly with the loop's bound; the default adjoint uses
this when it fits its budget."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Bool

from .._keeping import emit_tick, taped_step
from .._loop import Write
from .._residuals import tape_rows
from .._reverse_tape import reverse_tape
from .._sweep import Backward, Cotangents, Kept, Run, Tick
from ._base import AbstractSchedule, Sizing


class Tape(AbstractSchedule):
    """Tape every tick: a step's residuals, the carry before an emit, so that the reverse
    sweep evaluates no step again. `slots`: rows, one per tick of the loop's bound (None:
    sized for the loop)."""

    slots: int | None = eqx.field(static=True, default=None)

    def sized(self, sizing: Sizing) -> "Tape":
        return Tape(sizing.bound)

    def _row(self, at: Tick, active: Bool[Array, ""]) -> Array:
        assert self.slots is not None  # sized
        return jnp.where(active, at.k, self.slots)

    def empty(self, run: Run) -> Kept:
        assert self.slots is not None  # sized
        return None, tape_rows(run.loop, run.params, run.diff, run.init)[1].empty(self.slots + 1)

    def step(self, run: Run, at: Tick, kept: Kept, active: Bool[Array, ""]) -> tuple[Tick, Kept]:
        rows = tape_rows(run.loop, run.params, run.diff, run.init)
        at, tape = taped_step(run, rows, at, kept[1], self._row(at, active), active)
        return at, (None, tape)

    def emit(
        self, run: Run, at: Tick, kept: Kept, active: Bool[Array, ""]
    ) -> tuple[Tick, tuple[Write, ...], Kept]:
        rows = tape_rows(run.loop, run.params, run.diff, run.init)[1]
        tape = rows.put_carry(kept[1], self._row(at, active), at.carry)
        at, writes = emit_tick(run, at, active)
        return at, writes, (None, tape)

    def reverse(self, back: Backward) -> Cotangents:
        run = back.run
        rows = tape_rows(run.loop, run.params, run.diff, run.init)
        span = (jnp.int32(0), back.sweep.n - 1)
        return reverse_tape(run, back.sweep.kept[1], rows, span, back.start, back.ct_buffers)[0]
