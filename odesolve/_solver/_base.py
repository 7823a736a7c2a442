"""What every solver is: `AbstractSolver`, and what a step hands back.

The step loop works on one flat state vector in internal time tau (see `_flat` and
`_field`), and asks a solver for two things: `start` (given a `StartInput`), the state it
carries from step to step (a first-same-as-last derivative, a second state, a previous
point), and `advance` (given a `StepInput`), one attempted step. A step returns its new
state, an error estimate, and the vectors its dense output is made of: y(theta) = y0 + h
sum_i w_i(theta) dense_i, the weights given by the solver's `interpolation` table (see
`_interpolation`).

Diffrax's low-level API (`init`, `step`, `func`) works on the user's PyTree state and
real time, for people who write their own loops; it is built on the same two methods.
"""

import abc
import inspect
from collections.abc import Callable
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jaxtyping import Array, Bool, Float

from .._checks import check_array_leaves, check_finite_time, is_boolean_scalar
from .._field import FlatField
from .._flat import FlatSpec, PyTree, RealScalarLike, flat_spec, state_dtype
from .._results import RESULTS
from .._term import AbstractTerm, ODETerm, as_one_term
from .._time import as_times

# A vector field on a flat state: f(t, y, args).
Field = Callable[[Any, Any, Any], Any]


class StepField(eqx.Module):
    """The vector field as a step is given it. Calling it evaluates a stage: the loop
    makes that `Rematerialised` (reverse mode keeps the stage's input, not the field's
    intermediate values). `at_start` evaluates it at the step's start (t0, y0), whose
    inputs reverse mode keeps anyway, so it is not rematerialised: that would evaluate
    the field twice more when the step is reversed."""

    stages: Field
    plain: Field

    def __call__(self, t: Float[Array, ""], y: Float[Array, " n"], args: PyTree) -> Any:
        return self.stages(t, y, args)

    def at_start(self, t: Float[Array, ""], y: Float[Array, " n"], args: PyTree) -> Any:
        return self.plain(t, y, args)


class StepContext(eqx.Module):
    """What the step loop tells a solver beyond the step itself. Explicit methods need
    none of it; implicit ones derive their Newton tolerances from it.

    - `tolerances`: the controller's (rtol, atol), or None (fixed step sizes).
    - `direction`: +1 or -1, the sign of t1 - t0: the vector field a solver is given runs
      in tau = direction * t, so a user-supplied Jacobian must be mapped the same way.
    - `spec`: the static layout of the user's state (`FlatSpec`).
    - `span`: the length of the solve, |t1 - t0|, carrying no derivative (None where
      unknown): how many steps of a size fit it, for a solver whose errors add up
      step after step (`Reversible`).
    - `batched`: the step runs for each sample of a `vmap` batch (explicit stages then
      stay unrolled: see `_stage_loop`).
    """

    tolerances: tuple[Any, Any] | None
    direction: Any
    spec: FlatSpec | None = eqx.field(static=True)
    span: Any = None
    batched: bool = eqx.field(static=True, default=False)


class StartInput(eqx.Module):
    """Where a solve begins, as a solver's `start` is told it.

    - `vf`: the vector field on the flat state, f(t, y, args) (the loop's `FlatField`).
    - `t0`: the start time (internal time tau).
    - `y0`: (n,) the initial state.
    - `k0`: (n,) f(t0, y0), evaluated once by the loop.
    - `args`: the user's `args`, passed to `vf`.
    """

    vf: Field
    t0: Float[Array, ""]
    y0: Float[Array, " n"]
    k0: Float[Array, " n"]
    args: PyTree


