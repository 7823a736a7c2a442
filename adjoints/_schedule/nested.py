"""Nested segments for a loop of known length: states at the start of each segment, and
each innermost segment taped (its steps' residuals) when it is reversed.

The loop's n ticks are cut into segments of `lengths[0]` ticks whose starting states the
forward sweep keeps; the reverse sweep takes them last to first, cuts each again into
segments of `lengths[1]` ticks whose starting states it keeps in a second set of slots,
and so on; an innermost segment is run once more linearising each step, taping the step's
residuals, and reversed by applying the taped pullbacks. With one level this is the
segment scheme of T. Chen, B. Xu, C. Zhang and C. Guestrin, "Training deep nets with
sublinear memory cost" (arXiv:1604.06174, 2016); more levels nest it as Griewank and
Walther's multi-level checkpointing does (A. Griewank and A. Walther, "Evaluating
Derivatives", 2nd ed., SIAM 2008, ch. 12).

Cost, with d = len(lengths) levels of states: every tick runs d times bare (the forward
sweep, then once per deeper level), once linearised, and its pullback is applied once;
nothing is linearised twice. Revolve (`revolve.py`) reverses the same chain in fewer
states, but each tick it reverses is linearised again from a stored state, and its slot
bookkeeping is decided tick by tick at run time; here every loop bound is known when the
program is traced.

Memory, with |s| bytes per state and |r| per taped step: states ceil(n / L_1) + sum over
deeper levels of ceil(L_(i-1) / L_i), times |s|, plus L_d |r| for the tape.
"""

import math

import equinox as eqx
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, ArrayLike, Bool, Int, PyTree

from .._keeping import bare_step, emit_tick, skip_ahead
from .._lockstep import tree_where
from .._loop import Write
from .._packing import Rows
from .._residuals import linearise, tape_rows
from .._sweep import Backward, Cotangents, Kept, Run, Tick, get_state, put_state
from .._tick_vjp import accumulate
from ._base import AbstractSchedule, Sizing
from .revolve import needs_offline

# Deepest nesting tried: with three levels a chain of 1e9 ticks fits in about a thousand
# states' worth of memory.
_MAX_LEVELS = 3


