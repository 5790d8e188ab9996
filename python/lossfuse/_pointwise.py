"""The elementwise losses (mse_loss, l1_loss, smooth_l1_loss, huber_loss, kl_div, hinge_embedding_loss,
margin_ranking_loss, binary_cross_entropy, binary_cross_entropy_with_logits, poisson_nll_loss, gaussian_nll_loss):
fake implementations, autograd, and the torch-compatible functions and modules.

The functions do what torch.nn.functional does before its kernel runs -- dtype promotion, broadcasting (with
torch's warning), argument checks -- and hand the kernels operands of one dtype and one shape (broadcast ones -- a
target, weight, pos_weight or var -- as expanded views, so autograd sums their gradients back). Each op returns its
loss in float32 (float64 for float64 operands); the function casts it to the dtype torch would return.
"""

import functools
import math
import warnings

import torch
import torch.nn as _tnn
from torch.nn import _reduction as _torch_reduction

from ._args import (autocast_float32, autocast_reads_16bit, broadcast_shape, check_optional_tensors, check_tensors,
                    finite, infinite, reduction_code, sign_target)
from ._protocol import overridable
from ._register import ops, register_loss, register_loss_fakes, same_shape

_ops = ops  # torch.ops.lossfuse with the eager fast path
_nn = torch._C._nn  # torch's own kernels, untouched by patch_torch(): the double-backward path uses them
_MAX_DIMS = 8  # lossfuse::kMaxDims
_REDUCTION_NAMES = ("none", "mean", "sum")


# ---- the losses as differentiable torch ops ----------------------------------------------------------------------
# Each computes exactly what the lossfuse op of the same name computes from the same (promoted, broadcast)
# operands and scalar arguments. Used for double backward (create_graph=True) and for hyperparameters the kernels
# do not take (an infinite beta, delta or margin, a non-finite eps) and integer operands.


def _reduce(loss, weight, reduction, mean_by_weight_sum):
    if reduction == 0:
        return loss
    if reduction == 2:
        return loss.sum()
    return loss.sum() / weight.sum() if mean_by_weight_sum else loss.mean()


def _mse_formula(x, t, w, reduction):
    if w is None:
        return _nn.mse_loss(x, t, reduction)
    return _reduce((x - t).pow(2) * w, w, reduction, True)


def _l1_formula(x, t, w, reduction):
    if w is None:
        return _nn.l1_loss(x, t, reduction)
    return _reduce((x - t).abs() * w, w, reduction, True)


def _smooth_l1_formula(x, t, reduction, beta):
    # torch.nn.functional.smooth_l1_loss computes beta == 0 as l1_loss (gradient 0 where x == t).
    return _nn.l1_loss(x, t, reduction) if beta == 0 else _nn.smooth_l1_loss(x, t, reduction, beta)


def _huber_formula(x, t, w, reduction, delta):
    if w is None:
        return _nn.huber_loss(x, t, reduction, delta)
    return _reduce(_nn.huber_loss(x, t, 0, delta) * w, w, reduction, False)


def _kl_div_formula(x, t, reduction, batchmean, log_target):
    if batchmean:
        return torch.kl_div(x, t, 2, log_target=log_target) / (x.shape[0] if x.dim() else 1)
    return torch.kl_div(x, t, reduction, log_target=log_target)


def _hinge_formula(x, t, margin, reduction):
    return torch.hinge_embedding_loss(x, t, margin, reduction)


def _margin_ranking_formula(x1, x2, t, margin, reduction):
    return torch.margin_ranking_loss(x1, x2, t, margin, reduction)


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


for _name in ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div", "hinge_embedding_loss",
              "margin_ranking_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits", "poisson_nll_loss",
              "gaussian_nll_loss"):
    register_loss_fakes(_name, same_shape)


# ---- autograd ------------------------------------------------------------------------------------------------------


def _weight_grad(op, x, t, w, loss, grad_output, reduction, extra, mean_by_weight_sum):
    """d loss / d weight of a weighted mse/l1/huber op (torch differentiates the weight): grad * l per element for
    'none' and 'sum', where l is the unweighted loss; for 'mean', (l - loss) / sum(w) (mean_by_weight_sum: mse,
    l1) or l / numel (huber)."""
    per_element = op(x, t, None, 0, *extra)
    if reduction == 1:
        if mean_by_weight_sum:
            per_element = (per_element - loss) / w.to(per_element.dtype).sum()
        else:
            per_element = per_element / max(per_element.numel(), 1)
    return (grad_output * per_element).to(w.dtype)


