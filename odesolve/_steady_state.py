"""`steady_state_event`: stop once the solution has stopped changing (as Diffrax's)."""

import math
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp

from ._controller._base import AbstractStepSizeController, concrete_float
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
    """Tolerances known when given are finite and >= 0: a negative or NaN one is never
    met, and the solve would run out of steps without saying why."""
    for name, value in (("rtol", rtol), ("atol", atol)):
        known = None if value is None else concrete_float(value)
        if known is not None and not (known >= 0 and math.isfinite(known)):
            raise ValueError(f"{owner}({name}={value!r}): pass a finite number >= 0, e.g. 1e-6.")


def _tolerance(given: float | None, name: str, controller: AbstractStepSizeController) -> Any:
    if given is not None:
        return jnp.asarray(given)
    tolerances = controller.tolerances()
    if tolerances is None:
        raise ValueError(
            f"steady_state_event({name}=None) takes the step-size controller's {name}, but "
            f"{type(controller).__name__} has none: pass rtol and atol."
        )
    return jnp.asarray(tolerances[0 if name == "rtol" else 1])
