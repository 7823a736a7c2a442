"""Reversing taped ticks: a step's VJP is its stored linearisation transposed, with no
evaluation of the step; an emit's is taken from the carry stored before it."""

from collections.abc import Iterable

import equinox as eqx
import jax.numpy as jnp
import jax.tree_util as jtu
from jax import lax
from jaxtyping import Array, Bool, Int, PyTree

from ._lockstep import lockstep_while, tree_where
from ._loop import Buffers, emit_fn
from ._packing import Rows
from ._residuals import Layout, TapeRows
from ._sweep import Cotangents, Run
from ._tick_vjp import (
    accumulate,
    add,
    emit_vjp,
    read_leaves,
    reads_params,
    step_fn,
    where_or_zero,
)
from ._ticks import Ticks, run_ticks

Scalar = Int[Array, ""]
# (tick, cotangent of the carry after it) and (parameters' cotangent, output buffers').
_Small = tuple[Scalar, PyTree]
_Large = tuple[PyTree, Buffers]


def reverse_tape(
    run: Run,
    tape: Rows,
    rows: tuple[Layout, TapeRows],
    span: tuple[Scalar, Scalar],
    start: Cotangents,
    ct_buffers: Buffers,
) -> tuple[Cotangents, Buffers]:
    """Ticks `span` = (first, last) are on `tape`, tick k at row k - first: reverse them
    tick by tick, no recomputation. `start` holds the cotangents (of the carry after
    `last`, of the parameters so far) to begin from; where last < first no tick runs and
    they come back unchanged. Returns those of (the carry before `first`, the
    parameters) and what is left of the output cotangents.

    `rows`: (layout, `TapeRows`) of the rows, which hold each step's residuals (taping;
    online slots, beside the state, when they never had to thin): a step's VJP is its
    stored pullback applied, with no evaluation of the step.

    Organised by steps rather than by emits (see `_ticks`) so that under `vmap`, where
    the samples move in lockstep, the expensive tick (a step's VJP) runs once per step
    of the slowest sample, not once per tick of any kind."""
    reversal = _TapeReversal(run, tape, rows, span[0])
    # Traced once here, not at every tick's trace. (Batched, steps are not run in runs,
    # and the step is not traced again to find the live leaves.)
    live = () if run.batched else reversal.live_leaves()
    reversal = _TapeReversal(run, tape, rows, span[0], reversal.emit_reads_params(), live)
    ct_final, ct_params = start
    # Unbatched, `pending` is read only after a run of steps (`steps` runs them), where
    # an emit is due exactly while ticks are left: no need to read the tape (a kernel of
    # its own, which XLA:CPU would run beside others).
    unbatched_pending = lambda s: s[0] >= reversal.lo
    ticks = Ticks(
        going=lambda s: s[0] >= reversal.lo,
        pending=(lambda s: reversal.is_emit(s[0])) if run.batched else unbatched_pending,
        step=reversal.step,
        emit=reversal.emit,
        steps=None if run.batched else reversal.steps,
    )
    small = (span[1], ct_final)
    (_, ct_init), ct_params, ct_buffers = run_ticks(
        ticks, small, ct_params, ct_buffers, run.batched
    )
    return (ct_init, ct_params), ct_buffers


