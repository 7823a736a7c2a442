"""odesolve: differentiable ODE solvers in JAX, with Diffrax's API.

import odesolve as ode
sol = ode.diffeqsolve(ode.ODETerm(f), ode.Tsit5(), t0, t1, dt0, y0, args,
                      saveat=ode.SaveAt(ts=ts),
                      stepsize_controller=ode.PIDController(rtol=1e-6, atol=1e-6))
"""

from adjoints import (
    AbstractAdjoint as AbstractAdjoint,
    BacksolveAdjoint as BacksolveAdjoint,
    DirectAdjoint as DirectAdjoint,
    ForwardMode as ForwardMode,
    RecursiveCheckpointAdjoint as RecursiveCheckpointAdjoint,
)

from ._controller import (
    AbstractStepSizeController as AbstractStepSizeController,
    ConstantStepSize as ConstantStepSize,
    PIDController as PIDController,
    StepTo as StepTo,
    rms_norm as rms_norm,
)
from ._integrate import diffeqsolve as diffeqsolve
from ._progress_meter import (
    AbstractProgressMeter as AbstractProgressMeter,
    NoProgressMeter as NoProgressMeter,
    TextProgressMeter as TextProgressMeter,
    TqdmProgressMeter as TqdmProgressMeter,
)
from ._results import RESULTS as RESULTS
from ._saveat import SaveAt as SaveAt
from ._solution import DenseInterpolation as DenseInterpolation, Solution as Solution
from ._solver import (
    AbstractRungeKutta as AbstractRungeKutta,
    Bosh3 as Bosh3,
    ButcherTableau as ButcherTableau,
    Dopri5 as Dopri5,
    Dopri8 as Dopri8,
    Euler as Euler,
    Heun as Heun,
    Midpoint as Midpoint,
    Ralston as Ralston,
    Tsit5 as Tsit5,
)
from ._term import ODETerm as ODETerm

__version__ = "0.1.0"
