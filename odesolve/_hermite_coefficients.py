"""`backward_hermite_coefficients`: the coefficients of `CubicInterpolation` through data,
with missing observations (NaN) interpolated over, as Diffrax computes them.

Hermite cubic splines with backward differences (Morrill, Kidger, Yang & Lyons 2021,
"Neural controlled differential equations for online prediction tasks"): the piece
from an observation runs to the next observation, starting from the observed value with
the slope of the backward difference to the observation before (a forward difference
for the first one), and ends on the next value with the slope of the secant to it. A
missing observation lies inside the piece around it; the piece is re-expanded about
each knot so that `CubicInterpolation` reads it one knot interval at a time. Vectorised
over times (no loop), and differentiable with respect to the data.
"""

from typing import Any

import jax.numpy as jnp
import jax.tree_util as jtu
from jaxtyping import Array, Real

from ._checks import broadcasts_to
from ._flat import PyTree, in_state_dtype
from ._global_interpolation import as_inexact, cubic_slope, cubic_value
from ._missing_data import (
    check_rows,
    checked_knots,
    fill_forward,
    gather_rows,
    last_observed,
    next_observed,
)

Coefficients = tuple[Array, Array, Array, Array]


def _hermite(t0: Array, y0: Array, slope0: Array, t1: Array, y1: Array) -> Coefficients:
    """(d, c, b, a) of the cubic in s = t - t0 through (t0, y0) with slope `slope0` and
    through (t1, y1) with the secant's slope there."""
    width = in_state_dtype(t1 - t0, y0)
    bend = (y1 - y0) / width - slope0
    return -bend / width**2, 2 * bend / width, slope0, y0


def _first_row(value: Any, ys: Array) -> Array:
    return jnp.broadcast_to(jnp.asarray(value, ys.dtype), ys.shape[1:])


def _next_observations(
    ts: Real[Array, " times"], ys: Array, fill_forward_nans_at_end: bool
) -> tuple[Array, Array]:
    """For each knot interval i: the time and value of the first observation after
    ts[i] (ts[-1] and NaN where none, or the last value with `fill_forward_nans_at_end`)."""
    after = next_observed(ys[1:]) + 1
    t_next = ts[jnp.clip(after, 0, ts.shape[0] - 1)]
    y_next = gather_rows(ys, after)
    return t_next, fill_forward(y_next) if fill_forward_nans_at_end else y_next


def _observation_slopes(
    ts: Real[Array, " times"], ys: Array, start: tuple[Array, Array], nexts: tuple[Array, Array]
) -> Array:
    """The starting slope at each inner knot 1..T-2: the backward difference to the
    observation before (`start`, the value at ts[0], if none), or the forward difference
    to the next one when there is no value before. Read only where observed."""
    inner = ys[1:-1]
    observed = ~jnp.isnan(inner)
    safe = jnp.where(observed, inner, 0)  # no NaN in what is computed and not read
    before = jnp.concatenate([jnp.full((1,) + inner.shape[1:], -1), last_observed(inner)[:-1]])
    t_before = jnp.where(before < 0, start[0], ts[1:][jnp.clip(before, 0)])
    y_before = jnp.where(before < 0, start[1], gather_rows(inner, before))
    no_before = jnp.isnan(y_before)
    t_here = jnp.broadcast_to(ts[1:-1].reshape((-1,) + (1,) * (inner.ndim - 1)), inner.shape)
    t_next, y_next = nexts[0][1:], nexts[1][1:]
    forward = (y_next - safe) / in_state_dtype(jnp.where(observed, t_next - t_here, 1), safe)
    backward = (safe - jnp.where(no_before, 0, y_before)) / in_state_dtype(
        jnp.where(observed, t_here - t_before, 1), safe
    )
    return jnp.where(no_before, forward, backward)


def _piece_starts(
    ts: Real[Array, " times"],
    ys: Array,
    start: tuple[Array, Array, Array],
    nexts: tuple[Array, Array],
) -> tuple[Array, Array, Array]:
    """For each knot interval i: the (time, value, slope) its cubic piece starts from:
    the last observation at or before ts[i] (after ts[0]), else `start`."""
    t0, y0, slope0 = start
    if ys.shape[0] == 2:
        return t0[None], y0[None], slope0[None]
    inner = ys[1:-1]
    slopes = _observation_slopes(ts, ys, (t0, y0), nexts)
    last = last_observed(inner)
    fresh = last >= 0
    t_last = jnp.where(fresh, ts[1:][jnp.clip(last, 0)], t0)
    y_last = jnp.where(fresh, gather_rows(inner, last), y0)
    slope_last = jnp.where(fresh, gather_rows(slopes, last), slope0)
    return _prepend(t0, t_last), _prepend(y0, y_last), _prepend(slope0, slope_last)


