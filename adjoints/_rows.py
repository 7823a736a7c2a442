"""Reading and writing one row of a buffer at a traced index: every tape, slot store,
decision record and output buffer of this package is written and read this way.

A row index here is always in range: a write that is to be dropped goes to a buffer's
scratch row (its last), never past the end. So the index is promised in bounds. Under
`vmap`, where each sample's row differs, a write becomes a scatter and a read a gather;
with the promise, XLA:CPU neither clamps the index nor copies the written values into
the scatter's update layout first, kernels of their own on every tick.
"""

import jax.numpy as jnp
from jax.typing import ArrayLike
from jaxtyping import Array, Int


def write_row(buffer: Array, row: Int[ArrayLike, ""], value: ArrayLike, column: int = 0) -> Array:
    """`buffer` with `value` (cast to its dtype) in row `row`: the whole row, or from
    `column` on for a 2-D buffer whose rows are written in part."""
    value = jnp.asarray(value).astype(buffer.dtype)
    if column == 0 and value.shape == buffer.shape[1:]:
        return buffer.at[row].set(value, mode="promise_in_bounds")
    return buffer.at[row, column : column + value.shape[0]].set(value, mode="promise_in_bounds")


def read_row(
    buffer: Array, row: Int[ArrayLike, ""], column: int = 0, width: int | None = None
) -> Array:
    """Row `row` of `buffer`: the whole row, or `width` entries from `column` on."""
    if width is None and column == 0:
        return buffer.at[row].get(mode="promise_in_bounds")
    end = buffer.shape[1] if width is None else column + width
    return buffer.at[row, column:end].get(mode="promise_in_bounds")
