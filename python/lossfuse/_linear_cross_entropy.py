"""linear_cross_entropy: cross_entropy(input @ linear_weight.T + linear_bias, target) without the N x V logits."""

import collections
import warnings

import torch
import torch.nn as _tnn

from ._args import (ArgumentError, CeOptions, autocast_float32, autocast_lower, check_class_weight_dtype,
                    reduction_code, torch_label_smoothing)
from ._cuda import cuda_check
from ._func import differentiable_grads, graph_needed
from ._outputs import acc_dtype, class_target_mean, in_acc_dtype, lse_dtype, new_grad
from ._protocol import overridable
from ._register import ops, register_autograd
from ._roads import is_eager

_ops = ops  # torch.ops.lossfuse with the eager fast path
_torch_cross_entropy = torch.nn.functional.cross_entropy

# auto: 32 MiB of float32 logits per chunk, at least 256 rows within 1/16 of the logits; on CUDA 1 GiB
DEFAULT_MEMORY_BUDGET = 0
# vocab_tile=None: tiles of this many classes when the weight's gradient is 16-bit (the backward then runs tile by
# tile, with no V x H float32 accumulator), whole vocabulary rows otherwise.
AUTO_VOCAB_TILE_16BIT = 1024


class LinearCeOptions(collections.namedtuple("LinearCeOptions",
                                             CeOptions._fields + ("chunk_rows", "memory_budget", "vocab_tile",
                                                                  "grad_filter"))):
    """linear_cross_entropy's scalar options, in the order its ops take them: CeOptions' fields, then the chunking."""

    __slots__ = ()

    @property
    def ce(self):
        return CeOptions(*self[:len(CeOptions._fields)])


def _bias_grad_fake(bias, input, wanted):
    return new_grad(bias, True) if wanted and bias is not None else new_grad(input, False)


@torch.library.register_fake("lossfuse::linear_cross_entropy")
def _lce_fake(input, linear_weight, target, linear_bias, weight, reduction, ignore_index, label_smoothing,
              logit_scale, softcap, z_loss_scale, chunk_rows, memory_budget, vocab_tile, grad_filter, grad_mask):
    n = input.shape[0]
    loss = input.new_empty((n,) if reduction == 0 else (), dtype=acc_dtype(input))
    return (loss, input.new_empty((n,), dtype=lse_dtype(input)), torch.empty_like(loss),
            new_grad(input, grad_mask[0]), new_grad(linear_weight, grad_mask[1]),
            _bias_grad_fake(linear_bias, input, grad_mask[2]))


@torch.library.register_fake("lossfuse::linear_cross_entropy_backward")
def _lce_bwd_fake(grad_output, input, linear_weight, target, lse, linear_bias, weight, reduction, ignore_index,
                  label_smoothing, logit_scale, softcap, z_loss_scale, chunk_rows, memory_budget, vocab_tile,
                  grad_filter, grad_mask):
    return (new_grad(input, grad_mask[0]), new_grad(linear_weight, grad_mask[1]),
            _bias_grad_fake(linear_bias, input, grad_mask[2]))


@torch.library.register_fake("lossfuse::_linear_cross_entropy_scale_held_")
def _lce_scale_held_fake(grad_input, grad_linear_weight, grad_linear_bias, grad_output, target, reduction,
                         ignore_index):
    return None


def _lce_setup(ctx, inputs, output):
    input, linear_weight, target, linear_bias, weight = inputs[:5]
    ctx.args = LinearCeOptions(*inputs[5:15])
    ctx.precomputed = any(inputs[15])
    ctx.grad_mask = inputs[15]
    loss, lse, z_loss, gx, gw, gb = output
    ctx.mark_non_differentiable(lse, z_loss, gx, gw, gb)
    ctx.set_materialize_grads(False)
    ctx.eager = None
    if ctx.precomputed and is_eager(loss):
        # Gradients made in the forward for an upstream gradient of 1, each scaled in place by the backward that
        # hands it over (so kept outside save_for_backward's version check); True: still held.
        ctx.eager = [(g, True) for g in (gx, gw, gb)]
        gx = gw = gb = None
    ctx.save_for_backward(input, linear_weight, target, linear_bias, weight, lse, gx, gw, gb)


