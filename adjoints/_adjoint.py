"""Adjoint strategies: how the solver's loop is run, and so how it is differentiated.

The solver builds a `Loop` and calls `adjoint.run_loop(loop, params, init, buffers)`;
nothing here knows about ODEs.

Memory and recomputation (n ticks, |c| bytes per stored carry, t the repetition number):

- taping (checkpoints >= n): n max(|c|, |r|) bytes, |r| a step's residuals (for an ODE
  step, a few vectors per stage: the field is linearised again from each stage's input
  rather than storing its intermediate values); each reverse step applies its stored
  pullback, and no step is evaluated again.
- binomial, s slots (n known): s |c| bytes; t n - beta(s + 1, t - 1) ticks are
  recomputed in all (Griewank), plus the VJPs.
- segments of L ticks (n unknown, bound N, no `checkpoints` given): (L + 1) |r| +
  (N / L + 1) |c| bytes (at most 9 |c| when thinned); a solve of n <= L ticks is
  reversed as a tape, a longer one runs each tick outside its last segment once more,
  linearised (`Segments`). Bare (the default, unbatched): the forward sweep keeps only
  the states, and the reverse sweep tapes every segment.
- online, s slots (n unknown): s |c| bytes; about the binomial figure for gaps of up to
  2 n / s ticks with the slots free at the time. With residuals beside each state
  (`Online`) a solve of n <= s ticks is reversed as a tape; bare states (`States`, for
  residuals much larger than a state) hold more ticks, each reversed by its VJP from
  its state.
- nested segments, d levels (n known, no `checkpoints` given, the tape too large): a few
  hundred |c| and a short tape of |r| rows even for n = 1e5; every tick runs d times
  bare (the forward sweep's included) and once linearised, never twice (`Nested`). The
  binomial rule needs fewer states for the same recomputation, but linearises each tick
  again in the reverse sweep: at a like memory, nested segments are faster.

With adaptive step sizes, recomputing schedules also keep each tick's step-size decision
(one float per tick of the bound: 8 bytes x max_steps in float64) so that recomputation
reproduces the discretisation exactly; see `Loop.decision`.
"""

import abc
import math
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu

from ._arguments import check_count, check_linear_solver
from ._backsolve import ContinuousProblem, backsolve_loop
from ._checkpointed import Checkpointing, checkpointed_loop
from ._decisions import DECISION_ROWS, value_bytes
from ._direct import bounded_loop
from ._forward_only import forward_only
from ._loop import Loop, run_plain
from ._packing import tree_bytes
from ._residuals import tape_rows
from ._schedule import (
    SCHEDULES,
    AbstractSchedule,
    Nested,
    Online,
    Revolve,
    Segments,
    Sizing,
    States,
    Tape,
)
from ._schedule._base import MIN_SLOTS
from ._schedule.segments import MOST_STARTS
from ._schedule.undo import choose_undo
from ._sweep import num_ticks_bound, packing_before_steps

