"""The record of a loop's decisions (see `Loop.decision`): what the forward sweep decided
at each tick, which a recomputing reverse sweep imposes so that it differentiates the
discretisation the forward sweep took.

A decision has two parts, kept at different cost:
- its boolean leaves (an adaptive step's verdict, imposed by `Loop.obey`), one bit a
  tick, for every tick up to `DECISION_ROWS`: a verdict reversed by rounding in a
  recomputation would differentiate another solution;
- its other leaves (where the next step ends, imposed by `Loop.replay`), for the ticks
  the schedule plans to recompute: made again, a step size differs from the first in its
  last digits only.

Under `vmap` a record of every tick of the bound for every sample was most of a small
state's memory (a Lorenz ensemble's gradient: 21 of 35 MB, and its time with it); the
bits of 4,096 ticks take 512 bytes a sample.
"""

import math
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jax import lax
from jaxtyping import Array, ArrayLike, Bool, Int, PyTree

from ._loop import Loop
from ._packing import tree_bytes
from ._rows import read_row, write_row

# Decisions kept for recomputation to impose, by default: those of the first 2**17 ticks,
# not one per tick of the bound, so that memory follows the steps a solve takes rather
# than `max_steps`; a step's end only for the ticks a schedule plans to recompute. A
# longer solve's later decisions are made again when recomputed, as the forward sweep
# made them (equal but for rounding in a differently compiled step).
DECISION_ROWS = 2**17
_BITS = 32  # verdicts packed in a word


class Record(eqx.Module):
    """A decision record: `verdicts`, the boolean leaves packed a bit a tick into words;
    `values`, the others, a row a tick. Tick k is at bit or row k + 1 (0 is written by
    inactive samples and never read); `verdict_rows` and `value_rows` count them."""

    verdicts: PyTree
    values: PyTree
    verdict_rows: int = eqx.field(static=True)
    value_rows: int = eqx.field(static=True)


# One tick's recorded decision, whether the record holds its verdicts and its values.
Recorded = tuple[PyTree, Bool[Array, ""], Bool[Array, ""]] | None


def _is_verdict(leaf: jax.ShapeDtypeStruct) -> bool:
    return leaf.dtype == jnp.bool_


def _split(decision: PyTree) -> tuple[PyTree, PyTree]:
    """(verdict leaves, other leaves): the decision with the other kind set to None."""
    keep = lambda verdict: lambda x: x if _is_verdict(x) == verdict else None
    return jtu.tree_map(keep(True), decision), jtu.tree_map(keep(False), decision)


def value_bytes(loop: Loop, init: PyTree) -> int:
    """Bytes of one tick's recorded values (its decision's leaves that are not verdicts):
    what the record adds for each tick a schedule plans to recompute."""
    if loop.decision is None:
        return 0
    return tree_bytes(_split(jax.eval_shape(loop.decision, init, init))[1])


def empty_record(
    loop: Loop, init: PyTree, bound: int, rows: int | None, planned: int | None
) -> Record | None:
    """An empty record, or None for a loop that makes no decisions. It holds the
    verdicts of the first `rows` ticks (of `DECISION_ROWS` by default) and the values of
    the first `rows` (of `planned` by default, the ticks a schedule plans to recompute
    where fewer than the bound), never more than the `bound`."""
    if loop.decision is None:
        return None
    shapes = jax.eval_shape(loop.decision, init, init)
    for leaf in jtu.tree_leaves(shapes):
        assert leaf.shape == () or not _is_verdict(leaf)  # a verdict is one flag
    verdicts, values = _split(shapes)
    planned = DECISION_ROWS if planned is None else min(planned, DECISION_ROWS)
    verdict_rows = min(bound, DECISION_ROWS if rows is None else rows) + 1
    value_rows = min(bound, planned if rows is None else rows) + 1
    words = math.ceil(verdict_rows / _BITS)
    return Record(
        jtu.tree_map(lambda _: jnp.zeros((words,), jnp.uint32), verdicts),
        jtu.tree_map(lambda s: jnp.zeros((value_rows, *s.shape), s.dtype), values),
        verdict_rows,
        value_rows,
    )


