"""Argument rules shared by the losses' Python side: torch's reduction names, option checks, the errors lossfuse
raises, and torch.autocast's policies for loss operands."""

import math

import typing

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


def finite(v):
    """math.isfinite(v) by comparisons, which Dynamo traces on a symbolic float (a scalar argument under
    torch.compile(dynamic=True)); math.isfinite it cannot."""
    return v == v and -math.inf < v < math.inf


def torch_label_smoothing(v):
    """label_smoothing as torch's kernels take it: they check only label_smoothing <= 1 (not failing for NaN) and
    smooth only above 0, so a negative or NaN value means none. A symbolic float (torch.compile(dynamic=True)) is
    passed on as it is."""
    if isinstance(v, torch.SymFloat):
        return v
    return v if float(v) > 0 else 0.0


def check_class_weight_dtype(name, weight, input):
    """torch's rule for class-index targets: the class weights have the logits' dtype (it raises 'expected scalar
    type Float but found Double'); under autocast 16-bit ones are cast to float32 first. Probability targets
    promote."""
    def seen(t):
        return torch.float32 if autocasts(t) else t.dtype

    if weight is not None and seen(weight) != seen(input):
        raise ArgumentError(f"lossfuse: {name}: weight: expected dtype {input.dtype} (the input's), got "
                            f"{weight.dtype}")


def sign_target(target, dtype):
    """A +-1 target as the kernels read it (they test t == 1 and t == -1 in the computation dtype): targets of that
    dtype and signed integers as they are; others (bool, uint8, another float dtype) as int8 1 / -1 / 0 from
    torch's own comparisons `target == 1` and `target == -1` in the target's dtype (a uint8 255 is -1, and a float64
    1 + 1e-12 is no 1, as in torch; cast first, it would round to 1)."""
    if target.dtype == dtype or target.dtype in (torch.int8, torch.int16, torch.int32, torch.int64):
        return target
    return (target == 1).to(torch.int8) - (target == -1).to(torch.int8)


def infinite(v):
    """math.isinf(v) by comparisons (see finite)."""
    return v == math.inf or v == -math.inf


_HALF = (torch.float16, torch.bfloat16)


def _autocast_on(t):
    """Whether torch.autocast is on for t's device (a device without autocast, such as meta, never has it on)."""
    if t.is_cpu:
        return torch.is_autocast_enabled("cpu")
    device = t.device.type
    return torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device)


def autocasts(t):
    """Whether torch.autocast's float32 policy would cast t (16-bit, autocast on for its device)."""
    return t.dtype in _HALF and _autocast_on(t)


def autocast_reads_16bit(first, *others):
    """Whether torch.autocast's float32 policy would cast every operand, all of one 16-bit dtype: a kernel that
    computes in float32 then reads them as they are (the same values as the casts') and returns its float32 loss,
    writing gradients in their dtype, with no float32 copies."""
    return first.dtype in _HALF and all(t.dtype == first.dtype for t in others) and _autocast_on(first)


def autocast_float32(first, *others):
    """torch.autocast's float32 policy, which torch applies to its loss ops: where autocast is on for the operands'
    device, float16 and bfloat16 operands are cast to float32 before the loss (float64 and integer ones stay), and the
    loss comes back in float32; the casts are differentiable, so gradients come back in the operands' dtypes. Returns
    (first, *others), None and non-tensors as given."""
    tensors = (first, *others)
    for t in tensors:  # the common case first: no 16-bit operand, nothing to ask
        if isinstance(t, torch.Tensor) and t.dtype in _HALF:
            break
    else:
        return tensors
    if not _autocast_on(t):
        return tensors
    return tuple(t.float() if isinstance(t, torch.Tensor) and t.dtype in _HALF else t for t in tensors)


def autocast_lower(first, *others):
    """torch.autocast's lower-precision policy, which torch applies to its linear: where autocast is on for the
    operands' device, floating operands but float64 ones are cast to the autocast dtype. Returns whether it was on,
    then (first, *others)."""
    if not (isinstance(first, torch.Tensor) and _autocast_on(first)):
        return False, (first, *others)
    low = torch.get_autocast_dtype(first.device.type)
    return True, tuple(t.to(low) if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64
                       else t for t in (first, *others))


def check_tensors(name, *named):
    """torch's TypeError for an operand that is not a tensor; named: (argument name, value) in position order."""
    for position, (arg, value) in enumerate(named, 1):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name}(): argument '{arg}' (position {position}) must be Tensor, not "
                            f"{type(value).__name__}")


def check_optional_tensors(name, *named):
    """check_tensors for optional operands (None allowed); named: (argument name, position, value)."""
    for arg, position, value in named:
        if value is not None and not isinstance(value, torch.Tensor):
            raise TypeError(f"{name}(): argument '{arg}' (position {position}) must be Tensor, not "
                            f"{type(value).__name__}")


class ArgumentError(ValueError, RuntimeError):
    """A bad argument (shape, size, option out of range), named in the message. torch raises RuntimeError for most
    such arguments of its losses and ValueError for some; lossfuse's are both, so code written against either
    catches them."""


def as_argument_error(error):
    return error if isinstance(error, ArgumentError) else ArgumentError(str(error))


class CeOptions(typing.NamedTuple):
    """cross_entropy's scalar options, in the order its ops take them after the tensors (cross_entropy,
    cross_entropy_backward, linear_cross_entropy): a tuple, so `*options` passes them on."""
    reduction: int
    ignore_index: int
    label_smoothing: float
    logit_scale: float
    softcap: float
    z_loss_scale: float


def broadcast_shape(fn_name, **operands):
    """The shape the operands (tensors or shapes) broadcast to, or torch's RuntimeError naming them and their
    shapes (torch's own message names only positions)."""
    shapes = {name: v.shape if isinstance(v, torch.Tensor) else torch.Size(v) for name, v in operands.items()}
    try:
        plain = _plain_broadcast(shapes.values())
        return plain if plain is not None else torch.broadcast_shapes(*shapes.values())
    except RuntimeError:
        listed = ", ".join(f"{name} {tuple(shape)}" for name, shape in shapes.items())
        raise RuntimeError(f"{fn_name}: the sizes of {listed} do not broadcast to one shape") from None


def _plain_broadcast(shapes):
    """torch.broadcast_shapes of shapes whose sizes are all plain ints (eager calls), in a few microseconds instead
    of torch's tens; None for symbolic sizes (tracing), which torch's function guards. Proven equal to torch's by
    test_api.py::test_broadcast_shape_matches_torch."""
    if not all(type(d) is int for s in shapes for d in s):
        return None
    out = [1] * max((len(s) for s in shapes), default=0)
    for s in shapes:
        for i, d in enumerate(s, len(out) - len(s)):
            if d != 1:
                if out[i] != 1 and out[i] != d:
                    raise RuntimeError("shapes do not broadcast")
                out[i] = d
    return torch.Size(out)