def _weighted(name, mean_by_weight_sum):
    """weight_grad of register_loss for a weighted mse/l1/huber op."""
    op = getattr(_ops, name)
    return lambda tensors, loss, grad_output, args: _weight_grad(op, *tensors, loss, grad_output, args[0], args[1:],
                                                                 mean_by_weight_sum)


# (name, torch composition, tensors, of which the first ones take gradients from the backward op, weight gradient)
register_loss("mse_loss", _mse_formula, 3, 2, _weighted("mse_loss", True))
register_loss("l1_loss", _l1_formula, 3, 2, _weighted("l1_loss", True))
register_loss("smooth_l1_loss", _smooth_l1_formula, 2, 2)
register_loss("huber_loss", _huber_formula, 3, 2, _weighted("huber_loss", False))
register_loss("kl_div", _kl_div_formula, 2, 2)
register_loss("hinge_embedding_loss", _hinge_formula, 2, 2)  # the backward op gives the input's gradient alone
register_loss("margin_ranking_loss", _margin_ranking_formula, 3, 3)
# bce's weight: torch's forward derivative ignores it (and fails on a dual one)
register_loss("binary_cross_entropy", _bce_formula, 3, 2, differentiable=range(2))
register_loss("binary_cross_entropy_with_logits", _bce_logits_formula, 4, 2)
register_loss("poisson_nll_loss", _poisson_formula, 2, 2)
register_loss("gaussian_nll_loss", _gaussian_formula, 3, 3)


# ---- argument handling shared by the functions -----------------------------------------------------------------


def _warn_if_sizes_differ(input, target):
    """torch's warning for a target broadcast against the input (mse, l1, smooth_l1, huber); skipped while
    torch.compile traces (Dynamo cannot trace warnings.warn)."""
    if target.size() != input.size() and not torch.compiler.is_compiling():
        warnings.warn(
            f"Using a target size ({target.size()}) that is different to the input size ({input.size()}). "
            "This will likely lead to incorrect results due to broadcasting. "
            "Please ensure they have the same size.",
            stacklevel=4,  # the caller of the public function, above its overridable() wrapper
        )


def _category(dtype):
    return 2 if dtype.is_floating_point else (0 if dtype == torch.bool else 1)


def _result_type(*tensors):
    """torch.result_type for tensors (traceable by Dynamo, which cannot put a dtype in a graph): n-d operands
    promote each other; 0-d ones take part only where their category (bool < integer < floating) is higher."""
    dimmed = [t.dtype for t in tensors if t.dim() > 0]
    zero_dim = [t.dtype for t in tensors if t.dim() == 0]
    result = functools.reduce(torch.promote_types, dimmed or zero_dim)
    if dimmed and zero_dim:
        top = functools.reduce(torch.promote_types, zero_dim)
        if _category(top) > _category(result):
            result = top
    return result


def _floating_result_type(name, input, target):
    """The dtype of mse/l1/smooth_l1, which torch computes on the broadcast operands (so a 0-d one promotes too);
    it must be floating."""
    dtype = torch.promote_types(input.dtype, target.dtype)
    if not dtype.is_floating_point:
        raise NotImplementedError(
            f"{name}: input and target: expected a floating dtype for one of them at least, got {input.dtype} and "
            f"{target.dtype}")
    return dtype


def _floating_input_type(name, input):
    """The dtype of losses torch computes in the input's dtype (huber_loss, hinge_embedding_loss)."""
    if not input.dtype.is_floating_point:
        raise NotImplementedError(f"{name}: input: expected a floating dtype, got {input.dtype}")
    return input.dtype


def _prepare(name, tensors, dtype, names=("input", "target")):
    """Operands cast to `dtype` and broadcast to one shape (expanded views); torch's RuntimeError naming them and
    their shapes when they cannot be."""
    shape = broadcast_shape(name, **dict(zip(names, tensors)))
    return [t if t.dtype == dtype and t.shape == shape else t.to(dtype).expand(shape) for t in tensors]


