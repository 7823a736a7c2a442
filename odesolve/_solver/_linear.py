"""Second-order methods whose dense output is linear between a step's ends."""

import jax.numpy as jnp
from jaxtyping import Array, Float

from .._flat import in_state_dtype
from .._term import ODETerm
from ._base import AbstractSolver

# y(theta) = y0 + h theta k, with k = (y1 - y0) / h.
LINEAR: tuple[tuple[float, ...], ...] = ((1.0,),)


def linear_slope(
    y0: Float[Array, " n"], y1: Float[Array, " n"], h: Float[Array, ""]
) -> Float[Array, " n"]:
    """k of the `LINEAR` interpolant from y0 to y1 over a step of size h."""
    # Safe at h = 0 (a sample of a vmap batch that has finished): no NaN to mask.
    return jnp.where(h == 0, 0, (y1 - y0) / in_state_dtype(jnp.where(h == 0, 1, h), y0))


class AbstractLinearSecondOrder(AbstractSolver):
    """Second order, linear dense output; subclasses say how a step is taken."""

    def order(self, terms: ODETerm | None = None) -> int:
        return 2

    def error_order(self, terms: ODETerm | None = None) -> int:
        return 2

    @property
    def interpolation(self) -> tuple[tuple[float, ...], ...]:
        return LINEAR
