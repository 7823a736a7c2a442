"""Trace-time checks of `diffeqsolve`'s inputs, and their normal form.

Each error names the argument, shows the value and says the fix. Values that are traced
(inside the user's `jit`) cannot be checked here; the loop checks those at run time and
reports them through `RESULTS`.
"""

import re
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from adjoints import AbstractAdjoint, is_concrete

from . import _hints, _time
from ._checks import broadcasts_to, check_array_leaves, first_out_of_order, has_odd_dtype
from ._closure import trace_once
from ._controller._base import AbstractStepSizeController
from ._controller._base import concrete_float as _concrete
from ._controller._user import controller_name
from ._controller.constant import ConstantStepSize, StepTo
from ._event import BoundCondition, check_condition_outputs, condition_kwargs
from ._flat import PyTree, complex_dtype, real_dtype, widest_float
from ._progress_meter import AbstractProgressMeter
from ._results import InvalidSaveTimes, InvalidStepTimes
from ._saveat import SaveAt
from ._solver._base import AbstractSolver
from ._solver._user import own_terms, steps_with_own_terms
from ._term import BroadcastTo, ODETerm, SplitField, as_one_term


class Inputs(eqx.Module):
    terms: Any
    event: Any
    t0: Any
    t1: Any
    dt0: Any
    y0: Any
    direction: Any  # +1/-1 when t0, t1 are concrete, else None (decided at run time)
    num_steps: Any  # static step count when known, else None


def _float_dtype(dtype) -> Any:
    if jnp.issubdtype(dtype, jnp.inexact):  # real or complex
        return dtype
    if jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.bool_):
        return jnp.result_type(float)  # float64 with jax_enable_x64, else float32
    raise TypeError(f"dtype {dtype} is not real")


def _promoted(dtype: Any, time_dtype: Any) -> Any:
    """A state dtype at least as precise as the time arrays' (complex stays complex)."""
    real = widest_float(real_dtype(dtype), time_dtype)
    return complex_dtype(real) if jnp.issubdtype(dtype, jnp.complexfloating) else real


def _normalise_y0(y0: Any) -> Any:
    _, treedef = jtu.tree_flatten(y0)  # (a y0 without arrays is solved elsewhere)
    out = []
    check_array_leaves(y0, "y0")
    for leaf in jtu.tree_leaves(y0):
        if type(leaf) is int:  # solved as a float: one beyond int32 converts as well
            leaf = float(leaf)
        leaf = jnp.asarray(leaf)
        out.append(leaf.astype(_float_dtype(leaf.dtype)))
    return jtu.tree_unflatten(treedef, out)


def ends_without_t1(event: Any, max_steps: int | None) -> bool:
    """Whether a solve ends with t1 = inf: an event or an integer `max_steps` ends it."""
    return event is not None or max_steps is not None


def _check_times(t0, t1, dt0, controller, event, max_steps):
    c0, c1, cdt = _concrete(t0), _concrete(t1), _concrete(dt0) if dt0 is not None else None
    for name, value in (("t0", c0), ("t1", c1), ("dt0", cdt)):
        if value is None or np.isfinite(value):
            continue
        if name == "t1" and not np.isnan(value) and ends_without_t1(event, max_steps):
            continue  # solve until the event fires or max_steps steps are taken
        raise ValueError(
            f"{name}={value} is not finite: pass a finite time"
            + (
                " (t1=inf needs an event or an integer max_steps to end the solve)."
                if name == "t1" and not np.isnan(value)
                else "."
            )
        )
    if cdt is not None and c0 is not None and c1 is not None:
        # (An empty interval is solved by any dt0, as in Diffrax: it takes no step.)
        if (cdt == 0 and c1 != c0) or (c1 - c0) * cdt < 0:
            fix = abs(cdt) if c1 > c0 else -abs(cdt)
            raise ValueError(
                f"dt0={cdt} points the wrong way for integrating from t0={c0} to t1={c1}: "
                f"pass dt0={fix if cdt else (c1 - c0) / 100} (dt0 must have the sign of "
                "t1 - t0)."
            )
    if isinstance(controller, StepTo):
        if dt0 is not None:
            shown = cdt if cdt is not None else dt0
            raise ValueError(
                f"dt0={shown!r} was passed with StepTo, which takes its steps from its "
                "`ts`; pass dt0=None."
            )
        ts = np.asarray(controller.ts) if _concrete(controller.ts[0]) is not None else None
        if ts is not None and c0 is not None and c1 is not None:
            if ts[0] != c0 or ts[-1] != c1:
                raise InvalidStepTimes(
                    f"StepTo(ts) must start at t0={c0} and end at t1={c1}; got "
                    f"ts[0]={ts[0]}, ts[-1]={ts[-1]}."
                )
            i = first_out_of_order(ts, np.sign(c1 - c0))
            if i is not None:
                raise InvalidStepTimes(
                    "StepTo(ts): ts must be strictly monotonic from t0 to t1; got "
                    f"ts[{i}]={ts[i]:.7g} then ts[{i + 1}]={ts[i + 1]:.7g}."
                )
    return c0, c1


