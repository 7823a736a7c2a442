"""Online checkpointing for loops whose length is unknown until they finish (adaptive
steps), in a fixed number of slots.

States are kept at multiples of a stride; when every slot is full the stride doubles and
the states at odd multiples of the old stride are released (the thinning of dynamic
checkpointing schemes, cf. Q. Wang, P. Moin and G. Iaccarino, "Minimal repetition dynamic
checkpointing algorithm for unsteady adjoint calculation", SIAM J. Sci. Comput. 31 (2009)
2549-2567, and P. Stumm and A. Walther, SIAM J. Sci. Comput. 32 (2010) 836-854). After n
ticks at most `slots` states remain, spaced n/slots to 2n/slots apart; the reverse sweep
reverses each gap with the slots then free, by the binomial rule of `revolve`. Memory is
fixed; recomputation grows like the binomial schedule's for the gap length.
"""

import equinox as eqx
import equinox.internal as eqxi
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Int

from .._arguments import check_count
from .._keeping import taped_step
from .._lockstep import at_most_once
from .._loop import Write
from .._residuals import tape_rows
from .._reverse_recompute import reverse_recompute
from .._reverse_tape import reverse_tape
from .._slot_table import SlotTable
from .._sweep import Backward, Cotangents, Kept, Run, Tick
from ._base import AbstractSchedule, Sizing
from ._slots import emit_keeping, empty_slots, keep_before, record_after

# (stride, free slots)
_State = tuple[Int[Array, ""], Int[Array, ""]]


class Online(AbstractSchedule):
    """Keep at most `slots` (>= 2) states of a loop of unknown length, each with the
    residuals of the step from it, thinned as the loop runs. `checkpoints`: states of the
    step loop, a slot per emit added (None: as the adjoint says, else as many as its
    budget holds)."""

    slots: int | None = eqx.field(static=True, default=None)
    checkpoints: int | None = eqx.field(static=True, default=None)

    def __check_init__(self) -> None:
        if self.slots is not None and self.slots < 2:
            raise ValueError(f"Online(slots={self.slots}): online checkpointing needs >= 2.")
        check_count("Online", "checkpoints", self.checkpoints, 1, "states")

    def sized(self, sizing: Sizing) -> "Online":
        slots = self.slots or sizing.slots(self.checkpoints)
        return Online(min(slots, sizing.bound))

    def init(self) -> _State:
        # (stride, free slots): a count, so that a tick needs no reduction over the table.
        return jnp.ones((), jnp.int32), jnp.asarray(self.slots, jnp.int32)

    def in_order(self, state: _State) -> Bool[Array, ""]:
        """Whether no slot was thinned yet: the slots then hold every tick so far that
        was stored, in order (for `Online`, every tick: slot k holds tick k, and the
        reverse sweep can run as a tape)."""
        return state[0] == 1

    def store(
        self,
        k: Int[Array, ""],
        state: _State,
        table: SlotTable,
        active: Bool[ArrayLike, ""] = True,
    ) -> tuple[Bool[Array, ""], Int[Array, ""], SlotTable, _State]:
        """Whether to store the state before tick k, its slot, the slot table after any
        thinning (the caller marks k in the slot) and the new state. Only an `active`
        sample (see `lockstep_while`) stores or thins.

        Per tick this is scalar work: the table is rewritten only when some sample thins
        (`at_most_once`, whose predicate is reduced over a batch), and the free slot is
        the one above the stack's top (`SlotTable`), never searched for."""
        stride, free = state
        thin = jnp.asarray(active) & (k % stride == 0) & (free == 0)

        def thinned(
            kept: tuple[Int[Array, ""], Int[Array, ""], SlotTable],
        ) -> tuple[Int[Array, ""], Int[Array, ""], SlotTable]:
            stride, free, table = kept
            new_stride = jnp.where(thin, 2 * stride, stride)
            released = thin & (table.ticks >= 0) & (table.ticks % new_stride != 0)
            count = jnp.sum(released).astype(jnp.int32)
            return new_stride, free + count, table.released(released)

        stride, free, table = at_most_once(eqxi.unvmap_any(thin), thinned, (stride, free, table))
        due = jnp.asarray(active) & (k % stride == 0)
        assert self.slots is not None  # sized
        slot = table.free_slot(self.slots - free)
        return due, slot, table, (stride, free - due.astype(jnp.int32))

    def empty(self, run: Run) -> Kept:
        assert self.slots is not None  # sized
        rows = tape_rows(run.loop, run.params, run.diff, run.init, combined=True)[1]
        return empty_slots(run, rows.empty(self.slots + 1), self.init())

    def step(self, run: Run, at: Tick, kept: Kept, active: Bool[Array, ""]) -> tuple[Tick, Kept]:
        """Store the state (per `store`), then step, beside it the step's residuals while
        they serve: while the slots hold every tick in order."""
        kept, row = keep_before(self.store, run, at, kept, active)
        (state, last), (slots, table, decisions) = kept
        rows = tape_rows(run.loop, run.params, run.diff, run.init, combined=True)
        after, slots = taped_step(run, rows, at, slots, row, active, self.in_order(state))
        kept = (state, last), (slots, table, decisions)
        return after, record_after(run, kept, at, after, active)

    def emit(
        self, run: Run, at: Tick, kept: Kept, active: Bool[Array, ""]
    ) -> tuple[Tick, tuple[Write, ...], Kept]:
        return emit_keeping(self.store, run, at, kept, active)

    def reverse(self, back: Backward) -> Cotangents:
        # Until its slots fill up, online checkpointing has stored every state in order
        # (slot k holds tick k): then the sweep is a tape, reversed without recomputation.
        # The two sweeps run one after the other, one of them for zero ticks, rather than
        # in the branches of a `cond`: a branch that writes to the slots would copy them.
        run, n = back.run, back.sweep.n
        assert self.slots is not None  # sized
        as_tape = eqxi.unvmap_all(n <= self.slots)
        rows = tape_rows(run.loop, run.params, run.diff, run.init, combined=True)
        span = (jnp.int32(0), jnp.where(as_tape, n - 1, -1))
        slots = back.sweep.kept[1][0]
        start, ct_buffers = reverse_tape(run, slots, rows, span, back.start, back.ct_buffers)
        back = Backward(run, back.sweep, start, ct_buffers, back.scratch)
        return reverse_recompute(back, ~as_tape)[0]
