"""Butcher tableaux with interpolation coefficients: a Runge-Kutta method as data.

With k_i = f(t0 + c_i h, y0 + h sum_j a_ij k_j), a step is

    y1 = y0 + h sum_i b_i k_i,        error estimate  h sum_i b_error_i k_i,

and the dense output on the step is, for theta = (t - t0) / h in [0, 1],

    y(theta) = y0 + h sum_i k_i sum_p interp[i, p] theta^(p+1).

Every interpolant we use is linear in the stages given y0, so one (stages, degree) matrix
describes it.
"""

import dataclasses
from fractions import Fraction
from typing import Any

import numpy as np


def check_consistency(tableau, diagonal: float, tol: float) -> None:
    """Checks shared by explicit and implicit tableaux: sizes; each row of `a` (plus the
    `diagonal` coefficient) sums to its c; b sums to 1 and b_error to 0; the interpolant
    reaches y1 at theta = 1."""
    c, a, b, b_error = tableau.c, tableau.a, tableau.b, tableau.b_error
    s = len(c)
    if c[0] != 0 or len(a) != s - 1 or len(b) != s:
        raise ValueError("tableau sizes do not match its number of stages")
    for i, row in enumerate(a):
        if len(row) != i + 1:
            raise ValueError(f"row {i + 1} of `a` must have {i + 1} entries")
        if not np.isclose(sum(row) + diagonal, c[i + 1], rtol=tol, atol=tol / 100):
            raise ValueError(f"row {i + 1} of `a` (plus the diagonal) does not sum to c[{i + 1}]")
    if not np.isclose(sum(b), 1.0, rtol=tol):
        raise ValueError("`b` must sum to 1")
    if b_error is not None and not np.isclose(sum(b_error), 0.0, atol=tol):
        raise ValueError("`b_error` must sum to 0")
    interp = np.asarray(tableau.interp)
    if interp.shape[0] != s or not np.allclose(interp.sum(1), b, atol=1e-12):
        raise ValueError("the interpolant must reach y1 at theta = 1 (rows sum to b)")


def used_stages(interp) -> tuple[int, ...]:
    """Stages an interpolant uses (a nonzero row); only these are recorded for dense
    output."""
    return tuple(i for i, row in enumerate(interp) if any(x != 0 for x in row))


@dataclasses.dataclass(frozen=True)
class ButcherTableau:
    """An explicit Runge-Kutta method.

    - `c`: (s,) stage times as fractions of h; c[0] == 0.
    - `a`: s - 1 rows, row i (0-based) holding the a_{i+1, j} for j <= i.
    - `b`: (s,) solution weights. `b_error`: (s,) error weights (b minus the embedded
      method's weights), or None for a method with no error estimate.
    - `interp`: (s, degree) dense-output coefficients, see the module docstring.
    - `order`: order of the solution; the error estimate is of order `order - 1`.
    """

    c: tuple
    a: tuple
    b: tuple
    b_error: tuple | None
    interp: tuple
    order: int

    def __post_init__(self):
        check_consistency(self, diagonal=0.0, tol=1e-12)

    @property
    def num_stages(self) -> int:
        return len(self.c)

    @property
    def error_order(self) -> int:
        """The controller's exponent is 1/error_order: following Diffrax (and Hairer's
        1/(min(p, p_hat) + 1)), the order of the solution."""
        return self.order

    @property
    def fsal(self) -> bool:
        """First same as last: the last stage is f(t1, y1), so it is the next step's first."""
        return len(self.a) > 0 and self.c[-1] == 1 and tuple(self.a[-1]) + (0,) == tuple(self.b)

    @property
    def interp_stages(self) -> tuple[int, ...]:
        """Stages the interpolant uses; only these are recorded for dense output."""
        return used_stages(self.interp)


def as_floats(rows: Any) -> Any:
    """Fractions (exact published values) to float tuples."""
    if isinstance(rows, (list, tuple)):
        return tuple(as_floats(r) for r in rows)
    return float(Fraction(rows) if isinstance(rows, str) else rows)


