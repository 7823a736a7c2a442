"""What a solve returns: `SaveAt`."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import numpy as np


def save_y(t: Any, y: Any, args: Any) -> Any:
    """The default `SaveAt.fn`: save the state itself."""
    return y


class SaveAt(eqx.Module):
    """Which times to save the solution at.

    - `t0`, `t1`: the initial and final times.
    - `ts`: an increasing (decreasing when integrating backwards) 1-D array of times in
      [t0, t1]; values come from the solver's dense interpolant, so they do not change
      the steps taken.
    - `steps`: True saves every accepted step; an int n saves every n-th. Rows past the
      last step are `inf` (the output has max_steps // n rows).
    - `dense`: keep every step's interpolant so `sol.evaluate(t)` and `sol.derivative(t)`
      work anywhere in [t0, t1].
    - `fn(t, y, args)`: what to save instead of `y` (a statistic, a projection).

    Outputs are ordered t0, ts, steps, t1.
    """

    t0: bool = False
    t1: bool = False
    ts: Any = None
    steps: bool | int = False
    dense: bool = False
    fn: Callable = save_y

    def __check_init__(self):
        if not (self.t0 or self.t1 or self.ts is not None or self.steps or self.dense):
            raise ValueError(
                "SaveAt() saves nothing: pass at least one of t0=True, t1=True, ts=..., "
                "steps=True or dense=True."
            )
        if self.ts is not None:
            shape = np.shape(self.ts)  # a list too, which `jnp.shape` will refuse
            if len(shape) != 1 or shape[0] == 0:
                raise ValueError(
                    f"SaveAt(ts=...) must be a non-empty 1-D array of times, got shape {shape}."
                )
        if not isinstance(self.steps, (bool, int, np.integer)) or self.steps < 0:
            raise ValueError(f"SaveAt(steps={self.steps!r}): pass True, False or an int >= 1.")

    @property
    def every(self) -> int:
        """Save every `every`-th accepted step (0: do not save steps)."""
        return int(self.steps)
