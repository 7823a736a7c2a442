"""Progress meters: report how far through [t0, t1] a solve is, from inside the jitted loop.

The loop calls `meter.step(key, progress, last, num_steps)` each step; a host callback
fires only when a report is due (`due`: for the text meter, when the progress has grown
by `minimum_increase` since the last one), under `lax.cond`, so a meter costs a comparison
per step. Under `vmap` the slowest sample's progress is shown.
"""

import abc
import itertools
import numbers
from typing import Any, ClassVar

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Float, Int

_counter = itertools.count()
# The tqdm bars of running solves, by the key each solve's meter was given when traced:
# the host callbacks receive only that key (a meter is a static, hashed part of a compiled
# solve, so it cannot hold a bar itself).
_open: dict[int, Any] = {}


class AbstractProgressMeter(eqx.Module):
    """Host-side start/update/close around the loop; `active` False skips everything."""

    active: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Diffrax's interface (`init()`, `step(state, progress)`, `close(state)`) is not
        # this one: say so where the class is written, not as missing private methods.
        written = [m for m in ("init", "step", "close") if m in vars(cls)]
        if written and cls.__module__ != __name__:
            raise TypeError(
                f"{cls.__name__} defines {', '.join(written)}: progress meters written in "
                "Diffrax's interface (init(), step(state, progress), close(state)) are not "
                "supported: use odesolve.TextProgressMeter() or TqdmProgressMeter()."
            )

    @abc.abstractmethod
    def _start(self, key: int) -> None:
        """Open the display (on the host)."""

    @abc.abstractmethod
    def _update(self, key: int, progress: float) -> None:
        """Show `progress` in [0, 1] (on the host)."""

    @abc.abstractmethod
    def _close(self, key: int) -> None:
        """Close the display (on the host)."""

    @abc.abstractmethod
    def due(
        self, progress: Float[Array, ""], last: Float[Array, ""], num_steps: Int[Array, ""]
    ) -> Any:
        """Whether to report now."""

    def init(self, dtype: Any) -> Any:
        """Open the meter (a host callback); returns the progress already reported, in
        `dtype`, the time's: reports fall due as Diffrax's do, not a step early where a
        float32 progress would round up to the next `minimum_increase`."""
        key = next(_counter)

        def start():
            self._start(key)
            return np.zeros((), dtype)

        # A value-returning callback: the loop's first `last` depends on it, which orders
        # the bar's creation before its updates.
        last = jax.pure_callback(start, jax.ShapeDtypeStruct((), dtype))
        return key, last

    def step(
        self,
        key: int,
        progress: Float[Array, ""],
        last: Float[Array, ""],
        num_steps: Int[Array, ""],
    ) -> Any:
        """Report `progress` in [0, 1] after step `num_steps` if due; returns the new
        `last`."""

        def report(p: float):
            jax.debug.callback(lambda q: self._update(key, float(np.min(q))), p)
            return p

        # Under `vmap` the callback would fire once per sample: report the slowest
        # sample's progress instead (a minimum reduced over the batch, unbatched). Progress
        # is reported, not differentiated: the reduction has no derivative rule. The last
        # report is the largest `last` in the batch: a sample that has finished keeps the
        # `last` it had then, older than the running samples' (the minimum would make
        # every later step look due).
        progress = lax.stop_gradient(progress.astype(last.dtype))
        progress = -eqxi.unvmap_max(-progress)
        last = eqxi.unvmap_max(lax.stop_gradient(last))
        return lax.cond(self.due(progress, last, num_steps), report, lambda _: last, progress)

    def close(self, key: int, token: Array) -> None:
        # One close for a whole `vmap` batch: the token, reduced over it, is unbatched.
        token = eqxi.unvmap_max(lax.stop_gradient(token))
        jax.debug.callback(lambda _: self._close(key), token)


class NoProgressMeter(AbstractProgressMeter):
    """Report nothing (the default)."""

    active: ClassVar[bool] = False

    def _start(self, key: int) -> None:
        """Nothing to open: this meter shows nothing."""

    def _update(self, key: int, progress: float) -> None:
        """Nothing to show (never called: `due` is never true)."""

    def _close(self, key: int) -> None:
        """Nothing to close."""

    def due(
        self, progress: Float[Array, ""], last: Float[Array, ""], num_steps: Int[Array, ""]
    ) -> Any:
        return jnp.asarray(False)


class TextProgressMeter(AbstractProgressMeter):
    """Print the percentage done to stdout (as Diffrax), every `minimum_increase` (default
    2%)."""

    minimum_increase: float = 0.02

    def __check_init__(self):
        value = self.minimum_increase
        number = isinstance(value, numbers.Real) and not isinstance(value, bool)
        if not (number and 0 < value <= 1):  # also catches nan
            raise ValueError(
                f"TextProgressMeter(minimum_increase={value!r}): pass the fraction of the "
                "solve between two reports, a number in (0, 1], e.g. 0.02."
            )

    def due(
        self, progress: Float[Array, ""], last: Float[Array, ""], num_steps: Int[Array, ""]
    ) -> Any:
        """The progress grew by `minimum_increase` since the last report (100% is
        printed once, when the meter closes)."""
        return (progress >= last + self.minimum_increase) & (progress < 1)

    def _start(self, key: int):
        print("0.00%", flush=True)

    def _update(self, key: int, progress: float) -> None:
        print(f"{100 * progress:.2f}%", flush=True)

    def _close(self, key: int):
        print("100.00%", flush=True)


class TqdmProgressMeter(AbstractProgressMeter):
    """A tqdm bar (needs `pip install tqdm`), redrawn every `refresh_steps` steps (as
    Diffrax)."""

    refresh_steps: int = 20

    def due(self, progress: Float[Array, ""], last: Float[Array, ""], num_steps: Int[Array, ""]):
        # Under `vmap`, the step count of the sample furthest on.
        num_steps = eqxi.unvmap_max(num_steps)
        return (num_steps % self.refresh_steps == 0) & (progress > last)

    def __check_init__(self):
        if isinstance(self.refresh_steps, bool) or not isinstance(self.refresh_steps, int):
            raise TypeError(f"refresh_steps={self.refresh_steps!r}: pass a positive int.")
        if self.refresh_steps < 1:
            raise ValueError(f"refresh_steps={self.refresh_steps}: pass a positive int.")
        try:
            import tqdm  # noqa: F401
        except ImportError as e:
            raise ImportError(
                "TqdmProgressMeter needs tqdm: `pip install tqdm`, or use TextProgressMeter()."
            ) from e

    def _start(self, key: int):
        import tqdm

        _open[key] = tqdm.tqdm(
            total=100, unit="%", bar_format="{l_bar}{bar}| {n:.1f}/100% [{elapsed}<{remaining}]"
        )

    def _update(self, key: int, progress: float) -> None:
        bar = _open.get(key)
        if bar is not None:
            bar.n = 100 * progress
            bar.refresh()

    def _close(self, key: int):
        bar = _open.pop(key, None)
        if bar is not None:
            bar.n = 100
            bar.close()