def _fit_dims(tensors):
    """Operands with more dims than the kernels take, reshaped to (shape[0], rest) -- a copy only where a view
    cannot be had; dim 0 is kept for kl_div's batchmean. Returns them and the original shape (None when kept)."""
    shape = tensors[0].shape
    if len(shape) <= _MAX_DIMS:
        return tensors, None
    rest = math.prod(shape[1:])
    return [None if t is None else t.reshape(shape[0], rest) for t in tensors], shape


def _finish(loss, shape, reduction, dtype):
    """The op's loss in torch's shape and dtype."""
    if shape is not None and reduction == 0:
        loss = loss.reshape(shape)
    return loss if loss.dtype == dtype else loss.to(dtype)


def _weight_dtype(dtype, weight, loss_ndim):
    """torch computes loss * weight: a floating weight promotes the result unless it is 0-d against an n-d loss."""
    if weight.dtype.is_floating_point and (weight.dim() > 0 or loss_ndim == 0):
        return torch.promote_types(dtype, weight.dtype)
    return dtype


def _check_weight(weight, input):
    if weight.size() != input.size():
        raise ValueError(f"Weights and input must have the same size: weight {tuple(weight.shape)}, input "
                         f"{tuple(input.shape)}.")


def _weighted_loss(name, dtype, input, target, weight, red, extra, mean_by_weight_sum, out_dtype=None):
    """mse_loss, l1_loss, huber_loss: promoted and broadcast operands, the weight expanded to their shape. The loss
    in out_dtype (default: dtype)."""
    op = getattr(_ops, name)
    if weight is not None:
        _check_weight(weight, input)
        dtype = _weight_dtype(dtype, weight, len(broadcast_shape(name, input=input, target=target)))
    x, t = _prepare(name, (input, target), dtype)
    w = None if weight is None else weight.to(dtype).expand(x.shape)
    # torch divides a weighted mean by the sum of the weight as given. Where the target broadcasts the input (and
    # so the weight) to a larger shape, the kernel sums the expanded weight, in which each element appears
    # `repeat` times: its mean is torch's divided by `repeat`. (A target broadcasting a non-empty input to an
    # empty shape gives torch's 0 / sum(w): the kernel's sum, divided here.)
    repeat, divide = 1, False
    if mean_by_weight_sum and red == 1 and w is not None and x.numel() != input.numel():
        divide = x.numel() == 0
        repeat = 1 if divide else x.numel() // input.numel()
    (x, t, w), shape = _fit_dims([x, t, w])
    loss = op(x, t, w, 2 if divide else red, *extra)
    if divide:
        loss = loss / weight.to(loss.dtype).sum()
    elif repeat != 1:
        loss = loss * repeat
    return _finish(loss, shape, red, out_dtype or dtype)


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


def _expand_to(tensors, dtype, shape):
    """Operands cast to `dtype` and expanded to `shape` (views: broadcast operands get stride 0); None stays."""
    return [None if t is None else t.to(dtype).expand(shape) for t in tensors]


# ---- torch.nn.functional-compatible functions ----------------------------------------------------------------------


@overridable
def mse_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    """torch.nn.functional.mse_loss: (input - target)^2, weighted mean = sum(w l) / sum(w)."""
    check_optional_tensors("mse_loss", ("weight", 6, weight))
    _warn_if_sizes_differ(input, target)
    red = reduction_code(reduction, size_average, reduce)
    # torch's weighted mse_loss is a composition, which autocast leaves alone
    direct = weight is None and autocast_reads_16bit(input, target)
    if weight is None and not direct:
        input, target = autocast_float32(input, target)
    if weight is not None and not torch.promote_types(input.dtype, target.dtype).is_floating_point:
        return _composed_loss(torch.square, input, target, weight, red)  # torch's composition takes integers
    dtype = _floating_result_type("mse_loss", input, target)
    return _weighted_loss("mse_loss", dtype, input, target, weight, red, (), True,
                          out_dtype=torch.float32 if direct else None)


@overridable
def l1_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    """torch.nn.functional.l1_loss: |input - target|, weighted mean = sum(w l) / sum(w)."""
    check_optional_tensors("l1_loss", ("weight", 6, weight))
    _warn_if_sizes_differ(input, target)
    red = reduction_code(reduction, size_average, reduce)
    direct = weight is None and autocast_reads_16bit(input, target)  # as mse_loss
    if weight is None and not direct:
        input, target = autocast_float32(input, target)
    _check_no_bool("l1_loss", input, target)
    if not torch.promote_types(input.dtype, target.dtype).is_floating_point:
        return _composed_loss(torch.abs, input, target, weight, red)
    dtype = _floating_result_type("l1_loss", input, target)
    return _weighted_loss("l1_loss", dtype, input, target, weight, red, (), True,
                          out_dtype=torch.float32 if direct else None)


