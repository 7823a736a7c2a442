"""The vector field with repeated operations merged, so that its cost does not depend on
how it is spelled.

A field that reads `y[0]` three times traces three slices of y; XLA merges them in the
forward solve, but reverse mode transposes each one separately (a pad and an add per
read), and the reverse sweep, which linearises the field again at every stage, pays for
every copy: the same mathematics then costs several times more when written one way than
another. Merging identical operations in the field's trace (common subexpression
elimination) before it is differentiated makes every spelling one trace.

Only operations without effects and without nested computations are merged; a field with
effects (a callback) is called as it is.
"""

from collections.abc import Callable
from typing import Any

import jax
import jax.tree_util as jtu
from jax.extend.core import (
    ClosedJaxpr,
    Jaxpr,
    JaxprEqn,
    Literal,
    Var,
    jaxpr_as_fun,
    jaxprs_in_params,
)


def deduplicated(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` (of arrays only) evaluated from its trace with identical operations merged."""

    def call(*args: Any) -> Any:
        closed, shapes = jax.make_jaxpr(fn, return_shape=True)(*args)
        if closed.effects:
            return fn(*args)
        merged = ClosedJaxpr(_merged(closed.jaxpr), closed.consts)
        out = jaxpr_as_fun(merged)(*jtu.tree_leaves(args))
        return jtu.tree_unflatten(jtu.tree_structure(shapes), out)

    return call


def _merged(jaxpr: Jaxpr) -> Jaxpr:
    """`jaxpr` with each equation that repeats an earlier one (same primitive, inputs and
    parameters) removed, its outputs read from the earlier one's."""
    renamed: dict[Var, Var] = {}
    seen: dict[Any, JaxprEqn] = {}
    eqns: list[JaxprEqn] = []
    rename = lambda v: renamed.get(v, v) if isinstance(v, Var) else v
    for eqn in jaxpr.eqns:
        eqn = eqn.replace(invars=[rename(v) for v in eqn.invars])
        key = _key(eqn)
        if key is not None and key in seen:
            renamed.update(zip(eqn.outvars, seen[key].outvars))
            continue
        if key is not None:
            seen[key] = eqn
        eqns.append(eqn)
    return jaxpr.replace(eqns=eqns, outvars=[rename(v) for v in jaxpr.outvars])


def _key(eqn: JaxprEqn) -> Any:
    """What identifies an equation's result, or None if it must not be merged."""
    if eqn.effects or any(True for _ in jaxprs_in_params(eqn.params)):
        return None
    inputs: list[Any] = []
    for v in eqn.invars:
        if isinstance(v, Literal):
            if getattr(v.aval, "shape", None) != ():
                return None
            inputs.append(("literal", v.val.item() if hasattr(v.val, "item") else v.val))
        else:
            inputs.append(v)
    try:
        key = (eqn.primitive, tuple(inputs), tuple(sorted(eqn.params.items())))
        hash(key)
    except TypeError:  # an unhashable parameter (an array): kept as it is
        return None
    return key
