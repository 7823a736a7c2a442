"""Diffrax's names for kinds of solver, for code that asks `isinstance` of them."""

import abc
from typing import ClassVar

import equinox as eqx

from ._base import AbstractSolver


class _HasErrorEstimate(abc.ABCMeta):
    # Adaptivity is a property of an instance (`HalfSolver(Euler())` is adaptive,
    # `Reversible(Euler())` is not), so it is asked of the instance, not its class.
    def __instancecheck__(cls, instance: object) -> bool:
        return isinstance(instance, AbstractSolver) and bool(instance.adaptive)


class AbstractAdaptiveSolver(metaclass=_HasErrorEstimate):
    """`isinstance(solver, AbstractAdaptiveSolver)` says whether its steps come with an
    error estimate, so that `PIDController` can adapt them (`solver.adaptive`): Heun,
    Tsit5, Kvaerno5, ReversibleHeun, `HalfSolver(...)`; not Euler or LeapfrogMidpoint.
    A question to ask of a solver, as in Diffrax, not a base class to subclass."""


class AbstractWrappedSolver(AbstractSolver):
    """A solver built on another one, `solver` (`HalfSolver`, `Reversible`). It passes
    `isinstance` for the final class of the solver it wraps, as in Diffrax."""

    wraps_solver: ClassVar[bool] = True
    solver: eqx.AbstractVar[AbstractSolver]
