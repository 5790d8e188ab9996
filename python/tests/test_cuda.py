"""lossfuse's CUDA route in PyTorch: cross_entropy, nll_loss, the elementwise and margin losses and linear_cross_entropy on
CUDA tensors, against torch computing in float64 on the same (rounded) inputs and against torch's own CUDA kernels; the
extras torch lacks (z-loss, softcap, logit_scale) against lossfuse's CPU backend in float64. Also: class targets of
every integer dtype, the (N, C, d1, d2) layout, gradcheck, a bad class index, torch's current stream and caching
allocator, patch_torch, torch.compile. Runs where torch sees a GPU and lossfuse was built with its CUDA route
(scripts/gpu_check.sh on a GPU machine); skipped elsewhere."""

import pytest
import torch
import torch.nn.functional as F

import lossfuse
import lossfuse.nn.functional as LF

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.ops.lossfuse._has_cuda()),
    reason="needs a CUDA device and lossfuse built with its CUDA route (nvcc and torch with CUDA)")

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
INT_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
# Relative error allowed against float64 on the same inputs (accumulation in float32; 16-bit results rounded once).
TOL = {torch.float64: 1e-12, torch.float32: 2e-5, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}
OPTIONS = {
    "mean": {}, "sum": {"reduction": "sum"}, "none": {"reduction": "none"},
    "smoothing": {"label_smoothing": 0.1}, "ignore": {"ignore_index": 2}, "weight": {"weight": True},
    "all": {"weight": True, "ignore_index": 0, "label_smoothing": 0.2, "reduction": "sum"},
}


def max_error(got, ref):
    return (got.double() - ref.double()).abs().max().item() if ref.numel() else 0.0


def run(fn, x, target, kwargs, upstream):
    """fn's loss and d(sum(upstream * loss))/dx, x given as a leaf of its own."""
    x = x.detach().requires_grad_()
    loss = fn(x, target, **kwargs)
    (grad,) = torch.autograd.grad(loss, x, upstream.to(loss.dtype))
    return loss, grad


