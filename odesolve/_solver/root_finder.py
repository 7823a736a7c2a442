"""Diffrax's way of setting an implicit solver's Newton tolerances: `root_finder=`.

Implicit solvers here always solve their stages by chord iterations (see `_implicit`);
a root finder passed as `Kvaerno5(root_finder=...)` only sets when those iterations stop:
its `rtol` and `atol` (and `kappa`, where it has one). Diffrax's `VeryChord` and
optimistix's root finders (`optx.Chord`, `optx.Newton`, which carry `rtol` and `atol`)
are read the same way. `VeryChord` is also a root finder of its own for
`optx.root_find` (see `_chord_root_find`).
"""

from collections.abc import Callable
from typing import Any

import equinox as eqx

from adjoints import check_linear_solver

from .._checks import check_tolerance
from .._flat import PyTree
from .._norm import rms_norm
from . import _chord_root_find as chord


class _ControllerTolerance:
    """The tolerance a root finder leaves to the step-size controller. A leaf rather than
    None, so that `eqx.tree_at(lambda s: s.root_finder.rtol, solver, 1e-3)` can set it,
    as code written for Diffrax does."""

    def __repr__(self) -> str:
        return "use_stepsize_tol"


use_stepsize_tol: Any = _ControllerTolerance()


def _unset(tolerance: Any) -> bool:
    return tolerance is None or tolerance is use_stepsize_tol


class VeryChord(eqx.Module):
    """Newton tolerances for an implicit solver, as Diffrax's `VeryChord`: iterate until
    the estimated error of a stage is below `kappa * (atol + rtol * |y|)`. Left out (or
    None): the step-size controller's. `norm` is accepted for Diffrax's signature; the
    error is measured in the RMS norm. So is `linear_solver` (a Lineax solver): the
    iterations solve with a dense LU factorisation of the Jacobian, which is what
    Diffrax's default, `lineax.AutoLinearSolver(well_posed=None)`, picks for it.

    With tolerances set, it is also an optimistix root finder, as Diffrax's is:
    `optx.root_find(fn, VeryChord(rtol=1e-8, atol=1e-8), y0)` runs chord iterations
    (the Jacobian at y0, factorised once), in `norm`."""

    rtol: Any = use_stepsize_tol
    atol: Any = use_stepsize_tol
    kappa: float = 1e-2
    norm: Any = rms_norm
    linear_solver: Any = None

    def __check_init__(self):
        check_linear_solver("VeryChord", self.linear_solver)
        if _unset(self.rtol) != _unset(self.atol):
            raise ValueError(
                f"VeryChord(rtol={self.rtol}, atol={self.atol}): pass both or neither "
                "(neither: the step-size controller's)."
            )
        if not _unset(self.rtol):
            _check_tolerances(self)

    # The optimistix root-finder protocol (init, step, terminate, postprocess).

    def init(self, fn, y, args, options, f_struct, aux_struct, tags) -> chord.ChordState:
        if _unset(self.rtol):
            raise ValueError(
                "VeryChord() as a root finder of its own has no tolerances: pass them, "
                "e.g. VeryChord(rtol=1e-8, atol=1e-8)."
            )
        return chord.init(fn, y, args, options)

    def step(self, fn, y, args, options, state, tags) -> tuple[PyTree, chord.ChordState, Any]:
        return chord.step(fn, y, args, state, self.rtol, self.atol, self.norm)

    def terminate(self, fn, y, args, options, state, tags) -> tuple[Any, Any]:
        return chord.stops(state, self.kappa)

    def postprocess(self, fn, y, aux, args, options, state, tags, result) -> tuple:
        return y, aux, {}


def with_stepsize_controller_tols(cls: type) -> Callable[..., Any]:
    """As Diffrax: `with_stepsize_controller_tols(VeryChord)()` makes a root finder that
    takes its tolerances from the step-size controller."""

    def make(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("rtol", use_stepsize_tol)
        kwargs.setdefault("atol", use_stepsize_tol)
        return cls(*args, **kwargs)

    return make


def root_finder_tolerances(root_finder: Any) -> tuple[Any, Any, Any]:
    """(rtol, atol, kappa) of a root finder; None for those it leaves to the controller
    or the solver."""
    if isinstance(root_finder, type):
        name = root_finder.__name__
        raise TypeError(f"root_finder={name} is a class: pass an instance, {name}(...).")
    for name in ("rtol", "atol"):
        if not hasattr(root_finder, name):
            raise TypeError(
                f"root_finder={root_finder!r}: pass odesolve.VeryChord(rtol, atol) or an "
                "optimistix root finder (it needs `rtol` and `atol`)."
            )
    if _unset(root_finder.rtol) or _unset(root_finder.atol):
        return None, None, getattr(root_finder, "kappa", None)
    _check_tolerances(root_finder)
    return root_finder.rtol, root_finder.atol, getattr(root_finder, "kappa", None)


def _check_tolerances(root_finder: Any) -> None:
    for name in ("rtol", "atol"):
        check_tolerance(type(root_finder).__name__, name, getattr(root_finder, name))