def _scaled_traced(g, which, grad_loss, input, target, ignore_index):
    """A gradient made in the forward for an upstream gradient of 1, scaled on the traced road (no value read).
    What the ignored rows alone make keeps the forward's values, as torch's does, whatever the upstream gradient
    (scaled by NaN or inf, their zeros would turn NaN): the input gradient's ignored rows, and the weight's and bias's
    gradients when every row is ignored."""
    scaled = (g * grad_loss).to(g.dtype)
    counted = target.long() != ignore_index  # in int64: a uint8 target would wrap ignore_index -100 to 156
    if which == 0:
        return torch.where(counted.unsqueeze(1) if input.dim() == 2 else counted, scaled, g)
    return torch.where(counted.any(), scaled, g)


def _lce_backward(ctx, grad_loss, grad_lse, grad_z_loss, grad_gx, grad_gw, grad_gb):
    input, linear_weight, target, linear_bias, weight, lse, gx, gw, gb = ctx.saved_tensors
    need = ctx.needs_input_grad
    wanted = [need[0], need[1], need[3] and linear_bias is not None]
    out = [None, None, None]
    if grad_loss is None or not any(wanted):
        pass
    elif graph_needed(grad_loss, (input, linear_weight, linear_bias), wanted):
        # a double backward may follow: differentiate torch's own composition
        def f(x, w, b):
            logits = torch.nn.functional.linear(x, w, b)
            return _reference_loss(logits, target, weight, ctx.args.ce)
        out = differentiable_grads(f, (input, linear_weight, linear_bias), wanted, grad_loss)
    elif ctx.precomputed:
        held = ctx.eager if ctx.eager is not None else [(gx, None), (gw, None), (gb, None)]
        again = [False, False, False]
        handed = [None, None, None]
        for i, (g, eager) in enumerate(held):
            if not wanted[i]:
                continue
            if eager is None:
                out[i] = _scaled_traced(g, i, grad_loss, input, target, ctx.args.ignore_index)
            elif g is None:  # handed over by an earlier backward of a retained graph: computed anew below
                again[i] = True
            else:
                # handed over once: the caller owns it from now on (it may land in .grad and change there)
                out[i] = handed[i] = g
                held[i] = (None, eager)
        if any(again):
            # new gradients from the same forward kernel (same mask), the same to the bit as the first (backward is
            # reentrant, as gradcheck checks), scaled the same way
            with cuda_check("nan"):  # targets the first forward checked (the backward ops' rule: BackwardChecks)
                computed = torch.ops.lossfuse.linear_cross_entropy(input, linear_weight, target, linear_bias, weight,
                                                                   *ctx.args, ctx.grad_mask)[3:]
            for i in range(3):
                if again[i]:
                    out[i] = handed[i] = computed[i]
        if any(h is not None for h in handed):
            # on the device where the gradients live, nothing read back: no pass at an upstream gradient of 1; the
            # ignored rows (and, with every row ignored, the weight's and bias's gradients) keep their values
            _ops._linear_cross_entropy_scale_held_(*handed, grad_loss, target, ctx.args.reduction,
                                                   ctx.args.ignore_index)
    else:
        out = list(_ops.linear_cross_entropy_backward(grad_loss, input, linear_weight, target, lse, linear_bias,
                                                      weight, *ctx.args, wanted))
        out = [g if w else None for g, w in zip(out, wanted)]
    return (out[0], out[1], None, out[2]) + (None,) * 12


def _lce_composition(input, linear_weight, target, linear_bias, weight, *args):
    input, linear_weight, linear_bias, weight = in_acc_dtype([input, linear_weight, linear_bias, weight])
    return _reference_loss(torch.nn.functional.linear(input, linear_weight, linear_bias), target, weight,
                           CeOptions(*args[:6]))


register_autograd("linear_cross_entropy", _lce_backward, _lce_setup, _lce_composition, outputs=6,
                  differentiable=(0, 1, 3))


