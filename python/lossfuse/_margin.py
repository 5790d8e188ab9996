"""The margin and embedding losses (triplet_margin_loss, cosine_embedding_loss, multi_margin_loss,
multilabel_margin_loss, multilabel_soft_margin_loss): fake implementations, autograd, and the torch-compatible
functions and modules.

The functions do what torch does before its kernel runs -- dtype promotion, broadcasting, argument checks with
torch's exception types -- and hand the ops operands of one floating dtype, broadcast ones as expanded views (so
autograd sums their gradients back). Each op returns its loss in float32 (float64 for float64 operands); the
function casts it to the dtype torch returns.

What the kernels do not take is computed with the formulas below (torch's math, in float32 for 16-bit operands as
the kernels): non-finite margins and eps, a negative triplet norm degree, complex triplets, broadcasts over the
last dim that torch does not expand (a triplet pair or a cosine input with a last dim of 1 against a longer one, a
multilabel_soft_margin_loss input whose last dim the target broadcasts), and multilabel_soft_margin_loss weights
that broadcast beyond (C) or need a gradient.
"""

import torch
import torch.nn as _tnn

from ._args import (autocast_float32, broadcast_shape, check_class_weight_dtype, check_optional_tensors,
                    check_tensors, finite, infinite, reduction_code, sign_target)
from ._protocol import overridable
from ._register import ops, register_loss, register_loss_fakes, row_dims

_ops = ops  # torch.ops.lossfuse with the eager fast path
_log_sigmoid = torch._C._nn.log_sigmoid  # torch's own kernel, untouched by patch_torch()
_MAX_DIMS = 8  # lossfuse::kMaxDims
_KERNEL_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


# ---- the losses as differentiable torch ops ------------------------------------------------------------------------
# Each computes what the lossfuse op of the same name computes from the same operands and scalar arguments. Used
# for double backward (create_graph=True) and for the arguments the kernels do not take.


def _reduce(loss, reduction):
    if reduction == 0:
        return loss
    return loss.sum() if reduction == 2 else loss.mean()


def _hinge(z):
    """max(0, z) with gradient 0 at z == 0, as the kernels; a nan z counts as 0, as torch's `if (z > 0)`."""
    return torch.where(z > 0, z, torch.zeros_like(z))


def _triplet_formula(anchor, positive, negative, margin, p, eps, swap, reduction):
    return torch.triplet_margin_loss(anchor, positive, negative, margin, p, eps, swap, reduction)


def _cosine_formula(x1, x2, target, margin, reduction):
    return torch.cosine_embedding_loss(x1, x2, target, margin, reduction)


def _multi_margin_formula(x, target, weight, p, margin, reduction):
    """x (N, C) or (C); target (N), () or (1): sum_{j != y} w_y max(0, margin - x_y + x_j)^p / C per row."""
    rows = x.reshape(-1, x.shape[-1])
    y = target.reshape(-1).long()
    C = rows.shape[1]
    z = _hinge(margin - rows.gather(1, y.unsqueeze(1)) + rows)
    # the target's own term masked before anything multiplies it: with an infinite margin it is inf, and z * z
    # after the mask would send 0 * inf = NaN into x_y's gradient
    z = z.masked_fill(torch.arange(C, device=x.device) == y.unsqueeze(1), 0)
    if p == 2:
        z = z * z
    if weight is not None:
        z = z * weight.to(z.dtype)[y].unsqueeze(1)
    return _reduce((z.sum(1) / C).reshape(target.shape), reduction)


def _multilabel_margin_formula(x, target, reduction):
    """x, target (..., C): sum over the row's labels j (target entries before the first -1, repeats counted) and
    the non-labels i of max(0, 1 - x_j + x_i), divided by C."""
    C = x.shape[-1]
    t = target.long()
    listed = (t == -1).long().cumsum(-1) == 0
    counts = torch.zeros_like(x).scatter_add(-1, torch.where(listed, t, 0), listed.to(x.dtype))
    z = _hinge(1 - x.unsqueeze(-1) + x.unsqueeze(-2))  # [..., j, i]
    z = z * (counts == 0).to(x.dtype).unsqueeze(-2)
    return _reduce((counts.unsqueeze(-1) * z).sum((-2, -1)) / C, reduction)


