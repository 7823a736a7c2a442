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

A bound far beyond the steps a solve takes (`max_steps` 4096, a solve of 30 ticks) would
make the states before the segments of the bound the larger part of the memory. So at
most `starts` states are kept, thinned as the loop runs: the state before every
`stride`-th segment, the stride doubling (and the kept states moving down) whenever the
next would not fit. Memory then follows the tape, not the bound; a solve of up to
`length x starts` ticks still evaluates no tick more than twice, and a longer one runs
the segments between two kept states once more, bare, before re-taping each.

Memory, with |s| bytes per state and |r| per tape row: (length + 1) |r| + (S + 1) |s|
(one scratch row of each), S = `starts`, or ceil(N / length) for a bound of N ticks.
"""

import math
from typing import ClassVar, cast

import equinox as eqx
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax import lax
from jaxtyping import Array, ArrayLike, Bool, Int, PyTree

from .._lockstep import if_any, lockstep_while, tree_where
from .._loop import Buffers, Loop, Write
from .._packing import Packing, Rows
from .._residuals import Layout, TapeRows, linearise, tape_rows
from .._reverse_tape import reverse_tape
from .._sweep import Cotangents, SlotIndex, Sweep, get_state, replay_decision
from ._base import AbstractSchedule, Stored

# States kept before segments when the bound has more segments than this: enough that a
# solve of up to `length x MOST_STARTS` ticks re-tapes each tick at most once.
MOST_STARTS = 8

# (first tick of the segment, cotangent of the carry after it) and (tape, parameters'
# cotangent, output buffers').
_Small = tuple[Int[Array, ""], PyTree]
_Large = tuple[Rows, PyTree, Buffers]


class Segments(AbstractSchedule):
    """A tape of `length` rows reused by each segment of `length` ticks, and the state
    before each segment: before every segment of the bound (`starts` None), or before
    every `stride`-th, in `starts` slots thinned as the loop runs (see above)."""

    length: int = eqx.field(static=True)
    num_ticks: int = eqx.field(static=True)
    starts: int | None = eqx.field(static=True, default=None)
    tapes: ClassVar[bool] = True
    segmented: ClassVar[bool] = True

    def __check_init__(self) -> None:
        if self.starts is not None and self.starts < 2:
            raise ValueError(f"Segments(starts={self.starts}): keep at least 2 states.")

    @property
    def slots(self) -> int:
        """States the forward sweep keeps: one per segment of the bound, or `starts`."""
        per_segment = -(-self.num_ticks // self.length)
        return per_segment if self.starts is None else min(self.starts, per_segment)

    def init(self) -> Int[Array, ""]:
        """The stride: a state is kept before every stride-th segment."""
        return jnp.ones((), jnp.int32)

    def store(
        self,
        k: Int[Array, ""],
        state: PyTree,
        slot_index: SlotIndex | None,
        active: Bool[ArrayLike, ""] = True,
    ) -> Stored:
        """Whether the state before tick k is kept (k starts a kept segment), its slot
        and the new stride (doubled where the slots are full: the caller moves the kept
        states with `thin`). The tape rows are written by the forward sweep."""
        stride = jnp.asarray(state, jnp.int32)
        segment = (k // self.length).astype(jnp.int32)
        starts = k % self.length == 0
        stride = jnp.where(active & starts & (segment // stride >= self.slots), 2 * stride, stride)
        kept = starts & (segment % stride == 0)
        return kept, segment // stride, slot_index, stride

    def thin(self, states: Rows, old: Int[Array, ""], new: Int[Array, ""]) -> Rows:
        """The kept states after the stride doubled from `old` to `new` where it did:
        slot 2i's state moves to slot i (the others are released)."""
        moved = np.minimum(2 * np.arange(self.slots + 1), self.slots)
        doubled = new > old
        move = lambda rows: tree_where(doubled, rows[moved], rows)
        return if_any(doubled, lambda: (move(states[0]), move(states[1])), lambda: states)

    def final_stride(self, n: Int[Array, ""]) -> Int[Array, ""]:
        """The stride after a forward sweep of n ticks (as `store` doubled it)."""
        if self.starts is None:
            return jnp.ones((), jnp.int32)
        last = jnp.maximum(n - 1, 0) // self.length
        return lax.while_loop(
            lambda s: last // s >= self.slots, lambda s: 2 * s, jnp.ones((), jnp.int32)
        )

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
        packing = Packing.of(init)
        fixed = (loop, params, diff, sweep, start, ct_buffers)
        return reverse_segments(*fixed, rows, self, packing, batched)[0]

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
        when no length fits (or one segment would hold the whole bound: a plain tape).
        A state before each segment of the bound when that leaves segments long enough
        that at most `MOST_STARTS` cover it; else `MOST_STARTS` thinned states, so that
        the tape, not the bound, takes the memory."""
        r, s = max(row_bytes, 1), max(state_bytes, 1)
        # The larger root of r L^2 - (budget - r - s) L + N s = 0, the memory with the
        # ceiling dropped; the ceiling can only add, so step down from there.
        room = budget - r - s
        disc = room * room - 4 * r * num_ticks * s
        length = 0
        if room > 0 and disc >= 0:
            length = min(int((room + math.sqrt(disc)) / (2 * r)), num_ticks - 1)
            while length >= 1 and cls.memory(length, num_ticks, s, r) > budget:
                length -= 1
        if length >= 2 and -(-num_ticks // length) <= MOST_STARTS:
            return cls(length, num_ticks)
        thinned = min((budget - (MOST_STARTS + 1) * s) // r - 1, num_ticks - 1)
        if thinned >= 2 and -(-num_ticks // thinned) > MOST_STARTS:
            return cls(int(thinned), num_ticks, MOST_STARTS)
        return cls(length, num_ticks) if length >= 2 else None


def reverse_segments(
    loop: Loop,
    params: PyTree,
    diff: PyTree[bool],
    sweep: Sweep,
    start: Cotangents,
    ct_buffers: Buffers,
    rows: tuple[Layout, TapeRows],
    schedule: Segments,
    packing: Packing,
    batched: bool,
) -> tuple[Cotangents, Buffers]:
    """Reverse by `Segments`: the forward sweep left the last segment of each sample on
    the tape and the state before every kept segment. Segments are taken last to first;
    each but the last is first run again from the latest kept state before it (bare up
    to the segment, when thinning released the state before it), taping its ticks (with
    the first sweep's step-size decisions replayed), then every segment is reversed by
    `reverse_tape`. Under `vmap` a sample's segments are its own (samples end at
    different ticks); the loops run in lockstep. `start` and the result as for
    `reverse_tape`."""
    length, (layout, taped_rows) = schedule.length, rows
    n, decisions = sweep.n, sweep.decisions
    states = cast(Rows, sweep.slot_index)  # segmented: the state before each kept segment
    stride = schedule.final_stride(n)

    def retape(tape: Rows, first: Int[Array, ""], end: Int[Array, ""]) -> Rows:
        """Ticks [first, end) again from the latest kept state before `first`, taped at
        rows from 0 as the forward sweep taped them: an emit's carry, a step's
        residuals. Ticks before `first` (from a kept state further back) run bare."""

        def tick(
            small: tuple[Int[Array, ""], PyTree], tape: Rows, active: Bool[Array, ""]
        ) -> tuple[tuple[Int[Array, ""], PyTree], Rows]:
            k, carry = small
            emitting = loop.pending(carry)
            taping = active & (k >= first)
            row = lambda on: jnp.where(on, k - first, length)
            tape = taped_rows.put_carry(tape, row(taping & emitting), carry)

            def step() -> tuple[PyTree, tuple[Array, ...]]:
                new, pullback = linearise(loop, params, diff, carry)
                return new, layout.taped(pullback)

            skip = lambda: (carry, taped_rows.zero_residuals())
            plain = lambda: (loop.body(params, carry), taped_rows.zero_residuals())
            # Bare ticks happen only after thinning: otherwise no second step to compile.
            thinned = schedule.starts is not None
            bare = (lambda: if_any(active & ~emitting, plain, skip)) if thinned else skip
            stepped, taped = if_any(taping & ~emitting, step, bare)
            tape = taped_rows.put_residuals(tape, row(taping & ~emitting), taped)
            emitted, _ = loop.emit(params, carry)  # its writes were made by the first sweep
            new = jtu.tree_map(lambda e, s: jnp.where(emitting, e, s), emitted, stepped)
            new = replay_decision(loop, decisions, k, new)
            return (k + 1, new), tape

        kept = first // length // stride
        carry = get_state(states, kept, packing)
        # Nothing to run (the last segment, a finished sample): start at the end.
        small = (jnp.where(end > first, kept * stride * length, end), carry)
        return lockstep_while(lambda s, t: s[0] < end, tick, small, tape, batched)[1]

    def segment(small: _Small, large: _Large, active: Bool[Array, ""]) -> tuple[_Small, _Large]:
        first, ct_carry = small
        tape, ct_params, ct_bufs = large
        end = jnp.minimum(first + length, n)
        # The last segment is on the tape already; a finished sample runs nothing.
        tape = retape(tape, first, jnp.where(active & (end < n), end, first))
        span = (first, jnp.where(active, end - 1, first - 1))
        start = (ct_carry, ct_params)
        (ct_carry, ct_params), ct_bufs = reverse_tape(
            loop, params, diff, tape, span, start, ct_bufs, rows, batched
        )
        return (first - length, ct_carry), (tape, ct_params, ct_bufs)

    ct_final, ct_params = start
    last_first = jnp.maximum(n - 1, 0) // length * length
    first = jnp.where(n > 0, last_first, -length)
    small, large = lockstep_while(
        lambda s, b: s[0] >= 0,
        segment,
        (first, ct_final),
        (sweep.slots, ct_params, ct_buffers),
        batched,
    )
    return (small[1], large[1]), large[2]