def resolution(t_max: Any, dtype: Any, xp: Any = jnp) -> Any:
    """The smallest step that times of `dtype` near `t_max` represent to within half of
    its length: two spacings between consecutive values there. `xp`: `jnp` for traced
    times, `np` for concrete ones (inside `jit` a `jnp` result would be traced)."""
    return 2 * xp.spacing(xp.asarray(t_max, dtype))


def steps_of_dt0_throughout(controller: AbstractStepSizeController) -> bool:
    """Whether every step is dt0 long (`ConstantStepSize`), so that dt0 must be resolved
    by the times near both ends; any other controller takes dt0 once, at t0, and then
    chooses its steps (one that shrinks below the resolution later fails the solve with
    `step_size_underflow`)."""
    return isinstance(controller, ConstantStepSize)


def _check_resolution(c0, c1, cdt, dtype, controller: AbstractStepSizeController) -> None:
    if None in (c0, c1, cdt) or c0 == c1:  # an empty interval takes no step
        return
    t_max = max(abs(c0), abs(c1)) if steps_of_dt0_throughout(controller) else abs(c0)
    smallest = float(resolution(t_max, dtype, np))
    if abs(cdt) < smallest:
        name = jnp.dtype(dtype).name
        # Far from 0 at t0, shifting time helps; steps of dt0 all the way to a distant
        # t1 (constant steps from t0 near 0) need longer steps or finer times instead.
        shift = (
            f"shift time so the solve starts near 0 (t0=0, t1={c1 - c0:g}, with the field "
            f"given t + {c0:g}), "
            if abs(c0) >= abs(c1 - c0)
            else "use an adaptive controller (its steps grow where t is large), "
        )
        raise ValueError(
            f"dt0={cdt} is below the resolution of {name} times near t={t_max:g}: values "
            f"there are {smallest / 2:g} apart, so steps of that size cannot be taken. "
            f"To fix it, {shift}use float64 times, or pass |dt0| >= {smallest:g}."
        )


def _check_save_ts(ts, c0, c1, time_dtype):
    """Compared as the solve will compare them, in the time dtype: a float32 grid
    ending at float32(pi) ends at t1=pi. Times given in a narrower dtype are compared in
    theirs: float32(0.3), 0.30000001 in float64, ends a solve to t1=0.3 (and the solve
    saves it at t1: `_saving.save_times`)."""
    if ts is None or not is_concrete(ts):
        return
    dtype = jnp.result_type(ts) if _time.narrower_times(ts, time_dtype) else time_dtype
    ts = np.asarray(ts, dtype=dtype)
    given = (c0, c1)
    if c0 is not None and c1 is not None:
        c0, c1 = (np.asarray(c, dtype).item() for c in (c0, c1))
    if not np.all(np.isfinite(ts)):
        i = int(np.argmax(~np.isfinite(ts)))
        raise ValueError(f"SaveAt(ts=...) has ts[{i}]={ts[i]}: save times must be finite.")
    if c0 is None or c1 is None:
        return
    sign = 1 if c1 > c0 else -1
    if np.any(np.diff(ts) * sign < 0):
        i = int(np.argmax(np.diff(ts) * sign < 0))
        raise ValueError(
            f"SaveAt(ts=...) is not sorted in the direction of integration: ts[{i}]={ts[i]} "
            f"then ts[{i + 1}]={ts[i + 1]}. Sort it ({'increasing' if sign > 0 else 'decreasing'})."
        )
    lo, hi = min(c0, c1), max(c0, c1)
    outside = (ts < lo) | (ts > hi)
    if np.any(outside):
        i = int(np.argmax(outside))
        raise InvalidSaveTimes(
            f"SaveAt(ts=...) has ts[{i}]={ts[i]} outside [t0, t1] = [{given[0]}, {given[1]}]: save "
            "times must lie within the interval of integration."
        )


