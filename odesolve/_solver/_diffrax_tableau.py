"""Diffrax's spelling of a Runge-Kutta method, mapped onto odesolve's tableaux.

Diffrax describes a method by `ButcherTableau(c, b_sol, b_error, a_lower, a_diagonal,
a_predictor, c1)` (stage times after the first, lower rows, weights, error weights
used directly), several of them by `MultiButcherTableau` (one per term of a `MultiTerm`),
and its dense output by a class, `interpolation_cls`. This module is the one place that
turns them into the tableaux odesolve's engines step: `_tableau.ButcherTableau`
(explicit), `_tableau.ImplicitTableau` (ESDIRK) and `AdditiveTableau` (IMEX). The dense
output is read off `interpolation_cls`: every interpolant Diffrax's methods use is
linear in the step's stages and a polynomial in time, so evaluating it on each stage
alone, at a few times, gives the coefficients odesolve's dense output is made of.

`a_predictor` and `CalculateJacobian` are accepted and checked as Diffrax checks them;
they choose Diffrax's Newton starting point and when it evaluates the Jacobian, which
here are the implicit engine's own (the converged stages are the same).
"""

import dataclasses
import enum
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from . import _tableau
from ._additive_tableau import AdditiveTableau

# An interpolant up to this degree in time is recovered exactly from its values.
_MAX_DEGREE = 7
_NODES = np.linspace(0.05, 1.0, _MAX_DEGREE + 2)


class CalculateJacobian(enum.IntEnum):
    """When Diffrax's Newton iterations evaluate the Jacobian, as a method states it:
    `never` (explicit methods), `every_stage` (DIRK), `first_stage` (SDIRK),
    `second_stage` (ESDIRK). odesolve evaluates it once per step, at the step's start,
    and again when a stage's iterations stall, whichever is given."""

    never = 0
    every_stage = 1
    first_stage = 2
    second_stage = 3


_OURS = frozenset({"a", "b", "interp", "order"})


class _EitherSpelling(type):
    # `ButcherTableau(c=, a=, b=, b_error=, interp=, order=)` is odesolve's own spelling
    # (an explicit method with its dense output), kept beside Diffrax's.
    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        # Positionally, odesolve's sixth argument is the order (an int), Diffrax's the
        # predictor rows.
        ours_by_position = len(args) >= 6 and isinstance(args[5], (int, np.integer))
        if _OURS & set(kwargs) or ours_by_position:
            return _tableau.ButcherTableau(*args, **kwargs)
        return super().__call__(*args, **kwargs)

    def __instancecheck__(cls, instance: object) -> bool:
        return type.__instancecheck__(cls, instance) or isinstance(
            instance, _tableau.ButcherTableau
        )


def _array(x: Any) -> np.ndarray:
    return np.asarray(x, dtype=float)