class StepInput(eqx.Module):
    """One step to attempt, from (t0, y0) with size h, as a solver's `advance` is told it.

    - `vf`: the vector field as a step is given it (`StepField`).
    - `t0`: where the step starts (internal time tau); `h`: its size, so it ends at t0 + h.
    - `y0`: (n,) the state at t0.
    - `state`: what the solver carries into the step (`start`'s, then the last accepted
      step's `StepResult.state`).
    - `made_jump`: the last step ended on a discontinuity, so whatever `state` holds of f
      at t0 is its left limit (None: there are no jumps).
    - `args`: the user's `args`, passed to `vf`.
    - `with_error`: whether to return an error estimate (static; the loop asks for one
      when the controller reads it).
    - `context`: what the loop tells beyond the step (`StepContext`), or None.
    - `t1`: where the step ends exactly (t0 + h up to its rounding), or None for t0 + h:
      a stage at its end is evaluated there, as Diffrax evaluates it, so that a field
      with a jump at the step's end reads its value there.
    """

    vf: StepField
    t0: Float[Array, ""]
    h: Float[Array, ""]
    y0: Float[Array, " n"]
    state: PyTree
    made_jump: Bool[Array, ""] | None
    args: PyTree
    with_error: bool = eqx.field(static=True)
    context: StepContext | None
    t1: Float[Array, ""] | None = None


class RetreatInput(eqx.Module):
    """An accepted step to undo, as a reversible solver's `retreat` is told it.

    - `vf`: the vector field on the flat state, f(t, y, args).
    - `t0`: where the step started (internal time tau); `h`: its size, so it ended at
      t0 + h.
    - `y1`: (n,) the state the step ended at; `state1`: what the solver carried out of
      it (its `StepResult.state`).
    - `args`: the user's `args`, passed to `vf`.
    - `context`: as `advance` is given it (`StepContext`), or None.
    - `kept`: `kept(state0)`, what the reverse sweep kept of the state carried into the
      step, or None when only y0 and the dense vectors are wanted (state0 is then not
      read).
    """

    vf: Field
    t0: Float[Array, ""]
    h: Float[Array, ""]
    y1: Float[Array, " n"]
    state1: PyTree
    args: PyTree
    context: StepContext | None = None
    kept: PyTree = None


class StepResult(eqx.Module):
    """One attempted step from (t0, y0) with size h.

    - `y1`: (n,) candidate solution at t0 + h.
    - `y_error`: (n,) local error estimate, or None (no estimate, or none asked for).
    - `dense`: the vectors (n,) the step's interpolant is made of, one per row of the
      solver's `interpolation` table.
    - `state`: what the solver carries to the next step if this one is accepted.
    - `failed`: whether an implicit stage's Newton iterations failed (None: explicit).
    """

    y1: Float[Array, " n"]
    y_error: Float[Array, " n"] | None
    dense: tuple[Float[Array, " n"], ...]
    state: Any
    failed: Bool[Array, ""] | None = None


# The step loop's contract, which a solver written in Diffrax's interface does not
# define: `diffeqsolve` runs such a solver through an adapter (`_user.UserSolver`).
_LOOP_CONTRACT = frozenset(
    {"start", "advance", "adaptive", "interpolation", "order", "error_order"}
)
# What Diffrax's `AbstractSolver` requires of a subclass.
_DIFFRAX_INTERFACE = ("init", "step", "func")


def writes_diffrax_steps(cls: type) -> bool:
    """Whether a solver class is written in Diffrax's interface: its `step` (the first
    in its MRO) comes from a class that does not define the loop's `advance` too."""
    owner = next((k for k in cls.__mro__ if "step" in vars(k)), None)
    return owner is not None and "advance" not in vars(owner)


