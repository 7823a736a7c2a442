"""Reversing from stored states by recomputation: restore the latest state before the
tick to reverse, run forward to it (storing further states in free slots by Griewank's
binomial rule), apply the tick's VJP."""

import jax.numpy as jnp
from jax import lax

from ._binomial import next_checkpoint
from ._lockstep import lockstep_while
from ._sweep import get_state, put_state, replay_decision
from ._tick_vjp import add, batched_tick_vjp, tick_vjp


def _nearest(slot_index, target):
    """Slot holding the latest stored tick <= target."""
    eligible = jnp.where((slot_index >= 0) & (slot_index <= target), slot_index, -1)
    return jnp.argmax(eligible).astype(jnp.int32)


def _next_store(slot_index, index, target, moved=True, previous=None):
    """Where the next state goes when holding the state before tick `index` and needing
    the one before `target`: Griewank's binomial rule over the free slots (the target
    itself, never stored, when no slot is free). Where not `moved`, `previous` stays:
    one `cond` for both, so the rule runs only when it is needed."""
    otherwise = target if previous is None else jnp.where(moved, target, previous)

    def rule():
        free = jnp.sum(slot_index < 0).astype(jnp.int32)
        nxt = jnp.clip(next_checkpoint(index, target, jnp.maximum(free, 1)), index + 1, target)
        return jnp.where(free > 0, nxt, target)

    return lax.cond(moved & (index < target), rule, lambda: otherwise)


def reverse_recompute(
    loop, params, diff, sweep, start, ct_buffers, scratch, packing, batched, enabled=True
):
    """Reverse with recomputation from the stored carries, placing further checkpoints by
    Griewank's binomial rule. Each iteration reverses one tick: it advances (in an inner
    loop of bare ticks, which stores the states the rule picks on the way) from the
    latest stored state to the tick, applies the tick's VJP, then restores the latest
    state before the next tick. One iteration per tick rather than one per store halves
    the iterations of a binomial schedule, whose stores are about as many as its ticks.
    The slot bookkeeping is branch-free, so the slots never pass through a `cond` (which
    would copy them every iteration). `start`, `enabled` and the result as for
    `reverse_tape`."""
    ct_final, ct_params = start
    n, slots, slot_index, decisions = sweep.n, sweep.slots, sweep.slot_index, sweep.decisions
    scratch_slot = slot_index.shape[0]

    def tick(carry, index):
        carry, _ = loop.tick(params, carry, scratch)
        carry = replay_decision(loop, decisions, index, carry)
        return carry, index + 1

    def advance(target):
        """One tick towards `target`, first storing the state before it if it is the
        next checkpoint (an inactive sample stores to the scratch slot)."""

        def body(small, large, active):
            carry, index, nxt = small
            slots, slot_index = large
            store = (index == nxt) & active
            free_slot = jnp.argmax(slot_index < 0).astype(jnp.int32)
            slots = put_state(slots, jnp.where(store, free_slot, scratch_slot), carry, packing)
            kept = jnp.where(store, index, slot_index[free_slot])
            slot_index = slot_index.at[free_slot].set(kept)
            nxt = _next_store(slot_index, index, target, store, nxt)
            carry, index = tick(carry, index)
            return (carry, index, nxt), (slots, slot_index)

        return body

    def body(small, large, active):
        target, index, carry, nxt, slot_index, ct_carry = small
        slots, ct_params, ct_bufs = large
        # The slot table goes with the slots: written only where a sample stores.
        (carry, index, nxt), (slots, slot_index) = lockstep_while(
            lambda s, b: s[1] < target,
            advance(target),
            (carry, index, nxt),
            (slots, slot_index),
            batched,
        )
        if batched:  # a finished sample reverses nothing
            pulled = (carry, ct_carry, ct_bufs, active, ct_params)
            ct_params, ct_carry, ct_bufs = batched_tick_vjp(loop, params, diff, *pulled)
        else:
            pulled = tick_vjp(loop, params, carry, scratch, ct_carry, ct_bufs, diff)
            dp, ct_carry, ct_bufs = pulled
            ct_params = add(ct_params, dp)
        # Release the states at or after the tick just reversed, restore the latest one
        # before the next.
        slot_index = jnp.where(active & (slot_index >= target), -1, slot_index)
        target = jnp.where(active, target - 1, target)
        j = _nearest(slot_index, jnp.maximum(target, 0))
        carry = get_state(slots, j, packing)
        index = slot_index[j]
        nxt = _next_store(slot_index, index, target)
        return (target, index, carry, nxt, slot_index, ct_carry), (slots, ct_params, ct_bufs)

    # Start at the last tick, whose carry the forward sweep kept. Under `vmap` the samples
    # go in lockstep (see `lockstep_while`): a finished one stores to the scratch slot and
    # reverses nothing, so the slots and the parameter cotangent need no per-sample select.
    small = (jnp.where(enabled, n - 1, -1), n - 1, sweep.last, n - 1, slot_index, ct_final)
    small, (_, ct_params, ct_buffers) = lockstep_while(
        lambda s, b: s[0] >= 0,
        lambda s, b, a: body(s, b, a),
        small,
        (slots, ct_params, ct_buffers),
        batched,
    )
    return (small[5], ct_params), ct_buffers
