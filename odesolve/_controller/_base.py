"""The interface between the step loop and a step-size controller.

All times here are in the solver's internal time tau = direction * t, which always
increases; `wrap(direction)` maps a controller's own time arrays into it.
"""

import abc
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike
from jaxtyping import Array, Float

from adjoints import trace_time_value

from .._flat import FlatSpec, PyTree, RealScalarLike
from .._solver._base import Field


def concrete_float(x: object) -> float | None:
    """`x` as a Python float when it is known at trace time, else None (a tracer, or not
    a real scalar)."""
    value = trace_time_value(x)
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


class Proposal(eqx.Module):
    """A controller's verdict on an attempted step.

    - `accept`: keep the step.
    - `next_end`: where the next step should end (from the new start time).
    - `state`: the controller's new state.
    - `result`: a `RESULTS` code (successful unless the controller gives up).
    """

    accept: Any
    next_end: Any
    state: Any
    result: Any


class AbstractStepSizeController(eqx.Module):
    """Chooses step sizes. Times given to a controller are internal (tau = direction *
    t, see `wrap`), so they always increase. Subclasses are abstract or final."""

    @abc.abstractmethod
    def wrap(self, direction: Float[Array, ""]) -> "AbstractStepSizeController":
        """This controller with its own times mapped to tau = direction * t."""

    @property
    @abc.abstractmethod
    def needs_error(self) -> bool:
        """Whether `adapt` reads the solver's error estimate (static)."""

    @property
    @abc.abstractmethod
    def has_jumps(self) -> bool:
        """Whether steps stop at jump times (static)."""

    @abc.abstractmethod
    def jump_stops(self) -> Float[Array, " k"] | None:
        """Where steps stop before each jump time (None: no jumps)."""

    @abc.abstractmethod
    def tolerances(self) -> tuple[Any, Any] | None:
        """(rtol, atol) of the error control, or None for fixed step sizes. Implicit
        solvers derive their Newton tolerances from these."""

    @abc.abstractmethod
    def times_are_valid(self, t_start: Float[Array, ""], t_end: Float[Array, ""]) -> Any:
        """Run-time check of the controller's own times (concrete ones were checked when
        traced): a bool array, False to fail the solve with `invalid_step_times`."""

    @abc.abstractmethod
    def num_steps(
        self, t0: RealScalarLike, t1: RealScalarLike, dt0: RealScalarLike | None
    ) -> int | None:
        """The number of steps when it is known before solving (static), else None."""

    @abc.abstractmethod
    def init(
        self,
        vf: Field,
        t0: Float[Array, ""],
        t1: Float[Array, ""],
        y0: Float[Array, " n"],
        k0: Float[Array, " n"],
        dt0: Float[Array, ""] | None,
        args: PyTree,
        error_order: int,
        spec: FlatSpec,
    ) -> tuple[Any, Any]:
        """Return (end of the first step, initial state)."""

    @abc.abstractmethod
    def adapt(
        self,
        t0: Float[Array, ""],
        t1: Float[Array, ""],
        y0: Float[Array, " n"],
        y1: Float[Array, " n"],
        y_error: Float[Array, " n"] | None,
        state: PyTree,
        error_order: int,
        spec: FlatSpec,
    ) -> Proposal:
        """Accept or reject the step from t0 to t1, and propose the next one's end."""


class AbstractAdaptiveStepSizeController(AbstractStepSizeController):
    """A controller whose steps follow the solver's error estimate, as Diffrax names
    them: `PIDController`, and `ClipStepSizeController`, which clips another's steps."""


def signed_times(ts: ArrayLike, direction: Float[Array, ""]) -> Any:
    """Times given to a controller, in tau-space (`direction * ts`) and in the solve's time
    dtype, that of `direction`: integer times (`step_ts=[3, 4]`) and a list of Python
    floats beside float32 times then work under strict dtype promotion."""
    return jnp.asarray(ts).astype(jnp.result_type(direction)) * direction


def stops_before(jump_ts: Float[Array, " k"] | None) -> Any:
    """Where steps stop before each jump time: the float just below it, moving with the
    jump time (`nextafter` has no derivative; the one-ulp shift is added to the time
    itself, so a step that ends at a jump has the derivative of its length)."""
    if jump_ts is None:
        return None
    fixed = jax.lax.stop_gradient(jump_ts)
    return jump_ts + (jnp.nextafter(fixed, -jnp.inf) - fixed)


def clip_to_times(
    start: Float[Array, ""],
    end: Float[Array, ""],
    step_ts: Float[Array, " k"] | None,
    jump_stops: Float[Array, " k"] | None,
) -> Any:
    """Cap a step from `start` at the first step time after it, and at the first stop
    before a jump after it (a step must not straddle a discontinuity, nor end on it: the
    vector field's value exactly there belongs to the other side)."""
    for ts in (step_ts, jump_stops):
        if ts is not None:
            after = jnp.where(ts > start, ts, jnp.inf)
            end = jnp.minimum(end, jnp.min(after))
    return end
