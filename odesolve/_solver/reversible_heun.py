"""Reversible Heun: Heun's method made algebraically reversible.

P. Kidger, J. Foster, X. Li and T. Lyons, "Efficient and accurate gradients for neural
SDEs", NeurIPS 2021. The method carries a second state yhat and the field there:

    yhat1 = 2 y0 - yhat0 + h f(t0, yhat0),    y1 = y0 + h (f(t0, yhat0) + f(t1, yhat1)) / 2,

one new evaluation per step, second order, with the embedded first-order estimate
h (f(t1, yhat1) - f(t0, yhat0)) / 2. Dense output is linear between y0 and y1. A step
is undone exactly (in exact arithmetic), for `ReversibleAdjoint`, by

    yhat0 = 2 y1 - yhat1 - h f(t1, yhat1),    y0 = y1 - h (f(t0, yhat0) + f(t1, yhat1)) / 2.
"""

from typing import Any, ClassVar

import jax
from jaxtyping import Array, Float

from .._flat import in_state_dtype
from ._base import AbstractReversibleSolver, RetreatInput, StartInput, StepInput, StepResult
from ._linear import AbstractLinearSecondOrder


class ReversibleHeun(AbstractLinearSecondOrder, AbstractReversibleSolver):
    """Reversible Heun (Diffrax's `ReversibleHeun`): second order, one evaluation per
    step, an embedded error estimate, linear dense output; `ReversibleAdjoint` undoes
    its steps."""

    # After a jump the step takes f at y0, not at yhat0 (see `advance`): that step is
    # not algebraically reversible.
    reverses_jumps: ClassVar[bool] = False

    @property
    def adaptive(self) -> bool:
        return True

    def start(self, first: StartInput) -> Any:
        return first.y0, first.k0

    def advance(self, step: StepInput) -> StepResult:
        vf, t0, h, y0, args = step.vf, step.t0, step.h, step.y0, step.args
        yhat0, f0 = step.state
        if step.made_jump is not None:
            # After a jump the carried derivative is the left limit: take the right one.
            f0 = jax.lax.cond(step.made_jump, lambda: vf.at_start(t0, y0, args), lambda: f0)
        hy = in_state_dtype(h, y0)
        yhat1 = 2 * y0 - yhat0 + hy * f0
        f1 = vf(t0 + h, yhat1, args)
        mean = 0.5 * (f0 + f1)
        y1 = y0 + hy * mean
        y_error = 0.5 * hy * (f1 - f0) if step.with_error else None
        return StepResult(y1, y_error, (mean,), (yhat1, f1))

    def retreat(
        self, undo: RetreatInput
    ) -> tuple[Float[Array, " n"], Any, tuple[Float[Array, " n"], ...]]:
        y1 = undo.y1
        yhat1, f1 = undo.state1
        hy = in_state_dtype(undo.h, y1)
        yhat0 = 2 * y1 - yhat1 - hy * f1
        f0 = undo.vf(undo.t0, yhat0, undo.args)
        mean = 0.5 * (f0 + f1)
        return y1 - hy * mean, (yhat0, f0), (mean,)
