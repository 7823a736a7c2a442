"""A step's dense output: the one interpolant used by the loop (save times, events) and
by `Solution.evaluate`.

On a step from t0 with size h, at theta = (t - t0) / h in [0, 1],

    y(theta) = y0 + h sum_i w_i(theta) k_i,    w_i(theta) = sum_p table[i][p] theta^(p+1),

with k_i the step's dense vectors and `table` the solver's `interpolation` (Runge-Kutta
stages and their tableau's coefficients; a linear interpolant is one row (1,) and
k = (y1 - y0) / h).
"""

import functools
from collections.abc import Sequence
from math import comb

import jax.numpy as jnp
from jaxtyping import Array, Float

from ._flat import in_state_dtype

Table = tuple[tuple[float, ...], ...]


def position(t0: Array, t1: Array, t: Array) -> tuple[Array, Array]:
    """(h, theta): the step's size and where t lies in it.

    A step of no length is a solve's start, before its first step, whose dense vectors
    each hold the initial slope k0 (see `_step.empty_row`): it is taken as a step of unit
    length with theta = t - t0 (0: only t0 is read on it), so that its value
    y0 + sum_i b_i(t - t0) k0 = y0 + (t - t0) k0 (an interpolant's weights sum to theta)
    is y0 at t = t0 with the derivative in t (or in t0) that the first step's
    interpolant would give a save time at t0. `h` stays one number a step, not one a
    save time: XLA:CPU computed a block of save times' values about twice as slowly
    with a size for each (benchmarks/README.md)."""
    h = t1 - t0
    empty = h == 0
    return jnp.where(empty, 1, h), jnp.where(empty, t - t0, (t - t0) / jnp.where(empty, 1, h))


def _bernstein(monomial: Sequence[float]) -> tuple[float, ...]:
    """The Bernstein coefficients b_j of the polynomial sum_k monomial[k] x^k of degree
    n: the same polynomial as sum_j b_j C(n, j) x^j (1 - x)^(n - j)."""
    n = len(monomial) - 1
    return tuple(
        sum(comb(j, k) / comb(n, k) * monomial[k] for k in range(j + 1)) for j in range(n + 1)
    )


@functools.cache
def _weights(table: Table, slope: bool) -> tuple[tuple[float, ...], ...]:
    """Bernstein coefficients of each w_i (or w_i'), and last those of their sum."""
    rows = [*table, tuple(map(sum, zip(*table)))]
    if slope:  # w' = sum_p (p + 1) c_p theta^p
        monomials = [tuple((p + 1) * c for p, c in enumerate(row)) for row in rows]
    else:  # w = sum_p c_p theta^(p + 1)
        monomials = [(0.0, *row) for row in rows]
    return tuple(_bernstein(m) for m in monomials)


def _bernstein_basis(n: int, theta: Array) -> list[Array]:
    """The Bernstein polynomials of degree n at theta: C(n, j) theta^j (1 - theta)^(n - j)."""
    rest = 1 - theta
    return [comb(n, j) * theta**j * rest ** (n - j) for j in range(n + 1)]


def _combine(table: Table, theta: Array, ks: Sequence[Array], slope: bool) -> Array:
    """sum_i w_i(theta) k_i, or with w_i' for `slope`.

    Written for rounding: a Runge-Kutta interpolant's weights are large and alternate in
    sign, so summed as monomials (Tsit5's coefficients of w' reach 265, Dopri8's 582)
    they lose hundreds of ulps in float32. In the Bernstein basis, whose functions are
    positive on [0, 1], Tsit5's reach 38 and Dopri8's 11. And the sum is taken as
    (sum_i w_i) k_0 + sum_i w_i (k_i - k_0), the same sum, in which only the differences
    of the dense vectors (stage derivatives, close to each other on a step the tolerance
    accepts) are weighted."""
    weights = _weights(table, slope)
    basis = _bernstein_basis(len(weights[0]) - 1, theta)

    def weight(coeffs: Sequence[float], k: Array) -> Array:
        w = sum(c * basis[j] for j, c in enumerate(coeffs) if c != 0)
        return in_state_dtype(w, k)

    # Unrolled over the (static) coefficients: one fused elementwise expression, where a
    # `dot` would be a separate, slower library call on XLA:CPU.
    base = ks[0]
    acc = weight(weights[-1], base) * base
    for coeffs, k in zip(weights[1:-1], ks[1:], strict=True):
        if any(c != 0 for c in coeffs):
            acc = acc + weight(coeffs, k) * (k - base)
    return jnp.asarray(acc)


