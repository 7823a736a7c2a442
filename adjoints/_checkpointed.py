"""Reverse mode for a `Loop`: a custom VJP over the whole loop, with checkpoints.

Forward sweep (`_forward`): run the ticks, storing what the schedule says. Reverse sweep
(the schedule's `reverse`): for k = n-1, ..., 0, the VJP of tick k, from a taped row or
from a state stored before it and recomputed forwards. Cotangents reach the loop's `params`
(so a vector field's parameters and anything it closed over get gradients) and its
initial carry.

Buffer cotangents follow the overwrite semantics of `Loop`: the cotangent of a write is
what the output cotangent holds at its row, after which the row is zeroed, so an earlier
write to the same row (overwritten in the forward sweep) receives nothing.

Symbolic zeros: an output that was not differentiated arrives as `None` and becomes zeros;
integer and boolean leaves of the carry are never differentiated.

Under `vmap` both sweeps move the samples in lockstep, and every cotangent is one
sample's: `vmap`'s rule for custom VJPs sums a shared parameter's cotangents where the
composition asks for it (`grad(vmap(f))`), and keeps them apart where it does not
(`vmap(grad(f))`, `jax.jacrev`).
"""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jaxtyping import Array, PyTree

from ._forward import forward_sweep
from ._loop import Buffers, Loop, Plain, run_plain
from ._packing import is_float
from ._schedule import AbstractSchedule
from ._sweep import Backward, Run, Sweep, scratch_writes

# `choose(loop, init, params, diff, batch_size)`: the schedule for a differentiated loop.
ChooseSchedule = Callable[[Loop, PyTree, PyTree, PyTree[bool], int], AbstractSchedule]
# Which float leaves of (params, init) are differentiated.
Perturbed = tuple[PyTree[bool], PyTree[bool]]


class Checkpointing(eqx.Module):
    """How the custom VJP differentiates a loop: `choose` gives the schedule; each
    recomputing schedule keeps the step-size decisions of the first `decision_rows`
    ticks (see `Loop.decision`)."""

    choose: ChooseSchedule = eqx.field(static=True)
    decision_rows: int | None = eqx.field(static=True)

    def run(self, loop: Loop, perturbed: Perturbed, params: PyTree, init: PyTree) -> Run:
        """The differentiated run: its loop, parameters and what is differentiated."""
        loop = differentiated(loop, perturbed)
        diff = diff_of(perturbed, params)
        return Run(loop, params, diff, init, loop.batch_size > 1, self.decision_rows)


@eqx.filter_custom_vjp
def _differentiable_loop(
    params_and_init: tuple[PyTree, PyTree], buffers: Buffers, *, loop: Loop, how: Checkpointing
) -> Plain:
    params, init = params_and_init
    return run_plain(loop, params, init, buffers)


# The schedule is chosen here, not by the caller: sizing a tape by a step's residuals
# linearises the step (at trace time), which only a differentiated solve should do. The
# forward sweep hands it to the reverse sweep (a reverse sweep under `jax.jacrev` runs
# batched over cotangents after an unbatched forward sweep).
@_differentiable_loop.def_fwd
def _fwd(
    perturbed: Perturbed,
    params_and_init: tuple[PyTree, PyTree],
    buffers: Buffers,
    *,
    loop: Loop,
    how: Checkpointing,
) -> tuple[Plain, tuple[Sweep, AbstractSchedule]]:
    params, init = params_and_init
    run = how.run(loop, perturbed, params, init)
    schedule = how.choose(run.loop, init, params, run.diff, run.loop.batch_size)
    final, buffers, sweep = forward_sweep(run, schedule, buffers)
    return (final, buffers), (sweep, schedule)


@_differentiable_loop.def_bwd
def _bwd(
    residuals: tuple[Sweep, AbstractSchedule],
    grad_obj: tuple[PyTree, Buffers],
    perturbed: Perturbed,
    params_and_init: tuple[PyTree, PyTree],
    buffers: Buffers,
    *,
    loop: Loop,
    how: Checkpointing,
) -> tuple[PyTree, PyTree]:
    params, init = params_and_init
    sweep, schedule = residuals
    run = how.run(loop, perturbed, params, init)
    ct_final, ct_buffers = grad_obj
    ct_final = run.loop.split(materialise(ct_final, jax.eval_shape(lambda: init)))[0]
    ct_buffers = materialise(ct_buffers, jax.eval_shape(lambda: buffers))
    zero_params = jtu.tree_map(jnp.zeros_like, eqx.partition(params, run.diff)[0])
    # Shaped by the forward sweep's final carry, whose leaves are the arrays an emit reads.
    scratch = scratch_writes(run.loop, params, sweep.final, buffers)
    back = Backward(run, sweep, (ct_final, zero_params), ct_buffers, scratch)
    ct_init, ct_params = schedule.reverse(back)
    return ct_params, ct_init


def differentiated(loop: Loop, perturbed: Perturbed) -> Loop:
    """The loop whose ticks are differentiated: `loop.fixed_times` when nothing that
    places the tick times is (see `Loop`). Under `vmap`, times traced per sample but
    not differentiated (a latent ODE's save times) would otherwise give every emit and
    step a time cotangent that is computed, carried back, and dropped."""
    if loop.fixed_times is None or loop.times_of is None:
        return loop
    if any(jtu.tree_leaves(loop.times_of(*perturbed))):
        return loop
    return loop.fixed_times


def diff_of(perturbed: Perturbed, params: PyTree) -> PyTree[bool]:
    """Which parameter leaves are differentiated: a parameter that is not (save times, the
    controller's tolerances) would otherwise get a cotangent accumulated every step."""
    return jtu.tree_map(lambda p, x: bool(p) and is_float(x), perturbed[0], params)


def materialise(ct: PyTree, shapes: PyTree[jax.ShapeDtypeStruct]) -> PyTree:
    """Replace symbolic-zero (None) cotangents by zeros; non-float leaves stay None."""

    def one(c: Array | None, s: jax.ShapeDtypeStruct | None) -> Array | None:
        if s is None or not jnp.issubdtype(s.dtype, jnp.inexact):
            return None
        return jnp.zeros(s.shape, s.dtype) if c is None else c

    return jtu.tree_map(one, ct, shapes, is_leaf=lambda x: x is None)


def checkpointed_loop(
    loop: Loop, how: Checkpointing, params: PyTree, init: PyTree, buffers: Buffers
) -> Plain:
    """Run `loop` so that reverse mode differentiates it by the schedule that
    `how.choose(loop, init, params, diff, batch_size)` returns (called only when it is
    differentiated; `diff` says which parameter leaves are, `batch_size` how many samples
    a `vmap` runs together)."""
    return _differentiable_loop((params, init), buffers, loop=loop, how=how)
