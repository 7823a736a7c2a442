"""`batch_size`: how many samples the `vmap`s around a solve run together, in every
order users write the transformations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

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


# A solve under `vmap` is batched whatever input the `vmap` reaches: with a batched input
# the probe missed, the loop ran as one sample's under JAX's own batching rule, which
# selects every buffer of every sample on every iteration (a value the field closed over:
# 160 times Diffrax's time; a neural CDE's per-sample data: 40 times).
_X = jnp.array([0.5, 1.0, 2.0])
_TS = jnp.array([[0.0, 0.3, 1.0], [0.0, 0.5, 1.0], [0.0, 0.7, 1.0]])


def _solve(w, x, batched: str):
    import odesolve as ode

    rate = x if batched in ("closure", "control") else 1.0
    field = lambda t, y, a: -rate * jnp.tanh(a * y)
    term = ode.ODETerm(field)
    if batched == "control":
        control = ode.LinearInterpolation(ts=jnp.array([0.0, 1.0]), ys=jnp.stack([0.0, x])[:, None])
        term = ode.ControlTerm(lambda t, y, a: -jnp.tanh(a * y)[:, None], control).to_ode()
    # Per-sample save times: each sample picks its row of `_TS` by its x.
    ts = _TS[(_X == x).argmax()] if batched == "save times" else jnp.array([0.0, 0.5, 1.0])
    step_ts = jnp.stack([0.2 * x, 0.9]) if batched == "step_ts" else None
    sol = ode.diffeqsolve(
        term, ode.Tsit5(), 0.0, 1.0, 0.1, jnp.ones(2), w,
        stepsize_controller=ode.PIDController(rtol=1e-8, atol=1e-8, step_ts=step_ts),
        saveat=ode.SaveAt(ts=ts),
    )  # fmt: skip
    return jnp.sum(sol.ys**2)


_KINDS = ["closure", "control", "save times", "step_ts"]


def _batch_seen(monkeypatch) -> list:
    """The batch sizes the default adjoint is told, one per solve traced."""
    import odesolve as ode

    seen: list = []
    choose = ode.RecursiveCheckpointAdjoint.choose_schedule

    def recording(self, loop, init, params=None, diff=None, batch_size=1):
        seen.append(batch_size)
        return choose(self, loop, init, params, diff, batch_size)

    monkeypatch.setattr(ode.RecursiveCheckpointAdjoint, "choose_schedule", recording)
    return seen


# Each sample's gradient in w, shared by the samples (`batched` is static).
_PER_SAMPLE = jax.jit(jax.vmap(jax.grad(_solve), in_axes=(None, 0, None)), static_argnums=2)


@pytest.mark.parametrize("batched", _KINDS)
def test_a_solve_is_batched_by_any_batched_input(batched, monkeypatch):
    seen = _batch_seen(monkeypatch)
    w = jnp.asarray(1.3)
    _PER_SAMPLE.trace(w, _X, batched)  # traced only
    assert seen == [3]


@pytest.mark.matrix
@pytest.mark.parametrize("batched", _KINDS)
def test_gradients_batched_by_any_input_are_each_samples(batched):
    w = jnp.asarray(1.3)
    got = _PER_SAMPLE(w, _X, batched)
    want = [jax.grad(_solve)(w, x, batched) for x in _X]
    np.testing.assert_allclose(got, want, rtol=1e-10)
