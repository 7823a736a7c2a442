"""Offline binomial checkpointing for a loop of known length (Griewank; see `_binomial`):
the forward sweep stores the states revolve's rule picks, the reverse sweep recomputes from
them, placing further states by the same rule."""

from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Int, PyTree

from .._binomial import next_checkpoint
from .._loop import Buffers, Loop, Write
from .._packing import Packing
from .._reverse_recompute import reverse_recompute
from .._sweep import Cotangents, SlotIndex, Sweep
from ._base import AbstractSchedule, Stored


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


class Revolve(AbstractSchedule):
    """Binomial checkpointing for a loop of exactly `num_ticks` ticks, in `slots` slots."""

    slots: int = eqx.field(static=True)
    num_ticks: int = eqx.field(static=True)
    skips_ahead: ClassVar[bool] = True

    def init(self) -> Int[Array, ""]:
        return jnp.zeros((), jnp.int32)  # how many sweep positions are stored

    def _positions(self) -> Int[Array, " positions"]:
        return jnp.asarray(sweep_positions(self.num_ticks, self.slots) + (-1,), jnp.int32)

    def next_store(self, k: Int[Array, ""], pointer: Int[Array, ""]) -> Int[Array, ""]:
        """The first tick at or after k whose state `store` keeps (past the last position:
        never, as a tick beyond the loop)."""
        positions = self._positions()
        position = positions[jnp.minimum(pointer, positions.shape[0] - 1)]
        return jnp.where(position < 0, self.num_ticks + 1, jnp.maximum(position, k))

    def store(
        self,
        k: Int[Array, ""],
        pointer: Int[Array, ""],
        slot_index: SlotIndex | None,
        active: Bool[ArrayLike, ""] = True,
    ) -> Stored:
        """Whether to store the state before tick k, its slot, and the new schedule
        state and slot table (`active` is the caller's to apply: the table is unchanged)."""
        positions = self._positions()
        store = positions[jnp.minimum(pointer, positions.shape[0] - 1)] == k
        return store, pointer, slot_index, pointer + store.astype(jnp.int32)

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
