"""Filling in missing observations (NaN) before interpolating data, as Diffrax does:
`linear_interpolation`, `rectilinear_interpolation`, and the fill-forward they share.

Each works along the leading (time) axis of every leaf, channel by channel: a channel's
NaN is filled from that channel's nearest observations. It is vectorised (no loop over
times), and differentiable with respect to the observed values.
"""

import equinox as eqx
import jax.lax as lax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax.typing import ArrayLike
from jaxtyping import Array, Real

from adjoints import trace_time_value

from ._checks import first_out_of_order
from ._flat import PyTree, in_state_dtype
from ._global_interpolation import as_inexact


def checked_knots(ts: ArrayLike, name: str) -> Real[Array, " times"]:
    """`ts` given to the function `name` as an array of at least two strictly increasing
    times: checked now where known, else at run time (under `jit`)."""
    ts = jnp.asarray(ts)
    if ts.ndim != 1:
        raise ValueError(f"{name}(ts=...) has shape {ts.shape}: pass a 1-D array of times.")
    if ts.shape[0] < 2:
        raise ValueError(f"{name}(ts=...) has {ts.shape[0]} time(s): pass at least two.")
    fix = "times must be finite and strictly increasing."
    known = trace_time_value(ts)
    if known is not None:
        known = np.asarray(known, dtype=float)
        i = first_out_of_order(known)
        if i is not None:
            raise ValueError(
                f"{name}(ts=...) has ts[{i}]={known[i]:.7g} then ts[{i + 1}]="
                f"{known[i + 1]:.7g}: {fix}"
            )
        return ts
    # `>` is False for a NaN time, which is caught here too.
    return eqx.error_if(ts, ~(ts[1:] > ts[:-1]), f"{name}(ts=...): {fix}")


def check_rows(ts: Array, ys: PyTree, name: str = "ys") -> None:
    """Each leaf of `ys` has a leading axis of len(ts): one row per time."""
    for path, leaf in jtu.tree_flatten_with_path(ys)[0]:
        if jnp.shape(leaf)[:1] != jnp.shape(ts)[:1]:
            raise ValueError(
                f"{name}{jtu.keystr(path)} has shape {jnp.shape(leaf)} for {jnp.shape(ts)[0]} "
                f"times: each leaf of {name} needs a leading axis of len(ts), a row per time."
            )


def last_observed(ys: Array) -> Array:
    """For each entry of `ys` (time axis first), the index of the latest non-NaN entry
    of its channel at or before it; -1 where there is none."""
    rows = _row_index(ys)
    return lax.cummax(jnp.where(jnp.isnan(ys), -1, rows), axis=0)


def next_observed(ys: Array) -> Array:
    """For each entry, the index of the earliest non-NaN entry of its channel at or
    after it; len(ys) where there is none."""
    rows = _row_index(ys)
    return lax.cummin(jnp.where(jnp.isnan(ys), ys.shape[0], rows), axis=0, reverse=True)


def _row_index(ys: Array) -> Array:
    return jnp.broadcast_to(jnp.arange(ys.shape[0]).reshape((-1,) + (1,) * (ys.ndim - 1)), ys.shape)


def gather_rows(ys: Array, index: Array) -> Array:
    """ys[index[i, ...], ...] channel by channel (`index` shaped like `ys`, clipped into
    range)."""
    return jnp.take_along_axis(ys, jnp.clip(index, 0, ys.shape[0] - 1), axis=0)


def _times_at(ts: Real[Array, " times"], index: Array) -> Array:
    """ts[index], `index` clipped into range: the times of the rows `index` names."""
    return ts[jnp.clip(index, 0, ts.shape[0] - 1)]


def fill_forward(ys: Array, replace_nans_at_start: ArrayLike | None = None) -> Array:
    """Each NaN of `ys` (time axis first) replaced by its channel's latest observation
    before it; NaNs before any observation by `replace_nans_at_start` (broadcast to one
    row) if given, else left as they are."""
    last = last_observed(ys)
    filled = gather_rows(ys, last)
    start = ys if replace_nans_at_start is None else _start_row(replace_nans_at_start, ys)
    return jnp.where(last < 0, start, filled)


