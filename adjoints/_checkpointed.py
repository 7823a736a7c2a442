"""Reverse mode for a `Loop`: a custom VJP over the whole loop, with checkpoints.

Forward sweep: run the ticks, storing the carry before tick k whenever the schedule says so
(the output buffers are never stored: they are written, not carried). Reverse sweep: for
k = n-1, ..., 0 restore the nearest stored carry at or before k, recompute forwards to k
(storing further carries in free slots by the binomial rule), and apply the vector-Jacobian
product of tick k. Cotangents reach the loop's `params` (so a vector field's parameters and
anything it closed over get gradients) and its initial carry.

Buffer cotangents follow the overwrite semantics of `Loop`: the cotangent of a write is
what the output cotangent holds at its row, after which the row is zeroed, so an earlier
write to the same row (overwritten in the forward sweep) receives nothing.

Symbolic zeros: an output that was not differentiated arrives as `None` and becomes zeros;
integer and boolean leaves of the carry are never differentiated.
"""

from typing import Any

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jax import lax

from ._lockstep import if_any, lockstep_while, tree_where
from ._loop import Loop, Write, apply_writes, run_plain, scratch_row
from ._packing import Packing, is_float
from ._residuals import layout_of, linearise, tape_rows, transposed
from ._schedule.nested import Nested
from ._schedule.online import Online
from ._schedule.revolve import Revolve, next_checkpoint
from ._schedule.segments import Segments
from ._schedule.tape import Tape


def _split(tree):
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


# --------------------------------------------------------------------------- forward


