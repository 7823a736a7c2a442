"""A loop of bounded length written with `lax.scan`, so JAX differentiates it natively in
forward and reverse mode (and forward-over-reverse: Hessians).

Ticks run in blocks of about sqrt(bound); each block is rematerialised in reverse mode
(`jax.checkpoint`), so memory is O(sqrt(bound)) carries and buffers. Every call costs the
full bound of ticks: ticks after the loop has finished are skipped by `lax.cond`, which
`vmap` turns into a select, so prefer the default adjoint for reverse mode and
`ForwardMode` for forward mode when speed matters.
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import PyTree

from ._decided import DECISION, decided
from ._loop import Buffers, Loop, Plain, Write, apply_writes, run_plain
from ._sweep import num_ticks_bound, scratch_writes


def bounded_loop(loop: Loop, params: PyTree, init: PyTree, buffers: Buffers) -> Plain:
    """Run `loop` as `lax.scan`s over blocks of ticks up to its bound (see above); with
    no bound (`max_steps=None`), as a `lax.while_loop`, which forward mode differentiates
    and reverse mode refuses, as in Diffrax."""
    if loop.max_steps is None:
        return run_plain(loop, params, init, buffers)
    bound = num_ticks_bound(loop)
    block = max(1, math.isqrt(bound))
    blocks = -(-bound // block)
    scratch = scratch_writes(loop, params, init, buffers)

    def step(carry: PyTree) -> tuple[PyTree, tuple[Write, ...]]:
        new, writes = loop.tick(params, carry, scratch)
        if loop.decision is not None:
            assert loop.replay is not None  # a loop with decisions replays them
            # Recomputed blocks must take the forward sweep's step sizes: a decision
            # (an adaptive step size) is a difference of nearly equal numbers, and the
            # block compiled again for the reverse sweep rounds differently, so it would
            # otherwise differentiate a slightly different discretisation (relative
            # errors of 1e-7 seen). The decision is saved, not recomputed, as is what
            # the body marked `decided` (a step's acceptance).
            decision = decided(loop.decision(carry, new))
            new = loop.replay(new, decision, jnp.asarray(True))
        return new, writes

    def tick(state: Plain, _: None) -> tuple[Plain, None]:
        carry, bufs = state
        carry, writes = lax.cond(loop.going(params, carry), step, lambda c: (c, scratch), carry)
        return (carry, apply_writes(bufs, writes)), None

    @functools.partial(
        jax.checkpoint, policy=jax.checkpoint_policies.save_only_these_names(DECISION)
    )
    def run_block(state: Plain, _: None) -> tuple[Plain, None]:
        state, _ = lax.scan(tick, state, None, length=block)
        return state, None

    (final, buffers), _ = lax.scan(run_block, (init, buffers), None, length=blocks)
    return final, buffers
