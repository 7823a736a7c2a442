"""The vector-Jacobian product of one tick of a loop (an emit or a step), and the small
pieces the reverse sweeps share: reading and clearing an output row's cotangent, masking
and adding parameter cotangents.

Every cotangent here is one sample's: under `vmap` a parameter the samples share gets one
cotangent per sample, and `vmap`'s rules sum them where the composition asks for it.
"""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jax import lax
from jaxtyping import Array, ArrayLike, Bool, Int, PyTree

from ._lockstep import tree_where
from ._loop import Buffers, EmitFn, Loop, Write, emit_fn, scratch_row
from ._residuals import linearise, transposed
from ._rows import read_row, write_row

# Cotangents of (the differentiated parameters, or None; the carry's float leaves; the
# output buffers).
TickCotangents = tuple[PyTree, PyTree, Buffers]


def _read_row(buffer: PyTree, row: Int[ArrayLike, ""], batched: bool) -> PyTree:
    return jtu.tree_map(lambda b: read_row(b, row, batched=batched), buffer)


def _clear_row(buffer: PyTree, row: Int[ArrayLike, ""], batched: bool) -> PyTree:
    """A write's cotangent is taken once: earlier writes to the row were overwritten."""
    zero = lambda b: jnp.zeros((*jnp.shape(row), *b.shape[1:]), b.dtype)
    return jtu.tree_map(lambda b: write_row(b, row, zero(b), 0, batched), buffer)


def tick_vjp(
    loop: Loop,
    params: PyTree,
    carry: PyTree,
    scratch: tuple[Write, ...],
    ct_next: PyTree,
    ct_buffers: Buffers,
    diff: PyTree[bool],
) -> TickCotangents:
    """Cotangents of (params, carry) for one tick, given those of its outputs.

    The tick is an emit or a step depending on `pending(carry)`; branching here, outside
    the VJP, means each branch linearises only its own work, and only an emit reads and
    clears output cotangents."""
    params_f, params_s = eqx.partition(params, diff)
    carry_f, carry_s = loop.split(carry)
    ct_next = loop.split(ct_next)[0]

    def emit_branch(ct_buffers: Buffers) -> TickCotangents:
        emit = emit_fn(loop, params_s, carry_s)
        return emit_vjp(loop, emit, params_f, carry_f, ct_next, ct_buffers)

    def step_branch(ct_buffers: Buffers) -> TickCotangents:
        lin = linearise(loop, params, diff, carry)[1]
        ct_params, ct_carry = transposed(lin, params_f, carry_f)(ct_next)
        return ct_params, ct_carry, ct_buffers

    if loop.max_emits == 0:  # nothing is ever pending: no branch
        return step_branch(ct_buffers)
    return lax.cond(loop.pending(carry), emit_branch, step_branch, ct_buffers)


def batched_tick_vjp(
    loop: Loop,
    params: PyTree,
    diff: PyTree[bool],
    carry: PyTree,
    ct_next: PyTree,
    ct_buffers: Buffers,
    active: Bool[Array, ""],
    ct_params: PyTree,
) -> TickCotangents:
    """`tick_vjp` under `vmap`, where `active`, with the parameters' cotangent added to
    `ct_params` (nothing added where not `active`): returns it, the carry's cotangent
    (unchanged where not `active`) and the output buffers'. A step's VJP runs only when
    some sample steps, and adds its per-sample parameter cotangents inside that branch,
    so the batch of parameter-sized totals is written once per tick (see `reverse_tape`);
    a sample that emits reads and clears its rows, the others scratch rows."""
    params_f, params_s = eqx.partition(params, diff)
    carry_f, carry_s = loop.split(carry)
    ct_next = loop.split(ct_next)[0]
    pending = loop.pending(carry) if loop.max_emits else jnp.asarray(False)
    stepping, emitting = active & ~pending, active & pending

    def step_vjp() -> tuple[PyTree, PyTree]:
        lin = linearise(loop, params, diff, carry)[1]
        dp, dc = transposed(lin, params_f, carry_f)(ct_next)
        return tree_where(stepping, dc, ct_next), accumulate(stepping, ct_params, dp, params_f)

    ct_carry, ct_params = loop.if_stepping(stepping, step_vjp, lambda: (ct_next, ct_params))
    if loop.max_emits == 0:
        return ct_params, ct_carry, ct_buffers
    emit = emit_fn(loop, params_s, carry_s)
    emit_reads = reads_params(emit, params_f, carry_f)
    dp_e, dc_e, ct_buffers = emit_vjp(
        loop, emit, params_f, carry_f, ct_next, ct_buffers, emitting, wrt_params=emit_reads
    )
    ct_carry = tree_where(emitting, dc_e, ct_carry)
    if emit_reads:
        ct_params = accumulate(emitting, ct_params, dp_e, params_f)
    return ct_params, ct_carry, ct_buffers


