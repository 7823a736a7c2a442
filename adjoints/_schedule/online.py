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

from typing import ClassVar

import equinox as eqx
import equinox.internal as eqxi
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, ArrayLike, Bool, Int, PyTree

from .._loop import Buffers, Loop, Write
from .._packing import Packing
from .._residuals import tape_rows
from .._reverse_recompute import reverse_recompute
from .._reverse_tape import reverse_tape
from .._sweep import Cotangents, SlotIndex, Sweep
from ._base import AbstractSchedule, Stored

# (stride, free slots)
_State = tuple[Int[Array, ""], Int[Array, ""]]


class Online(AbstractSchedule):
    """Keep at most `slots` (>= 2) states of a loop of unknown length, each with the
    residuals of the step from it."""

    slots: int = eqx.field(static=True)
    keeps_residuals: ClassVar[bool] = True

    def __check_init__(self) -> None:
        if self.slots < 2:
            raise ValueError(f"Online(slots={self.slots}): online checkpointing needs >= 2.")

    def init(self) -> _State:
        # (stride, free slots): a count, so that a tick needs no reduction over the table.
        return jnp.ones((), jnp.int32), jnp.asarray(self.slots, jnp.int32)

    def in_order(self, state: _State) -> Bool[Array, ""]:
        """Whether the slots still hold every tick so far, slot k holding tick k (no
        thinning yet): the reverse sweep can then run as a tape."""
        return state[0] == 1

    def store(
        self,
        k: Int[Array, ""],
        state: _State,
        slot_index: SlotIndex | None,
        active: Bool[ArrayLike, ""] = True,
    ) -> Stored:
        """Whether to store the state before tick k, its slot, the slot table after any
        thinning (the caller writes k into the slot) and the new state. `slot_index[i]`
        is the tick whose state slot i holds, -1 if free. Only an `active` sample (see
        `lockstep_while`) stores or thins.

        Per tick this is scalar work: the table is rewritten only when some sample thins
        (a `cond` on any, which under `vmap` stays a branch), and searched for a free slot
        only once some sample has thinned (before that, slot k is the free one)."""
        assert slot_index is not None  # the forward sweep keeps a table for online slots
        table = slot_index
        stride, free = state
        thin = active & (k % stride == 0) & (free == 0)

        def thinned() -> tuple[Int[Array, ""], Int[Array, ""], SlotIndex]:
            new_stride = jnp.where(thin, 2 * stride, stride)
            released = thin & (table >= 0) & (table % new_stride != 0)
            count = jnp.sum(released).astype(jnp.int32)
            return new_stride, free + count, jnp.where(released, -1, table)

        unchanged = lambda: (stride, free, table)
        stride, free, table = lax.cond(eqxi.unvmap_any(thin), thinned, unchanged)
        due = active & (k % stride == 0)
        first_free = lambda: jnp.argmax(table < 0).astype(jnp.int32)
        in_order = lambda: jnp.asarray(k, jnp.int32)
        slot = lax.cond(eqxi.unvmap_any(stride > 1), first_free, in_order)
        return due, slot, table, (stride, free - due.astype(jnp.int32))

    def reverse(
        self,
        loop: Loop,
        params: PyTree,
        diff: PyTree[bool],
        init: PyTree,
        sweep: Sweep,
        scratch: tuple[Write, ...],
        start: Cotangents,
        ct_buffers: Buffers,
        batched: bool,
    ) -> Cotangents:
        # Until its slots fill up, online checkpointing has stored every state in order
        # (slot k holds tick k): then the sweep is a tape, reversed without recomputation.
        # The two sweeps run one after the other, one of them for zero ticks, rather than
        # in the branches of a `cond`: a branch that writes to the slots would copy them.
        as_tape = eqxi.unvmap_all(sweep.n <= self.slots)
        rows = tape_rows(loop, params, diff, init, combined=True)
        span = (jnp.int32(0), jnp.where(as_tape, sweep.n - 1, -1))
        taped = (loop, params, diff, sweep.slots)
        start, ct_buffers = reverse_tape(*taped, span, start, ct_buffers, rows, batched)
        rest = (scratch, Packing.of(init), batched, ~as_tape)
        return reverse_recompute(loop, params, diff, sweep, start, ct_buffers, *rest)[0]
