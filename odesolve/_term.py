"""Terms: what is being integrated."""

import abc
from collections.abc import Callable
from typing import Any, Generic, TypeVar, get_origin

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu

from ._flat import PyTree, RealScalarLike
from ._results import TermAndSolverIncompatible

_VF = TypeVar("_VF")
_Control = TypeVar("_Control")
_Terms = TypeVar("_Terms")


class AbstractTerm(eqx.Module, Generic[_VF, _Control]):
    """A term of the equation: dy = prod(vf(t, y, args), contr(t0, t1)). Diffrax's base
    of `ODETerm`, for `isinstance` checks and annotations (`AbstractTerm[VF, Control]`);
    `diffeqsolve` takes an `ODETerm`."""

    @abc.abstractmethod
    def vf(self, t: RealScalarLike, y: PyTree, args: PyTree) -> _VF:
        """The vector field at (t, y)."""

    @abc.abstractmethod
    def contr(self, t0: RealScalarLike, t1: RealScalarLike) -> _Control:
        """The control over [t0, t1]."""

    @abc.abstractmethod
    def prod(self, vf: _VF, control: _Control) -> PyTree:
        """The increment of y: the vector field applied to the control."""

    def vf_prod(self, t: RealScalarLike, y: PyTree, args: PyTree, control: _Control) -> PyTree:
        return self.prod(self.vf(t, y, args), control)

    def _control_rate(self, t: Any) -> _Control:
        """dc/dt: the rate of contr(t, s) in s at s = t, for the term as an ODE."""
        t = jnp.asarray(t)
        return jax.jvp(lambda s: self.contr(t, s), (t,), (jnp.ones_like(t),))[1]

    def is_vf_expensive(
        self, t0: RealScalarLike, t1: RealScalarLike, y: PyTree, args: PyTree
    ) -> bool:
        """Whether the field alone costs more than its product with a control. A
        Runge-Kutta method's `init` then carries no field value into the first step
        (it gives None), as Diffrax's does; its `step` evaluates it."""
        return False


class ODETerm(AbstractTerm[_VF, RealScalarLike]):
    """dy/dt = vector_field(t, y, args), with `y` any PyTree of float arrays.

    `vector_field` may be a plain function, a closure over arrays, or an `eqx.Module`
    whose arrays are its parameters; all of them receive gradients. `ODETerm[VF]` names
    the type of what the field returns, as in Diffrax.
    """

    vector_field: Callable[..., _VF]

    def __check_init__(self):
        if not callable(self.vector_field):
            raise TypeError(
                f"ODETerm(vector_field={self.vector_field!r}): pass a function "
                "f(t, y, args) returning dy/dt (or a callable eqx.Module)."
            )

    def vf(self, t: RealScalarLike, y: PyTree, args: PyTree) -> _VF:
        return self.vector_field(t, y, args)

    def contr(self, t0: RealScalarLike, t1: RealScalarLike) -> Any:
        """The control over [t0, t1]: for an ODE, the time increment."""
        return t1 - t0

    def prod(self, vf: _VF, control: RealScalarLike) -> PyTree:
        return jtu.tree_map(lambda v: v * control, vf)


class MultiTerm(AbstractTerm[tuple, tuple], Generic[_Terms]):
    """Several terms of one equation, added: `MultiTerm(ODETerm(f), ODETerm(g))` solves
    dy/dt = f(t, y, args) + g(t, y, args), as Diffrax's class of that name does for ODE
    terms (a field split into parts, e.g. a model and a forcing written apart).
    `MultiTerm[tuple[...]]` names the terms' types, as in Diffrax."""

    terms: tuple[AbstractTerm, ...]

    def __init__(self, *terms: AbstractTerm):
        if not terms or not all(isinstance(term, AbstractTerm) for term in terms):
            raise TypeError(
                f"MultiTerm{terms!r}: pass one or more terms, e.g. MultiTerm(ODETerm(f), "
                "ODETerm(g)) for dy/dt = f + g."
            )
        self.terms = terms

    def vf(self, t: RealScalarLike, y: PyTree, args: PyTree) -> tuple:
        return tuple(term.vf(t, y, args) for term in self.terms)

    def contr(self, t0: RealScalarLike, t1: RealScalarLike) -> tuple:
        return tuple(term.contr(t0, t1) for term in self.terms)

    def prod(self, vf: tuple, control: tuple) -> PyTree:
        return _sum([term.prod(v, c) for term, v, c in zip(self.terms, vf, control)])

    def is_vf_expensive(
        self, t0: RealScalarLike, t1: RealScalarLike, y: PyTree, args: PyTree
    ) -> bool:
        return any(term.is_vf_expensive(t0, t1, y, args) for term in self.terms)


def _sum(trees: list[PyTree]) -> PyTree:
    """Leafwise sum of PyTrees of one structure."""
    return jtu.tree_map(lambda *leaves: sum(leaves[1:], leaves[0]), *trees)


