"""lossfuse.distributed's vocab-parallel losses against torch's cross_entropy on the whole vocabulary.

Each test starts its ranks as separate processes (gloo over a file in a temporary directory: nothing leaves the machine;
the CUDA tests: gloo with CUDA tensors, and NCCL, one rank per GPU). Every rank builds the same full logits from a fixed
seed, takes its slice of the classes, and checks its own loss and its own slice of the gradient against torch on the
full logits (float64 reference; for 16-bit inputs our error must be no larger than torch's own on the same inputs), so a
wrong value anywhere fails on the rank that holds it. A worker that fails exits non-zero with its traceback; the test
reports it. Ranks run with a timeout, so a collective left waiting fails the test instead of hanging it.
"""

import math
import os
import subprocess
import sys
import traceback

import pytest
import torch
import torch.nn.functional as F

import lossfuse
import lossfuse.nn.functional as LF
from lossfuse.distributed import vocab_parallel_cross_entropy as vpce
from lossfuse.distributed import vocab_parallel_linear_cross_entropy as vplce

TIMEOUT_S = 240
DEVICE = torch.device("cpu")  # where the ranks' tensors live: set by worker


def run_ranks(tmp_path, case, world, backend="gloo", device="cpu"):
    """Runs this file's worker for `case` on `world` ranks over `backend`, the tensors on `device` ('cuda': rank r
    on GPU r for NCCL, all on GPU 0 for gloo); fails with every failing rank's output."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    init = tmp_path / "rendezvous"
    procs = [subprocess.Popen([sys.executable, __file__, case, str(rank), str(world), str(init), backend, device],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
             for rank in range(world)]
    failures = []
    for rank, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"rank {rank} of {world} still running after {TIMEOUT_S} s (a collective left waiting?)")
        if p.returncode != 0:
            failures.append(f"rank {rank} of {world} exited {p.returncode}:\n{out}")
    assert not failures, "\n".join(failures)


# ---- what the ranks run -----------------------------------------------------------------------------------------

SPLITS = {1: [41], 2: [23, 18], 3: [1, 30, 10]}  # unequal slices of a 41-class vocabulary; one slice of a single class
V = 41
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def full_inputs(dtype, shape=(5, 6), target_dtype=torch.int64, seed=3):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(*shape, V, generator=g) * 3).to(dtype)
    t = torch.randint(0, V, shape, generator=g)
    t.view(-1)[::4] = -100
    t = t.to(target_dtype) if target_dtype != torch.uint8 else t.clamp(min=0).to(torch.uint8)
    return x.to(DEVICE), t.to(DEVICE)


def my_slice(x, rank, world):
    sizes = SPLITS[world]
    start = sum(sizes[:rank])
    return x[..., start:start + sizes[rank]], start


def torch_loss(x, t, kw):
    """torch's loss of logits x (classes last) with lossfuse's options (z = softcap tanh(logit_scale x / softcap),
    z-loss), by cross_entropy on the whole vocabulary."""
    z = x * kw.get("logit_scale", 1.0)
    cap = kw.get("softcap", 0.0)
    if cap:
        z = cap * torch.tanh(z / cap)
    ignore = kw.get("ignore_index", -100)
    loss = F.cross_entropy(z.movedim(-1, 1) if z.dim() > 1 else z, t.long(), ignore_index=ignore, reduction="none",
                           label_smoothing=kw.get("label_smoothing", 0.0))
    zs = kw.get("z_loss_scale", 0.0)
    if zs:
        loss = loss + torch.where(t.long() == ignore, 0.0, zs * torch.logsumexp(z, -1) ** 2)
    red = kw.get("reduction", "mean")
    if red == "mean":
        loss = loss.sum() / (t.long() != ignore).sum()
    elif red == "sum":
        loss = loss.sum()
    return loss


def reference(x, t, kw, upstream):
    """torch's loss and gradient on the full logits, in float64 (class dim moved to 1 as torch takes it), and
    torch's own in the input's dtype (for the 16-bit comparison)."""
    out = []
    for dtype in (torch.float64, x.dtype):
        xr = x.detach().to(dtype).requires_grad_()
        loss = torch_loss(xr, t, kw)
        (grad,) = torch.autograd.grad(loss, xr, upstream(loss))
        out.append((loss.detach(), grad))
    return out


def check_against(ours, ref64, theirs, dtype, what):
    ours, ref64, theirs = ours.double(), ref64.double(), theirs.double()
    assert ours.shape == ref64.shape, f"{what}: shape {tuple(ours.shape)} != {tuple(ref64.shape)}"
    assert torch.equal(ours.isnan(), ref64.isnan()), f"{what}: NaN at other places than torch's"
    inf = ref64.isinf()
    assert torch.equal(ours.isinf(), inf) and torch.equal(ours[inf], ref64[inf]), f"{what}: infinities not torch's"
    ok = ref64.isfinite()
    err = (ours[ok] - ref64[ok]).abs().max().item() if ok.any() else 0.0
    if dtype in (torch.float32, torch.float64):
        tol = (1e-12 if dtype == torch.float64 else 2e-5) * max(1.0, ref64[ok].abs().max().item() if ok.any() else 1)
        assert err <= tol, f"{what}: largest error {err:.3g} > {tol:.3g}"
    else:
        theirs_err = (theirs[ok] - ref64[ok]).abs().max().item() if ok.any() else 0.0
        assert err <= theirs_err + 1e-7, f"{what}: largest error {err:.3g}, torch's own {theirs_err:.3g}"


def grad_without_sync(loss, leaf, upstream):
    """torch.autograd.grad(loss, leaf, upstream); with CUDA tensors the backward makes no synchronising torch call
    (torch's sync debug mode raises on one) and reads nothing back inside lossfuse."""
    if DEVICE.type != "cuda":
        return torch.autograd.grad(loss, leaf, upstream)
    torch.cuda.synchronize()
    before = lossfuse.cuda_host_syncs()
    torch.cuda.set_sync_debug_mode("error")
    try:
        grads = torch.autograd.grad(loss, leaf, upstream)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert lossfuse.cuda_host_syncs() == before, "the backward read values back"
    return grads


def one_case(rank, world, dtype, kw, shape=(5, 6), target_dtype=torch.int64, upstream=lambda l: torch.ones_like(l),
             give_slice=False, edit=None, inplace=False):
    x, t = full_inputs(dtype, shape, target_dtype)
    if edit is not None:
        edit(x, t)
    (loss64, grad64), (loss_t, grad_t) = reference(x, t, kw, upstream)
    mine, start = my_slice(x, rank, world)
    xs = mine.clone().requires_grad_()
    logits = xs * 1 if inplace else xs  # in place: logits made by an operation, the gradient taken through them
    extra = dict(vocab_start=start, vocab_size=V) if give_slice else {}
    loss = vpce(logits, t, **kw, **extra, inplace=inplace)
    what = f"rank {rank}/{world} {dtype} {kw} shape {shape} target {target_dtype} inplace {inplace}"
    assert loss.dtype == dtype, f"{what}: loss dtype {loss.dtype}"
    check_against(loss.detach(), loss64, loss_t, dtype, what + " loss")
    (grad,) = grad_without_sync(loss, xs, upstream(loss.detach()).to(loss.dtype))
    assert grad.dtype == dtype
    if inplace:
        assert torch.equal(logits.detach(), grad), f"{what}: the logits must hold their gradient"
    sl = slice(start, start + xs.shape[-1])
    check_against(grad, grad64[..., sl], grad_t[..., sl], dtype, what + " gradient")


def case_values(rank, world):
    for dtype in DTYPES:
        for reduction in ("mean", "sum", "none"):
            one_case(rank, world, dtype, dict(reduction=reduction))
            one_case(rank, world, dtype, dict(reduction=reduction, label_smoothing=0.1, z_loss_scale=1e-2))
    def upstream_rows(loss):  # the same per-row upstream gradient at every call
        g = torch.Generator().manual_seed(11)
        return (torch.rand(loss.shape, generator=g, dtype=torch.float64) + 0.5).to(loss.device, loss.dtype)
    one_case(rank, world, torch.float32, dict(reduction="none", softcap=4.0, logit_scale=1.5), upstream=upstream_rows)
    one_case(rank, world, torch.float32, dict(reduction="mean"), upstream=lambda l: torch.full_like(l, 3.7))
    one_case(rank, world, torch.float32, dict(ignore_index=0, label_smoothing=0.2), give_slice=True,
             edit=lambda x, t: t.masked_fill_(t == -100, 0))  # ignore_index 0, a class of the first slice
    for target_dtype in (torch.uint8, torch.int16, torch.int32):
        one_case(rank, world, torch.float32, dict(reduction="sum"), target_dtype=target_dtype)
    one_case(rank, world, torch.float32, dict(label_smoothing=-0.3))  # negative: no smoothing, as torch
    one_case(rank, world, torch.float32, dict(label_smoothing=math.nan))  # NaN: none either, as torch
    one_case(rank, world, torch.float32, dict(), shape=(7,))  # (N, V_rank)
    one_case(rank, world, torch.float32, dict(), shape=(2, 3, 4))
    # logits at a large common offset (float32 ulp 0.125 at 2^20): the slices' lse are gathered in float64 (max +
    # log-sum summed in double), so the whole lse and the gradients made from it keep the precision of the logits'
    # differences (the lse rounded to float32 put 1.5e-2 into the 'none' gradient)
    for offset in (2.0 ** 20, -2.0 ** 20):
        for kw in (dict(reduction="none"), dict(reduction="mean", label_smoothing=0.1)):
            one_case(rank, world, torch.float32, kw, upstream=upstream_rows if kw["reduction"] == "none" else
                     (lambda l: torch.ones_like(l)), edit=lambda x, t, o=offset: x.add_(o))
    # inplace=True: the gradient written over each rank's logits in backward
    for dtype in DTYPES:
        one_case(rank, world, dtype, dict(reduction="mean", label_smoothing=0.1, z_loss_scale=1e-2), inplace=True)
    one_case(rank, world, torch.float32, dict(reduction="none", softcap=4.0, logit_scale=1.5), upstream=upstream_rows,
             inplace=True)
    one_case(rank, world, torch.bfloat16, dict(reduction="sum"), target_dtype=torch.uint8, inplace=True)
    one_case(rank, world, torch.float32, dict(), shape=(2, 3, 4), inplace=True)


def raises_on_every_rank(rank, world, what, call):
    """call() has a bad argument on the last rank only: that rank's error names it, the others' name that rank."""
    try:
        call()
    except (ValueError, TypeError) as e:
        assert (what if rank == world - 1 else f"rank(s) [{world - 1}]") in str(e), str(e)
    else:
        raise AssertionError(f"no error on rank {rank} for a bad {what} on rank {world - 1}")


def raises_together(what, call):
    """call() raises ValueError naming `what` on every rank (what only the ranks together can see)."""
    try:
        call()
    except ValueError as e:
        assert what in str(e), str(e)
    else:
        raise AssertionError(f"no error for {what}")


def case_edges(rank, world):
    def masked(x, t):  # a row -inf but in the last class (held by the last slice), rows of only -inf
        x[0, 0, :-1] = -math.inf
        t[0, 0] = V - 1
        x[0, 1, :] = -math.inf
        x[1, 2, 5] = math.nan  # a NaN row, and an ignored one with a NaN
        t[1, 3] = -100
        x[1, 3, 7] = math.nan
        x[1, 0, :] = -math.inf  # an ignored row of only -inf: torch's gradient is NaN there too
        t[1, 0] = -100
    one_case(rank, world, torch.float32, dict(reduction="none"), edit=masked)
    one_case(rank, world, torch.float32, dict(reduction="sum"), edit=masked)
    one_case(rank, world, torch.float32, dict(reduction="none", label_smoothing=0.1), edit=masked)  # inf losses

    def holes(x, t):  # -inf at a target, and at each slice's first class in rows whose target is elsewhere
        t[1, 1] = 3
        x[1, 1, 3] = -math.inf
        for c in (0, 1, 23, 31):
            x[0, 2, c] = -math.inf
        t[0, 2] = 40
    for reduction in ("none", "mean"):
        one_case(rank, world, torch.float32, dict(reduction=reduction, label_smoothing=0.1), edit=holes)
        one_case(rank, world, torch.float32, dict(reduction=reduction), edit=holes)
    # every row ignored: 'mean' is 0 / 0 = NaN and the gradient 0, as torch
    one_case(rank, world, torch.float32, dict(ignore_index=5), edit=lambda x, t: t.fill_(5))
    # a bad target raises IndexError on every rank (none waits in a collective), naming its position and value
    x, t = full_inputs(torch.float32)
    t[2, 4] = V
    mine, _ = my_slice(x, rank, world)
    try:
        vpce(mine, t)
    except IndexError as e:
        assert f"got {V} at position [2, 4]" in str(e) and f"[0, {V})" in str(e), str(e)
    else:
        raise AssertionError("no IndexError for a target past the vocabulary")
    for bad, match in [(dict(vocab_start=0), "both or neither"), (dict(label_smoothing=1.5), "label_smoothing"),
                       (dict(vocab_start=V, vocab_size=V), "vocab_start"), (dict(reduction="avg"), "reduction"),
                       (dict(logit_scale=math.nan), "logit_scale"),
                       # the forward computes the z-loss itself: the scale float32 cannot hold is refused up front,
                       # not by the kernel in backward
                       (dict(z_loss_scale=1e-50), "z_loss_scale"), (dict(z_loss_scale=1e39), "z_loss_scale"),
                       (dict(z_loss_scale=-1.0), "z_loss_scale")]:
        try:
            vpce(mine, full_inputs(torch.float32)[1], **bad)
        except ValueError as e:
            assert match in str(e), str(e)
        else:
            raise AssertionError(f"no error for {bad}")
    # An argument bad on one rank only: every rank raises (the others name it), and the next call is right.
    last = rank == world - 1
    x, t = full_inputs(torch.float32)
    mine, start = my_slice(x, rank, world)
    for what, call in [("vocab_start", lambda: vpce(mine, t, vocab_start=-1 if last else start, vocab_size=V)),
                       ("at least one class", lambda: vpce(mine[..., :0] if last else mine, t)),
                       ("expected shape", lambda: vpce(mine, t[:, :2] if last else t)),
                       ("must be tensors", lambda: vpce(mine, t.tolist() if last else t)),
                       ("cannot convert float infinity",
                        lambda: vpce(mine, t, ignore_index=math.inf if last else -100)),
                       ("vocab_size: expected a value of magnitude below 2^62",
                        lambda: vpce(mine, t, vocab_start=start, vocab_size=2**70 if last else V)),
                       ("a leaf Variable that requires grad",  # torch's in-place rules, inplace=True
                        lambda: vpce(mine.clone().requires_grad_() if last else mine, t, inplace=True)),
                       ("inplace: expected logits whose elements do not share memory",
                        lambda: vpce((mine[..., :1].clone().requires_grad_() * 1).expand_as(mine) if last else mine,
                                     t, inplace=True))]:
        raises_on_every_rank(rank, world, what, call)
        one_case(rank, world, torch.float32, dict())
    # What only the ranks together can see, raised on every rank: slices that do not tile the vocabulary once,
    # targets or options that differ between ranks.
    t_other = t.clone()
    if rank == 0:
        t_other[0, 1] = (int(t_other[0, 1]) + 1) % V
    t_swapped = t.clone()  # the same multiset of targets, two swapped: a plain weighted sum would not see it
    t_swapped[0, :2] = torch.tensor([2, 0]) if rank == 0 else torch.tensor([0, 1])
    t_ignored = t.clone().masked_fill_(t == -100, -1)
    for what, call in [("cover [0, vocab_size) once", lambda: vpce(mine, t, vocab_start=0, vocab_size=V)),
                       ("differ: targets", lambda: vpce(mine, t_other)),
                       ("differ: targets", lambda: vpce(mine, t_swapped)),
                       ("differ: label_smoothing", lambda: vpce(mine, t, label_smoothing=0.1 if last else 0.0)),
                       ("differ: ignore_index", lambda: vpce(mine, t_ignored, ignore_index=-2 if last else -1)),
                       ("differ: dtype", lambda: vpce(mine.double() if last else mine, t))]:
        raises_together(what, call)
    # the same after the errors: the ranks are still in step
    one_case(rank, world, torch.float32, dict())
    one_case(rank, world, torch.float32, dict(label_smoothing=0.1), give_slice=True)


def case_gradcheck(rank, world):
    x, t = full_inputs(torch.float64, (3, 2))
    for kw in (dict(), dict(reduction="none", label_smoothing=0.3, softcap=3.0, z_loss_scale=0.05, logit_scale=0.7)):
        xs = x.clone().requires_grad_()
        assert torch.autograd.gradcheck(lambda a: vpce(a, t, **kw), (xs,))
    # the loss equals lossfuse's single-device cross_entropy on the same (whole) logits
    kw = dict(label_smoothing=0.1, softcap=5.0, z_loss_scale=1e-3)
    torch.testing.assert_close(vpce(x, t, **kw), LF.cross_entropy(x.movedim(-1, 1), t, **kw), rtol=1e-12, atol=0)


# ---- vocab_parallel_linear_cross_entropy ----------------------------------------------------------------------------

H = 6


def linear_inputs(dtype, lead=(9,), bias=True, seed=5):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, H, generator=g).to(dtype)
    w = (torch.randn(V, H, generator=g) * 0.8).to(dtype)
    b = torch.randn(V, generator=g).to(dtype) if bias else None
    t = torch.randint(0, V, lead, generator=g)
    t.view(-1)[::4] = -100
    return tuple(a if a is None else a.to(DEVICE) for a in (x, w, b, t))