def _multilabel_soft_margin_formula(x, target, weight, reduction):
    """torch.nn.functional.multilabel_soft_margin_loss's own formula (the class dim is the input's last)."""
    loss = -(target * _log_sigmoid(x) + (1 - target) * _log_sigmoid(-x))
    if weight is not None:
        loss = loss * weight
    class_dim = x.dim() - 1
    return _reduce(loss.sum(dim=class_dim) / x.size(class_dim), reduction)


# ---- fake (meta) implementations: shapes and dtypes only, for torch.compile and FakeTensor tracing ----------------


for _name in ("triplet_margin_loss", "cosine_embedding_loss", "multilabel_margin_loss", "multilabel_soft_margin_loss"):
    register_loss_fakes(_name, row_dims)
register_loss_fakes("multi_margin_loss", lambda input, target, *args: target.shape)


# ---- autograd ------------------------------------------------------------------------------------------------------


# (name, torch composition, tensors, of which the first ones take gradients)
register_loss("triplet_margin_loss", _triplet_formula, 3, 3)
register_loss("cosine_embedding_loss", _cosine_formula, 3, 2)
register_loss("multi_margin_loss", _multi_margin_formula, 3, 1)  # (input, target, weight)
register_loss("multilabel_margin_loss", _multilabel_margin_formula, 2, 1)
register_loss("multilabel_soft_margin_loss", _multilabel_soft_margin_formula, 3, 2)


# ---- argument handling shared by the functions -----------------------------------------------------------------


def _floating(dtype):
    """The dtype torch's float arithmetic (adding eps, dividing) turns `dtype` into."""
    return dtype if dtype.is_floating_point or dtype.is_complex else torch.get_default_dtype()


def _by_formula(formula, tensors, args, dtype):
    """formula(*tensors, *args) in the dtype the kernels would compute in (float32 for 16-bit operands, as they do),
    cast to `dtype`; operands of other dtypes (complex) as torch computes them."""
    if dtype not in _KERNEL_DTYPES:
        return formula(*tensors, *args)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    loss = formula(*[t.to(acc) if t is not None and t.is_floating_point() else t for t in tensors], *args)
    return loss if loss.dtype == dtype else loss.to(dtype)


def _fit_rows(tensors):
    """Operands (..., D) with more dims than the kernels take, reshaped to (rows, D). Returns them and the row
    shape to give the loss back (None when kept)."""
    shape = tensors[0].shape
    if len(shape) <= _MAX_DIMS:
        return tensors, None
    return [t.reshape(-1, shape[-1]) for t in tensors], shape[:-1]


def _finish(loss, rows, reduction, dtype):
    """The op's loss in torch's shape and dtype."""
    if rows is not None and reduction == 0:
        loss = loss.reshape(rows)
    return loss if loss.dtype == dtype else loss.to(dtype)


def _category(dtype):
    return 3 if dtype.is_complex else 2 if dtype.is_floating_point else 0 if dtype == torch.bool else 1


def _result_type(a, b):
    """torch.result_type(a, b) for two tensors, in a form Dynamo traces: a 0-d tensor against an n-d one promotes
    the result only when its category (bool < integer < floating < complex) is higher."""
    if (a.dim() == 0) == (b.dim() == 0):
        return torch.promote_types(a.dtype, b.dtype)
    dimensioned, scalar = (a, b) if b.dim() == 0 else (b, a)
    if _category(scalar.dtype) > _category(dimensioned.dtype):
        return torch.promote_types(dimensioned.dtype, scalar.dtype)
    return dimensioned.dtype


def _check_floating_input(name, input):
    if not input.dtype.is_floating_point:
        raise NotImplementedError(f"{name}: input: expected a floating dtype, got {input.dtype}")


def _check_class_input(name, input):
    """torch's shape rule for multi_margin_loss and multilabel_margin_loss: (N, C) or (C) with C > 0, or 0-d."""
    if not ((input.dim() == 2 and input.size(1) != 0) or (input.dim() == 1 and input.size(0) != 0)
            or input.dim() == 0):
        raise RuntimeError(f"{name}: input: expected a non-empty vector or matrix with optional 0-dim batch size "
                           f"(shape (N, C) or (C) with C > 0), got shape {tuple(input.shape)}")


# ---- torch.nn.functional-compatible functions ----------------------------------------------------------------------


