"""Reversing from stored states by recomputation: restore the latest state before the
tick to reverse, run forward to it (storing further states in free slots by Griewank's
binomial rule), apply the tick's VJP.

The slots are a stack in tick order (`SlotTable`): the reverse sweep only ever restores
the latest state, releases it once its tick is reversed, and stores states later than
every one it holds, so a reverse tick reads and writes one entry of the table.
"""

import equinox as eqx
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, ArrayLike, Bool, Int, PyTree

from . import _decisions
from ._binomial import next_checkpoint
from ._decisions import Recorded
from ._lockstep import lockstep_while, where_any
from ._loop import Buffers
from ._packing import Packing, Rows
from ._slot_table import SlotTable
from ._sweep import Backward, Cotangents, get_state, put_state
from ._tick_vjp import add, batched_tick_vjp, tick_vjp

Scalar = Int[Array, ""]
# Advancing: (carry, its tick, the next tick to store, slots in use) and (slots, table).
_Advance = tuple[PyTree, Scalar, Scalar, Scalar]
_Stored = tuple[Rows, SlotTable]
# Reversing: (tick to reverse, tick of the carry, carry, next tick to store, slots in
# use, cotangent of the carry after the tick) and (slots, slot table, parameters'
# cotangent, buffers').
_Small = tuple[Scalar, Scalar, PyTree, Scalar, Scalar, PyTree]
_Large = tuple[Rows, SlotTable, PyTree, Buffers]


def _next_store(
    free: Scalar,
    index: Scalar,
    target: Scalar,
    moved: Bool[ArrayLike, ""] = True,
    previous: Scalar | None = None,
) -> Scalar:
    """Where the next state goes when holding the state before tick `index` and needing
    the one before `target`, with `free` slots: Griewank's binomial rule (the target
    itself, never stored, when no slot is free). Where not `moved`, `previous` stays:
    one `cond` for both, so the rule runs only when it is needed."""
    otherwise = target if previous is None else jnp.where(moved, target, previous)

    def rule() -> Scalar:
        nxt = jnp.clip(next_checkpoint(index, target, jnp.maximum(free, 1)), index + 1, target)
        return jnp.where(free > 0, nxt, target)

    return lax.cond(moved & (index < target), rule, lambda: otherwise)


def reverse_recompute(
    back: Backward, enabled: Bool[ArrayLike, ""] = True, before_steps: bool = False
) -> tuple[Cotangents, Buffers]:
    """Reverse with recomputation from the states a schedule kept in slots (see
    `_schedule._slots`), placing further checkpoints by Griewank's binomial rule. Each
    iteration reverses one tick: it advances (in an inner loop of bare ticks, which
    stores the states the rule picks on the way) from the latest stored state to the
    tick, applies the tick's VJP, then restores the latest state before the next tick.
    One iteration per tick rather than one per store halves the iterations of a binomial
    schedule, whose stores are about as many as its ticks. The slot bookkeeping is
    branch-free, so the slots never pass through a `cond` (which would copy them every
    iteration). Where not `enabled`, nothing is reversed. `before_steps`: the slots hold
    states before steps only, packed by `Run.step_packing` (see `_schedule._slots`);
    then a state is stored only before a step, and a tick before every stored one (the
    emits at the start) is recomputed from the initial carry. Returns the cotangents (of
    the initial carry, of the parameters) and what is left of the output cotangents."""
    (_, last), (slots, table, _) = back.sweep.kept
    n = back.sweep.n
    ct_final, ct_params = back.start
    recomputation = _Recomputation(back, before_steps)
    # Start at the last tick, from the carry before it where the forward sweep kept it,
    # else from the latest state stored before it. Under `vmap` the samples go in
    # lockstep (see `lockstep_while`): a finished one stores to the scratch slot and
    # reverses nothing, so the slots and the parameter cotangent need no per-sample select.
    target = jnp.where(enabled, n - 1, -1)
    used = table.used()  # a count over the table, once a sweep
    if last is None:
        carry, index, nxt = recomputation.restore(slots, table, used, target)
        small = (target, index, carry, nxt, used, ct_final)
    else:
        small = (target, n - 1, last, n - 1, used, ct_final)
    small, (_, _, ct_params, ct_buffers) = lockstep_while(
        lambda s, b: s[0] >= 0,
        recomputation.reverse_tick,
        small,
        (slots, table, ct_params, back.ct_buffers),
        back.run.batched,
    )
    return (small[5], ct_params), ct_buffers


