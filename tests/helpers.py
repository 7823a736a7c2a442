"""Registries shared by the tests: a new solver added here is covered by every
parametrised test."""

import dataclasses
import math
from collections.abc import Callable

import jax.numpy as jnp
import numpy as np

import odesolve as ode

# (solver, order of the solution)
EXPLICIT_SOLVERS = [
    (ode.Euler(), 1),
    (ode.Heun(), 2),
    (ode.Midpoint(), 2),
    (ode.Ralston(), 2),
    (ode.Bosh3(), 3),
    (ode.Tsit5(), 5),
    (ode.Dopri5(), 5),
    (ode.Dopri8(), 8),
]
ADAPTIVE_SOLVERS = [(s, p) for s, p in EXPLICIT_SOLVERS if s.adaptive]


def solver_id(entry) -> str:
    return type(entry[0]).__name__


# Order of the dense output's global error (the interpolant, not the step): cubic Hermite
# for the low-order methods, the published continuous extensions for the others. Dopri8's
# 14-stage interpolant is a degree-6 polynomial in theta, so order 6 (as Diffrax's).
DENSE_ORDER = {
    "Euler": 1,
    "Heun": 2,
    "Midpoint": 2,
    "Ralston": 2,
    "Bosh3": 3,
    "Tsit5": 4,
    "Dopri5": 4,
    "Dopri8": 6,
}


def lotka_volterra(t, y, args):
    """dx = 1.5 x - x z, dz = -3 z + x z: a periodic orbit around (3, 1.5)."""
    x, z = y[0], y[1]
    return jnp.stack([1.5 * x - x * z, -3.0 * z + x * z])


def finite(ts, ys):
    """The rows of a SaveAt(steps=...) output that were written (unused rows are inf)."""
    keep = np.isfinite(np.asarray(ts))
    return np.asarray(ts)[keep], np.asarray(ys)[keep]


# ----------------------------------------------------------------- reference problems
#
# Non-stiff test problems of Hull, Enright, Fellen & Sedgwick, "Comparing numerical
# methods for ordinary differential equations", SIAM J. Numer. Anal. 9 (1972) 603-637
# ("DETEST"), all on [0, 20]. Each right-hand side is written once against an array
# namespace `xp` (numpy for the scipy reference, jax.numpy for odesolve) and returns the
# list of components. `exact` is the closed form where one exists.


@dataclasses.dataclass(frozen=True)
class Problem:
    name: str
    rhs: Callable  # rhs(t, y, xp) -> list of components
    y0: tuple
    exact: Callable | None = None  # exact(t: (m,)) -> (m, n)
    t1: float = 20.0

    def vector_field(self, t, y, args):
        return _join(self.rhs(t, y, jnp), jnp)

    def numpy_vector_field(self, t, y):
        return _join(self.rhs(t, y, np), np)


def _join(components, xp):
    if all(xp.ndim(c) == 0 for c in components):
        return xp.stack(components)
    return xp.concatenate([xp.reshape(c, (-1,)) for c in components])


def _columns(*cols):
    return np.stack([np.broadcast_to(c, np.shape(cols[0])) for c in cols], axis=-1)


def _chain(t, n, weight):
    """y_i for i < n from `weight(i, t)`, and the last component 1 - sum (conserved)."""
    first = [weight(i, t) for i in range(n - 1)]
    return _columns(*first, 1 - sum(first))


def _kepler_problem(name, e):
    """Class D: y'' = -y / |y|^3 from periapsis with eccentricity e (period 2 pi)."""

    def rhs(t, y, xp):
        r3 = (y[0] ** 2 + y[1] ** 2) ** 1.5
        return [y[2], y[3], -y[0] / r3, -y[1] / r3]

    def exact(t):
        # Kepler's equation E - e sin E = t, by Newton's method from E = t.
        big_e = np.array(t, dtype=float)
        for _ in range(50):
            big_e = big_e - (big_e - e * np.sin(big_e) - t) / (1 - e * np.cos(big_e))
        s, c, root = np.sin(big_e), np.cos(big_e), np.sqrt(1 - e**2)
        return _columns(c - e, root * s, -s / (1 - e * c), root * c / (1 - e * c))

    return Problem(name, rhs, (1 - e, 0.0, 0.0, np.sqrt((1 + e) / (1 - e))), exact)


def _c1(t, y, xp):
    return [-y[:1], y[:8] - y[1:9], y[8:9]]


def _c2(t, y, xp):
    i = xp.arange(1.0, 9.0)
    return [-y[:1], i * y[:8] - (i + 1) * y[1:9], 9 * y[8:9]]


def _c3(t, y, xp):
    return [-2 * y[:1] + y[1:2], y[:8] - 2 * y[1:9] + y[2:10], y[8:9] - 2 * y[9:10]]


def _b4(t, y, xp):
    r = xp.sqrt(y[0] ** 2 + y[1] ** 2)
    return [-y[1] - y[0] * y[2] / r, y[0] - y[1] * y[2] / r, y[0] / r]


_E1 = (np.sqrt(2 / np.pi) * np.sin(1.0), np.sqrt(2 / np.pi) * (np.cos(1.0) - np.sin(1.0) / 2))
_E4_B = 0.4 * np.sqrt(0.08)  # y2 = sqrt(0.08) tanh(b t), so y1 = 30 + 2.5 log cosh(b t)
_UNIT = (1.0,) + (0.0,) * 9

