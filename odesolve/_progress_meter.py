"""Progress meters: report how far through [t0, t1] a solve is, from inside the jitted loop.

The loop calls `meter.step(progress, last)` each step; a host callback fires only when the
progress has grown by `minimum_increase` since the last report (under `lax.cond`), so a
meter costs one comparison per step. Under `vmap` the slowest sample's progress is shown.
"""

import itertools
import sys
from typing import Any, ClassVar

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

_counter = itertools.count()
_open: dict[int, Any] = {}


class AbstractProgressMeter(eqx.Module):
    """Host-side start/update/close around the loop; `active` False skips everything."""

    active: ClassVar[bool] = True
    minimum_increase: float = 0.01

    def _start(self, key: int) -> None: ...

    def _update(self, key: int, progress: float) -> None: ...

    def _close(self, key: int) -> None: ...

    def init(self) -> Any:
        """Open the meter (a host callback); returns the progress already reported."""
        key = next(_counter)

        def start():
            self._start(key)
            return np.zeros((), np.float32)

        # A value-returning callback: the loop's first `last` depends on it, which orders
        # the bar's creation before its updates.
        last = jax.pure_callback(start, jax.ShapeDtypeStruct((), jnp.float32))
        return key, last

    def step(self, key: int, progress: Any, last: Any) -> Any:
        """Report `progress` in [0, 1] if it grew enough; returns the new `last`."""

        def report(p):
            jax.debug.callback(lambda q: self._update(key, float(np.min(q))), p)
            return p

        # Under `vmap` the callback would fire once per sample: report the slowest
        # sample's progress instead (a minimum reduced over the batch, unbatched). Progress
        # is reported, not differentiated: the reduction has no derivative rule.
        progress = lax.stop_gradient(progress.astype(jnp.float32))
        progress = -eqxi.unvmap_max(-progress)
        last = -eqxi.unvmap_max(-lax.stop_gradient(last))
        grew = progress >= last + self.minimum_increase
        return lax.cond(grew, report, lambda _: last, progress)

    def close(self, key: int, token: Any) -> None:
        jax.debug.callback(lambda _: self._close(key), token)


class NoProgressMeter(AbstractProgressMeter):
    """Report nothing (the default)."""

    active: ClassVar[bool] = False


class TextProgressMeter(AbstractProgressMeter):
    """Print the percentage done to stderr, every `minimum_increase` (default 2%)."""

    minimum_increase: float = 0.02

    def _start(self, key):
        print("0.00%", file=sys.stderr, flush=True)

    def _update(self, key, progress):
        print(f"{100 * progress:.2f}%", file=sys.stderr, flush=True)

    def _close(self, key):
        print("100.00%", file=sys.stderr, flush=True)


class TqdmProgressMeter(AbstractProgressMeter):
    """A tqdm bar (needs `pip install tqdm`)."""

    refresh_steps: int = 20

    def __check_init__(self):
        try:
            import tqdm  # noqa: F401
        except ImportError as e:
            raise ImportError(
                "TqdmProgressMeter needs tqdm: `pip install tqdm`, or use TextProgressMeter()."
            ) from e

    def _start(self, key):
        import tqdm

        _open[key] = tqdm.tqdm(total=100, unit="%", bar_format="{l_bar}{bar}| {n:.1f}/100%")

    def _update(self, key, progress):
        bar = _open.get(key)
        if bar is not None:
            bar.n = 100 * progress
            bar.refresh()

    def _close(self, key):
        bar = _open.pop(key, None)
        if bar is not None:
            bar.n = 100
            bar.close()
