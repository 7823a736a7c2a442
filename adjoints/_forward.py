"""The forward sweep of a checkpointed loop: run the ticks, storing what the schedule
says (a state before a tick, a step's residuals) for the reverse sweep.

The output buffers are never stored: they are written, not carried. Under `vmap` the
samples move in lockstep (see `_lockstep`): a sample that has finished, or does not store
at this tick, writes to scratch rows.
"""

from typing import TYPE_CHECKING, cast

import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, ArrayLike, Bool, Int, PyTree, Shaped

from ._lockstep import if_any, lockstep_while, tree_where
from ._loop import Buffers, Loop, apply_writes
from ._packing import Packing, Rows
from ._residuals import Layout, TapeRows, linearise, tape_rows
from ._sweep import SlotIndex, SlotTable, Sweep, decision_tape, put_state, record_decision

if TYPE_CHECKING:  # the schedules import modules that import this one
    from ._schedule import AbstractSchedule

Scalar = Int[Array, ""]
Decisions = Shaped[Array, " rows *decision"] | None
# (tick, carry, carry before the last tick, schedule state): selected per sample.
_Small = tuple[Scalar, PyTree, PyTree, PyTree]
# (slots, slot table, decisions): written only through scratch rows; with the buffers.
_Stored = tuple[Rows, SlotTable, Decisions]
_Large = tuple[Rows, SlotTable, Decisions, Buffers]


