"""Diffrax's older way to stop a solve: `diffeqsolve(..., discrete_terminating_event=...)`.

Diffrax deprecates it in favour of `Event`; it is kept so that code written for it runs.
A discrete terminating event is a boolean condition checked at the end of every accepted
step, which is exactly a boolean `Event`: each one is turned into that, and the solve
warns that the argument is deprecated.
"""

import abc
import warnings
from collections.abc import Callable
from typing import Any

import equinox as eqx
from jaxtyping import Array, Float

from ._event import Event
from ._flat import PyTree
from ._norm import rms_norm
from ._steady_state import check_tolerances, steady_state_event

DEPRECATED = (
    "diffeqsolve(..., discrete_terminating_event=...) is deprecated, as in Diffrax: pass "
    "event=Event(cond_fn) instead, with cond_fn(t, y, args, **kwargs) returning a bool."
)


class StepEnd(eqx.Module):
    """What a discrete event's condition is shown of the solve, at the end of an
    accepted step: `tprev` (the step's end, where the next step starts), `tnext` (the
    same here) and `y`, the state there, in the names of Diffrax's loop state."""

    tprev: Float[Array, ""]
    tnext: Float[Array, ""]
    y: PyTree


class AbstractDiscreteTerminatingEvent(eqx.Module):
    """A condition `event(state, **kwargs)` checked at the end of every accepted step;
    the solve stops at the end of the first on which it is True (Diffrax's, deprecated
    there and here: prefer `Event`). `state` is a `StepEnd`; the keyword arguments are
    `args` and those an `Event` condition gets (`terms`, `solver`, `t0`, `t1`, `dt0`,
    `saveat`, `stepsize_controller`, `max_steps`)."""

    @abc.abstractmethod
    def __call__(self, state: StepEnd, **kwargs: Any) -> Any:
        """Whether to stop."""

    def as_event(self) -> Event:
        return Event(_AtStepEnd(self))


class _AtStepEnd(eqx.Module):
    discrete: AbstractDiscreteTerminatingEvent

    def __call__(self, t: Float[Array, ""], y: PyTree, args: PyTree, **kwargs: Any):
        return self.discrete(StepEnd(tprev=t, tnext=t, y=y), args=args, **kwargs)


class DiscreteTerminatingEvent(AbstractDiscreteTerminatingEvent):
    """Stop once `cond_fn(state, **kwargs)` is True (see the abstract class)."""

    cond_fn: Callable

    def __check_init__(self) -> None:
        if not callable(self.cond_fn):
            raise TypeError(
                f"DiscreteTerminatingEvent(cond_fn={self.cond_fn!r}): pass a function "
                "cond_fn(state, **kwargs) returning a bool."
            )

    def __call__(self, state: StepEnd, **kwargs: Any) -> Any:
        return self.cond_fn(state, **kwargs)


class SteadyStateEvent(AbstractDiscreteTerminatingEvent):
    """Stop once |f(t, y)| < atol + rtol |y| in `norm`: `Event(steady_state_event(rtol,
    atol, norm))`, in Diffrax's deprecated form. `rtol`, `atol`: by default the
    step-size controller's."""

    rtol: float | None = None
    atol: float | None = None
    norm: Callable = rms_norm

    def __check_init__(self) -> None:
        check_tolerances("SteadyStateEvent", self.rtol, self.atol)

    def __call__(self, state: StepEnd, **kwargs: Any) -> Any:
        steady = steady_state_event(self.rtol, self.atol, self.norm)
        args = kwargs.pop("args")
        return steady(state.tprev, state.y, args, **kwargs)


def as_event(discrete: object, event: Event | None) -> Event:
    """The `Event` a `discrete_terminating_event=` argument stands for (with the
    deprecation warning)."""
    if not isinstance(discrete, AbstractDiscreteTerminatingEvent):
        raise TypeError(
            f"discrete_terminating_event={discrete!r}: pass a DiscreteTerminatingEvent, or "
            "better event=Event(cond_fn)."
        )
    if event is not None:
        raise ValueError(
            "event=... and discrete_terminating_event=... cannot both be given: put every "
            "condition in the Event (cond_fn may be a PyTree of conditions)."
        )
    warnings.warn(DEPRECATED, DeprecationWarning, stacklevel=3)
    return discrete.as_event()
