"""`AbstractPath`: a function of time on an interval, as Diffrax names it."""

import abc
from typing import Any, Generic, TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp
from equinox import AbstractVar

from ._flat import PyTree, RealScalarLike
from ._time import as_times

_Value = TypeVar("_Value")  # what the path's evaluation returns, for annotations


class AbstractPath(eqx.Module, Generic[_Value]):
    """A path x(t) on [t0, t1]: interpolated data, a forcing term, a step's dense
    output. Subclasses give `t0`, `t1` and `evaluate`; `derivative` defaults to the
    forward-mode derivative of `evaluate`. Generic over the value of x(t), as Diffrax's
    is: `AbstractPath[Float[Array, "2"]]` annotates a path of 2-vectors."""

    t0: AbstractVar[Any]
    t1: AbstractVar[Any]

    @abc.abstractmethod
    def evaluate(
        self, t0: RealScalarLike, t1: RealScalarLike | None = None, left: bool = True
    ) -> PyTree:
        """x(t0), or the increment x(t1) - x(t0) when `t1` is given. `left`: at a jump,
        the left limit (True) or the right one (False)."""

    def derivative(self, t: RealScalarLike, left: bool = True) -> PyTree:
        """dx/dt at `t` (one-sided at a jump, as `left` says)."""
        (time,) = as_times(t)  # a tangent needs a float time: Python ints too
        _, slope = jax.jvp(
            lambda s: self.evaluate(s, left=left), (time,), (jnp.ones_like(time),)
        )
        return slope
