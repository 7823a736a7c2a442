"""Whitaker and Kar's IMEX method for fast-slow problems.

J. S. Whitaker and S. K. Kar, "Implicit-explicit Runge-Kutta methods for fast-slow wave
problems", Monthly Weather Review 141 (2013) 3426-3434: an explicit tableau of order 3
for the slow (non-stiff) part paired with a diagonally implicit one of order 2 for the
fast (stiff) part, 4 stages, first same as last. The error estimate compares with Heun's
method; the dense output is the cubic Hermite interpolant through y0, y1 and the
derivatives there (the first and last stages of both parts), as Diffrax's.
"""

from ._additive import AbstractAdditiveRungeKutta
from ._additive_tableau import AdditiveTableau
from ._tableau import as_floats, hermite_interpolation

_B_EXPLICIT = as_floats(("1/2", "-1/2", 1, 0))
_B_IMPLICIT = as_floats(("3/8", 0, "3/8", "1/4"))

_SIL3 = AdditiveTableau(
    c_explicit=as_floats((0, "1/3", "2/3", 1)),
    c_implicit=as_floats((0, "1/3", "2/3", 1)),
    a_explicit=as_floats(
        ((0, 0, 0, 0), ("1/3", 0, 0, 0), ("1/6", "1/2", 0, 0), ("1/2", "-1/2", 1, 0))
    ),
    # Its diagonal varies from stage to stage (an EDIRK): one factorisation per stage.
    a_implicit=as_floats(
        ((0, 0, 0, 0), ("1/6", "1/6", 0, 0), ("1/3", 0, "1/3", 0), ("3/8", 0, "3/8", "1/4"))
    ),
    b_explicit=_B_EXPLICIT,
    b_implicit=_B_IMPLICIT,
    error_explicit=as_floats((0, "1/2", -1, "1/2")),
    error_implicit=as_floats(("1/8", 0, "-3/8", "1/4")),
    interp_explicit=hermite_interpolation(_B_EXPLICIT),
    interp_implicit=hermite_interpolation(_B_IMPLICIT),
    order=2,
)


class Sil3(AbstractAdditiveRungeKutta):
    """Whitaker and Kar's IMEX method: order 3 in the explicit part and 2 in the implicit
    part (order 2 overall), 4 stages, first same as last, cubic Hermite dense output.
    Takes `MultiTerm(ODETerm(slow), ODETerm(fast))`."""

    tableau = _SIL3