# Bytes of stored loop states for one call, shared by a vmap batch; see
# RecursiveCheckpointAdjoint. A tape far larger than the states it holds is slow, not just
# big: every stored byte is written once and read once (see benchmarks/README.md).
DEFAULT_MEMORY_BUDGET = 4 * 2**20
# The default budget's least share per sample of a `vmap` batch (the share of 128
# samples): beyond, the default grows with the batch, so that each sample keeps room for
# taped segments rather than thinned, recomputed online slots (see benchmarks/README.md)...
MIN_DEFAULT_BUDGET_PER_SOLVE = 32 * 2**10
# ...or room for segments of this many ticks where that takes less: a batch's tape is
# written, paged in and read back on every call whether its rows are used or not, and a
# small state's 32 KiB holds hundreds of rows for solves of tens of ticks (a Lorenz
# ensemble of 1,024: 50 MB of temporary memory against Diffrax's 10, and as slow).
MIN_DEFAULT_TICKS_PER_SOLVE = 64
# How many times more ticks bare states must hold than taped rows (segments, or online
# slots with residuals) before the default keeps states and recomputes each tick's VJP
# from its state: a step whose residuals are many times its state (a field that takes
# its own Jacobian, a wide network on a small state) would otherwise leave a tape of a
# few ticks, re-taped or thinned over and over.
RESIDUAL_RATIO = 4
# Bytes of a tape row from which the default keeps bare states rather than taped
# segments for adaptive steps: a large state's row takes about as long to write, page in
# and read back as its step takes to recompute, and few such rows fit a budget, so short
# segments re-run earlier ones bare again and again (see benchmarks/README.md: a
# reaction-diffusion state of 2,000 float64, 160 KB rows, ran in 2.06 of Diffrax's time
# with taped segments and in 1.04 with bare states).
LARGE_ROW_BYTES = 64 * 2**10
# ...and from which a solve keeps bare states when its step does few operations a byte of
# its row (`_work`): a discretised field of a few operations a point recomputes a step
# faster than its row is written and read back (benchmarks/README.md: a reaction-diffusion
# state of 50 to 800 points, 2.3 operations a byte, 1.4 to 1.8 times faster with bare
# states; an MLP field, 39 to 154 a byte, slower). Below it, the loop's own cost a tick
# dominates and taping is faster.
CHEAP_ROW_BYTES = 2 * 2**10
CHEAP_OPERATIONS_PER_BYTE = 8
# Under `vmap`, those rows are taped all the same while the budget's share tapes segments
# of this many ticks or more: a batch's budget is shared, and shorter segments are taped
# again and again (benchmarks/README.md: reaction-diffusion batches, segments of 20 ticks
# 10-20% faster than bare states, of 10 level, of 2 to 5 ticks 35-45% slower).
SHORT_SEGMENT_TICKS = 8
# A loop of unknown length (adaptive steps) with the default budget keeps little for its
# reverse sweep, whatever its bound: what a forward sweep leaves for the reverse is kept
# for as long as the caller's program needs it, and a `lax.scan` or `vmap` around the
# solve, which no solve can see, stacks it once for each iteration and sample (an ODE-RNN
# encoder, 20 solves of 5 steps in a scan under `vmap` over 32 series, kept 2.5 GB of
# tapes sized for `max_steps` and ran 43 times Diffrax's time; see benchmarks/README.md).
# Unbatched, the forward sweep tapes nothing: it keeps the states before segments of the
# ticks a reverse tape of `REVERSE_TAPE_BYTES` holds, and the reverse sweep tapes each
# segment again. Batched, its taped segments take at most `FORWARD_TAPE_BYTES` a sample.
# Either holds `MIN_DEFAULT_TICKS_PER_SOLVE` ticks at least, where the budget does.
REVERSE_TAPE_BYTES = 64 * 2**10
FORWARD_TAPE_BYTES = 128 * 2**10


def least_states(bound: int) -> int:
    """The fewest states the default budget holds for one solve of at most `bound` ticks:
    with log2(bound) + 1 states, online thinning recomputes a tick only a few times for
    any solve within the bound (the binomial count C(s + r, s) passes the bound for a
    small r). A fixed budget would otherwise hold two states of a large state (a
    discretised field saved at given times), and recompute quadratically."""
    return math.ceil(math.log2(max(bound, 2))) + 1


class AbstractAdjoint(eqx.Module):
    """Runs a `Loop`. Subclasses choose the differentiation strategy; the solver asks
    each what it needs with the methods below (their defaults suit an adjoint that
    differentiates the loop's ticks)."""

    def needs_problem(self) -> bool:
        """Whether `run_loop` needs the ODE itself, as `problem` (a `ContinuousProblem`):
        a continuous adjoint solves another ODE backwards (and so does not
        differentiate an event's time)."""
        return False

    def needs_reversal(self) -> bool:
        """Whether the loop must say how to undo its ticks (`Loop.reversal`)."""
        return False

    def differentiates_ticks(self) -> bool:
        """Whether derivatives flow through the loop's ticks (a resumed solve's states
        then carry them in)."""
        return True

    def differentiates_steady_state(self) -> bool:
        """Whether the solver gives the final state its derivative itself, as a steady
        state's (the ticks then carry none)."""
        return False

    def saveat_options(self) -> frozenset[str] | None:
        """The `SaveAt` options whose outputs this adjoint differentiates, by field name
        (`t0`, `t1`, `ts`, `steps`, `fn`, `subs`, `dense`, `solver_state`,
        `controller_state`, `made_jump`); None: every one."""
        return None

    @abc.abstractmethod
    def run_loop(
        self,
        loop: Loop,
        params: Any,
        init: Any,
        buffers: tuple,
        problem: ContinuousProblem | None = None,
    ) -> tuple[Any, tuple]:
        """Run `loop` from `init`: (final carry, filled buffers)."""


