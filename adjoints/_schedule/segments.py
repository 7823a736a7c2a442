"""Taped segments for a loop whose length is known only as a bound (adaptive steps).

The ticks are cut into segments of `length` ticks. The forward sweep tapes every tick (a
step's residuals, or the carry before an emit) into one tape of `length` rows, each
segment overwriting the last, and keeps the state before each segment. So when the loop
ends, its last segment is on the tape, and the reverse sweep reverses it by the taped
pullbacks alone; each earlier segment, last first, is run again from its state, taping
its ticks as the forward sweep did, and reversed the same way.

A loop that ends within one segment (the common case when the tape is sized from the
memory budget) is thus reversed as a plain tape, with no recomputation, while a longer
one costs one more linearised run of every tick outside its last segment: no tick is
evaluated more than twice, whatever the loop's length. Online thinning (`online.py`)
keeps fewer states, but reverses through Griewank's binomial rule, evaluating ticks
several times and linearising each again in its VJP; it remains for budgets too small
for this scheme.

Memory, with |s| bytes per state and |r| per tape row, for a bound of N ticks:
(length + 1) |r| + (ceil(N / length) + 1) |s| (one scratch row of each).
"""

import math

import equinox as eqx
import jax.numpy as jnp


class Segments(eqx.Module):
    """A tape of `length` rows reused by each segment of `length` ticks, and the state
    before each of the `ceil(num_ticks / length)` segments of the loop's bound."""

    length: int = eqx.field(static=True)
    num_ticks: int = eqx.field(static=True)

    @property
    def slots(self) -> int:
        """States the forward sweep keeps: one per segment of the bound."""
        return -(-self.num_ticks // self.length)

    def init(self):
        return jnp.zeros((), jnp.int32)

    @staticmethod
    def memory(length: int, num_ticks: int, state_bytes: int, row_bytes: int) -> int:
        """Bytes of the tape and the states, scratch rows included."""
        return (length + 1) * row_bytes + (-(-num_ticks // length) + 1) * state_bytes

    @classmethod
    def fit(
        cls, num_ticks: int, state_bytes: int, row_bytes: int, budget: int
    ) -> "Segments | None":
        """The longest segments that fit `budget` (the more ticks a segment holds, the
        likelier a solve ends within its first and needs no recomputation), or None
        when no length fits (or one segment would hold the whole bound: a plain tape)."""
        r, s = max(row_bytes, 1), max(state_bytes, 1)
        # The larger root of r L^2 - (budget - r - s) L + N s = 0, the memory with the
        # ceiling dropped; the ceiling can only add, so step down from there.
        room = budget - r - s
        disc = room * room - 4 * r * num_ticks * s
        if room <= 0 or disc < 0:
            return None
        length = min(int((room + math.sqrt(disc)) / (2 * r)), num_ticks - 1)
        while length >= 1 and cls.memory(length, num_ticks, s, r) > budget:
            length -= 1
        return cls(length, num_ticks) if length >= 2 else None
