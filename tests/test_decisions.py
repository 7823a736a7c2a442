"""A step's acceptance is a decision: a reverse sweep that recomputes steps (DirectAdjoint's
blocks, online checkpointing's gaps) runs them compiled apart from the forward sweep and
rounding differently, and must differentiate the steps the forward sweep took. In float32
at a tolerance near the resolution an error estimate is a few digits of noise, so a
recomputed verdict on a step now and then differs from the first; the reverse sweep then
differentiated another solve (gradients off by up to 75%, or by 1e32, in a batch of
Lorenz systems)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odesolve as ode

pytestmark = pytest.mark.matrix  # a batch of 256 solves each way: 14 s an adjoint


def _lorenz(t, y, p):
    s, r, b = p[0], p[1], p[2]
    return jnp.stack([s * (y[1] - y[0]), y[0] * (r - y[2]) - y[1], y[0] * y[1] - b * y[2]])


def _loss(p, adjoint):
    ts = jnp.linspace(0.0, 3.0, 31, dtype=jnp.float32)
    sol = ode.diffeqsolve(
        ode.ODETerm(_lorenz), ode.Tsit5(), 0.0, 3.0, 0.01, jnp.ones(3, jnp.float32), p,
        saveat=ode.SaveAt(ts=ts), stepsize_controller=ode.PIDController(rtol=1e-5, atol=1e-5),
        max_steps=4096, adjoint=adjoint,
    )  # fmt: skip
    return jnp.sum(sol.ys**2)


# Online thinning (16 slots for up to 4,096 steps) recomputes the steps between kept
# states; two samples in 256 were off by up to 34% before recomputed steps took the
# forward sweep's verdicts. Taped segments of 8 ticks with 2 kept states plan for 16
# ticks: the step sizes of later ticks are made again, their verdicts still imposed.
@pytest.mark.parametrize(
    "adjoint",
    [
        ode.DirectAdjoint(),
        ode.RecursiveCheckpointAdjoint(checkpoints=16),
        ode.RecursiveCheckpointAdjoint(schedule=ode.Segments(length=8, starts=2)),
    ],
)
@pytest.mark.parametrize("order", ["vmap(grad)", "grad(vmap)"])
def test_reverse_mode_agrees_with_forward_mode_in_a_batch(adjoint, order):
    noise = jax.random.normal(jax.random.key(0), (256, 3), jnp.float32)
    ps = jnp.array([10.0, 28.0, 8 / 3], jnp.float32) * (1 + 0.05 * noise)
    loss = lambda p: _loss(p, adjoint)
    if order == "vmap(grad)":
        reverse = jax.jit(jax.vmap(jax.grad(loss)))(ps)
    else:  # the batch's summed loss: each sample's parameters get their own gradient
        reverse = jax.jit(jax.grad(lambda p: jnp.sum(jax.vmap(loss)(p))))(ps)
    reverse = np.asarray(reverse)
    forward = jax.jit(jax.vmap(jax.jacfwd(lambda p: _loss(p, ode.ForwardMode()))))(ps)
    forward = np.asarray(forward)
    scale = np.max(np.abs(forward), axis=1, keepdims=True)
    np.testing.assert_array_less(np.abs(reverse - forward) / scale, 1e-3)
