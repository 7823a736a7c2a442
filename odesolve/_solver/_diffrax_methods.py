"""A Runge-Kutta method written in Diffrax's spelling runs on odesolve's engines.

A subclass of `AbstractERK` / `AbstractRungeKutta`, `AbstractDIRK`, `AbstractSDIRK` or
`AbstractESDIRK` whose `tableau` is Diffrax's `ButcherTableau(...)` or a
`MultiButcherTableau(...)`, with an `interpolation_cls` and an `order(self, terms)`, has
its tableau replaced by the engine's (see `_diffrax_tableau`) as the class is made, or
as its first step starts when its `interpolation_cls` reads the state's structure.
A `MultiButcherTableau` on a class that is not an IMEX method already is stepped by the
IMEX engine, and the class takes `MultiTerm(first, second)` as Diffrax's does.
"""

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from .._term import AbstractTerm, MultiTerm
from . import _diffrax_tableau as spelling
from ._additive import AbstractAdditiveRungeKutta
from ._implicit import AbstractImplicitRungeKutta
from ._runge_kutta import TABLEAU_SPELLINGS, AbstractTableauMethod

# What makes a class an IMEX method: taken from the IMEX engine's base.
_ADDITIVE = ("start", "advance", "_stages", "stages", "adaptive", "interpolation", "error_order")


def _interpolation_cls(cls: type) -> Callable:
    """`interpolation_cls` as a function of (t0, t1, y0, y1, k): a class, a static or
    class method, or a plain method (called without an instance, as it needs none)."""
    for klass in cls.__mro__:
        if "interpolation_cls" in vars(klass):
            raw = vars(klass)["interpolation_cls"]
            if inspect.isfunction(raw):  # a method of the solver, that uses no instance
                return lambda **kwargs: raw(None, **kwargs)
            return getattr(cls, "interpolation_cls")
    raise TypeError(
        f"{cls.__name__}: a method given by Diffrax's ButcherTableau needs an "
        "interpolation_cls for its dense output, e.g. interpolation_cls = "
        "ThirdOrderHermitePolynomialInterpolation.from_k."
    )


def _order(cls: type) -> int:
    """The order `cls.order(self, terms)` states (it needs neither). A class that does
    not define it fails when a solve asks for it (Diffrax's is abstract)."""
    if cls.order is AbstractTableauMethod.order:  # type: ignore[attr-defined]
        setattr(cls, "order", _undefined_order)
        return 0
    try:
        return int(cls.order(None, None))  # type: ignore[attr-defined]
    except Exception as error:
        raise TypeError(
            f"{cls.__name__}: order(self, terms) must return the method's order without "
            "reading self or terms (e.g. return 4), as Diffrax's methods do."
        ) from error


def _undefined_order(self: Any, terms: Any = None) -> int:
    raise TypeError(
        f"{type(self).__name__}: define order(self, terms) returning the method's order, "
        "as Diffrax asks of a Runge-Kutta method."
    )


def _as_additive(cls: type) -> None:
    """Step `cls` with the IMEX engine, on a MultiTerm of two terms. A class that is not
    an implicit method already (Diffrax's `AbstractRungeKutta` with an implicit tableau
    among its tableaus) gets the engine's Newton settings it does not declare, at their
    defaults."""
    if not issubclass(cls, AbstractAdditiveRungeKutta):
        for name in _ADDITIVE:
            setattr(cls, name, vars(AbstractAdditiveRungeKutta)[name])
        for field in dataclasses.fields(AbstractImplicitRungeKutta):
            if not hasattr(cls, field.name) and field.default is not dataclasses.MISSING:
                setattr(cls, field.name, field.default)
    setattr(cls, "term_structure", MultiTerm[tuple[AbstractTerm, AbstractTerm]])


def _conversion(cls: type, tableau: Any) -> Callable | None:
    """The function that turns `cls`'s Diffrax-spelled tableau into the engine's, or
    None for a tableau in the engine's spelling already."""
    if isinstance(tableau, spelling.MultiButcherTableau):
        spelling.check_multi(tableau)
        return spelling.additive_tableau
    if type(tableau) is not spelling.ButcherTableau:
        return None
    if tableau.implicit and not issubclass(cls, AbstractImplicitRungeKutta):
        raise TypeError(
            f"{cls.__name__}: a tableau with a_diagonal is diagonally implicit: "
            "subclass AbstractESDIRK (or AbstractDIRK, AbstractSDIRK)."
        )
    if not tableau.implicit and issubclass(cls, AbstractImplicitRungeKutta):
        raise TypeError(
            f"{cls.__name__}: its tableau has no a_diagonal (an explicit method): "
            "subclass AbstractERK."
        )
    return spelling.implicit_tableau if tableau.implicit else spelling.explicit_tableau


def _install(cls: type, new: Any) -> None:
    setattr(cls, "tableau", new)
    if cls.order is _undefined_order:  # type: ignore[attr-defined]
        setattr(cls, "error_order", _undefined_order)


def adapt(cls: type) -> None:
    """Replace a Diffrax-spelled `tableau` of `cls` by the engine's."""
    tableau = vars(cls).get("tableau")
    convert = _conversion(cls, tableau)
    if convert is None:
        return
    if convert is spelling.additive_tableau:
        _as_additive(cls)
    interpolation_cls, order = _interpolation_cls(cls), _order(cls)
    try:
        _install(cls, convert(tableau, interpolation_cls, order))
    except spelling.ProbeFailed:
        # The interpolant reads the state's structure (it indexes `k["y"]`, say), so
        # its coefficients are read on the first state the method steps instead.
        def prepare(self: Any, y0: Any) -> None:
            if vars(cls)["tableau"] is tableau:
                _install(cls, convert(tableau, interpolation_cls, order, y0))

        setattr(cls, "prepare", prepare)


TABLEAU_SPELLINGS.append(adapt)
