"""Whether a value is known at trace time, asked through JAX's public API.

A traced value (inside `jit`, `grad`, `vmap`, ...) cannot become a NumPy array: the
conversion raises one of JAX's documented errors. A JAX array is asked by its type
instead (`jax.core.Tracer`, public): converting it would copy it from the device to the
host, and an eager solve asks this of every parameter array on every call.
"""

from typing import Any

import jax
import numpy as np

_TRACED = (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError)


def trace_time_value(x: Any) -> np.ndarray | None:
    """`x` as a NumPy array when its value is known at trace time, else None. A concrete
    JAX array is copied to the host: ask `is_concrete` when the value is not needed."""
    if isinstance(x, jax.core.Tracer):
        return None
    try:
        return np.asarray(x)
    except _TRACED:
        return None


def is_concrete(x: Any) -> bool:
    """Whether `x`'s value is known at trace time (a traced value is not). Reads no
    array's value."""
    if isinstance(x, jax.Array | jax.core.Tracer):
        return not isinstance(x, jax.core.Tracer)
    return trace_time_value(x) is not None
