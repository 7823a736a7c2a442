"""Taping: keep the state before every tick, so the reverse sweep recomputes nothing but
the vector-Jacobian product of each tick (one forward evaluation inside it). Memory grows
linearly with the loop's bound; the default adjoint uses this when it fits its budget."""

import equinox as eqx
import jax.numpy as jnp


class Tape(eqx.Module):
    """Store every state: `slots` is the loop's bound on ticks."""

    slots: int = eqx.field(static=True)

    def init(self):
        return jnp.zeros((), jnp.int32)

    def store(self, k, unused, slot_index, active=True):
        return jnp.asarray(True), k.astype(jnp.int32), slot_index, unused
