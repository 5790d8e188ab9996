"""lossfuse's elementwise losses (mse_loss, l1_loss, smooth_l1_loss, huber_loss, kl_div, hinge_embedding_loss,
margin_ranking_loss) against torch: values and gradients for every option, reduction and dtype, broadcasting,
dtype promotion, layouts, edge cases, errors, 16-bit accuracy, gradcheck/gradgradcheck, opcheck, modules and
torch.compile."""

import math
import re
import warnings
import zlib

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import lossfuse
import lossfuse.nn.functional as LF

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
REDUCTIONS = ["none", "mean", "sum"]
# Relative tolerance (scaled by max(|reference|, 1)) on values and gradients against torch computing in float64 on
# the same, already rounded, inputs: lossfuse computes in float32 (float64 for float64) and rounds 16-bit results
# once to the output dtype.
TOL = {torch.float64: 1e-12, torch.float32: 2e-5, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}

# (loss, options); "weight": True asks for a weight of the input's shape.
CASES = [
    ("mse_loss", {}),
    ("mse_loss", {"weight": True}),
    ("l1_loss", {}),
    ("l1_loss", {"weight": True}),
    ("smooth_l1_loss", {}),
    ("smooth_l1_loss", {"beta": 0.25}),
    ("smooth_l1_loss", {"beta": 0.0}),
    ("huber_loss", {}),
    ("huber_loss", {"delta": 2.5}),
    ("huber_loss", {"delta": 0.5, "weight": True}),
    ("kl_div", {}),
    ("kl_div", {"log_target": True}),
    ("hinge_embedding_loss", {}),
    ("hinge_embedding_loss", {"margin": -0.5}),
    ("hinge_embedding_loss", {"margin": 2.0}),
    ("margin_ranking_loss", {}),
    ("margin_ranking_loss", {"margin": 0.3}),
]
NAMES = sorted({name for name, _ in CASES})
REGRESSION = ["mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss"]


def reductions_of(name):
    return REDUCTIONS + (["batchmean"] if name == "kl_div" else [])


CASES_AND_REDUCTIONS = [(name, opts, red) for name, opts in CASES for red in reductions_of(name)]


def case_id(value):
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items()) or "default"
    return str(value)


def n_operands(name):
    return 3 if name == "margin_ranking_loss" else 2


def differentiable(name, opts):
    """Indices of the tensors (operands, then the weight) torch differentiates."""
    if name == "hinge_embedding_loss":
        return [0]
    return list(range(n_operands(name) + bool(opts.get("weight"))))


def call(lib, name, tensors, opts, reduction):
    """lib.<name> (lib: torch.nn.functional or lossfuse.nn.functional) on the operands, then the weight if any."""
    kw = {k: v for k, v in opts.items() if k != "weight"}
    if opts.get("weight"):
        kw["weight"] = tensors[n_operands(name)]
    return getattr(lib, name)(*tensors[:n_operands(name)], reduction=reduction, **kw)


def make_tensors(name, opts, shape, dtype, gen, shapes=None, kinks=True):
    """Operands (and weight) for a loss: shapes[i] overrides the shape of operand i (broadcasting cases). kinks
    adds elements on the losses' kinks and special values (x == t, a kl_div target of 0, hinge targets other than
    +-1), which gradcheck cannot differentiate numerically."""
    shapes = shapes or [shape] * n_operands(name)

    def randn(s, scale=2.0):
        return torch.randn(s, generator=gen, dtype=torch.float64) * scale

    if name in REGRESSION:
        x, t = randn(shapes[0]), randn(shapes[1])
        if kinks and x.shape == t.shape and x.numel():
            t.view(-1)[::5] = x.reshape(-1)[::5]
        ops = [x, t]
    elif name == "kl_div":
        x = torch.log_softmax(randn(shapes[0]), -1) if len(shapes[0]) else -randn(shapes[0]).abs()
        t = torch.softmax(randn(shapes[1]), -1) if len(shapes[1]) else randn(shapes[1]).abs()
        if opts.get("log_target"):
            t = t.log()
        elif kinks and t.numel() and shapes[1] == shapes[0]:
            # y = 0 contributes 0. Not for a broadcast target: where it is broadcast over an empty input, torch's
            # composite kl_div gives its gradient 0 * (log 0 + 1) = nan, lossfuse an empty sum, 0.
            t.view(-1)[::4] = 0.0
        ops = [x, t]
    elif name == "hinge_embedding_loss":
        t = torch.where(torch.rand(shapes[1], generator=gen, dtype=torch.float64) < 0.5, 1.0, -1.0)
        if kinks and t.numel():
            t.view(-1)[::5] = 0.5  # neither 1 nor -1: both terms
        ops = [randn(shapes[0]), t]
    else:  # margin_ranking_loss
        t = torch.where(torch.rand(shapes[2], generator=gen, dtype=torch.float64) < 0.5, 1.0, -1.0)
        ops = [randn(shapes[0]), randn(shapes[1]), t]
    if opts.get("weight"):
        ops.append(torch.rand(shapes[0], generator=gen, dtype=torch.float64) + 0.1)
    return [o.to(dtype) for o in ops]


def assert_close(ours, ref, dtype, what, terms=1):
    """terms: how many rounded terms autograd summed into each element (a broadcast operand's gradient)."""
    assert ours.shape == ref.shape, f"{what}: shape {tuple(ours.shape)} != {tuple(ref.shape)}"
    ours, ref = ours.double(), ref.double()
    finite = ref[torch.isfinite(ref)]
    scale = finite.abs().max().item() if finite.numel() else 0.0
    tol = TOL[dtype] * max(terms, 1)
    torch.testing.assert_close(ours, ref, rtol=tol, atol=tol * max(scale, 1.0), equal_nan=True,
                               msg=lambda m: f"{what}: {m}")


