"""Any Runge-Kutta method, explicit or diagonally implicit, made algebraically reversible.

S. McCallum and J. Foster, "Efficient, accurate and stable gradients for neural ODEs"
(2024). With Psi_h(t, z) the increment of one step of the base method from (t, z), the
method carries a second state z and a coupling lambda in (0, 1]:

    y1 = lambda y0 + (1 - lambda) z0 + Psi_h(t0, z0)
    z1 = z0 - Psi_{-h}(t1, y1)

and a step is undone exactly (in exact arithmetic) by

    z0 = z1 + Psi_{-h}(t1, y1)
    y0 = (y1 - (1 - lambda) z0 - Psi_h(t0, z0)) / lambda.

It keeps the base method's order. Each step costs two base steps (the base method's
first-same-as-last derivative cannot be carried: the next step starts from z1, which no
stage evaluated). An implicit base method solves its stages to the same tolerances when a
step is undone as when it was taken, so that the undoing repeats the same computation.
The backward recursion is stable for lambda close to 1 wherever the base method is (the
paper's analysis); lambda = 1 gives no damping of the two states' drift apart, a smaller
lambda amplifies rounding by 1 / lambda per undone step.

The error estimate is the base method's on its step from z0; dense output is the base
method's interpolant from z0, shifted to start at y0 and end at y1.
"""

import dataclasses
from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float

from .._flat import PyTree, in_state_dtype
from .._term import ODETerm
from ._base import (
    AbstractReversibleSolver,
    Field,
    RetreatInput,
    StartInput,
    StepContext,
    StepInput,
    StepResult,
)
from ._kinds import AbstractWrappedSolver
from ._runge_kutta import (
    AbstractRungeKutta,
    AbstractTableauMethod,
    Stages,
    StagesInput,
    rk_stages,
)


