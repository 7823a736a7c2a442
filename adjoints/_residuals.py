"""Taping a step's linearisation: its residuals, stored step by step.

`jax.linearize` splits a step into a forward part, which produces the step's output and
the *residuals* (the intermediate values its derivative needs), and a linear map, the
step's derivative, that reads them; the map's transpose is the step's VJP. Taping the
residuals rather than the state before the step means the reverse sweep applies only the
transpose: the step is never evaluated again. This is what `lax.scan` does under `grad`.
The linear map itself, rather than a pullback (`jax.vjp`), is kept: its leaves are the
residuals, so the map is rebuilt from a taped row and the loop's parameters (`Layout`) and
transposed there (`transposed`).

A linearisation is a PyTree whose leaves are its residuals. Some of them are the same on
every step and are not stored:
- the loop's parameters themselves (a weight matrix that a layer's transpose multiplies
  by): taken from the parameters again in the reverse sweep;
- constants (concrete arrays made while tracing): taken from a fresh trace of the step.
The rest are packed into one float row and one int32 row per step (see `Packing`).
"""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax.extend.core import Jaxpr, Literal
from jaxtyping import Array, ArrayLike, Bool, Int, PyTree

from ._concrete import is_concrete
from ._contractions import with_short_contractions
from ._loop import Loop, emit_fn
from ._packing import Packing, Rows, common_float
from ._rows import read_row, write_row
from ._work import operations

_TAPED, _PARAM, _CONST = "taped", "param", "const"

# A step's linearisation: (tangents of the differentiated parameters, of the carry's float
# leaves) -> tangent of the new carry's float leaves. A PyTree whose leaves are residuals.
Linearisation = Callable[[PyTree, PyTree], PyTree]
# A step's VJP: cotangent of the new carry's float leaves -> those of (differentiated
# parameters, the carry's float leaves).
StepVJP = Callable[[PyTree], tuple[PyTree, PyTree]]


def linearise(
    loop: Loop, params: PyTree, diff: PyTree[bool], carry: PyTree
) -> tuple[PyTree, Linearisation]:
    """One step of `loop` from `carry`, and its linearisation: a linear function of the
    tangents of (the differentiated parameters, the carry's float leaves) giving that of
    the new carry's float leaves (`transposed` makes it the step's VJP). `diff`: which
    parameter leaves are differentiated."""
    params_f, params_s = eqx.partition(params, diff)
    carry_f, carry_s = loop.split(carry)

    def step(pf: PyTree, cf: PyTree) -> tuple[PyTree, PyTree]:
        new = loop.body(eqx.combine(pf, params_s), eqx.combine(cf, carry_s))
        return loop.split(new)

    new_f, lin, new_s = jax.linearize(step, params_f, carry_f, has_aux=True)
    return eqx.combine(new_f, new_s), lin


def transposed(lin: Linearisation, params_f: PyTree, carry_f: PyTree) -> StepVJP:
    """The VJP of a step from its linearisation: (cotangent of the new carry's float
    leaves) -> those of (`params_f`, `carry_f`); these give only shapes and dtypes. Its
    short contractions are written out (see `_contractions`)."""
    return with_short_contractions(lambda ct: jax.linear_transpose(lin, params_f, carry_f)(ct))


