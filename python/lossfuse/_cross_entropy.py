"""cross_entropy and nll_loss: fake implementations, autograd, and the torch-compatible functions."""

import math

import torch
import torch.nn as _tnn

from ._args import (ArgumentError, CeOptions, as_argument_error, autocast_float32, autocasts, check_class_weight_dtype,
                    check_optional_tensors, check_tensors, reduction_code, torch_label_smoothing)
from ._cuda import cuda_check
from ._func import differentiable_grads, graph_needed
from ._outputs import acc_dtype, class_target_mean, in_acc_dtype, lse_dtype, new_grad, new_loss
from ._protocol import overridable
from ._register import ops, register_autograd, register_loss_fakes
from ._roads import _plain_eager, compiled_autograd_on, forward_ad_active, is_eager

_ops = ops  # torch.ops.lossfuse with the eager fast path
_cross_entropy_eager = torch.ops.lossfuse._cross_entropy_eager.default
_cross_entropy_eager_inplace = torch.ops.lossfuse._cross_entropy_eager_inplace.default
_MAX_DIMS = 8  # lossfuse::kMaxDims
# torch's own functions, captured before patch_torch() can replace them: the double-backward path uses them.
_torch_cross_entropy = torch.nn.functional.cross_entropy
_torch_nll_loss = torch.nn.functional.nll_loss


def _rows(input):
    shape = list(input.shape)
    if shape:
        del shape[1 if len(shape) >= 2 else 0]
    return shape


# ---- fake (meta) implementations: shapes and dtypes only, for torch.compile and FakeTensor tracing ----------


@torch.library.register_fake("lossfuse::cross_entropy")
def _ce_fake(input, target, weight, reduction, ignore_index, label_smoothing, logit_scale, softcap, z_loss_scale,
             compute_grad):
    rows = _rows(input)
    return (new_loss(input, rows, reduction), input.new_empty(rows, dtype=lse_dtype(input)),
            new_loss(input, rows, reduction), new_grad(input, compute_grad))


@torch.library.register_fake("lossfuse::cross_entropy_backward")
def _ce_bwd_fake(grad_output, input, target, lse, weight, reduction, ignore_index, label_smoothing, logit_scale,
                 softcap, z_loss_scale):
    return new_grad(input, True)


@torch.library.register_fake("lossfuse::_cross_entropy_scale_held_")
def _scale_held_fake(grad, grad_output, target, reduction, ignore_index):
    return None


@torch.library.register_fake("lossfuse::_cross_entropy_backward_held_")
def _backward_held_fake(grad, grad_output, input, target, lse, weight, *args):
    return None


register_loss_fakes("nll_loss", lambda input, *args: _rows(input))


# ---- autograd ------------------------------------------------------------------------------------------------


def _ce_setup(ctx, inputs, output):
    input, target, weight, reduction, ignore_index, label_smoothing, logit_scale, softcap, z_loss_scale, \
        compute_grad = inputs
    loss, lse, z_loss, grad = output
    ctx.mark_non_differentiable(lse, z_loss, grad)
    # Outputs that get no gradient (lse, z_loss, the N x V gradient buffer) must not be filled with zeros for
    # backward: that would cost an N x V allocation and write per step.
    ctx.set_materialize_grads(False)
    ctx.args = CeOptions(reduction, ignore_index, label_smoothing, logit_scale, softcap, z_loss_scale)
    ctx.compute_grad = compute_grad
    ctx.eager_grad = None
    if compute_grad and reduction != 0 and is_eager(grad):
        # Scaled in place by the first backward (_cross_entropy_scale_held_) and handed over, so kept outside
        # save_for_backward's version check; [None] once handed over.
        ctx.eager_grad = [grad]
        grad = None
    ctx.save_for_backward(input, target, weight, lse, grad if compute_grad else None)


