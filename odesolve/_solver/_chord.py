"""Chord (simplified Newton) iterations for one implicit stage, and their derivative.

Each implicit stage solves k = f(t_i, base_i + h gamma k) for its derivative k
(Hairer & Wanner, *Solving ODEs II*, sec. IV.8):

    (I - h gamma J) delta = f(t_i, base_i + h gamma k) - k,    k <- k + delta,

with J = df/dy at the step's start, factorised once per step (gamma is the same for
every stage). Iterating on k rather than on the stage value keeps k consistent with the
stage equation, where re-evaluating f at an inexact stage value would multiply the
Newton error by |J|.

The iterations run in a `lax.while_loop`, which reverse mode cannot differentiate.
Instead a stage solve carries its implicit-function derivative (a custom JVP): with
k = f(t, base + h gamma k), a tangent obeys

    (I - h gamma J(Y)) dk = df(t, Y; dt, d base + d(h gamma) k, d args),   Y the stage,

one linear solve with the Jacobian at the converged stage. JAX transposes that linear
rule for reverse mode, so every adjoint (and `jax.jvp`) sees exact derivatives.
"""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import jax.tree_util as jtu
from jax import lax
from jaxtyping import Array, Float

from .._flat import PyTree
from .._norm import rms_norm
from ._base import Field

_RUNNING, _CONVERGED, _FAILED = 0, 1, 2
# Increments this far below the tolerance (in units of kappa) are rounding noise: their
# ratio says nothing about the convergence rate, so they end the iteration as converged.
_NOISE = 1e-3
# The stage value base + hg k is known to no better than a few ulp of its terms: where a
# stiff component makes |hg k| much larger than |y| (h |J| >> 1), that floor lies above a
# tolerance relative to y, the increments stall there, and the iteration would fail at a
# step the method takes without trouble; so it would at tolerances finer than the dtype
# resolves (1.4e-8 in float32, from a float64 script). Increments are measured against
# this floor too.
_ROUNDING_ULPS = 4
# Increments that grow by more than this factor mean divergence (optimistix's chord
# criterion, Diffrax's default). Between 1 and 2 the iteration goes on: from a stage's
# predictor the first chord step often overshoots a component (its increment grows once)
# before contracting fast; calling that divergence rejects steps the method takes.
DIVERGENT_RATE = 2.0


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


def differentiated(field: Callable, y: Float[Array, " n"]) -> Float[Array, "n n"]:
    """df/dy by `jax.jacfwd`. A field JAX cannot differentiate (a `jax.pure_callback`
    into other code) fails here with JAX's refusal, which names neither the solver's
    need nor the ways out: say them."""
    try:
        return jax.jacfwd(field)(y)
    except (ValueError, TypeError, NotImplementedError) as error:
        raise TypeError(
            "an implicit solver's Newton iterations take df/dy of the vector field with "
            f"jax.jacfwd, and differentiating it failed: {error} Make the field "
            "differentiable by JAX (a jax.pure_callback needs a jax.custom_jvp), pass the "
            "solver jacobian=... (a function (t, y, args) -> df/dy), or use an explicit "
            "solver such as Tsit5()."
        ) from None


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
            return differentiated(lambda x: vf(t, x, args), y)
        d_y, d_t = jnp.asarray(self.direction, y.dtype), jnp.asarray(self.direction, t.dtype)
        jac = self.user_fn(d_t * t, self.spec.unravel(y), args)
        n = y.shape[0]
        if jnp.shape(jac) != (n, n):
            raise ValueError(
                f"jacobian=...: the Jacobian function returned shape {jnp.shape(jac)}, but "
                f"the state has {n} components: it must return df/dy of shape ({n}, {n})."
            )
        return d_y * jnp.asarray(jac, y.dtype)


def frozen(tree: PyTree) -> Any:
    """`lax.stop_gradient` on the inexact arrays of a PyTree (a vector field may hold
    functions as leaves)."""
    return jtu.tree_map(lambda x: lax.stop_gradient(x) if eqx.is_inexact_array(x) else x, tree)


def remaining_error_factor(rate: Float[Array, ""]) -> Float[Array, ""]:
    """Hairer & Wanner IV.8 (8.10)-(8.11): with contraction rate theta, the error left
    after an iteration is about theta / (1 - theta) times its increment (inf once the
    iterations no longer contract)."""
    return jnp.where(rate < 1, rate / (1 - rate), jnp.inf)


def lu_factor(jac, hg: Float[Array, ""]):
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
    the last iterate before it (to restart from)."""

    ulp = _ROUNDING_ULPS * jnp.finfo(base.dtype).eps

    def body(carry: PyTree):
        k, it, prev_size, _ = carry
        delta = jsl.lu_solve(lu, vf(t, base + hg * k, args) - k)
        # (Divided by kappa: the iteration stops at increments of kappa x scale.)
        floor = ulp * (jnp.abs(base) + jnp.abs(hg * k)) / settings.kappa
        scale = jnp.maximum(settings.scale, floor)
        # A state with no components (an RMS of 0) has converged at once.
        size = rms_norm(hg * delta / scale)
        # The first iteration has no rate yet; it is accepted only when |delta| itself is
        # below kappa.
        rate = size / prev_size
        eta = jnp.where(it == 0, 1.0, remaining_error_factor(rate))
        converged = (size == 0) | ((eta * size <= settings.kappa) & (size <= settings.kappa))
        converged = converged | (size <= _NOISE * settings.kappa)
        diverged = (((it > 0) & (rate > DIVERGENT_RATE)) | ~jnp.isfinite(size)) & ~converged
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
        lu = lu_factor(jacobian(vf, t, base + hg * k, args), hg)
        k, status = _chord_iterations(vf, args, t, hg, base, k, lu, settings, _RUNNING)
        return k, lu, status, count + 1

    def failing(carry: PyTree):
        return (carry[2] == _FAILED) & ~skip & (carry[3] < settings.max_refreshes)

    if settings.max_refreshes > 0:  # (static: with error control a failure rejects the step)
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
    jac = differentiated(lambda x: vf(t, x, args), y)
    eye = jnp.eye(y.shape[0], dtype=y.dtype)
    # A failed stage is rejected by the caller; keep its tangent finite (zero) so that the
    # masked-out branch cannot send NaN through a transposed solve.
    factors = jsl.lu_factor(jnp.where(ok, eye - hg * jac, eye))
    t_k = jnp.where(ok, jsl.lu_solve(factors, jnp.where(ok, rhs, 0)), 0)
    return (k, ok, lu), (t_k, None, (None, None))
