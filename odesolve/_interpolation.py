"""A step's dense output: the one interpolant used by the loop (save times, events) and
by `Solution.evaluate`.

On a step from t0 with size h, at theta = (t - t0) / h in [0, 1],

    y(theta) = y0 + h sum_i w_i(theta) k_i,    w_i(theta) = sum_p table[i][p] theta^(p+1),

with k_i the step's dense vectors and `table` the solver's `interpolation` (Runge-Kutta
stages and their tableau's coefficients; a linear interpolant is one row (1,) and
k = (y1 - y0) / h).
"""

from collections.abc import Sequence

import jax.numpy as jnp
from jaxtyping import Array, Float

from ._flat import in_state_dtype

Table = tuple[tuple[float, ...], ...]


def position(t0: Array, t1: Array, t: Array) -> tuple[Array, Array]:
    """(h, theta): the step's size and where t lies in it (0 on a step of no length)."""
    h = t1 - t0
    return h, jnp.where(h == 0, 0, (t - t0) / jnp.where(h == 0, 1, h))


def _combine(table: Table, theta: Array, ks: Sequence[Array], powers_of) -> Array:
    # Unrolled over the (static) coefficients: one fused elementwise expression, where a
    # `dot` would be a separate, slower library call on XLA:CPU.
    powers = [powers_of(theta, p) for p in range(len(table[0]))]
    acc: Array | float = 0.0
    for coeffs, k in zip(table, ks, strict=True):
        weight = sum(c * powers[p] for p, c in enumerate(coeffs) if c != 0)
        acc = acc + in_state_dtype(weight, k) * k
    return jnp.asarray(acc)


def value(
    table: Table, y0: Float[Array, "*m n"], h: Array, theta: Array, ks: Sequence[Array]
) -> Float[Array, "*m n"]:
    """y(theta). `h` and `theta` broadcast against `y0` and each k."""
    return y0 + in_state_dtype(h, y0) * _combine(table, theta, ks, lambda x, p: x ** (p + 1))


def slope(table: Table, theta: Array, ks: Sequence[Array]) -> Array:
    """dy/dt = sum_i w_i'(theta) k_i."""
    return _combine(table, theta, ks, lambda x, p: (p + 1) * x**p)


def on_step(table: Table, row: tuple, t1: Array, t: Array) -> Array:
    """The interpolant of a step `row` = (t0, y0, dense vectors) ending at t1, at t."""
    t0, y0, ks = row
    h, theta = position(t0, t1, t)
    return value(table, y0, h, theta, ks)
