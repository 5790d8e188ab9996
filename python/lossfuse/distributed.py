"""Vocabulary-parallel cross-entropy over torch.distributed.

For a model whose output layer is split over the vocabulary (tensor parallelism), each rank of a process group
holds the logits of one contiguous slice of the classes, shape (..., C_rank), and the same class-index targets,
shape (...). vocab_parallel_cross_entropy gives on every rank the cross-entropy over the whole vocabulary, the value
cross_entropy would give on the logits concatenated along the classes, without gathering anything of size N x V:

  forward   each rank reads its slice once (the lossfuse kernel: the slice's log-sum-exp per row, and the sum of its
            logits for label smoothing) and picks the target's logit where the target falls in its slice; one
            all_gather of these per-row numbers (3 x N floats per rank) gives every rank the full rows' statistics.
  backward  local: each rank writes the gradient of its own slice from the full log-sum-exp (the lossfuse backward
            kernel, one more read of the slice), with no communication.

Eager mode (autograd, no torch.compile); first derivatives only.
"""

import torch
import torch.distributed as dist

from ._common import ArgumentError, acc_dtype, as_argument_error, reduction_code

__all__ = ["vocab_parallel_cross_entropy"]

_LOCAL_IGNORE = -1  # the ignore_index of the local targets handed to the kernels (never a class of a slice)


def vocab_parallel_cross_entropy(input, target, group=None, *, vocab_start=None, vocab_size=None, ignore_index=-100,
                                 reduction="mean", label_smoothing=0.0, logit_scale=1.0, softcap=0.0,
                                 z_loss_scale=0.0):
    """Cross-entropy over a vocabulary split across the ranks of `group` (default: the whole world).

    input: this rank's logits, (..., C_rank), classes on the last dim (as a language model's output), of classes
        [vocab_start, vocab_start + C_rank) of the vocabulary; float32, float64, bfloat16 or float16.
    target: class indices into the whole vocabulary, (...), any integer dtype, the same on every rank.
    vocab_start, vocab_size: this rank's first class and the vocabulary's size. Both or neither: when not given,
        the slices are taken to follow rank order (rank 0 holds the first classes), and one small all_gather of
        the slices' sizes finds them.
    ignore_index, reduction ('none', 'mean', 'sum'), label_smoothing: as torch.nn.functional.cross_entropy.
    logit_scale, softcap, z_loss_scale: as lossfuse.nn.functional.cross_entropy (z = softcap tanh(logit_scale x /
        softcap); z_loss_scale lse^2 added per row).

    Returns the loss on every rank (per row of `target`'s shape for 'none'), in the input's dtype. Backward gives
    each rank the gradient of its own logits. Every rank of the group must call it, with the same target and
    options (it runs collectives). A target outside [0, vocab_size) but for ignore_index raises IndexError on
    every rank, naming its position and value.
    """
    name = "vocab_parallel_cross_entropy"
    if not isinstance(input, torch.Tensor) or not isinstance(target, torch.Tensor):
        raise TypeError(f"{name}(): input and target must be tensors, got {type(input).__name__} and "
                        f"{type(target).__name__}")
    if not input.is_floating_point():
        raise ArgumentError(f"lossfuse: {name}: input: expected floating logits, got {input.dtype}")
    if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        raise ArgumentError(f"lossfuse: {name}: target: expected class indices of an integer dtype, got "
                            f"{target.dtype}")
    if input.dim() < 1 or tuple(input.shape[:-1]) != tuple(target.shape):
        raise ArgumentError(f"lossfuse: {name}: target: expected shape {tuple(input.shape[:-1])} (the logits' shape "
                            f"without the classes), got {tuple(target.shape)}")
    classes = input.shape[-1]
    if classes < 1:
        raise ArgumentError(f"lossfuse: {name}: input: expected at least one class on this rank, got 0")
    red = reduction_code(reduction, legacy_names=False)
    if not 0.0 <= float(label_smoothing) <= 1.0:
        raise ArgumentError(f"lossfuse: {name}: label_smoothing: expected a value in [0, 1], got {label_smoothing}")
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"lossfuse: {name}: torch.distributed is not initialized (init_process_group first)")
    if (vocab_start is None) != (vocab_size is None):
        raise ArgumentError(f"lossfuse: {name}: vocab_start and vocab_size: expected both or neither, got "
                            f"{vocab_start} and {vocab_size}")
    if vocab_start is None:
        vocab_start, vocab_size = _slice_of(classes, input.device, group)
    vocab_start, vocab_size = int(vocab_start), int(vocab_size)
    if vocab_start < 0 or vocab_start + classes > vocab_size:
        raise ArgumentError(f"lossfuse: {name}: vocab_start: expected this rank's {classes} classes from vocab_start "
                            f"to lie in [0, vocab_size = {vocab_size}), got vocab_start {vocab_start}")
    _check_targets(name, target, vocab_size, int(ignore_index))
    options = (red, int(ignore_index), float(label_smoothing), float(logit_scale), float(softcap),
               float(z_loss_scale), vocab_start, vocab_size, group)
    try:
        return _VocabParallelCE.apply(input, target, options)
    except ValueError as e:
        raise as_argument_error(e) from None


def _slice_of(classes, device, group):
    """(this rank's first class, the vocabulary's size) for slices in rank order, by an all_gather of their sizes."""
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(dist.get_world_size(group))]
    dist.all_gather(sizes, torch.tensor([classes], dtype=torch.int64, device=device), group=group)
    sizes = [int(s) for s in sizes]
    rank = dist.get_rank(group)
    return sum(sizes[:rank]), sum(sizes)


