"""The one engine that steps every ESDIRK tableau (see `ImplicitTableau`).

Each implicit stage solves k = f(t_i, base_i + h gamma k) for its derivative k by
simplified Newton (chord) iterations (Hairer & Wanner, *Solving ODEs II*, sec. IV.8):

    (I - h gamma J) delta = f(t_i, base_i + h gamma k) - k,    k <- k + delta,

with J = df/dy at (t0, y0), computed and factorised once per step: gamma is the same for
every stage, so the factorisation is too. Iterating on k rather than on the stage value
keeps k consistent with the stage equation (y1 = y0 + h sum b_i k_i exactly), where
re-evaluating f at an inexact stage value would multiply the Newton error by |J|.

The iterations run in a `lax.while_loop`, which reverse mode cannot differentiate.
Instead each stage solve carries its implicit-function derivative (a custom JVP): with
k = f(t, base + h gamma k), a tangent obeys

    (I - h gamma J(Y)) dk = df(t, Y; dt, d base + d(h gamma) k, d args),   Y the stage,

one linear solve with the Jacobian at the converged stage. JAX transposes that linear
rule for reverse mode, so every adjoint (and `jax.jvp`) sees exact derivatives of the
stage equations.
"""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import jax.tree_util as jtu
import numpy as np
from jax import lax
from jaxtyping import Array, Float

from .._flat import PyTree
from ._base import Field, StepContext
from ._runge_kutta import AbstractTableauMethod, Stages
from ._tableau import ImplicitTableau
from .root_finder import VeryChord, root_finder_tolerances

# Newton iteration status.
_RUNNING, _CONVERGED, _FAILED = 0, 1, 2
# Increments this far below the tolerance (in units of kappa) are rounding noise: their
# ratio says nothing about the convergence rate, so they end the iteration as converged.
_NOISE = 1e-3
# The stage value base + hg k is known to no better than a few ulp of its terms: where a
# stiff component makes |hg k| much larger than |y| (h |J| >> 1), that floor lies above a
# tolerance relative to y, the increments stall there, and the iteration would fail at a
# step the method takes without trouble. Increments are measured against this floor too.
_ROUNDING_ULPS = 4


class NewtonSettings(eqx.Module):
    """How one step's stage equations are solved.

    - `scale`: (n,) atol + rtol |y0|; an increment is measured as RMS(h gamma delta / scale).
    - `kappa`: the iteration stops once the estimated remaining error is below kappa.
    - `max_iterations`: chord iterations per Jacobian.
    - `max_refreshes`: Jacobian re-evaluations per stage before the stage has failed.
    """

    scale: Float[Array, " n"]
    kappa: float = eqx.field(static=True)
    max_iterations: int = eqx.field(static=True)
    max_refreshes: int = eqx.field(static=True)


class FlatJacobian(eqx.Module):
    """df/dy of the flat tau-time vector field: `jax.jacfwd`, or the user's `jacobian`
    mapped to tau time (dy/dtau = d f(d tau, y) has Jacobian d J(d tau, y))."""

    user_fn: Callable | None = eqx.field(static=True)
    direction: Any
    spec: Any = eqx.field(static=True)

    def __check_init__(self):
        spec = self.spec
        if self.user_fn is None or (
            len(spec.shapes) == 1 and len(spec.shapes[0]) == 1 and spec.treedef.num_nodes == 1
        ):
            return
        raise ValueError(
            f"jacobian=...: a user-supplied Jacobian needs y0 to be one 1-D array, but y0 "
            f"has structure {spec.treedef} with shapes {spec.shapes}. Pass y0 as a 1-D "
            "array, or leave jacobian=None to use jax.jacfwd."
        )

    def __call__(
        self, vf: Field, t: Float[Array, ""], y: Float[Array, " n"], args: PyTree
    ) -> Float[Array, "n n"]:
        if self.user_fn is None:
            return jax.jacfwd(lambda x: vf(t, x, args))(y)
        d_y, d_t = jnp.asarray(self.direction, y.dtype), jnp.asarray(self.direction, t.dtype)
        jac = self.user_fn(d_t * t, self.spec.unravel(y), args)
        n = y.shape[0]
        if jnp.shape(jac) != (n, n):
            raise ValueError(
                f"jacobian=...: the Jacobian function returned shape {jnp.shape(jac)}, but "
                f"the state has {n} components: it must return df/dy of shape ({n}, {n})."
            )
        return d_y * jnp.asarray(jac, y.dtype)


def _stop(tree: PyTree) -> Any:
    """`lax.stop_gradient` on the inexact arrays of a PyTree (a vector field may hold
    functions as leaves)."""
    return jtu.tree_map(lambda x: lax.stop_gradient(x) if eqx.is_inexact_array(x) else x, tree)


