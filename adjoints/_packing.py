"""A PyTree stored as two flat rows, one float and one int32.

Saving a state (or a step's residuals) per tick is then two row writes, however many
leaves it has: a write per leaf would cost an operation per leaf per tick on XLA:CPU.
"""

import math
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jax.typing import DTypeLike
from jaxtyping import Array, Inexact, Int, PyTree

# A packed PyTree (see `Packing`): its float leaves raveled into one row, its other leaves
# as int32 into another.
Row = tuple[Inexact[Array, " floats"], Int[Array, " ints"]]
# Rows of packed PyTrees, one per slot (a stored state, a tape row).
Rows = tuple[Inexact[Array, "rows floats"], Int[Array, "rows ints"]]


def tree_bytes(tree: PyTree) -> int:
    """Bytes of a PyTree's arrays (or shapes), each leaf in its own dtype."""
    leaves = jtu.tree_leaves(jax.eval_shape(lambda: tree))
    return sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in leaves)


def cast(x: Array, dtype: DTypeLike) -> Array:
    """`x.astype(dtype)`, taking the real part explicitly where a complex value goes to a
    real dtype (a real leaf stored beside complex ones; an implicit cast is deprecated)."""
    if jnp.iscomplexobj(x) and not jnp.issubdtype(dtype, jnp.complexfloating):
        x = jnp.real(x)
    return x.astype(dtype)


def common_float(*dtypes: DTypeLike) -> DTypeLike:
    """The one float dtype that holds every given dtype: the widest precision, complex
    if any is. Worked out by standard promotion, since strict promotion (which a user may
    have set) refuses to name a dtype for float64 beside complex128."""
    with jax.numpy_dtype_promotion("standard"):
        return jnp.result_type(*dtypes)


def is_float_dtype(dtype: DTypeLike) -> bool:
    """A floating-point (or complex) dtype: stored in the float row."""
    return jnp.issubdtype(dtype, jnp.inexact)


def is_float(x: Any) -> bool:
    """A floating-point array: the leaves that are differentiated and stored as floats."""
    return eqx.is_array(x) and is_float_dtype(x.dtype)


class Packing(eqx.Module):
    """Stores a carry as two flat rows, one float and one int32, so that saving a state
    is two row writes instead of one per leaf (which matters per tick on XLA:CPU).

    Leaves marked `left_out` are not stored, and come back as zeros: the parts of a
    carry that the tick after it never reads (see `Loop.step_ignores`)."""

    treedef: jtu.PyTreeDef = eqx.field(static=True)
    shapes: tuple[tuple[int, ...], ...] = eqx.field(static=True)
    dtypes: tuple[DTypeLike, ...] = eqx.field(static=True)
    float_dtype: DTypeLike = eqx.field(static=True)
    left_out: tuple[bool, ...] = eqx.field(static=True, default=())

    @staticmethod
    def of(carry: PyTree, leave_out: PyTree[bool] | None = None) -> "Packing":
        """The packing of `carry`'s structure; `leave_out`: a carry-shaped tree of bools,
        True for a leaf not stored."""
        leaves, treedef = jtu.tree_flatten(jax.eval_shape(lambda: carry))
        left_out = (False,) * len(leaves)
        if leave_out is not None:
            left_out = tuple(bool(x) for x in jtu.tree_leaves(leave_out))
            assert len(left_out) == len(leaves)  # one flag a leaf
        stored = [x.dtype for x, out in zip(leaves, left_out) if not out]
        floats = [d for d in stored if is_float_dtype(d)]
        float_dtype = common_float(*floats) if floats else jnp.float32
        return Packing(
            treedef,
            tuple(x.shape for x in leaves),
            tuple(x.dtype for x in leaves),
            float_dtype,
            left_out,
        )

    def _stored(self) -> list[tuple[bool, tuple[int, ...], DTypeLike]]:
        """(whether stored, shape, dtype) of each leaf."""
        left_out = self.left_out or (False,) * len(self.shapes)
        return [(not out, s, d) for out, s, d in zip(left_out, self.shapes, self.dtypes)]

    def sizes(self) -> tuple[int, int]:
        """Lengths of the float and the int row."""
        stored = [(math.prod(s), is_float_dtype(d)) for kept, s, d in self._stored() if kept]
        return sum(n for n, f in stored if f), sum(n for n, f in stored if not f)

    def pack(self, carry: PyTree) -> Row:
        stored = [x for x, (kept, _, _) in zip(jtu.tree_leaves(carry), self._stored()) if kept]
        floats = [jnp.ravel(x).astype(self.float_dtype) for x in stored if is_float_dtype(x.dtype)]
        ints = [jnp.ravel(x).astype(jnp.int32) for x in stored if not is_float_dtype(x.dtype)]
        cat = lambda xs, d: jnp.concatenate(xs) if xs else jnp.zeros((0,), d)
        return cat(floats, self.float_dtype), cat(ints, jnp.int32)

    def unpack(self, row: Row) -> PyTree:
        floats, ints = row
        leaves, fi, ii = [], 0, 0
        for kept, shape, dtype in self._stored():
            size = math.prod(shape)
            if not kept:
                leaves.append(jnp.zeros(shape, dtype))
            elif is_float_dtype(dtype):
                leaves.append(cast(floats[fi : fi + size].reshape(shape), dtype))
                fi += size
            else:
                leaves.append(ints[ii : ii + size].reshape(shape).astype(dtype))
                ii += size
        return jtu.tree_unflatten(self.treedef, leaves)

    def bytes(self) -> int:
        """Bytes of a packed PyTree: its two rows."""
        floats, ints = self.sizes()
        return floats * jnp.dtype(self.float_dtype).itemsize + ints * 4

    def empty(self, n: int) -> Rows:
        """`n` rows of zeros."""
        f, i = self.sizes()
        return jnp.zeros((n, f), self.float_dtype), jnp.zeros((n, i), jnp.int32)
