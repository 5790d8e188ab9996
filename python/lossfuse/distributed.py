"""Vocabulary-parallel cross-entropy over torch.distributed.

For a model whose output layer is split over the vocabulary (tensor parallelism), each rank of a process group
holds the logits of one contiguous slice of the classes, shape (..., C_rank), and the same class-index targets,
shape (...). vocab_parallel_cross_entropy gives on every rank the cross-entropy over the whole vocabulary, the value
cross_entropy would give on the logits concatenated along the classes, without gathering anything of size N x V:

  forward   each rank reads its slice once (the lossfuse kernel: the slice's log-sum-exp per row, and the sum of its
            logits for label smoothing) and picks the target's logit where the target falls in its slice; one
            all_gather of these per-row numbers (3 x N doubles per rank) gives every rank the full rows' statistics
            (after a small one that checks the ranks' arguments agree).
  backward  local: each rank writes the gradient of its own slice from the full log-sum-exp (the lossfuse backward
            kernel, one more read of the slice), with no communication.

Eager mode (autograd, no torch.compile); first derivatives only.
"""

import collections
import math
import operator
import struct

import torch
import torch.distributed as dist

from ._args import ArgumentError, as_argument_error, autocast_lower, CeOptions, reduction_code
from ._outputs import acc_dtype
from ._cross_entropy import _no_internal_overlap

__all__ = ["vocab_parallel_cross_entropy", "vocab_parallel_linear_cross_entropy"]

_LOCAL_IGNORE = -1  # the ignore_index of the local targets handed to the kernels (never a class of a slice)


# What the vocab-parallel Functions carry: CeOptions' fields, the rank's slice, the group, and per Function: inplace
# (vocab_parallel_cross_entropy), chunk_rows and reduce_input_grad (the linear one).
_SliceOptions = collections.namedtuple(
    "_SliceOptions",
    CeOptions._fields + ("vocab_start", "vocab_size", "group", "inplace", "chunk_rows", "reduce_input_grad"),
    defaults=(False, 0, True))


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
    try:
        return _VocabParallelCE.apply(input, target, _SliceOptions(*args, vocab_start, vocab_size, group,
                                                                   inplace=bool(inplace)))
    except ValueError as e:
        raise as_argument_error(e) from None


def _float32_holds(v):
    """Whether float32 rounds v to a finite value, nonzero for a nonzero v."""
    try:
        f = struct.unpack("f", struct.pack("f", v))[0]
    except OverflowError:
        return False
    return math.isfinite(f) and (v == 0 or f != 0)


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
        args = CeOptions(reduction_code(reduction, legacy_names=False), int(ignore_index), eps if eps > 0 else 0.0,
                float(logit_scale), float(softcap), float(z_loss_scale))  # negative or NaN: no smoothing, as torch
        if not args.label_smoothing <= 1.0:
            raise ArgumentError(f"lossfuse: {name}: label_smoothing: expected a value in [0, 1], got "
                                f"{label_smoothing}")
        zs = args.z_loss_scale
        if not (math.isfinite(zs) and zs >= 0) or (input.dtype != torch.float64 and not _float32_holds(zs)):
            # checked here: the forward computes the z-loss itself, the kernels see it in backward only
            raise ArgumentError(f"lossfuse: {name}: z_loss_scale: expected a finite value >= 0 that float32 holds "
                                f"(float64 logits: any finite one), got {z_loss_scale}")
        if (vocab_start is None) != (vocab_size is None):
            raise ArgumentError(f"lossfuse: {name}: vocab_start and vocab_size: expected both or neither, got "
                                f"{vocab_start} and {vocab_size}")
        if vocab_start is not None:
            first, size = int(vocab_start), int(vocab_size)
            if first < 0 or first + input.shape[-1] > size:
                raise ArgumentError(f"lossfuse: {name}: vocab_start: expected this rank's {input.shape[-1]} classes "
                                    f"from vocab_start to lie in [0, vocab_size = {size}), got vocab_start {first}")
        for arg, v in (("ignore_index", args.ignore_index), ("vocab_start", vocab_start), ("vocab_size", vocab_size)):
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