def forward_sweep(
    loop: Loop,
    schedule: "AbstractSchedule",
    params: PyTree,
    diff: PyTree[bool],
    init: PyTree,
    buffers: Buffers,
    batched: bool,
) -> tuple[PyTree, Buffers, Sweep]:
    """Run the loop, storing carries per `schedule`. Returns the final carry, the buffers
    and a `Sweep`. Its `last` is the carry before the last tick: revolve's first
    "youturn" starts from it, so the last stretch of the sweep is not recomputed.

    Taping (`Tape`) stores each step's residuals instead of the carry before it (see
    `_residuals`), and the carry before each emit. `Segments` tapes likewise into rows
    reused segment after segment, and keeps the state before each segment.

    Two levels, as in `run_plain`: steps run in an inner loop that never touches the
    output buffers; the outer loop emits."""
    packing = Packing.of(init)
    segmented, taping = schedule.segmented, schedule.tapes
    # Online slots also keep the residuals of the step from each stored state.
    linearising = taping or schedule.keeps_residuals
    layout: Layout | None = None
    rows: TapeRows | None = None
    if linearising:
        layout, rows = tape_rows(loop, params, diff, init, combined=not taping)
    # One extra row: a state that is not kept is written there, so that storing is a
    # plain row write every tick rather than a branch carrying all the slots.
    tape_length = schedule.length if segmented else schedule.slots
    slots = (rows or packing).empty(tape_length + 1)
    slot_index: SlotTable = jnp.full((schedule.slots,), -1, jnp.int32)
    if segmented:  # in the table's place: the state before each segment
        slot_index = packing.empty(schedule.slots + 1)
    replaying = loop.decision is not None and schedule.recomputes
    decisions = decision_tape(loop, init) if replaying else None

    def decide(
        decisions: Decisions, k: Scalar, carry: PyTree, active: Bool[ArrayLike, ""]
    ) -> Decisions:
        """Record the decision of the carry after tick k (row k + 1; inactive: row 0,
        which is never replayed)."""
        if decisions is None:  # not replaying
            return decisions
        return record_decision(loop, decisions, k, carry, active)

    def tape_row(k: Scalar, active: Bool[ArrayLike, ""]) -> Scalar:
        """Tick k's tape row (the scratch row where not `active`)."""
        return jnp.where(active, k % tape_length if segmented else k, tape_length)

    def keep_segment_start(
        states: SlotTable, k: Scalar, carry: PyTree, sched: PyTree, active: Bool[ArrayLike, ""]
    ) -> tuple[SlotTable, PyTree]:
        """`Segments`: store the carry before tick k if k starts a kept segment, the
        kept states moved first where the stride doubles. Returns the states and the
        schedule's new state."""
        if not segmented:
            return states, sched
        kept, slot, _, new_sched = schedule.store(k, sched, None, active)
        states = cast(Rows, states)  # segmented: the state before each kept segment
        if schedule.starts is not None:  # thinned as the loop runs
            states = schedule.thin(states, sched, new_sched)
        row = jnp.where(kept & active, slot, schedule.slots)
        return put_state(states, row, carry, packing), tree_where(active, new_sched, sched)

    def record(
        k: Scalar,
        carry: PyTree,
        slots: Rows,
        slot_index: SlotTable,
        sched: PyTree,
        active: Bool[ArrayLike, ""] = True,
    ) -> tuple[Rows, SlotTable, PyTree, Scalar]:
        """Store the carry before tick k if the schedule says so (and `active`). Branch
        free: a state not kept goes to the scratch row. (A `cond` here would, under
        `vmap`, become a select that copies every slot of every sample.) Also returns
        the row written (the scratch row if none)."""
        if taping:  # every state, at its tick's row
            assert rows is not None  # taping
            row = tape_row(k, active)
            slot_index, sched = keep_segment_start(slot_index, k, carry, sched, active)
            return rows.put_carry(slots, row, carry), slot_index, sched, row
        # A schedule leaves an inactive sample's table as it is.
        table = cast(SlotIndex, slot_index)  # not segmented: a slot table
        store, slot, new_table, new_sched = schedule.store(k, sched, table, active)
        assert new_table is not None
        store = store & active
        row = jnp.where(store, slot, schedule.slots)
        slots = put_state(slots, row, carry, packing)
        # One entry of the table written, not the whole table selected.
        new_table = new_table.at[slot].set(jnp.where(store, k, new_table[slot]))
        sched = tree_where(active, new_sched, sched)
        return slots, new_table, sched, row

    # The loops carry (small, large): the slots, decision tape and output buffers are
    # large and only written through scratch rows when inactive (see `lockstep_while`).
    # Each tick keeps its sample's carry where it is inactive (`tree_where`).
    def linearised_step(
        carry: PyTree,
        slots: Rows,
        row: Scalar,
        active: Bool[Array, ""],
        keep: Bool[ArrayLike, ""] = True,
    ) -> tuple[PyTree, Rows]:
        """One step, storing its residuals at `row`; a plain step where not `keep`."""
        assert layout is not None and rows is not None  # linearising

        def step() -> tuple[PyTree, tuple[Array, ...]]:
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

    def step_tick(small: _Small, large: _Stored, active: Bool[Array, ""]) -> tuple[_Small, _Stored]:
        k, carry, prev, sched = small
        slots, slot_index, decisions = large
        if taping:
            slot_index, sched = keep_segment_start(slot_index, k, carry, sched, active)
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

    def emit_tick(
        small: _Small, large: _Large, active: Bool[Array, ""], in_lockstep: bool = False
    ) -> tuple[_Small, _Large]:
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

    def stepping(small: _Small) -> Bool[Array, ""]:
        carry = small[1]
        return loop.cond(params, carry) & ~loop.pending(carry)

    def bare_steps(small: _Small, decisions: Decisions) -> tuple[_Small, Decisions]:
        """Steps that store nothing: those before the next stored state and before the
        last tick (whose state before it is `last`), both known ahead."""
        k, carry, prev, sched = small
        stop = jnp.minimum(schedule.next_store(k, sched), schedule.num_ticks - 1)

        def step(state: tuple[Scalar, PyTree, Decisions]) -> tuple[Scalar, PyTree, Decisions]:
            k, carry, decisions = state
            new = loop.body(params, carry)
            return k + 1, new, decide(decisions, k, new, True)

        k, carry, decisions = lax.while_loop(
            lambda s: (s[0] < stop) & loop.cond(params, s[1]),
            lambda s: step(s),
            (k, carry, decisions),
        )
        return (k, carry, prev, sched), decisions

    def stored_step(
        small: _Small, large: _Stored, active: Bool[Array, ""]
    ) -> tuple[_Small, _Stored]:
        """Where the stored ticks are known ahead (`Revolve`, `Nested`): bare steps up to
        the next tick that stores, then that tick."""
        slots, slot_index, decisions = large
        small, decisions = bare_steps(small, decisions)
        return step_tick(small, (slots, slot_index, decisions), active & stepping(small))

    def steps_then_emit(
        small: _Small, large: _Large, active: Bool[Array, ""]
    ) -> tuple[_Small, _Large]:
        """Unbatched: a run of steps in an inner loop that carries no output buffers,
        then one emit (unless the loop is over: then nothing is kept or counted)."""
        stored, bufs = large[:3], large[3]
        tick = stored_step if schedule.skips_ahead else step_tick
        small, stored = lockstep_while(
            lambda s, b: stepping(s),
            lambda s, b, a: tick(s, b, a & active),
            small,
            stored,
            False,
        )
        due = loop.pending(small[1]) & active
        return emit_tick(small, (*stored, bufs), due)

    def emits_then_step(
        small: _Small, large: _Large, active: Bool[Array, ""]
    ) -> tuple[_Small, _Large]:
        """Batched: the emits due, then one step. Samples emit at different ticks, so
        this order runs a step (the costly tick) once per step of the slowest sample,
        where the unbatched order would run one at every tick some sample steps."""
        small, large = lockstep_while(
            lambda s, b: loop.pending(s[1]),
            # A sample inactive in the outer loop has nothing pending: `a` implies `active`.
            lambda s, b, a: emit_tick(s, b, a & active, in_lockstep=True),
            small,
            large,
            True,
        )
        small, stored = step_tick(small, large[:3], stepping(small) & active)
        return small, (*stored, large[3])

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
    return final, buffers, Sweep(k, slots, slot_index, prev, decisions, schedule)