def _prepend(first: Array, rest: Array) -> Array:
    """`first` (one row) stacked before `rest`."""
    return jnp.concatenate([jnp.broadcast_to(first, rest.shape[1:])[None], rest])


def _coefficients(
    fill_forward_nans_at_end: bool,
    ts: Real[Array, " times"],
    ys: Array,
    deriv0: Any = None,
    replace_nans_at_start: Any = None,
) -> Coefficients:
    """One leaf's (d, c, b, a), each (T - 1, *channels)."""
    t_next, y_next = _next_observations(ts, ys, fill_forward_nans_at_end)
    t0 = jnp.broadcast_to(ts[0], ys.shape[1:])
    y0 = ys[0] if replace_nans_at_start is None else _first_row(replace_nans_at_start, ys)
    if deriv0 is None:
        slope0 = (y_next[0] - y0) / in_state_dtype(t_next[0] - t0, ys)
    else:
        slope0 = _first_row(deriv0, ys)
    t_from, y_from, slope_from = _piece_starts(ts, ys, (t0, y0, slope0), (t_next, y_next))
    # Re-expand each piece about its own knot ts[i], where `CubicInterpolation` reads it.
    knot = jnp.broadcast_to(ts[:-1].reshape((-1,) + (1,) * (ys.ndim - 1)), y_next.shape)
    piece = _hermite(t_from, y_from, slope_from, t_next, y_next)
    s = knot - t_from
    value, slope = cubic_value(piece, s), cubic_slope(piece[:3], s)
    return _hermite(knot, value, slope, t_next, y_next)


def backward_hermite_coefficients(
    ts: Real[Array, " times"],
    ys: PyTree,
    *,
    deriv0: PyTree | None = None,
    replace_nans_at_start: PyTree | None = None,
    fill_forward_nans_at_end: bool = False,
) -> tuple[PyTree, PyTree, PyTree, PyTree]:
    """Coefficients (d, c, b, a) of a Hermite cubic spline with backward differences
    through the data, for `CubicInterpolation(ts, coeffs)`.

    - `ts`: (T,) strictly increasing times; `ys`: a PyTree of arrays with leading axis T,
      NaN marking a missing observation.
    - `deriv0`: the slope at ts[0] (a PyTree like one row of `ys`); default the forward
      difference to the first observation after ts[0].
    - `replace_nans_at_start`: the value at ts[0] used in place of ys[0] (so filling
      NaNs before the first observation); default ys[0].
    - `fill_forward_nans_at_end`: after the last observation, run to its value at ts[-1]
      (default: NaN there).

    Returns (d, c, b, a), each a PyTree like `ys` with leading axis T - 1.
    """
    ts = checked_knots(ts, "backward_hermite_coefficients")
    check_rows(ts, ys)
    leaves, treedef = jtu.tree_flatten(ys)
    if not leaves:
        return ys, ys, ys, ys
    deriv0s = _per_leaf(deriv0, treedef, len(leaves))
    starts = _per_leaf(replace_nans_at_start, treedef, len(leaves))
    for name, given in (("deriv0", deriv0s), ("replace_nans_at_start", starts)):
        for y, row in zip(leaves, given):
            if row is not None and not broadcasts_to(jnp.shape(row), jnp.shape(y)[1:]):
                raise ValueError(
                    f"backward_hermite_coefficients({name}=...) has shape {jnp.shape(row)} "
                    f"where one row of ys has {jnp.shape(y)[1:]}: pass a value of that "
                    "shape (or one that broadcasts to it)."
                )
    out = [
        _coefficients(fill_forward_nans_at_end, ts, as_inexact(y), d0, r)
        for y, d0, r in zip(leaves, deriv0s, starts, strict=True)
    ]
    d, c, b, a = (jtu.tree_unflatten(treedef, [leaf[k] for leaf in out]) for k in range(4))
    return d, c, b, a


def _per_leaf(tree: PyTree | None, treedef: Any, n: int) -> list:
    """`tree`'s leaves, one per leaf of the data (None for each where not given)."""
    return [None] * n if tree is None else treedef.flatten_up_to(tree)
