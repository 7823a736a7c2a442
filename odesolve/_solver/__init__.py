from ._runge_kutta import AbstractRungeKutta as AbstractRungeKutta
from ._tableau import ButcherTableau as ButcherTableau
from .dopri5 import Dopri5 as Dopri5
from .dopri8 import Dopri8 as Dopri8
from .explicit import (
    Bosh3 as Bosh3,
    Euler as Euler,
    Heun as Heun,
    Midpoint as Midpoint,
    Ralston as Ralston,
)
from .tsit5 import Tsit5 as Tsit5
