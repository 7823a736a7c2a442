"""Saving: the only module that knows the output layout.

Saving never adds a loop. Steps that contain a requested save time write their
interpolation data into a row buffer as they go; after the loop, rows are turned into
`sol.ts` and `sol.ys`. Each output (`SaveAt`, or each `SubSaveAt` of `SaveAt(subs=...)`)
has its own buffers: one for its save times, one for its saved steps; dense output has
one more, shared. Every buffer has a scratch last row: a write that is not due goes
there and is dropped (see `adjoints.Loop`).

Times here are internal (tau = direction * t); outputs are in the user's time.
"""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jax.typing import ArrayLike
from jaxtyping import Array, Bool, Float, Int

from adjoints import Write

from . import _interpolation
from ._flat import FlatSpec, PyTree, flat_spec, state_dtype
from ._saveat import SaveAt, SubSaveAt, save_y
from ._solution import DenseInterpolation, StepRows
from ._time import narrower_times

# Save times one emit writes at most, under `vmap`. There each emit is a round of the
# lockstep loops, forwards and in the reverse sweep, that every sample waits for, so a
# solve saving many times within each step (a trajectory fitted at a hundred
# observations) would spend most of its time in rounds of one save each. A block's
# interpolations are unrolled and lengthen compilation: 4 keeps most of the gain of 8 at
# half the cost. Unbatched, an emit is a cheap tick between runs of steps, and one save
# time per emit costs least. See benchmarks/README.md.
SAVE_BLOCK = 4


class Output(eqx.Module):
    """One output's layout, fixed at trace time. `steps_spec`: the flat layout of
    `fn`'s output, for saved steps (None when steps are not saved)."""

    t0: bool = eqx.field(static=True)
    t1: bool = eqx.field(static=True)
    has_ts: bool = eqx.field(static=True)
    every: int = eqx.field(static=True)
    fn: Callable = eqx.field(static=True)
    steps_spec: FlatSpec | None = eqx.field(static=True)

    @property
    def spec(self) -> FlatSpec:
        """`steps_spec`, for an output that saves steps."""
        assert self.steps_spec is not None
        return self.steps_spec


class Layout(eqx.Module):
    """Every output of a solve, dense output, and the bound that sizes step buffers."""

    outputs: tuple[Output, ...] = eqx.field(static=True)
    dense: bool = eqx.field(static=True)
    max_steps: int | None = eqx.field(static=True)
    block: int = eqx.field(static=True, default=1)  # save times an emit writes at most

    @property
    def has_ts(self) -> bool:
        return any(o.has_ts for o in self.outputs)

    @property
    def rows(self) -> int:
        """Saved steps and dense output have max_steps rows (an int whenever they are
        asked for: see `layout`)."""
        assert self.max_steps is not None
        return self.max_steps

    @property
    def records(self) -> bool:
        """The loop emits output rows at all."""
        return self.has_ts or self.dense or any(o.every for o in self.outputs)


def layout(
    saveat: SaveAt,
    t0: Float[Array, ""],
    y0: PyTree,
    args: PyTree,
    max_steps: int | None,
    batched: bool = False,
) -> Layout:
    """The outputs' layout; `batched`: the solve runs under `vmap` (see `SAVE_BLOCK`)."""
    outputs = saveat.outputs
    if (saveat.dense or any(o.every for o in outputs)) and max_steps is None:
        raise ValueError(
            "max_steps=None cannot be combined with SaveAt(steps=...) or SaveAt(dense=True): "
            "their outputs are sized by max_steps. Pass an integer max_steps."
        )
    block = SAVE_BLOCK if batched else 1
    return Layout(
        tuple(_output(o, t0, y0, args) for o in outputs), bool(saveat.dense), max_steps, block
    )


def _output(sub: SubSaveAt, t0: Float[Array, ""], y0: PyTree, args: PyTree) -> Output:
    spec = None
    if sub.every or sub.fn is not save_y:
        out = _fn_shape(sub.fn, t0, y0, args)
        if sub.every:
            spec = flat_spec(out, state_dtype(jtu.tree_leaves(out)))
    return Output(bool(sub.t0), bool(sub.t1), sub.ts is not None, sub.every, sub.fn, spec)


