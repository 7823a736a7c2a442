"""Resuming a solve where another ended, as Diffrax does it.

A long solve may be split: the first part saves its loop state
(`SaveAt(t1=True, solver_state=True, controller_state=True, made_jump=True)`), and the
next starts from it, `diffeqsolve(..., t0=sol.ts[-1], y0=sol.ys[-1],
solver_state=sol.solver_state, controller_state=sol.controller_state,
made_jump=sol.made_jump)`. The solver then carries on with what it knew (a first-same-
as-last derivative, a reversible method's second state) and the controller with its
error history, instead of starting afresh. The passed states replace the fresh ones in
the loop's first carry, so every adjoint differentiates through them as through any
part of the carry.
"""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jaxtyping import Array, Bool

from adjoints import is_concrete

from ._checks import is_boolean_scalar
from ._flat import PyTree
from ._step import State


class Resume(eqx.Module):
    """The states a solve starts from (None: the fresh one)."""

    solver_state: PyTree
    controller_state: PyTree
    made_jump: Bool[Array, ""] | bool | None


def resume_from(solver_state: PyTree, controller_state: PyTree, made_jump: Any) -> Resume | None:
    """`Resume` of `diffeqsolve`'s arguments, or None when none was passed."""
    if solver_state is None and controller_state is None and made_jump is None:
        return None
    if made_jump is not None:
        _check_made_jump(made_jump)
    return Resume(solver_state, controller_state, made_jump)


def _check_made_jump(made_jump: Any) -> None:
    """`made_jump` is a boolean scalar (as `sol.made_jump` is)."""
    if not is_boolean_scalar(made_jump):
        raise TypeError(
            f"made_jump={made_jump!r}: pass a boolean scalar, the sol.made_jump of the solve "
            "this one resumes (SaveAt(made_jump=True)), or None."
        )


def resumed(init: State, resume: Resume | None, adaptive: bool, differentiable: bool) -> State:
    """The loop's first carry `init`, with the passed states in place of the fresh ones.

    - `adaptive`: the controller adapts step sizes, so its state is an error history to
      carry on with. A fixed-step controller's state is this solve's own grid of steps
      (its count, its interval): the fresh one is kept.
    - `differentiable`: the adjoint differentiates the carry (the discrete adjoints); the
      continuous ones carry the whole dependence in y, so the states pass without it.
    """
    if resume is None:
        return init
    keep = (lambda x: x) if differentiable else _frozen
    solver_state, controller_state = init.solver_state, init.controller_state
    if resume.solver_state is not None:
        given, first = _unflagged(resume.solver_state, solver_state)
        passed = keep(_as_fresh("solver_state", given, solver_state))
        jumped = _jumped(resume.made_jump)
        if first is not None:  # a state solver.init made: its first step starts afresh
            jumped = first if jumped is None else jumped | first
        # After a jump at t0 the saved state holds the field's left limit there: start
        # the solver afresh, as the first step after a jump time does.
        solver_state = passed if jumped is None else _where(jumped, solver_state, passed)
    if resume.controller_state is not None:
        passed = _as_fresh("controller_state", resume.controller_state, controller_state)
        controller_state = keep(passed) if adaptive else controller_state
    made_jump = init.made_jump
    if made_jump is not None and resume.made_jump is not None:
        made_jump = jnp.asarray(resume.made_jump, dtype=bool)
    return eqx.tree_at(
        lambda s: (s.solver_state, s.controller_state, s.made_jump),
        init,
        (solver_state, controller_state, made_jump),
        is_leaf=lambda x: x is None,
    )


def _unflagged(passed: PyTree, fresh: PyTree) -> tuple[PyTree, Bool[Array, ""] | None]:
    """A Runge-Kutta method's `solver.init` (Diffrax's low-level API) returns (first step,
    state): the state, and whether it is before a first step (None: `passed` is the
    state, as `sol.solver_state` is)."""
    if not (isinstance(passed, tuple) and len(passed) == 2 and is_boolean_scalar(passed[0])):
        return passed, None
    matches = lambda tree: jtu.tree_structure(tree) == jtu.tree_structure(fresh)  # type: ignore[operator]
    if matches(passed) or not matches(passed[1]):
        return passed, None
    return passed[1], jnp.asarray(passed[0], dtype=bool)


def _jumped(made_jump: Any) -> Bool[Array, ""] | None:
    """Whether the solve resumes on a jump (None: known not to)."""
    if made_jump is None or (is_concrete(made_jump) and not bool(made_jump)):
        return None
    return jnp.asarray(made_jump, dtype=bool)


def _where(pred: Bool[Array, ""], on_true: PyTree, on_false: PyTree) -> PyTree:
    return jtu.tree_map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


def _frozen(tree: PyTree) -> PyTree:
    return jtu.tree_map(lambda x: jax.lax.stop_gradient(x) if eqx.is_array(x) else x, tree)


def _as_fresh(name: str, passed: PyTree, fresh: PyTree) -> PyTree:
    """`passed` in the layout and dtypes of `fresh`, or a ValueError naming the fix."""
    passed_leaves, passed_def = jtu.tree_flatten(passed)
    fresh_leaves, fresh_def = jtu.tree_flatten(fresh)
    shapes = lambda leaves: [
        tuple(np.shape(x)) if eqx.is_array_like(x) else type(x).__name__ for x in leaves
    ]
    same_def = passed_def == fresh_def  # type: ignore[operator]  # (jaxlib's stub: no __eq__)
    if not same_def or shapes(passed_leaves) != shapes(fresh_leaves):
        raise ValueError(
            f"{name}=... does not match this solve's: it has structure {passed_def} with "
            f"shapes {shapes(passed_leaves)}, where this solver and controller carry "
            f"{fresh_def} with shapes {shapes(fresh_leaves)}. Pass sol.{name} of a solve "
            "with the same solver, step-size controller and state shapes (saved with "
            f"SaveAt({name}=True))."
        )
    leaves = [jnp.asarray(p, jnp.result_type(f)) for p, f in zip(passed_leaves, fresh_leaves)]
    return jtu.tree_unflatten(fresh_def, leaves)
