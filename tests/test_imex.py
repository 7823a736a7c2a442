"""IMEX solvers (`KenCarp3/4/5`, `Sil3`) on `MultiTerm(ODETerm(explicit), ODETerm(implicit))`:
Diffrax's values on fixed steps, the published orders against a closed form, error
control against scipy, gradients against finite differences."""

import dataclasses

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate
import scipy.linalg

import odesolve as ode
from odesolve._solver._additive import AbstractAdditiveRungeKutta

# (solver class name, order)
IMEX = [("KenCarp3", 3), ("KenCarp4", 4), ("KenCarp5", 5), ("Sil3", 2)]
FAST = ["KenCarp4"]

# A linear problem y' = (A + B) y split into a non-stiff rotation A and a stiff
# relaxation B; exact solution expm((A + B) t) y0.
ROTATION = np.array([[0.0, 1.0], [-1.0, 0.0]])
RELAXATION = np.array([[-10.0, 0.0], [5.0, -2.0]])
Y0 = np.array([1.0, -0.5])


def _rotation(t, y, args):
    return jnp.asarray(ROTATION, y.dtype) @ y


def _relaxation(t, y, args):
    return jnp.asarray(RELAXATION, y.dtype) @ y


def _exact(t: float) -> np.ndarray:
    return scipy.linalg.expm((ROTATION + RELAXATION) * t) @ Y0


# A nonlinear one: a forced, non-stiff part and a stiff pull towards (1, 2) at rate lam.
def _forced(t, y, args):
    return 0.3 * jnp.sin(t) * y[::-1] + jnp.cos(t)


def _pull(t, y, lam):
    return -lam * (y - jnp.array([1.0, 2.0]))


def _both(t, y, lam, xp=jnp):
    target = xp.array([1.0, 2.0])
    return 0.3 * xp.sin(t) * y[::-1] + xp.cos(t) - lam * (y - target)


def _solver(name: str, module=ode):
    return getattr(module, name)()


def _diffrax_values(name: str, lam: float, ts) -> np.ndarray:
    # Diffrax needs Newton tolerances on fixed steps; the stiff part is linear, so one
    # chord iteration with its exact Jacobian solves each stage to rounding anyway.
    solver = getattr(diffrax, name)(root_finder=diffrax.VeryChord(rtol=1e-3, atol=1e-6))
    terms = diffrax.MultiTerm(diffrax.ODETerm(_forced), diffrax.ODETerm(_pull))
    with jax.numpy_dtype_promotion("standard"):
        sol = diffrax.diffeqsolve(
            terms, solver, 0.0, 1.0, 0.05, jnp.asarray(Y0), lam, saveat=diffrax.SaveAt(ts=ts)
        )
    return np.asarray(sol.ys)


def _check_agrees_with_diffrax(name: str) -> None:
    ts = jnp.linspace(0.0, 1.0, 7)  # between step ends too: the dense output
    terms = ode.MultiTerm(ode.ODETerm(_forced), ode.ODETerm(_pull))
    ours = ode.diffeqsolve(
        terms, _solver(name), 0.0, 1.0, 0.05, jnp.asarray(Y0), 50.0, saveat=ode.SaveAt(ts=ts)
    )
    np.testing.assert_allclose(ours.ys, _diffrax_values(name, 50.0, ts), rtol=0, atol=1e-14)


@pytest.mark.parametrize("name", FAST)
def test_fixed_steps_and_dense_output_are_diffrax_values(name):
    _check_agrees_with_diffrax(name)


@pytest.mark.matrix
@pytest.mark.parametrize("name", [n for n, _ in IMEX if n not in FAST])
def test_fixed_steps_and_dense_output_are_diffrax_values_every_method(name):
    _check_agrees_with_diffrax(name)


