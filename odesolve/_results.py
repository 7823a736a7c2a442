"""Run-time outcomes of a solve: `sol.result` is one of these codes.

Trace-time mistakes (wrong shapes, wrong signs of concrete values) raise `ValueError` or
`TypeError` before anything runs; what can only be known while solving lands here. With
`throw=True` a non-successful result raises with the message below.
"""

import enum
from typing import Any, final

import equinox as eqx
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax.typing import ArrayLike
from jaxtyping import Array, Bool, Int

from adjoints import trace_time_value


class _Lookup(enum.EnumMeta):
    def __getitem__(cls, key: "str | int | Int[Array, '...'] | Result"):
        """`RESULTS["max_steps_reached"]` is the member; as in Diffrax, `RESULTS[code]`
        for a result code (`sol.result`) is its message: an array of messages for a
        batch of codes, and "traced" inside `jit` (the code is not known yet)."""
        if isinstance(key, str):
            return super().__getitem__(key)
        codes = _concrete_codes(key)
        if codes is None:
            return "traced"
        if codes.ndim == 0:
            return cls(int(codes)).message
        return np.vectorize(lambda c: cls(int(c)).message, otypes=[object])(codes)


class RESULTS(enum.IntEnum, metaclass=_Lookup):
    """How a solve ended: `sol.result` is one of these integer codes (an integer array
    inside `jit`).

    - `successful`: reached t1.
    - `event_occurred`: an `Event` stopped the solve (an okay outcome, not a failure).
    - `max_steps_reached`: ran out of `max_steps` before t1.
    - `dt_min_reached`: the step size fell below `PIDController(dtmin=...)` with
      `force_dtmin=False`.
    - `step_size_underflow`: every step was rejected until the step size reached the
      times' resolution (a shorter retry rounds to the rejected step, or t + dt == t).
    - `nonfinite_initial_derivative`: the vector field is NaN or inf at (t0, y0).
    - `nonfinite_state`: the state became NaN or inf.
    - `nonfinite_times`: t0 or t1 is NaN or inf (t1 may be inf only with an event or an
      integer `max_steps`).
    - `invalid_dt0`: `dt0` is zero, non-finite, points away from t1 or is below the time
      dtype's resolution.
    - `invalid_save_times`: `SaveAt(ts=...)` is not finite, sorted and within [t0, t1].
    - `invalid_step_times`: `StepTo(ts)` does not run strictly from t0 to t1, or traced
      `step_ts`/`jump_ts` hold a NaN or an infinity.
    - `nonlinear_divergence`: an implicit solver's Newton iterations failed on a fixed
      step.
    - `too_many_rejected_steps`: more steps were rejected in a row than
      `ClipStepSizeController(store_rejected_steps=n)` remembers.
    - `nonfinite_event_condition`: an `Event`'s real condition returned NaN.
    - `invalid_tolerances`: traced `rtol` or `atol` hold a negative, NaN or infinite
      value.

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
    too_many_rejected_steps = 12
    nonfinite_event_condition = 13
    invalid_tolerances = 14

    @property
    def message(self) -> str:
        return _MESSAGES[self]

    @staticmethod
    def where(pred: Bool[ArrayLike, "..."], a: Any, b: Any) -> "Result":
        """`a` where `pred`, else `b` (members, codes or results), as Diffrax's
        `RESULTS.where`; also inside `jit`."""
        return Result(jnp.where(pred, _code(a), _code(b)))

    @property
    def _value(self) -> int:
        """The code, under the name Diffrax's results (and `Result`) keep it."""
        return self.value


