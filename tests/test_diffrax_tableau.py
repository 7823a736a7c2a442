"""Diffrax's spelling of a Runge-Kutta method (`ButcherTableau(c, b_sol, b_error, a_lower,
...)`, `MultiButcherTableau`, `CalculateJacobian`, `interpolation_cls`) in a user's
subclass of `AbstractERK`, `AbstractESDIRK` or `AbstractRungeKutta` gives Diffrax's
values, dense output included."""

from typing import ClassVar

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odesolve as ode

TS = jnp.linspace(0.0, 2.0, 9)  # between step ends too: the dense output


def _rk4(lib):
    """Classical RK4 as a Diffrax user writes it, against library `lib`."""

    class RK4(lib.AbstractERK):
        tableau = lib.ButcherTableau(
            a_lower=(np.array([0.5]), np.array([0.0, 0.5]), np.array([0.0, 0.0, 1.0])),
            b_sol=np.array([1 / 6, 1 / 3, 1 / 3, 1 / 6]),
            b_error=np.zeros(4),
            c=np.array([0.5, 0.5, 1.0]),
        )
        interpolation_cls = lib.ThirdOrderHermitePolynomialInterpolation.from_k

        def order(self, terms):
            return 4

    return RK4()


def _field(t, y, args):
    return -y * jnp.cos(t) + jnp.sin(3 * t)


def _solve(lib, solver, terms=None, y0=(1.0, 2.0), **kwargs):
    terms = lib.ODETerm(_field) if terms is None else terms
    with jax.numpy_dtype_promotion("standard"):
        sol = lib.diffeqsolve(
            terms, solver, 0.0, 2.0, 0.1, jnp.array(y0), saveat=lib.SaveAt(ts=TS), **kwargs
        )
    return np.asarray(sol.ys)


def test_rk4_in_diffrax_spelling_gives_diffrax_values():
    np.testing.assert_allclose(
        _solve(ode, _rk4(ode)), _solve(diffrax, _rk4(diffrax)), rtol=0, atol=1e-13
    )


def _linear(t, y, args):
    return jnp.array([[-3.0, 1.0], [0.5, -2.0]], y.dtype) @ y


@pytest.mark.matrix
def test_an_esdirk_in_diffrax_spelling_gives_diffrax_values():
    # Kvaerno's 3(2) method as its arrays: the user's class, run by odesolve's engine.
    theirs = diffrax.Kvaerno3.tableau

    class MyKvaerno3(ode.AbstractESDIRK):
        tableau = ode.ButcherTableau(
            c=theirs.c,
            b_sol=theirs.b_sol,
            b_error=theirs.b_error,
            a_lower=theirs.a_lower,
            a_diagonal=theirs.a_diagonal,
            a_predictor=theirs.a_predictor,
        )
        calculate_jacobian = ode.CalculateJacobian.second_stage
        interpolation_cls = ode.ThirdOrderHermitePolynomialInterpolation.from_k

        def order(self, terms):
            return 3

    reference = diffrax.Kvaerno3(root_finder=diffrax.VeryChord(rtol=1e-3, atol=1e-6))
    # A linear field: one chord iteration solves each stage to rounding in both.
    ours = _solve(ode, MyKvaerno3(), ode.ODETerm(_linear))
    np.testing.assert_allclose(
        ours, _solve(diffrax, reference, diffrax.ODETerm(_linear)), rtol=0, atol=1e-13
    )


def _double_dopri5(lib):
    class DoubleDopri5(lib.AbstractRungeKutta):
        tableau: ClassVar = lib.MultiButcherTableau(lib.Dopri5.tableau, lib.Dopri5.tableau)
        calculate_jacobian: ClassVar = lib.CalculateJacobian.never

        @staticmethod
        def interpolation_cls(**kwargs):
            kwargs.pop("k")
            return lib.LocalLinearInterpolation(**kwargs)

        def order(self, terms):
            return 5

    return DoubleDopri5()


def test_a_multi_butcher_tableau_steps_each_term_with_its_tableau():
    half = lambda lib: lib.ODETerm(lambda t, y, args: 0.5 * _field(t, y, args))
    terms = lambda lib: lib.MultiTerm(half(lib), half(lib))
    controller = lambda lib: lib.PIDController(rtol=1e-8, atol=1e-8)
    ours = _solve(ode, _double_dopri5(ode), terms(ode), stepsize_controller=controller(ode))
    theirs = _solve(
        diffrax, _double_dopri5(diffrax), terms(diffrax), stepsize_controller=controller(diffrax)
    )
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-12)
    assert _double_dopri5(ode).term_structure == ode.MultiTerm[
        tuple[ode.AbstractTerm, ode.AbstractTerm]
    ]


def _own_term(lib, coeff):
    """A term written with its own control, as Diffrax's users subclass `AbstractTerm`."""

    class Decay(lib.AbstractTerm):
        coeff: float

        def vf(self, t, y, args):
            return {"f": -self.coeff * y["y"]}

        def contr(self, t0, t1, **kwargs):
            return {"t": t1 - t0}

        def prod(self, vf, control):
            return {"y": vf["f"] * control["t"]}

    return Decay(coeff)


