"""How an iterative solver's loop is run and differentiated.

This package never imports `odesolve`: a solver hands it a `Loop` (condition, body, bounds)
and its inputs, and gets back the final carry and the buffers the body wrote.
"""

from ._adjoint import (
    AbstractAdjoint as AbstractAdjoint,
    BacksolveAdjoint as BacksolveAdjoint,
    DirectAdjoint as DirectAdjoint,
    ForwardMode as ForwardMode,
    RecursiveCheckpointAdjoint as RecursiveCheckpointAdjoint,
)
from ._backsolve import ContinuousProblem as ContinuousProblem
from ._closure import (
    JaxprClosure as JaxprClosure,
    TrivialClosure as TrivialClosure,
    closure_convert as closure_convert,
    shape_record as shape_record,
)
from ._loop import (
    Loop as Loop,
    Write as Write,
    apply_writes as apply_writes,
    run_plain as run_plain,
)
