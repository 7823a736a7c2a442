"""Kvaerno's ESDIRK methods, and implicit Euler in the same form.

A. Kvaerno, "Singly diagonally implicit Runge-Kutta methods with an explicit first stage",
BIT 44 (2004) 489-502. Each method is stiffly accurate and L-stable; its embedded method of
one order lower is the second-to-last stage (also L-stable), so the error estimate is the
difference of the last two stage values. Kvaerno3 and Kvaerno4 are given in the paper as
functions of gamma, the L-stable root of a polynomial (below, to full double precision);
Kvaerno5's coefficients are the paper's decimals. Dense output is the cubic Hermite
interpolant through y0, y1 and the derivatives there (the first and last stages) for
Kvaerno3 and implicit Euler. A cubic between the long steps of Kvaerno5 is far less
accurate than the steps themselves (200 times the tolerance midway through a step of
Robertson's problem at rtol 1e-8), so Kvaerno5's dense output is a fourth-order
continuous extension of its stages, and Kvaerno4's a third-order one; both are also of
order 3 in stiff components, where a cubic Hermite is not (see `_continuous_extension`).

Implicit Euler (Hairer & Wanner II, sec. IV.3) is the one-stage method y1 = y0 + h f(t1, y1),
written with an explicit first stage k0 = f(t0, y0) that only serves its error estimate,
h (k1 - k0) / 2 (the difference from the trapezoidal rule), as Diffrax's does.
"""

import numpy as np

from .._local_interpolation import LocalLinearInterpolation
from ._continuous_extension import continuous_extension
from ._embedded import l_stable_embedding
from ._implicit import AbstractImplicitRungeKutta
from ._tableau import ImplicitTableau, hermite_interpolation, linear_interpolation


def _esdirk(c, a, gamma, order, embedded_row=None, dense_order=None, embedding_order=None):
    """A stiffly accurate ESDIRK tableau: b is the last row with gamma on the diagonal.

    Error estimate: against the published embedded solution, stage `embedded_row` (an
    index into `a`: b_error = b - that row with gamma, padded with zeros), or against the
    L-stable method of `embedding_order` on the same stages (see `_embedded`); the
    controller's exponent is then 1 / (embedding_order + 1). Dense output: the continuous
    extension of `dense_order` from the stages, or the cubic Hermite interpolant (None)."""
    b = tuple(a[-1]) + (gamma,)
    full = _full_matrix(a, gamma)
    error_order = None
    if embedding_order is None:
        embedded = tuple(a[embedded_row]) + (gamma,)
        embedded = embedded + (0.0,) * (len(b) - len(embedded))
    else:
        embedded = tuple(l_stable_embedding(full, embedding_order))
        error_order = embedding_order + 1
        if np.allclose(embedded, b, rtol=0, atol=1e-8):
            raise ValueError("the L-stable embedding is the method itself: no estimate")
    b_error = tuple(float(x - y) for x, y in zip(b, embedded))
    if dense_order is None:
        interp = hermite_interpolation(b)
    else:
        interp = continuous_extension(full, np.array(b), dense_order, 4, stiff_order=3)
    return ImplicitTableau(
        c=c, a=a, gamma=gamma, b=b, b_error=b_error, interp=interp, order=order,
        error_order=error_order,
    )  # fmt: skip


def _full_matrix(a, gamma) -> np.ndarray:
    """The (s, s) coefficient matrix: the strictly lower rows `a` and gamma on the
    diagonal of every stage after the explicit first."""
    s = len(a) + 1
    full = np.zeros((s, s))
    for i, row in enumerate(a):
        full[i + 1, : i + 1] = row
        full[i + 1, i + 1] = gamma
    return full


def _kvaerno3() -> ImplicitTableau:
    # Root of 6 g^3 - 18 g^2 + 9 g - 1 in (1/3, 1/2): L-stability of the 3rd-order method.
    g = 0.435866521508458999416
    a = (
        (g,),
        ((-4 * g**2 + 6 * g - 1) / (4 * g), (1 - 2 * g) / (4 * g)),
        ((6 * g - 1) / (12 * g), -1 / ((24 * g - 12) * g), (-6 * g**2 + 6 * g - 1) / (6 * g - 3)),
    )
    return _esdirk((0.0, 2 * g, 1.0, 1.0), a, g, order=3, embedded_row=1)


