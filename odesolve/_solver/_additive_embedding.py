"""An embedded method for an additive (IMEX) Runge-Kutta method's error estimate.

As for an ESDIRK (see `_embedded`), the error estimate y1 - y1_hat bounds y1's error only
while the embedded method's leading error term dominates y1's. Kennedy and Carpenter's
published embeddings of their ARK methods are one order lower and nearly as accurate as
the methods themselves, and their stability functions do not vanish at infinity: steps
they accept were 100 to 3000 times the tolerance (KenCarp5 on Robertson's problem and on
Lotka-Volterra at rtol 1e-8).

`additive_l_stable_embedding` gives weights of a chosen lower order on the method's own
stages, the same weights for the explicit and the implicit part. For an additive method
the order conditions are those of the bi-coloured trees (Kennedy & Carpenter 2003, sec.
3.1): each vertex other than the root is coupled to its parent through the explicit or
the implicit matrix, every colouring a condition of its own, so the embedded solution is
of its order for any split of the field. Its implicit stability function also vanishes
at infinity, like the method's own.
"""

import itertools
from collections.abc import Iterator

import numpy as np

from ._continuous_extension import _density, rooted_trees
from ._embedded import _stiff_limit

ColouredTree = tuple[tuple[int, "ColouredTree"], ...]  # (matrix index, subtree) per child


def _colourings(tree: tuple) -> Iterator[ColouredTree]:
    """Every assignment of a matrix (0: explicit, 1: implicit) to each edge of `tree`."""
    children = [[(m, sub) for m in (0, 1) for sub in _colourings(c)] for c in tree]
    for combination in itertools.product(*children):
        yield tuple(sorted(combination, key=repr))


def _coloured_weights(tree: ColouredTree, matrices: tuple[np.ndarray, ...]) -> np.ndarray:
    """Phi(t) per stage: the product over children (m, u) of (A_m Phi(u))."""
    weights = np.ones(matrices[0].shape[0])
    for m, child in tree:
        weights = weights * (matrices[m] @ _coloured_weights(child, matrices))
    return weights


def additive_conditions(
    a_explicit: np.ndarray, a_implicit: np.ndarray, order: int
) -> tuple[np.ndarray, np.ndarray]:
    """(rows, values): weights b shared by both parts give a method of order `order` for
    every split of the field iff rows @ b = values."""
    matrices = (np.asarray(a_explicit, float), np.asarray(a_implicit, float))
    rows, values = [], []
    for r in range(1, order + 1):
        for tree in rooted_trees(r):
            for coloured in set(_colourings(tree)):
                rows.append(_coloured_weights(coloured, matrices))
                values.append(1 / _density(tree))
    return np.array(rows), np.array(values)


def additive_l_stable_embedding(
    a_explicit: np.ndarray, a_implicit: np.ndarray, order: int
) -> np.ndarray:
    """Weights (s,) on the stages of the additive method with (s, s) matrices `a_explicit`
    and `a_implicit` (an ESDIRK) that give a method of order `order` in every coupling,
    whose implicit stability function is zero at infinity; the smallest such weights when
    several exist. Raises ValueError if none exists."""
    rows, values = additive_conditions(a_explicit, a_implicit, order)
    u1, u0 = _stiff_limit(np.asarray(a_implicit, float))
    matrix = np.vstack([rows, u1, u0])
    values = np.concatenate([values, [0.0, -1.0]])
    weights = np.linalg.lstsq(matrix, values, rcond=None)[0]
    residual = np.abs(matrix @ weights - values).max()
    if residual > 1e-12:
        raise ValueError(
            f"no L-stable embedding of order {order} on these stages (residual {residual:.2e})"
        )
    return weights
