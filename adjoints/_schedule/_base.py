"""What a checkpoint schedule is: where the forward sweep stores, and how the reverse
sweep uses what it stored.

A schedule decides during the forward sweep which states (the carry *before* tick k) to
store and in which slot (`store`), and owns the reverse sweep that reads them back
(`reverse`). Its class variables tell the forward sweep (`_forward`) what to store beside
or instead of the states.
"""

import abc
from typing import TYPE_CHECKING, ClassVar

import equinox as eqx
from equinox import AbstractVar
from jaxtyping import Array, ArrayLike, Bool, Int, PyTree

from .._loop import Buffers, Loop, Write
from .._packing import Rows
from .._sweep import Cotangents, SlotIndex, Sweep

# What `store` returns: whether to store, the slot, the slot table, the schedule's state.
Stored = tuple[Bool[Array, ""], Int[Array, ""], SlotIndex | None, PyTree]


class AbstractSchedule(eqx.Module):
    """A checkpoint schedule for a loop's reverse sweep.

    - `slots`: rows of the forward sweep's store (states, or tape rows when taping).
    - `tapes`: every tick's row is stored at the forward sweep (a step's residuals, the
      carry before an emit), so that the reverse sweep never evaluates a step again.
    - `segmented`: taping reuses one tape of `length` rows and keeps the state before
      each segment (or, with `starts`, before every few, moved by `thin` as it runs).
    - `keeps_residuals`: beside each stored state, the residuals of the step from it;
      `in_order(state)` says whether they still serve.
    - `skips_ahead`: the ticks that store are known ahead (`next_store`): the forward
      sweep runs the others in a bare inner loop, up to the last of the `num_ticks`.
    - `recomputes`: the reverse sweep runs ticks again, so step-size decisions are
      recorded and replayed (`Loop.decision`).
    """

    if TYPE_CHECKING:
        # For a type checker: `slots` is a field or a property; the other members are
        # those of the schedules whose flags below ask for them (see above).
        @property
        def slots(self) -> int: ...
        @property
        def length(self) -> int: ...
        @property
        def num_ticks(self) -> int: ...
        @property
        def starts(self) -> int | None: ...
        def thin(self, states: "Rows", old: Int[Array, ""], new: Int[Array, ""]) -> "Rows": ...
        def in_order(self, state: PyTree) -> Bool[Array, ""]: ...
        def next_store(self, k: Int[Array, ""], state: PyTree) -> Int[Array, ""]: ...
    else:
        slots: AbstractVar[int]
    tapes: ClassVar[bool] = False
    segmented: ClassVar[bool] = False
    keeps_residuals: ClassVar[bool] = False
    skips_ahead: ClassVar[bool] = False
    recomputes: ClassVar[bool] = True

    @abc.abstractmethod
    def init(self) -> PyTree:
        """The schedule's state at the start of the forward sweep."""

    @abc.abstractmethod
    def store(
        self,
        k: Int[Array, ""],
        state: PyTree,
        slot_index: SlotIndex | None,
        active: Bool[ArrayLike, ""] = True,
    ) -> Stored:
        """Whether to store the state before tick k, its slot, the slot table (`slot_index[i]`:
        the tick slot i holds, -1 if free) and the schedule's new state. Only an `active`
        sample (see `lockstep_while`) stores."""

    @abc.abstractmethod
    def reverse(
        self,
        loop: Loop,
        params: PyTree,
        diff: PyTree[bool],
        init: PyTree,
        sweep: Sweep,
        scratch: tuple[Write, ...],
        start: Cotangents,
        ct_buffers: Buffers,
        batched: bool,
    ) -> Cotangents:
        """The reverse sweep: cotangents of (the initial carry, the differentiated
        parameters), from `start` = (those of the final carry, zero parameter cotangents)
        and the output buffers' cotangents `ct_buffers`. `sweep`: what the forward sweep
        stored (`Sweep`); `scratch`: a step tick's writes (to scratch rows)."""
