"""What a solve fixes at trace time (`Config`), and the inputs of its loop that do not
change from step to step (`Params`)."""

from typing import Any

import equinox as eqx
import jax.tree_util as jtu

from adjoints import is_concrete

from ._controller._base import AbstractStepSizeController
from ._controller._user import controller_name, written_in_diffrax_interface
from ._event import Event, EventRecord, FlatConditions
from ._flat import FlatSpec, PyTree, RealScalarLike
from ._progress_meter import AbstractProgressMeter
from ._saving import Layout
from ._solver._base import AbstractSolver


class Config(eqx.Module):
    """Everything about a solve that is fixed at trace time.

    - `needs_error`: the controller asks for error estimates.
    - `jumps`: the controller stops at discontinuities (`jump_ts`).
    - `static_times`: nothing that sets the step times can be differentiated (see
      `static_times`).
    - `number_times`: t0, t1 and dt0 were given as Python numbers (see
      `FirstStepInput`).
    - `batched`: the solve runs under `vmap` (a batch of more than one sample). An
      unbatched solve's carry then holds the last step's dense vectors as one array (see
      `_step.carried_vectors`), and a step may run its stages in a loop (see
      `_solver._stage_loop`).
    """

    solver: AbstractSolver = eqx.field(static=True)
    spec: FlatSpec = eqx.field(static=True)
    saving: Layout = eqx.field(static=True)
    max_steps: int | None = eqx.field(static=True)
    meter: AbstractProgressMeter = eqx.field(static=True)
    meter_key: int = eqx.field(static=True)
    needs_error: bool = eqx.field(static=True)
    jumps: bool = eqx.field(static=True)
    event: EventRecord | None = eqx.field(static=True)
    static_times: bool = eqx.field(static=True)
    number_times: bool = eqx.field(static=True, default=False)
    batched: bool = eqx.field(static=True, default=True)

    @property
    def table(self) -> tuple:
        """The solver's dense-output coefficients."""
        return self.solver.interpolation

    @property
    def carries_row(self) -> bool:
        """The carry holds the last step's interpolant: for output, or to locate an event
        on it after the loop."""
        return self.saving.has_ts or self.saving.dense or self.event is not None


class Params(eqx.Module):
    """Inputs of the loop that do not change from step to step (differentiable). Times
    are internal: tau = direction * t."""

    vf: Any  # the flat vector field in tau (`FlatField`)
    args: Any
    controller: AbstractStepSizeController
    t_start: Any
    t_end: Any
    save_ts: tuple  # per output: its save times, with an inf sentinel, or None
    direction: Any
    dt0: Any  # the first step, or None
    conditions: FlatConditions | None


def check_adaptive(solver: AbstractSolver, controller: AbstractStepSizeController) -> None:
    if controller.needs_error and not solver.adaptive:
        raise ValueError(
            f"{type(solver).__name__} has no error estimate, so it cannot be used with "
            f"{controller_name(controller)}; use ConstantStepSize(), an adaptive solver "
            "such as Tsit5(), or wrap it: HalfSolver(solver)."
        )


def static_times(
    t0: RealScalarLike,
    t1: RealScalarLike,
    dt0: RealScalarLike | None,
    save_ts: PyTree,
    controller: AbstractStepSizeController,
    event: Event | None,
) -> bool:
    """Whether no derivative can flow through the step times: every input that places
    them is a concrete value (not a tracer), and no event moves the end to a root of the
    state. Step sizes themselves are never differentiated (see `PIDController.adapt`).
    Then a step's reverse needs no record of its size, and its VJP no time cotangents."""
    if event is not None or written_in_diffrax_interface(controller):
        return False  # (a user's controller may differentiate its step sizes)
    leaves = jtu.tree_leaves((t0, t1, dt0, save_ts, controller))
    return all(is_concrete(x) for x in leaves)
