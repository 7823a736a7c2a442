from ._base import AbstractAdaptiveStepSizeController as AbstractAdaptiveStepSizeController
from ._base import AbstractStepSizeController as AbstractStepSizeController
from .clip import ClipStepSizeController as ClipStepSizeController
from .constant import ConstantStepSize as ConstantStepSize
from .constant import StepTo as StepTo
from .pid import PIDController as PIDController
from .pid import rms_norm as rms_norm