def value(
    table: Table, y0: Float[Array, "*m n"], h: Array, theta: Array, ks: Sequence[Array]
) -> Float[Array, "*m n"]:
    """y(theta). `h` and `theta` broadcast against `y0` and each k."""
    return y0 + in_state_dtype(h, y0) * _combine(table, theta, ks, slope=False)


def slope(table: Table, theta: Array, ks: Sequence[Array]) -> Array:
    """dy/dt = sum_i w_i'(theta) k_i."""
    return _combine(table, theta, ks, slope=True)


def on_step(table: Table, row: tuple, t1: Array, t: Array) -> Array:
    """The interpolant of a step `row` = (t0, y0, dense vectors) ending at t1, at t."""
    t0, y0, ks = row
    h, theta = position(t0, t1, t)
    return value(table, y0, h, theta, ks)


# --- A dense-output row: the step's dense vectors, or fewer vectors of the same curve ----
#
# `SaveAt(dense=True)` keeps a row per step for up to `max_steps` steps (as Diffrax does),
# and that buffer is most of such a solve's memory: under `vmap` it is zeroed, written and
# (in a gradient) met by a cotangent of its size on every call. An interpolant of degree d
# is the curve sum_j C(d, j) theta^j (1 - theta)^(d - j) c_j with c_0 = 0, so d control
# points c_1..c_d hold it: 4 vectors instead of Tsit5's 7 dense vectors (Dopri5 6 -> 4,
# Dopri8 10 -> 6, Kvaerno5 7 -> 4). A row keeps whichever is fewer.


def _degree(table: Table) -> int:
    """The interpolant's degree in theta: how many control points it has past c_0 = 0."""
    return len(_weights(table, False)[0]) - 1


def uses_points(table: Table) -> bool:
    """Whether a dense-output row keeps the interpolant's control points (fewer than
    the step's dense vectors)."""
    return _degree(table) < len(table)


def row_width(table: Table) -> int:
    """How many vectors a dense-output row keeps."""
    return min(_degree(table), len(table))


def row_vectors(table: Table, ks: Sequence[Array]) -> list[Array]:
    """What a dense-output row keeps of a step's dense vectors `ks`: the control points
    c_1..c_d where fewer, each taken as `_combine` sums (the weighted differences of the
    dense vectors, for rounding), else `ks` themselves."""
    if not uses_points(table):
        return list(ks)
    weights = _weights(table, False)
    base = ks[0]
    points = []
    for j in range(1, _degree(table) + 1):
        point = in_state_dtype(weights[-1][j], base) * base
        for coeffs, k in zip(weights[1:-1], ks[1:], strict=True):
            if coeffs[j] != 0:
                point = point + in_state_dtype(coeffs[j], k) * (k - base)
        points.append(jnp.asarray(point))
    return points


def row_value(
    table: Table, y0: Float[Array, "*m n"], h: Array, theta: Array, vectors: Sequence[Array]
) -> Float[Array, "*m n"]:
    """y(theta) from a dense-output row's `vectors` (see `row_vectors`)."""
    if not uses_points(table):
        return value(table, y0, h, theta, vectors)
    basis = _bernstein_basis(len(vectors), theta)
    curve = sum(in_state_dtype(b, c) * c for b, c in zip(basis[1:], vectors, strict=True))
    return y0 + in_state_dtype(h, y0) * curve


def row_slope(table: Table, theta: Array, vectors: Sequence[Array]) -> Array:
    """dy/dt from a dense-output row's `vectors`: for control points, the derivative of
    the curve, d sum_j C(d-1, j) theta^j (1 - theta)^(d-1-j) (c_(j+1) - c_j)."""
    if not uses_points(table):
        return slope(table, theta, vectors)
    points = [jnp.zeros_like(vectors[0]), *vectors]
    d = len(vectors)
    basis = _bernstein_basis(d - 1, theta)
    total = sum(
        in_state_dtype(d * b, points[j]) * (points[j + 1] - points[j]) for j, b in enumerate(basis)
    )
    return jnp.asarray(total)