class ForwardMode(AbstractAdjoint):
    """Forward-mode autodiff through a plain `lax.while_loop`: `jax.jvp`, `jax.jacfwd`.
    Cheapest when there are fewer inputs than outputs to differentiate. No reverse mode."""

    def run_loop(self, loop, params, init, buffers, problem=None):
        return forward_only(run_plain(loop, params, init, buffers), _NO_REVERSE_MODE)


# Reverse mode through the plain loop would fail on JAX's `while_loop` transpose, whose
# message names neither the adjoint nor the fix; this one is raised first.
_NO_REVERSE_MODE = (
    "adjoint=ForwardMode() gives forward-mode derivatives only (jax.jvp, jax.jacfwd). "
    "For jax.grad, jax.vjp or jax.jacrev pass adjoint=RecursiveCheckpointAdjoint() (the "
    "default), or DirectAdjoint() for both modes."
)


def _tag_set(tags: Any) -> frozenset:
    try:
        return frozenset(tags)
    except TypeError:
        raise TypeError(
            f"ImplicitAdjoint(tags={tags!r}): pass a set of Lineax tags, e.g. "
            "{lineax.symmetric_tag}, or leave it out."
        ) from None


class ImplicitAdjoint(AbstractAdjoint):
    """For a solve that ends at a steady state (`Event(steady_state_event())`): the
    final state y1 is differentiated by the implicit function theorem, as Diffrax's
    `ImplicitAdjoint`. At a steady state f(t1, y1, args) = 0, so dy1/dargs =
    -(df/dy)^{-1} df/dargs, one linear solve: no memory or time for the steps, which
    are run without a derivative. Exact for an exact steady state; y0 has no effect on
    it (its gradient is zero). `SaveAt(t1=True)` only; forward and reverse mode.

    - `linear_solver`: a Lineax solver for the linear solve, as Diffrax's (None, the
      default: a dense LU solve, what `lineax.AutoLinearSolver(well_posed=None)` picks
      for the square Jacobian).
    - `tags`: Lineax tags describing the Jacobian df/dy (`lineax.symmetric_tag`, ...),
      passed to `linear_solver` with it."""

    linear_solver: Any = None
    tags: frozenset = eqx.field(static=True, default_factory=frozenset, converter=_tag_set)

    def __check_init__(self):
        check_linear_solver("ImplicitAdjoint", self.linear_solver)

    def differentiates_ticks(self) -> bool:
        return False

    def differentiates_steady_state(self) -> bool:
        # The solver attaches the derivative to the final state (it knows the field).
        return True

    def saveat_options(self) -> frozenset[str]:
        return frozenset({"t1", "made_jump"})

    def run_loop(self, loop, params, init, buffers, problem=None):
        frozen = lambda tree: jtu.tree_map(
            lambda x: jax.lax.stop_gradient(x) if eqx.is_inexact_array(x) else x, tree
        )
        return run_plain(loop, frozen(params), frozen(init), buffers)


class DirectAdjoint(AbstractAdjoint):
    """Differentiate the loop as a bounded `lax.scan`: forward mode (`jax.jvp`,
    `jax.jacfwd`), reverse mode and Hessians all work. Costs `max_steps` ticks (or the
    number of fixed steps, where counted when traced and fewer) whatever the number of
    steps taken; memory O(sqrt(max_steps)) states."""

    def run_loop(self, loop, params, init, buffers, problem=None):
        return bounded_loop(loop, params, init, buffers)