def _fn_shape(fn: Callable, t0: Float[Array, ""], y0: PyTree, args: PyTree) -> PyTree:
    """What `fn(t0, y0, args)` returns, as shapes: traced once here so that a mistake in
    it (a wrong signature, a string returned) is told against `fn`, not deep in a loop.
    The inputs are closed over, not passed: `args` may hold what is not an array (an
    `eqx.nn.MLP` holds its activation functions)."""
    try:
        return jax.eval_shape(lambda: fn(t0, y0, args))
    except Exception as error:
        raise TypeError(
            f"SaveAt(fn={fn!r}) failed when called as fn(t0, y0, args): "
            f"{type(error).__name__}: {error}. Write it as def fn(t, y, args) returning a "
            "PyTree of arrays (what to save instead of y)."
        ) from error


def save_times(
    saveat: SaveAt, direction: Float[Array, ""], dtype: jnp.dtype, start: Array, end: Array
) -> tuple[Array | None, ...]:
    """Each output's save times in tau, with an inf sentinel after the last (None: no
    `ts`). Times given in a narrower dtype than time's that lie past the interval
    [`start`, `end`] (tau) by their own dtype's rounding are at its end (float32 0.3 is
    0.30000001 in float64), as their check allowed."""

    def in_tau(ts: ArrayLike) -> Array:
        tau = direction * jnp.asarray(ts, dtype)
        if narrower_times(ts, dtype):
            own = lambda t: jnp.abs(jnp.spacing(jnp.asarray(t, jnp.result_type(ts))))
            rounding = lambda t: 2 * own(t).astype(dtype)
            tau = jnp.where((tau > end) & (tau - end <= rounding(end)), end, tau)
            tau = jnp.where((tau < start) & (start - tau <= rounding(start)), start, tau)
        return jnp.append(tau, jnp.inf)

    return tuple(None if o.ts is None else in_tau(o.ts) for o in saveat.outputs)


# ------------------------------------------------------------------ in the loop


class OutputState(eqx.Module):
    """Progress of one output (None where it saves no such rows): `ts_index` save times
    done, `next_save` the first not done (inf once all are; one at or before the solve's
    time is due); `steps_due` the last step is still to be saved, `steps_row` rows
    saved so far."""

    ts_index: Int[Array, ""] | None
    next_save: Array | None
    steps_due: Bool[Array, ""] | None
    steps_row: Int[Array, ""] | None


class SaveState(eqx.Module):
    """Progress of every output, and of dense output (`dense_due`, `dense_row`)."""

    outputs: tuple[OutputState, ...]
    dense_due: Bool[Array, ""] | None
    dense_row: Int[Array, ""] | None


def initial_state(layout: Layout, save_ts: tuple) -> SaveState:
    zero, no = jnp.zeros((), jnp.int32), jnp.asarray(False)
    outputs = tuple(
        OutputState(
            zero if o.has_ts else None,
            _save_time(ts, zero) if o.has_ts else None,
            no if o.every else None,
            zero if o.every else None,
        )
        for o, ts in zip(layout.outputs, save_ts)
    )
    return SaveState(outputs, no if layout.dense else None, zero if layout.dense else None)


def after_step(layout: Layout, state: SaveState, accept: Array, accepted: Array) -> SaveState:
    """Mark the step just taken for saving: `accepted` steps so far, this one included."""
    outputs = tuple(
        s
        if not o.every
        else eqx.tree_at(lambda s: s.steps_due, s, accept & (accepted % o.every == 0))
        for o, s in zip(layout.outputs, state.outputs)
    )
    return SaveState(outputs, accept if layout.dense else None, state.dense_row)


def pending(state: SaveState, t: Array) -> Bool[Array, ""]:
    """Output is due: a save time at or before `t`, or an unrecorded step."""
    due = jnp.asarray(False)
    for s in state.outputs:
        if s.next_save is not None:
            due = due | _due(t, s.next_save)
        if s.steps_due is not None:
            due = due | s.steps_due
    if state.dense_due is not None:
        due = due | state.dense_due
    return due


class Moment(eqx.Module):
    """What `emit` reads of the loop: where the solve is (`t`, flat `y`), the last
    step's interpolant `row` = (t0, y0, dense vectors) ending at `t`, `table` its
    coefficients, `spec` the state's layout, `direction` tau's sign, `args` the
    field's."""

    t: Array
    y: Array
    row: Any
    table: tuple = eqx.field(static=True)
    spec: FlatSpec = eqx.field(static=True)
    direction: Any
    args: Any


