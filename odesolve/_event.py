"""Terminating events: stop the solve when a condition fires.

An `Event` holds a PyTree of conditions `cond(t, y, args, **kwargs)`. After every accepted
step each condition is evaluated at the step's end, and the solve stops after the first
step on which one fires:

- a boolean condition fires when it is True; the event time is that step's end;
- a real condition fires when its sign changed over the step (either way, or only up or
  only down, see `direction`); the event time is where it crosses zero, found on the
  step's interpolant by a bracketed root finder to about machine precision.

When several conditions fire on the same step, the earliest crossing wins (not the first
in PyTree order), and `sol.event_mask` says which. Root finding runs once, after the loop,
on the last step's interpolant; the loop itself only carries the conditions' last values.

The event time is differentiable (see `_root`).
"""

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jaxtyping import Array, Bool, Float

from . import _interpolation
from ._closure import TracedFunction
from ._controller._base import AbstractStepSizeController
from ._flat import FlatSpec, PyTree, RealScalarLike
from ._root import crossing_time
from ._saveat import SaveAt
from ._solver._base import AbstractSolver
from ._term import ODETerm


def _is_condition(x: object) -> bool:
    return callable(x)


def _has_tolerances(root_finder: object) -> bool:
    """Whether `root_finder` has real `rtol` and `atol`, which locate the event time."""
    try:
        return all(math.isfinite(float(getattr(root_finder, n))) for n in ("rtol", "atol"))
    except (AttributeError, TypeError, ValueError):
        return False


class Event(eqx.Module):
    """Stop the solve when a condition fires (Diffrax's `Event`).

    - `cond_fn`: a function `cond(t, y, args, **kwargs)` returning a scalar bool or real,
      or a PyTree of them. The keyword arguments are `terms`, `solver`, `t0`, `t1`, `dt0`,
      `saveat`, `stepsize_controller` and `max_steps` (accept `**kwargs`).
    - `root_finder`: None locates real crossings to about machine precision; an object
      with `rtol` and `atol` attributes (e.g. `optimistix.Newton(rtol, atol)`) sets the
      tolerance on the event time instead (our bracketed search is used either way).
    - `direction`: per condition, None (either crossing), True (upward only, from
      `<= 0` to `> 0`) or False (downward only). Ignored for boolean conditions.
    """

    cond_fn: Any
    root_finder: Any = None
    direction: Any = None

    def __init__(
        self, cond_fn: PyTree, root_finder: object = None, direction: bool | None | PyTree = None
    ):
        leaves, structure = jtu.tree_flatten(cond_fn, is_leaf=_is_condition)
        if not leaves or not all(callable(c) for c in leaves):
            raise TypeError(
                f"Event(cond_fn={cond_fn!r}): pass a function cond(t, y, args, **kwargs) "
                "or a PyTree of such functions."
            )
        if direction in (None, True, False):
            direction = jtu.tree_unflatten(structure, [direction] * len(leaves))
        got = jtu.tree_structure(direction, is_leaf=lambda x: x is None)
        flat_direction = jtu.tree_leaves(direction, is_leaf=lambda x: x is None)
        # (jaxlib's stub for PyTreeDef declares no __eq__.)
        bad = any(d not in (None, True, False) for d in flat_direction)
        if got != structure or bad:  # type: ignore[operator]
            raise ValueError(
                f"Event(direction={direction!r}) must be None, True, False or a PyTree of "
                f"those with cond_fn's structure {structure}."
            )
        if root_finder is not None and not _has_tolerances(root_finder):
            raise TypeError(
                f"Event(root_finder={root_finder!r}): pass a root finder with rtol and atol, "
                "e.g. optimistix.Newton(rtol=1e-8, atol=1e-8), or None (locate the event "
                "to about machine precision)."
            )
        self.cond_fn = cond_fn
        self.root_finder = root_finder
        self.direction = direction

    @property
    def conditions(self) -> tuple:
        return tuple(jtu.tree_leaves(self.cond_fn, is_leaf=_is_condition))

    def with_conditions(self, conditions: Sequence[Callable]) -> "Event":
        structure = jtu.tree_structure(self.cond_fn, is_leaf=_is_condition)
        return Event(jtu.tree_unflatten(structure, conditions), self.root_finder, self.direction)

    @property
    def record(self) -> "EventRecord":
        tolerance = None
        if self.root_finder is not None:
            tolerance = (float(self.root_finder.rtol), float(self.root_finder.atol))
        return EventRecord(
            directions=tuple(jtu.tree_leaves(self.direction, is_leaf=lambda x: x is None)),
            structure=jtu.tree_structure(self.cond_fn, is_leaf=_is_condition),
            tolerance=tolerance,
        )


