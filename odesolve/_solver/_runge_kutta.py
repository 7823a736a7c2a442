"""The one engine that steps every explicit Runge-Kutta tableau.

Stages are unrolled at trace time: the tableau is static, so each stage input
`y0 + h * sum_j a_ij k_j` is a single fused elementwise expression with the zero
coefficients dropped, and there is no stage loop for reverse mode to recompute. A field
that reads its state at other positions (a stencil) on a large state runs its stages in a
loop instead (`_stage_loop`).
"""

import abc
from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from .._flat import PyTree, RealScalarLike, in_state_dtype
from .._term import ODETerm
from ._base import (
    AbstractSolver,
    Field,
    StartInput,
    StepContext,
    StepInput,
    StepResult,
    _jump_flag,
)
from ._stage_loop import looped_stage_derivatives, loops_stages, padded, stage_input
from ._tableau import ButcherTableau, ImplicitTableau


def _combine(
    base: Float[Array, " n"] | None,
    h: Float[Array, ""],
    coeffs: Sequence[float],
    ks: Sequence[Float[Array, " n"]],
):
    """base + h * sum(c * k), skipping zero coefficients (static)."""
    terms = [c * k for c, k in zip(coeffs, ks) if c != 0]
    if not terms:
        return base
    acc = terms[0]
    for term in terms[1:]:
        acc = acc + term
    return acc if base is None else base + h * acc


class StagesInput(eqx.Module):
    """One step's stages to compute, from (t0, y0) with size h, as a tableau method's
    `stages` is told them.

    - `vf`: the vector field, f(t, y, args): the step's `StepField`, or the flat field
      when a reversible method undoes a step.
    - `t0`: where the step starts (internal time tau); `h`: its size (negative for a step
      backwards), so it ends at t0 + h.
    - `y0`: (n,) the state at t0; `k0`: (n,) f(t0, y0), the first stage.
    - `args`: the user's `args`, passed to `vf`.
    - `with_error`: whether to return an error estimate (static).
    - `context`: what the loop tells beyond the step (`StepContext`), or None.
    - `t1`: where the step ends exactly, or None for t0 + h (see `StepInput`).
    """

    vf: Field
    t0: Float[Array, ""]
    h: Float[Array, ""]
    y0: Float[Array, " n"]
    k0: Float[Array, " n"]
    args: PyTree
    with_error: bool = eqx.field(static=True)
    context: StepContext | None
    t1: Float[Array, ""] | None = None

    def stage_time(self, c: float) -> Float[Array, ""]:
        """Where the stage at fraction `c` of the step is evaluated: the step's end itself
        for c = 1, as Diffrax evaluates it."""
        if c == 1 and self.t1 is not None:
            return self.t1
        return self.t0 + c * self.h


class Stages(eqx.Module):
    """A tableau step's stages: y1, its error estimate, the stage derivatives k_i (the
    last is f(t1, y1) for first-same-as-last methods) and whether a stage failed."""

    y1: Float[Array, " n"]
    y_error: Float[Array, " n"] | None
    ks: tuple[Float[Array, " n"], ...]
    failed: Bool[Array, ""] | None = None


def rk_stages(tableau: ButcherTableau, given: StagesInput, last_stage: bool = True) -> Stages:
    """Take one step of `tableau` given k0 = f(t0, y0). `last_stage=False`: a first
    same as last tableau's last stage, f(t1, y1), is only wanted for the error estimate,
    so is not evaluated without one. Explicit stages need no `given.context`."""
    batched = given.context is not None and given.context.batched
    if (
        len(tableau.a) > 1
        and not batched
        and loops_stages(given.vf, given.t0, given.y0, given.args)
    ):
        return _looped_stages(tableau, given, last_stage)
    vf, h, y0, args = given.vf, given.h, given.y0, given.args
    with_error = given.with_error
    ks = [given.k0]
    stage_y = y0
    rows = len(tableau.a)
    hy = in_state_dtype(h, y0)
    for i, (ci, row) in enumerate(zip(tableau.c[1:], tableau.a)):
        stage_y = _combine(y0, hy, row, ks)
        if i == rows - 1 and tableau.fsal and not (last_stage or with_error):
            break
        ks.append(vf(given.stage_time(ci), stage_y, args))
    # FSAL: the last stage was evaluated at y1 itself; reuse it rather than recombine.
    y1 = stage_y if tableau.fsal else _combine(y0, hy, tableau.b, ks)
    y_error = None
    if with_error and tableau.b_error is not None:
        y_error = hy * _combine(None, hy, tableau.b_error, ks)
    return Stages(y1=y1, y_error=y_error, ks=tuple(ks))


def _looped_stages(tableau: ButcherTableau, given: StagesInput, last_stage: bool) -> Stages:
    """`rk_stages` with the stage derivatives computed in a loop (see `_stage_loop`),
    then combined as the unrolled stages combine them."""
    y0, hy = given.y0, in_state_dtype(given.h, given.y0)
    m = len(tableau.a)
    if tableau.fsal and not (last_stage or given.with_error):
        m -= 1
    times = jnp.stack([given.stage_time(c) for c in tableau.c[1 : m + 1]])
    buffer = looped_stage_derivatives(tableau, given.vf, times, y0, given.k0, hy, given.args)
    ks = [buffer[i] for i in range(m + 1)]
    if tableau.fsal:  # y1 is the last stage's input, as the loop formed it
        y1 = stage_input(y0, hy, jnp.asarray(padded(tableau.a[-1], m + 1)), buffer)
    else:
        y1 = _combine(y0, hy, tableau.b, ks)
    y_error = None
    if given.with_error and tableau.b_error is not None:
        y_error = hy * _combine(None, hy, tableau.b_error, ks)
    return Stages(y1=y1, y_error=y_error, ks=tuple(ks))


