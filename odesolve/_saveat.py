"""What a solve returns: `SaveAt`, and `SubSaveAt` for several outputs at once."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax.tree_util as jtu
import numpy as np
from jax.typing import ArrayLike

from ._checks import check_flag, check_real_times, shape_of, shape_text
from ._flat import PyTree, RealScalarLike
from ._time import times_array


def save_y(t: RealScalarLike, y: PyTree, args: PyTree) -> Any:
    """The default `fn`: save the state itself."""
    return y


def _check_ts(ts: ArrayLike | None, owner: str) -> None:
    if ts is None:
        return
    shape = shape_of(ts)
    if shape is None or len(shape) != 1 or shape[0] == 0:
        got = shape_text(shape)
        raise ValueError(f"{owner}(ts=...) must be a non-empty 1-D array of times, got {got}.")
    check_real_times(f"{owner}(ts=...)", ts)


def _check_fn(fn: Callable, owner: str) -> None:
    if not callable(fn):
        raise TypeError(
            f"{owner}(fn={fn!r}): pass a function fn(t, y, args) returning what to save."
        )


def _check_steps(steps: int, owner: str) -> None:
    if not isinstance(steps, (bool, int, np.integer)) or steps < 0:
        raise ValueError(f"{owner}(steps={steps!r}): pass True, False or an int >= 1.")


class SubSaveAt(eqx.Module):
    """One output of a solve that saves several (`SaveAt(subs=...)`).

    - `t0`, `t1`: the initial and final times.
    - `ts`: an increasing (decreasing when integrating backwards) 1-D array of times in
      [t0, t1], read from the solver's dense interpolant (they do not change the steps).
    - `steps`: True saves every accepted step; an int n every n-th. Rows past the last
      step are `inf` (the output has max_steps // n rows).
    - `fn(t, y, args)`: what to save instead of `y` (a statistic, a projection).

    Its rows are ordered t0, ts, steps, t1.
    """

    t0: bool = False
    t1: bool = False
    ts: Any = eqx.field(default=None, converter=times_array)
    steps: bool | int = False
    fn: Callable = save_y

    def __check_init__(self) -> None:
        check_flag("t0", self.t0, "SubSaveAt")
        check_flag("t1", self.t1, "SubSaveAt")
        if not (self.t0 or self.t1 or self.ts is not None or self.steps):
            raise ValueError(
                "SubSaveAt() saves nothing: pass at least one of t0=True, t1=True, ts=... "
                "or steps=True."
            )
        _check_ts(self.ts, "SubSaveAt")
        _check_steps(self.steps, "SubSaveAt")
        _check_fn(self.fn, "SubSaveAt")

    @property
    def every(self) -> int:
        """Save every `every`-th accepted step (0: do not save steps)."""
        return int(self.steps)


def _is_sub(x: object) -> bool:
    return isinstance(x, SubSaveAt)


class SaveAt(eqx.Module):
    """Which times to save the solution at.

    - `t0`, `t1`, `ts`, `steps`, `fn`: as `SubSaveAt`; `sol.ts` is then an array of
      shape (m,) and `sol.ys` a PyTree of `fn`'s output with a leading axis m. They are
      held as one `SubSaveAt` in `subs`, as Diffrax holds them.
    - `subs`: instead of those, a PyTree of `SubSaveAt`s: several outputs from one
      solve, each with its own times and `fn`; `sol.ts` and `sol.ys` are PyTrees of the
      same structure.
    - `dense`: keep every step's interpolant so `sol.evaluate(t)` and `sol.derivative(t)`
      work anywhere in [t0, t1].
    - `solver_state`, `controller_state`, `made_jump`: also return the solver's and the
      controller's state and the jump flag at the end, as `sol.solver_state`,
      `sol.controller_state` and `sol.made_jump` (the loop's own form of them, to look
      at: `diffeqsolve` does not take them back to resume a solve).
    """

    subs: Any
    dense: bool
    solver_state: bool
    controller_state: bool
    made_jump: bool

    def __init__(
        self,
        *,
        t0: bool = False,
        t1: bool = False,
        ts: ArrayLike | None = None,
        steps: bool | int = False,
        fn: Callable = save_y,
        subs: Any = None,
        dense: bool = False,
        solver_state: bool = False,
        controller_state: bool = False,
        made_jump: bool = False,
    ):
        flags = dict(t0=t0, t1=t1, dense=dense, solver_state=solver_state)
        flags.update(controller_state=controller_state, made_jump=made_jump)
        for name, value in flags.items():
            check_flag(name, value, "SaveAt")
        ts = times_array(ts)
        if ts is not None and shape_of(ts) == (0,):
            if not (t0 or t1 or steps or subs is not None):
                raise ValueError("SaveAt(ts=[]) saves nothing: pass some save times, or t1=True.")
            ts = None  # as Diffrax: no save times beside the other outputs
        own = t0 or t1 or ts is not None or steps
        if subs is not None:
            if own or fn is not save_y:
                raise ValueError(
                    "SaveAt(subs=...) cannot be combined with t0, t1, ts, steps or fn: put "
                    "those in the SubSaveAt(...)s."
                )
            leaves = jtu.tree_leaves(subs, is_leaf=_is_sub)
            if not all(isinstance(s, SubSaveAt) for s in leaves):
                raise ValueError(f"SaveAt(subs={subs!r}): pass a SubSaveAt or a PyTree of them.")
        elif own:
            _check_ts(ts, "SaveAt")
            _check_steps(steps, "SaveAt")
            _check_fn(fn, "SaveAt")
            subs = SubSaveAt(t0=t0, t1=t1, ts=ts, steps=steps, fn=fn)
        elif fn is not save_y and not dense:
            # (With dense output alone, as in Diffrax, an `fn` has no times to apply to.)
            # `SaveAt()` alone is a solve for its result and statistics, as in Diffrax.
            raise ValueError(
                "SaveAt(fn=...) saves nothing: pass at least one of t0=True, t1=True, "
                "ts=... or steps=True for fn to apply to."
            )
        self.subs = subs
        self.dense = dense
        self.solver_state = solver_state
        self.controller_state = controller_state
        self.made_jump = made_jump

    @property
    def outputs(self) -> tuple[SubSaveAt, ...]:
        """Each output asked for, as a `SubSaveAt` (none for `SaveAt(dense=True)` alone)."""
        return tuple(jtu.tree_leaves(self.subs, is_leaf=_is_sub))

    def arrange(self, per_output: list) -> Any:
        """One value per output, arranged as `sol.ts`/`sol.ys` are: a PyTree of `subs`'
        structure (a single array for a single `SubSaveAt`; None with no outputs)."""
        if self.subs is None:
            return None
        structure = jtu.tree_structure(self.subs, is_leaf=_is_sub)
        return jtu.tree_unflatten(structure, per_output)
