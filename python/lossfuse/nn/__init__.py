"""lossfuse.nn: torch.nn-compatible loss modules and lossfuse.nn.functional."""

from . import functional
from .modules import *  # noqa: F401,F403
from .modules import __all__
