"""`diffeqsolve`: the entry point and the step loop.

The loop is one `lax.while_loop` (run by the adjoint) whose carry is a small named `State`.
Internally time runs forwards: tau = direction * t, and the vector field is wrapped to
match, so a backwards solve is the same loop. The state is one flat vector (see `_flat`).

Saving never adds a loop. Steps that contain a requested save time write their
interpolation data (a few vectors) into a row buffer; after the loop every save time is
interpolated at once. `SaveAt(steps=...)` and `SaveAt(dense=True)` write rows the same way.
"""

import functools
from collections.abc import Callable
from typing import Any

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from adjoints import (
    AbstractAdjoint,
    Loop,
    RecursiveCheckpointAdjoint,
    Write,
    batch_size,
    closure_convert,
    is_concrete,
    trace_time_value,
)

from ._continuous import check_supported, continuous_problem
from ._controller._base import AbstractStepSizeController
from ._controller.constant import ConstantStepSize
from ._event import (
    Event,
    EventRecord,
    FlatConditions,
    check_condition_outputs,
    condition_kwargs,
    crossing_time,
    fired,
    first_to_fire,
)
from ._flat import FlatSpec, flat_spec, state_dtype
from ._progress_meter import AbstractProgressMeter, NoProgressMeter
from ._results import RESULTS, SolveError, failure_message, is_okay
from ._saveat import SaveAt, save_y
from ._solution import DenseInterpolation, Solution, StepRows
from ._solver._runge_kutta import StepContext
from ._term import ODETerm
from ._validate import check_kinds, normalise_inputs, resolution


class _Config(eqx.Module):
    """Everything about a solve that is fixed at trace time."""

    solver: Any = eqx.field(static=True)
    spec: FlatSpec = eqx.field(static=True)
    saveat_fn: Callable = eqx.field(static=True)
    save_t0: bool = eqx.field(static=True)
    save_t1: bool = eqx.field(static=True)
    save_every: int = eqx.field(static=True)
    save_dense: bool = eqx.field(static=True)
    save_ts: bool = eqx.field(static=True)
    steps_spec: Any = eqx.field(static=True)  # FlatSpec of fn's output, for steps rows
    max_steps: int | None = eqx.field(static=True)
    meter: AbstractProgressMeter = eqx.field(static=True)
    meter_key: int = eqx.field(static=True)
    needs_error: bool = eqx.field(static=True)
    jumps: bool = eqx.field(static=True)
    event: EventRecord | None = eqx.field(static=True)
    # Nothing that sets the step times can be differentiated (see `_static_times`).
    static_times: bool = eqx.field(static=True)

    @property
    def fsal(self) -> bool:
        return self.solver.tableau.fsal

    @property
    def interp_stages(self) -> tuple[int, ...]:
        return self.solver.tableau.interp_stages

    @property
    def records_rows(self) -> bool:
        """Steps record interpolation rows (for SaveAt(ts) or dense output)."""
        return self.save_ts or self.save_dense

    @property
    def carries_row(self) -> bool:
        """The carry holds the last step's interpolant: for output, or to locate an event
        on it after the loop."""
        return self.records_rows or self.event is not None

    @property
    def records(self) -> bool:
        """The loop emits output rows at all."""
        return self.records_rows or bool(self.save_every)

    @property
    def interp(self) -> tuple:
        table = self.solver.tableau.interp
        return tuple(table[i] for i in self.interp_stages)


class _Params(eqx.Module):
    """Inputs of the loop that do not change from step to step (differentiable)."""

    vf: Any  # closure-converted flat vector field, tau-space
    args: Any
    controller: AbstractStepSizeController
    t_start: Any
    t_end: Any
    save_ts: Any  # tau-space save times, or None
    direction: Any
    dt0: Any  # tau-space first step, or None
    conditions: Any  # closure-converted FlatConditions of the event, or None


class State(eqx.Module):
    """The loop carry. `t` is where the next step starts, `t_next` where it should end.

    Output bookkeeping (None when not saving that kind of output):
    - `row`: (t0, y0, stages) of the last step: its interpolant, ending at `t`.
    - `event_values`: each event condition at (t, y); `event_mask`: which fired on the
      last step (None without an event).
    - `ts_index`: how many save times are done; `next_save` the first not done (inf once
      all are). A save time at or before `t` is due.
    - `dense_due`, `steps_due`: the last step still has to be recorded;
      `dense_row`, `steps_row`: rows recorded so far.
    """

    t: Any
    t_next: Any
    y: Any
    k0: Any  # f(t, y) for first-same-as-last methods, else None
    made_jump: Any  # the last accepted step ended on a jump time (None: no jump_ts)
    controller_state: Any
    num_steps: Any
    num_accepted: Any  # rejected steps: num_steps - num_accepted
    result: Any
    row: Any
    ts_index: Any
    next_save: Any
    dense_due: Any
    dense_row: Any
    steps_due: Any
    steps_row: Any
    meter_last: Any  # progress last reported (None: no meter)
    event_values: Any
    event_mask: Any


