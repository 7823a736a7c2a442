"""The scalars of the carry before a fixed step, rebuilt from the carry after it, so that
`ReversibleAdjoint` keeps nothing for a step (see `adjoints.Reversal.rewind`).

`ConstantStepSize` counts its steps, and the step counted k ends at
t0 + (t1 - t0) (k + 1) / n: every time of the carry before a step follows from the count
after it, by the formulas the forward loop used, so the rebuilt times are the same
floats. The counters go back by one; the result was successful (the loop steps only
then); the marks a step sets for output (`steps_due`, `dense_due`) were clear (a step is
taken only when no output is due).

Adaptive steps cannot be rewound: a step's size was chosen from the error estimate of
the step before, which is rebuilt only once this step is undone. Nor are steps that an
event watches (its progress holds values of the state), that a progress meter reports,
or of a solver that keeps part of its state (`kept`): those loops keep every step's
scalars.
"""

import dataclasses

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Int

from . import _step
from ._config import Config, Params
from ._controller.constant import ConstantStepSize
from ._results import RESULTS
from ._saving import SaveState
from ._solver._base import AbstractReversibleSolver


def rewinds(
    config: Config, solver: AbstractReversibleSolver, params: Params, after: _step.State
) -> bool:
    """Whether the carry before a step can be rebuilt from the one after it (static)."""
    return (
        type(params.controller) is ConstantStepSize
        and config.event is None
        and not config.jumps
        and after.meter_last is None
        and solver.kept(after.solver_state) is None
    )


def rewind(
    config: Config, solver: AbstractReversibleSolver, params: Params, after: _step.State
) -> _step.State | None:
    """What `keep` keeps of the carry before the step that gave `after` (of `solver`),
    or None where `rewinds` is False."""
    if not rewinds(config, solver, params, after):
        return None
    state = after.controller_state
    count = state[0]
    row = None
    if config.carries_row:  # the interpolant before the step starts a step earlier
        row = (_start_of(params, state, count - 2), None, None)
    return dataclasses.replace(
        after,
        t=_start_of(params, state, count - 1),
        t_next=after.t,
        y=None,
        solver_state=None,
        controller_state=(count - 1, *state[1:]),
        num_steps=after.num_steps - 1,
        num_accepted=after.num_accepted - 1,
        result=jnp.full_like(after.result, RESULTS.successful.value),
        row=row,
        saving=_before_step(after.saving),
    )


def _start_of(params: Params, state: tuple, k: Int[Array, ""]) -> Array:
    """Where the step counted k starts: t_start for k <= 0, else where the loop placed
    the end of step k - 1 (`clipped_to_end` from the start of the step before it)."""
    # The controller's own formula, so that the rebuilt times are the same floats.
    end_of = ConstantStepSize._end_of
    start = jnp.where(k >= 2, end_of(jnp.maximum(k - 1, 0), state), params.t_start)
    placed = _step.clipped_to_end(params, start, end_of(jnp.maximum(k, 0), state))
    return jnp.where(k >= 1, placed, params.t_start)


def _before_step(saving: SaveState) -> SaveState:
    """Output progress before a step: the marks it sets were clear."""
    outputs = tuple(
        s
        if s.steps_due is None
        else eqx.tree_at(lambda s: s.steps_due, s, jnp.zeros_like(s.steps_due))
        for s in saving.outputs
    )
    dense_due = None if saving.dense_due is None else jnp.zeros_like(saving.dense_due)
    return SaveState(outputs, dense_due, saving.dense_row)
