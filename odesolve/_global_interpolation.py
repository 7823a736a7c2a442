"""Paths through data over a grid of knots `ts`: `LinearInterpolation` and
`CubicInterpolation`, as Diffrax has them.

Either can be read inside a vector field (`args=interp`, or closed over): it is an
`eqx.Module` of arrays, so it goes through `jit`, `vmap` and every adjoint, and the
solve is differentiable with respect to its data. Between knots a path is smooth;
where its derivative jumps (at the knots of a linear interpolation), tell an adaptive
controller with `PIDController(..., jump_ts=ts)`.
"""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from equinox import AbstractVar
from jaxtyping import Array, Real

from adjoints import trace_time_value

from ._flat import PyTree, RealScalarLike, in_state_dtype
from ._path import AbstractPath
from ._time import as_time, time_dtype

# Cubic coefficients (d, c, b, a), each a PyTree of arrays with a leading axis of
# len(ts) - 1: on [ts[i], ts[i+1]], y = a[i] + b[i] s + c[i] s^2 + d[i] s^3, s = t - ts[i].
Cubic = tuple[PyTree, PyTree, PyTree, PyTree]


class AbstractGlobalInterpolation(AbstractPath):
    """A path over knots `ts` (1-D, increasing): piece i spans [ts[i], ts[i+1]].
    `ts_size`: how many of `ts` are knots. `t0`, `t1`: ts[0] and ts[-1]. Outside
    [t0, t1] the first or last piece is extended."""

    ts: AbstractVar[Real[Array, " times"]]
    ts_size: AbstractVar[Any]

    def __check_init__(self) -> None:
        name = type(self).__name__
        if jnp.ndim(self.ts) != 1:
            raise ValueError(
                f"{name}(ts=...) has shape {jnp.shape(self.ts)}: pass a 1-D array of knots."
            )
        if jnp.shape(self.ts)[0] < 2:
            raise ValueError(
                f"{name}(ts=...) has {jnp.shape(self.ts)[0]} knot(s): pass at least two."
            )
        known = trace_time_value(self.ts)
        if known is not None:
            known = np.asarray(known, dtype=float)
            # Repeated knots are allowed (`rectilinear_interpolation` makes them).
            bad = ~np.isfinite(known) | np.append(False, known[1:] < known[:-1])
            if np.any(bad):
                i = int(np.argmax(bad))
                raise ValueError(
                    f"{name}(ts=...) has ts[{i}]={known[i]}: knots must be finite and increasing."
                )

    # The properties give `AbstractPath`'s abstract attributes, which mypy reads as
    # dataclass fields that only a field may override; equinox accepts a property.
    @property  # type: ignore[misc]
    def t0(self) -> Array:
        """The first knot."""
        return self.ts[0]

    @property  # type: ignore[misc]
    def t1(self) -> Array:
        """The last knot."""
        return self.ts[-1]

    def _piece(self, t: RealScalarLike, left: bool, state: PyTree) -> tuple[Array, Array, Array]:
        """(i, s, width): the piece holding t, the offset t - ts[i] into it and its length
        ts[i+1] - ts[i], in the float time dtype. At a knot, `left` picks the piece that
        ends there (True) or the one that starts there."""
        dtype = time_dtype(self.ts, t, state=state)
        ts, t = as_time(self.ts, dtype), as_time(t, dtype)
        index = jnp.searchsorted(ts, t, side="left" if left else "right")
        index = jnp.clip(index - 1, 0, self.ts_size - 2)
        return index, t - ts[index], ts[index + 1] - ts[index]


def _increment(path: AbstractPath, t0: RealScalarLike, t1: RealScalarLike, left: bool) -> PyTree:
    """path(t1) - path(t0)."""
    end, start = path.evaluate(t1, left=left), path.evaluate(t0, left=left)
    return jtu.tree_map(lambda a, b: a - b, end, start)


def as_inexact(x: Any) -> Array:
    """`x` as an array of an inexact dtype (integer data in JAX's default float)."""
    x = jnp.asarray(x)
    return x if jnp.issubdtype(x.dtype, jnp.inexact) else x.astype(float)


