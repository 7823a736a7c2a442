"""The one engine that steps every explicit Runge-Kutta tableau.

Stages are unrolled at trace time: the tableau is static, so each stage input
`y0 + h * sum_j a_ij k_j` is a single fused elementwise expression with the zero
coefficients dropped, and there is no stage loop for reverse mode to recompute.
"""

from collections.abc import Callable
from typing import Any, ClassVar

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float

from ._tableau import ButcherTableau


class StepContext(eqx.Module):
    """What the step loop tells a solver beyond the step itself. Explicit methods need
    none of it; implicit ones derive their Newton tolerances from it.

    - `tolerances`: the controller's (rtol, atol), or None (fixed step sizes).
    - `direction`: +1 or -1, the sign of t1 - t0: the vector field a solver is given runs
      in tau = direction * t, so a user-supplied Jacobian must be mapped the same way.
    - `spec`: the static layout of the user's state (`FlatSpec`).
    """

    tolerances: tuple | None
    direction: Any
    spec: Any = eqx.field(static=True)


class StepResult(eqx.Module):
    """One attempted step from (t0, y0) with size h.

    - `y1`: (n,) candidate solution at t0 + h.
    - `y_error`: (n,) local error estimate, or None (no embedded method / not needed).
    - `stages`: tuple of s arrays (n,), the derivatives k_i; the last is f(t1, y1) for
      FSAL methods.
    - `failed`: whether an implicit stage's Newton iterations failed (None: explicit).
    """

    y1: Float[Array, " n"]
    y_error: Float[Array, " n"] | None
    stages: tuple
    failed: Any = None


def _combine(base, h, coeffs, ks):
    """base + h * sum(c * k), skipping zero coefficients (static)."""
    terms = [c * k for c, k in zip(coeffs, ks) if c != 0]
    if not terms:
        return base
    acc = terms[0]
    for term in terms[1:]:
        acc = acc + term
    return acc if base is None else base + h * acc


def rk_step(
    tableau: ButcherTableau,
    vf: Callable,
    t0: Float[Array, ""],
    h: Float[Array, ""],
    y0: Float[Array, " n"],
    k0: Float[Array, " n"],
    args: Any,
    with_error: bool,
) -> StepResult:
    """Take one step of `tableau` given k0 = f(t0, y0)."""
    ks = [k0]
    stage_y = y0
    for ci, row in zip(tableau.c[1:], tableau.a):
        stage_y = _combine(y0, h, row, ks)
        ks.append(vf(t0 + ci * h, stage_y, args))
    # FSAL: the last stage was evaluated at y1 itself; reuse it rather than recombine.
    y1 = stage_y if tableau.fsal else _combine(y0, h, tableau.b, ks)
    y_error = None
    if with_error and tableau.b_error is not None:
        y_error = h * _combine(None, h, tableau.b_error, ks)
    return StepResult(y1=y1, y_error=y_error, stages=tuple(ks))


class AbstractRungeKutta(eqx.Module):
    """An explicit Runge-Kutta method given by its `tableau` (a class attribute)."""

    tableau: ClassVar[ButcherTableau]

    def order(self, terms: Any = None) -> int:
        return self.tableau.order

    def error_order(self, terms: Any = None) -> int:
        # The controller's exponent is 1/error_order; following Diffrax (and Hairer's
        # 1/(min(p, p_hat) + 1)) this is the order of the solution.
        return self.tableau.order

    @property
    def adaptive(self) -> bool:
        return self.tableau.b_error is not None

    def step(
        self, vf, t0, h, y0, k0, args, with_error: bool, context: StepContext | None = None
    ) -> StepResult:
        return rk_step(self.tableau, vf, t0, h, y0, k0, args, with_error)


def interpolation_weights(
    interp: Float[Array, "s d"], theta: Float[Array, "*m"]
) -> Float[Array, "*m s"]:
    """w_i(theta) = sum_p interp[i, p] theta^(p+1), so y = y0 + h sum_i w_i k_i."""
    degree = interp.shape[1]
    powers = jnp.stack([theta ** (p + 1) for p in range(degree)], axis=-1)
    return powers @ interp.T


def interpolation_slopes(
    interp: Float[Array, "s d"], theta: Float[Array, "*m"]
) -> Float[Array, "*m s"]:
    """d w_i / d theta, so dy/dt = sum_i w_i'(theta) k_i."""
    degree = interp.shape[1]
    powers = jnp.stack([(p + 1) * theta**p for p in range(degree)], axis=-1)
    return powers @ interp.T
