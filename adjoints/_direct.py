"""A loop of bounded length written with `lax.scan`, so JAX differentiates it natively in
forward and reverse mode (and forward-over-reverse: Hessians).

Ticks run in blocks of about sqrt(bound); each block is rematerialised in reverse mode
(`jax.checkpoint`), so memory is O(sqrt(bound)) carries. The output buffers are not
carried: each tick's writes are the scans' outputs, stored into the buffers once the
loop is over, so that neither the blocks' checkpoints nor the reverse sweep copy a
buffer per block or per tick. A block after the loop has ended (under `vmap`, after
every sample's has) is skipped whole, so a call costs the blocks its ticks reach (its
slowest sample's), each rematerialised once in reverse mode: prefer the default adjoint
for reverse mode and `ForwardMode` for forward mode when speed matters.
"""

import functools
import math

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jax import lax
from jaxtyping import Array, PyTree

from ._decided import DECISION, decided
from ._lockstep import if_any, where_any
from ._loop import Buffers, Loop, Plain, Write, run_plain, scratch_row
from ._sweep import num_ticks_bound, scratch_writes


def bounded_loop(loop: Loop, params: PyTree, init: PyTree, buffers: Buffers) -> Plain:
    """Run `loop` as `lax.scan`s over blocks of ticks up to its bound (see above); with
    no bound (`max_steps=None` and adaptive steps), as a `lax.while_loop`, which forward
    mode differentiates and reverse mode refuses, as in Diffrax."""
    if loop.max_steps is None and loop.num_steps is None:
        return run_plain(loop, params, init, buffers)
    bound = num_ticks_bound(loop)
    block = max(1, math.isqrt(bound))
    blocks = -(-bound // block)
    scratch = scratch_writes(loop, params, init, buffers)

    def replayed(carry: PyTree, new: PyTree) -> PyTree:
        if loop.decision is None:
            return new
        assert loop.replay is not None  # a loop with decisions replays them
        # Recomputed blocks must take the forward sweep's step sizes: a decision (an
        # adaptive step size) is a difference of nearly equal numbers, and the block
        # compiled again for the reverse sweep rounds differently, so it would otherwise
        # differentiate a slightly different discretisation (relative errors of 1e-7
        # seen). The decision is saved, not recomputed, as is what the body marked
        # `decided` (a step's acceptance).
        decision = decided(loop.decision(carry, new))
        return loop.replay(new, decision, jnp.asarray(True))

    def step(carry: PyTree) -> tuple[PyTree, tuple[Write, ...]]:
        new, writes = loop.tick(params, carry, scratch)
        return replayed(carry, new), writes

    def lockstep(carry: PyTree) -> tuple[PyTree, tuple[Write, ...]]:
        # Under `vmap` a `cond` on each sample's predicate runs both branches and selects
        # every output leaf, which cost several times the step itself. Here the emit and
        # the step each run only when some sample takes it, and each sample keeps its
        # carry, writing to scratch, where it takes the other or has finished.
        def emit() -> tuple[PyTree, tuple[Write, ...]]:
            new, writes = loop.emit(params, carry)
            return replayed(carry, new), writes

        going = loop.going(params, carry)
        emitted: tuple[PyTree, tuple[Write, ...]] = (carry, scratch)
        if loop.max_emits > 0:
            pending = loop.pending(carry)
            emitted = where_any(going & pending, emit, emitted)
            going = going & ~pending
        after, writes = emitted
        stepped = lambda: replayed(after, loop.body(params, after))
        return where_any(going, stepped, after), writes

    def tick(carry: PyTree, _: None) -> tuple[PyTree, tuple[Write, ...]]:
        if loop.batch_size > 1:
            return lockstep(carry)
        return lax.cond(loop.going(params, carry), step, lambda c: (c, scratch), carry)

    idle = jtu.tree_map(lambda x: jnp.broadcast_to(x, (block, *jnp.shape(x))), scratch)

    @functools.partial(
        jax.checkpoint, policy=jax.checkpoint_policies.save_only_these_names(DECISION)
    )
    def run_block(carry: PyTree, _: None) -> tuple[PyTree, tuple[Write, ...]]:
        # A block after every sample has ended is skipped (under `vmap` too).
        ticks = lambda c: lax.scan(tick, c, None, length=block)
        going = loop.going(params, carry)
        if loop.batch_size > 1:
            return if_any(going, lambda: ticks(carry), lambda: (carry, idle))
        return lax.cond(going, ticks, lambda c: (c, idle), carry)

    final, writes = lax.scan(run_block, init, None, length=blocks)
    return final, tuple(_store(b, w) for b, w in zip(buffers, writes, strict=True))


def _store(buffer: PyTree, writes: Write) -> PyTree:
    """`buffer` with every tick's `writes` (stacked on leading axes) stored, as applying
    them in order would: where ticks write the same row, the last one's value."""
    rows = jnp.ravel(writes.row)
    scratch = scratch_row(buffer)
    order = jnp.arange(rows.shape[0], dtype=jnp.int32)
    last = jnp.full((scratch + 1,), -1, jnp.int32).at[rows].max(order)
    rows = jnp.where(last[rows] == order, rows, scratch)

    def put(b: Array, v: Array) -> Array:
        v = jnp.reshape(v, (rows.shape[0], *b.shape[1:])).astype(b.dtype)
        return b.at[rows].set(v, mode="promise_in_bounds")

    return jtu.tree_map(put, buffer, writes.value)