DETEST = {
    "A": [
        Problem("A1", lambda t, y, xp: [-y[0]], (1.0,), lambda t: _columns(np.exp(-t))),
        Problem(
            "A2",
            lambda t, y, xp: [-(y[0] ** 3) / 2],
            (1.0,),
            lambda t: _columns(1 / np.sqrt(1 + t)),
        ),
        Problem(
            "A3",
            lambda t, y, xp: [y[0] * xp.cos(t)],
            (1.0,),
            lambda t: _columns(np.exp(np.sin(t))),
        ),
        Problem(
            "A4",
            lambda t, y, xp: [y[0] / 4 * (1 - y[0] / 20)],
            (1.0,),
            lambda t: _columns(20 / (1 + 19 * np.exp(-t / 4))),
        ),
    ],
    "B": [
        Problem(
            "B1",
            lambda t, y, xp: [2 * (y[0] - y[0] * y[1]), -(y[1] - y[0] * y[1])],
            (1.0, 3.0),
        ),
        Problem(
            "B2",
            lambda t, y, xp: [-y[0] + y[1], y[0] - 2 * y[1] + y[2], y[1] - y[2]],
            (2.0, 0.0, 1.0),
        ),
        Problem("B3", lambda t, y, xp: [-y[0], y[0] - y[1] ** 2, y[1] ** 2], (1.0, 0.0, 0.0)),
        Problem("B4", _b4, (3.0, 0.0, 0.0)),
        Problem(
            "B5",
            lambda t, y, xp: [y[1] * y[2], -y[0] * y[2], -0.51 * y[0] * y[1]],
            (0.0, 1.0, 1.0),
        ),
    ],
    "C": [
        # y_i = t^(i-1) e^-t / (i-1)!
        Problem(
            "C1",
            _c1,
            _UNIT,
            lambda t: _chain(t, 10, lambda i, t: t**i * np.exp(-t) / math.factorial(i)),
        ),
        # y_i = e^-t (1 - e^-t)^(i-1)
        Problem(
            "C2",
            _c2,
            _UNIT,
            lambda t: _chain(t, 10, lambda i, t: np.exp(-t) * (1 - np.exp(-t)) ** i),
        ),
        Problem("C3", _c3, _UNIT),
    ],
    "D": [_kepler_problem("D1", 0.1), _kepler_problem("D3", 0.5), _kepler_problem("D5", 0.9)],
    "E": [
        # Bessel's equation of order 1/2 in x = t + 1: y = J_{1/2}(x) = sqrt(2/(pi x)) sin x.
        Problem(
            "E1",
            lambda t, y, xp: [y[1], -(y[1] / (t + 1) + (1 - 0.25 / (t + 1) ** 2) * y[0])],
            _E1,
            lambda t: _columns(
                np.sqrt(2 / (np.pi * (t + 1))) * np.sin(t + 1),
                np.sqrt(2 / np.pi)
                * (np.cos(t + 1) / np.sqrt(t + 1) - np.sin(t + 1) / (2 * (t + 1) ** 1.5)),
            ),
        ),
        Problem("E2", lambda t, y, xp: [y[1], (1 - y[0] ** 2) * y[1] - y[0]], (2.0, 0.0)),
        Problem(
            "E3",
            lambda t, y, xp: [y[1], y[0] ** 3 / 6 - y[0] + 2 * xp.sin(2.78535 * t)],
            (0.0, 0.0),
        ),
        Problem(
            "E4",
            lambda t, y, xp: [y[1], 0.032 - 0.4 * y[1] ** 2],
            (30.0, 0.0),
            lambda t: _columns(
                30 + 2.5 * np.log(np.cosh(_E4_B * t)), np.sqrt(0.08) * np.tanh(_E4_B * t)
            ),
        ),
        # asinh(y2) = log(25 / (25 - t))
        Problem(
            "E5",
            lambda t, y, xp: [y[1], xp.sqrt(1 + y[1] ** 2) / (25 - t)],
            (0.0, 0.0),
            lambda t: _columns(
                (25 * np.log(25 / (25 - t)) - t + t**2 / 50) / 2,
                (25 / (25 - t) - (25 - t) / 25) / 2,
            ),
        ),
    ],
}


@dataclasses.dataclass(frozen=True)
class ScheduleChoice:
    """What the default adjoint chose for one traced solve, and the batch it was told."""

    schedule: object
    batch_size: int


def record_schedule_choices(monkeypatch) -> list[ScheduleChoice]:
    """Records, for each solve traced from now on, the schedule the default adjoint
    chooses and the batch size it is told."""
    choices: list[ScheduleChoice] = []
    choose = ode.RecursiveCheckpointAdjoint.choose_schedule

    def recording(self, loop, init, params=None, diff=None, batch_size=1):
        schedule = choose(self, loop, init, params, diff, batch_size)
        choices.append(ScheduleChoice(schedule, batch_size))
        return schedule

    monkeypatch.setattr(ode.RecursiveCheckpointAdjoint, "choose_schedule", recording)
    return choices


def subjaxprs(eqn) -> list:
    """The jaxprs inside an equation's parameters (a loop's body, a call's function)."""
    found = []
    for value in eqn.params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            inner = getattr(item, "jaxpr", item)
            if hasattr(inner, "eqns"):
                found.append(inner)
    return found


def equations(jaxpr) -> list:
    """Every equation of a jaxpr, with those of the jaxprs inside it."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    return [
        e for eqn in jaxpr.eqns for e in (eqn, *(x for j in subjaxprs(eqn) for x in equations(j)))
    ]
