"""What a checkpoint schedule is: where the forward sweep stores, and how the reverse
sweep uses what it stored.

A schedule decides during the forward sweep which states (the carry *before* tick k) to
store and in which slot (`store`), and owns the reverse sweep that reads them back
(`reverse`). Its class variables tell the forward sweep (`_forward`) what to store beside
or instead of the states.
"""

import abc
from typing import Any, ClassVar

import equinox as eqx
from equinox import AbstractVar


class AbstractSchedule(eqx.Module):
    """A checkpoint schedule for a loop's reverse sweep.

    - `slots`: rows of the forward sweep's store (states, or tape rows when taping).
    - `tapes`: every tick's row is stored at the forward sweep (a step's residuals, the
      carry before an emit), so that the reverse sweep never evaluates a step again.
    - `segmented`: taping reuses one tape of `length` rows and keeps the state before
      each segment.
    - `keeps_residuals`: beside each stored state, the residuals of the step from it.
    - `skips_ahead`: the ticks that store are known ahead (`next_store`): the forward
      sweep runs the others in a bare inner loop.
    - `recomputes`: the reverse sweep runs ticks again, so step-size decisions are
      recorded and replayed (`Loop.decision`).
    """

    slots: AbstractVar[int]
    tapes: ClassVar[bool] = False
    segmented: ClassVar[bool] = False
    keeps_residuals: ClassVar[bool] = False
    skips_ahead: ClassVar[bool] = False
    recomputes: ClassVar[bool] = True

    @abc.abstractmethod
    def init(self) -> Any:
        """The schedule's state at the start of the forward sweep."""

    @abc.abstractmethod
    def store(self, k, state, slot_index, active=True) -> tuple:
        """Whether to store the state before tick k, its slot, the slot table (`slot_index[i]`:
        the tick slot i holds, -1 if free) and the schedule's new state. Only an `active`
        sample (see `lockstep_while`) stores."""

    @abc.abstractmethod
    def reverse(self, loop, params, diff, init, sweep, scratch, start, ct_buffers, batched):
        """The reverse sweep: cotangents of (the initial carry, the differentiated
        parameters), from `start` = (those of the final carry, zero parameter cotangents)
        and the output buffers' cotangents `ct_buffers`. `sweep`: what the forward sweep
        stored (`Sweep`); `scratch`: a step tick's writes (to scratch rows)."""
