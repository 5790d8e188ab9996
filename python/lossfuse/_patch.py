"""patch_torch / unpatch_torch: route torch.nn.functional's losses to lossfuse and back."""

import torch.nn.functional as F

from .nn import functional as _lf

_saved = {}


def patch_torch():
    """Replaces each torch.nn.functional loss lossfuse provides with lossfuse's; returns the names replaced.

    torch.nn's loss modules call torch.nn.functional at run time, so they follow. Calling it twice is harmless.
    """
    names = []
    for name in _lf.__all__:
        if hasattr(F, name):
            _saved.setdefault(name, getattr(F, name))
            setattr(F, name, getattr(_lf, name))
            names.append(name)
    return names


def unpatch_torch():
    """Restores every function patch_torch replaced."""
    for name, fn in _saved.items():
        setattr(F, name, fn)
    _saved.clear()