class _FlatField(eqx.Module):
    """The user's vector field on the flat state, in tau-time: dy/dtau = d * f(d*tau, y)."""

    term: ODETerm
    spec: FlatSpec = eqx.field(static=True)
    direction: Any

    def __call__(self, tau, y, args):
        out = self.term.vf(self.direction * tau, self.spec.unravel(y), args)
        return self.direction * self.spec.ravel(out)


# --------------------------------------------------------------------------- the step


def _start_derivative(config, params, state):
    """f(t, y) at the step's start: carried for FSAL methods (re-evaluated after a jump)."""
    vf, args = params.vf, params.args
    if not config.fsal:
        return vf(state.t, state.y, args)
    if not config.jumps:
        return state.k0
    # After a jump `t` is already just past it: this is the right limit.
    return jax.lax.cond(state.made_jump, lambda: vf(state.t, state.y, args), lambda: state.k0)


class _OneTrace:
    """Holds the checkpointed field once it is made, so that every stage of a step calls
    the same function and JAX traces the field once. Hashed by identity: it is static."""

    def __init__(self):
        self.call = None
        self.static = None  # the non-array leaves `call` was made for

    def made_for(self, static: Any) -> bool:
        if self.static is None:
            return False
        (old, old_def), (new, new_def) = map(jtu.tree_flatten, (self.static, static))
        return old_def == new_def and all(a is b for a, b in zip(old, new))


class _Rematerialised(eqx.Module):
    """The field as a step uses it: reverse mode keeps each stage's input rather than the
    field's intermediate values, and linearises the field again stage by stage when it
    reverses the step (a step's residuals are then a few vectors per stage however large
    the field is; see `adjoints._residuals`). No effect on the forward solve.

    A Module rather than a closure: the field's arrays stay leaves, so a solver that
    passes it through a custom derivative (the implicit stages) sees them as inputs and
    not as constants captured from an enclosing trace."""

    vf: Any
    one_trace: _OneTrace = eqx.field(static=True)

    def __call__(self, t, y, args):
        arrays, static = eqx.partition((self.vf, args), eqx.is_array)
        if not self.one_trace.made_for(static):

            def call(arrays, t, y):
                f, a = eqx.combine(arrays, static)
                return f(t, y, a)

            self.one_trace.call = jax.checkpoint(call, prevent_cse=False)
            self.one_trace.static = static
        return self.one_trace.call(arrays, t, y)


def _times(config, *times):
    """Step times as the step uses them: without a derivative when none can flow."""
    return tuple(jax.lax.stop_gradient(t) for t in times) if config.static_times else times


def _step(config: _Config, params: _Params, state: State) -> State:
    t0, t1 = _times(config, state.t, state.t_next)
    k0 = _start_derivative(config, params, state)
    # Implicit solvers take their Newton tolerances from the controller (see StepContext).
    context = StepContext(params.controller.tolerances(), params.direction, config.spec)
    step = config.solver.step(
        _Rematerialised(params.vf, _OneTrace()),
        t0,
        t1 - t0,
        state.y,
        k0,
        params.args,
        config.needs_error,
        context,
    )
    proposal = params.controller.adapt(
        t0,
        t1,
        state.y,
        step.y1,
        step.y_error,
        state.controller_state,
        config.solver.error_order(),
        config.spec,
    )
    accept = jnp.asarray(proposal.accept)
    jumped = _jumped(params, accept, t1)
    # Across a jump the next step starts just after it (its right limit): t1 is the float
    # below the jump time.
    t_new = jnp.where(accept, t1, t0)
    if jumped is not None:
        # A shift of two ulps: as a time it moves with t1 (nextafter has no derivative).
        fixed = jax.lax.stop_gradient(t1)
        past = jnp.nextafter(jnp.nextafter(fixed, jnp.inf), jnp.inf)
        t_new = jnp.where(jumped, t1 + (past - fixed), t_new)
    next_end = _clipped_to_end(params, t_new, proposal.next_end)
    # Every step rejected until t + dt == t: report it rather than spin to max_steps.
    underflow = (next_end <= t_new) & (t_new < params.t_end)
    result = jnp.where(underflow, RESULTS.step_size_underflow, proposal.result)
    if step.failed is not None and not config.needs_error:
        # Fixed steps cannot reject a step whose Newton iterations failed: say so.
        result = jnp.where(step.failed, RESULTS.nonlinear_divergence, result)
    accepted = accept.astype(jnp.int32)
    num_accepted = state.num_accepted + accepted
    steps_due = None
    if config.save_every:
        steps_due = accept & (num_accepted % config.save_every == 0)
    y_new = jnp.where(accept, step.y1, state.y)
    event_values, event_mask = _check_event(config, params, state, accept, t_new, y_new)
    if event_mask is not None:
        stop = jnp.any(jnp.stack(event_mask)) & (result == RESULTS.successful.value)
        result = jnp.where(stop, RESULTS.event_occurred, result)
    return State(
        t=t_new,
        t_next=next_end,
        y=y_new,
        k0=jnp.where(accept, step.stages[-1], k0) if config.fsal else None,
        made_jump=None if jumped is None else jnp.where(accept, jumped, state.made_jump),
        controller_state=proposal.state,
        num_steps=state.num_steps + 1,
        num_accepted=num_accepted,
        result=jnp.where(state.result == RESULTS.successful.value, result, state.result),
        row=_interp_row(config, t0, state.y, step) if config.carries_row else None,
        ts_index=state.ts_index,
        next_save=state.next_save,
        dense_due=accept if config.save_dense else None,
        dense_row=state.dense_row,
        steps_due=steps_due,
        steps_row=state.steps_row,
        meter_last=_report_progress(config, params, state, t_new),
        event_values=event_values,
        event_mask=event_mask,
    )


