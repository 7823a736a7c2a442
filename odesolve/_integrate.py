"""`diffeqsolve`: the entry point, and the wiring of one solve.

A solve is a loop (`_step`) handed to an adjoint (`adjoints`), which runs and
differentiates it; saving (`_saving`) and events (`_event`) each keep their part of the
loop's carry and turn it into output afterwards.
"""

import dataclasses
import functools
import warnings
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jaxtyping import Array, Float

from adjoints import AbstractAdjoint, Loop, RecursiveCheckpointAdjoint, batch_size

from . import _event, _interpolation, _saving, _steady_state_derivative, _step
from ._adjoint_outputs import check_outputs
from ._checks import check_flag
from ._config import Config, Params, check_adaptive, static_times
from ._continuous import continuous_problem
from ._controller._base import AbstractStepSizeController
from ._controller._user import loop_controller, written_in_diffrax_interface
from ._controller.constant import ConstantStepSize
from ._discrete_event import AbstractDiscreteTerminatingEvent, as_event
from ._eager import cached_call, check_once
from ._event import Event, FlatConditions
from ._field import FlatField
from ._flat import PyTree, RealScalarLike, flat_spec, state_dtype
from ._hints import forward_mode_named
from ._progress_meter import AbstractProgressMeter, NoProgressMeter
from ._results import COMPLEX_STATE, RESULTS, ComplexStateWarning, Result, UnsupportedCombination
from ._resume import Resume, resume_from, resumed
from ._reversal import reversal
from ._runtime_checks import final_result, input_checks, raise_if_failed
from ._saveat import SaveAt, SubSaveAt, save_y
from ._solution import Solution
from ._solver._base import AbstractSolver
from ._solver._user import OwnTerms, loop_solver
from ._term import ODETerm
from ._validate import (
    MOST_STEPS,
    Inputs,
    check_kinds,
    check_time_values,
    normalise_inputs,
    time_arrays,
)


