"""torch.nn.functional's losses, computed by lossfuse: same signatures, defaults and results, plus lossfuse's
keyword-only extras. Each family module (lossfuse._cross_entropy, ._pointwise, ._margin, ._ctc,
._linear_cross_entropy) lists its functions in FUNCTIONS."""

from .. import _cross_entropy, _ctc, _linear_cross_entropy, _margin, _pointwise

__all__ = []
for _family in (_cross_entropy, _pointwise, _margin, _ctc, _linear_cross_entropy):
    for _name in getattr(_family, "FUNCTIONS", ()):
        globals()[_name] = getattr(_family, _name)
        __all__.append(_name)
del _family, _name
