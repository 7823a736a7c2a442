"""Terms: what is being integrated."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax.tree_util as jtu
from jaxtyping import Array, Float

from ._flat import PyTree, RealScalarLike


class ODETerm(eqx.Module):
    """dy/dt = vector_field(t, y, args), with `y` any PyTree of float arrays.

    `vector_field` may be a plain function, a closure over arrays, or an `eqx.Module`
    whose arrays are its parameters; all of them receive gradients.
    """

    vector_field: Callable

    def vf(self, t: RealScalarLike, y: PyTree, args: PyTree) -> Any:
        return self.vector_field(t, y, args)

    def contr(self, t0: RealScalarLike, t1: RealScalarLike) -> Any:
        """The control over [t0, t1]: for an ODE, the time increment."""
        return t1 - t0

    def prod(self, vf: PyTree, control: Float[Array, ""]) -> Any:
        return jtu.tree_map(lambda v: v * control, vf)

    def vf_prod(self, t: RealScalarLike, y: PyTree, args: PyTree, control: Float[Array, ""]) -> Any:
        return self.prod(self.vf(t, y, args), control)
