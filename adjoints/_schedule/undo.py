"""Reversing by undoing, for a loop whose ticks can be undone (`Loop.reversal`, a
reversible solver): keep only what undoing cannot rebuild, and reverse by undoing the
ticks one by one from the final carry (`adjoints._reversible`).

The forward sweep keeps, for each emit, its tick and what `Reversal.keep` says of the
carry before it (times, counters, output progress: a few scalars, never the state
vectors), and the same for each step unless `Reversal.rewind` rebuilds it (fixed steps;
adaptive ones keep the step sizes the controller chose).
"""

import jax.numpy as jnp
from jaxtyping import Array, Bool, PyTree

from .._keeping import bare_step, emit_tick
from .._loop import Loop, Reversal, Write
from .._reversible import empty_records, record, reverse_sweep
from .._sweep import Backward, Cotangents, Kept, Run, Tick
from ._base import AbstractSchedule, Sizing


def _reversal(run: Run) -> Reversal:
    assert run.loop.reversal is not None  # checked by `ReversibleAdjoint`
    return run.loop.reversal


class Undo(AbstractSchedule):
    """Keep what undoing the ticks cannot rebuild; reverse by undoing them."""

    def sized(self, sizing: Sizing) -> "Undo":
        return self

    def empty(self, run: Run) -> Kept:
        """(emits so far, the records)."""
        records = empty_records(run.loop, _reversal(run), run.params, run.init)
        return jnp.zeros((), jnp.int32), records

    def step(self, run: Run, at: Tick, kept: Kept, active: Bool[Array, ""]) -> tuple[Tick, Kept]:
        emits, records = kept
        if records.steps is not None:  # `keep` is traced only where kept
            small = _reversal(run).keep(at.carry)
            records = record(records, small, (at.k, emits), False, active)
        return bare_step(run, at, active), (emits, records)

    def emit(
        self, run: Run, at: Tick, kept: Kept, active: Bool[Array, ""]
    ) -> tuple[Tick, tuple[Write, ...], Kept]:
        emits, records = kept
        records = record(records, _reversal(run).keep(at.carry), (at.k, emits), True, active)
        after, writes = emit_tick(run, at, active)
        return after, writes, (emits + active.astype(jnp.int32), records)

    def reverse(self, back: Backward) -> Cotangents:
        run, sweep = back.run, back.sweep
        emits, records = sweep.kept
        kept = (sweep.final, records, sweep.n, emits)
        return reverse_sweep(
            run.loop,
            _reversal(run),
            run.params,
            run.diff,
            run.init,
            kept,
            back.start[0],
            back.ct_buffers,
            run.batched,
        )


def choose_undo(loop: Loop, init: PyTree, params: PyTree, diff: PyTree, batch_size: int) -> Undo:
    """`ReversibleAdjoint`'s schedule, whatever the loop."""
    return Undo()
