"""Solvers written in Diffrax's interface, run by the step loop.

A researcher's own method, written as Diffrax asks (`init`, `step` and `func` on the
user's PyTree state in real time; `order`, optionally `error_order`; an
`interpolation_cls` built as `interpolation_cls(t0=, t1=, **dense_info)` for dense
output), is a subclass of `AbstractSolver` that the loop cannot step: the loop works on
one flat vector in internal time tau = direction * t (see `_base`). `UserSolver` gives it
the loop's contract, so `diffeqsolve` takes it under every controller, `SaveAt` and
adjoint, and odesolve's own solvers keep their direct path.

- Each step hands the user's `step` an `ODETerm` whose field is the loop's, seen in real
  time on the user's PyTree, so closed-over parameters still receive gradients.
- Dense output: the step's interpolant is sampled at `degree` points of the step and
  stored as the polynomial through them (Lagrange form, a fixed table), which is exact
  for Diffrax's local interpolations, polynomials of degree 1, 3 and 4.
"""

from typing import Any, final, get_origin

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jaxtyping import Array, Bool, Float

from .._flat import FlatSpec, PyTree
from .._results import RESULTS
from .._term import AbstractTerm, MultiTerm, ODETerm
from ._base import (
    AbstractSolver,
    StartInput,
    StepField,
    StepInput,
    StepResult,
    writes_diffrax_steps,
)
from ._kinds import AbstractWrappedSolver

# Degree of Diffrax's local interpolations (matched by class name, so that Diffrax's own
# classes and odesolve's of the same name both work). Any other class is sampled as a
# polynomial of degree at most four.
_DEGREES = {
    "LocalLinearInterpolation": 1,
    "ThirdOrderHermitePolynomialInterpolation": 3,
    "FourthOrderPolynomialInterpolation": 4,
}
_MOST_DEGREE = 4


def loop_solver(solver: AbstractSolver) -> AbstractSolver:
    """The solver as the step loop runs it: one written in Diffrax's interface wrapped
    in `UserSolver`, including inside a wrapper (`HalfSolver(solver)`); any other as
    it is."""
    if writes_diffrax_steps(type(solver)):
        return UserSolver(solver)
    inner = getattr(solver, "solver", None)
    if type(solver) is UserSolver or not isinstance(inner, AbstractSolver):
        return solver  # (the continuous adjoint solves again with the adapted solver)
    if isinstance(solver, AbstractWrappedSolver):
        wrapped = loop_solver(inner)
        if wrapped is not inner:
            return eqx.tree_at(lambda s: s.solver, solver, wrapped)
    return solver


class _RealTimeField(eqx.Module):
    """The loop's field (flat state, tau) as the user's step calls it: f(t, y, args)
    on the PyTree state in real time. dy/dtau = d f(d tau, y), so f(t) = d vf(d t)."""

    vf: Any
    spec: FlatSpec = eqx.field(static=True)
    direction: Any

    def __call__(self, t: Any, y: PyTree, args: PyTree) -> PyTree:
        out = self.vf(self.direction * t, self.spec.ravel(y), args)
        return self.spec.unravel(jnp.asarray(self.direction).astype(out.dtype) * out)


def _user_terms(vf: Any, spec: FlatSpec, direction: Any) -> Any:
    """The terms a step of the user's solver is given: the user's own, when the solve
    hands them over (`OwnTerms`), else the loop's field seen in real time."""
    plain = vf.plain if isinstance(vf, StepField) else vf
    field = getattr(getattr(plain, "term", None), "vector_field", None)
    if isinstance(field, OwnTerms):
        return field.terms
    return ODETerm(_RealTimeField(vf, spec, direction))


