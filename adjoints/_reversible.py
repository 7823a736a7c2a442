"""Reverse mode for a loop whose ticks can be undone (`Loop.reversal`): no stored states.
The schedule `Undo` (`_schedule/undo.py`) runs it through the checkpointed loop's custom
VJP (`_checkpointed`); here are what it keeps and its reverse sweep.

Forward sweep: run the ticks, keeping for each emit its tick's number and what
`Reversal.keep` says of the carry before it (times, counters, output progress: a few
scalars, never the state vectors), and the same for each step unless `Reversal.rewind`
rebuilds it (fixed steps; adaptive ones keep the step sizes the controller chose).
Reverse sweep: from the final carry, for k = n-1, ..., 0, rebuild the carry before tick
k (`Reversal.restore` for an emit, `Reversal.undo` for a step) and apply the tick's VJP
there. Memory is one carry and the kept scalars: with fixed steps, a row per emit (no
more than the outputs' own rows), whatever the number of steps. Each step is undone
once (`undo` passes on what it learnt of the step before) and linearised once.

The gradient is that of the computed discretisation, exact but for the rounding errors
of the rebuilt states (an algebraically reversible solver's backward recursion is exact
in exact arithmetic).

Symbolic zeros and batching follow `_checkpointed`: every cotangent is one sample's, and
`vmap`'s rules for custom VJPs sum shared parameters' where the composition asks for it.
"""

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jax import lax
from jaxtyping import Array, Bool, Int, PyTree

from ._lockstep import if_any, tree_where
from ._loop import Buffers, Loop, Reversal, emit_fn
from ._residuals import linearise, transposed
from ._rows import read_row, write_row
from ._sweep import num_steps_bound
from ._tick_vjp import accumulate, add, emit_vjp, reads_params
from ._ticks import Ticks, run_ticks


class Records(eqx.Module):
    """What the forward sweep keeps of the carries before the ticks, a row each and a
    last, scratch row: for the e-th emit, its tick (`emit_ticks`) and `keep` of the
    carry before it (`emits`); for the s-th step, `keep` of the carry before it
    (`steps`; None where `Reversal.rewind` rebuilds it)."""

    emit_ticks: Int[Array, " emits"]
    emits: PyTree
    steps: PyTree | None


# What the forward sweep leaves: the final carry, the records, the number of ticks and
# of emits among them.
Kept = tuple[PyTree, Records, Int[Array, ""], Int[Array, ""]]


def rewinds(reversal: Reversal, params: PyTree, init: PyTree) -> bool:
    """Whether the reverse sweep rebuilds what is kept of a step's carry (when traced)."""
    return eqx.filter_eval_shape(reversal.rewind, params, init) is not None


def _rows(example: PyTree, count: int) -> PyTree:
    return jtu.tree_map(lambda x: jnp.zeros((count + 1, *x.shape), x.dtype), example)


def _put(records: PyTree, k: Int[Array, ""], small: PyTree, active: Bool[Array, ""]) -> PyTree:
    def one(rows: Array, value: Array) -> Array:
        row = jnp.where(active, k, rows.shape[0] - 1)
        return write_row(rows, row, value)

    return jtu.tree_map(one, records, small)


def _get(records: PyTree, k: Int[Array, ""]) -> PyTree:
    return jtu.tree_map(lambda rows: read_row(rows, jnp.maximum(k, 0)), records)


def empty_records(loop: Loop, reversal: Reversal, params: PyTree, init: PyTree) -> Records:
    """Records of zeros: `max_emits` emit rows, and a row for each step the loop can
    take unless rewound."""
    example = jax.eval_shape(reversal.keep, init)
    most = num_steps_bound(loop)  # raises without a bound on the steps
    steps = None if rewinds(reversal, params, init) else _rows(example, most)
    ticks = jnp.zeros((loop.max_emits + 1,), jnp.int32)
    return Records(ticks, _rows(example, loop.max_emits), steps)


def record(
    records: Records,
    small: PyTree,
    counts: tuple[Int[Array, ""], Int[Array, ""]],
    emitting: bool,
    active: Bool[Array, ""],
) -> Records:
    """`records` with `small` (`keep` of the carry before tick k, the e-th emit or the
    (k - e)-th step; `counts` = (k, e)) kept where `active`."""
    k, e = counts
    if emitting:
        ticks = _put(records.emit_ticks, e, k, active)
        return Records(ticks, _put(records.emits, e, small, active), records.steps)
    if records.steps is None:
        return records
    return Records(records.emit_ticks, records.emits, _put(records.steps, k - e, small, active))