class EventRecord(NamedTuple):
    """What the loop needs to know about an event at trace time (hashable)."""

    directions: tuple  # None / True / False per condition
    structure: Any  # treedef of cond_fn, for `sol.event_mask`
    tolerance: tuple | None  # (rtol, atol) on the event time, from `root_finder`


class BoundCondition(eqx.Module):
    """A condition traced once (see `_closure`) with its keyword arguments already bound
    (they are fixed for a solve); later keyword arguments are ignored."""

    converted: TracedFunction

    def __call__(self, t: RealScalarLike, y: PyTree, args: PyTree, **kwargs: object):
        return self.converted(t, y, args)


def condition_kwargs(
    terms: ODETerm,
    solver: AbstractSolver,
    t0: RealScalarLike,
    t1: RealScalarLike,
    dt0: RealScalarLike | None,
    saveat: SaveAt,
    controller: AbstractStepSizeController,
    max_steps: int | None,
) -> dict:
    """The keyword arguments every condition receives (Diffrax's names)."""
    return dict(
        terms=terms,
        solver=solver,
        t0=t0,
        t1=t1,
        dt0=dt0,
        saveat=saveat,
        stepsize_controller=controller,
        max_steps=max_steps,
    )


class FlatConditions(eqx.Module):
    """The conditions on the flat state in tau-time: a tuple of scalars, one per leaf.
    `conditions`: each a `BoundCondition` (traced once, its keyword arguments bound)."""

    conditions: tuple
    spec: FlatSpec = eqx.field(static=True)
    direction: Any

    def __call__(self, tau: Float[Array, ""], y: PyTree, args: PyTree) -> tuple:
        t, y = self.direction * tau, self.spec.unravel(y)
        return tuple(jnp.asarray(c(t, y, args)) for c in self.conditions)

    @property
    def out_struct(self) -> tuple:
        return tuple(c.converted.out_struct for c in self.conditions)


def check_condition_outputs(out_struct: tuple, conditions: tuple) -> None:
    """Trace-time check: every condition returns a scalar bool or real."""
    for i, out in enumerate(out_struct):
        real = jnp.issubdtype(out.dtype, jnp.floating)
        if out.shape != () or not (real or out.dtype == jnp.bool_):
            raise ValueError(
                f"event condition {i} ({conditions[i]!r}) returned an array of shape "
                f"{out.shape} and dtype {out.dtype}; each condition must return a scalar "
                "bool or a scalar float (e.g. y[0] for 'stop when y[0] crosses zero')."
            )


def fired(old: Array, new: Array, upward: bool | None) -> Bool[Array, ""]:
    """Whether a condition fires on a step whose start and end values are `old`, `new`."""
    if new.dtype == jnp.bool_:
        return new
    before, after = jnp.sign(old), jnp.sign(new)
    if upward is None:
        return before != after
    if upward:
        return (before <= 0) & (after > 0)
    return (before > 0) & (after <= 0)


def first_to_fire(times: tuple) -> tuple[Float[Array, ""], tuple]:
    """The earliest firing time, and which conditions fire then (ties all count)."""
    earliest = jnp.min(jnp.stack(times))
    return earliest, tuple((t == earliest) & jnp.isfinite(t) for t in times)


# ---------------------------------------------------------------- in the loop


class EventState(eqx.Module):
    """Each condition's value at the solve's current (t, y), and which of them fired on
    the last step."""

    values: tuple
    mask: tuple