def _check_event(config, params, state, accept, t_new, y_new):
    """The conditions at the end of an accepted step, and which of them fired."""
    if config.event is None:
        return None, None
    new = params.conditions(t_new, y_new, params.args)
    values = tuple(jnp.where(accept, n, o) for n, o in zip(new, state.event_values))
    mask = tuple(
        accept & fired(o, n, up)
        for o, n, up in zip(state.event_values, new, config.event.directions)
    )
    return values, mask


def _jumped(params, accept, t1):
    """Whether this accepted step stopped at a jump (None: no jump times)."""
    stops = params.controller.jump_stops() if params.controller.has_jumps else None
    if stops is None:
        return None
    return accept & jnp.any(stops == t1)


def _report_progress(config, params, state, t_new):
    if state.meter_last is None:
        return None
    # Reported, never differentiated (the meter's callback has no derivative).
    progress = jax.lax.stop_gradient((t_new - params.t_start) / (params.t_end - params.t_start))
    return config.meter.step(config.meter_key, progress, state.meter_last, state.num_steps + 1)


def _interp_row(config, t0, y0, step):
    # A tuple, not a stacked (s, n) array: stacking would copy every stage once more on
    # every step, and the row is read only when output is due.
    return (t0, y0, tuple(step.stages[i] for i in config.interp_stages))


def _pending(state: State):
    """Output is due: a save time at or before `t`, or an unrecorded step."""
    due = jnp.asarray(False)
    if state.next_save is not None:
        due = due | (state.t >= state.next_save)
    for flag in (state.dense_due, state.steps_due):
        if flag is not None:
            due = due | flag
    return due


def _interpolate_row(config, row, t1, t):
    """The last step's interpolant (ending at t1) at time t: (n,)."""
    t0, y0, stages = row
    h = t1 - t0
    theta = jnp.where(h == 0, 0, (t - t0) / jnp.where(h == 0, 1, h))
    # Unrolled over the (static) coefficients: one fused elementwise expression, where a
    # `dot` would be a separate, slower library call on XLA:CPU.
    powers = [theta ** (p + 1) for p in range(len(config.interp[0]))]
    acc = 0
    for i, coeffs in enumerate(config.interp):
        weight = sum(c * powers[p] for p, c in enumerate(coeffs) if c != 0)
        acc = acc + weight * stages[i]
    return y0 + h * acc


def _emit(config: _Config, params: _Params, state: State) -> tuple[State, tuple]:
    """Record one piece of due output (see `adjoints.Loop`). A write that is not due goes
    to the buffer's last row, a scratch row that is dropped."""
    if not config.records:
        return state, ()
    writes, updates = [], {}
    if params.save_ts is not None:
        due = state.t >= state.next_save
        n_ts = params.save_ts.shape[0] - 1  # the last entry is an inf sentinel
        t0, t1, t = _times(config, state.row[0], state.t, state.next_save)
        value = _interpolate_row(config, (t0, *state.row[1:]), t1, t)
        writes.append(Write(jnp.where(due, state.ts_index, n_ts), value))
        index = state.ts_index + due.astype(jnp.int32)
        updates.update(ts_index=index, next_save=params.save_ts[index])
    if config.save_every:
        due = state.steps_due
        t_user = params.direction * state.t
        saved = config.saveat_fn(t_user, config.spec.unravel(state.y), params.args)
        scratch = config.max_steps // config.save_every
        row = jnp.where(due, state.steps_row, scratch)
        writes.append(Write(row, (t_user, config.steps_spec.ravel(saved))))
        updates.update(
            steps_row=state.steps_row + due.astype(jnp.int32), steps_due=jnp.zeros_like(due)
        )
    if config.save_dense:
        due = state.dense_due
        t0, y0, stages = state.row
        row = jnp.where(due, state.dense_row, config.max_steps)
        writes.append(Write(row, (t0, state.t, y0, jnp.stack(stages))))
        updates.update(
            dense_row=state.dense_row + due.astype(jnp.int32), dense_due=jnp.zeros_like(due)
        )
    state = eqx.tree_at(
        lambda s: tuple(getattr(s, k) for k in updates), state, tuple(updates.values())
    )
    return state, tuple(writes)


def _keep_going(config: _Config, params: _Params, state: State):
    going = (state.t < params.t_end) & (state.result == RESULTS.successful.value)
    if config.max_steps is not None:
        going = going & (state.num_steps < config.max_steps)
    return going


