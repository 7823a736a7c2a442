"""What steers a loop, marked inside its body so that a rematerialising adjoint keeps it.

`DirectAdjoint` recomputes blocks of ticks in its reverse sweep (`jax.checkpoint`). The
recomputation is compiled apart from the first run and rounds differently, and a step's
acceptance compares an error estimate (a difference of nearly equal numbers) with 1: in
float32 at a tolerance near the resolution, the recomputed step is now and then rejected
where the first run accepted it (or the reverse), and the reverse sweep then differentiates
a different solution. A value the body passes through `decided` is saved by the first run
and reused by the recomputation, whatever it would have computed.
"""

from jax.ad_checkpoint import checkpoint_name
from jaxtyping import Array

# The name under which `jax.checkpoint` saves a decision (see `_direct.py`).
DECISION = "odesolve_step_decision"


def decided(x: Array) -> Array:
    """`x` (a step's acceptance, a step size), marked as a decision: the identity, but a
    rematerialised recomputation reuses the value the first run computed."""
    return checkpoint_name(x, DECISION)
