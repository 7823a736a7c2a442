"""A loop of bounded length written with `lax.scan`, so JAX differentiates it natively in
forward and reverse mode (and forward-over-reverse: Hessians).

Ticks run in blocks of about sqrt(bound); each block is rematerialised in reverse mode
(`jax.checkpoint`), so memory is O(sqrt(bound)) carries and buffers. Every call costs the
full bound of ticks: ticks after the loop has finished are skipped by `lax.cond`, which
`vmap` turns into a select, so prefer the default adjoint for reverse mode and
`ForwardMode` for forward mode when speed matters.
"""

import math

import jax
from jax import lax

from ._checkpointed import num_ticks_bound, scratch_writes
from ._loop import Loop, apply_writes


def bounded_loop(loop: Loop, params, init, buffers: tuple):
    bound = num_ticks_bound(loop)
    block = max(1, math.isqrt(bound))
    blocks = -(-bound // block)
    scratch = scratch_writes(buffers)

    def tick(state, _):
        carry, bufs = state
        carry, writes = lax.cond(
            loop.going(params, carry),
            lambda c: loop.tick(params, c, scratch),
            lambda c: (c, scratch),
            carry,
        )
        return (carry, apply_writes(bufs, writes)), None

    @jax.checkpoint
    def run_block(state, _):
        state, _ = lax.scan(tick, state, None, length=block)
        return state, None

    (final, buffers), _ = lax.scan(run_block, (init, buffers), None, length=blocks)
    return final, buffers