class OwnTerms(eqx.Module):
    """The field of a solve whose solver, written in Diffrax's interface, steps with a
    term of the user's own that is not an ODE the loop could call: its `vf` returns
    nothing, or its `prod` means something else (a solver that reads its problem from
    `args` and keeps a placeholder term). The solver's steps are handed `terms` as
    given, as Diffrax hands them. The loop's own use of a field, the derivative at the
    start from which `dt0=None` picks the first step, is the solver's `func`, as in
    Diffrax; `rates` says whether `func` returns dy/dt (y's structure and shapes). When
    it does not, the start's derivative is zeros, which nothing reads: `diffeqsolve`
    refuses `dt0=None` and the continuous adjoints for such a solve (`own_terms`)."""

    terms: Any
    solver: AbstractSolver = eqx.field(static=True)
    rates: bool = eqx.field(static=True)

    def __call__(self, t: Any, y: PyTree, args: PyTree) -> PyTree:
        if self.rates:
            return self.solver.func(self.terms, t, y, args)
        return jtu.tree_map(jnp.zeros_like, y)


def steps_with_own_terms(solver: AbstractSolver, terms: Any) -> bool:
    """Whether `terms` may go to `solver` as given: a solver written in Diffrax's
    interface, and a term of the user's own class (not an ODETerm or a MultiTerm)."""
    own = isinstance(terms, AbstractTerm) and not isinstance(terms, (ODETerm, MultiTerm))
    return type(solver) is UserSolver and own


def own_terms(
    terms: Any, solver: "UserSolver", t0: Any, dt0: Any, y0: PyTree, args: PyTree
) -> ODETerm:
    """The field of a solve that hands the user's solver its `terms` (see `OwnTerms`)."""
    user = solver.solver
    try:
        out = jax.eval_shape(lambda: user.func(terms, t0, y0, args))
    except Exception:  # a `func` that is not meant to be called (`assert False`)
        out = None
    shapes = lambda tree: [x.shape for x in jtu.tree_leaves(tree)]
    expected = jax.eval_shape(lambda: y0)
    same = jtu.tree_structure(out) == jtu.tree_structure(expected)  # type: ignore[operator]
    rates = same and shapes(out) == shapes(expected)
    if dt0 is None and not rates:
        raise ValueError(
            f"dt0=None: the first step size is chosen from the derivative at t0, "
            f"{type(user).__name__}.func(terms, t0, y0, args), which returned {out!r} "
            "rather than dy/dt of y0's structure and shapes. Pass dt0, or have func return "
            "dy/dt."
        )
    return ODETerm(OwnTerms(terms, user, rates))


