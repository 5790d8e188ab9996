"""Vocabulary-parallel cross-entropy over torch.distributed.

For a model whose output layer is split over the vocabulary (tensor parallelism), each rank of a process group
holds the logits of one contiguous slice of the classes, shape (..., C_rank), and the same class-index targets,
shape (...). vocab_parallel_cross_entropy gives on every rank the cross-entropy over the whole vocabulary, the value
cross_entropy would give on the logits concatenated along the classes, without gathering anything of size N x V:

  forward   each rank reads its slice once (the lossfuse kernel: the slice's log-sum-exp per row, and the sum of its
            logits for label smoothing) and picks the target's logit where the target falls in its slice; one
            all_gather of these per-row numbers (3 x N floats per rank) gives every rank the full rows' statistics
            (after a small one that checks the ranks' arguments agree).
  backward  local: each rank writes the gradient of its own slice from the full log-sum-exp (the lossfuse backward
            kernel, one more read of the slice), with no communication.

Eager mode (autograd, no torch.compile); first derivatives only.
"""

import math
import struct

import torch
import torch.distributed as dist

from ._common import ArgumentError, acc_dtype, as_argument_error, reduction_code
from ._cross_entropy import _no_internal_overlap

__all__ = ["vocab_parallel_cross_entropy"]

_LOCAL_IGNORE = -1  # the ignore_index of the local targets handed to the kernels (never a class of a slice)


def vocab_parallel_cross_entropy(input, target, group=None, *, vocab_start=None, vocab_size=None, ignore_index=-100,
                                 reduction="mean", label_smoothing=0.0, logit_scale=1.0, softcap=0.0,
                                 z_loss_scale=0.0, inplace=False):
    """Cross-entropy over a vocabulary split across the ranks of `group` (default: the whole world).

    input: this rank's logits, (..., C_rank), classes on the last dim (as a language model's output), of classes
        [vocab_start, vocab_start + C_rank) of the vocabulary; float32, float64, bfloat16 or float16.
    target: class indices into the whole vocabulary, (...), any integer dtype, the same on every rank.
    vocab_start, vocab_size: this rank's first class and the vocabulary's size. Both or neither: when not given,
        the slices follow rank order (rank 0 holds the first classes).
    ignore_index, reduction ('none', 'mean', 'sum'), label_smoothing: as torch.nn.functional.cross_entropy.
    logit_scale, softcap, z_loss_scale: as lossfuse.nn.functional.cross_entropy (z = softcap tanh(logit_scale x /
        softcap); z_loss_scale lse^2 added per row).
    inplace: backward writes the gradient over this rank's logits (kept for backward anyway) instead of into a
        buffer of its own: no second N x C_rank buffer. Afterwards the logits hold their gradient, and the gradient
        handed to autograd is their storage (logits whose layout cannot be viewed as rows of C_rank are copied for
        the kernels: then the copy holds it and nothing is saved). torch's in-place rules apply (not a leaf that
        requires grad nor a view of one, no elements sharing memory), checked on every rank before the call's
        collectives; a second backward through a retained graph raises (torch's error about the modified logits).

    Returns the loss on every rank (per row of `target`'s shape for 'none'), in the input's dtype. Backward gives
    each rank the gradient of its own logits. Every rank of the group must call it, with the same target and
    options. A call runs two all_gathers: first a few numbers per rank (its slice, the targets' range and a
    checksum of the targets and options, whether its own argument checks passed), so that a bad argument on any
    rank makes every rank raise (none is left waiting in a collective), slices that do not tile the vocabulary
    once or targets and options that differ between ranks raise, and a target outside [0, vocab_size) but for
    ignore_index raises IndexError naming its position and value; then the per-row statistics.
    """
    name = "vocab_parallel_cross_entropy"
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"lossfuse: {name}: torch.distributed is not initialized (init_process_group first)")
    error, args = _local_arguments(name, input, target, vocab_start, vocab_size, ignore_index, reduction,
                                   label_smoothing, logit_scale, softcap, z_loss_scale, inplace)
    vocab_start, vocab_size = _agree(name, input, target, vocab_start, vocab_size, error, args, group)
    red, ignore_index, eps, scale, cap, zs = args
    try:
        return _VocabParallelCE.apply(input, target, (red, ignore_index, eps, scale, cap, zs, vocab_start,
                                                      vocab_size, group, bool(inplace)))
    except ValueError as e:
        raise as_argument_error(e) from None