# The reverse sweep's carry: (tick k, the emits before it and it, the carry after it,
# that carry's cotangent, what the undo that rebuilt it passed on), and what it
# accumulates: the parameters' cotangent (steps and emits), the output buffers' (emits).
_Small = tuple[Int[Array, ""], Int[Array, ""], PyTree, PyTree, PyTree]


def reverse_sweep(
    loop: Loop,
    reversal: Reversal,
    params: PyTree,
    diff: PyTree[bool],
    init: PyTree,
    kept: Kept,
    ct_final: PyTree,
    ct_buffers: Buffers,
    batched: bool,
) -> tuple[PyTree, PyTree]:
    """Cotangents of (the initial carry, the differentiated parameters), ticks undone
    one by one from the last, in the orders of `_ticks`. Raises (`Reversal.unstable`)
    where the carry rebuilt before the first tick is not `init`: the gradient would be
    wrong.

    An emit is undone by `restore` alone; only a step is undone by the solver, so a
    tick's kind is decided (by the emits' recorded ticks) before either is evaluated."""
    final, records, n, num_emits = kept
    undoing = _Undoing(loop, reversal, params, diff, records, batched)
    undoing = _Undoing(loop, reversal, params, diff, records, batched, undoing.emit_reads(final))
    ticks = Ticks(
        going=lambda s: s[0] >= 0,
        pending=undoing.is_emit,
        step=undoing.step,
        emit=undoing.emit,
    )
    start = (n - 1, num_emits, final, loop.split(ct_final)[0], reversal.start(params, final))
    ct_params = jtu.tree_map(jnp.zeros_like, eqx.partition(params, diff)[0])
    small, ct_params, _ = run_ticks(ticks, start, ct_params, ct_buffers, batched)
    _, _, rebuilt, ct_init, _ = small
    # Not `error > tolerance`: an error that overflowed to NaN is a failure too.
    unstable = ~(rebuilding_error(reversal, rebuilt, init) <= rebuilding_tolerance(init))
    _raise_if(unstable, reversal.unstable)
    return ct_init, ct_params


class _Undoing(eqx.Module):
    """The ticks of `reverse_sweep`: each rebuilds the carry before it and applies its
    VJP there."""

    loop: Loop
    reversal: Reversal
    params: PyTree
    diff: PyTree[bool]
    records: Records
    batched: bool
    reads_params: bool = False  # whether an emit reads a differentiated parameter

    def emit_reads(self, final: PyTree) -> bool:
        params_f, params_s = eqx.partition(self.params, self.diff)
        example_f, example_s = self.loop.split(final)
        emit = emit_fn(self.loop, params_s, example_s)
        return self.loop.max_emits > 0 and reads_params(emit, params_f, example_f)

    def is_emit(self, small: _Small) -> Bool[Array, ""]:
        k, e = small[0], small[1]
        if self.loop.max_emits == 0:
            return jnp.asarray(False)
        return (k >= 0) & (e > 0) & (self.records.emit_ticks[jnp.maximum(e - 1, 0)] == k)

    def emit(self, small: _Small, large: tuple[PyTree, Buffers], active: Bool[Array, ""]) -> tuple:
        """Undo one emit (by `restore`) and apply its VJP; nothing where not `active`."""
        if self.batched:
            return self.emit_tick(small, large, active)
        # Unbatched, the emit after the last run of steps is not due: skip its VJP.
        return lax.cond(
            active,
            lambda s, b: self.emit_tick(s, b, None),
            lambda s, b: (s, b),
            small,
            large,
        )

    def emit_tick(
        self, small: _Small, large: tuple[PyTree, Buffers], active: Bool[Array, ""] | None
    ) -> tuple:
        """One emit undone; where not `active`, nothing changes. None: known active, so
        the old values are not selected (a `cond` then forwards what the emit leaves)."""
        k, e, after, ct_after, spare = small
        ct_params, ct_bufs = large
        params_f, params_s = eqx.partition(self.params, self.diff)
        before = self.reversal.restore(after, _get(self.records.emits, e - 1))
        before_f, before_s = self.loop.split(before)
        emit = emit_fn(self.loop, params_s, before_s)
        ct_after = self.loop.split(ct_after)[0]
        mask = jnp.asarray(True) if active is None else active
        dp, ct_before, ct_bufs = emit_vjp(
            self.loop, emit, params_f, before_f, ct_after, ct_bufs, mask, self.reads_params
        )
        if self.reads_params:
            ct_params = accumulate(mask, ct_params, dp, params_f)
        new = (k - 1, e - 1, before, ct_before, spare)
        if active is None:
            return new, (ct_params, ct_bufs)
        return tree_where(active, new, (k, e, after, ct_after, spare)), (ct_params, ct_bufs)

    def obeying(self, before: PyTree, after: PyTree) -> PyTree:
        """`before`, rebuilt, made to take the verdict the forward sweep took from it (the
        kept counters of `after` say which): its vectors are rebuilt with other rounding."""
        loop = self.loop
        if loop.decision is None:
            return before
        assert loop.obey is not None  # a loop with decisions imposes them
        return loop.obey(before, loop.decision(before, after), jnp.asarray(True))

    def step_vjp(self, small: _Small) -> tuple:
        """(The carry before step k, its cotangent, what its undo passed on, the
        parameters' cotangent)."""
        k, e, after, ct_after, spare = small
        if self.records.steps is None:
            small_before = self.reversal.rewind(self.params, after)
        else:
            small_before = _get(self.records.steps, k - e)
        before, spare = self.reversal.undo(self.params, after, small_before, spare)
        lin = linearise(self.loop, self.params, self.diff, self.obeying(before, after))[1]
        params_f = eqx.partition(self.params, self.diff)[0]
        ct_p, ct_before = transposed(lin, params_f, self.loop.split(before)[0])(
            self.loop.split(ct_after)[0]
        )
        return before, ct_before, spare, ct_p

    def step(self, small: _Small, ct_params: PyTree, stepping: Bool[Array, ""]) -> tuple:
        """Undo one step and apply its VJP; batched, only when some sample steps."""
        k, e, after, ct_after, spare = small
        if not self.batched:  # the inner loop runs only active steps
            before, ct_before, spare, ct_p = self.step_vjp(small)
            return (k - 1, e, before, ct_before, spare), add(ct_params, ct_p)
        staying = (after, self.loop.split(ct_after)[0], spare)
        params_f = eqx.partition(self.params, self.diff)[0]

        def step() -> tuple:
            # The parameters' cotangent is added inside the branch, so the batch of
            # parameter-sized totals is written once per step (see `reverse_tape`).
            safe = (jnp.maximum(k, 0), e, after, ct_after, spare)
            before, ct_before, spare_before, ct_p = self.step_vjp(safe)
            moved = tree_where(stepping, (before, ct_before, spare_before), staying)
            return moved, accumulate(stepping, ct_params, ct_p, params_f)

        (after, ct_after, spare), ct_params = if_any(stepping, step, lambda: (staying, ct_params))
        k = jnp.where(stepping, k - 1, k)
        return (k, e, after, ct_after, spare), ct_params


