"""Adaptive step sizes: the PID controller (with I and PI as special cases).

Follows Soderlind, "Digital filters in adaptive time-stepping", ACM TOMS 29 (2003), in the
form Diffrax uses, so that the same settings take the same steps:

    factor = safety * e_n^(-(p+i+d)/q) * e_{n-1}^((p+2d)/q) * e_{n-2}^(-d/q),

with e the scaled error norm of a step and q the solver's error order, clipped to
[1, factormax] on acceptance and [factormin, safety] on rejection.
"""

import math
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax import lax
from jax.typing import ArrayLike
from jaxtyping import Array, Bool, Float

from adjoints import trace_time_value

from .._checks import check_flag
from .._flat import FlatSpec, RealScalarLike, in_state_dtype
from .._norm import rms_norm
from .._results import RESULTS
from .._time import times_array
from ._base import (
    AbstractAdaptiveStepSizeController,
    AttemptInput,
    FirstStepInput,
    Proposal,
    check_step_times,
    clip_to_times,
    concrete_float,
    finite_times,
    signed_times,
    stops_before,
)


def _is_zero(x: object) -> bool:
    return isinstance(x, (int, float)) and x == 0


def _power(base: Float[Array, ""], exponent: ArrayLike) -> Float[Array, ""]:
    """`base ** exponent` for a base in [0, inf], as exp(exponent log base): XLA's general
    power (which also handles negative bases) took 4x as long on CPU, a sixth of a small
    ensemble's step (benchmarks/README.md, W10)."""
    return jnp.exp(exponent * jnp.log(base))


# Allowed values of PIDController's scalar options: (low, high, low allowed, the fix).
_RANGES = {
    "rtol": (0.0, math.inf, True, "tolerances must be >= 0, e.g. 1e-6."),
    "atol": (0.0, math.inf, True, "tolerances must be >= 0, e.g. 1e-6."),
    "dtmin": (0.0, math.inf, True, "a step size bound must be >= 0 (a magnitude)."),
    "dtmax": (0.0, math.inf, False, "a step size bound must be > 0 (a magnitude)."),
    "factormin": (0.0, 1.0, False, "must be in (0, 1]: how far a step may shrink, e.g. 0.2."),
    "factormax": (1.0, math.inf, True, "must be >= 1: how far a step may grow, e.g. 10."),
    "safety": (0.0, 1.0, False, "must be in (0, 1], e.g. 0.9."),
}


def _check_tolerance_array(name: str, value: Any) -> None:
    """A tolerance known at construction is real, and per component finite and >= 0 (a
    scalar's range is checked with the other options; a traced one when the solve runs)."""
    if jnp.iscomplexobj(value):
        raise TypeError(f"PIDController({name}={value!r}): pass a real tolerance, e.g. 1e-6.")
    known = None if jnp.ndim(value) == 0 else trace_time_value(value)
    if known is None:
        return
    known = np.asarray(known)
    bad = ~(np.isfinite(known) & (known >= 0))
    if np.any(bad):
        i = tuple(int(j) for j in np.argwhere(bad)[0])
        raise ValueError(
            f"PIDController({name}=array with {name}{list(i)}={known[i]}): each tolerance "
            "must be finite and >= 0, e.g. 1e-6."
        )


def _known(value: object) -> float | None:
    """A scalar option's value when known at construction (None: unset or traced)."""
    return None if value is None else concrete_float(value)


def _scale_per_leaf(
    rtol: Any, atol: Any, y0: Float[Array, " n"], y1: Float[Array, " n"], spec: FlatSpec
) -> Float[Array, " n"]:
    """atol + rtol max(|y0|, |y1|), flat, with array tolerances broadcast against each
    leaf of the state as Diffrax does (an `atol` of shape (2,) for a state of (3, 2))."""

    def one(a: Array, b: Array) -> Array:
        leaf = atol + rtol * jnp.maximum(jnp.abs(a), jnp.abs(b))
        return jnp.ravel(jnp.broadcast_to(leaf, a.shape))

    leaves = jtu.tree_leaves(jtu.tree_map(one, spec.unravel(y0), spec.unravel(y1)))
    return leaves[0] if len(leaves) == 1 else jnp.concatenate(leaves)