def diffeqsolve(
    terms: ODETerm,
    solver: AbstractSolver,
    t0: RealScalarLike,
    t1: RealScalarLike,
    dt0: RealScalarLike | None,
    y0: PyTree,
    args: PyTree = None,
    *,
    saveat: SaveAt = SaveAt(t1=True),
    stepsize_controller: AbstractStepSizeController = ConstantStepSize(),
    adjoint: AbstractAdjoint = RecursiveCheckpointAdjoint(),
    event: Event | None = None,
    max_steps: int | None = 4096,
    throw: bool = True,
    progress_meter: AbstractProgressMeter = NoProgressMeter(),
    solver_state: PyTree = None,
    controller_state: PyTree = None,
    made_jump: Any = None,
    discrete_terminating_event: AbstractDiscreteTerminatingEvent | None = None,
) -> Solution:
    """Solve dy/dt = f(t, y, args) from t0 to t1 (Diffrax's signature, ODE subset).

    - `terms`: `ODETerm(f)`. `solver`: e.g. `Tsit5()`. `y0`: PyTree of float arrays
      (integers are promoted). `dt0`: first step size (None lets `PIDController` pick).
    - `t0`, `t1`: scalar start and end times (Python numbers or scalar arrays, traced
      or not). `t1 < t0` integrates backwards in time; `t1` may be inf only when an
      `event` ends the solve.
    - `args`: any PyTree passed unchanged as `f(t, y, args)`'s third argument; gradients
      flow to its arrays.
    - `saveat`: what to return (`SaveAt`). `stepsize_controller`: `ConstantStepSize()`,
      `StepTo(ts)` or `PIDController(rtol, atol)`.
    - `adjoint`: how gradients are computed (`RecursiveCheckpointAdjoint()` by default).
    - `event`: an `Event` that stops the solve when one of its conditions fires, or
      None. Not with `BacksolveAdjoint`.
    - `max_steps`: bound on the number of steps (accepted and rejected).
    - `throw`: raise on failure (`SolveError`; inside `jit`, JAX's `JaxRuntimeError`
      carrying its message); with False, check `sol.result`.
    - `progress_meter`: reports progress from t0 to t1 while solving:
      `NoProgressMeter()` (the default), `TextProgressMeter()` or `TqdmProgressMeter()`.
    - `discrete_terminating_event`: Diffrax's deprecated form of a boolean `event`
      (`DiscreteTerminatingEvent`); it warns, and is run as that `Event`.
    - `solver_state`, `controller_state`, `made_jump`: resume a solve where another
      ended, from what it saved with `SaveAt(solver_state=True, controller_state=True,
      made_jump=True)` (see `_resume`); None starts afresh.
    """
    check_kinds(
        solver=solver,
        saveat=saveat,
        stepsize_controller=stepsize_controller,
        adjoint=adjoint,
        progress_meter=progress_meter,
    )
    check_flag("throw", throw)
    if isinstance(max_steps, np.integer):  # a NumPy count sizes buffers as an int does
        max_steps = int(max_steps)
    if any(eqx.is_array_like(x) and jnp.iscomplexobj(x) for x in jtu.tree_leaves(y0)):
        warnings.warn(COMPLEX_STATE, ComplexStateWarning, stacklevel=2)
    call = dict(
        terms=terms,
        solver=solver,
        t0=t0,
        t1=t1,
        dt0=dt0,
        y0=y0,
        args=args,
        saveat=saveat,
        stepsize_controller=stepsize_controller,
        adjoint=adjoint,
        event=event,
        max_steps=max_steps,
        throw=throw,
        progress_meter=progress_meter,
        solver_state=solver_state,
        controller_state=controller_state,
        made_jump=made_jump,
        discrete_terminating_event=discrete_terminating_event,
    )
    sol = None
    if _numbers_for_times(t0, t1, dt0, y0):
        # Numbers are part of the key, checked when its program is traced; arrays of
        # times are inputs, checked on every call.
        arrays = time_arrays(saveat, stepsize_controller)
        if arrays:
            check = lambda: check_time_values(
                t0, t1, dt0, y0, saveat, stepsize_controller, event, max_steps
            )
            dtypes = tuple(getattr(x, "dtype", type(x)) for x in jtu.tree_leaves(y0))
            check_once(check, arrays, (t0, t1, dt0, dtypes, event is None, max_steps))
        sol = cached_call(_diffeqsolve, call)
    if sol is None:  # inside a transformation, or times given as arrays
        sol = _diffeqsolve(**call)
    if max_steps is not None and max_steps > MOST_STEPS:
        sol = eqx.tree_at(lambda s: s.stats["max_steps"], sol, max_steps)
    # A wrong input raises whatever `throw` is, as in Diffrax (checked here when it was
    # traced; a concrete one was refused before solving).
    return raise_if_failed(sol, bad_inputs_only=not throw)


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _numbers_for_times(t0: Any, t1: Any, dt0: Any, y0: PyTree) -> bool:
    """Whether a call may take the cached eager dispatch (`_eager`): t0, t1 and dt0 are
    Python numbers (or dt0 None), so their values are part of its key, and y0's leaves
    are arrays or numbers (other leaves get their error from `normalise_inputs`)."""
    if not (_is_number(t0) and _is_number(t1) and (dt0 is None or _is_number(dt0))):
        return False
    leaves = jtu.tree_leaves(y0)
    return bool(leaves) and all(
        eqx.is_array_like(x) and not isinstance(x, bool | np.bool_) for x in leaves
    )


