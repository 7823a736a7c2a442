"""The loop's carry and one step of it.

The loop is one `lax.while_loop` (run by the adjoint) whose carry is `State`. Time is
internal, tau = direction * t, and always runs forwards; the state is one flat vector.
Each feature keeps its own part of the carry: saving (`_saving.SaveState`), events
(`_event.EventState`), the solver's and the controller's states.
"""

import dataclasses
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jaxtyping import Array, Bool, Float, Int

from adjoints import Write, decided

from . import _event, _saving
from ._config import Config, Params
from ._controller._base import AttemptInput, FirstStepInput, next_start
from ._field import OneTrace, Rematerialised
from ._results import RESULTS
from ._solver._base import StartInput, StepContext, StepField, StepInput, StepResult

# `State.verdict` when none is imposed.
_NONE_IMPOSED = -1


class State(eqx.Module):
    """The loop carry. `t` is where the next step starts, `t_next` where it should end.

    - `solver_state`: what the solver carries between steps; `made_jump`: the last
      accepted step ended on a jump time (None: no jump times).
    - `row`: (t0, y0, dense vectors) of the last step, its interpolant, ending at `t`
      (None when no output or event reads it).
    - `saving`, `event`, `meter_last`: each feature's part (None when it is off).
    - `verdict`: the verdict a reverse sweep that recomputes the next tick imposes on it
      (see `Decision`): 1 accept, 0 reject, -1 none (the controller's). None in a first
      run: `obey` sets it for one tick, which drops it, so a solve that recomputes
      nothing carries and tests nothing for it.
    """

    t: Any
    t_next: Any
    y: Any
    solver_state: Any
    made_jump: Bool[Array, ""] | None
    controller_state: Any
    num_steps: Int[Array, ""]
    num_accepted: Int[Array, ""]
    result: Int[Array, ""]
    row: Any
    saving: _saving.SaveState
    event: _event.EventState | None
    meter_last: Any
    verdict: Int[Array, ""] | None


def time_leaves(tree: State) -> State:
    """Which leaves of a State-shaped `tree` (None where it has none) are times, or are
    placed by them alone: where steps start and end, the controller's state, the
    interpolation row's start, the next save times and the progress meter's last time.
    A loop with static times gives them no derivative (see `Loop.constant`)."""

    def is_time(path: tuple, leaf: Any) -> bool:
        names = tuple(getattr(k, "name", getattr(k, "idx", None)) for k in path)
        return names[:1] in _TIME_FIELDS or names[:2] == ("row", 0) or names[-1:] == ("next_save",)

    return jtu.tree_map_with_path(is_time, tree, is_leaf=lambda x: x is None)


def step_ignores(tree: State) -> State:
    """Which leaves of a State-shaped `tree` a step never reads: the last step's
    interpolant (`row`), which a step writes afresh and only emits read. A state kept
    for reverse mode before a step leaves it out: for Tsit5 it is 8 of a carry's 10
    state vectors."""
    is_row = lambda path, leaf: getattr(path[0], "name", None) == "row"
    return jtu.tree_map_with_path(is_row, tree)


_TIME_FIELDS = {("t",), ("t_next",), ("controller_state",), ("meter_last",)}


class Decision(eqx.Module):
    """What a tick decided, as a reverse sweep that recomputes it replays it: the step's
    verdict (True: accepted; False: rejected, or an emit) and where the next step ends.

    A step's verdict compares an error estimate, a difference of nearly equal numbers,
    with 1, and a recomputation compiled apart rounds differently: in float32 near the
    resolution it is now and then reversed, and the reverse sweep would differentiate
    another solution. So the recomputed step is made to take the first run's verdict
    (`obey`, before it) and end where it ended (`replay`, after it, outside what is
    differentiated: the end carries the derivative of the end time it was clipped to).
    The controller's proposal carries no derivative, so neither changes a derivative.
    """

    verdict: Bool[Array, ""]
    t_next: Float[Array, ""]

    @staticmethod
    def taken(before: "State", after: "State") -> "Decision":
        """The decision of the tick from `before` to `after`."""
        return Decision(after.num_accepted > before.num_accepted, after.t_next)


