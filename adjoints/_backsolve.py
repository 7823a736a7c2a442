"""Continuous adjoint ("backsolve"): gradients from an adjoint ODE solved backwards in time.

Chen, Rubanova, Bettencourt and Duvenaud, "Neural ordinary differential equations",
NeurIPS 2018 (appendix B); with the seminorm of Kidger, Chen and Lyons, "'Hey, that's not
an ODE': faster ODE adjoints via seminorms", ICML 2021.

Backwards from each save time to the one before, solve

    dy/dt = f(t, y, theta),  da/dt = -a^T df/dy,  dg/dt = -a^T df/dtheta,

adding the output cotangent to `a` at every save time and restarting `y` from the value
the forward solve saved there (checkpointing at the save times, as
`jax.experimental.ode.odeint` does). The result approximates the gradient of the exact
solution, not of the computed one: it is as accurate as the solver's tolerances, and it
can be poor for problems that are unstable backwards. Memory is O(number of save times).

The solver hands over a `ContinuousProblem`; this module never sees an ODE otherwise.
"""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jax import lax

from ._batching import batch_size, runs_batched
from ._forward_only import forward_only
from ._loop import Loop, run_plain

# A gradient by the adjoint ODE is itself differentiated by how its two solves run: the
# forward solve it restarts from, and the backward solve. Run as plain loops (the
# default), they differentiate in forward mode only.
_TWICE = (
    "BacksolveAdjoint() differentiates its gradient in forward mode only (jax.hessian, "
    "jax.jacfwd(jax.grad(f))). For jax.grad(jax.grad(f)) or jax.jacrev(jax.grad(f)) pass "
    "BacksolveAdjoint(adjoint=DirectAdjoint()) (both modes) or "
    "BacksolveAdjoint(adjoint=RecursiveCheckpointAdjoint()) (reverse mode only)."
)


class ContinuousProblem(eqx.Module):
    """What the solver tells a continuous adjoint about its loop (internal time tau).

    - `field(theta, t, y) -> dy/dt` with `theta = theta_of(params)`: the vector field's
      inputs (its closure-converted leaves and `args`).
    - `with_theta_cotangent(params, ct_theta) -> ct_params`: embeds a cotangent of theta.
    - `times_of(tree)`: the leaves of a params-shaped tree that are times (t0, t1, save
      times); a continuous adjoint cannot differentiate with respect to them.
    - `y_of(carry)`, `with_y_cotangent(carry, ct_y) -> ct_carry`: the state in the carry.
    - `saved(buffers, ct_buffers, params) -> (ts (M,), ys (M, n), ct_ys (M, n))`, or
      three Nones when nothing is saved at intermediate times.
    - `t_start(params)`: the initial time.
    - `integrate(field, theta, z0, t0, t1, seminorm, params) -> z1`: solve dz/dt =
      field(theta, t, z) for a PyTree z = (y, a, g) with the forward solve's solver and
      controller; `seminorm` measures the error on (y, a) only.
    """

    field: Callable = eqx.field(static=True)
    theta_of: Callable = eqx.field(static=True)
    with_theta_cotangent: Callable = eqx.field(static=True)
    times_of: Callable = eqx.field(static=True)
    y_of: Callable = eqx.field(static=True)
    with_y_cotangent: Callable = eqx.field(static=True)
    saved: Callable = eqx.field(static=True)
    t_start: Callable = eqx.field(static=True)
    integrate: Callable = eqx.field(static=True)


# How the forward solve runs when the gradient is differentiated: `run_loop(loop, params,
# init, buffers)` of the adjoint that differentiates the backward solve, or None (plain).
RunLoop = Callable | None


@eqx.filter_custom_vjp
def _backsolve_loop(params_and_init, buffers, *, loop, problem, seminorm, forward: RunLoop):
    params, init = params_and_init
    return run_plain(loop, params, init, buffers)


