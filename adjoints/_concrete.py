"""Whether a value is known at trace time, asked through JAX's public errors.

A traced value (inside `jit`, `grad`, `vmap`, ...) cannot become a NumPy array: the
conversion raises one of JAX's documented errors. Nothing here inspects tracer types.
"""

from typing import Any

import jax
import numpy as np

_TRACED = (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError)


def trace_time_value(x: Any) -> np.ndarray | None:
    """`x` as a NumPy array when its value is known at trace time, else None."""
    try:
        return np.asarray(x)
    except _TRACED:
        return None


def is_concrete(x: Any) -> bool:
    """Whether `x`'s value is known at trace time (a traced value is not)."""
    return trace_time_value(x) is not None
