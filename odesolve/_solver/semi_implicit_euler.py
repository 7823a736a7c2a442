"""Semi-implicit (symplectic) Euler, for a partitioned system.

For a state (y_1, y_2) with dy_1/dt = f_1(t, y_2) and dy_2/dt = f_2(t, y_1) (positions
and momenta of a separable Hamiltonian system), one step is

    y_1' = y_1 + h f_1(t0, y_2),    y_2' = y_2 + h f_2(t0, y_1'),

first order, explicit despite its name, and symplectic: energy errors stay bounded over
long times where explicit Euler's grow (Hairer, Lubich & Wanner, *Geometric Numerical
Integration*, sec. I.1.2). No error estimate (fixed steps, or wrap it in `HalfSolver`).
A step is undone exactly (in exact arithmetic) in the reverse order,

    y_2 = y_2' - h f_2(t0, y_1'),    y_1 = y_1' - h f_1(t0, y_2),

so `ReversibleAdjoint` differentiates it without storing the solve.

The two terms arrive as one field on the flat state (see `_term.as_one_term`), which
returns both parts' rates; a step evaluates it twice and keeps the part it needs each
time.
"""

from typing import Any, ClassVar

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._flat import FlatSpec, in_state_dtype
from .._term import AbstractTerm, ODETerm
from ._base import AbstractReversibleSolver, RetreatInput, StartInput, StepInput, StepResult
from ._linear import LINEAR, linear_slope


def first_part_size(spec: FlatSpec) -> int:
    """How many entries of the flat state (y_1, y_2) belong to y_1."""
    first = spec.treedef.children()[0].num_leaves
    return int(sum(int(np.prod(s)) for s in spec.shapes[:first]))


class SemiImplicitEuler(AbstractReversibleSolver):
    """Semi-implicit Euler (Diffrax's `SemiImplicitEuler`): takes terms
    `(ODETerm(f_1), ODETerm(f_2))` and a state `(y_1, y_2)`, with dy_1/dt = f_1(t, y_2,
    args) and dy_2/dt = f_2(t, y_1, args). First order, symplectic, fixed steps;
    reversible (`ReversibleAdjoint`)."""

    term_structure: ClassVar[Any] = (AbstractTerm, AbstractTerm)

    def order(self, terms: ODETerm | None = None) -> int:
        return 1

    def error_order(self, terms: ODETerm | None = None) -> int:
        return 2

    @property
    def adaptive(self) -> bool:
        return False

    @property
    def interpolation(self) -> tuple[tuple[float, ...], ...]:
        return LINEAR

    def start(self, first: StartInput) -> Any:
        return None

    def advance(self, step: StepInput) -> StepResult:
        context = step.context
        assert context is not None and context.spec is not None  # the loop gives both
        vf, t0, h, y0, args = step.vf, step.t0, step.h, step.y0, step.args
        n_1 = first_part_size(context.spec)
        dt = in_state_dtype(h, y0)
        # The field's first part at (y_1, y_2) is f_1(t0, y_2): y_1's step.
        y_1 = y0[:n_1] + dt * vf.at_start(t0, y0, args)[:n_1]
        # Its second part at (y_1', y_2) is f_2(t0, y_1'): y_2's step.
        y_2 = y0[n_1:] + dt * vf(t0, jnp.concatenate([y_1, y0[n_1:]]), args)[n_1:]
        y1 = jnp.concatenate([y_1, y_2])
        return StepResult(y1, None, (linear_slope(y0, y1, h),), None)

    def retreat(
        self, undo: RetreatInput
    ) -> tuple[Float[Array, " n"], Any, tuple[Float[Array, " n"], ...]]:
        vf, t0, h, y1, args, context = undo.vf, undo.t0, undo.h, undo.y1, undo.args, undo.context
        assert context is not None and context.spec is not None  # the reverse sweep's
        n_1 = first_part_size(context.spec)
        dt = in_state_dtype(h, y1)
        # The steps in reverse: y_2 from f_2(t0, y_1'), then y_1 from f_1(t0, y_2).
        y_2 = y1[n_1:] - dt * vf(t0, y1, args)[n_1:]
        y_1 = y1[:n_1] - dt * vf(t0, jnp.concatenate([y1[:n_1], y_2]), args)[:n_1]
        y0 = jnp.concatenate([y_1, y_2])
        return y0, None, (linear_slope(y0, y1, h),)
