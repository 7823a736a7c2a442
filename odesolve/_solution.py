"""The result of a solve, and its dense interpolant."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike
from jaxtyping import Array, Float, Int, Real

from . import _interpolation
from ._checks import is_real
from ._flat import FlatSpec, RealScalarLike
from ._results import RESULTS, Result
from ._time import as_time


class StepRows(eqx.Module):
    """Interpolation data of recorded steps, one row per step, in internal time tau.

    - `t_start`, `t_end`: (R,) the step's interval.
    - `y0`: (R, n) the state at `t_start`.
    - `stages`: (R, w, n) what the interpolant is made from: the step's dense vectors,
      or the fewer control points of the same curve (`_interpolation.row_vectors`).
    - `count`: how many leading rows are valid; `t_end` is +inf past them, so that a
      time is located by one binary search.
    """

    t_start: Float[Array, " R"]
    t_end: Float[Array, " R"]
    y0: Float[Array, "R n"]
    stages: Float[Array, "R s n"]
    count: Int[Array, ""]

    def locate(self, tau: Float[Array, " m"]) -> tuple[Any, Any]:
        """Row index holding each tau, and whether such a row exists (tau within the
        steps taken)."""
        # The rows past `count` were masked when the rows were made, not here: masking
        # every row of the bound (`max_steps`) on each call made the program a few
        # thousand operations, which XLA:CPU dispatches to a worker thread instead of
        # running it in the calling one (about 50 us more an eager call).
        index = jnp.searchsorted(self.t_end, tau, side="left")
        found = (index < self.count.astype(index.dtype)) & (tau >= self.t_start[0])
        return jnp.clip(index, 0, jnp.maximum(self.count.astype(index.dtype) - 1, 0)), found

    def _local(self, tau: Float[Array, " m"]) -> tuple[Any, Any, Any, Any, list]:
        """Each tau's row: whether it exists, its step size h (m, 1), the position theta
        (m, 1) within its step, and its dense vectors, each (m, n)."""
        index, found = self.locate(tau)
        h, theta = _interpolation.position(self.t_start[index], self.t_end[index], tau)
        ks = [self.stages[index, i] for i in range(self.stages.shape[1])]
        return index, found, h[:, None], theta[:, None], ks

    def evaluate(self, table: tuple, tau: Float[Array, " m"]) -> Float[Array, "m n"]:
        index, found, h, theta, ks = self._local(tau)
        y = _interpolation.row_value(table, self.y0[index], h, theta, ks)
        return jnp.where(found[:, None], y, jnp.nan)

    def slope(self, table: tuple, tau: Float[Array, " m"]) -> Float[Array, "m n"]:
        _, found, _, theta, ks = self._local(tau)
        return jnp.where(found[:, None], _interpolation.row_slope(table, theta, ks), jnp.nan)


class DenseInterpolation(eqx.Module):
    """The solver's piecewise-polynomial solution over [t0, t1] (`SaveAt(dense=True)`)."""

    rows: StepRows
    interp: tuple = eqx.field(static=True)  # (s', degree) coefficients, hashable
    spec: FlatSpec
    direction: Any
    t0: Any
    t1: Any

    def _tau(self, t: RealScalarLike | Real[Array, " m"]):
        t = as_time(t, self.rows.t_start.dtype)  # Python ints and int arrays too
        return t, jnp.atleast_1d(t * self.direction)

    def _shape_like(self, t: ArrayLike, flat: Float[Array, "m n"]):
        out = self.spec.unravel_rows(flat)
        return jax.tree_util.tree_map(lambda x: x[0], out) if np.ndim(t) == 0 else out

    def evaluate(
        self,
        t0: RealScalarLike | Real[Array, " m"],
        t1: RealScalarLike | Real[Array, " m"] | None = None,
        left: bool = True,
    ) -> Any:
        """y(t0), or y(t1) - y(t0) if t1 is given. `t0` may be a scalar or a 1-D array.
        Outside the interval solved over: NaN, as in Diffrax (no extrapolation)."""
        self.check_unbatched("evaluate")
        return _evaluate(self, _time_input(t0), _time_input(t1))

    def derivative(self, t: RealScalarLike | Real[Array, " m"], left: bool = True) -> Any:
        """dy/dt of the interpolant (an approximation to the vector field)."""
        self.check_unbatched("derivative")
        return _derivative(self, _time_input(t))

    def check_unbatched(self, method: str) -> None:
        """A solution returned by a `vmap` holds one interpolant per sample."""
        shape = jnp.shape(self.rows.t_start)
        if len(shape) != 1:
            raise ValueError(
                f"sol.{method}: this solution holds {shape[:-1]} solutions (a solve "
                f"under jax.vmap): call sol.{method} under a vmap too, e.g. "
                f"jax.vmap(lambda sol: sol.{method}(t))(sol)."
            )

    def value(self, t: Real[Array, " m"]) -> Any:
        t, tau = self._tau(t)
        return self._shape_like(t, self.rows.evaluate(self.interp, tau))

    def slope(self, t: Real[Array, " m"]) -> Any:
        t, tau = self._tau(t)
        return self._shape_like(t, self.rows.slope(self.interp, tau) * self.direction)


