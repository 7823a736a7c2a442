"""Reading and writing one row of a buffer at a traced index: every tape, slot store,
decision record and output buffer of this package is written and read this way.

A row index here is always in range: a write that is to be dropped goes to a buffer's
scratch row (its last), never past the end. Unbatched, a row is a dynamic slice, updated
in place. Under `vmap` (`batched`), where each sample's row differs, JAX turns a dynamic
slice into a gather and its update into a scatter that clamp the index, and XLA:CPU
copied the written values into the scatter's update layout first: kernels of their own
on every tick. So a batched row is a scatter or gather with the index promised in
bounds. (Unbatched, a scatter would cost more than the in-place update.)

A row index may also be a vector: several rows written or read at once (an emit that
records a block of outputs); rows that are not to be kept are all sent to the scratch row.
A block is written and read a row at a time, each row a scatter or gather of its own. As
one scatter of the stacked rows, XLA:CPU fused the stack into the kernel that computes the
rows, and that kernel, writing rows of a few elements through a transpose, ran three to
five times slower than the same arithmetic as one kernel a row (W6's forward solve spent
a fifth of its time there; see benchmarks/README.md).
"""

import jax.numpy as jnp
from jax import lax
from jax.typing import ArrayLike
from jaxtyping import Array, Int


def write_row(
    buffer: Array,
    row: Int[ArrayLike, ""],
    value: ArrayLike,
    column: int = 0,
    batched: bool = False,
) -> Array:
    """`buffer` with `value` (cast to its dtype) in row `row`: the whole row, or from
    `column` on for a 2-D buffer whose rows are written in part; for a vector `row`, one
    row of `value` in each."""
    value = jnp.asarray(value).astype(buffer.dtype)
    if jnp.ndim(row) == 1:  # a block of whole rows
        assert column == 0  # blocks are written whole
        rows = jnp.asarray(row)
        for i in range(rows.shape[0]):  # rows sent to the scratch row may repeat
            buffer = buffer.at[rows[i]].set(value[i], mode="promise_in_bounds")
        return buffer
    if not batched:
        start = [jnp.asarray(row, jnp.int32)] + [jnp.int32(0)] * (buffer.ndim - 1)
        if column:
            start[1] = jnp.int32(column)
        return lax.dynamic_update_slice(buffer, value[None], start)
    if column == 0 and value.shape == buffer.shape[1:]:
        return buffer.at[row].set(value, mode="promise_in_bounds")
    return buffer.at[row, column : column + value.shape[0]].set(value, mode="promise_in_bounds")


def read_row(
    buffer: Array,
    row: Int[ArrayLike, ""],
    column: int = 0,
    width: int | None = None,
    batched: bool = False,
) -> Array:
    """Row `row` of `buffer`: the whole row, or `width` entries from `column` on; for a
    vector `row`, those rows."""
    whole = width is None and column == 0
    if jnp.ndim(row) == 1:  # a block of whole rows
        assert whole  # blocks are read whole
        rows = jnp.asarray(row)
        return jnp.stack([buffer.at[r].get(mode="promise_in_bounds") for r in rows])
    if not batched:
        line = lax.dynamic_index_in_dim(buffer, row, keepdims=False)
        return (
            line if whole else line[column : buffer.shape[1] if width is None else column + width]
        )
    if whole:
        return buffer.at[row].get(mode="promise_in_bounds")
    end = buffer.shape[1] if width is None else column + width
    return buffer.at[row, column:end].get(mode="promise_in_bounds")