def row_bytes(loop: Loop, params: Any, init: Any, diff: Any = None) -> tuple[int, int, int, int]:
    """Bytes of (a stored state; a taping row: the larger of a state and a step's
    residuals; an online slot: a state and the residuals beside it) when the parameter
    leaves `diff` says are differentiated; None: every float one (an upper bound); and
    the step's floating-point operations (`_work`). The sweeps size their rows with the
    same `diff`, and so reuse this trace of the step."""
    if diff is None:
        is_float = lambda x: eqx.is_array(x) and jnp.issubdtype(x.dtype, jnp.inexact)
        diff = jtu.tree_map(is_float, params)
    layout, taped = tape_rows(loop, params, diff, init)
    online = tape_rows(loop, params, diff, init, combined=True)[1]
    size = lambda r: r.float_width * jnp.dtype(r.float_dtype).itemsize + r.int_width * 4
    (floats, ints), itemsize = online.carry_packing.sizes(), jnp.dtype(online.float_dtype).itemsize
    return floats * itemsize + ints * 4, size(taped), size(online), layout.operations


class RecursiveCheckpointAdjoint(AbstractAdjoint):
    """Discretise-then-optimise reverse mode: exact gradients of the computed solution.

    - `checkpoints`: number of states of the step loop kept for the reverse sweep, as
      Diffrax counts them; each emit (an output time, or the row that dense output or
      `SaveAt(steps=True)` writes after a step) has a slot of its own besides, so that
      saving more often does not thin the checkpoints of the steps. None (default):
      with an unknown number of steps (adaptive steps) and the default budget, segments
      whose reverse sweep runs each tick at most once more, sized by what they keep
      rather than by `max_steps` (see `REVERSE_TAPE_BYTES`): unbatched, the forward
      sweep tapes nothing and keeps the states before segments; under `vmap`, it tapes
      every step, each segment over the last (a solve that ends within one recomputes
      nothing). Otherwise,
      tape every step (its residuals: no recomputation) when the tape fits in
      `memory_budget` bytes; failing that, with a known number of steps
      (`ConstantStepSize` with concrete times, `StepTo`) and no output between them,
      nested segments within the budget; with an unknown number or outputs between the
      steps, taped segments: the longest that
      fit beside the states before its segments (before each segment of the bound, or
      at most 8, thinned as the loop runs). In either case segments give way to bare
      states where a row takes `LARGE_ROW_BYTES`, or
      `CHEAP_ROW_BYTES` for a step of at most `CHEAP_OPERATIONS_PER_BYTE` operations a
      byte of it, and (under `vmap`) the segments would be shorter than
      `SHORT_SEGMENT_TICKS` (then bare states, thinned online: recomputing such a step
      costs less than its row's traffic); where a
      step's residuals are so much larger than a state that bare states hold
      `RESIDUAL_RATIO` times as many ticks, bare states, each tick's VJP recomputed
      from its state; failing those, as many states as fit. A count of at least the
      loop's bound tapes. With a count and a known number of steps, states are placed
      by Griewank's binomial rule (optimal for that count); with an unknown number, by
      online thinning, which behaves as taping for as long as the states taken so far
      fit. 1 keeps 2 states (the initial one and one to recompute from), the fewest a
      schedule here keeps.
    - `memory_budget`: bytes of stored states allowed when `checkpoints` is None, shared
      by the samples when `diffeqsolve` is called directly under `vmap`. None (default):
      4 MiB, at least 32 KiB per sample (more than 128 samples get more; or, where less,
      what taped segments of `MIN_DEFAULT_TICKS_PER_SOLVE` ticks take), and at least
      `least_states` states per sample (log2 of the bound on the ticks, plus 1). A tape of
      every step is sized for `max_steps` (or for the number of fixed steps, where
      counted when traced and fewer), so a lower `max_steps` lets more solves tape;
      taped segments are sized by the budget alone. Set it to tape the whole of an
      adaptive solve (fastest for one long solve called on its own; see the adjoints
      page for a solve inside a loop).
    - `schedule`: None (default) chooses as above; a schedule forces one: `Tape()`
      (every step), `Segments(length=...)` (taped segments), `Online(checkpoints=...)`
      (online thinning), `States(checkpoints=...)` (online thinning of bare states, no
      residuals), `Revolve(checkpoints=...)` (binomial) or `Nested(lengths=...)` (nested
      segments); what it leaves as None is sized by `checkpoints` when given, else by
      `memory_budget`. The last two need a number of steps known when traced and no
      output between steps. A name stands for the schedule with nothing given:
      `"tape"`, `"segments"`, `"online"`, `"states"`, `"revolve"`, `"nested"`.
    - `decision_rows`: decisions (each step's verdict and size) kept for recomputing
      schedules to impose: those of the first `decision_rows` ticks; later ones are made
      again when recomputed (equal but for rounding, which in float32 near the resolution
      can reverse a verdict). None (default): verdicts, a bit each, of the first 2**17
      ticks; step sizes (made again, they differ in their last digits only) of the ticks
      the schedule plans to recompute: with taped segments whose kept states are thinned
      (a bound far beyond what the budget tapes), the first `length x starts`, so that
      the record follows the budget rather than `max_steps`.
    """

    checkpoints: int | None = None
    memory_budget: int | None = None
    schedule: str | AbstractSchedule | None = None
    decision_rows: int | None = None

    def __check_init__(self):
        if self.checkpoints is not None and (
            isinstance(self.checkpoints, bool) or not isinstance(self.checkpoints, int)
        ):
            raise TypeError(
                f"RecursiveCheckpointAdjoint(checkpoints={self.checkpoints!r}): pass an "
                "integer number of states (or None to choose from memory_budget)."
            )
        if self.checkpoints is not None and self.checkpoints < 1:
            raise ValueError(
                f"RecursiveCheckpointAdjoint(checkpoints={self.checkpoints}): pass at "
                "least 1 (or None to choose from memory_budget)."
            )
        check_count("RecursiveCheckpointAdjoint", "memory_budget", self.memory_budget, 1, "bytes")
        check_count("RecursiveCheckpointAdjoint", "decision_rows", self.decision_rows, 0, "ticks")
        named = isinstance(self.schedule, str) and self.schedule in SCHEDULES
        if not (self.schedule is None or named or isinstance(self.schedule, AbstractSchedule)):
            raise ValueError(
                f"RecursiveCheckpointAdjoint(schedule={self.schedule!r}): pass a schedule "
                "(Tape(), Segments(), Online(), States(), Revolve(), Nested()), one of "
                f"{', '.join(repr(n) for n in SCHEDULES)}, or None to choose by memory."
            )

    def choose_schedule(
        self, loop: Loop, init: Any, params: Any = None, diff: Any = None, batch_size: int = 1
    ):
        """The checkpoint schedule this adjoint uses for `loop`, run `batch_size` samples
        at a time. With `params`, taping is sized by its rows (a step's residuals, or a
        state, whichever is larger) for the parameter leaves `diff` marks differentiated
        (None: every float one)."""
        bound = num_ticks_bound(loop)
        per_state = per_tick = per_slot = tree_bytes(init)
        per_step = None  # the step's operations, when traced
        if params is not None and self.checkpoints is None:
            per_state, per_tick, per_slot, per_step = row_bytes(loop, params, init, diff)
        per_bare = packing_before_steps(loop, init).bytes()  # a state kept before a step
        # Taped segments keep the step sizes of the ticks they plan to recompute (at most
        # `MOST_STARTS` segments' worth: see `_decisions`), so a tape row costs those too.
        per_segment_row = per_tick
        if self.decision_rows is None:
            per_segment_row += MOST_STARTS * value_bytes(loop, init)
        per_solve = self.budget_per_solve(batch_size)
        ticks = MIN_DEFAULT_TICKS_PER_SOLVE
        enough = Segments.memory(ticks, ticks * MOST_STARTS, per_state, per_segment_row)
        if self.memory_budget is None:
            per_solve = max(
                self.budget_per_solve(batch_size, enough), least_states(bound) * per_state
            )
        # What segments and bare states may take: by default, for a loop of unknown
        # length, little (see `REVERSE_TAPE_BYTES`); unbatched, bare segments.
        segmented = kept = per_solve
        capped = self.memory_budget is None and loop.num_steps is None
        bare = capped and batch_size == 1
        if capped:
            cap = REVERSE_TAPE_BYTES if bare else FORWARD_TAPE_BYTES
            segmented, kept = min(per_solve, max(cap, enough)), min(per_solve, cap)
        chosen = self.chosen_schedule()
        if chosen is not None:
            sizing = Sizing(
                bound, loop.num_steps, loop.max_emits, per_state, per_tick, per_slot,
                per_solve, self.checkpoints, per_bare,
            )  # fmt: skip
            return chosen.sized(sizing)
        slots = self.checkpoints
        if slots is None:
            if segmented // max(per_tick, 1) >= bound:
                return Tape(bound)
            if loop.num_steps is not None and _offline(loop) and loop.decision is None:
                nested = Nested.fit(loop.num_steps, per_state, per_tick, per_solve)
                if nested is not None:
                    return nested
            if not _offline(loop):
                segments = Segments.fit(bound, per_state, per_segment_row, segmented)
                # Bare states are weighed against taped rows as whole carries, the
                # measure the ratios were set by (a field whose linearisation is
                # costly is faster taped, however small its states); once chosen, as
                # many states kept before a step (smaller) as fit are kept.
                carries = min(per_solve // max(per_state, 1), bound)
                # Bare states are what the forward sweep leaves: as many as `kept` holds
                # (by default, never fewer than `least_states`).
                least = least_states(bound) if self.memory_budget is None else 0
                states = min(max(kept // max(per_bare, 1), least), bound)
                length = 0 if segments is None or segments.length is None else segments.length
                dear = _rows_dearer_than_steps(per_tick, per_step, batch_size, length)
                if segments is not None and not dear and RESIDUAL_RATIO * length >= carries:
                    return segments.with_bare(bare)
                many = carries >= RESIDUAL_RATIO * per_solve // max(per_slot, 1)
                if states >= 2 and (dear or many):
                    return States(states)
                if segments is not None:
                    return segments.with_bare(bare)
            slots = max(MIN_SLOTS, per_solve // max(per_slot, 1))
        else:
            slots = max(MIN_SLOTS, slots + loop.max_emits)
        if slots >= bound:
            return Tape(bound)
        if loop.num_steps is not None and _offline(loop):
            return Revolve(slots, loop.num_steps)
        return Online(slots)

    def chosen_schedule(self) -> AbstractSchedule | None:
        """The schedule `schedule` names or is, not yet sized; None: chosen by memory."""
        if isinstance(self.schedule, str):
            return SCHEDULES[self.schedule]
        return self.schedule

    def budget_per_solve(self, batch_size: int, enough: int | None = None) -> int:
        """Bytes of stored states each of `batch_size` solves run together may take;
        `enough`: what taped segments of `MIN_DEFAULT_TICKS_PER_SOLVE` ticks take, which
        lowers the default's least share where it is less."""
        batch_size = max(batch_size, 1)
        if self.memory_budget is None:
            least = MIN_DEFAULT_BUDGET_PER_SOLVE
            if enough is not None:
                least = min(enough, least)
            return max(DEFAULT_MEMORY_BUDGET // batch_size, least)
        return self.memory_budget // batch_size

    def run_loop(self, loop, params, init, buffers, problem=None):
        how = Checkpointing(self.choose_schedule, self.decision_rows)
        return checkpointed_loop(loop, how, params, init, buffers)


def _rows_dearer_than_steps(
    per_tick: int, per_step: int | None, batch_size: int, length: int
) -> bool:
    """Whether a tape row costs more to write and read back than its step costs to
    recompute: a row of `LARGE_ROW_BYTES` or more, or of `CHEAP_ROW_BYTES` or more for at
    most `CHEAP_OPERATIONS_PER_BYTE` operations a byte (`per_step`, when the step was
    traced); under `vmap`, only where taped segments would be shorter than
    `SHORT_SEGMENT_TICKS` (`length`)."""
    large = per_tick >= LARGE_ROW_BYTES
    cheap = per_step is not None and per_step <= CHEAP_OPERATIONS_PER_BYTE * per_tick
    dear = large or (per_tick >= CHEAP_ROW_BYTES and cheap)
    return dear and (batch_size == 1 or length < SHORT_SEGMENT_TICKS)


def _offline(loop: Loop) -> bool:
    """Whether offline schedules apply: the number of steps is known and nothing is
    emitted between them."""
    return loop.num_steps is not None and loop.max_emits == 0


_EXAMPLES = {
    "solver": "Tsit5()",
    "stepsize_controller": "PIDController(rtol=1e-6, atol=1e-6)",
    "adjoint": "ForwardMode()",
}


class BacksolveAdjoint(AbstractAdjoint):
    """Continuous adjoint: solve the adjoint ODE backwards in time (Chen et al. 2018).

    Memory O(number of save times), whatever the number of steps; gradients approximate
    (as accurate as the tolerances) and possibly poor for problems unstable backwards.
    Supports `SaveAt(t0, t1, ts)` only, and no gradients with respect to the times.

    - `seminorm`: measure the backward solve's error on the state and its adjoint only,
      not on the parameter-gradient channels (Kidger, Chen and Lyons 2021): typically
      40% fewer steps for the same gradient accuracy.
    - `solver`, `stepsize_controller`, `dt0`, `max_steps`, `throw`: for the backward
      solve (default: the forward's), as Diffrax's `BacksolveAdjoint(**kwargs)` takes
      them; the backward solve runs from t1 to t0, so `dt0` is taken as its size.
    - `adjoint`: how the gradient is differentiated (a second derivative): the backward
      solve, and in reverse mode the forward solve too. `ForwardMode()` (default):
      forward over reverse only (`jax.hessian`, `jax.jacfwd(jax.grad(f))`);
      `DirectAdjoint()`: that and reverse over reverse (`jax.grad(jax.grad(f))`), its
      forward solve then run as a bounded loop on every call;
      `RecursiveCheckpointAdjoint()`: reverse over reverse only.
    """

    seminorm: bool = True
    solver: Any = None
    stepsize_controller: Any = None
    dt0: Any = None
    max_steps: Any = None
    throw: Any = None
    adjoint: Any = None

    def __check_init__(self):
        if not isinstance(self.seminorm, bool):
            raise TypeError(
                f"BacksolveAdjoint(seminorm={self.seminorm!r}): pass True (the default: "
                "the error of the state and its adjoint only) or False."
            )
        # The backward solve's solver and controller are objects of the solving library
        # (this package knows none): a name or a number here is a mistake to say now.
        for name in ("solver", "stepsize_controller", "adjoint"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, eqx.Module):
                raise TypeError(
                    f"BacksolveAdjoint({name}={value!r}): pass an instance (e.g. "
                    f"{_EXAMPLES[name]}) for the backward solve, or None for the forward's."
                )

    def needs_problem(self) -> bool:
        return True

    def differentiates_ticks(self) -> bool:
        return False

    def saveat_options(self) -> frozenset[str]:
        # Its backward solve restarts from the saved states and differentiates nothing
        # else.
        return frozenset({"t0", "t1", "ts", "made_jump"})

    def run_loop(self, loop, params, init, buffers, problem=None):
        if problem is None:
            raise ValueError("BacksolveAdjoint needs the ODE: call it through diffeqsolve.")
        nested = self.adjoint
        forward = None if nested is None or isinstance(nested, ForwardMode) else nested.run_loop
        return backsolve_loop(loop, problem, params, init, buffers, self.seminorm, forward)


class ReversibleAdjoint(AbstractAdjoint):
    """Reverse mode by running the solve backwards: for a reversible solver
    (`Reversible(solver)`, `ReversibleHeun()`), each step is undone algebraically in
    the reverse sweep, so no state is stored. Memory: one state and a few scalars per
    step taken (times and step sizes), whatever the size of the state; gradients are
    those of the computed solution, exact but for rounding in the rebuilt states.
    Reverse mode only (use `ForwardMode` or `DirectAdjoint` for `jax.jvp`)."""

    def needs_reversal(self) -> bool:
        return True

    def run_loop(self, loop, params, init, buffers, problem=None):
        if loop.reversal is None:
            raise ValueError("this loop cannot be undone: it was built without a Reversal.")
        how = Checkpointing(choose_undo, DECISION_ROWS)
        return checkpointed_loop(loop, how, params, init, buffers)
