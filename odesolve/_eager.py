"""An eager `diffeqsolve` as one cached dispatch.

Called outside any transformation, `diffeqsolve` would otherwise check and normalise its
inputs, trace the field's record and enter its compiled solve through `filter_jit` on
every call: about ten times the cost of the compiled call itself for a small problem.
Here a call is keyed by everything that fixes its program (the structure of all its
inputs, their non-array values, and the shapes and dtypes of their arrays); the first
call of a key traces the whole solve, checks and normalisation included, into one
`jax.jit`, and later calls only flatten their inputs and call it.

An array is an input of the program. Python numbers (times, a state or arguments given
as numbers) are fixed in it, so a call whose numbers differ from those its key was
compiled for takes the plain path, which makes them inputs of its own compiled solve:
a loop over `t1` values compiles once, as before. Times given as arrays also keep the
plain path, which reads their values when they are concrete. The functions a call uses
must be pure, as for `_closure`.
"""

import collections
import functools
import types
from collections.abc import Callable, Hashable
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from adjoints import is_concrete

_SIZE = 64
_ARRAYS = (jax.Array, np.ndarray, np.generic)
# Leaves fixed in a program by their value (as any leaf that is neither an array nor a
# number), found by their exact type.
_PLAIN = frozenset({bool, str, types.FunctionType, types.BuiltinFunctionType, functools.partial})


class _Compiled:
    """One program: `call(arrays)` runs it on a call's array leaves and rebuilds the
    output, whose non-array leaves are fixed by the trace."""

    def __init__(self, body: Callable[..., Any], treedef: Any, fixed: list, at: list[int]):
        self.out_def: Any = None
        self.out_fixed: list = []
        self.out_at: list[int] = []

        def flat_body(arrays: list) -> list:
            leaves = list(fixed)
            for i, x in zip(at, arrays, strict=True):
                leaves[i] = x
            out_leaves, self.out_def = jtu.tree_flatten(body(**jtu.tree_unflatten(treedef, leaves)))
            self.out_at = [i for i, x in enumerate(out_leaves) if isinstance(x, jax.Array)]
            self.out_fixed = [None if isinstance(x, jax.Array) else x for x in out_leaves]
            return [out_leaves[i] for i in self.out_at]

        self._jitted = jax.jit(flat_body)

    def __call__(self, arrays: list) -> Any:
        out = self._jitted(arrays)
        leaves = list(self.out_fixed)
        for i, x in zip(self.out_at, out, strict=True):
            leaves[i] = x
        return jtu.tree_unflatten(self.out_def, leaves)


# Per key: the numbers of the call it was compiled for, and its program.
_kept: collections.OrderedDict[Hashable, tuple[tuple, _Compiled]] = collections.OrderedDict()


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float | complex) and not isinstance(x, bool)


def _split(inputs: dict[str, Any]) -> tuple[Hashable, tuple, Any, list, list, list[int]] | None:
    """(key, the Python numbers, treedef, the non-array leaves with None at the arrays,
    the arrays, where they go), or None when the call cannot be cached: a traced input,
    or a non-array leaf that is not hashable. Numbers are apart from the key: see
    `cached_call`."""
    leaves, treedef = jtu.tree_flatten(inputs)
    record: list = []
    numbers: list = []
    fixed: list = []
    arrays: list = []
    at: list[int] = []
    for i, x in enumerate(leaves):
        kind = type(x)
        # Most leaves are Python scalars and functions: told apart by their exact type
        # before the slower checks against the array types (NumPy's float64 subclasses
        # float, so only the exact types are taken here).
        if kind in _PLAIN:
            record.append((kind, x))
            fixed.append(x)
            continue
        if kind is float or kind is int or kind is complex:
            record.append(kind)
            numbers.append(x)
            fixed.append(x)
            continue
        if isinstance(x, _ARRAYS):
            if isinstance(x, jax.core.Tracer):
                return None
            # (A PRNG key array has no weak type: it is refused by the checks that follow.)
            weak = isinstance(x, jax.Array) and getattr(x, "weak_type", False)
            record.append((x.shape, x.dtype, weak))
            fixed.append(None)
            arrays.append(x)
            at.append(i)
            continue
        if _is_number(x):
            record.append(type(x))
            numbers.append(x)
        else:
            record.append((type(x), x))
        fixed.append(x)
    key = (treedef, tuple(record))
    try:
        hash(key)
    except TypeError:
        return None
    return key, tuple(numbers), treedef, fixed, arrays, at


def cached_call(body: Callable[..., Any], inputs: dict[str, Any]) -> Any | None:
    """`body(**inputs)` through the program kept for the call's key, compiled on the
    first call of the key. None, for the caller to run `body` itself, when the call is
    not eager (inside a transformation), cannot be keyed, or fails to trace; and when
    its key was compiled for other Python numbers: the plain path takes times, states
    and so on given as numbers as inputs of its own compiled solve, so that a loop over
    `t1` values does not compile once per value."""
    split = _split(inputs)
    if split is None:
        return None
    key, numbers, treedef, fixed, arrays, at = split
    kept = _kept.get(key)
    if kept is not None:
        if kept[0] != numbers:
            return None
        _kept.move_to_end(key)
        return kept[1](arrays)
    # Inside a `jit` of the caller's, arrays made here are tracers: not eager.
    if not is_concrete(jnp.zeros(())):
        return None
    compiled = _Compiled(body, treedef, fixed, at)
    try:
        out = compiled(arrays)
    except jax.errors.JaxRuntimeError:  # raised while running: the solve's own error
        raise
    except Exception:
        # Raised while tracing: bad input. The plain path raises it again, where the
        # error's hints can read the input's values.
        return None
    _kept[key] = (numbers, compiled)
    while len(_kept) > _SIZE:
        _kept.popitem(last=False)
    return out


# Checks of time arrays passed on these arrays (held, so that their ids stay theirs).
_checked: collections.OrderedDict[Hashable, tuple] = collections.OrderedDict()


def check_once(check: Callable[[], Any], arrays: list, numbers: Hashable) -> None:
    """Run `check`, which reads `arrays` and `numbers` only, unless it passed before on
    these very arrays and numbers: a JAX array cannot change, so it would pass again (a
    loop that saves at the same `ts` checks them once). NumPy arrays can change: always
    checked, and traced arrays are never kept."""
    if not all(isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer) for a in arrays):
        check()
        return
    key = (tuple(id(a) for a in arrays), numbers)
    if key in _checked:
        _checked.move_to_end(key)
        return
    check()
    _checked[key] = tuple(arrays)
    while len(_checked) > _SIZE:
        _checked.popitem(last=False)
