"""The one engine that steps every ESDIRK tableau (see `ImplicitTableau`).

Stage 1 is explicit (k0 = f(t0, y0)); each later stage is solved by chord iterations
with its implicit-function derivative (see `_chord`), one Jacobian and one LU
factorisation per step. A stage that fails rejects the step (error control) or makes the
step NaN (fixed steps).
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Float

from .._flat import PyTree
from ._base import Field
from ._chord import FlatJacobian, NewtonSettings, frozen, lu_factor, solve_stage
from ._runge_kutta import AbstractTableauMethod, Stages, StagesInput
from ._tableau import ImplicitTableau
from .root_finder import VeryChord, root_finder_tolerances


def _newton_settings(solver, context, y0: Float[Array, " n"], adaptive) -> NewtonSettings:
    """Newton tolerances: the solver's own (`root_finder`, or `newton_rtol`/`newton_atol`)
    if set, else the controller's rtol/atol, with kappa = `solver.kappa` (or the root
    finder's); else (fixed steps) 100 ulp relative to the state."""
    dtype = y0.dtype
    rtol, atol, kappa = solver.newton_rtol, solver.newton_atol, solver.kappa
    if solver.root_finder is not None:
        finder_rtol, finder_atol, finder_kappa = root_finder_tolerances(solver.root_finder)
        if finder_rtol is not None:
            rtol, atol = finder_rtol, finder_atol
        # Both default to VeryChord's kappa: whichever was set otherwise counts.
        if finder_kappa is not None and finder_kappa != VeryChord.kappa:
            kappa = finder_kappa
    if rtol is None and context is not None and context.tolerances is not None:
        rtol, atol = context.tolerances
    elif rtol is None:
        rtol = atol = 100 * float(jnp.finfo(dtype).eps)
        kappa = 1.0
    scale = jnp.asarray(atol, dtype) + jnp.asarray(rtol, dtype) * jnp.abs(y0)
    # A failed stage costs an adaptive solve one rejected step, but a fixed-step solve its
    # result: without error control, iterate longer and re-evaluate the Jacobian more.
    # With error control a failure rejects the step at once (as in Hairer's RADAU5 and in
    # Diffrax): chord iterations that do not converge with the Jacobian at the step's
    # start say the field changes too much over the step, and a step rescued by a fresh
    # Jacobian is one the error estimate can pass while its dense output is far off (HIRES
    # and Robertson at rtol 1e-3: benchmarks/README, "Accuracy").
    max_iterations = solver.max_iterations or solver.root_find_max_steps or (10 if adaptive else 20)
    max_refreshes = (
        solver.max_refreshes if solver.max_refreshes is not None else (0 if adaptive else 10)
    )
    return NewtonSettings(lax.stop_gradient(scale), kappa, max_iterations, max_refreshes)


def implicit_step(
    tableau: ImplicitTableau, solver: "AbstractImplicitRungeKutta", given: StagesInput
) -> Stages:
    """One ESDIRK step given k0 = f(t0, y0). A stage whose Newton iterations fail makes
    the error estimate +inf (the controller rejects the step and shrinks it by its
    `factormin`); without error control (fixed steps) it makes y1 NaN, which the solve
    reports as a non-finite state."""
    vf, t0, h, y0, k0, args = given.vf, given.t0, given.h, given.y0, given.k0, given.args
    context = given.context
    adaptive = given.with_error and tableau.b_error is not None
    settings = _newton_settings(solver, context if adaptive else None, y0, adaptive)
    direction = 1 if context is None else lax.stop_gradient(context.direction)
    spec = None if context is None else context.spec
    jacobian = FlatJacobian(solver.jacobian, direction, spec)
    frozen_vf, frozen_args, frozen_t0, frozen_y0 = frozen((vf, args, t0, y0))
    hg = h * jnp.asarray(tableau.gamma, h.dtype)
    lu = lu_factor(jacobian(frozen_vf, frozen_t0, frozen_y0, frozen_args), lax.stop_gradient(hg))
    # Each stage's time, the step's end itself for c = 1 (see `StagesInput.stage_time`).
    times = jnp.stack([jnp.asarray(given.stage_time(c), h.dtype) for c in tableau.c])
    ks, failed = _implicit_stages(tableau, vf, args, times, h, hg, y0, k0, lu, settings, jacobian)
    y1 = y0 + h * (jnp.asarray(tableau.b, y0.dtype) @ ks)  # = the last stage value
    y_error = None
    if adaptive:
        error = h * (jnp.asarray(tableau.b_error, y0.dtype) @ ks)
        y_error = jnp.where(failed, jnp.inf, error)
    else:
        y1 = jnp.where(failed, jnp.nan, y1)
    return Stages(y1=y1, y_error=y_error, ks=tuple(ks), failed=failed)


def _implicit_stages(
    tableau,
    vf: Field,
    args: PyTree,
    times: Float[Array, " s"],
    h: Float[Array, ""],
    hg: Float[Array, ""],
    y0: Float[Array, " n"],
    k0: Float[Array, " n"],
    lu,
    settings,
    jacobian,
):
    """Stages 2..s in a `lax.scan`: each is a while loop, so unrolling them would buy no
    fusion, only s - 1 copies of the Newton solve for every transformation of the step to
    trace and compile. Returns the stage derivatives (s, n) and whether any stage failed."""
    s, dtype = tableau.num_stages, y0.dtype
    a = np.zeros((s, s))
    for i, row in enumerate(tableau.a):
        a[i + 1, : i + 1] = row

    def stage(carry: PyTree, i):
        ks, failed, lu = carry
        # Predictor: the previous stage's derivative (bounded for stiff components, where
        # extrapolating the stages would amplify their fast modes).
        k, ok, lu = solve_stage(
            vf,
            args,
            times[i],
            hg,
            y0 + h * (jnp.asarray(a, dtype)[i] @ ks),
            guess=lax.stop_gradient(ks[i - 1]),
            lu=lax.stop_gradient(lu),
            settings=settings,
            skip=failed,
            jacobian=jacobian,
        )
        return (ks.at[i].set(k), failed | ~ok, lu), None

    ks = jnp.zeros((s, y0.shape[0]), dtype).at[0].set(k0)
    init = (ks, jnp.asarray(False), lu)
    (ks, failed, _), _ = lax.scan(stage, init, jnp.arange(1, s))
    return ks, failed


