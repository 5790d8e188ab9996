"""The likelihood losses (binary_cross_entropy, binary_cross_entropy_with_logits, poisson_nll_loss,
gaussian_nll_loss): fake implementations, autograd, and the torch-compatible functions and modules.

The functions do what torch.nn.functional does before its kernel runs -- argument and shape checks, dtype
promotion, broadcasting -- and hand the kernels operands of one floating dtype and one shape (broadcast ones --
a weight, pos_weight or var, or an input smaller than its target -- as expanded views, so autograd sums their
gradients back). Each op returns its loss in float32 (float64 for float64 operands); the function casts it to the
dtype torch would return.
"""

import math

import torch
import torch.nn as _tnn
from torch.nn import _reduction as _torch_reduction

from ._args import autocast_float32, broadcast_shape, check_optional_tensors, check_tensors, finite, reduction_code
from ._protocol import overridable
from ._register import ops, register_loss, register_loss_fakes, same_shape

_ops = ops  # torch.ops.lossfuse with the eager fast path
_MAX_DIMS = 8  # lossfuse::kMaxDims
_REDUCTION_NAMES = ("none", "mean", "sum")


# ---- the losses as differentiable torch ops ----------------------------------------------------------------------
# Each computes what the lossfuse op of the same name computes from the same operands and scalar arguments, with
# torch's own kernels (which patch_torch() leaves alone). Used for double backward (create_graph=True), and for
# arguments the kernels do not take (integer operands, a non-finite eps).


def _bce_formula(x, t, w, reduction):
    return torch._C._nn.binary_cross_entropy(x, t, w, reduction)


def _bce_logits_formula(x, t, w, pw, reduction):
    return torch.binary_cross_entropy_with_logits(x, t, w, pw, reduction)


def _poisson_formula(x, t, log_input, full, eps, reduction):
    return torch.poisson_nll_loss(x, t, log_input, full, eps, reduction)


def _gaussian_formula(x, t, v, full, eps, reduction):
    """torch.nn.functional.gaussian_nll_loss's computation: var is clamped to eps outside autograd, so d/dvar is
    taken at max(var, eps) and passed straight through the clamp."""
    v = v.clone()
    with torch.no_grad():
        v.clamp_(min=eps)
    loss = 0.5 * (torch.log(v) + (x - t) ** 2 / v)
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
    return loss if reduction == 0 else loss.sum() if reduction == 2 else loss.mean()


# ---- fake (meta) implementations: shapes and dtypes only, for torch.compile and FakeTensor tracing ----------------


for _name in ("binary_cross_entropy", "binary_cross_entropy_with_logits", "poisson_nll_loss", "gaussian_nll_loss"):
    register_loss_fakes(_name, same_shape)


# ---- autograd ------------------------------------------------------------------------------------------------------


# (name, torch composition, tensors, of which the first ones take gradients)
# bce's weight: torch's forward derivative ignores it (and fails on a dual one)
register_loss("binary_cross_entropy", _bce_formula, 3, 2, differentiable=range(2))
register_loss("binary_cross_entropy_with_logits", _bce_logits_formula, 4, 2)
register_loss("poisson_nll_loss", _poisson_formula, 2, 2)
register_loss("gaussian_nll_loss", _gaussian_formula, 3, 3)


# ---- argument handling shared by the functions -----------------------------------------------------------------


def _bce_reduction(reduction, size_average, reduce):
    """The binary cross-entropies read `reduction` with torch's get_enum, which still takes 'elementwise_mean' (as
    'mean', with torch's deprecation warning)."""
    if size_average is not None or reduce is not None:
        return reduction_code(reduction, size_average, reduce)
    return _torch_reduction.get_enum(reduction)


def _check_not_requiring_grad(fn_name, arg_name, t):
    """torch differentiates no weight of the binary cross-entropies and refuses one that requires a gradient."""
    if t is not None and t.requires_grad and torch.is_grad_enabled():
        raise RuntimeError(f"The function '{fn_name}' is not differentiable with respect to argument '{arg_name}'. "
                           "This input cannot have requires_grad True.")