def _diffeqsolve(
    terms: ODETerm,
    solver: AbstractSolver,
    t0: RealScalarLike,
    t1: RealScalarLike,
    dt0: RealScalarLike | None,
    y0: PyTree,
    args: PyTree,
    *,
    saveat: SaveAt,
    stepsize_controller: AbstractStepSizeController,
    adjoint: AbstractAdjoint,
    event: Event | None,
    max_steps: int | None,
    throw: bool,
    progress_meter: AbstractProgressMeter,
    solver_state: PyTree,
    controller_state: PyTree,
    made_jump: Any,
    discrete_terminating_event: AbstractDiscreteTerminatingEvent | None,
) -> Solution:
    """`diffeqsolve` after its cheap checks, up to the solution (not yet raised on)."""
    solver.prepare(y0)
    # A solver written in Diffrax's interface (`init`/`step`) runs through an adapter.
    solver = loop_solver(solver)
    # So does a controller written in Diffrax's (`init`/`adapt_step_size`): it is given
    # the solver's error estimate whenever the solver has one, as Diffrax's loop does.
    stepsize_controller = loop_controller(stepsize_controller, solver.adaptive)
    check_outputs(adjoint, saveat)
    if discrete_terminating_event is not None:
        event = as_event(discrete_terminating_event, event)
    if event is not None and not isinstance(event, Event):
        raise TypeError(f"event={event!r}: pass odesolve.Event(cond_fn) or None.")
    if event is None and adjoint.differentiates_steady_state():
        raise ValueError(
            f"adjoint={type(adjoint).__name__}() differentiates a steady state, and this "
            "solve has no event to end at one: its gradient would be that of a state that "
            "no longer moves. Pass event=Event(steady_state_event()) (t1 may be inf), or "
            "use RecursiveCheckpointAdjoint() (the default) for a solve to a fixed t1."
        )
    if event is not None and adjoint.needs_problem():
        raise UnsupportedCombination(
            f"event=... cannot be combined with adjoint={type(adjoint).__name__}(): the "
            "continuous adjoint does not differentiate the event time. Use "
            "RecursiveCheckpointAdjoint() (the default) or DirectAdjoint()."
        )
    if not jtu.tree_leaves(y0):
        _call_with_no_state(terms, t0, y0, args)
        terms, y0, event, saveat = _nothing_to_solve_for(y0, event, saveat)
    inputs = normalise_inputs(
        terms, solver, t0, t1, dt0, y0, args, saveat, stepsize_controller, max_steps, event
    )
    field = inputs.terms.vector_field
    if isinstance(field, OwnTerms) and adjoint.needs_problem():
        raise UnsupportedCombination(
            f"adjoint={type(adjoint).__name__}() solves an adjoint equation built from the "
            f"vector field, and {type(field.solver).__name__} steps with terms of its own "
            "rather than one: use RecursiveCheckpointAdjoint() (the default) or "
            "DirectAdjoint()."
        )
    given = _Given(inputs, solver, args, resume_from(solver_state, controller_state, made_jump))
    how = _How(
        saveat=saveat,
        controller=stepsize_controller,
        adjoint=adjoint,
        meter=progress_meter,
        # Step counters are int32: a larger bound (never reached: a billion steps) is
        # that many, rather than a count that wraps.
        max_steps=None if max_steps is None else min(max_steps, MOST_STEPS),
        throw=throw,
    )
    known = _Known(
        # An event may stop the solve early: the step count is not known in advance.
        num_steps=inputs.num_steps if event is None else None,
        static_times=static_times(t0, t1, dt0, saveat, stepsize_controller, event),
        number_times=all(_is_number(x) for x in (t0, t1, dt0) if x is not None),
        # Any input batched by a `vmap` makes the loop run batched: a per-sample control
        # inside the term (a neural CDE's data), a value the field closed over, save
        # times, the controller's times, the solver's arrays.
        batch=batch_size(given, saveat, stepsize_controller),
    )
    with forward_mode_named(adjoint):
        sol = _solve(given, how, known)
    if adjoint.differentiates_steady_state() and jtu.tree_leaves(y0):
        sol = _steady_state_derivative.with_steady_state_derivative(sol, terms, args, adjoint)
    return sol


def _call_with_no_state(terms: Any, t0: Any, y0: PyTree, args: PyTree) -> None:
    """A y0 with no arrays is a state of nothing to solve for, and as in Diffrax the
    field is called with it once: a field that computes with its state then fails here,
    where a forgotten y0 (None) is named, rather than returning a solution of nothing.
    Traced abstractly: nothing is computed."""
    field = getattr(terms, "vector_field", None)
    if not callable(field):
        return
    try:
        jax.eval_shape(lambda: field(t0, y0, args))
    except Exception as error:
        raise TypeError(
            f"y0={y0!r} holds no arrays, and the vector field f(t0, y0, args) failed on "
            f"it: {type(error).__name__}: {error}. Pass the initial state as y0 (an array, "
            "or a PyTree of arrays)."
        ) from None


def _nothing_to_solve_for(empty: PyTree, event: Event | None, saveat: SaveAt):
    """y0 has no arrays (None, {}): as Diffrax, run the clock and return y0's structure
    as the states. The field is not called again; events and `SaveAt(fn=...)` see y0.
    Returns (terms, y0, event, saveat) for a stand-in state of no elements."""

    def with_empty_state(fn: Callable):
        return lambda t, y, args, **kwargs: fn(t, empty, args, **kwargs)

    if event is not None:
        event = event.with_conditions([with_empty_state(c) for c in event.conditions])

    def saving_nothing(sub: SubSaveAt) -> Any:
        if sub.fn is save_y:
            fn = _save_nothing if empty is None else (lambda t, y, args: empty)
        else:
            fn = with_empty_state(sub.fn)
        return eqx.tree_at(lambda s: s.fn, sub, fn)

    if saveat.subs is not None:
        subs = jtu.tree_map(saving_nothing, saveat.subs, is_leaf=lambda x: isinstance(x, SubSaveAt))
        saveat = eqx.tree_at(lambda s: s.subs, saveat, subs)
    return ODETerm(_no_change), jnp.zeros(0), event, saveat