@final
class UserSolver(AbstractWrappedSolver):
    """A solver written in Diffrax's interface (`solver`), given the step loop's
    contract. Its steps may come with an error estimate: whether one does is known
    when the step is traced, so `PIDController` asks for it then."""

    solver: AbstractSolver

    def __check_init__(self) -> None:
        name = type(self.solver).__name__
        if getattr(self.solver, "interpolation_cls", None) is None:
            raise TypeError(
                f"{name} has no interpolation_cls: set it as a class attribute, e.g. "
                "interpolation_cls = LocalLinearInterpolation, built from the dense_info "
                "its step returns."
            )
        structure = self.solver.term_structure
        if isinstance(structure, (tuple, list)) or get_origin(structure) is MultiTerm:
            raise TypeError(
                f"{name}.term_structure = {structure!r}: a solver written in Diffrax's "
                "interface is given one ODETerm here (a MultiTerm of ODE terms is summed "
                "into one); set term_structure = ODETerm."
            )

    @property
    def term_structure(self) -> Any:  # type: ignore[override]
        return self.solver.term_structure

    @property
    def interpolation_cls(self) -> Any:
        return getattr(self.solver, "interpolation_cls")

    def order(self, terms: ODETerm | None = None) -> int:
        return self.solver.order(terms)

    def error_order(self, terms: ODETerm | None = None) -> int:
        # As Diffrax: an estimate from two methods of orders p and p - 1 is of local
        # order p, unless the solver says otherwise.
        written = type(self.solver).error_order is not AbstractSolver.error_order
        order = self.solver.error_order(terms) if written else self.solver.order(terms)
        return 1 if order is None else order

    @property
    def adaptive(self) -> bool:
        return True

    @property
    def interpolation(self) -> tuple[tuple[float, ...], ...]:
        return _lagrange_table(self.degree)

    @property
    def degree(self) -> int:
        """Degree of the polynomial the step's interpolant is stored as."""
        for cls in type.mro(self.interpolation_cls):
            if cls.__name__ in _DEGREES:
                return _DEGREES[cls.__name__]
        return _MOST_DEGREE

    def start(self, first: StartInput) -> Any:
        # The loop hands `start` its flat field (`FlatField`), which knows the layout.
        # The step's end is not known yet: `init` is given t1 = t0.
        vf: Any = first.vf
        spec, direction = vf.spec, vf.direction
        t = direction * first.t0
        terms = _user_terms(vf, spec, direction)
        return self.solver.init(terms, t, t, spec.unravel(first.y0), first.args)

    def advance(self, step: StepInput) -> StepResult:
        context = step.context
        assert context is not None and context.spec is not None  # the loop gives both
        spec, d = context.spec, context.direction
        t0, h, y0 = step.t0, step.h, step.y0
        # The step's end itself, as Diffrax hands it to a step (t0 + h up to rounding).
        ta, tb = d * t0, d * (t0 + h if step.t1 is None else step.t1)
        jump = jnp.asarray(False) if step.made_jump is None else step.made_jump
        y1, y_error, dense_info, new_state, result = self.solver.step(
            _user_terms(step.vf, spec, d), ta, tb, spec.unravel(y0), step.args, step.state, jump
        )
        failed = _failed(result)
        error = None
        if step.with_error:
            error = self._flat_error(spec, y_error)
            if failed is not None:  # a failed step is rejected, as an implicit stage's
                error = jnp.where(failed, jnp.inf, error)
        dense = self._dense(spec, ta, tb, h, y0, dense_info)
        return StepResult(spec.ravel(y1), error, dense, new_state, failed)

    def _flat_error(self, spec: FlatSpec, y_error: PyTree) -> Float[Array, " n"]:
        if y_error is None:
            raise ValueError(
                f"{type(self.solver).__name__}.step returned y_error=None: without an error "
                "estimate it cannot be used with an adaptive step-size controller; use "
                "ConstantStepSize(), or return an estimate of the step's local error."
            )
        return spec.ravel(y_error)

    def _dense(
        self,
        spec: FlatSpec,
        ta: Float[Array, ""],
        tb: Float[Array, ""],
        h: Float[Array, ""],
        y0: Float[Array, " n"],
        dense_info: dict[str, Any],
    ) -> tuple[Float[Array, " n"], ...]:
        """k_j = (y(theta_j) - y0) / h at theta_j = j / degree: the interpolant's values,
        as the Lagrange table weighs them (see `_lagrange_table`)."""
        interpolant = self.interpolation_cls(t0=ta, t1=tb, **dense_info)
        safe_h = jnp.where(h == 0, 1, h)  # a step of no length has no interpolant
        ks = []
        for j in range(1, self.degree + 1):
            y = spec.ravel(interpolant.evaluate(ta + (j / self.degree) * (tb - ta)))
            ks.append(jnp.where(h == 0, 0, (y - y0) / safe_h.astype(y0.dtype)))
        return tuple(ks)


def _failed(result: Any) -> Bool[Array, ""] | None:
    """Whether a step's result is a failure (None: it is `successful`, known now)."""
    if isinstance(result, RESULTS) and result is RESULTS.successful:
        return None
    return jnp.asarray(result) != RESULTS.successful.value


def _lagrange_table(degree: int) -> tuple[tuple[float, ...], ...]:
    """Rows j = 1..degree: the coefficients of theta^1..theta^degree of the Lagrange
    polynomial L_j on the nodes theta_i = i / degree (i = 0..degree). With k_j =
    (y(theta_j) - y0) / h, y0 + h sum_j L_j(theta) k_j is the polynomial through the
    nodes' values (the L_j sum to 1, and L_0's part is y0)."""
    nodes = np.arange(degree + 1) / degree
    rows = []
    for j in range(1, degree + 1):
        others = np.delete(nodes, j)
        coeffs = np.polynomial.polynomial.polyfromroots(others) / np.prod(nodes[j] - others)
        rows.append(tuple(float(c) for c in coeffs[1:]))  # L_j(0) = 0: no constant term
    return tuple(rows)