def _check_no_bool(name, input, target):
    """torch's NotImplementedError for input - target with a bool operand."""
    if input.dtype == torch.bool or target.dtype == torch.bool:
        raise NotImplementedError(f"{name}: input and target: subtraction with a bool tensor is not supported, got "
                                  f"{input.dtype} and {target.dtype}")


def _composed_loss(f, input, target, weight, red):
    """l1_loss (f = abs) of integer tensors, which torch computes exactly in integers (its 'mean' raises), or of
    complex ones (|input - target| is real; autograd differentiates the complex operands), and weighted mse_loss
    (f = square) of integer ones: torch's own composition, there being nothing for a real floating kernel to do."""
    x, t = torch.broadcast_tensors(input, target)
    d = f(x - t)
    if weight is not None:
        _check_weight(weight, input)
        d = d * weight
        if red == 1:
            return torch.sum(d) / torch.sum(weight)
    return d if red == 0 else (torch.sum(d) if red == 2 else torch.mean(d))


@overridable
def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    """torch.nn.functional.smooth_l1_loss: 0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta."""
    _warn_if_sizes_differ(input, target)
    red = reduction_code(reduction, size_average, reduce)
    beta = float(beta)
    if beta == 0:  # torch's smooth_l1_loss is l1_loss there
        _check_no_bool("smooth_l1_loss", input, target)
        if not torch.promote_types(input.dtype, target.dtype).is_floating_point:  # integers, complex: as l1_loss
            return l1_loss(input, target, size_average, reduce, reduction)
    direct = not infinite(beta) and autocast_reads_16bit(input, target)  # as mse_loss
    if not direct:
        input, target = autocast_float32(input, target)
    dtype = _floating_result_type("smooth_l1_loss", input, target)
    if not beta >= 0:
        raise RuntimeError(f"smooth_l1_loss does not support negative values for beta (beta = {beta}).")
    x, t = _prepare("smooth_l1_loss", (input, target), dtype)
    if infinite(beta):  # the loss is 0; the kernels take finite betas
        return _smooth_l1_formula(x, t, red, beta)
    (x, t), shape = _fit_dims([x, t])
    return _finish(_ops.smooth_l1_loss(x, t, red, beta), shape, red, torch.float32 if direct else dtype)


@overridable
def huber_loss(input, target, reduction="mean", delta=1.0, weight=None):
    """torch.nn.functional.huber_loss: 0.5 d^2 where |d| < delta, else delta (|d| - 0.5 delta); weighted mean =
    mean(w l). The loss in the input's dtype (a weight can promote it), as torch; computed in the dtype the target
    promotes it to (torch's elementwise kernel casts only its result: a float64 target's digits count)."""
    check_optional_tensors("huber_loss", ("weight", 5, weight))
    _warn_if_sizes_differ(input, target)
    red = reduction_code(reduction)
    delta = float(delta)
    direct = weight is None and not infinite(delta) and autocast_reads_16bit(input, target)  # as mse_loss
    if not direct:
        input, target, weight = autocast_float32(input, target, weight)
    # torch's kernel writes the input's dtype: a floating result cannot be cast to an integer input, nor a complex
    # one to a real input (torch.can_cast, which Dynamo cannot trace)
    if (target.dtype.is_complex and not input.dtype.is_complex) or (
            target.dtype.is_floating_point and not (input.dtype.is_floating_point or input.dtype.is_complex)):
        raise RuntimeError(f"huber_loss: result type {torch.promote_types(input.dtype, target.dtype)} can't be cast "
                           f"to the desired output type {input.dtype} (the input's)")
    dtype = _floating_input_type("huber_loss", input)
    if not delta > 0:
        raise RuntimeError(f"huber_loss does not support non-positive values for delta (delta = {delta}).")
    compute = torch.promote_types(dtype, target.dtype) if target.is_floating_point() else dtype
    out = dtype
    if weight is not None:
        out = _weight_dtype(dtype, weight, len(torch.broadcast_shapes(input.shape, target.shape)))
    if infinite(delta):  # 0.5 d^2 everywhere; the kernels take finite deltas
        if weight is not None:
            _check_weight(weight, input)
        x, t = _prepare("huber_loss", (input, target), compute)
        w = None if weight is None else weight.expand(x.shape)
        loss = _huber_formula(x, t, w, red, delta)
        return loss if loss.dtype == out else loss.to(out)
    return _weighted_loss("huber_loss", compute, input, target, weight, red, (delta,), False,
                          out_dtype=torch.float32 if direct else out)