def _check_broadcasts_to(fn_name, arg_name, t, shape):
    """`t` must broadcast to `shape` without enlarging it (torch writes the loss in place in the input's shape)."""
    try:
        ok = torch.broadcast_shapes(t.shape, shape) == shape
    except RuntimeError:
        ok = False
    if not ok:
        raise RuntimeError(f"{fn_name}: {arg_name}: expected a shape that broadcasts to the input's {tuple(shape)}, "
                           f"got {tuple(t.shape)}")


def _promote(*tensors):
    """The dtype torch's elementwise arithmetic gives floating operands: the promotion of those with dims, a 0-d one
    counting only when all are 0-d (torch's zero-dim rule: within one category, a 0-d tensor does not widen)."""
    pool = [t.dtype for t in tensors if t.dim() > 0] or [t.dtype for t in tensors]
    dtype = pool[0]
    for other in pool[1:]:
        dtype = torch.promote_types(dtype, other)
    return dtype


def _kernel_dtype(result, tensors):
    """The one dtype the kernel gets: the result's, widened to any wider floating operand (no precision lost)."""
    dtype = result
    for t in tensors:
        if t is not None and t.dtype != dtype and t.dtype.is_floating_point:
            dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def _sum_broadcast_grads_in_float32(kernel_dtype, tensors, shape):
    """float32 instead of a 16-bit kernel dtype when an operand that needs a gradient is broadcast: its gradient is
    a sum over the broadcast dims, and the terms of such a sum can cancel (gaussian_nll's var gradient,
    (1 - (x - y)^2 / v) / 2v, changes sign). Summed from float32 terms and rounded once, it is exact to the 16-bit
    dtype's rounding; summed from terms each rounded to 16 bits (torch's way, and the kernel's output in the 16-bit
    dtype), it can be off by many units of the result. The loss and the other gradients are the same either way
    (the kernel computes in float32 and rounds once); the cost is float32 copies of the operands."""
    if kernel_dtype not in (torch.float16, torch.bfloat16) or not torch.is_grad_enabled():
        return kernel_dtype
    shape = tuple(shape)
    if any(t is not None and t.requires_grad and tuple(t.shape) != shape for t in tensors):
        return torch.float32
    return kernel_dtype


def _prepare(tensors, dtype, shape):
    """Operands cast to `dtype` and expanded to `shape` (views: broadcast operands get stride 0); None stays."""
    return [None if t is None else t.to(dtype).expand(shape) for t in tensors]


def _fit_dims(tensors):
    """Operands with more dims than the kernels take, flattened (a copy only where a view cannot be had; the losses
    are elementwise, so any common order of elements will do). Returns them and the shape to restore (or None)."""
    shape = tensors[0].shape
    if len(shape) <= _MAX_DIMS:
        return tensors, None
    return [None if t is None else t.reshape(-1) for t in tensors], shape


def _finish(loss, shape, reduction, dtype):
    """The op's loss in torch's shape and dtype."""
    if shape is not None and reduction == 0:
        loss = loss.reshape(shape)
    return loss if loss.dtype == dtype else loss.to(dtype)


# ---- torch.nn.functional-compatible functions ----------------------------------------------------------------------


@overridable
def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    """torch.nn.functional.binary_cross_entropy: -w [y log x + (1 - y) log(1 - x)], each log clamped to >= -100;
    weighted mean = mean(w l). input and target of one shape and one floating dtype; every input and target element
    in [0, 1] (else RuntimeError naming the first bad one). The weight broadcasts to the input; it gets no
    gradient."""
    check_optional_tensors("binary_cross_entropy", ("weight", 3, weight))
    red = _bce_reduction(reduction, size_average, reduce)
    input, target, weight = autocast_float32(input, target, weight)
    if target.size() != input.size():
        raise ValueError(f"Using a target size ({target.size()}) that is different to the input size "
                         f"({input.size()}) is deprecated. Please ensure they have the same size.")
    if not input.dtype.is_floating_point:
        raise NotImplementedError(f"binary_cross_entropy: input: expected a floating dtype, got {input.dtype}")
    if target.dtype != input.dtype:
        raise RuntimeError(f"binary_cross_entropy: target: expected the input's dtype {input.dtype}, got "
                           f"{target.dtype}")
    if weight is not None:
        _check_not_requiring_grad("binary_cross_entropy", "weight", weight)
        _check_broadcasts_to("binary_cross_entropy", "weight", weight, input.shape)
        weight = weight.to(input.dtype).expand(input.shape)
    (x, t, w), shape = _fit_dims([input, target, weight])
    return _finish(_ops.binary_cross_entropy(x, t, w, red), shape, red, input.dtype)