def linear_case(rank, world, dtype, kw, lead=(9,), bias=True, chunk_rows=0, reduce_input_grad=True,
                upstream=lambda l: torch.ones_like(l), edit=None):
    """This rank's loss and its gradients of input, its rows of W and of b, against torch's cross_entropy of torch's
    linear over the whole classifier (float64; for 16-bit, torch's own error in that dtype bounds ours)."""
    import torch.distributed as dist
    x, w, b, t = linear_inputs(dtype, lead, bias)
    if edit is not None:
        edit(x, w, b, t)
    refs = []
    for d in (torch.float64, dtype):
        leaves = [a.detach().to(d).requires_grad_() for a in (x, w, b) if a is not None]
        loss = torch_loss(F.linear(*leaves), t, kw)
        refs.append((loss.detach(), torch.autograd.grad(loss, leaves, upstream(loss))))
    (loss64, g64), (loss_t, g_t) = refs
    start = sum(SPLITS[world][:rank])
    sl = slice(start, start + SPLITS[world][rank])
    leaves = [x.clone().requires_grad_(), w[sl].clone().requires_grad_()] + \
        ([b[sl].clone().requires_grad_()] if bias else [])
    loss = vplce(leaves[0], leaves[1], t, linear_bias=leaves[2] if bias else None, chunk_rows=chunk_rows,
                 reduce_input_grad=reduce_input_grad, **kw)
    what = f"rank {rank}/{world} {dtype} {kw} lead {lead} bias {bias} chunk_rows {chunk_rows}"
    assert loss.dtype == dtype, f"{what}: loss dtype {loss.dtype}"
    check_against(loss.detach(), loss64, loss_t, dtype, what + " loss")
    grads = torch.autograd.grad(loss, leaves, upstream(loss.detach()).to(loss.dtype))
    assert [g.dtype for g in grads] == [dtype] * len(grads)
    dx = grads[0]
    if not reduce_input_grad:  # each rank's share: their sum is the gradient
        dx = dx.double()
        dist.all_reduce(dx)
    check_against(dx, g64[0], g_t[0], dtype, what + " input gradient")
    check_against(grads[1], g64[1][sl], g_t[1][sl], dtype, what + " weight gradient")
    if bias:
        check_against(grads[2], g64[2][sl], g_t[2][sl], dtype, what + " bias gradient")


