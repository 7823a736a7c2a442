"""Diffrax's names for kinds of solver: for code that asks `isinstance` of them, and for
solvers written in Diffrax's interface that subclass them."""

from typing import Any, ClassVar

import equinox as eqx

from ._base import AbstractSolver
from ._implicit import AbstractImplicitRungeKutta


class _AskedOfInstances(type(AbstractSolver)):  # type: ignore[misc]
    # Diffrax's kinds are bases; odesolve's solvers pass for them by what they are.
    # Adaptivity is a property of an instance (`HalfSolver(Euler())` is adaptive,
    # `Reversible(Euler())` is not). The implicit methods are Runge-Kutta methods first
    # (one engine for all tableaux). A subclass is asked as any class is. One metaclass
    # for both, so that a solver may subclass both kinds.
    def __instancecheck__(cls, instance: object) -> bool:
        if super().__instancecheck__(instance):
            return True
        if cls is AbstractAdaptiveSolver:
            return isinstance(instance, AbstractSolver) and bool(instance.adaptive)
        if cls is AbstractImplicitSolver:
            return isinstance(instance, AbstractImplicitRungeKutta)
        return False


class AbstractAdaptiveSolver(AbstractSolver, metaclass=_AskedOfInstances):
    """`isinstance(solver, AbstractAdaptiveSolver)` says whether its steps come with an
    error estimate, so that `PIDController` can adapt them (`solver.adaptive`): Heun,
    Tsit5, Kvaerno5, ReversibleHeun, `HalfSolver(...)`; not Euler or LeapfrogMidpoint.
    A solver written in Diffrax's interface may subclass it, as in Diffrax, to say
    that its `step` returns an error estimate."""


class AbstractImplicitSolver(AbstractSolver, metaclass=_AskedOfInstances):
    """An implicit method, as Diffrax names the kind: `isinstance` holds for
    `ImplicitEuler` and the Kvaerno methods. A solver written in Diffrax's interface
    may subclass it; it then has `root_finder` and `root_find_max_steps`, as fields or
    properties."""

    root_finder: eqx.AbstractVar[Any]
    root_find_max_steps: eqx.AbstractVar[Any]


class AbstractWrappedSolver(AbstractSolver):
    """A solver built on another one, `solver` (`HalfSolver`, `Reversible`). It passes
    `isinstance` for the final class of the solver it wraps, as in Diffrax."""

    wraps_solver: ClassVar[bool] = True
    solver: eqx.AbstractVar[AbstractSolver]

    def prepare(self, y0: Any) -> None:
        self.solver.prepare(y0)
