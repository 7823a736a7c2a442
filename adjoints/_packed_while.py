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
    """Where each packed leaf of a flattened carry goes: `groups` lists, per dtype, the
    positions of the leaves packed into that dtype's vector; the others pass through."""

    treedef: jtu.PyTreeDef = eqx.field(static=True)
    num_leaves: int = eqx.field(static=True)
    groups: tuple[tuple[int, ...], ...] = eqx.field(static=True)

    def pack(self, tree: T) -> tuple[list, list[Array]]:
        leaves = jtu.tree_leaves(tree)
        packed = {i for group in self.groups for i in group}
        rest = [x for i, x in enumerate(leaves) if i not in packed]
        return rest, [jnp.stack([leaves[i] for i in group]) for group in self.groups]

    def unpack(self, packed: tuple[list, list[Array]]) -> Any:
        rest, vectors = packed
        leaves: list = [None] * self.num_leaves
        for group, vector in zip(self.groups, vectors, strict=True):
            for row, i in enumerate(group):
                leaves[i] = lax.index_in_dim(vector, row, keepdims=False)
        passing = iter(rest)
        leaves = [next(passing) if x is None else x for x in leaves]
        return jtu.tree_unflatten(self.treedef, leaves)


def _packing(init: T) -> _Packing | None:
    """The packing of `init`'s strongly typed scalar leaves, by dtype; None where no dtype
    has two of them (nothing to gain)."""
    leaves, treedef = jtu.tree_flatten(init)
    by_dtype: dict[np.dtype, list[int]] = {}
    for i, x in enumerate(leaves):
        if eqx.is_array(x) and jnp.ndim(x) == 0 and not jax.typeof(x).weak_type:
            by_dtype.setdefault(jnp.result_type(x), []).append(i)
    groups = tuple(tuple(group) for group in by_dtype.values() if len(group) > 1)
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
