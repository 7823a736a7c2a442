"""What a solve returns: `SaveAt`, and `SubSaveAt` for several outputs at once."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax.tree_util as jtu
import numpy as np
from jax.typing import ArrayLike

from ._flat import PyTree, RealScalarLike


def save_y(t: RealScalarLike, y: PyTree, args: PyTree) -> Any:
    """The default `fn`: save the state itself."""
    return y


def _check_ts(ts: ArrayLike | None, owner: str) -> None:
    if ts is None:
        return
    shape = np.shape(ts)  # a list too, which `jnp.shape` would refuse
    if len(shape) != 1 or shape[0] == 0:
        raise ValueError(
            f"{owner}(ts=...) must be a non-empty 1-D array of times, got shape {shape}."
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
    ts: Any = None
    steps: bool | int = False
    fn: Callable = save_y

    def __check_init__(self) -> None:
        if not (self.t0 or self.t1 or self.ts is not None or self.steps):
            raise ValueError(
                "SubSaveAt() saves nothing: pass at least one of t0=True, t1=True, ts=... "
                "or steps=True."
            )
        _check_ts(self.ts, "SubSaveAt")
        _check_steps(self.steps, "SubSaveAt")

    @property
    def every(self) -> int:
        """Save every `every`-th accepted step (0: do not save steps)."""
        return int(self.steps)


def _is_sub(x: object) -> bool:
    return isinstance(x, SubSaveAt)


class SaveAt(eqx.Module):
    """Which times to save the solution at.

    - `t0`, `t1`, `ts`, `steps`, `fn`: as `SubSaveAt`; `sol.ts` is then an array of
      shape (m,) and `sol.ys` a PyTree of `fn`'s output with a leading axis m.
    - `subs`: instead of those, a PyTree of `SubSaveAt`s: several outputs from one
      solve, each with its own times and `fn`; `sol.ts` and `sol.ys` are PyTrees of the
      same structure.
    - `dense`: keep every step's interpolant so `sol.evaluate(t)` and `sol.derivative(t)`
      work anywhere in [t0, t1].
    """

    t0: bool = False
    t1: bool = False
    ts: Any = None
    steps: bool | int = False
    fn: Callable = save_y
    subs: Any = None
    dense: bool = False

    def __check_init__(self) -> None:
        own = self.t0 or self.t1 or self.ts is not None or self.steps or self.fn is not save_y
        if self.subs is not None:
            if own:
                raise ValueError(
                    "SaveAt(subs=...) cannot be combined with t0, t1, ts, steps or fn: put "
                    "those in the SubSaveAt(...)s."
                )
            subs = jtu.tree_leaves(self.subs, is_leaf=_is_sub)
            if not subs or not all(isinstance(s, SubSaveAt) for s in subs):
                raise ValueError(
                    f"SaveAt(subs={self.subs!r}): pass a SubSaveAt or a PyTree of them."
                )
            return
        if not (own or self.dense):
            raise ValueError(
                "SaveAt() saves nothing: pass at least one of t0=True, t1=True, ts=..., "
                "steps=True or dense=True."
            )
        _check_ts(self.ts, "SaveAt")
        _check_steps(self.steps, "SaveAt")

    @property
    def outputs(self) -> tuple[SubSaveAt, ...]:
        """Each output asked for, as a `SubSaveAt` (none for `SaveAt(dense=True)` alone)."""
        if self.subs is not None:
            return tuple(jtu.tree_leaves(self.subs, is_leaf=_is_sub))
        if not (self.t0 or self.t1 or self.ts is not None or self.steps):
            return ()
        return (SubSaveAt(self.t0, self.t1, self.ts, self.steps, self.fn),)

    def arrange(self, per_output: list) -> Any:
        """One value per output, arranged as `sol.ts`/`sol.ys` are: the value itself
        without `subs`, else a PyTree of `subs`' structure (None with no outputs)."""
        if self.subs is None:
            return per_output[0] if per_output else None
        structure = jtu.tree_structure(self.subs, is_leaf=_is_sub)
        return jtu.tree_unflatten(structure, per_output)
