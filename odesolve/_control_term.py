"""A field driven by a control path, solved as the ODE it is when the path is smooth."""

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import jax.tree_util as jtu

from ._flat import PyTree, RealScalarLike
from ._path import AbstractPath
from ._term import _VF, AbstractTerm, ODETerm, RateOfControl, _Control


def _contract(vf: PyTree, control: PyTree) -> PyTree:
    """Each leaf of `vf` (shape y_leaf.shape + control_leaf.shape) applied to its
    control leaf: a sum over the control's axes, conjugating `vf` as Diffrax does."""
    return jtu.tree_map(
        lambda v, c: jnp.tensordot(jnp.conj(v), c, axes=jnp.ndim(c)), vf, control
    )


class ControlTerm(AbstractTerm[_VF, _Control]):
    """dy = vector_field(t, y, args) · dx(t) for a control path `x`, as Diffrax's class of
    that name: the field returns, per leaf of y, an array of shape
    `y.shape + x.shape` that acts on dx by a sum over x's axes.

    `diffeqsolve` integrates ODEs; a differentiable control is an ODE through
    `to_ode()`, dy/dt = vector_field(t, y, args) · dx/dt (a neural CDE driven by an
    interpolation of its data, `CubicInterpolation`, is solved this way). A control
    term given to `diffeqsolve` as it is, as Diffrax takes it with an ODE solver, is
    solved as its `to_ode()`.
    """

    vector_field: Callable[..., PyTree]
    control: AbstractPath

    def __check_init__(self):
        control = self.control
        if not (callable(getattr(control, "evaluate", None)) or callable(control)):
            raise TypeError(
                f"ControlTerm(control={control!r}): pass a path x(t) to drive the "
                "field, e.g. CubicInterpolation(ts, coeffs) or LinearInterpolation(ts, ys)."
            )

    def vf(self, t: RealScalarLike, y: PyTree, args: PyTree) -> PyTree:
        return self.vector_field(t, y, args)

    def contr(self, t0: RealScalarLike, t1: RealScalarLike) -> PyTree:
        """The control's increment x(t1) - x(t0)."""
        return self.control.evaluate(t0, t1)

    def prod(self, vf: PyTree, control: PyTree) -> PyTree:
        return _contract(vf, control)

    def _control_rate(self, t: Any) -> PyTree:
        return self.control.derivative(t)

    def to_ode(self) -> ODETerm:
        """This term as `ODETerm(f)` with f(t, y, args) = vector_field(t, y, args) · dx/dt."""
        return ODETerm(RateOfControl(self))
