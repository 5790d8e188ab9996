"""lossfuse.nn.functional.linear_cross_entropy against torch's cross_entropy(linear(x, W, b)) and torch's own
linear_cross_entropy: values and gradients of x, W and b for every option, both strategies, chunks that do not
divide the batch, upstream gradients that are not 1; gradcheck, opcheck, torch.compile, errors."""

import contextlib
import math
import zlib

import pytest
import torch
import torch.nn.functional as F

import lossfuse
import lossfuse.nn.functional as LF

REDUCTIONS = ["none", "mean", "sum"]
TOL = {torch.float64: 1e-10, torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 5e-3}



def torch_linear_ce(input, linear_weight, target, *, linear_bias=None, **kw):
    """torch.nn.functional.linear_cross_entropy (torch >= 2.13); on older torch its definition, torch's
    cross_entropy of torch's linear."""
    if hasattr(F, "linear_cross_entropy"):
        return F.linear_cross_entropy(input, linear_weight, target, linear_bias=linear_bias, **kw)
    return F.cross_entropy(F.linear(input, linear_weight, linear_bias), target, **kw)

def make(n, h, v, dtype, seed=0, ignored=0.2):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, h, generator=g, dtype=torch.float64).to(dtype)
    w = (torch.randn(v, h, generator=g, dtype=torch.float64) / h**0.5).to(dtype)
    b = (torch.randn(v, generator=g, dtype=torch.float64) * 0.1).to(dtype)
    t = torch.randint(0, v, (n,), generator=g)
    t[torch.rand(n, generator=g) < ignored] = -100
    return x, w, b, t


def reference(x, w, b, t, reduction, cw=None, label_smoothing=0.0, softcap=0.0, logit_scale=1.0, z_loss_scale=0.0):
    """cross_entropy of linear in float64 (lossfuse's extras composed from torch ops)."""
    z = F.linear(x.double(), w.double(), None if b is None else b.double()) * logit_scale
    if softcap:
        z = softcap * torch.tanh(z / softcap)
    loss = F.cross_entropy(z, t, None if cw is None else cw.double(), reduction="none",
                           label_smoothing=label_smoothing)
    valid = t != -100
    loss = loss + torch.where(valid, z_loss_scale * torch.logsumexp(z, 1) ** 2, torch.zeros_like(loss))
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    wy = cw.double()[torch.where(valid, t, 0)] if cw is not None else torch.ones_like(loss)
    return loss.sum() / torch.where(valid, wy, torch.zeros_like(wy)).sum()


def compare(dtype, reduction, strategy, chunk_rows, bias=True, classes=203, **opts):
    # a seed per case that is the same in every run (hash() of strings is salted per process)
    seed = zlib.crc32(repr((str(dtype), reduction, strategy, chunk_rows)).encode()) % 1000
    x, w, b, t = make(29, 16, classes, dtype, seed=seed)
    b = b if bias else None
    leaves = [x.requires_grad_(), w.requires_grad_()] + ([b.requires_grad_()] if bias else [])
    ours = LF.linear_cross_entropy(x, w, t, linear_bias=b, reduction=reduction, strategy=strategy,
                                   chunk_rows=chunk_rows, **opts)
    refs = [p.detach().double().requires_grad_() for p in leaves]
    ref = reference(refs[0], refs[1], refs[2] if bias else None, t, reduction,
                    **{k: v for k, v in opts.items() if k not in ("weight", "vocab_tile")}, cw=opts.get("weight"))
    assert ours.dtype == dtype and ours.shape == ref.shape
    scale = max(ref.abs().max().item(), 1.0)
    torch.testing.assert_close(ours.double(), ref, rtol=TOL[dtype], atol=TOL[dtype] * scale, equal_nan=True)
    g = torch.rand(ref.shape, dtype=torch.float64) + 0.5
    ours_g = torch.autograd.grad(ours, leaves, g.to(dtype))
    ref_g = torch.autograd.grad(ref, refs, g)
    for name, a, r in zip(["input", "linear_weight", "linear_bias"], ours_g, ref_g):
        assert a.dtype == dtype
        tol = TOL[dtype] * max(r.abs().max().item(), 1e-3)
        torch.testing.assert_close(a.double(), r, rtol=TOL[dtype], atol=tol, msg=lambda m: f"grad {name}: {m}")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("strategy", ["auto", "recompute"])