def _start_row(value: ArrayLike, ys: Array) -> Array:
    return jnp.broadcast_to(jnp.asarray(value, ys.dtype), ys.shape[1:])


def _interpolate_channel(
    fill_forward_nans_at_end: bool,
    ts: Real[Array, " times"],
    ys: Array,
    replace_nans_at_start: ArrayLike | None,
) -> Array:
    """One leaf of `linear_interpolation`."""
    before, after = last_observed(ys), next_observed(ys)
    t_before = jnp.where(before < 0, ts[0], _times_at(ts, before))
    start = ys[0] if replace_nans_at_start is None else _start_row(replace_nans_at_start, ys)
    y_before = jnp.where(before < 0, start, gather_rows(ys, before))
    # Past the last observation: NaN, or (fill_forward_nans_at_end) the last observation,
    # reached at ts[-1]; the line to it is then flat.
    none_after = after >= ys.shape[0]
    t_after = jnp.where(none_after, ts[-1], _times_at(ts, after))
    y_end = jnp.where(before < 0, jnp.nan, gather_rows(ys, before))
    y_end = y_end if fill_forward_nans_at_end else jnp.full_like(ys, jnp.nan)
    y_after = jnp.where(none_after, y_end, gather_rows(ys, after))
    missing = jnp.isnan(ys)
    # An observation's own neighbours are itself: the division is guarded, not used.
    width = jnp.where(missing, t_after - t_before, 1)
    weight = in_state_dtype((_times_at(ts, _row_index(ys)) - t_before) / width, ys)
    return jnp.where(missing, y_before + (y_after - y_before) * weight, ys)


def linear_interpolation(
    ts: Real[Array, " times"],
    ys: PyTree,
    *,
    fill_forward_nans_at_end: bool = False,
    replace_nans_at_start: PyTree | None = None,
) -> PyTree:
    """`ys` with each missing value (NaN) replaced by the straight line between its
    channel's nearest observations either side.

    - `ts`: (T,) strictly increasing times; `ys`: a PyTree of arrays with leading axis T.
    - `fill_forward_nans_at_end`: NaNs after the last observation take its value
      (default: they stay NaN).
    - `replace_nans_at_start`: a PyTree like one row of `ys` (or broadcastable): the
      value at ts[0] that NaNs before the first observation are interpolated from
      (default: they stay NaN).

    Returns a PyTree like `ys`.
    """
    ts = checked_knots(ts, "linear_interpolation")
    check_rows(ts, ys)
    fill = lambda y, start=None: _interpolate_channel(
        fill_forward_nans_at_end, ts, as_inexact(y), start
    )
    if replace_nans_at_start is None:
        return jtu.tree_map(fill, ys)
    return jtu.tree_map(fill, ys, replace_nans_at_start)


def rectilinear_interpolation(
    ts: Real[Array, " times"], ys: PyTree, replace_nans_at_start: PyTree | None = None
) -> tuple[Array, PyTree]:
    """Data for a path that first advances time with the data held, then the data with
    time held (Morrill et al. 2021, "Neural CDEs for online prediction tasks"):
    ts = [t0, t1, t2] and ys = [y0, y1, y2] become [t0, t1, t1, t2, t2] and
    [y0, y0, y1, y1, y2]. Missing values are filled forward first (NaNs before any
    observation by `replace_nans_at_start` if given).

    Returns (new_ts, new_ys), of length 2T - 1 along the time axis.
    """
    ts = checked_knots(ts, "rectilinear_interpolation")
    check_rows(ts, ys)
    new_ts = jnp.repeat(ts, 2)[1:]
    hold = lambda y, start=None: jnp.repeat(fill_forward(as_inexact(y), start), 2, axis=0)[:-1]
    if replace_nans_at_start is None:
        return new_ts, jtu.tree_map(hold, ys)
    return new_ts, jtu.tree_map(hold, ys, replace_nans_at_start)
