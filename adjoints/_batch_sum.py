"""Parameter cotangents summed over a `vmap` batch where they are made.

Under `vmap`, the reverse sweep of a loop runs once per sample, and a parameter that all
samples share (a neural vector field's weights) gets one cotangent per sample: for each
stage of each step, an (n_samples, *weight_shape) array, summed by JAX only after the
sweep. `sum_over_batch(dp, param)` sums such a cotangent over the batch as soon as it is
made, so the sweep accumulates one weight-sized array, and XLA can fold the sum into the
matrix product that made it. Where `param` is itself batched (each sample has its own),
nothing is summed.

A custom-VJP backward pass may return an unbatched cotangent for an unbatched input:
JAX sums a batched one itself, and passes an unbatched one through as it is.

Summing where the cotangent is made still leaves one outer product per sample, each
masked (a sample that has finished) before the sum. `masked_vjp` does better for a taped
step: it batches the step's linearisation over the samples before transposing it, as
`jax.grad` of a vmapped function does, so a shared weight's cotangent is one matrix
product contracting the batch.
"""

import equinox as eqx
import jax
import jax.extend.core
import jax.interpreters.ad as ad
import jax.interpreters.batching as batching
import jax.interpreters.mlir as mlir
import jax.numpy as jnp
import jax.tree_util as jtu

sum_over_batch_p = jax.extend.core.Primitive("sum_over_batch")


def sum_over_batch(cotangent, param):
    """`cotangent`, summed over every `vmap` axis that it has and `param` has not."""
    return sum_over_batch_p.bind(cotangent, param)


def _batch(values, dims):
    cotangent, param = values
    ct_dim, param_dim = dims
    if ct_dim is not None and param_dim is None:
        # Rebound, so that an enclosing vmap sums over its own axis as well.
        return sum_over_batch(jnp.sum(cotangent, axis=ct_dim), param), None
    return sum_over_batch(cotangent, param), ct_dim


def _jvp(primals, tangents):
    cotangent, param = primals
    out = sum_over_batch(cotangent, param)
    if type(tangents[0]) is ad.Zero:
        return out, ad.Zero.from_primal_value(out)
    return out, sum_over_batch(tangents[0], param)


def _transpose(ct, cotangent, param):
    return [ct, None]


sum_over_batch_p.def_impl(lambda cotangent, param: cotangent)
sum_over_batch_p.def_abstract_eval(lambda cotangent, param: cotangent)
batching.primitive_batchers[sum_over_batch_p] = _batch
ad.primitive_jvps[sum_over_batch_p] = _jvp
ad.primitive_transposes[sum_over_batch_p] = _transpose
mlir.register_lowering(
    sum_over_batch_p, mlir.lower_fun(lambda cotangent, param: cotangent, multiple_results=False)
)


# --------------------------------------------------------------------------- batched VJP


def masked_vjp(layout, taped, params, diff, ct, mask):
    """The VJP of a taped step where `mask`, zero elsewhere: (cotangents of the carry's
    float leaves, of the differentiated parameters), given the new carry's.

    `layout` rebuilds the step's linearisation from `taped` (its stored residuals) and
    `params`. Under `vmap` the samples' VJPs are taken together: the linearisation is
    batched first and transposed after, so a parameter the samples share gets its
    cotangent from one matrix product over the batch (the transpose of a batched
    product), rather than one outer product per sample summed afterwards; it comes out
    unbatched. A masked-out sample takes part with a zero cotangent and the residuals of
    an active sample, which are finite wherever the gradient is: its own row may be
    stale or never written."""
    arrays, static = eqx.partition(params, eqx.is_array)
    linearised = lambda taped, arrays: layout.rebuild(taped, eqx.combine(arrays, static))

    @jax.custom_batching.custom_vmap
    def vjp(taped, ct, mask, arrays):
        dp, dc = jax.linear_transpose(linearised(taped, arrays), *layout.tangents)(ct)
        return _where(mask, dc), _where(mask, dp)

    @vjp.def_vmap
    def batched(size, in_batched, taped, ct, mask, arrays):
        taped_b, ct_b, mask_b, arrays_b = in_batched
        mask = mask if mask_b else jnp.broadcast_to(mask, (size,))
        taped, ct = _stand_ins(mask, taped, taped_b, ct, ct_b)
        # The differentiated parameters that are per sample keep per-sample cotangents.
        pf_b = eqx.filter(eqx.combine(arrays_b, jtu.tree_map(lambda _: False, static)), diff)
        lin = _batched(linearised, (taped, taped_b), (arrays, arrays_b), pf_b)
        dp, dc = jax.linear_transpose(lin, *_stacked(layout.tangents, size, pf_b))(ct)
        # Under an enclosing vmap, a round may have no sample of this batch active.
        return (dc, _where(jnp.any(mask), dp)), (jtu.tree_map(lambda _: True, dc), pf_b)

    return vjp(taped, ct, mask, arrays)


def _where(mask, tree):
    return jtu.tree_map(lambda x: jnp.where(mask, x, jnp.zeros_like(x)), tree)


def _stand_ins(mask, taped, taped_b, ct, ct_b):
    """A batch's residuals and cotangents (sample axis first; `*_b`: which leaves have
    it), where a masked-out sample has the first active sample's residuals and a zero
    cotangent."""
    size = mask.shape[0]
    along = lambda x: mask.reshape((size,) + (1,) * (x.ndim - 1))
    first = jnp.argmax(mask)
    taped = tuple(jnp.where(along(r), r, r[first]) if b else r for r, b in zip(taped, taped_b))
    ct = jtu.tree_map(lambda c, b: c if b else jnp.broadcast_to(c, (size, *c.shape)), ct, ct_b)
    ct = jtu.tree_map(lambda c: jnp.where(along(c), c, 0), ct)
    return taped, ct


def _batched(linearised, taped, arrays, pf_b):
    """The batch's linearisation: (tangents of the differentiated parameters, batched
    where `pf_b`; of the carries) -> those of the new carries. `taped`, `arrays`: the
    values and which leaves are batched."""
    (taped, taped_b), (arrays, arrays_b) = taped, arrays
    axes = lambda flags: jtu.tree_map(lambda b: 0 if b else None, flags)
    one = lambda taped, arrays, tp, tc: linearised(taped, arrays)(tp, tc)
    in_axes = (axes(taped_b), axes(arrays_b), axes(pf_b), 0)
    return lambda tp, tc: jax.vmap(one, in_axes=in_axes)(taped, arrays, tp, tc)


def _stacked(tangents, size, pf_b):
    """Shapes of the batch's tangents: the carry's all per sample, the parameters' where
    `pf_b`."""
    params, carry = tangents
    shape = lambda s, b=True: jax.ShapeDtypeStruct((size, *s.shape) if b else s.shape, s.dtype)
    return jtu.tree_map(shape, params, pf_b), jtu.tree_map(shape, carry)