def _factor(jac, hg: Float[Array, ""]):
    """LU factors of I - hg J."""
    return jsl.lu_factor(jnp.eye(jac.shape[0], dtype=jac.dtype) - hg * jac)


def _chord_iterations(
    vf: Field,
    args: PyTree,
    t: Float[Array, ""],
    hg: Float[Array, ""],
    base: Float[Array, " n"],
    k: Float[Array, " n"],
    lu,
    settings,
    status,
):
    """Chord iterations from k while `status` is running: (k, status). On divergence k is
    the last iterate before it (the best one, to restart from)."""

    ulp = _ROUNDING_ULPS * jnp.finfo(base.dtype).eps

    def body(carry: PyTree):
        k, it, prev_size, _ = carry
        delta = jsl.lu_solve(lu, vf(t, base + hg * k, args) - k)
        scale = jnp.maximum(settings.scale, ulp * (jnp.abs(base) + jnp.abs(hg * k)))
        size = jnp.sqrt(jnp.mean(jnp.square(hg * delta / scale)))
        # Hairer & Wanner IV.8 (8.10)-(8.11): with rate theta the error left after this
        # iteration is about theta / (1 - theta) |delta|. The first iteration has no rate
        # yet; it is accepted only when |delta| itself is below kappa.
        rate = size / prev_size
        eta = jnp.where(it == 0, 1.0, jnp.where(rate < 1, rate / (1 - rate), jnp.inf))
        converged = (size == 0) | ((eta * size <= settings.kappa) & (size <= settings.kappa))
        converged = converged | (size <= _NOISE * settings.kappa)
        diverged = (((it > 0) & (rate >= 1)) | ~jnp.isfinite(size)) & ~converged
        exhausted = it + 1 >= settings.max_iterations
        status = jnp.where(
            converged, _CONVERGED, jnp.where(diverged | exhausted, _FAILED, _RUNNING)
        )
        return jnp.where(diverged, k, k + delta), it + 1, size, status

    init = (k, jnp.zeros((), jnp.int32), jnp.ones((), settings.scale.dtype), status)
    k, _, _, status = lax.while_loop(lambda c: c[3] == _RUNNING, body, init)
    return k, status


@eqx.filter_custom_jvp
def solve_stage(
    vf: Field,
    args: PyTree,
    t: Float[Array, ""],
    hg: Float[Array, ""],
    base: Float[Array, " n"],
    *,
    guess: Float[Array, " n"],
    lu,
    settings,
    skip,
    jacobian,
):
    """Solve k = vf(t, base + hg k, args) for the stage derivative k: (n,).

    Chord iterations with `lu` (factors of I - hg J). If they diverge or cannot converge
    within the iteration budget, the Jacobian is re-evaluated at the best iterate and they
    start again, up to `settings.max_refreshes` times (the Jacobian at the step's start can
    be a poor one, e.g. where a fast mode is not yet excited).

    Returns (k, ok, lu): `lu` the factors in use at the end, for the later stages. On
    failure (or `skip`: an earlier stage failed) k is `guess`, a finite value, so that
    nothing downstream turns into NaN: the caller rejects the step instead. `guess`,
    `lu`, `settings`, `skip` and `jacobian` are not differentiated.
    """
    running = jnp.where(skip, _FAILED, _RUNNING)
    k, status = _chord_iterations(vf, args, t, hg, base, guess, lu, settings, running)

    def retry(carry: PyTree):
        k, _, _, count = carry
        lu = _factor(jacobian(vf, t, base + hg * k, args), hg)
        k, status = _chord_iterations(vf, args, t, hg, base, k, lu, settings, _RUNNING)
        return k, lu, status, count + 1

    def failing(carry: PyTree):
        return (carry[2] == _FAILED) & ~skip & (carry[3] < settings.max_refreshes)

    k, lu, status, _ = lax.while_loop(failing, retry, (k, lu, status, 0))
    ok = status == _CONVERGED
    return jnp.where(ok, k, guess), ok, lu