def case_linear(rank, world):
    for dtype in DTYPES:
        for reduction in ("mean", "sum", "none"):
            linear_case(rank, world, dtype, dict(reduction=reduction))
        linear_case(rank, world, dtype, dict(label_smoothing=0.1, z_loss_scale=1e-2), chunk_rows=2)
    def upstream_rows(loss):
        g = torch.Generator().manual_seed(12)
        return (torch.rand(loss.shape, generator=g, dtype=torch.float64) + 0.5).to(loss.device, loss.dtype)
    linear_case(rank, world, torch.float32, dict(reduction="none", softcap=4.0, logit_scale=1.5, label_smoothing=0.2),
                upstream=upstream_rows, chunk_rows=4)
    linear_case(rank, world, torch.float32, dict(reduction="sum"), upstream=lambda l: torch.full_like(l, 3.7))
    linear_case(rank, world, torch.float64, dict(), bias=False, chunk_rows=1)
    linear_case(rank, world, torch.float32, dict(label_smoothing=0.1), lead=(2, 3))
    linear_case(rank, world, torch.bfloat16, dict(label_smoothing=0.1), reduce_input_grad=False)
    linear_case(rank, world, torch.float32, dict(ignore_index=7), edit=lambda x, w, b, t: t.fill_(7))  # all ignored
    linear_case(rank, world, torch.float32, dict(), lead=(0,))  # no rows
    linear_case(rank, world, torch.float32, dict(), lead=())  # unbatched: input (H), target ()
    # logits at a large common offset: x = 0 and b = 2^20 + b, so every row's logits are b exactly (float32 rounds
    # x W^T + b itself, torch's too); the whole lse in float64 keeps the gradients' precision (db, dx = G W)
    for kw in (dict(reduction="none"), dict(reduction="mean", label_smoothing=0.1)):
        linear_case(rank, world, torch.float32, kw, chunk_rows=4, upstream=upstream_rows if kw["reduction"] == "none"
                    else (lambda l: torch.ones_like(l)), edit=lambda x, w, b, t: (x.zero_(), b.add_(2.0 ** 20)))
    linear_autocast_case(rank, world)
    import lossfuse.distributed as D  # 16-bit weights converted to float32 a few classes at a time
    saved, D._CLASS_BLOCK = D._CLASS_BLOCK, 8
    try:
        for dtype in (torch.bfloat16, torch.float16):
            linear_case(rank, world, dtype, dict(label_smoothing=0.1, z_loss_scale=1e-2), chunk_rows=4)
    finally:
        D._CLASS_BLOCK = saved

    # bad operands on one rank: every rank raises (the others name it), then the ranks are still in step
    x, w, b, t = linear_inputs(torch.float32)
    start = sum(SPLITS[world][:rank])
    ws, bs = w[start:start + SPLITS[world][rank]], b[start:start + SPLITS[world][rank]]
    last = rank == world - 1
    for what, call in [("linear_weight: expected shape", lambda: vplce(x, ws[:, :4] if last else ws, t)),
                       ("linear_bias: expected shape", lambda: vplce(x, ws, t, linear_bias=bs[:1] if last else bs)),
                       ("linear_weight: expected the input's dtype", lambda: vplce(x, ws.double() if last else ws, t)),
                       ("chunk_rows", lambda: vplce(x, ws, t, chunk_rows=-1 if last else 0)),
                       ("target: expected shape", lambda: vplce(x, ws, t[:5] if last else t)),
                       ("must be a tensor", lambda: vplce(x.tolist() if last else x, ws, t)),
                       ("input: expected shape (..., H), got a 0-d tensor",
                        lambda: vplce(torch.tensor(1.0) if last else x, ws, t)),
                       ("chunk_rows must be an int", lambda: vplce(x, ws, t, chunk_rows=2.5 if last else 0))]:
        raises_on_every_rank(rank, world, what, call)
    # what the backward's all_reduce depends on, different on one rank: every rank raises in the forward (none is
    # left waiting in backward)
    xg = x.clone().requires_grad_()
    for what, call in [("differ: hidden size", lambda: vplce(x[:, :5] if last else x, ws[:, :5] if last else ws, t)),
                       ("differ: reduce_input_grad", lambda: vplce(xg, ws, t, reduce_input_grad=not last)),
                       ("differ: input requires grad", lambda: vplce(xg if last else x, ws, t))]:
        raises_together(what, call)
    bad = t.clone()
    bad[3] = V
    try:
        vplce(x, ws, bad)
    except IndexError as e:
        assert f"got {V} at position [3]" in str(e), str(e)
    else:
        raise AssertionError("no IndexError for a target past the vocabulary")
    linear_case(rank, world, torch.float32, dict())


