"""What the forward sweep of a checkpointed loop leaves for its reverse sweep, and the
helpers both sweeps use to store and restore loop states (packed rows, see `Packing`)."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jax import lax

from ._loop import Loop, Write, scratch_row
from ._packing import is_float


def split_floats(tree):
    return eqx.partition(tree, is_float)


def scratch_writes(buffers: tuple) -> tuple:
    """Zero writes to each buffer's last (scratch) row: what a step tick writes."""

    def one(buffer):
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

    n: Any  # ticks taken
    slots: Any  # stored carries, packed; one scratch row at the end
    slot_index: Any  # tick held by each slot, -1 if free (`Segments`: the segment states)
    last: Any  # carry before the last tick (None when taping)
    decisions: Any  # step-size decision after each tick (None unless replaying)
    schedule: Any = eqx.field(static=True)


# Step-size decisions kept for recomputation to replay: those of the first DECISION_ROWS
# ticks (1 MiB in float64), not one per tick of the bound, so that memory follows the
# steps a solve takes rather than `max_steps`. A longer solve's later decisions are made
# again when recomputed, as the forward sweep made them (equal but for rounding in a
# differently compiled step).
DECISION_ROWS = 2**17


def decision_tape(loop, init):
    """Row k + 1 holds the decision after tick k (row 0 is written by inactive samples
    and never read)."""
    shape = jax.eval_shape(loop.decision, init)
    rows = min(num_ticks_bound(loop), DECISION_ROWS) + 1
    return jnp.zeros((rows, *shape.shape), shape.dtype)


def record_decision(loop, decisions, k, carry, active):
    """Keep the decision of the carry after tick k, where the tape has a row for it."""
    row = jnp.where(active & (k + 1 < decisions.shape[0]), k + 1, 0)
    return lax.dynamic_update_index_in_dim(decisions, loop.decision(carry), row, 0)


def replay_decision(loop, decisions, k, carry):
    """The carry after recomputing tick k, with the forward sweep's decision put back
    where the tape holds it (later ticks keep the one just made)."""
    if decisions is None:
        return carry
    rows = decisions.shape[0]
    kept = decisions[jnp.minimum(k + 1, rows - 1)]
    return loop.replay(carry, jnp.where(k + 1 < rows, kept, loop.decision(carry)))


def put_state(slots, i, carry, packing):
    """Store a state in the first columns of row i (a row may hold more beside it)."""
    floats, ints = packing.pack(carry)
    i, zero = jnp.asarray(i, jnp.int32), jnp.zeros((), jnp.int32)
    put = lambda s, r: lax.dynamic_update_slice(s, r[None].astype(s.dtype), (i, zero))
    return put(slots[0], floats), put(slots[1], ints)


def get_state(slots, i, packing):
    f, n = packing.sizes()
    return packing.unpack((slots[0][i, :f], slots[1][i, :n]))
