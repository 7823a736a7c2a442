"""`HalfSolver`: an error estimate for any solver, from step doubling.

Each step is taken once whole and once as two halves; the halves' result is the
solution and the difference is the error estimate (Hairer, Norsett & Wanner, *Solving
ODEs I*, sec. II.4). Three steps of the wrapped solver per step.
"""

from dataclasses import replace
from typing import Any

import jax.numpy as jnp

from .._term import ODETerm
from ._base import AbstractSolver, StartInput, StepInput, StepResult
from ._kinds import AbstractWrappedSolver


def _either(a: Any, b: Any) -> Any:
    if a is None:
        return b
    return a if b is None else a | b


class HalfSolver(AbstractWrappedSolver):
    """Wraps `solver` (e.g. `Euler()`) so that it can be used with `PIDController`, as
    Diffrax's `HalfSolver`. Dense output is the whole step's."""

    solver: AbstractSolver

    def __check_init__(self):
        solver = self.solver
        if isinstance(solver, type) and issubclass(solver, AbstractSolver):
            raise TypeError(
                f"HalfSolver(solver={solver.__name__}) is a class: pass an instance, "
                f"HalfSolver({solver.__name__}())."
            )
        if not isinstance(solver, AbstractSolver):
            raise TypeError(
                f"HalfSolver(solver={solver!r}): pass a solver, e.g. HalfSolver(Euler())."
            )

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

    def start(self, first: StartInput) -> Any:
        return self.solver.start(first)

    def advance(self, step: StepInput) -> StepResult:
        inner = self.solver.advance
        h, made_jump = step.h, step.made_jump
        half = 0.5 * h
        middle = step.t0 + half  # where the first half ends and the second starts
        first = inner(replace(step, h=half, t1=middle, with_error=False))
        no_jump = None if made_jump is None else jnp.zeros_like(made_jump)
        second = inner(
            replace(
                step,
                t0=middle,
                h=h - half,
                y0=first.y1,
                state=first.state,
                made_jump=no_jump,
                with_error=False,
            )
        )
        whole = inner(replace(step, with_error=False))
        failed = _either(_either(first.failed, second.failed), whole.failed)
        y_error = jnp.abs(second.y1 - whole.y1) if step.with_error else None
        if y_error is not None and failed is not None:
            y_error = jnp.where(failed, jnp.inf, y_error)
        return StepResult(second.y1, y_error, whole.dense, second.state, failed)