def _soft_target_grad(input, target, weight, lse, grad_output, o):
    """d loss / d target for probability targets: (1 - eps) w_c (lse - z_c) per row, times the upstream grad.
    o: CeOptions."""
    reduction, label_smoothing, logit_scale, softcap = o.reduction, o.label_smoothing, o.logit_scale, o.softcap
    cdim = 1 if input.dim() >= 2 else 0
    acc = acc_dtype(input)
    z = input.to(acc) * logit_scale
    if softcap > 0:
        z = softcap * torch.tanh(z / softcap)
    # lse - z as (hi - z) + lo, hi + lo the saved lse (float64, lse_dtype): precise at any common offset
    hi = lse.to(acc)
    g = hi.unsqueeze(cdim) - z
    if lse.dtype != acc:
        g = g + (lse - hi.to(lse.dtype)).to(acc).unsqueeze(cdim)
    g = g * (1.0 - label_smoothing)
    if weight is not None:
        shape = [1] * input.dim()
        shape[cdim] = -1
        g = g * weight.to(g.dtype).view(shape)
    if reduction == 1:
        rows = input.numel() // max(input.shape[cdim], 1) if input.numel() else 0
        g = g / rows
    go = grad_output.to(g.dtype)
    g = g * (go.unsqueeze(cdim) if reduction == 0 else go)
    return g.to(target.dtype)


def _ce_differentiable(input, target, weight, o):
    """The loss as a composition of differentiable torch ops (for create_graph=True backward passes); o: CeOptions."""
    reduction, ignore_index, label_smoothing, logit_scale, softcap, z_loss_scale = o
    cdim = 1 if input.dim() >= 2 else 0
    z = input * logit_scale
    if softcap > 0:
        z = softcap * torch.tanh(z / softcap)
    soft = target.is_floating_point()
    t = target if soft else target.long()
    loss = _torch_cross_entropy(z, t, weight, ignore_index=ignore_index, reduction="none",
                                label_smoothing=label_smoothing)
    if z_loss_scale:
        zl = z_loss_scale * torch.logsumexp(z, cdim) ** 2
        loss = loss + (zl if soft else torch.where(t == ignore_index, torch.zeros_like(zl), zl))
    if reduction == 0:
        return loss
    if reduction == 2 or soft:
        return loss.sum() if reduction == 2 else loss.mean()
    return class_target_mean(loss, z, t, weight, ignore_index, label_smoothing, bool(label_smoothing or z_loss_scale))


def _held_grad(ctx, input, target, weight):
    """The gradient the forward held (for an upstream gradient of 1), handed over once: the caller owns it from now
    on (it may land in .grad and change there). A retained graph's next backward gets a new one from the same forward
    kernel, the same to the bit as the first (backward is reentrant, as gradcheck checks)."""
    grad = ctx.eager_grad[0]
    if grad is None:
        with cuda_check("nan"):  # targets the first forward checked (the backward ops' rule: BackwardChecks)
            return torch.ops.lossfuse.cross_entropy(input, target, weight, *ctx.args, True)[3]
    ctx.eager_grad = [None]
    return grad


