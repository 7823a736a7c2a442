"""The interface between the step loop and a step-size controller.

All times here are in the solver's internal time tau = direction * t, which always
increases; `wrap(direction)` maps a controller's own time arrays into it.
"""

import abc
import functools
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax.typing import ArrayLike
from jaxtyping import Array, Bool, Float

from adjoints import trace_time_value

from .._checks import check_real_times
from .._flat import FlatSpec, PyTree, RealScalarLike, flat_spec, state_dtype
from .._results import Result
from .._solver._base import Field
from .._time import as_times


def concrete_float(x: object) -> float | None:
    """`x` as a Python float when it is known at trace time, else None (a tracer, or not
    a real scalar)."""
    if type(x) is float or type(x) is int:  # the usual case, without a NumPy round trip
        return float(x)
    value = trace_time_value(x)
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def check_step_times(owner: str, name: str, ts: Any) -> None:
    """`step_ts`/`jump_ts` given to `owner`: None, or a 1-D array of real times, finite
    where known at construction (NaN would be passed by every step without a word)."""
    if ts is None:
        return
    shape = np.shape(ts)  # a list too, which `jnp.shape` would refuse
    if len(shape) != 1:
        raise ValueError(f"{owner}({name}=...): pass a 1-D array of times, got shape {shape}.")
    check_real_times(f"{owner}({name}=...)", ts)
    value = trace_time_value(ts)
    if value is not None and not np.all(np.isfinite(np.asarray(value, dtype=float))):
        i = int(np.argmax(~np.isfinite(np.asarray(value, dtype=float))))
        raise ValueError(f"{owner}({name}=...) has {name}[{i}]={value[i]}: times must be finite.")


def finite_times(*times: Any) -> Any:
    """Whether every `step_ts`/`jump_ts` given (None: not given) is finite: the run-time
    side of `check_step_times`, for times that were traced when the controller was made."""
    finite = jnp.asarray(True)
    for ts in times:
        if ts is not None:
            finite = finite & jnp.all(jnp.isfinite(ts))
    return finite


class FirstStepInput(eqx.Module):
    """What a controller's `start` is told to choose the first step.

    - `vf`: the vector field on the flat state, f(t, y, args), to try a first step with.
    - `t0`, `t1`: where the solve starts and ends (internal time tau).
    - `y0`: (n,) the initial state; `k0`: (n,) f(t0, y0).
    - `dt0`: the first step's size as the user gave it (tau), or None to choose one.
    - `args`: the user's `args`, passed to `vf`.
    - `error_order`: the solver's; the step-size exponent is 1 / error_order (static).
    - `spec`: the static layout of the user's state, for a norm on it (`FlatSpec`).
    - `number_times`: t0, t1 and dt0 were given as Python numbers, which Diffrax's
      compiled program holds as constants (`ConstantStepSize` places its steps as it).
    """

    vf: Field
    t0: Float[Array, ""]
    t1: Float[Array, ""]
    y0: Float[Array, " n"]
    k0: Float[Array, " n"]
    dt0: Float[Array, ""] | None
    args: PyTree
    error_order: int = eqx.field(static=True)
    spec: FlatSpec = eqx.field(static=True)
    number_times: bool = eqx.field(static=True, default=False)


class AttemptInput(eqx.Module):
    """An attempted step, as a controller's `adapt` is told it to accept or reject it.

    - `t0`, `t1`: where the step started and ended (internal time tau).
    - `y0`: (n,) the state at t0; `y1`: (n,) the step's candidate at t1.
    - `y_error`: (n,) the step's error estimate, or None (none asked for: `needs_error`
      is False, or the solver has none).
    - `state`: the controller's state (`start`'s, then the last `Proposal.state`).
    - `error_order`: the solver's; the step-size exponent is 1 / error_order (static).
    - `spec`: the static layout of the user's state, for a norm on it (`FlatSpec`).
    - `args`: the user's `args` (a controller written in Diffrax's interface reads them).
    """

    t0: Float[Array, ""]
    t1: Float[Array, ""]
    y0: Float[Array, " n"]
    y1: Float[Array, " n"]
    y_error: Float[Array, " n"] | None
    state: PyTree
    error_order: int = eqx.field(static=True)
    spec: FlatSpec = eqx.field(static=True)
    args: PyTree = None


