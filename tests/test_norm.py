"""The error norm and the step-size factor against their textbook formulas.

`rms_norm` sums with a product by ones on CPU, and the PID factor raises to a power as
exp(c log x): the values, derivatives and batching must be those of sqrt(mean(|x|^2))
and x ** c."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odesolve as ode
from odesolve._controller.pid import _power
from odesolve._norm import sum_elements


def textbook_rms(x) -> jax.Array:
    leaves = jax.tree_util.tree_leaves(x)
    squares = np.concatenate([np.abs(np.asarray(leaf)).ravel() ** 2 for leaf in leaves])
    return np.sqrt(np.mean(squares))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64, jnp.complex64])
@pytest.mark.parametrize("shape", [(2, 5), (700,)])
def test_rms_norm_is_the_root_mean_square(dtype, shape):
    x = jax.random.normal(jax.random.key(1), shape, dtype)
    rtol = 1e-6 if jnp.finfo(dtype).bits <= 32 else 1e-13
    np.testing.assert_allclose(ode.rms_norm(x), textbook_rms(x), rtol=rtol)
    np.testing.assert_allclose(jax.jit(ode.rms_norm)(x), textbook_rms(x), rtol=rtol)


def test_rms_norm_of_a_pytree_and_of_nothing():
    tree = {"a": jnp.arange(3.0), "b": (jnp.ones((2, 2)), -2 * jnp.ones(1))}
    np.testing.assert_allclose(ode.rms_norm(tree), textbook_rms(tree), rtol=1e-14)
    assert ode.rms_norm(jnp.zeros((0,))) == 0


def test_rms_norm_batched_matches_one_sample_at_a_time():
    xs = jax.random.normal(jax.random.key(2), (64, 3))
    batched = jax.vmap(ode.rms_norm)(xs)
    np.testing.assert_allclose(batched, [textbook_rms(x) for x in xs], rtol=1e-13)
    twice = jax.vmap(jax.vmap(ode.rms_norm))(xs.reshape(8, 8, 3))
    np.testing.assert_allclose(twice.ravel(), batched, rtol=1e-13)


def test_rms_norm_derivatives_in_every_order():
    x = jnp.array([0.5, -1.5, 2.0])
    # d/dx sqrt(mean(x^2)) = x / (n rms)
    expected = x / (x.size * textbook_rms(x))
    np.testing.assert_allclose(jax.grad(ode.rms_norm)(x), expected, rtol=1e-13)
    np.testing.assert_allclose(jax.jacfwd(ode.rms_norm)(x), expected, rtol=1e-13)
    np.testing.assert_allclose(jax.jit(jax.grad(ode.rms_norm))(x), expected, rtol=1e-13)
    xs = jnp.stack([x, 2 * x])
    np.testing.assert_allclose(
        jax.vmap(jax.grad(ode.rms_norm))(xs), jnp.stack([expected, expected]), rtol=1e-13
    )
    total = jax.grad(lambda v: jnp.sum(jax.vmap(ode.rms_norm)(v)))(xs)
    np.testing.assert_allclose(total, jnp.stack([expected, expected]), rtol=1e-13)


def test_sum_elements_sums():
    x = jnp.arange(12.0).reshape(3, 4)
    assert sum_elements(x) == 66.0
    np.testing.assert_allclose(jax.vmap(sum_elements)(x), x.sum(axis=1))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_power_is_the_power_on_the_controllers_range(dtype):
    base = jnp.asarray([0.0, 1e-30, 0.37, 1.0, 2.0, 1e30, jnp.inf], dtype)
    for exponent in (0.2, 1 / 8, -0.1, 0.7):
        with np.errstate(divide="ignore"):  # 0 ** -0.1 is inf, as it should be
            expected = np.asarray(base, np.float64) ** exponent
        rtol = 1e-5 if dtype == jnp.float32 else 1e-12
        np.testing.assert_allclose(_power(base, exponent), expected, rtol=rtol)
