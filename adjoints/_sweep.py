"""What the forward sweep of a checkpointed loop leaves for its reverse sweep, and the
helpers both sweeps use to store and restore loop states (packed rows, see `Packing`)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jaxtyping import Array, ArrayLike, Bool, Int, PyTree

from ._decisions import Record, empty_record
from ._lockstep import tree_where
from ._loop import Buffers, Loop, Write, scratch_row
from ._packing import Packing, Rows
from ._rows import read_row, write_row

# Cotangents of (a carry, the differentiated parameters).
Cotangents = tuple[PyTree, PyTree]
# What a schedule keeps on the way forward: (a part selected per sample, a part written
# only through scratch rows: slots, a tape, a decision record).
Kept = tuple[PyTree, PyTree]


class Run(eqx.Module):
    """One differentiated run of a loop, as both of its sweeps see it: the loop, its
    parameters (`diff`: which leaves are differentiated), its initial carry, whether it
    runs batched under `vmap`, and how many step-size decisions to record for replay
    (None: as the schedule plans, see `_decisions`)."""

    loop: Loop
    params: PyTree
    diff: PyTree[bool]
    init: PyTree
    batched: bool
    decision_rows: int | None = None

    @property
    def packing(self) -> Packing:
        """How a state of this loop is packed into a row."""
        return Packing.of(self.init)

    @property
    def step_packing(self) -> Packing:
        """How a state stored before a step is packed: without what a step never reads
        (see `Loop.step_ignores`)."""
        return packing_before_steps(self.loop, self.init)


def packing_before_steps(loop: Loop, carry: PyTree) -> Packing:
    """How a state of `loop` shaped as `carry` is packed when stored before a step:
    without the leaves a step never reads (see `Loop.step_ignores`)."""
    ignores = loop.step_ignores
    return Packing.of(carry, None if ignores is None else ignores(carry))


class Tick(eqx.Module):
    """A tick of the forward sweep: its number k and the carry before it."""

    k: Int[Array, ""]
    carry: PyTree

    def after(self, new: PyTree, active: Bool[ArrayLike, ""]) -> "Tick":
        """The next tick, from `new`, the carry after this one; unchanged where not
        `active`."""
        return Tick(
            self.k + jnp.asarray(active).astype(jnp.int32), tree_where(active, new, self.carry)
        )


class Sweep(eqx.Module):
    """What the forward sweep leaves for the reverse sweep: the ticks taken and what the
    schedule kept (see `AbstractSchedule`)."""

    n: Int[Array, ""]
    kept: Kept
    final: PyTree  # the carry after the last tick (undoing starts from it)


class Backward(eqx.Module):
    """What a schedule's reverse sweep starts from: the run, the forward sweep's record,
    the cotangents (of the final carry, of the differentiated parameters: zeros) and the
    output buffers' cotangents, and what a step tick writes (`scratch`, to scratch rows)."""

    run: Run
    sweep: Sweep
    start: Cotangents
    ct_buffers: Buffers
    scratch: tuple[Write, ...]


def scratch_writes(
    loop: Loop, params: PyTree, carry: PyTree, buffers: Buffers
) -> tuple[Write, ...]:
    """Zero writes to each buffer's last (scratch) row, shaped as an emit's writes (one
    row, or a block of rows): what a step tick writes."""
    if not buffers:
        return ()
    _, shapes = jax.eval_shape(lambda: loop.emit(params, carry))

    def one(buffer: PyTree, write: Write) -> Write:
        row = jnp.full(jnp.shape(write.row), scratch_row(buffer), jnp.int32)
        return Write(row, jtu.tree_map(lambda v: jnp.zeros(v.shape, v.dtype), write.value))

    return tuple(one(b, w) for b, w in zip(buffers, shapes, strict=True))


class UnboundedLoop(ValueError, RuntimeError):
    """Reverse mode asked of a loop with no bound on its steps (a `ValueError`, and the
    `RuntimeError` Diffrax raises for it)."""


def num_steps_bound(loop: Loop) -> int:
    """The most steps the loop can take: `max_steps`, or its exact number of steps where
    that is known and fewer (fixed steps: a tape, a record or a scan sized by
    `max_steps` would be mostly never used)."""
    known = [n for n in (loop.max_steps, loop.num_steps) if n is not None]
    if not known:
        raise UnboundedLoop(
            "reverse-mode differentiation needs a bound on the number of steps: pass an "
            "integer max_steps (or use adjoint=BacksolveAdjoint())."
        )
    return min(known)


def num_ticks_bound(loop: Loop) -> int:
    """The most ticks the loop can take: its steps and its emits."""
    return num_steps_bound(loop) + loop.max_emits


def decision_record(run: Run, planned: int | None = None) -> Record | None:
    """An empty record of the run's decisions (see `_decisions`); `planned`: the ticks
    the schedule plans to recompute, where fewer than the bound."""
    bound = num_ticks_bound(run.loop) if run.loop.decision is not None else 0
    return empty_record(run.loop, run.init, bound, run.decision_rows, planned)


def put_state(
    slots: Rows, i: Int[ArrayLike, ""], carry: PyTree, packing: Packing, batched: bool = False
) -> Rows:
    """Store a state in the first columns of row i (a row may hold more beside it);
    `batched`: under `vmap` (see `_rows`)."""
    floats, ints = packing.pack(carry)
    return write_row(slots[0], i, floats, 0, batched), write_row(slots[1], i, ints, 0, batched)


def get_state(
    slots: Rows, i: Int[ArrayLike, ""], packing: Packing, batched: bool = False
) -> PyTree:
    """The state stored in the first columns of row i."""
    f, n = packing.sizes()
    floats, ints = read_row(slots[0], i, 0, f, batched), read_row(slots[1], i, 0, n, batched)
    return packing.unpack((floats, ints))
