"""The loop the solver hands to an adjoint, and its plain (forward-only) evaluation.

A `Loop` interleaves two kinds of *tick* on a small carry:

    while cond(params, carry) or pending(carry):
        if pending(carry): carry, writes = emit(params, carry); store writes
        else:              carry = body(params, carry)        # one solver step

`params` are the loop's inputs that never change (the closure-converted vector field, `args`,
save times); `carry` is the small state that does. Outputs produced piece by piece go into
*buffers*: `emit` returns one `Write(row, value)` per buffer, and the loop stores `value` at
`row`. A later write to the same row replaces an earlier one, so `emit` may write a scratch
row and only advance a row index when it means to keep the row. Buffers never enter the
carry, so they never enter a checkpoint.

Why emitting is separate from stepping: on XLA:CPU a loop body that touches large arrays is
several times slower per iteration than one that only does small elementwise work. So
`run_plain` runs steps in an inner `while_loop` whose carry is small and leaves it only to
emit (the structure that makes `jax.experimental.ode.odeint` fast), instead of paying for
output bookkeeping on every step.
"""

from collections.abc import Callable
from typing import Any, TypeVar

import equinox as eqx
import jax.numpy as jnp
import jax.tree_util as jtu
from jax import lax
from jaxtyping import Array, ArrayLike, Bool, Int, PyTree

from ._lockstep import if_any, tree_where, where_any
from ._packing import is_float
from ._rows import write_row
from ._ticks import Ticks, run_ticks

T = TypeVar("T")  # a PyTree


class Write(eqx.Module):
    """Store `value` (a PyTree matching one row of a buffer) at `row` (int scalar); or,
    for a vector `row`, a block of rows, one of `value`'s in each."""

    row: Int[ArrayLike, ""] | Int[ArrayLike, " block"]
    value: PyTree


Buffers = tuple[PyTree, ...]  # a loop's output buffers, each with a scratch last row
Plain = tuple[PyTree, Buffers]  # (carry, buffers): what running a loop gives


class StepMemo:
    """What tracing a loop's step found, kept as long as the loop: one solve. Choosing a
    schedule, the forward sweep and the reverse sweep each need the layout of a step's
    linearisation (`_residuals.layout_of`), and tracing a step is the dearest part of
    compiling a gradient.

    Hashed and compared by identity (a static field must be hashable): a loop rebuilt from
    its treedef, as the custom VJP's forward and backward passes rebuild it, shares it."""

    def __init__(self) -> None:
        # (signature of the step's inputs, what was found: a `_residuals.Layout`); searched
        # by equality, as a signature may hold unhashable static leaves.
        self.found: list[tuple[tuple[Any, ...], object]] = []

    def get(self, key: tuple[Any, ...]) -> object | None:
        """What was found for inputs of signature `key`, or None."""
        return next((value for known, value in self.found if known == key), None)

    def put(self, key: tuple[Any, ...], value: object) -> None:
        self.found.append((key, value))


class Reversal(eqx.Module):
    """How a loop runs backwards, for a loop whose steps can be undone (a reversible
    solver): the reverse sweep rebuilds each carry from the one after it instead of
    storing it.

    - `keep(carry) -> small`: the part of a carry kept for every tick, with the large
      parts (the state vectors) left out: times, step sizes, counters, controller and
      output progress.
    - `restore(after, small) -> carry`: `small` with the large parts of `after`. An emit
      changes no large part, so this is the carry before an emit from the carry after
      it and what `keep` kept of the carry before it.
    - `undo(params, after, small, spare) -> (before, spare)`: likewise the carry before
      a step, its large parts rebuilt by undoing the step. `spare` is what the undo that
      rebuilt `after` learnt of the step before it (where rebuilding a carry undoes that
      step too), passed on so that no step is undone twice; `start(params, final)` gives
      it for the final carry (None: nothing is passed on).
    - `rewind(params, after) -> small`: what `keep` kept of the carry before a step,
      rebuilt from the carry after it, so that nothing is kept for a step; None where
      the loop cannot (decided when traced: adaptive steps must be kept).
    - `unstable`: the message of the error raised when the rebuilt initial carry is not
      the initial carry (to sqrt of the float type's resolution, relative): undoing the
      ticks amplified rounding errors, and the gradient would be wrong.
    """

    keep: Callable[[PyTree], PyTree] = eqx.field(static=True)
    restore: Callable[[PyTree, PyTree], PyTree] = eqx.field(static=True)
    undo: Callable[[PyTree, PyTree, PyTree, PyTree], tuple[PyTree, PyTree]] = eqx.field(static=True)
    unstable: str = eqx.field(static=True, default="undoing the loop's ticks was unstable")
    start: Callable[[PyTree, PyTree], PyTree] = eqx.field(static=True, default=lambda p, c: None)
    rewind: Callable[[PyTree, PyTree], PyTree] = eqx.field(static=True, default=lambda p, c: None)