def emit_vjp(
    loop: Loop,
    emit: EmitFn,
    params_f: PyTree,
    carry_f: PyTree,
    ct_carry: PyTree,
    ct_bufs: Buffers,
    active: Bool[ArrayLike, ""] = True,
    wrt_params: bool = True,
) -> TickCotangents:
    """Cotangents (of params, or None when not `wrt_params`; of the carry; of the output
    buffers) of one emit, given the carry's after it. Each write's cotangent is read from
    its buffer row, which is then cleared unless `loop.writes_once` (earlier writes to it
    were overwritten); an inactive sample (see `lockstep_while`) reads and clears scratch
    rows only. Under `vmap` (`loop.batch_size`) rows are read as `_rows` says."""
    batched = loop.batch_size > 1
    if wrt_params:
        _, pullback, rows = jax.vjp(emit, params_f, carry_f, has_aux=True)
    else:
        _, pull_carry, rows = jax.vjp(lambda cf: emit(params_f, cf), carry_f, has_aux=True)
        pullback = lambda ct: (None, *pull_carry(ct))
    rows = tuple(jnp.where(active, row, scratch_row(b)) for row, b in zip(rows, ct_bufs))
    ct_values = tuple(_read_row(ct_b, row, batched) for row, ct_b in zip(rows, ct_bufs))
    if not loop.writes_once:
        ct_bufs = tuple(_clear_row(ct_b, row, batched) for row, ct_b in zip(rows, ct_bufs))
    ct_params, ct_carry = pullback((ct_carry, ct_values))
    return ct_params, ct_carry, ct_bufs


def add(a: PyTree, b: PyTree) -> PyTree:
    """Leafwise sum of two PyTrees of one structure."""
    return jtu.tree_map(lambda x, y: x + y, a, b)


def where_or_zero(active: Bool[ArrayLike, ""], tree: PyTree) -> PyTree:
    """`tree` where `active`, zeros elsewhere."""
    return jtu.tree_map(lambda x: jnp.where(active, x, jnp.zeros_like(x)), tree)


def accumulate(active: Bool[ArrayLike, ""], total: PyTree, term: PyTree, params: PyTree) -> PyTree:
    """total + term where `active`, else total."""
    return add(total, where_or_zero(active, term))


def read_leaves(fn: Callable[..., PyTree], *inputs: PyTree) -> tuple[tuple[bool, ...], ...]:
    """For each input PyTree, whether `fn` reads each of its leaves. Conservative: a leaf
    passed into a nested call counts as read."""
    closed = jax.make_jaxpr(fn)(*inputs)
    used = {id(v) for eqn in closed.jaxpr.eqns for v in eqn.invars}
    used |= {id(v) for v in closed.jaxpr.outvars}
    out: list[tuple[bool, ...]] = []
    start = 0
    for tree in inputs:
        count = len(jtu.tree_leaves(tree))
        out.append(tuple(id(v) in used for v in closed.jaxpr.invars[start : start + count]))
        start += count
    return tuple(out)


def reads_params(emit: EmitFn, params_f: PyTree, carry_f: PyTree) -> bool:
    """Whether an emit reads any differentiated parameter: if not, its VJP takes no
    parameter cotangent."""
    return any(read_leaves(emit, params_f, carry_f)[0])


def step_fn(loop: Loop, params_s: PyTree, carry_s: PyTree) -> Callable[[PyTree, PyTree], PyTree]:
    """One step as a function of the differentiated float inputs: (params, carry) ->
    float leaves of the new carry."""

    def step(pf: PyTree, cf: PyTree) -> PyTree:
        new = loop.body(eqx.combine(pf, params_s), eqx.combine(cf, carry_s))
        return loop.split(new)[0]

    return step
