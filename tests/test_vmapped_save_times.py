"""Save times traced per sample under `vmap` (a latent ODE's decoder): gradients with
respect to the field's parameters, where the times are traced but not differentiated,
and with respect to the save times themselves.

y' = -a y, y(t0) = y0, saved at ts with t0 = ts[0], t1 = ts[-1]: y(t) = y0 e^(-a (t - t0)).
For S = sum_i y(ts_i): dS/da = -sum_i (ts_i - t0) y(ts_i); dS/dts_i = -a y(ts_i) for
i > 0, and dS/dts_0 = a sum_{i > 0} y(ts_i) (ts_0 is also t0, which moves every later
save).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odesolve as ode

A = 0.7
Y0 = np.array([1.0, -0.5, 2.0])
TS = np.array(
    [
        [0.0, 0.13, 0.2, 0.55, 0.61, 0.9, 1.4],
        [0.3, 0.31, 0.75, 0.8, 1.2, 1.9, 2.6],
        [0.1, 0.5, 0.52, 0.54, 1.7, 1.75, 2.2],
    ]
)


def _saved_sum(a, ts, y0):
    field = lambda t, y, args: -args * y
    sol = ode.diffeqsolve(
        ode.ODETerm(field), ode.Tsit5(), ts[0], ts[-1], 0.05, y0, args=a,
        saveat=ode.SaveAt(ts=ts),
    )  # fmt: skip
    return jnp.sum(sol.ys)


def _exact(a, ts, y0):
    ys = y0[:, None] * np.exp(-a * (ts - ts[:, :1]))
    d_a = -np.sum((ts - ts[:, :1]) * ys)
    d_ts = -a * ys
    d_ts[:, 0] = a * np.sum(ys[:, 1:], axis=1)
    return d_a, d_ts


def _batched_sum(a, ts):
    return jnp.sum(jax.vmap(_saved_sum, in_axes=(None, 0, 0))(a, ts, jnp.asarray(Y0)))


@pytest.mark.parametrize(
    "wrt",
    [pytest.param((0,), marks=pytest.mark.matrix), (0, 1)],
    ids=["parameters", "parameters and times"],
)
def test_gradients_with_save_times_traced_per_sample(wrt):
    grads = jax.jit(jax.grad(_batched_sum, argnums=wrt))(A, jnp.asarray(TS))
    d_a, d_ts = _exact(A, TS, Y0)
    np.testing.assert_allclose(grads[0], d_a, rtol=1e-7)
    if len(wrt) == 2:
        np.testing.assert_allclose(grads[1], d_ts, rtol=1e-7, atol=1e-9)


# Many save times within each step: an emit under `vmap` writes a block of them, several
# blocks per step here (40 save times, 5 steps), with blocks that end part-way.
DENSE_TS = np.stack([np.sort(np.random.default_rng(i).uniform(0.0, 2.5, 40)) for i in range(3)])


def _dense_saved(a, ts, y0, adjoint=ode.RecursiveCheckpointAdjoint()):
    field = lambda t, y, args: -args * y
    sol = ode.diffeqsolve(
        ode.ODETerm(field), ode.Tsit5(), ts[0], ts[-1], 0.5, y0, args=a,
        saveat=ode.SaveAt(ts=ts), stepsize_controller=ode.ConstantStepSize(), adjoint=adjoint,
    )  # fmt: skip
    return sol.ys


@pytest.mark.parametrize(
    "order",
    # 13 s each; the suite checks these orders against per-sample solves below.
    [pytest.param(order, marks=pytest.mark.matrix) for order in ("grad(vmap)", "vmap(grad)")],
)
def test_many_save_times_per_step_under_vmap(order):
    ts, y0 = jnp.asarray(DENSE_TS), jnp.asarray(Y0)
    ys = jax.jit(jax.vmap(_dense_saved, in_axes=(None, 0, 0)))(A, ts, y0)
    exact = Y0[:, None] * np.exp(-A * (DENSE_TS - DENSE_TS[:, :1]))
    # Tsit5's interpolant on steps of 0.5: fourth order in the step.
    np.testing.assert_allclose(ys, exact, rtol=2e-5)
    one = lambda a, ts, y0: jnp.sum(_dense_saved(a, ts, y0))
    if order == "grad(vmap)":
        total = lambda a, ts: jnp.sum(jax.vmap(one, in_axes=(None, 0, 0))(a, ts, y0))
        d_a, d_ts = jax.jit(jax.grad(total, argnums=(0, 1)))(A, ts)
    else:
        d_a, d_ts = jax.jit(jax.vmap(jax.grad(one, argnums=(0, 1)), in_axes=(None, 0, 0)))(
            A, ts, y0
        )
        d_a = jnp.sum(d_a)
    # Against the closed form, to the discretisation's accuracy (the time derivative of
    # the interpolant is an order less accurate than its value).
    exact_a, exact_ts = _exact(A, DENSE_TS, Y0)
    np.testing.assert_allclose(d_a, exact_a, rtol=1e-4)
    np.testing.assert_allclose(d_ts, exact_ts, rtol=1e-3, atol=1e-5)
    # The same solves one by one (one save time per emit) give the same gradients.
    for i in range(len(Y0)):
        g = jax.grad(one, argnums=(0, 1))(A, ts[i], y0[i])
        np.testing.assert_allclose(d_ts[i], g[1], rtol=1e-9, atol=1e-12)


ORDERS = ["vmap(grad) batched", "vmap(vmap(grad))", "jacrev(vmap)", "jit(jvp(vmap))"]


@pytest.mark.parametrize(
    "order",
    # The commonest order in the suite; forward mode (also in the composition suite), the
    # nested batch and the Jacobian with -m matrix.
    [o if o == "vmap(grad) batched" else pytest.param(o, marks=pytest.mark.matrix) for o in ORDERS],
)
def test_many_save_times_per_step_in_every_order(order):
    """The blocks of save times in the other orders users write, against each sample's
    gradient from its own unbatched solve (one save time per emit)."""
    ts, y0 = jnp.asarray(DENSE_TS), jnp.asarray(Y0)
    one = lambda a, ts, y0: jnp.sum(_dense_saved(a, ts, y0))
    d_one = jax.jit(jax.grad(one))
    a_batch = jnp.asarray([0.4, 0.7, 1.1])
    if order == "vmap(grad) batched":
        got = jax.jit(jax.vmap(jax.grad(one)))(a_batch, ts, y0)
        want = [d_one(a_batch[i], ts[i], y0[i]) for i in range(3)]
    elif order == "vmap(vmap(grad))":
        inner = jax.vmap(jax.grad(one), in_axes=(None, 0, 0))
        got = jax.jit(jax.vmap(inner, in_axes=(0, None, None)))(a_batch[:2], ts, y0)
        want = [[d_one(a_batch[j], ts[i], y0[i]) for i in range(3)] for j in range(2)]
    elif order == "jacrev(vmap)":
        got = jax.jit(jax.jacrev(lambda a: jax.vmap(one, in_axes=(None, 0, 0))(a, ts, y0)))(A)
        want = [d_one(A, ts[i], y0[i]) for i in range(3)]
    else:  # forward mode, as Diffrax: the default adjoint is reverse-mode only
        forward = lambda a, ts, y0: jnp.sum(_dense_saved(a, ts, y0, ode.ForwardMode()))
        batched = lambda a: jax.vmap(forward, in_axes=(None, 0, 0))(a, ts, y0)
        got = jax.jit(lambda a: jax.jvp(batched, (a,), (jnp.ones_like(a),))[1])(jnp.asarray(A))
        want = [d_one(A, ts[i], y0[i]) for i in range(3)]
    np.testing.assert_allclose(got, np.asarray(want), rtol=1e-9)
