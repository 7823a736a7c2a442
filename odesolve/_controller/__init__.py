from ._base import AbstractStepSizeController as AbstractStepSizeController
from .constant import ConstantStepSize as ConstantStepSize, StepTo as StepTo
from .pid import PIDController as PIDController, rms_norm as rms_norm