def _collective_device(group, input):
    """The device of the argument check's tensors: NCCL's current CUDA device, gloo's CPU (it takes both), another
    backend's the input's; so a rank whose argument is on the wrong device (or not a tensor) still joins the
    collective and raises with the others."""
    backend = str(dist.get_backend(group))
    if "gloo" in backend:
        return torch.device("cpu")
    if "nccl" in backend:
        return torch.device("cuda", torch.cuda.current_device())
    return input.device if isinstance(input, torch.Tensor) else torch.device("cpu")


def _agree(name, input, target, vocab_start, vocab_size, error, args, group, device=None, extra=()):
    """One small all_gather of every rank's slice, rows, targets' range and checksum, options, and whether its own
    checks failed: every rank then raises together, or finds its (vocab_start, vocab_size). Checked here, the same on
    every rank: the slices tile [0, vocab_size) once (in rank order when none is given), the targets and options
    are the same on every rank, and every target lies in [0, vocab_size) or is ignore_index. extra: (name, int)
    pairs that must also be equal on every rank (the same names on every rank)."""
    if device is None:
        device = _collective_device(group, input)
    keys = _INFO + tuple(k for k, _ in extra)
    mine = [1] + [0] * (len(keys) - 1)
    if error is None:
        try:  # nothing may raise on one rank alone before the all_gather
            t = target.reshape(-1).long()
            counted = t[t != args.ignore_index]
            mine = [0, input.shape[-1], -1 if vocab_start is None else int(vocab_start),
                    -1 if vocab_size is None else int(vocab_size), _DTYPES.index(input.dtype), t.numel(),
                    int(counted.min()) if counted.numel() else 0, int(counted.max()) if counted.numel() else 0,
                    _checksum(t), args.reduction, args.ignore_index] + [_bits(v) for v in args[2:]] + \
                [int(v) for _, v in extra]
        except Exception as e:  # noqa: BLE001
            error = e if isinstance(e, TypeError) else as_argument_error(e)
            mine = [1] + [0] * (len(keys) - 1)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    infos = [torch.zeros(len(mine), dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(infos, torch.tensor(mine, dtype=torch.int64, device=device), group=group)
    infos = [dict(zip(keys, i.tolist())) for i in infos]

    failed = [r for r, i in enumerate(infos) if i["failed"]]
    if failed:
        if error is not None:
            raise error
        raise ArgumentError(f"lossfuse: {name}: rank(s) {failed} of the group failed their argument checks (their "
                            "error says why); every rank raises so that none is left waiting in a collective")
    differ = [k for k in keys[4:] if k not in ("min", "max") and len({i[k] for i in infos}) > 1]
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
        bad = (t != args.ignore_index) & ((t < 0) | (t >= vocab))
        first = int(bad.reshape(-1).nonzero()[0])
        position = [int(i) for i in torch.unravel_index(torch.tensor(first), tuple(target.shape))]
        raise IndexError(f"lossfuse: {name}: target: expected a class index in [0, {vocab}) or ignore_index "
                         f"({args.ignore_index}), got {int(t.reshape(-1)[first])} at position {position}")
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


def _slice_stats(x, t, ignore_index, eps, scale, softcap, start):
    """Per-row statistics of one slice of the vocabulary, x (rows, C_rank) its logits, t (rows) the global targets
    (int64): (stats, t_local, valid, mine), stats (3, rows) in float64 holding the slice's log-sum-exp (as the kernel
    saves it: max + log-sum summed in double, so the whole lse and the gradients made from it keep the precision of
    the logits' differences at any common offset), the target's z where the target falls in this slice (else 0) and,
    with label smoothing, the sum of the slice's z; t_local the targets handed to the kernels; valid the counted
    rows; mine the rows whose target is in this slice."""
    classes = x.shape[1]
    acc = acc_dtype(x)
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
    stats = torch.zeros(3, x.shape[0], dtype=torch.float64, device=x.device)
    odd = lse_local.isnan()
    if eps > 0:
        stats[2] = (lse_local - loss_local) * classes
        odd |= loss_local.isnan()  # a local target logit of -inf: the kernel's 0 * inf in the unused target term
    if bool(odd.any()):
        # The kernel's NaN lse also marks a row whose z are all -inf, which in a slice only means that the slice
        # adds nothing to the row's sum: its log-sum-exp is -inf. These rows' sums of z are taken directly.
        z_rows = _transform(x[odd].to(acc), scale, softcap)[0]
        lse_local[odd] = torch.where(torch.isneginf(z_rows).all(1), -torch.inf, lse_local[odd])
        stats[2, odd] = z_rows.sum(1).to(stats.dtype) if eps > 0 else 0
    z_target = _transform(x.gather(1, t_local.clamp(min=0).unsqueeze(1)).squeeze(1).to(acc), scale, softcap)[0]
    stats[0] = lse_local
    stats[1] = torch.where(mine, z_target, 0)
    return stats, t_local, valid, mine


def _full_rows(stats, valid, eps, zs, vocab, group):
    """Gathers every rank's per-row statistics (one all_gather): (lse, loss) per row of the whole vocabulary."""
    gathered = [torch.empty_like(stats) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, stats, group=group)
    gathered = torch.stack(gathered)
    lse = torch.logsumexp(gathered[:, 0], 0)
    lse = lse.masked_fill(torch.isneginf(lse), torch.nan)  # a row of only -inf: NaN, its gradient too, as torch
    z_t = gathered[:, 1].sum(0)
    rows = lse - (1 - eps) * z_t + zs * lse * lse
    if eps > 0:
        rows = rows - (eps / vocab) * gathered[:, 2].sum(0)
    return lse, torch.where(valid, rows, 0)


def _whole_loss(stats, valid, o, target_shape, dtype):
    """(lse, counted rows, loss in dtype) of the whole vocabulary from this rank's per-row statistics (o:
    _SliceOptions)."""
    lse, rows = _full_rows(stats, valid, o.label_smoothing, o.z_loss_scale, o.vocab_size, o.group)
    count = valid.sum()
    loss = _reduce(rows, o.reduction, count, lse.dtype)
    return lse, count, (loss.reshape(target_shape) if o.reduction == 0 else loss).to(dtype)


def _reduce(rows, red, count, acc):
    if red == 0:
        return rows
    loss = rows.double().sum()
    return (loss / count if red == 1 else loss).to(acc)


def _slice_grad(x, t_local, lse, valid, mine, go, red, count, o, inplace):
    """The gradient of one slice's logits x (rows, C_rank) from the whole vocabulary's lse (float64): go the upstream
    gradient (per row for reduction 'none', else the scalar) in the accumulation dtype, count the counted rows of the
    whole batch. o: _SliceOptions. inplace: written over x."""
    eps, scale, softcap, zs, vocab = o.label_smoothing, o.logit_scale, o.softcap, o.z_loss_scale, o.vocab_size
    classes = x.shape[1]
    acc = acc_dtype(x)
    # Each row's logit at its local target (its own class here, class 0 for a target elsewhere or an ignored row),
    # read before an in-place gradient overwrites it. Gathers and a scatter, no row selection: nothing is read back.
    col = t_local.clamp(min=0).unsqueeze(1)
    z, dz = _transform(x.gather(1, col).squeeze(1).to(acc), scale, softcap)
    # Every element from the full lse by the backward kernel. With label smoothing eps_k = eps * C_rank / V, the
    # kernel's eps_k / C_rank is the full vocabulary's eps / V (and its softmax coefficient stays 1); its target
    # term, at the local target, is replaced just below.
    eps_k = eps * classes / vocab
    # the kernel runs as for 'none', given each row's scale: a chunk of rows cannot see the whole batch's count
    go_k = go if red == 0 else (go / count if red == 1 else go).expand(x.shape[0]).contiguous()
    args = (lse, None, 0, _LOCAL_IGNORE, eps_k, scale, softcap, zs)
    if inplace:
        torch.ops.lossfuse._cross_entropy_backward_inplace(go_k, x, t_local, *args)
        g = x.detach()
    else:
        g = torch.ops.lossfuse.cross_entropy_backward(go_k, x, t_local, *args)
    # The gradient of the full loss at those elements of the counted rows, q A - eps / V - (1 - eps) [target here],
    # rounded once; an ignored row keeps the kernel's zeros.
    a = 1 + 2 * zs * lse
    b = eps / vocab + (1 - eps) * mine.to(acc)
    at_target = ((torch.exp(z - lse) * a - b) * go_k * dz).to(g.dtype)
    g.scatter_(1, col, torch.where(valid, at_target, g.gather(1, col).squeeze(1)).unsqueeze(1))
    return g


class _VocabParallelCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, target, options):
        o = options
        x = input.reshape(-1, input.shape[-1])
        stats, t_local, valid, mine = _slice_stats(x, target.reshape(-1).long(), o.ignore_index, o.label_smoothing,
                                                   o.logit_scale, o.softcap, o.vocab_start)
        lse, count, loss = _whole_loss(stats, valid, options, target.shape, input.dtype)
        ctx.save_for_backward(x, t_local, lse, valid, mine, count)
        ctx.options = options
        ctx.input_shape = input.shape
        return loss

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss):
        x, t_local, lse, valid, mine, count = ctx.saved_tensors
        red = ctx.options.reduction
        go = grad_loss.to(acc_dtype(x))
        g = _slice_grad(x, t_local, lse, valid, mine, go.reshape(-1) if red == 0 else go, red, count, ctx.options,
                        ctx.options.inplace)
        return g.reshape(ctx.input_shape), None, None


