"""Diffrax's way of setting an implicit solver's Newton tolerances: `root_finder=`.

Implicit solvers here always solve their stages by chord iterations (see `_implicit`);
a root finder passed as `Kvaerno5(root_finder=...)` only sets when those iterations stop:
its `rtol` and `atol` (and `kappa`, where it has one). Diffrax's `VeryChord` and
optimistix's root finders (`optx.Chord`, `optx.Newton`, which carry `rtol` and `atol`)
are read the same way.
"""

from collections.abc import Callable
from typing import Any

import equinox as eqx


class VeryChord(eqx.Module):
    """Newton tolerances for an implicit solver, as Diffrax's `VeryChord`: iterate until
    the estimated error of a stage is below `kappa * (atol + rtol * |y|)`. `rtol=None`,
    `atol=None`: the step-size controller's. `norm` is accepted for Diffrax's signature;
    the error is measured in the RMS norm."""

    rtol: float | None = None
    atol: float | None = None
    kappa: float = 1e-2
    norm: Any = None

    def __check_init__(self):
        if (self.rtol is None) != (self.atol is None):
            raise ValueError(
                f"VeryChord(rtol={self.rtol}, atol={self.atol}): pass both or neither "
                "(neither: the step-size controller's)."
            )


def with_stepsize_controller_tols(cls: type) -> Callable[..., Any]:
    """As Diffrax: `with_stepsize_controller_tols(VeryChord)()` makes a root finder that
    takes its tolerances from the step-size controller (here: `rtol=atol=None`)."""

    def make(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("rtol", None)
        kwargs.setdefault("atol", None)
        return cls(*args, **kwargs)

    return make


def root_finder_tolerances(root_finder: Any) -> tuple[Any, Any, Any]:
    """(rtol, atol, kappa) of a root finder; None for those it leaves to the controller
    or the solver."""
    for name in ("rtol", "atol"):
        if not hasattr(root_finder, name):
            raise TypeError(
                f"root_finder={root_finder!r}: pass odesolve.VeryChord(rtol, atol) or an "
                "optimistix root finder (it needs `rtol` and `atol`)."
            )
    return root_finder.rtol, root_finder.atol, getattr(root_finder, "kappa", None)
