"""The engine that steps every additive (IMEX) tableau (see `AdditiveTableau`).

An IMEX solver takes `MultiTerm(ODETerm(explicit), ODETerm(implicit))`; the loop's field
is then a `SplitField`, whose parts a step asks for one at a time. The first stage is
explicit (or carried, first same as last); each later stage solves its implicit part by
chord iterations (`_chord.solve_stage`, with its implicit-function derivative) and then
evaluates the explicit part at the stage value. One Jacobian of the implicit part per
step, at its start; one LU factorisation per step when every implicit stage has the same
diagonal coefficient (ESDIRK), else one per stage.
"""

from collections.abc import Callable
from typing import Any, ClassVar

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Bool, Float

from .._flat import PyTree, in_state_dtype
from .._term import AbstractTerm, MultiTerm, ODETerm, OnePart
from ._additive_tableau import AdditiveTableau
from ._base import StartInput, StepContext, StepInput, StepResult
from ._chord import FlatJacobian, frozen, lu_factor, solve_stage
from ._implicit import AbstractImplicitRungeKutta, _newton_settings, _RealView, as_complex, as_real
from ._runge_kutta import Stages, StagesInput

EXPLICIT, IMPLICIT = 0, 1


class PartOf(eqx.Module):
    """One part of a `SplitField`, as a field of its own (a Module, so that the arrays
    of the field it wraps stay leaves for `solve_stage`)."""

    vf: Any
    which: int = eqx.field(static=True)

    def __call__(self, t: Float[Array, ""], y: Float[Array, " n"], args: PyTree) -> Any:
        return self.vf(t, y, OnePart(args, self.which))

    def at_start(self, t: Float[Array, ""], y: Float[Array, " n"], args: PyTree) -> Any:
        # Only the loop's `StepField` tells the start of a step apart.
        at_start = getattr(self.vf, "at_start", self.vf)
        return at_start(t, y, OnePart(args, self.which))


class AdditiveStages(eqx.Module):
    """A step's stages: y1, its error estimate, the stage derivatives of each part
    (s, n), and whether an implicit stage failed."""

    y1: Float[Array, " n"]
    y_error: Float[Array, " n"] | None
    explicit: Float[Array, "s n"]
    implicit: Float[Array, "s n"]
    failed: Bool[Array, ""]


def _matrix(rows: tuple, dtype: Any) -> Array:
    return jnp.asarray(np.array(rows, dtype=float), dtype)


def additive_step(
    tableau: AdditiveTableau,
    solver: "AbstractAdditiveRungeKutta",
    fields: tuple[Callable, Callable],
    t0: Float[Array, ""],
    h: Float[Array, ""],
    y0: Float[Array, " n"],
    k0: tuple[Float[Array, " n"], Float[Array, " n"]],
    args: PyTree,
    with_error: bool,
    context: StepContext | None,
) -> AdditiveStages:
    """One step given the first stage of each part, k0 = (f_E(t0, y0), f_I(t0, y0)). A
    failed implicit stage makes the error estimate +inf (adaptive) or y1 NaN (fixed)."""
    adaptive = with_error and tableau.adaptive
    settings = jacobian = jac = None
    if tableau.implicit:
        settings = _newton_settings(solver, context if adaptive else None, y0, adaptive)
        direction = 1 if context is None else lax.stop_gradient(context.direction)
        spec = None if context is None else context.spec
        jacobian = FlatJacobian(solver.jacobian, direction, spec)
        frozen_vf, frozen_args, frozen_t0, frozen_y0 = frozen((fields[1], args, t0, y0))
        jac = jacobian(frozen_vf, frozen_t0, frozen_y0, frozen_args)
    ke, ki, failed = _stages(tableau, fields, args, t0, h, y0, k0, jac, settings, jacobian)
    dtype, hy = y0.dtype, in_state_dtype(h, y0)
    weighted = lambda e, i: _matrix(e, dtype) @ ke + _matrix(i, dtype) @ ki
    y1 = y0 + hy * weighted(tableau.b_explicit, tableau.b_implicit)
    y_error = None
    if adaptive:
        error = hy * weighted(tableau.error_explicit, tableau.error_implicit)
        y_error = jnp.where(failed, jnp.inf, error)
    elif tableau.implicit:
        y1 = jnp.where(failed, jnp.nan, y1)
    return AdditiveStages(y1, y_error, ke, ki, failed)