# ---------------------------------------------------------------------- setting up


def _row_buffers(config, n_rows, time_dtype, n):
    """Dense-output rows: the step's times, and its start state and stages (in the
    state's dtype, which may be complex)."""
    s, dtype = len(config.interp_stages), config.spec.dtype
    return (
        jnp.full((n_rows,), jnp.inf, time_dtype),
        jnp.full((n_rows,), jnp.inf, time_dtype),
        jnp.zeros((n_rows, n), dtype),
        jnp.zeros((n_rows, s, n), dtype),
    )


def _buffers(config, params, time_dtype):
    """Output buffers, each with one scratch row at the end."""
    n, dtype = config.spec.size, config.spec.dtype
    buffers = []
    if params.save_ts is not None:
        buffers.append(jnp.full((params.save_ts.shape[0], n), jnp.inf, dtype))
    if config.save_every:
        rows = config.max_steps // config.save_every + 1
        buffers.append(
            (
                jnp.full((rows,), jnp.inf, time_dtype),
                jnp.full((rows, config.steps_spec.size), jnp.inf, config.steps_spec.dtype),
            )
        )
    if config.save_dense:
        buffers.append(_row_buffers(config, config.max_steps + 1, time_dtype, n))
    return tuple(buffers)


def _empty_row(config, params, y0):
    return (params.t_start, y0, tuple(jnp.zeros_like(y0) for _ in config.interp_stages))


def _clipped_to_end(params, start, end):
    """Where a step from `start` proposed to end at `end` ends: never past t_end, and at
    t_end when it would leave less than 1% of its length to go (no sliver of a last step,
    and no step of a few ulps left by rounding in start + dt)."""
    end = jnp.minimum(end, params.t_end)
    return jnp.where(params.t_end - end <= 0.01 * (end - start), params.t_end, end)


def _initial_state(config, params, y0, dt0, initial_result, meter_last):
    vf, args = params.vf, params.args
    k0 = vf(params.t_start, y0, args)
    t_next, controller_state = params.controller.init(
        vf,
        params.t_start,
        params.t_end,
        y0,
        k0,
        dt0,
        args,
        config.solver.error_order(),
        config.spec,
    )
    t_next = _clipped_to_end(params, params.t_start, t_next)
    result = jnp.where(
        jnp.all(jnp.isfinite(k0)), initial_result, RESULTS.nonfinite_initial_derivative
    )
    zero = jnp.zeros((), jnp.int32)
    has_ts = params.save_ts is not None
    event_values = event_mask = None
    if config.event is not None:
        event_values = params.conditions(params.t_start, y0, args)
        # A boolean condition already true at t0 stops the solve before its first step.
        event_mask = tuple(v if v.dtype == jnp.bool_ else jnp.asarray(False) for v in event_values)
        at_start = jnp.any(jnp.stack(event_mask)) & (result == RESULTS.successful.value)
        result = jnp.where(at_start, RESULTS.event_occurred, result)
    return State(
        t=params.t_start,
        t_next=t_next,
        y=y0,
        k0=k0 if config.fsal else None,
        made_jump=jnp.asarray(False) if config.jumps else None,
        controller_state=controller_state,
        num_steps=zero,
        num_accepted=zero,
        result=jnp.asarray(result, jnp.int32),
        row=_empty_row(config, params, y0) if config.carries_row else None,
        ts_index=zero if has_ts else None,
        next_save=params.save_ts[0] if has_ts else None,
        dense_due=jnp.asarray(False) if config.save_dense else None,
        dense_row=zero if config.save_dense else None,
        steps_due=jnp.asarray(False) if config.save_every else None,
        steps_row=zero if config.save_every else None,
        meter_last=meter_last,
        event_values=event_values,
        event_mask=event_mask,
    )


# ---------------------------------------------------------------------- finishing


def _final_result(config, params, final):
    result = final.result
    unfinished = (result == RESULTS.successful.value) & (final.t < params.t_end)
    result = jnp.where(unfinished, RESULTS.max_steps_reached, result)
    if not config.needs_error:
        # Fixed steps never reject, so a blow-up only shows in the state.
        bad = (result == RESULTS.successful.value) & ~jnp.all(jnp.isfinite(final.y))
        result = jnp.where(bad, RESULTS.nonfinite_state, result)
    return result


