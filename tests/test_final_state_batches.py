"""A batch that saves only y(t1) steps some sample in every lockstep round, so its
forward and reverse steps run without the branch that skips a round (see
`Loop.steps_every_round`). Its gradients, in every order users write them, against each
sample's own solve differentiated by `DirectAdjoint` outside any `vmap`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odesolve as ode

Y0S = jnp.array([[1.0, 0.5], [0.3, -0.8], [2.0, 0.1]])
PS = jnp.array([0.7, 1.3, 2.1])


def _final(p, y0, adjoint):
    """y(t1) of a damped, forced oscillator whose samples take different steps."""
    field = lambda t, y, a: jnp.stack([y[1], -a * y[0] - 0.3 * y[1] + jnp.sin(2 * t)])
    sol = ode.diffeqsolve(
        ode.ODETerm(field), ode.Tsit5(), 0.0, 3.0, 0.1, y0, p,
        stepsize_controller=ode.PIDController(rtol=1e-8, atol=1e-8), adjoint=adjoint,
    )  # fmt: skip
    return sol.ys[-1]


def _loss(p, y0, adjoint):
    return jnp.sum(_final(p, y0, adjoint) ** 2)


def _reference_jacobians():
    """d y(t1) / d p and d y(t1) / d y0 per sample, unbatched."""
    direct = ode.DirectAdjoint()
    jac = jax.jit(jax.jacrev(_final, argnums=(0, 1)), static_argnums=2)
    per_sample = [jac(p, y0, direct) for p, y0 in zip(PS, Y0S)]
    return jnp.stack([j[0] for j in per_sample]), jnp.stack([j[1] for j in per_sample])


def _loss_gradients(dp, dy0):
    """Gradients of each sample's loss from the Jacobians of y(t1)."""
    y1 = jnp.stack([_final(p, y0, ode.DirectAdjoint()) for p, y0 in zip(PS, Y0S)])  # (3, 2)
    return jnp.einsum("si,si->s", 2 * y1, dp), jnp.einsum("si,sij->sj", 2 * y1, dy0)


ORDERS = {
    "vmap(grad) batched": lambda a: jax.vmap(jax.grad(_loss, argnums=(0, 1)), (0, 0, None))(
        PS, Y0S, a
    ),
    "grad(vmap)": lambda a: jax.grad(
        lambda p, y: jnp.sum(jax.vmap(_loss, (None, 0, None))(p, y, a)), argnums=(0, 1)
    )(PS[1], Y0S),
    "vmap(grad) shared": lambda a: jax.vmap(jax.grad(_loss, argnums=(0, 1)), (None, 0, None))(
        PS[1], Y0S, a
    ),
    "vmap(vmap(grad))": lambda a: jax.vmap(
        jax.vmap(jax.grad(_loss, argnums=(0, 1)), (0, 0, None)), (0, 0, None)
    )(PS.reshape(3, 1), Y0S.reshape(3, 1, 2), a),
    "jacrev(vmap)": lambda a: jax.jacrev(jax.vmap(_final, (0, 0, None)), argnums=(0, 1))(
        PS, Y0S, a
    ),
    "jit(vmap(jvp(grad)))": lambda a: jax.jit(jax.vmap(lambda p, y: _second(p, y, a)))(PS, Y0S),
}


def _second(p, y0, adjoint):
    """d2 loss / dp2 as forward mode over reverse mode: jvp(grad)."""
    grad = jax.grad(_loss)
    return jax.jvp(lambda q: grad(q, y0, adjoint), (p,), (jnp.ones_like(p),))[1]


def _expected(order, dp, dy0):
    """What `ORDERS[order]` returns, from the per-sample Jacobians."""
    if order in ("vmap(grad) batched", "vmap(vmap(grad))"):
        gp, gy = _loss_gradients(dp, dy0)
        shape = (3,) if order == "vmap(grad) batched" else (3, 1)
        return gp.reshape(shape), gy.reshape(*shape, 2)
    if order == "jacrev(vmap)":
        # Output (3, 2) against p (3,) and y0 (3, 2): block-diagonal over the samples.
        eye = jnp.eye(3)
        return jnp.einsum("si,st->sit", dp, eye), jnp.einsum("sij,st->sitj", dy0, eye)
    raise AssertionError(order)  # the other orders have their own reference


def _second_reference():
    second = jax.jit(_second, static_argnums=2)
    return (jnp.stack([second(p, y0, ode.DirectAdjoint()) for p, y0 in zip(PS, Y0S)]),)


def _shared_reference(order):
    """The shared-parameter orders: every sample at PS[1], unbatched, by DirectAdjoint."""
    grad = jax.jit(jax.grad(_loss, argnums=(0, 1)), static_argnums=2)
    per = [grad(PS[1], y0, ode.DirectAdjoint()) for y0 in Y0S]
    gp, gy = jnp.stack([g[0] for g in per]), jnp.stack([g[1] for g in per])
    return (jnp.sum(gp), gy) if order == "grad(vmap)" else (gp, gy)


@pytest.fixture(scope="module")
def jacobians():
    return _reference_jacobians()


ADJOINTS = {
    "default": ode.RecursiveCheckpointAdjoint(),
    "tape": ode.RecursiveCheckpointAdjoint(schedule="tape"),
    "states": ode.RecursiveCheckpointAdjoint(schedule="states"),
    "segments": ode.RecursiveCheckpointAdjoint(schedule=ode.Segments(length=4, starts=2)),
}
# The suite runs the default adjoint in two orders; every pair with -m matrix.
CASES = [
    pytest.param(
        adjoint,
        order,
        marks=()
        if adjoint == "default" and order in ("vmap(grad) batched", "grad(vmap)")
        else pytest.mark.matrix,
    )
    for adjoint in ADJOINTS
    for order in ORDERS
]


@pytest.mark.parametrize("adjoint, order", CASES)
def test_gradients_of_a_final_state_batch_in_every_order(adjoint, order, jacobians):
    got = ORDERS[order](ADJOINTS[adjoint])
    if order in ("grad(vmap)", "vmap(grad) shared"):
        expected = _shared_reference(order)
    elif order == "jit(vmap(jvp(grad)))":
        expected = _second_reference()
    else:
        expected = _expected(order, *jacobians)
    for g, e in zip(jax.tree_util.tree_leaves(got), expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-9)
