"""The norm errors are measured in, unless a controller is given another."""

from typing import Any

import jax
import jax.numpy as jnp

from ._flat import PyTree


def rms_norm(x: PyTree) -> Any:
    """Root mean square over every element of a PyTree."""
    leaves = jax.tree_util.tree_leaves(x)
    size = sum(leaf.size for leaf in leaves)
    if size == 0:  # an empty state has no error: every step is accepted
        real = [jnp.finfo(leaf.dtype).dtype for leaf in leaves]
        return jnp.zeros((), real[0] if real else None)
    total = sum(jnp.sum(jnp.square(jnp.abs(leaf))) for leaf in leaves)  # complex too
    return jnp.sqrt(total / size)