def _local_arguments(name, input, target, vocab_start, vocab_size, ignore_index, reduction, label_smoothing,
                     logit_scale, softcap, z_loss_scale, inplace):
    """This rank's checks, raising nothing (a rank raising alone would leave the others waiting in a collective):
    (the error to raise or None, the options as (reduction code, ignore_index, and the four floats))."""
    try:
        if not isinstance(input, torch.Tensor) or not isinstance(target, torch.Tensor):
            raise TypeError(f"{name}(): input and target must be tensors, got {type(input).__name__} and "
                            f"{type(target).__name__}")
        if not input.is_floating_point():
            raise ArgumentError(f"lossfuse: {name}: input: expected floating logits, got {input.dtype}")
        if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
            raise ArgumentError(f"lossfuse: {name}: target: expected class indices of an integer dtype, got "
                                f"{target.dtype}")
        if input.dim() < 1 or tuple(input.shape[:-1]) != tuple(target.shape):
            raise ArgumentError(f"lossfuse: {name}: target: expected shape {tuple(input.shape[:-1])} (the logits' "
                                f"shape without the classes), got {tuple(target.shape)}")
        if input.shape[-1] < 1:
            raise ArgumentError(f"lossfuse: {name}: input: expected at least one class on this rank, got 0")
        eps = float(label_smoothing)
        args = (reduction_code(reduction, legacy_names=False), int(ignore_index), 0.0 if eps < 0 else eps,
                float(logit_scale), float(softcap), float(z_loss_scale))  # negative: no smoothing, as torch
        if not args[2] <= 1.0:
            raise ArgumentError(f"lossfuse: {name}: label_smoothing: expected a value in [0, 1], got "
                                f"{label_smoothing}")
        if (vocab_start is None) != (vocab_size is None):
            raise ArgumentError(f"lossfuse: {name}: vocab_start and vocab_size: expected both or neither, got "
                                f"{vocab_start} and {vocab_size}")
        if vocab_start is not None:
            first, size = int(vocab_start), int(vocab_size)
            if first < 0 or first + input.shape[-1] > size:
                raise ArgumentError(f"lossfuse: {name}: vocab_start: expected this rank's {input.shape[-1]} classes "
                                    f"from vocab_start to lie in [0, vocab_size = {size}), got vocab_start {first}")
        for arg, v in (("ignore_index", args[1]), ("vocab_start", vocab_start), ("vocab_size", vocab_size)):
            if v is not None and not -(1 << 62) < int(v) < 1 << 62:
                raise ArgumentError(f"lossfuse: {name}: {arg}: expected a value of magnitude below 2^62, got {v}")
        if inplace and input.requires_grad and torch.is_grad_enabled():
            torch.ops.lossfuse._check_inplace(input)  # torch's rules and errors
            if not _no_internal_overlap(input):
                raise ArgumentError(f"lossfuse: {name}: inplace: expected logits whose elements do not share memory, "
                                    f"got strides {tuple(input.stride())} for shape {tuple(input.shape)}")
        return None, args
    except Exception as e:  # noqa: BLE001  (whatever it is, it is raised on every rank by _agree)
        return (e if isinstance(e, TypeError) else as_argument_error(e)), None