def _reference_loss(logits, target, weight, o):
    """cross_entropy of the logits by torch's ops, with lossfuse's options (o: CeOptions)."""
    reduction, ignore_index, label_smoothing, logit_scale, softcap, z_loss_scale = o
    z = logits * logit_scale
    if softcap > 0:
        z = softcap * torch.tanh(z / softcap)
    t = target.long()
    loss = _torch_cross_entropy(z, t, weight, ignore_index=ignore_index, reduction="none",
                                label_smoothing=label_smoothing)
    valid = t != ignore_index
    if z_loss_scale:
        zl = z_loss_scale * torch.logsumexp(z, 1) ** 2
        loss = loss + torch.where(valid, zl, torch.zeros_like(zl))
    if reduction == 0:
        return loss
    if reduction == 2:
        return loss.sum()
    return class_target_mean(loss, z, t, weight, ignore_index, label_smoothing, bool(label_smoothing or z_loss_scale))


@overridable
def linear_cross_entropy(input, linear_weight, target, *, linear_bias=None, weight=None, reduction="mean",
                         ignore_index=None, label_smoothing=0.0, options=None, softcap=0.0, z_loss_scale=0.0,
                         logit_scale=1.0, return_lse=False, strategy="auto", chunk_rows=0,
                         memory_budget=DEFAULT_MEMORY_BUDGET, vocab_tile=None, grad_filter=0.0, loss_dtype=None):
    """torch.nn.functional.linear_cross_entropy without ever holding the N x V logits.

    input (N, H) or (H), linear_weight (V, H), target (N) or () class indices of any integer dtype, linear_bias (V).
    The logits are made chunk by chunk (chunk_rows rows, or as many as fit memory_budget bytes of float32; the
    default 0 means 32 MiB, raised to 256 rows where that stays within 1/16 of the logits, as at large V thin chunks
    cost more than their work; on CUDA 1 GiB) and reduced at once. strategy:
      'chunked'   gradients of input, linear_weight and linear_bias are computed during the forward pass and
                  kept until backward (reduction 'mean' or 'sum'; the fastest: one pass);
      'recompute' the forward keeps only the per-row log-sum-exp and backward recomputes the logits (any
                  upstream gradient, reduction 'none' included; retain_graph and checkpointing are fine);
      'auto'      'chunked' when gradients are needed and the reduction is 'mean' or 'sum', else 'recompute'.
    vocab_tile > 0: the logits are made rows x vocab_tile at a time with an online log-sum-exp (the smallest memory;
    for 16-bit weights also no V x H float32 accumulator of the weight's gradient); 0: whole vocabulary rows (for
    float32 the fastest: three GEMMs in all); None (the default): 1024 when linear_weight is a 16-bit CPU tensor
    that needs a gradient, else 0 (CUDA serves whole rows only, its products on cuBLAS). grad_filter (with vocab_tile,
    off at 0): in backward, a (row, tile) whose largest probability is below it keeps only its target and
    smoothing terms (error bound in include/lossfuse/linear_cross_entropy.hpp).
    lossfuse's extras as in cross_entropy: softcap, z_loss_scale, logit_scale, return_lse. loss_dtype: the loss's
    dtype (None: input's, as torch; torch.float32 for 16-bit input returns the float32 accumulation unrounded).
    `options` (torch's LinearCrossEntropyOptions) is accepted and ignored: lossfuse always chunks. Probability
    targets and multi-dimensional weights fall back to cross_entropy on the full logits, with a warning.
    """
    del options
    red = reduction_code(reduction)
    label_smoothing = torch_label_smoothing(label_smoothing)
    # torch.autocast: torch's linear runs in the autocast dtype and its cross-entropy in float32, which is the loss's
    autocasting, (input, linear_weight, linear_bias) = autocast_lower(input, linear_weight, linear_bias)
    if autocasting:
        (weight,) = autocast_float32(weight)
    # torch's argument rules, with torch's exception type.
    if input.dim() not in (1, 2):
        raise RuntimeError(f"lossfuse: input: expected dimensionality 1 or 2, got {input.dim()}")
    if linear_weight.dim() < 2:
        raise RuntimeError(f"lossfuse: linear_weight: expected dimensionality at least 2, got {linear_weight.dim()}")
    if input.shape[-1] != linear_weight.shape[-1]:
        raise RuntimeError("lossfuse: linear_weight: expected the last dimension (in_features) of input, "
                           f"{input.shape[-1]}, got {linear_weight.shape[-1]}")
    if linear_weight.dim() > 2 and input.dim() == 1:
        raise RuntimeError("lossfuse: input: a K-dimensional loss (linear_weight of shape "
                           f"{tuple(linear_weight.shape)}) needs batched input, got shape {tuple(input.shape)}")
    if linear_bias is not None and tuple(linear_bias.shape) not in (tuple(linear_weight.shape[:-1]),
                                                                  (linear_weight.shape[:-1].numel(),)):
        raise RuntimeError(f"lossfuse: linear_bias: expected shape {tuple(linear_weight.shape[:-1])}, got "
                           f"{tuple(linear_bias.shape)}")
    if not target.is_floating_point() and linear_weight.dim() == 2 and target.shape != input.shape[:-1]:
        raise ArgumentError(f"lossfuse: target: expected shape {tuple(input.shape[:-1])} (one class index per row "
                            f"of input), got shape {tuple(target.shape)}")
    if target.is_floating_point() and ignore_index is not None:
        raise RuntimeError("lossfuse: ignore_index: cannot be given when target holds probabilities")
    if ignore_index is None:
        ignore_index = -100
    if target.is_floating_point() or linear_weight.dim() != 2 or linear_weight.shape[0] == 0:
        # (no class: the logits (N, 0) hold nothing, and cross_entropy takes them as torch does)
        if linear_weight.shape[0] != 0 and not torch.compiler.is_compiling():  # Dynamo cannot trace warnings.warn
            warnings.warn("lossfuse.linear_cross_entropy: probability targets and multi-dimensional weights are "
                          "computed from the full logits", stacklevel=3)  # above overridable()
        from ._cross_entropy import cross_entropy
        classes, *out, hidden = linear_weight.shape
        logits = torch.nn.functional.linear(input, linear_weight.reshape(-1, hidden),
                                            None if linear_bias is None else linear_bias.reshape(-1))
        logits = logits.reshape(*input.shape[:-1], classes, *out)
        out = cross_entropy(logits, target, weight, ignore_index=ignore_index, reduction=reduction,
                            label_smoothing=label_smoothing, softcap=softcap, z_loss_scale=z_loss_scale,
                            logit_scale=logit_scale, return_lse=return_lse)
        if loss_dtype is None:
            return out
        return (out[0].to(loss_dtype), out[1]) if return_lse else out.to(loss_dtype)
    if strategy not in ("auto", "chunked", "recompute"):
        raise ValueError(f"strategy: expected 'auto', 'chunked' or 'recompute', got {strategy!r}")
    check_class_weight_dtype("linear_cross_entropy", weight, input)  # as torch's cross_entropy of the logits
    lead = input.shape[:-1]
    # (N, H) as it is, (H) as one row: no product of sizes, which would make torch.export specialize a dynamic N
    x, t = (input, target) if input.dim() == 2 else (input.unsqueeze(0), target.reshape(1))
    if x.stride(-1) != 1:
        # an empty tensor counts as contiguous whatever its strides: the clone gets the plain ones
        x = x.contiguous() if x.numel() else x.clone(memory_format=torch.contiguous_format)
    w = linear_weight if linear_weight.stride(-1) == 1 else linear_weight.contiguous()
    grad_on = torch.is_grad_enabled()
    wants = [grad_on and input.requires_grad, grad_on and linear_weight.requires_grad,
             grad_on and linear_bias is not None and linear_bias.requires_grad]
    chunked = strategy == "chunked" or (strategy == "auto" and red != 0)
    if chunked and red == 0:
        raise ValueError("strategy 'chunked' needs reduction 'mean' or 'sum' (use 'recompute' for 'none')")
    mask = wants if chunked and any(wants) else [False, False, False]
    if vocab_tile is None:
        vocab_tile = AUTO_VOCAB_TILE_16BIT if wants[1] and w.element_size() == 2 and w.device.type == "cpu" else 0
    loss, lse, _, _, _, _ = _ops.linear_cross_entropy(
        x, w, t, linear_bias, weight, red, int(ignore_index), float(label_smoothing), float(logit_scale),
        float(softcap), float(z_loss_scale), int(chunk_rows), int(memory_budget), int(vocab_tile), float(grad_filter),
        mask)
    if red == 0:
        loss = loss.reshape(lead)
    out_dtype = loss.dtype if autocasting and loss_dtype is None else (loss_dtype or input.dtype)
    loss = loss if loss.dtype == out_dtype else loss.to(out_dtype)
    if not return_lse:
        return loss
    # the op saves lse in float64 (lse_dtype); returned in acc_dtype, as cross_entropy's
    return loss, (lse if lse.dtype == acc_dtype(x) else lse.to(acc_dtype(x))).reshape(lead)