def _raise_if(failed: Bool[Array, ""], message: str) -> None:
    """Raise `message` when the program runs, if `failed` (for any sample under `vmap`).
    A host callback, not `eqx.error_if`, which trips `jax.checking_leaks()` here."""

    def fail() -> None:
        raise RuntimeError(message)

    lax.cond(
        eqxi.unvmap_any(failed),
        lambda: jax.debug.callback(fail),
        lambda: None,
    )


def rebuilding_error(reversal: Reversal, rebuilt: PyTree, init: PyTree) -> Array:
    """How far the rebuilt initial carry is from the true one, over the leaves the
    reverse sweep rebuilds (those `keep` drops): the largest difference relative to the
    largest entry."""

    def rebuilt_here(kept: PyTree, carry: PyTree) -> PyTree:
        if kept is None:
            return jtu.tree_map(eqx.is_inexact_array, carry)
        return jtu.tree_map(lambda _: False, carry)

    dropped = jtu.tree_map(rebuilt_here, reversal.keep(init), init, is_leaf=lambda x: x is None)
    pairs = [
        (r, i)
        for r, i, d in zip(
            jtu.tree_leaves(rebuilt), jtu.tree_leaves(init), jtu.tree_leaves(dropped), strict=True
        )
        if d
    ]
    if not pairs:
        return jnp.zeros(())
    diff = jnp.max(jnp.stack([jnp.max(jnp.abs(r - i)).astype(float) for r, i in pairs]))
    scale = jnp.max(jnp.stack([jnp.max(jnp.abs(i)).astype(float) for _, i in pairs]))
    return jnp.where(scale > 0, diff / jnp.where(scale > 0, scale, 1), diff)


def rebuilding_tolerance(init: PyTree) -> float:
    """sqrt of the resolution of the widest float type in the carry: 1.5e-8 in float64."""
    floats = [x for x in jtu.tree_leaves(init) if eqx.is_inexact_array(x)]
    eps = max((float(jnp.finfo(x.dtype).eps) for x in floats), default=2.0**-52)
    return eps**0.5