@_backsolve_loop.def_fwd
def _fwd(perturbed, params_and_init, buffers, *, loop, problem, seminorm, forward: RunLoop):
    params, init = params_and_init
    if any(jtu.tree_leaves(problem.times_of(perturbed[0]))):
        raise ValueError(
            "BacksolveAdjoint cannot differentiate with respect to t0, t1, "
            "SaveAt(ts=...) or the step-size controller's times and settings (step_ts, "
            "jump_ts, StepTo(ts)): the continuous adjoint has no gradient for them. Use "
            "adjoint=RecursiveCheckpointAdjoint() (the default), which does."
        )
    if forward is None:
        out = forward_only(run_plain(loop, params, init, buffers), _TWICE)
    else:
        out = forward(loop, params, init, buffers)
    return out, out


def _augmented_field(problem):
    """Dynamics of (y, a, g): the state, its adjoint, and the accumulated theta-gradient."""

    def field(theta, t, state):
        y, a, _ = state
        theta_f, theta_s = eqx.partition(theta, eqx.is_inexact_array)
        fy, pullback = jax.vjp(
            lambda y_, th: problem.field(eqx.combine(th, theta_s), t, y_), y, theta_f
        )
        a_y, a_theta = pullback(a)
        return fy, -a_y, jtu.tree_map(jnp.negative, a_theta)

    return field


def _like(new, old):
    return jtu.tree_map(lambda n, o: n.astype(o.dtype), new, old)


@_backsolve_loop.def_bwd
def _bwd(
    residuals,
    grad_obj,
    perturbed,
    params_and_init,
    buffers,
    *,
    loop,
    problem,
    seminorm,
    forward: RunLoop,
):
    final, out_buffers = residuals
    params, init = params_and_init
    ct_final, ct_buffers = grad_obj
    theta = problem.theta_of(params)
    y_end = problem.y_of(final)
    ct_y_end = problem.y_of(ct_final) if ct_final is not None else None
    a = jnp.zeros_like(y_end) if ct_y_end is None else ct_y_end
    g = jtu.tree_map(jnp.zeros_like, eqx.filter(theta, eqx.is_inexact_array))
    save_ts, ys, ct_ys = problem.saved(out_buffers, ct_buffers, params)
    augmented = _augmented_field(problem)
    t_end, t_start = final.t, problem.t_start(params)

    def integrate(z0, t0, t1):
        _, a, g = problem.integrate(augmented, theta, z0, t0, t1, seminorm, params)
        return (a, g) if forward is not None else forward_only((a, g), _TWICE)

    def back(state, point):
        """From the later point back to `t_prev`, then add that point's cotangent."""
        t_from, y_from, a, g = state
        t_prev, y_prev, ct_prev = point
        a_new, g_new = integrate((y_from, a, g), t_from, t_prev)
        # Cotangents keep their dtypes: a parameter narrower than the state (float32
        # weights, float64 state) has its cotangent integrated at the state's precision.
        return (t_prev, y_prev, _like(a_new, a) + ct_prev, _like(g_new, g)), None

    state = (t_end, y_end, a, g)
    # The backward solves are traced in a scan's body, where a `vmap` around the sweep
    # cannot be seen: told, they run as batched solves (e.g. stages unrolled, not in a
    # loop whose stage buffer a batch would transpose at every stage).
    with runs_batched(batch_size(y_end, a, ys, ct_ys)):
        if save_ts is not None:
            points = (save_ts[::-1], ys[::-1], ct_ys[::-1])
            state, _ = lax.scan(back, state, points)
        t_last, y_last, a, g = state
        a_new, g_new = integrate((y_last, a, g), t_last, t_start)
    a, g = _like(a_new, a), _like(g_new, g)
    ct_params = problem.with_theta_cotangent(params, g)
    ct_init = problem.with_y_cotangent(init, a)
    return ct_params, ct_init


def backsolve_loop(
    loop: Loop,
    problem: ContinuousProblem,
    params,
    init,
    buffers,
    seminorm: bool,
    forward: RunLoop = None,
):
    """Run `loop`, differentiated by the adjoint ODE. `forward`: how the forward solve
    runs when the gradient is itself differentiated in reverse mode (the `run_loop` of
    an adjoint with reverse mode); None: a plain loop, whose gradient differentiates in
    forward mode only."""
    kw = dict(loop=loop, problem=problem, seminorm=seminorm, forward=forward)
    return _backsolve_loop((params, init), buffers, **kw)
