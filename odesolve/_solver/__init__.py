from ._base import AbstractReversibleSolver as AbstractReversibleSolver
from ._base import AbstractSolver as AbstractSolver
from ._base import RetreatInput as RetreatInput
from ._base import StartInput as StartInput
from ._base import StepContext as StepContext
from ._base import StepInput as StepInput
from ._implicit import AbstractImplicitRungeKutta as AbstractImplicitRungeKutta
from ._kinds import AbstractAdaptiveSolver as AbstractAdaptiveSolver
from ._kinds import AbstractImplicitSolver as AbstractImplicitSolver
from ._kinds import AbstractWrappedSolver as AbstractWrappedSolver
from ._runge_kutta import AbstractRungeKutta as AbstractRungeKutta
from . import _diffrax_methods as _diffrax_methods  # Diffrax's spelling of a tableau
from ._diffrax_tableau import ButcherTableau as ButcherTableau
from ._diffrax_tableau import CalculateJacobian as CalculateJacobian
from ._diffrax_tableau import MultiButcherTableau as MultiButcherTableau
from ._tableau import ImplicitTableau as ImplicitTableau
from .dopri5 import Dopri5 as Dopri5
from .dopri8 import Dopri8 as Dopri8
from .explicit import (
    Bosh3 as Bosh3,
)
from .explicit import (
    Euler as Euler,
)
from .explicit import (
    Heun as Heun,
)
from .explicit import (
    Midpoint as Midpoint,
)
from .explicit import (
    Ralston as Ralston,
)
from .half import HalfSolver as HalfSolver
from .kencarp import KenCarp3 as KenCarp3
from .kencarp import KenCarp4 as KenCarp4
from .kencarp import KenCarp5 as KenCarp5
from .kvaerno import ImplicitEuler as ImplicitEuler
from .kvaerno import Kvaerno3 as Kvaerno3
from .kvaerno import Kvaerno4 as Kvaerno4
from .kvaerno import Kvaerno5 as Kvaerno5
from .leapfrog_midpoint import LeapfrogMidpoint as LeapfrogMidpoint
from .reversible import Reversible as Reversible
from .reversible_heun import ReversibleHeun as ReversibleHeun
from .root_finder import VeryChord as VeryChord
from .root_finder import with_stepsize_controller_tols as with_stepsize_controller_tols
from .semi_implicit_euler import SemiImplicitEuler as SemiImplicitEuler
from .sil3 import Sil3 as Sil3
from .tsit5 import Tsit5 as Tsit5

# Diffrax's names for the same bases.
AbstractERK = AbstractRungeKutta
AbstractESDIRK = AbstractImplicitRungeKutta
AbstractDIRK = AbstractImplicitRungeKutta
AbstractSDIRK = AbstractImplicitRungeKutta