_MESSAGES = {
    RESULTS.successful: "",
    RESULTS.max_steps_reached: (
        "The maximum number of solver steps was reached before t1. Increase `max_steps`, "
        "loosen the tolerances, or use an implicit solver if the problem is stiff. "
        "Tolerances near the state's precision (float32 holds about 7 digits) need float64 "
        "(jax.config.update('jax_enable_x64', True)); with t1=inf, only an Event ends the "
        "solve before max_steps."
    ),
    RESULTS.dt_min_reached: (
        "The step size fell below `dtmin` (PIDController(force_dtmin=False)). Lower "
        "`dtmin`, pass force_dtmin=True, or loosen the tolerances."
    ),
    RESULTS.step_size_underflow: (
        "The step size shrank to the resolution of the times' dtype (a shorter step rounds "
        "to the one rejected, or t + dt == t): every step there was rejected. The vector "
        "field most likely returned NaN or inf (check it at the time reported in sol.ts), "
        "the problem is too stiff for an explicit solver, or the tolerances ask for more "
        "than the dtype resolves (float32 times near t = 1000 are 6e-5 apart; float32 "
        "states hold about 7 digits): solve in float64 (jax.config.update("
        "'jax_enable_x64', True)) or loosen the tolerances."
    ),
    RESULTS.nonfinite_initial_derivative: (
        "The vector field returned NaN or inf at (t0, y0). Check y0, args and the vector "
        "field itself."
    ),
    RESULTS.nonfinite_state: (
        "The solution became NaN or inf. With a constant step size this usually means the "
        "step is too large for stability: pass a smaller dt0 or use PIDController. With "
        "PIDController(dtmin=...), a step forced at dtmin was unstable: lower dtmin, pass "
        "force_dtmin=False, or use an implicit solver if the problem is stiff."
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
        "The step-size controller's times are invalid: `StepTo(ts)` must be strictly "
        "monotonic from t0 to t1 (ts[0] == t0, ts[-1] == t1, no repeated or NaN times), and "
        "`step_ts` and `jump_ts` must be finite (a NaN would be passed by every step)."
    ),
    RESULTS.nonlinear_divergence: (
        "An implicit solver's Newton iterations did not converge on a fixed step. Pass a "
        "smaller dt0, use PIDController (a failed step is then rejected and shrunk), or "
        "raise the solver's max_iterations or max_refreshes."
    ),
    RESULTS.nonfinite_times: (
        "t0 or t1 is NaN or inf. t1 may be inf only when an Event or an integer max_steps "
        "ends the solve."
    ),
    RESULTS.event_occurred: "The solve stopped because an event occurred.",
    RESULTS.too_many_rejected_steps: (
        "More steps were rejected in a row than ClipStepSizeController(store_rejected_steps"
        "=n) remembers. Pass a larger n, or None: an ODE needs none."
    ),
    RESULTS.invalid_tolerances: (
        "The step-size controller's rtol or atol (passed traced, so checked when the solve "
        "runs) holds a negative, NaN or infinite value: every tolerance must be finite and "
        ">= 0 (a negative one would accept every step)."
    ),
    RESULTS.nonfinite_event_condition: (
        "An Event's condition function returned NaN (at t0, or at the end of the last step "
        "in sol.ts): a real condition must be finite for its sign change to locate the "
        "event. Check the condition and the state it reads."
    ),
}


def _code(result: "int | Int[Array, '...'] | Result") -> Any:
    """The integer code(s) of a `Result`, a `RESULTS` member or a code. Members compare
    by value: under `jax.disable_jit()` JAX takes an enum member for a strong int64."""
    if isinstance(result, Result):
        return result._value
    if isinstance(result, RESULTS):
        return result.value
    return result


def _concrete_codes(result: "int | Int[Array, '...'] | Result") -> np.ndarray | None:
    """The codes as a NumPy array, or None while they are traced."""
    return trace_time_value(_code(result))


@final
@jtu.register_pytree_node_class
class Result:
    """`sol.result`: how the solve ended, as a `RESULTS` code (an integer array, batched
    under `vmap`). Prints as the outcome's name, and compares with `RESULTS` members,
    integers and other results:

        sol.result == ode.RESULTS.successful   # a boolean array, also inside jit
        ode.RESULTS[sol.result]                # the message
        sol.result.name                        # "successful"

    `int(sol.result)` and `np.asarray(sol.result)` give the code; `sol.result._value` is
    the code array, under the name Diffrax uses for it."""

    __slots__ = ("_value",)

    def __init__(self, value: Int[ArrayLike, "..."]) -> None:
        self._value: Any = value

    def tree_flatten(self) -> tuple[tuple[Any], None]:
        return (self._value,), None

    @classmethod
    def tree_unflatten(cls, aux: None, children: Any) -> "Result":
        # Transformations rebuild with placeholders (object(), None): store them as given.
        result = object.__new__(cls)
        result._value = children[0]
        return result

    def __eq__(self, other: object) -> Any:  # type: ignore[override]
        return jnp.asarray(self._value == _code(other))  # type: ignore[arg-type]

    def __ne__(self, other: object) -> Any:  # type: ignore[override]
        return jnp.asarray(self._value != _code(other))  # type: ignore[arg-type]

    __hash__ = None  # type: ignore[assignment]

    def __bool__(self) -> bool:
        raise TypeError(
            "The truth value of sol.result is ambiguous (0 is success). Test it with "
            "ode.is_successful(sol.result), ode.is_okay(sol.result) or "
            "sol.result == ode.RESULTS.successful."
        )

    def __int__(self) -> int:
        return int(self._value)

    def __index__(self) -> int:
        return int(self._value)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.asarray(self._value, dtype=dtype)

    @property
    def name(self) -> Any:
        """The outcome's name ("successful", ...); an array of names for a batch."""
        codes = _concrete_codes(self)
        if codes is None:
            return "traced"
        if codes.ndim == 0:
            return RESULTS(int(codes)).name
        return np.vectorize(lambda c: RESULTS(int(c)).name, otypes=[object])(codes)

    @property
    def message(self) -> Any:
        """What the outcome means and what to do (see `RESULTS[code]`)."""
        return RESULTS[self]  # type: ignore[misc]  # (mypy reads enum lookups as by name)

    def __repr__(self) -> str:
        codes = _concrete_codes(self)
        if codes is None or not np.issubdtype(codes.dtype, np.integer):
            # Traced, or a placeholder a transformation put in the code's place.
            return f"Result({self._value!r})"
        names = self.name
        if isinstance(names, str):
            return f"RESULTS.{names}"
        return f"RESULTS[{', '.join(np.ravel(names))}] (shape {names.shape})"