@dataclasses.dataclass(frozen=True, eq=False)
class ButcherTableau(metaclass=_EitherSpelling):
    """A Runge-Kutta method of s stages in Diffrax's spelling.

    - `c`: (s - 1,) stage times of stages 2..s as fractions of h (`c1` is the first's).
    - `b_sol`: (s,) solution weights; `b_error`: (s,) error weights, used directly.
    - `a_lower`: s - 1 rows, row i of length i, below the diagonal.
    - `a_diagonal`: (s,) the diagonal, for a diagonally implicit method; `a_predictor`:
      rows like `a_lower` (each summing to 1), Diffrax's Newton starting points.

    Called with odesolve's spelling instead (`a=`, `b=`, `interp=`, `order=`), it makes
    odesolve's explicit tableau (`odesolve._solver._tableau.ButcherTableau`).
    """

    c: Any
    b_sol: Any
    b_error: Any
    a_lower: tuple
    a_diagonal: Any = None
    a_predictor: tuple | None = None
    c1: float = 0.0

    def __post_init__(self) -> None:
        s = len(self.b_sol)
        if len(self.c) != s - 1 or len(self.a_lower) != s - 1 or len(self.b_error) != s:
            raise ValueError(
                f"ButcherTableau: b_sol has {s} entries, so c and a_lower need {s - 1} and "
                f"b_error {s}; got {len(self.c)}, {len(self.a_lower)} and {len(self.b_error)}."
            )
        if any(len(row) != i + 1 for i, row in enumerate(self.a_lower)):
            raise ValueError("ButcherTableau: row i of a_lower (from 0) needs i + 1 entries")
        if (self.a_diagonal is None) != (self.a_predictor is None):
            raise ValueError("ButcherTableau: give a_diagonal and a_predictor together")
        full = self.full_matrix()
        c = np.concatenate([[self.c1], _array(self.c)])
        if not np.allclose(full.sum(1), c):
            raise ValueError("ButcherTableau: each row of a (with its diagonal) must sum to c")
        if not np.isclose(_array(self.b_sol).sum(), 1.0):
            raise ValueError("ButcherTableau: b_sol must sum to 1")
        if not np.isclose(_array(self.b_error).sum(), 0.0):
            raise ValueError("ButcherTableau: b_error must sum to 0")

    @property
    def num_stages(self) -> int:
        return len(self.b_sol)

    @property
    def implicit(self) -> bool:
        return self.a_diagonal is not None

    @property
    def fsal(self) -> bool:
        """The last stage is f(t1, y1) and the first is explicit."""
        full, b = self.full_matrix(), _array(self.b_sol)
        return bool(np.array_equal(full[-1], b) and full[0, 0] == 0)

    @property
    def ssal(self) -> bool:
        """y1 is the last stage value and that stage is explicit."""
        full, b = self.full_matrix(), _array(self.b_sol)
        return bool(np.array_equal(full[-1], b) and full[-1, -1] == 0)

    def full_matrix(self) -> np.ndarray:
        """The (s, s) coefficient matrix, diagonal included."""
        s = self.num_stages
        full = np.zeros((s, s))
        for i, row in enumerate(self.a_lower):
            full[i + 1, : i + 1] = _array(row)
        if self.a_diagonal is not None:
            full[np.diag_indices(s)] = _array(self.a_diagonal)
        return full

    def stage_times(self) -> np.ndarray:
        return np.concatenate([[self.c1], _array(self.c)])


class MultiButcherTableau:
    """Several tableaux of one number of stages, one per term of a `MultiTerm`, at most
    one of them implicit (Diffrax's, for IMEX methods). odesolve steps two: the first
    term explicitly, the second (implicitly when its tableau is)."""

    def __init__(self, *tableaus: Any):
        self.tableaus = tableaus

    def __repr__(self) -> str:
        return f"MultiButcherTableau{self.tableaus!r}"


@dataclasses.dataclass(frozen=True)
class _Parts:
    """One tableau as arrays: the (s, s) matrix, stage times, weights, error weights."""

    a: np.ndarray
    c: np.ndarray
    b: np.ndarray
    error: np.ndarray | None


def _parts(tableau: Any) -> _Parts:
    """Either spelling, or odesolve's implicit tableau, as arrays."""
    if isinstance(tableau, (_tableau.ButcherTableau, _tableau.ImplicitTableau)):
        s = tableau.num_stages
        a = np.zeros((s, s))
        for i, row in enumerate(tableau.a):
            a[i + 1, : i + 1] = row
        if isinstance(tableau, _tableau.ImplicitTableau):
            a[np.diag_indices(s)] = [0.0] + [tableau.gamma] * (s - 1)
        error = None if tableau.b_error is None else _array(tableau.b_error)
        return _Parts(a, _array(tableau.c), _array(tableau.b), error)
    if isinstance(tableau, ButcherTableau):
        full = tableau.full_matrix()
        return _Parts(full, tableau.stage_times(), _array(tableau.b_sol), _array(tableau.b_error))
    raise TypeError(
        f"tableau={tableau!r}: pass a ButcherTableau (Diffrax's spelling or odesolve's), "
        "or a MultiButcherTableau of them."
    )