class Reversible(AbstractReversibleSolver, AbstractWrappedSolver):
    """`Reversible(solver, coupling=0.999)`: the Runge-Kutta `solver` (`Euler`, `Heun`,
    `Midpoint`, `Ralston`, `Bosh3`, `Tsit5`, `Dopri5`, `Dopri8`, or the implicit
    `ImplicitEuler`, `Kvaerno3`, `Kvaerno4`, `Kvaerno5`) made algebraically reversible,
    for `ReversibleAdjoint`: gradients in memory independent of the number of steps, at
    the base method's order, for twice its evaluations a step.
    `coupling` (lambda in (0, 1]) ties the two states together; values just below 1 keep
    the backward recursion stable."""

    solver: AbstractTableauMethod
    coupling: float = eqx.field(default=0.999, static=True)

    def __check_init__(self):
        if not isinstance(self.solver, AbstractTableauMethod):
            raise TypeError(
                f"Reversible(solver={self.solver!r}): pass a Runge-Kutta solver (Euler, "
                "Heun, Midpoint, Ralston, Bosh3, Tsit5, Dopri5, Dopri8, ImplicitEuler or "
                "Kvaerno3/4/5)."
            )
        coupling = self.coupling
        if isinstance(coupling, bool) or not isinstance(coupling, (int, float)):
            raise TypeError(
                f"Reversible(coupling={coupling!r}): pass a number in (0, 1], such as 0.999."
            )
        if not 0 < coupling <= 1:
            raise ValueError(
                f"Reversible(coupling={coupling!r}): pass a number in (0, 1]; values just "
                "below 1 (0.999) keep the backward recursion stable."
            )

    def order(self, terms: ODETerm | None = None) -> int:
        return self.solver.order(terms)

    def error_order(self, terms: ODETerm | None = None) -> int:
        return self.solver.error_order(terms)

    @property
    def adaptive(self) -> bool:
        return self.solver.adaptive

    @property
    def interpolation(self) -> tuple[tuple[float, ...], ...]:
        # The base interpolant's rows, then a linear row for the shift from z to y.
        table = self.solver.interpolation
        return (*table, (1.0,) + (0.0,) * (len(table[0]) - 1))

    def start(self, first: StartInput) -> Any:
        return first.y0

    def advance(self, step: StepInput) -> StepResult:
        vf, t0, h, y0, args, context = step.vf, step.t0, step.h, step.y0, step.args, step.context
        z0 = step.state
        ahead = self._base_step(vf.at_start, vf, t0, h, z0, args, step.with_error, True, context)
        y1 = self.coupling * y0 + (1 - self.coupling) * z0 + (ahead.y1 - z0)
        back = self._base_step(vf, vf, t0 + h, -h, y1, args, False, False, context)
        z1 = z0 - (back.y1 - y1)
        failed = None
        if ahead.failed is not None and back.failed is not None:
            failed = ahead.failed | back.failed
        y_error = None
        if step.with_error:
            assert ahead.y_error is not None  # asked for with the error
            drift = self._drift(ahead.y1 - z1, y1, z1, h, context)
            y_error = jnp.abs(ahead.y_error) + drift
        return StepResult(y1, y_error, self._dense(ahead, h, y0, z0), z1, failed)

    def _drift(
        self,
        added: Float[Array, " n"],
        y1: Float[Array, " n"],
        z1: Float[Array, " n"],
        h: Float[Array, ""],
        context: StepContext | None,
    ) -> Float[Array, " n"]:
        """The error the gap between the two states can reach from what a step adds to it.
        The gap e = y - z evolves as e1 = coupling * e0 + added (added = the base step from
        z0 less z1: nil for an exactly symmetric base step), and y1 takes it whole. Its mode
        grows by about coupling / |R(h mu)| a step (R the base method's stability
        function) wherever the field is dissipative, which the base method's estimate does
        not see: unchecked, a solve of a decaying field ended 1e200 away, reported as a
        success. What a step adds is kept within the tolerance divided by the number of
        steps over which additions pile up: 1 / (1 - coupling), the steps the coupling
        takes to damp one, or the steps of this size the solve holds where fewer. The
        rounding of computing `added` (a few ulps of the states) is left out: no smaller
        step removes it."""
        rounding = 4 * jnp.finfo(y1.dtype).eps * (jnp.abs(y1) + jnp.abs(z1))
        added = jnp.maximum(jnp.abs(added) - rounding, 0)
        piled = jnp.asarray(jnp.inf if self.coupling == 1 else 1 / (1 - self.coupling))
        if context is not None and context.span is not None:
            piled = jnp.minimum(piled, context.span / jnp.abs(jnp.where(h == 0, 1, h)))
        piled = jnp.where(jnp.isfinite(piled), jnp.maximum(piled, 1), 1)
        return added * piled.astype(added.dtype)

    def retreat(
        self, undo: RetreatInput
    ) -> tuple[Float[Array, " n"], Any, tuple[Float[Array, " n"], ...]]:
        vf, t0, h, y1, args, context = undo.vf, undo.t0, undo.h, undo.y1, undo.args, undo.context
        back = self._base_step(vf, vf, t0 + h, -h, y1, args, False, False, context)
        z0 = undo.state1 + (back.y1 - y1)
        ahead = self._base_step(vf, vf, t0, h, z0, args, False, True, context)
        y0 = (y1 - (1 - self.coupling) * z0 - (ahead.y1 - z0)) / self.coupling
        return y0, z0, self._dense(ahead, h, y0, z0)

    def _base_step(
        self,
        start: Field,
        vf: Field,
        t0: Float[Array, ""],
        h: Float[Array, ""],
        y0: Float[Array, " n"],
        args: PyTree,
        with_error: bool,
        dense: bool,
        context: StepContext | None,
    ) -> Stages:
        """One step of the base method, its first stage by `start`. Without `dense`
        output (the backward step) a first-same-as-last last stage is not evaluated."""
        k0 = start(t0, y0, args)
        given = StagesInput(
            vf=vf, t0=t0, h=h, y0=y0, k0=k0, args=args, with_error=with_error, context=context
        )
        if isinstance(self.solver, AbstractRungeKutta):
            return rk_stages(self.solver.tableau, given, dense)
        # Implicit stages: the forward step's Newton tolerances whether it is being taken
        # or undone (with error control, the controller's), so that both solve alike.
        controlled = dense and context is not None and context.tolerances is not None
        return self.solver.stages(dataclasses.replace(given, with_error=controlled))

    def _dense(
        self, ahead: Stages, h: Float[Array, ""], y0: Float[Array, " n"], z0: Float[Array, " n"]
    ) -> tuple[Float[Array, " n"], ...]:
        """The base interpolant from z0, plus (y0 - z0)(1 - (1 - lambda) theta): from y0
        at theta = 0 to y1 at theta = 1. The shift's slope is the last vector."""
        safe_h = jnp.where(h == 0, 1, h)
        shift = jnp.where(h == 0, 0, -(1 - self.coupling) * (y0 - z0) / in_state_dtype(safe_h, y0))
        stages = self.solver.tableau.interp_stages
        return (*(ahead.ks[i] for i in stages), shift)