class _LinearCrossEntropyModule(_tnn.modules.loss._WeightedLoss):
    """The constructor, attributes and state_dict layout of torch.nn.LinearCrossEntropyLoss (torch >= 2.13), the base
    of lossfuse's module on the torch releases that predate it: a classifier Linear(in_features, num_classes *
    prod(out_features)) whose weight and bias forward() views as (num_classes, *out_features, in_features) and
    (num_classes, *out_features)."""

    def __init__(self, in_features, num_classes, *, out_features=(), bias=False, device=None, dtype=None,
                 reduction="mean", weight=None, ignore_index=None, label_smoothing=0.0, options=None):
        if weight is not None and tuple(weight.shape) != (num_classes,):
            raise RuntimeError(f"lossfuse: weight: expected shape {(num_classes,)}, got {tuple(weight.shape)}")
        if label_smoothing < 0 or label_smoothing > 1.0:  # as torch's module, which lets NaN through
            raise RuntimeError(f"lossfuse: label_smoothing: expected a value in [0, 1], got {label_smoothing}")
        super().__init__(weight=weight, reduction=reduction)
        self.num_classes = num_classes
        self.out_features = out_features
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing
        self.options = options
        outputs = num_classes
        for d in self.out_features:
            outputs *= d
        self.linear = _tnn.Linear(in_features, outputs, bias=bias, device=device, dtype=dtype)

    def extra_repr(self):
        return (f"in_features={self.linear.in_features}, num_classes={self.num_classes}, "
                f"out_features={self.out_features}, bias={self.linear.bias is not None}, reduction={self.reduction}, "
                f"ignore_index={self.ignore_index}, label_smoothing={self.label_smoothing}, options={self.options}")