def _forward(loop, schedule, params, diff, init, buffers, batched):
    """Run the loop, storing carries per `schedule`. Returns the final carry, the buffers
    and a `_Sweep`. Its `last` is the carry before the last tick: revolve's first
    "youturn" starts from it, so the last stretch of the sweep is not recomputed.

    Taping (`Tape`) stores each step's residuals instead of the carry before it (see
    `_residuals`), and the carry before each emit. `Segments` tapes likewise into rows
    reused segment after segment, and keeps the state before each segment.

    Two levels, as in `run_plain`: steps run in an inner loop that never touches the
    output buffers; the outer loop emits."""
    packing = Packing.of(init)
    segmented = isinstance(schedule, Segments)
    taping = segmented or isinstance(schedule, Tape)
    # Online slots also keep the residuals of the step from each stored state.
    linearising = taping or isinstance(schedule, Online)
    layout, rows = (None, None)
    if linearising:
        layout, rows = tape_rows(loop, params, diff, init, combined=not taping)
    # One extra row: a state that is not kept is written there, so that storing is a
    # plain row write every tick rather than a branch carrying all the slots.
    tape_length = schedule.length if segmented else schedule.slots
    slots = (rows or packing).empty(tape_length + 1)
    slot_index = jnp.full((schedule.slots,), -1, jnp.int32)
    if segmented:  # in the table's place: the state before each segment
        slot_index = packing.empty(schedule.slots + 1)
    replaying = loop.decision is not None and not isinstance(schedule, Tape)
    decisions = _decision_tape(loop, init, num_ticks_bound(loop)) if replaying else None

    def decide(decisions, k, carry, active):
        """Record the decision of the carry after tick k (row k + 1; inactive: row 0,
        which is never replayed)."""
        if not replaying:
            return decisions
        row = jnp.where(active, k + 1, 0)
        return lax.dynamic_update_index_in_dim(decisions, loop.decision(carry), row, 0)

    def tape_row(k, active):
        """Tick k's tape row (the scratch row where not `active`)."""
        return jnp.where(active, k % tape_length if segmented else k, tape_length)

    def keep_segment_start(states, k, carry, active):
        """`Segments`: store the carry before tick k if k starts a segment."""
        if not segmented:
            return states
        starts = active & (k % tape_length == 0)
        return _put(states, jnp.where(starts, k // tape_length, schedule.slots), carry, packing)

    def record(k, carry, slots, slot_index, sched, active=True):
        """Store the carry before tick k if the schedule says so (and `active`). Branch
        free: a state not kept goes to the scratch row. (A `cond` here would, under
        `vmap`, become a select that copies every slot of every sample.) Also returns
        the row written (the scratch row if none)."""
        if taping:  # every state, at its tick's row
            row = tape_row(k, active)
            slot_index = keep_segment_start(slot_index, k, carry, active)
            return rows.put_carry(slots, row, carry), slot_index, sched, row
        # A schedule leaves an inactive sample's table as it is.
        store, slot, slot_index, new_sched = schedule.store(k, sched, slot_index, active)
        store = store & active
        row = jnp.where(store, slot, schedule.slots)
        slots = _put(slots, row, carry, packing)
        # One entry of the table written, not the whole table selected.
        slot_index = slot_index.at[slot].set(jnp.where(store, k, slot_index[slot]))
        sched = tree_where(active, new_sched, sched)
        return slots, slot_index, sched, row

    # The loops carry (small, large): the slots, decision tape and output buffers are
    # large and only written through scratch rows when inactive (see `lockstep_while`).
    # Each tick keeps its sample's carry where it is inactive (`tree_where`).
    def linearised_step(carry, slots, row, active, keep=True):
        """One step, storing its residuals at `row`; a plain step where not `keep`."""

        def step():
            new, pullback = linearise(loop, params, diff, carry)
            return new, layout.taped(pullback)

        plain = lambda: (loop.body(params, carry), rows.zero_residuals())
        if batched:
            skip = lambda: (carry, rows.zero_residuals())
            if keep is True:  # no plain step to compile
                new, taped = if_any(active, step, skip)
            else:
                new, taped = if_any(active & keep, step, lambda: if_any(active, plain, skip))
        else:
            new, taped = step() if keep is True else lax.cond(keep, step, plain)
        return new, rows.put_residuals(slots, row, taped)

    def step_tick(small, large, active):
        k, carry, prev, sched = small
        slots, slot_index, decisions = large
        if taping:
            slot_index = keep_segment_start(slot_index, k, carry, active)
            new, slots = linearised_step(carry, slots, tape_row(k, active), active)
        elif linearising:
            slots, slot_index, sched, row = record(k, carry, slots, slot_index, sched, active)
            # Residuals serve only while the slots hold every tick in order.
            keep = schedule.in_order(sched)
            new, slots = linearised_step(carry, slots, row, active, keep)
        else:
            slots, slot_index, sched, _ = record(k, carry, slots, slot_index, sched, active)
            step = lambda: loop.body(params, carry)
            new = if_any(active, step, lambda: carry) if batched else step()
        new = tree_where(active, new, carry)
        prev = None if taping else tree_where(active, carry, prev)
        decisions = decide(decisions, k, new, active)
        small = (k + active.astype(jnp.int32), new, prev, sched)
        return small, (slots, slot_index, decisions)

    def emit_tick(small, large, active, in_lockstep=False):
        """One emit. `in_lockstep`: called as the body of a `lockstep_while`, which keeps
        an inactive sample's small carry itself (a select per leaf, not two)."""
        k, carry, prev, sched = small
        slots, slot_index, decisions, bufs = large
        slots, slot_index, sched, _ = record(k, carry, slots, slot_index, sched, active)
        new, writes = loop.emit(params, carry)
        if not in_lockstep:
            new = tree_where(active, new, carry)
            prev = None if taping else tree_where(active, carry, prev)
        else:
            prev = None if taping else carry
        decisions = decide(decisions, k, new, active)
        bufs = apply_writes(bufs, writes, active)
        small = (k + active.astype(jnp.int32), new, prev, sched)
        return small, (slots, slot_index, decisions, bufs)

    def stepping(small):
        carry = small[1]
        return loop.cond(params, carry) & ~loop.pending(carry)

    def bare_steps(small, decisions):
        """Steps that store nothing: those before the next stored state and before the
        last tick (whose state before it is `last`), both known under `Revolve`."""
        k, carry, prev, sched = small
        stop = jnp.minimum(schedule.next_store(k, sched), schedule.num_ticks - 1)

        def step(state):
            k, carry, decisions = state
            new = loop.body(params, carry)
            return k + 1, new, decide(decisions, k, new, True)

        k, carry, decisions = lax.while_loop(
            lambda s: (s[0] < stop) & loop.cond(params, s[1]),
            lambda s: step(s),
            (k, carry, decisions),
        )
        return (k, carry, prev, sched), decisions

    def stored_step(small, large, active):
        """Under `Revolve` or `Nested`: bare steps up to the next tick that stores, then
        that tick."""
        slots, slot_index, decisions = large
        small, decisions = bare_steps(small, decisions)
        return step_tick(small, (slots, slot_index, decisions), active & stepping(small))

    def steps_then_emit(small, large, active):
        """Unbatched: a run of steps in an inner loop that carries no output buffers,
        then one emit (unless the loop is over: then nothing is kept or counted)."""
        *stored, bufs = large
        tick = stored_step if isinstance(schedule, (Revolve, Nested)) else step_tick
        small, stored = lockstep_while(
            lambda s, b: stepping(s),
            lambda s, b, a: tick(s, b, a & active),
            small,
            tuple(stored),
            False,
        )
        due = loop.pending(small[1]) & active
        return emit_tick(small, (*stored, bufs), due)

    def emits_then_step(small, large, active):
        """Batched: the emits due, then one step. Samples emit at different ticks, so
        this order runs a step (the costly tick) once per step of the slowest sample,
        where the unbatched order would run one at every tick some sample steps."""
        small, (*stored, bufs) = lockstep_while(
            lambda s, b: loop.pending(s[1]),
            # A sample inactive in the outer loop has nothing pending: `a` implies `active`.
            lambda s, b, a: emit_tick(s, b, a & active, in_lockstep=True),
            small,
            large,
            True,
        )
        small, stored = step_tick(small, tuple(stored), stepping(small) & active)
        return small, (*stored, bufs)

    # The slot table is large under `vmap` (slots x samples) and, like the slots, only
    # written where a sample is active: it is carried with them, not selected every tick.
    first = None if taping else init
    small = (jnp.int32(0), init, first, schedule.init())
    (k, final, prev, _), (slots, slot_index, decisions, buffers) = lockstep_while(
        lambda s, b: loop.going(params, s[1]),
        lambda s, b, a: (emits_then_step if batched else steps_then_emit)(s, b, a),
        small,
        (slots, slot_index, decisions, buffers),
        batched,
    )
    return final, buffers, _Sweep(k, slots, slot_index, prev, decisions, schedule)


class _Sweep(eqx.Module):
    """What the forward sweep leaves for the reverse sweep, and the schedule it kept
    (chosen once, where the batch size is known: a reverse sweep under `jax.jacrev` runs
    batched over cotangents after an unbatched forward sweep)."""

    n: Any  # ticks taken
    slots: Any  # stored carries, packed; one scratch row at the end
    slot_index: Any  # tick held by each slot, -1 if free (`Segments`: the segment states)
    last: Any  # carry before the last tick (None when taping)
    decisions: Any  # step-size decision after each tick (None unless replaying)
    schedule: Any = eqx.field(static=True)


def _decision_tape(loop, init, bound):
    shape = jax.eval_shape(loop.decision, init)
    return jnp.zeros((bound + 1, *shape.shape), shape.dtype)


def _put(slots, i, carry, packing):
    """Store a state in the first columns of row i (a row may hold more beside it)."""
    floats, ints = packing.pack(carry)
    i, zero = jnp.asarray(i, jnp.int32), jnp.zeros((), jnp.int32)
    put = lambda s, r: lax.dynamic_update_slice(s, r[None].astype(s.dtype), (i, zero))
    return put(slots[0], floats), put(slots[1], ints)


def _get(slots, i, packing):
    f, n = packing.sizes()
    return packing.unpack((slots[0][i, :f], slots[1][i, :n]))


# --------------------------------------------------------------------------- reverse


def _read_row(buffer, row):
    return jtu.tree_map(lambda b: b[row], buffer)


def _clear_row(buffer, row):
    """A write's cotangent is taken once: earlier writes to the row were overwritten."""
    return jtu.tree_map(lambda b: b.at[row].set(0), buffer)


def _tick_vjp(loop, params, carry, scratch, ct_next, ct_buffers, diff):
    """Cotangents of (params, carry) for one tick, given those of its outputs.

    The tick is an emit or a step depending on `pending(carry)`; branching here, outside
    the VJP, means each branch linearises only its own work, and only an emit reads and
    clears output cotangents."""
    params_f, params_s = eqx.partition(params, diff)
    carry_f, carry_s = _split(carry)
    ct_next = _split(ct_next)[0]

    def emit_vjp(ct_buffers):
        emit = _emit_fn(loop, params_s, carry_s)
        return _emit_vjp(emit, params_f, carry_f, ct_next, ct_buffers)

    def step_vjp(ct_buffers):
        lin = linearise(loop, params, diff, carry)[1]
        ct_params, ct_carry = transposed(lin, params_f, carry_f)(ct_next)
        return ct_params, ct_carry, ct_buffers

    if loop.max_emits == 0:  # nothing is ever pending: no branch
        return step_vjp(ct_buffers)
    return lax.cond(loop.pending(carry), emit_vjp, step_vjp, ct_buffers)


def _batched_tick_vjp(loop, params, diff, carry, ct_next, ct_buffers, active):
    """`_tick_vjp` under `vmap`, where `active`: returns the parameters' cotangent (zero
    where not `active`), the carry's (unchanged where not `active`) and the output
    buffers' cotangents. A step's VJP runs only when some sample steps; a sample that
    emits reads and clears its rows, the others scratch rows."""
    params_f, params_s = eqx.partition(params, diff)
    carry_f, carry_s = _split(carry)
    ct_next = _split(ct_next)[0]
    pending = loop.pending(carry) if loop.max_emits else jnp.asarray(False)
    stepping, emitting = active & ~pending, active & pending

    def step_vjp():
        lin = linearise(loop, params, diff, carry)[1]
        dp, dc = transposed(lin, params_f, carry_f)(ct_next)
        return dc, _where(stepping, dp)

    zeros = jtu.tree_map(jnp.zeros_like, params_f)
    dc, dp = if_any(stepping, step_vjp, lambda: (ct_next, zeros))
    ct_carry = tree_where(stepping, dc, ct_next)
    if loop.max_emits == 0:
        return dp, ct_carry, ct_buffers
    emit = _emit_fn(loop, params_s, carry_s)
    reads_params = _reads_params(emit, params_f, carry_f)
    dp_e, dc_e, ct_buffers = _emit_vjp(
        emit, params_f, carry_f, ct_next, ct_buffers, emitting, wrt_params=reads_params
    )
    ct_carry = tree_where(emitting, dc_e, ct_carry)
    if reads_params:
        dp = _accumulate(emitting, dp, dp_e, params_f)
    return dp, ct_carry, ct_buffers


def _emit_vjp(emit, params_f, carry_f, ct_carry, ct_bufs, active=True, wrt_params=True):
    """Cotangents (of params, or None when not `wrt_params`; of the carry; of the output
    buffers) of one emit, given the carry's after it. Each write's cotangent is read from
    its buffer row, which is then cleared (earlier writes to it were overwritten); an
    inactive sample (see `lockstep_while`) reads and clears scratch rows only."""
    if wrt_params:
        _, pullback, rows = jax.vjp(emit, params_f, carry_f, has_aux=True)
    else:
        _, pull_carry, rows = jax.vjp(lambda cf: emit(params_f, cf), carry_f, has_aux=True)
        pullback = lambda ct: (None, *pull_carry(ct))
    rows = tuple(jnp.where(active, row, scratch_row(b)) for row, b in zip(rows, ct_bufs))
    ct_values = tuple(_read_row(ct_b, row) for row, ct_b in zip(rows, ct_bufs))
    ct_bufs = tuple(_clear_row(ct_b, row) for row, ct_b in zip(rows, ct_bufs))
    ct_params, ct_carry = pullback((ct_carry, ct_values))
    return ct_params, ct_carry, ct_bufs


def _add(a, b):
    return jtu.tree_map(lambda x, y: x + y, a, b)


def _where(active, tree):
    """`tree` where `active`, zeros elsewhere."""
    return jtu.tree_map(lambda x: jnp.where(active, x, jnp.zeros_like(x)), tree)


def _accumulate(active, total, term, params):
    """total + term where `active`, else total."""
    return _add(total, _where(active, term))


def _read_leaves(fn, *inputs) -> tuple[tuple[bool, ...], ...]:
    """For each input PyTree, whether `fn` reads each of its leaves. Conservative: a leaf
    passed into a nested call counts as read."""
    closed = jax.make_jaxpr(fn)(*inputs)
    used = {id(v) for eqn in closed.jaxpr.eqns for v in eqn.invars}
    used |= {id(v) for v in closed.jaxpr.outvars}
    out, start = [], 0
    for tree in inputs:
        count = len(jtu.tree_leaves(tree))
        out.append(tuple(id(v) in used for v in closed.jaxpr.invars[start : start + count]))
        start += count
    return tuple(out)


def _reads_params(emit, params_f, carry_f) -> bool:
    """Whether an emit reads any differentiated parameter: if not, its VJP takes no
    parameter cotangent."""
    return any(_read_leaves(emit, params_f, carry_f)[0])


def _reverse_tape(loop, params, diff, slots, span, start, ct_buffers, rows, batched):
    """Ticks `span` = (first, last) are on the tape `slots`, tick k at row k - first:
    reverse them tick by tick, no recomputation. `start` holds the cotangents (of the
    carry after `last`, of the parameters so far) to begin from; where last < first no
    tick runs and they come back unchanged. Returns those of (the carry before `first`,
    the parameters) and what is left of the output cotangents.

    `rows`: (layout, `TapeRows`) of the rows, which hold each step's residuals (taping;
    online slots, beside the state, when they never had to thin): a step's VJP is its
    stored pullback applied, with no evaluation of the step.

    Each iteration reverses the run of emits that follows a step (an inner loop touching
    only the output cotangents), then the step. Organised by steps rather than by emits
    so that under `vmap`, where the samples move in lockstep, the expensive tick (a
    step's VJP) runs once per step of the slowest sample, not once per tick of any kind."""
    params_f, params_s = eqx.partition(params, diff)
    lo, hi = span
    ct_final, ct_params = start
    layout, tape = rows
    carry_at = lambda k: tape.carry(slots, k - lo)
    if tape.combined:  # a state in every row: the tick's kind is read from it
        is_carry = lambda k: loop.pending(carry_at(k))
    else:
        is_carry = lambda k: tape.is_carry(slots, k - lo)

    def step_vjp(k, ct_carry):
        dp, dc = layout.vjp(tape.residuals(slots, k - lo), params)(ct_carry)
        return dc, dp

    def masked_step_vjp(k, ct_carry, mask):
        dc, dp = step_vjp(k, ct_carry)
        return dc, _where(mask, dp)

    example_f, example_s = _split(carry_at(lo))
    emit_reads_params = _reads_params(_emit_fn(loop, params_s, example_s), params_f, example_f)

    def emit_tick(small, large, active):
        k, ct_carry = small
        ct_params, ct_bufs = large
        carry_f, carry_s = _split(carry_at(k))
        emit = _emit_fn(loop, params_s, carry_s)
        dp, dc, ct_bufs = _emit_vjp(
            emit, params_f, carry_f, ct_carry, ct_bufs, active, wrt_params=emit_reads_params
        )
        if emit_reads_params:
            ct_params = _accumulate(active, ct_params, dp, params_f)
        return (k - 1, dc), (ct_params, ct_bufs)

    def is_emit(k):
        return (k >= lo) & is_carry(jnp.maximum(k, lo))

    def is_step(k):
        return (k >= lo) & ~is_carry(jnp.maximum(k, lo))

    def emits_then_step(small, large, active):
        """Batched: the run of emits after a step, then the step, whose VJP runs only
        when some sample steps."""
        (k, ct_carry), (ct_params, ct_bufs) = lockstep_while(
            lambda s, b: is_emit(s[0]),
            lambda s, b, a: emit_tick(s, b, a & active),
            small,
            large,
            True,
        )
        stepping = active & (k >= lo)
        dc, dp = if_any(
            stepping,
            lambda: masked_step_vjp(jnp.maximum(k, lo), ct_carry, stepping),
            lambda: (ct_carry, jtu.tree_map(jnp.zeros_like, params_f)),
        )
        ct_carry = tree_where(stepping, dc, ct_carry)
        return (k - 1, ct_carry), (_add(ct_params, dp), ct_bufs)

    # Carry leaves a step reads: only their cotangents change along a run of steps. The
    # others' (an interpolation row, which only an emit reads) enter the run's first
    # step and are zero after it; carrying them through the run would rewrite them with
    # zeros every step, which XLA does with a copy per leaf. (Batched, steps are not run
    # in such runs, and the step is not traced again to find these.)
    live = ()
    if not batched:
        live = _read_leaves(_step_fn(loop, params_s, example_s), params_f, example_f)[1]
    ct_live = lambda ct: tuple(c for c, r in zip(jtu.tree_leaves(ct), live) if r)

    def with_live(ct, values):
        leaves, treedef = jtu.tree_flatten(ct)
        values = iter(values)
        return jtu.tree_unflatten(treedef, [next(values) if r else c for c, r in zip(leaves, live)])

    def steps_then_emit(small, large, active):
        """Unbatched: the run of steps before an emit in a tight inner loop, then the
        emit."""
        ct_params, ct_bufs = large
        first, ct_carry = small

        def one_step(k, values, ct_params):
            zero_unless_first = lambda c: jnp.where(k == first, c, jnp.zeros_like(c))
            ct = with_live(jtu.tree_map(zero_unless_first, ct_carry), values)
            dc, dp = step_vjp(k, ct)
            return (k - 1, ct_live(dc)), _add(ct_params, dp)

        (k, values), ct_params = lockstep_while(
            lambda s, p: is_step(s[0]),
            lambda s, p, a: one_step(*s, p),
            (first, ct_live(ct_carry)),
            ct_params,
            False,
        )
        stepped = lambda c: jnp.where(k < first, jnp.zeros_like(c), c)
        small = (k, with_live(jtu.tree_map(stepped, ct_carry), values))
        return lax.cond(
            k >= lo,
            lambda: emit_tick(small, (ct_params, ct_bufs), jnp.asarray(True)),
            lambda: (small, (ct_params, ct_bufs)),
        )

    (_, ct_init), (ct_params, ct_buffers) = lockstep_while(
        lambda s, b: s[0] >= lo,
        lambda s, b, a: (emits_then_step if batched else steps_then_emit)(s, b, a),
        (hi, ct_final),
        (ct_params, ct_buffers),
        batched,
    )
    return (ct_init, ct_params), ct_buffers


def _step_fn(loop, params_s, carry_s):
    """One step as a function of the differentiated float inputs: (params, carry) ->
    float leaves of the new carry."""

    def step(pf, cf):
        new = loop.body(eqx.combine(pf, params_s), eqx.combine(cf, carry_s))
        return _split(new)[0]

    return step


def _emit_fn(loop, params_s, carry_s):
    """One emit likewise: -> ((float leaves of the new carry, written values), rows)."""

    def emit(pf, cf):
        new, writes = loop.emit(eqx.combine(pf, params_s), eqx.combine(cf, carry_s))
        return (_split(new)[0], tuple(w.value for w in writes)), tuple(w.row for w in writes)

    return emit


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


def _reverse_recompute(
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
    `_reverse_tape`."""
    ct_final, ct_params = start
    n, slots, slot_index, decisions = sweep.n, sweep.slots, sweep.slot_index, sweep.decisions
    scratch_slot = slot_index.shape[0]

    def tick(carry, index):
        carry, _ = loop.tick(params, carry, scratch)
        if decisions is not None:
            carry = loop.replay(carry, decisions[index + 1])
        return carry, index + 1

    def advance(target):
        """One tick towards `target`, first storing the state before it if it is the
        next checkpoint (an inactive sample stores to the scratch slot)."""

        def body(small, large, active):
            carry, index, nxt = small
            slots, slot_index = large
            store = (index == nxt) & active
            free_slot = jnp.argmax(slot_index < 0).astype(jnp.int32)
            slots = _put(slots, jnp.where(store, free_slot, scratch_slot), carry, packing)
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
            pulled = _batched_tick_vjp(loop, params, diff, carry, ct_carry, ct_bufs, active)
        else:
            pulled = _tick_vjp(loop, params, carry, scratch, ct_carry, ct_bufs, diff)
        dp, ct_carry, ct_bufs = pulled
        ct_params = _add(ct_params, dp)
        # Release the states at or after the tick just reversed, restore the latest one
        # before the next.
        slot_index = jnp.where(active & (slot_index >= target), -1, slot_index)
        target = jnp.where(active, target - 1, target)
        j = _nearest(slot_index, jnp.maximum(target, 0))
        carry = _get(slots, j, packing)
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


def _reverse_segments(
    loop, params, diff, sweep, start, ct_buffers, rows, schedule, packing, batched
):
    """Reverse by `Segments`: the forward sweep left the last segment of each sample on
    the tape and the state before every segment. Segments are taken last to first; each
    but the last is first run again from its state, taping its ticks (with the first
    sweep's step-size decisions replayed), then every segment is reversed by
    `_reverse_tape`. Under `vmap` a sample's segments are its own (samples end at
    different ticks); the loops run in lockstep. `start` and the result as for
    `_reverse_tape`."""
    length, (layout, taped_rows) = schedule.length, rows
    n, states, decisions = sweep.n, sweep.slot_index, sweep.decisions

    def retape(tape, first, end):
        """Ticks [first, end) again from the state before `first`, taped at rows from
        0 as the forward sweep taped them: an emit's carry, a step's residuals."""

        def tick(small, tape, active):
            k, carry = small
            emitting = loop.pending(carry)
            row = lambda on: jnp.where(on, k - first, length)
            tape = taped_rows.put_carry(tape, row(active & emitting), carry)

            def step():
                new, pullback = linearise(loop, params, diff, carry)
                return new, layout.taped(pullback)

            skip = lambda: (carry, taped_rows.zero_residuals())
            stepped, taped = if_any(active & ~emitting, step, skip)
            tape = taped_rows.put_residuals(tape, row(active & ~emitting), taped)
            emitted, _ = loop.emit(params, carry)  # its writes were made by the first sweep
            new = jtu.tree_map(lambda e, s: jnp.where(emitting, e, s), emitted, stepped)
            if decisions is not None:
                new = loop.replay(new, decisions[k + 1])
            return (k + 1, new), tape

        carry = _get(states, first // length, packing)
        small = (first, carry)
        return lockstep_while(lambda s, t: s[0] < end, tick, small, tape, batched)[1]

    def segment(small, large, active):
        first, ct_carry = small
        tape, ct_params, ct_bufs = large
        end = jnp.minimum(first + length, n)
        # The last segment is on the tape already; a finished sample runs nothing.
        tape = retape(tape, first, jnp.where(active & (end < n), end, first))
        span = (first, jnp.where(active, end - 1, first - 1))
        start = (ct_carry, ct_params)
        (ct_carry, ct_params), ct_bufs = _reverse_tape(
            loop, params, diff, tape, span, start, ct_bufs, rows, batched
        )
        return (first - length, ct_carry), (tape, ct_params, ct_bufs)

    ct_final, ct_params = start
    last_first = jnp.maximum(n - 1, 0) // length * length
    first = jnp.where(n > 0, last_first, -length)
    small, large = lockstep_while(
        lambda s, b: s[0] >= 0,
        segment,
        (first, ct_final),
        (sweep.slots, ct_params, ct_buffers),
        batched,
    )
    return (small[1], large[1]), large[2]


def _reverse_nested(loop, params, diff, sweep, start, schedule, packing, rows):
    """Reverse a loop of steps only (no emits) by `Nested` segments: the forward sweep
    kept the state before each outermost segment; each segment, last first, is run again
    keeping the states before its own segments, down to the innermost, which is run once
    linearising its steps onto a tape of `rows` (layout, `TapeRows`) and reversed by the
    taped pullbacks. Every loop bound is known when traced, so under `vmap` no loop is
    batched; ticks at or after the sample's own count (a solve that stopped early) do
    not reach the cotangents. `start` and the result as for `_reverse_tape`."""
    lengths = schedule.lengths
    layout, taped_rows = rows
    params_f = eqx.partition(params, diff)[0]
    n = sweep.n

    def bare(carry, count):
        return lax.fori_loop(0, count, lambda i, c: loop.body(params, c), carry)

    def leaf(first, count, carry, state):
        ct, ct_params, store = state
        tape = store[-1]

        def linearised(i, s):
            carry, tape = s
            new, pullback = linearise(loop, params, diff, carry)
            return new, taped_rows.put_residuals(tape, i, layout.taped(pullback))

        _, tape = lax.fori_loop(0, count, linearised, (carry, tape))

        def pull(i, s):
            ct, ct_params = s
            row = count - 1 - i
            residuals = taped_rows.residuals(tape, row)
            taken = first + row < n
            dp, dc = layout.vjp(residuals, params)(ct)
            ct_params = _accumulate(taken, ct_params, dp, params_f)
            ct = tree_where(taken, dc, ct)
            return ct, ct_params

        ct, ct_params = lax.fori_loop(0, count, pull, (ct, ct_params))
        return ct, ct_params, (*store[:-1], tape)

    def span(level, first, count, carry, state):
        """Reverse ticks [first, first + count) from the carry before `first` (at the
        outermost level the forward sweep's states serve instead)."""
        if level == len(lengths):
            return leaf(first, count, carry, state)
        length = lengths[level]
        segments = (count + length - 1) // length
        if level > 0:  # keep the state before each segment, advancing between them

            def keep(j, s):
                carry, states = s
                states = _put(states, j, carry, packing)
                return bare(carry, jnp.where(j < segments - 1, length, 0)), states

            ct, ct_params, store = state
            _, states = lax.fori_loop(0, segments, keep, (carry, store[level]))
            state = (ct, ct_params, (*store[:level], states, *store[level + 1 :]))

        def segment(i, state):
            j = segments - 1 - i
            begin = _get(state[2][level], j, packing)
            size = jnp.minimum(length, count - j * length)
            return span(level + 1, first + j * length, size, begin, state)

        return lax.fori_loop(0, segments, segment, state)

    ct_final, ct_params = start
    deeper = tuple(packing.empty(schedule.level_slots(i)) for i in range(1, len(lengths)))
    store = (sweep.slots, *deeper, taped_rows.empty(lengths[-1]))
    count = jnp.int32(schedule.num_ticks)
    ct_init, ct_params, _ = span(0, jnp.int32(0), count, None, (ct_final, ct_params, store))
    return ct_init, ct_params


# ------------------------------------------------------------------ the custom VJP


@eqx.filter_custom_vjp
def _differentiable_loop(params_and_init, buffers, *, loop, choose):
    params, init = params_and_init
    return run_plain(loop, params, init, buffers)


# The schedule is chosen here, not by the caller: sizing a tape by a step's residuals
# linearises the step (at trace time), which only a differentiated solve should do. Under
# `vmap` both sweeps move the samples in lockstep, and return one cotangent per sample,
# which `vmap`'s rule for custom VJPs sums where the composition asks for it.
@_differentiable_loop.def_fwd
def _fwd(perturbed, params_and_init, buffers, *, loop, choose):
    params, init = params_and_init
    diff = _diff(perturbed, params)
    schedule = choose(loop, init, params, diff, loop.batch_size)
    batched = loop.batch_size > 1
    final, buffers, sweep = _forward(loop, schedule, params, diff, init, buffers, batched)
    return (final, buffers), sweep


def _diff(perturbed, params):
    """Which parameter leaves are differentiated: a parameter that is not (save times, the
    controller's tolerances) would otherwise get a cotangent accumulated every step."""
    return jtu.tree_map(lambda p, x: bool(p) and is_float(x), perturbed[0], params)


@_differentiable_loop.def_bwd
def _bwd(sweep, grad_obj, perturbed, params_and_init, buffers, *, loop, choose):
    params, init = params_and_init
    diff = _diff(perturbed, params)
    batched = loop.batch_size > 1
    return _reverse(loop, sweep, grad_obj, params, diff, init, buffers, batched)


def _reverse(loop, sweep, grad_obj, params, diff, init, buffers, batched):
    """Cotangents of (the differentiated parameters, the initial carry)."""
    schedule = sweep.schedule
    ct_final, ct_buffers = grad_obj
    final_shape = jax.eval_shape(lambda: init)
    ct_final = _split(_materialise(ct_final, final_shape))[0]  # float leaves only
    ct_buffers = _materialise(ct_buffers, jax.eval_shape(lambda: buffers))
    scratch = scratch_writes(buffers)
    zero_params = jtu.tree_map(jnp.zeros_like, eqx.partition(params, diff)[0])
    start = (ct_final, zero_params)
    fixed = (loop, params, diff, sweep)
    taped = (loop, params, diff, sweep.slots)  # `_reverse_tape`'s first arguments
    rest = (scratch, Packing.of(init), batched)
    if isinstance(schedule, Tape):
        rows = tape_rows(loop, params, diff, init)
        span = (jnp.int32(0), sweep.n - 1)
        (ct_init, ct_params), _ = _reverse_tape(*taped, span, start, ct_buffers, rows, batched)
    elif isinstance(schedule, Segments):
        rows = tape_rows(loop, params, diff, init)
        segments = (rows, schedule, rest[1], batched)
        (ct_init, ct_params), _ = _reverse_segments(*fixed, start, ct_buffers, *segments)
    elif isinstance(schedule, Online):
        # Until its slots fill up, online checkpointing has stored every state in order
        # (slot k holds tick k): then the sweep is a tape, reversed without recomputation.
        # The two sweeps run one after the other, one of them for zero ticks, rather than
        # in the branches of a `cond`: a branch that writes to the slots would copy them.
        as_tape = eqxi.unvmap_all(sweep.n <= schedule.slots)
        rows = tape_rows(loop, params, diff, init, combined=True)
        span = (jnp.int32(0), jnp.where(as_tape, sweep.n - 1, -1))
        start, ct_buffers = _reverse_tape(*taped, span, start, ct_buffers, rows, batched)
        (ct_init, ct_params), _ = _reverse_recompute(*fixed, start, ct_buffers, *rest, ~as_tape)
    elif isinstance(schedule, Nested):
        rows = tape_rows(loop, params, diff, init)
        ct_init, ct_params = _reverse_nested(*fixed, start, schedule, rest[1], rows)
    else:
        (ct_init, ct_params), _ = _reverse_recompute(*fixed, start, ct_buffers, *rest)
    return ct_params, ct_init


def _materialise(ct, shapes):
    """Replace symbolic-zero (None) cotangents by zeros; non-float leaves stay None."""

    def one(c, s):
        if s is None or not jnp.issubdtype(s.dtype, jnp.inexact):
            return None
        return jnp.zeros(s.shape, s.dtype) if c is None else c

    return jtu.tree_map(one, ct, shapes, is_leaf=lambda x: x is None)


def checkpointed_loop(loop: Loop, choose: Any, params: Any, init: Any, buffers: tuple):
    """Run `loop` so that reverse mode differentiates it by the schedule that
    `choose(loop, init, params, diff, batch_size)` returns (called only when it is
    differentiated; `diff` says which parameter leaves are, `batch_size` how many samples
    a `vmap` runs together)."""
    return _differentiable_loop((params, init), buffers, loop=loop, choose=choose)