def _ce_backward(ctx, grad_loss, grad_lse, grad_z_loss, grad_grad):
    input, target, weight, lse, grad = ctx.saved_tensors
    grad_input = grad_target = None
    if grad_loss is None:  # only the non-differentiable outputs were used
        return grad_input, grad_target, None, None, None, None, None, None, None, None
    wanted = [ctx.needs_input_grad[0], ctx.needs_input_grad[1] and target.is_floating_point()]
    if graph_needed(grad_loss, [input, target], wanted):  # a double backward may follow
        grad_input, grad_target = differentiable_grads(
            lambda x, t: _ce_differentiable(x, t, weight, ctx.args), [input, target], wanted, grad_loss)
        return grad_input, grad_target, None, None, None, None, None, None, None, None
    if ctx.needs_input_grad[0]:
        if ctx.eager_grad is not None:
            grad = _held_grad(ctx, input, target, weight)
            if getattr(ctx, "float32_loss", False):
                # the forward's 16-bit gradient of a float32 loss (autocast), scaled and rounded again, would be off
                # the once-rounded value by an ulp where torch's is not: made again from the saved lse, scaled before
                # rounding, unless the upstream value is 1 (read on the device: nothing is read back)
                _ops._cross_entropy_backward_held_(grad, grad_loss, input, target, lse, weight, *ctx.args)
            else:
                # scaled on its device, nothing read back; the ignored rows keep theirs whatever the upstream gradient
                _ops._cross_entropy_scale_held_(grad, grad_loss, target, ctx.args.reduction, ctx.args.ignore_index)
            grad_input = grad
        elif ctx.compute_grad and getattr(ctx, "float32_loss", False):
            grad_input = _ops.cross_entropy_backward(grad_loss, input, target, lse, weight, *ctx.args)
        elif ctx.compute_grad:  # computed with an upstream gradient of 1 (per row for reduction 'none')
            cdim = 1 if input.dim() >= 2 else 0
            go = grad_loss.unsqueeze(cdim) if ctx.args.reduction == 0 and grad_loss.dim() else grad_loss
            grad_input = (grad * go).to(grad.dtype)
            if not target.is_floating_point():
                # the ignored rows keep the forward's values (0, NaN for a NaN row), as torch's do, whatever the
                # upstream gradient: scaled by NaN or inf, their zeros would turn NaN. No value is read (this road
                # is the traced one); under torch.compile the select fuses into the multiply. Compared in int64: a
                # uint8 target would wrap ignore_index -100 to 156.
                grad_input = torch.where((target.long() != ctx.args.ignore_index).unsqueeze(cdim), grad_input, grad)
        else:
            grad_input = _ops.cross_entropy_backward(grad_loss, input, target, lse, weight, *ctx.args)
    if ctx.needs_input_grad[1] and target.is_floating_point():
        grad_target = _soft_target_grad(input, target, weight, lse, grad_loss, ctx.args)
    return grad_input, grad_target, None, None, None, None, None, None, None, None


_Tensor = torch.Tensor
_TRAINING_REDUCTIONS = {"mean": 1, "sum": 2}


def _training_step_eager(input, target):
    """For plain tensors with 2-D logits requiring grad and 1-D targets: whether cross_entropy's call takes the eager
    C++ node as it would through the checks of the general road (floating logits, class-index targets, grad mode on,
    autocast not casting the logits, nothing tracing: _eager_state's conditions, no forward-mode AD, no compiled
    autograd)."""
    return (input.is_floating_point() and not target.is_floating_point() and torch.is_grad_enabled()
            and not autocasts(input) and not torch.compiler.is_compiling()
            and not torch._C._is_torch_function_mode_enabled() and torch._C._len_torch_dispatch_stack() == 0
            and not torch._C._are_functorch_transforms_active() and torch._C._get_tracing_state() is None
            and not forward_ad_active() and not compiled_autograd_on())


register_autograd("cross_entropy", _ce_backward, _ce_setup,
                  lambda input, target, weight, *args: _ce_differentiable(*in_acc_dtype([input, target, weight]),
                                                                          CeOptions(*args[:6])),
                  # class weights carry tangents for probability targets only, as in torch
                  outputs=4, differentiable=lambda args: (0, 1, 2) if args[1].is_floating_point() else (0,))


def _nll_setup(ctx, inputs, output):
    input, target, weight, reduction, ignore_index = inputs
    ctx.args = (reduction, ignore_index)
    ctx.save_for_backward(input, target, weight)


def _nll_backward(ctx, grad_loss):
    input, target, weight = ctx.saved_tensors
    grad_input = None
    if graph_needed(grad_loss, [input], [True]):  # a double backward may follow
        reduction, ignore_index = ctx.args
        name = ("none", "mean", "sum")[reduction]
        grad_input, = differentiable_grads(
            lambda x: _torch_nll_loss(x, target.long(), weight, ignore_index=ignore_index, reduction=name), [input],
            [True], grad_loss)
    elif ctx.needs_input_grad[0]:
        grad_input = _ops.nll_loss_backward(grad_loss, input, target, weight, *ctx.args)
    return grad_input, None, None, None, None