def initial_state(
    conditions: FlatConditions, t0: Float[Array, ""], y0: Float[Array, " n"], args: PyTree
) -> EventState:
    values = conditions(t0, y0, args)
    # A boolean condition already true at t0 stops the solve before its first step.
    mask = tuple(v if v.dtype == jnp.bool_ else jnp.asarray(False) for v in values)
    return EventState(values, mask)


def after_step(
    record: EventRecord,
    conditions: FlatConditions,
    state: EventState,
    accept: Bool[Array, ""],
    t: Float[Array, ""],
    y: Float[Array, " n"],
    args: PyTree,
) -> EventState:
    """The conditions at the end of a step, kept if it was accepted, and which fired."""
    new = conditions(t, y, args)
    values = tuple(jnp.where(accept, n, o) for n, o in zip(new, state.values))
    mask = tuple(accept & fired(o, n, up) for o, n, up in zip(state.values, new, record.directions))
    return EventState(values, mask)


def any_fired(state: EventState) -> Bool[Array, ""]:
    return jnp.any(jnp.stack(state.mask))


def any_nan(state: EventState) -> Bool[Array, ""]:
    """Whether a real condition's value is NaN: its sign is then no sign, and a change of
    it would fire the event where nothing crossed zero."""
    nans = [jnp.isnan(v) for v in state.values if v.dtype != jnp.bool_]
    return jnp.any(jnp.stack(nans)) if nans else jnp.asarray(False)


class LastStep(eqx.Module):
    """The step an event stopped the solve on: its interpolant `row` = (t0, y0, dense
    vectors) with coefficients `table`, ending at (`t`, `y`)."""

    row: Any
    table: tuple = eqx.field(static=True)
    t: Any
    y: Any

    def value(self, t: Float[Array, ""]) -> Float[Array, " n"]:
        return _interpolation.on_step(self.table, self.row, self.t, t)


def locate(
    record: EventRecord,
    conditions: FlatConditions,
    state: EventState,
    happened: Bool[Array, ""],
    last: LastStep,
    args: PyTree,
) -> tuple[Any, Any, Any]:
    """After a solve: the event's time and state, the earliest firing on the last step's
    interpolant (the step's end and state where nothing happened), and the PyTree mask
    of which condition fired."""

    def find() -> tuple:
        times = tuple(
            jnp.where(mask, _firing_time(record, conditions, i, last, args), jnp.inf)
            for i, mask in enumerate(state.mask)
        )
        t_event, mask = first_to_fire(times)
        # Under `vmap` a sample without an event takes part at its own end time: at the
        # inf that `first_to_fire` gives it, the interpolant's derivative is infinite,
        # and reverse mode would multiply it by a zero cotangent (NaN).
        t_event = jnp.where(happened, t_event, last.t)
        # A boolean event ends the step itself (and a sample without one keeps its end
        # state): the end state bit for bit.
        y_event = jnp.where(t_event == last.t, last.y, last.value(t_event))
        return t_event, y_event, tuple(m & happened for m in mask)

    def unchanged() -> tuple:
        return last.t, last.y, tuple(jnp.zeros_like(m) for m in state.mask)

    # Skip the root search unless some solve in the batch has an event to locate.
    t_event, y_event, mask = jax.lax.cond(eqxi.unvmap_any(happened), find, unchanged)
    return t_event, y_event, jtu.tree_unflatten(record.structure, mask)


def _firing_time(
    record: EventRecord, conditions: FlatConditions, i: int, last: LastStep, args: PyTree
) -> Any:
    """When condition i fired on the last step: the step's end for a boolean condition,
    the zero crossing on the step's interpolant for a real one."""
    if conditions.out_struct[i].dtype == jnp.bool_:
        return last.t

    def condition(t: Float[Array, ""], data: tuple) -> Any:
        conditions, args, last = data
        return conditions(t, last.value(t), args)[i]

    data = (conditions, args, last)
    return crossing_time(condition, data, last.row[0], last.t, record.tolerance)
