"""Terms: what is being integrated."""

import abc
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import equinox as eqx
import jax.tree_util as jtu

from ._flat import PyTree, RealScalarLike

_VF = TypeVar("_VF")
_Control = TypeVar("_Control")


class AbstractTerm(eqx.Module, Generic[_VF, _Control]):
    """A term of the equation: dy = prod(vf(t, y, args), contr(t0, t1)). Diffrax's base
    of `ODETerm`, for `isinstance` checks and annotations (`AbstractTerm[VF, Control]`);
    `diffeqsolve` takes an `ODETerm`."""

    @abc.abstractmethod
    def vf(self, t: RealScalarLike, y: PyTree, args: PyTree) -> _VF:
        """The vector field at (t, y)."""

    @abc.abstractmethod
    def contr(self, t0: RealScalarLike, t1: RealScalarLike) -> _Control:
        """The control over [t0, t1]."""

    @abc.abstractmethod
    def prod(self, vf: _VF, control: _Control) -> PyTree:
        """The increment of y: the vector field applied to the control."""

    def vf_prod(self, t: RealScalarLike, y: PyTree, args: PyTree, control: _Control) -> PyTree:
        return self.prod(self.vf(t, y, args), control)


class ODETerm(AbstractTerm[_VF, RealScalarLike]):
    """dy/dt = vector_field(t, y, args), with `y` any PyTree of float arrays.

    `vector_field` may be a plain function, a closure over arrays, or an `eqx.Module`
    whose arrays are its parameters; all of them receive gradients. `ODETerm[VF]` names
    the type of what the field returns, as in Diffrax.
    """

    vector_field: Callable[..., _VF]

    def vf(self, t: RealScalarLike, y: PyTree, args: PyTree) -> _VF:
        return self.vector_field(t, y, args)

    def contr(self, t0: RealScalarLike, t1: RealScalarLike) -> Any:
        """The control over [t0, t1]: for an ODE, the time increment."""
        return t1 - t0

    def prod(self, vf: _VF, control: RealScalarLike) -> PyTree:
        return jtu.tree_map(lambda v: v * control, vf)
