"""odesolve: differentiable ODE solvers in JAX, with Diffrax's API.

import odesolve as ode
sol = ode.diffeqsolve(ode.ODETerm(f), ode.Tsit5(), t0, t1, dt0, y0, args,
                      saveat=ode.SaveAt(ts=ts),
                      stepsize_controller=ode.PIDController(rtol=1e-6, atol=1e-6))
"""

from adjoints import (
    AbstractAdjoint as AbstractAdjoint,
)
from adjoints import (
    BacksolveAdjoint as BacksolveAdjoint,
)
from adjoints import (
    DirectAdjoint as DirectAdjoint,
)
from adjoints import (
    ForwardMode as ForwardMode,
)
from adjoints import (
    ImplicitAdjoint as ImplicitAdjoint,
)
from adjoints import (
    RecursiveCheckpointAdjoint as RecursiveCheckpointAdjoint,
)
from adjoints import (
    ReversibleAdjoint as ReversibleAdjoint,
)
from adjoints import AbstractSchedule as AbstractSchedule
from adjoints import Nested as Nested
from adjoints import Online as Online
from adjoints import Revolve as Revolve
from adjoints import Segments as Segments
from adjoints import States as States
from adjoints import Tape as Tape

from ._continuous import adjoint_rms_seminorm as adjoint_rms_seminorm
from ._control_term import ControlTerm as ControlTerm
from ._controller import (
    AbstractAdaptiveStepSizeController as AbstractAdaptiveStepSizeController,
)
from ._controller import (
    AbstractStepSizeController as AbstractStepSizeController,
)
from ._controller import (
    ClipStepSizeController as ClipStepSizeController,
)
from ._controller import (
    ConstantStepSize as ConstantStepSize,
)
from ._controller import (
    PIDController as PIDController,
)
from ._controller import (
    StepTo as StepTo,
)
from ._controller import (
    rms_norm as rms_norm,
)
from ._discrete_event import (
    AbstractDiscreteTerminatingEvent as AbstractDiscreteTerminatingEvent,
)
from ._discrete_event import DiscreteTerminatingEvent as DiscreteTerminatingEvent
from ._discrete_event import SteadyStateEvent as SteadyStateEvent
from ._event import Event as Event
from ._global_interpolation import (
    AbstractGlobalInterpolation as AbstractGlobalInterpolation,
)
from ._global_interpolation import CubicInterpolation as CubicInterpolation
from ._global_interpolation import LinearInterpolation as LinearInterpolation
from ._hermite_coefficients import (
    backward_hermite_coefficients as backward_hermite_coefficients,
)
from ._integrate import diffeqsolve as diffeqsolve
from ._local_interpolation import (
    AbstractLocalInterpolation as AbstractLocalInterpolation,
)
from ._local_interpolation import (
    FourthOrderPolynomialInterpolation as FourthOrderPolynomialInterpolation,
)
from ._local_interpolation import LocalLinearInterpolation as LocalLinearInterpolation
from ._local_interpolation import (
    ThirdOrderHermitePolynomialInterpolation as ThirdOrderHermitePolynomialInterpolation,
)
from ._missing_data import linear_interpolation as linear_interpolation
from ._missing_data import rectilinear_interpolation as rectilinear_interpolation
from ._path import AbstractPath as AbstractPath
from ._progress_meter import (
    AbstractProgressMeter as AbstractProgressMeter,
)
from ._progress_meter import (
    NoProgressMeter as NoProgressMeter,
)
from ._progress_meter import (
    TextProgressMeter as TextProgressMeter,
)
from ._progress_meter import (
    TqdmProgressMeter as TqdmProgressMeter,
)
from ._results import RESULTS as RESULTS
from ._results import ComplexStateWarning as ComplexStateWarning
from ._results import InvalidSaveTimes as InvalidSaveTimes
from ._results import InvalidStepTimes as InvalidStepTimes
from ._results import Result as Result
from ._results import SolveError as SolveError
from ._results import UnsupportedCombination as UnsupportedCombination
from ._results import TermAndSolverIncompatible as TermAndSolverIncompatible
from ._results import is_event as is_event
from ._results import is_okay as is_okay
from ._results import is_successful as is_successful
from ._saveat import SaveAt as SaveAt
from ._saveat import SubSaveAt as SubSaveAt
from ._solution import DenseInterpolation as DenseInterpolation
from ._solution import Solution as Solution
from ._solver import AbstractAdaptiveSolver as AbstractAdaptiveSolver
from ._solver import AbstractDIRK as AbstractDIRK
from ._solver import AbstractERK as AbstractERK
from ._solver import AbstractESDIRK as AbstractESDIRK
from ._solver import AbstractImplicitRungeKutta as AbstractImplicitRungeKutta
from ._solver import AbstractImplicitSolver as AbstractImplicitSolver
from ._solver import AbstractReversibleSolver as AbstractReversibleSolver
from ._solver import AbstractSDIRK as AbstractSDIRK
from ._solver import (
    AbstractRungeKutta as AbstractRungeKutta,
)
from ._solver import AbstractSolver as AbstractSolver
from ._solver import AbstractWrappedSolver as AbstractWrappedSolver
from ._solver import (
    Bosh3 as Bosh3,
)
from ._solver import (
    ButcherTableau as ButcherTableau,
)
from ._solver import (
    Dopri5 as Dopri5,
)
from ._solver import (
    Dopri8 as Dopri8,
)
from ._solver import (
    Euler as Euler,
)
from ._solver import CalculateJacobian as CalculateJacobian
from ._solver import HalfSolver as HalfSolver
from ._solver import RetreatInput as RetreatInput
from ._solver import StartInput as StartInput
from ._solver import StepInput as StepInput
from ._solver import KenCarp3 as KenCarp3
from ._solver import KenCarp4 as KenCarp4
from ._solver import KenCarp5 as KenCarp5
from ._solver import (
    Heun as Heun,
)
from ._solver import (
    ImplicitEuler as ImplicitEuler,
)
from ._solver import (
    Kvaerno3 as Kvaerno3,
)
from ._solver import (
    Kvaerno4 as Kvaerno4,
)
from ._solver import (
    Kvaerno5 as Kvaerno5,
)
from ._solver import LeapfrogMidpoint as LeapfrogMidpoint
from ._solver import MultiButcherTableau as MultiButcherTableau
from ._solver import (
    Midpoint as Midpoint,
)
from ._solver import (
    Ralston as Ralston,
)
from ._solver import Reversible as Reversible
from ._solver import ReversibleHeun as ReversibleHeun
from ._solver import SemiImplicitEuler as SemiImplicitEuler
from ._solver import Sil3 as Sil3
from ._solver import (
    Tsit5 as Tsit5,
)
from ._solver import VeryChord as VeryChord
from ._solver import with_stepsize_controller_tols as with_stepsize_controller_tols
from ._steady_state import steady_state_event as steady_state_event
from ._term import AbstractTerm as AbstractTerm
from ._term import MultiTerm as MultiTerm
from ._term import ODETerm as ODETerm

__version__ = "0.1.0"
