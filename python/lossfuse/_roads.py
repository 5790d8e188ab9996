"""The eager fast path: which road a call takes (plain eager with or without a gradient, traced, forward-mode),
and the predicates it decides by."""

import sys
import threading

import torch


# ---- the eager fast path -------------------------------------------------------------------------------------------
#
# Every forward op's autograd is registered with torch.library.register_autograd, which is what torch.compile,
# FakeTensor and the other tracers need. In plain eager mode that registration costs tens of microseconds per call
# in Python (the dispatcher calls back into a generated autograd.Function, which re-reads the schema's defaults for
# setup_context on every call): several times torch's own small losses. So `register_autograd` below also builds a
# plain torch.autograd.Function from the same setup_context and backward, and `ops.<name>(...)` applies it directly
# when nothing traces the call. A plain eager call that needs no gradient (torch.no_grad, inference_mode, an
# evaluation loop, operands that do not require grad) skips the registered autograd altogether and runs the kernel
# below autograd, as that autograd's own no-grad path does after its Python redispatch. Anything else (Dynamo, a
# dispatch or function mode, a tensor subclass, forward-mode duals) goes through the registered op. Every path runs
# the same kernel; the gradient paths the same backward.


# Tensor types the fast path takes: plain tensors and parameters (a subclass that overrides nothing).
_PLAIN = (torch.Tensor, torch.nn.Parameter)

# what _eager_state finds
_TRACED, _NO_GRAD, _WANTS_GRAD = 0, 1, 2


def _eager_state(args):
    """_WANTS_GRAD when the call may bypass the dispatcher's autograd for the plain Function: grad mode on, some plain
    tensor requiring grad, no tracer (Dynamo, torch.jit.trace, functorch), mode or other tensor subclass anywhere;
    _NO_GRAD in the same conditions when no tensor requires grad or grad mode is off; else _TRACED."""
    if torch.compiler.is_compiling():
        return _TRACED
    if (torch._C._is_torch_function_mode_enabled() or torch._C._len_torch_dispatch_stack() > 0
            or torch._C._are_functorch_transforms_active() or torch._C._get_tracing_state() is not None):
        return _TRACED
    wants_grad = False
    for a in args:
        if isinstance(a, torch.Tensor):
            if type(a) not in _PLAIN:
                return _TRACED
            wants_grad = wants_grad or a.requires_grad
    return _WANTS_GRAD if wants_grad and torch.is_grad_enabled() else _NO_GRAD


def _plain_eager(args):
    """True when the call may bypass the dispatcher's autograd: grad mode on, some plain tensor requiring grad, no
    tracer (Dynamo, torch.jit.trace, functorch), mode or other tensor subclass anywhere."""
    return _eager_state(args) == _WANTS_GRAD


def is_eager(t):
    """True outside every tracer and transform (Dynamo, AOTAutograd, FakeTensor, torch.func): only then may a
    backward mutate what its forward saved (the gradients handed over and rescaled in place)."""
    return (type(t) is torch.Tensor and not torch.compiler.is_compiling()
            and not torch._C._are_functorch_transforms_active())


_below_autograd = torch._C._AutoDispatchBelowAutograd


_fwad = torch.autograd.forward_ad


class _DualMasks(threading.local):
    """Per thread, for each Function applied on torch.autograd.forward_ad duals: which arguments are duals."""

    def __init__(self):
        self.stack = []


_dual_masks = _DualMasks()


def compiled_autograd_on():
    """Whether torch's compiled autograd is on (torch._dynamo.config.compiled_autograd, or its context active now):
    it traces every node's backward into a graph, which cross_entropy's eager C++ node does not allow (torch asserts
    against C++ nodes with outputs marked non-differentiable, and the node reads the upstream gradient's value), so
    such calls take the autograd.Function road, which it traces."""
    config = sys.modules.get("torch._dynamo.config")
    if config is None:
        return False
    module = sys.modules.get("torch._dynamo.compiled_autograd")
    return bool(config.compiled_autograd or (module is not None and module.compiled_autograd_enabled))


def forward_ad_active():
    return torch.autograd.forward_ad._current_level >= 0


def _has_tangent(args):
    return any(isinstance(a, torch.Tensor) and torch.autograd.forward_ad.unpack_dual(a).tangent is not None
               for a in args)