# The interpolant is a few dozen operations: called eagerly (a plotting loop over times),
# each would be dispatched on its own, about 6 ms a call for a small state. As one
# compiled call it costs one dispatch (0.1 ms), less than Diffrax's `filter_jit`ed
# `evaluate`. The interpolant's leaves are arrays (its direction a number), so a plain
# `jax.jit` takes it; times are made arrays first, so a new time (a Python number too)
# reuses the program.


def _time_input(t: Any) -> Any:
    # An array passes as it is (`jnp.asarray` of one costs as much as the compiled call).
    return t if t is None or isinstance(t, jax.Array) else jnp.asarray(t)


@jax.jit
def _evaluate(interpolation: DenseInterpolation, t0: Array, t1: Array | None) -> Any:
    if t1 is None:
        return interpolation.value(t0)
    start, end = interpolation.value(t0), interpolation.value(t1)
    return jax.tree_util.tree_map(lambda a, b: b - a, start, end)


@jax.jit
def _derivative(interpolation: DenseInterpolation, t: Array) -> Any:
    return interpolation.slope(t)


class Solution(eqx.Module):
    """What `diffeqsolve` returns.

    - `ts`: (m,) save times; `ys`: PyTree with leading axis m (structure of `SaveAt.fn`'s
      output). Unused rows (steps not taken, times not reached) are `inf`.
    - `stats`: dict with num_steps, num_accepted_steps, num_rejected_steps, max_steps.
    - `result`: a `Result` (a `RESULTS` code that prints as its name); `throw=False`
      leaves failures here instead of raising.
    - `evaluate(t)`, `derivative(t)`: need `SaveAt(dense=True)`.
    """

    t0: Any
    t1: Any
    ts: Any
    ys: Any
    stats: dict
    result: Result
    interpolation: DenseInterpolation | None = None
    solver_state: Any = None
    controller_state: Any = None
    made_jump: Any = None
    event_mask: Any = None

    def evaluate(
        self,
        t0: RealScalarLike | Real[Array, " m"],
        t1: RealScalarLike | Real[Array, " m"] | None = None,
        left: bool = True,
    ) -> Any:
        """The dense solution y(t0), or the increment y(t1) - y(t0) if `t1` is given.

        Needs `SaveAt(dense=True)`; raises `ValueError` otherwise.

        - `t0`, `t1`: a scalar time, or a (m,) array of times within [t0, t1] of the solve.
        - `left`: accepted for Diffrax's signature and ignored: at a step boundary the step
          ending there is used (the dense solution is continuous).

        Returns a PyTree like y0 (leading axis m for an array of times). Times outside
        the interval solved over give NaN (no extrapolation), as in Diffrax.
        """
        if self.interpolation is None:
            raise ValueError(
                "sol.evaluate needs the dense solution: pass saveat=SaveAt(dense=True)."
            )
        _check_times("sol.evaluate", t0=t0, t1=t1)
        self.interpolation.check_unbatched("evaluate")
        return _evaluate(self.interpolation, _time_input(t0), _time_input(t1))

    def derivative(self, t: RealScalarLike | Real[Array, " m"], left: bool = True) -> Any:
        """dy/dt of the dense solution at `t`: the interpolant's slope, an approximation
        to the vector field there.

        Needs `SaveAt(dense=True)`; raises `ValueError` otherwise.

        - `t`: a scalar time, or a (m,) array of times.
        - `left`: accepted for Diffrax's signature and ignored: at a step boundary the
          slope of the step ending there is used.

        Returns a PyTree like y0 (leading axis m for an array of times); NaN outside the
        interval solved over.
        """
        if self.interpolation is None:
            raise ValueError(
                "sol.derivative needs the dense solution: pass saveat=SaveAt(dense=True)."
            )
        _check_times("sol.derivative", t=t)
        self.interpolation.check_unbatched("derivative")
        return _derivative(self.interpolation, _time_input(t))


def _check_times(owner: str, **times: Any) -> None:
    """Each time is a real scalar or a 1-D array of them."""
    for name, t in times.items():
        if t is None and name == "t1":  # no increment asked for
            continue
        if isinstance(t, jax.Array) and t.dtype.kind in "fiu" and t.ndim <= 1:
            continue  # the common case, checked without JAX's dtype machinery
        real = eqx.is_array_like(t) and not isinstance(t, (str, bytes)) and is_real(t)
        if not real or jnp.ndim(t) > 1:
            raise TypeError(f"{owner}({name}={t!r}): pass a real time, or a 1-D array of times.")


__all__ = ["Solution", "RESULTS", "DenseInterpolation"]
