"""A step's VJP writes its short contractions (a weight's cotangent from a few stacked
tangents, as `jax.jacfwd` in a field makes) as sums of products, which XLA fuses, rather
than as matrix products whose outputs it keeps apart: checked on the traced program, and
for the values and gradients it gives against `lax.dot_general` and against JAX's own
differentiation of the loop (`DirectAdjoint`) in the orders users write."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import odesolve as ode
from adjoints._contractions import SHORT, with_short_contractions


def _short_dots(fn, *args) -> int:
    """Products of matrices over 2..SHORT terms left in fn's trace, looking into nested
    calls."""

    def own(aval, contracting, batch) -> int:
        return int(np.prod([n for d, n in enumerate(aval.shape) if d not in contracting + batch]))

    def count(jaxpr) -> int:
        n = 0
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "dot_general":
                (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
                lhs, rhs = (v.aval for v in eqn.invars)
                terms = int(np.prod([lhs.shape[d] for d in lc]))
                matrices = own(lhs, lc, lb) > 1 and own(rhs, rc, rb) > 1
                n += matrices and 1 < terms <= SHORT
            for inner in jax.extend.core.jaxprs_in_params(eqn.params):
                n += count(inner)
        return n

    return count(jax.make_jaxpr(fn)(*args).jaxpr)


# (lhs shape, rhs shape, dimension numbers): plain, transposed sides, batch dimensions,
# two contracting dimensions, and a contraction too long to write out.
_PRODUCTS = [
    ((64, 3), (3, 32), (((1,), (0,)), ((), ()))),
    ((2, 40), (24, 2), (((0,), (1,)), ((), ()))),
    ((5, 16, 4), (5, 4, 8), (((2,), (1,)), ((0,), (0,)))),
    ((2, 7, 3, 6), (3, 2, 9), (((0, 2), (1, 0)), ((), ()))),
    ((16, 32), (32, 8), (((1,), (0,)), ((), ()))),
]


@pytest.mark.parametrize("lhs_shape, rhs_shape, dims", _PRODUCTS)
def test_written_out_products_equal_the_matrix_products(lhs_shape, rhs_shape, dims):
    lhs = jax.random.normal(jax.random.key(0), lhs_shape)
    rhs = jax.random.normal(jax.random.key(1), rhs_shape)
    product = lambda a, b: lax.dot_general(a, b, dims)
    written = with_short_contractions(product)
    np.testing.assert_allclose(written(lhs, rhs), product(lhs, rhs), rtol=1e-13, atol=1e-13)
    batched = jax.vmap(written, in_axes=(0, None))
    np.testing.assert_allclose(
        batched(jnp.stack([lhs, 2 * lhs]), rhs),
        jax.vmap(product, in_axes=(0, None))(jnp.stack([lhs, 2 * lhs]), rhs),
        rtol=1e-13,
    )
    long = int(np.prod([lhs_shape[d] for d in dims[0][0]])) > SHORT
    assert _short_dots(written, lhs, rhs) == 0
    assert _short_dots(product, lhs, rhs) == (0 if long else 1)


def test_inside_a_checkpointed_call_and_a_jitted_one():
    w = jax.random.normal(jax.random.key(2), (16, 16))
    h = jax.random.normal(jax.random.key(3), (2, 16))

    def cotangent_of_w(w, h):  # d/dw of sum(tanh(h @ w)) for two stacked rows: K = 2
        f = jax.checkpoint(jax.jit(lambda w: jnp.sum(jnp.tanh(h @ w))))
        return jax.grad(f)(w)

    written = with_short_contractions(cotangent_of_w)
    assert _short_dots(cotangent_of_w, w, h) >= 1
    assert _short_dots(written, w, h) == 0
    np.testing.assert_allclose(written(w, h), cotangent_of_w(w, h), rtol=1e-13, atol=1e-14)
    # A derivative of the written-out function (as a Hessian takes one of a VJP).
    hvp = lambda f: jax.jvp(lambda w: f(w, h), (w,), (jnp.ones_like(w),))[1]
    np.testing.assert_allclose(hvp(written), hvp(cotangent_of_w), rtol=1e-12, atol=1e-14)


# A continuous normalising flow: the field's divergence is the trace of its Jacobian by
# `jax.jacfwd`, so the reverse sweep's weight cotangents are contractions over 2 tangents.
def _flow(t, state, params):
    z, _ = state
    w1, w2, w3 = params
    f = lambda z: jnp.tanh(jnp.tanh(jnp.append(z, t) @ w1) @ w2) @ w3
    return f(z), -jnp.trace(jax.jacfwd(f)(z))


def _params():
    keys = jax.random.split(jax.random.key(4), 3)
    shapes = [(3, 16), (16, 16), (16, 2)]
    return tuple(jax.random.normal(k, s) / np.sqrt(s[0]) for k, s in zip(keys, shapes))


def _nll(params, x, adjoint):
    sol = ode.diffeqsolve(
        ode.ODETerm(_flow), ode.Tsit5(), 0.0, 1.0, None, (x, jnp.zeros(())), params,
        stepsize_controller=ode.PIDController(rtol=1e-8, atol=1e-8), adjoint=adjoint,
        max_steps=16,
    )  # fmt: skip
    (z1,), (delta,) = sol.ys
    return 0.5 * jnp.sum(z1**2) + delta


_XS = jax.random.normal(jax.random.key(5), (6, 2))
_DEFAULT, _DIRECT = ode.RecursiveCheckpointAdjoint(), ode.DirectAdjoint()


@pytest.mark.parametrize(
    "order",
    [
        pytest.param("grad(vmap)", marks=pytest.mark.matrix),  # 18 s
        pytest.param("vmap(grad)", marks=pytest.mark.matrix),
        pytest.param("jit(grad)", marks=pytest.mark.matrix),
        pytest.param("vmap(grad) batched parameters", marks=pytest.mark.matrix),
        pytest.param("vmap(vmap(grad))", marks=pytest.mark.matrix),
        pytest.param("jacrev(vmap)", marks=pytest.mark.matrix),
    ],
)
def test_flow_gradients_match_jax_differentiating_the_loop(order):
    params = _params()
    batch_loss = lambda p, adjoint: jnp.mean(jax.vmap(lambda x: _nll(p, x, adjoint))(_XS))
    sample_grads = lambda adjoint: jax.vmap(jax.grad(lambda p, x: _nll(p, x, adjoint)), (None, 0))
    two_weights = jax.tree_util.tree_map(lambda w: jnp.stack([w, 0.9 * w]), params)
    gradient = {
        "grad(vmap)": lambda adjoint: jax.grad(batch_loss)(params, adjoint),
        "vmap(grad)": lambda adjoint: sample_grads(adjoint)(params, _XS),
        "jit(grad)": lambda adjoint: jax.jit(jax.grad(_nll), static_argnums=2)(
            params, _XS[0], adjoint
        ),
        # Each of two samples its own weights (the second's scaled by 0.9).
        "vmap(grad) batched parameters": lambda adjoint: jax.vmap(
            jax.grad(lambda p, x: _nll(p, x, adjoint))
        )(two_weights, _XS[:2]),
        "vmap(vmap(grad))": lambda adjoint: jax.vmap(sample_grads(adjoint), (None, 0))(
            params, _XS.reshape(2, 3, 2)
        ),
        "jacrev(vmap)": lambda adjoint: jax.jacrev(
            lambda p: jax.vmap(lambda x: _nll(p, x, adjoint))(_XS)
        )(params),
    }[order]
    jax.clear_caches()  # the leak checker collects garbage after every trace
    with jax.checking_leaks():
        ours = gradient(_DEFAULT)
    reference = gradient(_DIRECT)
    for a, b in zip(ours, reference):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


@pytest.mark.matrix
def test_flow_hessian_vector_product_matches_jax_differentiating_the_loop():
    """Forward over reverse: `jax.jvp` of the gradient differentiates the written-out
    step VJPs (and the checkpointed calls they keep)."""
    params, x = _params(), _XS[0]
    direction = jax.tree_util.tree_map(jnp.ones_like, params)

    def hvp(adjoint):
        grad = jax.grad(lambda p: _nll(p, x, adjoint))
        return jax.jit(lambda p: jax.jvp(grad, (p,), (direction,))[1])(params)

    for a, b in zip(hvp(_DEFAULT), hvp(_DIRECT)):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-11)


def test_the_flows_step_vjp_has_no_short_products_left():
    """The step's VJP the reverse sweep applies, traced: the field's transposed `jacfwd`
    gives products over 2 terms, all written out."""
    from adjoints._residuals import transposed

    params, y = _params(), (_XS[0], jnp.zeros(()))
    step = lambda p, y: jax.tree_util.tree_map(
        lambda a, b: a + 0.1 * b, y, _flow(0.0, y, p)
    )  # one Euler step
    _, lin = jax.linearize(step, params, y)
    ct = jax.tree_util.tree_map(jnp.ones_like, y)
    plain = lambda ct: jax.linear_transpose(lin, params, y)(ct)
    assert _short_dots(plain, ct) >= 2
    assert _short_dots(transposed(lin, params, y), ct) == 0
    for a, b in zip(jax.tree_util.tree_leaves(transposed(lin, params, y)(ct)),
                    jax.tree_util.tree_leaves(plain(ct))):  # fmt: skip
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)
