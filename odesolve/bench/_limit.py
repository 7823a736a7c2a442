"""The limit every adaptive solver is measured against: a hand-written `lax.scan` taking a
fixed number of explicit Runge-Kutta steps, with no adaptivity and no saving logic. Reverse
mode through it stores every step, so it also bounds what taping can reach."""

from collections.abc import Callable

import jax
import jax.numpy as jnp

# (c, a, b) of the classical fourth-order method.
RK4 = (
    (0.0, 0.5, 0.5, 1.0),
    ((0.5,), (0.0, 0.5), (0.0, 0.0, 1.0)),
    (1 / 6, 1 / 3, 1 / 3, 1 / 6),
)


def tableau_of(solver_class) -> tuple:
    """(c, a, b) of an odesolve Runge-Kutta class, e.g. `ode.Tsit5`."""
    tableau = solver_class.tableau
    return tableau.c, tableau.a, tableau.b


def is_fsal(tableau: tuple) -> bool:
    """First same as last: the last stage is f(t + h, y1), so the next step reuses it."""
    c, a, b = tableau
    return c[-1] == 1.0 and b[-1] == 0.0 and tuple(a[-1]) == tuple(b[:-1])


def evals_per_step(tableau: tuple) -> int:
    """Vector-field evaluations per step of `fixed_step_solve` (one more at the start)."""
    stages = len(tableau[0])
    return stages - 1 if is_fsal(tableau) else stages


def _step(field, tableau, t, y, k0, h, args):
    """One step from (t, y) given k0 = f(t, y); returns y1 and f(t + h, y1)."""
    c, a, b = tableau
    ks = [k0]
    for ci, row in zip(c[1:], a):
        stage_y = y + h * sum(aij * k for aij, k in zip(row, ks) if aij != 0.0)
        ks.append(field(t + ci * h, stage_y, args))
    if is_fsal(tableau):
        return stage_y, ks[-1]
    y1 = y + h * sum(bi * k for bi, k in zip(b, ks) if bi != 0.0)
    return y1, field(t + h, y1, args)


def fixed_step_solve(
    field: Callable, tableau: tuple, y0, t0: float, t1: float, num_steps: int, args
) -> jax.Array:
    """y(t1) after `num_steps` equal steps of `tableau` (c, a, b) from y(t0) = y0."""
    h = (t1 - t0) / num_steps
    times = t0 + h * jnp.arange(num_steps, dtype=y0.dtype)

    def body(carry, t):
        y, k0 = carry
        return _step(field, tableau, t, y, k0, jnp.asarray(h, y0.dtype), args), None

    (y1, _), _ = jax.lax.scan(body, (y0, field(t0, y0, args)), times)
    return y1