class Nested(AbstractSchedule):
    """Segments of `lengths[i]` ticks at level i (decreasing) for a loop of exactly
    `num_ticks` ticks; the last level's segments are taped. `lengths` None: the fewest
    levels that fit the adjoint's memory budget (else the least memory); a loop of known
    length only."""

    lengths: tuple[int, ...] | None = eqx.field(static=True, default=None)
    num_ticks: int | None = eqx.field(static=True, default=None)

    def sized(self, sizing: Sizing) -> "Nested":
        needs_offline(self, sizing)
        n = sizing.num_steps
        assert n is not None  # offline
        if self.lengths is not None:
            return Nested(self.lengths, n)
        fitted = Nested.fit(n, sizing.state, sizing.row, sizing.budget)
        return fitted or Nested.smallest(n, sizing.state, sizing.row)

    def _sized(self) -> tuple[tuple[int, ...], int]:
        assert self.lengths is not None and self.num_ticks is not None  # sized
        return self.lengths, self.num_ticks

    @property
    def slots(self) -> int:
        """States the forward sweep keeps: one per outermost segment."""
        lengths, num_ticks = self._sized()
        return -(-num_ticks // lengths[0])

    def level_slots(self, level: int) -> int:
        """States kept at a deeper `level` (>= 1): one per segment of its parent."""
        lengths = self._sized()[0]
        return -(-lengths[level - 1] // lengths[level])

    def empty(self, run: Run) -> Kept:
        return None, run.packing.empty(self.slots + 1)

    def _keep(self, run: Run, at: Tick, states: Rows, active: Bool[Array, ""]) -> Rows:
        """Store the state before tick `at.k` if it starts an outermost segment."""
        length = self._sized()[0][0]
        store = (at.k % length == 0) & active
        row = jnp.where(store, at.k // length, self.slots)
        return put_state(states, row, at.carry, run.packing, run.batched)

    def step(self, run: Run, at: Tick, kept: Kept, active: Bool[Array, ""]) -> tuple[Tick, Kept]:
        """Bare steps up to the start of the next segment, then its first step."""
        (length, *_), num_ticks = self._sized()
        stop = jnp.minimum((at.k + length - 1) // length * length, num_ticks - 1)
        at = skip_ahead(run, at, stop)
        loop = run.loop
        active = active & loop.cond(run.params, at.carry) & ~loop.pending(at.carry)
        states = self._keep(run, at, kept[1], active)
        return bare_step(run, at, active), (None, states)

    def emit(
        self, run: Run, at: Tick, kept: Kept, active: Bool[Array, ""]
    ) -> tuple[Tick, tuple[Write, ...], Kept]:
        states = self._keep(run, at, kept[1], active)
        after, writes = emit_tick(run, at, active)
        return after, writes, (None, states)

    def reverse(self, back: Backward) -> Cotangents:
        return _NestedReversal(back.run, self).reverse(back)

    @staticmethod
    def fit(num_ticks: int, state_bytes: int, row_bytes: int, budget: int) -> "Nested | None":
        """The fewest levels whose states and tape fit in `budget` bytes (each level is
        one more bare run of every tick), arranged to need the least memory; None if
        none fits."""
        for levels in range(1, _MAX_LEVELS + 1):
            best = _smallest(num_ticks, levels, state_bytes, row_bytes)
            if best is not None and _bytes(num_ticks, best, state_bytes, row_bytes) <= budget:
                return Nested(best, num_ticks)
        return None

    @staticmethod
    def smallest(num_ticks: int, state_bytes: int, row_bytes: int) -> "Nested":
        """The arrangement that needs the least memory, whatever it is."""
        candidates = [
            _smallest(num_ticks, levels, state_bytes, row_bytes)
            for levels in range(1, _MAX_LEVELS + 1)
        ]
        options = [o for o in candidates if o is not None] or [(1,)]
        best = min(options, key=lambda o: _bytes(num_ticks, o, state_bytes, row_bytes))
        return Nested(best, num_ticks)


def _lengths(num_ticks: int, levels: int, leaf: int) -> tuple[int, ...]:
    """Segment lengths for a taped segment of `leaf` ticks, each level `ratio` times its
    inner one, the ratio the least that covers the loop."""
    ratio = max(1, math.ceil((num_ticks / leaf) ** (1 / levels) - 1e-9))
    while leaf * ratio ** (levels - 1) * ratio < num_ticks:
        ratio += 1
    return tuple(leaf * ratio ** (levels - 1 - i) for i in range(levels))


def _bytes(num_ticks: int, lengths: tuple[int, ...], state_bytes: int, row_bytes: int) -> int:
    states = -(-num_ticks // lengths[0])
    states += sum(-(-outer // inner) for outer, inner in zip(lengths, lengths[1:]))
    return states * state_bytes + lengths[-1] * row_bytes


def _smallest(
    num_ticks: int, levels: int, state_bytes: int, row_bytes: int
) -> tuple[int, ...] | None:
    """The lengths with `levels` levels that need the least memory, or None when a level
    would be a single tick (more levels than the loop needs)."""
    leaves = range(1, max(2, math.isqrt(num_ticks)) + 1)
    options = [_lengths(num_ticks, levels, leaf) for leaf in leaves]
    options = [o for o in options if all(a > b for a, b in zip(o, o[1:])) and o[0] < num_ticks]
    if not options:
        return None
    return min(options, key=lambda o: (_bytes(num_ticks, o, state_bytes, row_bytes), -o[-1]))


# (cotangent of the carry, parameters' cotangent, the stores: the forward sweep's states,
# those of each deeper level, the tape).
_State = tuple[PyTree, PyTree, tuple[Rows, ...]]


class _NestedReversal(eqx.Module):
    """Reverse a loop of steps only (no emits) by `Nested` segments: the forward sweep
    kept the state before each outermost segment; each segment, last first, is run again
    keeping the states before its own segments, down to the innermost, which is run once
    linearising its steps onto a tape and reversed by the taped pullbacks. Every loop
    bound is known when traced, so under `vmap` no loop is batched; ticks at or after the
    sample's own count (a solve that stopped early) do not reach the cotangents."""

    run: Run
    schedule: Nested

    def reverse(self, back: Backward) -> Cotangents:
        lengths, num_ticks = self.schedule._sized()
        run = self.run
        ct_final, ct_params = back.start
        levels = range(1, len(lengths))
        deeper = tuple(run.packing.empty(self.schedule.level_slots(i)) for i in levels)
        taped_rows = tape_rows(run.loop, run.params, run.diff, run.init)[1]
        store = (back.sweep.kept[1], *deeper, taped_rows.empty(lengths[-1]))
        state = (ct_final, ct_params, store)
        count = jnp.int32(num_ticks)
        ct_init, ct_params, _ = self.span(0, jnp.int32(0), count, None, state, back.sweep.n)
        return ct_init, ct_params

    def bare(self, carry: PyTree, count: Int[ArrayLike, ""]) -> PyTree:
        loop, params = self.run.loop, self.run.params
        return lax.fori_loop(0, count, lambda i, c: loop.body(params, c), carry)

    def leaf(
        self,
        first: Int[Array, ""],
        count: Int[Array, ""],
        carry: PyTree,
        state: _State,
        n: Int[Array, ""],
    ) -> _State:
        """Tape the steps of an innermost segment, then apply their pullbacks, last first."""
        run = self.run
        layout, taped_rows = tape_rows(run.loop, run.params, run.diff, run.init)
        params_f = eqx.partition(run.params, run.diff)[0]
        ct, ct_params, store = state

        def linearised(i: Int[Array, ""], s: tuple[PyTree, Rows]) -> tuple[PyTree, Rows]:
            carry, tape = s
            new, linearisation = linearise(run.loop, run.params, run.diff, carry)
            return new, taped_rows.put_residuals(tape, i, layout.taped(linearisation))

        _, tape = lax.fori_loop(0, count, linearised, (carry, store[-1]))

        def pull(i: Int[Array, ""], s: Cotangents) -> Cotangents:
            ct, ct_params = s
            row = count - 1 - i
            taken = first + row < n
            # Each sample reads its row at an index of its own (row 0, unused, where its
            # solve ended earlier): under `vmap` a row read at an index the samples share
            # is fused by XLA:CPU into every kernel that uses it, among them the
            # per-sample weight cotangents, where it ran ten times slower than read once.
            own = jnp.where(taken, row, 0)
            dp, dc = layout.vjp(taped_rows.residuals(tape, own), run.params)(ct)
            return tree_where(taken, dc, ct), accumulate(taken, ct_params, dp, params_f)

        ct, ct_params = lax.fori_loop(0, count, pull, (ct, ct_params))
        return ct, ct_params, (*store[:-1], tape)

    def keep_starts(
        self, level: int, segments: Int[Array, ""], carry: PyTree, state: _State
    ) -> _State:
        """Keep the state before each segment of `level`, advancing between them."""
        length = self.schedule._sized()[0][level]
        packing = self.run.packing

        def keep(j: Int[Array, ""], s: tuple[PyTree, Rows]) -> tuple[PyTree, Rows]:
            carry, states = s
            states = put_state(states, j, carry, packing, self.run.batched)
            return self.bare(carry, jnp.where(j < segments - 1, length, 0)), states

        ct, ct_params, store = state
        _, states = lax.fori_loop(0, segments, keep, (carry, store[level]))
        return ct, ct_params, (*store[:level], states, *store[level + 1 :])

    def span(
        self,
        level: int,
        first: Int[Array, ""],
        count: Int[Array, ""],
        carry: PyTree,
        state: _State,
        n: Int[Array, ""],
    ) -> _State:
        """Reverse ticks [first, first + count) from the carry before `first` (at the
        outermost level the forward sweep's states serve instead)."""
        lengths = self.schedule._sized()[0]
        if level == len(lengths):
            return self.leaf(first, count, carry, state, n)
        length = lengths[level]
        segments = (count + length - 1) // length
        if level > 0:
            state = self.keep_starts(level, segments, carry, state)

        def segment(i: Int[Array, ""], state: _State) -> _State:
            j = segments - 1 - i
            begin = get_state(state[2][level], j, self.run.packing, self.run.batched)
            size = jnp.minimum(length, count - j * length)
            return self.span(level + 1, first + j * length, size, begin, state, n)

        return lax.fori_loop(0, segments, segment, state)