class LinearInterpolation(AbstractGlobalInterpolation):
    """Piecewise-linear interpolation of `ys` at knots `ts`.

    - `ts`: (T,) increasing times.
    - `ys`: a PyTree of arrays, each with leading axis T.

    Missing values (NaN) make the pieces beside them NaN: fill them first with
    `linear_interpolation` or `rectilinear_interpolation`.
    """

    ts: Real[Array, " times"] = eqx.field(converter=jnp.asarray)
    ys: PyTree

    def __check_init__(self) -> None:
        for leaf in jtu.tree_leaves(self.ys):
            if jnp.shape(leaf)[:1] != jnp.shape(self.ts)[:1]:
                raise ValueError(
                    f"ys has a leaf of shape {jnp.shape(leaf)} for {jnp.shape(self.ts)[0]} "
                    "knots: each leaf of ys needs a leading axis of len(ts)."
                )

    @property  # type: ignore[misc]
    def ts_size(self) -> int:
        """The number of knots."""
        return self.ts.shape[0]

    def evaluate(
        self, t0: RealScalarLike, t1: RealScalarLike | None = None, left: bool = True
    ) -> PyTree:
        """y(t0) = ys[i] + (t0 - ts[i]) / (ts[i+1] - ts[i]) (ys[i+1] - ys[i]) on piece i,
        or the increment y(t1) - y(t0) when `t1` is given."""
        if t1 is not None:
            return _increment(self, t0, t1, left)
        i, s, width = self._piece(t0, left, self.ys)

        def value(y: Array) -> Array:
            y = as_inexact(y)
            return y[i] + in_state_dtype(s / width, y) * (y[i + 1] - y[i])

        return jtu.tree_map(value, self.ys)

    def derivative(self, t: RealScalarLike, left: bool = True) -> PyTree:
        """The slope (ys[i+1] - ys[i]) / (ts[i+1] - ts[i]) of the piece holding `t`."""
        i, _, width = self._piece(t, left, self.ys)

        def slope(y: Array) -> Array:
            y = as_inexact(y)
            return (y[i + 1] - y[i]) / in_state_dtype(width, y)

        return jtu.tree_map(slope, self.ys)


class CubicInterpolation(AbstractGlobalInterpolation):
    """Piecewise-cubic interpolation at knots `ts` from coefficients per piece.

    - `ts`: (T,) increasing times.
    - `coeffs`: (d, c, b, a), each a PyTree like the data with leading axis T - 1: on
      [ts[i], ts[i+1]], y(t) = a[i] + b[i] s + c[i] s^2 + d[i] s^3 with s = t - ts[i].
      `backward_hermite_coefficients(ts, ys)` computes them from data.
    """

    ts: Real[Array, " times"] = eqx.field(converter=jnp.asarray)
    coeffs: Cubic

    def __check_init__(self) -> None:
        if not (isinstance(self.coeffs, (tuple, list)) and len(self.coeffs) == 4):
            raise ValueError(
                "CubicInterpolation(coeffs=...): pass the 4-tuple (d, c, b, a), as "
                "backward_hermite_coefficients(ts, ys) returns it."
            )
        for leaf in jtu.tree_leaves(self.coeffs):
            if jnp.shape(leaf)[:1] != (jnp.shape(self.ts)[0] - 1,):
                raise ValueError(
                    f"coeffs has a leaf of shape {jnp.shape(leaf)} for "
                    f"{jnp.shape(self.ts)[0]} knots: each coefficient needs a leading axis "
                    "of len(ts) - 1, one per piece."
                )

    @property  # type: ignore[misc]
    def ts_size(self) -> int:
        """The number of knots."""
        return self.ts.shape[0]

    def evaluate(
        self, t0: RealScalarLike, t1: RealScalarLike | None = None, left: bool = True
    ) -> PyTree:
        """y(t0), or the increment y(t1) - y(t0) when `t1` is given."""
        if t1 is not None:
            return _increment(self, t0, t1, left)
        d, c, b, a = self.coeffs
        i, s, _ = self._piece(t0, left, a)
        return jtu.tree_map(
            lambda d_, c_, b_, a_: cubic_value((d_[i], c_[i], b_[i], a_[i]), s), d, c, b, a
        )

    def derivative(self, t: RealScalarLike, left: bool = True) -> PyTree:
        """dy/dt = b[i] + 2 c[i] s + 3 d[i] s^2 on the piece holding `t`."""
        d, c, b, a = self.coeffs
        i, s, _ = self._piece(t, left, a)
        return jtu.tree_map(lambda d_, c_, b_: cubic_slope((d_[i], c_[i], b_[i]), s), d, c, b)


def cubic_value(coeffs: tuple[Any, Any, Any, Any], s: Array) -> Array:
    """a + b s + c s^2 + d s^3 for one leaf's (d, c, b, a), s in their dtype."""
    d, c, b, a = (as_inexact(x) for x in coeffs)
    s = in_state_dtype(s, a)
    return a + s * (b + s * (c + s * d))


def cubic_slope(coeffs: tuple[Any, Any, Any], s: Array) -> Array:
    """b + 2 c s + 3 d s^2 for one leaf's (d, c, b)."""
    d, c, b = (as_inexact(x) for x in coeffs)
    s = in_state_dtype(s, b)
    return b + s * (2 * c + 3 * s * d)