class _Recomputation(eqx.Module):
    """The ticks of `reverse_recompute`. The slot table changes only where a state is
    stored (a write that a sample not going leaves unchanged), so it goes with the slots
    rather than being selected per sample every tick; the count of slots in use is."""

    back: Backward
    before_steps: bool

    @property
    def packing(self) -> Packing:
        run = self.back.run
        return run.step_packing if self.before_steps else run.packing

    def tick(self, carry: PyTree, index: Scalar) -> tuple[PyTree, Scalar]:
        """Tick `index` again, with the forward sweep's decision."""
        run = self.back.run
        recorded = self.recorded(index)
        carry = _decisions.obey(run.loop, recorded, carry)
        carry, _ = run.loop.tick(run.params, carry, self.back.scratch)
        return _decisions.replay(run.loop, recorded, carry), index + 1

    def recorded(self, k: Scalar) -> Recorded:
        return _decisions.recorded(self.back.run.loop, self.back.sweep.kept[1][2], k)

    def advance(
        self, target: Scalar, small: _Advance, large: _Stored, active: Bool[Array, ""]
    ) -> tuple[_Advance, _Stored]:
        """One tick towards `target`, first storing the state before it if it is the
        next checkpoint (an inactive sample stores to the scratch slot)."""
        carry, index, nxt, used = small
        slots, table = large
        run = self.back.run
        count = table.count
        due = index == nxt
        # Before an emit, with states kept before steps only: the next tick instead.
        storable = ~run.loop.pending(carry) if self.before_steps else True
        store = due & storable & active
        free_slot = table.free_slot(used)
        row = jnp.where(store, free_slot, count)  # else the scratch row
        slots = put_state(slots, row, carry, self.packing, run.batched)
        table = table.holding(free_slot, index, store)
        used = used + store.astype(jnp.int32)
        nxt = _next_store(count - used, index, target, store, nxt)
        if self.before_steps:
            nxt = jnp.where(due & ~store, jnp.minimum(index + 1, target), nxt)
        carry, index = self.tick(carry, index)
        return (carry, index, nxt, used), (slots, table)

    def reverse_tick(
        self, small: _Small, large: _Large, active: Bool[Array, ""]
    ) -> tuple[_Small, _Large]:
        """Advance to tick `target`, apply its VJP, restore the latest state before the
        next one."""
        run = self.back.run
        target, index, carry, nxt, used, ct_carry = small
        slots, table, ct_params, ct_bufs = large
        (carry, index, nxt, used), (slots, table) = lockstep_while(
            lambda s, b: s[1] < target,
            lambda s, b, a: self.advance(target, s, b, a),
            (carry, index, nxt, used),
            (slots, table),
            run.batched,
        )
        loop, params, diff = run.loop, run.params, run.diff
        # The tick is differentiated as the forward sweep took it.
        carry = _decisions.obey(loop, self.recorded(target), carry)
        if run.batched:  # a finished sample reverses nothing
            ct_params, ct_carry, ct_bufs = batched_tick_vjp(
                loop, params, diff, carry, ct_carry, ct_bufs, active=active, ct_params=ct_params
            )
        else:
            scratch = self.back.scratch
            dp, ct_carry, ct_bufs = tick_vjp(loop, params, carry, scratch, ct_carry, ct_bufs, diff)
            ct_params = add(ct_params, dp)
        # Release the state before the tick just reversed, if kept (every later one was
        # released before), and restore the latest one before the next.
        released = active & (used > 0) & (table.ticks[table.top(used)] >= target)
        used = used - released.astype(jnp.int32)
        target = jnp.where(active, target - 1, target)
        carry, index, nxt = self.restore(slots, table, used, target)
        return (target, index, carry, nxt, used, ct_carry), (slots, table, ct_params, ct_bufs)

    def restore(
        self, slots: Rows, table: SlotTable, used: Scalar, target: Scalar
    ) -> tuple[PyTree, Scalar, Scalar]:
        """The latest stored state before tick `target` (the top of the stack: every
        later one is released), its tick, and the next tick to store on the way to
        `target`."""
        run = self.back.run
        j = table.top(used)
        carry = get_state(slots, j, self.packing, run.batched)
        index = table.ticks[j]
        if self.before_steps:  # no state stored before the emits at the start
            none = (used == 0) | (index > jnp.maximum(target, 0))
            # A branch: the initial carry is read for those emits only, not selected
            # leaf by leaf on every tick.
            carry = where_any(none, lambda: run.init, carry)
            index = jnp.where(none, 0, index)
        return carry, index, _next_store(table.count - used, index, target)
