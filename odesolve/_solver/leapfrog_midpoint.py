"""The leapfrog/midpoint method, a two-step method.

L. F. Shampine, "Stability of the leapfrog/midpoint method", Appl. Math. Comput. 208
(2009) 293-298. With the previous point (t_-1, y_-1) carried from step to step,

    y1 = y_-1 + (t1 - t_-1) f(t0, y0),

second order, one evaluation per step, no error estimate (fixed step sizes only). The
first step, with no previous point, is Euler's. Dense output is linear.

It is time-symmetric, so a step is undone exactly (in exact arithmetic) by the same
formula: y_-1 = y1 - (t1 - t_-1) f(t0, y0), with (t0, y0) carried and t_-1, a time, kept
by the reverse sweep as it keeps the step times. `ReversibleAdjoint` differentiates it so.
"""

from typing import Any

from jaxtyping import Array, Float

from .._flat import PyTree, in_state_dtype
from ._base import AbstractReversibleSolver, RetreatInput, StartInput, StepInput, StepResult
from ._linear import AbstractLinearSecondOrder, linear_slope


class LeapfrogMidpoint(AbstractLinearSecondOrder, AbstractReversibleSolver):
    """Leapfrog/midpoint (Diffrax's `LeapfrogMidpoint`): second order, one evaluation
    per step, for fixed step sizes; reversible (`ReversibleAdjoint`)."""

    @property
    def adaptive(self) -> bool:
        return False

    def start(self, first: StartInput) -> Any:
        return first.t0, first.y0

    def advance(self, step: StepInput) -> StepResult:
        vf, t0, h, y0 = step.vf, step.t0, step.h, step.y0
        t_previous, y_previous = step.state
        t1 = t0 + h
        y1 = y_previous + in_state_dtype(t1 - t_previous, y0) * vf.at_start(t0, y0, step.args)
        return StepResult(y1, None, (linear_slope(y0, y1, h),), (t0, y0))

    def kept(self, state: PyTree) -> PyTree:
        return state[0]  # the previous point's time

    def retreat(
        self, undo: RetreatInput
    ) -> tuple[Float[Array, " n"], Any, tuple[Float[Array, " n"], ...]]:
        t0, h, y1 = undo.t0, undo.h, undo.y1
        _, y0 = undo.state1
        # Without `kept` only y0 and the slope are wanted: any time does for the rest.
        t_previous = t0 if undo.kept is None else undo.kept
        y_previous = y1 - in_state_dtype(t0 + h - t_previous, y0) * undo.vf(t0, y0, undo.args)
        return y0, (t_previous, y_previous), (linear_slope(y0, y1, h),)
