"""Additive Runge-Kutta tableaux: an IMEX method as data.

For dy/dt = f_E(t, y) + f_I(t, y), a non-stiff part stepped explicitly and a stiff part
stepped implicitly, both parts share the stage values (Kennedy & Carpenter, "Additive
Runge-Kutta schemes for convection-diffusion-reaction equations", Appl. Numer. Math. 44
(2003), sec. 2):

    Y_i = y0 + h sum_{j<i} (aE_ij kE_j + aI_ij kI_j) + h aI_ii kI_i,
    kE_i = f_E(t0 + cE_i h, Y_i),   kI_i = f_I(t0 + cI_i h, Y_i),
    y1 = y0 + h sum_i (bE_i kE_i + bI_i kI_i),

with the error estimate h sum_i (eE_i kE_i + eI_i kI_i) and the dense output

    y(theta) = y0 + h sum_i sum_p (PE[i, p] kE_i + PI[i, p] kI_i) theta^(p+1).
"""

import dataclasses
from typing import Any

import numpy as np


def _rows(x: Any) -> tuple:
    return tuple(tuple(float(v) for v in row) for row in np.asarray(x, dtype=float))


def _vector(x: Any) -> tuple | None:
    return None if x is None else tuple(float(v) for v in np.asarray(x, dtype=float))


@dataclasses.dataclass(frozen=True)
class AdditiveTableau:
    """An additive (IMEX) Runge-Kutta method of s stages.

    - `c_explicit`, `c_implicit`: (s,) stage times of each part, as fractions of h.
    - `a_explicit`: (s, s) strictly lower triangular; `a_implicit`: (s, s) lower
      triangular, its diagonal the implicit coefficient of each stage (0: explicit).
    - `b_explicit`, `b_implicit`: (s,) solution weights.
    - `error_explicit`, `error_implicit`: (s,) error weights (summing to 0), or None for
      a method without an error estimate.
    - `interp_explicit`, `interp_implicit`: (s, degree) dense-output coefficients (see
      the module docstring); each row sums to its b, so the interpolant reaches y1.
    - `order`: order of the solution; `error_order`: the exponent the step-size
      controller assumes (None: `order`).

    Arrays may be given as nested sequences or NumPy arrays; they are kept as tuples.
    """

    c_explicit: tuple
    c_implicit: tuple
    a_explicit: tuple
    a_implicit: tuple
    b_explicit: tuple
    b_implicit: tuple
    error_explicit: tuple | None
    error_implicit: tuple | None
    interp_explicit: tuple
    interp_implicit: tuple
    order: int
    error_order: int | None = None

    def __post_init__(self) -> None:
        for name in ("a_explicit", "a_implicit", "interp_explicit", "interp_implicit"):
            object.__setattr__(self, name, _rows(getattr(self, name)))
        for name in ("c_explicit", "c_implicit", "b_explicit", "b_implicit"):
            object.__setattr__(self, name, _vector(getattr(self, name)))
        for name in ("error_explicit", "error_implicit"):
            object.__setattr__(self, name, _vector(getattr(self, name)))
        _check(self)

    @property
    def num_stages(self) -> int:
        return len(self.b_explicit)

    @property
    def diagonal(self) -> tuple[float, ...]:
        """The implicit coefficient of each stage."""
        return tuple(self.a_implicit[i][i] for i in range(self.num_stages))

    @property
    def implicit(self) -> bool:
        """Whether any stage is implicit."""
        return any(d != 0 for d in self.diagonal)

    @property
    def adaptive(self) -> bool:
        return self.error_explicit is not None

    @property
    def fsal(self) -> bool:
        """First same as last: the last stage of both parts is evaluated at (t1, y1), so
        it is the next step's (explicit) first stage."""
        last = self.num_stages - 1
        return (
            self.diagonal[0] == 0
            and self.c_explicit[last] == 1
            and self.c_implicit[last] == 1
            and self.a_explicit[last] == self.b_explicit
            and self.a_implicit[last] == self.b_implicit
        )


def _check(tableau: AdditiveTableau) -> None:
    """Shapes and the consistency conditions of each part: rows of a sum to c, b sums to
    1, the error weights to 0, the interpolant reaches y1."""
    s = tableau.num_stages
    a_e, a_i = np.array(tableau.a_explicit), np.array(tableau.a_implicit)
    if a_e.shape != (s, s) or a_i.shape != (s, s):
        raise ValueError(f"an additive tableau of {s} stages needs (s, s) matrices")
    if np.any(np.triu(a_e) != 0) or np.any(np.triu(a_i, 1) != 0):
        raise ValueError("the explicit matrix must be strictly lower triangular, the other lower")
    if a_i[0, 0] != 0:
        raise ValueError("the first stage must be explicit (a zero first diagonal coefficient)")
    if (tableau.error_explicit is None) != (tableau.error_implicit is None):
        raise ValueError("give error weights for both parts or for neither")
    parts = (
        (a_e, tableau.c_explicit, tableau.b_explicit, tableau.error_explicit),
        (a_i, tableau.c_implicit, tableau.b_implicit, tableau.error_implicit),
    )
    interps = (tableau.interp_explicit, tableau.interp_implicit)
    for (a, c, b, error), interp in zip(parts, interps):
        if len(c) != s or not np.allclose(a.sum(1), c, rtol=1e-8, atol=1e-10):
            raise ValueError("each row of a tableau's coefficients must sum to its c")
        if not np.isclose(sum(b), 1.0, rtol=1e-10):
            raise ValueError("a tableau's b must sum to 1")
        if error is not None and not np.isclose(sum(error), 0.0, atol=1e-10):
            raise ValueError("a tableau's error weights must sum to 0")
        if len(interp) != s or not np.allclose(np.sum(interp, 1), b, rtol=1e-8, atol=1e-10):
            raise ValueError("the interpolant must reach y1 at theta = 1 (rows sum to b)")
