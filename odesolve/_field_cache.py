"""Vector fields already checked, for solves called outside any `jit`.

Checking a field traces it (its output must match y0, and a closure over a traced value
must be made explicit; see `_validate._converted_vector_field`). A notebook that calls
`diffeqsolve` again and again with the same field would pay that trace every call. When
nothing about the call is traced (every input concrete, and no `jit` being traced), the
outcome depends only on the field object and the shapes and dtypes of its inputs, so it
is remembered here for the most recent fields. As with `jax.jit`, a field must be a pure
function of (t, y, args) and of what it closes over when made: one that reads a global
changed between calls is not traced again.
"""

import collections
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax.numpy as jnp
import jax.tree_util as jtu

from adjoints import is_concrete

_SIZE = 32
_checked: collections.OrderedDict = collections.OrderedDict()


def _key(vf: Callable, example_args: tuple) -> Any:
    """The field itself (held, so that its id stays its own) and the structure, shapes
    and dtypes of its inputs, with their non-array leaves by value. None: not cacheable."""
    leaves, treedef = jtu.tree_flatten(example_args)
    kinds = tuple(
        (x.shape, x.dtype, getattr(x, "weak_type", False)) if eqx.is_array(x) else ("static", x)
        for x in leaves
    )
    key = (id(vf), treedef, kinds)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _untraced(vf: Callable, example_args: tuple) -> bool:
    """Whether nothing about this call is traced: no input, none of the field's arrays,
    and no `jit` being traced (a constant made now would be a tracer)."""
    arrays = [x for x in jtu.tree_leaves((vf, example_args)) if eqx.is_array(x)]
    return all(is_concrete(x) for x in arrays) and is_concrete(jnp.zeros(()))


def checked_once(check: Callable, vf: Callable, *example_args: Any) -> Any:
    """`check(vf, *example_args)`, remembered for untraced calls whose check returned
    the field unchanged (nothing to convert)."""
    key = _key(vf, example_args) if _untraced(vf, example_args) else None
    if key is not None and key in _checked:
        _checked.move_to_end(key)
        return _checked[key][1]
    result = check(vf, *example_args)
    if key is not None and result is vf:
        _checked[key] = (vf, result)
        while len(_checked) > _SIZE:
            _checked.popitem(last=False)
    return result
