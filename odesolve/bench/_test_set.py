"""Standard stiff and non-stiff test problems, with independent reference solutions.

Each right-hand side is written once against an array namespace `xp` (`jax.numpy` for the
solvers, `numpy` for scipy's reference), so every solver integrates the same arithmetic.
The references are scipy's Radau (stiff) or DOP853 (non-stiff) at rtol 1e-13, computed
once per process: never one of our own solves.

Stiff: Robertson's kinetics and HIRES (Hairer & Wanner II, sec. IV.10), Van der Pol with
mu = 1e3. Non-stiff: Lotka-Volterra, Arenstorf's orbit and Pleiades (Hairer, Norsett &
Wanner I, sec. II.0 and II.10).
"""

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class StandardProblem:
    """y' = rhs(t, y, xp) on [0, t1] from y0, compared at `ts`.

    `atol_ratio`: atol = atol_ratio * rtol, the absolute tolerance a user would pick for
    the problem's scale (components that are tiny but matter need a small one)."""

    name: str
    stiff: bool
    rhs: Callable[[Any, Any, Any], list]
    y0: tuple
    ts: tuple
    atol_ratio: float

    @property
    def t1(self) -> float:
        return self.ts[-1]

    def jax_field(self) -> Callable:
        """f(t, y, args) for odesolve and Diffrax."""
        import jax.numpy as jnp

        return lambda t, y, args: jnp.stack(self.rhs(t, y, jnp))

    def numpy_field(self) -> Callable:
        return lambda t, y: np.array(self.rhs(t, y, np), dtype=float)


def _robertson(t, y, xp):
    fast = 3e7 * y[1] ** 2
    exchange = 0.04 * y[0] - 1e4 * y[1] * y[2]
    return [-exchange, exchange - fast, fast]


def _van_der_pol(t, y, xp):
    return [y[1], 1e3 * (1 - y[0] ** 2) * y[1] - y[0]]


def _hires(t, y, xp):
    y1, y2, y3, y4, y5, y6, y7, y8 = (y[i] for i in range(8))
    return [
        -1.71 * y1 + 0.43 * y2 + 8.32 * y3 + 0.0007,
        1.71 * y1 - 8.75 * y2,
        -10.03 * y3 + 0.43 * y4 + 0.035 * y5,
        8.32 * y2 + 1.71 * y3 - 1.12 * y4,
        -1.745 * y5 + 0.43 * y6 + 0.43 * y7,
        -280.0 * y6 * y8 + 0.69 * y4 + 1.71 * y5 - 0.43 * y6 + 0.69 * y7,
        280.0 * y6 * y8 - 1.81 * y7,
        -280.0 * y6 * y8 + 1.81 * y7,
    ]


def _lotka_volterra(t, y, xp):
    return [1.5 * y[0] - y[0] * y[1], -3.0 * y[1] + y[0] * y[1]]


_ARENSTORF_MU = 0.012277471


def _arenstorf(t, y, xp):
    mu, nu = _ARENSTORF_MU, 1 - _ARENSTORF_MU
    x, z, dx, dz = y[0], y[1], y[2], y[3]
    d1 = ((x + mu) ** 2 + z**2) ** 1.5
    d2 = ((x - nu) ** 2 + z**2) ** 1.5
    return [
        dx,
        dz,
        x + 2 * dz - nu * (x + mu) / d1 - mu * (x - nu) / d2,
        z - 2 * dx - nu * z / d1 - mu * z / d2,
    ]


def _pleiades(t, y, xp):
    """Seven bodies of masses 1..7 in the plane: y = (x, z, x', z') of each."""
    x, z = y[0:7], y[7:14]
    mass = xp.arange(1.0, 8.0)
    dx = x[None, :] - x[:, None]  # x_j - x_i
    dz = z[None, :] - z[:, None]
    r3 = (dx**2 + dz**2 + xp.eye(7)) ** 1.5  # the diagonal (i = j) is masked below
    weight = (1 - xp.eye(7)) * mass[None, :] / r3
    ax, az = (weight * dx).sum(axis=1), (weight * dz).sum(axis=1)
    return [y[14 + i] for i in range(14)] + [ax[i] for i in range(7)] + [az[i] for i in range(7)]


_ARENSTORF_PERIOD = 17.0652165601579625588917206249
_ARENSTORF_Y0 = (0.994, 0.0, 0.0, -2.00158510637908252240537862224)
_PLEIADES_Y0 = (
    (3.0, 3.0, -1.0, -3.0, 2.0, -2.0, 2.0)
    + (3.0, -3.0, 2.0, 0.0, 0.0, -4.0, 4.0)
    + (0.0, 0.0, 0.0, 0.0, 0.0, 1.75, -1.5)
    + (0.0, 0.0, 0.0, -1.25, 1.0, 0.0, 0.0)
)

PROBLEMS = {
    p.name: p
    for p in (
        StandardProblem("Robertson", True, _robertson, (1.0, 0.0, 0.0),
                    (1e-3, 1e-2, 0.1, 1.0, 10.0, 40.0), 1e-2),
        StandardProblem("VanDerPol", True, _van_der_pol, (2.0, 0.0),
                    (10.0, 100.0, 400.0, 700.0, 1000.0), 1.0),
        StandardProblem("HIRES", True, _hires, (1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0057),
                    (1.0, 10.0, 100.0, 321.8122), 1e-4),
        StandardProblem("LotkaVolterra", False, _lotka_volterra, (1.0, 1.0),
                    (2.5, 5.0, 7.5, 10.0, 12.5, 15.0), 1.0),
        StandardProblem("Arenstorf", False, _arenstorf, _ARENSTORF_Y0,
                    (_ARENSTORF_PERIOD / 4, _ARENSTORF_PERIOD / 2, _ARENSTORF_PERIOD), 1.0),
        StandardProblem("Pleiades", False, _pleiades, _PLEIADES_Y0, (1.0, 2.0, 3.0), 1.0),
    )
}  # fmt: skip


@functools.cache
def reference(name: str) -> np.ndarray:
    """(len(ts), n): scipy's Radau (stiff problems; it takes its Jacobian by finite
    differences) or DOP853 at rtol 1e-13, at the problem's save times."""
    from scipy.integrate import solve_ivp

    p = PROBLEMS[name]
    method = "Radau" if p.stiff else "DOP853"
    sol = solve_ivp(
        p.numpy_field(), (0.0, p.t1), np.array(p.y0), method=method, t_eval=np.array(p.ts),
        rtol=1e-13, atol=1e-13 * p.atol_ratio * 1e-2,
    )  # fmt: skip
    if not sol.success:
        raise RuntimeError(f"reference for {name}: {sol.message}")
    return sol.y.T


def scaled_error(name: str, ys: Any, rtol: float) -> float:
    """max over save times and components of |y - ref| / (atol + rtol |ref|): 1 means
    exactly the accuracy asked for."""
    p, ref = PROBLEMS[name], reference(name)
    atol = p.atol_ratio * rtol
    return float(np.max(np.abs(np.asarray(ys) - ref) / (atol + rtol * np.abs(ref))))