def _is_implicit(tableau: Any) -> bool:
    return isinstance(tableau, _tableau.ImplicitTableau) or (
        type(tableau) is ButcherTableau and tableau.implicit
    )


def check_multi(tableau: MultiButcherTableau) -> None:
    """Diffrax's conditions on a MultiButcherTableau, and odesolve's (two tableaux, the
    implicit one second)."""
    stages = {_parts(t).b.shape[0] for t in tableau.tableaus}
    if len(stages) > 1:
        raise ValueError("MultiButcherTableau: the tableaus must have one number of stages")
    implicit = [i for i, t in enumerate(tableau.tableaus) if _is_implicit(t)]
    if len(implicit) > 1:
        raise ValueError("MultiButcherTableau: at most one tableau may be implicit")
    if len(tableau.tableaus) != 2 or implicit not in ([], [1]):
        raise ValueError(
            "MultiButcherTableau: odesolve steps two tableaus, the explicit one first: "
            "MultiButcherTableau(explicit, implicit) for MultiTerm(explicit, implicit)."
        )


# ------------------------------------------------------------- dense output


class NotAPolynomial(ValueError):
    """`interpolation_cls` builds something other than a method's dense output."""


class ProbeFailed(TypeError):
    """`interpolation_cls` raised when built or evaluated on the probing state."""


def _stage_probe(
    interpolation_cls: Callable, s: int, parts: int, part: int, i: int, y1: float, like: Any
) -> Any:
    """The interpolant of a step of size 1 from y0 = 0 whose only nonzero stage is
    stage i of `part` (value 1), as `interpolation_cls` builds it, on a state with the
    structure of `like` and a scalar for each of its leaves."""
    treedef, n = jtu.tree_structure(like), len(jtu.tree_leaves(like))
    fill = lambda x: jtu.tree_unflatten(treedef, [x] * n)
    ks = [fill(jnp.zeros(s)) for _ in range(parts)]
    ks[part] = fill(jnp.zeros(s).at[i].set(1.0))
    k = ks[0] if parts == 1 else tuple(ks)
    y0 = fill(jnp.zeros(()))
    return interpolation_cls(t0=0.0, t1=1.0, y0=y0, y1=fill(jnp.asarray(y1)), k=k)


def _value(interpolation_cls: Callable, path: Any, t: float) -> float:
    """The probe's value at t, one number: every leaf of the state has the same."""
    values = np.concatenate([np.ravel(x) for x in jtu.tree_leaves(path.evaluate(t))])
    if values.size == 0 or not np.allclose(values, values[0], rtol=0, atol=1e-12):
        raise NotAPolynomial(
            f"interpolation_cls={interpolation_cls!r}: it interpolates the leaves of the "
            "state differently, so odesolve cannot use it as a method's dense output."
        )
    return float(values[0])


def interpolation_rows(
    interpolation_cls: Callable, bs: list[np.ndarray], like: Any = 0.0
) -> list[tuple]:
    """Dense-output coefficients (one (s, degree) table per part) of the interpolant
    `interpolation_cls(t0=, t1=, y0=, y1=, k=)` builds, read off its values on a state
    with the structure of `like` (a scalar unless the interpolant reads the state's
    structure, as one that indexes `k["y"]` does)."""
    s, powers = len(bs[0]), np.stack([_NODES ** (p + 1) for p in range(_MAX_DEGREE)], 1)
    tables = []
    # Concrete numbers even when a solve being traced asks for them.
    with (
        jax.enable_x64(True),
        jax.numpy_dtype_promotion("standard"),
        jax.ensure_compile_time_eval(),
    ):
        for part, b in enumerate(bs):
            rows = []
            for i in range(s):
                try:
                    path = _stage_probe(interpolation_cls, s, len(bs), part, i, b[i], like)
                    values = np.array([_value(interpolation_cls, path, t) for t in _NODES])
                except NotAPolynomial:
                    raise
                except Exception as error:
                    raise ProbeFailed(
                        f"interpolation_cls={interpolation_cls!r} failed on a step of a "
                        f"state structured as {jtu.tree_structure(like)} (the error above). "
                        "It must build the step's interpolant from t0, t1, y0, y1 and k "
                        "(each leaf of k the stages of that leaf of the state), as "
                        "Diffrax's interpolation classes do."
                    ) from error
                coeffs, *_ = np.linalg.lstsq(powers, values, rcond=None)
                if not np.allclose(powers @ coeffs, values, rtol=0, atol=1e-10):
                    raise NotAPolynomial(
                        f"interpolation_cls={interpolation_cls!r}: its interpolant is not a "
                        f"polynomial of degree at most {_MAX_DEGREE} in time, linear in the "
                        "stages, so odesolve cannot use it as a method's dense output."
                    )
                rows.append(np.where(np.abs(coeffs) < 1e-13, 0.0, coeffs))
            tables.append(np.array(rows))
    used = np.any(np.concatenate(tables) != 0, axis=0)  # the powers of theta in use
    degree = max(1, int(np.max(np.nonzero(used)[0], initial=0)) + 1)
    return [tuple(tuple(float(x) for x in row[:degree]) for row in t) for t in tables]


