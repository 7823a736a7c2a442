"""Checks of user inputs that several entry points share: each names the argument, shows
the value and says the fix, and is written once here."""

import math
from typing import Any

import equinox as eqx
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from adjoints import trace_time_value

from ._flat import PyTree


def check_array_leaves(tree: PyTree, name: str, owner: str = "") -> None:
    """Each leaf of `tree` (a state) is an array or a number, not a bool or an object."""
    for path, leaf in jtu.tree_flatten_with_path(tree)[0]:
        not_array = isinstance(leaf, (bool, np.bool_, str, bytes)) or not eqx.is_array_like(leaf)
        if not_array or has_odd_dtype(leaf):
            raise TypeError(
                f"{owner}{name}{jtu.keystr(path)} = {leaf!r} (type {type(leaf).__name__}) is "
                f"not an array: every leaf of {name} must be a float (or integer) array or "
                "number, e.g. jnp.asarray(...)."
            )


def has_odd_dtype(x: Any) -> bool:
    """`x` has a dtype that is not one of numbers (strings, objects, PRNG keys)."""
    dtype = getattr(x, "dtype", None)
    return dtype is not None and not is_number_dtype(dtype)


def is_number_dtype(dtype: Any) -> bool:
    """A dtype of numbers (bool, int, float, complex): not strings, objects or PRNG keys."""
    if isinstance(dtype, np.dtype) and dtype.kind in "biufc":  # the usual case, at once
        return True
    try:  # (bfloat16 and the float8 types are NumPy void dtypes, numbers to JAX)
        return bool(jnp.issubdtype(dtype, jnp.number) or jnp.issubdtype(dtype, jnp.bool_))
    except TypeError:
        return False


def is_boolean_scalar(x: Any) -> bool:
    """A bool or a boolean array of no dimensions (a jump flag)."""
    if isinstance(x, str) or not eqx.is_array_like(x):
        return False
    return jnp.result_type(x) == jnp.bool_ and jnp.ndim(x) == 0


def shape_of(ts: Any) -> tuple[int, ...] | None:
    """The shape of times, a list's too (which `jnp.shape` would refuse); None if ragged."""
    try:
        return np.shape(ts)
    except ValueError:
        return None


def shape_text(shape: tuple[int, ...] | None) -> str:
    """`shape_of`'s answer, as an error message shows it."""
    return "a ragged list" if shape is None else f"shape {shape}"


def _dtype_of(ts: Any) -> Any:
    """The dtype of times: a list or NumPy array as NumPy reads it (strings stay strings),
    a JAX array's."""
    known = isinstance(ts, (list, tuple, np.ndarray))
    return np.asarray(ts).dtype if known else jnp.result_type(ts)


def is_real(ts: Any) -> bool:
    """Whether times (a list or an array) are real numbers."""
    dtype = _dtype_of(ts)
    return bool(jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer))


def check_real_times(given: str, ts: Any) -> None:
    """Times are real numbers; `given` names the argument, e.g. "SaveAt(ts=...)"."""
    if not is_real(ts):
        raise TypeError(f"{given}: pass real times, got dtype {_dtype_of(ts)}.")


def first_out_of_order(times: Any, direction: float = 1.0) -> int | None:
    """The first i with times[i + 1] not strictly beyond times[i] in `direction` (a NaN
    counts), or None when the known `times` run strictly that way."""
    wrong = np.flatnonzero(~(np.diff(np.asarray(times, dtype=float)) * direction > 0))
    return int(wrong[0]) if wrong.size else None


def check_finite_time(given: str, value: Any) -> None:
    """A time is a real number, finite where known when given: a step to or from NaN or
    inf is NaN, and reported as nothing else. `given` names the argument, e.g.
    "solver.step(t1"."""
    if isinstance(value, (str, bytes)) or not eqx.is_array_like(value):
        raise TypeError(
            f"{given}={value!r}): pass a real number (a Python float or a scalar array)."
        )
    known = trace_time_value(value)
    if known is None or np.ndim(known) != 0 or not is_real(known):
        return
    if not math.isfinite(float(known)):
        raise ValueError(f"{given}={float(known)}): pass a finite time.")


def broadcasts_to(shape: tuple, to: tuple) -> bool:
    """Whether an array of `shape` broadcasts to `to` (keeping `to`'s shape)."""
    try:
        return np.broadcast_shapes(shape, to) == tuple(to)
    except ValueError:  # shapes that do not broadcast at all
        return False


def check_tolerance(owner: str, name: str, value: Any) -> None:
    """A tolerance known when given is finite and >= 0: a negative or NaN one is never
    met, and the solve would fail without naming it."""
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{owner}({name}={value!r}): pass a number, e.g. 1e-6.")
    known = None if value is None else trace_time_value(value)
    if known is None or np.ndim(known) != 0:
        return
    if not (float(known) >= 0 and math.isfinite(float(known))):  # NaN fails too
        raise ValueError(f"{owner}({name}={value!r}): pass a finite number >= 0, e.g. 1e-6.")


def check_flag(name: str, value: Any, owner: str = "") -> None:
    """A switch that decides what is traced (what to save, whether to raise) is a Python
    bool: a string or an array would be read as its truth value, silently or, traced,
    with JAX's error naming neither the argument nor the fix. `owner`: the class it is
    given to, if any ("SaveAt")."""
    if isinstance(value, (bool, np.bool_)) or type(value) is int and value in (0, 1):
        return
    given = f"{owner}({name}={value!r})" if owner else f"{name}={value!r}"
    if eqx.is_array(value) and trace_time_value(value) is None:
        raise TypeError(
            f"{given} is a traced value: pass a Python bool (True or False). It decides "
            "what the solve's program does, so it cannot be an input to `jit`: mark it "
            "static, or close over it."
        )
    raise TypeError(f"{given}: pass True or False.")
