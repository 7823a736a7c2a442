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
import jax.numpy as jnp


class Online(eqx.Module):
    """Keep at most `slots` (>= 2) states of a loop of unknown length."""

    slots: int = eqx.field(static=True)

    def __check_init__(self):
        if self.slots < 2:
            raise ValueError(f"Online(slots={self.slots}): online checkpointing needs >= 2.")

    def init(self):
        return jnp.ones((), jnp.int32)  # the stride

    def in_order(self, stride):
        """Whether the slots still hold every tick so far, slot k holding tick k (no
        thinning yet): the reverse sweep can then run as a tape."""
        return stride == 1

    def store(self, k, stride, slot_index):
        """Whether to store the state before tick k, its slot, the new slot table and
        the new stride. `slot_index[i]` is the tick whose state slot i holds, -1 if free."""
        due = k % stride == 0
        thin = due & jnp.all(slot_index >= 0)
        stride = jnp.where(thin, 2 * stride, stride)
        released = thin & (slot_index % stride != 0)
        slot_index = jnp.where(released, -1, slot_index)
        due = k % stride == 0
        slot = jnp.argmax(slot_index < 0).astype(jnp.int32)
        return due, slot, slot_index, stride
