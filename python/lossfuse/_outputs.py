"""The dtypes and outputs of the ops: accumulation dtypes, new losses and gradients, casts back to torch's dtypes,
and the reference compositions' reductions."""

import torch


def acc_dtype(t):
    """The dtype lossfuse stores losses in: float64 for float64 inputs, float32 otherwise."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def lse_dtype(t):
    """The dtype of the per-row lse that the cross_entropy and linear_cross_entropy ops save for backward: float64 for
    every logits dtype (the kernels write max + log-sum summed in double, so a gradient made from it later keeps the
    forward's precision however large the logits' common offset: a relative error up to 1.1e-16 |lse| per
    probability). Callers hand lse to users in acc_dtype."""
    return torch.float64


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


def class_target_mean(loss, z, t, weight, ignore_index, label_smoothing, split):
    """'mean' of a composed cross-entropy over class-index targets t (class dim 1, or 0 unbatched) from its per-row
    losses and logits z: over the target weights of the kept rows. split (label smoothing or a z-loss present):
    torch's division is by term, the (1 - eps) class term over the sum plus the rest over it, which is NaN (0/0)
    where the sum is 0, not the total's inf (the kernels' split_mean_denominator)."""
    valid = t != ignore_index
    wy = weight[torch.where(valid, t, 0)] if weight is not None else torch.ones_like(loss)
    denom = torch.where(valid, wy, torch.zeros_like(wy)).sum()
    total = loss.sum()
    if not split:
        return total / denom
    # torch's own kernel (of any number of dims; reduction 2: sum), which patch_torch() leaves alone: lossfuse's
    # nll_loss inside this composition's forward-mode AD would meet its own transform level
    cls = (1 - label_smoothing) * torch._C._nn.nll_loss_nd(
        torch.log_softmax(z, 1 if z.dim() >= 2 else 0), t, weight, 2, ignore_index)
    return cls / denom + (total - cls) / denom


def in_acc_dtype(tensors):
    """The floating tensors in the accumulation dtype of the first (the dtype lossfuse returns losses in)."""
    acc = acc_dtype(tensors[0])
    return [t.to(acc) if t is not None and t.is_floating_point() else t for t in tensors]