class _TapeReversal(eqx.Module):
    """The ticks of a taped span, reversed: tick k's row is k - lo."""

    run: Run
    tape: Rows
    rows: tuple[Layout, TapeRows]
    lo: Scalar
    emit_reads: bool = False  # whether an emit reads a differentiated parameter
    live: tuple[bool, ...] = ()  # see `live_leaves`

    def carry_at(self, k: Scalar) -> PyTree:
        return self.rows[1].carry(self.tape, k - self.lo)

    def is_carry(self, k: Scalar) -> Bool[Array, ""]:
        if self.rows[1].combined:  # a state in every row: the tick's kind is read from it
            return self.run.loop.pending(self.carry_at(k))
        return self.rows[1].is_carry(self.tape, k - self.lo)

    def is_emit(self, k: Scalar) -> Bool[Array, ""]:
        return (k >= self.lo) & self.is_carry(jnp.maximum(k, self.lo))

    def is_step(self, k: Scalar) -> Bool[Array, ""]:
        return (k >= self.lo) & ~self.is_carry(jnp.maximum(k, self.lo))

    def step_vjp(self, k: Scalar, ct_carry: PyTree) -> Cotangents:
        layout, taped = self.rows
        dp, dc = layout.vjp(taped.residuals(self.tape, k - self.lo), self.run.params)(ct_carry)
        return dc, dp

    def split_params(self) -> tuple[PyTree, PyTree]:
        return eqx.partition(self.run.params, self.run.diff)

    def emit_reads_params(self) -> bool:
        params_f, params_s = self.split_params()
        example_f, example_s = self.run.loop.split(self.carry_at(self.lo))
        return reads_params(emit_fn(self.run.loop, params_s, example_s), params_f, example_f)

    def emit_tick(
        self, small: _Small, large: _Large, active: Bool[Array, ""]
    ) -> tuple[_Small, _Large]:
        """One emit reversed; where not `active`, nothing changes."""
        k, ct_carry = small
        ct_params, ct_bufs = large
        params_f, params_s = self.split_params()
        carry_f, carry_s = self.run.loop.split(self.carry_at(k))
        emit = emit_fn(self.run.loop, params_s, carry_s)
        wrt_params = self.emit_reads
        dp, dc, ct_bufs = emit_vjp(
            self.run.loop, emit, params_f, carry_f, ct_carry, ct_bufs, active, wrt_params
        )
        if wrt_params:
            ct_params = accumulate(active, ct_params, dp, params_f)
        small = (k - active.astype(jnp.int32), tree_where(active, dc, ct_carry))
        return small, (ct_params, ct_bufs)

    def known_active_emit(self, small: _Small, large: _Large) -> tuple[_Small, _Large]:
        """An emit known to be active: no masking, and the cotangents it leaves alone are
        passed through rather than selected (a `cond` then forwards them)."""
        k, ct_carry = small
        ct_params, ct_bufs = large
        params_f, params_s = self.split_params()
        carry_f, carry_s = self.run.loop.split(self.carry_at(k))
        emit = emit_fn(self.run.loop, params_s, carry_s)
        dp, dc, ct_bufs = emit_vjp(
            self.run.loop, emit, params_f, carry_f, ct_carry, ct_bufs, True, self.emit_reads
        )
        if self.emit_reads:
            ct_params = add(ct_params, dp)
        return (k - 1, dc), (ct_params, ct_bufs)

    def emit(self, small: _Small, large: _Large, active: Bool[Array, ""]) -> tuple[_Small, _Large]:
        if self.run.batched:
            return self.emit_tick(small, large, active)
        # Unbatched, the emit after the last run of steps is not due: skip its VJP. Inside
        # the branch the emit is known to be active (nothing to mask).
        return lax.cond(
            active,
            lambda s, b: self.known_active_emit(s, b),
            lambda s, b: (s, b),
            small,
            large,
        )

    def step(
        self, small: _Small, ct_params: PyTree, stepping: Bool[Array, ""]
    ) -> tuple[_Small, PyTree]:
        """Batched: one step's VJP, run only when some sample steps."""
        k, ct_carry = small

        def vjp() -> tuple[PyTree, PyTree]:
            dc, dp = self.step_vjp(jnp.maximum(k, self.lo), ct_carry)
            # Added inside the branch: the parameters' cotangent (one per sample under
            # `vmap`, a batch of weight-sized arrays) is then written once per step.
            return tree_where(stepping, dc, ct_carry), add(ct_params, where_or_zero(stepping, dp))

        kept = lambda: (ct_carry, ct_params)
        ct_carry, ct_params = self.run.loop.if_stepping(stepping, vjp, kept)
        return (k - stepping.astype(jnp.int32), ct_carry), ct_params

    def live_leaves(self) -> tuple[bool, ...]:
        """Carry leaves a step reads: only their cotangents change along a run of steps.
        The others' (an interpolation row, which only an emit reads) enter the run's
        first step and are zero after it; carrying them through the run would rewrite
        them with zeros every step, which XLA does with a copy per leaf."""
        params_f, params_s = self.split_params()
        example_f, example_s = self.run.loop.split(self.carry_at(self.lo))
        return read_leaves(step_fn(self.run.loop, params_s, example_s), params_f, example_f)[1]

    def steps(self, small: _Small, ct_params: PyTree) -> tuple[_Small, PyTree]:
        """Unbatched: the run of steps before an emit in a tight inner loop that carries
        only the live cotangents."""
        first, ct_carry = small
        live = self.live
        ct_live = lambda ct: tuple(c for c, r in zip(jtu.tree_leaves(ct), live) if r)

        def with_live(ct: PyTree, values: Iterable[Array]) -> PyTree:
            leaves, treedef = jtu.tree_flatten(ct)
            values = iter(values)
            return jtu.tree_unflatten(
                treedef, [next(values) if r else c for c, r in zip(leaves, live)]
            )

        def one_step(
            k: Scalar, values: tuple[Array, ...], ct_params: PyTree
        ) -> tuple[tuple[Scalar, tuple[Array, ...]], PyTree]:
            zero_unless_first = lambda c: jnp.where(k == first, c, jnp.zeros_like(c))
            dc, dp = self.step_vjp(k, with_live(jtu.tree_map(zero_unless_first, ct_carry), values))
            return (k - 1, ct_live(dc)), add(ct_params, dp)

        (k, values), ct_params = lockstep_while(
            lambda s, p: self.is_step(s[0]),
            lambda s, p, a: one_step(*s, p),
            (first, ct_live(ct_carry)),
            ct_params,
            False,
        )
        stepped = lambda c: jnp.where(k < first, jnp.zeros_like(c), c)
        return (k, with_live(jtu.tree_map(stepped, ct_carry), values)), ct_params