def _no_change(t: RealScalarLike, y: PyTree, args: PyTree):
    return jnp.zeros_like(y)


def _save_nothing(t: RealScalarLike, y: PyTree, args: PyTree):
    return None


class _Given(eqx.Module):
    """What one solve is given: the checked inputs (`Inputs`: terms, event, times, y0,
    direction), the solver, `args`, and the state it resumes from (or None)."""

    inputs: Inputs
    solver: AbstractSolver
    args: PyTree
    resume: Resume | None


class _How(eqx.Module):
    """How it is solved and what it returns: the strategies the caller chose."""

    saveat: SaveAt
    controller: AbstractStepSizeController
    adjoint: AbstractAdjoint
    meter: AbstractProgressMeter
    max_steps: int | None
    throw: bool


class _Known(eqx.Module):
    """What is known when the solve is traced: its exact number of steps (or None),
    whether its times are concrete, whether they were Python numbers (see
    `FirstStepInput`), how many samples a `vmap` runs together."""

    num_steps: int | None
    static_times: bool
    number_times: bool
    batch: int


@eqx.filter_jit
def _solve(given: _Given, how: _How, known: _Known) -> Solution:
    inputs, solver, args, resume = given.inputs, given.solver, given.args, given.resume
    terms, event, direction = inputs.terms, inputs.event, inputs.direction
    t0, t1, dt0, y0 = inputs.t0, inputs.t1, inputs.dt0, inputs.y0
    saveat, controller, adjoint, meter = how.saveat, how.controller, how.adjoint, how.meter
    max_steps, throw = how.max_steps, how.throw
    num_steps, static_times, batch = known.num_steps, known.static_times, known.batch
    time_dtype = jnp.result_type(t0)
    if direction is None:  # only known at run time
        direction = jnp.where(t1 >= t0, 1, -1).astype(time_dtype)
    # The solver works in at least float32 (a float16 state's error norm and stages would
    # lose most of their digits); the field still sees each leaf in its own dtype.
    spec = flat_spec(y0, state_dtype(jtu.tree_leaves(y0)))
    meter_key, meter_last = meter.init(time_dtype) if meter.active else (0, None)
    check_adaptive(solver, controller)
    config = Config(
        solver=solver,
        spec=spec,
        saving=_saving.layout(saveat, t0, y0, args, max_steps, batch > 1),
        max_steps=max_steps,
        meter=meter,
        meter_key=meter_key,
        needs_error=controller.needs_error,
        jumps=controller.has_jumps,
        event=None if event is None else event.record,
        static_times=static_times,
        number_times=known.number_times,
        batched=batch > 1,
    )
    conditions = None
    if event is not None:
        conditions = FlatConditions(event.conditions, spec, direction)
    params = Params(
        vf=FlatField(terms, spec, direction),
        args=args,
        controller=controller.wrap(jnp.asarray(direction, time_dtype)),
        t_start=direction * t0,
        t_end=direction * t1,
        save_ts=_saving.save_times(saveat, direction, time_dtype, direction * t0, direction * t1),
        direction=direction,
        dt0=None if dt0 is None else direction * dt0,
        conditions=conditions,
    )
    y0_flat = spec.ravel(y0)
    init = _step.initial_state(config, params, y0_flat, input_checks(config, params), meter_last)
    init = resumed(init, resume, config.needs_error, adjoint.differentiates_ticks())
    make_loop = functools.partial(
        _loop,
        max_emits=_saving.max_emits(config.saving, params.save_ts, num_steps),
        num_steps=num_steps,
        batch=batch,
        reverses=adjoint.needs_reversal(),
    )
    # Times that nothing differentiated places (static ones, or traced ones not
    # differentiated: `fixed_times`) are constants to reverse mode. A controller written
    # in Diffrax's interface may differentiate its step sizes: they follow the state.
    fixed = None
    if config.static_times:
        loop = make_loop(config, constant=_step.time_leaves)
    else:
        if config.event is None and not written_in_diffrax_interface(controller):
            static = dataclasses.replace(config, static_times=True)
            fixed = make_loop(static, constant=_step.time_leaves)
        loop = make_loop(config, fixed_times=fixed)
    buffers = _saving.buffers(
        config.saving, params.save_ts, spec, _interpolation.row_width(config.table), time_dtype
    )
    problem = None
    if adjoint.needs_problem():
        problem = continuous_problem(adjoint, solver, max_steps, throw, diffeqsolve)
    final, buffers = adjoint.run_loop(loop, params, init, buffers, problem)
    return _finish(config, params, saveat, y0_flat, final, buffers, t0, t1)