def _row(k: Int[Array, ""], rows: int, active: Bool[ArrayLike, ""]) -> Int[Array, ""]:
    return jnp.where(active & (k + 1 < rows), k + 1, 0)


def _set_bit(words: Array, row: Int[Array, ""], flag: Array) -> Array:
    # Added rather than read, changed and written back (one scatter, no gather): the
    # forward sweep sets each tick's bit once, from zero, and an inactive sample adds 0.
    word, bit = row // _BITS, (row % _BITS).astype(jnp.uint32)
    value = lax.shift_left((row > 0).astype(jnp.uint32) * flag.astype(jnp.uint32), bit)
    return words.at[word].add(value, mode="promise_in_bounds")


def _get_bit(words: Array, row: Int[Array, ""], batched: bool) -> Array:
    word, bit = row // _BITS, (row % _BITS).astype(jnp.uint32)
    return (lax.shift_right_logical(read_row(words, word, batched=batched), bit) & 1) == 1


def record(
    loop: Loop,
    decisions: Record | None,
    k: Int[Array, ""],
    before: PyTree,
    after: PyTree,
    active: Bool[ArrayLike, ""],
) -> Record | None:
    """Keep the decision of tick k (from carry `before` to `after`), where the record has
    room for it."""
    if decisions is None:
        return None
    assert loop.decision is not None  # only a loop with decisions records them
    batched = loop.batch_size > 1
    verdicts, values = _split(loop.decision(before, after))
    bit = _row(k, decisions.verdict_rows, active)
    row = _row(k, decisions.value_rows, active)
    return Record(
        jtu.tree_map(lambda w, v: _set_bit(w, bit, v), decisions.verdicts, verdicts),
        jtu.tree_map(lambda d, v: write_row(d, row, v, batched=batched), decisions.values, values),
        decisions.verdict_rows,
        decisions.value_rows,
    )


def recorded(loop: Loop, decisions: Record | None, k: Int[Array, ""]) -> Recorded:
    """The forward sweep's decision of tick k, read once for both sides of recomputing
    it, and whether the record holds its verdicts and its values (None: the loop records
    none)."""
    if decisions is None:
        return None
    batched = loop.batch_size > 1
    bit = jnp.minimum(k + 1, decisions.verdict_rows - 1)
    row = jnp.minimum(k + 1, decisions.value_rows - 1)
    verdicts = jtu.tree_map(lambda w: _get_bit(w, bit, batched), decisions.verdicts)
    values = jtu.tree_map(lambda d: read_row(d, row, batched=batched), decisions.values)
    merged = jtu.tree_map(
        lambda a, b: a if b is None else b, verdicts, values, is_leaf=lambda x: x is None
    )
    return merged, k + 1 < decisions.verdict_rows, k + 1 < decisions.value_rows


def obey(loop: Loop, recorded: Recorded, carry: PyTree) -> PyTree:
    """The carry before recomputing a tick, made to take the forward sweep's verdict
    where the record holds it."""
    return _impose(loop.obey, recorded, carry, 0)


def replay(loop: Loop, recorded: Recorded, carry: PyTree) -> PyTree:
    """The carry after recomputing a tick, with the forward sweep's step size put back
    where the record holds it."""
    return _impose(loop.replay, recorded, carry, 1)


def _impose(
    hook: Callable[[PyTree, PyTree, Bool[Array, ""]], PyTree] | None,
    recorded: Recorded,
    carry: PyTree,
    part: int,
) -> PyTree:
    """`hook(carry, decision, held)`, `held` saying whether the record holds the
    decision's verdicts (`part` 0) or its values (1)."""
    if recorded is None:
        return carry
    assert hook is not None  # a loop that records decisions imposes them
    decision, *held = recorded
    return hook(carry, decision, held[part])
