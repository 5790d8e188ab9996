"""patch_torch / unpatch_torch: route torch.nn.functional's losses to lossfuse and back."""

import functools

import torch
import torch.nn.functional as F

from .nn import functional as _lf

_saved = {}
_PLAIN = (torch.Tensor, torch.nn.Parameter)
# tensors of tracing (non-strict torch.export, make_fx, AOTAutograd), which lossfuse's fake implementations serve
_TRACING = (torch._subclasses.fake_tensor.FakeTensor, torch._subclasses.functional_tensor.FunctionalTensor)


def _catalog_name(name):
    """The catalog's (C++ LossKind's) name of torch.nn.functional's loss `name`."""
    return {"binary_cross_entropy": "bce", "binary_cross_entropy_with_logits": "bce_with_logits"}.get(
        name, name.removesuffix("_loss"))


@functools.cache
def devices(name):
    """The device types lossfuse serves torch.nn.functional's loss `name` on: the catalog's devices for it (the CPU;
    CUDA, for every loss, in a build with the CUDA route), and meta (shapes only, as torch.compile traces them)."""
    rows = (line.split(",") for line in torch.ops.lossfuse._catalog().splitlines()[1:])
    served = {device for loss, _, device, _ in rows if loss == _catalog_name(name)}
    if not torch.ops.lossfuse._has_cuda():
        served.discard("cuda")
    return ("meta", *sorted(served))


def _torch_takes(args, kwargs, served):
    """Whether a call is left to torch's own function: a tensor on a device lossfuse does not serve this loss on (not
    in `served`), a tensor subclass (DTensor, FX's proxies, a subclass with its own __torch_function__: torch's
    function gives them its override protocol; but the fake and functional tensors of tracing stay with lossfuse), or
    an active torch function mode (torch's function hands the call to the mode, which calls the patched function again
    with itself disabled: lossfuse then)."""
    operands = (*args, *kwargs.values())
    if torch.overrides.has_torch_function(operands):  # an override (FX's Proxy is no tensor) or a mode
        return True
    return any(isinstance(a, torch.Tensor) and ((type(a) not in _PLAIN and not isinstance(a, _TRACING))
                                                 or a.device.type not in served)
               for a in operands)


def _routed(name, ours, theirs):
    @functools.wraps(ours)
    def loss(*args, **kwargs):
        if _torch_takes(args, kwargs, devices(name)):
            return theirs(*args, **kwargs)
        return ours(*args, **kwargs)

    loss.lossfuse_original = theirs
    return loss


def patch_torch():
    """Replaces each torch.nn.functional loss lossfuse provides with lossfuse's; returns the names replaced.

    torch.nn's loss modules call torch.nn.functional at run time, so they follow. Calling it twice is harmless.
    Calls lossfuse cannot serve stay with torch's own function: tensors on a device lossfuse has no kernels of that
    loss for (devices() lists those it has: the CPU, and CUDA in a build with the CUDA route) and tensor subclasses
    (DTensor, torch.fx's tracing proxies, subclasses overriding __torch_function__). Under a torch function mode, torch's function hands the call to the mode, as torch does, and
    the mode's own call runs lossfuse.
    torch.jit.script of code calling a patched function fails (TorchScript cannot compile it): script before
    patching, or after unpatch_torch().
    """
    names = []
    for name in _lf.__all__:
        if hasattr(F, name):
            if name not in _saved:
                _saved[name] = getattr(F, name)
                # lossfuse's function below its __torch_function__ wrapper (overridable): the calls that protocol
                # serves go to torch's function, and a warning's stack level is the same as in a direct call
                setattr(F, name, _routed(name, getattr(_lf, name).__wrapped__, _saved[name]))
            names.append(name)
    return names


def unpatch_torch():
    """Restores every function patch_torch replaced."""
    for name, fn in _saved.items():
        setattr(F, name, fn)
    _saved.clear()
