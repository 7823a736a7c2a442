"""A PyTree state as one flat vector.

The solver works on a single 1-D array: every stage combination is then one fused
elementwise expression, however many leaves `y0` has. `FlatSpec` is the static record that
turns the vector back into the user's PyTree for each vector-field call.
"""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax.typing import ArrayLike, DTypeLike
from jaxtyping import Array, Float, Real

from adjoints import cast

# An arbitrary PyTree (the user's state or args, a loop carry): nothing narrower is true.
PyTree = Any
# A scalar time as users pass it: a Python number or a 0-d array, possibly traced.
RealScalarLike = int | float | Real[Array, ""]


class FlatSpec(eqx.Module):
    """Static description of a PyTree of float arrays: treedef, shapes, dtypes."""

    treedef: Any = eqx.field(static=True)
    shapes: tuple = eqx.field(static=True)
    dtypes: tuple = eqx.field(static=True)
    dtype: Any = eqx.field(static=True)  # the common dtype of the flat vector

    @property
    def size(self) -> int:
        return int(sum(int(np.prod(s)) for s in self.shapes))

    def ravel(self, tree: PyTree) -> Float[Array, " n"]:
        leaves = jtu.tree_leaves(tree)
        flat = [jnp.ravel(x).astype(self.dtype) for x in leaves]
        return flat[0] if len(flat) == 1 else jnp.concatenate(flat)

    def unravel(self, flat: Float[Array, " n"]) -> Any:
        if len(self.shapes) == 1:
            leaves = [cast(flat.reshape(self.shapes[0]), self.dtypes[0])]
        else:
            sizes = [int(np.prod(s)) for s in self.shapes]
            parts = jnp.split(flat, np.cumsum(sizes)[:-1])
            leaves = [
                cast(p.reshape(s), d)
                for p, s, d in zip(parts, self.shapes, self.dtypes, strict=True)
            ]
        return jtu.tree_unflatten(self.treedef, leaves)

    def unravel_rows(self, flat: Float[Array, "m n"]) -> Any:
        """Unravel a stack of flat vectors into a PyTree with a leading axis of size m."""
        m = flat.shape[0]
        sizes = [int(np.prod(s)) for s in self.shapes]
        parts = jnp.split(flat, np.cumsum(sizes)[:-1], axis=1) if len(sizes) > 1 else [flat]
        leaves = [
            cast(p.reshape((m, *s)), d)
            for p, s, d in zip(parts, self.shapes, self.dtypes, strict=True)
        ]
        return jtu.tree_unflatten(self.treedef, leaves)


def widest_float(*values: ArrayLike | DTypeLike) -> Any:
    """The widest floating dtype among `values` (arrays or dtypes). Python scalars are
    weakly typed and do not count; with none left, JAX's default float. Written out
    rather than `jnp.result_type`, which refuses float32 + float64 under strict
    promotion, where a state may legitimately mix them."""
    dtypes = []
    for v in values:
        if isinstance(v, (bool, int, float)):
            continue
        raw: Any = getattr(v, "dtype", v)
        dtype = jnp.dtype(raw)
        if jnp.issubdtype(dtype, jnp.inexact):
            dtypes.append(dtype)
    if not dtypes:
        return jnp.result_type(float)
    return max(dtypes, key=lambda d: jnp.finfo(d).bits)


def flat_spec(tree: PyTree, dtype: DTypeLike) -> FlatSpec:
    leaves, treedef = jtu.tree_flatten(tree)
    return FlatSpec(
        treedef=treedef,
        shapes=tuple(tuple(x.shape) for x in leaves),
        dtypes=tuple(jnp.result_type(x) for x in leaves),
        dtype=dtype,
    )


def real_dtype(dtype: DTypeLike) -> Any:
    """The real dtype of the same precision (complex128 -> float64)."""
    return jnp.finfo(dtype).dtype


def state_dtype(leaves: list) -> Any:
    """The flat state's dtype: the widest real precision among the leaves (at least
    float32: a float16 state's error norm and stages would lose most of their digits),
    complex when any leaf is complex."""
    real = widest_float(*[real_dtype(jnp.result_type(x)) for x in leaves], jnp.float32)
    if any(jnp.iscomplexobj(x) for x in leaves):
        return complex_dtype(real)
    return real


def in_state_dtype(h: ArrayLike, y: Array) -> Array:
    """The step size `h` (a real time) in the state's dtype, for state arithmetic such as
    `y0 + h * k`. A complex state takes it as a complex number: strict dtype promotion
    mixes no real and complex values implicitly."""
    return jnp.asarray(h).astype(y.dtype)


def complex_dtype(real: DTypeLike) -> Any:
    """The complex dtype whose parts have the precision of `real` (float64 -> complex128);
    named, since strict dtype promotion refuses to derive it."""
    return jnp.dtype(f"complex{2 * max(jnp.finfo(real).bits, 32)}")
