"""What the forward sweep of a checkpointed loop leaves for its reverse sweep, and the
helpers both sweeps use to store and restore loop states (packed rows, see `Packing`)."""

from collections.abc import Callable
from typing import TypeAlias

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jaxtyping import Array, ArrayLike, Bool, Int, PyTree

from ._lockstep import tree_where
from ._loop import Buffers, Loop, Write, scratch_row
from ._packing import Packing, Rows
from ._rows import read_row, write_row

SlotIndex = Int[Array, " slots"]  # the tick whose state each slot holds, -1 if free
# Cotangents of (a carry, the differentiated parameters).
Cotangents = tuple[PyTree, PyTree]
# What a schedule keeps on the way forward: (a part selected per sample, a part written
# only through scratch rows: slots, a tape, a decision record).
Kept = tuple[PyTree, PyTree]
# A record of decisions: a PyTree of arrays of a row per tick, or None.
Decisions: TypeAlias = PyTree
# One tick's recorded decision and whether the record holds it, or None.
Recorded: TypeAlias = tuple[PyTree, Bool[Array, ""]] | None

# Decisions kept for recomputation to impose, by default: those of the first 2**17 ticks
# (1.1 MiB in float64), not one per tick of the bound, so that memory follows the steps a
# solve takes rather than `max_steps`. A longer solve's later decisions are made again
# when recomputed, as the forward sweep made them (equal but for rounding in a
# differently compiled step).
DECISION_ROWS = 2**17


class Run(eqx.Module):
    """One differentiated run of a loop, as both of its sweeps see it: the loop, its
    parameters (`diff`: which leaves are differentiated), its initial carry, whether it
    runs batched under `vmap`, and how many step-size decisions to record for replay."""

    loop: Loop
    params: PyTree
    diff: PyTree[bool]
    init: PyTree
    batched: bool
    decision_rows: int = DECISION_ROWS

    @property
    def packing(self) -> Packing:
        """How a state of this loop is packed into a row."""
        return Packing.of(self.init)


class Tick(eqx.Module):
    """A tick of the forward sweep: its number k and the carry before it."""

    k: Int[Array, ""]
    carry: PyTree

    def after(self, new: PyTree, active: Bool[ArrayLike, ""]) -> "Tick":
        """The next tick, from `new`, the carry after this one; unchanged where not
        `active`."""
        return Tick(
            self.k + jnp.asarray(active).astype(jnp.int32), tree_where(active, new, self.carry)
        )


class Sweep(eqx.Module):
    """What the forward sweep leaves for the reverse sweep: the ticks taken and what the
    schedule kept (see `AbstractSchedule`)."""

    n: Int[Array, ""]
    kept: Kept
    final: PyTree  # the carry after the last tick (undoing starts from it)


class Backward(eqx.Module):
    """What a schedule's reverse sweep starts from: the run, the forward sweep's record,
    the cotangents (of the final carry, of the differentiated parameters: zeros) and the
    output buffers' cotangents, and what a step tick writes (`scratch`, to scratch rows)."""

    run: Run
    sweep: Sweep
    start: Cotangents
    ct_buffers: Buffers
    scratch: tuple[Write, ...]


def scratch_writes(
    loop: Loop, params: PyTree, carry: PyTree, buffers: Buffers
) -> tuple[Write, ...]:
    """Zero writes to each buffer's last (scratch) row, shaped as an emit's writes (one
    row, or a block of rows): what a step tick writes."""
    if not buffers:
        return ()
    _, shapes = jax.eval_shape(lambda: loop.emit(params, carry))

    def one(buffer: PyTree, write: Write) -> Write:
        row = jnp.full(jnp.shape(write.row), scratch_row(buffer), jnp.int32)
        return Write(row, jtu.tree_map(lambda v: jnp.zeros(v.shape, v.dtype), write.value))

    return tuple(one(b, w) for b, w in zip(buffers, shapes, strict=True))


def num_ticks_bound(loop: Loop) -> int:
    if loop.max_steps is None:
        raise ValueError(
            "reverse-mode differentiation needs a bound on the number of steps: pass an "
            "integer max_steps (or use adjoint=BacksolveAdjoint())."
        )
    return loop.max_steps + loop.max_emits


def decision_tape(run: Run) -> Decisions:
    """An empty record of step-size decisions, or None for a loop that makes none. Row
    k + 1 holds the decision of tick k (row 0 is written by inactive samples and never
    read)."""
    loop = run.loop
    if loop.decision is None:
        return None
    shapes = jax.eval_shape(loop.decision, run.init, run.init)
    rows = min(num_ticks_bound(loop), run.decision_rows) + 1
    return jtu.tree_map(lambda s: jnp.zeros((rows, *s.shape), s.dtype), shapes)


def record_decision(
    loop: Loop,
    decisions: Decisions,
    k: Int[Array, ""],
    before: PyTree,
    after: PyTree,
    active: Bool[ArrayLike, ""],
) -> Decisions:
    """Keep the decision of tick k (from carry `before` to `after`), where the record has
    a row for it."""
    if decisions is None:
        return None
    assert loop.decision is not None  # only a loop with decisions records them
    row = jnp.where(active & (k + 1 < _rows(decisions)), k + 1, 0)
    batched = loop.batch_size > 1
    write = lambda d, v: write_row(d, row, v, batched=batched)
    return jtu.tree_map(write, decisions, loop.decision(before, after))


def recorded_decision(loop: Loop, decisions: Decisions, k: Int[Array, ""]) -> Recorded:
    """The forward sweep's decision of tick k, read once for both sides of recomputing
    it, and whether the record holds it (None: the loop records none)."""
    if decisions is None:
        return None
    rows = _rows(decisions)
    row = jnp.minimum(k + 1, rows - 1)
    batched = loop.batch_size > 1
    kept = jtu.tree_map(lambda d: read_row(d, row, batched=batched), decisions)
    return kept, k + 1 < rows


def obey_decision(loop: Loop, recorded: Recorded, carry: PyTree) -> PyTree:
    """The carry before recomputing a tick, made to take the forward sweep's verdict
    where the record holds it."""
    return _impose(loop.obey, recorded, carry)


def replay_decision(loop: Loop, recorded: Recorded, carry: PyTree) -> PyTree:
    """The carry after recomputing a tick, with the forward sweep's step size put back
    where the record holds it."""
    return _impose(loop.replay, recorded, carry)


def _impose(
    hook: Callable[[PyTree, PyTree, Bool[Array, ""]], PyTree] | None,
    recorded: Recorded,
    carry: PyTree,
) -> PyTree:
    if recorded is None:
        return carry
    assert hook is not None  # a loop that records decisions imposes them
    return hook(carry, *recorded)


def _rows(decisions: PyTree) -> int:
    return jtu.tree_leaves(decisions)[0].shape[0]


def put_state(
    slots: Rows, i: Int[ArrayLike, ""], carry: PyTree, packing: Packing, batched: bool = False
) -> Rows:
    """Store a state in the first columns of row i (a row may hold more beside it);
    `batched`: under `vmap` (see `_rows`)."""
    floats, ints = packing.pack(carry)
    return write_row(slots[0], i, floats, 0, batched), write_row(slots[1], i, ints, 0, batched)


def get_state(
    slots: Rows, i: Int[ArrayLike, ""], packing: Packing, batched: bool = False
) -> PyTree:
    """The state stored in the first columns of row i."""
    f, n = packing.sizes()
    floats, ints = read_row(slots[0], i, 0, f, batched), read_row(slots[1], i, 0, n, batched)
    return packing.unpack((floats, ints))
