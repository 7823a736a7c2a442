"""`steady_state_event`: stop once the solution has stopped changing (as Diffrax's)."""

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp

from ._checks import check_tolerance
from ._controller._base import AbstractStepSizeController
from ._controller._user import controller_name
from ._controller.pid import rms_norm
from ._flat import PyTree, RealScalarLike
from ._term import ODETerm


def steady_state_event(
    rtol: float | None = None, atol: float | None = None, norm: Callable = rms_norm
) -> Callable:
    """A condition for `Event`: true once |f(t, y)| < atol + rtol |y| (in `norm`), that
    is once the state has (nearly) stopped moving. `rtol`, `atol`: by default the
    step-size controller's. Pair it with `t1=jnp.inf` to run to the steady state."""
    check_tolerances("steady_state_event", rtol, atol)

    def steady(
        t: RealScalarLike,
        y: PyTree,
        args: PyTree,
        *,
        terms: ODETerm,
        stepsize_controller: AbstractStepSizeController,
        **kwargs: object,
    ):
        _rtol = _tolerance(rtol, "rtol", stepsize_controller)
        _atol = _tolerance(atol, "atol", stepsize_controller)
        return norm(terms.vf(t, y, args)) < _atol + _rtol * norm(y)

    return steady


def check_tolerances(owner: str, rtol: Any, atol: Any) -> None:
    check_tolerance(owner, "rtol", rtol)
    check_tolerance(owner, "atol", atol)


def _tolerance(given: float | None, name: str, controller: AbstractStepSizeController) -> Any:
    if given is not None:
        return jnp.asarray(given)
    tolerances = controller.tolerances()
    if tolerances is None:
        raise ValueError(
            f"steady_state_event({name}=None) takes the step-size controller's {name}, but "
            f"{controller_name(controller)} has none: pass rtol and atol."
        )
    return jnp.asarray(tolerances[0 if name == "rtol" else 1])