def linear_autocast_case(rank, world):
    """float32 operands inside torch.autocast(bfloat16): the operands rounded to bfloat16 as torch's linear takes them,
    the loss in float32, the gradients of the float32 leaves (backward inside the region too). The logits are then
    made in float32: the loss is float64's on the rounded operands within float32's tolerance (torch's own
    composition, with bfloat16 logits, is further off, as is a forward whose logits autocast made in bfloat16). The
    gradients are rounded to bfloat16 on their way back through the casts, as torch's: no further off than torch's."""
    x, w, b, t = linear_inputs(torch.float32)
    kw = dict(label_smoothing=0.1, z_loss_scale=1e-2)
    low = [a.to(torch.bfloat16).double().requires_grad_() for a in (x, w, b)]
    loss64 = torch_loss(F.linear(*low), t, kw)
    g64 = torch.autograd.grad(loss64, low)
    leaves_t = [a.clone().requires_grad_() for a in (x, w, b)]
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        loss_t = torch_loss(F.linear(*leaves_t), t, kw)
    g_t = torch.autograd.grad(loss_t, leaves_t)
    start = sum(SPLITS[world][:rank])
    sl = slice(start, start + SPLITS[world][rank])
    leaves = [x.clone().requires_grad_(), w[sl].clone().requires_grad_(), b[sl].clone().requires_grad_()]
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        loss = vplce(leaves[0], leaves[1], t, linear_bias=leaves[2], chunk_rows=4, **kw)
        grads = torch.autograd.grad(loss, leaves)
    what = f"rank {rank}/{world} autocast"
    assert loss.dtype == torch.float32 and all(g.dtype == torch.float32 for g in grads), what
    check_against(loss.detach(), loss64, loss_t.detach(), torch.float32, what + " loss")
    check_against(grads[0], g64[0], g_t[0], torch.bfloat16, what + " input gradient")
    check_against(grads[1], g64[1][sl], g_t[1][sl], torch.bfloat16, what + " weight gradient")
    check_against(grads[2], g64[2][sl], g_t[2][sl], torch.bfloat16, what + " bias gradient")
    # exactly the call outside autocast on the bfloat16 operands (its backward included: logits made in bfloat16
    # there would change the gradients)
    low = [a.detach().bfloat16().requires_grad_() for a in leaves]
    loss_low = vplce(low[0], low[1], t, linear_bias=low[2], chunk_rows=4, **kw)
    assert torch.equal(loss.detach().bfloat16(), loss_low.detach()), what
    for g, h in zip(grads, torch.autograd.grad(loss_low, low)):
        assert torch.equal(g, h.float()), what + ": gradients differ from the bfloat16 call's"
    x8 = leaves[0].detach().mul(8).requires_grad_()  # logits large enough for their rounding to show
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        g8 = torch.autograd.grad(vplce(x8, leaves[1], t, linear_bias=leaves[2], chunk_rows=4, **kw), x8)[0]
    x8_low = x8.detach().bfloat16().requires_grad_()
    g8_low = torch.autograd.grad(vplce(x8_low, low[1], t, linear_bias=low[2], chunk_rows=4, **kw), x8_low)[0]
    assert torch.equal(g8, g8_low.float()), what + ": x 8, gradients differ from the bfloat16 call's"