class _LooksThroughWrappers(type(eqx.Module)):  # type: ignore[misc]
    def __new__(mcs, name: str, bases: tuple, namespace: dict, **kwargs: Any) -> Any:
        cls = super().__new__(mcs, name, bases, namespace, **kwargs)
        if writes_diffrax_steps(cls):
            # Abstract as Diffrax's AbstractSolver is: `init`, `step` and `func` must be
            # written; the loop's contract is the adapter's, not the class's. A subclass
            # of a final solver (a `step` written over `Euler`'s) inherits that solver's
            # `init` and `func`, as in Diffrax: here they are `AbstractSolver`'s.
            concrete = any(
                issubclass(k, AbstractSolver) and not inspect.isabstract(k) for k in cls.__mro__[1:]
            )
            unwritten = {m for m in _DIFFRAX_INTERFACE if _from_base(cls, m) and not concrete}
            cls.__abstractmethods__ = (cls.__abstractmethods__ - _LOOP_CONTRACT) | unwritten
        return cls

    # As in Diffrax, a wrapper passes for the solver it wraps: `HalfSolver(Euler())` is
    # an `Euler`. Only for the final classes: asked of an abstract kind (reversible,
    # Runge-Kutta), the answer is the wrapper's own, which is what the loop relies on.
    def __instancecheck__(cls, instance: object) -> bool:
        if super().__instancecheck__(instance):
            return True
        wrapped = getattr(instance, "solver", None)
        return (
            not cls.__name__.startswith("Abstract")
            and isinstance(instance, AbstractSolver)
            and getattr(type(instance), "wraps_solver", False)
            and isinstance(wrapped, cls)
        )


class AbstractSolver(eqx.Module, metaclass=_LooksThroughWrappers):
    """A one-step method on the flat state. Subclasses are abstract or final.

    `term_structure`: the terms a solver takes, as Diffrax names it (one term here).

    A subclass written in Diffrax's interface instead (`init`, `step`, `func` on the
    user's PyTree state in real time, `order`, optionally `error_order`, and an
    `interpolation_cls` for dense output) runs in `diffeqsolve` too, through
    `_user.UserSolver`."""

    term_structure: ClassVar[Any] = AbstractTerm

    @abc.abstractmethod
    def order(self, terms: ODETerm | None = None) -> int:
        """Order of the solution."""

    @abc.abstractmethod
    def error_order(self, terms: ODETerm | None = None) -> int:
        """The controller's step-size exponent is 1 / error_order."""

    @property
    @abc.abstractmethod
    def adaptive(self) -> bool:
        """Whether steps come with an error estimate (for `PIDController`)."""

    @property
    @abc.abstractmethod
    def interpolation(self) -> tuple[tuple[float, ...], ...]:
        """Dense-output coefficients, one row per vector of `StepResult.dense`."""

    @abc.abstractmethod
    def start(self, first: StartInput) -> Any:
        """The state carried into the first step."""

    @abc.abstractmethod
    def advance(self, step: StepInput) -> StepResult:
        """One attempted step."""

    def prepare(self, y0: PyTree) -> None:
        """Complete what the method could not know before it saw a state: the dense
        output of a Diffrax-spelled method whose `interpolation_cls` indexes the state
        (`k["y"]`). Called before stepping; nothing for most methods."""

    # ------------------------------------------------- Diffrax's low-level API

    def init(
        self, terms: ODETerm, t0: RealScalarLike, t1: RealScalarLike, y0: PyTree, args: PyTree
    ) -> Any:
        """The solver state before the first step (opaque: pass it to `step`)."""
        check_array_leaves(y0, "y0", "solver.init: ")
        self.prepare(y0)
        spec, field = _flat_problem(self.term_structure, terms, y0, args)
        y = spec.ravel(y0)
        t, _ = as_times(t0, t1, state=y0)
        return self.start(StartInput(vf=field, t0=t, y0=y, k0=field(t, y, args), args=args))

    def step(
        self,
        terms: ODETerm,
        t0: RealScalarLike,
        t1: RealScalarLike,
        y0: PyTree,
        args: PyTree,
        solver_state: PyTree,
        made_jump: bool | Bool[Array, ""],
    ) -> tuple[Any, Any, dict[str, Any], Any, Any]:
        """One step from t0 to t1: (y1, y_error, dense_info, solver_state, result), as
        Diffrax's `solver.step`. y_error is None for a method without an estimate."""
        check_array_leaves(y0, "y0", "solver.step: ")
        check_finite_time("solver.step(t0", t0)
        check_finite_time("solver.step(t1", t1)
        made_jump = _jump_flag(made_jump)
        self.prepare(y0)
        spec, field = _flat_problem(self.term_structure, terms, y0, args)
        start, end = as_times(t0, t1, state=y0)
        context = StepContext(None, jnp.ones((), start.dtype), spec)
        step = StepInput(
            vf=StepField(field, field),
            t0=start,
            h=end - start,
            y0=spec.ravel(y0),
            state=solver_state,
            made_jump=made_jump,
            args=args,
            with_error=self.adaptive,
            context=context,
            t1=end,
        )
        try:
            out = self.advance(step)
        except (TypeError, ValueError) as error:
            # A state that is not the one `init` makes fails deep in the step: say so.
            expected = jax.eval_shape(lambda: self.init(terms, t0, t1, y0, args))
            got = jax.eval_shape(lambda: solver_state)
            # (jaxlib's stub for PyTreeDef declares no __eq__.)
            same = jtu.tree_structure(got) == jtu.tree_structure(expected)  # type: ignore[operator]
            if not same or jtu.tree_leaves(got) != jtu.tree_leaves(expected):
                raise ValueError(
                    f"solver_state={solver_state!r} is not the state this solver carries for "
                    f"y0 (expected {expected}): pass what solver.init(terms, t0, t1, y0, "
                    "args) or the previous solver.step returned."
                ) from error
            raise
        result: Any = RESULTS.successful
        if out.failed is not None:
            result = jnp.where(out.failed, RESULTS.nonlinear_divergence, result)
        y_error = None if out.y_error is None else spec.unravel(out.y_error)
        dense_info = dict(y0=y0, y1=spec.unravel(out.y1), k=out.dense)
        return spec.unravel(out.y1), y_error, dense_info, out.state, result

    def func(self, terms: ODETerm, t0: RealScalarLike, y0: PyTree, args: PyTree) -> Any:
        """The vector field at (t0, y0)."""
        (t,) = as_times(t0, state=y0)
        return as_one_term(terms, self.term_structure, y0).vf(t, y0, args)