def _traced_vector_field(terms, t0, y0, args):
    """Trace the vector field, once per solve (see `_closure`), and check that it
    returns y0's structure and shapes."""
    if isinstance(terms.vector_field, SplitField):  # each part traced and checked alone
        trace_part = lambda part: _traced_vector_field(part, t0, y0, args)
        return ODETerm(terms.vector_field.map_parts(trace_part))
    try:
        traced = trace_once(terms.vf, t0, y0, args)
    except (TypeError, AttributeError, IndexError, KeyError) as e:
        hint = _field_hint(terms.vector_field, e, t0, y0, args)
        if hint is not None:
            message = f"calling the vector field f(t0, y0, args) failed: {e}. {hint}."
            raise TypeError(message) from None
        if not isinstance(e, TypeError):
            raise
        kind = re.search(r"value of type <class '([\w.]+)'>, which is not a valid JAX", str(e))
        if kind:
            raise TypeError(
                f"the vector field returned a value of type {kind.group(1)}, not an array: "
                "f(t, y, args) must return dy/dt, an array (or a PyTree of arrays) shaped "
                "like y0."
            ) from None
        raise TypeError(f"calling the vector field f(t0, y0, args) failed: {e}") from e
    # y0's shapes read off its arrays: `jax.eval_shape` would trace a function per call.
    expected = jtu.tree_map(lambda y: jax.ShapeDtypeStruct(jnp.shape(y), jnp.result_type(y)), y0)
    out = traced.out_struct
    got_def, want_def = jtu.tree_structure(out), jtu.tree_structure(expected)
    shapes = lambda tree: [tuple(x.shape) for x in jtu.tree_leaves(tree)]
    complex_leaves = [
        x.dtype
        for x, y in zip(jtu.tree_leaves(out), jtu.tree_leaves(expected))
        if jnp.iscomplexobj(x) and not jnp.iscomplexobj(y)
    ]
    if complex_leaves:
        raise TypeError(
            f"the vector field returned a complex value ({complex_leaves[0]}) for a real "
            "state: its imaginary part would be dropped. Return real arrays, or solve for "
            "the real and imaginary parts as two real states."
        )
    if any(x.dtype == jnp.bool_ for x in jtu.tree_leaves(out)):
        raise TypeError(
            "the vector field returned a boolean array: dy/dt is a number per component "
            "(a comparison such as y > 0 is a bool: turn it into rates, e.g. "
            "jnp.where(y > 0, rate, 0.0))."
        )
    # (jaxlib's stub for PyTreeDef declares no __eq__.)
    same_def = got_def == want_def  # type: ignore[operator]
    if same_def and shapes(out) != shapes(expected) and _broadcasts(out, expected):
        return ODETerm(BroadcastTo(traced, tuple(shapes(expected))))
    if not same_def or shapes(out) != shapes(expected):
        listed = _hints.list_of_numbers(y0)
        if listed:
            raise ValueError(
                f"the vector field's output does not match y0: it returned shapes "
                f"{shapes(out)} for y0's {len(y0)} scalars. {listed}."
            )
        raise ValueError(
            "the vector field's output does not match y0: f(t, y, args) returned "
            f"structure {got_def} with shapes {shapes(out)}, but y0 has structure "
            f"{want_def} with shapes {shapes(expected)}. dy/dt must have y's structure "
            "and shapes."
        )
    return ODETerm(traced)