def case_linear_gradcheck(rank, world):
    x, w, b, t = linear_inputs(torch.float64, (4,))
    for kw in (dict(), dict(reduction="none", label_smoothing=0.3, softcap=3.0, z_loss_scale=0.05, logit_scale=0.7)):
        leaves = [a.clone().requires_grad_() for a in (x, w, b)]
        assert torch.autograd.gradcheck(lambda *a: vplce(a[0], a[1], t, linear_bias=a[2], chunk_rows=3, **kw),
                                        leaves)
    # the loss equals lossfuse's single-device linear_cross_entropy on the whole classifier
    kw = dict(label_smoothing=0.1, softcap=5.0, z_loss_scale=1e-3)
    torch.testing.assert_close(vplce(x, w, t, linear_bias=b, **kw),
                               LF.linear_cross_entropy(x, w, t, linear_bias=b, **kw), rtol=1e-12, atol=0)


def worker(case, rank, world, init, backend, device):
    import torch.distributed as dist
    import datetime
    global DEVICE
    if device == "cuda":
        DEVICE = torch.device("cuda", rank if backend == "nccl" else 0)
        torch.cuda.set_device(DEVICE)
    dist.init_process_group(backend, init_method=f"file://{init}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S - 30))
    try:
        {"values": case_values, "edges": case_edges, "gradcheck": case_gradcheck, "linear": case_linear,
         "linear_gradcheck": case_linear_gradcheck}[case](rank, world)
    finally:
        dist.destroy_process_group()


# ---- the tests ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world", [2, 3])
def test_matches_torch_on_the_whole_vocabulary(tmp_path, world):
    run_ranks(tmp_path, "values", world)


@pytest.mark.parametrize("world", [2, 3])
def test_edges_and_errors(tmp_path, world):
    run_ranks(tmp_path, "edges", world)


def test_gradcheck_one_rank(tmp_path):
    run_ranks(tmp_path, "gradcheck", 1)


@pytest.mark.parametrize("world", [2, 3])
def test_linear_matches_torch_on_the_whole_classifier(tmp_path, world):
    run_ranks(tmp_path, "linear", world)


def test_linear_gradcheck_one_rank(tmp_path):
    run_ranks(tmp_path, "linear_gradcheck", 1)


def _cuda_worlds():
    """(backend, world) pairs this machine can run with CUDA tensors: gloo's ranks share GPU 0, NCCL's take one each."""
    if not (torch.cuda.is_available() and torch.ops.lossfuse._has_cuda()):
        return []
    worlds = [("gloo", 2), ("gloo", 3)]
    if torch.distributed.is_nccl_available():
        worlds += [("nccl", w) for w in (1, 2) if w <= torch.cuda.device_count()]
    return worlds


@pytest.mark.skipif(not _cuda_worlds(), reason="needs a CUDA device and lossfuse's CUDA backend")
@pytest.mark.parametrize("case", ["values", "edges", "linear"])
def test_cuda_tensors(tmp_path, case):
    """The same checks with every rank's tensors on a GPU: lossfuse's CUDA kernels, torch on CUDA as the oracle."""
    for backend, world in _cuda_worlds():
        if world > 1 or case == "values":  # the other cases' errors need ranks that disagree
            run_ranks(tmp_path / f"{backend}{world}", case, world, backend, "cuda")


def test_needs_an_initialized_process_group():
    x, t = torch.randn(3, 5), torch.tensor([0, 1, 2])
    if torch.distributed.is_initialized():
        pytest.skip("a process group is initialized in this process")
    with pytest.raises(RuntimeError, match="init_process_group"):
        vpce(x, t)
    with pytest.raises(RuntimeError, match="init_process_group"):
        vplce(x, torch.randn(4, 5), t)
    assert "distributed" in lossfuse.__all__


if __name__ == "__main__":
    try:
        worker(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6])
    except BaseException:
        traceback.print_exc()
        sys.exit(1)