def _loop(
    config: Config,
    *,
    max_emits: int,
    num_steps: int | None,
    batch: int,
    reverses: bool,
    fixed_times: Loop | None = None,
    constant: Callable[[PyTree], PyTree] | None = None,
) -> Loop:
    """The solve as a loop for an adjoint; `fixed_times`: the same loop with no
    derivative through the step and save times; `constant`: which carry leaves carry
    none (see `Loop`)."""
    return Loop(
        cond=lambda p, s: _step.keep_going(config, p, s),
        body=lambda p, s: _step.step(config, p, s),
        pending=_step.pending,
        emit=lambda p, s: _step.emit(config, p, s),
        max_steps=config.max_steps,
        max_emits=max_emits,
        num_steps=num_steps,
        batch_size=batch,
        decision=_step.Decision.taken if config.needs_error else None,
        obey=_step.obey,
        replay=_step.replay,
        reversal=reversal(config) if reverses else None,
        fixed_times=fixed_times,
        times_of=_times_of if fixed_times is not None else None,
        constant=constant,
        # Every output row is written once: a save time's, a step's and a dense row's
        # index only advances past a row it keeps; other writes go to the scratch row,
        # which `_finish` drops.
        writes_once=True,
        step_ignores=_step.step_ignores,
    )


def _times_of(params: Params, state: _step.State) -> tuple:
    """What places the step and save times: the solve's ends, first step size, save
    times and controller, and where the loop starts (its first step's end). As for
    `static_times`, step sizes the controller picks carry no derivative."""
    return (
        params.t_start,
        params.t_end,
        params.dt0,
        params.save_ts,
        params.controller,
        params.direction,
        state.t,
        state.t_next,
        state.controller_state,
    )


def _finish(
    config: Config,
    params: Params,
    saveat: SaveAt,
    y0: PyTree,
    final: _step.State,
    buffers: tuple,
    t0: Float[Array, ""],
    t1: Float[Array, ""],
) -> Solution:
    t_end, y_end, event_mask = final.t, final.y, None
    if config.event is not None:
        assert params.conditions is not None and final.event is not None  # made with it
        happened = final.result == RESULTS.event_occurred.value
        last = _event.LastStep(final.row, config.table, final.t, final.y)
        t_end, y_end, event_mask = _event.locate(
            config.event, params.conditions, final.event, happened, last, params.args
        )
        t1 = params.direction * t_end
    end = _saving.Finish(
        t_start=params.t_start,
        y0=y0,
        t=t_end,
        y=y_end,
        accepted=final.num_accepted,
        cut=None if config.event is None else t_end,
        direction=params.direction,
        args=params.args,
        spec=config.spec,
    )
    ts, ys, dense = _saving.outputs(
        config.saving, params.save_ts, final.saving, end, buffers, config.table
    )
    if config.meter.active:
        config.meter.close(config.meter_key, t_end)
    # Counted in int32 in the loop; given in JAX's default integer, as Diffrax gives them
    # (int64 under x64), so that they mix with other integers in `lax.cond` branches.
    count = lambda n: n.astype(jnp.asarray(0).dtype)
    stats = {
        "num_steps": count(final.num_steps),
        "num_accepted_steps": count(final.num_accepted),
        "num_rejected_steps": count(final.num_steps - final.num_accepted),
        "max_steps": config.max_steps,
    }
    return Solution(
        t0=t0,
        t1=t1,
        ts=saveat.arrange(ts),
        ys=saveat.arrange(ys),
        stats=stats,
        result=Result(final_result(config, params, final.result, t_end, y_end)),
        interpolation=dense,
        solver_state=final.solver_state if saveat.solver_state else None,
        controller_state=final.controller_state if saveat.controller_state else None,
        # No jump times: no step can end on one (a Python False, as Diffrax's).
        made_jump=(False if final.made_jump is None else final.made_jump)
        if saveat.made_jump
        else None,
        event_mask=event_mask,
    )