@overridable
def kl_div(input, target, size_average=None, reduce=None, reduction="mean", log_target=False):
    """torch.nn.functional.kl_div: target (log target - input), or exp(target) (target - input) with log_target;
    'batchmean' divides the sum by input.size(0)."""
    check_tensors("kl_div", ("input", input), ("target", target))
    legacy = size_average is not None or reduce is not None
    if legacy:
        red = reduction_code("mean", size_average, reduce)
    else:
        if reduction == "mean" and not torch.compiler.is_compiling():  # Dynamo cannot trace warnings.warn
            warnings.warn(
                "reduction: 'mean' divides the total loss by both the batch size and the support size."
                "'batchmean' divides only by the batch size, and aligns with the KL div math definition."
                "'mean' will be changed to behave the same as 'batchmean' in the next major release.",
                stacklevel=3,  # the caller, above overridable()'s wrapper
            )
        red = 2 if reduction == "batchmean" else reduction_code(reduction)
    batchmean = reduction == "batchmean"
    input, target = autocast_float32(input, target)
    if not (input.dtype.is_floating_point and target.dtype.is_floating_point):
        kind = "Complex" if input.is_complex() or target.is_complex() else "Integral"
        raise RuntimeError(f"kl_div: {kind} inputs not supported (input: {input.dtype}, target: {target.dtype}).")
    dtype = _result_type(input, target)
    x, t = _prepare("kl_div", (input, target), dtype)
    # The kernels' batchmean divides by the operands' size(0); torch's by the input's, which differs where the
    # target broadcasts the input.
    native = batchmean and not legacy and x.shape == input.shape
    (x, t), shape = _fit_dims([x, t])
    loss = _ops.kl_div(x, t, 1 if native else red, native, bool(log_target))
    if batchmean and not native and input.dim() != 0:
        loss = loss / input.size(0)
    return _finish(loss, shape, red, dtype)


@overridable
def hinge_embedding_loss(input, target, margin=1.0, size_average=None, reduce=None, reduction="mean"):
    """torch.nn.functional.hinge_embedding_loss: input where target == 1, max(0, margin - input) where target == -1,
    both summed for any other target. Computed in the input's dtype; no gradient for the target, as torch."""
    check_tensors("hinge_embedding_loss", ("input", input), ("target", target))
    red = reduction_code(reduction, size_average, reduce)
    input, target = autocast_float32(input, target)
    dtype = _floating_input_type("hinge_embedding_loss", input)
    margin = float(margin)
    # torch compares the target with 1 and -1 in its own dtype (a float64 1 + 1e-12 is no 1 for float32 input)
    x, t = _prepare("hinge_embedding_loss", (input, sign_target(target.detach(), dtype)), dtype)
    if not finite(margin):  # the kernels take finite margins
        return _hinge_formula(x, t, margin, red)
    (x, t), shape = _fit_dims([x, t])
    return _finish(_ops.hinge_embedding_loss(x, t, margin, red), shape, red, dtype)


