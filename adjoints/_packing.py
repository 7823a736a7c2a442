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


def is_float(x: Any) -> bool:
    """A floating-point array: the leaves that are differentiated and stored as floats."""
    return eqx.is_array(x) and jnp.issubdtype(x.dtype, jnp.inexact)


class Packing(eqx.Module):
    """Stores a carry as two flat rows, one float and one int32, so that saving a state
    is two row writes instead of one per leaf (which matters per tick on XLA:CPU)."""

    treedef: jtu.PyTreeDef = eqx.field(static=True)
    shapes: tuple[tuple[int, ...], ...] = eqx.field(static=True)
    dtypes: tuple[DTypeLike, ...] = eqx.field(static=True)
    float_dtype: DTypeLike = eqx.field(static=True)

    @staticmethod
    def of(carry: PyTree) -> "Packing":
        leaves, treedef = jtu.tree_flatten(jax.eval_shape(lambda: carry))
        floats = [x.dtype for x in leaves if jnp.issubdtype(x.dtype, jnp.inexact)]
        float_dtype = common_float(*floats) if floats else jnp.float32
        return Packing(
            treedef,
            tuple(x.shape for x in leaves),
            tuple(x.dtype for x in leaves),
            float_dtype,
        )

    def _is_float(self, dtype: DTypeLike) -> bool:
        return jnp.issubdtype(dtype, jnp.inexact)

    def sizes(self) -> tuple[int, int]:
        """Lengths of the float and the int row."""
        f = sum(math.prod(s) for s, d in zip(self.shapes, self.dtypes) if self._is_float(d))
        i = sum(math.prod(s) for s, d in zip(self.shapes, self.dtypes) if not self._is_float(d))
        return f, i

    def pack(self, carry: PyTree) -> Row:
        leaves = jtu.tree_leaves(carry)
        floats = [jnp.ravel(x).astype(self.float_dtype) for x in leaves if self._is_float(x.dtype)]
        ints = [jnp.ravel(x).astype(jnp.int32) for x in leaves if not self._is_float(x.dtype)]
        cat = lambda xs, d: jnp.concatenate(xs) if xs else jnp.zeros((0,), d)
        return cat(floats, self.float_dtype), cat(ints, jnp.int32)

    def unpack(self, row: Row) -> PyTree:
        floats, ints = row
        leaves, fi, ii = [], 0, 0
        for shape, dtype in zip(self.shapes, self.dtypes):
            size = math.prod(shape)
            if self._is_float(dtype):
                leaves.append(cast(floats[fi : fi + size].reshape(shape), dtype))
                fi += size
            else:
                leaves.append(ints[ii : ii + size].reshape(shape).astype(dtype))
                ii += size
        return jtu.tree_unflatten(self.treedef, leaves)

    def empty(self, n: int) -> Rows:
        """`n` rows of zeros."""
        f, i = self.sizes()
        return jnp.zeros((n, f), self.float_dtype), jnp.zeros((n, i), jnp.int32)
