"""`SemiImplicitEuler` on a pair of terms: its order, its bounded energy error (it is
symplectic), its gradients in every order of transformation, and the errors that say how
to call it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odesolve as ode

# The harmonic oscillator as positions q and momenta p: dq/dt = p, dp/dt = -k q.
VELOCITY = ode.ODETerm(lambda t, p, k: p)
FORCE = ode.ODETerm(lambda t, q, k: -k * q)
TERMS = (VELOCITY, FORCE)
Q0, P0 = jnp.array([1.0, 0.5]), jnp.array([0.0, -0.3])


def solve(k, q0=Q0, p0=P0, t1=1.0, dt0=0.01, **kwargs):
    return ode.diffeqsolve(TERMS, ode.SemiImplicitEuler(), 0.0, t1, dt0, (q0, p0), k, **kwargs)


def exact(k, t, q0=Q0, p0=P0):
    w = np.sqrt(k)
    return q0 * np.cos(w * t) + p0 / w * np.sin(w * t), -q0 * w * np.sin(w * t) + p0 * np.cos(w * t)


def test_the_same_solution_as_the_field_written_as_one():
    together = ode.ODETerm(lambda t, y, k: (y[1], -k * y[0]))
    one = ode.diffeqsolve(together, ode.Tsit5(), 0.0, 1.0, 1e-3, (Q0, P0), 2.0)
    pair = solve(2.0, dt0=1e-5, max_steps=100_001)
    for a, b in zip(pair.ys, one.ys):
        np.testing.assert_allclose(a, b, atol=2e-5)


def test_first_order():
    dts = 0.02 / 2.0 ** np.arange(4)
    errors = [
        np.max(np.abs(solve(2.0, dt0=dt, max_steps=1000).ys[0][-1] - exact(2.0, 1.0)[0]))
        for dt in dts
    ]
    orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
    np.testing.assert_allclose(orders, 1.0, atol=0.05)


def test_the_energy_error_stays_bounded_where_eulers_grows():
    energy = lambda q, p: 0.5 * p**2 + 0.5 * q**2
    ts = jnp.linspace(0.0, 200.0, 201)
    saveat = ode.SaveAt(ts=ts)
    q0, p0 = jnp.array(1.0), jnp.array(0.0)
    sol = solve(1.0, q0, p0, t1=200.0, dt0=0.05, saveat=saveat, max_steps=4000)
    drift = np.abs(energy(*sol.ys) - 0.5)
    assert drift.max() < 0.05  # O(h), and no growth over 30 periods
    euler = ode.diffeqsolve(
        ode.ODETerm(lambda t, y, a: (y[1], -y[0])), ode.Euler(), 0.0, 200.0, 0.05, (q0, p0),
        saveat=saveat, max_steps=4000,
    )  # fmt: skip
    assert np.abs(energy(*euler.ys) - 0.5).max() > 100 * drift.max()


def test_adaptive_in_a_half_solver_and_dense_output():
    controller = ode.PIDController(rtol=1e-6, atol=1e-6)
    sol = ode.diffeqsolve(
        TERMS, ode.HalfSolver(ode.SemiImplicitEuler()), 0.0, 1.0, None, (Q0, P0), 2.0,
        stepsize_controller=controller, saveat=ode.SaveAt(t1=True, dense=True),
    )  # fmt: skip
    q1, p1 = exact(2.0, 1.0)
    # A first-order method: local errors of 1e-6 add up to about 1e-3.
    np.testing.assert_allclose(sol.ys[0][-1], q1, atol=2e-3)
    np.testing.assert_allclose(sol.ys[1][-1], p1, atol=2e-3)
    q, p = sol.evaluate(0.37)
    np.testing.assert_allclose(q, exact(2.0, 0.37)[0], atol=2e-3)
    assert isinstance(ode.HalfSolver(ode.SemiImplicitEuler()), ode.SemiImplicitEuler)


def _loss(k, q0, adjoint=ode.RecursiveCheckpointAdjoint()):
    q, p = solve(k, q0, adjoint=adjoint).ys
    return jnp.sum(q[-1] ** 2) + jnp.sum(p[-1])


def _by_differences(k, q0, eps=1e-6):
    return (_loss(k + eps, q0) - _loss(k - eps, q0)) / (2 * eps)


@pytest.mark.parametrize(
    "adjoint",
    [
        pytest.param(ode.RecursiveCheckpointAdjoint(), marks=pytest.mark.matrix),
        pytest.param(ode.DirectAdjoint(), marks=pytest.mark.matrix),
        pytest.param(ode.RecursiveCheckpointAdjoint(3), marks=pytest.mark.matrix),
    ],
    ids=["checkpointed", "direct", "three_checkpoints"],
)
def test_gradients_in_every_order(adjoint):
    ks = jnp.array([1.0, 2.0, 3.0])
    expected = np.array([_by_differences(k, Q0) for k in ks])
    grad = jax.grad(_loss)
    np.testing.assert_allclose(grad(2.0, Q0, adjoint), expected[1], rtol=1e-6)
    # vmap(grad), batched parameter and shared parameter with batched state.
    np.testing.assert_allclose(jax.vmap(lambda k: grad(k, Q0, adjoint))(ks), expected, rtol=1e-6)
    q0s = jnp.stack([Q0, 2 * Q0])
    shared = jax.vmap(lambda q0: grad(2.0, q0, adjoint))(q0s)
    np.testing.assert_allclose(shared, [_by_differences(2.0, q0) for q0 in q0s], rtol=1e-6)
    # grad(vmap): the sum of the samples' gradients.
    summed = jax.grad(lambda k: jnp.sum(jax.vmap(lambda q0: _loss(k, q0, adjoint))(q0s)))(2.0)
    np.testing.assert_allclose(summed, np.sum(shared), rtol=1e-6)
    # Forward mode agrees with reverse mode.
    if not isinstance(adjoint, ode.RecursiveCheckpointAdjoint):
        _, tangent = jax.jit(lambda k: jax.jvp(lambda k: _loss(k, Q0, adjoint), (k,), (1.0,)))(2.0)
        np.testing.assert_allclose(tangent, expected[1], rtol=1e-6)


def test_the_reversible_adjoint_undoes_its_steps():
    saveat = ode.SaveAt(t0=True, ts=jnp.linspace(0.0, 1.0, 5), steps=True)

    def loss(k, adjoint):
        q, p = solve(k, saveat=saveat, adjoint=adjoint).ys
        return jnp.sum(jnp.where(jnp.isfinite(q), q, 0) ** 2) + jnp.sum(p[-1])

    expected = jax.grad(loss)(2.0, ode.DirectAdjoint())
    np.testing.assert_allclose(jax.grad(loss)(2.0, ode.ReversibleAdjoint()), expected, rtol=1e-10)


def test_backsolve_needs_a_solver_of_its_own():
    with pytest.raises(NotImplementedError, match="BacksolveAdjoint\\(solver="):
        jax.grad(_loss)(2.0, Q0, ode.BacksolveAdjoint())
    rough = jax.grad(_loss)(2.0, Q0, ode.BacksolveAdjoint(solver=ode.Tsit5()))
    # The continuous adjoint: the discrete gradient up to the method's O(h) error.
    np.testing.assert_allclose(rough, _by_differences(2.0, Q0), rtol=0.05)


def test_the_low_level_api_takes_the_pair():
    solver = ode.SemiImplicitEuler()
    y0 = (1.0, -0.5)
    decay, grow = ode.ODETerm(lambda t, y, a: -y), ode.ODETerm(lambda t, y, a: y)
    state = solver.init((decay, grow), 0.0, 0.1, y0, None)
    (y_1, y_2), error, _, _, result = solver.step((decay, grow), 0.0, 0.1, y0, None, state, False)
    # y_1 = 1 + 0.1 * -(-0.5); y_2 = -0.5 + 0.1 * y_1.
    np.testing.assert_allclose([y_1, y_2], [1.05, -0.395], rtol=1e-12)
    assert error is None and result == ode.RESULTS.successful
    np.testing.assert_allclose(solver.func((decay, grow), 0.0, y0, None), (0.5, 1.0))


def test_errors_say_how_to_call_it():
    with pytest.raises(TypeError, match="pair"):
        ode.diffeqsolve(VELOCITY, ode.SemiImplicitEuler(), 0.0, 1.0, 0.1, (Q0, P0), 2.0)
    with pytest.raises(ValueError, match="y0=\\(y_1, y_2\\)"):
        ode.diffeqsolve(TERMS, ode.SemiImplicitEuler(), 0.0, 1.0, 0.1, Q0, 2.0)
    with pytest.raises(TypeError, match="SemiImplicitEuler"):
        ode.diffeqsolve(TERMS, ode.Tsit5(), 0.0, 1.0, 0.1, (Q0, P0), 2.0)
