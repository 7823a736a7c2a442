"""A batch whose samples an event stops at their own times, saved with
`SaveAt(ts=..., t1=True)`: each sample's final row sits right after the save times it
reached (as Diffrax writes it), at a row that differs between samples. Its gradients, in
every order users write them, against the analytic ones of a falling body."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odesolve as ode

TS = jnp.linspace(0.0, 2.0, 5)
HEIGHTS = jnp.array([10.0, 5.0, 8.0])
GS = jnp.array([9.81, 9.81, 12.0])  # landing at 1.43, 1.01 and 1.15: between save times


def _loss(g, height, adjoint):
    """The sum of the saved heights and speeds, the landing's row included."""
    sol = ode.diffeqsolve(
        ode.ODETerm(lambda t, y, g: jnp.stack([y[1], -g])), ode.Tsit5(), 0.0, 2.0, 0.05,
        jnp.stack([height, jnp.zeros_like(height)]), g,
        saveat=ode.SaveAt(ts=TS, t1=True), event=ode.Event(lambda t, y, g, **kw: y[0]),
        stepsize_controller=ode.PIDController(rtol=1e-10, atol=1e-10), adjoint=adjoint,
    )  # fmt: skip
    return jnp.sum(jnp.where(jnp.isfinite(sol.ys), sol.ys, 0.0))


def _analytic(g, height):
    """(dL/dg, dL/dH): h = H - g t^2 / 2 and v = -g t at the save times before the
    landing T = sqrt(2 H / g), where h = 0 and v = -sqrt(2 g H)."""
    g, height = np.asarray(g), np.asarray(height)
    landing = np.sqrt(2 * height / g)
    before = np.asarray(TS)[None, :] < landing[..., None]
    t = np.where(before, np.asarray(TS)[None, :], 0.0)
    d_g = np.sum(-(t**2) / 2 - t, axis=-1) - np.sqrt(height / (2 * g))
    d_height = np.sum(before, axis=-1) - np.sqrt(g / (2 * height))
    return d_g, d_height


DEFAULT = ode.RecursiveCheckpointAdjoint()
grad = jax.grad(_loss, argnums=(0, 1))
ORDERS = {
    "vmap(grad) batched": lambda: jax.vmap(grad, (0, 0, None))(GS, HEIGHTS, DEFAULT),
    "grad(vmap)": lambda: jax.grad(
        lambda g, h: jnp.sum(jax.vmap(_loss, (None, 0, None))(g, h, DEFAULT)), argnums=(0, 1)
    )(GS[0], HEIGHTS),
    "vmap(grad) shared": lambda: jax.vmap(grad, (None, 0, None))(GS[0], HEIGHTS, DEFAULT),
    "vmap(vmap(grad))": lambda: jax.vmap(jax.vmap(grad, (0, 0, None)), (0, 0, None))(
        GS.reshape(3, 1), HEIGHTS.reshape(3, 1), DEFAULT
    ),
    "jacrev(vmap)": lambda: jax.jacrev(jax.vmap(_loss, (0, 0, None)), argnums=(0, 1))(
        GS, HEIGHTS, DEFAULT
    ),
    "jit(jvp(vmap))": lambda: jax.jit(
        lambda g, h: jax.jvp(
            lambda g, h: jax.vmap(_loss, (0, 0, None))(g, h, ode.ForwardMode()),
            (g, h),
            (jnp.ones_like(g), jnp.zeros_like(h)),
        )[1]
    )(GS, HEIGHTS),  # fmt: skip
}


def _expected(order: str):
    d_g, d_height = _analytic(GS, HEIGHTS)
    if order == "grad(vmap)":
        d_g, d_height = _analytic(GS[0], HEIGHTS)
        return np.sum(d_g), d_height
    if order == "vmap(grad) shared":
        return _analytic(GS[0], HEIGHTS)
    if order == "vmap(vmap(grad))":
        return d_g.reshape(3, 1), d_height.reshape(3, 1)
    if order == "jacrev(vmap)":
        return np.diag(d_g), np.diag(d_height)
    if order == "jit(jvp(vmap))":
        return (d_g,)
    return d_g, d_height


@pytest.mark.matrix  # heavy: runs with -m matrix
@pytest.mark.parametrize(
    "order",
    [
        order
        if order == "grad(vmap)"  # the others with -m matrix
        else pytest.param(order, marks=pytest.mark.matrix)
        for order in ORDERS
    ],
)
def test_an_early_stop_in_a_batch_differentiates_in_every_order(order):
    got = ORDERS[order]()
    got = got if isinstance(got, tuple) else (got,)
    for actual, expected in zip(got, _expected(order), strict=True):
        np.testing.assert_allclose(actual, expected, rtol=1e-8, atol=1e-10)