class Loop(eqx.Module):
    """What a solver hands to an adjoint.

    - `cond(params, carry) -> bool scalar`: whether to take another step.
    - `body(params, carry) -> carry`: one step.
    - `pending(carry) -> bool scalar`: whether there is output to emit before stepping on.
    - `emit(params, carry) -> (carry, writes)`: one piece of output, one `Write` per
      buffer; called while `pending`. Called when not pending it must change nothing that
      is kept (it may write scratch rows): reverse mode evaluates both branches.
    - `max_steps`: bound on the number of steps, or None.
    - `max_emits`: bound on the number of emit ticks (0: `pending` is never true, and
      ticks are steps without a branch).
    - `decision(before, after) -> PyTree`, `obey(carry, decision, held) -> carry`,
      `replay(carry, decision, held) -> carry`: what steers the loop (an adaptive step's
      verdict and the next step's size), and how to impose it where `held` (else leave
      the loop to decide): `obey` before a tick (the verdict, inside what is
      differentiated), `replay` after it (the step size, outside it). Reverse mode
      records the decisions on the first sweep and imposes them when recomputing: they
      compare quantities such as an error estimate, a difference of nearly equal
      numbers, so a recomputation compiled differently (one fused multiply-add more or
      less) would otherwise choose step sizes differing in the 9th digit, or in float32
      now and then reverse a verdict, and the gradient would be that of another
      discretisation. A decision's boolean leaves are what `obey` imposes (kept for
      every tick, a bit each), its other leaves what `replay` imposes (kept for the
      ticks a schedule plans to recompute; see `_decisions`). None: the loop recomputes
      bit for bit (fixed steps).
    - `num_steps`: the exact number of steps when it is known at trace time (fixed step
      sizes with static times), else None; offline schedules need it.
    - `batch_size`: how many loops run together under `vmap` (see `_batching`): they run
      in lockstep and share a memory budget. It changes how the work is scheduled, never
      what is computed.
    - `reversal`: how to undo ticks (see `Reversal`), or None; only `ReversibleAdjoint`
      needs it.
    - `fixed_times`, `times_of`: the same loop with no derivative through the times of
      its ticks, and `times_of(params, carry) -> PyTree` the leaves of a params-shaped
      and a carry-shaped tree that place those times. Reverse mode differentiates
      `fixed_times` when none of those leaves is differentiated: the time cotangents
      it leaves out would all be dropped (None: always this loop).
    - `constant(tree) -> PyTree[bool]`: for a carry-shaped `tree` (None where it has no
      leaf), which of its leaves never carry a derivative in this loop, though floats
      (times placed by nothing differentiated, as in `fixed_times`). Reverse mode
      treats them as constants, and computes and carries no cotangent for them.
      None: every float leaf carries one.
    - `writes_once`: each row of a buffer but its scratch row is written at most once,
      and the scratch row is never read as output (its cotangent is zero). Reverse mode
      then reads a write's cotangent without clearing its row for the earlier writes it
      would have overwritten: under `vmap` the clearing is a scatter into the whole
      cotangent buffer on every emit, which XLA:CPU follows with two copies of it.
    - `step_ignores(carry) -> PyTree[bool]`: for a carry, which of its leaves a step
      never reads (it writes them afresh: an interpolant of the step before, which only
      emits read). A state stored before a step leaves them out, so that more states fit
      a budget. None: a step reads every leaf.
    - `memo`: what tracing the loop's step found (see `StepMemo`); made with the loop,
      never passed.
    """

    cond: Callable[[PyTree, PyTree], Bool[Array, ""]] = eqx.field(static=True)
    body: Callable[[PyTree, PyTree], PyTree] = eqx.field(static=True)
    pending: Callable[[PyTree], Bool[Array, ""]] = eqx.field(static=True)
    emit: Callable[[PyTree, PyTree], tuple[PyTree, tuple[Write, ...]]] = eqx.field(static=True)
    max_steps: int | None = eqx.field(static=True, default=None)
    max_emits: int = eqx.field(static=True, default=0)
    decision: Callable[[PyTree, PyTree], PyTree] | None = eqx.field(static=True, default=None)
    obey: Callable[[PyTree, PyTree, Bool[Array, ""]], PyTree] | None = eqx.field(
        static=True, default=None
    )
    replay: Callable[[PyTree, PyTree, Bool[Array, ""]], PyTree] | None = eqx.field(
        static=True, default=None
    )
    num_steps: int | None = eqx.field(static=True, default=None)
    batch_size: int = eqx.field(static=True, default=1)
    reversal: Reversal | None = eqx.field(static=True, default=None)
    fixed_times: "Loop | None" = eqx.field(static=True, default=None)
    times_of: Callable[[PyTree, PyTree], PyTree] | None = eqx.field(static=True, default=None)
    constant: Callable[[PyTree], PyTree] | None = eqx.field(static=True, default=None)
    writes_once: bool = eqx.field(static=True, default=False)
    step_ignores: Callable[[PyTree], PyTree] | None = eqx.field(static=True, default=None)
    memo: StepMemo = eqx.field(static=True, init=False, default_factory=StepMemo, repr=False)

    @property
    def steps_every_round(self) -> bool:
        """Whether every round of a lockstep sweep steps some sample: with no emits, a
        round runs only while some sample is going, and its tick is a step."""
        return self.max_emits == 0

    def if_stepping(
        self, stepping: Bool[Array, ""], fn: Callable[[], T], otherwise: Callable[[], T]
    ) -> T:
        """A lockstep round's step: `fn()` where `stepping`, else `otherwise()` (see
        `if_any`), with no branch when every round steps some sample."""
        return if_any(stepping, fn, otherwise, self.steps_every_round)

    def going(self, params: PyTree, carry: PyTree) -> Bool[Array, ""]:
        return self.cond(params, carry) | self.pending(carry)

    def split(self, tree: PyTree) -> tuple[PyTree, PyTree]:
        """(the leaves of a carry-shaped `tree` that reverse mode differentiates: its
        float leaves but those `constant` marks; the others), each with None in the
        other's places."""
        if self.constant is None:
            return eqx.partition(tree, is_float)
        is_none = lambda x: x is None
        marked = self.constant(tree)
        keep = jtu.tree_map(lambda x, c: is_float(x) and not c, tree, marked, is_leaf=is_none)
        return eqx.partition(tree, keep, is_leaf=is_none)

    def tick(
        self, params: PyTree, carry: PyTree, scratch_writes: tuple[Write, ...]
    ) -> tuple[PyTree, tuple[Write, ...]]:
        """One emit or one step: the unit reverse mode differentiates. A step writes
        `scratch_writes` (rows that are dropped), so both branches have one structure."""
        if self.max_emits == 0:  # nothing is ever pending: no branch
            return self.body(params, carry), scratch_writes
        return lax.cond(
            self.pending(carry),
            lambda c: self.emit(params, c),
            lambda c: (self.body(params, c), scratch_writes),
            carry,
        )