def _locate_event(config, params, final):
    """After a solve that an event stopped: move the final time and state to the event,
    the earliest firing on the last step's interpolant, and say which condition fired.
    Returns the new final state and the event mask (None without an event)."""
    if config.event is None:
        return final, None
    happened = final.result == RESULTS.event_occurred.value

    def locate():
        times = tuple(
            jnp.where(mask, _firing_time(config, params, final, i), jnp.inf)
            for i, mask in enumerate(final.event_mask)
        )
        t_event, mask = first_to_fire(times)
        # Under `vmap` a sample without an event takes part at its own end time: at the
        # inf that `first_to_fire` gives it, the interpolant's derivative is infinite,
        # and reverse mode would multiply it by a zero cotangent (NaN).
        t_event = jnp.where(happened, t_event, final.t)
        y_event = _interpolate_row(config, final.row, final.t, t_event)
        # A boolean event ends the step itself (and a sample without one keeps its end
        # state): the end state bit for bit.
        y_event = jnp.where(t_event == final.t, final.y, y_event)
        return t_event, y_event, tuple(m & happened for m in mask)

    def unchanged():
        return final.t, final.y, tuple(jnp.zeros_like(m) for m in final.event_mask)

    # Skip the root search unless some solve in the batch has an event to locate.
    t_event, y_event, mask = jax.lax.cond(eqxi.unvmap_any(happened), locate, unchanged)
    final = eqx.tree_at(lambda s: (s.t, s.y), final, (t_event, y_event))
    return final, jtu.tree_unflatten(config.event.structure, mask)


def _firing_time(config, params, final, i):
    """When condition i fired on the last step: the step's end for a boolean condition,
    the zero crossing on the step's interpolant for a real one."""
    t_end = final.t
    if params.conditions.out_struct[i].dtype == jnp.bool_:
        return t_end

    def condition(t, data):
        conditions, args, row, end = data
        return conditions(t, _interpolate_row(config, row, end, t), args)[i]

    data = (params.conditions, params.args, final.row, t_end)
    return crossing_time(condition, data, final.row[0], t_end, config.event.tolerance)


def _steps_output(config, params, final, rows, cut):
    """Rows saved every `save_every` accepted steps. As in Diffrax, t1 is saved as one more
    row when the last step was not saved, and the output has max_steps // every rows (one
    more if that does not divide max_steps). After an event (`cut`, tau-space), the step
    that crossed it ends later: its row is replaced by the event's."""
    t_rows, y_rows = rows
    count = final.steps_row
    dropped = False
    if cut is not None:
        last = jnp.maximum(count - 1, 0)
        dropped = (count > 0) & (params.direction * t_rows[last] > cut)
        count = count - dropped.astype(jnp.int32)
    if config.save_t1 or cut is not None:
        missing = (final.num_accepted % config.save_every != 0) & config.save_t1
        missing = missing | dropped
        t_final = params.direction * final.t
        saved = config.saveat_fn(t_final, config.spec.unravel(final.y), params.args)
        row = jnp.where(missing, count, t_rows.shape[0] - 1)
        t_rows = t_rows.at[row].set(t_final)
        y_rows = y_rows.at[row].set(config.steps_spec.ravel(saved))
        count = count + missing.astype(jnp.int32)
    size = config.max_steps // config.save_every
    if config.save_t1 and config.max_steps % config.save_every:
        size += 1
    valid = jnp.arange(size, dtype=jnp.int32) < count
    ts = jnp.where(valid, t_rows[:size], jnp.inf)
    ys = jnp.where(valid[:, None], y_rows[:size], jnp.inf)
    return ts, config.steps_spec.unravel_rows(ys)


def _before(cut, tau, ts, ys):
    """Save times after an event (tau > cut) were not reached: inf, as unused rows."""
    if cut is None:
        return ts, ys
    valid = tau <= cut
    ts = jnp.where(valid, ts, jnp.inf)
    mask = lambda y: jnp.where(valid.reshape(valid.shape + (1,) * (y.ndim - 1)), y, jnp.inf)
    return ts, jtu.tree_map(mask, ys)


def _outputs(config, params, y0, final, buffers, cut):
    """Assemble (ts, ys) in the order t0, ts, steps, t1; each part a (ts, flat ys) pair.
    `cut`: the event time (tau-space), or None."""
    spec, fn, args, d = config.spec, config.saveat_fn, params.args, params.direction
    parts = []
    buffers = list(buffers)

    def saved(t, y_flat_rows):
        ys = spec.unravel_rows(y_flat_rows)
        if fn is save_y:
            return ys
        return jax.vmap(lambda t_, y_: fn(t_, y_, args))(t, ys)

    if config.save_t0:
        parts.append((d * params.t_start[None], saved(d * params.t_start[None], y0[None])))
    if params.save_ts is not None:
        ys, tau = buffers.pop(0)[:-1], params.save_ts[:-1]
        # A solve stopped early (max_steps with throw=False) leaves its later rows unused:
        # inf, in ts as in ys.
        rows = jnp.arange(tau.shape[0], dtype=final.ts_index.dtype)
        ts = jnp.where(rows < final.ts_index, d * tau, jnp.inf)
        parts.append(_before(cut, tau, ts, saved(ts, ys)))
    if config.save_every:
        parts.append(_steps_output(config, params, final, buffers.pop(0), cut))
    if config.save_t1 and not config.save_every:
        parts.append((d * final.t[None], saved(d * final.t[None], final.y[None])))
    dense = None
    if config.save_dense:
        t_start, t_end, y_rows, stage_rows = buffers.pop(0)
        count = final.dense_row
        # No step (t0 == t1): the interpolant is the point y0, a row of zero length.
        empty = count == 0
        t_start = t_start.at[0].set(jnp.where(empty, params.t_start, t_start[0]))
        t_end = t_end.at[0].set(jnp.where(empty, params.t_start, t_end[0]))
        y_rows = y_rows.at[0].set(jnp.where(empty, y0, y_rows[0]))
        stage_rows = stage_rows.at[0].set(jnp.where(empty, 0, stage_rows[0]))
        rows = StepRows(t_start, t_end, y_rows, stage_rows, jnp.maximum(count, 1))
        dense = DenseInterpolation(rows, config.interp, spec, d, d * params.t_start, d * final.t)
    if not parts:
        return None, None, dense
    ts = jnp.concatenate([p[0] for p in parts])
    ys = jtu.tree_map(lambda *leaves: jnp.concatenate(leaves), *[p[1] for p in parts])
    return ts, ys, dense