@overridable
def triplet_margin_loss(anchor, positive, negative, margin=1.0, p=2, eps=1e-6, swap=False, size_average=None,
                        reduce=None, reduction="mean"):
    """torch.nn.functional.triplet_margin_loss: max(0, margin + d(a, p) - d(a, n)) per row of the last dim, with
    d(x, y) = ||x - y + eps||_p (swap: d(a, n) <- min(d(a, n), d(p, n))). Operands of one number of dims,
    broadcast; a 0-d or 1-d operand is one row."""
    check_tensors("triplet_margin_loss", ("anchor", anchor), ("positive", positive), ("negative", negative))
    red = reduction_code(reduction, size_average, reduce)
    anchor, positive, negative = autocast_float32(anchor, positive, negative)
    margin, p, eps, swap = float(margin), float(p), float(eps), bool(swap)
    if margin <= 0:
        raise ValueError(f"triplet_margin_loss: margin must be greater than 0, got {margin}")
    operands = (anchor, positive, negative)
    if not anchor.dim() == positive.dim() == negative.dim():
        raise RuntimeError(
            "triplet_margin_loss: anchor, positive and negative: expected the same number of dimensions, got "
            f"anchor {anchor.dim()}D, positive {positive.dim()}D and negative {negative.dim()}D inputs")
    # torch forms each distance from its own pair (x - y + eps, then a norm): a pair of integer operands gives
    # the default float dtype, and the loss promotes the distances' dtypes.
    pairs = [(anchor, positive), (anchor, negative)] + ([(positive, negative)] if swap else [])
    dtype = None
    for x, y in pairs:
        if x.dtype == torch.bool and y.dtype == torch.bool:
            raise NotImplementedError(
                "triplet_margin_loss: anchor, positive and negative: the distance of two bool tensors needs a "
                "subtraction, which torch does not support for bool")
        d = _floating(torch.promote_types(x.dtype, y.dtype))
        dtype = d if dtype is None else torch.promote_types(dtype, d)
    shape = broadcast_shape("triplet_margin_loss", anchor=anchor, positive=positive, negative=negative)
    a, pos, neg = [t.to(dtype).expand(shape) for t in operands]
    # torch takes each distance over its own pair's last dim: where both operands of a pair have a last dim of 1
    # and the third a longer one, that pair's distance is over one element, not over the expanded copies.
    D = a.shape[-1] if a.dim() else 1
    short = [t.dim() > 0 and t.shape[-1] != D for t in operands]
    pairwise_last_dim = (short[0] and (short[1] or short[2])) or (swap and short[1] and short[2])
    if (dtype not in _KERNEL_DTYPES or pairwise_last_dim
            or not (p >= 0 and finite(margin) and finite(eps))):
        operands = [t.to(dtype) for t in operands] if pairwise_last_dim else (a, pos, neg)
        return _by_formula(_triplet_formula, operands, (margin, p, eps, swap, red), dtype)
    if infinite(p) and D == 0:
        raise RuntimeError("triplet_margin_loss: p: the infinity norm of an empty last dim (D = 0) is undefined; "
                           "torch's linalg.vector_norm raises here too")
    if a.dim() == 0:  # one row of one element
        a, pos, neg = a.reshape(1), pos.reshape(1), neg.reshape(1)
    (a, pos, neg), rows = _fit_rows([a, pos, neg])
    return _finish(_ops.triplet_margin_loss(a, pos, neg, margin, p, eps, swap, red), rows, red, dtype)


@overridable
def cosine_embedding_loss(input1, input2, target, margin=0, size_average=None, reduce=None, reduction="mean"):
    """torch.nn.functional.cosine_embedding_loss: 1 - cos(x1, x2) where target == 1, max(0, cos - margin) where
    target == -1, 0 elsewhere; (N, D) inputs with a (N) target or (D) inputs with a 0-d one, broadcast. No gradient
    for the target, as torch."""
    check_tensors("cosine_embedding_loss", ("input1", input1), ("input2", input2), ("target", target))
    red = reduction_code(reduction, size_average, reduce)
    input1, input2, target = autocast_float32(input1, input2, target)
    margin = float(margin)
    tdim = target.dim()
    if tdim > 1:
        raise RuntimeError(f"cosine_embedding_loss: target: expected a 0-d or 1-d tensor (multi-target not "
                           f"supported), got shape {tuple(target.shape)}")
    if input1.dim() != tdim + 1 or input2.dim() != tdim + 1:
        raise RuntimeError(
            f"cosine_embedding_loss: input1 and input2: a {tdim}-d target expects {tdim + 1}-d inputs, got shapes "
            f"{tuple(input1.shape)} and {tuple(input2.shape)}")
    dtype = _floating(torch.promote_types(input1.dtype, input2.dtype))
    # torch broadcasts x1 with x2, then the per-row result with the target.
    rows = broadcast_shape("cosine_embedding_loss", **{"input1's rows": input1.shape[:-1],
                                                       "input2's rows": input2.shape[:-1], "target": target})
    shape = rows + broadcast_shape("cosine_embedding_loss", **{"input1's features": input1.shape[-1:],
                                                               "input2's features": input2.shape[-1:]})
    t = sign_target(target.detach(), dtype).expand(rows)
    # torch sums each squared norm over its own input's last dim: where x1's and x2's last dims differ (one is 1),
    # expanding it would count that input's norm repeatedly.
    if dtype not in _KERNEL_DTYPES or not finite(margin) or input1.shape[-1:] != input2.shape[-1:]:
        return _by_formula(_cosine_formula, (input1.to(dtype), input2.to(dtype), t), (margin, red), dtype)
    x1, x2 = input1.to(dtype).expand(shape), input2.to(dtype).expand(shape)
    return _finish(_ops.cosine_embedding_loss(x1, x2, t, margin, red), None, red, dtype)