# One emit as a function of the differentiated float inputs, (params, carry) -> ((float
# leaves of the new carry, written values), rows written); see `emit_fn`.
EmitOutput = tuple[tuple[PyTree, tuple[PyTree, ...]], tuple[Int[ArrayLike, ""], ...]]
EmitFn = Callable[[PyTree, PyTree], EmitOutput]


def emit_fn(loop: Loop, params_s: PyTree, carry_s: PyTree) -> EmitFn:
    """One emit of `loop` as a function of the differentiated float inputs (the others,
    `params_s` and `carry_s`, held): -> ((float leaves of the new carry, written values),
    rows written)."""

    def emit(pf: PyTree, cf: PyTree) -> EmitOutput:
        new, writes = loop.emit(eqx.combine(pf, params_s), eqx.combine(cf, carry_s))
        return (loop.split(new)[0], tuple(w.value for w in writes)), tuple(w.row for w in writes)

    return emit


def scratch_row(buffer: PyTree) -> int:
    """Index of a buffer's last row, the scratch row that dropped writes go to."""
    return jtu.tree_leaves(buffer)[0].shape[0] - 1


def apply_writes(
    buffers: Buffers,
    writes: tuple[Write, ...],
    active: Bool[ArrayLike, ""] = True,
    batched: bool = False,
) -> Buffers:
    """Store each write in its buffer; an inactive write (see `lockstep_while`) goes to
    the buffer's last row, a scratch row. `batched`: under `vmap` (see `_rows`)."""

    def put(buffer: PyTree, write: Write) -> PyTree:
        row = jnp.where(active, write.row, scratch_row(buffer))
        return jtu.tree_map(lambda b, v: write_row(b, row, v, 0, batched), buffer, write.value)

    return tuple(put(b, w) for b, w in zip(buffers, writes, strict=True))


def run_plain(loop: Loop, params: PyTree, init: PyTree, buffers: Buffers) -> Plain:
    """Run `loop` with `lax.while_loop`s: forward mode (jvp) works, reverse mode does not."""
    batched = loop.batch_size > 1

    def step(carry: PyTree, stored: tuple[()], active: Bool[Array, ""]) -> tuple[PyTree, tuple[()]]:
        if not batched:  # the inner loop runs only active steps
            return loop.body(params, carry), stored
        step = lambda: loop.body(params, carry)
        return where_any(active, step, carry, loop.steps_every_round), stored

    def emit(
        carry: PyTree, large: tuple[tuple[()], Buffers], active: Bool[Array, ""]
    ) -> tuple[PyTree, tuple[tuple[()], Buffers]]:
        new, writes = loop.emit(params, carry)
        if batched:
            return tree_where(active, new, carry), (
                large[0],
                apply_writes(large[1], writes, active, batched),
            )
        # Unbatched, an emit runs inactive only once the loop is over, and an emit that is
        # not due changes nothing that is kept and writes only scratch rows (see `Loop`):
        # no select.
        return new, (large[0], apply_writes(large[1], writes))

    ticks = Ticks(
        going=lambda c: loop.going(params, c),
        pending=loop.pending,
        step=step,
        emit=emit,
    )
    final, _, buffers = run_ticks(ticks, init, (), buffers, batched)
    return final, buffers