# ---------------------------------------------------------------------- entry point


def diffeqsolve(
    terms: ODETerm,
    solver: Any,
    t0: Any,
    t1: Any,
    dt0: Any,
    y0: Any,
    args: Any = None,
    *,
    saveat: SaveAt = SaveAt(t1=True),
    stepsize_controller: AbstractStepSizeController = ConstantStepSize(),
    adjoint: AbstractAdjoint = RecursiveCheckpointAdjoint(),
    event: Any = None,
    max_steps: int | None = 4096,
    throw: bool = True,
    progress_meter: AbstractProgressMeter = NoProgressMeter(),
    solver_state: Any = None,
    controller_state: Any = None,
    made_jump: Any = None,
) -> Solution:
    """Solve dy/dt = f(t, y, args) from t0 to t1 (Diffrax's signature, ODE subset).

    - `terms`: `ODETerm(f)`. `solver`: e.g. `Tsit5()`. `y0`: PyTree of float arrays
      (integers are promoted). `dt0`: first step size (None lets `PIDController` pick).
    - `saveat`: what to return (`SaveAt`). `stepsize_controller`: `ConstantStepSize()`,
      `StepTo(ts)` or `PIDController(rtol, atol)`.
    - `adjoint`: how gradients are computed (`RecursiveCheckpointAdjoint()` by default).
    - `max_steps`: bound on the number of steps (accepted and rejected).
    - `throw`: raise on failure (`SolveError`; inside `jit`, JAX's `JaxRuntimeError`
      carrying its message); with False, check `sol.result`.
    """
    check_kinds(
        solver=solver,
        saveat=saveat,
        stepsize_controller=stepsize_controller,
        adjoint=adjoint,
        progress_meter=progress_meter,
    )
    if event is not None and not isinstance(event, Event):
        raise TypeError(f"event={event!r}: pass odesolve.Event(cond_fn) or None.")
    if event is not None and adjoint.continuous:
        raise ValueError(
            f"event=... cannot be combined with adjoint={type(adjoint).__name__}(): the "
            "continuous adjoint does not differentiate the event time. Use "
            "RecursiveCheckpointAdjoint() (the default) or DirectAdjoint()."
        )
    for name, value in (
        ("solver_state", solver_state),
        ("controller_state", controller_state),
        ("made_jump", made_jump),
    ):
        if value is not None:
            raise ValueError(f"{name}=...: resuming a solve is not supported; pass None.")
    if not jtu.tree_leaves(y0):
        terms, y0, event, saveat = _nothing_to_solve_for(y0, event, saveat)
    inputs = normalise_inputs(
        terms, solver, t0, t1, dt0, y0, args, saveat, stepsize_controller, max_steps, event
    )
    solve = functools.partial(
        _solve,
        inputs.terms,
        solver,
        inputs.t0,
        inputs.t1,
        inputs.dt0,
        inputs.y0,
        args,
        saveat=saveat,
        controller=stepsize_controller,
        # Step counters are int32: a larger bound (never reached: a billion steps) is
        # that many, rather than a count that wraps.
        max_steps=None if max_steps is None else min(max_steps, _MOST_STEPS),
        throw=throw,
        meter=progress_meter,
        event=inputs.event,
        direction=inputs.direction,
        # An event may stop the solve early: the step count is not known in advance.
        num_steps=inputs.num_steps if event is None else None,
        static_times=_static_times(t0, t1, dt0, saveat, stepsize_controller, event),
        batch=batch_size(inputs.y0, args, inputs.t0, inputs.t1),
    )
    sol = solve(adjoint=adjoint)
    if max_steps is not None and max_steps > _MOST_STEPS:
        sol = eqx.tree_at(lambda s: s.stats["max_steps"], sol, max_steps)
    return _raise_if_failed(sol) if throw else sol


_MOST_STEPS = 2**30


def _nothing_to_solve_for(empty, event, saveat):
    """y0 has no arrays (None, {}): as Diffrax, run the clock and return y0's structure
    as the states. The field is not called; events and `SaveAt(fn=...)` see y0. Returns
    (terms, y0, event, saveat) for a stand-in state of no elements."""

    def with_empty_state(fn):
        return lambda t, y, args, **kwargs: fn(t, empty, args, **kwargs)

    if event is not None:
        event = event.with_conditions([with_empty_state(c) for c in event.conditions])
    if saveat.fn is save_y:
        fn = _save_nothing if empty is None else (lambda t, y, args: empty)
    else:
        fn = with_empty_state(saveat.fn)
    saveat = eqx.tree_at(lambda s: s.fn, saveat, fn)
    return ODETerm(_no_change), jnp.zeros(0), event, saveat