@overridable
def margin_ranking_loss(input1, input2, target, margin=0, size_average=None, reduce=None, reduction="mean"):
    """torch.nn.functional.margin_ranking_loss: max(0, -target (input1 - input2) + margin); operands of one number
    of dims, broadcast."""
    red = reduction_code(reduction, size_average, reduce)
    if input1.dim() != input2.dim() or input1.dim() != target.dim():
        raise RuntimeError(
            f"margin_ranking_loss : All input tensors should have same dimension but got sizes: "
            f"input1: {input1.size()}, input2: {input2.size()}, target: {target.size()} "
        )
    if torch.bool in (input1.dtype, input2.dtype):
        raise NotImplementedError("margin_ranking_loss: input1 and input2: torch computes input1 - input2, a "
                                  "subtraction, which it does not support for bool")
    if target.dtype == torch.bool:
        raise NotImplementedError("margin_ranking_loss: target: torch computes -target, a negation, which it does not "
                                  "support for bool")
    if not (input1.is_floating_point() or input2.is_floating_point()) or any(
            t.is_complex() for t in (input1, input2, target)):
        # integer inputs, which torch subtracts in their dtype (wrapping), and complex operands (its error): torch's
        # own op, there being nothing for a real floating kernel to do
        return _margin_ranking_formula(input1, input2, target, float(margin), red)
    input1, input2, target = autocast_float32(input1, input2, target)
    dtype = _result_type(input1, input2, target)
    if not dtype.is_floating_point:  # torch adds the (float) margin: integer operands give the default dtype
        dtype = torch.get_default_dtype()
    if not target.is_floating_point():
        # torch negates an integer target in its own dtype, wrapping (a uint8 1 gives 255): the same multiplier
        target = -((-target).to(dtype))
    margin = float(margin)
    x1, x2, t = _prepare("margin_ranking_loss", (input1, input2, target), dtype, ("input1", "input2", "target"))
    if not finite(margin):  # the kernels take finite margins
        return _margin_ranking_formula(x1, x2, t, margin, red)
    (x1, x2, t), shape = _fit_dims([x1, x2, t])
    return _finish(_ops.margin_ranking_loss(x1, x2, t, margin, red), shape, red, dtype)


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
    x, t, w, pw = _expand_to((input, target, weight, pos_weight), kd, input.shape)
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
    dtype = _result_type(input, target)
    shape = broadcast_shape("poisson_nll_loss", input=input, target=target)
    kd = _sum_broadcast_grads_in_float32(_kernel_dtype(dtype, (input, target)), (input, target), shape)
    x, t = _expand_to((input, target), kd, shape)
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
    dtype = _result_type(input, target, var)
    shape = broadcast_shape("gaussian_nll_loss", input=input, target=target, var=var)
    kd = _sum_broadcast_grads_in_float32(_kernel_dtype(dtype, operands), operands, shape)
    x, t, v = _expand_to(operands, kd, shape)
    (x, t, v), shape = _fit_dims([x, t, v])
    return _finish(_ops.gaussian_nll_loss(x, t, v, full, eps, red), shape, red, dtype)


# ---- torch.nn modules ---------------------------------------------------------------------------------------------


class MSELoss(_tnn.MSELoss):
    """torch.nn.MSELoss."""

    def forward(self, input, target):
        return mse_loss(input, target, reduction=self.reduction)


class L1Loss(_tnn.L1Loss):
    """torch.nn.L1Loss."""

    def forward(self, input, target):
        return l1_loss(input, target, reduction=self.reduction)


class SmoothL1Loss(_tnn.SmoothL1Loss):
    """torch.nn.SmoothL1Loss."""

    def forward(self, input, target):
        return smooth_l1_loss(input, target, reduction=self.reduction, beta=self.beta)


class HuberLoss(_tnn.HuberLoss):
    """torch.nn.HuberLoss."""

    def forward(self, input, target):
        return huber_loss(input, target, reduction=self.reduction, delta=self.delta)


class KLDivLoss(_tnn.KLDivLoss):
    """torch.nn.KLDivLoss."""

    def forward(self, input, target):
        return kl_div(input, target, reduction=self.reduction, log_target=self.log_target)


class HingeEmbeddingLoss(_tnn.HingeEmbeddingLoss):
    """torch.nn.HingeEmbeddingLoss."""

    def forward(self, input, target):
        return hinge_embedding_loss(input, target, margin=self.margin, reduction=self.reduction)


class MarginRankingLoss(_tnn.MarginRankingLoss):
    """torch.nn.MarginRankingLoss."""

    def forward(self, input1, input2, target):
        return margin_ranking_loss(input1, input2, target, margin=self.margin, reduction=self.reduction)


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


FUNCTIONS = ["mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div", "hinge_embedding_loss",
             "margin_ranking_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits", "poisson_nll_loss",
             "gaussian_nll_loss"]
MODULES = ["MSELoss", "L1Loss", "SmoothL1Loss", "HuberLoss", "KLDivLoss", "HingeEmbeddingLoss", "MarginRankingLoss",
           "BCELoss", "BCEWithLogitsLoss", "PoissonNLLLoss", "GaussianNLLLoss"]