class _Summed(eqx.Module):
    # The ODE terms of a MultiTerm as one field: the sum of their rates.
    terms: tuple[ODETerm, ...]

    def __call__(self, t: RealScalarLike, y: PyTree, args: PyTree) -> PyTree:
        rates = [term.vf(t, y, args) for term in self.terms]
        try:
            return _sum(rates)
        except (TypeError, ValueError) as error:
            shapes = lambda tree: jtu.tree_map(jnp.shape, tree)
            listed = "; ".join(f"terms[{i}]: {shapes(r)}" for i, r in enumerate(rates))
            raise ValueError(
                f"MultiTerm: the rates of its terms do not add up ({listed}; y0: "
                f"{shapes(y)}). Each term's field must return dy/dt shaped like y0."
            ) from error


class BroadcastTo(eqx.Module):
    """A field whose output leaves broadcast to the state's leaves (a scalar rate for a
    vector of states), as one that returns them in those `shapes`: Diffrax's steps add
    such a rate to the state by broadcasting."""

    field: Callable[..., PyTree]
    shapes: tuple[tuple[int, ...], ...] = eqx.field(static=True)

    def __call__(self, t: RealScalarLike, y: PyTree, args: PyTree) -> PyTree:
        leaves, treedef = jtu.tree_flatten(self.field(t, y, args))
        broadcast = [jnp.broadcast_to(x, s) for x, s in zip(leaves, self.shapes, strict=True)]
        return jtu.tree_unflatten(treedef, broadcast)


class RateOfControl(eqx.Module):
    """A term as an ODE's field: dy/dt = prod(vf(t, y, args), dc/dt) (prod is linear in
    the control), dc/dt its `_control_rate`. For a term of the user's own with a control
    of s - t, the steps are those of its increments exactly; a `ControlTerm` gives its
    path's derivative. A module, so the term's arrays are parameters with gradients."""

    term: AbstractTerm

    def __call__(self, t: RealScalarLike, y: PyTree, args: PyTree) -> PyTree:
        return self.term.vf_prod(t, y, args, self.term._control_rate(t))


def _ode_terms(term: Any) -> tuple[ODETerm, ...] | None:
    """The ODE terms a term adds up (None if some part of it is not an ODE): a term of
    the user's own with a control in time is one; a `ControlTerm` is one by its
    `to_ode()` when its path says how it changes (`derivative(t)`): dy/dt = f · dx/dt,
    as Diffrax solves it with an ODE solver (which takes the path's increment over each
    step: to first order the same; `to_ode` keeps the solver's order)."""
    if isinstance(term, ODETerm):
        return (term,)
    is_own = isinstance(term, AbstractTerm) and not isinstance(term, MultiTerm)
    if is_own and callable(getattr(term, "to_ode", None)):
        return (term.to_ode(),) if _differentiable(term) else None
    if is_own:
        return (ODETerm(RateOfControl(term)),)
    if isinstance(term, MultiTerm):
        parts = [_ode_terms(t) for t in term.terms]
        if all(p is not None for p in parts):
            return tuple(t for p in parts for t in p)  # type: ignore[union-attr]
    return None


def _as_ode_term(terms: Any) -> "ODETerm | None":
    """An ODETerm, or a MultiTerm of ODETerms as one (None for anything else)."""
    parts = _ode_terms(terms)
    if parts is None:
        return None
    return parts[0] if len(parts) == 1 else ODETerm(_Summed(parts))


class _Paired(eqx.Module):
    # Two terms as one field on the pair (y_1, y_2): (f_1(t, y_2), f_2(t, y_1)), each
    # part's rate from the other part (a partitioned system, e.g. positions and momenta).
    first: AbstractTerm
    second: AbstractTerm

    def __call__(self, t: RealScalarLike, y: PyTree, args: PyTree) -> PyTree:
        y_1, y_2 = y
        return (self.first.vf(t, y_2, args), self.second.vf(t, y_1, args))


class OnePart(eqx.Module):
    """The `args` of a call to a `SplitField` that asks for one of its parts: `which`
    is 0 (the explicit part) or 1 (the implicit part). It passes through the flat,
    rematerialised and traced wrappers of the field as `args` does."""

    args: PyTree
    which: int = eqx.field(static=True)


class SplitField(eqx.Module):
    """The field of `MultiTerm(ODETerm(explicit), ODETerm(implicit))` for a solver that
    treats the two parts apart (an IMEX method): called with the user's `args` it is
    the sum of both parts (for everything but the solver's stages: the first step size,
    the continuous adjoint), called with `OnePart(args, which)` it is that part alone."""

    parts: tuple[ODETerm, ODETerm]

    def __call__(self, t: RealScalarLike, y: PyTree, args: PyTree) -> PyTree:
        if isinstance(args, OnePart):
            return self.parts[args.which].vf(t, y, args.args)
        return _sum([part.vf(t, y, args) for part in self.parts])

    def map_parts(self, fn: Callable[[ODETerm], ODETerm]) -> "SplitField":
        return SplitField((fn(self.parts[0]), fn(self.parts[1])))


