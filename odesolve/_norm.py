"""The norm errors are measured in, unless a controller is given another."""

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from ._flat import PyTree


def _sum_cpu(values: jax.Array) -> jax.Array:
    # XLA:CPU reduces a short axis slowly: under `vmap` over 4,096 samples of 3 elements
    # the sum took 66 us against 8 us as a product with ones, and it stayed faster up to
    # thousands of elements (benchmarks/README.md, "W10: the error norm").
    ones = jnp.ones_like(values)
    return jnp.dot(values, ones, precision=lax.Precision.HIGHEST)


def sum_elements(values: jax.Array) -> jax.Array:
    """Sum of a real array's elements, written for the backend it runs on: a product
    with ones on CPU, a reduction (which fuses into the kernel making `values`) elsewhere."""
    flat = values.reshape(-1)
    return lax.platform_dependent(flat, cpu=_sum_cpu, default=jnp.sum)


def rms_norm(x: PyTree) -> Any:
    """Root mean square over every element of a PyTree."""
    leaves = jax.tree_util.tree_leaves(x)
    size = sum(leaf.size for leaf in leaves)
    if size == 0:  # an empty state has no error: every step is accepted
        real = [jnp.finfo(leaf.dtype).dtype for leaf in leaves]
        return jnp.zeros((), real[0] if real else None)
    total = sum(sum_elements(jnp.square(jnp.abs(leaf))) for leaf in leaves)  # complex too
    return jnp.sqrt(total / size)
