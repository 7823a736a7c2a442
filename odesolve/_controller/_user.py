"""Step-size controllers written in Diffrax's interface, run by the step loop.

A controller written as Diffrax asks (`wrap(direction)`, `init(terms, t0, t1, y0, dt0,
args, func, error_order)` and `adapt_step_size(t0, t1, y0, y1_candidate, args, y_error,
error_order, controller_state)` on the user's PyTree state) is a subclass of
`AbstractStepSizeController` that the loop cannot call: the loop works on one flat
vector and asks its controllers through `start` and `adapt`. `UserController` gives it
that contract, so `diffeqsolve` takes it with every solver, `SaveAt` and adjoint, and
inside `ClipStepSizeController`. Its times are the loop's (tau = direction * t, which
increases), as Diffrax's loop gives them after `wrap(direction)`.
"""

from typing import Any, final

import equinox as eqx
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jaxtyping import Array, Float

from .._flat import RealScalarLike
from .._term import ODETerm
from ._base import (
    AbstractAdaptiveStepSizeController,
    AbstractStepSizeController,
    AttemptInput,
    FirstStepInput,
    Proposal,
    writes_diffrax_step_sizes,
)
from .clip import ClipStepSizeController


def loop_controller(
    controller: AbstractStepSizeController, estimates: bool
) -> AbstractStepSizeController:
    """The controller as the step loop runs it: one written in Diffrax's interface in
    `UserController`, also inside a `ClipStepSizeController`; any other as it is.
    `estimates`: the solver gives an error estimate."""
    if writes_diffrax_step_sizes(type(controller)):
        adaptive = isinstance(controller, AbstractAdaptiveStepSizeController)
        return UserController(controller, given_error=adaptive or estimates)
    if type(controller) is ClipStepSizeController:  # (a PID with step_ts passes for one)
        inner = loop_controller(controller.controller, estimates)
        return eqx.tree_at(lambda c: c.controller, controller, inner)
    return controller


def written_in_diffrax_interface(controller: AbstractStepSizeController) -> bool:
    """Whether `controller` holds one written in Diffrax's interface (after
    `loop_controller`)."""
    is_user = lambda x: isinstance(x, UserController)
    return any(is_user(x) for x in jtu.tree_leaves(controller, is_leaf=is_user))


def controller_name(controller: AbstractStepSizeController) -> str:
    """The class name to tell a user: their own for a controller in `UserController`."""
    inner = controller.controller if isinstance(controller, UserController) else controller
    return type(inner).__name__


def _field_of(first: FirstStepInput) -> ODETerm:
    """The loop's vector field on the user's PyTree state, as an `ODETerm`."""
    spec = first.spec
    return ODETerm(lambda t, y, args: spec.unravel(first.vf(t, spec.ravel(y), args)))


def _solver_func(terms: ODETerm, t: RealScalarLike, y: Any, args: Any) -> Any:
    """Diffrax's `solver.func(terms, t, y, args)` for one ODE term: the field's value."""
    return terms.vf(t, y, args)


@final
class UserController(AbstractStepSizeController):
    """A controller written in Diffrax's interface, as the step loop calls one.
    `given_error`: it is given the solver's error estimate (always when the solver has
    one, as in Diffrax; an adaptive one, a subclass of
    `AbstractAdaptiveStepSizeController`, needs one). Implicit solvers take their Newton
    tolerances from its `rtol` and `atol` when it has them."""

    controller: AbstractStepSizeController
    given_error: bool = eqx.field(static=True)

    def wrap(self, direction: Float[Array, ""]) -> "UserController":
        return UserController(self.controller.wrap(direction), self.given_error)

    @property
    def needs_error(self) -> bool:
        return self.given_error

    @property
    def has_jumps(self) -> bool:
        return True  # its `adapt_step_size` says whether a step ended on a jump

    def jump_stops(self) -> None:
        return None

    def tolerances(self) -> tuple[Any, Any] | None:
        rtol = getattr(self.controller, "rtol", None)
        atol = getattr(self.controller, "atol", None)
        return None if rtol is None or atol is None else (rtol, atol)

    def times_are_valid(self, t_start: Float[Array, ""], t_end: Float[Array, ""]) -> Any:
        return jnp.asarray(True)

    def num_steps(
        self,
        t0: RealScalarLike,
        t1: RealScalarLike,
        dt0: RealScalarLike | None,
        time_dtype: np.dtype,
    ) -> None:
        return None  # the user's controller places its steps as it runs

    def start(self, first: FirstStepInput) -> tuple[Any, Any]:
        end, state = self.controller.init(
            _field_of(first),
            first.t0,
            first.t1,
            first.spec.unravel(first.y0),
            first.dt0,
            first.args,
            _solver_func,
            first.error_order,
        )
        return jnp.asarray(end, first.t0.dtype), state

    def adapt(self, attempt: AttemptInput) -> Proposal:
        unravel = attempt.spec.unravel
        # Under `vmap` a sample that has finished still runs the loop's body, a step of
        # no length whose result is discarded. A controller is not written for that (an
        # error of 0 to a negative power), and its derivative there, NaN, would reach the
        # gradient through the discarded result: it is shown a unit step instead.
        idle = attempt.t1 == attempt.t0
        t1 = jnp.where(idle, attempt.t0 + 1, attempt.t1)
        y_error = None
        if attempt.y_error is not None:
            y_error = unravel(jnp.where(idle, jnp.ones_like(attempt.y_error), attempt.y_error))
        accept, next_t0, next_t1, made_jump, state, result = self.controller.adapt_step_size(
            attempt.t0,
            t1,
            unravel(attempt.y0),
            unravel(attempt.y1),
            attempt.args,
            y_error,
            attempt.error_order,
            attempt.state,
        )
        dtype = attempt.t0.dtype
        return Proposal(
            accept=jnp.asarray(accept, bool),
            next_end=jnp.asarray(next_t1, dtype),
            state=state,
            result=result,
            start=jnp.asarray(next_t0, dtype),
            made_jump=jnp.asarray(made_jump, bool),
        )