_LinearCrossEntropyBase = getattr(_tnn, "LinearCrossEntropyLoss", _LinearCrossEntropyModule)


class LinearCrossEntropyLoss(_LinearCrossEntropyBase):
    """torch.nn.LinearCrossEntropyLoss (it owns the classifier's linear layer), computed by
    linear_cross_entropy; lossfuse's extras as keyword-only constructor arguments."""

    def __init__(self, *args, softcap=0.0, z_loss_scale=0.0, logit_scale=1.0, strategy="auto", chunk_rows=0,
                 memory_budget=DEFAULT_MEMORY_BUDGET, vocab_tile=None, grad_filter=0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.extras = dict(softcap=softcap, z_loss_scale=z_loss_scale, logit_scale=logit_scale, strategy=strategy,
                           chunk_rows=chunk_rows, memory_budget=memory_budget, vocab_tile=vocab_tile,
                           grad_filter=grad_filter)

    def forward(self, input, target):
        linear_weight = self.linear.weight.reshape((self.num_classes, *self.out_features, self.linear.in_features))
        linear_bias = (self.linear.bias.reshape((self.num_classes, *self.out_features))
                       if self.linear.bias is not None else None)
        return linear_cross_entropy(input, linear_weight, target, linear_bias=linear_bias, weight=self.weight,
                                    reduction=self.reduction, ignore_index=self.ignore_index,
                                    label_smoothing=self.label_smoothing, options=self.options, **self.extras)


FUNCTIONS = ["linear_cross_entropy"]
MODULES = ["LinearCrossEntropyLoss"]
