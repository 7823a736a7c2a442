"""Run-time outcomes of a solve: `sol.result` is one of these codes.

Trace-time mistakes (wrong shapes, wrong signs of concrete values) raise `ValueError` or
`TypeError` before anything runs; what can only be known while solving lands here. With
`throw=True` a non-successful result raises with the message below.
"""

import enum

import equinox as eqx
from jaxtyping import Array, Bool, Int


class _Lookup(enum.EnumMeta):
    def __getitem__(cls, key: str | int | Int[Array, ""]):
        """`RESULTS["max_steps_reached"]` is the member; as in Diffrax, `RESULTS[code]`
        for a result code (`sol.result`) is its message."""
        if isinstance(key, str):
            return super().__getitem__(key)
        return cls(int(key)).message


class RESULTS(enum.IntEnum, metaclass=_Lookup):
    """How a solve ended: `sol.result` is one of these integer codes (an integer array
    inside `jit`).

    - `successful`: reached t1.
    - `event_occurred`: an `Event` stopped the solve (an okay outcome, not a failure).
    - `max_steps_reached`: ran out of `max_steps` before t1.
    - `dt_min_reached`: the step size fell below `PIDController(dtmin=...)` with
      `force_dtmin=False`.
    - `step_size_underflow`: every step was rejected until `t + dt == t`.
    - `nonfinite_initial_derivative`: the vector field is NaN or inf at (t0, y0).
    - `nonfinite_state`: the state became NaN or inf.
    - `nonfinite_times`: t0 or t1 is NaN or inf (t1 may be inf only with an event).
    - `invalid_dt0`: `dt0` is zero, non-finite, points away from t1 or is below the time
      dtype's resolution.
    - `invalid_save_times`: `SaveAt(ts=...)` is not finite, sorted and within [t0, t1].
    - `invalid_step_times`: `StepTo(ts)` does not run strictly from t0 to t1.
    - `nonlinear_divergence`: an implicit solver's Newton iterations failed on a fixed
      step.

    `RESULTS["max_steps_reached"]` is the member, and `RESULTS[code]` for a code such as
    `sol.result` is its message (as in Diffrax), also `RESULTS.x.message`. Test a code,
    traced or not, with `is_okay` (t1 or an event), `is_successful` (t1) and `is_event`.
    """

    successful = 0
    max_steps_reached = 1
    dt_min_reached = 2
    step_size_underflow = 3
    nonfinite_initial_derivative = 4
    nonfinite_state = 5
    invalid_dt0 = 6
    invalid_save_times = 7
    event_occurred = 8
    nonfinite_times = 9
    invalid_step_times = 10
    nonlinear_divergence = 11

    @property
    def message(self) -> str:
        return _MESSAGES[self]


_MESSAGES = {
    RESULTS.successful: "",
    RESULTS.max_steps_reached: (
        "The maximum number of solver steps was reached before t1. Increase `max_steps`, "
        "loosen the tolerances, or use an implicit solver if the problem is stiff."
    ),
    RESULTS.dt_min_reached: (
        "The step size fell below `dtmin` (PIDController(force_dtmin=False)). Lower "
        "`dtmin`, pass force_dtmin=True, or loosen the tolerances."
    ),
    RESULTS.step_size_underflow: (
        "The step size shrank until t + dt == t: every step was rejected. The vector field "
        "most likely returned NaN or inf (check it at the time reported in sol.ts), or the "
        "problem is too stiff for an explicit solver."
    ),
    RESULTS.nonfinite_initial_derivative: (
        "The vector field returned NaN or inf at (t0, y0). Check y0, args and the vector "
        "field itself."
    ),
    RESULTS.nonfinite_state: (
        "The solution became NaN or inf. With a constant step size this usually means the "
        "step is too large for stability: pass a smaller dt0 or use PIDController."
    ),
    RESULTS.invalid_dt0: (
        "`dt0` is zero, NaN, inf, points the wrong way, or is below the resolution of the "
        "time dtype near t0 and t1 (two spacings between consecutive values there): it "
        "must be finite and point from t0 towards t1 (dt0 > 0 when t1 > t0, dt0 < 0 when "
        "t1 < t0)."
    ),
    RESULTS.invalid_save_times: (
        "`SaveAt(ts=...)` must be finite, sorted in the direction of integration and lie "
        "in [t0, t1]."
    ),
    RESULTS.invalid_step_times: (
        "`StepTo(ts)` must be strictly monotonic from t0 to t1: ts[0] == t0, ts[-1] == t1, "
        "no repeated or NaN times."
    ),
    RESULTS.nonlinear_divergence: (
        "An implicit solver's Newton iterations did not converge on a fixed step. Pass a "
        "smaller dt0, use PIDController (a failed step is then rejected and shrunk), or "
        "raise the solver's max_iterations or max_refreshes."
    ),
    RESULTS.nonfinite_times: (
        "t0 or t1 is NaN or inf. t1 may be inf only when an Event ends the solve."
    ),
    RESULTS.event_occurred: "The solve stopped because an event occurred.",
}


def is_okay(result: int | Int[Array, ""]) -> bool | Bool[Array, ""]:
    """The solve reached t1 or stopped at an event (works on traced results). Compared
    by value: under `jax.disable_jit()` JAX takes an enum member for a strong int64."""
    return (result == RESULTS.successful.value) | (result == RESULTS.event_occurred.value)


def is_successful(result: int | Int[Array, ""]) -> bool | Bool[Array, ""]:
    """The solve reached t1 (no event stopped it)."""
    return result == RESULTS.successful.value


def is_event(result: int | Int[Array, ""]) -> bool | Bool[Array, ""]:
    """An event stopped the solve."""
    return result == RESULTS.event_occurred.value


def failure_message(result: RESULTS) -> str:
    """What a user reads when a solve fails with `throw=True` ("" when it did not)."""
    if is_okay(result):
        return ""
    return (
        f"diffeqsolve failed ({result.name}): {result.message} Pass throw=False to get "
        "the solution back with sol.result set instead."
    )


class SolveError(eqx.EquinoxRuntimeError):
    """A solve that failed while running, with `throw=True`. Inside `jit` it reaches the
    caller wrapped in JAX's `JaxRuntimeError`; both are `RuntimeError`s, and this is a
    kind of Equinox's `EquinoxRuntimeError`, which Diffrax raises."""


SolveError.__module__ = "odesolve"  # how tracebacks name it


class InvalidStepTimes(ValueError, RuntimeError):
    """`StepTo(ts)` does not run from t0 to t1 (a `ValueError`, and the `RuntimeError`
    Diffrax raises for it)."""


class UnsupportedCombination(ValueError, NotImplementedError):
    """Options that do not work together (a `ValueError`, and the `NotImplementedError`
    Diffrax raises for them)."""


InvalidStepTimes.__module__ = UnsupportedCombination.__module__ = "odesolve"