def obey(state: "State", decision: Decision, held: Bool[Array, ""]) -> "State":
    """`state`, whose next step takes the verdict of `decision` where `held` (else its
    controller's)."""
    verdict = jnp.where(held, decision.verdict.astype(jnp.int8), jnp.int8(_NONE_IMPOSED))
    return dataclasses.replace(state, verdict=verdict)


def replay(state: "State", decision: Decision, held: Bool[Array, ""]) -> "State":
    """`state` after a step, ending its next step where `decision` says where `held`."""
    return eqx.tree_at(lambda s: s.t_next, state, jnp.where(held, decision.t_next, state.t_next))


def times(config: Config, *ts: Float[Array, ""]) -> tuple:
    """Step times as the step uses them: without a derivative when none can flow."""
    return tuple(jax.lax.stop_gradient(t) for t in ts) if config.static_times else ts


def clipped_to_end(params: Params, start: Float[Array, ""], end: Float[Array, ""]) -> Any:
    """Where a step from `start` proposed to end at `end` ends: never past t_end, and at
    t_end when it would leave less than 100 ulps of t_end to go (as Diffrax: no step of
    a few ulps left by rounding in start + dt) and at most 1% of its length (so a step of
    a few ulps, near the resolution of time, is not stretched many times over)."""
    t_end = params.t_end
    end = jnp.minimum(end, t_end)
    left = t_end - end
    return jnp.where((left < _hundred_ulps(t_end)) & (left <= 0.01 * (end - start)), t_end, end)


def _hundred_ulps(t: Float[Array, ""]) -> Float[Array, ""]:
    """100 spacings of floats just below `t` (inf for t = inf: no step is stretched).
    A threshold, so it carries no derivative."""
    t = jax.lax.stop_gradient(t)
    return 100 * (t - jnp.nextafter(t, jnp.asarray(-jnp.inf, t.dtype)))


def initial_state(
    config: Config,
    params: Params,
    y0: Float[Array, " n"],
    initial_result: RESULTS | Int[Array, ""],
    meter_last: Float[Array, ""] | None,
) -> State:
    vf, args, t0 = params.vf, params.args, params.t_start
    k0 = vf(t0, y0, args)
    first_step = FirstStepInput(
        vf=vf,
        t0=t0,
        t1=params.t_end,
        y0=y0,
        k0=k0,
        dt0=params.dt0,
        args=args,
        error_order=config.solver.error_order(),
        spec=config.spec,
        number_times=config.number_times,
    )
    t_next, controller_state = params.controller.start(first_step)
    result = jnp.where(
        jnp.all(jnp.isfinite(k0)), initial_result, RESULTS.nonfinite_initial_derivative
    )
    event = None
    if config.event is not None:
        assert params.conditions is not None  # made with the event
        event = _event.initial_state(params.conditions, t0, y0, args)
        result = _event_result(event, result)
    zero = jnp.zeros((), jnp.int32)
    return State(
        t=t0,
        t_next=clipped_to_end(params, t0, t_next),
        y=y0,
        solver_state=config.solver.start(StartInput(vf=vf, t0=t0, y0=y0, k0=k0, args=args)),
        made_jump=jnp.asarray(False) if config.jumps else None,
        controller_state=controller_state,
        num_steps=zero,
        num_accepted=zero,
        result=jnp.asarray(result, jnp.int32),
        row=empty_row(config, t0, y0, k0) if config.carries_row else None,
        saving=_saving.initial_state(config.saving, params.save_ts),
        event=event,
        meter_last=meter_last,
        verdict=None,
    )


