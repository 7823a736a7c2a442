"""How an iterative solver's loop is run and differentiated.

This package never imports `odesolve`: a solver hands it a `Loop` (condition, body, bounds)
and its inputs, and gets back the final carry and the buffers the body wrote.
"""

from ._adjoint import (
    AbstractAdjoint as AbstractAdjoint,
)
from ._adjoint import (
    BacksolveAdjoint as BacksolveAdjoint,
)
from ._adjoint import (
    DirectAdjoint as DirectAdjoint,
)
from ._adjoint import (
    ForwardMode as ForwardMode,
)
from ._adjoint import (
    ImplicitAdjoint as ImplicitAdjoint,
)
from ._adjoint import (
    RecursiveCheckpointAdjoint as RecursiveCheckpointAdjoint,
)
from ._adjoint import (
    ReversibleAdjoint as ReversibleAdjoint,
)
from ._arguments import check_linear_solver as check_linear_solver
from ._backsolve import ContinuousProblem as ContinuousProblem
from ._batching import batch_size as batch_size
from ._concrete import is_concrete as is_concrete
from ._concrete import trace_time_value as trace_time_value
from ._decided import decided as decided
from ._loop import (
    Loop as Loop,
)
from ._loop import (
    Reversal as Reversal,
)
from ._loop import (
    Write as Write,
)
from ._packing import cast as cast
from ._schedule import AbstractSchedule as AbstractSchedule
from ._schedule import Nested as Nested
from ._schedule import Online as Online
from ._schedule import Revolve as Revolve
from ._schedule import Segments as Segments
from ._schedule import States as States
from ._schedule import Tape as Tape
