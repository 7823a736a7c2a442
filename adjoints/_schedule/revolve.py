"""Offline binomial checkpointing for a loop of known length (Griewank; see `_binomial`):
the forward sweep stores the states revolve's rule picks, the reverse sweep recomputes from
them, placing further states by the same rule."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Int, PyTree

from .._binomial import next_checkpoint
from .._keeping import bare_step, skip_ahead
from .._loop import Write
from .._reverse_recompute import reverse_recompute
from .._slot_table import SlotTable
from .._sweep import Backward, Cotangents, Kept, Run, Tick
from ._base import AbstractSchedule, Sizing
from ._slots import emit_passing, empty_slots, keep_before, record_after


def sweep_positions(n: int, slots: int) -> tuple[int, ...]:
    """States the first forward sweep stores: 0, then revolve's choices towards n - 1."""
    positions, free = [0], slots - 1
    while free > 0 and positions[-1] < n - 1:
        nxt = next_checkpoint(positions[-1], n - 1, free)
        nxt = min(max(nxt, positions[-1] + 1), n - 1)
        if nxt >= n - 1:
            break
        positions.append(nxt)
        free -= 1
    return tuple(positions)


def needs_offline(schedule: AbstractSchedule, sizing: Sizing) -> None:
    """Refuse a loop whose number of steps is not known ahead."""
    if not sizing.offline:
        raise ValueError(
            f"schedule={type(schedule).__name__}(...) needs a number of steps known when "
            "traced and no output between steps (ConstantStepSize or StepTo with concrete "
            "times, SaveAt(t1=True) only). Use Online() or Segments()."
        )


class Revolve(AbstractSchedule):
    """Binomial checkpointing for a loop of exactly `num_ticks` ticks, in `slots` slots.
    `checkpoints`: the states to keep (None: as the adjoint says, else as many as its
    budget holds); a loop of known length only."""

    slots: int | None = eqx.field(static=True, default=None)
    num_ticks: int | None = eqx.field(static=True, default=None)
    checkpoints: int | None = eqx.field(static=True, default=None)

    def sized(self, sizing: Sizing) -> "Revolve":
        needs_offline(self, sizing)
        assert sizing.num_steps is not None  # offline
        slots = self.slots or sizing.slots(self.checkpoints)
        return Revolve(min(slots, sizing.num_steps), sizing.num_steps)

    def init(self) -> Int[Array, ""]:
        return jnp.zeros((), jnp.int32)  # how many sweep positions are stored

    def _positions(self) -> Int[Array, " positions"]:
        assert self.slots is not None and self.num_ticks is not None  # sized
        return jnp.asarray(sweep_positions(self.num_ticks, self.slots) + (-1,), jnp.int32)

    def next_store(self, k: Int[Array, ""], pointer: Int[Array, ""]) -> Int[Array, ""]:
        """The first tick at or after k whose state `store` keeps (past the last position:
        never, as a tick beyond the loop)."""
        assert self.num_ticks is not None  # sized
        positions = self._positions()
        position = positions[jnp.minimum(pointer, positions.shape[0] - 1)]
        return jnp.where(position < 0, self.num_ticks + 1, jnp.maximum(position, k))

    def store(
        self,
        k: Int[Array, ""],
        pointer: Int[Array, ""],
        table: SlotTable,
        active: Bool[ArrayLike, ""] = True,
    ) -> tuple[Bool[Array, ""], Int[Array, ""], SlotTable, PyTree]:
        """Whether to store the state before tick k, its slot, and the new schedule
        state and slot table (`active` is the caller's to apply: the table is unchanged)."""
        positions = self._positions()
        store = positions[jnp.minimum(pointer, positions.shape[0] - 1)] == k
        # Slots fill in order and are never thinned: the pointer is the free slot.
        return store, pointer, table, pointer + store.astype(jnp.int32)

    def empty(self, run: Run) -> Kept:
        assert self.slots is not None  # sized
        return empty_slots(run, run.step_packing.empty(self.slots + 1), self.init())

    def step(self, run: Run, at: Tick, kept: Kept, active: Bool[Array, ""]) -> tuple[Tick, Kept]:
        """Bare steps up to the next tick that stores (and before the last tick, whose
        state is kept as the last), then that tick."""
        assert self.num_ticks is not None  # sized
        stop = jnp.minimum(self.next_store(at.k, kept[0][0]), self.num_ticks - 1)
        at = skip_ahead(run, at, stop)
        loop = run.loop
        active = active & loop.cond(run.params, at.carry) & ~loop.pending(at.carry)
        kept, _ = keep_before(self.store, run, at, kept, active, run.step_packing)
        after = bare_step(run, at, active)
        return after, record_after(run, kept, at, after, active)

    def emit(
        self, run: Run, at: Tick, kept: Kept, active: Bool[Array, ""]
    ) -> tuple[Tick, tuple[Write, ...], Kept]:
        return emit_passing(run, at, kept, active)

    def reverse(self, back: Backward) -> Cotangents:
        return reverse_recompute(back, before_steps=True)[0]
