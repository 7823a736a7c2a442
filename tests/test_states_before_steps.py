"""States kept before steps only: `States` and `Revolve` store a carry without the last
step's interpolant (a step writes it afresh; only emits read it), and never store the
carry before an emit, which the reverse sweep recomputes from the state before the step
that precedes it, or from the initial carry for the emits before the first step.

Checked against forward mode through the plain loop (no reverse sweep at all), with few
slots so that states are thinned and recomputed, output at the start (emits before any
step), between steps, at every step, as dense output and at the end only (the last tick a
step), in each order users compose."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odesolve as ode

_Y0 = jnp.array([1.0, 0.5, -0.3])
_RATES = jnp.array([0.7, 1.3, 0.4])
_TS = jnp.array([0.0, 0.0, 0.3, 0.31, 1.1, 2.0])  # two emits before the first step


def _field(t, y, k):
    return jnp.stack([-k[0] * y[0] + y[1], k[1] * y[0] * y[2] - y[1], jnp.sin(k[2] * t) - y[2]])


def _outputs(rates, adjoint, saving: str):
    """The saved values (or dense output) of an adaptive Tsit5 solve."""
    saveat = {
        "ts": ode.SaveAt(ts=_TS),
        "steps": ode.SaveAt(t0=True, steps=True),
        "dense": ode.SaveAt(dense=True),
        "t1": ode.SaveAt(t1=True),  # no emits: the last tick is a step
    }[saving]
    sol = ode.diffeqsolve(
        ode.ODETerm(_field), ode.Tsit5(), 0.0, 2.0, 0.05, _Y0, rates,
        stepsize_controller=ode.PIDController(rtol=1e-8, atol=1e-8),
        saveat=saveat, adjoint=adjoint, max_steps=256,
    )  # fmt: skip
    if saving == "dense":
        return jax.vmap(sol.evaluate)(jnp.array([0.0, 0.45, 1.7, 2.0]))
    if saving == "steps":
        return jnp.where(jnp.isfinite(sol.ys), sol.ys, 0.0)
    return sol.ys


def _jacobian(saving: str):
    forward = lambda r: _outputs(r, ode.ForwardMode(), saving)
    return jax.jacfwd(forward)(_RATES)  # (outputs..., 3 rates)


_HEAVY = pytest.mark.matrix  # runs with -m matrix


@pytest.mark.parametrize(
    "saving, slots",
    [
        ("ts", 2),
        pytest.param("t1", 2, marks=_HEAVY),
        pytest.param("steps", 5, marks=_HEAVY),
        pytest.param("dense", 2, marks=_HEAVY),
        pytest.param("ts", 5, marks=_HEAVY),
        pytest.param("steps", 2, marks=_HEAVY),
        pytest.param("dense", 5, marks=_HEAVY),
    ],
)
def test_bare_states_give_forward_modes_gradient(saving, slots):
    adjoint = ode.RecursiveCheckpointAdjoint(schedule=ode.States(slots=slots))
    loss = lambda r: jnp.sum(_outputs(r, adjoint, saving) ** 2)
    values = _outputs(_RATES, ode.ForwardMode(), saving)
    want = jnp.einsum("...,...k->k", 2 * values, _jacobian(saving))
    np.testing.assert_allclose(jax.jit(jax.grad(loss))(_RATES), want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(
    "order", [pytest.param(o, marks=_HEAVY) for o in ("grad(vmap)", "vmap(grad)", "jacrev")]
)
def test_bare_states_in_every_order(order):
    adjoint = ode.RecursiveCheckpointAdjoint(schedule=ode.States(slots=3))
    outputs = lambda r: _outputs(r, adjoint, "ts")
    loss = lambda r: jnp.sum(outputs(r) ** 2)
    forward = lambda r: _outputs(r, ode.ForwardMode(), "ts")
    grad_forward = lambda r: jnp.einsum("...,...k->k", 2 * forward(r), jax.jacfwd(forward)(r))
    batch = _RATES * jnp.array([[1.0], [0.9], [1.2]])
    if order == "vmap(grad)":
        got = jax.jit(jax.vmap(jax.grad(loss)))(batch)
        want = jnp.stack([grad_forward(r) for r in batch])
    elif order == "grad(vmap)":
        scales = jnp.array([1.0, 2.0, 3.0])
        shared = lambda r: jnp.sum(jax.vmap(lambda s: loss(s * r))(scales))
        got = jax.jit(jax.grad(shared))(_RATES)
        want = sum(s * grad_forward(s * _RATES) for s in scales)
    else:
        got, want = jax.jit(jax.jacrev(outputs))(_RATES), jax.jacfwd(forward)(_RATES)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_revolve_keeps_states_before_steps():
    # Fixed steps and one output: the binomial schedule, with 2 slots for 40 steps.
    def end(rates, adjoint):
        sol = ode.diffeqsolve(
            ode.ODETerm(_field), ode.Tsit5(), 0.0, 2.0, 0.05, _Y0, rates,
            adjoint=adjoint, saveat=ode.SaveAt(t1=True),
        )  # fmt: skip
        return jnp.sum(sol.ys**2)

    adjoint = ode.RecursiveCheckpointAdjoint(schedule=ode.Revolve(checkpoints=2))
    got = jax.jit(jax.grad(lambda r: end(r, adjoint)))(_RATES)
    want = jax.jacfwd(lambda r: end(r, ode.ForwardMode()))(_RATES)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
