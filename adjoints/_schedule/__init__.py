"""Checkpoint schedules: which loop states to keep, in how many slots.

A schedule decides during the forward sweep which states (the carry *before* tick k) to
store and in which slot; the reverse sweep (`adjoints._checkpointed`) then restores the
nearest stored state and recomputes forwards, placing further checkpoints in free slots by
Griewank's binomial rule (`revolve.next_checkpoint`). For a loop of known length,
`nested` keeps states at the start of fixed segments instead, and tapes the innermost ones;
for a loop known only by its bound, `segments` tapes one segment at a time.
"""

from .nested import Nested as Nested
from .online import Online as Online
from .revolve import (
    Revolve as Revolve,
)
from .revolve import (
    beta as beta,
)
from .revolve import (
    forward_steps as forward_steps,
)
from .revolve import (
    next_checkpoint as next_checkpoint,
)
from .segments import Segments as Segments
from .tape import Tape as Tape
