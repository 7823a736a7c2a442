"""The dtype times are computed in, shared by `diffeqsolve` and the low-level API.

Times may arrive as Python ints, int arrays or floats of any width. `diffeqsolve`
computes in one float dtype: the widest float among the time arrays and the state's
real precision, never narrower than float32. Every other entry point that takes times
(`solver.init`/`step`/`func`, a controller's `init`/`adapt_step_size`, interpolations)
promotes them the same way, so that `t0 = 0` next to `t1 = 0.05` is not an int32 that
truncates the step to zero.
"""

import contextlib
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax.typing import ArrayLike
from jaxtyping import Array

from ._flat import PyTree, real_dtype, widest_float


def time_dtype(*times: ArrayLike | None, state: PyTree = None) -> Any:
    """The float dtype of `times` (Python numbers, int or float arrays; None skipped)
    next to a state `state` (any PyTree of arrays or numbers; its real precision
    counts, a complex state's too)."""
    leaves = [_real_precision(jnp.result_type(x)) for x in jtu.tree_leaves(state)]
    present = [t for t in times if t is not None]
    return widest_float(*present, *leaves, jnp.float32)


def narrower_times(ts: Any, time_dtype: Any) -> bool:
    """Whether save times are given in a float dtype narrower than time's (float32 times
    of a float64 solve), where each is known only to the rounding of its own dtype."""
    dtype = jnp.result_type(ts)
    floating = jnp.issubdtype(dtype, jnp.floating) and not getattr(ts, "weak_type", False)
    return floating and jnp.finfo(dtype).bits < jnp.finfo(time_dtype).bits


def _real_precision(dtype: Any) -> Any:
    # An integer state is solved in JAX's default float, as `diffeqsolve` makes it.
    inexact = jnp.issubdtype(dtype, jnp.inexact)
    return real_dtype(dtype) if inexact else jnp.result_type(float)


def as_times(*times: ArrayLike | None, state: PyTree = None) -> tuple[Any, ...]:
    """Each of `times` as an array of `time_dtype(*times, state=state)` (None stays
    None)."""
    dtype = time_dtype(*times, state=state)
    return tuple(None if t is None else as_time(t, dtype) for t in times)


def as_time(t: ArrayLike, dtype: Any) -> Array:
    """`t` in the float dtype `dtype`."""
    return jnp.asarray(t).astype(dtype)


def times_array(ts: Any) -> Any:
    """Times given as a sequence (`SaveAt(ts=...)`, `StepTo(ts)`, `step_ts`, `jump_ts`) as
    an array, as Diffrax makes them. `eqx.filter_jit` traces arrays (NumPy ones too) and
    holds a list static, so new times of the same shape reuse the compiled solve rather
    than compile it again for each value. A list of numbers becomes a NumPy array, whose
    values stay known when traced (the checks read them); a list holding traced values, a
    JAX array. What cannot be an array is kept as given, for the caller's check to report."""
    if ts is None or isinstance(ts, (jax.Array, np.ndarray)):
        return ts
    for as_array in (np.asarray, jnp.asarray):
        with contextlib.suppress(TypeError, ValueError):  # not numbers: try the next
            return as_array(ts)
    return ts