def check_against_torch(name, opts, reduction, tensors, dtype, diff=None):
    """lossfuse on the tensors as given against torch in float64 on the same values: the loss, its dtype and shape
    (torch's own at the given dtypes), and the gradients of every tensor torch differentiates."""
    diff = differentiable(name, opts) if diff is None else diff
    ours_in = [t.detach().requires_grad_(i in diff) for i, t in enumerate(tensors)]
    ref_in = [t.detach().double().requires_grad_(i in diff) for i, t in enumerate(tensors)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = call(LF, name, ours_in, opts, reduction)
        ref = call(F, name, ref_in, opts, reduction)
        native = call(F, name, [t.detach() for t in tensors], opts, reduction)
    assert ours.dtype == native.dtype, f"dtype {ours.dtype}, torch gives {native.dtype}"
    assert_close(ours, ref, dtype, "loss")
    if not diff:
        return
    g = torch.randn(ref.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(ours.dtype)
    ours_g = torch.autograd.grad(ours, [ours_in[i] for i in diff], g)
    ref_g = torch.autograd.grad(ref, [ref_in[i] for i in diff], g.double())  # the same (rounded) values
    full = torch.broadcast_shapes(*[t.shape for t in tensors])
    for i, a, b in zip(diff, ours_g, ref_g):
        assert a.dtype == tensors[i].dtype, f"grad of tensor {i}: dtype {a.dtype}"
        # A gradient is rounded to its tensor's dtype, which may be coarser than the loss's; a broadcast operand's
        # is the sum of `terms` full-shape gradients, each rounded to that dtype before autograd sums them (as with
        # torch's own losses), and can be a small difference of large terms (a weight that cancels out of a mean).
        terms = math.prod(full) // max(tensors[i].numel(), 1)
        assert_close(a, b, max(dtype, a.dtype, key=lambda d: TOL[d]), f"grad of tensor {i}", terms)


# ---- every loss, option, reduction and dtype ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name,opts,reduction", CASES_AND_REDUCTIONS, ids=case_id)
def test_against_torch(name, opts, reduction, dtype):
    # A seed per case that is the same in every run (hash() of strings is not).
    gen = torch.Generator().manual_seed(zlib.crc32(repr((name, case_id(opts), reduction)).encode()))
    tensors = make_tensors(name, opts, (6, 9), dtype, gen)
    check_against_torch(name, opts, reduction, tensors, dtype)


@pytest.mark.parametrize("name,opts,reduction", CASES_AND_REDUCTIONS, ids=case_id)
def test_large_and_zero_dim(name, opts, reduction):
    gen = torch.Generator().manual_seed(1)
    check_against_torch(name, opts, reduction, make_tensors(name, opts, (3, 20001), torch.float32, gen),
                        torch.float32)
    check_against_torch(name, opts, reduction, make_tensors(name, opts, (), torch.float64, gen), torch.float64)


def noncontiguous(t):
    """The same values in a strided view (every other element of a wider last dim)."""
    if t.dim() == 0:
        return t
    wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    wide[..., ::2] = t
    return wide[..., ::2]


def broadcast_shapes_for(name, shape, pattern, draw_bits):
    """Operand shapes broadcasting to `shape`: pattern 'target' shrinks the target (and the operands after the
    first), 'input' shrinks the first operand; margin_ranking_loss keeps the number of dims (torch requires it)."""
    shapes = [list(shape) for _ in range(n_operands(name))]
    which = range(1, len(shapes)) if pattern == "target" else [0]
    for i in which:
        for d in range(len(shape)):
            if draw_bits[(i * 7 + d) % len(draw_bits)]:
                shapes[i][d] = 1
        if name != "margin_ranking_loss" and shapes[i] and draw_bits[-1]:
            while shapes[i] and shapes[i][0] == 1:  # drop leading 1s as well
                shapes[i].pop(0)
    return [tuple(s) for s in shapes]


@settings(max_examples=50, deadline=None)
@given(case=st.sampled_from(CASES), dtype=st.sampled_from(DTYPES), reduction=st.sampled_from(REDUCTIONS + ["bm"]),
       shape=st.lists(st.integers(0, 5), min_size=0, max_size=4), pattern=st.sampled_from(["same", "target", "input"]),
       bits=st.lists(st.booleans(), min_size=8, max_size=8), strided=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_random_shapes_broadcasting_layouts(case, dtype, reduction, shape, pattern, bits, strided, seed):
    name, opts = case
    if reduction == "bm":
        reduction = "batchmean" if name == "kl_div" else "mean"
    gen = torch.Generator().manual_seed(seed)
    shapes = None if pattern == "same" else broadcast_shapes_for(name, shape, pattern, bits)
    tensors = make_tensors(name, opts, tuple(shape), dtype, gen, shapes)
    if strided:
        tensors = [noncontiguous(t) for t in tensors]
    check_against_torch(name, opts, reduction, tensors, dtype)


@pytest.mark.parametrize("name,opts", CASES, ids=case_id)
def test_expanded_and_transposed_operands(name, opts):
    gen = torch.Generator().manual_seed(3)
    tensors = make_tensors(name, opts, (7, 5), torch.float32, gen)
    # A transposed view, and an operand that is an expanded (stride 0) view of a row.
    tensors = [t.t().contiguous().t() if i % 2 == 0 else t[:1].expand(7, 5) for i, t in enumerate(tensors)]
    for reduction in reductions_of(name):
        check_against_torch(name, opts, reduction, tensors, torch.float32)


@pytest.mark.parametrize("name,opts", CASES, ids=case_id)
def test_more_dims_than_the_kernels_take(name, opts):
    gen = torch.Generator().manual_seed(4)
    shape = (2, 1, 3, 1, 2, 1, 1, 2, 1, 3)  # 10 dims; the kernels take 8
    shapes = [shape] * n_operands(name)
    shapes[1] = shape[:-1] + (1,)  # and a broadcast operand
    for reduction in reductions_of(name):
        check_against_torch(name, opts, reduction, make_tensors(name, opts, shape, torch.float64, gen, shapes),
                            torch.float64)


# ---- edge cases (torch-loss-semantics.md) ------------------------------------------------------------------------


@pytest.mark.parametrize("name,opts,reduction", CASES_AND_REDUCTIONS, ids=case_id)
def test_empty(name, opts, reduction):
    """Mean of nothing is nan, sum is 0, batchmean of (0, C) is 0 / 0 = nan."""
    tensors = make_tensors(name, opts, (0, 4), torch.float32, torch.Generator().manual_seed(0))
    check_against_torch(name, opts, reduction, tensors, torch.float32)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_weighted_means_differ_as_torch(reduction):
    """mse/l1: sum(w l) / sum(w); huber: mean(w l) -- with weights far from 1 so a wrong denominator shows."""
    gen = torch.Generator().manual_seed(5)
    x, t = torch.randn(4, 6, generator=gen, dtype=torch.float64), torch.randn(4, 6, generator=gen, dtype=torch.float64)
    w = torch.rand(4, 6, generator=gen, dtype=torch.float64) * 10
    for name in ["mse_loss", "l1_loss", "huber_loss"]:
        check_against_torch(name, {"weight": True}, reduction, [x, t, w], torch.float64)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("name", ["mse_loss", "l1_loss", "huber_loss"])
def test_weight_broadcast_with_the_input(name, reduction):
    """The weight has the input's shape; a target broadcasting the input to a larger shape broadcasts the weight
    too, and torch's weighted mean (mse, l1) divides by the sum of the weight as given."""
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(1, 5, generator=gen, dtype=torch.float64)
    t = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    w = torch.rand(1, 5, generator=gen, dtype=torch.float64) + 0.5
    check_against_torch(name, {"weight": True}, reduction, [x, t, w], torch.float64)


def test_kinks_match_torch():
    """l1 and smooth_l1 (beta 0 included: torch computes it as l1) have gradient 0 where x == t; huber at
    |d| == delta; hinge and margin ranking at their hinge points."""
    x = torch.tensor([1.0, 2.0, -3.0, 0.5], dtype=torch.float64)
    t = torch.tensor([1.0, 3.0, -3.0, 1.5], dtype=torch.float64)
    for name, opts in [("l1_loss", {}), ("smooth_l1_loss", {"beta": 0.0}), ("smooth_l1_loss", {"beta": 1.0}),
                       ("huber_loss", {"delta": 1.0}), ("mse_loss", {})]:
        for reduction in REDUCTIONS:
            check_against_torch(name, opts, reduction, [x, t], torch.float64)
    xh = torch.tensor([1.0, 0.0, 2.0, 1.0], dtype=torch.float64)
    th = torch.tensor([-1.0, -1.0, 1.0, 1.0], dtype=torch.float64)
    check_against_torch("hinge_embedding_loss", {}, "none", [xh, th], torch.float64)
    x1 = torch.tensor([1.0, 2.0, 0.0], dtype=torch.float64)
    x2 = torch.tensor([1.0, 1.0, 0.5], dtype=torch.float64)
    y = torch.tensor([1.0, -1.0, 1.0], dtype=torch.float64)
    check_against_torch("margin_ranking_loss", {"margin": 0.5}, "none", [x1, x2, y], torch.float64)


@pytest.mark.parametrize("log_target", [False, True])
def test_kl_div_special_targets(log_target):
    """y = 0 gives 0, y < 0 gives nan (not log_target); log_target accepts any real y."""
    x = torch.tensor([[-1.0, -2.0, -0.5], [0.3, -4.0, -1.0]], dtype=torch.float64)
    t = torch.tensor([[0.0, 0.5, -0.1], [0.2, 0.0, 1.0]], dtype=torch.float64)
    if log_target:
        t = t * 10
    for reduction in reductions_of("kl_div"):
        check_against_torch("kl_div", {"log_target": log_target}, reduction, [x, t], torch.float64)


@pytest.mark.parametrize("shape", [(), (7,), (3, 4), (1, 4), (4, 1)], ids=str)
def test_kl_div_batchmean_divisor(shape):
    """batchmean divides the sum by input.size(0): by C for a 1-D input, not at all for a 0-d one, and by the
    input's size(0) even where the target broadcasts it to a larger one."""
    gen = torch.Generator().manual_seed(7)
    x, t = make_tensors("kl_div", {}, shape, torch.float64, gen, kinks=False)
    check_against_torch("kl_div", {}, "batchmean", [x, t], torch.float64)
    if len(shape) == 2:
        tb = torch.rand(5, *shape[1:], generator=gen, dtype=torch.float64) if shape[0] == 1 else t
        check_against_torch("kl_div", {}, "batchmean", [x, tb], torch.float64)
        check_against_torch("kl_div", {}, "batchmean", [x[:1], t], torch.float64)  # the input is broadcast


def test_kl_div_mean_warns_as_torch():
    x, t = torch.log_softmax(torch.randn(2, 3), 1), torch.softmax(torch.randn(2, 3), 1)
    with pytest.warns(UserWarning, match="batchmean"):
        LF.kl_div(x, t)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LF.kl_div(x, t, reduction="batchmean")
        LF.kl_div(x, t, reduction="sum")


@pytest.mark.parametrize("name", REGRESSION)
def test_size_mismatch_warns_and_broadcasts(name):
    x, t = torch.randn(3, 4), torch.randn(4)
    with pytest.warns(UserWarning, match="target size") as record:
        out = getattr(LF, name)(x, t, reduction="none")
    assert record[0].filename == __file__  # attributed to the caller, as torch's
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(out, getattr(F, name)(x, t, reduction="none"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        getattr(LF, name)(x, t.expand(3, 4).clone())


@pytest.mark.parametrize("target_value", [1.0, -1.0, 0.0, 0.5, 2.0, -3.0])
def test_hinge_any_target_value(target_value):
    """y == 1: x; y == -1: max(0, margin - x); any other y: both terms summed."""
    x = torch.tensor([-2.0, -0.3, 0.0, 0.4, 1.0, 3.0], dtype=torch.float64)
    t = torch.full_like(x, target_value)
    for reduction in REDUCTIONS:
        check_against_torch("hinge_embedding_loss", {"margin": 0.7}, reduction, [x, t], torch.float64)


@pytest.mark.parametrize("tdtype", [torch.int64, torch.int32, torch.int8, torch.float64, torch.float16], ids=str)
def test_hinge_target_dtypes(tdtype):
    """The loss takes the input's dtype whatever the target's; integer targets (+-1) are common."""
    x = torch.randn(5, 4, dtype=torch.float32)
    t = (torch.randint(0, 2, (5, 4)) * 2 - 1).to(tdtype)
    for reduction in REDUCTIONS:
        check_against_torch("hinge_embedding_loss", {}, reduction, [x, t], torch.float32)


@pytest.mark.parametrize("margin", [0.7, math.inf], ids=str)
@pytest.mark.parametrize("xdtype", [torch.float32, torch.bfloat16], ids=str)
def test_hinge_target_compared_in_its_own_dtype(xdtype, margin):
    """torch tests target == 1 and target == -1 in the target's dtype: a float64 1 + 1e-12 (or a float32 1.001 for
    16-bit input) is no 1 although it rounds to 1 in the input's dtype, and a uint8 255 is -1."""
    x = torch.tensor([0.3, -0.2, 0.5, 0.1], dtype=xdtype, requires_grad=True)
    targets = [torch.tensor([1 + 1e-12, -1 - 1e-12, 1.0, -1.0], dtype=torch.float64),
               torch.tensor([1.001, -1.001, 1.0, -1.0], dtype=torch.float32),
               torch.tensor([1, 255, 0, 1], dtype=torch.uint8), torch.tensor([True, False, True, False])]
    for t in targets:
        for reduction in REDUCTIONS:
            ours = LF.hinge_embedding_loss(x, t, margin=margin, reduction=reduction)
            ref = F.hinge_embedding_loss(x, t, margin=margin, reduction=reduction)
            assert ours.dtype == ref.dtype
            # bfloat16: margin - x rounded once by lossfuse, after torch's bfloat16 steps: an ulp apart at most
            rtol = 0 if xdtype == torch.float32 else 2.0 ** -7
            torch.testing.assert_close(ours, ref, rtol=rtol, atol=0, equal_nan=True)
            if margin == 0.7:
                g = torch.ones_like(ref)
                torch.testing.assert_close(torch.autograd.grad(ours, x, g)[0], torch.autograd.grad(ref, x, g)[0],
                                           rtol=0, atol=0)


def test_hinge_target_gets_no_gradient():
    x = torch.randn(4, requires_grad=True)
    t = torch.tensor([1.0, -1.0, 1.0, -1.0], requires_grad=True)
    loss = LF.hinge_embedding_loss(x, t)
    assert torch.autograd.grad(loss, [x, t], allow_unused=True)[1] is None  # as torch: t is not in the graph


# dtype combinations: (input, target[, input2/weight]) -> torch's result dtype, gradients in each tensor's dtype.
PROMOTIONS = [
    (torch.float32, torch.float64),
    (torch.float64, torch.float32),
    (torch.bfloat16, torch.float16),
    (torch.bfloat16, torch.float32),
    (torch.float16, torch.float64),
    (torch.float32, torch.int64),
    (torch.int64, torch.float32),
]


@pytest.mark.parametrize("dtypes", PROMOTIONS, ids=str)
@pytest.mark.parametrize("name,opts", [c for c in CASES if c[0] != "margin_ranking_loss"], ids=case_id)
def test_dtype_promotion(name, opts, dtypes):
    """Mixed dtypes give torch's result dtype (torch's type promotion; huber and hinge keep the input's dtype)."""
    x_dtype, t_dtype = dtypes
    tensors = make_tensors(name, opts, (3, 4), torch.float64, torch.Generator().manual_seed(8))
    tensors[0], tensors[1] = tensors[0].to(x_dtype), tensors[1].to(t_dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            call(F, name, tensors, opts, "mean")
        except RuntimeError as e:  # NotImplementedError included
            with pytest.raises(type(e)):
                call(LF, name, tensors, opts, "mean")
            return
    diff = [i for i in differentiable(name, opts) if tensors[i].is_floating_point()]
    worst = max((t.dtype for t in tensors if t.is_floating_point()), key=lambda d: TOL[d])
    for reduction in reductions_of(name):
        check_against_torch(name, opts, reduction, tensors, worst, diff)


@pytest.mark.parametrize("dtypes", [(torch.float16, torch.float64), (torch.float64, torch.float16),
                                    (torch.int64, torch.float32), (torch.bfloat16, torch.int64)], ids=str)
@pytest.mark.parametrize("zero_dim", [0, 1])
@pytest.mark.parametrize("name", NAMES)
def test_zero_dim_operand_promotion(name, zero_dim, dtypes):
    """A 0-d operand promotes an n-d one only from a lower category (torch.result_type's rule)."""
    tensors = make_tensors(name, {}, (3, 4), torch.float64, torch.Generator().manual_seed(18), kinks=False)
    tensors[zero_dim] = tensors[zero_dim][0, 0]
    tensors[:2] = [t.to(d) if d.is_floating_point else t.round().to(d) for t, d in zip(tensors[:2], dtypes)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            native = call(F, name, tensors, {}, "mean")
        except RuntimeError as e:
            with pytest.raises(type(e)):
                call(LF, name, tensors, {}, "mean")
            return
        ours = call(LF, name, tensors, {}, "mean")
    assert ours.dtype == native.dtype
    assert_close(ours, native, max(native.dtype, *[t.dtype for t in tensors if t.is_floating_point()],
                                   key=lambda d: TOL[d]), "loss")


@pytest.mark.parametrize("wdtype", [torch.float64, torch.bfloat16, torch.int64], ids=str)
@pytest.mark.parametrize("name", ["mse_loss", "l1_loss", "huber_loss"])
def test_weight_dtype_promotion(name, wdtype):
    gen = torch.Generator().manual_seed(9)
    x, t, w = make_tensors(name, {"weight": True}, (3, 4), torch.float32, gen)
    w = (w * 4).to(wdtype)
    diff = [0, 1, 2] if wdtype.is_floating_point else [0, 1]
    for reduction in REDUCTIONS:
        check_against_torch(name, {"weight": True}, reduction, [x, t, w], torch.float32, diff)


@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float64, torch.float32), (torch.float16, torch.float16,
                                    torch.int64), (torch.int64, torch.int64, torch.int64),
                                    (torch.bfloat16, torch.float32, torch.bfloat16)], ids=str)
def test_margin_ranking_promotion(dtypes):
    """torch promotes all three operands; integer ones give the default dtype (the margin is a float)."""
    tensors = make_tensors("margin_ranking_loss", {}, (4, 3), torch.float64, torch.Generator().manual_seed(10))
    tensors = [(t * 3).round().to(d) if not d.is_floating_point else t.to(d) for t, d in zip(tensors, dtypes)]
    diff = [i for i, t in enumerate(tensors) if t.is_floating_point()]
    worst = max((t.dtype for t in tensors if t.is_floating_point()), key=lambda d: TOL[d], default=torch.float32)
    for reduction in REDUCTIONS:
        check_against_torch("margin_ranking_loss", {"margin": 0.5}, reduction, tensors, worst, diff)


@pytest.mark.parametrize("margin", [0.5, math.inf], ids=str)
def test_margin_ranking_integer_and_bool_targets(margin):
    """torch negates the target in its own dtype (a uint8 1 becomes 255, an int8 -128 stays -128) and raises
    NotImplementedError for a bool target or bool inputs, which it cannot negate or subtract."""
    x1 = torch.tensor([0.3, -0.2, 0.5, 0.1], requires_grad=True)
    x2 = torch.tensor([0.5, -0.2, 0.3, -0.4])
    for t in [torch.tensor([1, 255, 0, 2], dtype=torch.uint8), torch.tensor([1, -128, 0, -1], dtype=torch.int8),
              torch.tensor([1, -1, 0, 3])]:
        for reduction in REDUCTIONS:
            ours = LF.margin_ranking_loss(x1, x2, t, margin=margin, reduction=reduction)
            ref = F.margin_ranking_loss(x1, x2, t, margin=margin, reduction=reduction)
            torch.testing.assert_close(ours, ref, rtol=1e-6, atol=0, equal_nan=True)
            if margin == 0.5:
                g = torch.ones_like(ref)
                torch.testing.assert_close(torch.autograd.grad(ours, x1, g)[0], torch.autograd.grad(ref, x1, g)[0])
    for a, b, t in [(x1, x2, torch.tensor([True, False, True, False])), (x1 > 0, x2, torch.ones(4)),
                    (x1, x2 > 0, torch.ones(4))]:
        with pytest.raises(NotImplementedError):
            F.margin_ranking_loss(a, b, t, margin=margin)
        with pytest.raises(NotImplementedError, match="margin_ranking_loss"):
            LF.margin_ranking_loss(a, b, t, margin=margin)


def test_integer_and_complex_operands_as_torch():
    """torch's own arithmetic where no real floating kernel applies: margin_ranking_loss subtracts integer inputs in
    their dtype (int8 100 - (-100) wraps to -56) and refuses complex operands; smooth_l1_loss at beta 0 is l1_loss,
    which takes integer and complex operands."""
    i8 = torch.tensor([100, -100, 7], dtype=torch.int8)
    u8 = torch.tensor([1, 5, 200], dtype=torch.uint8)
    t = torch.tensor([1, -1, 1])
    for a, b in [(i8, i8.flip(0)), (u8, u8.flip(0)), (i8.long(), u8.long())]:
        for reduction in REDUCTIONS:
            want = F.margin_ranking_loss(a, b, t, margin=0.5, reduction=reduction)
            got = LF.margin_ranking_loss(a, b, t, margin=0.5, reduction=reduction)
            assert got.dtype == want.dtype
            torch.testing.assert_close(got, want)
    c = torch.tensor([1 + 1j, 5, 2], dtype=torch.complex64)
    with pytest.raises(NotImplementedError):
        F.margin_ranking_loss(torch.rand(3), torch.rand(3), c)
    with pytest.raises(NotImplementedError):
        LF.margin_ranking_loss(torch.rand(3), torch.rand(3), c)
    for a, b in [(i8.long(), u8.long()), (c, torch.rand(3))]:
        for reduction in ["none", "sum"]:
            want = F.smooth_l1_loss(a, b, beta=0.0, reduction=reduction)
            got = LF.smooth_l1_loss(a, b, beta=0.0, reduction=reduction)
            assert got.dtype == want.dtype
            torch.testing.assert_close(got, want)


@pytest.mark.parametrize("name,opts", [("smooth_l1_loss", {"beta": math.inf}), ("huber_loss", {"delta": math.inf}),
                                       ("huber_loss", {"delta": math.inf, "weight": True}),
                                       ("hinge_embedding_loss", {"margin": math.inf}),
                                       ("hinge_embedding_loss", {"margin": -math.inf}),
                                       ("hinge_embedding_loss", {"margin": math.nan}),
                                       ("margin_ranking_loss", {"margin": math.inf}),
                                       ("margin_ranking_loss", {"margin": -math.inf})], ids=case_id)
def test_non_finite_hyperparameters(name, opts):
    """torch accepts an infinite beta/delta/margin (and a nan margin); so does lossfuse (computed with torch ops)."""
    tensors = make_tensors(name, opts, (3, 4), torch.float64, torch.Generator().manual_seed(11))
    for reduction in REDUCTIONS:
        check_against_torch(name, opts, reduction, tensors, torch.float64)


@pytest.mark.parametrize("name", [n for n in NAMES if n != "huber_loss"])
@pytest.mark.parametrize("legacy", [dict(size_average=False), dict(reduce=False), dict(size_average=True),
                                    dict(size_average=False, reduce=True)], ids=str)
def test_legacy_size_average_and_reduce(name, legacy):
    tensors = make_tensors(name, {}, (3, 4), torch.float64, torch.Generator().manual_seed(12))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = getattr(LF, name)(*tensors, **legacy)
        ref = getattr(F, name)(*tensors, **legacy)
        assert_close(ours, ref, torch.float64, "loss")
        if name == "kl_div":  # torch also divides a legacy reduction by size(0) when reduction is 'batchmean'
            assert_close(LF.kl_div(*tensors, reduction="batchmean", **legacy),
                         F.kl_div(*tensors, reduction="batchmean", **legacy), torch.float64, "loss")


# ---- 16-bit accuracy: never worse than torch's own -----------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["none", "mean"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name,opts", CASES, ids=case_id)
def test_16bit_error_not_above_torch(name, opts, dtype, reduction):
    """Against the float64 result on the same 16-bit inputs, lossfuse's error (value and gradients, element by
    element) is at most torch's own 16-bit error plus one unit of the output's precision at that element: both are
    rounded to the 16-bit output, and ours is the rounding of a float32 value, which can fall on the other side of
    a rounding tie (it cannot otherwise be further from the exact value than a correctly rounded result)."""
    gen = torch.Generator().manual_seed(13)
    tensors = make_tensors(name, opts, (64, 256), dtype, gen)
    diff = differentiable(name, opts)
    eps, tiny = torch.finfo(dtype).eps, torch.finfo(dtype).tiny

    def run(lib, tensors):
        ins = [t.detach().requires_grad_(i in diff) for i, t in enumerate(tensors)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = call(lib, name, ins, opts, reduction)
        g = torch.linspace(-1, 1, out.numel(), dtype=torch.float64).reshape(out.shape)
        grads = torch.autograd.grad(out, [ins[i] for i in diff], g.to(out.dtype))
        return [out.double()] + [x.double() for x in grads]

    exact = run(F, [t.double() for t in tensors])
    ours, theirs = run(LF, tensors), run(F, tensors)
    for what, e, a, b in zip(["loss"] + [f"grad {i}" for i in diff], exact, ours, theirs):
        ok = e.isfinite()
        ours_err, torch_err = (a - e).abs()[ok], (b - e).abs()[ok]
        allowed = torch_err + eps * e.abs()[ok] + tiny
        assert bool((ours_err <= allowed).all()), f"{what}: {(ours_err - allowed).max().item()} above torch's"


# ---- errors ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_bad_reduction(name):
    tensors = make_tensors(name, {}, (2, 3), torch.float32, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="avg is not a valid value for reduction"):
        getattr(LF, name)(*tensors, reduction="avg")


@pytest.mark.parametrize("name", NAMES)
def test_shapes_that_do_not_broadcast(name):
    tensors = make_tensors(name, {}, (2, 3), torch.float32, torch.Generator().manual_seed(0))
    tensors[1] = tensors[1][:, :2]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(RuntimeError) as theirs:
            getattr(F, name)(*tensors)
        with pytest.raises(RuntimeError) as ours:
            getattr(LF, name)(*tensors)
    assert type(ours.value) is type(theirs.value)
    # torch's message names positions; lossfuse's names the operands and their shapes
    second = "input2" if name == "margin_ranking_loss" else "target"
    pattern = rf"{name}: the sizes of input1? \(2, 3\), {second} \(2, 2\).* do not broadcast"
    assert re.search(pattern, str(ours.value)), str(ours.value)


def test_bad_arguments_name_the_argument():
    x, t = torch.randn(3, 4), torch.randn(3, 4)
    with pytest.raises(ValueError, match="[Ww]eight.*input.*same size"):
        LF.mse_loss(x, t, weight=torch.ones(4))
    with pytest.raises(ValueError, match="[Ww]eight"):
        LF.l1_loss(x, t, weight=torch.ones(3, 1))
    with pytest.raises(ValueError, match="[Ww]eight"):
        LF.huber_loss(x, t, weight=torch.ones(1, 4))
    for beta in [-1.0, math.nan]:
        with pytest.raises(RuntimeError, match="beta"):
            LF.smooth_l1_loss(x, t, beta=beta)
    for delta in [0.0, -2.0, math.nan]:
        with pytest.raises(RuntimeError, match="delta"):
            LF.huber_loss(x, t, delta=delta)
    with pytest.raises(RuntimeError, match="same dimension.*input2"):
        LF.margin_ranking_loss(x, torch.randn(4), torch.ones(3, 4))
    with pytest.raises(RuntimeError, match="kl_div.*Integral"):
        LF.kl_div(x, t.long(), reduction="sum")
    for name in ["mse_loss", "smooth_l1_loss"]:  # l1_loss of integers is computed as torch's (test_api.py)
        with pytest.raises(NotImplementedError, match="input and target"):
            getattr(LF, name)(x.long(), t.long())
    with pytest.raises(NotImplementedError, match="input"):
        LF.hinge_embedding_loss(x.long(), t)
    # the exception types torch raises: its huber kernel writes the input's dtype (a float result cannot be cast
    # to int64, nor a complex one to float32), and it cannot subtract a bool tensor
    c = torch.randn(x.shape, dtype=torch.complex64)
    for name, args, kwargs, error, match in [
            ("huber_loss", (x.long(), t), {}, RuntimeError, "can't be cast"),
            ("huber_loss", (x, c), {}, RuntimeError, "can't be cast"),
            ("huber_loss", (x.long(), t.long()), {}, NotImplementedError, "input"),
            ("l1_loss", (x, t > 0), {}, NotImplementedError, "bool"),
            ("l1_loss", (x > 0, t > 0), {}, NotImplementedError, "bool"),
            ("smooth_l1_loss", (x, t > 0), {"beta": 0.0}, NotImplementedError, "bool"),
            ("kl_div", (x, c), {}, RuntimeError, "Complex")]:
        with pytest.raises(error):
            getattr(F, name)(*args, **kwargs)
        with pytest.raises(error, match=match):
            getattr(LF, name)(*args, **kwargs)
    torch.testing.assert_close(LF.mse_loss(x, t > 0), F.mse_loss(x, t > 0))  # torch allows it for mse
    torch.testing.assert_close(LF.smooth_l1_loss(x, t > 0), F.smooth_l1_loss(x, t > 0))  # and for beta > 0
    # torch's weighted mse_loss is a composition, which takes integer operands (and an integer weight)
    xi, ti = (x * 3).round().long(), (t * 3).round().long()
    for w in [torch.rand(x.shape) + 0.5, torch.randint(1, 4, x.shape)]:
        for reduction in REDUCTIONS:
            want = F.mse_loss(xi, ti, weight=w, reduction=reduction)
            got = LF.mse_loss(xi, ti, weight=w, reduction=reduction)
            assert got.dtype == want.dtype
            torch.testing.assert_close(got, want)


def test_ops_check_their_operands():
    """The ops themselves (called directly) reject mismatched operands with the argument's name."""
    ops = torch.ops.lossfuse
    x = torch.randn(3, 4)
    with pytest.raises(ValueError, match="target"):
        ops.mse_loss(x, torch.randn(3, 5), None, 1)
    with pytest.raises(RuntimeError, match="target"):
        ops.l1_loss(x, torch.randn(3, 4, dtype=torch.float64), None, 1)
    with pytest.raises(ValueError, match="weight"):
        ops.huber_loss(x, x, torch.ones(3), 1, 1.0)
    with pytest.raises(ValueError, match="reduction"):
        ops.kl_div(x, x, 5, False, False)
    with pytest.raises(ValueError, match="batchmean"):
        ops.kl_div(x, x, 2, True, False)
    with pytest.raises(ValueError, match="beta"):
        ops.smooth_l1_loss(x, x, 1, -1.0)
    with pytest.raises(ValueError, match="margin"):
        ops.hinge_embedding_loss(x, x, math.inf, 1)
    with pytest.raises(ValueError, match="input2"):
        ops.margin_ranking_loss(x, torch.randn(4, 3), x, 0.0, 1)


# ---- autograd machinery --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,opts,reduction", CASES_AND_REDUCTIONS, ids=case_id)
def test_gradcheck_and_gradgradcheck(name, opts, reduction):
    gen = torch.Generator().manual_seed(14)
    tensors = make_tensors(name, opts, (3, 4), torch.float64, gen, kinks=False)
    diff = differentiable(name, opts)
    inputs = [t.requires_grad_(i in diff) for i, t in enumerate(tensors)]

    def fn(*ts):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return call(LF, name, ts, opts, reduction)

    assert torch.autograd.gradcheck(fn, inputs)
    assert torch.autograd.gradgradcheck(fn, inputs)


@pytest.mark.parametrize("name,opts", [c for c in CASES if c[0] in ("mse_loss", "l1_loss", "huber_loss", "kl_div",
                                                                     "margin_ranking_loss")], ids=case_id)
def test_gradcheck_broadcast(name, opts):
    gen = torch.Generator().manual_seed(15)
    shapes = [(3, 1), (3, 4), (1, 4)][:n_operands(name)]
    tensors = make_tensors(name, opts, (3, 4), torch.float64, gen, shapes, kinks=False)
    diff = differentiable(name, opts)
    inputs = [t.requires_grad_(i in diff) for i, t in enumerate(tensors)]
    for reduction in reductions_of(name):
        def fn(*ts):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return call(LF, name, ts, opts, reduction)
        assert torch.autograd.gradcheck(fn, inputs)


def test_second_backward_of_retained_graph():
    x = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    t = torch.randn(4, 5, dtype=torch.float64)
    w = torch.rand(4, 5, dtype=torch.float64, requires_grad=True)
    loss = LF.mse_loss(x, t, weight=w)
    g1 = torch.autograd.grad(loss, [x, w], torch.tensor(2.0, dtype=torch.float64), retain_graph=True)
    g2 = torch.autograd.grad(loss, [x, w], torch.tensor(-0.5, dtype=torch.float64))
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a * -0.25, b)


def _op_cases():
    """(op, args) for every forward and backward op, with a broadcast (expanded) operand and a weight."""
    gen = torch.Generator().manual_seed(16)
    x = torch.randn(3, 4, generator=gen, requires_grad=True)
    t = torch.randn(4, generator=gen).expand(3, 4).requires_grad_()  # a stride-0 (expanded) leaf
    w = torch.rand(3, 4, generator=gen) + 0.1
    p = torch.softmax(torch.randn(3, 4, generator=gen), 1).requires_grad_()
    y = torch.tensor([1.0, -1.0, 0.5, 1.0]).expand(3, 4)
    ops = torch.ops.lossfuse
    xd, td, pd = (a.detach() for a in (x, t, p))
    g0, g1 = torch.rand(3, 4, generator=gen), torch.tensor(0.7)
    return [
        (ops.mse_loss, (x, t, w, 1)), (ops.mse_loss, (x, t, None, 0)),
        (ops.l1_loss, (x, t, w, 2)), (ops.l1_loss, (x, t, None, 1)),
        (ops.smooth_l1_loss, (x, t, 1, 0.5)),
        (ops.huber_loss, (x, t, w, 0, 1.5)), (ops.huber_loss, (x, t, None, 1, 2.0)),
        (ops.kl_div, (torch.log(p), p, 1, True, False)), (ops.kl_div, (x, t, 0, False, True)),
        (ops.hinge_embedding_loss, (x, y, 1.0, 1)), (ops.margin_ranking_loss, (x, t, y, 0.2, 0)),
        (ops.mse_loss_backward, (g1, xd, td, w, 1, [True, True])),
        (ops.mse_loss_backward, (g0, xd, td, None, 0, [False, True])),
        (ops.l1_loss_backward, (g1, xd, td, w, 2, [True, False])),
        (ops.smooth_l1_loss_backward, (g0, xd, td, 0, 0.5, [True, True])),
        (ops.huber_loss_backward, (g1, xd, td, w, 1, 1.5, [False, True])),
        (ops.kl_div_backward, (g1, torch.log(pd), pd, 1, True, False, [True, True])),
        (ops.kl_div_backward, (g0, xd, td, 0, False, True, [True, False])),
        (ops.hinge_embedding_loss_backward, (g1, xd, y, 1.0, 2)),
        (ops.margin_ranking_loss_backward, (g0, xd, td, y, 0.2, 0, [True, False, True])),
        (ops.margin_ranking_loss_backward, (g1, xd, td, y, 0.2, 1, [False, True, False])),
    ]


@pytest.mark.parametrize("case", range(len(_op_cases())))
def test_opcheck(case):
    op, args = _op_cases()[case]
    torch.library.opcheck(op, args)


def test_torch_compile_training_step():
    """Every loss in one fullgraph-compiled forward (broadcast operands and a weight included); AOTAutograd
    compiles the backward from the ops' fake implementations and autograd registrations."""
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 8)
    ref_model = torch.nn.Linear(6, 8)
    ref_model.load_state_dict(model.state_dict())
    x = torch.randn(5, 6)
    t = torch.randn(5, 8)
    w = torch.rand(5, 8)
    y = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, 1.0, -1.0, 0.0])

    def forward(m, lib, x, t, w, y):
        z = m(x)
        return (lib.mse_loss(z, t, weight=w) + lib.l1_loss(z, t[:1]) + lib.smooth_l1_loss(z, t, beta=0.5)
                + lib.huber_loss(z, t, delta=0.7, weight=w)
                + lib.kl_div(torch.log_softmax(z, 1), torch.softmax(t, 1), reduction="batchmean")
                + lib.hinge_embedding_loss(z, y) + lib.margin_ranking_loss(z, t, y.expand(5, 8), margin=0.1)
                + lib.mse_loss(z, t, reduction="none").sum(1).mean())

    compiled = torch.compile(forward, fullgraph=True, backend="aot_eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = compiled(model, LF, x, t, w, y)
        ref = forward(ref_model, F, x, t, w, y)
    ours.backward()
    ref.backward()
    torch.testing.assert_close(ours, ref)
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


# ---- modules -------------------------------------------------------------------------------------------------------

MODULES = [
    ("MSELoss", {}), ("MSELoss", {"reduction": "sum"}), ("L1Loss", {"reduction": "none"}),
    ("SmoothL1Loss", {"beta": 0.3}), ("HuberLoss", {"delta": 0.4, "reduction": "sum"}),
    ("KLDivLoss", {"reduction": "batchmean", "log_target": True}), ("KLDivLoss", {"size_average": False}),
    ("HingeEmbeddingLoss", {"margin": 0.5}), ("MarginRankingLoss", {"margin": 0.2, "reduction": "none"}),
]
MODULE_LOSS = {"MSELoss": "mse_loss", "L1Loss": "l1_loss", "SmoothL1Loss": "smooth_l1_loss",
               "HuberLoss": "huber_loss", "KLDivLoss": "kl_div", "HingeEmbeddingLoss": "hinge_embedding_loss",
               "MarginRankingLoss": "margin_ranking_loss"}


@pytest.mark.parametrize("cls,kwargs", MODULES, ids=case_id)
def test_modules_match_torch(cls, kwargs):
    ours_m, theirs_m = getattr(lossfuse.nn, cls)(**kwargs), getattr(torch.nn, cls)(**kwargs)
    assert isinstance(ours_m, getattr(torch.nn, cls))
    assert ours_m.state_dict().keys() == theirs_m.state_dict().keys() and repr(ours_m) == repr(theirs_m)
    name = MODULE_LOSS[cls]
    tensors = make_tensors(name, {}, (4, 5), torch.float64, torch.Generator().manual_seed(17))
    ours_in = [t.clone().requires_grad_(t.is_floating_point()) for t in tensors]
    theirs_in = [t.clone().requires_grad_(t.is_floating_point()) for t in tensors]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours, theirs = ours_m(*ours_in), theirs_m(*theirs_in)
    assert "lossfuse" in type(ours.grad_fn).__name__  # computed by lossfuse, not a torch fallback
    assert_close(ours, theirs, torch.float64, "loss")
    ours.sum().backward()
    theirs.sum().backward()
    for a, b in zip(ours_in, theirs_in):
        if b.grad is not None:
            assert_close(a.grad, b.grad, torch.float64, "grad")


@pytest.mark.parametrize("input_dtype,target_dtype", [(torch.bfloat16, torch.float32), (torch.bfloat16, torch.float64),
                                                     (torch.float16, torch.float32), (torch.float16, torch.float64),
                                                     (torch.float32, torch.float64)], ids=str)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("delta", [1.0, 0.5, math.inf])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_huber_wider_target_is_not_rounded_first(input_dtype, target_dtype, weighted, delta, reduction):
    """torch's huber_loss computes d = input - target in the promoted dtype and rounds only the result to the input's
    dtype: a float64 target 1.001 against a bfloat16 1 gives 5e-7, not 0. The loss's dtype is torch's; its value is
    within one rounding (to the input's dtype) of the float64 loss of the same values."""
    x = torch.tensor([1.0, 2.0, 5.0, -3.0], dtype=input_dtype)
    t = torch.tensor([1.001, 2.003, 1.0, -3.25], dtype=target_dtype)
    w = torch.tensor([0.5, 2.0, 1.0, 3.0]) if weighted else None
    got = LF.huber_loss(x, t, reduction=reduction, delta=delta, weight=w)
    want = F.huber_loss(x.double(), t.double(), reduction=reduction, delta=delta,
                        weight=None if w is None else w.double())
    assert got.dtype == F.huber_loss(x, t, reduction=reduction, delta=delta, weight=w).dtype
    eps = torch.finfo(got.dtype).eps
    torch.testing.assert_close(got.double(), want, rtol=eps, atol=torch.finfo(got.dtype).tiny)