@pytest.mark.parametrize("chunk_rows", [0, 4])
@pytest.mark.parametrize("vocab_tile", [0, 64])
def test_matches_cross_entropy_of_linear(dtype, reduction, strategy, chunk_rows, vocab_tile):
    compare(dtype, reduction, strategy, chunk_rows, vocab_tile=vocab_tile)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("vocab_tile", [0, 1500])
def test_wide_vocabulary(dtype, vocab_tile):
    # V = 2600: the binding's GEMM makes a chunk's float32 / float64 logits in column blocks (5 x 512 + 40).
    compare(dtype, "mean", "auto", 4, classes=2600, vocab_tile=vocab_tile)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("opts", [dict(label_smoothing=0.1), dict(softcap=3.0, logit_scale=0.7),
                                  dict(z_loss_scale=1e-2), dict(weight="w", label_smoothing=0.2)], ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_options(reduction, opts, bias):
    if opts.get("weight") == "w":
        opts = dict(opts, weight=torch.rand(203, dtype=torch.float64) + 0.3)
    compare(torch.float64, reduction, "auto", 6, bias=bias, **opts)
    if "weight" in opts:  # class weights of the logits' dtype, as torch requires
        opts = dict(opts, weight=opts["weight"].float())
    compare(torch.float32, reduction, "recompute", 0, bias=bias, **opts)


def test_matches_torch_linear_cross_entropy_and_module():
    x, w, b, t = make(40, 12, 97, torch.float32, seed=3)
    ours = LF.linear_cross_entropy(x, w, t, linear_bias=b, label_smoothing=0.05)
    theirs = torch_linear_ce(x, w, t, linear_bias=b, label_smoothing=0.05)
    torch.testing.assert_close(ours, theirs)
    torch.manual_seed(0)
    m_ours = lossfuse.nn.LinearCrossEntropyLoss(12, 97, bias=True)
    torch.manual_seed(0)
    if hasattr(torch.nn, "LinearCrossEntropyLoss"):
        m_theirs = torch.nn.LinearCrossEntropyLoss(12, 97, bias=True)
    else:  # torch < 2.13: the same module is a Linear(12, 97) whose logits go through cross_entropy
        m_theirs = torch.nn.Sequential()
        m_theirs.linear = torch.nn.Linear(12, 97, bias=True)
        m_theirs.forward = lambda x, t: F.cross_entropy(m_theirs.linear(x), t)
    torch.testing.assert_close(m_ours(x, t), m_theirs(x, t))
    assert m_ours.state_dict().keys() == m_theirs.state_dict().keys()
    # the constructor's other arguments, as torch's module takes them
    m = lossfuse.nn.LinearCrossEntropyLoss(12, 5, out_features=(3,), bias=False, dtype=torch.float64,
                                           reduction="sum", weight=torch.ones(5), ignore_index=2, label_smoothing=0.1)
    assert (m.linear.weight.shape, m.linear.bias, m.linear.weight.dtype) == ((15, 12), None, torch.float64)
    assert (m.num_classes, m.out_features, m.reduction, m.ignore_index, m.label_smoothing) == (5, (3,), "sum", 2, 0.1)
    with pytest.raises(RuntimeError, match="weight"):
        lossfuse.nn.LinearCrossEntropyLoss(12, 5, weight=torch.ones(4))
    with pytest.raises(RuntimeError, match="label_smoothing"):
        lossfuse.nn.LinearCrossEntropyLoss(12, 5, label_smoothing=1.5)


@pytest.mark.filterwarnings("ignore:lossfuse.linear_cross_entropy. probability targets")
def test_module_base_for_torch_without_linear_cross_entropy_loss():
    """torch < 2.13 has no torch.nn.LinearCrossEntropyLoss; lossfuse's module then derives from its own base, which
    must build the classifier as torch's module does: the same parameters from the same seed, state_dict keys,
    attributes, argument checks, and (through lossfuse's forward) the loss of cross_entropy(linear(x), t)."""
    from lossfuse._linear_cross_entropy import _LinearCrossEntropyModule
    x, _, _, t = make(40, 12, 15, torch.float64, seed=11)
    t = t.view(40, 1).expand(40, 3).clamp(min=0) % 5  # out_features (3,): 5 classes per position
    kwargs = dict(out_features=(3,), bias=True, dtype=torch.float64, reduction="sum", label_smoothing=0.1)
    torch.manual_seed(2)
    own = _LinearCrossEntropyModule(12, 5, **kwargs)
    torch.manual_seed(2)
    lin = torch.nn.Linear(12, 15, bias=True, dtype=torch.float64)
    assert own.state_dict().keys() == {"linear.weight", "linear.bias"}
    torch.testing.assert_close(own.linear.weight, lin.weight, rtol=0, atol=0)
    torch.testing.assert_close(own.linear.bias, lin.bias, rtol=0, atol=0)
    assert (own.num_classes, own.out_features, own.reduction, own.ignore_index, own.label_smoothing, own.weight) == \
        (5, (3,), "sum", None, 0.1, None)
    if hasattr(torch.nn, "LinearCrossEntropyLoss"):
        torch.manual_seed(2)
        theirs = torch.nn.LinearCrossEntropyLoss(12, 5, **kwargs)
        for k, v in theirs.state_dict().items():
            torch.testing.assert_close(own.state_dict()[k], v, rtol=0, atol=0)
    own.extras = {}
    got = lossfuse.nn.LinearCrossEntropyLoss.forward(own, x, t)  # lossfuse's forward on this base
    want = F.cross_entropy(lin(x).view(40, 5, 3), t, reduction="sum", label_smoothing=0.1)
    torch.testing.assert_close(got, want)
    with pytest.raises(RuntimeError, match="weight: expected shape"):
        _LinearCrossEntropyModule(12, 5, weight=torch.ones(4))
    with pytest.raises(RuntimeError, match="label_smoothing"):
        _LinearCrossEntropyModule(12, 5, label_smoothing=-0.1)


def test_unbatched_and_all_ignored():
    x, w, b, t = make(12, 8, 31, torch.float64, seed=4)
    ours = LF.linear_cross_entropy(x[3], w, t[3].clamp(min=0), reduction="none")
    torch.testing.assert_close(ours, reference(x[3:4], w, None, t[3:4].clamp(min=0), "none")[0])
    t_all = torch.full((12,), -100)
    xg = x.clone().requires_grad_()
    loss = LF.linear_cross_entropy(xg, w, t_all)
    assert torch.isnan(loss)  # torch: mean over no target is nan
    assert torch.equal(torch.autograd.grad(loss, xg)[0], torch.zeros_like(x))


@pytest.mark.parametrize("strategy", ["chunked", "recompute"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_target_weights_summing_to_zero(strategy, label_smoothing):
    """Rows remain but their target classes weigh 0: torch's mean is NaN (0/0, plus s/0 with label smoothing), and
    so are the gradients; ours gave zero gradients (and an infinite loss with label smoothing)."""
    x, w, b, _ = make(8, 6, 9, torch.float64, seed=7)
    t = torch.tensor([0, 1, -100, 0, 1, 1, -100, 0])
    cw = torch.tensor([0.0, 0.0] + [1.0] * 7, dtype=torch.float64)
    leaves = [x.clone().requires_grad_(), w.clone().requires_grad_(), b.clone().requires_grad_()]
    ours = LF.linear_cross_entropy(leaves[0], leaves[1], t, linear_bias=leaves[2], weight=cw,
                                   label_smoothing=label_smoothing, strategy=strategy)
    ref_leaves = [x.clone().requires_grad_(), w.clone().requires_grad_(), b.clone().requires_grad_()]
    ref = F.cross_entropy(F.linear(*ref_leaves), t, weight=cw, label_smoothing=label_smoothing)  # torch itself
    assert torch.isnan(ref) and torch.isnan(ours)
    for got, want in zip(torch.autograd.grad(ours, leaves), torch.autograd.grad(ref, ref_leaves)):
        torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("all_ignored", [False, True])
def test_nan_upstream_keeps_what_torch_keeps(reduction, all_ignored):
    """The chunked strategy's held gradients scaled by a NaN upstream gradient: torch's NaN everywhere but the input
    gradient's ignored rows (0), and every gradient 0 when every row is ignored."""
    x, w, b, t = make(8, 6, 9, torch.float32, seed=3, ignored=0.0)
    t[2] = -100
    if all_ignored:
        t[:] = -100
    leaves = [p.clone().requires_grad_() for p in (x, w, b)]
    ref_leaves = [p.clone().requires_grad_() for p in (x, w, b)]
    ours = LF.linear_cross_entropy(leaves[0], leaves[1], t, linear_bias=leaves[2], reduction=reduction,
                                   strategy="chunked")
    ref = F.cross_entropy(F.linear(*ref_leaves), t, reduction=reduction)
    nan = torch.tensor(float("nan"))
    for got, want in zip(torch.autograd.grad(ours, leaves, nan), torch.autograd.grad(ref, ref_leaves, nan)):
        assert torch.equal(torch.isnan(got), torch.isnan(want))
        torch.testing.assert_close(got, want, equal_nan=True)


class _NoOpMode(torch.overrides.TorchFunctionMode):
    """Any active mode makes linear_cross_entropy take the registered op and its autograd."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("path", ["eager", "registered"])
@pytest.mark.parametrize("strategy", ["chunked", "recompute"])
def test_retain_graph_and_second_backward(path, strategy):
    # The chunked strategy makes the gradients in the forward and hands each over once; a gradient handed over is
    # the caller's (it may be accumulated into .grad), so the next backward of a retained graph must compute it anew
    # and leave the earlier results alone.
    x, w, b, t = make(9, 6, 17, torch.float64, seed=5)
    leaves = (x.requires_grad_(), w.requires_grad_(), b.requires_grad_())
    x64, w64, b64 = (p.detach().requires_grad_() for p in leaves)
    ref = torch.autograd.grad(reference(x64, w64, b64, t, "mean"), (x64, w64, b64))
    with _NoOpMode() if path == "registered" else contextlib.nullcontext():
        loss = LF.linear_cross_entropy(x, w, t, linear_bias=b, strategy=strategy)
        g1 = torch.autograd.grad(loss, leaves, torch.tensor(2.0, dtype=torch.float64), retain_graph=True)
        kept = [g.clone() for g in g1]
        gw = torch.autograd.grad(loss, w, torch.tensor(-0.5, dtype=torch.float64), retain_graph=True)[0]
        g3 = torch.autograd.grad(loss, leaves, retain_graph=True)
        g3_again = torch.autograd.grad(loss, leaves, retain_graph=True)
        (3 * loss).backward(retain_graph=True)
        loss.backward()
    for a, k in zip(g1, kept):
        assert torch.equal(a, k), "a later backward changed an earlier result"
    for a, b in zip(g3, g3_again):
        assert torch.equal(a, b), "backward is not reentrant"
    for g, r in zip(g1, ref):
        torch.testing.assert_close(g, 2 * r)
    torch.testing.assert_close(gw, -0.5 * ref[1])
    for g, r in zip(g3, ref):
        torch.testing.assert_close(g, r)
    for p, r in zip(leaves, ref):
        torch.testing.assert_close(p.grad, 4 * r)  # accumulated: 3 + 1


def test_zero_upstream_gradient_then_another():
    x, w, b, t = make(9, 6, 17, torch.float64, seed=7)
    x.requires_grad_()
    loss = LF.linear_cross_entropy(x, w, t, linear_bias=b)
    g0 = torch.autograd.grad(loss, x, torch.tensor(0.0, dtype=torch.float64), retain_graph=True)[0]
    g2 = torch.autograd.grad(loss, x, torch.tensor(2.0, dtype=torch.float64))[0]
    x64 = x.detach().requires_grad_()
    assert torch.equal(g0, torch.zeros_like(g0))
    torch.testing.assert_close(g2, 2 * torch.autograd.grad(reference(x64, w, b, t, "mean"), x64)[0])


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_gradcheck(reduction):
    x, w, b, t = make(5, 4, 7, torch.float64, seed=6)
    leaves = (x.requires_grad_(), w.requires_grad_(), b.requires_grad_())

    def fn(x, w, b):
        return LF.linear_cross_entropy(x, w, t, linear_bias=b, reduction=reduction, label_smoothing=0.1,
                                       chunk_rows=2)

    def tiled(x, w, b):
        return LF.linear_cross_entropy(x, w, t, linear_bias=b, reduction=reduction, label_smoothing=0.1,
                                       chunk_rows=2, vocab_tile=3)

    assert torch.autograd.gradcheck(fn, leaves)
    assert torch.autograd.gradgradcheck(fn, leaves)
    assert torch.autograd.gradcheck(tiled, leaves)


@pytest.mark.parametrize("grad_mask", [[False, False, False], [True, True, True]], ids=str)
def test_opcheck(grad_mask):
    x, w, b, t = make(6, 5, 9, torch.float32, seed=7)
    ops = torch.ops.lossfuse
    args = (x, w, t, b, None, 1, -100, 0.1, 1.0, 0.0, 0.0, 4, 1 << 20, 0, 0.0, grad_mask)
    torch.library.opcheck(ops.linear_cross_entropy.default, args)
    lse = ops.linear_cross_entropy(*args)[1]
    torch.library.opcheck(ops.linear_cross_entropy_backward.default,
                          (torch.rand(6), x, w, t, lse, b, None, 0, -100, 0.1, 1.0, 0.0, 0.0, 4, 1 << 20, 0, 0.0,
                           grad_mask))
    tiled = args[:13] + (4, 0.0, grad_mask)
    torch.library.opcheck(ops.linear_cross_entropy.default, tiled)


@pytest.mark.parametrize("strict", [False, True], ids=["non_strict", "strict"])
def test_export_with_a_dynamic_batch(strict):
    """torch.export of a module calling linear_cross_entropy keeps the batch dim dynamic (it was specialized to the
    example's size in non-strict export), and the exported program gives eager's results at other sizes."""
    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(50, 16))

        def forward(self, x, t):
            return LF.linear_cross_entropy(x, self.w, t, label_smoothing=0.1)

    head = Head()
    batch = torch.export.Dim("batch", min=2, max=1024)
    example = (torch.randn(8, 16), torch.randint(0, 50, (8,)))
    program = torch.export.export(head, example, dynamic_shapes=({0: batch}, {0: batch}), strict=strict)
    for n in (5, 33):
        x, t = torch.randn(n, 16), torch.randint(0, 50, (n,))
        torch.testing.assert_close(program.module()(x, t), head(x, t))


def test_torch_compile():
    x, w, b, t = make(16, 8, 40, torch.float32, seed=8)
    w.requires_grad_()
    fn = torch.compile(lambda x, w, t: LF.linear_cross_entropy(x, w, t, label_smoothing=0.1), fullgraph=True)
    loss = fn(x, w, t)
    loss.backward()
    w2 = w.detach().requires_grad_()
    ref = F.cross_entropy(F.linear(x, w2), t, label_smoothing=0.1)
    ref.backward()
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(w.grad, w2.grad)


def test_16bit_error_not_above_torch():
    x, w, b, t = make(64, 64, 2000, torch.bfloat16, seed=9)
    exact = reference(x, w, b, t, "mean")
    ours = LF.linear_cross_entropy(x, w, t, linear_bias=b)
    theirs = F.cross_entropy(F.linear(x, w, b), t)
    half_ulp = 0.5 * torch.finfo(torch.bfloat16).eps * exact.abs().item()
    assert (ours.double() - exact).abs() <= (theirs.double() - exact).abs() + half_ulp


@pytest.mark.parametrize("strategy", ["chunked", "recompute"])
def test_float32_loss_of_16bit_input(strategy):
    """loss_dtype=float32: the float32 accumulation unrounded (the default rounds it to bf16: that rounding, no
    further from the float64 reference), gradients as the default's."""
    x, w, b, t = make(64, 64, 2000, torch.bfloat16, seed=9)
    exact = reference(x, w, b, t, "sum")
    x.requires_grad_()
    wide = LF.linear_cross_entropy(x, w, t, linear_bias=b, reduction="sum", strategy=strategy,
                                   loss_dtype=torch.float32)
    narrow = LF.linear_cross_entropy(x, w, t, linear_bias=b, reduction="sum", strategy=strategy)
    assert wide.dtype == torch.float32 and narrow.dtype == torch.bfloat16
    assert narrow.item() == wide.to(torch.bfloat16).item() != wide.item()
    assert abs(wide.item() - exact.item()) <= abs(narrow.item() - exact.item())
    (gw,) = torch.autograd.grad(wide, x)
    (gn,) = torch.autograd.grad(narrow, x)
    torch.testing.assert_close(gw, gn, rtol=0, atol=0)


def test_bad_input():
    x, w, b, t = make(6, 5, 9, torch.float32, seed=10)
    with pytest.raises(RuntimeError, match="linear_weight"):
        LF.linear_cross_entropy(x, w[:, :4], t)
    with pytest.raises(RuntimeError, match="bias"):
        LF.linear_cross_entropy(x, w, t, linear_bias=b[:5])
    with pytest.raises(RuntimeError, match="weight"):
        LF.linear_cross_entropy(x, w.double(), t)
    bad = t.clone()
    bad[2] = 9
    with pytest.raises(IndexError, match=r"target.*got 9 at position \[2\]"):
        LF.linear_cross_entropy(x, w, bad)
    with pytest.raises(ValueError, match="strategy"):
        LF.linear_cross_entropy(x, w, t, strategy="fast")


def test_target_shape_must_match_the_rows():
    # torch raises RuntimeError for an (N, 1) target and ValueError for a (1, N) one; lossfuse's ArgumentError is
    # both, and no target is silently flattened
    x, w, b, t = make(5, 4, 7, torch.float64, seed=8)
    for bad in (t.view(5, 1), t.view(1, 5), t[:4]):
        with pytest.raises(Exception) as theirs:
            torch_linear_ce(x, w, bad)
        with pytest.raises(type(theirs.value), match="target"):
            LF.linear_cross_entropy(x, w, bad)
    with pytest.raises(RuntimeError, match="target"):
        LF.linear_cross_entropy(x[0], w, t)  # unbatched input wants a 0-d target


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_no_features(reduction):
    # in_features = 0: every logit is the bias (or 0), as torch computes it
    x, w, b, t = make(5, 4, 7, torch.float64, seed=9)
    leaves = (x[:, :0].clone().requires_grad_(), w[:, :0].clone().requires_grad_(), b.requires_grad_())
    ours = LF.linear_cross_entropy(*leaves[:2], t, linear_bias=leaves[2], reduction=reduction)
    theirs = torch_linear_ce(*leaves[:2], t, linear_bias=leaves[2], reduction=reduction)
    torch.testing.assert_close(ours, theirs)
    g = torch.ones_like(theirs)
    for a, c in zip(torch.autograd.grad(ours, leaves, g), torch.autograd.grad(theirs, leaves, g)):
        torch.testing.assert_close(a, c)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_empty_batch_with_strided_hidden_states(reduction):
    # an empty tensor counts as contiguous whatever its strides, so .contiguous() leaves a stride of 2 (or 0) along H
    w = torch.randn(5, 8, dtype=torch.float64, requires_grad=True)
    t = torch.zeros(0, dtype=torch.long)
    for x in [torch.zeros(0, 16, dtype=torch.float64)[:, ::2], torch.zeros(0, 1, dtype=torch.float64).expand(0, 8)]:
        x = x.requires_grad_()
        ours = LF.linear_cross_entropy(x, w, t, reduction=reduction)
        theirs = torch_linear_ce(x, w, t, reduction=reduction)
        torch.testing.assert_close(ours, theirs, equal_nan=True)
        for a, c in zip(torch.autograd.grad(ours.sum(), (x, w)), torch.autograd.grad(theirs.sum(), (x, w))):
            assert a.shape == c.shape
            torch.testing.assert_close(a, c)


def test_label_smoothing_and_class_weights_as_torch():
    # torch smooths only above 0 (a negative or NaN value is none) and wants class weights of the logits' dtype
    x, w, b, t = make(6, 4, 9, torch.float32, seed=11)
    for ls in [-0.5, math.nan]:
        ours = LF.linear_cross_entropy(x, w, t, linear_bias=b, label_smoothing=ls)
        torch.testing.assert_close(ours, torch_linear_ce(x, w, t, linear_bias=b, label_smoothing=ls))
        assert torch.equal(ours, LF.linear_cross_entropy(x, w, t, linear_bias=b))
    cw = torch.rand(9, dtype=torch.float64) + 0.5
    with pytest.raises(RuntimeError):
        torch_linear_ce(x, w, t, weight=cw)
    with pytest.raises(RuntimeError, match="linear_cross_entropy: weight: expected dtype torch.float32"):
        LF.linear_cross_entropy(x, w, t, weight=cw)
