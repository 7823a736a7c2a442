"""A step's VJP with its short contractions written out as sums of products.

Transposing a product whose contraction is short gives a `dot_general` with a few terms
per output element and a large output: the cotangent of a weight from a few stacked
tangents, as `jax.jacfwd` inside a field makes them (a continuous normalising flow's exact
trace: one term per state dimension). XLA:CPU computes each such product into a buffer of
its own and adds them up afterwards, so a step of six stages keeps six weight-sized
buffers of every sample alive at once: with 512 samples and a 64 x 64 weight, 50 MB of
temporary memory that the CPU runtime maps afresh, and faults in, on every call. Written
as a sum of products the same arithmetic is elementwise: XLA fuses a step's whole sum
into one pass that writes the weight's cotangent once.

Only calls that are evaluated in line anyway (`jit`, `checkpoint`, closed calls) are
looked into; anything else (a loop or a branch inside the field) is bound as it is.
"""

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jax.extend.core import ClosedJaxpr, Jaxpr, JaxprEqn, Literal, jaxpr_as_fun
from jax.extend.core.primitives import closed_call_p, dot_general_p, jit_p, remat_p
from jaxtyping import Array

# Longest contraction written out: a few products per output element, which XLA fuses;
# a longer one is a matrix product worth a kernel of its own.
SHORT = 8
_CALLS = (jit_p, closed_call_p, remat_p)


def with_short_contractions(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` (of arrays only) evaluated from its trace with each short contraction (see
    the module's docstring) written as a sum of products; as traced if it has none."""

    def call(*args: Any) -> Any:
        closed, shapes = jax.make_jaxpr(fn, return_shape=True)(*args)
        leaves = jtu.tree_leaves(args)
        if closed.effects or not _has_short(closed.jaxpr):
            out = jaxpr_as_fun(closed)(*leaves)
        else:
            out = _evaluate(closed.jaxpr, closed.consts, leaves)
        return jtu.tree_unflatten(jtu.tree_structure(shapes), out)

    return call


def _own(shape: Sequence[int], contracting: Sequence[int], batch: Sequence[int]) -> list[int]:
    """The dimensions of one side of a product that neither contract nor batch: its own,
    in order."""
    return [d for d in range(len(shape)) if d not in contracting and d not in batch]


def _is_short(eqn: JaxprEqn) -> bool:
    """A product of matrices (both sides keep a dimension of their own) over at most
    `SHORT` terms, computed in its inputs' floating dtype."""
    if eqn.primitive is not dot_general_p:
        return False
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    # `ShapedArray`s, which JAX types as the base `AbstractValue`.
    avals: list[Any] = [v.aval for v in (*eqn.invars, *eqn.outvars)]
    lhs, rhs, out = avals
    if not all(isinstance(n, int) for n in (*lhs.shape, *rhs.shape)):
        return False  # a symbolic dimension (shape polymorphism): its size is not known
    size = lambda shape, dims: math.prod(shape[d] for d in dims)
    terms = size(lhs.shape, lc)
    matrices = size(lhs.shape, _own(lhs.shape, lc, lb)) > 1
    matrices = matrices and size(rhs.shape, _own(rhs.shape, rc, rb)) > 1
    same_dtype = lhs.dtype == rhs.dtype == out.dtype
    floating = same_dtype and jnp.issubdtype(lhs.dtype, jnp.inexact)
    return 1 < terms <= SHORT and matrices and floating


def _sum_of_products(lhs: Array, rhs: Array, dimension_numbers: Any) -> Array:
    """`dot_general(lhs, rhs)` as a sum over its contraction of broadcast products: out[b,
    i, j] = sum_k lhs[b, i, k] * rhs[b, j, k], unrolled over k."""
    (lc, rc), (lb, rb) = dimension_numbers
    lf, rf = _own(lhs.shape, lc, lb), _own(rhs.shape, rc, rb)
    batch = [lhs.shape[d] for d in lb]
    lshape, rshape = [lhs.shape[d] for d in lf], [rhs.shape[d] for d in rf]
    terms = math.prod(lhs.shape[d] for d in lc)
    # Both as [batch, lhs's own, rhs's own, terms], with ones where the other side's own
    # dimensions go, so that their products broadcast to the output's layout.
    lhs = jnp.transpose(lhs, [*lb, *lf, *lc]).reshape(*batch, *lshape, *[1] * len(rf), terms)
    rhs = jnp.transpose(rhs, [*rb, *rf, *rc]).reshape(*batch, *[1] * len(lf), *rshape, terms)
    out = lhs[..., 0] * rhs[..., 0]
    for k in range(1, terms):
        out = out + lhs[..., k] * rhs[..., k]
    return out


def _inner(eqn: JaxprEqn) -> ClosedJaxpr | None:
    """The jaxpr of a call evaluated in line, or None for any other equation."""
    if eqn.primitive not in _CALLS:
        return None
    inner = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
    if isinstance(inner, Jaxpr):
        return ClosedJaxpr(inner, ())
    return inner if isinstance(inner, ClosedJaxpr) else None


def _has_short(jaxpr: Jaxpr) -> bool:
    """Whether `jaxpr`, or a call in it that `_evaluate` looks into, has a short
    contraction."""
    for eqn in jaxpr.eqns:
        inner = _inner(eqn)
        if _is_short(eqn) or (inner is not None and _has_short(inner.jaxpr)):
            return True
    return False


def _evaluate(jaxpr: Jaxpr, consts: Sequence[Any], args: Sequence[Any]) -> list[Any]:
    """`jaxpr` evaluated equation by equation, short contractions written out; a
    checkpointed call stays checkpointed (for a derivative of the VJP)."""
    env: dict[Any, Any] = dict(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    read = lambda v: v.val if isinstance(v, Literal) else env[v]
    for eqn in jaxpr.eqns:
        inputs = [read(v) for v in eqn.invars]
        inner = _inner(eqn)
        if inner is not None:
            body = lambda *a, inner=inner: _evaluate(inner.jaxpr, inner.consts, a)
            if eqn.primitive is remat_p:
                policy, prevent_cse = eqn.params["policy"], eqn.params["prevent_cse"]
                body = jax.checkpoint(body, prevent_cse=prevent_cse, policy=policy)
            out = body(*inputs)
        elif _is_short(eqn):
            lhs, rhs = inputs
            out = [_sum_of_products(lhs, rhs, eqn.params["dimension_numbers"])]
        else:
            out = eqn.primitive.bind(*inputs, **eqn.primitive.get_bind_params(eqn.params))
            out = out if eqn.primitive.multiple_results else [out]
        env.update(zip(eqn.outvars, out))
    return [read(v) for v in jaxpr.outvars]
