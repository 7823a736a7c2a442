"""What the forward sweep of a checkpointed loop leaves for its reverse sweep, and the
helpers both sweeps use to store and restore loop states (packed rows, see `Packing`)."""

from typing import TYPE_CHECKING

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jax import lax
from jaxtyping import Array, ArrayLike, Bool, Int, PyTree, Shaped

from ._loop import Buffers, Loop, Write, scratch_row
from ._packing import Packing, Rows, is_float

if TYPE_CHECKING:  # the schedules import this module
    from ._schedule import AbstractSchedule


SlotIndex = Int[Array, " slots"]  # the tick whose state each slot holds, -1 if free
# A sweep's slot table; `Segments` keeps the packed state before each segment in its place.
SlotTable = SlotIndex | Rows
# Cotangents of (a carry, the differentiated parameters).
Cotangents = tuple[PyTree, PyTree]


def split_floats(tree: PyTree) -> tuple[PyTree, PyTree]:
    """(the float leaves of `tree`, the others), each with None in the other's places."""
    return eqx.partition(tree, is_float)


def scratch_writes(buffers: Buffers) -> tuple[Write, ...]:
    """Zero writes to each buffer's last (scratch) row: what a step tick writes."""

    def one(buffer: PyTree) -> Write:
        row = scratch_row(buffer)
        zeros = jtu.tree_map(lambda b: jnp.zeros(b.shape[1:], b.dtype), buffer)
        return Write(jnp.int32(row), zeros)

    return tuple(one(b) for b in buffers)


def num_ticks_bound(loop: Loop) -> int:
    if loop.max_steps is None:
        raise ValueError(
            "reverse-mode differentiation needs a bound on the number of steps: pass an "
            "integer max_steps (or use adjoint=BacksolveAdjoint())."
        )
    return loop.max_steps + loop.max_emits


class Sweep(eqx.Module):
    """What the forward sweep leaves for the reverse sweep, and the schedule it kept
    (chosen once, where the batch size is known: a reverse sweep under `jax.jacrev` runs
    batched over cotangents after an unbatched forward sweep)."""

    n: Int[Array, ""]  # ticks taken
    slots: Rows  # stored carries, packed; one scratch row at the end
    slot_index: SlotTable
    last: PyTree  # carry before the last tick (None when taping)
    decisions: Array | None  # step-size decision after each tick (None unless replaying)
    schedule: "AbstractSchedule" = eqx.field(static=True)


# Step-size decisions kept for recomputation to replay: those of the first DECISION_ROWS
# ticks (1 MiB in float64), not one per tick of the bound, so that memory follows the
# steps a solve takes rather than `max_steps`. A longer solve's later decisions are made
# again when recomputed, as the forward sweep made them (equal but for rounding in a
# differently compiled step).
DECISION_ROWS = 2**17


def decision_tape(loop: Loop, init: PyTree) -> Shaped[Array, " rows *decision"]:
    """Row k + 1 holds the decision after tick k (row 0 is written by inactive samples
    and never read)."""
    assert loop.decision is not None  # only a loop with decisions records them
    shape = jax.eval_shape(loop.decision, init)
    rows = min(num_ticks_bound(loop), DECISION_ROWS) + 1
    return jnp.zeros((rows, *shape.shape), shape.dtype)


def record_decision(
    loop: Loop,
    decisions: Shaped[Array, " rows *decision"],
    k: Int[Array, ""],
    carry: PyTree,
    active: Bool[ArrayLike, ""],
) -> Shaped[Array, " rows *decision"]:
    """Keep the decision of the carry after tick k, where the tape has a row for it."""
    assert loop.decision is not None  # only a loop with decisions records them
    row = jnp.where(active & (k + 1 < decisions.shape[0]), k + 1, 0)
    return lax.dynamic_update_index_in_dim(decisions, loop.decision(carry), row, 0)


def replay_decision(
    loop: Loop,
    decisions: Shaped[Array, " rows *decision"] | None,
    k: Int[Array, ""],
    carry: PyTree,
) -> PyTree:
    """The carry after recomputing tick k, with the forward sweep's decision put back
    where the tape holds it (later ticks keep the one just made)."""
    if decisions is None:
        return carry
    assert loop.decision is not None and loop.replay is not None  # decisions were recorded
    rows = decisions.shape[0]
    kept = decisions[jnp.minimum(k + 1, rows - 1)]
    return loop.replay(carry, jnp.where(k + 1 < rows, kept, loop.decision(carry)))


def put_state(slots: Rows, i: Int[ArrayLike, ""], carry: PyTree, packing: Packing) -> Rows:
    """Store a state in the first columns of row i (a row may hold more beside it)."""
    floats, ints = packing.pack(carry)
    i, zero = jnp.asarray(i, jnp.int32), jnp.zeros((), jnp.int32)
    put = lambda s, r: lax.dynamic_update_slice(s, r[None].astype(s.dtype), (i, zero))
    return put(slots[0], floats), put(slots[1], ints)


def get_state(slots: Rows, i: Int[ArrayLike, ""], packing: Packing) -> PyTree:
    """The state stored in the first columns of row i."""
    f, n = packing.sizes()
    return packing.unpack((slots[0][i, :f], slots[1][i, :n]))