def linear_interpolation(b) -> tuple:
    """y(theta) = y0 + theta (y1 - y0)."""
    return tuple((float(bi),) for bi in b)


def hermite_interpolation(b) -> tuple:
    """The cubic matching y0, y1 and the slopes k_first at theta=0 and k_last at theta=1.

    With D = y1 - y0 = h sum b_i k_i:
    y(theta) = y0 + theta h k_first + theta^2 (3D - 2h k_first - h k_last)
               + theta^3 (h k_first + h k_last - 2D).
    For methods that are not FSAL, k_last is the last stage, an approximation to f(t1, y1).
    """
    s = len(b)
    rows = []
    for i, bi in enumerate(b):
        first, last = float(i == 0), float(i == s - 1)
        rows.append((first, 3 * bi - 2 * first - last, first + last - 2 * bi))
    return tuple(rows)


def factored_polynomial_interpolation(factors) -> tuple:
    """Interpolation rows from polynomials given as products of factors.

    `factors[i]` is a list of coefficient lists (highest power first, as `np.poly1d`);
    their product is b_i(theta), which must vanish at theta = 0.
    """
    rows = []
    for fs in factors:
        poly = np.poly1d([1.0])
        for f in fs:
            poly = poly * np.poly1d(f)
        coeffs = poly.coeffs[::-1]  # lowest power first
        if abs(coeffs[0]) > 1e-15:
            raise ValueError("interpolating polynomials must vanish at theta = 0")
        rows.append(tuple(float(x) for x in coeffs[1:]))
    degree = max(len(r) for r in rows)
    return tuple(r + (0.0,) * (degree - len(r)) for r in rows)


@dataclasses.dataclass(frozen=True)
class ImplicitTableau:
    """A diagonally implicit Runge-Kutta method with an explicit first stage (ESDIRK).

    Every implicit stage has the same diagonal coefficient `gamma`:

        k_1 = f(t0, y0),
        k_i = f(t0 + c_i h, y0 + h sum_{j<i} a_ij k_j + h gamma k_i),   i >= 2,

    so one factorisation of I - h gamma J serves every stage of a step.

    - `c`: (s,) stage times as fractions of h; c[0] == 0 (the explicit stage).
    - `a`: s - 1 rows, row i (0-based) holding the strictly lower a_{i+1, j}, j <= i.
    - `gamma`: the diagonal coefficient of stages 2..s.
    - `b`, `b_error`, `interp`, `order`: as for `ButcherTableau`.
    - `error_order`: the order the step-size controller assumes for the error estimate
      (None: `order`).

    The methods here are stiffly accurate (b is the last row of the full matrix), so y1
    is the last stage value and its derivative is the next step's first stage.
    """

    c: tuple
    a: tuple
    gamma: float
    b: tuple
    b_error: tuple | None
    interp: tuple
    order: int
    error_order: int | None = None

    def __post_init__(self):
        check_consistency(self, diagonal=self.gamma, tol=1e-10)
        if not self.stiffly_accurate:
            raise ValueError("the implicit engine needs a stiffly accurate method")

    @property
    def num_stages(self) -> int:
        return len(self.c)

    @property
    def stiffly_accurate(self) -> bool:
        """b is the last row of the full coefficient matrix: y1 is the last stage."""
        last = tuple(self.a[-1]) + (self.gamma,) if self.a else ()
        return self.c[-1] == 1 and np.allclose(last, self.b, rtol=0, atol=1e-15)

    @property
    def fsal(self) -> bool:
        """The last stage is (to the Newton tolerance) f(t1, y1): the next step's first."""
        return self.stiffly_accurate

    @property
    def interp_stages(self) -> tuple[int, ...]:
        """Stages the interpolant uses; only these are recorded for dense output."""
        return used_stages(self.interp)