def _jump_flag(made_jump: Any) -> Bool[Array, ""]:
    """`made_jump` as a boolean scalar (None: no jump)."""
    if made_jump is None:
        return jnp.asarray(False)
    if not is_boolean_scalar(made_jump):
        raise TypeError(
            f"solver.step(made_jump={made_jump!r}): pass a boolean scalar, True when t0 is "
            "just past a jump of the vector field (False otherwise)."
        )
    return jnp.asarray(made_jump)


def _from_base(cls: type, method: str) -> bool:
    """Whether `cls` has `method` only as `AbstractSolver` defines it."""
    return next(k for k in cls.__mro__ if method in vars(k)) is AbstractSolver


class AbstractReversibleSolver(AbstractSolver):
    """A solver whose accepted steps can be undone algebraically: from the state after
    a step, the state before it (exact in exact arithmetic). `ReversibleAdjoint` rebuilds
    the solve backwards this way instead of storing it.

    `reverses_jumps`: a step that starts just after a discontinuity (`jump_ts`) can be
    undone too; not for a method that evaluates the field there at another state."""

    reverses_jumps: ClassVar[bool] = True

    def kept(self, state: PyTree) -> PyTree:
        """What of the state carried into a step the reverse sweep keeps for `retreat`,
        as it keeps the step times: scalars that a step cannot be undone without (a
        previous time). None by default: everything is rebuilt."""
        return None

    @abc.abstractmethod
    def retreat(
        self, undo: RetreatInput
    ) -> tuple[Float[Array, " n"], Any, tuple[Float[Array, " n"], ...]]:
        """Undo the accepted step from t0 of size h that ended at (y1, state1): the
        (y0, state0) it started from, and the step's dense vectors (as `advance` gave)."""


def _flat_problem(
    term_structure: Any, terms: Any, y0: PyTree, args: PyTree
) -> tuple[FlatSpec, Field]:
    """The field on the flat state, in the user's own time (direction +1)."""
    leaves = [jnp.asarray(x) for x in jtu.tree_leaves(y0)]  # Python numbers too
    spec = flat_spec(jtu.tree_unflatten(jtu.tree_structure(y0), leaves), state_dtype(leaves))
    return spec, FlatField(as_one_term(terms, term_structure, y0), spec, 1)