def empty_row(
    config: Config, t0: Float[Array, ""], y0: Float[Array, " n"], k0: Float[Array, " n"]
) -> tuple:
    """The row before the first step: of no length, each dense vector k0. Read as a
    step of unit length at theta = t - t0 (see `_interpolation.position`), it gives
    y0 + (t - t0) k0 (a step's weights sum to theta): y0 at t0, with the derivative in
    time that a save time at t0 has."""
    return (t0, y0, carried_vectors(config, tuple(k0 for _ in config.table)))


def carried_vectors(config: Config, ks: Sequence[Array]) -> Any:
    """A step's dense vectors `ks` as the carry's row holds them: one array where
    unbatched (`config.batched` false), else each a carry leaf of its own.

    Stacked, an unbatched solve's row is one buffer, made by one kernel before the loop.
    Each carry leaf is a buffer that XLA:CPU initialises with a kernel of its own there;
    with Tsit5's seven vectors apart, more kernels were ready at once than XLA:CPU runs
    on the calling thread, it handed half of them to a worker thread, and the loop ran
    on the worker, slower (benchmarks/README.md, "Where the step loop runs"). Under
    `vmap` the stacked row costs a copy of every sample's vectors each step, which
    slowed a batched training step: batched rows stay apart."""
    return tuple(ks) if config.batched else jnp.stack(ks)


def keep_going(config: Config, params: Params, state: State) -> Bool[Array, ""]:
    going = (state.t < params.t_end) & (state.result == RESULTS.successful.value)
    if config.max_steps is not None:
        going = going & (state.num_steps < config.max_steps)
    return going


def _attempt(
    config: Config, params: Params, state: State, t0: Float[Array, ""], t1: Float[Array, ""]
) -> StepResult:
    """The solver's attempt at the step from (t0, state.y) to t1."""
    # Implicit solvers take their Newton tolerances from the controller (see StepContext).
    vf = StepField(Rematerialised(params.vf, OneTrace()), params.vf)
    return config.solver.advance(
        StepInput(
            vf=vf,
            t0=t0,
            h=t1 - t0,
            y0=state.y,
            state=state.solver_state,
            made_jump=state.made_jump,
            args=params.args,
            with_error=config.needs_error,
            context=step_context(config, params),
            t1=t1,
        )
    )


def step_context(config: Config, params: Params) -> StepContext:
    """What a step is told beyond itself (see `StepContext`)."""
    span = jax.lax.stop_gradient(params.t_end - params.t_start)
    tolerances = params.controller.tolerances()
    return StepContext(tolerances, params.direction, config.spec, span, config.batched)


def step(config: Config, params: Params, state: State) -> State:
    t0, t1 = times(config, state.t, state.t_next)
    out = _attempt(config, params, state, t0, t1)
    proposal = params.controller.adapt(
        AttemptInput(
            t0=t0,
            t1=t1,
            y0=state.y,
            y1=out.y1,
            y_error=out.y_error,
            state=state.controller_state,
            error_order=config.solver.error_order(),
            spec=config.spec,
            args=params.args,
        )
    )
    # The controller's verdict, marked: a recomputation that rounds differently must not
    # reverse it (see `adjoints.decided`).
    proposal = jax.tree_util.tree_map(lambda x: decided(x) if eqx.is_array(x) else x, proposal)
    accept = jnp.asarray(proposal.accept)
    if state.verdict is not None:  # where a recomputing reverse sweep imposes one
        accept = jnp.where(state.verdict == _NONE_IMPOSED, accept, state.verdict == 1)
    stops = params.controller.jump_stops() if params.controller.has_jumps else None
    t_new, jumped = next_start(stops, accept, t0, t1)
    if proposal.start is not None:  # a controller that says where the next step starts
        t_new = jnp.where(accept, proposal.start, t0)
    if proposal.made_jump is not None:  # ...and whether it crossed a jump
        jumped = accept & proposal.made_jump
    next_end = clipped_to_end(params, t_new, proposal.next_end)
    result = _step_result(config, params, out, proposal.result, t_new, next_end)
    num_accepted = state.num_accepted + accept.astype(jnp.int32)
    y_new = jnp.where(accept, out.y1, state.y)
    event = state.event
    if config.event is not None:
        assert params.conditions is not None and event is not None  # made with the event
        event = _event.after_step(
            config.event, params.conditions, event, accept, t_new, y_new, params.args
        )
        result = _event_result(event, result)
    keep = lambda new, old: jax.tree_util.tree_map(lambda a, b: jnp.where(accept, a, b), new, old)
    return State(
        t=t_new,
        t_next=next_end,
        y=y_new,
        solver_state=keep(out.state, state.solver_state),
        made_jump=_made_jump(accept, jumped, state.made_jump),
        controller_state=proposal.state,
        num_steps=state.num_steps + 1,
        num_accepted=num_accepted,
        result=jnp.where(state.result == RESULTS.successful.value, result, state.result),
        row=(t0, state.y, carried_vectors(config, out.dense)) if config.carries_row else None,
        saving=_saving.after_step(config.saving, state.saving, accept, num_accepted),
        event=event,
        meter_last=_report_progress(config, params, state, t_new),
        verdict=None,
    )


