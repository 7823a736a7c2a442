"""How a solve's loop runs backwards, for `ReversibleAdjoint` (see `adjoints.Reversal`).

What is kept of each tick's carry is everything but the state vectors: times, step
sizes, counters, the controller's, the outputs' and the events' progress, and where the
last step's interpolant starts. The state vectors are rebuilt:

- an emit changes only output progress, so before it the vectors are those after it;
- an accepted step is undone by the solver (`AbstractReversibleSolver.retreat`); a
  rejected one changed no vector;
- the interpolant of the step before (`State.row`, which the emits between the two
  steps read) is rebuilt by undoing that step too, where the carry holds one. That
  gives the solver state before the step before, which is passed on to the next undo
  (its state vector is where the interpolant starts), so each step is undone once (but
  for a solver that keeps part of its state, `kept`: its steps are undone again).

With `ConstantStepSize` nothing is kept for a step: its scalars are rebuilt from the
carry after it (`_rewind`).
"""

import dataclasses

import jax.numpy as jnp
import jax.tree_util as jtu
from jax import lax
from jaxtyping import Array, PyTree

from adjoints import Reversal

from . import _rewind, _step
from ._config import Config, Params
from ._solver._base import AbstractReversibleSolver, RetreatInput


def check_reversible(config: Config) -> AbstractReversibleSolver:
    """The solver, if `ReversibleAdjoint` can undo its steps; else a clear error."""
    solver = config.solver
    if not isinstance(solver, AbstractReversibleSolver):
        raise ValueError(
            f"adjoint=ReversibleAdjoint() needs a solver whose steps can be undone, not "
            f"{type(solver).__name__}(): wrap it, solver=Reversible({type(solver).__name__}"
            "()), or use ReversibleHeun(), LeapfrogMidpoint() or SemiImplicitEuler()."
        )
    if config.jumps and not solver.reverses_jumps:
        raise ValueError(
            f"adjoint=ReversibleAdjoint() cannot undo {type(solver).__name__}'s steps across "
            "the jumps of the step-size controller (its jump_ts, or the made_jump that a "
            "controller written in Diffrax's interface may return); use "
            "solver=Reversible(Tsit5()), or another adjoint."
        )
    return solver


def reversal(config: Config) -> Reversal:
    """The loop's `Reversal` (see the module docstring)."""
    solver = check_reversible(config)

    def undo(
        params: Params, after: _step.State, kept: _step.State, spare: PyTree
    ) -> tuple[_step.State, PyTree]:
        if spare is None:
            return _undo_step(config, solver, params, after, kept), None
        return _undo_passed_on(config, solver, params, after, kept, spare)

    def start(params: Params, final: _step.State) -> PyTree:
        """What the undo of the last step is passed: the solver state where the final
        interpolant starts (None where undos pass nothing on)."""
        if not _passes_on(config, solver, final):
            return None
        row, y, z = final.row, final.y, final.solver_state
        return _previous_row(config, solver, params, row[0], final.t, y, z)[1]

    def rewind(params: Params, after: _step.State) -> _step.State | None:
        return _rewind.rewind(config, solver, params, after)

    def keep(state: _step.State) -> _step.State:
        """The carry without its state vectors (of the solver's state, what it asks to
        be kept); of the interpolation row, its start time."""
        row = None if state.row is None else (state.row[0], None, None)
        return dataclasses.replace(
            state, y=None, solver_state=solver.kept(state.solver_state), row=row
        )

    name = type(solver).__name__
    unstable = (
        f"ReversibleAdjoint: undoing the steps of {name} did not rebuild the initial state "
        "(relative error above sqrt of the float resolution): the backward recursion "
        "amplified rounding errors, so the gradient would be wrong. Each undone step "
        "multiplies errors by about 1/coupling: pass Reversible(solver, coupling=1.0) or "
        "a coupling nearer 1, take fewer steps, or use RecursiveCheckpointAdjoint()."
    )
    return Reversal(
        keep=keep, restore=_restore, undo=undo, unstable=unstable, start=start, rewind=rewind
    )


