"""Interpolants over one step [t0, t1], as a solver written in Diffrax's interface names
them in `interpolation_cls` and builds them from a step's `dense_info`.

They take Diffrax's constructor arguments exactly: `(t0, t1, y0, y1)`,
`(t0, t1, y0, y1, k0, k1)` or `from_k(t0, t1, y0, y1, k)`, `(t0, t1, y0, y1, k)`. A `k`
holds a step's stage increments f_i * (t1 - t0), stacked on a leading axis. Where a
step lies and where t lies in it is `_interpolation.position`, as for odesolve's own
dense output.
"""

from typing import Any

import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from equinox import AbstractVar
from jaxtyping import Array, Shaped

from . import _interpolation
from ._flat import PyTree, RealScalarLike, in_state_dtype
from ._path import AbstractPath
from ._time import as_times


class AbstractLocalInterpolation(AbstractPath):
    """An interpolant over one step [t0, t1]."""


def _step_position(
    t0: RealScalarLike, t1: RealScalarLike, t: RealScalarLike, state: PyTree
) -> tuple[Array, Array]:
    """(h, theta): the step's size and where t lies in it, in the float time dtype."""
    t0_, t1_, t_ = as_times(t0, t1, t, state=state)
    return _interpolation.position(t0_, t1_, t_)


def _theta(t0: RealScalarLike, t1: RealScalarLike, t: RealScalarLike, state: PyTree) -> Array:
    """Where t lies in the step [t0, t1]; on a step of no length 0, with no derivative in
    t, so that the interpolant is its start, constant (as Diffrax's)."""
    _, theta = _step_position(t0, t1, t, state)
    return jnp.where(_no_length(t0, t1, state), 0, theta)


def _no_length(t0: RealScalarLike, t1: RealScalarLike, state: PyTree) -> Array:
    """Whether the step is of no length (`_step_position` then gives it a unit size)."""
    t0_, t1_ = as_times(t0, t1, state=state)
    return t1_ == t0_


class LocalLinearInterpolation(AbstractLocalInterpolation):
    """y0 + (t - t0) / (t1 - t0) * (y1 - y0) on [t0, t1] (Euler's, Heun's dense
    output). `y0`, `y1`: PyTrees of one structure."""

    t0: RealScalarLike
    t1: RealScalarLike
    y0: PyTree
    y1: PyTree

    def evaluate(
        self, t0: RealScalarLike, t1: RealScalarLike | None = None, left: bool = True
    ) -> PyTree:
        """y(t0), or y(t1) - y(t0). `left` is ignored: the interpolant is continuous.
        On a step of no length it is y0 everywhere, constant in t (as `derivative`)."""
        if t1 is not None:
            theta = _theta(self.t0, self.t1, t1, self.y0) - _theta(self.t0, self.t1, t0, self.y0)
            return jtu.tree_map(
                lambda a, b: _scaled(theta, b - a), _arrays(self.y0), _arrays(self.y1)
            )
        theta = _theta(self.t0, self.t1, t0, self.y0)
        return jtu.tree_map(
            lambda a, b: a + _scaled(theta, b - a), _arrays(self.y0), _arrays(self.y1)
        )

    def derivative(self, t: RealScalarLike, left: bool = True) -> PyTree:
        """(y1 - y0) / (t1 - t0): constant on the step (0 on a step of no length)."""
        h, _ = _step_position(self.t0, self.t1, t, self.y0)
        empty = _no_length(self.t0, self.t1, self.y0)
        return jtu.tree_map(
            lambda a, b: jnp.where(empty, 0, _scaled(1 / h, b - a)),
            _arrays(self.y0),
            _arrays(self.y1),
        )


class AbstractPolynomialInterpolation(AbstractLocalInterpolation):
    """A polynomial in theta = (t - t0) / (t1 - t0) per leaf: `coeffs` holds, for each
    leaf of y, its coefficients stacked highest power first (as `jnp.polyval`)."""

    t0: AbstractVar[RealScalarLike]
    t1: AbstractVar[RealScalarLike]
    coeffs: AbstractVar[PyTree]

    def evaluate(
        self, t0: RealScalarLike, t1: RealScalarLike | None = None, left: bool = True
    ) -> PyTree:
        """y(t0), or y(t1) - y(t0). `left` is ignored: the interpolant is continuous.
        On a step of no length it is y0 everywhere, constant in t (as `derivative`)."""
        if t1 is not None:
            end, start = self.evaluate(t1), self.evaluate(t0)
            return jtu.tree_map(lambda a, b: a - b, end, start)
        theta = _theta(self.t0, self.t1, t0, self._values())
        return jtu.tree_map(lambda c: _horner(c, theta), self.coeffs)

    def derivative(self, t: RealScalarLike, left: bool = True) -> PyTree:
        """dy/dt: the polynomial's theta-derivative over the step size."""
        h, theta = _step_position(self.t0, self.t1, t, self._values())
        empty = _no_length(self.t0, self.t1, self._values())

        def slope(c: Array) -> Array:
            degree = c.shape[0] - 1
            powers = np.arange(degree, 0, -1).reshape((-1,) + (1,) * (c.ndim - 1))
            d_theta = _horner(c[:-1] * powers.astype(c.dtype), theta)
            return jnp.where(empty, 0, _scaled(1 / h, d_theta))

        return jtu.tree_map(slope, self.coeffs)

    def _values(self) -> PyTree:
        # One row of each leaf's coefficients: what the time dtype is read against.
        return jtu.tree_map(lambda c: c[0], self.coeffs)