@overridable
def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None, reduction="mean",
                                     pos_weight=None):
    """torch.nn.functional.binary_cross_entropy_with_logits: -w [pw y log sigmoid(x) + (1 - y) log(1 - sigmoid(x))],
    computed stably; weighted mean = mean(w l). input and target of one shape; weight and pos_weight broadcast to it
    (pos_weight's (C) along the last dim) and get no gradient. The loss has the target's dtype, as torch."""
    check_optional_tensors("binary_cross_entropy_with_logits", ("weight", 3, weight), ("pos_weight", 7, pos_weight))
    red = _bce_reduction(reduction, size_average, reduce)
    input, target, weight, pos_weight = autocast_float32(input, target, weight, pos_weight)
    if target.size() != input.size():
        raise ValueError(f"Target size ({target.size()}) must be the same as input size ({input.size()})")
    name = "binary_cross_entropy_with_logits"
    if torch._C._are_functorch_transforms_active() and any(
            t is not None and t.requires_grad for t in (weight, pos_weight)):
        # torch refuses these gradients in plain autograd but gives them under torch.func (grad, jacrev of the
        # weights): its own op there
        return _bce_logits_formula(input, target, weight, pos_weight, red)
    _check_not_requiring_grad(name, "weight", weight)
    _check_not_requiring_grad(name, "pos_weight", pos_weight)
    for arg, t in (("weight", weight), ("pos_weight", pos_weight)):
        if t is not None:
            _check_broadcasts_to(name, arg, t, input.shape)
    if not all(t.dtype.is_floating_point for t in (input, target, pos_weight) if t is not None):
        # Integer or bool operands (which torch rejects, or computes with its promotion rules): torch's own.
        return _bce_logits_formula(input, target, weight, pos_weight, red)
    # torch computes the loss in place in a tensor of the target's dtype.
    dtype = target.dtype
    kd = _kernel_dtype(dtype, (input, weight, pos_weight))
    x, t, w, pw = _prepare((input, target, weight, pos_weight), kd, input.shape)
    (x, t, w, pw), shape = _fit_dims([x, t, w, pw])
    return _finish(_ops.binary_cross_entropy_with_logits(x, t, w, pw, red), shape, red, dtype)


@overridable
def poisson_nll_loss(input, target, log_input=True, full=False, size_average=None, eps=1e-8, reduce=None,
                     reduction="mean"):
    """torch.nn.functional.poisson_nll_loss: exp(x) - y x (log_input), else x - y log(x + eps); full adds
    y log y - y + 0.5 log(2 pi y) where y > 1. input and target broadcast; both get gradients, as torch."""
    check_tensors("poisson_nll_loss", ("input", input), ("target", target))
    red = reduction_code(reduction, size_average, reduce, legacy_names=False)
    input, target = autocast_float32(input, target)
    log_input, full, eps = bool(log_input), bool(full), float(eps)
    if not (input.dtype.is_floating_point and target.dtype.is_floating_point) or not finite(eps):
        # Integer or bool operands, or an eps the kernels do not take: torch's own computation.
        return _poisson_formula(input, target, log_input, full, eps, red)
    dtype = _promote(input, target)
    shape = broadcast_shape("poisson_nll_loss", input=input, target=target)
    kd = _sum_broadcast_grads_in_float32(_kernel_dtype(dtype, (input, target)), (input, target), shape)
    x, t = _prepare((input, target), kd, shape)
    (x, t), shape = _fit_dims([x, t])
    return _finish(_ops.poisson_nll_loss(x, t, log_input, full, eps, red), shape, red, dtype)


