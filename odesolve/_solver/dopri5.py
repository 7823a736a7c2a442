"""Dormand-Prince 5(4): J. R. Dormand and P. J. Prince, "A family of embedded Runge-Kutta
formulae", J. Comput. Appl. Math. 6 (1980) 19-26. Dense output of L. F. Shampine, "Some
practical Runge-Kutta formulas", Math. Comp. 46 (1986) 135-150 (as in Hairer-Norsett-Wanner
I, sec. II.6).
"""

from typing import ClassVar

import numpy as np

from .._local_interpolation import FourthOrderPolynomialInterpolation
from ._runge_kutta import AbstractRungeKutta
from ._tableau import ButcherTableau, as_floats

_a = as_floats(
    (
        ("1/5",),
        ("3/40", "9/40"),
        ("44/45", "-56/15", "32/9"),
        ("19372/6561", "-25360/2187", "64448/6561", "-212/729"),
        ("9017/3168", "-355/33", "46732/5247", "49/176", "-5103/18656"),
        ("35/384", "0", "500/1113", "125/192", "-2187/6784", "11/84"),
    )
)
_b = _a[-1] + (0.0,)
# The embedded 4th-order weights of Dormand and Prince's paper that Diffrax and
# torchdiffeq use (Hairer's DOPRI5 code uses another pair, 5179/57600, ...): the same error
# estimate, so the same steps as theirs.
_b_hat = as_floats(
    ("1951/21600", "0", "22642/50085", "451/720", "-12231/42400", "649/6300", "1/60")
)
_interp = as_floats(
    (
        (
            "1",
            "-8048581381/2820520608",
            "8663915743/2820520608",
            "-12715105075/11282082432",
        ),
        ("0", "0", "0", "0"),
        (
            "0",
            "131558114200/32700410799",
            "-68118460800/10900136933",
            "87487479700/32700410799",
        ),
        ("0", "-1754552775/470086768", "14199869525/1410260304", "-10690763975/1880347072"),
        (
            "0",
            "127303824393/49829197408",
            "-318862633887/49829197408",
            "701980252875/199316789632",
        ),
        ("0", "-282668133/205662961", "2019193451/616988883", "-1453857185/822651844"),
        ("0", "40617522/29380423", "-110615467/29380423", "69997945/29380423"),
    )
)

_DOPRI5 = ButcherTableau(
    c=as_floats(("0", "1/5", "3/10", "4/5", "8/9", "1", "1")),
    a=_a,
    b=_b,
    b_error=tuple(x - y for x, y in zip(_b, _b_hat)),
    interp=_interp,
    order=5,
)


class _Dopri5Interpolation(FourthOrderPolynomialInterpolation):
    """Dopri5's dense output as an interpolation class, under Diffrax's name for it
    (user methods built from Dopri5's stages use it as their `interpolation_cls`). Its
    midpoint weights are the tableau's interpolant at theta = 1/2."""

    c_mid: ClassVar[np.ndarray] = np.array(  # type: ignore[misc]  # as in Diffrax
        [sum(c * 0.5 ** (p + 1) for p, c in enumerate(row)) for row in _interp]
    )


class Dopri5(AbstractRungeKutta):
    """Dormand-Prince 5(4): 7 stages (6 evaluations per step, FSAL), 4th-order dense output."""

    tableau = _DOPRI5
