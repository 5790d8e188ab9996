"""torch.nn's loss modules backed by lossfuse. Each subclasses its torch.nn counterpart (same constructor,
attributes and state) and computes forward with lossfuse's function. Each family module lists its classes in
MODULES."""

from .. import _cross_entropy, _ctc, _linear_cross_entropy, _margin, _pointwise

__all__ = []
for _family in (_cross_entropy, _pointwise, _margin, _ctc, _linear_cross_entropy):
    for _name in getattr(_family, "MODULES", ()):
        globals()[_name] = getattr(_family, _name)
        __all__.append(_name)
del _family, _name
