"""The vector field as the step loop calls it.

`FlatField` is the user's field on the flat state in internal time tau = direction * t
(see `_flat`), so that a backwards solve is the same loop. `Rematerialised` is that
field as a step uses it, for reverse mode's sake.
"""

from typing import Any

import equinox as eqx
import jax
import jax.tree_util as jtu
from jaxtyping import Array, Float

from ._dedupe import deduplicated
from ._flat import FlatSpec, PyTree, in_state_dtype
from ._term import ODETerm


class FlatField(eqx.Module):
    """dy/dtau = d * f(d * tau, y) on the flat state, d the direction of integration."""

    term: ODETerm
    spec: FlatSpec = eqx.field(static=True)
    direction: Any

    def __call__(self, tau: Float[Array, ""], y: Float[Array, " n"], args: PyTree) -> Any:
        out = self.spec.ravel(self.term.vf(self.direction * tau, self.spec.unravel(y), args))
        return in_state_dtype(self.direction, out) * out


class OneTrace:
    """Holds the checkpointed field once it is made, so that every stage of a step calls
    the same function and JAX traces it once. Hashed by identity: it is static."""

    def __init__(self) -> None:
        self.call: Any = None
        self.static: Any = None  # the non-array leaves `call` was made for

    def made_for(self, static: PyTree) -> bool:
        if self.static is None:
            return False
        (old, old_def), (new, new_def) = map(jtu.tree_flatten, (self.static, static))
        # (jaxlib's stub for PyTreeDef declares no __eq__.)
        same = old_def == new_def  # type: ignore[operator]
        return same and all(a is b for a, b in zip(old, new))


class Rematerialised(eqx.Module):
    """The field as a step uses it: reverse mode keeps each stage's input rather than the
    field's intermediate values, and linearises the field again stage by stage when it
    reverses the step (a step's residuals are then a few vectors per stage however large
    the field is; see `adjoints._residuals`). No effect on the forward solve.

    A Module rather than a closure: the field's arrays stay leaves, so a solver that
    passes it through a custom derivative (the implicit stages) sees them as inputs and
    not as constants captured from an enclosing trace."""

    vf: Any
    one_trace: OneTrace = eqx.field(static=True)

    def __call__(self, t: Float[Array, ""], y: Float[Array, " n"], args: PyTree) -> Any:
        arrays, static = eqx.partition((self.vf, args), eqx.is_array)
        if not self.one_trace.made_for(static):

            def call(arrays: PyTree, t: Float[Array, ""], y: Float[Array, " n"]) -> Any:
                f, a = eqx.combine(arrays, static)
                return f(t, y, a)

            # Merged repeats: the reverse sweep's cost does not depend on the spelling.
            self.one_trace.call = jax.checkpoint(deduplicated(call), prevent_cse=False)
            self.one_trace.static = static
        return self.one_trace.call(arrays, t, y)
