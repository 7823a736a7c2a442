"""What a continuous adjoint (`BacksolveAdjoint`) needs to know about a solve.

The adjoint package never imports odesolve: this module describes the ODE to it as an
`adjoints.ContinuousProblem`, including a function that solves any other ODE (the adjoint
system) with the same solver and step-size controller.
"""

import warnings
from collections.abc import Callable
from typing import Any, get_origin

import equinox as eqx
import jax.numpy as jnp
import jax.tree_util as jtu
from jaxtyping import Array, Float

from adjoints import ContinuousProblem, ForwardMode

from ._controller.clip import unclipped
from ._controller.constant import StepTo
from ._controller.pid import PIDController
from ._flat import PyTree
from ._norm import rms_norm
from ._results import ComplexStateWarning, UnsupportedCombination
from ._saveat import SaveAt
from ._term import MultiTerm, ODETerm


def _zeros_float(tree: PyTree):
    return jtu.tree_map(lambda x: jnp.zeros_like(x) if eqx.is_inexact_array(x) else None, tree)


def _is_none(x: PyTree):
    return x is None


def adjoint_rms_seminorm(x: tuple) -> Array:
    """RMS over the state and its adjoint, the first two parts of `BacksolveAdjoint`'s
    backward state, leaving out the parameter-gradient channels (Kidger, Chen and Lyons
    2021). `BacksolveAdjoint()` measures its error this way by default (`seminorm=True`);
    as in Diffrax, `BacksolveAdjoint(stepsize_controller=PIDController(...,
    norm=adjoint_rms_seminorm))` asks for it explicitly."""
    y, a = x[0], x[1]
    return rms_norm((y, a))


def _backward_norm(adjoint, seminorm: bool):
    """A norm given to the backward solve's own controller, else the seminorm (or RMS)."""
    own = unclipped(adjoint.stepsize_controller)
    if isinstance(own, PIDController) and own.norm is not None:
        return own.norm
    return adjoint_rms_seminorm if seminorm else None


def _backward_controller(adjoint, controller, seminorm):
    norm = _backward_norm(adjoint, seminorm)
    controller = unclipped(adjoint.stepsize_controller or controller)
    if isinstance(controller, PIDController):
        # Save/jump times are in the forward solve's time; the backward solve does not
        # need them to land anywhere. The forward solve's norm is for its state alone.
        controller = eqx.tree_at(
            lambda c: (c.step_ts, c.jump_ts, c.norm),
            controller,
            (None, None, norm),
            is_leaf=_is_none,
        )
    elif isinstance(controller, StepTo):
        # The backward solve runs from t1 to t0: through the same grid, reversed.
        controller = StepTo(jnp.flip(jnp.asarray(controller.ts)))
    return controller


def continuous_problem(
    adjoint: Any, solver: Any, max_steps: int | None, throw: bool, diffeqsolve: Callable
) -> ContinuousProblem:
    """The problem, with `diffeqsolve` to solve the adjoint system. Everything that is an
    array (the controller's tolerances, dt0) is read from the loop's `params` when
    needed, never closed over: the adjoint calls these functions in its backward pass,
    outside the forward pass's trace."""
    structure = solver.term_structure
    if adjoint.solver is None and (
        isinstance(structure, tuple) or get_origin(structure) is MultiTerm
    ):
        raise UnsupportedCombination(
            f"BacksolveAdjoint() with solver={solver!r}: the adjoint system is one term, "
            "not the several this solver takes, so it cannot be solved with this solver. "
            "Pass one for it, e.g. BacksolveAdjoint(solver=Tsit5()) (or Kvaerno5() for a "
            "stiff problem)."
        )

    def integrate(field, theta, z0, t0: Float[Array, ""], t1: Float[Array, ""], seminorm, params):
        dt0 = params.dt0 if adjoint.dt0 is None else adjoint.dt0
        step = None if dt0 is None else -jnp.abs(dt0)
        controller = _backward_controller(adjoint, params.controller, seminorm)
        with warnings.catch_warnings():  # the user was told of a complex state already
            warnings.simplefilter("ignore", ComplexStateWarning)
            sol = _backward_solve(controller, step, z0, theta, field, t0, t1)
        return jtu.tree_map(lambda x: x[0], sol.ys)

    def _backward_solve(controller, step, z0, theta, field, t0, t1):
        return diffeqsolve(
            ODETerm(lambda t, z, th: field(th, t, z)),
            adjoint.solver or solver,
            t0,
            t1,
            step,
            z0,
            theta,
            saveat=SaveAt(t1=True),
            stepsize_controller=controller,
            adjoint=ForwardMode() if adjoint.adjoint is None else adjoint.adjoint,
            max_steps=max_steps if adjoint.max_steps is None else adjoint.max_steps,
            throw=throw if adjoint.throw is None else adjoint.throw,
        )

    def saved(buffers, ct_buffers, params):
        save_ts = params.save_ts[0] if params.save_ts else None
        if save_ts is None:
            return None, None, None
        ys = buffers[0][:-1]
        ct = None if ct_buffers is None else ct_buffers[0]
        ct_ys = jnp.zeros_like(ys) if ct is None else ct[:-1]
        return save_ts[:-1], ys, ct_ys

    def with_theta_cotangent(params, ct_theta):
        return eqx.tree_at(
            lambda p: (p.vf, p.args), _zeros_float(params), ct_theta, is_leaf=_is_none
        )

    def with_y_cotangent(init, ct_y):
        return eqx.tree_at(lambda s: s.y, _zeros_float(init), ct_y, is_leaf=_is_none)

    return ContinuousProblem(
        field=lambda theta, t, y: theta[0](t, y, theta[1]),
        theta_of=lambda params: (params.vf, params.args),
        with_theta_cotangent=with_theta_cotangent,
        times_of=lambda p: (p.t_start, p.t_end, p.save_ts, p.controller),
        y_of=lambda carry: carry.y,
        with_y_cotangent=with_y_cotangent,
        saved=saved,
        t_start=lambda params: params.t_start,
        integrate=integrate,
    )
