"""Derivatives with respect to every time input, over (time input x solver x adjoint).

Each time input is a function `theta -> scalar loss` placing one time at theta: the start,
the end, the first step, a declared discontinuity (`jump_ts`) or step time (`step_ts`) of
a field that switches there, a point of a `StepTo` grid, a save time, and the level of an
event that ends the solve. Each derivative is checked against central differences of our
own solves (up to their truncation error) and against forward mode through the plain loop,
which differentiates the same discretisation and shares no code with a reverse sweep.

The suite runs each input but two (the start and `step_ts`, which differentiate as the end
and `jump_ts` do) with one explicit solver, the default adjoint and forward mode;
`pytest -m matrix` runs those two and the whole product.
"""

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odesolve as ode

THETA = 0.5
Y0 = (1.0, 0.0)  # (y, integral of y)


def _smooth(s, y, args):
    return (-y[0] + jnp.sin(3 * s), y[0])


def _switching_at(t):
    return lambda s, y, args: (-y[0] + jnp.where(s < t, 0.0, 1.0), y[0])


def _pid(**kwargs):
    return ode.PIDController(rtol=1e-10, atol=1e-10, **kwargs)


def _solve(solver, adjoint, field, t0=0.0, t1=1.0, dt0=None, **kwargs):
    kwargs.setdefault("stepsize_controller", _pid())
    return ode.diffeqsolve(
        ode.ODETerm(field), solver, t0, t1, dt0, Y0, adjoint=adjoint, max_steps=4096, **kwargs
    )


def _final(sol):
    return sol.ys[0][-1] + sol.ys[1][-1]


def _t0(theta, solver, adjoint):
    return _final(_solve(solver, adjoint, _smooth, t0=theta - 0.4))


def _t1(theta, solver, adjoint):
    return _final(_solve(solver, adjoint, _smooth, t1=theta + 0.5))


def _dt0(theta, solver, adjoint):
    # The grid scales with the first step (the controller's factors are frozen), so the
    # derivative is of the size of the solver's error.
    return _final(_solve(solver, adjoint, _smooth, dt0=0.02 * theta))


def _jump_ts(theta, solver, adjoint):
    controller = _pid(jump_ts=jnp.asarray(theta)[None])
    return _final(_solve(solver, adjoint, _switching_at(theta), stepsize_controller=controller))


def _step_ts(theta, solver, adjoint):
    controller = _pid(step_ts=jnp.asarray(theta)[None])
    return _final(_solve(solver, adjoint, _switching_at(theta), stepsize_controller=controller))


def _step_to(theta, solver, adjoint):
    ts = jnp.concatenate([jnp.linspace(0.0, 0.4, 21), jnp.array([theta]), jnp.linspace(0.6, 1, 21)])
    return _final(_solve(solver, adjoint, _smooth, stepsize_controller=ode.StepTo(ts)))


def _save_ts(theta, solver, adjoint):
    saveat = ode.SaveAt(ts=jnp.stack([0.25, theta, 0.75]))
    sol = _solve(solver, adjoint, _smooth, saveat=saveat)
    return jnp.sum(sol.ys[0]) + jnp.sum(sol.ys[1])


def _event(theta, solver, adjoint):
    # The solve ends where y = theta: d(end time)/d(theta) flows through the root.
    event = ode.Event(lambda t, y, args, **kw: y[0] - theta)
    sol = _solve(solver, adjoint, lambda s, y, a: (-y[0], y[0]), t1=5.0, event=event)
    return sol.ts[-1] + sol.ys[1][-1]


@dataclass(frozen=True)
class TimeInput:
    loss: Callable
    tolerance: float  # against central differences: their truncation error and noise
    exact: float | None = None


TIME_INPUTS = {
    "t0": TimeInput(_t0, 1e-6),
    "t1": TimeInput(_t1, 1e-6),
    "dt0": TimeInput(_dt0, 1e-6),
    # d/dt of y(1) + S(1) for a forcing switched on at t: -e^(t-1) - (1 - e^(t-1)).
    "jump_ts": TimeInput(_jump_ts, 1e-6, exact=-1.0),
    "step_ts": TimeInput(_step_ts, 1e-5, exact=-1.0),
    "StepTo": TimeInput(_step_to, 1e-6),
    "SaveAt_ts": TimeInput(_save_ts, 1e-6),
    "event": TimeInput(_event, 1e-6, exact=-1 / THETA - 1),
}

