"""Fixed step sizes: `ConstantStepSize` and `StepTo`."""

import math
from typing import Any

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Float, Int

from .._checks import check_real_times, shape_of, shape_text
from .._flat import RealScalarLike
from .._results import RESULTS
from .._time import times_array
from ._base import AbstractStepSizeController, AttemptInput, FirstStepInput, Proposal, signed_times
from ._base import concrete_float as _concrete


class AbstractFixedStepController(AbstractStepSizeController):
    """Step sizes fixed before solving: no error control, no jump times."""

    @property
    def needs_error(self) -> bool:
        return False

    @property
    def has_jumps(self) -> bool:
        return False

    def jump_stops(self) -> None:
        return None

    def tolerances(self) -> None:
        return None


def _step_count(span: Any, step: Any, xp: Any) -> Any:
    """ceil(span / step), at least 1, in the dtype of `span` and `step`, with array
    module `xp`: NumPy when counted at trace time, jax.numpy in the loop, so that both
    count alike. nextafter: a span that is a whole number of steps up to rounding is not
    given an extra sliver of a step."""
    return xp.maximum(xp.ceil(span / xp.nextafter(step, xp.asarray(np.inf, step.dtype))), 1)


class ConstantStepSize(AbstractFixedStepController):
    """n = ceil((t1 - t0) / dt0) equal steps: of size dt0 when it divides t1 - t0.

    Step k ends at t0 + (t1 - t0) (k+1)/n rather than at a running sum of dt0, so rounding
    errors do not accumulate. Unlike Diffrax, which steps by dt0 and shortens the last
    step, a dt0 that does not divide the span gives n steps slightly shorter than dt0.
    With t1 = inf (an event ends the solve) step k ends at t0 + (k+1) dt0.
    """

    def wrap(self, direction: Float[Array, ""]) -> "ConstantStepSize":
        return self

    def times_are_valid(self, t_start: Float[Array, ""], t_end: Float[Array, ""]) -> Any:
        return jnp.asarray(True)

    def num_steps(
        self,
        t0: RealScalarLike,
        t1: RealScalarLike,
        dt0: RealScalarLike | None,
        time_dtype: np.dtype,
    ) -> int | None:
        c0, c1, cdt = _concrete(t0), _concrete(t1), _concrete(dt0)
        if c0 is None or c1 is None or cdt is None or cdt == 0 or not math.isfinite(c1 - c0):
            return None
        # Counted as `start` counts them, in the times' dtype: the adjoints size their
        # buffers by this count, and in float32 a span that float64 divides into n steps
        # of dt0 may take n - 1 or n + 1 (t0 = 1.3298..., t1 = t0 + 1, dt0 = 0.01: 101).
        # A backward solve counts in tau = -t, where the span and step are positive.
        kind = np.dtype(time_dtype).type
        return int(_step_count(abs(kind(c1) - kind(c0)), abs(kind(cdt)), np))

    def start(self, first: FirstStepInput):
        t0, t1, dt0 = first.t0, first.t1, first.dt0
        if dt0 is None:
            raise ValueError(
                "dt0=None: ConstantStepSize cannot choose a step size. Pass dt0 (for "
                "example dt0=(t1 - t0) / 100) or use PIDController(rtol, atol), which "
                "picks the first step automatically."
            )
        dt0 = jnp.asarray(dt0, dtype=jnp.result_type(t0))
        # The step count is an integer: no derivative flows through it.
        span, step = lax.stop_gradient(t1 - t0), lax.stop_gradient(dt0)
        finite = jnp.isfinite(span)
        n = _step_count(jnp.where(finite, span, 0), step, jnp)
        # Step k ends at t0 + (t1 - t0) (k / n), as in Diffrax, with k / n as Diffrax's
        # compiled program computes it: times given as numbers are constants there, and
        # XLA turns a division by the constant n into a product with its reciprocal; times
        # given as arrays are its inputs, and n is divided by. Each is written out here
        # (`reciprocal`, None for the second) so that every program computing this solve
        # steps to the same times: the forward sweep of an adjoint is another program, in
        # which the times may be inputs where they were constants, and a field switching
        # at grid times would otherwise switch a step apart once differentiated.
        reciprocal = 1 / n.astype(t0.dtype) if first.number_times else None
        state = (jnp.zeros((), jnp.int32), n.astype(jnp.int32), t0, t1, dt0, reciprocal)
        return self._end_of(1, state), state

    @staticmethod
    def _end_of(k: int | Int[Array, ""], state: tuple) -> Float[Array, ""]:
        _, n, t0, t1, dt0, reciprocal = state
        k_ = jnp.asarray(k, t0.dtype)
        if reciprocal is None:
            # n where it is used (k < n), but never a constant for XLA to take the
            # reciprocal of.
            fraction = k_ / jnp.maximum(n, jnp.asarray(k) + 1).astype(t0.dtype)
        else:
            fraction = k_ * reciprocal
        end = t0 + (t1 - t0) * fraction
        unbounded = t0 + k_ * dt0  # t1 = inf
        return jnp.where(jnp.isfinite(t1), jnp.where(k >= n, t1, end), unbounded)

    def adapt(self, attempt: AttemptInput):
        # A step cut short of its grid point (by `ClipStepSizeController`) is followed by
        # one to that grid point: the grid stays where it was.
        state = attempt.state
        k = state[0]
        k = jnp.where(attempt.t1 < self._end_of(k + 1, state), k, k + 1)
        state = (k, *state[1:])
        return Proposal(True, self._end_of(k + 1, state), state, RESULTS.successful)


class StepTo(AbstractFixedStepController):
    """Step exactly to each time in `ts` (which must start at t0 and end at t1)."""

    ts: Any = eqx.field(converter=times_array)

    def __check_init__(self):
        shape = shape_of(self.ts)
        if shape is None or len(shape) != 1 or shape[0] < 2:
            got = shape_text(shape)
            raise ValueError(
                f"StepTo(ts): ts must be a 1-D array of at least 2 times (t0 ... t1), got {got}."
            )
        check_real_times("StepTo(ts)", self.ts)

    def wrap(self, direction: Float[Array, ""]):
        return StepTo(signed_times(self.ts, direction))

    def num_steps(
        self,
        t0: RealScalarLike,
        t1: RealScalarLike,
        dt0: RealScalarLike | None,
        time_dtype: np.dtype,
    ) -> int | None:
        return len(self.ts) - 1

    def times_are_valid(self, t_start: Float[Array, ""], t_end: Float[Array, ""]):
        # In tau-space (see `wrap`): increasing whichever way the solve runs. Written so
        # that NaN fails (a comparison with NaN is False).
        ts = jnp.asarray(self.ts)
        increasing = jnp.all(ts[1:] > ts[:-1])
        return increasing & (ts[0] == t_start) & (ts[-1] == t_end)

    def start(self, first: FirstStepInput):
        dt0 = first.dt0
        if dt0 is not None:
            raise ValueError(
                f"dt0={dt0!r} was passed with StepTo, which takes its steps from `ts`; "
                "pass dt0=None."
            )
        ts = jnp.asarray(self.ts)
        return ts[1], jnp.ones((), jnp.int32)

    def adapt(self, attempt: AttemptInput):
        ts = jnp.asarray(self.ts)
        last = len(ts) - 1
        # A step cut short of its time (by `ClipStepSizeController`) is followed by one to
        # that time: every time in `ts` is still stepped to.
        k = attempt.state
        k = jnp.where(attempt.t1 < ts[jnp.minimum(k, last)], k, k + 1)
        return Proposal(True, ts[jnp.minimum(k, last)], k, RESULTS.successful)
