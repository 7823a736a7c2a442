"""Which tick's state each of a fixed number of slots holds, and the slots as a stack.

Both sweeps touch one entry a tick. The forward sweep fills the free slot above the top
of the stack (`free_slot`); online thinning, the one step that reads the whole table,
releases some slots and moves them above those still in use (`released`). The reverse
sweep restores from the top (`top`), stores above it and releases it once its tick is
reversed. So a tick never searches the table: a default budget holds some 70,000 slots
of a small state, and a search of them a tick had made a ten-step solve's gradient cost
twice Diffrax's.
"""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Int

Scalar = Int[Array, ""]


class SlotTable(eqx.Module):
    """`ticks[i]`: the tick whose state slot i holds, -1 if free. `order`: the slots in
    use in the order of their ticks, then the free ones; the first `used()` are in use."""

    ticks: Int[Array, " slots"]
    order: Int[Array, " slots"]

    @staticmethod
    def empty(count: int) -> "SlotTable":
        """`count` free slots, filled in order."""
        return SlotTable(jnp.full((count,), -1, jnp.int32), jnp.arange(count, dtype=jnp.int32))

    @property
    def count(self) -> int:
        return self.ticks.shape[-1]

    def used(self) -> Scalar:
        """How many slots are in use (a count over the table: once a sweep, not a tick)."""
        return jnp.sum(self.ticks >= 0).astype(jnp.int32)

    def at(self, position: Int[ArrayLike, ""]) -> Scalar:
        """The slot at `position` in the stack (clipped to the table)."""
        return self.order[jnp.clip(position, 0, self.count - 1)]

    def free_slot(self, used: Int[ArrayLike, ""]) -> Scalar:
        """The slot the next state goes to when `used` are in use."""
        return self.at(used)

    def top(self, used: Int[ArrayLike, ""]) -> Scalar:
        """The slot holding the latest tick when `used` are in use (the first slot if none)."""
        return self.at(jnp.asarray(used) - 1)

    def holding(self, slot: Scalar, tick: Scalar, store: Bool[ArrayLike, ""]) -> "SlotTable":
        """Slot `slot` marked as holding `tick` where `store`: one entry written."""
        ticks = self.ticks.at[slot].set(jnp.where(store, tick, self.ticks[slot]))
        return SlotTable(ticks, self.order)

    def released(self, release: Bool[Array, " slots"]) -> "SlotTable":
        """The slots `release` marks freed, and moved above the top: those still in use
        keep their order at the bottom of the stack (online thinning's pass over the
        table)."""
        ticks = jnp.where(release, -1, self.ticks)
        in_use = (ticks[self.order] >= 0).astype(jnp.int32)  # by stack position
        free = 1 - in_use
        # A stable partition by counting (a sort costs more to compile).
        count = lambda x: jnp.cumsum(x, dtype=jnp.int32)
        rank = jnp.where(in_use == 1, count(in_use), jnp.sum(in_use, dtype=jnp.int32) + count(free))
        rank = rank - 1
        order = jnp.zeros_like(self.order).at[rank].set(self.order)
        return SlotTable(ticks, order)