# Functions that map another spelling of a subclass's `tableau` onto the engines' own,
# called as each subclass is made (Diffrax's spelling registers `_diffrax_methods.adapt`).
TABLEAU_SPELLINGS: list[Callable[[type], None]] = []


class AbstractTableauMethod(AbstractSolver):
    """A Runge-Kutta method given by its `tableau` (a class attribute): explicit or
    diagonally implicit. It carries f(t, y) from step to step when the tableau is first
    same as last, and its dense output is the tableau's interpolant on the stages.
    `scan_stages` and `scan_kind` (None, "lax", "checkpointed" or "bounded") are
    accepted for Diffrax's signature and ignored: they change how Diffrax compiles the
    stages or its loop, never the result. Here explicit stages are always unrolled and
    implicit stages always run in one `lax.scan`."""

    tableau: eqx.AbstractClassVar[ButcherTableau | ImplicitTableau]
    # Plain fields, as Diffrax's: a static one costs a check on every construction, and a
    # script may build its solver on every call.
    scan_stages: bool = eqx.field(default=False, kw_only=True)
    scan_kind: str | None = eqx.field(default=None, kw_only=True)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for adapt in TABLEAU_SPELLINGS:
            adapt(cls)

    def __check_init__(self):
        if self.scan_kind not in (None, "lax", "checkpointed", "bounded"):
            raise ValueError(
                f"scan_kind={self.scan_kind!r}: pass None, 'lax', 'checkpointed' or "
                "'bounded' (Diffrax's choices; none changes the result here)."
            )

    @abc.abstractmethod
    def stages(self, given: StagesInput) -> Stages:
        """The step's stages given k0 = f(t0, y0)."""

    def order(self, terms: ODETerm | None = None) -> int:
        return self.tableau.order

    def error_order(self, terms: ODETerm | None = None) -> int:
        return self.tableau.error_order or self.tableau.order

    @property
    def adaptive(self) -> bool:
        return self.tableau.b_error is not None

    @property
    def interpolation(self) -> tuple[tuple[float, ...], ...]:
        return tuple(self.tableau.interp[i] for i in self.tableau.interp_stages)

    def start(self, first: StartInput) -> Any:
        return first.k0 if self.tableau.fsal else None

    def init(
        self, terms: Any, t0: RealScalarLike, t1: RealScalarLike, y0: PyTree, args: PyTree
    ) -> Any:
        # As Diffrax's: a term whose field alone is expensive carries nothing. (Terms
        # that are not terms get their error from `super().init`.)
        expensive = getattr(terms, "is_vf_expensive", None)
        if expensive is not None and expensive(t0, t1, y0, args):
            self.prepare(y0)
            return None
        state = super().init(terms, t0, t1, y0, args)
        # As Diffrax's: (first step, f(t0, y0)). The first step evaluates its first stage
        # itself, with its own args: a loop that changes `args` between steps (a
        # controller's input) steps from the derivative of its first step's args, whatever
        # `init` was given.
        return None if state is None else (jnp.asarray(True), state)

    def step(
        self,
        terms: Any,
        t0: RealScalarLike,
        t1: RealScalarLike,
        y0: PyTree,
        args: PyTree,
        solver_state: PyTree,
        made_jump: Any,
    ) -> tuple[Any, Any, dict[str, Any], Any, Any]:
        if not (isinstance(solver_state, tuple) and len(solver_state) == 2):
            return super().step(terms, t0, t1, y0, args, solver_state, made_jump)
        first, state = solver_state
        again = jnp.logical_or(_jump_flag(made_jump), first)
        y1, y_error, dense_info, state, result = super().step(terms, t0, t1, y0, args, state, again)
        return y1, y_error, dense_info, (jnp.asarray(False), state), result

    def advance(self, step: StepInput) -> StepResult:
        k0 = _first_stage(self.tableau.fsal, step)
        out = self.stages(
            StagesInput(
                vf=step.vf,
                t0=step.t0,
                h=step.h,
                y0=step.y0,
                k0=k0,
                args=step.args,
                with_error=step.with_error,
                context=step.context,
                t1=step.t1,
            )
        )
        dense = tuple(out.ks[i] for i in self.tableau.interp_stages)
        state = out.ks[-1] if self.tableau.fsal else None
        return StepResult(out.y1, out.y_error, dense, state, out.failed)


def _first_stage(fsal: bool, step: StepInput) -> Float[Array, " n"]:
    """f(t0, y0): carried in `step.state` by first-same-as-last methods, and evaluated
    again after a jump (the step then starts just past it, and this is the right limit)
    or when a caller of `step` passes no state (`init` gives none for an expensive field)."""
    at_start = lambda: step.vf.at_start(step.t0, step.y0, step.args)
    if not fsal or step.state is None:
        return at_start()
    if step.made_jump is None:
        return step.state
    return jax.lax.cond(step.made_jump, at_start, lambda: step.state)


class AbstractRungeKutta(AbstractTableauMethod):
    """An explicit Runge-Kutta method given by its `tableau` (a class attribute)."""

    tableau: eqx.AbstractClassVar[ButcherTableau]

    def stages(self, given: StagesInput) -> Stages:
        return rk_stages(self.tableau, given)