def _check_order(solver, order: int) -> None:
    terms = ode.MultiTerm(ode.ODETerm(_rotation), ode.ODETerm(_relaxation))
    # dt traced: one compilation for every step size.
    final = jax.jit(
        lambda dt: ode.diffeqsolve(terms, solver, 0.0, 1.0, dt, jnp.asarray(Y0)).ys[-1]
    )
    # Small enough steps that the stiff part (h |lambda| <= 0.6) shows the full order.
    dts = [2.0**-k for k in range(4, 9)]
    errors = [float(np.max(np.abs(np.asarray(final(dt)) - _exact(1.0)))) for dt in dts]
    slope = np.polyfit(np.log2(dts), np.log2(errors), 1)[0]
    assert order - 0.2 < slope < order + 0.5, (errors, slope)


@pytest.mark.parametrize("name, order", [("KenCarp4", 4)])
def test_convergence_order_against_the_closed_form(name, order):
    _check_order(_solver(name), order)


@pytest.mark.matrix
@pytest.mark.parametrize("name, order", [("KenCarp3", 3), ("KenCarp5", 5), ("Sil3", 2)])
def test_convergence_order_against_the_closed_form_every_method(name, order):
    _check_order(_solver(name), order)



def _embedded_method(name: str) -> AbstractAdditiveRungeKutta:
    """The method of a solver's embedded weights b - error (the solution its error
    estimate is measured against), with a linear dense output."""
    tableau = getattr(ode, name).tableau
    weights = tuple(b - e for b, e in zip(tableau.b_explicit, tableau.error_explicit))
    linear = tuple((w,) for w in weights)
    embedded = dataclasses.replace(
        tableau, b_explicit=weights, b_implicit=weights, error_explicit=None,
        error_implicit=None, interp_explicit=linear, interp_implicit=linear, error_order=None,
    )  # fmt: skip
    return type(f"{name}Embedded", (AbstractAdditiveRungeKutta,), {"tableau": embedded})()


# The error estimate's embedded method: its order, in the explicit part, the implicit part
# and their coupling (the rotation and the relaxation do not commute), and its stability
# function zero at infinity, so a stiff component at equilibrium adds nothing to it.
@pytest.mark.parametrize("name, order", [("KenCarp4", 2), ("KenCarp5", 3)])
def test_the_error_estimate_is_against_a_method_of_its_order(name, order):
    _check_order(_embedded_method(name), order)


@pytest.mark.parametrize("name", ["KenCarp4", "KenCarp5"])
def test_the_error_estimate_is_against_an_l_stable_method(name):
    stiff = ode.ODETerm(lambda t, y, args: -1e9 * y)
    terms = ode.MultiTerm(ode.ODETerm(lambda t, y, args: 0.0 * y), stiff)
    y0 = jnp.array([1.0])
    y1 = ode.diffeqsolve(terms, _embedded_method(name), 0.0, 1.0, 1.0, y0).ys[-1]
    assert abs(float(y1[0])) < 1e-6

def _scipy_reference(lam: float, t1: float) -> np.ndarray:
    sol = scipy.integrate.solve_ivp(
        lambda t, y: _both(t, y, lam, np), (0.0, t1), Y0, "Radau", rtol=1e-13, atol=1e-13
    )
    return sol.y[:, -1]


@pytest.mark.parametrize("name", FAST)
def test_error_control_meets_the_tolerance_on_a_stiff_problem(name):
    lam, t1 = 1e4, 2.0
    terms = ode.MultiTerm(ode.ODETerm(_forced), ode.ODETerm(_pull))
    controller = ode.PIDController(rtol=1e-7, atol=1e-7)
    sol = ode.diffeqsolve(
        terms, _solver(name), 0.0, t1, None, jnp.asarray(Y0), lam,
        stepsize_controller=controller, max_steps=20_000,
    )  # fmt: skip
    np.testing.assert_allclose(sol.ys[-1], _scipy_reference(lam, t1), rtol=0, atol=1e-5)
    # Stiffness does not hold the step: an explicit method needs a step below 2.8 / lam
    # (Tsit5's stability limit), over 7,000 steps here.
    assert int(sol.stats["num_steps"]) < 2_000


def _loss(name: str, lam, adjoint=ode.RecursiveCheckpointAdjoint()):
    # Fixed steps: a central difference needs one step sequence on both sides.
    terms = ode.MultiTerm(ode.ODETerm(_forced), ode.ODETerm(_pull))
    sol = ode.diffeqsolve(
        terms, _solver(name), 0.0, 1.0, 0.05, jnp.asarray(Y0), lam, adjoint=adjoint
    )
    return jnp.sum(sol.ys[-1] ** 2)