def emit(
    layout: Layout, save_ts: tuple, state: SaveState, now: Moment, times: Callable
) -> tuple[SaveState, tuple[Write, ...]]:
    """Record one piece of due output: a `Write` per buffer (see `buffers`). `times`
    gives the step times as the step used them (with or without their derivative)."""
    writes: list[Write] = []
    outputs = []
    for o, s, ts in zip(layout.outputs, state.outputs, save_ts):
        if o.has_ts:
            s, write = _emit_save_time(s, ts, now, times, layout.block)
            writes.append(write)
        if o.every:
            s, write = _emit_step(o, s, now, layout.rows // o.every)
            writes.append(write)
        outputs.append(s)
    dense_due, dense_row = state.dense_due, state.dense_row
    if layout.dense:
        assert dense_due is not None and dense_row is not None
        t0, y0, ks = now.row
        row = jnp.where(dense_due, dense_row, layout.rows)
        vectors = _interpolation.row_vectors(now.table, ks)
        writes.append(Write(row, (t0, now.t, y0, jnp.stack(vectors))))
        dense_row = dense_row + dense_due.astype(jnp.int32)
        dense_due = jnp.zeros_like(dense_due)
    return SaveState(tuple(outputs), dense_due, dense_row), tuple(writes)


def _save_time(ts: Array, index: Int[Array, "*n"]) -> Array:
    """The save time at `index`; inf once every save time is done, whatever `ts` holds
    (see `_due`)."""
    last = ts.shape[0] - 1
    return jnp.where(index < last, ts[jnp.minimum(index, last)], jnp.inf)


def _due(t: Array, at: Array) -> Bool[Array, "*n"]:
    """Whether a save time `at` (inf: none left) is due at `t`.

    Neither the count of save times nor this test rely on what the arrays hold: the loop
    may run on arrays that are not a solve's (Optimistix's Levenberg-Marquardt applies the
    linearised solve of its all-zero initial state once) and must still end, at t = inf
    too."""
    return (t >= at) & (at < jnp.inf)


def _emit_save_time(
    s: OutputState, ts: Array, now: Moment, times: Callable, most: int
) -> tuple[OutputState, Write]:
    """The first save time not done, if it is due (else a write to the scratch row); or,
    for `most` > 1, a block of them (see `_emit_save_times`)."""
    assert s.next_save is not None and s.ts_index is not None
    if min(most, ts.shape[0] - 1) > 1:
        return _emit_save_times(s, ts, now, times, most)
    due = _due(now.t, s.next_save)
    # A save time not due (an emit for dense output, or every one done) is evaluated at
    # the step's end, as in `_emit_save_times`: an infinite time would make its scratch
    # write's derivative 0 x inf = NaN.
    t0, t1, t = times(now.row[0], now.t, jnp.where(due, s.next_save, now.t))
    value = _interpolation.on_step(now.table, (t0, *now.row[1:]), t1, t)
    write = Write(jnp.where(due, s.ts_index, ts.shape[0] - 1), value)
    index = s.ts_index + due.astype(jnp.int32)
    return OutputState(index, _save_time(ts, index), s.steps_due, s.steps_row), write


def _emit_save_times(
    s: OutputState, ts: Array, now: Moment, times: Callable, most: int
) -> tuple[OutputState, Write]:
    """The save times due among the next `most` not done, written as a block of rows; a
    time not due goes to the scratch row."""
    assert s.ts_index is not None
    scratch = ts.shape[0] - 1
    block = min(scratch, most)
    rows = s.ts_index + jnp.arange(block, dtype=jnp.int32)
    # Past the last save time: inf, never due. Save times are sorted, so those due come
    # first.
    at = _save_time(ts, rows)
    due = _due(now.t, at)
    # A time not due is evaluated at the step's end instead: the interpolant at a later
    # time (inf past the last) would give its scratch write an infinite derivative.
    t0, t1, t = times(now.row[0], now.t, jnp.where(due, at, now.t))
    on_step = lambda t: _interpolation.on_step(now.table, (t0, *now.row[1:]), t1, t)
    # Unrolled, not vectorised over the block: the reverse sweep's sum over the block is
    # then elementwise work that XLA fuses. Vectorised, XLA:CPU made that sum a library
    # call per emit, which doubled a Lorenz ensemble's gradient time.
    value = jnp.stack([on_step(t[i]) for i in range(block)])
    write = Write(jnp.where(due, rows, scratch), value)
    index = s.ts_index + jnp.sum(due, dtype=jnp.int32)
    return OutputState(index, _save_time(ts, index), s.steps_due, s.steps_row), write


def _emit_step(o: Output, s: OutputState, now: Moment, scratch: int) -> tuple[OutputState, Write]:
    """The step just taken, if it is to be saved (else a write to the scratch row)."""
    assert s.steps_due is not None and s.steps_row is not None
    t_user = now.direction * now.t
    saved = o.fn(t_user, now.spec.unravel(now.y), now.args)
    write = Write(jnp.where(s.steps_due, s.steps_row, scratch), (t_user, o.spec.ravel(saved)))
    row = s.steps_row + s.steps_due.astype(jnp.int32)
    return OutputState(s.ts_index, s.next_save, jnp.zeros_like(s.steps_due), row), write


# ------------------------------------------------------------------ buffers


def buffers(
    layout: Layout, save_ts: tuple, spec: FlatSpec, width: int, time_dtype: jnp.dtype
) -> tuple:
    """Output buffers in `emit`'s order, each with one scratch row at the end. `width`:
    how many dense vectors a step has."""
    n, dtype = spec.size, spec.dtype
    out: list[Any] = []
    for o, ts in zip(layout.outputs, save_ts):
        if o.has_ts:
            out.append(jnp.full((ts.shape[0], n), jnp.inf, dtype))
        if o.every:
            rows = layout.rows // o.every + 1
            times = jnp.full((rows,), jnp.inf, time_dtype)
            out.append((times, jnp.full((rows, o.spec.size), jnp.inf, o.spec.dtype)))
    if layout.dense:
        rows = layout.rows + 1
        out.append(
            (
                jnp.full((rows,), jnp.inf, time_dtype),
                jnp.full((rows,), jnp.inf, time_dtype),
                jnp.zeros((rows, n), dtype),
                jnp.zeros((rows, width, n), dtype),
            )
        )
    return tuple(out)


def max_emits(layout: Layout, save_ts: tuple, num_steps: int | None = None) -> int:
    """Bound on emit ticks: one per save time, one per recorded step (of at most
    `max_steps`, or of the `num_steps` fixed steps where known and fewer)."""
    emits = sum(ts.shape[0] - 1 for ts in save_ts if ts is not None)
    if layout.dense or any(o.every for o in layout.outputs):
        emits += layout.rows if num_steps is None else min(layout.rows, num_steps)
    return emits


# ------------------------------------------------------------------ after the loop


class Finish(eqx.Module):
    """What the outputs are made from: the solve's start `t_start` and `y0`, its end `t`
    and `y` (tau, flat), `accepted` steps, and `cut`, the event time if one stopped it."""

    t_start: Array
    y0: Array
    t: Array
    y: Array
    accepted: Int[Array, ""]
    cut: Array | None
    direction: Any
    args: Any
    spec: FlatSpec = eqx.field(static=True)


def outputs(
    layout: Layout, save_ts: tuple, state: SaveState, end: Finish, buffers: tuple, table: tuple
) -> tuple[list, list, DenseInterpolation | None]:
    """(ts, ys) of every output, and the dense interpolant (or None)."""
    rest = list(buffers)
    all_ts, all_ys = [], []
    for o, s, ts in zip(layout.outputs, state.outputs, save_ts):
        ts_rows = rest.pop(0) if o.has_ts else None
        step_rows = rest.pop(0) if o.every else None
        t, y = _one_output(layout, o, s, ts, end, ts_rows, step_rows)
        all_ts.append(t)
        all_ys.append(y)
    dense = _dense(state, end, rest.pop(0), table) if layout.dense else None
    return all_ts, all_ys, dense


def _one_output(
    layout: Layout,
    o: Output,
    s: OutputState,
    ts: Float[Array, " k"] | None,
    end: Finish,
    ts_rows: Array | None,
    step_rows: tuple[Array, Array] | None,
) -> tuple[Array, PyTree]:
    """Rows in the order t0, ts, steps, t1; each part a (ts, ys) pair."""
    d = end.direction
    parts = []
    if o.t0:
        parts.append(_saved(o, end, d * end.t_start[None], end.y0[None]))
    if o.has_ts:
        assert ts is not None and ts_rows is not None and s.ts_index is not None
        tau = ts[:-1]
        # A solve stopped early (max_steps with throw=False) leaves its later rows unused:
        # inf, in ts as in ys.
        rows = jnp.arange(tau.shape[0], dtype=s.ts_index.dtype)
        times = jnp.where(rows < s.ts_index, d * tau, jnp.inf)
        parts.append(_before(end.cut, tau, *_saved(o, end, times, ts_rows[:-1])))
    if o.every:
        assert step_rows is not None
        parts.append(_steps(layout, o, s, end, step_rows))
    if o.t1 and not o.every:
        final = _saved(o, end, d * end.t[None], end.y[None])
        parts.append(_after_saved(parts.pop(), final) if o.has_ts else final)
    ts_out = jnp.concatenate([p[0] for p in parts])
    ys_out = jtu.tree_map(lambda *leaves: jnp.concatenate(leaves), *[p[1] for p in parts])
    return ts_out, ys_out


def _saved(o: Output, end: Finish, t: Array, flat_rows: Array) -> tuple[Array, Any]:
    ys = end.spec.unravel_rows(flat_rows)
    if o.fn is not save_y:
        ys = jax.vmap(lambda t_, y_: o.fn(t_, y_, end.args))(t, ys)
    return t, ys


def _after_saved(saved: tuple[Array, PyTree], final: tuple[Array, PyTree]) -> tuple[Array, PyTree]:
    """The save times' rows with the final row right after those reached, as Diffrax
    writes them: a solve stopped early (an event, or max_steps with throw=False) leaves
    its unreached rows after the final one, so `ys[n - 1]`, n the finite times, is where
    it stopped."""
    ts, ys = saved
    reached = jnp.sum(jnp.isfinite(ts), dtype=jnp.int32)
    grow = lambda rows: jnp.concatenate([rows, jnp.full_like(rows[:1], jnp.inf)])
    place = lambda rows, row: grow(rows).at[reached].set(row[0])
    return place(ts, final[0]), jtu.tree_map(place, ys, final[1])


def _before(
    cut: Array | None, tau: Float[Array, " k"], ts: Float[Array, " k"], ys: PyTree
) -> tuple[Array, PyTree]:
    """Save times after an event (tau > cut) were not reached: inf, as unused rows."""
    if cut is None:
        return ts, ys
    valid = tau <= cut
    ts = jnp.where(valid, ts, jnp.inf)
    mask = lambda y: jnp.where(valid.reshape(valid.shape + (1,) * (y.ndim - 1)), y, jnp.inf)
    return ts, jtu.tree_map(mask, ys)


def _steps(
    layout: Layout, o: Output, s: OutputState, end: Finish, rows: tuple[Array, Array]
) -> tuple[Array, PyTree]:
    """Rows saved every `every` accepted steps. As in Diffrax, t1 is saved as one more
    row when the last step was not saved, and the output has max_steps // every rows (one
    more if that does not divide max_steps). After an event (`cut`), the step that
    crossed it ends later: its row is replaced by the event's."""
    t_rows, y_rows = rows
    count = s.steps_row
    assert count is not None
    dropped = jnp.asarray(False)
    if end.cut is not None:
        last = jnp.maximum(count - 1, 0)
        dropped = (count > 0) & (end.direction * t_rows[last] > end.cut)
        count = count - dropped.astype(jnp.int32)
    if o.t1 or end.cut is not None:
        missing = ((end.accepted % o.every != 0) & o.t1) | dropped
        t_final = end.direction * end.t
        saved = o.fn(t_final, end.spec.unravel(end.y), end.args)
        row = jnp.where(missing, count, t_rows.shape[0] - 1)
        t_rows = t_rows.at[row].set(t_final)
        y_rows = y_rows.at[row].set(o.spec.ravel(saved))
        count = count + missing.astype(jnp.int32)
    size = layout.rows // o.every
    if o.t1 and layout.rows % o.every:
        size += 1
    valid = jnp.arange(size, dtype=jnp.int32) < count
    ts = jnp.where(valid, t_rows[:size], jnp.inf)
    ys = jnp.where(valid[:, None], y_rows[:size], jnp.inf)
    return ts, o.spec.unravel_rows(ys)


def _dense(state: SaveState, end: Finish, rows: tuple, table: tuple) -> DenseInterpolation:
    t_start, t_end, y_rows, stage_rows = rows
    count = state.dense_row
    assert count is not None
    # No step (t0 == t1): the interpolant is the point y0, a row of zero length.
    empty = count == 0
    t_start = t_start.at[0].set(jnp.where(empty, end.t_start, t_start[0]))
    t_end = t_end.at[0].set(jnp.where(empty, end.t_start, t_end[0]))
    y_rows = y_rows.at[0].set(jnp.where(empty, end.y0, y_rows[0]))
    stage_rows = stage_rows.at[0].set(jnp.where(empty, 0, stage_rows[0]))
    count = jnp.maximum(count, 1)
    t_end = jnp.where(jnp.arange(t_end.shape[0], dtype=count.dtype) < count, t_end, jnp.inf)
    steps = StepRows(t_start, t_end, y_rows, stage_rows, count)
    d = end.direction
    return DenseInterpolation(steps, table, end.spec, d, d * end.t_start, d * end.t)