def _kvaerno4() -> ImplicitTableau:
    # Root of 24 g^4 - 96 g^3 + 72 g^2 - 16 g + 1 near 0.573: L-stability of 4th order.
    g = 0.572816062482134855408

    def p(*coeffs):  # a polynomial in g, highest power first
        return np.polyval(coeffs, g)

    a31 = p(144, -180, 81, -15, 1) * g / p(12, -6, 1) ** 2
    a32 = p(-36, 39, -15, 2) * g / p(12, -6, 1) ** 2
    a = (
        (g,),
        (a31, a32),
        (
            p(-144, 396, -330, 117, -18, 1) / (12 * g**2 * p(12, -9, 2)),
            p(72, -126, 69, -15, 1) / (12 * g**2 * p(3, -1)),
            p(-6, 6, -1) * p(12, -6, 1) ** 2 / (12 * g**2 * p(12, -9, 2) * p(3, -1)),
        ),
        (
            p(288, -312, 120, -18, 1) / (48 * g**2 * p(12, -9, 2)),
            p(24, -12, 1) / (48 * g**2 * p(3, -1)),
            -(p(12, -6, 1) ** 3) / (48 * g**2 * p(3, -1) * p(12, -9, 2) * p(6, -6, 1)),
            p(-24, 36, -12, 1) / p(24, -24, 4),
        ),
    )
    c = (0.0, 2 * g, g + a31 + a32, 1.0, 1.0)
    times = tuple(float(x) for x in c)
    return _esdirk(times, _floats(a), float(g), order=4, dense_order=3, embedding_order=2)


def _kvaerno5() -> ImplicitTableau:
    g = 0.26
    a = (
        (g,),
        (0.13, 0.84033320996790809),
        (0.22371961478320505, 0.47675532319799699, -0.06470895363112615),
        (0.16648564323248321, 0.10450018841591720, 0.03631482272098715, -0.13090704451073998),
        (
            0.13855640231268224,
            0.0,
            -0.04245337201752043,
            0.02446657898003141,
            0.61943039072480676,
        ),
        (
            0.13659751177640291,
            0.0,
            -0.05496908796538376,
            -0.04118626728321046,
            0.62993304899016403,
            0.06962479448202728,
        ),
    )
    c = (0.0,) + tuple(sum(row) + g for row in a)
    return _esdirk(c, a, g, order=5, dense_order=4, embedding_order=3)


def _floats(rows) -> tuple:
    return tuple(tuple(float(x) for x in row) for row in rows)


def _implicit_euler() -> ImplicitTableau:
    return ImplicitTableau(
        c=(0.0, 1.0),
        a=((0.0,),),
        gamma=1.0,
        b=(0.0, 1.0),
        b_error=(-0.5, 0.5),
        interp=linear_interpolation((0.0, 1.0)),
        order=1,
        error_order=2,  # the error estimate is that of a second-order pair (as Diffrax)
    )


class ImplicitEuler(AbstractImplicitRungeKutta):
    """Implicit (backward) Euler: first order, L-stable, one implicit stage. Error
    estimate against the trapezoidal rule; linear dense output."""

    tableau = _implicit_euler()
    # Diffrax's: the dense output of a `step` written over this one (see `_user`).
    interpolation_cls = LocalLinearInterpolation


class Kvaerno3(AbstractImplicitRungeKutta):
    """Kvaerno's 3(2) ESDIRK: 4 stages (3 implicit), L-stable, stiffly accurate, cubic
    Hermite dense output."""

    tableau = _kvaerno3()


class Kvaerno4(AbstractImplicitRungeKutta):
    """Kvaerno's 4th-order ESDIRK: 5 stages (4 implicit), L-stable, stiffly accurate,
    dense output of order 3 from its stages. Its error is estimated against an L-stable
    second-order method on the same stages (the published third-order one let errors of
    20 times the tolerance through on HIRES). Its second stage is evaluated past t1 (c = 1.15...)."""

    tableau = _kvaerno4()


class Kvaerno5(AbstractImplicitRungeKutta):
    """Kvaerno's 5th-order ESDIRK: 7 stages (6 implicit), L-stable, stiffly accurate,
    dense output of order 4 from its stages. Its error is estimated against an L-stable
    third-order method on the same stages (the published fourth-order one is about as
    accurate as the solution, so their difference bounds neither). The first choice for stiff problems at tight
    tolerances. Its third stage is evaluated past t1 (c = 1.23...)."""

    tableau = _kvaerno5()