@solve_stage.def_jvp
def _solve_stage_jvp(primals, tangents, **kwargs: object):
    vf, args, t, hg, base = primals
    t_vf, t_args, t_t, t_hg, t_base = tangents
    k, ok, lu = solve_stage(vf, args, t, hg, base, **kwargs)
    y = base + hg * k
    # d(stage value) = d base + d(hg) k + hg dk; the hg dk part is on the left-hand side.
    t_y = jnp.zeros_like(y) if t_base is None else t_base
    if t_hg is not None:
        t_y = t_y + t_hg * k
    t_in = (t_vf, t_args, jnp.zeros_like(t) if t_t is None else t_t, t_y)
    _, rhs = eqx.filter_jvp(lambda f, a, s, x: f(s, x, a), (vf, args, t, y), t_in)
    # The exact Jacobian at the stage (not the chord's): derivatives must be exact.
    jac = jax.jacfwd(lambda x: vf(t, x, args))(y)
    eye = jnp.eye(y.shape[0], dtype=y.dtype)
    # A failed stage is rejected by the caller; keep its tangent finite (zero) so that the
    # masked-out branch cannot send NaN through a transposed solve.
    factors = jsl.lu_factor(jnp.where(ok, eye - hg * jac, eye))
    t_k = jnp.where(ok, jsl.lu_solve(factors, jnp.where(ok, rhs, 0)), 0)
    return (k, ok, lu), (t_k, None, (None, None))


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
    max_iterations = solver.max_iterations or (10 if adaptive else 20)
    max_refreshes = (
        solver.max_refreshes if solver.max_refreshes is not None else (1 if adaptive else 10)
    )
    return NewtonSettings(lax.stop_gradient(scale), kappa, max_iterations, max_refreshes)


def implicit_step(
    tableau: ImplicitTableau,
    solver: "AbstractImplicitRungeKutta",
    vf: Callable,
    t0: Float[Array, ""],
    h: Float[Array, ""],
    y0: Float[Array, " n"],
    k0: Float[Array, " n"],
    args: PyTree,
    with_error: bool,
    context: StepContext | None,
) -> Stages:
    """One ESDIRK step given k0 = f(t0, y0). A stage whose Newton iterations fail makes
    the error estimate +inf (the controller rejects the step and shrinks it by its
    `factormin`); without error control (fixed steps) it makes y1 NaN, which the solve
    reports as a non-finite state."""
    adaptive = with_error and tableau.b_error is not None
    settings = _newton_settings(solver, context if adaptive else None, y0, adaptive)
    direction = 1 if context is None else lax.stop_gradient(context.direction)
    spec = None if context is None else context.spec
    jacobian = FlatJacobian(solver.jacobian, direction, spec)
    frozen_vf, frozen_args, frozen_t0, frozen_y0 = _stop((vf, args, t0, y0))
    hg = h * jnp.asarray(tableau.gamma, h.dtype)
    lu = _factor(jacobian(frozen_vf, frozen_t0, frozen_y0, frozen_args), lax.stop_gradient(hg))
    ks, failed = _implicit_stages(tableau, vf, args, t0, h, hg, y0, k0, lu, settings, jacobian)
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
    t0: Float[Array, ""],
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
            t0 + jnp.asarray(tableau.c, h.dtype)[i] * h,
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
      and 20 with fixed steps.
    - `max_refreshes`: how often a stage whose iterations fail may re-evaluate the
      Jacobian (at its best iterate) and start again before the step is rejected; by
      default 1 with error control and 10 with fixed steps (which cannot reject).
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

    def __check_init__(self):
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
        if self.max_iterations is not None and self.max_iterations < 1:
            raise ValueError(f"max_iterations={self.max_iterations}: must be >= 1.")
        if self.max_refreshes is not None and self.max_refreshes < 0:
            raise ValueError(f"max_refreshes={self.max_refreshes}: must be >= 0.")

    def stages(
        self,
        vf: Field,
        t0: Float[Array, ""],
        h: Float[Array, ""],
        y0: Float[Array, " n"],
        k0: Float[Array, " n"],
        args: PyTree,
        with_error,
        context,
    ) -> Stages:
        if not jnp.iscomplexobj(y0):
            return implicit_step(self.tableau, self, vf, t0, h, y0, k0, args, with_error, context)
        # A complex state is stepped as its real and imaginary parts: the Newton iterations
        # and their Jacobian are then right for any field, holomorphic or not.
        if self.jacobian is not None:
            raise ValueError(
                "jacobian=...: a user-supplied Jacobian needs a real state; for a complex "
                "one leave jacobian=None (df/dy is then taken of the real and imaginary parts)."
            )
        step = implicit_step(
            self.tableau, self, _RealView(vf), t0, h, _as_real(y0), _as_real(k0), args,
            with_error, context,
        )  # fmt: skip
        error = None if step.y_error is None else _as_complex(step.y_error)
        ks = tuple(map(_as_complex, step.ks))
        return Stages(_as_complex(step.y1), error, ks, step.failed)


def _as_real(z: Array) -> Array:
    return jnp.concatenate([jnp.real(z), jnp.imag(z)])


def _as_complex(x: Array) -> Array:
    n = x.shape[0] // 2
    return lax.complex(x[:n], x[n:])


class _RealView(eqx.Module):
    """A field on complex vectors seen as one on their real and imaginary parts. A Module,
    so that the arrays of the field it wraps stay leaves (see `solve_stage`)."""

    vf: Callable

    def __call__(self, t: Float[Array, ""], x: PyTree, args: PyTree):
        return _as_real(self.vf(t, _as_complex(x), args))
