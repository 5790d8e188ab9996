"""Helpers shared by every loss's Python side: reductions, accumulation dtypes, output casts."""

import torch
from torch.nn import _reduction as _torch_reduction

_REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


def reduction_code(reduction, size_average=None, reduce=None, legacy_names=True):
    """torch's rules: the deprecated size_average/reduce pair wins when given; 'elementwise_mean' is taken as
    'mean' (with torch's warning) where torch reads the reduction with get_enum (legacy_names)."""
    if size_average is not None or reduce is not None:
        reduction = _torch_reduction.legacy_get_string(size_average, reduce)
    if legacy_names and reduction == "elementwise_mean":  # torch's old name for 'mean', accepted with a warning
        return _torch_reduction.get_enum(reduction)
    try:
        return _REDUCTIONS[reduction]
    except (KeyError, TypeError):
        raise ValueError(f"{reduction} is not a valid value for reduction") from None


def acc_dtype(t):
    """The dtype lossfuse stores losses in: float64 for float64 inputs, float32 otherwise."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def new_loss(input, rows, reduction):
    return input.new_empty(tuple(rows) if reduction == 0 else (), dtype=acc_dtype(input))


def new_grad(like, wanted):
    if wanted:
        return torch.empty_like(like, memory_format=torch.contiguous_format)
    return like.new_empty((0,))


def to_input_dtype(loss, input):
    """Losses are computed and stored in float32 or wider; torch returns them in the input's dtype."""
    return loss if loss.dtype == input.dtype else loss.to(input.dtype)


def sum_to(grad, shape):
    """Reduces a full-shape gradient of a broadcast operand to the operand's own shape."""
    if grad is None or tuple(grad.shape) == tuple(shape):
        return grad
    return grad.sum_to_size(shape)