def _nll_composition(input, target, weight, reduction, ignore_index):
    input, weight = in_acc_dtype([input, weight])
    return _torch_nll_loss(input, target.long(), weight, ignore_index=ignore_index,
                           reduction=("none", "mean", "sum")[reduction])


register_autograd("nll_loss", _nll_backward, _nll_setup, _nll_composition, differentiable=(0,))


# ---- torch.nn.functional-compatible functions ----------------------------------------------------------------


@overridable
def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
                  label_smoothing=0.0, *, softcap=0.0, z_loss_scale=0.0, logit_scale=1.0, return_lse=False,
                  return_z_loss=False, inplace=False):
    """torch.nn.functional.cross_entropy, with lossfuse's extras (keyword-only):

    softcap: z = softcap * tanh(logit_scale * x / softcap) replaces the logits (0: off).
    z_loss_scale: adds z_loss_scale * lse^2 per row, reduced like the loss.
    logit_scale: multiplies the logits first.
    return_lse: also return the per-row log-sum-exp (float32, float64 for float64 input; no gradient).
    return_z_loss: also return the z-loss term alone (reduced like the loss; no gradient).
    inplace: when the logits need a gradient, write it over the logits instead of into a buffer of its own (no
        N x V memory beyond the logits). Afterwards the logits hold their gradient: do not read them. Needs
        reduction 'mean' or 'sum' and logits that are not a leaf requiring grad (as any in-place op) and whose
        elements do not share memory. The logits' version counter is bumped, so an autograd node that saved them
        raises torch's in-place error instead of reading the gradient, and backward raises if the logits changed
        after the call (the counter is shared by every view of a tensor: two in-place calls on views of one tensor
        raise, as torch's own checks do; give each call logits of its own). The gradient can be handed over once:
        a second backward through a retained graph, or create_graph=True, raises. Honoured for class-index
        targets in plain eager mode (a torch function mode sees the call and runs it so); under torch.compile,
        torch.func, compiled autograd, autocast's float32 loss of 16-bit logits, or with probability targets the
        gradient gets a buffer of its own.
    Targets may be class indices of any integer dtype (uint8 .. int64), read without conversion.
    Precision: the loss and the gradient keep the precision of the logits' differences whatever their common offset
    (as torch's log_softmax). A gradient made in backward from the saved lse (reduction 'none', and the rarer roads
    that remake it: a non-finite upstream gradient, autocast's float32 loss under an upstream gradient other than 1,
    vmap) reads the lse saved in float64 (max + log-sum summed in double), so each probability carries a relative
    error up to 1.1e-16 |lse| beside its own rounding: below float32's for |lse| < 5e8.

    When the logits need a gradient and the reduction is 'mean' or 'sum', the gradient is written during the
    forward pass (one read of the logits for the whole training step) and kept until backward.
    """
    label_smoothing = torch_label_smoothing(label_smoothing)
    red = _TRAINING_REDUCTIONS.get(reduction) if type(reduction) is str else None
    if (red is not None and not inplace and type(input) is _Tensor and type(target) is _Tensor and weight is None
            and size_average is None and reduce is None and not return_lse and not return_z_loss
            and type(ignore_index) is int and input.requires_grad and input.dim() == 2 and target.dim() == 1
            and _training_step_eager(input, target)):
        # the training step's common call: the road below's conditions in fewer Python operations (each costs cache
        # misses when the step's other work has evicted this code), to the same op with the same arguments
        scalars = float(label_smoothing), float(logit_scale), float(softcap), float(z_loss_scale)
        try:
            return _cross_entropy_eager(input, target, None, red, ignore_index, *scalars)[0]
        except ValueError as e:
            if input.shape[1] != 0:  # logits of no class take the road below (_no_class)
                raise as_argument_error(e) from None
    check_optional_tensors("cross_entropy_loss", ("weight", 3, weight))
    red = reduction_code(reduction, size_average, reduce)
    input, target = _check_tensors("cross_entropy_loss", input, target)
    soft = target.is_floating_point()
    if not soft:
        check_class_weight_dtype("cross_entropy_loss", weight, input)
    loss_dtype = _autocast_class_target_logits(input, soft)
    if loss_dtype is None:
        input, target, weight = autocast_float32(input, target, weight)
    else:
        (weight,) = autocast_float32(weight)
    if soft and input.is_floating_point() and target.dtype != input.dtype:
        # probabilities of another floating dtype: torch computes in the promoted dtype (and returns it)
        dtype = torch.promote_types(input.dtype, target.dtype)
        input, target = input.to(dtype), target.to(dtype)
    loss_dtype = loss_dtype or input.dtype
    if soft and weight is not None and weight.is_floating_point():
        # torch's probability-target loss is -(log_softmax(x) * p * w).sum(): the class weights promote it too
        loss_dtype = torch.promote_types(loss_dtype, weight.dtype)
    if inplace and red == 0 and input.requires_grad and torch.is_grad_enabled():
        raise ArgumentError("lossfuse: cross_entropy_loss: inplace: expected reduction 'mean' or 'sum' (the gradient "
                            "is written in the forward pass, before a per-row upstream gradient exists), got 'none'")
    if input.shape[1 if input.dim() >= 2 else 0] == 0:
        loss, lse, z_loss = _no_class("cross_entropy_loss", input, target, weight, red, ignore_index, soft,
                                      label_smoothing, z_loss_scale)
        return _ce_outputs(loss, lse, z_loss, loss_dtype, return_lse, return_z_loss, acc_dtype(input))
    args = (red, int(ignore_index), float(label_smoothing), float(logit_scale), float(softcap), float(z_loss_scale))
    fitted, fitted_target, restore = _fit_class_dims(input, target, soft, same_shape_is_soft=True)
    if _weight_needs_grad("cross_entropy", weight, soft):
        # torch differentiates the class weights of probability targets; so does its composition, used here
        with torch.no_grad():
            _, lse, z_loss, _ = _ops.cross_entropy(fitted, fitted_target, weight, *args, False)
        if restore is not None:
            lse, z_loss = restore(lse), restore(z_loss)
        loss = _ce_differentiable(input, target, weight, args)
        return _ce_outputs(loss, lse, z_loss, loss_dtype, return_lse, return_z_loss, acc_dtype(input))
    input, target = fitted, fitted_target
    compute_grad = (red != 0 and input.requires_grad and torch.is_grad_enabled())
    args = (input, target, weight) + args
    if (compute_grad and not soft and loss_dtype == input.dtype and _plain_eager(args) and not forward_ad_active()
            and not compiled_autograd_on()):
        # a training step in plain eager mode: the autograd node is C++ (see _cross_entropy_eager in
        # csrc/cross_entropy_ops.cpp), same kernel and same gradient as the registered op's; it returns the loss in
        # the input's dtype (not autocast's float32)
        if inplace and not _no_internal_overlap(input):
            raise ArgumentError("lossfuse: cross_entropy_loss: inplace: expected logits whose elements do not share "
                                f"memory, got strides {tuple(input.stride())} for shape {tuple(input.shape)}")
        try:
            loss, lse, z_loss = (_cross_entropy_eager_inplace if inplace else _cross_entropy_eager)(*args)
        except ValueError as e:
            raise as_argument_error(e) from None
    else:
        loss, lse, z_loss, _ = _ops.cross_entropy(*args, compute_grad)
        if compute_grad and loss_dtype != input.dtype and is_eager(loss) and loss.grad_fn is not None:
            # autocast's float32 loss of 16-bit logits, handed to the caller as it is: its backward (the node's ctx)
            # rounds the gradient once (_ce_backward)
            loss.grad_fn.float32_loss = True
    if restore is not None:
        loss, lse, z_loss = (restore(t) for t in (loss, lse, z_loss))
    return _ce_outputs(loss, lse, z_loss, loss_dtype, return_lse, return_z_loss, acc_dtype(input))


