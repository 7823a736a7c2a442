"""Checks of the arguments the adjoints (and the solvers' Diffrax-spelled options) are
made with: each names the class, the argument and its value, and says the fix."""

import numbers
from typing import Any


def check_count(owner: str, name: str, value: Any, least: int, unit: str) -> None:
    """`value` is None or a whole number of `unit` of at least `least`."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"{owner}({name}={value!r}): pass an integer number of {unit} "
            "(or leave it out for the default)."
        )
    if value < least:
        raise ValueError(
            f"{owner}({name}={value!r}): pass {least} {unit} or more "
            "(or leave it out for the default)."
        )


def check_linear_solver(owner: str, solver: Any) -> None:
    """`solver` is None or a Lineax linear solver."""
    if solver is None:
        return
    try:
        import lineax as lx
    except ImportError:
        raise ImportError(
            f"{owner}(linear_solver=...) takes a Lineax solver: pip install lineax "
            "(or leave linear_solver out)."
        ) from None
    if not isinstance(solver, lx.AbstractLinearSolver):
        raise TypeError(
            f"{owner}(linear_solver={solver!r}): pass a Lineax solver, e.g. "
            "lineax.AutoLinearSolver(well_posed=None), or leave it out."
        )
