"""Explicit stages in a loop, for a field that reads its state at other positions.

Unrolled stages (`rk_stages`) let XLA fuse each stage's combination with the field that
follows it. For an elementwise field or a field made of matrix products that is the
fastest form. For a field that reads an element's neighbours (a stencil written with
`jnp.roll`, slices, padding or a gather: a discretised PDE), XLA fuses each stage's
derivative into every later stage that reads it and, since the later stage reads it at
several positions, computes it again for each: the work of a step then grows with the
square of the number of stages, and its linearisation likewise. A reaction-diffusion
field on 2,000 points took 1.9 times Diffrax's forward time and its gradient 1.2 times
(see benchmarks/README.md, "Large states"). In a loop over the stages, as Diffrax runs
them, each derivative is computed once into a row of a stage buffer. On much larger
states the buffer's traffic costs more than the recomputation, and stages stay unrolled.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Jaxpr, Literal, jaxprs_in_params
from jaxtyping import Array, Float

from ._tableau import ButcherTableau

# Primitives that XLA fuses into their consumer and that read an element of their
# operand at another position than the one they write.
_MOVES_ELEMENTS = frozenset(
    {"slice", "dynamic_slice", "gather", "concatenate", "pad", "rev", "transpose"}
)
# States of fewer elements keep unrolled stages (a handful of operations a step, which
# the loop's iterations would not pay for). Measured in one process against Diffrax, the
# looped forward solve / gradient took: a stencil of 16 to 96 points 0.32-0.50 / 0.32-0.46
# of Diffrax's time (unrolled 0.48-0.98 / 0.23-0.44); Pleiades (28 elements, each body
# reading every other) 1.06 / 1.03 (unrolled 1.14 / 1.78); a stencil of 200 points 0.82 /
# 0.59 (1.42 / 0.65), of 2,000 points 0.75 / 1.04 (1.38 / 1.36). See benchmarks/README.md.
MIN_LOOPED_ELEMENTS = 16
# Up to this many bytes of state: beyond, the loop's traffic through its stage buffer
# costs more than the recomputation (gradients of the same field, 4,000 points: equal;
# 6,000 points: 1.11 of Diffrax's time looped against 0.70 unrolled; 20,000: 1.20
# against 0.58).
MAX_LOOPED_BYTES = 32 * 1024


def _reads_across(jaxpr: Jaxpr, tainted: set) -> bool:
    """Whether `jaxpr` applies a primitive of `_MOVES_ELEMENTS` to a value computed from
    its inputs in `tainted` (the state)."""
    tainted = set(tainted)
    computed = lambda var: not isinstance(var, Literal) and var in tainted  # noqa: E731
    for eqn in jaxpr.eqns:
        if not any(computed(var) for var in eqn.invars):
            continue
        if eqn.primitive.name in _MOVES_ELEMENTS:
            return True
        for inner in jaxprs_in_params(eqn.params):
            # A nested computation's inputs line up with the equation's last inputs
            # (a `cond`'s index and a loop's constants come first).
            offset = len(eqn.invars) - len(inner.invars)
            inner_tainted = {
                var
                for var, outer in zip(inner.invars, eqn.invars[max(offset, 0) :])
                if computed(outer)
            }
            if _reads_across(inner, inner_tainted):
                return True
        tainted.update(eqn.outvars)
    return False


def loops_stages(vf, t0: Float[Array, ""], y0: Float[Array, " n"], args) -> bool:
    """Whether a step of field `vf` at state `y0` runs its stages in a loop: a state of
    `MIN_LOOPED_ELEMENTS` elements to `MAX_LOOPED_BYTES` bytes and a field that reads it
    across positions."""
    if not MIN_LOOPED_ELEMENTS <= y0.size <= MAX_LOOPED_BYTES // y0.dtype.itemsize:
        return False
    state = jax.ShapeDtypeStruct(y0.shape, y0.dtype)
    time = jax.ShapeDtypeStruct(jnp.shape(t0), jnp.result_type(t0))
    closed = jax.make_jaxpr(lambda t, y: vf(t, y, args))(time, state)
    return _reads_across(closed.jaxpr, {closed.jaxpr.invars[1]})


def stage_input(
    y0: Float[Array, " n"], hy: Float[Array, ""], weights: Array, buffer: Float[Array, "m n"]
) -> Float[Array, " n"]:
    """y0 + h sum_j weights[j] buffer[j]."""
    # A product at full precision: a GPU's default would round float32 to TF32. (A
    # weighted sum over the rows as a reduction took twice the time on XLA:CPU.)
    combined = jnp.dot(weights.astype(y0.dtype), buffer, precision=lax.Precision.HIGHEST)
    return y0 + hy * combined


def looped_stage_derivatives(
    tableau: ButcherTableau,
    vf,
    stage_times: Float[Array, " m"],
    y0: Float[Array, " n"],
    k0: Float[Array, " n"],
    hy: Float[Array, ""],
    args,
) -> Float[Array, "m+1 n"]:
    """The stage derivatives k_0..k_m as rows of one buffer, k_i = vf(stage_times[i-1],
    y0 + h sum_j a_ij k_j) computed in a `lax.scan` over i = 1..m (m <= s - 1)."""
    m = stage_times.shape[0]
    buffer = jnp.zeros((m + 1,) + y0.shape, y0.dtype).at[0].set(k0)

    def stage(buffer: Array, given: tuple[Array, Array, Array]) -> tuple[Array, None]:
        i, row, t = given
        k = vf(t, stage_input(y0, hy, row, buffer), args).astype(buffer.dtype)
        return lax.dynamic_update_index_in_dim(buffer, k, i, 0), None

    rows = jnp.asarray([padded(row, m + 1) for row in tableau.a[:m]])
    buffer, _ = lax.scan(stage, buffer, (jnp.arange(1, m + 1), rows, stage_times))
    return buffer


def padded(weights: tuple[float, ...], size: int) -> np.ndarray:
    """`weights` followed by zeros, `size` entries."""
    out = np.zeros(size)
    out[: len(weights)] = weights
    return out
