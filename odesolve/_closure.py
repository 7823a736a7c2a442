"""A user function traced once per solve, and called through its trace.

A vector field (or an event condition) may be a function, a closure over arrays or
tracers (model parameters, values of an enclosing `jax.grad`) or an `eqx.Module`. Before
it crosses the adjoint's custom-derivative boundary, and before the solve's own `jit`,
every array it uses must be an explicit input: a captured tracer would get no cotangent,
and would leak into that `jit`'s cache. `trace_once` traces the function to a jaxpr,
with its own arrays (a Module's parameters) and the values it closed over as leaves.
Every later call evaluates the jaxpr: the user's Python runs once per solve however
many steps, sweeps and transformations trace the loop.

The jaxpr is kept for functions of the same structure (the same function, or a Module
of the same type and shapes with new values) called with arguments of the same shapes,
so a notebook that solves again and again, or differentiates an eager solve again and
again, reuses one compilation; a trace that captured a tracer is never kept. As with
`jax.jit`, a function must then be pure: one that reads a global changed between calls
is not traced again.
"""

import collections
from collections.abc import Callable, Hashable
from typing import Any

import equinox as eqx
import jax
import jax.tree_util as jtu

from adjoints import is_concrete

from ._flat import PyTree

Record = tuple[tuple[Any, ...], Any]


def _strip(x: PyTree) -> Any:
    """Arrays are recorded by shape and dtype with weak types stripped (a weak and a
    strong float64 are the same input); anything else, Python numbers included (they
    are baked into the trace), by value."""
    if eqx.is_array(x):
        return jax.ShapeDtypeStruct(x.shape, x.dtype)
    return x


def shape_record(tree: PyTree) -> Record:
    """Static record of `tree`: its array leaves as `ShapeDtypeStruct`s, other leaves by
    value, and its treedef. Hashable when the non-array leaves are."""
    leaves, treedef = jtu.tree_flatten(tree)
    return tuple(_strip(x) for x in leaves), treedef


class TracedFunction(eqx.Module):
    """`fn` traced once to `jaxpr`. Leaves: `own`, the arrays of `fn` itself, and
    `captured`, the arrays it closed over; both get cotangents and tangents."""

    jaxpr: Any = eqx.field(static=True)
    own: list
    captured: list
    in_record: Record = eqx.field(static=True)
    out_struct: Any = eqx.field(static=True)  # ShapeDtypeStructs of the output
    name: str = eqx.field(static=True)

    def __call__(self, *args: PyTree) -> Any:
        got = shape_record(args)
        if got != self.in_record:
            raise TypeError(
                f"`{self.name}` was traced for arguments {self.in_record}, and called with "
                f"{got}. Trace it again for the new arguments."
            )
        flat = [x for x in jtu.tree_leaves(args) if eqx.is_array(x)]
        out = jax.core.eval_jaxpr(self.jaxpr, self.captured, *self.own, *flat)
        return jtu.tree_unflatten(jtu.tree_structure(self.out_struct), out)


def _trace(fn: Callable, example_args: tuple) -> TracedFunction:
    fn_leaves, fn_def = jtu.tree_flatten(fn)
    own_at = [i for i, x in enumerate(fn_leaves) if eqx.is_array(x)]
    dynamic, static = eqx.partition(example_args, eqx.is_array)

    def with_explicit_leaves(own: list, dynamic_args: PyTree) -> Any:
        leaves = list(fn_leaves)
        for i, x in zip(own_at, own, strict=True):
            leaves[i] = x
        return jtu.tree_unflatten(fn_def, leaves)(*eqx.combine(dynamic_args, static))

    own = [fn_leaves[i] for i in own_at]
    name = getattr(fn, "__name__", type(fn).__name__)
    try:
        closed, out_struct = jax.make_jaxpr(with_explicit_leaves, return_shape=True)(own, dynamic)
    except jax.errors.ConcretizationTypeError as error:
        # JAX's message names this module's wrapper, not the user's function.
        raise TypeError(
            "it reads the value of an array it is given (an `if` or `while` on it, "
            "or bool(), float(), int() of it): inside a solve its arguments are traced, "
            "without values. Branch with jnp.where(condition, a, b) or jax.lax.cond, and "
            "keep numbers that decide the program's shape out of y and args (close over "
            f"them). JAX's message: {str(error).splitlines()[0]}"
        ) from error
    return TracedFunction(
        _without_consts(closed.jaxpr),
        own,
        list(closed.consts),
        shape_record(example_args),
        out_struct,
        name,
    )


def _without_consts(jaxpr: Any) -> Any:
    """`jaxpr` holding no constant values. Newer JAX keeps the constants inside the
    jaxpr too; the jaxpr is a static field (part of a cache key in every `jit` that
    sees it), so a constant that is a tracer would leak through it. Replacing the
    const variables by themselves drops the held values; they are passed explicitly
    (`captured`) at every call."""
    return jaxpr.replace(constvars=jaxpr.constvars)


_SIZE = 32
_kept: collections.OrderedDict[Hashable, TracedFunction] = collections.OrderedDict()


def _key(fn: Callable, example_args: tuple) -> Hashable | None:
    """What the trace depends on: `fn`'s structure and non-array leaves, and the
    arguments' record, or None when that is not hashable. Arrays, of `fn` or of the
    arguments, count by shape and dtype only, traced or not: the trace takes them as its
    inputs, so an eager `grad` or `vmap` around the solve finds the trace kept by its
    last call, and the solve's `jit` finds its compiled program."""
    key = (shape_record(fn), shape_record(example_args), _weak_types((fn, example_args)))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _weak_types(tree: PyTree) -> tuple[bool, ...]:
    """Which array leaves are weakly typed. A trace made for a weak input (a Python
    number made an array) holds a conversion that one made for a strong input does not,
    so its step's linearisation has another residual: the two are kept apart."""
    return tuple(bool(jax.typeof(x).weak_type) for x in jtu.tree_leaves(tree) if eqx.is_array(x))


def trace_once(fn: Callable, *example_args: PyTree) -> TracedFunction:
    """`fn` as a `TracedFunction` for calls shaped like `example_args` (arrays or
    `ShapeDtypeStruct`s; other leaves are fixed by value)."""
    key = _key(fn, example_args)
    kept = None if key is None else _kept.get(key)
    if kept is None:
        traced = _trace(fn, example_args)
        # A closure over a tracer (of an eager `grad`) must never be kept, nor the
        # function's own arrays, which may be tracers: each call brings its own.
        if key is not None and all(is_concrete(c) for c in traced.captured):
            _kept[key] = eqx.tree_at(lambda f: f.own, traced, [])
            while len(_kept) > _SIZE:
                _kept.popitem(last=False)
        return traced
    _kept.move_to_end(key)
    own = [x for x in jtu.tree_leaves(fn) if eqx.is_array(x)]
    return eqx.tree_at(lambda f: f.own, kept, own)
