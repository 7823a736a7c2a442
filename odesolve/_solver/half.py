"""`HalfSolver`: an error estimate for any solver, from step doubling.

Each step is taken once whole and once as two halves; the halves' result is the
solution and the difference is the error estimate (Hairer, Norsett & Wanner, *Solving
ODEs I*, sec. II.4). Three steps of the wrapped solver per step.
"""

from typing import Any

import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from .._flat import PyTree
from .._term import ODETerm
from ._base import AbstractSolver, Field, StepContext, StepField, StepResult
from ._kinds import AbstractWrappedSolver


def _either(a: Any, b: Any) -> Any:
    if a is None:
        return b
    return a if b is None else a | b


class HalfSolver(AbstractWrappedSolver):
    """Wraps `solver` (e.g. `Euler()`) so that it can be used with `PIDController`, as
    Diffrax's `HalfSolver`. Dense output is the whole step's."""

    solver: AbstractSolver

    @property
    def term_structure(self) -> Any:  # type: ignore[override]
        return self.solver.term_structure

    def order(self, terms: ODETerm | None = None) -> int:
        return self.solver.order(terms)

    def error_order(self, terms: ODETerm | None = None) -> int:
        return self.solver.order(terms) + 1

    @property
    def adaptive(self) -> bool:
        return True

    @property
    def interpolation(self) -> tuple[tuple[float, ...], ...]:
        return self.solver.interpolation

    def start(
        self,
        vf: Field,
        t0: Float[Array, ""],
        y0: Float[Array, " n"],
        k0: Float[Array, " n"],
        args: PyTree,
    ) -> Any:
        return self.solver.start(vf, t0, y0, k0, args)

    def advance(
        self,
        vf: StepField,
        t0: Float[Array, ""],
        h: Float[Array, ""],
        y0: Float[Array, " n"],
        state: PyTree,
        made_jump: Bool[Array, ""] | None,
        args: PyTree,
        with_error: bool,
        context: StepContext | None,
    ) -> StepResult:
        inner = self.solver.advance
        half = 0.5 * h
        first = inner(vf, t0, half, y0, state, made_jump, args, False, context)
        no_jump = None if made_jump is None else jnp.zeros_like(made_jump)
        second = inner(
            vf, t0 + half, h - half, first.y1, first.state, no_jump, args, False, context
        )
        whole = inner(vf, t0, h, y0, state, made_jump, args, False, context)
        failed = _either(_either(first.failed, second.failed), whole.failed)
        y_error = jnp.abs(second.y1 - whole.y1) if with_error else None
        if y_error is not None and failed is not None:
            y_error = jnp.where(failed, jnp.inf, y_error)
        return StepResult(second.y1, y_error, whole.dense, second.state, failed)
