"""How much arithmetic a traced step does: a count of its floating-point operations.

The default adjoint weighs a step's arithmetic against the bytes its tape row takes
(`RecursiveCheckpointAdjoint`): a step of a few operations a point (a discretised field)
recomputes faster than its row is written, paged in and read back, and a step dominated
by matrix products (a neural field) does not. The count is coarse by design: a product
`dot_general` counts two operations per multiply-add, every other primitive one per
element of its outputs; a branch counts its dearest branch, a loop its body once per
known iteration (once when its length is not known at trace time).
"""

import math

from jax.extend.core import ClosedJaxpr, Jaxpr


def _size(var) -> int:
    return math.prod(getattr(var.aval, "shape", ()))


def _sub_jaxprs(params: dict) -> list[Jaxpr]:
    """The jaxprs a primitive's parameters hold (a `pjit`'s, a `cond`'s branches, ...)."""
    found = []
    for value in params.values():
        for item in value if isinstance(value, tuple | list) else (value,):
            if isinstance(item, ClosedJaxpr):
                found.append(item.jaxpr)
            elif isinstance(item, Jaxpr):
                found.append(item)
    return found


def operations(jaxpr: Jaxpr) -> int:
    """The floating-point operations `jaxpr` does, counted as above."""
    total = 0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        inner = _sub_jaxprs(eqn.params)
        if name == "dot_general":
            (contracting, _), _ = eqn.params["dimension_numbers"]
            lhs_shape = getattr(eqn.invars[0].aval, "shape", ())
            depth = math.prod(lhs_shape[d] for d in contracting)
            total += 2 * depth * sum(_size(v) for v in eqn.outvars)
        elif name == "cond":
            total += max((operations(j) for j in inner), default=0)
        elif inner:
            repeats = eqn.params.get("length", 1) if name == "scan" else 1
            total += repeats * sum(operations(j) for j in inner)
        else:
            total += sum(_size(v) for v in eqn.outvars)
    return total