def _stages(tableau, fields, args, t0, h, y0, k0, jac, settings, jacobian):
    """Stages 2..s in a `lax.scan` (each implicit one is a while loop: unrolled, every
    transformation of the step would trace and compile s - 1 Newton solves). Returns
    the stage derivatives of each part, (s, n) twice, and whether a stage failed."""
    s, dtype = tableau.num_stages, y0.dtype
    explicit_vf, implicit_vf = fields
    a_e, a_i = _matrix(tableau.a_explicit, dtype), _matrix(tableau.a_implicit, dtype)
    c_e, c_i = (jnp.asarray(c, h.dtype) for c in (tableau.c_explicit, tableau.c_implicit))
    diagonal = jnp.asarray(tableau.diagonal, h.dtype)
    # ESDIRK: one factorisation serves every stage (and a refreshed one the later ones).
    one_gamma = len(set(tableau.diagonal[1:])) == 1
    hy = in_state_dtype(h, y0)

    def stage(carry: PyTree, i: Array) -> tuple[PyTree, None]:
        ke, ki, failed, lu = carry
        base = y0 + hy * (a_e[i] @ ke + jnp.tril(a_i, -1)[i] @ ki)
        hg = h * diagonal[i]
        if tableau.implicit:
            lu = lu if one_gamma else lu_factor(jac, lax.stop_gradient(hg))
            k, ok, lu = solve_stage(
                implicit_vf, args, t0 + c_i[i] * h, in_state_dtype(hg, y0), base,
                guess=lax.stop_gradient(ki[i - 1]), lu=lax.stop_gradient(lu),
                settings=settings, skip=failed, jacobian=jacobian,
            )  # fmt: skip
            failed = failed | ~ok
        else:
            k = implicit_vf(t0 + c_i[i] * h, base, args)
        stage_y = base + in_state_dtype(hg, y0) * k
        ki = ki.at[i].set(k)
        ke = ke.at[i].set(explicit_vf(t0 + c_e[i] * h, stage_y, args))
        return (ke, ki, failed, lu), None

    lu = None
    if tableau.implicit and one_gamma:
        lu = lu_factor(jac, lax.stop_gradient(h * diagonal[1]))
    elif tableau.implicit:  # factorised stage by stage; this only gives the carry its shape
        n = y0.shape[0]
        lu = (jnp.zeros((n, n), dtype), jnp.zeros((n,), jnp.int32))
    zeros = jnp.zeros((s, y0.shape[0]), dtype)
    init = (zeros.at[0].set(k0[0]), zeros.at[0].set(k0[1]), jnp.asarray(False), lu)
    (ke, ki, failed, _), _ = lax.scan(stage, init, jnp.arange(1, s))
    return ke, ki, failed