def _check_gradient(name: str) -> None:
    lam, eps = 20.0, 1e-5
    grad = jax.grad(lambda k: _loss(name, k))(lam)
    loss = jax.jit(lambda k: _loss(name, k))  # one compilation for both differences
    fd = (loss(lam + eps) - loss(lam - eps)) / (2 * eps)
    np.testing.assert_allclose(grad, fd, rtol=1e-6)


@pytest.mark.parametrize("name", ["Sil3"])
def test_gradient_under_the_default_adjoint_matches_finite_differences(name):
    _check_gradient(name)


@pytest.mark.matrix
@pytest.mark.parametrize("name", ["KenCarp3", "KenCarp4", "KenCarp5"])
def test_gradient_matches_finite_differences_every_method(name):
    _check_gradient(name)


@pytest.mark.matrix
@pytest.mark.parametrize("adjoint", [ode.DirectAdjoint(), ode.ForwardMode()], ids=str)
def test_every_adjoint_gives_the_same_gradient(adjoint):
    reverse = jax.grad(lambda k: _loss("KenCarp4", k))(20.0)
    differentiate = jax.jacfwd if isinstance(adjoint, ode.ForwardMode) else jax.grad
    other = differentiate(lambda k: _loss("KenCarp4", k, adjoint))(20.0)
    np.testing.assert_allclose(other, reverse, rtol=1e-10)


@pytest.mark.matrix
@pytest.mark.parametrize("name", [n for n, _ in IMEX])
def test_a_complex_state_is_solved_as_its_real_and_imaginary_parts(name):
    terms = ode.MultiTerm(ode.ODETerm(_rotation), ode.ODETerm(_relaxation))
    z0 = jnp.asarray(Y0 * (1.0 + 2.0j))
    with pytest.warns(ode.ComplexStateWarning):
        sol = ode.diffeqsolve(terms, _solver(name), 0.0, 1.0, 2.0**-6, z0)
    real = ode.diffeqsolve(terms, _solver(name), 0.0, 1.0, 2.0**-6, jnp.asarray(Y0))
    np.testing.assert_allclose(sol.ys, np.asarray(real.ys) * (1.0 + 2.0j), rtol=1e-12)


def test_a_part_given_as_a_number_stands_for_it_in_every_component():
    # Diffrax's Robertson test passes MultiTerm(ODETerm(lambda t, y, args: 0), stiff).
    zero = ode.ODETerm(lambda t, y, args: 0)
    whole = ode.ODETerm(_relaxation)
    solve = lambda terms: ode.diffeqsolve(terms, ode.KenCarp4(), 0.0, 1.0, 0.1, jnp.asarray(Y0))
    ours = solve(ode.MultiTerm(zero, whole)).ys
    zeros = ode.ODETerm(lambda t, y, args: jnp.zeros_like(y))
    np.testing.assert_array_equal(ours, solve(ode.MultiTerm(zeros, whole)).ys)


def test_the_terms_an_imex_solver_takes_are_named_as_diffrax_names_them():
    pair = ode.MultiTerm[tuple[ode.AbstractTerm, ode.AbstractTerm]]
    assert all(_solver(name).term_structure == pair for name, _ in IMEX)
    assert isinstance(ode.KenCarp4(), ode.AbstractImplicitSolver)
    assert isinstance(ode.KenCarp4(), ode.AbstractAdaptiveSolver)
    with pytest.raises(ValueError, match=r"MultiTerm\(ODETerm\(explicit\), ODETerm\(implicit\)\)"):
        ode.diffeqsolve(ode.ODETerm(_rotation), ode.KenCarp4(), 0.0, 1.0, 0.1, jnp.asarray(Y0))
    with pytest.raises(ode.UnsupportedCombination, match="BacksolveAdjoint"):
        jax.grad(lambda k: _loss("KenCarp4", k, ode.BacksolveAdjoint()))(20.0)