def _check_targets(name, target, vocab_size, ignore_index):
    t = target.long()
    bad = (t != ignore_index) & ((t < 0) | (t >= vocab_size))
    if bool(bad.any()):
        first = int(bad.reshape(-1).nonzero()[0])
        position = [int(i) for i in torch.unravel_index(torch.tensor(first), tuple(target.shape))]
        raise IndexError(f"lossfuse: {name}: target: expected a class index in [0, {vocab_size}) or ignore_index "
                         f"({ignore_index}), got {int(t.reshape(-1)[first])} at position {position}")


def _transform(x, logit_scale, softcap):
    """z = T(x) and dz/dx, in x's dtype (the accumulation dtype)."""
    z = x * logit_scale
    if softcap > 0:
        th = torch.tanh(z / softcap)
        return softcap * th, logit_scale * (1 - th * th)
    return z, torch.full_like(z, logit_scale)


class _VocabParallelCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, target, options):
        red, ignore_index, eps, scale, softcap, zs, start, vocab, group = options
        classes = input.shape[-1]
        x = input.reshape(-1, classes)
        acc = acc_dtype(input)
        t = target.reshape(-1).long()
        valid = t != ignore_index
        mine = valid & (t >= start) & (t < start + classes)
        # Local targets for the kernels: the class in this slice, class 0 for a target in another slice (its term is
        # replaced in backward), _LOCAL_IGNORE for ignored rows.
        t_local = torch.where(mine, t - start, 0).masked_fill_(~valid, _LOCAL_IGNORE)

        # The slice's log-sum-exp per row, by one read of the logits. With label smoothing the same pass gives the
        # sum of the slice's z: the kernel's row loss at label_smoothing 1 is lse - sum(z) / C_rank (for every row
        # counted; the target does not enter it).
        loss_local, lse_local = torch.ops.lossfuse.cross_entropy(x, t_local, None, 0, _LOCAL_IGNORE,
                                                                 1.0 if eps > 0 else 0.0, scale, softcap, 0.0,
                                                                 False)[:2]
        stats = torch.zeros(3, x.shape[0], dtype=acc, device=x.device)
        if eps > 0:
            stats[2] = (lse_local - loss_local) * classes
        nonfinite = lse_local.isnan()
        if bool(nonfinite.any()):
            # the kernel's NaN also marks a row whose z are all -inf, which in a slice only means that the slice adds
            # nothing to the row's sum: its log-sum-exp is -inf (and its sum of z -inf)
            none = torch.isneginf(_transform(x[nonfinite].to(acc), scale, softcap)[0]).all(1)
            lse_local[nonfinite] = torch.where(none, -torch.inf, lse_local[nonfinite])
            stats[2, nonfinite] = torch.where(none, -torch.inf, stats[2, nonfinite])
        z_target = _transform(x.gather(1, t_local.clamp(min=0).unsqueeze(1)).squeeze(1).to(acc), scale, softcap)[0]
        stats[0] = lse_local
        stats[1] = torch.where(mine, z_target, 0)

        gathered = [torch.empty_like(stats) for _ in range(dist.get_world_size(group))]
        dist.all_gather(gathered, stats, group=group)
        gathered = torch.stack(gathered)
        lse = torch.logsumexp(gathered[:, 0], 0)
        lse = lse.masked_fill(torch.isneginf(lse), torch.nan)  # a row of only -inf: NaN, its gradient too, as torch
        z_t = gathered[:, 1].sum(0)
        rows = lse - (1 - eps) * z_t + zs * lse * lse
        if eps > 0:
            rows = rows - (eps / vocab) * gathered[:, 2].sum(0)
        rows = torch.where(valid, rows, 0)
        count = valid.sum()
        if red == 0:
            loss = rows.reshape(target.shape)
        else:
            loss = rows.double().sum()
            loss = (loss / count if red == 1 else loss).to(acc)

        ctx.save_for_backward(x, t_local, lse, valid, mine, count)
        ctx.options = options
        ctx.input_shape = input.shape
        return loss.to(input.dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss):
        x, t_local, lse, valid, mine, count = ctx.saved_tensors
        red, _, eps, scale, softcap, zs, _, vocab, _ = ctx.options
        classes = x.shape[1]
        acc = lse.dtype
        go = grad_loss.to(acc)
        go_rows = go.reshape(-1) if red == 0 else go
        # Every element from the full lse by the backward kernel. With label smoothing eps_k = eps * C_rank / V, the
        # kernel's eps_k / C_rank is the full vocabulary's eps / V (and its softmax coefficient stays 1); its target
        # term, at the local target, is replaced just below.
        eps_k = eps * classes / vocab
        g = torch.ops.lossfuse.cross_entropy_backward(go_rows, x, t_local, lse, None, red, _LOCAL_IGNORE, eps_k, scale,
                                                      softcap, zs)
        # Each counted row's element at its local target (its own class here, class 0 for a target elsewhere): the
        # gradient of the full loss there, q A - eps / V - (1 - eps) [target here], rounded once.
        idx = valid.nonzero().squeeze(1)
        p = t_local[idx]
        z, dz = _transform(x[idx, p].to(acc), scale, softcap)
        lse_i = lse[idx]
        a = 1 + 2 * zs * lse_i
        b = eps / vocab + (1 - eps) * mine[idx].to(acc)
        gs = go_rows[idx] if red == 0 else (go / count if red == 1 else go)
        g[idx, p] = ((torch.exp(z - lse_i) * a - b) * gs * dz).to(g.dtype)
        return g.reshape(ctx.input_shape), None, None