class ThirdOrderHermitePolynomialInterpolation(AbstractPolynomialInterpolation):
    """The cubic through (t0, y0) and (t1, y1) with slopes k0 / h and k1 / h at its ends,
    h = t1 - t0: `k0`, `k1` are the field's increments f * h there. `from_k` takes a
    step's stacked increments `k` and uses the first and the last."""

    t0: RealScalarLike
    t1: RealScalarLike
    coeffs: PyTree

    def __init__(
        self,
        *,
        t0: RealScalarLike,
        t1: RealScalarLike,
        y0: PyTree,
        y1: PyTree,
        k0: PyTree,
        k1: PyTree,
    ):
        self.t0 = t0
        self.t1 = t1
        self.coeffs = jtu.tree_map(_hermite, _arrays(y0), _arrays(y1), k0, k1)

    @classmethod
    def from_k(
        cls,
        *,
        t0: RealScalarLike,
        t1: RealScalarLike,
        y0: PyTree,
        y1: PyTree,
        k: PyTree,
    ) -> "ThirdOrderHermitePolynomialInterpolation":
        """From a step's increments `k` (leading axis: the stages)."""
        k0 = jtu.tree_map(lambda x: jnp.asarray(x)[0], k)
        k1 = jtu.tree_map(lambda x: jnp.asarray(x)[-1], k)
        return cls(t0=t0, t1=t1, y0=y0, y1=y1, k0=k0, k1=k1)


def _hermite(y0: Array, y1: Array, k0: Any, k1: Any) -> Array:
    """Cubic coefficients (theta^3, theta^2, theta, 1) of the Hermite interpolant."""
    k0, k1 = jnp.asarray(k0, y0.dtype), jnp.asarray(k1, y0.dtype)
    cubic = k0 + k1 + 2 * (y0 - y1)
    square = 3 * (y1 - y0) - 2 * k0 - k1
    return jnp.stack([cubic, square, k0, y0])


class FourthOrderPolynomialInterpolation(AbstractPolynomialInterpolation):
    """The quartic through y0, y1 and a midpoint value y0 + sum_i c_mid[i] k[i], with
    slopes k[0] / h and k[-1] / h at the ends (the dense output of Dopri5 and Tsit5).
    Abstract: a subclass sets `c_mid`, the method's midpoint weights (one per stage).
    `k`: the step's increments f_i * h, leading axis the stages."""

    t0: RealScalarLike
    t1: RealScalarLike
    coeffs: PyTree
    c_mid: AbstractVar[np.ndarray]

    def __init__(
        self,
        *,
        t0: RealScalarLike,
        t1: RealScalarLike,
        y0: PyTree,
        y1: PyTree,
        k: PyTree,
    ):
        self.t0 = t0
        self.t1 = t1
        self.coeffs = jtu.tree_map(self._quartic, _arrays(y0), _arrays(y1), k)

    def _quartic(self, y0: Array, y1: Array, k: Any) -> Array:
        """Quartic coefficients (theta^4, ..., 1) from y0, y1 and the midpoint value."""
        k = jnp.asarray(k, y0.dtype)
        weights = jnp.asarray(np.asarray(self.c_mid)).astype(y0.dtype)
        y_mid = y0 + jnp.tensordot(weights, k, axes=1)
        f0, f1 = k[0], k[-1]
        quartic = 2 * (f1 - f0) - 8 * (y1 + y0) + 16 * y_mid
        cubic = 5 * f0 - 3 * f1 + 18 * y0 + 14 * y1 - 32 * y_mid
        square = f1 - 4 * f0 - 11 * y0 - 5 * y1 + 16 * y_mid
        return jnp.stack([quartic, cubic, square, f0, y0])


def _arrays(tree: PyTree) -> PyTree:
    return jtu.tree_map(jnp.asarray, tree)


def _scaled(weight: Array, x: Shaped[Array, "..."]) -> Array:
    """weight * x with the (real) weight in x's dtype: strict promotion mixes none."""
    return in_state_dtype(weight, x) * x


def _horner(coeffs: Shaped[Array, "p ..."], theta: Array) -> Array:
    """sum_j coeffs[j] theta^(p-1-j), theta in the coefficients' dtype."""
    x = in_state_dtype(theta, coeffs)
    acc = coeffs[0]
    for c in coeffs[1:]:
        acc = acc * x + c
    return acc