def _event_result(event: _event.EventState, result: Int[Array, ""]) -> Int[Array, ""]:
    """`result` after the event's conditions were evaluated (at t0, or at the end of an
    accepted step): a NaN condition is a failure, a fired one stops the solve."""
    outcome = jnp.where(
        _event.any_nan(event),
        RESULTS.nonfinite_event_condition,
        jnp.where(_event.any_fired(event), RESULTS.event_occurred, RESULTS.successful),
    )
    return jnp.where(result == RESULTS.successful.value, outcome, result)


def _made_jump(accept: Array, jumped: Array | None, before: Array | None) -> Array | None:
    """Whether the last accepted step ended on a jump (None: there are no jump times)."""
    if jumped is None or before is None:
        return None
    return jnp.where(accept, jumped, before)


def _step_result(
    config: Config,
    params: Params,
    out: StepResult,
    proposed: RESULTS | Int[Array, ""],
    t_new: Float[Array, ""],
    next_end: Float[Array, ""],
) -> Any:
    # Every step rejected until t + dt == t: report it rather than spin to max_steps.
    underflow = (next_end <= t_new) & (t_new < params.t_end)
    result = jnp.where(underflow, RESULTS.step_size_underflow, proposed)
    if out.failed is not None and not config.needs_error:
        # Fixed steps cannot reject a step whose Newton iterations failed: say so.
        result = jnp.where(out.failed, RESULTS.nonlinear_divergence, result)
    return result


def _report_progress(config: Config, params: Params, state: State, t_new: Float[Array, ""]) -> Any:
    if state.meter_last is None:
        return None
    # Reported, never differentiated (the meter's callback has no derivative).
    progress = jax.lax.stop_gradient((t_new - params.t_start) / (params.t_end - params.t_start))
    return config.meter.step(config.meter_key, progress, state.meter_last, state.num_steps + 1)


def pending(state: State) -> Bool[Array, ""]:
    return _saving.pending(state.saving, state.t)


def emit(config: Config, params: Params, state: State) -> tuple[State, tuple[Write, ...]]:
    """Record one piece of due output (see `adjoints.Loop`)."""
    state = dataclasses.replace(state, verdict=None)  # an imposed verdict is for a step
    if not config.saving.records:
        return state, ()
    now = _saving.Moment(
        state.t, state.y, state.row, config.table, config.spec, params.direction, params.args
    )
    saving, writes = _saving.emit(
        config.saving, params.save_ts, state.saving, now, lambda *ts: times(config, *ts)
    )
    return eqx.tree_at(lambda s: s.saving, state, saving), writes