def _no_change(t, y, args):
    return jnp.zeros_like(y)


def _save_nothing(t, y, args):
    return None


@eqx.filter_jit
def _solve(
    terms,
    solver,
    t0,
    t1,
    dt0,
    y0,
    args,
    *,
    saveat,
    controller,
    adjoint,
    max_steps,
    throw,
    meter,
    event,
    direction,
    num_steps,
    static_times,
    batch,
):
    time_dtype = jnp.result_type(t0)
    if direction is None:  # only known at run time
        direction = jnp.where(t1 >= t0, 1, -1).astype(time_dtype)
    # The solver works in at least float32 (a float16 state's error norm and stages would
    # lose most of their digits); the field still sees each leaf in its own dtype.
    spec = flat_spec(y0, state_dtype(jtu.tree_leaves(y0)))
    y0_flat = spec.ravel(y0)
    tau0, tau1 = direction * t0, direction * t1
    field = _FlatField(terms, spec, direction)
    vf = closure_convert(field, tau0, y0_flat, args)
    meter_key, meter_last = meter.init() if meter.active else (0, None)
    config = _make_config(
        solver,
        spec,
        saveat,
        controller,
        max_steps,
        meter,
        meter_key,
        y0,
        t0,
        args,
        event,
        static_times,
    )
    save_ts = None
    if saveat.ts is not None:  # tau-space, with an inf sentinel after the last
        save_ts = jnp.append(direction * jnp.asarray(saveat.ts, time_dtype), jnp.inf)
    params = _Params(
        vf=vf,
        args=args,
        controller=controller.wrap(jnp.asarray(direction, time_dtype)),
        t_start=tau0,
        t_end=tau1,
        save_ts=save_ts,
        direction=direction,
        dt0=None if dt0 is None else direction * dt0,
        conditions=None
        if event is None
        else _conditions(
            event,
            condition_kwargs(terms, solver, t0, t1, dt0, saveat, controller, max_steps),
            (spec, direction, tau0, y0_flat),
            args,
        ),
    )
    dt0_tau = params.dt0
    initial_result = _runtime_input_checks(config, params, dt0_tau)
    init = _initial_state(config, params, y0_flat, dt0_tau, initial_result, meter_last)
    loop = Loop(
        cond=lambda p, s: _keep_going(config, p, s),
        body=lambda p, s: _step(config, p, s),
        pending=_pending,
        emit=lambda p, s: _emit(config, p, s),
        max_steps=max_steps,
        max_emits=_max_emits(config, params, max_steps),
        num_steps=num_steps,
        batch_size=batch,
        decision=(lambda s: s.t_next) if config.needs_error else None,
        replay=lambda s, t_next: eqx.tree_at(lambda s: s.t_next, s, t_next),
    )
    buffers = _buffers(config, params, time_dtype)
    if adjoint.continuous:
        check_supported(saveat)
        problem = continuous_problem(adjoint, solver, max_steps, throw)
        final, buffers = adjoint.run_continuous(loop, problem, params, init, buffers)
    else:
        final, buffers = adjoint.run_loop(loop, params, init, buffers)
    final, event_mask = _locate_event(config, params, final)
    cut = None if config.event is None else final.t
    result = _final_result(config, params, final)
    ts, ys, dense = _outputs(config, params, y0_flat, final, buffers, cut)
    if config.meter.active:
        config.meter.close(config.meter_key, final.t)
    stats = {
        "num_steps": final.num_steps,
        "num_accepted_steps": final.num_accepted,
        "num_rejected_steps": final.num_steps - final.num_accepted,
        "max_steps": max_steps,
    }
    if config.event is not None:
        t1 = direction * final.t
    sol = Solution(
        t0=t0,
        t1=t1,
        ts=ts,
        ys=ys,
        stats=stats,
        result=result,
        interpolation=dense,
        event_mask=event_mask,
    )
    return sol


def _max_emits(config, params, max_steps):
    """Bound on emit ticks: one per save time, one per recorded step."""
    emits = 0 if params.save_ts is None else params.save_ts.shape[0] - 1
    if (config.save_dense or config.save_every) and max_steps is not None:
        emits += max_steps
    return emits


def _conditions(event, kwargs, flat_start, args):
    """The event's conditions on the flat state, closure-converted (they may close over
    values that need cotangents, like the vector field). `flat_start`: (spec, direction,
    tau0, y0_flat), how the state is flattened and where the solve starts."""
    spec, direction, tau0, y0_flat = flat_start
    flat = FlatConditions(event.conditions, spec, direction, kwargs)
    conditions = closure_convert(flat, tau0, y0_flat, args)
    check_condition_outputs(conditions.out_struct, event.conditions)
    return conditions


