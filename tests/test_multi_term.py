"""`MultiTerm`: ODE terms added into one field, as Diffrax code writes a split field. A
solve, its gradient in every transformation order and its errors are those of the
field written as one sum."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odesolve as ode

DECAY = ode.ODETerm(lambda t, y, k: -k * y)
FORCING = ode.ODETerm(lambda t, y, k: jnp.sin(t) * jnp.ones_like(y))
SUM = ode.ODETerm(lambda t, y, k: -k * y + jnp.sin(t))
PID = ode.PIDController(rtol=1e-6, atol=1e-6)


def _final(terms, solver, k, y0, adjoint=ode.RecursiveCheckpointAdjoint()):
    sol = ode.diffeqsolve(
        terms, solver, 0.0, 2.0, 0.1, y0, k, stepsize_controller=PID, adjoint=adjoint
    )
    return sol.ys[-1]


@pytest.mark.parametrize("solver", [ode.Tsit5(), ode.Kvaerno3()], ids=["Tsit5", "Kvaerno3"])
def test_a_multi_term_solves_the_sum_of_its_fields(solver):
    y0 = jnp.array([1.0, -0.5])
    nested = ode.MultiTerm(DECAY, ode.MultiTerm(FORCING))
    np.testing.assert_array_equal(
        _final(nested, solver, 0.7, y0), _final(SUM, solver, 0.7, y0)
    )


@pytest.mark.matrix  # the solve is the summed field, checked bit for bit in the suite
def test_a_multi_term_gradient_is_the_summed_fields_in_every_order():
    terms = ode.MultiTerm(DECAY, FORCING)
    y0s = jnp.array([[1.0, 2.0], [0.5, -1.0], [3.0, 0.0]])
    loss = lambda terms: lambda k, y0: jnp.sum(_final(terms, ode.Tsit5(), k, y0) ** 2)
    ours, reference = loss(terms), loss(SUM)
    # Shared parameter, batched y0: vmap(grad) gives each sample its own gradient.
    per_sample = jax.vmap(jax.grad(ours), in_axes=(None, 0))(0.7, y0s)
    reference_grad = jax.jit(jax.grad(reference))  # one compile for every sample
    expected = jnp.stack([reference_grad(0.7, y0) for y0 in y0s])
    np.testing.assert_allclose(per_sample, expected, rtol=1e-10)
    # Batched parameters, nested vmap and jacrev give the same per-sample gradients.
    ks = jnp.array([0.7, 0.4, 1.1])
    batched = jax.vmap(jax.grad(ours))(ks, y0s)
    reference_batched = jnp.stack([reference_grad(k, y0) for k, y0 in zip(ks, y0s)])
    np.testing.assert_allclose(batched, reference_batched, rtol=1e-10)
    nested = jax.vmap(jax.vmap(jax.grad(ours), in_axes=(None, 0)), in_axes=(0, None))(ks, y0s)
    np.testing.assert_allclose(nested[0], expected, rtol=1e-10)
    rows = jax.jacrev(lambda k: jax.vmap(ours, in_axes=(None, 0))(k, y0s))(0.7)
    np.testing.assert_allclose(rows, expected, rtol=1e-10)
    # grad(vmap) sums them; forward mode agrees.
    summed = jax.grad(lambda k: jnp.sum(jax.vmap(ours, in_axes=(None, 0))(k, y0s)))(0.7)
    np.testing.assert_allclose(summed, expected.sum(), rtol=1e-10)
    forward = lambda k: jnp.sum(_final(terms, ode.Tsit5(), k, y0s[0], ode.ForwardMode()) ** 2)
    np.testing.assert_allclose(jax.jit(jax.jacfwd(forward))(0.7), expected[0], rtol=1e-8)


def test_a_multi_term_keeps_diffrax_low_level_api():
    terms = ode.MultiTerm(DECAY, FORCING)
    control = terms.contr(0.0, 0.1)
    assert control == (0.1, 0.1)
    increment = terms.vf_prod(0.5, jnp.ones(2), 0.7, control)
    np.testing.assert_allclose(increment, 0.1 * (-0.7 + np.sin(0.5)) * np.ones(2))
    assert ode.MultiTerm[tuple[ode.ODETerm, ode.ODETerm]] is not None  # subscriptable


def test_a_multi_term_of_something_else_is_refused_with_the_fix():
    with pytest.raises(TypeError, match=r"MultiTerm\(ODETerm\(f\), ODETerm\(g\)\)"):
        ode.MultiTerm(lambda t, y, args: -y)
    with pytest.raises(TypeError, match="pass one or more terms"):
        ode.MultiTerm()
