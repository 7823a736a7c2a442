"""`adjoints._batch_sum.sum_over_batch`: a cotangent summed over exactly the vmap axes
that its parameter does not have."""

import jax
import jax.numpy as jnp
import numpy as np

from adjoints._batch_sum import sum_over_batch

XS = jnp.arange(12.0).reshape(4, 3)
SHARED = jnp.ones(3)


def test_without_vmap_it_is_the_identity():
    np.testing.assert_array_equal(sum_over_batch(XS, SHARED), XS)
    np.testing.assert_array_equal(jax.jit(sum_over_batch)(XS, SHARED), XS)


def test_a_shared_parameter_gets_the_sum_over_the_batch():
    summed = jax.vmap(lambda x: sum_over_batch(2 * x, SHARED), out_axes=None)(XS)
    np.testing.assert_array_equal(summed, 2 * XS.sum(0))


def test_a_batched_parameter_gets_its_own_cotangent():
    own = jax.vmap(lambda x, p: sum_over_batch(x * p, p))(XS, XS)
    np.testing.assert_array_equal(own, XS * XS)


def test_nested_vmaps_each_sum_their_own_axis():
    xs = XS.reshape(2, 2, 3)
    inner = lambda x: sum_over_batch(x, SHARED)
    both = jax.vmap(jax.vmap(inner, out_axes=None), out_axes=None)(xs)
    np.testing.assert_array_equal(both, XS.sum(0))
    # Shared by the inner samples only: summed over the inner axis, one per outer sample.
    per_outer = jax.vmap(lambda x, p: jax.vmap(lambda y: sum_over_batch(y, p), out_axes=None)(x))
    np.testing.assert_array_equal(per_outer(xs, jnp.ones((2, 3))), xs.sum(1))


def test_it_is_linear_under_jvp_and_transpose():
    f = lambda x: jnp.sum(jax.vmap(lambda r: sum_over_batch(r**2, SHARED), out_axes=None)(x))
    value, tangent = jax.jvp(f, (XS,), (jnp.ones_like(XS),))
    np.testing.assert_allclose(value, jnp.sum(XS**2))
    np.testing.assert_allclose(tangent, jnp.sum(2 * XS))
    np.testing.assert_allclose(jax.grad(lambda x: jnp.sum(sum_over_batch(x, SHARED)))(XS), 1.0)
