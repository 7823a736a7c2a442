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

The event time is differentiable. Its value comes from the bracketed search (no
derivative: bisection-like updates are piecewise constant), and its derivative from the
implicit function theorem, d t*/d theta = -(d g/d theta) / (d g/d t) at the root, added as
a zero-valued correction (see `_with_root_derivative`).
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jaxtyping import Array, Bool, Float

from ._flat import FlatSpec


def _is_condition(x: Any) -> bool:
    return callable(x)


class Event(eqx.Module):
    """Stop the solve when a condition fires (Diffrax's `Event`).

    - `cond_fn`: a function `cond(t, y, args, **kwargs)` returning a scalar bool or real,
      or a PyTree of them. The keyword arguments are `terms`, `solver`, `t0`, `t1`, `dt0`,
      `saveat`, `stepsize_controller` and `max_steps` (accept `**kwargs`).
    - `root_finder`: None locates real crossings to about machine precision; an object
      with `rtol` and `atol` attributes (e.g. `optimistix.Newton(rtol, atol)`) sets the
      tolerance on the event time instead (our bracketed search is used either way).
    - `direction`: per condition, None (either crossing), True (upward only: from <= 0 to
      > 0) or False (downward only). Ignored for boolean conditions.
    """

    cond_fn: Any
    root_finder: Any = None
    direction: Any = None

    def __init__(self, cond_fn, root_finder=None, direction=None):
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
        if got != structure or any(d not in (None, True, False) for d in flat_direction):
            raise ValueError(
                f"Event(direction={direction!r}) must be None, True, False or a PyTree of "
                f"those with cond_fn's structure {structure}."
            )
        self.cond_fn = cond_fn
        self.root_finder = root_finder
        self.direction = direction

    @property
    def conditions(self) -> tuple:
        return tuple(jtu.tree_leaves(self.cond_fn, is_leaf=_is_condition))

    def with_conditions(self, conditions) -> "Event":
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
    """A condition closure-converted with its keyword arguments already bound (they are
    fixed for a solve); later keyword arguments are ignored."""

    converted: Callable

    def __call__(self, t, y, args, **kwargs):
        return self.converted(t, y, args)


def condition_kwargs(terms, solver, t0, t1, dt0, saveat, controller, max_steps) -> dict:
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
    """The conditions on the flat state in tau-time: a tuple of scalars, one per leaf."""

    conditions: tuple
    spec: FlatSpec = eqx.field(static=True)
    direction: Any
    kwargs: dict

    def __call__(self, tau, y, args) -> tuple:
        t, y = self.direction * tau, self.spec.unravel(y)
        return tuple(jnp.asarray(c(t, y, args, **self.kwargs)) for c in self.conditions)


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


# ---------------------------------------------------------------- locating a crossing


def _tolerance(tolerance, a, b):
    """Bracket width at which the search stops."""
    eps = jnp.finfo(jnp.result_type(a)).eps
    scale = jnp.maximum(jnp.abs(a), jnp.abs(b))
    tol = 4 * eps * jnp.maximum(scale, b - a)
    if tolerance is not None:
        rtol, atol = tolerance
        tol = jnp.maximum(tol, atol + rtol * scale)
    return tol


def _illinois(g: Callable, a, b, ga, gb, tol, max_iterations: int = 200):
    """A root of g in [a, b], where g(a) and g(b) have different signs.

    The Illinois variant of regula falsi (Dowell & Jarratt, BIT 11 (1971) 168-174): the
    secant through the bracket's ends, with the retained end's value halved when the same
    end is kept twice, which restores superlinear convergence; a midpoint step when the
    secant leaves the bracket. Returns the end with the smaller |g|.
    """

    def keep_going(s):
        a, b, ga, gb, _, i = s
        return (b - a > tol) & (ga != 0) & (gb != 0) & (i < max_iterations)

    def narrow(s):
        a, b, ga, gb, side, i = s
        c = (a * gb - b * ga) / jnp.where(gb == ga, 1, gb - ga)
        c = jnp.where((c > a) & (c < b) & (gb != ga), c, (a + b) / 2)
        gc = g(c)
        right = jnp.sign(gc) == jnp.sign(gb)  # the root is in [a, c]
        new_a, new_ga = jnp.where(right, a, c), jnp.where(right, ga, gc)
        new_b, new_gb = jnp.where(right, c, b), jnp.where(right, gc, gb)
        # Illinois: the end kept twice in a row has its value halved.
        new_ga = jnp.where(right & (side == 1), new_ga / 2, new_ga)
        new_gb = jnp.where(~right & (side == -1), new_gb / 2, new_gb)
        side = jnp.where(right, 1, -1).astype(jnp.int32)
        return new_a, new_b, new_ga, new_gb, side, i + 1

    init = (a, b, ga, gb, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))
    a, b, ga, gb, _, _ = jax.lax.while_loop(keep_going, narrow, init)
    # Halving distorts the kept end's value, so compare true values before choosing.
    return jnp.where(jnp.abs(g(a)) <= jnp.abs(g(b)), a, b)


def _with_root_derivative(g: Callable, data, root):
    """`root` (a constant) with the implicit-function derivative of g's zero attached.

    The correction -g(root)/g'(root) has (nearly) zero value and, with g' held constant,
    derivative -(dg/dtheta)/g', which is the derivative of the root with respect to
    everything g depends on (`data`)."""
    value, slope = jax.jvp(lambda t: g(t, data), (root,), (jnp.ones_like(root),))
    slope = jax.lax.stop_gradient(slope)
    step = -value / jnp.where(slope == 0, 1, slope)
    step = jnp.where((slope == 0) | ~jnp.isfinite(step), 0, step)
    return root + (step - jax.lax.stop_gradient(step))


def crossing_time(g: Callable, data: Any, t_start, t_end, tolerance) -> Float[Array, ""]:
    """Where t -> g(t, data) crosses zero in [t_start, t_end], given that its signs at the
    two ends differ (or one is zero). `data`: the arrays g depends on (the step's
    interpolant, `args`); the search sees them as constants, so no derivative enters the
    search loop (JAX cannot reverse-differentiate a while loop)."""
    freeze = lambda x: jax.lax.stop_gradient(x) if eqx.is_array(x) else x
    a, b, frozen_data = jtu.tree_map(freeze, (t_start, t_end, data))
    frozen = lambda t: g(t, frozen_data)
    root = _illinois(frozen, a, b, frozen(a), frozen(b), _tolerance(tolerance, a, b))
    return _with_root_derivative(g, data, root)