def _field_of(given, terms, solver, t0, dt0, y0, args) -> ODETerm:
    """The field the loop integrates, traced and checked (`_traced_vector_field`). A
    solver written in Diffrax's interface given a term of the user's own that is no ODE
    (its `vf` returns nothing, or not dy/dt) steps with that term as given, as in
    Diffrax (`OwnTerms`)."""
    try:
        return _traced_vector_field(terms, t0, y0, args)
    except (TypeError, ValueError):
        if not steps_with_own_terms(solver, given):
            raise
    return own_terms(given, solver, t0, dt0, y0, args)


def _broadcasts(out: PyTree, expected: PyTree) -> bool:
    """Whether each leaf of the field's output broadcasts to its leaf of y0's shape (a
    scalar rate for a vector of states), as Diffrax's arithmetic broadcasts it."""
    pairs = zip(jtu.tree_leaves(out), jtu.tree_leaves(expected), strict=True)
    return all(broadcasts_to(o.shape, e.shape) for o, e in pairs)


def _field_hint(fn: Any, error: Exception, t0: Any, y0: Any, args: Any) -> str | None:
    """The likely mistake behind a vector field that failed on its first call."""
    signature = _hints.wrong_signature(fn, "ODETerm's vector field", "f(t, y, args)", t0, y0, args)
    if signature is not None:
        return f"{signature}: write it as def f(t, y, args) (args may go unused)"
    return _hints.args_not_passed(fn, error, t0, y0, args) or _hints.list_of_numbers(y0)


def _check_condition_returns_an_array(cond, out) -> None:
    """`out`: the shape of what the condition returned."""
    leaves, treedef = jtu.tree_flatten(out)
    # (jaxlib's stub for PyTreeDef declares no num_nodes.)
    if len(leaves) != 1 or treedef.num_nodes != 1:  # type: ignore[attr-defined]
        raise ValueError(f"event condition {cond!r} returned {out!r}; {_CONDITION_RETURNS}")


_CONDITION_RETURNS = (
    "each condition must return a scalar bool or a scalar float (e.g. y[0] for 'stop "
    "when y[0] crosses zero')."
)


class _NotAnArray(Exception):
    """An event condition returned something other than arrays or numbers."""


_ARRAY_LIKE = (jax.Array, np.ndarray, np.generic, bool, int, float)


class _CheckedCondition(eqx.Module):
    """`cond` with the solve's keyword arguments bound, refusing a non-array result
    before JAX's tracing turns it into an error about JAX types. A PyTree, not a
    closure: the arrays among the keyword arguments (times, the traced field's
    parameters) are its leaves, so `trace_once` keys its trace by their shapes and keeps
    it for the next solve of the same structure (an eager `jax.grad` called again)."""

    cond: Callable
    kwargs: dict[str, Any]

    @property
    def __name__(self) -> str:
        return getattr(self.cond, "__name__", "condition")

    def __call__(self, t: Any, y: PyTree, args: PyTree) -> Any:
        out = self.cond(t, y, args, **self.kwargs)
        if not all(isinstance(leaf, _ARRAY_LIKE) for leaf in jtu.tree_leaves(out)):
            raise _NotAnArray
        return out


def _traced_event(event, terms, solver, t0, t1, dt0, y0, args, saveat, controller, max_steps):
    """The event's conditions traced once each (see `_closure`), with their keyword
    arguments bound: they are fixed for the solve."""
    if event is None:
        return None
    kwargs = condition_kwargs(terms, solver, t0, t1, dt0, saveat, controller, max_steps)
    conditions = []
    for cond in event.conditions:
        bound = _CheckedCondition(cond, kwargs)
        try:
            traced = trace_once(bound, t0, y0, args)
        except _NotAnArray:  # returned a string, an object...
            raise ValueError(
                f"event condition {cond!r} returned a value that is not an array; "
                + _CONDITION_RETURNS
            ) from None
        except TypeError as e:
            call = "cond(t, y, args, **kwargs)"
            signature = _hints.wrong_signature(
                cond, "an event condition", call, t0, y0, args, **kwargs
            )
            if signature is not None:
                raise TypeError(
                    f"{signature}: the solve passes keyword arguments ({', '.join(kwargs)}), "
                    "as Diffrax does. Write it as def cond(t, y, args, **kwargs)."
                ) from None
            raise TypeError(
                f"calling the event condition {cond!r}(t0, y0, args) failed: {e}"
            ) from e
        _check_condition_returns_an_array(cond, traced.out_struct)
        conditions.append(BoundCondition(traced))
    check_condition_outputs(tuple(c.converted.out_struct for c in conditions), event.conditions)
    return event.with_conditions(conditions)