class AbstractAdditiveRungeKutta(AbstractImplicitRungeKutta):
    """An IMEX method given by its additive `tableau` (a class attribute): takes
    `MultiTerm(ODETerm(explicit), ODETerm(implicit))`, steps the first part explicitly
    and the second implicitly. The Newton options are those of the implicit solvers
    (`AbstractImplicitRungeKutta`); `jacobian=`, if given, is df/dy of the implicit part.
    """

    tableau: eqx.AbstractClassVar[AdditiveTableau]  # type: ignore[assignment]
    term_structure: ClassVar[Any] = MultiTerm[tuple[AbstractTerm, AbstractTerm]]

    def order(self, terms: ODETerm | None = None) -> int:
        return self.tableau.order

    def error_order(self, terms: ODETerm | None = None) -> int:
        return self.tableau.error_order or self.tableau.order

    @property
    def adaptive(self) -> bool:
        return self.tableau.adaptive

    @property
    def interpolation(self) -> tuple[tuple[float, ...], ...]:
        # The dense vectors are the interpolant's coefficients of theta, theta^2, ...
        degree = _degree(self.tableau)
        return tuple(tuple(float(p == q) for q in range(degree)) for p in range(degree))

    def start(self, first: StartInput) -> Any:
        if not self.tableau.fsal:
            return None
        return _first_stages(first.vf, first.t0, first.y0, first.args)

    def advance(self, step: StepInput) -> StepResult:
        k0 = _carried_or_fresh(self.tableau.fsal, step)
        out = self._stages(
            step.vf, step.t0, step.h, step.y0, k0, step.args, step.with_error, step.context
        )
        dense = _dense(self.tableau, out.explicit, out.implicit)
        carried = (out.explicit[-1], out.implicit[-1]) if self.tableau.fsal else None
        failed = out.failed if self.tableau.implicit else None
        return StepResult(out.y1, out.y_error, dense, carried, failed)

    def _stages(self, vf, t0, h, y0, k0, args, with_error, context) -> AdditiveStages:
        fields = (PartOf(vf, EXPLICIT), PartOf(vf, IMPLICIT))
        if not jnp.iscomplexobj(y0):
            return additive_step(
                self.tableau, self, fields, t0, h, y0, k0, args, with_error, context
            )
        # A complex state is stepped as its real and imaginary parts (see `_implicit`).
        if getattr(self, "jacobian", None) is not None:
            raise ValueError(
                "jacobian=...: a user-supplied Jacobian needs a real state; for a complex "
                "one leave jacobian=None (df/dy is then taken of the real and imaginary parts)."
            )
        real_fields = (_RealView(fields[0]), _RealView(fields[1]))
        real_k0 = (as_real(k0[0]), as_real(k0[1]))
        out = additive_step(
            self.tableau, self, real_fields, t0, h, as_real(y0), real_k0, args, with_error, context
        )
        error = None if out.y_error is None else as_complex(out.y_error)
        stack = lambda ks: as_complex(ks.T).T
        explicit, implicit = stack(out.explicit), stack(out.implicit)
        return AdditiveStages(as_complex(out.y1), error, explicit, implicit, out.failed)

    def stages(self, given: StagesInput) -> Stages:
        # The stages of one field: only a wrapper of single-field methods asks for them.
        raise TypeError(
            f"{type(self).__name__}() steps two terms, so it cannot be wrapped as a method "
            "of one field (Reversible(...)): wrap an explicit or implicit method, e.g. "
            "Reversible(Kvaerno5()) on the summed field."
        )


def _degree(tableau: AdditiveTableau) -> int:
    return max(len(row) for row in tableau.interp_explicit + tableau.interp_implicit)


def _padded(rows: tuple, degree: int) -> np.ndarray:
    return np.array([row + (0.0,) * (degree - len(row)) for row in rows])


def _dense(tableau: AdditiveTableau, ke: Array, ki: Array) -> tuple[Array, ...]:
    """The interpolant's coefficient vectors of theta^(p+1), p = 0..degree-1."""
    degree, dtype = _degree(tableau), ke.dtype
    pe = jnp.asarray(_padded(tableau.interp_explicit, degree), dtype)
    pi = jnp.asarray(_padded(tableau.interp_implicit, degree), dtype)
    coefficients = pe.T @ ke + pi.T @ ki
    return tuple(coefficients[p] for p in range(degree))


def _first_stages(vf: Any, t0: Array, y0: Array, args: PyTree) -> tuple[Array, Array]:
    explicit, implicit = PartOf(vf, EXPLICIT), PartOf(vf, IMPLICIT)
    return explicit.at_start(t0, y0, args), implicit.at_start(t0, y0, args)


def _carried_or_fresh(fsal: bool, step: StepInput) -> tuple[Array, Array]:
    """Both parts at (t0, y0): carried in `step.state` by first-same-as-last methods,
    evaluated again after a jump (the right limit), by every other method, and when a
    caller of `step` passes no state."""
    fresh = lambda: _first_stages(step.vf, step.t0, step.y0, step.args)
    if not fsal or step.state is None:
        return fresh()
    if step.made_jump is None:
        return step.state
    return lax.cond(step.made_jump, fresh, lambda: step.state)