def _gaussian_var(input, var):
    """torch's var checks and shapes: a float becomes a tensor like the input; a var one dim short of the input
    gets a last dim of 1; otherwise var has the input's shape or differs from it in one dim, where var is 1."""
    if isinstance(var, float):
        if var < 0:
            raise ValueError("var has negative entry/entries")
        dtype = input.dtype if input.dtype.is_floating_point else torch.get_default_dtype()
        return torch.full((), var, dtype=dtype, device=input.device).expand(input.shape)
    if not isinstance(var, torch.Tensor):
        raise TypeError(f"gaussian_nll_loss: var: expected a tensor or a float, got {type(var).__name__}")
    # Negative entries are reported by the kernel (no host sync here), as torch's ValueError naming var.
    if var.size() != input.size():
        if input.size()[:-1] == var.size():
            var = torch.unsqueeze(var, -1)
        elif not (input.dim() == var.dim()
                  and sum(v for i, v in zip(input.size(), var.size()) if i != v) == 1):
            raise ValueError(f"var is of incorrect size: var {tuple(var.shape)} for input {tuple(input.shape)} "
                             "(expected the input's shape, the input's shape without its last dim, or the input's "
                             "shape with one dim of size 1)")
    return var


@overridable
def gaussian_nll_loss(input, target, var, full=False, eps=1e-6, reduction="mean"):
    """torch.nn.functional.gaussian_nll_loss: 0.5 (log max(var, eps) + (x - y)^2 / max(var, eps)), plus
    0.5 log(2 pi) when full. var: a float, a tensor of the input's shape, of the input's shape without its last dim,
    or with one dim of size 1; every entry >= 0 (ValueError). The clamp is outside autograd, as torch: the var's
    gradient is taken at max(var, eps). input, target and var broadcast; all get gradients."""
    check_tensors("gaussian_nll_loss", ("input", input), ("target", target))
    var = _gaussian_var(input, var)
    if reduction not in _REDUCTION_NAMES:
        raise ValueError(f"{reduction} is not valid")
    red = _REDUCTION_NAMES.index(reduction)
    full, eps = bool(full), float(eps)
    operands = (input, target, var)
    if not all(t.dtype.is_floating_point for t in operands) or not finite(eps):
        # Integer or bool operands, or an eps the kernels do not take: torch's own computation (and its checks).
        if var.is_floating_point() and torch.any(var < 0):
            raise ValueError("var has negative entry/entries")
        return _gaussian_formula(input, target, var, full, eps, red)
    dtype = _promote(input, target, var)
    shape = broadcast_shape("gaussian_nll_loss", input=input, target=target, var=var)
    kd = _sum_broadcast_grads_in_float32(_kernel_dtype(dtype, operands), operands, shape)
    x, t, v = _prepare(operands, kd, shape)
    (x, t, v), shape = _fit_dims([x, t, v])
    return _finish(_ops.gaussian_nll_loss(x, t, v, full, eps, red), shape, red, dtype)


# ---- torch.nn modules ---------------------------------------------------------------------------------------------


class BCELoss(_tnn.BCELoss):
    """torch.nn.BCELoss."""

    def forward(self, input, target):
        return binary_cross_entropy(input, target, weight=self.weight, reduction=self.reduction)


class BCEWithLogitsLoss(_tnn.BCEWithLogitsLoss):
    """torch.nn.BCEWithLogitsLoss."""

    def forward(self, input, target):
        return binary_cross_entropy_with_logits(input, target, self.weight, pos_weight=self.pos_weight,
                                                reduction=self.reduction)


class PoissonNLLLoss(_tnn.PoissonNLLLoss):
    """torch.nn.PoissonNLLLoss."""

    def forward(self, log_input, target):
        return poisson_nll_loss(log_input, target, log_input=self.log_input, full=self.full, eps=self.eps,
                                reduction=self.reduction)


class GaussianNLLLoss(_tnn.GaussianNLLLoss):
    """torch.nn.GaussianNLLLoss."""

    def forward(self, input, target, var):
        return gaussian_nll_loss(input, target, var, full=self.full, eps=self.eps, reduction=self.reduction)


FUNCTIONS = ["binary_cross_entropy", "binary_cross_entropy_with_logits", "poisson_nll_loss", "gaussian_nll_loss"]
MODULES = ["BCELoss", "BCEWithLogitsLoss", "PoissonNLLLoss", "GaussianNLLLoss"]