# (argument, the classes it takes, an example) for `check_kinds`.
_KINDS = (
    ("solver", (AbstractSolver,), "odesolve.Tsit5()"),
    ("saveat", (SaveAt,), "odesolve.SaveAt(t1=True)"),
    ("stepsize_controller", (AbstractStepSizeController,), "odesolve.PIDController(1e-6, 1e-6)"),
    ("adjoint", (AbstractAdjoint,), "odesolve.RecursiveCheckpointAdjoint()"),
    ("progress_meter", (AbstractProgressMeter,), "odesolve.NoProgressMeter()"),
)


def check_kinds(**values) -> None:
    """Each of `_KINDS`' arguments is an instance of an odesolve class: a class passed
    without calling it, or another library's object (Diffrax's), fails later with a
    message about a missing `self` or attribute, naming neither the argument nor the fix."""
    for name, kinds, example in _KINDS:
        value = values[name]
        if isinstance(value, kinds):
            continue
        if isinstance(value, type) and issubclass(value, kinds):
            raise TypeError(
                f"{name}={value.__name__} is a class: pass an instance, {value.__name__}(...)."
            )
        origin = type(value).__module__.split(".")[0]
        other = ""
        if origin not in ("builtins", "odesolve"):
            other = f" A {origin} object does not mix with odesolve's: use odesolve's class."
        raise TypeError(
            f"{name}={value!r} (type {origin}.{type(value).__name__}) is not one of "
            f"odesolve's: pass e.g. {example}.{other}"
        )


def _check_tolerance_shapes(controller: AbstractStepSizeController, y0: PyTree) -> None:
    """Array tolerances broadcast against each leaf of y0, as Diffrax applies them; a
    mismatch would otherwise surface as a broadcasting error inside the loop."""
    tolerances = controller.tolerances()
    if tolerances is None:
        return
    for name, tol in zip(("rtol", "atol"), tolerances):
        if np.ndim(tol) == 0:
            continue
        for path, leaf in jtu.tree_flatten_with_path(y0)[0]:
            try:
                np.broadcast_shapes(np.shape(tol), np.shape(leaf))
            except ValueError:
                raise ValueError(
                    f"{controller_name(controller)}({name}=...) has shape {np.shape(tol)}, which "
                    f"does not broadcast against y0{jtu.keystr(path)} of shape "
                    f"{np.shape(leaf)}: pass a scalar, or an array that broadcasts against "
                    "every leaf of y0."
                ) from None


def _check_scalar_times(**times) -> None:
    """t0, t1 and dt0 are real scalars (dt0 may be None)."""
    for name, x in times.items():
        if x is None and name == "dt0":
            continue
        if x is None:
            raise TypeError(f"{name}=None: pass a real number (a Python float or a scalar array).")
        if isinstance(x, (str, bytes)) or not eqx.is_array_like(x) or has_odd_dtype(x):
            raise TypeError(f"{name}={x!r}: pass a real number (a Python float or a scalar array).")
        dtype = jnp.result_type(x)  # no array made: this runs on every eager call
        if not (jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer)):
            raise TypeError(f"{name}={x!r} has dtype {dtype}: pass a real number.")
        if np.shape(x) != ():
            raise ValueError(
                f"{name} has shape {np.shape(x)}: pass a scalar time. To solve from several "
                f"times, jax.vmap over {name}."
            )


def time_arrays(saveat: SaveAt, controller: AbstractStepSizeController) -> list:
    """The arrays of times whose values `check_time_values` reads: `SaveAt(ts=...)` and
    `StepTo(ts)`."""
    arrays = [o.ts for o in saveat.outputs if o.ts is not None]
    return arrays + [controller.ts] if isinstance(controller, StepTo) else arrays