SOLVERS = {
    "Tsit5": ode.Tsit5(),
    "Dopri5": ode.Dopri5(),
    "Bosh3": ode.Bosh3(),
    "Kvaerno5": ode.Kvaerno5(),
}

ADJOINTS = {
    "default": ode.RecursiveCheckpointAdjoint(),
    "checkpoints=3": ode.RecursiveCheckpointAdjoint(checkpoints=3),
    "direct": ode.DirectAdjoint(),
    "forward": ode.ForwardMode(),
}


def _derivative(time_input: str, solver: str, adjoint: str) -> float:
    loss = functools.partial(
        TIME_INPUTS[time_input].loss, solver=SOLVERS[solver], adjoint=ADJOINTS[adjoint]
    )
    differentiate = jax.jacfwd if adjoint == "forward" else jax.grad
    return float(jax.jit(differentiate(loss))(THETA))


@functools.cache
def _central(time_input: str, solver: str) -> float:
    loss = jax.jit(
        functools.partial(
            TIME_INPUTS[time_input].loss, solver=SOLVERS[solver], adjoint=ode.ForwardMode()
        )
    )
    h = 1e-4
    return float((loss(THETA + h) - loss(THETA - h)) / (2 * h))


@functools.cache
def _forward(time_input: str, solver: str) -> float:
    return _derivative(time_input, solver, "forward")


def _check(time_input: str, solver: str, adjoints=tuple(ADJOINTS)) -> None:
    """Each adjoint's derivative against central differences (and the exact value where
    known), and the reverse ones against forward mode."""
    spec = TIME_INPUTS[time_input]
    central = _central(time_input, solver)
    scale = max(abs(central), 1.0)
    forward = _forward(time_input, solver)
    for adjoint in adjoints:
        derivative = forward if adjoint == "forward" else _derivative(time_input, solver, adjoint)
        where = (time_input, solver, adjoint, derivative)
        assert abs(derivative - central) <= spec.tolerance * scale, (*where, central)
        if spec.exact is not None:
            assert abs(derivative - spec.exact) <= 1e-5 * abs(spec.exact), (*where, spec.exact)
        # The same discretisation's derivative: equal up to rounding.
        assert abs(derivative - forward) <= 1e-9 * scale, (*where, forward)


# Each time input with one explicit solver (each of them with two or three inputs), the
# default adjoint and forward mode; the implicit solver, the other adjoints and
# everything else with `-m matrix`.
_EXPLICIT = [name for name in SOLVERS if name != "Kvaerno5"]
_COVERING = [(name, _EXPLICIT[i % len(_EXPLICIT)]) for i, name in enumerate(TIME_INPUTS)]
_ALL = list(itertools.product(TIME_INPUTS, SOLVERS))


# The start and the step_ts cases differentiate as the end and the jump_ts ones do (a
# time of the solve's grid), and an event's time has its analytic derivative checked in
# test_events.py: with `-m matrix`.
_SHARED_PATHS = {"t0", "step_ts", "event"}


@pytest.mark.parametrize(
    "time_input, solver",
    [
        pytest.param(name, solver, marks=pytest.mark.matrix)
        if name in _SHARED_PATHS
        else (name, solver)
        for name, solver in _COVERING
    ],
    ids=str,
)
def test_time_derivative(time_input, solver):
    # DirectAdjoint (JAX differentiating the loop itself) in the full table.
    _check(time_input, solver, ("default", "forward"))


@pytest.mark.matrix
@pytest.mark.parametrize("time_input, solver", _ALL, ids=str)
def test_time_derivative_full_table(time_input, solver):
    _check(time_input, solver)