# ------------------------------------------------------------- conversions


def explicit_tableau(
    tableau: ButcherTableau, interpolation_cls: Callable, order: int, like: Any = 0.0
) -> Any:
    """Diffrax's explicit tableau as odesolve's, its dense output from `interpolation_cls`
    (probed on a state like `like`)."""
    parts = _parts(tableau)
    (interp,) = interpolation_rows(interpolation_cls, [parts.b], like)
    return _tableau.ButcherTableau(
        c=tuple(parts.c),
        a=tuple(tuple(parts.a[i, :i]) for i in range(1, len(parts.b))),
        b=tuple(parts.b),
        b_error=tuple(parts.error),  # type: ignore[arg-type]
        interp=interp,
        order=order,
    )


def implicit_tableau(
    tableau: ButcherTableau, interpolation_cls: Callable, order: int, like: Any = 0.0
) -> Any:
    """Diffrax's diagonally implicit tableau as odesolve's ESDIRK tableau: an explicit
    first stage, one diagonal coefficient after it, stiffly accurate (b the last row)."""
    parts = _parts(tableau)
    diagonal = np.diag(parts.a)
    if diagonal[0] != 0 or len(set(diagonal[1:])) != 1 or not tableau.fsal:
        raise ValueError(
            "ButcherTableau: odesolve steps diagonally implicit methods with an explicit "
            "first stage, one diagonal coefficient after it, and b_sol equal to the last "
            "row (stiffly accurate ESDIRK methods, as Kvaerno's); this tableau is not one."
        )
    (interp,) = interpolation_rows(interpolation_cls, [parts.b], like)
    return _tableau.ImplicitTableau(
        c=tuple(parts.c),
        a=tuple(tuple(parts.a[i, :i]) for i in range(1, len(parts.b))),
        gamma=float(diagonal[1]),
        b=tuple(parts.b),
        b_error=tuple(parts.error),  # type: ignore[arg-type]
        interp=interp,
        order=order,
    )


def additive_tableau(
    tableau: MultiButcherTableau, interpolation_cls: Callable, order: int, like: Any = 0.0
) -> Any:
    """Diffrax's MultiButcherTableau(explicit, implicit) as an `AdditiveTableau`."""
    check_multi(tableau)
    explicit, implicit = (_parts(t) for t in tableau.tableaus)
    interp = interpolation_rows(interpolation_cls, [explicit.b, implicit.b], like)
    return AdditiveTableau(
        c_explicit=tuple(explicit.c),
        c_implicit=tuple(implicit.c),
        a_explicit=tuple(map(tuple, explicit.a)),
        a_implicit=tuple(map(tuple, implicit.a)),
        b_explicit=tuple(explicit.b),
        b_implicit=tuple(implicit.b),
        error_explicit=None if explicit.error is None else tuple(explicit.error),
        error_implicit=None if implicit.error is None else tuple(implicit.error),
        interp_explicit=interp[0],
        interp_implicit=interp[1],
        order=order,
    )