class Layout:
    """Which leaves of a step's linearisation are taped, and how to put it back together.

    Built at trace time from one traced linearisation; the forward and the reverse sweep each
    build their own from the same step, so both agree on the order of the taped leaves.
    """

    def __init__(
        self, linearisation: Linearisation, params: PyTree, tangents: tuple[PyTree, PyTree]
    ) -> None:
        self.tangents = tangents  # shapes of (differentiated params, carry float leaves)
        # The step's floating-point operations (`_work`), counted where it is traced.
        self.operations = 0
        leaves, self.treedef = jtu.tree_flatten(linearisation)
        param_leaves = jtu.tree_leaves(params)
        # Per leaf of the linearisation: where it comes from, and its index there.
        self.kinds: list[tuple[str, int]] = []
        self.consts: list[ArrayLike] = []
        taped: list[Array] = []
        for leaf in leaves:
            where = [i for i, p in enumerate(param_leaves) if leaf is p]
            if where:
                self.kinds.append((_PARAM, where[0]))
            elif is_concrete(leaf):
                self.kinds.append((_CONST, len(self.consts)))
                self.consts.append(leaf)
            else:
                self.kinds.append((_TAPED, len(taped)))
                taped.append(leaf)
        self.packing = Packing.of(tuple(taped))

    def fold(self, constants: dict[int, np.ndarray]) -> None:
        """Make taped leaves known to be constants (taped position -> value) constants:
        a tableau coefficient multiplying a stage is a residual of the step, traced as a
        value but the same on every step, and need not be stored."""
        kept: list[int] = []
        for n, (kind, i) in enumerate(self.kinds):
            if kind != _TAPED:
                continue
            if i in constants:
                self.kinds[n] = (_CONST, len(self.consts))
                self.consts.append(constants[i])
            else:
                self.kinds[n] = (_TAPED, len(kept))
                kept.append(i)
        shapes = [(self.packing.shapes[i], self.packing.dtypes[i]) for i in kept]
        self.packing = Packing.of(tuple(jnp.zeros(shape, dtype) for shape, dtype in shapes))

    def taped(self, linearisation: Linearisation) -> tuple[Array, ...]:
        """The leaves of `linearisation` (traced like the one this layout was built from) to
        store."""
        leaves = jtu.tree_leaves(linearisation)
        return tuple(x for x, (kind, _) in zip(leaves, self.kinds) if kind == _TAPED)

    def rebuild(self, taped: tuple[Array, ...], params: PyTree) -> Linearisation:
        """The step's linearisation, from its stored leaves and the loop's parameters."""
        param_leaves = jtu.tree_leaves(params)
        sources = {_TAPED: taped, _PARAM: param_leaves, _CONST: self.consts}
        leaves = [sources[kind][i] for kind, i in self.kinds]
        return jtu.tree_unflatten(self.treedef, leaves)

    def vjp(self, taped: tuple[Array, ...], params: PyTree) -> StepVJP:
        """The step's VJP from its stored leaves and the loop's parameters."""
        return transposed(self.rebuild(taped, params), *self.tangents)


def layout_of(loop: Loop, params: PyTree, diff: PyTree[bool], carry: PyTree) -> Layout:
    """The layout of one step's linearisation. Traced abstractly (`eqx.filter_make_jaxpr`): the
    step is not evaluated, so a field with side effects (a callback) does not run for it;
    residuals that the trace shows to be literals are constants, not taped.
    Remembered on the loop (`Loop.memo`, so for one solve): choosing a schedule, the forward
    sweep and the reverse sweep each ask for it, and tracing a step is the dearest part of
    compiling a gradient."""
    carry = _traceable(carry)
    key = (_signature(params), _signature(diff), _signature(carry))
    known = loop.memo.get(key)
    if isinstance(known, Layout):
        return known
    found: list[Layout] = []

    def trace(params: PyTree, carry: PyTree) -> tuple[Array, ...]:
        _, linearisation = linearise(loop, params, diff, carry)
        shapes = jax.eval_shape(lambda: (eqx.filter(params, diff), loop.split(carry)[0]))
        found.append(Layout(linearisation, params, shapes))
        return found[0].taped(linearisation)

    closed = eqx.filter_make_jaxpr(trace)(params, carry)[0]
    found[0].fold(_literals(closed.jaxpr))
    found[0].operations = operations(closed.jaxpr)
    loop.memo.put(key, found[0])
    return found[0]


def _traceable(carry: PyTree) -> PyTree:
    """A carry's Python and NumPy scalars and arrays as JAX arrays, so that the layout's
    trace sees them as values, as every sweep's steps do (they step carries the loop
    made). The reverse sweep receives the initial carry with some leaves made concrete
    (a flag as a Python bool): traced with those constants, the step would show other
    residuals as literals (a `cond`'s branch index), and the sweeps would pack different
    rows."""
    concrete = (bool, int, float, np.ndarray, np.generic)
    return jtu.tree_map(lambda x: jnp.asarray(x) if isinstance(x, concrete) else x, carry)