class AbstractImplicitRungeKutta(AbstractTableauMethod):
    """An ESDIRK method given by its `tableau` (a class attribute), stepped by chord
    iterations on each stage.

    - `jacobian`: optional `jacobian(t, y, args) -> (n, n)` array, df/dy, used instead of
      `jax.jacfwd` in the Newton iterations. Only for a state `y0` that is one 1-D array
      of size n (a ValueError otherwise). Derivatives of the solution still use
      `jax.jacfwd` at the converged stages, so they stay exact if `jacobian` is
      approximate. It must depend on parameters only through `args`.
    - `newton_rtol`, `newton_atol`: Newton tolerances; by default the step-size
      controller's rtol/atol, or 100 ulp relative to the state with fixed step sizes.
    - `kappa`: the iterations stop once the estimated Newton error is below kappa times
      the tolerance (Hairer & Wanner suggest 1e-1 to 1e-2).
    - `max_iterations`: chord iterations per Jacobian; by default 10 with error control
      and 20 with fixed steps. `root_find_max_steps` is Diffrax's name for it.
    - `max_refreshes`: how often a stage whose iterations fail may re-evaluate the
      Jacobian (at its best iterate) and start again before the step is rejected; by
      default 0 with error control (a failure rejects the step and the controller
      shrinks it) and 10 with fixed steps (which cannot reject).
    - `root_finder`: Diffrax's spelling of the tolerances: `VeryChord(rtol, atol)` or an
      optimistix root finder; its `rtol`, `atol` (and `kappa`) are used as above. The
      stages are solved by chord iterations whichever is passed.
    """

    tableau: eqx.AbstractClassVar[ImplicitTableau]
    jacobian: Callable | None = None
    newton_rtol: float | None = None
    newton_atol: float | None = None
    kappa: float = 1e-2
    max_iterations: int | None = None
    max_refreshes: int | None = None
    root_finder: Any = VeryChord()
    root_find_max_steps: int | None = None

    def __check_init__(self):
        if self.jacobian is not None and not callable(self.jacobian):
            raise TypeError(
                f"{type(self).__name__}(jacobian=...) is a {type(self.jacobian).__name__}, "
                "not a function: pass jacobian(t, y, args) returning df/dy, or None for "
                "jax.jacfwd."
            )
        if self.root_find_max_steps is not None and self.max_iterations is not None:
            raise ValueError(
                f"root_find_max_steps={self.root_find_max_steps} and max_iterations="
                f"{self.max_iterations} name the same limit: pass one of them."
            )
        if self.root_finder is not None:
            rtol, _, _ = root_finder_tolerances(self.root_finder)  # refuses one without
            if self.newton_rtol is not None and rtol is not None:
                raise ValueError(
                    "root_finder=... and newton_rtol/newton_atol both set the Newton "
                    "tolerances: pass one of them."
                )
        if (self.newton_rtol is None) != (self.newton_atol is None):
            raise ValueError(
                f"newton_rtol={self.newton_rtol}, newton_atol={self.newton_atol}: pass both "
                "or neither (neither: taken from the step-size controller)."
            )
        if not 0 < self.kappa <= 1:
            raise ValueError(f"kappa={self.kappa}: must be in (0, 1], e.g. 1e-2.")
        for name in ("max_iterations", "root_find_max_steps"):
            limit = getattr(self, name)
            if limit is not None and (not isinstance(limit, int) or limit < 1):
                raise ValueError(f"{name}={limit!r}: pass an int >= 1, e.g. 10.")
        if self.max_refreshes is not None and self.max_refreshes < 0:
            raise ValueError(f"max_refreshes={self.max_refreshes}: must be >= 0.")

    def stages(self, given: StagesInput) -> Stages:
        if not jnp.iscomplexobj(given.y0):
            return implicit_step(self.tableau, self, given)
        # A complex state is stepped as its real and imaginary parts: the Newton iterations
        # and their Jacobian are then right for any field, holomorphic or not.
        if self.jacobian is not None:
            raise ValueError(
                "jacobian=...: a user-supplied Jacobian needs a real state; for a complex "
                "one leave jacobian=None (df/dy is then taken of the real and imaginary parts)."
            )
        real = dataclasses.replace(
            given, vf=_RealView(given.vf), y0=as_real(given.y0), k0=as_real(given.k0)
        )
        step = implicit_step(self.tableau, self, real)
        error = None if step.y_error is None else as_complex(step.y_error)
        ks = tuple(map(as_complex, step.ks))
        return Stages(as_complex(step.y1), error, ks, step.failed)


def as_real(z: Array) -> Array:
    return jnp.concatenate([jnp.real(z), jnp.imag(z)])


def as_complex(x: Array) -> Array:
    n = x.shape[0] // 2
    return lax.complex(x[:n], x[n:])


class _RealView(eqx.Module):
    """A field on complex vectors seen as one on their real and imaginary parts. A Module,
    so that the arrays of the field it wraps stay leaves (see `solve_stage`)."""

    vf: Callable

    def __call__(self, t: Float[Array, ""], x: PyTree, args: PyTree):
        return as_real(self.vf(t, as_complex(x), args))
