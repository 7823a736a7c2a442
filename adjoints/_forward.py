"""The forward sweep of a checkpointed loop: run the ticks, the schedule taking each and
keeping what its reverse sweep needs.

The output buffers are never kept: they are written, not carried. Under `vmap` the
samples move in lockstep (see `_ticks`): a sample that has finished, or does not keep
anything at this tick, writes to scratch rows.
"""

import jax.numpy as jnp
from jaxtyping import Array, Bool, PyTree

from ._loop import Buffers, apply_writes
from ._schedule import AbstractSchedule
from ._sweep import Run, Sweep, Tick
from ._ticks import Ticks, run_ticks

# (the tick, the part of what is kept that is selected per sample)
_Small = tuple[Tick, PyTree]


def forward_sweep(
    run: Run, schedule: AbstractSchedule, buffers: Buffers
) -> tuple[PyTree, Buffers, Sweep]:
    """Run the loop, `schedule` keeping what it needs. Returns the final carry, the
    buffers and what the schedule kept (`Sweep`)."""

    def step(small: _Small, stored: PyTree, active: Bool[Array, ""]) -> tuple[_Small, PyTree]:
        at, kept = schedule.step(run, small[0], (small[1], stored), active)
        return (at, kept[0]), kept[1]

    def emit(
        small: _Small, large: tuple[PyTree, Buffers], active: Bool[Array, ""]
    ) -> tuple[_Small, tuple[PyTree, Buffers]]:
        stored, bufs = large
        at, writes, kept = schedule.emit(run, small[0], (small[1], stored), active)
        return (at, kept[0]), (kept[1], apply_writes(bufs, writes, active, run.batched))

    run_steps = None if run.batched else schedule.run_of_steps(run)

    def steps(small: _Small, stored: PyTree) -> tuple[_Small, PyTree]:
        assert run_steps is not None
        at, kept = run_steps(small[0], (small[1], stored))
        return (at, kept[0]), kept[1]

    loop, params = run.loop, run.params
    ticks = Ticks(
        going=lambda s: loop.going(params, s[0].carry),
        pending=lambda s: loop.pending(s[0].carry),
        step=step,
        emit=emit,
        steps=None if run_steps is None else steps,
    )
    small, stored = schedule.empty(run)
    start = (Tick(jnp.int32(0), run.init), small)
    (at, small), stored, buffers = run_ticks(ticks, start, stored, buffers, run.batched)
    return at.carry, buffers, Sweep(at.k, (small, stored), at.carry)
