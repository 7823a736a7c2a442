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


class ChordState(eqx.Module):
    """The factorised Jacobian at the first point and the last two increments' sizes."""

    lu: tuple[Array, Array]
    size: Float[Array, ""]
    previous_size: Float[Array, ""]
    step: Int[Array, ""]


def init(fn: Any, y: PyTree, args: PyTree, options: dict | None) -> ChordState:
    reuse = (options or {}).get("init_state")
    lu = reuse.lu if reuse is not None else _factorised_jacobian(fn, y, args)
    flat, _ = ravel_pytree(y)
    inf = jnp.asarray(jnp.inf, jnp.real(flat).dtype)
    return ChordState(lu, inf, inf, jnp.asarray(0))


def _factorised_jacobian(fn: Any, y: PyTree, args: PyTree) -> tuple[Array, Array]:
    flat, unravel = ravel_pytree(y)
    residual = lambda x: ravel_pytree(fn(unravel(x), args)[0])[0]
    return jsl.lu_factor(jax.jacfwd(residual)(flat))


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
    left = state.size * rate / (1 - rate)
    # An increment of zero is an exact root (a linear fn after one step).
    exact = state.size == 0
    converged = exact | ((left >= 0) & (left < kappa))
    diverged = ~exact & (~jnp.isfinite(rate) | (rate > 2))
    judged = state.step >= 2
    failed = judged & diverged
    result = optx.RESULTS.where(
        failed, optx.RESULTS.nonlinear_divergence, optx.RESULTS.successful
    )
    return (judged & (converged | diverged)) | (state.step >= 1) & exact, result