def _agree(name, input, target, vocab_start, vocab_size, error, args, group):
    """One small all_gather of every rank's slice, rows, targets' range and checksum, options, and whether its own
    checks failed: every rank then raises together, or finds its (vocab_start, vocab_size). Checked here, the same on
    every rank: the slices tile [0, vocab_size) once (in rank order when none is given), the targets and options
    are the same on every rank, and every target lies in [0, vocab_size) or is ignore_index."""
    device = input.device if isinstance(input, torch.Tensor) else torch.device("cpu")
    mine = [1] + [0] * (len(_INFO) - 1)
    if error is None:
        try:  # nothing may raise on one rank alone before the all_gather
            t = target.reshape(-1).long()
            counted = t[t != args[1]]
            mine = [0, input.shape[-1], -1 if vocab_start is None else int(vocab_start),
                    -1 if vocab_size is None else int(vocab_size), _DTYPES.index(input.dtype), t.numel(),
                    int(counted.min()) if counted.numel() else 0, int(counted.max()) if counted.numel() else 0,
                    _checksum(t), args[0], args[1]] + [_bits(v) for v in args[2:]]
        except Exception as e:  # noqa: BLE001
            error = e if isinstance(e, TypeError) else as_argument_error(e)
            mine = [1] + [0] * (len(_INFO) - 1)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    infos = [torch.zeros(len(mine), dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(infos, torch.tensor(mine, dtype=torch.int64, device=device), group=group)
    infos = [dict(zip(_INFO, i.tolist())) for i in infos]

    failed = [r for r, i in enumerate(infos) if i["failed"]]
    if failed:
        if error is not None:
            raise error
        raise ArgumentError(f"lossfuse: {name}: rank(s) {failed} of the group failed their argument checks (their "
                            "error says why); every rank raises so that none is left waiting in a collective")
    differ = [k for k in _INFO[4:] if k not in ("min", "max") and len({i[k] for i in infos}) > 1]
    if differ:
        raise ArgumentError(f"lossfuse: {name}: expected the same logits dtype, targets and options on every rank; "
                            f"these differ: {', '.join(differ)}")
    classes = [i["classes"] for i in infos]
    starts = [i["start"] for i in infos]
    if all(s < 0 for s in starts):  # rank order
        vocab = sum(classes)
        starts = [sum(classes[:r]) for r in range(world)]
    else:
        vocab = infos[0]["vocab"]
        spans = sorted((i["start"], i["start"] + i["classes"], r) for r, i in enumerate(infos))
        tiled = spans[0][0] == 0 and spans[-1][1] == vocab and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
        if min(starts) < 0 or len({i["vocab"] for i in infos}) > 1 or not tiled:
            raise ArgumentError(f"lossfuse: {name}: vocab_start, vocab_size: expected the ranks' slices to cover "
                                f"[0, vocab_size) once, got {[(r, a, b) for a, b, r in spans]} (rank, start, end) "
                                f"and vocab_size {[i['vocab'] for i in infos]} by rank")
    if min(i["min"] for i in infos) < 0 or max(i["max"] for i in infos) >= vocab:
        t = target.long()
        bad = (t != args[1]) & ((t < 0) | (t >= vocab))
        first = int(bad.reshape(-1).nonzero()[0])
        position = [int(i) for i in torch.unravel_index(torch.tensor(first), tuple(target.shape))]
        raise IndexError(f"lossfuse: {name}: target: expected a class index in [0, {vocab}) or ignore_index "
                         f"({args[1]}), got {int(t.reshape(-1)[first])} at position {position}")
    return starts[rank], vocab


# What _agree gathers from each rank, in order (int64 each).
_INFO = ("failed", "classes", "start", "vocab", "dtype", "rows", "min", "max", "targets", "reduction",
         "ignore_index", "label_smoothing", "logit_scale", "softcap", "z_loss_scale")
_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def _bits(v):
    """A float option as an int64 of its bits, 0.0 for -0.0 and one NaN for all (equal options, equal bits)."""
    v = math.nan if v != v else v + 0.0
    return struct.unpack("<q", struct.pack("<d", v))[0]


def _checksum(t):
    """A checksum of the targets (int64, 1-D): each element mixed with its position by multiplications and shifts in
    wrapping int64 arithmetic, then summed; any difference in value or order changes it but with probability ~2^-64."""
    k = (t + 1) * _signed(0x9E3779B97F4A7C15) + torch.arange(t.numel(), device=t.device) * _signed(0xC2B2AE3D27D4EB4F)
    k = k ^ (k >> 31)
    k = k * _signed(0x94D049BB133111EB)
    k = k ^ (k >> 29)
    return int(k.sum())


def _signed(u):
    return u - (1 << 64) if u >= 1 << 63 else u


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
        red, ignore_index, eps, scale, softcap, zs, start, vocab, group, _ = options
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
        odd = lse_local.isnan()
        if eps > 0:
            stats[2] = (lse_local - loss_local) * classes
            odd |= loss_local.isnan()  # a local target logit of -inf: the kernel's 0 * inf in the unused target term
        if bool(odd.any()):
            # The kernel's NaN lse also marks a row whose z are all -inf, which in a slice only means that the slice
            # adds nothing to the row's sum: its log-sum-exp is -inf. These rows' sums of z are taken directly.
            z_rows = _transform(x[odd].to(acc), scale, softcap)[0]
            lse_local[odd] = torch.where(torch.isneginf(z_rows).all(1), -torch.inf, lse_local[odd])
            stats[2, odd] = z_rows.sum(1) if eps > 0 else 0
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
        red, _, eps, scale, softcap, zs, _, vocab, _, inplace = ctx.options
        classes = x.shape[1]
        acc = lse.dtype
        go = grad_loss.to(acc)
        go_rows = go.reshape(-1) if red == 0 else go
        # Each counted row's logit at its local target (its own class here, class 0 for a target elsewhere), read
        # before an in-place gradient overwrites it.
        idx = valid.nonzero().squeeze(1)
        p = t_local[idx]
        z, dz = _transform(x[idx, p].to(acc), scale, softcap)
        # Every element from the full lse by the backward kernel. With label smoothing eps_k = eps * C_rank / V, the
        # kernel's eps_k / C_rank is the full vocabulary's eps / V (and its softmax coefficient stays 1); its target
        # term, at the local target, is replaced just below.
        eps_k = eps * classes / vocab
        args = (lse, None, red, _LOCAL_IGNORE, eps_k, scale, softcap, zs)
        if inplace:
            torch.ops.lossfuse._cross_entropy_backward_inplace(go_rows, x, t_local, *args)
            g = x.detach()
        else:
            g = torch.ops.lossfuse.cross_entropy_backward(go_rows, x, t_local, *args)
        # The gradient of the full loss at those elements, q A - eps / V - (1 - eps) [target here], rounded once.
        lse_i = lse[idx]
        a = 1 + 2 * zs * lse_i
        b = eps / vocab + (1 - eps) * mine[idx].to(acc)
        gs = go_rows[idx] if red == 0 else (go / count if red == 1 else go)
        g[idx, p] = ((torch.exp(z - lse_i) * a - b) * gs * dz).to(g.dtype)
        return g.reshape(ctx.input_shape), None, None
