"""A step's acceptance is a decision: DirectAdjoint's reverse sweep recomputes blocks of
steps, compiled apart from the forward sweep and rounding differently, and must
differentiate the steps the forward sweep took. In float32 at a tolerance near the
resolution an error estimate is a few digits of noise, so a recomputed verdict on a step
now and then differs from the first; the reverse sweep then differentiated another solve
(gradients off by up to 75%, or by 1e32, in a batch of Lorenz systems)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odesolve as ode

pytestmark = pytest.mark.matrix  # a batch of 256 DirectAdjoint solves each way: 14 s


def _lorenz(t, y, p):
    s, r, b = p[0], p[1], p[2]
    return jnp.stack([s * (y[1] - y[0]), y[0] * (r - y[2]) - y[1], y[0] * y[1] - b * y[2]])


def _loss(p):
    ts = jnp.linspace(0.0, 3.0, 31, dtype=jnp.float32)
    sol = ode.diffeqsolve(
        ode.ODETerm(_lorenz), ode.Tsit5(), 0.0, 3.0, 0.01, jnp.ones(3, jnp.float32), p,
        saveat=ode.SaveAt(ts=ts), stepsize_controller=ode.PIDController(rtol=1e-5, atol=1e-5),
        max_steps=4096, adjoint=ode.DirectAdjoint(),
    )  # fmt: skip
    return jnp.sum(sol.ys**2)


def test_direct_adjoint_reverse_mode_agrees_with_its_forward_mode_in_a_batch():
    noise = jax.random.normal(jax.random.key(0), (256, 3), jnp.float32)
    ps = jnp.array([10.0, 28.0, 8 / 3], jnp.float32) * (1 + 0.05 * noise)
    reverse = np.asarray(jax.jit(jax.vmap(jax.grad(_loss)))(ps))
    forward = np.asarray(jax.jit(jax.vmap(jax.jacfwd(_loss)))(ps))
    scale = np.max(np.abs(forward), axis=1, keepdims=True)
    np.testing.assert_array_less(np.abs(reverse - forward) / scale, 1e-3)
