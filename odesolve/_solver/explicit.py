"""Low-order explicit methods: Euler, Heun, Midpoint, Ralston, Bosh3.

Tableaux from Hairer, Norsett & Wanner, *Solving ODEs I*, sec. II.1 (Euler, Heun, midpoint),
Ralston (1962, Math. Comp. 16:431) and Bogacki & Shampine (1989, Appl. Math. Lett. 2:321).
The 2-stage methods embed Euler for an error estimate, as Diffrax's do.
"""

from .._local_interpolation import LocalLinearInterpolation
from ._runge_kutta import AbstractRungeKutta
from ._tableau import ButcherTableau, hermite_interpolation, linear_interpolation


def _tableau(c, a, b, b_hat, order, interpolation):
    b_error = None if b_hat is None else tuple(x - y for x, y in zip(b, b_hat))
    return ButcherTableau(c=c, a=a, b=b, b_error=b_error, interp=interpolation(b), order=order)


_EULER = _tableau((0.0,), (), (1.0,), None, 1, linear_interpolation)
_HEUN = _tableau((0.0, 1.0), ((1.0,),), (0.5, 0.5), (1.0, 0.0), 2, hermite_interpolation)
_MIDPOINT = _tableau((0.0, 0.5), ((0.5,),), (0.0, 1.0), (1.0, 0.0), 2, hermite_interpolation)
_RALSTON = _tableau((0.0, 2 / 3), ((2 / 3,),), (0.25, 0.75), (1.0, 0.0), 2, hermite_interpolation)
_BOSH3 = _tableau(
    (0.0, 1 / 2, 3 / 4, 1.0),
    ((1 / 2,), (0.0, 3 / 4), (2 / 9, 1 / 3, 4 / 9)),
    (2 / 9, 1 / 3, 4 / 9, 0.0),
    (7 / 24, 1 / 4, 1 / 3, 1 / 8),
    3,
    hermite_interpolation,
)


class Euler(AbstractRungeKutta):
    """Forward Euler: first order, one stage, no error estimate (fixed steps only)."""

    tableau = _EULER
    # Diffrax's: the dense output of a `step` written over this one (see `_user`).
    interpolation_cls = LocalLinearInterpolation


class Heun(AbstractRungeKutta):
    """Heun's method (explicit trapezoid): second order, embedded Euler."""

    tableau = _HEUN


class Midpoint(AbstractRungeKutta):
    """Explicit midpoint: second order, embedded Euler."""

    tableau = _MIDPOINT


class Ralston(AbstractRungeKutta):
    """Ralston's second-order method (minimal truncation error), embedded Euler."""

    tableau = _RALSTON


class Bosh3(AbstractRungeKutta):
    """Bogacki-Shampine 3(2): third order, FSAL, cubic Hermite dense output."""

    tableau = _BOSH3
