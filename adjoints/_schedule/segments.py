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

`bare`: the forward sweep tapes nothing, running the steps as a plain loop does, and the
reverse sweep tapes every segment, the last too, into a tape of its own. What the forward
sweep leaves for the reverse is then a few states and the step decisions, whatever the
tape's length and the loop's bound: a caller's `lax.scan` (or `jax.checkpoint`) around
the solve keeps that for each of its iterations. Each tick is evaluated twice.

A bound far beyond the steps a solve takes (`max_steps` 4096, a solve of 30 ticks) would
make the states before the segments of the bound the larger part of the memory. So at
most `starts` states are kept, thinned as the loop runs: the state before every
`stride`-th segment, the stride doubling (and the kept states moving down) whenever the
next would not fit. Memory then follows the tape, not the bound; a solve of up to
`length x starts` ticks still evaluates no tick more than twice, and a longer one runs
the segments between two kept states once more, bare, before re-taping each.

Memory, with |s| bytes per state and |r| per tape row: (length + 1) |r| + (S + 1) |s|
(one scratch row of each), S = `starts`, or ceil(N / length) for a bound of N ticks;
bare, the tape is the reverse sweep's.
"""

import math
from collections.abc import Callable

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Bool, Int, PyTree

from .. import _decisions
from .._arguments import check_count
from .._keeping import bare_step, emit_tick, taped_step
from .._lockstep import if_any, lockstep_while, tree_where
from .._loop import Buffers, Write
from .._packing import Rows
from .._residuals import Layout, TapeRows, linearise, tape_rows
from .._reverse_tape import reverse_tape
from .._sweep import (
    Backward,
    Cotangents,
    Kept,
    Run,
    Tick,
    decision_record,
    get_state,
    put_state,
)
from .._ticks import Ticks, run_ticks
from ._base import AbstractSchedule, Sizing

# States kept before segments when the bound has more segments than this: enough that a
# solve of up to `length x MOST_STARTS` ticks re-tapes each tick at most once.
MOST_STARTS = 8

# (first tick of the segment, cotangent of the carry after it) and (tape, parameters'
# cotangent, output buffers').
_Small = tuple[Int[Array, ""], PyTree]
_Large = tuple[Rows, PyTree, Buffers]
# Re-taping: (tick, carry).
_Tick = tuple[Int[Array, ""], PyTree]


class Segments(AbstractSchedule):
    """A tape of `length` rows reused by each segment of `length` ticks (the reverse
    sweep's alone where `bare`), and the state before each segment: before every segment
    of the bound (`starts` None), or before every `stride`-th, in `starts` slots thinned
    as the loop runs (see above). `length` None: the longest segments that fit the
    adjoint's memory budget (or its `checkpoints`)."""

    length: int | None = eqx.field(static=True, default=None)
    num_ticks: int | None = eqx.field(static=True, default=None)
    starts: int | None = eqx.field(static=True, default=None)
    bare: bool = eqx.field(static=True, default=False)

    def __check_init__(self) -> None:
        if self.starts is not None and self.starts < 2:
            raise ValueError(f"Segments(starts={self.starts}): keep at least 2 states.")
        check_count("Segments", "length", self.length, 1, "ticks")

    def sized(self, sizing: Sizing) -> "Segments":
        bound = sizing.bound
        length = self.length if self.length is not None else sizing.checkpoints
        if length is not None:
            return Segments(max(2, min(length, bound - 1)), bound, self.starts, self.bare)
        fitted = Segments.fit(bound, sizing.state, sizing.row, sizing.budget) or Segments(2, bound)
        return fitted.with_bare(self.bare)

    def with_bare(self, bare: bool) -> "Segments":
        """These segments, with a forward sweep that tapes (False) or runs bare (True)."""
        return Segments(self.length, self.num_ticks, self.starts, bare)

    def _sized(self) -> tuple[int, int]:
        assert self.length is not None and self.num_ticks is not None  # sized
        return self.length, self.num_ticks

    @property
    def slots(self) -> int:
        """States the forward sweep keeps: one per segment of the bound, or `starts`."""
        assert self.length is not None and self.num_ticks is not None  # sized
        per_segment = -(-self.num_ticks // self.length)
        return per_segment if self.starts is None else min(self.starts, per_segment)

    def init(self) -> Int[Array, ""]:
        """The stride: a state is kept before every stride-th segment."""
        return jnp.ones((), jnp.int32)

    def store(
        self, k: Int[Array, ""], stride: Int[Array, ""], active: Bool[Array, ""]
    ) -> tuple[Bool[Array, ""], Int[Array, ""], Int[Array, ""]]:
        """Whether the state before tick k is kept (k starts a kept segment), its slot
        and the new stride (doubled where the slots are full: `thin` moves the kept
        states)."""
        length = self._sized()[0]
        segment = (k // length).astype(jnp.int32)
        starts = k % length == 0
        stride = jnp.where(active & starts & (segment // stride >= self.slots), 2 * stride, stride)
        kept = starts & (segment % stride == 0)
        return kept, segment // stride, stride

    def _keep_start(self, run: Run, at: Tick, kept: Kept, active: Bool[Array, ""]) -> Kept:
        """Store the carry before tick `at.k` if it starts a kept segment, the kept
        states moved first where the stride doubles."""
        stride, (tape, states, decisions) = kept

        def keep(small: tuple[Array, Rows]) -> tuple[Array, Rows]:
            stride, states = small
            store, slot, new_stride = self.store(at.k, stride, active)
            if self.starts is not None:  # thinned as the loop runs
                states = self.thin(states, stride, new_stride)
            row = jnp.where(store & active, slot, self.slots)
            put = lambda: put_state(states, row, at.carry, run.packing, run.batched)
            # Batched, the scatter of every sample's carry (and its packing) runs only
            # when some sample stores one, not at every tick into the scratch row.
            states = if_any(store & active, put, lambda: states) if run.batched else put()
            return tree_where(active, new_stride, stride), states

        if self.bare and not run.batched:
            # Called once a segment or emit (see `_bare_run`): only at a segment's start,
            # in a branch that holds the states alone. (At every tick, as a taped sweep
            # calls it, a branch costs more than the write into the scratch row.)
            starts = active & (at.k % self._sized()[0] == 0)
            stride, states = lax.cond(starts, keep, lambda small: small, (stride, states))
        else:
            stride, states = keep((stride, states))
        return stride, (tape, states, decisions)

    def _row(self, at: Tick, active: Bool[Array, ""]) -> Array:
        length = self._sized()[0]
        return jnp.where(active, at.k % length, length)

    def empty(self, run: Run) -> Kept:
        rows = tape_rows(run.loop, run.params, run.diff, run.init)[1]
        tape = () if self.bare else rows.empty(self._sized()[0] + 1)
        decisions = decision_record(run, self.planned_ticks)
        return self.init(), (tape, run.packing.empty(self.slots + 1), decisions)

    @property
    def planned_ticks(self) -> int | None:
        """The ticks whose step sizes the record keeps, where fewer than the bound: with
        thinned starts, `length x starts`, the ticks recomputed at most once (None: every
        tick of the bound). Bare, every tick: its forward sweep's steps are compiled apart
        from the re-taping sweep's, so a step size made again would differ in its last
        digits (a thinned solve's gradient by 2e-9 in a float64 test), and a bare sweep
        unbatched keeps few other bytes."""
        length = self._sized()[0]
        return None if self.starts is None or self.bare else length * self.starts

    def step(self, run: Run, at: Tick, kept: Kept, active: Bool[Array, ""]) -> tuple[Tick, Kept]:
        """One step, taped unless bare, the state before it kept if it starts a
        segment."""
        stride, (tape, states, decisions) = self._keep_start(run, at, kept, active)
        if self.bare:  # batched (unbatched, `_bare_run` takes the steps)
            after = bare_step(run, at, active)
        else:
            rows = tape_rows(run.loop, run.params, run.diff, run.init)
            after, tape = taped_step(run, rows, at, tape, self._row(at, active), active)
        decisions = _decisions.record(run.loop, decisions, at.k, at.carry, after.carry, active)
        return after, (stride, (tape, states, decisions))

    def run_of_steps(self, run: Run) -> Callable[[Tick, Kept], tuple[Tick, Kept]] | None:
        return (lambda at, kept: self._bare_run(run, at, kept)) if self.bare else None

    def _bare_run(self, run: Run, at: Tick, kept: Kept) -> tuple[Tick, Kept]:
        """Bare and unbatched, the steps before the next emit: for each segment, its
        state kept, then its steps, recording their decisions, in a loop that carries
        nothing else and holds the one copy of the step. (A state written at every
        tick, into the scratch row when not kept, took as long as the step itself on a
        small state.)"""
        loop, params, length = run.loop, run.params, self._sized()[0]
        stepping = lambda at: loop.cond(params, at.carry) & ~loop.pending(at.carry)

        def bare(s: tuple[Tick, PyTree]) -> tuple[Tick, PyTree]:
            at, decisions = s
            new = loop.body(params, at.carry)
            decisions = _decisions.record(loop, decisions, at.k, at.carry, new, True)
            return Tick(at.k + 1, new), decisions

        def segment(s: tuple[Tick, Kept]) -> tuple[Tick, Kept]:
            """The steps up to the next segment's start (or emit, or the end), the state
            before the first kept where it starts a segment (after an emit it may not)."""
            at, kept = s
            stride, (tape, states, decisions) = self._keep_start(run, at, kept, jnp.asarray(True))
            end = (at.k // length + 1) * length
            going = lambda s: (s[0].k < end) & stepping(s[0])
            at, decisions = lax.while_loop(going, bare, (at, decisions))
            return at, (stride, (tape, states, decisions))

        return lax.while_loop(lambda s: stepping(s[0]), segment, (at, kept))

    def emit(
        self, run: Run, at: Tick, kept: Kept, active: Bool[Array, ""]
    ) -> tuple[Tick, tuple[Write, ...], Kept]:
        stride, (tape, states, decisions) = self._keep_start(run, at, kept, active)
        if not self.bare:
            rows = tape_rows(run.loop, run.params, run.diff, run.init)[1]
            tape = rows.put_carry(tape, self._row(at, active), at.carry)
        after, writes = emit_tick(run, at, active)
        decisions = _decisions.record(run.loop, decisions, at.k, at.carry, after.carry, active)
        return after, writes, (stride, (tape, states, decisions))

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
        last = jnp.maximum(n - 1, 0) // self._sized()[0]
        return lax.while_loop(
            lambda s: last // s >= self.slots, lambda s: 2 * s, jnp.ones((), jnp.int32)
        )

    def reverse(self, back: Backward) -> Cotangents:
        return _SegmentReversal(back.run, self, back.sweep.n, back.sweep.kept[1]).reverse(back)

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


class _SegmentReversal(eqx.Module):
    """Reverse by `Segments`: the forward sweep left the last segment of each sample on
    the tape (bare: no tape) and the state before every kept segment. Segments are taken
    last to first; each but the taped last is first run again from the latest kept state
    before it (bare up to the segment, when thinning released the state before it),
    taping its ticks (with the first sweep's step-size decisions replayed), then every
    segment is reversed by `reverse_tape`. Under `vmap` a sample's segments are its own
    (samples end at different ticks); the loops run in lockstep."""

    run: Run
    schedule: Segments
    n: Int[Array, ""]
    kept: tuple[Rows, Rows, PyTree]  # (tape, states before segments, decisions)

    def rows(self) -> tuple[Layout, TapeRows]:
        run = self.run
        return tape_rows(run.loop, run.params, run.diff, run.init)

    def reverse(self, back: Backward) -> Cotangents:
        length, n = self.schedule._sized()[0], self.n
        ct_final, ct_params = back.start
        last_first = jnp.maximum(n - 1, 0) // length * length
        first = jnp.where(n > 0, last_first, -length)
        # Bare, the reverse sweep's own tape (the forward sweep left none).
        tape = self.rows()[1].empty(length + 1) if self.schedule.bare else self.kept[0]
        small, large = lockstep_while(
            lambda s, b: s[0] >= 0,
            self.segment,
            (first, ct_final),
            (tape, ct_params, back.ct_buffers),
            self.run.batched,
        )
        return small[1], large[1]

    def segment(
        self, small: _Small, large: _Large, active: Bool[Array, ""]
    ) -> tuple[_Small, _Large]:
        """Reverse the segment from tick `first`, re-taping it first unless it is the
        last of a taped sweep (on the tape already); a finished sample runs nothing."""
        length, n = self.schedule._sized()[0], self.n
        first, ct_carry = small
        tape, ct_params, ct_bufs = large
        end = jnp.minimum(first + length, n)
        retaped = self.schedule.bare or end < n  # the last is on the tape unless bare
        tape = self.retape(tape, first, jnp.where(active & retaped, end, first))
        span = (first, jnp.where(active, end - 1, first - 1))
        (ct_carry, ct_params), ct_bufs = reverse_tape(
            self.run, tape, self.rows(), span, (ct_carry, ct_params), ct_bufs
        )
        return (first - length, ct_carry), (tape, ct_params, ct_bufs)

    def retape(self, tape: Rows, first: Int[Array, ""], end: Int[Array, ""]) -> Rows:
        """Ticks [first, end) again from the latest kept state before `first`, taped at
        rows from 0 as the forward sweep taped them: an emit's carry, a step's
        residuals. Ticks before `first` (from a kept state further back) run bare."""
        length = self.schedule._sized()[0]
        stride = self.schedule.final_stride(self.n)
        kept = first // length // stride
        carry = get_state(self.kept[1], kept, self.run.packing, self.run.batched)
        # Nothing to run (the last segment, a finished sample): start at the end.
        small = (jnp.where(end > first, kept * stride * length, end), carry)
        going = lambda s: s[0] < end
        ticks = Ticks(
            going=going,
            pending=lambda s: going(s) & self.run.loop.pending(s[1]),
            step=lambda s, t, a: self.retape_step(first, s, t, a),
            emit=lambda s, t, a: self.retape_emit(first, s, t, a),
        )
        return run_ticks(ticks, small, tape, (), self.run.batched)[1]

    def retape_emit(
        self,
        first: Int[Array, ""],
        small: _Tick,
        large: tuple[Rows, tuple[()]],
        active: Bool[Array, ""],
    ) -> tuple[_Tick, tuple[Rows, tuple[()]]]:
        k, carry = small
        loop, length = self.run.loop, self.schedule._sized()[0]
        row = jnp.where(active & (k >= first), k - first, length)
        tape = self.rows()[1].put_carry(large[0], row, carry)
        new, _ = loop.emit(self.run.params, carry)  # its writes were made by the first sweep
        new = _decisions.replay(loop, _decisions.recorded(loop, self.kept[2], k), new)
        return (k + active.astype(jnp.int32), tree_where(active, new, carry)), (tape, ())

    def retape_step(
        self, first: Int[Array, ""], small: _Tick, tape: Rows, active: Bool[Array, ""]
    ) -> tuple[_Tick, Rows]:
        k, carry = small
        run, length = self.run, self.schedule._sized()[0]
        layout, taped_rows = self.rows()
        taping = active & (k >= first)
        recorded = _decisions.recorded(run.loop, self.kept[2], k)
        obeying = _decisions.obey(run.loop, recorded, carry)

        def linearised() -> tuple[PyTree, tuple[Array, ...]]:
            new, linearisation = linearise(run.loop, run.params, run.diff, obeying)
            return new, layout.taped(linearisation)

        skip = lambda: (carry, taped_rows.zero_residuals())
        # A bare tick (after thinning: before `first`) runs the same linearised step and
        # tapes it into the scratch row: a second, plain copy of the step would add a
        # tenth to the program XLA compiles, for ticks that only a solve longer than the
        # kept states cover runs.
        new, taped = if_any(active, linearised, skip)
        tape = taped_rows.put_residuals(tape, jnp.where(taping, k - first, length), taped)
        new = _decisions.replay(run.loop, recorded, new)
        return (k + active.astype(jnp.int32), tree_where(active, new, carry)), tape