class Proposal(eqx.Module):
    """A controller's verdict on an attempted step.

    - `accept`: keep the step.
    - `next_end`: where the next step should end (from the new start time).
    - `state`: the controller's new state.
    - `result`: a `RESULTS` code (successful unless the controller gives up).
    - `start`, `made_jump`: where the next step starts, and whether an accepted step
      ended on a jump of the vector field, for a controller that says (one written in
      Diffrax's interface returns them); None: at t1 if accepted, else at t0, and from
      the controller's jump times.
    """

    accept: Any
    next_end: Any
    state: Any
    result: Any
    start: Any = None
    made_jump: Any = None


# The step loop's contract, which a controller written in Diffrax's interface does not
# define: `diffeqsolve` runs such a controller through an adapter (`_user.UserController`).
_LOOP_CONTRACT = frozenset(
    {
        *("needs_error", "has_jumps", "jump_stops", "tolerances"),
        *("times_are_valid", "num_steps", "start", "adapt"),
    }
)
# What Diffrax's `AbstractStepSizeController` requires of a subclass.
_DIFFRAX_INTERFACE = ("wrap", "init", "adapt_step_size")


def writes_diffrax_step_sizes(cls: type) -> bool:
    """Whether a controller class is written in Diffrax's interface: the first class in
    its MRO to define `init` or `adapt_step_size` or the loop's `start` or `adapt`
    defines the former (this module's bases, which implement Diffrax's methods on the
    loop's contract, do not count)."""
    for k in cls.__mro__:
        own = vars(k)
        if k.__module__ == __name__ or "start" in own or "adapt" in own:
            return False
        if "init" in own or "adapt_step_size" in own:
            return True
    return False


class _DiffraxInterface(type(eqx.Module)):  # type: ignore[misc]
    def __new__(mcs, name: str, bases: tuple, namespace: dict, **kwargs: Any) -> Any:
        cls = super().__new__(mcs, name, bases, namespace, **kwargs)
        if writes_diffrax_step_sizes(cls):
            # Abstract as Diffrax's controller is: `wrap`, `init` and `adapt_step_size`
            # must be written; the loop's contract is the adapter's, not the class's.
            unwritten = {
                m
                for m in _DIFFRAX_INTERFACE
                if next(k for k in cls.__mro__ if m in vars(k)).__module__ == __name__
            }
            cls.__abstractmethods__ = (cls.__abstractmethods__ - _LOOP_CONTRACT) | unwritten
        return cls


class AbstractStepSizeController(eqx.Module, metaclass=_DiffraxInterface):
    """Chooses step sizes. Times given to a controller are internal (tau = direction *
    t, see `wrap`), so they always increase. Subclasses are abstract or final.

    A subclass written in Diffrax's interface instead (`wrap`, `init` and
    `adapt_step_size` on the user's PyTree state) runs in `diffeqsolve` too, through
    `_user.UserController`."""

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
        self,
        t0: RealScalarLike,
        t1: RealScalarLike,
        dt0: RealScalarLike | None,
        time_dtype: np.dtype,
    ) -> int | None:
        """The number of steps when it is known before solving (static), else None: the
        number the step loop takes, counted as it counts them, in `time_dtype`."""

    @abc.abstractmethod
    def start(self, first: FirstStepInput) -> tuple[Any, Any]:
        """Return (end of the first step, initial state)."""

    @abc.abstractmethod
    def adapt(self, attempt: AttemptInput) -> Proposal:
        """Accept or reject the step from t0 to t1, and propose the next one's end."""

    # ------------------------------------------------- Diffrax's low-level API

    def init(
        self,
        terms: Any,
        t0: RealScalarLike,
        t1: RealScalarLike,
        y0: PyTree,
        dt0: RealScalarLike | None,
        args: PyTree,
        func: Callable,
        error_order: int | None,
    ) -> tuple[Any, Any]:
        """(The end of the first step, the controller state), as Diffrax's
        `controller.init`, for writing your own step loop with times that increase.
        `func(terms, t, y, args)` is the vector field (`solver.func`); with `dt0=None`
        the first step is chosen from it."""
        start, end, first_dt = as_times(t0, t1, dt0, state=y0)
        spec, y = _flat(y0)
        vf = lambda t, x, a: spec.ravel(func(terms, t, spec.unravel(x), a))
        controller = self.wrap(jnp.ones((), start.dtype))
        k0 = vf(start, y, args)
        return controller.start(
            FirstStepInput(
                vf=vf,
                t0=start,
                t1=end,
                y0=y,
                k0=k0,
                dt0=first_dt,
                args=args,
                error_order=error_order or 1,
                spec=spec,
            )
        )

    def adapt_step_size(
        self,
        t0: RealScalarLike,
        t1: RealScalarLike,
        y0: PyTree,
        y1_candidate: PyTree,
        args: PyTree,
        y_error: PyTree | None,
        error_order: int | None,
        controller_state: PyTree,
    ) -> tuple[Any, Any, Any, Any, Any, Any]:
        """Accept or reject the step from t0 to t1, as Diffrax's
        `controller.adapt_step_size`: (keep_step, next_t0, next_t1, made_jump,
        controller_state, result). A step that ends just before a jump time (see
        `jump_ts`) makes the next one start just after it, with `made_jump` True."""
        start, end = as_times(t0, t1, state=y0)
        spec, y = _flat(y0)
        controller = self.wrap(jnp.ones((), start.dtype))
        error = None if y_error is None else spec.ravel(y_error)
        y1 = spec.ravel(y1_candidate)
        proposal = controller.adapt(
            AttemptInput(
                t0=start,
                t1=end,
                y0=y,
                y1=y1,
                y_error=error,
                state=controller_state,
                error_order=error_order or 1,
                spec=spec,
                args=args,
            )
        )
        accept = jnp.asarray(proposal.accept)
        stops = controller.jump_stops() if controller.has_jumps else None
        next_t0, jumped = next_start(stops, accept, start, end)
        made_jump = jnp.asarray(False) if jumped is None else jumped
        result = Result(jnp.asarray(proposal.result, jnp.int32))
        return accept, next_t0, proposal.next_end, made_jump, proposal.state, result