@overridable
def multi_margin_loss(input, target, p=1, margin=1.0, weight=None, size_average=None, reduce=None,
                      reduction="mean"):
    """torch.nn.functional.multi_margin_loss: sum_{j != y} w_y max(0, margin - x_y + x_j)^p / C per sample, for
    (N, C) or (C) inputs. Also for float16/bfloat16 inputs (torch: float32/float64 only) and targets of any integer
    dtype (torch: int64); the weight has the input's dtype, as in torch."""
    check_optional_tensors("multi_margin_loss", ("weight", 5, weight))
    check_tensors("multi_margin_loss", ("input", input), ("target", target))
    red = reduction_code(reduction, size_average, reduce)
    check_class_weight_dtype("multi_margin_loss", weight, input)
    input, weight = autocast_float32(input, weight)
    if p != 1 and p != 2:
        raise ValueError(f"multi_margin_loss: p: only p == 1 and p == 2 supported, got {p}")
    if weight is not None and weight.dim() != 1:
        raise ValueError(f"multi_margin_loss: weight must be one-dimensional, got shape {tuple(weight.shape)}")
    _check_class_input("multi_margin_loss", input)
    samples = input.size(0) if input.dim() == 2 else 1
    classes = input.size(-1) if input.dim() else 1
    if not (target.dim() <= 1 and target.numel() == samples):
        raise RuntimeError(f"multi_margin_loss: target: expected one class index per sample ({samples}), shape "
                           f"({samples},) or () for one sample, got shape {tuple(target.shape)}")
    if weight is not None and weight.numel() != classes:
        raise RuntimeError(f"multi_margin_loss: weight: expected {classes} elements (one per class), got shape "
                           f"{tuple(weight.shape)}")
    _check_floating_input("multi_margin_loss", input)
    if weight is not None and weight.requires_grad and torch.is_grad_enabled():
        raise RuntimeError("multi_margin_loss: weight: the loss is not differentiable with respect to the weight "
                           "(as in torch); this input cannot have requires_grad=True")
    x = input.reshape(1) if input.dim() == 0 else input
    t = target.reshape(samples) if input.dim() == 2 else target  # a 0-d target of a (1, C) input
    w = None if weight is None else weight.detach()
    if not finite(float(margin)):
        loss = _by_formula(_multi_margin_formula, (x, t, w), (int(p), float(margin), red), input.dtype)
    else:
        loss = _ops.multi_margin_loss(x, t, w, int(p), float(margin), red)
    if red == 0 and loss.shape != target.shape:
        loss = loss.reshape(target.shape)
    return _finish(loss, None, red, input.dtype)


@overridable
def multilabel_margin_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """torch.nn.functional.multilabel_margin_loss: per row, the labels are the target entries before the first -1;
    sum over labels j and non-labels i of max(0, 1 - x_j + x_i) / C. (N, C) or (C) inputs; also float16/bfloat16
    (torch: float32/float64 only) and targets of any integer dtype (torch: int64)."""
    check_tensors("multilabel_margin_loss", ("input", input), ("target", target))
    red = reduction_code(reduction, size_average, reduce)
    (input,) = autocast_float32(input)
    _check_class_input("multilabel_margin_loss", input)
    if input.dim() <= 1:
        ok = target.dim() <= 1 and target.numel() == (input.numel())
    else:
        ok = target.shape == input.shape
    if not ok:
        raise RuntimeError(f"multilabel_margin_loss: target: expected the input's shape {tuple(input.shape)}, got "
                           f"shape {tuple(target.shape)}")
    _check_floating_input("multilabel_margin_loss", input)
    x = input.reshape(1) if input.dim() == 0 else input
    return _finish(_ops.multilabel_margin_loss(x, target.reshape(x.shape), red), None, red, input.dtype)