def is_okay(result: "int | Int[Array, '...'] | Result") -> bool | Bool[Array, "..."]:
    """The solve reached t1 or stopped at an event (works on traced results)."""
    code = _code(result)
    return (code == RESULTS.successful.value) | (code == RESULTS.event_occurred.value)


def is_successful(result: "int | Int[Array, '...'] | Result") -> bool | Bool[Array, "..."]:
    """The solve reached t1 (no event stopped it)."""
    return _code(result) == RESULTS.successful.value


def is_event(result: "int | Int[Array, '...'] | Result") -> bool | Bool[Array, "..."]:
    """An event stopped the solve."""
    return _code(result) == RESULTS.event_occurred.value


def failure_message(result: RESULTS) -> str:
    """What a user reads when a solve fails with `throw=True` ("" when it did not)."""
    if is_okay(result):
        return ""
    if result in _INPUTS:
        # Raised whatever `throw` is: there is no solution to hand back.
        return f"diffeqsolve failed ({result.name}): {result.message}"
    return (
        f"diffeqsolve failed ({result.name}): {result.message} Pass throw=False to get "
        "the solution back with sol.result set instead."
    )


# Results that say an input was wrong (a traced one, checked when the solve runs).
_INPUTS = frozenset(
    {
        RESULTS.nonfinite_times,
        RESULTS.invalid_dt0,
        RESULTS.invalid_save_times,
        RESULTS.invalid_step_times,
        RESULTS.invalid_tolerances,
    }
)


def is_bad_input(result: RESULTS) -> bool:
    """Whether `result` says an input was wrong: raised whatever `throw` is."""
    return result in _INPUTS


class SolveError(eqx.EquinoxRuntimeError):
    """A solve that failed while running, with `throw=True`. Inside `jit` it reaches the
    caller wrapped in JAX's `JaxRuntimeError`; both are `RuntimeError`s, and this is a
    kind of Equinox's `EquinoxRuntimeError`, which Diffrax raises."""


SolveError.__module__ = "odesolve"  # how tracebacks name it


class InvalidStepTimes(ValueError, RuntimeError):
    """`StepTo(ts)` does not run from t0 to t1 (a `ValueError`, and the `RuntimeError`
    Diffrax raises for it)."""


class InvalidSaveTimes(ValueError, RuntimeError):
    """`SaveAt(ts=...)` reaches outside [t0, t1] (a `ValueError`, and the `RuntimeError`
    Diffrax raises for it when the solve runs)."""


class TermAndSolverIncompatible(TypeError, ValueError):
    """Terms of a structure the solver does not take (a `TypeError`, and the `ValueError`
    Diffrax raises for them, under this name)."""


class UnsupportedCombination(ValueError, NotImplementedError):
    """Options that do not work together (a `ValueError`, and the `NotImplementedError`
    Diffrax raises for them)."""


class ComplexStateWarning(UserWarning):
    """Said once per call site when `y0` is complex, as Diffrax warns ("Complex dtype"):
    what a complex solve means here. Silence it with
    `warnings.filterwarnings("ignore", category=odesolve.ComplexStateWarning)`."""


COMPLEX_STATE = (
    "Complex dtype: y0 is complex. odesolve solves it in real time with errors measured "
    "by modulus; a gradient with respect to a complex value follows JAX's convention "
    "(for a real loss L of z = x + iy, jax.grad gives dL/dx - i dL/dy). Silence this with "
    "warnings.filterwarnings('ignore', category=odesolve.ComplexStateWarning)."
)

InvalidStepTimes.__module__ = UnsupportedCombination.__module__ = "odesolve"
InvalidSaveTimes.__module__ = TermAndSolverIncompatible.__module__ = "odesolve"
ComplexStateWarning.__module__ = "odesolve"
