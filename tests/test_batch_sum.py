"""`adjoints._batch_sum`: `sum_over_batch`, a cotangent summed over exactly the vmap axes
that its parameter does not have; `masked_vjp`, a taped step's VJP taken for a batch at
once, masked samples excluded."""

import jax
import jax.numpy as jnp
import numpy as np

from adjoints._batch_sum import masked_vjp, sum_over_batch
from adjoints._residuals import Layout

XS = jnp.arange(12.0).reshape(4, 3)
SHARED = jnp.ones(3)


def test_without_vmap_it_is_the_identity():
    np.testing.assert_array_equal(sum_over_batch(XS, SHARED), XS)
    np.testing.assert_array_equal(jax.jit(sum_over_batch)(XS, SHARED), XS)


def test_a_shared_parameter_gets_the_sum_over_the_batch():
    summed = jax.vmap(lambda x: sum_over_batch(2 * x, SHARED), out_axes=None)(XS)
    np.testing.assert_array_equal(summed, 2 * XS.sum(0))


def test_a_batched_parameter_gets_its_own_cotangent():
    own = jax.vmap(lambda x, p: sum_over_batch(x * p, p))(XS, XS)
    np.testing.assert_array_equal(own, XS * XS)


def test_nested_vmaps_each_sum_their_own_axis():
    xs = XS.reshape(2, 2, 3)
    inner = lambda x: sum_over_batch(x, SHARED)
    both = jax.vmap(jax.vmap(inner, out_axes=None), out_axes=None)(xs)
    np.testing.assert_array_equal(both, XS.sum(0))
    # Shared by the inner samples only: summed over the inner axis, one per outer sample.
    per_outer = jax.vmap(lambda x, p: jax.vmap(lambda y: sum_over_batch(y, p), out_axes=None)(x))
    np.testing.assert_array_equal(per_outer(xs, jnp.ones((2, 3))), xs.sum(1))


def test_it_is_linear_under_jvp_and_transpose():
    f = lambda x: jnp.sum(jax.vmap(lambda r: sum_over_batch(r**2, SHARED), out_axes=None)(x))
    value, tangent = jax.jvp(f, (XS,), (jnp.ones_like(XS),))
    np.testing.assert_allclose(value, jnp.sum(XS**2))
    np.testing.assert_allclose(tangent, jnp.sum(2 * XS))
    np.testing.assert_allclose(jax.grad(lambda x: jnp.sum(sum_over_batch(x, SHARED)))(XS), 1.0)


# --------------------------------------------------------------------------- masked_vjp

W = jnp.array([[1.0, -2.0], [0.5, 3.0]])


def _step(w, c):
    """A toy step: its derivative in c is infinite at c = 0."""
    return w @ jnp.sqrt(c)


def _layout():
    """Built from a traced linearisation, as `layout_of` builds one."""
    found = []

    def trace(w, c):
        linearisation = jax.linearize(_step, w, c)[1]
        found.append(Layout(linearisation, w, jax.eval_shape(lambda: (w, c))))
        return found[0].taped(linearisation)

    jax.make_jaxpr(trace)(W, jnp.ones(2))
    return found[0]


def _taped(layout, w, cs):
    return jax.vmap(lambda c: layout.taped(jax.linearize(_step, w, c)[1]))(cs)


def _per_sample_vjp(w, c, ct):
    return jax.vjp(_step, w, c)[1](ct)


CS = jnp.array([[1.0, 4.0], [0.0, 0.0], [9.0, 0.25]])  # sample 1's row: infinite slopes
CTS = jnp.array([[1.0, 2.0], [5.0, 5.0], [-1.0, 0.5]])
MASK = jnp.array([True, False, True])


def test_masked_vjp_sums_shared_cotangents_and_excludes_masked_samples():
    """A shared parameter's cotangent comes out unbatched: the sum over the active
    samples only. The masked sample's row would give inf * 0 = NaN; it takes part with
    an active sample's residuals and a zero cotangent instead, so nothing is NaN."""
    layout = _layout()
    vjp = lambda taped, ct, mask: masked_vjp(layout, taped, W, True, ct, mask)
    dc, dw = jax.jit(jax.vmap(vjp, out_axes=(0, None)))(_taped(layout, W, CS), CTS, MASK)
    want = [_per_sample_vjp(W, c, ct) for c, ct in zip(CS[MASK], CTS[MASK])]
    np.testing.assert_allclose(dw, want[0][0] + want[1][0], rtol=1e-6)
    np.testing.assert_allclose(dc[MASK], jnp.stack([c for _, c in want]), rtol=1e-6)
    np.testing.assert_array_equal(dc[1], 0.0)


def test_masked_vjp_keeps_a_batched_parameters_cotangents_per_sample():
    layout = _layout()
    ws = jnp.stack([W, 2 * W, -W])
    vjp = lambda taped, ct, mask, w: masked_vjp(layout, taped, w, True, ct, mask)
    taped = jax.vmap(lambda w, c: tuple(r[0] for r in _taped(layout, w, c[None])))(ws, CS)
    dc, dw = jax.vmap(vjp)(taped, CTS, MASK, ws)
    for i in (0, 2):
        want_w, want_c = _per_sample_vjp(ws[i], CS[i], CTS[i])
        np.testing.assert_allclose(dw[i], want_w, rtol=1e-6)
        np.testing.assert_allclose(dc[i], want_c, rtol=1e-6)
    np.testing.assert_array_equal(dw[1], 0.0)
    np.testing.assert_array_equal(dc[1], 0.0)


def test_masked_vjp_without_vmap_is_the_vjp_where_the_mask_holds():
    layout = _layout()
    taped = _taped(layout, W, CS[:1])
    one = tuple(r[0] for r in taped)
    dc, dw = masked_vjp(layout, one, W, True, CTS[0], jnp.asarray(True))
    want_w, want_c = _per_sample_vjp(W, CS[0], CTS[0])
    np.testing.assert_allclose(dw, want_w, rtol=1e-6)
    np.testing.assert_allclose(dc, want_c, rtol=1e-6)
    dc, dw = masked_vjp(layout, one, W, True, CTS[0], jnp.asarray(False))
    np.testing.assert_array_equal(dw, 0.0)
