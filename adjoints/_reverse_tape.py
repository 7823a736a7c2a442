"""Reversing taped ticks: a step's VJP is its stored linearisation transposed, with no
evaluation of the step; an emit's is taken from the carry stored before it."""

from collections.abc import Iterable

import equinox as eqx
import jax.numpy as jnp
import jax.tree_util as jtu
from jax import lax
from jaxtyping import Array, Bool, Int, PyTree

from ._lockstep import if_any, lockstep_while, tree_where
from ._loop import Buffers, Loop
from ._packing import Rows
from ._residuals import Layout, TapeRows
from ._sweep import Cotangents, split_floats
from ._tick_vjp import (
    accumulate,
    add,
    emit_fn,
    emit_vjp,
    read_leaves,
    reads_params,
    step_fn,
    where_or_zero,
)

# (tick, cotangent of the carry after it) and (parameters' cotangent, output buffers').
_Small = tuple[Int[Array, ""], PyTree]
_Large = tuple[PyTree, Buffers]


def reverse_tape(
    loop: Loop,
    params: PyTree,
    diff: PyTree[bool],
    slots: Rows,
    span: tuple[Int[Array, ""], Int[Array, ""]],
    start: Cotangents,
    ct_buffers: Buffers,
    rows: tuple[Layout, TapeRows],
    batched: bool,
) -> tuple[Cotangents, Buffers]:
    """Ticks `span` = (first, last) are on the tape `slots`, tick k at row k - first:
    reverse them tick by tick, no recomputation. `start` holds the cotangents (of the
    carry after `last`, of the parameters so far) to begin from; where last < first no
    tick runs and they come back unchanged. Returns those of (the carry before `first`,
    the parameters) and what is left of the output cotangents.

    `rows`: (layout, `TapeRows`) of the rows, which hold each step's residuals (taping;
    online slots, beside the state, when they never had to thin): a step's VJP is its
    stored pullback applied, with no evaluation of the step.

    Each iteration reverses the run of emits that follows a step (an inner loop touching
    only the output cotangents), then the step. Organised by steps rather than by emits
    so that under `vmap`, where the samples move in lockstep, the expensive tick (a
    step's VJP) runs once per step of the slowest sample, not once per tick of any kind."""
    params_f, params_s = eqx.partition(params, diff)
    lo, hi = span
    ct_final, ct_params = start
    layout, tape = rows
    carry_at = lambda k: tape.carry(slots, k - lo)
    if tape.combined:  # a state in every row: the tick's kind is read from it
        is_carry = lambda k: loop.pending(carry_at(k))
    else:
        is_carry = lambda k: tape.is_carry(slots, k - lo)

    def step_vjp(k: Int[Array, ""], ct_carry: PyTree) -> Cotangents:
        dp, dc = layout.vjp(tape.residuals(slots, k - lo), params)(ct_carry)
        return dc, dp

    def masked_step_vjp(k: Int[Array, ""], ct_carry: PyTree, mask: Bool[Array, ""]) -> Cotangents:
        dc, dp = step_vjp(k, ct_carry)
        return dc, where_or_zero(mask, dp)

    example_f, example_s = split_floats(carry_at(lo))
    emit_reads_params = reads_params(emit_fn(loop, params_s, example_s), params_f, example_f)

    def emit_tick(small: _Small, large: _Large, active: Bool[Array, ""]) -> tuple[_Small, _Large]:
        k, ct_carry = small
        ct_params, ct_bufs = large
        carry_f, carry_s = split_floats(carry_at(k))
        emit = emit_fn(loop, params_s, carry_s)
        dp, dc, ct_bufs = emit_vjp(
            emit, params_f, carry_f, ct_carry, ct_bufs, active, wrt_params=emit_reads_params
        )
        if emit_reads_params:
            ct_params = accumulate(active, ct_params, dp, params_f)
        return (k - 1, dc), (ct_params, ct_bufs)

    def is_emit(k: Int[Array, ""]) -> Bool[Array, ""]:
        return (k >= lo) & is_carry(jnp.maximum(k, lo))

    def is_step(k: Int[Array, ""]) -> Bool[Array, ""]:
        return (k >= lo) & ~is_carry(jnp.maximum(k, lo))

    def emits_then_step(
        small: _Small, large: _Large, active: Bool[Array, ""]
    ) -> tuple[_Small, _Large]:
        """Batched: the run of emits after a step, then the step, whose VJP runs only
        when some sample steps."""
        (k, ct_carry), (ct_params, ct_bufs) = lockstep_while(
            lambda s, b: is_emit(s[0]),
            lambda s, b, a: emit_tick(s, b, a & active),
            small,
            large,
            True,
        )
        stepping = active & (k >= lo)

        def step() -> tuple[PyTree, PyTree]:
            dc, dp = masked_step_vjp(jnp.maximum(k, lo), ct_carry, stepping)
            # Added inside the branch: the parameters' cotangent (one per sample under
            # `vmap`, a batch of weight-sized arrays) is then written once per step.
            return tree_where(stepping, dc, ct_carry), add(ct_params, dp)

        ct_carry, ct_params = if_any(stepping, step, lambda: (ct_carry, ct_params))
        return (k - 1, ct_carry), (ct_params, ct_bufs)

    # Carry leaves a step reads: only their cotangents change along a run of steps. The
    # others' (an interpolation row, which only an emit reads) enter the run's first
    # step and are zero after it; carrying them through the run would rewrite them with
    # zeros every step, which XLA does with a copy per leaf. (Batched, steps are not run
    # in such runs, and the step is not traced again to find these.)
    live: tuple[bool, ...] = ()
    if not batched:
        live = read_leaves(step_fn(loop, params_s, example_s), params_f, example_f)[1]
    ct_live = lambda ct: tuple(c for c, r in zip(jtu.tree_leaves(ct), live) if r)

    def with_live(ct: PyTree, values: Iterable[Array]) -> PyTree:
        leaves, treedef = jtu.tree_flatten(ct)
        values = iter(values)
        return jtu.tree_unflatten(treedef, [next(values) if r else c for c, r in zip(leaves, live)])

    def steps_then_emit(
        small: _Small, large: _Large, active: Bool[Array, ""]
    ) -> tuple[_Small, _Large]:
        """Unbatched: the run of steps before an emit in a tight inner loop, then the
        emit."""
        ct_params, ct_bufs = large
        first, ct_carry = small

        def one_step(
            k: Int[Array, ""], values: tuple[Array, ...], ct_params: PyTree
        ) -> tuple[tuple[Int[Array, ""], tuple[Array, ...]], PyTree]:
            zero_unless_first = lambda c: jnp.where(k == first, c, jnp.zeros_like(c))
            ct = with_live(jtu.tree_map(zero_unless_first, ct_carry), values)
            dc, dp = step_vjp(k, ct)
            return (k - 1, ct_live(dc)), add(ct_params, dp)

        (k, values), ct_params = lockstep_while(
            lambda s, p: is_step(s[0]),
            lambda s, p, a: one_step(*s, p),
            (first, ct_live(ct_carry)),
            ct_params,
            False,
        )
        stepped = lambda c: jnp.where(k < first, jnp.zeros_like(c), c)
        small = (k, with_live(jtu.tree_map(stepped, ct_carry), values))
        return lax.cond(
            k >= lo,
            lambda: emit_tick(small, (ct_params, ct_bufs), jnp.asarray(True)),
            lambda: (small, (ct_params, ct_bufs)),
        )

    (_, ct_init), (ct_params, ct_buffers) = lockstep_while(
        lambda s, b: s[0] >= lo,
        lambda s, b, a: (emits_then_step if batched else steps_then_emit)(s, b, a),
        (hi, ct_final),
        (ct_params, ct_buffers),
        batched,
    )
    return (ct_init, ct_params), ct_buffers