def _flat(y0: PyTree) -> tuple[FlatSpec, Array]:
    y0 = jtu.tree_map(jnp.asarray, y0)  # Python numbers too
    spec = flat_spec(y0, state_dtype(jtu.tree_leaves(y0)))
    return spec, spec.ravel(y0)


def next_start(
    stops: Float[Array, " k"] | None, accept: Bool[Array, ""], t0: Array, t1: Array
) -> tuple[Any, Any]:
    """Where the next step starts, and whether this one stopped at a jump (None: no
    jump times). Across a jump the next step starts just after it (its right limit):
    t1 is the float below the jump time, one of `stops`."""
    t_new = jnp.where(accept, t1, t0)
    if stops is None:
        return t_new, None
    jumped = accept & jnp.any(stops == t1)
    return jnp.where(jumped, floats_away(t1, 2), t_new), jumped


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
    return floats_away(jump_ts, -1)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def floats_away(x: Array, n: int) -> Array:
    """`x` moved by `n` representable floats (below it for n < 0), with the derivative
    of `x` itself: a time placed next to another moves with it (`nextafter` alone has
    no derivative). One operation rather than `x + (moved - x)`: XLA may reassociate
    that sum inside a loop into `(x + moved) - x`, which rounds back onto `x`."""
    towards = jnp.inf if n > 0 else -jnp.inf
    for _ in range(abs(n)):
        x = jnp.nextafter(x, towards)
    return x


@floats_away.defjvp
def _floats_away_jvp(n: int, primals: tuple, tangents: tuple) -> tuple[Array, Array]:
    (x,), (dx,) = primals, tangents
    return floats_away(x, n), dx


def clip_to_times(
    start: Float[Array, ""],
    end: Float[Array, ""],
    step_ts: Float[Array, " k"] | None,
    jump_stops: Float[Array, " k"] | None,
) -> Any:
    """Cap a step from `start` at the first step time after it, and at the first stop
    before a jump after it (a step must not straddle a discontinuity, nor end on it: the
    vector field's value exactly there belongs to the other side).

    Times within one float of `start` are behind it: a step that stopped just below a
    jump time (at its stop) is followed by one from just past it, so the jump time
    itself, also a step time here or in an enclosing `ClipStepSizeController`, has been
    reached; capping there would propose a step that ends before it starts."""
    reached = jnp.nextafter(jax.lax.stop_gradient(start), jnp.inf)
    for ts in (step_ts, jump_stops):
        if ts is not None:
            after = jnp.where(ts > reached, ts, jnp.inf)
            end = jnp.minimum(end, jnp.min(after))
    return end
