"""Resuming a solve from the state another saved (Diffrax's way of splitting a long
solve): the split solve is the unsplit one, its derivatives too, and agrees with
Diffrax's split solve."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odesolve as ode


def _forced_oscillator(t, y, k):
    return jnp.stack([y[1], -k * y[0] - 0.1 * y[1] + jnp.sin(t)])


_Y0 = jnp.array([1.0, 0.0])


def _split(lib, controller, k, adjoint=None, solver=None, dt0=0.1, first_adjoint=None):
    """y(2) solved as [0, 1] then [1, 2], the second part resumed from the first."""
    solver = lib.Tsit5() if solver is None else solver
    more = {} if adjoint is None else dict(adjoint=adjoint)
    first_adjoint = adjoint if first_adjoint is None else first_adjoint
    first_more = {} if first_adjoint is None else dict(adjoint=first_adjoint)
    saveat = lib.SaveAt(t1=True, solver_state=True, controller_state=True, made_jump=True)
    term = lib.ODETerm(_forced_oscillator)
    first = lib.diffeqsolve(
        term, solver, 0.0, 1.0, dt0, _Y0, k, stepsize_controller=controller, saveat=saveat,
        **first_more,
    )  # fmt: skip
    second = lib.diffeqsolve(
        term, solver, 1.0, 2.0, dt0, first.ys[-1], k, stepsize_controller=controller,
        solver_state=first.solver_state, controller_state=first.controller_state,
        made_jump=first.made_jump, **more,
    )  # fmt: skip
    return second.ys[-1], first.stats["num_steps"] + second.stats["num_steps"]


def _whole(k, adjoint):
    sol = ode.diffeqsolve(
        ode.ODETerm(_forced_oscillator), ode.Tsit5(), 0.0, 2.0, 0.1, _Y0, k, adjoint=adjoint
    )
    return sol.ys[-1]


@pytest.mark.parametrize(
    "adjoint",
    [
        pytest.param(ode.RecursiveCheckpointAdjoint(), id="recursive"),
        pytest.param(ode.DirectAdjoint(), id="direct", marks=pytest.mark.matrix),
    ],
)
def test_a_split_fixed_step_solve_is_the_whole_one_with_its_gradient(adjoint):
    k = jnp.asarray(2.0)
    split = lambda k: _split(ode, ode.ConstantStepSize(), k, adjoint)[0][0]
    whole = lambda k: _whole(k, adjoint)[0]
    (value, grad), (value_whole, grad_whole) = (jax.value_and_grad(f)(k) for f in (split, whole))
    np.testing.assert_allclose(value, value_whole, rtol=1e-14)
    np.testing.assert_allclose(grad, grad_whole, rtol=1e-12)


def test_a_split_solve_under_forward_mode():
    k = jnp.asarray(2.0)
    split = lambda k: _split(ode, ode.ConstantStepSize(), k, ode.ForwardMode())[0][0]
    whole = lambda k: _whole(k, ode.ForwardMode())[0]
    tangents = [jax.jvp(f, (k,), (jnp.ones(()),))[1] for f in (split, whole)]
    np.testing.assert_allclose(tangents[0], tangents[1], rtol=1e-12)


@pytest.mark.matrix
def test_a_split_solve_under_backsolve():
    k = jnp.asarray(2.0)
    # The continuous adjoint carries the dependence on the first part through y alone:
    # the passed states are inputs without a derivative, and its gradient is the whole
    # solve's to the accuracy of its backward solve. (It refuses to save the states, so
    # the first part runs under the default adjoint.)
    back, first = ode.BacksolveAdjoint(), ode.RecursiveCheckpointAdjoint()
    resumed = lambda k: _split(ode, ode.ConstantStepSize(), k, back, first_adjoint=first)[0][0]
    grad = jax.grad(resumed)(k)
    exact = jax.grad(lambda k: _whole(k, ode.RecursiveCheckpointAdjoint())[0])(k)
    np.testing.assert_allclose(grad, exact, rtol=1e-4)


@pytest.mark.parametrize(
    "pid",
    [
        pytest.param(dict(), id="I"),
        pytest.param(dict(pcoeff=0.3, icoeff=0.4, dcoeff=0.1), id="PID", marks=pytest.mark.matrix),
    ],
)
def test_a_split_adaptive_solve_agrees_with_diffrax(pid):
    k = jnp.asarray(2.0)
    ours = _split(ode, ode.PIDController(rtol=1e-6, atol=1e-8, **pid), k)
    theirs = _split(diffrax, diffrax.PIDController(rtol=1e-6, atol=1e-8, **pid), k)
    np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-12, atol=1e-12)
    assert int(ours[1]) == int(theirs[1])


def test_a_resumed_solve_carries_the_solver_state_on():
    # ReversibleHeun's state is a second solution: starting afresh from y alone would
    # give another solution than carrying it on.
    k = jnp.asarray(2.0)
    solver = ode.ReversibleHeun()
    split, _ = _split(ode, ode.ConstantStepSize(), k, solver=solver)
    whole = ode.diffeqsolve(
        ode.ODETerm(_forced_oscillator), solver, 0.0, 2.0, 0.1, _Y0, k
    ).ys[-1]
    np.testing.assert_allclose(split, whole, rtol=1e-14, atol=1e-14)
    afresh = ode.diffeqsolve(
        ode.ODETerm(_forced_oscillator), solver, 1.0, 2.0, 0.1,
        ode.diffeqsolve(ode.ODETerm(_forced_oscillator), solver, 0.0, 1.0, 0.1, _Y0, k).ys[-1], k,
    ).ys[-1]  # fmt: skip
    assert not np.allclose(afresh, whole, rtol=1e-12, atol=0)


@pytest.mark.matrix
def test_a_split_reversible_solve_differentiates_as_the_whole_one():
    k, solver, adjoint = jnp.asarray(2.0), ode.ReversibleHeun(), ode.ReversibleAdjoint()
    split = lambda k: _split(ode, ode.ConstantStepSize(), k, adjoint, solver=solver)[0][0]
    whole = lambda k: ode.diffeqsolve(
        ode.ODETerm(_forced_oscillator), solver, 0.0, 2.0, 0.1, _Y0, k, adjoint=adjoint
    ).ys[-1][0]
    np.testing.assert_allclose(jax.grad(split)(k), jax.grad(whole)(k), rtol=1e-12)