class PIDController(AbstractAdaptiveStepSizeController):
    """Adapt the step size to keep the local error within rtol * |y| + atol.

    A step is accepted when the norm of its error estimate, scaled elementwise by
    `atol + rtol * max(|y0|, |y1|)`, is below 1; the next step is the last one times
    `safety * e_n^(-(p+i+d)/q) * e_{n-1}^((p+2d)/q) * e_{n-2}^(-d/q)` (Soderlind 2003,
    as in Diffrax): e_n is this step's scaled error norm, e_{n-1} and e_{n-2} those of
    the two accepted steps before it, q the error order.

    - `rtol`, `atol`: relative and absolute tolerance (>= 0, not both 0); scalars.
    - `norm`: maps the PyTree of scaled errors (structured like y0) to a scalar; the
      default is `rms_norm`, the RMS over all elements.
    - `pcoeff`, `icoeff`, `dcoeff`: the filter's proportional, integral and derivative
      coefficients p, i, d. The default (0, 1, 0) is the classic I controller; e.g.
      (0.4, 0.3, 0) is a PI controller, smoother on mildly stiff problems.
    - `dtmin`, `dtmax`: bounds on the step size's magnitude (None: unbounded). The first
      step is clipped to them too.
    - `force_dtmin`: with `dtmin` set, True accepts a step at `dtmin` whatever its
      error and goes on; False ends the solve with `RESULTS.dt_min_reached` when the
      controller asks for a smaller step.
    - `step_ts`: (k,) times every step must land on (steps are clipped to end there).
    - `jump_ts`: (k,) times where the vector field is discontinuous: a step ends just
      before each (one float below) and the next starts there, so no step straddles a
      jump, and a first-same-as-last solver re-evaluates its derivative after it.
    - `factormin`, `factormax`: how far one step may shrink after a rejection (in
      (0, 1], default 0.2) and grow after an acceptance (>= 1, default 10). After a
      rejection the factor is also at most `safety`; after an acceptance at least 1.
    - `safety`: multiplies every proposed factor, in (0, 1] (default 0.9): aim a little
      under the tolerance so fewer steps are rejected.
    - `error_order`: the order q in the filter's exponents (None: the solver's
      `error_order()`, for most Runge-Kutta methods their order).
    """

    # In Diffrax's order, for arguments passed by position; then the step and jump
    # times, which Diffrax 0.7 moved to `ClipStepSizeController`.
    rtol: Any
    atol: Any
    norm: Callable | None = None
    pcoeff: Any = 0
    icoeff: Any = 1
    dcoeff: Any = 0
    dtmin: Any = None
    dtmax: Any = None
    force_dtmin: bool = True
    factormin: Any = 0.2
    factormax: Any = 10.0
    safety: Any = 0.9
    error_order: Any = None
    step_ts: Any = eqx.field(default=None, converter=times_array)
    jump_ts: Any = eqx.field(default=None, converter=times_array)

    def __check_init__(self):
        """Values known when constructed (numbers, NumPy or concrete JAX scalars) are
        checked here; traced ones cannot be."""
        # The fields read once, as a dict: a Module's attribute access is slow, and a
        # script that builds its controller on every call pays for each read.
        fields = vars(self)
        for name in _RANGES:
            value = fields[name]
            if isinstance(value, (str, bytes)):
                raise TypeError(f"PIDController({name}={value!r}): pass a number.")
        for name in ("rtol", "atol"):
            if fields[name] is None:
                raise TypeError(
                    f"PIDController({name}=None): pass a tolerance, e.g. {name}=1e-6 (an "
                    "adaptive step needs both rtol and atol)."
                )
            if isinstance(fields[name], (list, tuple, dict)):
                raise TypeError(
                    f"PIDController({name}={fields[name]!r}): pass a number, or an array "
                    f"for tolerances per component (e.g. {name}=jnp.array([...]), broadcast "
                    "against each leaf of the state)."
                )
            if _known(fields[name]) == math.inf:
                raise ValueError(
                    f"PIDController({name}=inf) turns off error control: pass a finite "
                    "tolerance, or ConstantStepSize() for fixed steps."
                )
            _check_tolerance_array(name, fields[name])
        known = {name: _known(fields[name]) for name in _RANGES}
        for name, (low, high, closed_low, fix) in _RANGES.items():
            value = known[name]
            if value is None:
                continue
            above = value >= low if closed_low else value > low
            if not (above and value <= high):  # also catches nan
                given = fields[name]
                shown = given if isinstance(given, (int, float)) else f"{value:.6g}"
                raise ValueError(f"PIDController({name}={shown}): {fix}")
        for name in ("pcoeff", "icoeff", "dcoeff"):
            value = fields[name]
            if isinstance(value, (str, bytes)) or not eqx.is_array_like(value):
                raise TypeError(f"PIDController({name}={value!r}): pass a number, e.g. 0.3.")
            if not math.isfinite(_known(value) or 0.0):
                raise ValueError(f"PIDController({name}={value!r}): pass a finite number.")
        order = self.error_order
        if order is not None and (
            isinstance(order, (bool, str, bytes)) or not eqx.is_array_like(order)
        ):
            raise TypeError(
                f"PIDController(error_order={order!r}): pass a number (the order q of the "
                "error estimate), or None for the solver's."
            )
        known_order = None if order is None else _known(order)
        if known_order is not None and not (0 < known_order < math.inf):  # also catches nan
            raise ValueError(
                f"PIDController(error_order={order!r}): pass a positive number (the order q "
                "of the error estimate: the step's exponents divide by it), or None for the "
                "solver's."
            )
        check_flag("force_dtmin", self.force_dtmin, "PIDController")
        if self.norm is not None and not callable(self.norm):
            raise TypeError(
                f"PIDController(norm={self.norm!r}): pass a function from the PyTree of "
                "scaled errors to a scalar, e.g. odesolve.rms_norm, or None."
            )
        check_step_times("PIDController", "step_ts", self.step_ts)
        check_step_times("PIDController", "jump_ts", self.jump_ts)
        if known["rtol"] == 0 and known["atol"] == 0:
            raise ValueError("PIDController(rtol=0, atol=0): set at least one > 0.")
        dtmin, dtmax = known["dtmin"], known["dtmax"]
        if dtmin is not None and dtmax is not None and dtmin > dtmax:
            raise ValueError(
                f"PIDController(dtmin={dtmin}, dtmax={dtmax}): dtmin must not exceed dtmax."
            )

    @property
    def needs_error(self) -> bool:
        return True

    def tolerances(self):
        return self.rtol, self.atol

    @property
    def has_jumps(self) -> bool:
        return self.jump_ts is not None

    def times_are_valid(self, t_start: Float[Array, ""], t_end: Float[Array, ""]) -> Any:
        return finite_times(self.step_ts, self.jump_ts)

    def num_steps(
        self,
        t0: RealScalarLike,
        t1: RealScalarLike,
        dt0: RealScalarLike | None,
        time_dtype: np.dtype,
    ) -> int | None:
        return None

    def wrap(self, direction: Float[Array, ""]):
        def flip(ts: ArrayLike | None):
            return None if ts is None else jnp.sort(signed_times(ts, direction))

        return eqx.tree_at(
            lambda c: (c.step_ts, c.jump_ts),
            self,
            (flip(self.step_ts), flip(self.jump_ts)),
            is_leaf=lambda x: x is None,
        )

    def _q(self, error_order: int):
        return error_order if self.error_order is None else self.error_order

    def _scaled_norm(
        self,
        y0: Float[Array, " n"],
        y1: Float[Array, " n"],
        y_error: Float[Array, " n"],
        spec: FlatSpec,
    ):
        # A NaN candidate would poison the scale; measure against y0 instead.
        y1 = jnp.where(jnp.isnan(y1), y0, y1)
        if jnp.ndim(self.atol) == 0 and jnp.ndim(self.rtol) == 0:
            scale = self.atol + self.rtol * jnp.maximum(jnp.abs(y0), jnp.abs(y1))
        else:
            scale = _scale_per_leaf(self.rtol, self.atol, y0, y1, spec)
        scaled = y_error / in_state_dtype(scale, y_error)  # a real scale, maybe complex y
        if self.norm is None:
            return rms_norm(scaled)
        error = self.norm(spec.unravel(scaled))
        if jnp.shape(error) != ():
            raise ValueError(
                f"PIDController(norm={self.norm!r}) returned shape {jnp.shape(error)}: a "
                "norm maps the scaled errors to one scalar, e.g. jnp.max(jnp.abs(x))."
            )
        return error

    def start(self, first: FirstStepInput):
        t0, dt0 = first.t0, first.dt0
        if dt0 is None:
            dt0 = self._initial_step(first, self._q(first.error_order))
        dt0 = jnp.asarray(dt0, dtype=jnp.result_type(t0))
        if self.dtmax is not None:
            dt0 = jnp.minimum(dt0, self.dtmax)
        if self.dtmin is not None:  # as Diffrax: the first step too is at least dtmin
            dt0 = jnp.maximum(dt0, self.dtmin)
        one = jnp.ones((), jnp.result_type(t0))
        # Only the history the filter reads is carried: an I controller (the default)
        # carries none, which is two fewer selects on every step.
        uses_prev, uses_prevprev = self._uses_history()
        state = (
            one if uses_prev else None,
            one if uses_prevprev else None,
            jnp.asarray(False) if self.dtmin is not None else None,
        )
        return self._clip_to_ts(t0, t0 + dt0), state

    def _uses_history(self) -> tuple[bool, bool]:
        """Whether the filter reads e_{n-1} and e_{n-2} (static: coefficients that are
        arrays count as nonzero)."""
        uses_prevprev = not _is_zero(self.dcoeff)
        uses_prev = uses_prevprev or not _is_zero(self.pcoeff)
        return uses_prev, uses_prevprev

    def _initial_step(self, first: FirstStepInput, q: float):
        """Hairer, Norsett & Wanner I, sec. II.4: a first step whose Euler error estimate
        is about 1% of the tolerance. One extra evaluation of the vector field."""
        vf, t0, y0, k0, spec = first.vf, first.t0, first.y0, first.k0, first.spec
        scale = in_state_dtype(self.atol + jnp.abs(y0) * self.rtol, y0)
        user_norm = self.norm
        norm = rms_norm if user_norm is None else (lambda x: user_norm(spec.unravel(x)))
        d0, d1 = norm(y0 / scale), norm(k0 / scale)
        tiny = (d0 < 1e-5) | (d1 < 1e-5)
        h0 = jnp.where(tiny, 1e-6, 0.01 * d0 / jnp.where(tiny, 1, d1))
        k1 = vf(t0 + h0, y0 + in_state_dtype(h0, y0) * k0, first.args)
        d2 = norm((k1 - k0) / scale) / h0
        d = jnp.maximum(d1, d2)
        h1 = jnp.where(d <= 1e-15, jnp.maximum(1e-6, h0 * 1e-3), (0.01 / d) ** (1 / q))
        return lax.stop_gradient(jnp.minimum(100 * h0, h1))

    def _clip_to_ts(self, start: Float[Array, ""], end: Float[Array, ""]):
        return clip_to_times(start, end, self.step_ts, self.jump_stops())

    def jump_stops(self):
        return stops_before(self.jump_ts)

    def adapt(self, attempt: AttemptInput):
        t0, t1, y_error = attempt.t0, attempt.t1, attempt.y_error
        inv_prev, inv_prevprev, at_dtmin = attempt.state
        q = self._q(attempt.error_order)
        # `needs_error` is True: the step loop always passes an error estimate here.
        assert y_error is not None
        error = self._scaled_norm(attempt.y0, attempt.y1, y_error, attempt.spec)
        error = jnp.where(jnp.isnan(error), jnp.inf, error)
        accept = error < 1
        if self.dtmin is not None:
            accept = accept | at_dtmin
        # The step-size factor is not differentiated: gradients are those of the
        # discretisation actually taken (and this keeps them finite). The step length
        # keeps its derivative, so the grid moves with the time inputs that placed it:
        # a step clipped to a traced step time passes that time's derivative on.
        inv = lax.stop_gradient(1 / error)
        factor = self.safety * self._filter(inv, inv_prev, inv_prevprev, q)
        factor = jnp.clip(
            factor,
            jnp.where(accept, 1.0, self.factormin),
            jnp.where(accept, self.factormax, self.safety),
        )
        dt = (t1 - t0) * factor.astype(jnp.result_type(t0))
        dt, at_dtmin, result = self._bound(dt, at_dtmin, factor)
        start = jnp.where(accept, t1, t0)
        next_end = self._clip_to_ts(start, start + dt)
        # A shorter retry that rounds to the rejected step's end is that step again, and
        # is rejected again, forever: the step has reached the resolution of the times'
        # dtype (a float32 time at t = 800 resolves 6e-5; Van der Pol with mu = 1000 at
        # rtol 1e-5 needs shorter steps there). Say so rather than spin to `max_steps`.
        # (A retry at dtmin differs: it is accepted whatever its error.)
        stalled = ~accept & (next_end >= t1)
        if at_dtmin is not None:
            stalled = stalled & ~at_dtmin
        result = jnp.where(stalled, RESULTS.step_size_underflow, result)
        # An error of 0 or inf says nothing about the next step: forget it.
        inv = jnp.where((inv == 0) | jnp.isinf(inv), 1, inv)
        state = (
            None if inv_prev is None else jnp.where(accept, inv, inv_prev),
            None if inv_prevprev is None else jnp.where(accept, inv_prev, inv_prevprev),
            at_dtmin,
        )
        return Proposal(accept, next_end, state, result)

    def _filter(
        self,
        inv: Float[Array, ""],
        inv_prev: Float[Array, ""] | None,
        inv_prevprev: Float[Array, ""] | None,
        q: float,
    ):
        c1 = (self.icoeff + self.pcoeff + self.dcoeff) / q
        c2 = -(self.pcoeff + 2 * self.dcoeff) / q
        c3 = self.dcoeff / q
        # inv is in [0, inf] (the error's NaN became inf); the history is finite, > 0.
        factor = 1 if _is_zero(c1) else _power(inv, c1)
        if inv_prev is not None:
            factor = factor * _power(inv_prev, c2)
        if inv_prevprev is not None:
            factor = factor * _power(inv_prevprev, c3)
        return jnp.asarray(factor, dtype=jnp.result_type(inv))

    def _bound(
        self, dt: Float[Array, ""], at_dtmin: Bool[Array, ""] | None, factor: Float[Array, ""]
    ):
        result: Any = RESULTS.successful
        if self.dtmax is not None:
            dt = jnp.minimum(dt, self.dtmax)
        if self.dtmin is not None:
            assert at_dtmin is not None  # carried whenever there is a dtmin
            if not self.force_dtmin:
                result = jnp.where(dt < self.dtmin, RESULTS.dt_min_reached, result)
            dt = jnp.where(at_dtmin & (factor == 1), self.dtmin, dt)
            at_dtmin = dt <= self.dtmin
            dt = jnp.maximum(dt, self.dtmin)
        return dt, at_dtmin, result