@pytest.mark.parametrize("time_input", [n for n in TIME_INPUTS if n != "dt0"])
def test_backsolve_refuses_time_derivatives(time_input):
    # The continuous adjoint has no derivative for times: a clear error, never a zero.
    loss = functools.partial(
        TIME_INPUTS[time_input].loss, solver=ode.Tsit5(), adjoint=ode.BacksolveAdjoint()
    )
    with pytest.raises(ValueError, match="BacksolveAdjoint"):
        jax.grad(loss)(THETA)


def test_backsolve_steps_back_through_a_step_to_grid():
    def loss(y0, ts, adjoint):
        field = lambda s, y, args: -y + jnp.sin(3 * s)
        controller = ode.StepTo(ts)
        sol = ode.diffeqsolve(
            ode.ODETerm(field), ode.Tsit5(), 0.0, 1.0, None, y0,
            stepsize_controller=controller, adjoint=adjoint,
        )  # fmt: skip
        return sol.ys[-1, 0]

    y0, ts = jnp.array([1.0]), jnp.linspace(0.0, 1.0, 41)
    backsolve = jax.jit(jax.grad(loss), static_argnums=2)(y0, ts, ode.BacksolveAdjoint())
    direct = jax.grad(loss)(y0, ts, ode.DirectAdjoint())
    np.testing.assert_allclose(backsolve, direct, rtol=1e-6)


@pytest.mark.parametrize(
    "time_input", [pytest.param(name, marks=pytest.mark.matrix) for name in ("jump_ts", "event")]
)
def test_per_sample_time_derivatives(time_input):
    # One time per sample: vmap(grad) gives each sample's own derivative, grad(vmap) the
    # same (the loss is a sum over samples), both equal to forward mode one at a time.
    thetas = jnp.array([0.45, 0.5, 0.55])
    loss = functools.partial(
        TIME_INPUTS[time_input].loss, solver=ode.Tsit5(), adjoint=ode.RecursiveCheckpointAdjoint()
    )
    per_sample = jax.jit(jax.vmap(jax.grad(loss)))(thetas)
    of_sum = jax.jit(jax.grad(lambda th: jnp.sum(jax.vmap(loss)(th))))(thetas)
    forward = functools.partial(
        TIME_INPUTS[time_input].loss, solver=ode.Tsit5(), adjoint=ode.ForwardMode()
    )
    reference = np.array([jax.jacfwd(forward)(t) for t in thetas])
    np.testing.assert_allclose(per_sample, reference, rtol=1e-12)
    np.testing.assert_allclose(of_sum, reference, rtol=1e-12)


@pytest.mark.parametrize(
    "time_input", [pytest.param(name, marks=pytest.mark.matrix) for name in ("step_ts", "StepTo")]
)
def test_time_derivatives_in_other_transformation_orders(time_input):
    # jacrev over a batch, nested vmap of grad, and jit(jvp) (forward mode through
    # DirectAdjoint), each against forward mode one sample at a time. (A StepTo point's
    # derivative is of the size of the truncation error: compared to 1e-13 absolute.)
    thetas = jnp.array([0.45, 0.5, 0.55])
    loss_of = lambda adjoint: functools.partial(
        TIME_INPUTS[time_input].loss, solver=ode.Tsit5(), adjoint=adjoint
    )
    loss, forward = loss_of(ode.RecursiveCheckpointAdjoint()), loss_of(ode.ForwardMode())
    reference = np.array([jax.jacfwd(forward)(t) for t in thetas])
    jacobian = jax.jit(jax.jacrev(jax.vmap(loss)))(thetas)
    np.testing.assert_allclose(jacobian, np.diag(reference), rtol=1e-12, atol=1e-13)
    nested = jax.jit(jax.vmap(jax.vmap(jax.grad(loss))))(thetas.reshape(3, 1))
    np.testing.assert_allclose(nested.ravel(), reference, rtol=1e-12, atol=1e-13)
    direct = loss_of(ode.DirectAdjoint())
    tangents = [jax.jit(jax.jvp, static_argnums=0)(direct, (t,), (1.0,))[1] for t in thetas]
    np.testing.assert_allclose(tangents, reference, rtol=1e-10, atol=1e-13)
