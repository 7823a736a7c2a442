"""Patterns from Diffrax's documentation examples, with only the import changed.

A control term turned into an ODE (`ControlTerm(f, path).to_ode()`): a user's path that
defines only `evaluate`, and a neural-CDE-style field driven by a cubic interpolation
of data, checked against closed forms and Diffrax's values.
"""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odesolve as ode


def _quadratic_path(lib):
    class QuadraticPath(lib.AbstractPath):
        """x(t) = t**2 on [0, 3]; its derivative is left to the default."""

        @property
        def t0(self):
            return 0

        @property
        def t1(self):
            return 3

        def evaluate(self, t0, t1=None, left=True):
            del left
            if t1 is not None:
                return self.evaluate(t1) - self.evaluate(t0)
            return t0**2

    return QuadraticPath()


def test_control_term_of_a_user_path_is_an_ode():
    # dy = -y dx with x = t**2: y(t) = exp(-t**2); times given as Python ints.
    term = ode.ControlTerm(lambda t, y, args: -y, _quadratic_path(ode)).to_ode()
    sol = ode.diffeqsolve(term, ode.Dopri5(), t0=0, t1=3, dt0=0.05, y0=1.0)
    np.testing.assert_allclose(sol.ys, [np.exp(-9.0)], rtol=1e-5)  # Dopri5 at dt 0.05


def _cde_solve(lib, data, weight):
    ts = jnp.linspace(0.0, 3.0, 7)
    path = lib.CubicInterpolation(ts, lib.backward_hermite_coefficients(ts, data))

    def field(t, y, args):
        return jnp.tanh(weight @ y).reshape(2, 2)  # shape y.shape + control.shape

    term = lib.ControlTerm(field, path).to_ode()
    saveat = lib.SaveAt(ts=ts)
    return lib.diffeqsolve(
        term, lib.Heun(), ts[0], ts[-1], 0.05, jnp.array([0.3, -0.2]), saveat=saveat
    ).ys


def _data_and_weight():
    t = jnp.linspace(0.0, 3.0, 7)
    data = jnp.stack([jnp.sin(t), t**2 / 4], axis=-1)
    weight = jnp.array([[0.5, -1.0], [0.3, 0.2], [-0.7, 0.4], [1.1, 0.1]])
    return data, weight


@pytest.mark.matrix  # heavy: runs with -m matrix
def test_control_term_driven_by_data_gives_diffraxs_values():
    data, weight = _data_and_weight()
    np.testing.assert_allclose(
        _cde_solve(ode, data, weight), _cde_solve(diffrax, data, weight), rtol=1e-12, atol=1e-12
    )


@pytest.mark.matrix
def test_control_term_driven_by_data_gives_diffraxs_gradient():
    data, weight = _data_and_weight()

    def loss(lib):
        return jax.grad(lambda d, w: jnp.sum(_cde_solve(lib, d, w) ** 2), argnums=(0, 1))

    for ours, theirs in zip(loss(ode)(data, weight), loss(diffrax)(data, weight)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-12)


def test_control_term_contracts_each_leaf_over_the_control_axes():
    term = ode.ControlTerm(lambda t, y, args: None, _quadratic_path(ode))
    vf = {"a": jnp.arange(6.0).reshape(3, 2), "b": jnp.array([2.0, 1.0])}
    control = {"a": jnp.array([1.0, 10.0]), "b": jnp.array([3.0, 4.0])}
    out = term.prod(vf, control)
    np.testing.assert_array_equal(out["a"], [10.0, 32.0, 54.0])
    assert float(out["b"]) == 10.0


def test_a_control_term_given_to_diffeqsolve_is_solved_as_its_ode():
    # As Diffrax solves it with an ODE solver (which steps by the path's increments: the
    # same solution, to the solver's accuracy).
    solve = lambda lib, term: lib.diffeqsolve(term, lib.Dopri5(), t0=0, t1=3, dt0=0.05, y0=1.0)
    term = ode.ControlTerm(lambda t, y, args: -y, _quadratic_path(ode))
    ours = solve(ode, term).ys
    np.testing.assert_array_equal(ours, solve(ode, term.to_ode()).ys)
    theirs = solve(diffrax, diffrax.ControlTerm(lambda t, y, args: -y, _quadratic_path(diffrax)))
    np.testing.assert_allclose(ours, [np.exp(-9.0)], rtol=1e-5)
    np.testing.assert_allclose(ours, theirs.ys, rtol=1e-4)
