"""The two orders in which a loop's ticks run, written once for every sweep.

A loop interleaves steps (costly, small carry) with emits (cheap, they write output).
Forwards and backwards, every sweep of this package runs them in one of two orders:

- unbatched, *steps then emit*: a run of steps in an inner loop whose carry holds no
  output buffers, then one emit. On XLA:CPU a loop body that touches large arrays is
  several times slower per iteration than one that only does small elementwise work, so
  the steps, which are many, stay out of the loop that carries the buffers.
- batched (under `vmap`), *emits then step*: the emits due, then one step. Samples emit
  at different ticks, so this order runs a step, the costly tick, once per step of the
  slowest sample, where the other would run one at every tick some sample steps.

Both run in lockstep (see `_lockstep`): the carry is split into a *small* part, which a
tick selects per sample, and a *large* part, written only through scratch rows where a
sample is not active. The large part is itself two: what steps write (`stored`: slots, a
tape, a parameter cotangent) and what only emits write (`buffers`: outputs or their
cotangents).
"""

from collections.abc import Callable
from typing import Generic, TypeVar

import equinox as eqx
from jaxtyping import Array, Bool

from ._lockstep import lockstep_while

Small = TypeVar("Small")  # a PyTree: selected per sample
Stored = TypeVar("Stored")  # a PyTree: what steps (and emits) write, through scratch rows
Buffers = TypeVar("Buffers")  # a PyTree: what only emits write, through scratch rows


class Ticks(eqx.Module, Generic[Small, Stored, Buffers]):
    """A loop's ticks, as `run_ticks` runs them. Each tick is given its sample's `active`
    and leaves that sample's small and large carry as they were where it is False.

    - `going(small)`: whether any tick is left.
    - `pending(small)`: whether the next tick is an emit (implies `going`).
    - `step(small, stored, active) -> (small, stored)`: one step.
    - `emit(small, (stored, buffers), active) -> (small, (stored, buffers))`: one emit.
    - `steps(small, stored) -> (small, stored)`: unbatched, the run of steps before the
      next emit (None: `step` after `step` in a `while_loop`), for a sweep that carries
      something else along such a run.
    """

    going: Callable[[Small], Bool[Array, ""]]
    pending: Callable[[Small], Bool[Array, ""]]
    step: Callable[[Small, Stored, Bool[Array, ""]], tuple[Small, Stored]]
    emit: Callable[
        [Small, tuple[Stored, Buffers], Bool[Array, ""]], tuple[Small, tuple[Stored, Buffers]]
    ]
    steps: Callable[[Small, Stored], tuple[Small, Stored]] | None = None

    def stepping(self, small: Small) -> Bool[Array, ""]:
        """Whether the next tick is a step."""
        return self.going(small) & ~self.pending(small)


def _run_of_steps(
    ticks: Ticks[Small, Stored, Buffers], small: Small, stored: Stored
) -> tuple[Small, Stored]:
    if ticks.steps is not None:
        return ticks.steps(small, stored)
    return lockstep_while(
        lambda s, st: ticks.stepping(s), lambda s, st, a: ticks.step(s, st, a), small, stored, False
    )


def _steps_then_emit(
    ticks: Ticks[Small, Stored, Buffers],
    small: Small,
    large: tuple[Stored, Buffers],
    active: Bool[Array, ""],
) -> tuple[Small, tuple[Stored, Buffers]]:
    """Unbatched: the steps before the next emit, then that emit (none when the loop is
    over: the emit is then inactive)."""
    stored, buffers = large
    small, stored = _run_of_steps(ticks, small, stored)
    return ticks.emit(small, (stored, buffers), ticks.pending(small) & active)


def _emits_then_step(
    ticks: Ticks[Small, Stored, Buffers],
    small: Small,
    large: tuple[Stored, Buffers],
    active: Bool[Array, ""],
) -> tuple[Small, tuple[Stored, Buffers]]:
    """Batched: the emits due, then one step. A sample inactive in the outer loop has
    nothing pending, so the inner loop's `active` implies the outer one."""
    small, (stored, buffers) = lockstep_while(
        lambda s, b: ticks.pending(s),
        lambda s, b, a: ticks.emit(s, b, a),
        small,
        large,
        True,
        body_keeps=True,
    )
    small, stored = ticks.step(small, stored, ticks.stepping(small) & active)
    return small, (stored, buffers)


def run_ticks(
    ticks: Ticks[Small, Stored, Buffers],
    small: Small,
    stored: Stored,
    buffers: Buffers,
    batched: bool,
) -> tuple[Small, Stored, Buffers]:
    """Run the ticks until none is left: steps then emit unbatched, emits then step
    batched (see above). Returns the final (small, stored, buffers)."""
    order = _emits_then_step if batched else _steps_then_emit
    # Fresh lambdas on every call: JAX caches control-flow bodies by hashing the callable,
    # and a callable that is (or closes over) an `eqx.Module` holding tracers is unhashable
    # since JAX 0.4.30 (jax-ml/jax#24722, equinox#768).
    small, (stored, buffers) = lockstep_while(
        lambda s, b: ticks.going(s),
        lambda s, b, a: order(ticks, s, b, a),
        small,
        (stored, buffers),
        batched,
        body_keeps=True,
    )
    return small, stored, buffers