def _double_dopri5_on_a_dict(lib):
    class DoubleDopri5(lib.AbstractRungeKutta):
        tableau: ClassVar = lib.MultiButcherTableau(lib.Dopri5.tableau, lib.Dopri5.tableau)
        calculate_jacobian: ClassVar = lib.CalculateJacobian.never

        @staticmethod
        def interpolation_cls(*, t0, t1, y0, y1, k):
            k = {"y": k[0]["y"] + k[1]["y"]}  # reads the state's structure
            hermite = lib.ThirdOrderHermitePolynomialInterpolation
            return hermite.from_k(t0=t0, t1=t1, y0=y0, y1=y1, k=k)

        def order(self, terms):
            return 5

    return DoubleDopri5()


def test_an_interpolant_that_reads_the_state_and_terms_with_their_own_control():
    def solve(lib):
        terms = lib.MultiTerm(_own_term(lib, 0.3), _own_term(lib, 0.7))
        y0 = {"y": jnp.array([[1.0, 2.0], [3.0, 4.0]])}
        sol = lib.diffeqsolve(
            terms,
            _double_dopri5_on_a_dict(lib),  # a new class: its dense output is read here
            0.4,
            0.9,
            0.01,
            y0,
            saveat=lib.SaveAt(ts=jnp.linspace(0.4, 0.9, 23)),
            stepsize_controller=lib.PIDController(rtol=1e-8, atol=1e-8),
        )
        return sol.ys["y"]

    theirs = solve(diffrax)
    np.testing.assert_allclose(jax.jit(lambda: solve(ode))(), theirs, rtol=0, atol=1e-12)
    np.testing.assert_allclose(solve(ode), theirs, rtol=0, atol=1e-12)
    # Diffrax's private name for Dopri5's dense output, which such classes use.
    kwargs = dict(t0=0.0, t1=0.5, y0=jnp.ones(2), y1=jnp.full(2, 2.0))
    k = jnp.arange(14.0).reshape(7, 2) / 10
    ours = ode._solver.dopri5._Dopri5Interpolation(**kwargs, k=k)
    reference = diffrax._solver.dopri5._Dopri5Interpolation(**kwargs, k=k)
    for t in (0.1, 0.25, 0.4):
        np.testing.assert_allclose(ours.evaluate(t), reference.evaluate(t), rtol=1e-14)


def test_both_spellings_name_one_tableau_kind():
    ours = ode.ButcherTableau(
        c=(0.0, 1.0), a=((1.0,),), b=(0.5, 0.5), b_error=(-0.5, 0.5), interp=((1.0, -0.5), (0.0, 0.5)), order=2
    )  # fmt: skip
    assert isinstance(ours, ode.ButcherTableau)
    assert isinstance(ode.Tsit5.tableau, ode.ButcherTableau)
    assert isinstance(_rk4(ode).tableau, ode.ButcherTableau)
    assert [m.name for m in ode.CalculateJacobian] == [m.name for m in diffrax.CalculateJacobian]


def test_tableaus_diffrax_refuses_are_refused():
    with pytest.raises(ValueError, match="number of stages"):

        class Mixed(ode.AbstractRungeKutta):
            tableau = ode.MultiButcherTableau(ode.Dopri5.tableau, ode.Bosh3.tableau)

    with pytest.raises(ValueError, match="at most one"):

        class TwoImplicit(ode.AbstractRungeKutta):
            tableau = ode.MultiButcherTableau(ode.Kvaerno3.tableau, ode.Kvaerno3.tableau)

    with pytest.raises(TypeError, match="interpolation_cls"):

        class NoDenseOutput(ode.AbstractERK):
            tableau = ode.ButcherTableau(
                c=np.array([1.0]), b_sol=np.array([0.5, 0.5]), b_error=np.zeros(2),
                a_lower=(np.array([1.0]),),
            )  # fmt: skip

            def order(self, terms):
                return 2

    with pytest.raises(ValueError, match="b_sol must sum to 1"):
        ode.ButcherTableau(
            c=np.array([1.0]), b_sol=np.array([0.5, 0.6]), b_error=np.zeros(2),
            a_lower=(np.array([1.0]),),
        )  # fmt: skip


def test_an_interpolant_that_fails_on_every_state_fails_the_solve_naming_it():
    class Heun(ode.AbstractERK):
        tableau = ode.ButcherTableau(
            c=np.array([1.0]), b_sol=np.array([0.5, 0.5]), b_error=np.array([0.5, -0.5]),
            a_lower=(np.array([1.0]),),
        )  # fmt: skip

        @staticmethod
        def interpolation_cls(*, t0, t1, y0, y1, k):
            return k["missing"]  # fails on a scalar state and on the solve's own

        def order(self, terms):
            return 2

    with pytest.raises(TypeError, match="interpolation_cls=.*failed on a step of a state"):
        ode.diffeqsolve(ode.ODETerm(_field), Heun(), 0.0, 1.0, 0.1, {"y": jnp.ones(2)})
