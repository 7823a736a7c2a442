"""Closure conversion: turn a callable into a PyTree whose array leaves are explicit.

A vector field may close over arrays or tracers (model parameters, values from an outer
`jax.grad`). Before it crosses a custom-VJP boundary every such value must be an explicit
input, or it gets no cotangent and its tracer leaks. `closure_convert` returns

- `TrivialClosure(fn)` when tracing `fn` captures nothing: `fn` itself is a PyTree (a plain
  function, or an `eqx.Module` whose arrays are its leaves), so nothing needs rewriting;
- `JaxprClosure(jaxpr, consts)` otherwise: `fn` traced to a jaxpr whose captured values
  (`consts`) become leaves.

Both record the input structure as static data (`ShapeDtypeStruct`s with weak types
stripped, and a treedef) and check every call against it. Static records are hashable and
survive `jit`/`eval_shape`, so a converted function crosses those boundaries without its
structure turning back into dynamic values.
"""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu

from ._concrete import is_concrete


def _strip(x: Any, numbers_by_value: bool) -> Any:
    """Arrays (and, unless `numbers_by_value`, Python numbers) are recorded by shape and
    dtype with weak types stripped: a weak and a strong float64 are the same input
    (equinox#854 hit exactly this). Anything else is static and recorded by value."""
    if eqx.is_array(x) or (eqx.is_array_like(x) and not numbers_by_value):
        x = jnp.asarray(x)
        return jax.ShapeDtypeStruct(x.shape, x.dtype)
    return x


def shape_record(tree: Any, numbers_by_value: bool = False) -> tuple[tuple[Any, ...], Any]:
    """Static record of `tree`: its leaves as `ShapeDtypeStruct`s (or the static values
    themselves) and its treedef. Hashable."""
    leaves, treedef = jtu.tree_flatten(tree)
    return tuple(_strip(x, numbers_by_value) for x in leaves), treedef


def _check_call(record, args, name: str, numbers_by_value: bool = False) -> None:
    got = shape_record(args, numbers_by_value)
    if got != record:
        raise TypeError(
            f"closure-converted `{name}` was called with arguments of structure {got}, "
            f"but it was converted for {record}. Convert it again for the new shapes."
        )


class TrivialClosure(eqx.Module):
    """`fn` captured nothing, so it is its own explicit form. `fn`'s array leaves (the
    parameters of an `eqx.Module` vector field) are this PyTree's leaves."""

    fn: Callable
    in_record: tuple = eqx.field(static=True)
    out_struct: Any = eqx.field(static=True)  # ShapeDtypeStructs of the output

    def __call__(self, *args):
        _check_call(self.in_record, args, getattr(self.fn, "__name__", "fn"))
        return self.fn(*args)


class JaxprClosure(eqx.Module):
    """`fn` traced once to a jaxpr; what it captured is in `consts` (leaves, so they get
    cotangents). `jaxpr` and the records are static."""

    jaxpr: Any = eqx.field(static=True)
    consts: list
    # Python numbers in the arguments were baked into the jaxpr, so they are recorded by
    # value: a conversion traced with `scale=1.0` must not silently run with 5.0.
    in_record: tuple = eqx.field(static=True)
    out_struct: Any = eqx.field(static=True)

    @property
    def captures_tracers(self) -> bool:
        """Whether it closed over values of an enclosing transformation."""
        return not all(is_concrete(c) for c in self.consts)

    def __call__(self, *args):
        _check_call(self.in_record, args, "fn", numbers_by_value=True)
        flat = jtu.tree_leaves(eqx.filter(args, eqx.is_array))
        out = jax.core.eval_jaxpr(self.jaxpr, self.consts, *flat)
        return jtu.tree_unflatten(jtu.tree_structure(self.out_struct), out)


def closure_convert(fn: Callable, *example_args: Any) -> TrivialClosure | JaxprClosure:
    """Make every array `fn` uses when called on `example_args` an explicit leaf.

    `example_args` may be arrays or `jax.ShapeDtypeStruct`s; they fix the call structure.
    Non-array leaves of `example_args` (a function or a string in `args`) are recorded
    statically and must be hashable; later calls must pass the same ones.
    """
    dynamic_args, static_args = eqx.partition(example_args, eqx.is_array)
    if not jtu.tree_leaves(dynamic_args):
        raise TypeError("closure_convert needs at least one array argument")
    fn_leaves, fn_def = jtu.tree_flatten(fn)
    dynamic = [i for i, x in enumerate(fn_leaves) if eqx.is_array(x)]

    def with_explicit_leaves(fn_arrays, args):
        leaves = list(fn_leaves)
        for i, x in zip(dynamic, fn_arrays, strict=True):
            leaves[i] = x
        return jtu.tree_unflatten(fn_def, leaves)(*eqx.combine(args, static_args))

    fn_arrays = [fn_leaves[i] for i in dynamic]
    closed, out_shape = jax.make_jaxpr(with_explicit_leaves, return_shape=True)(
        fn_arrays, dynamic_args
    )
    if not closed.consts:
        return TrivialClosure(fn, shape_record(example_args), out_shape)
    # Something was captured from a closure. Trace again with only `args` explicit so the
    # captured values, and `fn`'s own arrays, all become consts.
    closed = jax.make_jaxpr(lambda a: fn(*eqx.combine(a, static_args)))(dynamic_args)
    record = shape_record(example_args, numbers_by_value=True)
    return JaxprClosure(closed.jaxpr, list(closed.consts), record, out_shape)
