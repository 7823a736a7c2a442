"""Checkpoint schedules: what each keeps of a loop on the way forward, and how it runs
the way back (see `_base.AbstractSchedule`). A new schedule is one file here, and a line
below (and in `SCHEDULES` to give it a name).

- `Tape`: every tick's row (a step's residuals): nothing is evaluated again.
- `Segments`: a loop known by its bound only: one tape reused segment by segment.
- `Online`: a loop known by its bound only: a fixed number of states, thinned as it runs.
- `States`: likewise, bare states (no residuals), each tick's VJP recomputed from its state.
- `Revolve`: a loop of known length: Griewank's binomial placement (`adjoints._binomial`).
- `Nested`: a loop of known length: states at the start of nested segments, the
  innermost taped.
- `Undo`: a loop whose ticks can be undone: what undoing cannot rebuild; reverse by
  undoing (`ReversibleAdjoint`).
"""

from .._binomial import beta as beta
from .._binomial import forward_steps as forward_steps
from .._binomial import next_checkpoint as next_checkpoint
from ._base import AbstractSchedule as AbstractSchedule
from ._base import Sizing as Sizing
from .nested import Nested as Nested
from .online import Online as Online
from .revolve import Revolve as Revolve
from .segments import Segments as Segments
from .states import States as States
from .tape import Tape as Tape
from .undo import Undo as Undo

# The names `RecursiveCheckpointAdjoint(schedule=...)` accepts for a schedule left to be
# sized by the adjoint's `checkpoints` or `memory_budget`.
SCHEDULES: dict[str, AbstractSchedule] = {
    "tape": Tape(),
    "segments": Segments(),
    "online": Online(),
    "states": States(),
    "revolve": Revolve(),
    "nested": Nested(),
}