def _no_class(name, input, target, weight, red, ignore_index, soft, label_smoothing=0.0, z_loss_scale=0.0):
    """Logits with no class (C = 0), which torch takes: every class-index target must be ignore_index (torch raises an
    IndexError for any other; in eager mode this one names the first, where the kernels' target scan would), and the
    loss is torch's own kernel's (0 per row; 'mean' of class indices is 0/0, NaN, and so is that of probabilities,
    torch dividing by numel / C). The lse of a row of no class is -inf; its z-loss is 0 for an ignored row and
    z_loss_scale * inf for a row of probabilities. Returns (loss, lse, z_loss)."""
    if not soft and is_eager(target) and torch._C._len_torch_dispatch_stack() == 0:
        kept = (target != ignore_index).reshape(-1).nonzero()
        if kept.numel():
            flat = int(kept[0, 0])
            position = [flat // math.prod(target.shape[d + 1:]) % n for d, n in enumerate(target.shape)]
            raise IndexError(f"lossfuse: {name}: target: expected ignore_index ({ignore_index}) only, the input "
                             f"having no class (shape {tuple(input.shape)}), got {int(target.reshape(-1)[flat])} at "
                             f"position {position}")
    if not soft:
        target = target.long()  # torch's kernels take int64 class indices; the values are the same
    if name == "nll_loss":
        loss = torch._C._nn.nll_loss_nd(input, target, weight, red, ignore_index)
    else:
        loss = torch._C._nn.cross_entropy_loss(input, target, weight, red, ignore_index, label_smoothing)
    rows = input.shape[:1] + input.shape[2:] if input.dim() >= 2 else ()
    acc = acc_dtype(input)
    lse = torch.full(rows, -math.inf, dtype=acc, device=input.device)
    z_rows = torch.full(rows, math.inf if soft and z_loss_scale > 0 else 0.0, dtype=acc, device=input.device)
    # 'mean' over the kept rows (none of class indices: 0/0) or over the rows of probabilities
    z_loss = z_rows if red == 0 else z_rows.sum() / (1 if red == 2 else z_rows.numel() if soft else 0)
    if z_loss_scale > 0:
        loss = loss + z_loss.to(loss.dtype)
    return loss, lse, z_loss


def _autocast_class_target_logits(input, soft):
    """Inside torch.autocast, torch casts 16-bit logits to float32 and returns a float32 loss. With class-index
    targets the kernels read the 16-bit logits as they are, in float32 arithmetic (the same values as the cast's), and
    write the gradient in their dtype: no float32 copy of the logits, and no float32 gradient cast back (two N x V
    passes each way). Returns the loss dtype (float32) where that applies, else None."""
    return torch.float32 if not soft and autocasts(input) else None


def _ce_outputs(loss, lse, z_loss, dtype, return_lse, return_z_loss, lse_dtype):
    out = (loss if loss.dtype == dtype else loss.to(dtype),)
    if return_lse:
        # lse_dtype: acc_dtype of the logits the op read (the op saves lse in float64, _outputs.lse_dtype)
        out += (lse if lse.dtype == lse_dtype else lse.to(lse_dtype),)
    if return_z_loss:
        out += (z_loss if z_loss.dtype == dtype else z_loss.to(dtype),)
    return out[0] if len(out) == 1 else out


def _no_internal_overlap(t):
    """Whether no two elements of t share memory: with its dims of more than one element ordered by stride, each
    stride passes the farthest offset the smaller ones reach (sufficient; slices and transposes pass, expanded dims
    fail)."""
    reach = 0
    for stride, size in sorted((st, sz) for st, sz in zip(t.stride(), t.shape) if sz > 1):
        if stride <= reach:
            return False
        reach += (size - 1) * stride
    return True


def _check_tensors(name, input, target):
    """torch's TypeError for non-tensors, its NotImplementedError for logits that are not floating, and an
    ArgumentError (a ValueError, as nll_loss's, and a RuntimeError, as cross_entropy's) for 0-d logits."""
    check_tensors(name, ("input", input), ("target", target))
    if not input.is_floating_point():
        raise NotImplementedError(f"lossfuse: {name}: input: expected float32, float64, float16 or bfloat16 "
                                  f"logits, got {input.dtype}")
    if input.dim() == 0:
        raise ArgumentError(f"lossfuse: {name}: input: expected 1 or more dims (the classes), got a 0-d tensor")
    return input, target


def _weight_needs_grad(name, weight, soft):
    """True when the class weights need a gradient (probability targets only); torch's error for class indices."""
    if weight is None or not weight.requires_grad or not torch.is_grad_enabled():
        return False
    if not soft:
        raise RuntimeError(f"lossfuse: {name}: weight: the loss of class-index targets is not differentiable with "
                           "respect to the class weights (torch's nll_loss_forward is not either); the weight "
                           "cannot have requires_grad=True")
    return True


def _fit_class_dims(input, target, soft, same_shape_is_soft=False):
    """Inputs of more dims than the kernels take (N, C, d1, ..., dk) as (N, C, d1 * ... * dk), targets alike.
    Returns them and a function giving a per-row result ((N, d1 * ... * dk) or 0-d) its shape back.
    An unbatched input (C) takes a class-index target of one element, (1) as well as (), as torch does (but for
    C = 1 in cross_entropy, same_shape_is_soft, where torch reads the equal shapes as probabilities)."""
    if (input.dim() == 1 and not soft and target.dim() == 1 and target.numel() == 1
            and not (same_shape_is_soft and input.shape == target.shape)):
        return input, target.reshape(()), None
    if input.dim() <= _MAX_DIMS:
        return input, target, None
    n, c, rows = input.shape[0], input.shape[1], input.shape[:1] + input.shape[2:]
    input = input.reshape(n, c, -1)
    target = target.reshape(n, c, -1) if soft else target.reshape(n, -1)
    return input, target, (lambda t: t.reshape(rows) if t.dim() == 2 else t)


@overridable
def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):
    """torch.nn.functional.nll_loss; targets of any integer dtype."""
    check_optional_tensors("nll_loss", ("weight", 3, weight))
    red = reduction_code(reduction, size_average, reduce)
    input, target = _check_tensors("nll_loss", input, target)
    check_class_weight_dtype("nll_loss", weight, input)
    loss_dtype = _autocast_class_target_logits(input, False) or input.dtype
    (weight,) = autocast_float32(weight)
    _weight_needs_grad("nll_loss", weight, False)
    if input.shape[1 if input.dim() >= 2 else 0] == 0:
        loss = _no_class("nll_loss", input, target, weight, red, ignore_index, False)[0]
        return loss if loss.dtype == loss_dtype else loss.to(loss_dtype)
    input, target, restore = _fit_class_dims(input, target, False)
    loss = _ops.nll_loss(input, target, weight, red, int(ignore_index))
    if restore is not None:
        loss = restore(loss)
    return loss if loss.dtype == loss_dtype else loss.to(loss_dtype)


