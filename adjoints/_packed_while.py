"""A `while_loop` whose scalar carry leaves travel packed: one vector per dtype.

XLA runs a loop body as a sequence of kernels, and on CPU each output of the body is made by
a kernel of its own (XLA:CPU fuses no two outputs into one kernel). A solver step carries
several scalars that change every iteration (the time, the step size, the previous step's
time, counters, a result code), and each would be a kernel launch of its own doing one or two
operations. Packed into one vector per dtype, the scalars of a dtype are made by one kernel,
which XLA fuses with the arithmetic that computes them.

For unbatched loops only: under `vmap` each scalar leaf is already a vector over the
batch, and the packed ones would be a (batch, leaves) array that every iteration transposes
to read a leaf and back to write it.

Integers and flags travel in a float vector where that float represents each of their values
exactly (int32 in float64; int8, int16 and bool in float32 too): each packed vector costs a
kernel and, as its new value is gathered from the old one's elements, a copy every iteration.
A vector holds at most 8 leaves, as many as XLA:CPU assembles in one kernel.

Only strongly typed scalars are packed: a weakly typed one would come back strongly typed.
"""

from collections.abc import Callable
from typing import Any, TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax import lax
from jaxtyping import Array, Bool

T = TypeVar("T")  # a PyTree


class _Packing(eqx.Module):
    """Where each packed leaf of a flattened carry goes: `groups` lists, per vector, its
    dtype and the positions and dtypes of the leaves packed into it; the others pass
    through."""

    treedef: jtu.PyTreeDef = eqx.field(static=True)
    num_leaves: int = eqx.field(static=True)
    groups: tuple[tuple[np.dtype, tuple[tuple[int, np.dtype], ...]], ...] = eqx.field(static=True)

    def pack(self, tree: T) -> tuple[list, list[Array]]:
        leaves = jtu.tree_leaves(tree)
        packed = {i for _, members in self.groups for i, _ in members}
        rest = [x for i, x in enumerate(leaves) if i not in packed]
        stack = lambda dtype, members: jnp.stack([leaves[i].astype(dtype) for i, _ in members])
        return rest, [stack(dtype, members) for dtype, members in self.groups]

    def unpack(self, packed: tuple[list, list[Array]]) -> Any:
        rest, vectors = packed
        leaves: list = [None] * self.num_leaves
        for (_, members), vector in zip(self.groups, vectors, strict=True):
            for row, (i, dtype) in enumerate(members):
                leaves[i] = _exactly(lax.index_in_dim(vector, row, keepdims=False), dtype)
        passing = iter(rest)
        leaves = [next(passing) if x is None else x for x in leaves]
        return jtu.tree_unflatten(self.treedef, leaves)


def _exactly(x: Array, dtype: np.dtype) -> Array:
    """`x`, which holds a value of `dtype` exactly, as `dtype`."""
    return x != 0 if dtype == np.bool_ else x.astype(dtype)


def _represents(vector: np.dtype, leaf: np.dtype) -> bool:
    """Whether the float dtype `vector` holds every value of the integer or bool dtype
    `leaf` exactly (its significand has at least the integer's bits)."""
    if not jnp.issubdtype(vector, jnp.floating) or jnp.issubdtype(leaf, jnp.inexact):
        return False
    bits = 1 if leaf == np.bool_ else 8 * leaf.itemsize
    return bits <= jnp.finfo(vector).nmant + 1


# XLA:CPU fuses a concatenation of at most 8 operands: a longer vector is assembled from a
# kernel per element.
_MOST_PER_VECTOR = 8


def _packing(init: T) -> _Packing | None:
    """The packing of `init`'s strongly typed scalar leaves: by dtype, with the integers
    and flags that a float represents exactly moved to the widest such float's leaves, in
    vectors of at most `_MOST_PER_VECTOR` leaves; None where no vector would hold two
    leaves (nothing to gain)."""
    leaves, treedef = jtu.tree_flatten(init)
    by_dtype: dict[np.dtype, list[tuple[int, np.dtype]]] = {}
    for i, x in enumerate(leaves):
        if eqx.is_array(x) and jnp.ndim(x) == 0 and not jax.typeof(x).weak_type:
            dtype = np.dtype(jnp.result_type(x))
            by_dtype.setdefault(dtype, []).append((i, dtype))
    widest_first = sorted(
        (d for d in by_dtype if jnp.issubdtype(d, jnp.floating)), key=lambda d: -d.itemsize
    )
    for dtype in list(by_dtype):
        into = next((f for f in widest_first if _represents(f, dtype)), None)
        if into is not None:
            by_dtype[into] += by_dtype.pop(dtype)
    n = _MOST_PER_VECTOR
    chunks = [(d, tuple(m[i : i + n])) for d, m in by_dtype.items() for i in range(0, len(m), n)]
    groups = tuple((d, members) for d, members in chunks if len(members) > 1)
    return _Packing(treedef, len(leaves), groups) if groups else None


def packed_while_loop(cond: Callable[[T], Bool[Array, ""]], body: Callable[[T], T], init: T) -> T:
    """`lax.while_loop(cond, body, init)`, with `init`'s strongly typed scalar leaves
    carried packed into one vector per dtype (see above)."""
    packing = _packing(init)
    if packing is None:
        return lax.while_loop(lambda c: cond(c), lambda c: body(c), init)
    final = lax.while_loop(
        lambda p: cond(packing.unpack(p)),
        lambda p: packing.pack(body(packing.unpack(p))),
        packing.pack(init),
    )
    return packing.unpack(final)
