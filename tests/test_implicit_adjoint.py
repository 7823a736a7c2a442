"""`ImplicitAdjoint`: derivatives of a steady state by the implicit function theorem,
against the closed form, in every transformation order."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odesolve as ode

# dy/dt = a - k y^3 runs to y* = (a / k)^(1/3), whatever y0.
FIELD = ode.ODETerm(lambda t, y, p: p[0] - p[1] * y**3)
Y0 = jnp.array([0.5, 2.0])
PID = ode.PIDController(rtol=1e-9, atol=1e-9)


def steady_state(params, y0=Y0, adjoint=ode.ImplicitAdjoint()):
    sol = ode.diffeqsolve(
        FIELD, ode.Tsit5(), 0.0, jnp.inf, None, y0, params,
        event=ode.Event(ode.steady_state_event()), stepsize_controller=PID, adjoint=adjoint,
    )  # fmt: skip
    return sol.ys[-1]


def exact_jacobian(params):
    a, k = params
    root = (a / k) ** (1 / 3)
    d_a = root / (3 * a)  # d/da (a/k)^(1/3)
    d_k = -root / (3 * k)
    return np.stack([np.full(2, d_a), np.full(2, d_k)], axis=-1)


PARAMS = jnp.array([2.0, 0.5])


def test_the_steady_state_and_its_derivatives():
    np.testing.assert_allclose(steady_state(PARAMS), (2.0 / 0.5) ** (1 / 3), rtol=1e-7)
    expected = exact_jacobian(PARAMS)
    np.testing.assert_allclose(jax.jacrev(steady_state)(PARAMS), expected, rtol=1e-6)
    np.testing.assert_allclose(jax.jacfwd(steady_state)(PARAMS), expected, rtol=1e-6)
    # Where the solve started does not move the steady state.
    np.testing.assert_allclose(jax.jacrev(steady_state, argnums=1)(PARAMS, Y0), 0.0)


@pytest.mark.matrix  # every transformation order: 12 s
def test_transformation_orders_agree_with_one_sample_at_a_time():
    batch = jnp.array([[2.0, 0.5], [1.0, 1.0], [1.5, 0.75]])
    loss = lambda p: jnp.sum(steady_state(p) ** 2)
    one_at_a_time = np.stack([jax.grad(loss)(p) for p in batch])
    np.testing.assert_allclose(jax.vmap(jax.grad(loss))(batch), one_at_a_time, rtol=1e-10)
    of_sum = jax.grad(lambda b: jnp.sum(jax.vmap(loss)(b)))(batch)
    np.testing.assert_allclose(of_sum, one_at_a_time, rtol=1e-10)
    jitted = jax.jit(jax.grad(loss))(batch[0])
    np.testing.assert_allclose(jitted, one_at_a_time[0], rtol=1e-10)
    for p, g in zip(batch, one_at_a_time):
        np.testing.assert_allclose(
            g, 2 * np.sum(steady_state(p)[:, None] * exact_jacobian(p), 0), rtol=1e-7
        )


def test_a_lineax_solver_and_tags_as_diffrax_takes_them():
    lx = pytest.importorskip("lineax")
    expected = exact_jacobian(PARAMS)
    # The Jacobian of this field is diagonal: each solver and tag gives the same solve.
    for adjoint in (
        ode.ImplicitAdjoint(linear_solver=lx.AutoLinearSolver(well_posed=None)),
        ode.ImplicitAdjoint(linear_solver=lx.QR()),
        ode.ImplicitAdjoint(linear_solver=lx.Diagonal(), tags={lx.diagonal_tag}),
    ):
        jacobian = jax.jit(jax.jacrev(lambda p, a=adjoint: steady_state(p, Y0, a)))(PARAMS)
        np.testing.assert_allclose(jacobian, expected, rtol=1e-6)
    # The solver is the one given: Lineax's diagonal solver needs the tag.
    with pytest.raises(ValueError, match="diagonal"):
        jax.jacrev(lambda p: steady_state(p, Y0, ode.ImplicitAdjoint(lx.Diagonal())))(PARAMS)
    assert ode.ImplicitAdjoint(tags=[lx.symmetric_tag]).tags == frozenset({lx.symmetric_tag})
    with pytest.raises(TypeError, match=r"ImplicitAdjoint\(linear_solver='lu'\)"):
        ode.ImplicitAdjoint(linear_solver="lu")
    with pytest.raises(TypeError, match=r"ImplicitAdjoint\(tags=3\)"):
        ode.ImplicitAdjoint(tags=3)


def test_only_the_final_state_is_differentiated():
    with pytest.raises(ValueError, match=r"SaveAt\(t1=True\)"):
        ode.diffeqsolve(
            FIELD, ode.Tsit5(), 0.0, 1.0, 0.1, Y0, PARAMS,
            saveat=ode.SaveAt(ts=jnp.array([0.5, 1.0])), adjoint=ode.ImplicitAdjoint(),
        )  # fmt: skip


@pytest.mark.matrix  # the transformation orders stay in the suite
def test_shared_parameters_nested_batches_and_forward_mode():
    loss = lambda p, y0: jnp.sum(steady_state(p, y0) ** 2)
    starts = jnp.array([[0.5, 2.0], [1.0, 1.5]])
    expected = jax.grad(loss)(PARAMS, starts[0])
    # vmap(grad) with the parameters shared: each sample's own gradient, not their sum.
    shared = jax.vmap(jax.grad(loss), in_axes=(None, 0))(PARAMS, starts)
    np.testing.assert_allclose(shared, np.stack([expected, expected]), rtol=1e-6)
    nested = jax.vmap(jax.vmap(jax.grad(loss), in_axes=(None, 0)), in_axes=(None, 0))(
        PARAMS, starts[None]
    )
    np.testing.assert_allclose(nested[0], shared, rtol=1e-10)
    tangent = jax.jit(jax.jvp, static_argnums=0)(
        lambda p: loss(p, starts[0]), (PARAMS,), (jnp.array([1.0, 0.0]),)
    )[1]
    np.testing.assert_allclose(tangent, expected[0], rtol=1e-8)


@pytest.mark.matrix  # the suite's Lineax test runs jit(jacrev)
def test_a_lineax_solver_in_every_transformation_order():
    # Against the closed form: d/dp sum(y*^2) = 2 sum_i y*_i dy*_i/dp.
    lx = pytest.importorskip("lineax")
    adjoint = ode.ImplicitAdjoint(linear_solver=lx.QR())
    loss = lambda p, y0=Y0: jnp.sum(steady_state(p, y0, adjoint) ** 2)
    exact = lambda p: 2 * np.sum(steady_state(p)[:, None] * exact_jacobian(p), 0)
    batch = jnp.array([[2.0, 0.5], [1.0, 1.0], [1.5, 0.75]])
    expected = np.stack([exact(p) for p in batch])
    starts = jnp.array([[0.5, 2.0], [1.0, 1.5], [2.0, 0.3]])
    orders = {
        "grad(vmap)": jax.grad(lambda b: jnp.sum(jax.vmap(loss)(b)))(batch),
        "vmap(grad) batched": jax.vmap(jax.grad(loss))(batch),
        "vmap(grad) shared": jax.vmap(jax.grad(loss), in_axes=(None, 0))(batch[0], starts),
        "vmap(vmap(grad))": jax.vmap(jax.vmap(jax.grad(loss)))(batch[None])[0],
        "jacrev": jax.jacrev(lambda b: jax.vmap(loss)(b))(batch).sum(axis=1),
        "jit(jvp)": jnp.stack(
            [jax.jit(lambda p, v: jax.jvp(loss, (p,), (v,))[1])(batch[0], e) for e in jnp.eye(2)]
        ),
    }
    wanted = {"vmap(grad) shared": np.stack([expected[0]] * 3), "jit(jvp)": expected[0]}
    for name, got in orders.items():
        np.testing.assert_allclose(got, wanted.get(name, expected), rtol=1e-6, err_msg=name)


def test_a_solve_without_an_event_to_end_at_a_steady_state_is_refused():
    # Its gradient would be the steady state's (zero for y0) of a state still moving.
    with pytest.raises(ValueError, match=r"ImplicitAdjoint\(\) differentiates a steady state"):
        ode.diffeqsolve(
            FIELD, ode.Tsit5(), 0.0, 1.0, 0.1, Y0, PARAMS, adjoint=ode.ImplicitAdjoint()
        )
