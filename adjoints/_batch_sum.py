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
"""

import jax
import jax.extend.core
import jax.interpreters.ad as ad
import jax.interpreters.batching as batching
import jax.interpreters.mlir as mlir
import jax.numpy as jnp

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
