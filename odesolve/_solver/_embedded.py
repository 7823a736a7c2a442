"""An embedded method for an ESDIRK's error estimate, built from its own stages.

The error estimate of a step is y1 - y1_hat, with y1_hat = y0 + h sum_i b_hat_i k_i of a
lower order. The controller trusts it as a bound on y1's own error, which holds only while
the embedded method's leading error term dominates y1's: a safe margin is one order more
than usual (Hairer & Wanner II, sec. IV.8: Radau IIA of order 5 estimates its error with an
embedded method of order 3). Kvaerno's published order-4 embedding of his order-5 method
is too accurate for this (its fifth-order error coefficients are at most 1.2e-3, the main
method's sixth-order ones up to 5.8e-3): the two errors are of the same size at the steps
the controller takes, their difference says little about either, and steps it accepts
were 100 to 400 times the tolerance on a smooth problem.

`l_stable_embedding` gives weights of a chosen order whose stability function vanishes at
infinity, like the method's own: a stiff component at equilibrium then adds nothing to the
estimate, and the difference is dominated by the embedded method's error.
"""

import numpy as np

from ._continuous_extension import _density, _elementary_weights, rooted_trees


def _stiff_limit(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(u1, u0) with z (I - z A)^-1 1 = z u1 + u0 + O(1/z) as z -> infinity, for an ESDIRK
    (first row of A zero, A[1:, 1:] invertible). A method b then has stability function
    R(z) = 1 + z b.u1 + b.u0 + O(1/z): bounded when b.u1 = 0, zero at infinity when also
    1 + b.u0 = 0."""
    inverse = np.linalg.inv(a[1:, 1:])
    u1 = np.concatenate([[1.0], -inverse @ a[1:, 0]])
    u0 = np.concatenate([[0.0], inverse @ (u1[1:] - 1.0)])
    return u1, u0


def l_stable_embedding(a: np.ndarray, order: int) -> np.ndarray:
    """Weights (s,) on the stages of the ESDIRK with full coefficient matrix `a` (s, s)
    that give a method of classical order `order` whose stability function is zero at
    infinity; the smallest such weights when several exist. Raises ValueError if none
    exists."""
    a = np.asarray(a, float)
    rows = [_elementary_weights(tree, a) for r in range(1, order + 1) for tree in rooted_trees(r)]
    rhs = [1 / _density(tree) for r in range(1, order + 1) for tree in rooted_trees(r)]
    u1, u0 = _stiff_limit(a)
    matrix = np.array(rows + [u1, u0])
    values = np.array(rhs + [0.0, -1.0])
    weights = np.linalg.lstsq(matrix, values, rcond=None)[0]
    residual = np.abs(matrix @ weights - values).max()
    if residual > 1e-12:
        raise ValueError(
            f"no L-stable method of order {order} on these stages (residual {residual:.2e})"
        )
    return weights
