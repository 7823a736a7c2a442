"""What the schedules that reverse by recomputation keep (`Online`, `States`, `Revolve`):
states in a fixed number of slots, with a table of the tick each holds, the carry before
the last tick (the reverse sweep starts from it; `States` keeps none, see `empty_slots`),
and the step-size decisions to replay.

`States` and `Revolve` keep states before steps only, packed without what a step never
reads (`Run.step_packing`): for an ODE, the last step's interpolant, which is most of a
carry (Tsit5: 8 of 10 state vectors), so a budget holds several times more states. The
state before an emit is recomputed from the one before the step that precedes it.

Kept: ((the schedule's own state, the carry before the last tick), (slots, table,
decisions)); see `AbstractSchedule`.
"""

from collections.abc import Callable

from jaxtyping import Array, ArrayLike, Bool, Int, PyTree

from .._decisions import record
from .._keeping import emit_tick, store_state
from .._lockstep import tree_where
from .._loop import Write
from .._packing import Packing, Rows
from .._slot_table import SlotTable
from .._sweep import Kept, Run, Tick, decision_record

# A schedule's rule: (tick, its state, slot table, active) -> (whether to store the state
# before the tick, its slot, the table after any thinning, the schedule's new state).
Rule = Callable[
    [Int[Array, ""], PyTree, SlotTable, Bool[ArrayLike, ""]],
    tuple[Bool[Array, ""], Int[Array, ""], SlotTable, PyTree],
]


def empty_slots(run: Run, slots: Rows, state: PyTree, keeps_last: bool = True) -> Kept:
    """Nothing kept yet: `slots` (one row per slot and a scratch row), a free table, the
    schedule's first `state`. Where not `keeps_last`, the carry before the last tick is
    not kept (None): the reverse sweep recomputes it from the states stored before it.
    Keeping it holds the carry before each tick beside the one after, and XLA then
    copies every carried array on every step (the last step's interpolant too)."""
    table = SlotTable.empty(slots[0].shape[0] - 1)
    return (state, run.init if keeps_last else None), (slots, table, decision_record(run))


def keep_before(
    rule: Rule,
    run: Run,
    at: Tick,
    kept: Kept,
    active: Bool[Array, ""],
    packing: Packing | None = None,
) -> tuple[Kept, Int[Array, ""]]:
    """Store the carry before tick `at.k` where `rule` says so (and `active`), packed by
    `packing` (None: the whole carry); also returns the row written (the scratch row if
    none)."""
    (state, _), (slots, table, decisions) = kept
    # A rule leaves an inactive sample's table as it is.
    store, slot, table, new_state = rule(at.k, state, table, active)
    packing = run.packing if packing is None else packing
    slots, table, row = store_state(slots, table, at, slot, store & active, packing, run.batched)
    state = tree_where(active, new_state, state)
    return ((state, _noted_last(at, kept[0][1], active)), (slots, table, decisions)), row


def _noted_last(at: Tick, last: PyTree | None, active: Bool[Array, ""]) -> PyTree | None:
    """The carry before the last tick, noted as tick `at.k` is taken (where kept)."""
    return None if last is None else tree_where(active, at.carry, last)


def record_after(run: Run, kept: Kept, before: Tick, after: Tick, active: Bool[Array, ""]) -> Kept:
    """Record the step-size decision of the tick from `before` to `after`."""
    small, (slots, table, decisions) = kept
    decisions = record(run.loop, decisions, before.k, before.carry, after.carry, active)
    return small, (slots, table, decisions)


def emit_passing(
    run: Run, at: Tick, kept: Kept, active: Bool[Array, ""]
) -> tuple[Tick, tuple[Write, ...], Kept]:
    """One emit of a schedule that keeps states before steps only: nothing stored, the
    carry before it noted as the last, the decision after it recorded."""
    (state, last), rest = kept
    kept = (state, _noted_last(at, last, active)), rest
    after, writes = emit_tick(run, at, active)
    return after, writes, record_after(run, kept, at, after, active)


def emit_keeping(
    rule: Rule, run: Run, at: Tick, kept: Kept, active: Bool[Array, ""]
) -> tuple[Tick, tuple[Write, ...], Kept]:
    """One emit of a slot schedule: store the carry before it where `rule` says so, emit,
    record the decision after it."""
    kept, _ = keep_before(rule, run, at, kept, active)
    after, writes = emit_tick(run, at, active)
    return after, writes, record_after(run, kept, at, after, active)
