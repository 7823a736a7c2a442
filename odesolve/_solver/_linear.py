"""Second-order methods whose dense output is linear between a step's ends."""

from .._term import ODETerm
from ._base import AbstractSolver

# y(theta) = y0 + h theta k, with k = (y1 - y0) / h.
LINEAR: tuple[tuple[float, ...], ...] = ((1.0,),)


class AbstractLinearSecondOrder(AbstractSolver):
    """Second order, linear dense output; subclasses say how a step is taken."""

    def order(self, terms: ODETerm | None = None) -> int:
        return 2

    def error_order(self, terms: ODETerm | None = None) -> int:
        return 2

    @property
    def interpolation(self) -> tuple[tuple[float, ...], ...]:
        return LINEAR