def check_time_values(t0, t1, dt0, y0, saveat, controller, event, max_steps) -> tuple:
    """The checks that read the values of times known at trace time: t0, t1 and dt0,
    `SaveAt(ts=...)` and `StepTo(ts)`. Returns t0, t1 and dt0 as Python floats (None
    where traced) and the time dtype. `y0`: leaves that are arrays or numbers."""
    c0, c1 = _check_times(t0, t1, dt0, controller, event, max_steps)
    cdt = _concrete(dt0) if dt0 is not None else None
    # Never narrower than float32: a float16 state keeps its precision, but times in
    # float16 could not resolve a step of a span much longer than a few thousand steps.
    # Time is real: a complex state's precision counts, not its type.
    time_dtype = _time.time_dtype(t0, t1, dt0, state=y0)
    for output in saveat.outputs:
        _check_save_ts(output.ts, c0, c1, time_dtype)
    _check_resolution(c0, c1, cdt, time_dtype, controller)
    return c0, c1, cdt, time_dtype


def normalise_inputs(
    terms, solver, t0, t1, dt0, y0, args, saveat, controller, max_steps, event=None
) -> Inputs:
    given = terms
    terms = as_one_term(terms, solver.term_structure, y0)
    _check_scalar_times(t0=t0, t1=t1, dt0=dt0)
    if max_steps is not None and (
        isinstance(max_steps, bool) or not isinstance(max_steps, (int, np.integer)) or max_steps < 1
    ):
        raise ValueError(f"max_steps={max_steps!r}: pass a positive int (or None).")
    y0 = _normalise_y0(y0)
    _check_tolerance_shapes(controller, y0)
    # Read before converting: under `jit` a converted Python number is a tracer.
    c0, c1, cdt, time_dtype = check_time_values(
        t0, t1, dt0, y0, saveat, controller, event, max_steps
    )
    times = [x for x in (t0, t1, dt0) if x is not None]
    # As Diffrax: a state narrower than time arrays (float64 ones) is promoted to them.
    # Python-number times are weakly typed and leave each leaf's precision as it is.
    floating = lambda x: jnp.issubdtype(jnp.result_type(x), jnp.floating)
    arrays = [x for x in times if not isinstance(x, (bool, int, float)) and floating(x)]
    if arrays:
        widest = widest_float(*arrays)
        y0 = jtu.tree_map(lambda y: y.astype(_promoted(y.dtype, widest)), y0)
    as_time = lambda x: None if x is None else _time.as_time(x, time_dtype)
    t0, t1, dt0 = as_time(t0), as_time(t1), as_time(dt0)
    terms = _field_of(given, terms, solver, t0, dt0, y0, args)
    event = _traced_event(
        event, terms, solver, t0, t1, dt0, y0, args, saveat, controller, max_steps
    )
    direction = None if c0 is None or c1 is None else (1 if c1 > c0 else -1)
    num_steps = controller.num_steps(c0, c1, cdt, time_dtype)
    _check_rows_per_step(saveat, max_steps if num_steps is None else num_steps)
    return Inputs(terms, event, t0, t1, dt0, y0, direction, num_steps)


# Most steps a solve counts: step counters are int32, so a larger max_steps (never
# reached: a billion steps) is taken as this many; an output of a row per step refuses it.
MOST_STEPS = 2**30


def _check_rows_per_step(saveat: SaveAt, steps: Any) -> None:
    """`SaveAt(steps=...)` and `dense=True` keep a row for every step the solve may take:
    a bound of more steps than rows can be held is refused, not capped silently."""
    every = [o.every for o in saveat.outputs if o.every]
    if steps is None or steps <= MOST_STEPS or not (every or saveat.dense):
        return
    shown = "True" if every and every[0] == 1 else every[0] if every else None
    what = "SaveAt(dense=True)" if saveat.dense else f"SaveAt(steps={shown})"
    raise ValueError(
        f"{what} keeps a row for each step the solve may take, and max_steps={steps} asks "
        f"for more than {MOST_STEPS} of them: pass a max_steps the solve can reach "
        "(e.g. 100_000), or save at SaveAt(ts=...) instead."
    )
