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


@pytest.mark.parametrize("wrt", [(0,), (0, 1)], ids=["parameters", "parameters and times"])
def test_gradients_with_save_times_traced_per_sample(wrt):
    grads = jax.jit(jax.grad(_batched_sum, argnums=wrt))(A, jnp.asarray(TS))
    d_a, d_ts = _exact(A, TS, Y0)
    np.testing.assert_allclose(grads[0], d_a, rtol=1e-7)
    if len(wrt) == 2:
        np.testing.assert_allclose(grads[1], d_ts, rtol=1e-7, atol=1e-9)
