"""`batch_size`: how many samples the `vmap`s around a solve run together, in every
order users write the transformations."""

import jax
import jax.numpy as jnp
import numpy as np

from adjoints._batching import batch_size


def _seen(x: jax.Array) -> jax.Array:
    """x, times the batch size seen for x (recorded at trace time)."""
    return x * batch_size(x, jnp.ones(2))


def test_the_batch_size_in_every_order():
    x = jnp.arange(1.0, 4.0)
    sum_seen = lambda v: jnp.sum(_seen(v))
    assert _seen(x[0]) == x[0]
    assert jax.grad(_seen)(x[0]) == 1.0  # an eager grad: no vmap
    assert jax.jvp(_seen, (x[0],), (1.0,))[1] == 1.0
    np.testing.assert_array_equal(jax.vmap(_seen)(x), 3 * x)
    np.testing.assert_array_equal(jax.jit(jax.vmap(_seen))(x), 3 * x)
    np.testing.assert_array_equal(jax.vmap(jax.grad(_seen))(x), [3.0, 3.0, 3.0])
    np.testing.assert_array_equal(jax.grad(lambda v: jnp.sum(jax.vmap(_seen)(v)))(x), [3.0] * 3)
    grid = jnp.ones((2, 3))
    np.testing.assert_array_equal(jax.vmap(jax.vmap(_seen))(grid), 6 * grid)
    np.testing.assert_array_equal(jax.jit(jax.grad(sum_seen))(x), [1.0] * 3)  # not batched
