"""`VeryChord` as an optimistix root finder of its own, `optx.root_find(fn,
VeryChord(rtol, atol), y0)`, as Diffrax's is: chord iterations y <- y - J(y0)^-1 f(y)
with the Jacobian factorised once at the start, stopped by the rate of convergence.

With the contraction rate r = |d_k| / |d_{k-1}| of successive increments (scaled by
atol + rtol |y|), the distance left to the root is about |d_k| r / (1 - r) (Hairer and
Wanner, Solving ODEs II, IV.8): below `kappa` the iteration has converged; a rate above
2 means it diverges. `options=dict(init_state=state)` reuses a state's factorisation,
as for the stages of one implicit step.

optimistix is imported where its result codes are needed: only code that calls
`optx.root_find` reaches here, and it has optimistix.
"""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
from jax.flatten_util import ravel_pytree
from jaxtyping import Array, Bool, Float, Int

from .._flat import PyTree
from ._chord import DIVERGENT_RATE, remaining_error_factor


class ChordState(eqx.Module):
    """The factorised Jacobian at the first point and the last two increments' sizes."""

    lu: tuple[Array, Array]
    size: Float[Array, ""]
    previous_size: Float[Array, ""]
    step: Int[Array, ""]


def init(fn: Any, y: PyTree, args: PyTree, options: dict | None) -> ChordState:
    flat, unravel = ravel_pytree(y)
    reuse = (options or {}).get("init_state")
    if reuse is not None:
        lu = reuse.lu
    else:
        residual = lambda x: ravel_pytree(fn(unravel(x), args)[0])[0]
        lu = jsl.lu_factor(jax.jacfwd(residual)(flat))
    inf = jnp.asarray(jnp.inf, jnp.real(flat).dtype)
    return ChordState(lu, inf, inf, jnp.asarray(0))


def step(
    fn: Any, y: PyTree, args: PyTree, state: ChordState, rtol: Any, atol: Any, norm: Any
) -> tuple[PyTree, ChordState, PyTree]:
    f, aux = fn(y, args)
    flat_y, unravel = ravel_pytree(y)
    increment = jsl.lu_solve(state.lu, ravel_pytree(f)[0])
    new_flat = flat_y - increment
    scale = atol + rtol * jnp.abs(new_flat)
    size = norm(unravel(increment / scale))
    new_state = ChordState(state.lu, size, state.size, state.step + 1)
    return unravel(new_flat), new_state, aux


def stops(state: ChordState, kappa: float) -> tuple[Bool[Array, ""], Any]:
    """Whether to stop, and the optimistix result: successful or nonlinear divergence."""
    import optimistix as optx

    rate = state.size / state.previous_size
    converged = state.size * remaining_error_factor(rate) < kappa
    # An increment of zero is an exact root (a linear fn after one step); the first
    # increment's size is inf, so this never holds before a step.
    exact = state.size == 0
    # Judged from the second step, once there is a rate.
    failed = (state.step >= 2) & ~exact & (~jnp.isfinite(rate) | (rate > DIVERGENT_RATE))
    done = exact | ((state.step >= 2) & converged) | failed
    result = optx.RESULTS.where(failed, optx.RESULTS.nonlinear_divergence, optx.RESULTS.successful)
    return done, result
