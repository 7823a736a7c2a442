"""`batch_size`: how many samples the `vmap`s around a solve run together, in every
order users write the transformations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import record_schedule_choices

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


def _solve(w, x, batched: str, adjoint=None):
    import odesolve as ode

    adjoint = adjoint or ode.RecursiveCheckpointAdjoint()
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
        saveat=ode.SaveAt(ts=ts), adjoint=adjoint,
    )  # fmt: skip
    return jnp.sum(sol.ys**2)


_KINDS = ["closure", "control", "save times", "step_ts"]


# Each sample's gradient in w, shared by the samples (`batched` is static).
_PER_SAMPLE = jax.jit(jax.vmap(jax.grad(_solve), in_axes=(None, 0, None)), static_argnums=2)


@pytest.mark.parametrize("batched", _KINDS)
def test_a_solve_is_batched_by_any_batched_input(batched, monkeypatch):
    seen = record_schedule_choices(monkeypatch)
    w = jnp.asarray(1.3)
    _PER_SAMPLE.trace(w, _X, batched)  # traced only
    assert [c.batch_size for c in seen] == [3]


@pytest.mark.matrix
@pytest.mark.parametrize("batched", _KINDS)
def test_gradients_batched_by_any_input_are_each_samples(batched):
    w = jnp.asarray(1.3)
    got = _PER_SAMPLE(w, _X, batched)
    want = [jax.grad(_solve)(w, x, batched) for x in _X]
    np.testing.assert_allclose(got, want, rtol=1e-10)


@pytest.mark.matrix
@pytest.mark.parametrize(
    "order",
    ["grad(vmap)", "vmap(grad) batched", "vmap(vmap(grad))", "jacrev", "jit(jvp)"],
)
def test_a_field_closing_over_the_batch_differentiates_in_every_order(order, monkeypatch):
    # The batched input is only a value the field closed over; each order's gradients
    # against one sample's gradient at a time, and the batch the adjoint was told.
    import odesolve as ode

    seen = record_schedule_choices(monkeypatch)
    one = lambda w, x: jax.grad(_solve)(w, x, "closure")
    ws = jnp.array([1.3, 0.7, 1.1])
    if order == "grad(vmap)":
        total = lambda w: jnp.sum(jax.vmap(lambda x: _solve(w, x, "closure"))(_X))
        got, want = jax.jit(jax.grad(total))(ws[0]), sum(one(ws[0], x) for x in _X)
    elif order == "vmap(grad) batched":
        got = jax.jit(jax.vmap(jax.grad(lambda w, x: _solve(w, x, "closure"))))(ws, _X)
        want = jnp.stack([one(w, x) for w, x in zip(ws, _X)])
    elif order == "vmap(vmap(grad))":
        grid = jnp.stack([_X, 1.5 * _X])
        inner = jax.vmap(jax.grad(lambda w, x: _solve(w, x, "closure")), in_axes=(None, 0))
        got = jax.jit(jax.vmap(inner, in_axes=(None, 0)))(ws[0], grid)
        want = jnp.stack([jnp.stack([one(ws[0], x) for x in row]) for row in grid])
    elif order == "jacrev":
        per_sample = lambda w: jax.vmap(lambda x: _solve(w, x, "closure"))(_X)
        got = jax.jit(jax.jacrev(per_sample))(ws[0])
        want = jnp.stack([one(ws[0], x) for x in _X])
    else:  # forward mode: the adjoint that differentiates by jvp
        forward = ode.ForwardMode()
        per_sample = lambda w: jax.vmap(lambda x: _solve(w, x, "closure", forward))(_X)
        got = jax.jit(lambda w: jax.jvp(per_sample, (w,), (jnp.ones_like(w),))[1])(ws[0])
        want = jnp.stack([one(ws[0], x) for x in _X])
    np.testing.assert_allclose(got, want, rtol=1e-9)
    expected = {"vmap(vmap(grad))": 6, "jit(jvp)": None}.get(order, 3)
    if expected is not None:  # the reverse-mode adjoint was told the whole batch
        assert seen[0].batch_size == expected, seen