def _literals(jaxpr: Jaxpr) -> dict[int, np.ndarray]:
    """Outputs of `jaxpr` that are literals: position -> value."""
    # A literal's `aval` is a `ShapedArray`; JAX types it as the base `AbstractValue`.
    return {
        i: np.asarray(v.val, v.aval.dtype).reshape(v.aval.shape)  # type: ignore[attr-defined]
        for i, v in enumerate(jaxpr.outvars)
        if isinstance(v, Literal)
    }


def _signature(tree: PyTree) -> tuple[jtu.PyTreeDef, tuple[Any, ...]]:
    """Structure, shapes and dtypes of a PyTree's arrays; other leaves as they are."""
    leaves, treedef = jtu.tree_flatten(tree)
    spec = lambda x: (x.shape, x.dtype) if eqx.is_array(x) else x
    return treedef, tuple(spec(x) for x in leaves)


class TapeRows:
    """Rows of residuals, alone or beside a state.

    - Taping (`combined=False`): tick k's row holds the residuals of step k or, for an
      emit, the carry before it (an emit is not linearised ahead: its VJP reads and
      clears output cotangents). Column 0 of the int row says which (1: a carry).
    - Online checkpointing (`combined=True`): a slot holds a state, which recomputation
      restarts from, and beside it the residuals of the step from that state, which the
      reverse sweep uses while the slots still hold every tick in order. The state comes
      first, so `_put`/`_get` of a bare state work on these rows too.

    `batched`: the rows are written and read under `vmap`, a row per sample (see `_rows`).
    """

    def __init__(
        self, carry: Packing, residuals: Packing, combined: bool = False, batched: bool = False
    ) -> None:
        self.carry_packing, self.residual_packing = carry, residuals
        self.batched = batched
        (cf, ci), (rf, ri) = carry.sizes(), residuals.sizes()
        self.combined = combined
        if combined:
            self.float_width, self.int_width = cf + rf, ci + ri
            self.carry_at, self.residuals_at = (0, 0), (cf, ci)
        else:
            self.float_width, self.int_width = max(cf, rf), 1 + max(ci, ri)
            self.carry_at, self.residuals_at = (0, 1), (0, 1)
        self.float_dtype = common_float(carry.float_dtype, residuals.float_dtype)

    def empty(self, n: int) -> Rows:
        jnp = jax.numpy
        return (
            jnp.zeros((n, self.float_width), self.float_dtype),
            jnp.zeros((n, self.int_width), jnp.int32),
        )

    def _put(
        self,
        slots: Rows,
        i: Int[ArrayLike, ""],
        packing: Packing,
        tree: PyTree,
        at: tuple[int, int],
        kind: int,
    ) -> Rows:
        jnp = jax.numpy
        floats, ints = packing.pack(tree)
        if not self.combined:  # the kind column, then the ints
            ints = jnp.concatenate([jnp.full((1,), kind, jnp.int32), ints])
            at = (at[0], 0)
        put = lambda s, r, c: write_row(s, i, r, c, self.batched)
        return put(slots[0], floats, at[0]), put(slots[1], ints, at[1])

    def put_carry(self, slots: Rows, i: Int[ArrayLike, ""], carry: PyTree) -> Rows:
        return self._put(slots, i, self.carry_packing, carry, self.carry_at, 1)

    def put_residuals(self, slots: Rows, i: Int[ArrayLike, ""], taped: tuple[Array, ...]) -> Rows:
        return self._put(slots, i, self.residual_packing, taped, self.residuals_at, 0)

    def zero_residuals(self) -> tuple[Array, ...]:
        """Residuals of the right shapes, all zero (what a skipped step stores)."""
        jnp = jax.numpy
        f, i = self.residual_packing.sizes()
        zeros = (jnp.zeros((f,), self.float_dtype), jnp.zeros((i,), jnp.int32))
        return self.residual_packing.unpack(zeros)

    def is_carry(self, slots: Rows, k: Int[ArrayLike, ""]) -> Bool[Array, ""]:
        """Taping only: whether tick k's row holds a carry (an emit's)."""
        return read_row(slots[1], k, 0, 1, self.batched)[0] == 1

    def _read(
        self, slots: Rows, k: Int[ArrayLike, ""], packing: Packing, at: tuple[int, int]
    ) -> PyTree:
        f, i = packing.sizes()
        get = lambda s, c, n: read_row(s, k, c, n, self.batched)
        return packing.unpack((get(slots[0], at[0], f), get(slots[1], at[1], i)))

    def carry(self, slots: Rows, k: Int[ArrayLike, ""]) -> PyTree:
        return self._read(slots, k, self.carry_packing, self.carry_at)

    def residuals(self, slots: Rows, k: Int[ArrayLike, ""]) -> tuple[Array, ...]:
        return self._read(slots, k, self.residual_packing, self.residuals_at)


