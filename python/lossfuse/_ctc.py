"""ctc_loss: fake implementations, autograd, and the torch-compatible function and module."""

import operator

import torch
import torch.nn as _tnn

from ._args import autocast_float32, reduction_code
from ._outputs import acc_dtype, new_grad, new_loss, to_input_dtype
from ._protocol import overridable
from ._register import ops, register_autograd

_ops = ops  # torch.ops.lossfuse with the eager fast path


# ---- fake (meta) implementations: shapes and dtypes only, for torch.compile and FakeTensor tracing ----------


@torch.library.register_fake("lossfuse::ctc_loss")
def _ctc_fake(log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity, save_log_alpha):
    batched = log_probs.dim() == 3
    loss = new_loss(log_probs, (log_probs.shape[1],) if batched else (), reduction)
    if not save_log_alpha or log_probs.dim() not in (2, 3):
        return loss, log_probs.new_empty((0,), dtype=acc_dtype(log_probs))
    if batched and targets.dim() == 1:
        # Concatenated targets: the width is 2 max(target_lengths) + 1, known only from the lengths' values. (The
        # new size must be a dim by itself for torch.compile to bind it, so it is the width, not max(lengths).)
        width = torch.library.get_ctx().new_dynamic_size(min=1)
    else:
        width = 2 * (targets.shape[-1] if targets.dim() else 0) + 1
    shape = (log_probs.shape[0], log_probs.shape[1], width) if batched else (log_probs.shape[0], width)
    return loss, log_probs.new_empty(shape, dtype=acc_dtype(log_probs))


@torch.library.register_fake("lossfuse::ctc_loss_backward")
def _ctc_bwd_fake(grad_output, log_probs, targets, input_lengths, target_lengths, log_alpha, blank, reduction,
                  zero_infinity):
    return new_grad(log_probs, True)


# ---- autograd ------------------------------------------------------------------------------------------------


def _ctc_setup(ctx, inputs, output):
    log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity, save_log_alpha = inputs
    _, log_alpha = output
    ctx.mark_non_differentiable(log_alpha)
    ctx.set_materialize_grads(False)  # else autograd hands backward a zero tensor the size of log_alpha
    ctx.args = (blank, reduction, zero_infinity)
    # Without the saved forward variables the backward op recomputes them.
    ctx.save_for_backward(log_probs, targets, input_lengths, target_lengths, log_alpha if save_log_alpha else None)


def _ctc_backward(ctx, grad_loss, grad_log_alpha):
    log_probs, targets, input_lengths, target_lengths, log_alpha = ctx.saved_tensors
    grad = None
    if ctx.needs_input_grad[0] and grad_loss is not None:
        # Also under create_graph=True: as torch's, this gradient is computed by an op without a derivative, so a
        # double backward raises (see _ctc_double_backward) instead of silently giving a wrong result.
        grad = _ops.ctc_loss_backward(grad_loss, log_probs, targets, input_lengths, target_lengths, log_alpha,
                                      *ctx.args)
    return grad, None, None, None, None, None, None, None


register_autograd("ctc_loss", _ctc_backward, _ctc_setup)


def _ctc_double_setup(ctx, inputs, output):
    pass


def _ctc_double_backward(ctx, grad):
    # torch.nn.functional.ctc_loss has no double backward either: its gradient's grad_fn raises
    # "derivative for aten::_ctc_loss_backward is not implemented" when differentiated.
    raise RuntimeError("derivative for lossfuse::ctc_loss_backward is not implemented (torch's ctc_loss does not "
                       "support double backward either)")


register_autograd("ctc_loss_backward", _ctc_double_backward, _ctc_double_setup)


# ---- torch.nn.functional-compatible functions ----------------------------------------------------------------


def _lengths(lengths, name, on_host):
    """A lengths argument as a 1-D tensor: tensors as given (any integer dtype; flattened, as torch reads them by
    numel; copied to the host when on_host), sequences of ints (torch's other overload) as int64 on the host, where
    the kernels read them without a synchronisation."""
    if torch.is_tensor(lengths):
        lengths = lengths if lengths.dim() == 1 else lengths.reshape(-1)
        return lengths.cpu() if on_host else lengths
    if isinstance(lengths, (list, tuple)):
        try:
            values = [operator.index(v) for v in lengths]
        except TypeError:
            values = None
        if values is not None:
            return torch.tensor(values, dtype=torch.long)
    raise TypeError(f"ctc_loss(): argument '{name}' must be a Tensor or a tuple of ints, not "
                    f"{type(lengths).__name__}" + (" of non-integers" if isinstance(lengths, (list, tuple)) else ""))


@overridable
def ctc_loss(log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: torch.Tensor,
             target_lengths: torch.Tensor, blank: int = 0, reduction: str = "mean",
             zero_infinity: bool = False) -> torch.Tensor:
    """torch.nn.functional.ctc_loss.

    log_probs: (T, N, C) or unbatched (T, C), float32/float64 (and float16/bfloat16, which torch's CPU kernel
    lacks; computed in float32). targets: padded (N, S) or concatenated (sum(target_lengths)), any integer dtype
    (floating targets are truncated to int64, as torch does). input_lengths, target_lengths: tensors of any integer
    dtype, or tuples/lists of ints.

    When log_probs needs a gradient, the forward keeps its log alpha table (T x N x (2 S + 1), as torch's) for the
    backward. On CUDA with padded targets and CUDA lengths a call reads back one check record (none under CUDA-graph
    capture, where a bad length or label makes its sample's loss and gradient NaN); concatenated targets' lengths
    come to the host, and are refused under capture.
    """
    red = reduction_code(reduction)
    if not log_probs.is_floating_point():  # torch's type for a dtype its kernel lacks
        raise NotImplementedError(f"ctc_loss: log_probs: expected a floating dtype, got {log_probs.dtype}")
    (log_probs,) = autocast_float32(log_probs)
    if targets.is_floating_point() or targets.dtype == torch.bool:
        targets = targets.long()
    if targets.device != log_probs.device:  # torch takes CPU targets with CUDA log_probs; the kernels read them there
        targets = targets.to(log_probs.device)
    # Concatenated targets: the lengths are read on the host (each sample's first label, the log_alpha width), so a
    # device copy is brought over once here, for the forward and the backward (as it is for CPU log_probs). Under
    # CUDA-graph capture that copy cannot be made: refused before it spoils the capture.
    on_host = (targets.dim() == 1 and log_probs.dim() == 3) or log_probs.device.type == "cpu"
    if (on_host and log_probs.is_cuda and not torch.compiler.is_compiling()
            and torch.cuda.is_current_stream_capturing()):
        raise RuntimeError("lossfuse: targets: expected padded (N, S) targets under stream capture, got concatenated "
                           "targets (their lengths are read on the host)")
    input_lengths = _lengths(input_lengths, "input_lengths", on_host)
    target_lengths = _lengths(target_lengths, "target_lengths", on_host)
    save_log_alpha = log_probs.requires_grad and torch.is_grad_enabled()
    loss, _ = _ops.ctc_loss(log_probs, targets, input_lengths, target_lengths, int(blank), red, bool(zero_infinity),
                            save_log_alpha)
    return to_input_dtype(loss, log_probs)


class CTCLoss(_tnn.CTCLoss):
    """torch.nn.CTCLoss."""

    def forward(self, log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: torch.Tensor,
                target_lengths: torch.Tensor) -> torch.Tensor:
        return ctc_loss(log_probs, targets, input_lengths, target_lengths, self.blank, self.reduction,
                        self.zero_infinity)


FUNCTIONS = ["ctc_loss"]
MODULES = ["CTCLoss"]