def _make_config(
    solver,
    spec,
    saveat,
    controller,
    max_steps,
    meter,
    meter_key,
    y0,
    t0,
    args,
    event,
    static_times,
):
    every = saveat.every
    if (every or saveat.dense) and max_steps is None:
        raise ValueError(
            "max_steps=None cannot be combined with SaveAt(steps=...) or SaveAt(dense=True): "
            "their outputs are sized by max_steps. Pass an integer max_steps."
        )
    steps_spec = None
    if every:
        out = jax.eval_shape(saveat.fn, t0, y0, args)
        leaves = jtu.tree_leaves(out)
        steps_spec = flat_spec(out, state_dtype(leaves))
    if controller.needs_error and not getattr(solver, "adaptive", True):
        raise ValueError(
            f"{type(solver).__name__} has no error estimate, so it cannot be used with "
            f"{type(controller).__name__}; use ConstantStepSize() or an adaptive solver "
            "such as Tsit5()."
        )
    return _Config(
        solver=solver,
        spec=spec,
        saveat_fn=saveat.fn,
        save_t0=bool(saveat.t0),
        save_t1=bool(saveat.t1),
        save_every=every,
        save_dense=bool(saveat.dense),
        save_ts=saveat.ts is not None,
        steps_spec=steps_spec,
        max_steps=max_steps,
        meter=meter,
        meter_key=meter_key,
        needs_error=controller.needs_error,
        jumps=controller.has_jumps,
        event=None if event is None else event.record,
        static_times=static_times,
    )


def _static_times(t0, t1, dt0, saveat, controller, event) -> bool:
    """Whether no derivative can flow through the step times: every input that places
    them is a concrete value (not a tracer), and no event moves the end to a root of the
    state. Step sizes themselves are never differentiated (see `PIDController.adapt`).
    Then a step's reverse needs no record of its size, and its VJP no time cotangents."""
    if event is not None:
        return False
    leaves = jtu.tree_leaves((t0, t1, dt0, saveat.ts, controller))
    return all(is_concrete(x) for x in leaves)


def _runtime_input_checks(config, params, dt0_tau):
    """Checks of traced inputs, which can only fail at run time (concrete ones were
    checked before tracing, with trace-time errors)."""
    # Written so that NaN fails each check (a comparison with NaN is False).
    result = jnp.asarray(RESULTS.successful, jnp.int32)
    t_start, t_end = params.t_start, params.t_end
    if dt0_tau is not None:
        # (t1 = inf with an event: the resolution near t0.)
        t_far = jnp.where(jnp.isfinite(t_end), t_end, t_start)
        t_max = jnp.maximum(jnp.abs(t_start), jnp.abs(t_far))
        fine = dt0_tau >= resolution(jax.lax.stop_gradient(t_max), t_start.dtype)
        bad_dt0 = ~(jnp.isfinite(dt0_tau) & fine) & (t_end > t_start)
        result = jnp.where(bad_dt0, RESULTS.invalid_dt0, result)
    if params.save_ts is not None:
        ts = params.save_ts[:-1]
        ordered = jnp.all(ts[1:] >= ts[:-1]) & (ts[0] >= t_start) & (ts[-1] <= t_end)
        result = jnp.where(ordered & jnp.all(jnp.isfinite(ts)), result, RESULTS.invalid_save_times)
    valid = params.controller.times_are_valid(t_start, t_end)
    result = jnp.where(valid, result, RESULTS.invalid_step_times)
    # t1 = inf is allowed only for an event to end the solve (checked at trace time).
    finite = jnp.isfinite(t_start) & (jnp.isfinite(t_end) | (config.event is not None))
    result = jnp.where(finite & ~jnp.isnan(t_end), result, RESULTS.nonfinite_times)
    return result


def _raise_if_failed(sol: Solution) -> Solution:
    """`throw=True`. Outside any transformation the result is known here: raise one
    `SolveError` with our message. Inside one, a host callback raises it when the program
    runs (JAX then wraps it in its `JaxRuntimeError`, a `RuntimeError` too)."""
    code = trace_time_value(sol.result)
    if code is not None:
        failed = [RESULTS(int(c)) for c in np.ravel(code) if not is_okay(RESULTS(int(c)))]
        if failed:
            raise SolveError(failure_message(max(failed)))
        return sol
    # One code however large a `vmap` batch is (the largest failure code over the batch,
    # `unvmap_max`): a batched callback would be unrolled into one per sample, thousands
    # of operations to compile for an ensemble. Not `eqx.error_if`: under `jit(grad)` it
    # trips `jax.checking_leaks()`.
    failed = ~is_okay(sol.result)
    code = eqxi.unvmap_max(jnp.where(failed, sol.result, RESULTS.successful))
    jax.lax.cond(
        code != RESULTS.successful.value,
        lambda c: jax.debug.callback(_raise_failure, c),
        lambda c: None,
        code,
    )
    return sol


def _raise_failure(code) -> None:
    raise SolveError(failure_message(RESULTS(int(code))))