@overridable
def multilabel_soft_margin_loss(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    """torch.nn.functional.multilabel_soft_margin_loss: -(1/C) sum_c w_c [y log sigmoid(x) + (1 - y) log
    sigmoid(-x)] per row of the last dim; the target broadcasts with the input and is differentiated too, as
    torch."""
    check_optional_tensors("multilabel_soft_margin_loss", ("weight", 3, weight))
    check_tensors("multilabel_soft_margin_loss", ("input", input), ("target", target))
    red = reduction_code(reduction, size_average, reduce)
    _check_floating_input("multilabel_soft_margin_loss", input)
    if target.dtype == torch.bool:
        raise NotImplementedError("multilabel_soft_margin_loss: target: torch computes 1 - target, a subtraction "
                                  "it does not support for a bool tensor; pass a float target")
    shape = broadcast_shape("multilabel_soft_margin_loss", input=input, target=target)
    if input.dim() == 0:
        raise IndexError("multilabel_soft_margin_loss: input: expected at least one dim (the classes, the last "
                         "dim), got a 0-d tensor")
    dtype = _result_type(input, target)
    if weight is not None and weight.dim() > 0:  # a 0-d weight does not promote the (n-d) loss
        dtype = torch.promote_types(dtype, weight.dtype)
    # torch sums the loss over the input's last dim and divides by its size: the kernels' sum and C only where
    # that is the broadcast shape's last dim, of the same size.
    fits = (len(shape) == input.dim() and shape[-1] == input.shape[-1]
            and (weight is None or (weight.dim() <= 1 and broadcast_shape("multilabel_soft_margin_loss", **{
                "input and target": shape, "weight": weight}) == shape
                                    and not (weight.requires_grad and torch.is_grad_enabled()))))
    if dtype not in _KERNEL_DTYPES or not fits:
        return _by_formula(_multilabel_soft_margin_formula, (input.to(dtype), target.to(dtype), weight), (red,), dtype)
    x, t = torch.broadcast_tensors(input.to(dtype), target.to(dtype))
    w = None if weight is None else weight.to(dtype).expand(shape[-1:])
    (x, t), rows = _fit_rows([x, t])
    return _finish(_ops.multilabel_soft_margin_loss(x, t, w, red), rows, red, dtype)


# ---- torch.nn modules ---------------------------------------------------------------------------------------------


class TripletMarginLoss(_tnn.TripletMarginLoss):
    """torch.nn.TripletMarginLoss."""

    def forward(self, anchor, positive, negative):
        return triplet_margin_loss(anchor, positive, negative, margin=self.margin, p=self.p, eps=self.eps,
                                   swap=self.swap, reduction=self.reduction)


class CosineEmbeddingLoss(_tnn.CosineEmbeddingLoss):
    """torch.nn.CosineEmbeddingLoss."""

    def forward(self, input1, input2, target):
        return cosine_embedding_loss(input1, input2, target, margin=self.margin, reduction=self.reduction)


class MultiMarginLoss(_tnn.MultiMarginLoss):
    """torch.nn.MultiMarginLoss."""

    def forward(self, input, target):
        return multi_margin_loss(input, target, p=self.p, margin=self.margin, weight=self.weight,
                                 reduction=self.reduction)


class MultiLabelMarginLoss(_tnn.MultiLabelMarginLoss):
    """torch.nn.MultiLabelMarginLoss."""

    def forward(self, input, target):
        return multilabel_margin_loss(input, target, reduction=self.reduction)


class MultiLabelSoftMarginLoss(_tnn.MultiLabelSoftMarginLoss):
    """torch.nn.MultiLabelSoftMarginLoss."""

    def forward(self, input, target):
        return multilabel_soft_margin_loss(input, target, weight=self.weight, reduction=self.reduction)


FUNCTIONS = ["triplet_margin_loss", "cosine_embedding_loss", "multi_margin_loss", "multilabel_margin_loss",
             "multilabel_soft_margin_loss"]
MODULES = ["TripletMarginLoss", "CosineEmbeddingLoss", "MultiMarginLoss", "MultiLabelMarginLoss",
           "MultiLabelSoftMarginLoss"]