class CrossEntropyLoss(_tnn.CrossEntropyLoss):
    """torch.nn.CrossEntropyLoss; lossfuse's extras (softcap, z_loss_scale, logit_scale, inplace) as keyword-only
    constructor arguments."""

    def __init__(self, *args, softcap=0.0, z_loss_scale=0.0, logit_scale=1.0, inplace=False, **kwargs):
        super().__init__(*args, **kwargs)
        self.softcap, self.z_loss_scale, self.logit_scale, self.inplace = softcap, z_loss_scale, logit_scale, inplace

    def forward(self, input, target):
        return cross_entropy(input, target, weight=self.weight, ignore_index=self.ignore_index,
                             reduction=self.reduction, label_smoothing=self.label_smoothing, softcap=self.softcap,
                             z_loss_scale=self.z_loss_scale, logit_scale=self.logit_scale,
                             inplace=getattr(self, "inplace", False))  # modules pickled before it existed


class NLLLoss(_tnn.NLLLoss):
    """torch.nn.NLLLoss."""

    def forward(self, input, target):
        return nll_loss(input, target, weight=self.weight, ignore_index=self.ignore_index, reduction=self.reduction)


FUNCTIONS = ["cross_entropy", "nll_loss"]
MODULES = ["CrossEntropyLoss", "NLLLoss"]
