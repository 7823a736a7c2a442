"""Tsitouras 5(4): Ch. Tsitouras, "Runge-Kutta pairs of order 5(4) satisfying only the
first column simplifying assumption", Comput. Math. Appl. 62 (2011) 770-775.

Coefficients and the dense-output polynomials b_i(theta) (given there in factored form) are
those of the paper's Table 1 and Section 3.
"""

from ._runge_kutta import AbstractRungeKutta
from ._tableau import ButcherTableau, factored_polynomial_interpolation

_c = (0.0, 0.161, 0.327, 0.9, 0.9800255409045097, 1.0, 1.0)
_a = (
    (0.161,),
    (-0.008480655492356989, 0.335480655492357),
    (2.8971530571054935, -6.359448489975075, 4.3622954328695815),
    (5.325864828439257, -11.748883564062828, 7.4955393428898365, -0.09249506636175525),
    (
        5.86145544294642,
        -12.92096931784711,
        8.159367898576159,
        -0.071584973281401,
        -0.028269050394068383,
    ),
    (
        0.09646076681806523,
        0.01,
        0.4798896504144996,
        1.379008574103742,
        -3.290069515436081,
        2.324710524099774,
    ),
)
_b = _a[-1] + (0.0,)
_b_error = (
    0.0017800110522257773,
    0.0008164344596567463,
    -0.007880878010261994,
    0.1447110071732629,
    -0.5823571654525552,
    0.45808210592918686,
    -1 / 66,
)
# b_i(theta), each a product of factors (coefficients highest power first).
_dense = (
    (
        [-1.0530884977290216, 0],
        [1, -1.3299890189751412],
        [1, -1.4364028541716351, 0.7139816917074209],
    ),
    ([0.1017, 0, 0], [1, -2.1966568338249754, 1.2949852507374631]),
    ([2.490627285651252793, 0, 0], [1, -2.38535645472061657, 1.57803468208092486]),
    ([-16.54810288924490272, 0, 0], [1, -1.21712927295533244], [1, -0.61620406037800089]),
    ([47.37952196281928122, 0, 0], [1, -1.203071208372362603], [1, -0.658047292653547382]),
    ([-34.87065786149660974, 0, 0], [1, -1.2], [1, -2 / 3]),
    ([2.5, 0, 0], [1, -1], [1, -0.6]),
)

_TSIT5 = ButcherTableau(
    c=_c,
    a=_a,
    b=_b,
    b_error=_b_error,
    interp=factored_polynomial_interpolation(_dense),
    order=5,
)


class Tsit5(AbstractRungeKutta):
    """Tsitouras' 5(4) method: 7 stages (6 evaluations per step, FSAL), 4th-order dense
    output. The usual first choice for non-stiff problems."""

    tableau = _TSIT5