def compare(fn_ours, fn_torch, x, target, kwargs, dtype):
    """ours on CUDA within TOL of torch in float64 and no further from it than torch's own CUDA result (plus one
    rounding of the output dtype)."""
    ref_kwargs = {k: (v.double() if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in kwargs.items()}
    ref_loss = fn_torch(x.double(), target, **ref_kwargs)
    upstream = torch.randn(ref_loss.shape, dtype=torch.float64, device=x.device) if ref_loss.dim() else \
        torch.tensor(1.7, dtype=torch.float64, device=x.device)
    loss64, grad64 = run(fn_torch, x.double(), target, ref_kwargs, upstream)
    ours, ours_grad = run(fn_ours, x, target, kwargs, upstream)
    theirs, theirs_grad = run(fn_torch, x, target, kwargs, upstream)
    assert ours.dtype == x.dtype and ours.device == x.device and ours_grad.dtype == x.dtype
    for what, got, torch_got, ref in (("loss", ours, theirs, loss64), ("grad", ours_grad, theirs_grad, grad64)):
        check_error(what, got, torch_got, ref, dtype)


def check_error(what, got, torch_got, ref, dtype):
    """got within TOL[dtype] of the float64 reference (relative to its largest magnitude, at least 1) and no further
    from it than torch's own result torch_got, plus one rounding of dtype."""
    scale = max(ref.abs().max().item() if ref.numel() else 0.0, 1.0)
    err = max_error(got, ref)
    assert err <= TOL[dtype] * scale, f"{what}: error {err} against float64, allowed {TOL[dtype] * scale}"
    assert err <= max_error(torch_got, ref) + torch.finfo(dtype).eps * scale, f"{what}: error {err} above torch's"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", OPTIONS)
def test_cross_entropy_and_nll_match_torch(dtype, name):
    gen = torch.Generator(device="cuda").manual_seed(len(name))
    opts = dict(OPTIONS[name])
    x = (3 * torch.randn(37, 1001, device="cuda", generator=gen)).to(dtype)
    target = torch.randint(0, 1001, (37,), device="cuda", generator=gen)
    target[::5] = opts.get("ignore_index", 3)
    if opts.get("weight"):
        opts["weight"] = torch.rand(1001, device="cuda", generator=gen).to(dtype) + 0.5
    compare(LF.cross_entropy, F.cross_entropy, x, target, opts, dtype)
    opts.pop("label_smoothing", None)
    compare(LF.nll_loss, F.nll_loss, torch.log_softmax(x.float(), 1).to(dtype), target, opts, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_probability_targets_and_layouts(dtype):
    gen = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(6, 50, 3, 4, device="cuda", generator=gen).to(dtype)
    probs = torch.softmax(torch.randn(6, 50, 3, 4, device="cuda", generator=gen), 1).to(dtype)
    compare(LF.cross_entropy, F.cross_entropy, x, probs, {"label_smoothing": 0.05}, dtype)
    target = torch.randint(0, 50, (6, 3, 4), device="cuda", generator=gen)
    compare(LF.cross_entropy, F.cross_entropy, x, target, {"reduction": "none"}, dtype)
    compare(LF.cross_entropy, F.cross_entropy, x.transpose(1, 3).contiguous().transpose(1, 3), target, {}, dtype)


@pytest.mark.parametrize("target_dtype", INT_DTYPES, ids=str)
def test_integer_targets_are_used_as_they_are(target_dtype):
    x = torch.randn(64, 100, device="cuda", requires_grad=True)
    t = torch.randint(0, 100, (64,), device="cuda")
    ref = LF.cross_entropy(x, t, reduction="none")
    got = LF.cross_entropy(x, t.to(target_dtype), reduction="none")
    assert torch.equal(got, ref)
    assert torch.equal(LF.nll_loss(x, t.to(target_dtype)), LF.nll_loss(x, t))


def test_extras_match_the_cpu_backend_in_float64():
    """z-loss, softcap and logit_scale (no torch equivalent): CUDA against lossfuse's CPU kernels in float64."""
    x = torch.randn(33, 777, dtype=torch.float64)
    t = torch.randint(0, 777, (33,))
    kw = {"z_loss_scale": 1e-3, "softcap": 30.0, "logit_scale": 0.7, "label_smoothing": 0.1, "return_z_loss": True}
    cpu_loss, cpu_z = LF.cross_entropy(x, t, **kw)
    cuda_loss, cuda_z = LF.cross_entropy(x.cuda(), t.cuda(), **kw)
    torch.testing.assert_close(cuda_loss.cpu(), cpu_loss, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(cuda_z.cpu(), cpu_z, rtol=1e-12, atol=1e-12)


def test_gradcheck_float64():
    x = torch.randn(5, 9, dtype=torch.float64, device="cuda", requires_grad=True)
    t = torch.randint(0, 9, (5,), device="cuda")
    w = torch.rand(9, dtype=torch.float64, device="cuda") + 0.5
    assert torch.autograd.gradcheck(lambda a: LF.cross_entropy(a, t, weight=w, label_smoothing=0.1), (x,))
    assert torch.autograd.gradcheck(lambda a: LF.nll_loss(a, t, weight=w, reduction="sum"), (x,))


def test_bad_class_index_raises_index_error_and_the_context_survives():
    x = torch.randn(8, 10, device="cuda")
    t = torch.randint(0, 10, (8,), device="cuda")
    t[5] = 10
    with pytest.raises(IndexError, match="10"):
        LF.cross_entropy(x, t)
    with pytest.raises(IndexError):
        LF.nll_loss(x, t.to(torch.uint8))
    t[5] = 1
    assert torch.isfinite(LF.cross_entropy(x, t)).item()  # no device assert: the context still works
    torch.cuda.synchronize()


def test_runs_on_torchs_current_stream():
    """Work queued on a side stream before the call (the logits written there) is seen by the call, made on that
    stream, without a synchronisation in between."""
    side = torch.cuda.Stream()
    t = torch.randint(0, 4000, (512,), device="cuda")
    base = torch.randn(512, 4000, device="cuda")
    want = F.cross_entropy(base * 3, t)
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        for _ in range(3):
            x = torch.empty_like(base)
            torch.mul(base, 3, out=x)  # queued on the side stream
            got = LF.cross_entropy(x, t)
    torch.cuda.synchronize()
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)


def test_scratch_comes_back_to_torchs_allocator():
    x = torch.randn(256, 3000, device="cuda", requires_grad=True)
    t = torch.randint(0, 3000, (256,), device="cuda")
    w = torch.rand(3000, device="cuda")
    LF.cross_entropy(x, t, weight=w).backward()  # warm
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    allocs = torch.cuda.memory_stats()["allocation.all.allocated"]
    loss = LF.cross_entropy(x, t, weight=w)
    del loss
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before
    assert torch.cuda.memory_stats()["allocation.all.allocated"] > allocs  # its scratch and outputs came from torch


def test_patch_torch_routes_cuda_losses_with_kernels():
    x = torch.randn(4, 5, device="cuda", requires_grad=True)
    t = torch.randint(0, 5, (4,), device="cuda")
    try:
        lossfuse.patch_torch()
        assert "lossfuse" in F.cross_entropy(x, t).grad_fn.name()
        assert "lossfuse" in F.nll_loss(x, t).grad_fn.name()
        assert "lossfuse" in F.mse_loss(x, x.detach()).grad_fn.name()
        a, b, c = (torch.randn(4, 8, device="cuda", requires_grad=True) for _ in range(3))
        assert "lossfuse" in F.triplet_margin_loss(a, b, c).grad_fn.name()
        lp = torch.randn(6, 2, 5, device="cuda").log_softmax(2).requires_grad_()
        tg = torch.randint(1, 5, (2, 3), device="cuda")
        lengths = (torch.full((2,), 6), torch.full((2,), 3))
        assert "lossfuse" in F.ctc_loss(lp, tg, *lengths).grad_fn.name()
    finally:
        lossfuse.unpatch_torch()


def test_compile_fullgraph_matches_eager():
    x = torch.randn(64, 1000, device="cuda", requires_grad=True)
    t = torch.randint(0, 1000, (64,), device="cuda")
    compiled = torch.compile(lambda a, b: LF.cross_entropy(a, b, label_smoothing=0.1), fullgraph=True)
    (g1,) = torch.autograd.grad(compiled(x, t), x)
    (g0,) = torch.autograd.grad(LF.cross_entropy(x, t, label_smoothing=0.1), x)
    torch.testing.assert_close(g1, g0, rtol=1e-6, atol=1e-7)


def _captured(step):
    """step() run eagerly, then captured into a CUDA graph (after a warm-up on a side stream, as torch's CUDA-graph
    notes do) and replayed: (eager result, replayed result, graph). Any host synchronisation in step fails the
    capture."""
    want = step()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = step()
    graph.replay()
    torch.cuda.synchronize()
    return want, got, graph


def test_graph_capture_forward_matches_eager():
    """cross_entropy and nll_loss forwards captured in a CUDA graph (any host synchronisation in a call fails the
    capture) and replayed give the eager results; a bad target under capture gives NaN (nothing is read back)."""
    x = torch.randn(128, 32000, device="cuda")
    t = torch.randint(0, 32000, (128,), device="cuda")
    w = torch.rand(32000, device="cuda")
    lp = x.log_softmax(1)

    def calls():
        return LF.cross_entropy(x, t, weight=w, label_smoothing=0.1), LF.nll_loss(lp, t)

    with torch.no_grad():
        want, got, graph = _captured(calls)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        t[5] = -3
        graph.replay()
        torch.cuda.synchronize()
        assert torch.isnan(got[0]) and torch.isnan(got[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_graph_capture_training_steps_match_eager(dtype):
    """Training steps (forward and backward) captured in a CUDA graph: cross_entropy (its eager C++ node, separate, in
    place and with (N, C, d) logits, and probability targets through the autograd.Function road: each scales the held
    gradient on the device, cross_entropy_scale_held) and the elementwise losses (forward and backward ops then); the
    replay gives the eager gradients. float16 takes the largest power-of-two upstream gradient its losses hold, 32768
    (GradScaler's 65536 is inf in float16; its losses are float32 under autocast)."""
    scale = 32768.0 if dtype == torch.float16 else 2.5
    x = torch.randn(64, 5000, device="cuda", dtype=dtype)
    t = torch.randint(0, 5000, (64,), device="cuda")
    t[3] = -100
    x3 = torch.randn(8, 500, 16, device="cuda", dtype=dtype)
    t3 = torch.randint(0, 500, (8, 16), device="cuda")
    t3[1, 2] = -100
    y = torch.rand(64, 5000, device="cuda", dtype=dtype)
    p = torch.rand(64, 5000, device="cuda", dtype=dtype).clamp(0.05, 0.95)
    probs = torch.rand(64, 5000, device="cuda").softmax(1).to(dtype)

    def grads(loss_of, operand):
        leaf = operand.clone().requires_grad_()
        (scale * loss_of(leaf)).backward()
        return leaf.grad

    steps = {
        "cross_entropy": lambda: grads(lambda a: LF.cross_entropy(a, t), x),
        "cross_entropy_inplace": lambda: grads(lambda a: LF.cross_entropy(a * 1, t, inplace=True), x),
        "cross_entropy_3d": lambda: grads(lambda a: LF.cross_entropy(a, t3), x3),
        "cross_entropy_soft": lambda: grads(lambda a: LF.cross_entropy(a, probs), x),
        "mse_loss": lambda: grads(lambda a: LF.mse_loss(a, y), x),
        "binary_cross_entropy": lambda: grads(lambda a: LF.binary_cross_entropy(a, y), p),
        "gaussian_nll_loss": lambda: grads(lambda a: LF.gaussian_nll_loss(a, y, y + 0.5), x),
    }
    for name, step in steps.items():
        want, got, _ = _captured(step)
        assert torch.isfinite(got).all(), name
        # within an ulp or two: the eager road may scale a gradient rounded for an upstream gradient of 1
        torch.testing.assert_close(got, want, rtol=2 * torch.finfo(dtype).eps, atol=1e-12, msg=name)


def backward_raising_on_sync(loss):
    """loss.backward() under torch's sync debug mode set to "error": a synchronising torch call in it raises."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("upstream", [1.0, 65536.0])
@pytest.mark.parametrize("road", ["separate", "inplace", "3d", "soft"])
def test_cross_entropy_backward_reads_nothing_back(road, upstream):
    """An eager cross_entropy training step's backward (the C++ node, separate, in place and with (N, C, d) logits;
    probability targets through the autograd.Function road) makes no synchronising torch call: torch's sync debug
    mode raises on one (item(), a host copy). A read-back inside lossfuse fails the captured steps instead
    (test_graph_capture_training_steps_match_eager). The gradients are the float64 ones rounded to bfloat16 (within
    an ulp), the ignored rows 0."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    shape, tshape = ((16, 300, 4), (16, 4)) if road == "3d" else ((64, 3000), (64,))
    x0 = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
    if road == "soft":
        t = torch.rand(shape, device="cuda", generator=gen).softmax(1).to(torch.bfloat16)
    else:
        t = torch.randint(0, shape[1], tshape, device="cuda", generator=gen)
        t.view(-1)[::7] = -100
    leaf = x0.clone().requires_grad_()
    a = leaf * 1 if road == "inplace" else leaf
    loss = LF.cross_entropy(a, t, inplace=road == "inplace")
    node = type(loss.grad_fn).__name__
    assert ("cross_entropyBackward" in node) == (road == "soft"), node  # the road asked for
    scaled = loss * upstream if upstream != 1.0 else loss
    backward_raising_on_sync(scaled)
    x64 = x0.double().requires_grad_()
    (want,) = torch.autograd.grad(F.cross_entropy(x64, t.double() if road == "soft" else t) * upstream, x64)
    if road != "soft":
        ignored = (t == -100).unsqueeze(1).expand_as(want)
        assert torch.equal(leaf.grad[ignored], torch.zeros_like(leaf.grad[ignored]))
    torch.testing.assert_close(leaf.grad.double(), want, rtol=2 ** -7, atol=1e-12 * upstream)


@pytest.mark.parametrize("upstream", [1.0, 65536.0])
def test_linear_cross_entropy_backward_reads_nothing_back(upstream):
    """The chunked strategy's backward hands the forward's gradients over through _linear_cross_entropy_scale_held_,
    with no synchronising torch call (torch's sync debug mode raises on one: the item() reads it replaced; a
    read-back inside lossfuse fails the C++ captured step instead, LinearCeCudaGraph). The gradients are the float64
    ones rounded to bfloat16, the input gradient's ignored rows 0."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    x0 = torch.randn(64, 128, device="cuda", generator=gen).to(torch.bfloat16)
    w0 = (torch.randn(3000, 128, device="cuda", generator=gen) / 128 ** 0.5).to(torch.bfloat16)
    t = torch.randint(0, 3000, (64,), device="cuda", generator=gen)
    t[::7] = -100
    x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    loss = LF.linear_cross_entropy(x, w, t, strategy="chunked")
    scaled = loss * upstream if upstream != 1.0 else loss
    backward_raising_on_sync(scaled)
    x64, w64 = x0.double().requires_grad_(), w0.double().requires_grad_()
    want = torch.autograd.grad(F.cross_entropy(F.linear(x64, w64), t) * upstream, (x64, w64))
    ignored = t == -100
    assert torch.equal(x.grad[ignored], torch.zeros_like(x.grad[ignored]))
    for got, ref in zip((x.grad, w.grad), want):
        torch.testing.assert_close(got.double(), ref, rtol=2 ** -6, atol=1e-5 * upstream)


@pytest.mark.parametrize("upstream", [1.0, 65536.0])
def test_autocast_cross_entropy_backward_reads_nothing_back(upstream):
    """Under autocast (a float32 loss of bfloat16 logits) the backward's gradient is remade from the lse unless the
    upstream value is 1 (_cross_entropy_backward_held_: the value read on the device), with no synchronising torch
    call (the item() it replaced raised here); torch's own gradient under autocast is the reference (within an ulp
    of bfloat16)."""
    gen = torch.Generator(device="cuda").manual_seed(9)
    x0 = torch.randn(64, 3000, device="cuda", generator=gen).to(torch.bfloat16)
    t = torch.randint(0, 3000, (64,), device="cuda", generator=gen)
    t[::5] = -100

    def grad(f):
        x = x0.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = f(x, t)
        assert loss.dtype == torch.float32
        scaled = loss * upstream if upstream != 1.0 else loss
        if f is LF.cross_entropy:
            backward_raising_on_sync(scaled)
        else:
            scaled.backward()
        return x.grad

    ours, theirs = grad(LF.cross_entropy), grad(F.cross_entropy)
    torch.testing.assert_close(ours.float(), theirs.float(), rtol=2 ** -7, atol=1e-6 * upstream)


BACKWARD_OP_STEPS = ["cross_entropy none", "cross_entropy autocast none", "nll_loss", "linear_cross_entropy recompute",
                     "linear_cross_entropy none", "multi_margin_loss", "multilabel_margin_loss", "ctc_loss",
                     "binary_cross_entropy"]


def _backward_op_steps():
    """Training steps (inputs, then a step of (inputs) -> loss) whose backward is a backward op (not a held gradient
    scaled): cross_entropy 'none', under autocast 'none', nll_loss, linear_cross_entropy's recompute strategy and
    'none', a margin loss with class targets, another with label lists, CTC with CUDA lengths, bce."""
    gen = torch.Generator(device="cuda").manual_seed(31)
    x = torch.randn(64, 300, device="cuda", generator=gen)
    t = torch.randint(0, 300, (64,), device="cuda", generator=gen)
    t[::5] = -100
    w = torch.randn(300, 32, device="cuda", generator=gen) / 32 ** 0.5
    h = torch.randn(64, 32, device="cuda", generator=gen)
    labels = torch.full((64, 300), -1, device="cuda", dtype=torch.int64)
    labels[:, :3] = torch.randint(0, 300, (64, 3), device="cuda", generator=gen)
    lp, targets, il, tl = _ctc_inputs(gen)

    def autocast_none(a):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return LF.cross_entropy(a.bfloat16(), t, reduction="none").sum()

    return {
        "cross_entropy none": ((x,), lambda a: LF.cross_entropy(a, t, reduction="none").sum()),
        "cross_entropy autocast none": ((x,), autocast_none),
        "nll_loss": ((x.log_softmax(1),), lambda a: LF.nll_loss(a, t)),
        "linear_cross_entropy recompute": ((h, w), lambda a, b: LF.linear_cross_entropy(a, b, t, strategy="recompute")),
        "linear_cross_entropy none": ((h, w), lambda a, b: LF.linear_cross_entropy(a, b, t, reduction="none").sum()),
        "multi_margin_loss": ((x,), lambda a: LF.multi_margin_loss(a, t.clamp(min=0))),
        "multilabel_margin_loss": ((x,), lambda a: LF.multilabel_margin_loss(a, labels)),
        "ctc_loss": ((lp,), lambda a: LF.ctc_loss(a, targets, il, tl, zero_infinity=True)),
        "binary_cross_entropy": ((x.sigmoid(),), lambda a: LF.binary_cross_entropy(  # 'none': the backward op
            a, t.clamp(min=0).float().unsqueeze(1).expand(-1, 300) / 300, reduction="none").sum()),
    }


@pytest.mark.parametrize("name", BACKWARD_OP_STEPS)
def test_backward_reads_nothing_back(name):
    """A backward op runs its CUDA calls as CudaCheck::nan (binding.hpp BackwardChecks): the forward checked the
    inputs, so the backward reads nothing back (lossfuse.cuda_host_syncs() unchanged across it) and its gradients are
    finite. Their values are the other tests' (test_*_matches_torch)."""
    steps = _backward_op_steps()
    assert list(steps) == BACKWARD_OP_STEPS
    inputs, step = steps[name]
    leaves = [a.detach().clone().requires_grad_() for a in inputs]
    loss = step(*leaves)
    torch.cuda.synchronize()
    before = lossfuse.cuda_host_syncs()
    backward_raising_on_sync(loss)  # and no synchronising torch call either
    torch.cuda.synchronize()
    assert lossfuse.cuda_host_syncs() == before, "the backward read a check back"
    for leaf in leaves:
        assert leaf.grad is not None and torch.isfinite(leaf.grad).all()


@pytest.mark.parametrize("name", ["mse_loss", "binary_cross_entropy", "gaussian_nll_loss"])
def test_retained_graph_second_backward_reads_nothing_back(name):
    """A retained graph's second backward of a fused elementwise loss runs the fused op again (_register.py
    handed_over) under CudaCheck::nan: nothing is read back, and the gradient has the first backward's bits."""
    gen = torch.Generator(device="cuda").manual_seed(34)
    x, y = (torch.randn(64, 300, device="cuda", generator=gen) for _ in range(2))
    calls = {"mse_loss": lambda a: LF.mse_loss(a, y),
             "binary_cross_entropy": lambda a: LF.binary_cross_entropy(a, y.sigmoid()),
             "gaussian_nll_loss": lambda a: LF.gaussian_nll_loss(a, y, x.abs() + 0.5)}
    leaf = (x.sigmoid() if name == "binary_cross_entropy" else x).clone().requires_grad_()
    loss = calls[name](leaf)
    loss.backward(retain_graph=True)
    first, leaf.grad = leaf.grad.clone(), None
    torch.cuda.synchronize()
    before = lossfuse.cuda_host_syncs()
    backward_raising_on_sync(loss)
    torch.cuda.synchronize()
    assert lossfuse.cuda_host_syncs() == before, "the second backward read a check back"
    assert torch.equal(leaf.grad, first)


def test_training_forwards_still_report():
    """The backward ops' CudaCheck::nan stays theirs: a training step's forward (the fused elementwise op, the C++
    cross-entropy node) still raises for a bad value, by default."""
    gen = torch.Generator(device="cuda").manual_seed(33)
    p = torch.rand(8, 100, device="cuda", generator=gen).clamp(0.1, 0.9)
    y = torch.rand(8, 100, device="cuda", generator=gen)
    bad_p, bad_y = p.clone(), y.clone()
    bad_p[3, 7], bad_y[2, 5] = 1.5, 1.5
    with pytest.raises(RuntimeError):
        LF.binary_cross_entropy(bad_p.requires_grad_(), y)
    with pytest.raises(RuntimeError, match="expected every element in \\[0, 1\\]"):
        LF.binary_cross_entropy(p.clone().requires_grad_(), bad_y)
    with pytest.raises(ValueError):
        LF.gaussian_nll_loss(p.clone().requires_grad_(), y, -p)
    x = torch.randn(8, 100, device="cuda", generator=gen, requires_grad=True)
    with pytest.raises(IndexError, match="100 at position"):
        LF.cross_entropy(x, torch.full((8,), 100, device="cuda"))


def test_cuda_check_nan_training_step_reads_nothing_back():
    """Under lossfuse.cuda_check("nan") a cross_entropy training step ('none', then mean) reads nothing back, forward
    included, and gives the default's bits; a bad target is then no error: its row's loss and gradient are NaN, the
    other rows as before. Outside the block a bad target raises again."""
    gen = torch.Generator(device="cuda").manual_seed(32)
    x = torch.randn(64, 3000, device="cuda", generator=gen)
    t = torch.randint(0, 3000, (64,), device="cuda", generator=gen)

    def step(target, reduction):
        leaf = x.clone().requires_grad_()
        loss = LF.cross_entropy(leaf, target, reduction=reduction)
        (loss.sum() if reduction == "none" else loss).backward()
        return loss.detach(), leaf.grad

    for reduction in ("none", "mean"):
        want = step(t, reduction)
        torch.cuda.synchronize()
        before = lossfuse.cuda_host_syncs()
        with lossfuse.cuda_check("nan"):
            got = step(t, reduction)
        torch.cuda.synchronize()
        assert lossfuse.cuda_host_syncs() == before, reduction
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), reduction
    bad = t.clone()
    bad[7] = 3000
    with lossfuse.cuda_check("nan"):
        loss, grad = step(bad, "none")
    assert torch.isnan(loss[7]) and torch.isnan(grad[7]).all()
    keep = torch.arange(64, device="cuda") != 7
    assert torch.equal(loss[keep], step(t, "none")[0][keep])
    with pytest.raises(IndexError, match="3000 at position"):
        step(bad, "none")


def test_graph_capture_elementwise_forwards():
    """Elementwise forwards captured in a CUDA graph: the eager results on replay, and a value outside bce's range
    (nothing can be read back to raise the error) makes the loss NaN."""
    x = torch.rand(33, 2049, device="cuda").clamp(0.05, 0.95)
    y = torch.rand(33, 2049, device="cuda")
    w = torch.rand(33, 2049, device="cuda")

    def step():
        return (LF.mse_loss(x, y), LF.binary_cross_entropy(x, y, weight=w),
                LF.gaussian_nll_loss(x, y, w + 0.1), LF.smooth_l1_loss(x, y, reduction="sum"))

    with torch.no_grad():
        want, got, graph = _captured(step)
        for a, b in zip(got, want):
            assert torch.equal(a, b)
        x[7, 11] = 1.5
        graph.replay()
        torch.cuda.synchronize()
        assert torch.isnan(got[1])


def test_inplace_writes_the_gradient_over_the_logits():
    base = torch.randn(32, 500, device="cuda")
    t = torch.randint(0, 500, (32,), device="cuda")
    x = base.clone().requires_grad_()
    (want,) = torch.autograd.grad(F.cross_entropy(x, t), x)
    logits = base.clone().requires_grad_()
    work = logits * 1  # a non-leaf the loss may overwrite
    loss = LF.cross_entropy(work, t, inplace=True)
    loss.backward()
    torch.testing.assert_close(logits.grad, want, rtol=2e-5, atol=1e-7)


def _elementwise_cases(gen):
    """Each elementwise loss's operands (input, second operand) and keyword arguments, on CUDA in float32."""
    def r(*shape):
        return torch.randn(*shape, device="cuda", generator=gen)

    def u(*shape):
        return torch.rand(*shape, device="cuda", generator=gen)

    def signs(*shape):
        return u(*shape).round() * 2 - 1

    shape = (33, 257)
    return {
        "mse_loss": (r(*shape), r(*shape), {}),
        "l1_loss": (r(*shape), r(*shape), {}),
        "smooth_l1_loss": (r(*shape), r(*shape), {"beta": 0.5}),
        "huber_loss": (r(*shape), r(*shape), {"delta": 0.7}),
        "binary_cross_entropy": (u(*shape).clamp(0.01, 0.99), u(*shape), {"weight": u(*shape)}),
        "binary_cross_entropy_with_logits": (3 * r(*shape), u(*shape), {"pos_weight": u(shape[-1]) + 0.5}),
        "kl_div": (torch.log_softmax(r(*shape), 1), torch.softmax(r(*shape), 1), {}),
        "poisson_nll_loss": (r(*shape), (4 * u(*shape)).floor(), {"full": True}),
        "gaussian_nll_loss": (r(*shape), r(*shape), {"var": u(*shape) + 0.1}),
        "hinge_embedding_loss": (r(*shape), signs(*shape), {"margin": 0.5}),
        "margin_ranking_loss": (r(*shape), r(*shape), {"target": signs(*shape), "margin": 0.1}),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("name", [
    "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits",
    "kl_div", "poisson_nll_loss", "gaussian_nll_loss", "hinge_embedding_loss", "margin_ranking_loss"])
def test_elementwise_losses_match_torch(name, reduction, dtype):
    gen = torch.Generator(device="cuda").manual_seed(len(name))
    x, second, kwargs = _elementwise_cases(gen)[name]
    kwargs = {k: (v.to(dtype) if torch.is_tensor(v) else v) for k, v in kwargs.items()}
    kwargs["reduction"] = "batchmean" if name == "kl_div" and reduction == "mean" else reduction
    compare(getattr(LF, name), getattr(F, name), x.to(dtype), second.to(dtype), kwargs, dtype)


MARGIN_LOSSES = ["triplet_margin_loss", "cosine_embedding_loss", "multi_margin_loss", "multilabel_margin_loss",
                 "multilabel_soft_margin_loss"]


def _margin_cases(gen, n=33, d=257):
    """Each margin loss as (f(module, x, **kwargs), kwargs): the loss of `module` (F or LF) as a function of its first
    input x, the other operands (on CUDA, float32, cast to x's dtype) closed over."""
    def r(*shape):
        return torch.randn(*shape, device="cuda", generator=gen)

    pos, neg, x2, w = r(n, d), r(n, d), r(n, d), r(d).abs() + 0.5
    signs = torch.rand(n, device="cuda", generator=gen).round() * 2 - 1
    classes = torch.randint(0, d, (n,), device="cuda", generator=gen)
    labels = torch.randint(-1, d, (n, d), device="cuda", generator=gen)  # lists of every length up to d
    soft = torch.rand(n, d, device="cuda", generator=gen)
    return {
        "triplet_margin_loss": (lambda f, x, **k: f.triplet_margin_loss(x, pos.to(x.dtype), neg.to(x.dtype), **k),
                                {"margin": 0.5, "swap": True}),
        "cosine_embedding_loss": (lambda f, x, **k: f.cosine_embedding_loss(x, x2.to(x.dtype), signs.to(x.dtype), **k),
                                  {"margin": 0.1}),
        "multi_margin_loss": (lambda f, x, **k: f.multi_margin_loss(x, classes, weight=w.to(x.dtype), **k),
                              {"p": 2, "margin": 0.8}),
        "multilabel_margin_loss": (lambda f, x, **k: f.multilabel_margin_loss(x, labels, **k), {}),
        "multilabel_soft_margin_loss": (
            lambda f, x, **k: f.multilabel_soft_margin_loss(x, soft.to(x.dtype), weight=w.to(x.dtype), **k), {}),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("name", MARGIN_LOSSES)
def test_margin_losses_match_torch(name, reduction, dtype):
    gen = torch.Generator(device="cuda").manual_seed(len(name))
    fn, kwargs = _margin_cases(gen)[name]
    x = torch.randn(33, 257, device="cuda", generator=gen).to(dtype)
    compare(lambda a, _, **k: fn(LF, a, **k), lambda a, _, **k: fn(F, a, **k), x, None,
            dict(kwargs, reduction=reduction), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_graph_capture_margin_training_steps(dtype):
    """Each margin loss's training step (forward and backward, an upstream gradient of 2.5) captured in a CUDA graph:
    every call is a device call (weights, target check, upstream scalar and reduction on the device), so the capture
    holds and the replay gives the eager gradients and loss bit for bit."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(64, 300, device="cuda", generator=gen).to(dtype)
    for name, (fn, kwargs) in _margin_cases(gen, n=64, d=300).items():
        def step():
            leaf = x.clone().requires_grad_()
            loss = fn(LF, leaf, **kwargs)
            (2.5 * loss).backward()
            return loss.detach(), leaf.grad

        want, got, _ = _captured(step)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), name


@pytest.mark.parametrize("name", MARGIN_LOSSES)
def test_margin_losses_gradcheck(name):
    gen = torch.Generator(device="cuda").manual_seed(3)
    fn, kwargs = _margin_cases(gen, n=4, d=6)
    x = torch.randn(4, 6, device="cuda", dtype=torch.float64, generator=gen, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a: fn(LF, a, **kwargs), (x,))


@pytest.mark.parametrize("target_dtype", INT_DTYPES, ids=str)
def test_margin_class_targets_of_every_integer_dtype(target_dtype):
    x = torch.randn(9, 40, device="cuda", dtype=torch.float64)
    classes = torch.randint(0, 40, (9,), device="cuda")
    labels = torch.randint(0, 40, (9, 40), device="cuda")
    if target_dtype != torch.uint8:  # which cannot hold -1: full label lists
        labels[:, 5] = -1
    for f, t in ((LF.multi_margin_loss, classes), (LF.multilabel_margin_loss, labels)):
        want = f(x, t)
        torch.testing.assert_close(f(x, t.to(target_dtype)), want, rtol=0, atol=0)



def _lce_grads(fn, x, w, b, t, upstream, **kwargs):
    """fn's loss and its gradients of x, w and b for d(sum(upstream * loss)), each input a fresh leaf."""
    x, w, b = (a.detach().requires_grad_() for a in (x, w, b))
    loss = fn(x, w, b, t, **kwargs)
    return (loss, *torch.autograd.grad(loss, (x, w, b), upstream.to(loss.dtype)))


def _torch_lce(x, w, b, t, **kwargs):
    return F.cross_entropy(F.linear(x, w, b), t, **kwargs)


def _our_lce(x, w, b, t, **kwargs):
    return LF.linear_cross_entropy(x, w, t, linear_bias=b, **kwargs)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("strategy", ["chunked", "recompute"])
@pytest.mark.parametrize("name", ["mean", "sum", "smoothing", "ignore", "weight", "all"])
def test_linear_cross_entropy_matches_torch(name, strategy, dtype):
    """Loss and the gradients of x, W and b within TOL of torch's linear + cross_entropy in float64 on the same
    (rounded) inputs, and no further from it than torch's own CUDA result: several chunks (chunk_rows 37), V over a
    cuBLAS tile."""
    gen = torch.Generator(device="cuda").manual_seed(11)
    x = (torch.randn(150, 64, device="cuda", generator=gen) / 8).to(dtype)
    w = torch.randn(1003, 64, device="cuda", generator=gen).to(dtype)
    b = torch.randn(1003, device="cuda", generator=gen).to(dtype)
    t = torch.randint(0, 1003, (150,), device="cuda", generator=gen)
    kwargs = dict(OPTIONS[name])
    if kwargs.pop("weight", False):
        kwargs["weight"] = (torch.rand(1003, device="cuda", generator=gen) + 0.5).to(dtype)
    ref_kwargs = {k: (v.double() if torch.is_tensor(v) else v) for k, v in kwargs.items()}
    upstream = torch.tensor(1.3, dtype=torch.float64, device="cuda")
    want = _lce_grads(_torch_lce, x.double(), w.double(), b.double(), t, upstream, **ref_kwargs)
    theirs = _lce_grads(_torch_lce, x, w, b, t, upstream, **kwargs)
    ours = _lce_grads(_our_lce, x, w, b, t, upstream, strategy=strategy, chunk_rows=37, **kwargs)
    for what, got, torch_got, ref in zip(("loss", "grad_x", "grad_weight", "grad_bias"), ours, theirs, want):
        assert got.device == ref.device and got.dtype == dtype, what
        check_error(what, got, torch_got, ref, dtype)


def test_linear_cross_entropy_gradcheck():
    gen = torch.Generator(device="cuda").manual_seed(5)
    x, w, b = (torch.randn(*s, device="cuda", dtype=torch.float64, generator=gen, requires_grad=True)
               for s in ((6, 5), (9, 5), (9,)))
    t = torch.randint(0, 9, (6,), device="cuda", generator=gen)
    for strategy in ("chunked", "recompute"):
        assert torch.autograd.gradcheck(
            lambda a, c, d: LF.linear_cross_entropy(a, c, t, linear_bias=d, label_smoothing=0.1, strategy=strategy,
                                                    chunk_rows=4), (x, w, b))


@pytest.mark.parametrize("target_dtype", INT_DTYPES, ids=str)
def test_linear_cross_entropy_integer_targets(target_dtype):
    x = torch.randn(40, 16, device="cuda")
    w = torch.randn(100, 16, device="cuda")
    t = torch.randint(0, 100, (40,), device="cuda")
    want = LF.linear_cross_entropy(x, w, t, reduction="none")
    torch.testing.assert_close(LF.linear_cross_entropy(x, w, t.to(target_dtype), reduction="none"), want, rtol=0,
                               atol=0)


def test_linear_cross_entropy_refuses_tiles_and_bad_targets_on_cuda():
    x = torch.randn(8, 16, device="cuda", requires_grad=True)
    w = torch.randn(50, 16, device="cuda", requires_grad=True)
    t = torch.randint(0, 50, (8,), device="cuda")
    with pytest.raises(NotImplementedError, match="vocab_tile"):
        LF.linear_cross_entropy(x, w, t, vocab_tile=16)
    t[3] = 50
    with pytest.raises(IndexError, match="50"):
        LF.linear_cross_entropy(x, w, t)
    torch.cuda.synchronize()  # the context survives


def _ctc_inputs(gen, T=30, N=4, C=12, S=8, dtype=torch.float32):
    lp = torch.randn(T, N, C, device="cuda", generator=gen).log_softmax(2).to(dtype)
    targets = torch.randint(1, C, (N, S), device="cuda", generator=gen)
    il = torch.tensor([T, T - 3, T // 2, 1], device="cuda")[:N]
    tl = torch.tensor([S, S - 2, 3, 0], device="cuda")[:N]
    return lp, targets, il, tl


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("concatenated", [False, True])
def test_ctc_loss_matches_torch(concatenated, reduction, dtype):
    """Loss and gradient within TOL of torch's ctc_loss in float64 on the same (rounded) inputs, and no further from
    it than torch's own CUDA kernel (float32; torch has no 16-bit CTC)."""
    gen = torch.Generator(device="cuda").manual_seed(21)
    lp, targets, il, tl = _ctc_inputs(gen, dtype=dtype)
    if concatenated:
        targets = torch.cat([targets[b, :tl[b]] for b in range(len(tl))])
    upstream = torch.rand(4 if reduction == "none" else (), dtype=torch.float64, device="cuda") + 0.5

    def run(f, x):
        x = x.detach().requires_grad_()
        loss = f(x, targets, il, tl, reduction=reduction, zero_infinity=True)
        return loss, torch.autograd.grad(loss, x, upstream.to(loss.dtype))[0]

    want = run(F.ctc_loss, lp.double())
    ours = run(LF.ctc_loss, lp)
    theirs = run(F.ctc_loss, lp.float()) if dtype != torch.float64 else run(F.ctc_loss, lp)
    for what, got, torch_got, ref in zip(("loss", "grad"), ours, theirs, want):
        assert got.dtype == dtype and got.device == ref.device, what
        check_error(what, got, torch_got, ref, dtype)


def test_ctc_loss_gradcheck_and_host_lengths():
    gen = torch.Generator(device="cuda").manual_seed(4)
    lp, targets, il, tl = _ctc_inputs(gen, T=6, N=2, C=4, S=2, dtype=torch.float64)
    x = lp.detach().requires_grad_()
    assert torch.autograd.gradcheck(lambda a: LF.ctc_loss(a.log_softmax(2), targets, il, tl), (x,))
    torch.testing.assert_close(LF.ctc_loss(lp, targets, il.cpu(), tl.cpu()), LF.ctc_loss(lp, targets, il, tl),
                               rtol=0, atol=0)
    torch.testing.assert_close(LF.ctc_loss(lp, targets.cpu(), il, tl), LF.ctc_loss(lp, targets, il, tl), rtol=0,
                               atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_graph_capture_ctc_training_step(dtype):
    """A CTC training step (padded targets, CUDA lengths) captured in a CUDA graph: the check, the upstream gradient
    and the reduction stay on the device, so the capture holds and the replay gives the eager loss and gradient bit
    for bit; a blank used as a label under capture makes the loss NaN (nothing is read back)."""
    gen = torch.Generator(device="cuda").manual_seed(12)
    lp, targets, il, tl = _ctc_inputs(gen, dtype=dtype)

    def step():
        leaf = lp.clone().requires_grad_()
        loss = LF.ctc_loss(leaf, targets, il, tl, zero_infinity=True)
        (2.5 * loss).backward()
        return loss.detach(), leaf.grad

    want, got, graph = _captured(step)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    targets[0, 0] = 0
    graph.replay()
    torch.cuda.synchronize()
    assert torch.isnan(got[0]) and torch.isnan(got[1][:, 0]).all() and not torch.isnan(got[1][:, 1]).any()


def test_ctc_loss_host_values_refused_under_capture():
    """Under CUDA-graph capture, concatenated targets (whose lengths are read on the host) and lengths on the host are
    refused with an error naming the argument, before any copy that would spoil the capture."""
    gen = torch.Generator(device="cuda").manual_seed(13)
    lp, targets, il, tl = _ctc_inputs(gen)
    flat = torch.cat([targets[b, :tl[b]] for b in range(len(tl))])
    for args, name in (((flat, il, tl), "targets"), ((targets, il.tolist(), tl), "input_lengths"),
                       ((targets, il, tl.cpu()), "target_lengths")):
        with pytest.raises(RuntimeError, match=name):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                LF.ctc_loss(lp, *args)
    torch.cuda.synchronize()


@pytest.mark.parametrize("target_dtype", INT_DTYPES, ids=str)
def test_ctc_loss_integer_targets(target_dtype):
    gen = torch.Generator(device="cuda").manual_seed(8)
    lp, targets, il, tl = _ctc_inputs(gen, C=100)
    want = LF.ctc_loss(lp, targets, il, tl, reduction="none")
    got = LF.ctc_loss(lp, targets.to(target_dtype), il.to(target_dtype), tl.to(target_dtype), reduction="none")
    torch.testing.assert_close(got, want, rtol=0, atol=0)