class _NumberEverywhere(eqx.Module):
    # A part of a split field that returns one number stands for that number in every
    # component of y: Diffrax accepts `ODETerm(lambda t, y, args: 0)` for an absent part.
    term: ODETerm

    def __call__(self, t: RealScalarLike, y: PyTree, args: PyTree) -> PyTree:
        out = self.term.vf(t, y, args)
        leaves, states = jtu.tree_leaves(out), jtu.tree_leaves(y)
        scalar_state = len(states) == 1 and jnp.ndim(states[0]) == 0
        if len(leaves) != 1 or jnp.ndim(leaves[0]) != 0 or scalar_state:
            return out
        return jtu.tree_map(lambda x: jnp.full(jnp.shape(x), leaves[0], jnp.result_type(x)), y)


def _split_term(terms: Any) -> "ODETerm":
    """`MultiTerm(ODETerm(f), ODETerm(g))` as one term whose field keeps its parts."""
    given = terms.terms if isinstance(terms, MultiTerm) else ()
    parts = [term for term in map(_as_ode_term, given) if term is not None]
    if len(given) != 2 or len(parts) != 2:
        raise TermAndSolverIncompatible(
            f"{_INCOMPATIBLE}terms={terms!r}: this solver takes MultiTerm(ODETerm(explicit), "
            "ODETerm(implicit)): the non-stiff part of the field, stepped explicitly, and "
            "its stiff part, stepped implicitly (dy/dt is their sum)."
        )
    explicit, implicit = (ODETerm(_NumberEverywhere(part)) for part in parts)
    return ODETerm(SplitField((explicit, implicit)))


# Diffrax's words for these errors, which code written for it may match.
_INCOMPATIBLE = "Terms are not compatible with solver! "


def _differentiable(term: Any) -> bool:
    """Whether a control term's path says how it changes: `derivative(t)`."""
    return callable(getattr(getattr(term, "control", None), "derivative", None))


def as_one_term(terms: Any, term_structure: Any, y0: PyTree) -> "ODETerm":
    """The `ODETerm` the step loop integrates. A solver of two terms
    (`term_structure` a pair, `SemiImplicitEuler`) takes `(ODETerm(f_1), ODETerm(f_2))`
    on a state `(y_1, y_2)`, with dy_1/dt = f_1(t, y_2) and dy_2/dt = f_2(t, y_1). A
    solver of a `MultiTerm[...]` of two terms (an IMEX method) takes
    `MultiTerm(ODETerm(explicit), ODETerm(implicit))`, whose field keeps its parts
    (`SplitField`)."""
    if get_origin(term_structure) is MultiTerm:
        return _split_term(terms)
    if not isinstance(term_structure, tuple):
        one = _as_ode_term(terms)
        if one is not None:
            return one
        pair = ""
        if isinstance(terms, (tuple, list)):
            pair = " A pair of terms is for a partitioned solver, SemiImplicitEuler()."
        if callable(getattr(terms, "to_ode", None)):
            pair = (
                " A control term is solved as the ODE it is when its path has a "
                "derivative(t) method (e.g. LinearInterpolation, CubicInterpolation)."
            )
        origin = type(terms).__module__.split(".")[0]
        if origin not in ("builtins", "odesolve"):
            pair += f" A {origin} term does not mix with odesolve's: use odesolve.ODETerm."
        raise TermAndSolverIncompatible(
            f"{_INCOMPATIBLE}terms={terms!r}: pass ODETerm(f) with f(t, y, args) returning "
            f"dy/dt (or a MultiTerm of ODETerms, whose rates add).{pair}"
        )
    is_pair = isinstance(terms, (tuple, list)) and len(terms) == 2
    if is_pair:
        terms = tuple(_as_ode_term(t) for t in terms)
    if not (is_pair and all(isinstance(t, ODETerm) for t in terms)):
        raise TermAndSolverIncompatible(
            f"{_INCOMPATIBLE}terms={terms!r}: this solver takes a pair (ODETerm(f_1), "
            "ODETerm(f_2)) for a state (y_1, y_2), with dy_1/dt = f_1(t, y_2, args) and "
            "dy_2/dt = f_2(t, y_1, args)."
        )
    if not (isinstance(y0, (tuple, list)) and len(y0) == 2):
        raise ValueError(
            f"y0 of type {type(y0).__name__}: a pair of terms integrates a pair of states, "
            "y0=(y_1, y_2)."
        )
    return ODETerm(_Paired(terms[0], terms[1]))
