"""`ClipStepSizeController`: any controller's steps clipped to given times (Diffrax 0.7)."""

import dataclasses
from typing import Any

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike
from jaxtyping import Array, Float

from .._flat import RealScalarLike
from .._results import RESULTS
from .._time import times_array
from ._base import (
    AbstractAdaptiveStepSizeController,
    AbstractStepSizeController,
    AttemptInput,
    FirstStepInput,
    Proposal,
    check_step_times,
    clip_to_times,
    finite_times,
    signed_times,
    stops_before,
)
from .pid import PIDController


class _AlsoClippedPID(type(AbstractAdaptiveStepSizeController)):  # type: ignore[misc]
    # Diffrax 0.7 turns `PIDController(step_ts=..., jump_ts=...)` into this wrapper;
    # ours clips within the PID, and passes `isinstance` as the wrapper it stands for.
    def __instancecheck__(cls, instance: object) -> bool:
        return super().__instancecheck__(instance) or (
            isinstance(instance, PIDController)
            and (instance.step_ts is not None or instance.jump_ts is not None)
        )


class ClipStepSizeController(AbstractAdaptiveStepSizeController, metaclass=_AlsoClippedPID):
    """Wrap `controller` so that steps land on each of `step_ts`, and stop just before
    each of `jump_ts` (times where the vector field is discontinuous; the step after one
    starts just past it, with the field evaluated there again). As Diffrax's wrapper of
    the same name; `PIDController(step_ts=..., jump_ts=...)` is the same for a PID.

    `store_rejected_steps`: None, or n >= 1 to remember where rejected steps would have
    ended and land a later step on each of those times exactly, as Diffrax does (it
    matters for SDEs, whose Brownian path must be sampled consistently; for an ODE it
    only adds steps). More than n rejections in a row end the solve with
    `RESULTS.too_many_rejected_steps`.
    """

    controller: AbstractStepSizeController
    step_ts: Any = eqx.field(default=None, converter=times_array)
    jump_ts: Any = eqx.field(default=None, converter=times_array)
    store_rejected_steps: int | None = eqx.field(default=None, static=True)

    def __check_init__(self):
        if not isinstance(self.controller, AbstractStepSizeController):
            raise TypeError(
                f"ClipStepSizeController(controller={self.controller!r}): pass a step-size "
                "controller, e.g. PIDController(rtol=1e-6, atol=1e-6)."
            )
        stored = self.store_rejected_steps
        if stored is not None and (
            isinstance(stored, bool) or not isinstance(stored, (int, np.integer)) or stored < 1
        ):
            raise ValueError(
                f"ClipStepSizeController(store_rejected_steps={stored!r}): pass None or an "
                "int >= 1, the most rejections in a row to remember (e.g. 100)."
            )
        check_step_times("ClipStepSizeController", "step_ts", self.step_ts)
        check_step_times("ClipStepSizeController", "jump_ts", self.jump_ts)

    def wrap(self, direction: Float[Array, ""]):
        def flip(ts: ArrayLike | None):
            return None if ts is None else jnp.sort(signed_times(ts, direction))

        return ClipStepSizeController(
            self.controller.wrap(direction),
            flip(self.step_ts),
            flip(self.jump_ts),
            self.store_rejected_steps,
        )

    # The wrapped controller's tolerances and norm, read through the wrapper as Diffrax's.
    @property
    def rtol(self) -> Any:
        return self.controller.rtol  # type: ignore[attr-defined]

    @property
    def atol(self) -> Any:
        return self.controller.atol  # type: ignore[attr-defined]

    @property
    def norm(self) -> Any:
        return self.controller.norm  # type: ignore[attr-defined]

    @property
    def needs_error(self) -> bool:
        return self.controller.needs_error

    def tolerances(self):
        return self.controller.tolerances()

    def num_steps(
        self,
        t0: RealScalarLike,
        t1: RealScalarLike,
        dt0: RealScalarLike | None,
        time_dtype: np.dtype,
    ) -> int | None:
        if self.step_ts is not None or self.jump_ts is not None or self.store_rejected_steps:
            return None  # clipping adds steps
        return self.controller.num_steps(t0, t1, dt0, time_dtype)

    @property
    def has_jumps(self) -> bool:
        return self.jump_ts is not None or self.controller.has_jumps

    def jump_stops(self):
        own = stops_before(self.jump_ts)
        inner = self.controller.jump_stops()
        if own is None or inner is None:
            return inner if own is None else own
        return jnp.concatenate([own, inner.astype(own.dtype)])

    def times_are_valid(self, t_start: Float[Array, ""], t_end: Float[Array, ""]):
        own = finite_times(self.step_ts, self.jump_ts)
        return own & self.controller.times_are_valid(t_start, t_end)

    def start(self, first: FirstStepInput):
        t0 = first.t0
        end, state = self.controller.start(first)
        end = clip_to_times(t0, end, self.step_ts, stops_before(self.jump_ts))
        if self.store_rejected_steps is None:
            return end, state
        # Where rejected steps would have ended, ascending; inf marks a free slot.
        rejected = jnp.full((self.store_rejected_steps,), jnp.inf, jnp.result_type(t0))
        return end, (state, rejected)

    def adapt(self, attempt: AttemptInput):
        t0, t1 = attempt.t0, attempt.t1
        rejected = None
        if self.store_rejected_steps is not None:
            # The wrapped controller is given its own part of the state.
            state, rejected = attempt.state
            attempt = dataclasses.replace(attempt, state=state)
        inner = self.controller.adapt(attempt)
        start = jnp.where(inner.accept, t1 if inner.start is None else inner.start, t0)
        end = clip_to_times(start, inner.next_end, self.step_ts, stops_before(self.jump_ts))
        if rejected is None:
            return Proposal(
                inner.accept, end, inner.state, inner.result, inner.start, inner.made_jump
            )
        rejected, result = _remember(rejected, inner.accept, t1, inner.result)
        end = clip_to_times(start, end, rejected, None)
        state = (inner.state, rejected)
        return Proposal(inner.accept, end, state, result, inner.start, inner.made_jump)


def _remember(
    rejected: Float[Array, " n"], accept: Any, t1: Float[Array, ""], result: Any
) -> tuple[Float[Array, " n"], Any]:
    """The stored ends of rejected steps after a step to t1: an accepted step reached
    those up to t1 (they are forgotten), a rejected one adds t1. A full store fails."""
    reached = jnp.where(rejected <= t1, jnp.inf, rejected)
    full = jnp.isfinite(rejected[-1])
    added = jnp.sort(rejected.at[-1].set(t1))
    rejected = jnp.where(accept, jnp.sort(reached), added)
    overflow = ~accept & full
    return rejected, jnp.where(overflow, RESULTS.too_many_rejected_steps.value, result)


def unclipped(controller: Any) -> Any:
    """The controller inside any `ClipStepSizeController`s (a PID keeps its own times)."""
    while type(controller) is ClipStepSizeController:
        controller = controller.controller
    return controller
