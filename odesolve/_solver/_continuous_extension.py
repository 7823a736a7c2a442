"""Continuous extensions: dense output of a Runge-Kutta method built from its own stages.

A continuous extension replaces the weights b by polynomials b_i(theta), theta in [0, 1],

    y(theta) = y0 + h sum_i b_i(theta) k_i,        b_i(0) = 0,  b_i(1) = b_i,

chosen so that y(theta) is accurate to order q at every theta: for every rooted tree t of
order r <= q, sum_i b_i(theta) Phi_i(t) = theta^r / gamma(t), with Phi(t) the tree's
elementary weight vector (Hairer, Norsett & Wanner I, sec. II.6 "Dense output"). We also
ask that y'(0) = k_1 = f(t0, y0) and y'(1) = k_s = f(t1, y1) (for a method whose last
stage is at y1), so the interpolant is C1 across steps, like a cubic Hermite.

The conditions are linear in the polynomial coefficients; the minimum-norm solution is
taken (its coefficients are small, which keeps the dense output's rounding small). Each
solve is checked to satisfy its conditions: an order the stages cannot reach is refused.
"""

import functools

import numpy as np


@functools.cache
def rooted_trees(order: int) -> tuple[tuple, ...]:
    """The rooted trees with `order` vertices, each a sorted tuple of its subtrees."""
    if order == 1:
        return ((),)
    forests = {tuple(sorted(f, key=repr)) for f in _forests(order - 1, order - 1)}
    return tuple(sorted(forests, key=repr))


def _forests(vertices: int, largest: int):
    """Multisets of trees with `vertices` vertices in all, each tree at most `largest`."""
    if vertices == 0:
        yield ()
        return
    for size in range(min(vertices, largest), 0, -1):
        for tree in rooted_trees(size):
            for rest in _forests(vertices - size, size):
                yield (tree,) + rest


def _tree_order(tree: tuple) -> int:
    return 1 + sum(_tree_order(child) for child in tree)


def _density(tree: tuple) -> float:
    """gamma(t): the tree's order times the densities of its subtrees."""
    return _tree_order(tree) * float(np.prod([_density(child) for child in tree]))


def _elementary_weights(tree: tuple, a: np.ndarray) -> np.ndarray:
    """Phi(t) per stage: the product over subtrees u of (A Phi(u))."""
    weights = np.ones(a.shape[0])
    for child in tree:
        weights = weights * (a @ _elementary_weights(child, a))
    return weights


Condition = tuple[np.ndarray, float, int | None]  # stage vector, value, power of theta


def _system(a: np.ndarray, b: np.ndarray, order: int, stiff_order: int, degree: int):
    """The linear system on the (stages, degree) coefficient matrix, flattened: each
    condition is a stage vector v whose combination sum_i b_i(theta) v_i must equal a
    given monomial value * theta^power (power None: zero for every theta)."""
    conditions: list[Condition] = [
        (_elementary_weights(tree, a), 1 / _density(tree), r)
        for r in range(1, order + 1)
        for tree in rooted_trees(r)
    ]
    conditions += _stiff_conditions(a, stiff_order)
    s = a.shape[0]
    rows, rhs = [], []
    for vector, value, power in conditions:
        for p in range(1, degree + 1):  # the coefficient of theta^p
            matrix = np.zeros((s, degree))
            matrix[:, p - 1] = vector
            rows.append(matrix.ravel())
            rhs.append(value if p == power else 0.0)
    for i in range(s):
        at_end, slope_start = np.zeros((s, degree)), np.zeros((s, degree))
        at_end[i] = 1.0  # b_i(1) = b_i: the interpolant reaches y1
        slope_start[i, 0] = 1.0  # y'(0) = k_1 = f(t0, y0)
        rows += [at_end.ravel(), slope_start.ravel()]
        rhs += [b[i], float(i == 0)]
    return np.array(rows), np.array(rhs)


def _stiff_conditions(a: np.ndarray, stiff_order: int) -> list[Condition]:
    """Conditions for the stiff components of an ESDIRK (explicit first stage, A[1:, 1:]
    invertible). In the stiff limit such a component is slaved to the others, and its
    stage derivatives are whatever the stage relation Y = y0 + h A k makes them: the
    dense output is then sum_i w_i(theta) (Y_i - y0) over the implicit stages, with
    w = A[1:, 1:]^-T b[1:](theta). It reproduces a smooth solution to order m when
    w . c^k = theta^k for k = 2..m (k = 1 is the classical first condition), and it does
    not feel the stages' own leading error, h^3 (A c^2 - c^3 / 3), when w is orthogonal
    to it (for stage order 2). Hairer & Wanner II, sec. VI.1, for the same view of the
    endpoint, where b^T A^-1 = e_s makes these hold at theta = 1 for a stiffly accurate
    method."""
    if stiff_order < 2:
        return []
    c = a.sum(axis=1)
    inverse = np.linalg.inv(a[1:, 1:])

    def on_stages(v: np.ndarray) -> np.ndarray:
        return np.concatenate([[0.0], inverse @ v[1:]])

    conditions: list[Condition] = [
        (on_stages(c**k), 1.0, k) for k in range(2, stiff_order + 1)
    ]
    stage_defect = a @ c**2 - c**3 / 3
    conditions.append((on_stages(stage_defect), 0.0, None))
    return conditions


def _principal_error(a: np.ndarray, order: int, degree: int):
    """The next order's error terms, sum_i b_i(theta) Phi_i(t) - theta^r / gamma(t) for
    the trees t of order r = order + 1, at theta on a grid in (0, 1]: (rows, rhs) of a
    least-squares problem on the flattened coefficients."""
    s, r = a.shape[0], order + 1
    rows, rhs = [], []
    for theta in np.linspace(0.1, 1.0, 10):
        powers = theta ** np.arange(1, degree + 1)
        for tree in rooted_trees(r):
            rows.append(np.outer(_elementary_weights(tree, a), powers).ravel())
            rhs.append(theta**r / _density(tree))
    return np.array(rows), np.array(rhs)


def continuous_extension(
    a: np.ndarray, b: np.ndarray, order: int, degree: int, stiff_order: int = 0
) -> tuple:
    """Interpolation rows (stages, degree), lowest power first, in the form of
    `ButcherTableau.interp`, for a method with full coefficient matrix `a` (s, s) and
    weights `b` (s,): dense output of classical order `order`, which for an ESDIRK also
    holds its stiff components to order `stiff_order` (0: no such condition). Of the
    polynomials that do, those with the smallest next-order error terms over the step
    (the freedom left is spent there, as in Dormand & Prince's dense outputs). Raises
    ValueError if no polynomials of this degree meet the conditions."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    matrix, rhs = _system(a, b, order, stiff_order, degree)
    particular = np.linalg.lstsq(matrix, rhs, rcond=None)[0]
    residual = np.abs(matrix @ particular - rhs).max()
    if residual > 1e-12:
        raise ValueError(
            f"no continuous extension of order {order} (stiff order {stiff_order}) and "
            f"degree {degree} from these stages (residual {residual:.2e})"
        )
    # Every solution is particular + free @ z; choose z for the smallest error terms.
    _, singular, vt = np.linalg.svd(matrix)
    rank = int(np.sum(singular > 1e-10 * singular[0]))
    free = vt[rank:].T
    error_rows, error_rhs = _principal_error(a, order, degree)
    z = np.linalg.lstsq(error_rows @ free, error_rhs - error_rows @ particular, rcond=None)[0]
    coeffs = particular + free @ z
    return tuple(tuple(float(x) for x in row) for row in coeffs.reshape(len(b), degree))