def vocab_parallel_linear_cross_entropy(input, linear_weight, target, group=None, *, linear_bias=None,
                                        vocab_start=None, vocab_size=None, ignore_index=-100, reduction="mean",
                                        label_smoothing=0.0, logit_scale=1.0, softcap=0.0, z_loss_scale=0.0,
                                        chunk_rows=0, reduce_input_grad=True):
    """cross_entropy(input @ W.T + b, target) over a vocabulary whose classifier W is split across the ranks of
    `group` (a vocabulary-parallel output layer), without the N x V logits on any rank, nor N x V / world on one.

    input: the hidden states, (..., H), the same on every rank. linear_weight: this rank's rows of the classifier,
        (C_rank, H), classes [vocab_start, vocab_start + C_rank) of the vocabulary; linear_bias: (C_rank) or None.
        One float dtype for all three.
    target, vocab_start, vocab_size, ignore_index, reduction, label_smoothing, logit_scale, softcap, z_loss_scale:
        as vocab_parallel_cross_entropy (the same checks, every rank raising together).
    chunk_rows: rows of logits made at a time (0: as many as fit 32 MiB of the accumulation dtype). Each rank
        makes its slice's logits a chunk at a time, in float32 for 16-bit operands (float64 for float64), and keeps
        none: the forward keeps per-row statistics, gathered as vocab_parallel_cross_entropy does; backward makes
        each chunk's logits again, turns them into their gradient from the whole vocabulary's log-sum-exp (in place)
        and adds its products into the gradients of input, W and b (float32 accumulators for 16-bit operands).
    reduce_input_grad: the input's gradient is summed over the ranks (an all_reduce), so that each rank gets the
        gradient of the whole loss; False leaves each rank its own slice's share (for a caller whose own
        communication sums it, as a tensor-parallel region's backward does).

    Returns the loss on every rank (per row of `target`'s shape for 'none'), in the input's dtype (inside
    torch.autocast, which casts the operands but float64 ones to its dtype as for torch's linear: float32, or float64
    for float64 operands). Eager autograd, first derivatives.
    Collectives: two small all_gathers in the forward (the argument check, then 3 numbers per row and rank), one
    all_reduce of N x H in backward when reduce_input_grad and the input requires grad. The argument check also
    compares H, reduce_input_grad and whether the input requires grad across the ranks; every rank must then run
    the backward, asking for the input's gradient alike.
    """
    name = "vocab_parallel_linear_cross_entropy"
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"lossfuse: {name}: torch.distributed is not initialized (init_process_group first)")
    # torch.autocast: the operands in the autocast dtype, as torch's linear takes them (the logits are then made in
    # float32 with autocast off, the same in forward and backward), the loss in float32 as torch's cross_entropy
    autocasting, (input, linear_weight, linear_bias) = autocast_lower(input, linear_weight, linear_bias)
    error, logits_like, chunk_rows = _linear_arguments(name, input, linear_weight, linear_bias, target, chunk_rows)
    if error is None:
        error, args = _local_arguments(name, logits_like, target, vocab_start, vocab_size, ignore_index, reduction,
                                       label_smoothing, logit_scale, softcap, z_loss_scale, False)
    else:
        args = None
    device = input.device if isinstance(input, torch.Tensor) else torch.device("cpu")
    # What the backward's all_reduce depends on must be the same on every rank, or one rank would wait in it alone.
    need_x = isinstance(input, torch.Tensor) and input.requires_grad and torch.is_grad_enabled()
    extra = (("hidden size", input.shape[-1] if error is None else 0), ("reduce_input_grad", bool(reduce_input_grad)),
             ("input requires grad", need_x))
    vocab_start, vocab_size = _agree(name, logits_like, target, vocab_start, vocab_size, error, args, group,
                                     _collective_device(group, input), extra)
    classes = linear_weight.shape[0]
    acc = acc_dtype(input)
    rows = chunk_rows or max(1, (32 << 20) // (classes * torch.finfo(acc).bits // 8))
    try:
        with torch.autocast(device.type, enabled=False):
            loss = _VocabParallelLinearCE.apply(input, linear_weight, linear_bias, target,
                                                _SliceOptions(*args, vocab_start, vocab_size, group, chunk_rows=rows,
                                                              reduce_input_grad=bool(reduce_input_grad)))
    except ValueError as e:
        raise as_argument_error(e) from None
    return loss if autocasting else loss.to(input.dtype)


def _linear_arguments(name, input, weight, bias, target, chunk_rows):
    """This rank's checks of the linear operands, raising nothing: (the error or None, a meta tensor shaped as this
    rank's logits, (..., C_rank), for the checks shared with vocab_parallel_cross_entropy, chunk_rows as an int)."""
    try:
        for arg, v in (("input", input), ("linear_weight", weight)):
            if not isinstance(v, torch.Tensor):
                raise TypeError(f"{name}(): {arg} must be a tensor, got {type(v).__name__}")
        if bias is not None and not isinstance(bias, torch.Tensor):
            raise TypeError(f"{name}(): linear_bias must be a tensor or None, got {type(bias).__name__}")
        if input.dtype not in _DTYPES:
            raise ArgumentError(f"lossfuse: {name}: input: expected float32, float64, bfloat16 or float16, got "
                                f"{input.dtype}")
        if input.dim() < 1:
            raise ArgumentError(f"lossfuse: {name}: input: expected shape (..., H), got a 0-d tensor")
        if weight.dim() != 2 or weight.shape[1] != input.shape[-1]:
            raise ArgumentError(f"lossfuse: {name}: linear_weight: expected shape (C_rank, {input.shape[-1]}) "
                                f"(input's last dimension), got {tuple(weight.shape)}")
        if bias is not None and tuple(bias.shape) != (weight.shape[0],):
            raise ArgumentError(f"lossfuse: {name}: linear_bias: expected shape ({weight.shape[0]},), got "
                                f"{tuple(bias.shape)}")
        for arg, v in (("linear_weight", weight), ("linear_bias", bias)):
            if v is not None and (v.dtype != input.dtype or v.device != input.device):
                raise ArgumentError(f"lossfuse: {name}: {arg}: expected the input's dtype and device "
                                    f"({input.dtype}, {input.device}), got {v.dtype}, {v.device}")
        try:
            rows = operator.index(chunk_rows)
        except TypeError:
            raise TypeError(f"{name}(): chunk_rows must be an int, got {type(chunk_rows).__name__}") from None
        if rows < 0:
            raise ArgumentError(f"lossfuse: {name}: chunk_rows: expected 0 (auto) or a positive count, got {rows}")
        return None, torch.empty((*input.shape[:-1], weight.shape[0]), dtype=input.dtype, device="meta"), rows
    except Exception as e:  # noqa: BLE001  (raised on every rank by _agree)
        return (e if isinstance(e, TypeError) else as_argument_error(e)), None, 0


_CLASS_BLOCK = 4096  # classes of a 16-bit weight converted to float32 at a time


def _weight_blocks(w, acc):
    """(first class, the rows of w from it in acc): the whole of w when it is in acc, else blocks of classes."""
    if w.dtype == acc:
        yield 0, w
        return
    for c0 in range(0, w.shape[0], _CLASS_BLOCK):
        yield c0, w[c0:c0 + _CLASS_BLOCK].to(acc)


def _chunk_logits(x, w, b, acc):
    """x (rows, H) @ w.T + b in acc, whatever the operands' dtype."""
    x = x.to(acc)
    if w.dtype == acc:
        return torch.nn.functional.linear(x, w, b)
    out = torch.empty(x.shape[0], w.shape[0], dtype=acc, device=x.device)
    for c0, wb in _weight_blocks(w, acc):
        out[:, c0:c0 + wb.shape[0]] = x @ wb.t()
    if b is not None:
        out += b.to(acc)
    return out


class _VocabParallelLinearCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias, target, options):
        o = options
        chunk = o.chunk_rows
        x = input.reshape(-1, input.shape[-1])
        t = target.reshape(-1).long()
        acc = acc_dtype(input)
        n = x.shape[0]
        stats = torch.zeros(3, n, dtype=torch.float64, device=x.device)
        t_local = torch.empty_like(t)
        valid = torch.empty(n, dtype=torch.bool, device=x.device)
        mine = torch.empty_like(valid)
        for r0 in range(0, n, chunk):
            r1 = min(n, r0 + chunk)
            logits = _chunk_logits(x[r0:r1], weight, bias, acc)
            stats[:, r0:r1], t_local[r0:r1], valid[r0:r1], mine[r0:r1] = _slice_stats(
                logits, t[r0:r1], o.ignore_index, o.label_smoothing, o.logit_scale, o.softcap, o.vocab_start)
        lse, count, loss = _whole_loss(stats, valid, options, target.shape, acc)  # in acc: rounded by the caller
        ctx.save_for_backward(x, weight, bias, t_local, lse, valid, mine, count)
        ctx.options = options
        ctx.input_shape = input.shape
        return loss

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss):
        x, weight, bias, t_local, lse, valid, mine, count = ctx.saved_tensors
        o = ctx.options
        red, group, chunk, reduce_dx = o.reduction, o.group, o.chunk_rows, o.reduce_input_grad
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        acc = acc_dtype(x)
        go = grad_loss.to(acc).reshape(-1) if red == 0 else grad_loss.to(acc)
        n = x.shape[0]
        dx = torch.zeros(x.shape, dtype=acc, device=x.device) if need_x else None
        dw = torch.zeros(weight.shape, dtype=acc, device=x.device) if need_w else None
        db = torch.zeros(weight.shape[0], dtype=acc, device=x.device) if need_b and bias is not None else None
        with torch.autocast(x.device.type, enabled=False):
            for r0 in range(0, n if need_x or need_w or db is not None else 0, chunk):
                r1 = min(n, r0 + chunk)
                xc = x[r0:r1].to(acc)
                g = _slice_grad(_chunk_logits(xc, weight, bias, acc), t_local[r0:r1], lse[r0:r1], valid[r0:r1],
                                mine[r0:r1], go[r0:r1] if red == 0 else go, red, count, o, True)
                for c0, wb in _weight_blocks(weight, acc) if need_x or need_w else ():
                    gb = g[:, c0:c0 + wb.shape[0]]
                    if need_x:
                        dx[r0:r1].addmm_(gb, wb)
                    if need_w:
                        dw[c0:c0 + wb.shape[0]].addmm_(gb.t(), xc)
                if db is not None:
                    db += g.sum(0)
        if need_x and reduce_dx:
            dist.all_reduce(dx, group=group)
        return (dx.to(x.dtype).reshape(ctx.input_shape) if need_x else None,
                dw.to(weight.dtype) if need_w else None, db.to(bias.dtype) if db is not None else None, None, None)
