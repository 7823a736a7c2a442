"""The pieces a schedule's forward ticks are made of: a bare step, a step that tapes its
residuals, an emit, storing a state in a slot.

Each is given its sample's `active` (see `_ticks`): where it is False the tick leaves the
carry as it was and writes only scratch rows. A store is a plain row write every tick (a
state that is not kept goes to the scratch row) rather than a branch: under `vmap` a
`cond` carrying the slots would become a select that copies every slot of every sample.
"""

import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, ArrayLike, Bool, Int, PyTree

from ._lockstep import if_any
from ._loop import Write
from ._packing import Packing, Rows
from ._residuals import Layout, TapeRows, linearise
from ._slot_table import SlotTable
from ._sweep import Run, Tick, put_state


def bare_step(run: Run, at: Tick, active: Bool[Array, ""]) -> Tick:
    """One step that keeps nothing; batched, it runs only when some sample steps."""
    step = lambda: run.loop.body(run.params, at.carry)
    new = run.loop.if_stepping(active, step, lambda: at.carry) if run.batched else step()
    return at.after(new, active)


def emit_tick(run: Run, at: Tick, active: Bool[Array, ""]) -> tuple[Tick, tuple[Write, ...]]:
    """One emit, and its writes (the forward sweep stores them, to scratch rows where not
    `active`)."""
    new, writes = run.loop.emit(run.params, at.carry)
    return at.after(new, active), writes


def taped_step(
    run: Run,
    rows: tuple[Layout, TapeRows],
    at: Tick,
    tape: Rows,
    row: Int[ArrayLike, ""],
    active: Bool[Array, ""],
    keep: Bool[ArrayLike, ""] = True,
) -> tuple[Tick, Rows]:
    """One step, storing its residuals at `row` of `tape`; a bare step where not `keep`
    (residuals that would no longer serve)."""
    layout, taped_rows = rows
    loop, params, carry = run.loop, run.params, at.carry

    def linearised() -> tuple[PyTree, tuple[Array, ...]]:
        new, linearisation = linearise(loop, params, run.diff, carry)
        return new, layout.taped(linearisation)

    plain = lambda: (loop.body(params, carry), taped_rows.zero_residuals())
    if run.batched:
        skip = lambda: (carry, taped_rows.zero_residuals())
        if keep is True:  # no plain step to compile
            new, taped = loop.if_stepping(active, linearised, skip)
        else:
            other = lambda: if_any(active, plain, skip)
            new, taped = if_any(active & keep, linearised, other)
    else:
        new, taped = linearised() if keep is True else lax.cond(keep, linearised, plain)
    return at.after(new, active), taped_rows.put_residuals(tape, row, taped)


def store_state(
    slots: Rows,
    table: SlotTable,
    at: Tick,
    slot: Int[Array, ""],
    store: Bool[Array, ""],
    packing: Packing,
    batched: bool = False,
) -> tuple[Rows, SlotTable, Int[Array, ""]]:
    """Store the carry before tick `at.k` in `slot` where `store`, else in the scratch
    row (the last), and mark it in the slot table. Returns the slots, the table and the
    row written."""
    row = jnp.where(store, slot, table.count)
    slots = put_state(slots, row, at.carry, packing, batched)
    return slots, table.holding(slot, at.k, store), row


def skip_ahead(run: Run, at: Tick, stop: Int[Array, ""]) -> Tick:
    """Bare steps up to tick `stop` (or the loop's end), where a schedule knows ahead that
    none of them keeps anything: an inner loop that carries only the carry."""
    loop, params = run.loop, run.params
    k, carry = lax.while_loop(
        lambda s: (s[0] < stop) & loop.cond(params, s[1]),
        lambda s: (s[0] + 1, loop.body(params, s[1])),
        (at.k, at.carry),
    )
    return Tick(k, carry)