def tape_rows(
    loop: Loop, params: PyTree, diff: PyTree[bool], carry: PyTree, combined: bool = False
) -> tuple[Layout, TapeRows]:
    """A step's layout and rows sized for it and for `carry` (see `TapeRows`): taping,
    an emit's row holds only the leaves of the carry its reversal reads
    (`emit_inputs`); an online slot holds the whole carry, which recomputation restarts
    from."""
    layout = layout_of(loop, params, diff, carry)
    kept = Packing.of(carry)
    if not combined and loop.max_emits:
        kept = Packing.of(
            carry, jtu.tree_map(lambda r: not r, emit_inputs(loop, params, diff, carry))
        )
    return layout, TapeRows(kept, layout.packing, combined, loop.batch_size > 1)


def emit_inputs(loop: Loop, params: PyTree, diff: PyTree[bool], carry: PyTree) -> PyTree[bool]:
    """Which leaves of `carry` reversing an emit from it reads (a carry-shaped tree of
    bools): those its linearisation's residuals and the rows it writes are made from.

    An emit interpolates the step before it: linear in the step's dense vectors, which
    are most of the carry, whenever its times are not differentiated. Its VJP then reads
    none of them, only the times that place the save times on the step, and a taped
    emit need not store them. Save times between the steps make about half the ticks
    emits, and a tape row holds the larger of a step's residuals and an emit's carry (256
    solves of a state of 64 with 20 save times: segments of 3 ticks with whole carries,
    of 7 without). A leaf left out comes back as zeros, which the VJP never reads."""
    carry = _traceable(carry)
    key = ("emit", _signature(params), _signature(diff), _signature(carry))
    known = loop.memo.get(key)
    if known is not None:
        return known
    params_f, params_s = eqx.partition(params, diff)

    def made_from(params_f: PyTree, carry: PyTree) -> tuple[list[Array], tuple]:
        carry_f, carry_s = loop.split(carry)
        emit = emit_fn(loop, params_s, carry_s)
        _, linearisation, rows = jax.linearize(emit, params_f, carry_f, has_aux=True)
        return jtu.tree_leaves(linearisation), rows

    closed = jax.make_jaxpr(made_from)(params_f, carry)
    read = _inputs_read(closed.jaxpr)[len(jtu.tree_leaves(params_f)) :]
    found = jtu.tree_unflatten(jtu.tree_structure(carry), read)
    loop.memo.put(key, found)
    return found


def _inputs_read(jaxpr: Jaxpr) -> list[bool]:
    """For each input of `jaxpr`, whether an output is computed from it. Conservative:
    an equation that makes a needed value needs all of its inputs."""
    needed = {v for v in jaxpr.outvars if not isinstance(v, Literal)}
    for eqn in reversed(jaxpr.eqns):
        if any(v in needed for v in eqn.outvars):
            needed.update(v for v in eqn.invars if not isinstance(v, Literal))
    return [v in needed for v in jaxpr.invars]