def _passes_on(config: Config, solver: AbstractReversibleSolver, carry: _step.State) -> bool:
    """Whether an undo passes on the solver state before the step before (static):
    where it rebuilds an interpolant, with a solver whose `retreat` gives the whole
    state without `kept`."""
    return config.carries_row and solver.kept(carry.solver_state) is None


def _restore(after: _step.State, kept: _step.State) -> _step.State:
    """What was kept, with the state vectors (and interpolation row) of `after`."""
    return dataclasses.replace(kept, y=after.y, solver_state=after.solver_state, row=after.row)


def _undo_step(
    config: Config,
    solver: AbstractReversibleSolver,
    params: Params,
    after: _step.State,
    kept: _step.State,
) -> _step.State:
    """The carry before a step, from the carry after it and what was kept of it."""
    t0, t1 = _step.times(config, kept.t, kept.t_next)
    y, z, _ = solver.retreat(
        RetreatInput(
            vf=params.vf,
            t0=t0,
            h=t1 - t0,
            y1=after.y,
            state1=after.solver_state,
            args=params.args,
            context=_step.step_context(config, params),
            kept=kept.solver_state,
        )
    )
    accepted = after.num_accepted > kept.num_accepted
    y, z = _tree_where(accepted, (y, z), (after.y, after.solver_state))
    row = None
    if config.carries_row:
        assert kept.row is not None  # kept whenever the carry has a row
        row = _previous_row(config, solver, params, kept.row[0], kept.t, y, z)[0]
    return dataclasses.replace(kept, y=y, solver_state=z, row=row)


def _undo_passed_on(
    config: Config,
    solver: AbstractReversibleSolver,
    params: Params,
    after: _step.State,
    kept: _step.State,
    spare: PyTree,
) -> tuple[_step.State, PyTree]:
    """`_undo_step` where the carry after the step holds the step's interpolant and
    `spare` is the solver state it started from: the state vector before the step is
    where the interpolant starts (a rejected step's too), so only the step before is
    undone, for its interpolant; the solver state that gives is passed on."""
    accepted = after.num_accepted > kept.num_accepted
    y = after.row[1]
    z = _tree_where(accepted, spare, after.solver_state)
    assert kept.row is not None  # kept whenever the carry has a row
    row, spare = _previous_row(config, solver, params, kept.row[0], kept.t, y, z)
    return dataclasses.replace(kept, y=y, solver_state=z, row=row), spare


def _previous_row(
    config: Config,
    solver: AbstractReversibleSolver,
    params: Params,
    t_prev: Array,
    t: Array,
    y: Array,
    z: PyTree,
) -> tuple[tuple, PyTree]:
    """The interpolant of the step that ended at (t, y, z) and started at `t_prev`,
    rebuilt by undoing it, and the solver state it started from (whole where the
    solver keeps nothing, `kept`). A step of no length (the loop's start, or a rejected
    step before) left the row of the loop's start (see `_step.empty_row`)."""
    t0, t1 = _step.times(config, t_prev, t)
    h = t1 - t0
    y0, z0, dense = solver.retreat(
        RetreatInput(
            vf=params.vf,
            t0=t0,
            h=h,
            y1=y,
            state1=z,
            args=params.args,
            context=_step.step_context(config, params),
        )
    )
    moved = h != 0
    y0 = jnp.where(moved, y0, y)
    # A row of no length is the loop's start, which a save time at t0 reads: its dense
    # vectors are each the slope there (see `_step.empty_row`), evaluated only for it.
    start = lambda: _step.empty_row(config, t0, y, params.vf(t0, y, params.args))[2]
    dense = lax.cond(moved, lambda: _step.carried_vectors(config, dense), start)
    return (t_prev, y0, dense), _tree_where(moved, z0, z)


def _tree_where(pred: Array, new: PyTree, old: PyTree) -> PyTree:
    return jtu.tree_map(lambda a, b: jnp.where(pred, a, b), new, old)
