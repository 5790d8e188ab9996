"""lossfuse.nn.functional's margin and embedding losses against torch: triplet_margin_loss, cosine_embedding_loss,
multi_margin_loss, multilabel_margin_loss, multilabel_soft_margin_loss. Values, gradients, options, dtypes,
broadcasting, layouts, errors, gradcheck/gradgradcheck, opcheck, torch.compile and the modules."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import lossfuse.nn as LN
import lossfuse.nn.functional as LF

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
REDUCTIONS = ["none", "mean", "sum"]
TORCH_VERSION = tuple(int(v) for v in torch.__version__.split(".")[:2])
INT_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
# Relative tolerance on values and gradients against torch computing in float64 on the same (rounded) inputs:
# lossfuse accumulates in float32, and 16-bit results (and the 16-bit upstream gradient) are rounded once.
TOL = {torch.float64: 1e-12, torch.float32: 2e-5, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}
NAMES = ["triplet_margin_loss", "cosine_embedding_loss", "multi_margin_loss", "multilabel_margin_loss",
         "multilabel_soft_margin_loss"]
# torch's own functions, captured here (test_api's patch_torch() restores them, but never trust a global).
TF = {name: getattr(F, name) for name in NAMES}
assert all(fn.__module__ == "torch.nn.functional" for fn in TF.values())


def assert_close(ours, ref, dtype, what, terms=None):
    """ours within TOL[dtype] of ref (relative, and absolute against the largest |ref| or 1). `terms`, a tensor of
    ref's shape: the size of the terms whose difference ref is, where they cancel; TOL[dtype] of it is allowed on
    top (a rounding error relative to the terms, not to their difference)."""
    ours, ref = ours.double(), ref.double()
    assert ours.shape == ref.shape, f"{what}: shape {tuple(ours.shape)} != {tuple(ref.shape)}"
    finite = ref[torch.isfinite(ref)]
    scale = finite.abs().max().item() if finite.numel() else 0.0
    tol = TOL[dtype] * max(scale, 1.0)
    if terms is not None:
        ok = ((ours - ref).abs() <= tol + TOL[dtype] * (ref.abs() + terms)) | (ours == ref) | (ours.isnan() & ref.isnan())
        assert ok.all(), f"{what}: {(~ok).sum().item()} of {ok.numel()} elements off: ours {ours[~ok][:4].tolist()} " \
                         f"ref {ref[~ok][:4].tolist()} terms {terms[~ok][:4].tolist()}"
        return
    torch.testing.assert_close(ours, ref, rtol=TOL[dtype], atol=tol, equal_nan=True, msg=lambda m: f"{what}: {m}")


def check_against_torch(name, args, kwargs, diff, dtype, grad_terms=None):
    """Runs lossfuse on the arguments as given and torch in float64 on the same values; compares the loss and the
    gradients of the positional arguments `diff` (torch's None gradient, e.g. for p = 0, counts as zeros).
    grad_terms(args64, i, g): the size of the cancelling terms of argument i's gradient (see assert_close)."""
    args = [a.detach().requires_grad_(i in diff) if torch.is_tensor(a) and a.is_floating_point() else a
            for i, a in enumerate(args)]
    ours = getattr(LF, name)(*args, **kwargs)
    args64 = [a.detach().double().requires_grad_(i in diff) if torch.is_tensor(a) and a.is_floating_point() else a
              for i, a in enumerate(args)]
    kw64 = {k: (v.double() if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in kwargs.items()}
    ref = TF[name](*args64, **kw64)
    assert ours.dtype == dtype, f"dtype {ours.dtype} != {dtype}"
    assert_close(ours, ref, dtype, "loss")
    if ref.numel() == 0 or not diff:
        return
    g = torch.randn(ref.shape, dtype=torch.float64) if ref.dim() else torch.tensor(1.7, dtype=torch.float64)
    g16 = g.to(ours.dtype)  # the upstream gradient as ours sees it; torch's reference gets the same values
    ours_grads = torch.autograd.grad(ours, [args[i] for i in diff], g16, allow_unused=True)
    ref_grads = torch.autograd.grad(ref, [args64[i] for i in diff], g16.double(), allow_unused=True) \
        if ref.requires_grad else [None] * len(diff)
    for i, go, gr in zip(diff, ours_grads, ref_grads):
        if go is None and gr is None:  # neither differentiates (torch's p = 0 norm, where ours uses its formula)
            continue
        assert go is not None and go.dtype == args[i].dtype and go.shape == args[i].shape, f"grad of arg {i}"
        terms = grad_terms(args64, i, g) if grad_terms is not None else None
        assert_close(go, torch.zeros_like(args64[i]) if gr is None else gr, dtype, f"grad of arg {i}", terms)


def randn(shape, dtype, scale=1.0):
    return (torch.randn(shape, dtype=torch.float64) * scale).to(dtype)


def class_targets(rows, C, int_dtype=torch.int64):
    return torch.randint(0, C, rows).to(int_dtype)


def label_lists(N, C, int_dtype=torch.int64):
    """multilabel_margin_loss targets (N, C): a label list per row (repeats allowed), ended by -1 unless full,
    then valid values past the -1 (torch ignores them but checks their range)."""
    t = torch.randint(0, C, (N, C))
    for r in range(N):
        k = int(torch.randint(0, C + 1, ()))
        if k < C:
            t[r, k] = -1
    return t.to(int_dtype)


def cosine_targets(rows):
    return torch.tensor([1, -1, 0, 1, -1, 2, 1, -1])[torch.randint(0, 8, rows)]


# ---- every option, reduction and dtype, on fixed cases -------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", [(), (9,), (5, 9), (2, 3, 17)], ids=str)
@pytest.mark.parametrize("options", [{}, dict(swap=True), dict(p=1, margin=0.5, eps=0.0), dict(p=3.0, swap=True),
                                     dict(p=float("inf"), eps=1e-3), dict(p=0.0, margin=2.0), dict(p=1.5, eps=0.5)],
                         ids=str)
def test_triplet(dtype, reduction, shape, options):
    torch.manual_seed(1)
    a, p, n = (randn(shape, dtype) for _ in range(3))
    check_against_torch("triplet_margin_loss", [a, p, n], dict(reduction=reduction, **options), (0, 1, 2), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", [(12,), (8, 12), (40, 3)], ids=str)
@pytest.mark.parametrize("margin", [0.0, 0.4, -0.6])
def test_cosine(dtype, reduction, shape, margin):
    torch.manual_seed(2)
    x1, x2 = randn(shape, dtype), randn(shape, dtype)
    x2[..., : shape[-1] // 2] += x1[..., : shape[-1] // 2]  # cosines of both signs
    y = cosine_targets(shape[:-1])
    check_against_torch("cosine_embedding_loss", [x1, x2, y], dict(margin=margin, reduction=reduction), (0, 1),
                        dtype, lambda args64, i, g: cosine_grad_terms(args64, i, g, reduction))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", [(), (7,), (6, 7), (3, 1)], ids=str)
@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("margin", [1.0, -0.5])
@pytest.mark.parametrize("weighted", [False, True])
def test_multi_margin(dtype, reduction, shape, p, margin, weighted):
    torch.manual_seed(3)
    C = shape[-1] if shape else 1
    x = randn(shape, dtype)
    t = class_targets(shape[:1] if len(shape) == 2 else (), C)
    w = (torch.rand(C, dtype=torch.float64) + 0.5).to(dtype) if weighted else None
    check_against_torch("multi_margin_loss", [x, t], dict(p=p, margin=margin, weight=w, reduction=reduction), (0,),
                        dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", [(), (1,), (6,), (5, 6), (4, 30)], ids=str)
def test_multilabel_margin(dtype, reduction, shape):
    torch.manual_seed(4)
    C = shape[-1] if shape else 1
    x = randn(shape, dtype)
    t = label_lists(1 if len(shape) < 2 else shape[0], C).reshape(shape)
    check_against_torch("multilabel_margin_loss", [x, t], dict(reduction=reduction), (0,), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", [(6,), (5, 6), (2, 3, 7)], ids=str)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("hard", [False, True])
def test_multilabel_soft_margin(dtype, reduction, shape, weighted, hard):
    torch.manual_seed(5)
    x = randn(shape, dtype, 3.0)
    t = (torch.rand(shape) < 0.5 if hard else torch.rand(shape)).to(dtype)
    w = (torch.rand(shape[-1], dtype=torch.float64) + 0.5).to(dtype) if weighted else None
    # torch differentiates the target too.
    check_against_torch("multilabel_soft_margin_loss", [x, t], dict(weight=w, reduction=reduction), (0, 1), dtype)


# ---- random cases ------------------------------------------------------------------------------------------------


def _broadcast_shape(st_data, shape):
    """`shape` with some dims set to 1 (a broadcast operand)."""
    return tuple(1 if st_data.draw(st.booleans()) else s for s in shape)


@settings(max_examples=25, deadline=None)
@given(data=st.data(), rows=st.lists(st.integers(0, 4), max_size=2), D=st.integers(0, 40),
       dtype=st.sampled_from(DTYPES), reduction=st.sampled_from(REDUCTIONS),
       p=st.sampled_from([0.0, 1.0, 1.5, 2.0, 3.0, float("inf")]), margin=st.sampled_from([0.1, 1.0, 4.0]),
       eps=st.sampled_from([0.0, 1e-6, 0.1]), swap=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_triplet_random(data, rows, D, dtype, reduction, p, margin, eps, swap, seed):
    torch.manual_seed(seed)
    shape = (*rows, D)
    a, pos, neg = (randn(_broadcast_shape(data, shape), dtype) for _ in range(3))
    if p == float("inf") and 0 in (a.shape[-1], pos.shape[-1], neg.shape[-1]):
        # torch's infinity norm of an empty dim raises (where a pair's last dim is empty); lossfuse does the same
        try:
            TF["triplet_margin_loss"](a, pos, neg, p=p, swap=swap)
        except RuntimeError:
            with pytest.raises(RuntimeError, match="norm"):
                LF.triplet_margin_loss(a, pos, neg, p=p, swap=swap)
            return
    check_against_torch("triplet_margin_loss", [a, pos, neg],
                        dict(margin=margin, p=p, eps=eps, swap=swap, reduction=reduction), (0, 1, 2), dtype)


def cosine_grad_terms(args64, i, g, reduction):
    """cosine_embedding's gradient for x_i is k (x_other / den - cos x_i / m_i), k = upstream * dloss/dcos with
    |dloss/dcos| <= 1: the two terms cancel where cos is near +-1 (always for D = 1), and any float32 result, torch's
    included, then carries an error relative to them. Their size per element, summed over broadcast rows."""
    x1, x2 = torch.broadcast_tensors(args64[0].detach(), args64[1].detach())
    m1 = (x1 * x1).sum(-1, keepdim=True) + 1e-12
    m2 = (x2 * x2).sum(-1, keepdim=True) + 1e-12
    den = (m1 * m2).sqrt()
    cos = ((x1 * x2).sum(-1, keepdim=True) / den).abs()
    k = g.abs()
    if reduction == "none":
        k = k.unsqueeze(-1) if k.dim() else k
    elif reduction == "mean":
        k = k / max(1, x1[..., 0].numel())
    self_, other, m = (x1, x2, m1) if i == 0 else (x2, x1, m2)
    return (k * (other.abs() / den + cos * self_.abs() / m)).sum_to_size(args64[i].shape)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), N=st.integers(0, 7), D=st.integers(1, 50), batched=st.booleans(),
       dtype=st.sampled_from(DTYPES), reduction=st.sampled_from(REDUCTIONS),
       margin=st.sampled_from([-0.5, 0.0, 0.5]), target_dtype=st.sampled_from([None, torch.int8, torch.int64]),
       seed=st.integers(0, 2**31 - 1))
def test_cosine_random(data, N, D, batched, dtype, reduction, margin, target_dtype, seed):
    torch.manual_seed(seed)
    shape = (N, D) if batched else (D,)
    x1, x2 = randn(_broadcast_shape(data, shape), dtype), randn(_broadcast_shape(data, shape), dtype)
    y = cosine_targets(_broadcast_shape(data, shape[:-1]) if batched else ()).to(target_dtype or dtype)
    # a broadcast operand's gradient sums terms that cancel (x2 of shape (N, 1) near 0): bounded by their size, as
    # in test_cosine (torch's float32 result carries the same error there)
    check_against_torch("cosine_embedding_loss", [x1, x2, y], dict(margin=margin, reduction=reduction), (0, 1),
                        dtype, lambda args64, i, g: cosine_grad_terms(args64, i, g, reduction))


@settings(max_examples=40, deadline=None)
@given(N=st.integers(1, 7), C=st.integers(1, 40), batched=st.booleans(), dtype=st.sampled_from(DTYPES),
       reduction=st.sampled_from(REDUCTIONS), p=st.sampled_from([1, 2]),
       margin=st.sampled_from([-1.0, 0.0, 1.0, 2.5]), weighted=st.booleans(),
       int_dtype=st.sampled_from(INT_DTYPES), seed=st.integers(0, 2**31 - 1))
def test_multi_margin_random(N, C, batched, dtype, reduction, p, margin, weighted, int_dtype, seed):
    torch.manual_seed(seed)
    x = randn((N, C) if batched else (C,), dtype, 2.0)
    t = class_targets((N,) if batched else (), C, int_dtype)
    w = (torch.rand(C, dtype=torch.float64) * 2).to(dtype) if weighted else None
    # torch wants int64 targets; lossfuse reads any integer dtype.
    ours = LF.multi_margin_loss(x, t, p=p, margin=margin, weight=w, reduction=reduction)
    ref = TF["multi_margin_loss"](x.double(), t.long(), p=p, margin=margin,
                                  weight=None if w is None else w.double(), reduction=reduction)
    assert_close(ours, ref, dtype, "loss")
    check_against_torch("multi_margin_loss", [x, t.long()], dict(p=p, margin=margin, weight=w, reduction=reduction),
                        (0,), dtype)


@settings(max_examples=40, deadline=None)
@given(N=st.integers(1, 7), C=st.integers(1, 40), batched=st.booleans(), dtype=st.sampled_from(DTYPES),
       reduction=st.sampled_from(REDUCTIONS), int_dtype=st.sampled_from(INT_DTYPES[1:]),
       seed=st.integers(0, 2**31 - 1))
def test_multilabel_margin_random(N, C, batched, dtype, reduction, int_dtype, seed):
    torch.manual_seed(seed)
    x = randn((N, C) if batched else (C,), dtype, 2.0)
    t = label_lists(N if batched else 1, C).reshape(x.shape)
    ours = LF.multilabel_margin_loss(x, t.to(int_dtype), reduction=reduction)  # any integer dtype (torch: int64)
    assert_close(ours, TF["multilabel_margin_loss"](x.double(), t, reduction=reduction), dtype, "loss")
    check_against_torch("multilabel_margin_loss", [x, t], dict(reduction=reduction), (0,), dtype)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), rows=st.lists(st.integers(0, 4), max_size=3), C=st.integers(1, 60),
       dtype=st.sampled_from(DTYPES), reduction=st.sampled_from(REDUCTIONS), weighted=st.booleans(),
       scale=st.sampled_from([0.1, 3.0, 30.0]), seed=st.integers(0, 2**31 - 1))
def test_multilabel_soft_margin_random(data, rows, C, dtype, reduction, weighted, scale, seed):
    torch.manual_seed(seed)
    shape = (*rows, C)
    x = randn(shape, dtype, scale)
    t = torch.rand(_broadcast_shape(data, shape)).to(dtype)
    w = (torch.rand(C, dtype=torch.float64) + 0.1).to(dtype) if weighted else None
    kwargs = dict(weight=w, reduction=reduction)

    def target_terms(args64, i, g):
        """A broadcast target's gradient sums the per-element ones (-w x / C, up to the reduction's scale), which
        cancel: their magnitudes, summed the same way, bound the rounding of the 16-bit terms (torch's too)."""
        if i != 1 or args64[1].shape == args64[0].shape:
            return None
        full = args64[1].detach().expand(args64[0].shape).clone().requires_grad_()
        kw64 = {k: (v.double() if torch.is_tensor(v) else v) for k, v in kwargs.items()}
        (per_element,) = torch.autograd.grad(TF["multilabel_soft_margin_loss"](args64[0].detach(), full, **kw64),
                                             full, g)
        return per_element.abs().sum_to_size(args64[1].shape)

    check_against_torch("multilabel_soft_margin_loss", [x, t], kwargs, (0, 1), dtype, grad_terms=target_terms)


# ---- edge cases of docs/semantics.md ---------------------------------------------------------------------------------


def test_triplet_eps_is_added_to_the_difference():
    a = torch.zeros(3, 4, dtype=torch.float64)
    n = torch.ones(3, 4, dtype=torch.float64)
    for eps in [0.0, 1e-6, 0.25]:
        for p in [1.0, 2.0]:
            # margin 5: every row in the hinge's active part, none on its kink (eps 0.25, p 2 and margin 1 sit on it,
            # where torch 2.11's clamp passed the gradient and later torch does not), the zero distance (eps 0) too
            check_against_torch("triplet_margin_loss", [a, a.clone(), n],
                                dict(eps=eps, p=p, reduction="none", margin=5.0), (0, 1, 2), torch.float64)
            ours = LF.triplet_margin_loss(a, a, n, eps=eps, p=p, reduction="none", margin=5.0)
            d_ap = 4 ** (1 / p) * eps  # ||0 - 0 + eps||_p over 4 entries
            d_an = 4 ** (1 / p) * abs(eps - 1)
            torch.testing.assert_close(ours, torch.full((3,), 5.0 + d_ap - d_an, dtype=torch.float64))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_triplet_swap_takes_the_smaller_negative_distance(reduction):
    torch.manual_seed(6)
    a = randn((6, 5), torch.float64)
    pos = a + 0.1 * randn((6, 5), torch.float64)
    neg = torch.where(torch.arange(6).unsqueeze(1) % 2 == 0, pos + 0.3, a + 0.3)  # swap matters on even rows
    for swap in [False, True]:
        check_against_torch("triplet_margin_loss", [a, pos, neg], dict(swap=swap, reduction=reduction), (0, 1, 2),
                            torch.float64)
    tie = torch.zeros(1, 2, dtype=torch.float64)  # d(a, n) == d(p, n): half the gradient each, as torch's minimum
    check_against_torch("triplet_margin_loss", [tie, tie.clone(), tie + 1], dict(swap=True, margin=5.0), (0, 1, 2),
                        torch.float64)


def test_triplet_infinity_norm_ties_and_zero_norms():
    a = torch.tensor([[1.0, -1.0, 0.5], [2.0, 2.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    pos = torch.zeros(3, 3, dtype=torch.float64)
    neg = torch.full((3, 3), 5.0, dtype=torch.float64)
    for p in [float("inf"), 1.0, 2.0, 0.0]:
        check_against_torch("triplet_margin_loss", [a, pos, neg], dict(p=p, eps=0.0, margin=10.0), (0, 1, 2),
                            torch.float64)


def test_triplet_broadcasts_and_unbatched():
    torch.manual_seed(7)
    cases = [((5, 4), (1, 4), (5, 4)), ((5, 4), (5, 1), (1, 1)), ((1, 4), (1, 4), (3, 4)), ((4,), (4,), (1,)),
             ((2, 1, 6), (1, 3, 6), (2, 3, 1)),
             # torch takes each distance over its pair's own last dim: (a, p) over 1 element, (a, n) over 3
             ((2, 1), (2, 1), (2, 3)), ((2, 1), (1, 3), (2, 1)), ((1,), (3,), (3,)), ((3,), (1,), (1,)),
             ((4, 1), (4, 0), (4, 1))]
    for shapes in cases:
        args = [randn(s, torch.float32) for s in shapes]
        check_against_torch("triplet_margin_loss", args, dict(reduction="none", swap=True), (0, 1, 2),
                            torch.float32)


def test_cosine_zero_vector_other_targets_and_eps():
    x1 = torch.tensor([[0.0, 0.0, 0.0], [1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [1e-7, 0.0, 0.0]], dtype=torch.float64)
    x2 = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [-1.0, 0.5, 2.0], [1e-7, 0.0, 0.0]], dtype=torch.float64)
    for y in [[1, 1, 1, 1], [-1, -1, -1, -1], [0, 2, -2, 1]]:
        for dtype in [torch.float64, torch.float32]:  # float16: see test_cosine_float16_zero_vector
            check_against_torch("cosine_embedding_loss", [x1.to(dtype), x2.to(dtype), torch.tensor(y)],
                                dict(reduction="none", margin=-0.2), (0, 1), dtype)
    ours = LF.cosine_embedding_loss(x1, x2, torch.ones(4), reduction="none")
    assert ours[0] == 1 and ours[1] == 1  # a zero vector has cosine 0


def test_cosine_float16_zero_vector():
    """torch adds its 1e-12 to the squared norms in float16, where it vanishes: a zero vector gives nan. lossfuse
    computes in float32, where it does not: the loss is 1 (target 1) as in float32/float64."""
    x1 = torch.zeros(2, 3, dtype=torch.float16)
    x2 = torch.ones(2, 3, dtype=torch.float16)
    y = torch.tensor([1, -1])
    assert torch.isnan(TF["cosine_embedding_loss"](x1, x2, y, reduction="none")).all()
    torch.testing.assert_close(LF.cosine_embedding_loss(x1, x2, y, reduction="none"),
                               TF["cosine_embedding_loss"](x1.float(), x2.float(), y, reduction="none").half())


@pytest.mark.parametrize("target_dtype", [torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64,
                                          torch.float16, torch.float32, torch.float64], ids=str)
def test_cosine_target_dtypes(target_dtype):
    torch.manual_seed(8)
    x1, x2 = randn((7, 5), torch.float32), randn((7, 5), torch.float32)
    raw = torch.tensor([1, -1, 0, 255, 1, 2, -1])  # uint8 255 compares equal to -1 in torch
    y = raw.to(target_dtype) if target_dtype != torch.uint8 else raw.to(torch.uint8)
    if target_dtype.is_floating_point:
        y = y.clone()
        y[4] = 1 + 1e-6  # not 1 in float32/float64: loss 0, as torch
    ours = LF.cosine_embedding_loss(x1, x2, y, reduction="none", margin=-0.3)
    ref = TF["cosine_embedding_loss"](x1, x2, y, reduction="none", margin=-0.3)
    assert ours.dtype == ref.dtype
    assert_close(ours, ref, torch.float32, "loss")


def test_cosine_broadcasts():
    torch.manual_seed(9)
    cases = [((5, 4), (1, 4), (5,)), ((1, 4), (1, 4), (5,)), ((5, 4), (5, 4), (1,)), ((5, 1), (1, 4), (5,)),
             ((4,), (1,), ()),
             # torch forms each squared norm over its own input's last dim: here one element for x1
             ((5, 1), (5, 4), (5,)), ((1, 4), (3, 1), (1,))]
    for s1, s2, st_ in cases:
        y = cosine_targets(st_)
        check_against_torch("cosine_embedding_loss", [randn(s1, torch.float64), randn(s2, torch.float64), y],
                            dict(reduction="none", margin=0.1), (0, 1), torch.float64)


def test_multi_margin_mean_is_over_samples_not_weights():
    x = torch.tensor([[0.1, 0.2, 0.3], [1.0, 0.0, -1.0]], dtype=torch.float64)
    t = torch.tensor([2, 0])
    w = torch.tensor([10.0, 0.5, 3.0], dtype=torch.float64)
    ours = LF.multi_margin_loss(x, t, weight=w)
    per_row = torch.tensor([3.0 * (0.8 + 0.9) / 3, 10.0 * (0.0 + 0.0) / 3], dtype=torch.float64)
    torch.testing.assert_close(ours, per_row.mean())
    check_against_torch("multi_margin_loss", [x, t], dict(weight=w), (0,), torch.float64)


def test_multilabel_margin_label_lists():
    """The first -1 ends the list; repeated labels count twice; values after the -1 do not matter."""
    x = torch.tensor([[0.1, 0.2, 0.4, 0.8], [0.3, -0.2, 0.5, 0.1], [1.0, 0.0, 0.0, 2.0]], dtype=torch.float64)
    for t in [[[3, 0, -1, 1], [1, 1, -1, 3], [-1, 0, 1, 2]], [[3, -1, 2, 2], [0, 1, 2, 3], [0, 0, 0, 0]]]:
        check_against_torch("multilabel_margin_loss", [x, torch.tensor(t)], dict(reduction="none"), (0,),
                            torch.float64)


@pytest.mark.parametrize("name,args", [
    ("triplet_margin_loss", lambda: [torch.randn(0, 4), torch.randn(0, 4), torch.randn(0, 4)]),
    ("cosine_embedding_loss", lambda: [torch.randn(0, 4), torch.randn(0, 4), torch.ones(0)]),
    ("multi_margin_loss", lambda: [torch.randn(0, 4), torch.zeros(0, dtype=torch.long)]),
    ("multilabel_margin_loss", lambda: [torch.randn(0, 4), torch.zeros(0, 4, dtype=torch.long)]),
    ("multilabel_soft_margin_loss", lambda: [torch.randn(0, 4), torch.rand(0, 4)]),
])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_empty_batch(name, args, reduction):
    """Mean over no rows is nan and the sum 0. torch agrees for triplet, cosine and multilabel_soft_margin; its
    multi_margin_loss and multilabel_margin_loss return uninitialized memory here, so those are checked against
    the rule only."""
    a = [t.requires_grad_() if t.is_floating_point() and i < 2 else t for i, t in enumerate(args())]
    ours = getattr(LF, name)(*a, reduction=reduction)
    expected = {"none": torch.zeros(0), "mean": torch.tensor(float("nan")), "sum": torch.tensor(0.0)}[reduction]
    torch.testing.assert_close(ours, expected, equal_nan=True)
    if name not in ("multi_margin_loss", "multilabel_margin_loss"):
        torch.testing.assert_close(ours, TF[name](*a, reduction=reduction), equal_nan=True)
    grads = torch.autograd.grad(ours.sum(), a[0])
    assert grads[0].shape == a[0].shape


def test_multilabel_soft_margin_broadcasts_and_any_weight():
    """The target broadcasts; a weight of any shape torch accepts (with its gradient) gives torch's result."""
    torch.manual_seed(10)
    x = randn((5, 4), torch.float64)
    cases = [(torch.rand(1, 4), None), (torch.rand(5, 1), None), (torch.rand(5, 4), torch.rand(5, 4)),
             (torch.rand(5, 4), torch.rand(5, 1)), (torch.rand(5, 4), torch.rand(3, 5, 4)),
             (torch.rand(4), torch.rand(1)), (torch.rand(5, 4), torch.rand(()))]
    for t, w in cases:
        for reduction in REDUCTIONS:
            args = [x, t.double()] if w is None else [x, t.double(), w.double()]
            check_against_torch("multilabel_soft_margin_loss", args, dict(reduction=reduction),
                                (0, 1) if w is None else (0, 1, 2), torch.float64)
    # the input broadcast up by the target: torch sums over the input's last dim and divides by its size,
    # whatever the loss's shape is
    for xs, ts in [((4,), (5, 4)), ((5, 1), (5, 4)), ((1, 1), (3, 5))]:
        check_against_torch("multilabel_soft_margin_loss", [randn(xs, torch.float64), torch.rand(ts).double()],
                            dict(reduction="none"), (0, 1), torch.float64)


def test_more_dims_than_the_kernels_take():
    torch.manual_seed(11)
    shape = (2, 1, 2, 1, 2, 1, 2, 1, 3)  # 9 dims
    a, p, n = (randn(shape, torch.float32) for _ in range(3))
    check_against_torch("triplet_margin_loss", [a, p, n], dict(reduction="none"), (0, 1, 2), torch.float32)
    check_against_torch("multilabel_soft_margin_loss", [a, torch.rand(shape)], dict(reduction="none"), (0, 1),
                        torch.float32)


def test_hyperparameters_the_kernels_do_not_take():
    """torch accepts these; lossfuse computes them with torch's formula."""
    torch.manual_seed(12)
    a, p, n = (randn((4, 5), torch.float32) for _ in range(3))
    for kw in [dict(p=-1.0), dict(margin=float("inf")), dict(eps=float("inf")), dict(p=float("nan"))]:
        check_against_torch("triplet_margin_loss", [a, p, n], dict(reduction="none", **kw), (0, 1, 2),
                            torch.float32)
    y = torch.tensor([1, -1, -1, 0])
    for margin in [float("inf"), -float("inf")]:
        check_against_torch("cosine_embedding_loss", [a, p, y], dict(reduction="none", margin=margin), (0, 1),
                            torch.float32)
        for kw in [dict(), dict(p=2), dict(p=2, weight=torch.rand(5) + 0.5)]:
            # p=2: the target's own term (inf at an infinite margin) must not reach x_y's gradient as 0 * inf
            check_against_torch("multi_margin_loss", [a, torch.tensor([0, 4, 2, 1])],
                                dict(reduction="none", margin=margin, **kw), (0,), torch.float32)


def test_complex_triplet_falls_back_to_torch():
    torch.manual_seed(13)
    a, p, n = (torch.randn(3, 4, dtype=torch.complex64) for _ in range(3))
    torch.testing.assert_close(LF.triplet_margin_loss(a, p, n), TF["triplet_margin_loss"](a, p, n))


# ---- dtype promotion and integer operands --------------------------------------------------------------------------


@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float64, torch.float16), (torch.int64, torch.int64,
                                                                                    torch.float16),
                                    (torch.int32, torch.int64, torch.int16), (torch.bfloat16, torch.float16,
                                                                              torch.bfloat16)], ids=str)
@pytest.mark.parametrize("swap", [False, True])
def test_triplet_promotion(dtypes, swap):
    torch.manual_seed(14)
    args = [(torch.randn(4, 6) * 3).to(d) for d in dtypes]
    ours = LF.triplet_margin_loss(*args, swap=swap, reduction="none")
    theirs = TF["triplet_margin_loss"](*args, swap=swap, reduction="none")
    assert ours.dtype == theirs.dtype
    # torch computes each distance in its pair's promoted dtype (16-bit where both are); lossfuse computes in the
    # result's dtype (float32 at least) on the exactly widened values: it is float32-close to the exact result and
    # never further from it than torch (slack: float32 rounding).
    exact = TF["triplet_margin_loss"](*[a.double() for a in args], swap=swap, reduction="none")
    assert_close(ours, exact, torch.float32, "loss")
    assert ((ours.double() - exact).abs() <= (theirs.double() - exact).abs() + 1e-6 * exact.abs()).all()


def test_cosine_and_soft_margin_promotion():
    torch.manual_seed(15)
    x32, x64 = torch.randn(5, 4), torch.randn(5, 4, dtype=torch.float64)
    y = torch.tensor([1, -1, 1, 0, -1])
    for a, b in [(x32, x64), (x64.half(), x32), (x32.long(), x32.long())]:
        ours = LF.cosine_embedding_loss(a, b, y, reduction="none")
        ref = TF["cosine_embedding_loss"](a, b, y, reduction="none")
        assert ours.dtype == ref.dtype
        assert_close(ours, ref, torch.float32, "cosine")
    t64 = torch.rand(5, 4, dtype=torch.float64)
    for args, kw in [((x32, t64), {}), ((x64, t64.float()), {}), ((x32, t64[0, 0]), {}),
                     ((x32, t64.float()), dict(weight=torch.rand(4, dtype=torch.float64))),
                     ((x32, t64.float()), dict(weight=torch.tensor(2.0, dtype=torch.float64))),
                     ((x32, torch.randint(0, 2, (5, 4))), {})]:
        ours = LF.multilabel_soft_margin_loss(*args, reduction="none", **kw)
        ref = TF["multilabel_soft_margin_loss"](*args, reduction="none", **kw)
        assert ours.dtype == ref.dtype, args
        assert_close(ours, ref, torch.float32, "multilabel_soft_margin")


def test_multi_margin_extensions_beyond_torch():
    """16-bit inputs and any integer target dtype: torch accepts float32/float64 inputs and int64 targets only.
    Checked against torch on the converted operands. The weight has the input's dtype, as torch requires."""
    torch.manual_seed(16)
    x = randn((6, 5), torch.bfloat16)
    t = class_targets((6,), 5, torch.int16)
    w = (torch.rand(5, dtype=torch.float64) + 0.5).bfloat16()
    ours = LF.multi_margin_loss(x, t, weight=w, reduction="none")
    assert ours.dtype == torch.bfloat16
    ref = TF["multi_margin_loss"](x.double(), t.long(), weight=w.double(), reduction="none")
    assert_close(ours, ref, torch.bfloat16, "loss")
    with pytest.raises(NotImplementedError):
        TF["multi_margin_loss"](x, t.long())


@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float64), (torch.float64, torch.float32),
                                    (torch.float32, torch.bfloat16), (torch.bfloat16, torch.float64)], ids=str)
def test_multi_margin_weight_of_another_dtype_raises(dtypes):
    """torch's rule: the weight has the input's dtype (under autocast, 16-bit ones count as float32)."""
    x_dtype, w_dtype = dtypes
    x, t, w = randn((4, 5), x_dtype), class_targets((4,), 5), torch.rand(5).to(w_dtype)
    if x_dtype != torch.bfloat16:
        with pytest.raises(RuntimeError, match="expected scalar type"):
            TF["multi_margin_loss"](x, t, weight=w)
    with pytest.raises(RuntimeError, match="weight: expected dtype"):
        LF.multi_margin_loss(x, t, weight=w)
    seen = [torch.float32 if d in (torch.float16, torch.bfloat16) else d for d in dtypes]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        if seen[0] != seen[1]:
            with pytest.raises(RuntimeError, match="expected scalar type"):
                TF["multi_margin_loss"](x, t, weight=w)
            with pytest.raises(RuntimeError, match="weight: expected dtype"):
                LF.multi_margin_loss(x, t, weight=w)
        else:  # 16-bit operands are cast to float32 first
            torch.testing.assert_close(LF.multi_margin_loss(x, t, weight=w), TF["multi_margin_loss"](x, t, weight=w))


# ---- layouts ------------------------------------------------------------------------------------------------------


def test_layouts_non_contiguous_and_expanded():
    torch.manual_seed(17)
    base = randn((12, 20), torch.float32)
    layouts = [base[::2, ::2], base.t()[:10, :6].t(), base[:1].expand(6, 20)[:, :10], base[1:7, 3:13]]
    t_class = class_targets((6,), 10)
    t_labels = label_lists(6, 10)
    for x in layouts:
        y = torch.flip(x, [0])
        check_against_torch("triplet_margin_loss", [x, y, x.roll(1, 1)], dict(swap=True), (0, 1, 2), torch.float32)
        check_against_torch("cosine_embedding_loss", [x, y, cosine_targets((6,))], {}, (0, 1), torch.float32)
        check_against_torch("multi_margin_loss", [x, t_class], dict(p=2), (0,), torch.float32)
        check_against_torch("multilabel_margin_loss", [x, t_labels], {}, (0,), torch.float32)
        check_against_torch("multilabel_soft_margin_loss", [x, torch.sigmoid(y)], {}, (0, 1), torch.float32)
        check_against_torch("multilabel_margin_loss", [x, t_labels.t().contiguous().t()], {}, (0,), torch.float32)
    # a strided class target and a stride-0 weight
    check_against_torch("multi_margin_loss", [layouts[0], class_targets((12,), 10)[::2]],
                        dict(weight=torch.rand(1).expand(10)), (0,), torch.float32)


# ---- 16-bit accuracy: never worse than torch's own -----------------------------------------------------------------


def _error(loss, exact):
    return (loss.double() - exact).abs().max().item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", ["triplet_margin_loss", "cosine_embedding_loss", "multilabel_soft_margin_loss"])
def test_16bit_error_not_above_torch(dtype, name):
    """torch computes these in the 16-bit dtype; lossfuse in float32 on the same values, rounded once at the end.
    Both results are rounded to the 16-bit output, so ours can lose to torch by a rounding tie at most: half an ulp
    of the output on top of torch's error (per element for reduction 'none')."""
    torch.manual_seed(18)
    N, D = 256, 200
    if name == "triplet_margin_loss":
        args = [randn((N, D), dtype, 2.0) for _ in range(3)]
        diff = (0, 1, 2)
    elif name == "cosine_embedding_loss":
        args = [randn((N, D), dtype), randn((N, D), dtype), cosine_targets((N,))]
        diff = (0, 1)
    else:
        args = [randn((N, D), dtype, 4.0), torch.rand(N, D).to(dtype)]
        diff = (0, 1)
    for reduction in REDUCTIONS:
        args64 = [a.detach().double().requires_grad_(i in diff) if a.is_floating_point() else a
                  for i, a in enumerate(args)]
        exact = TF[name](*args64, reduction=reduction)
        ours_in = [a.detach().requires_grad_(i in diff) if a.is_floating_point() else a for i, a in enumerate(args)]
        theirs_in = [a.detach().requires_grad_(i in diff) if a.is_floating_point() else a for i, a in enumerate(args)]
        ours = getattr(LF, name)(*ours_in, reduction=reduction)
        theirs = TF[name](*theirs_in, reduction=reduction)
        half_ulp = 0.5 * torch.finfo(dtype).eps * exact.detach().abs()
        assert ((ours.double() - exact).abs() <= (theirs.double() - exact).abs() + half_ulp).all(), reduction
        g = torch.ones_like(exact)
        exact_g = torch.autograd.grad(exact, [args64[i] for i in diff], g)
        ours_g = torch.autograd.grad(ours, [ours_in[i] for i in diff], g.to(dtype))
        theirs_g = torch.autograd.grad(theirs, [theirs_in[i] for i in diff], g.to(dtype))
        for e, o, t in zip(exact_g, ours_g, theirs_g):
            slack = 0.5 * torch.finfo(dtype).eps * e.abs().max()
            assert _error(o, e) <= _error(t, e) + slack, reduction
            assert (o.double() - e).norm() <= (t.double() - e).norm() * 1.01, reduction


# ---- errors: torch's exception types, messages naming the argument ---------------------------------------------


def _x():
    return torch.randn(5, 4)


BAD = [
    ("triplet_margin_loss", lambda: (_x(), _x(), _x()), dict(reduction="avg"), ValueError, "reduction"),
    ("triplet_margin_loss", lambda: (_x(), _x(), _x()), dict(margin=0.0), ValueError, "margin"),
    ("triplet_margin_loss", lambda: (_x(), _x(), _x()), dict(margin=-1), ValueError, "margin"),
    ("triplet_margin_loss", lambda: (_x()[0], _x(), _x()), {}, RuntimeError, "anchor"),
    ("triplet_margin_loss", lambda: (_x(), _x(), torch.randn(5, 3)), {}, RuntimeError, "size"),
    ("triplet_margin_loss", lambda: (_x() > 0, _x() > 0, _x() > 0), {}, NotImplementedError, "bool"),
    ("triplet_margin_loss", lambda: (torch.randn(3, 0), torch.randn(3, 0), torch.randn(3, 0)), dict(p=math.inf),
     RuntimeError, "p"),
    ("cosine_embedding_loss", lambda: (_x(), _x(), torch.ones(5, 1)), {}, RuntimeError, "target"),
    ("cosine_embedding_loss", lambda: (_x()[0], _x()[0], torch.ones(5)), {}, RuntimeError, "input1"),
    ("cosine_embedding_loss", lambda: (_x(), _x(), torch.ones(3)), {}, RuntimeError, "hape"),
    ("cosine_embedding_loss", lambda: (_x(), torch.randn(5, 3), torch.ones(5)), {}, RuntimeError, "hape"),
    ("cosine_embedding_loss", lambda: (_x(), _x(), torch.ones(5)), dict(reduction=None), ValueError, "reduction"),
    ("multi_margin_loss", lambda: (_x(), torch.zeros(5, dtype=torch.long)), dict(p=3), ValueError, "p"),
    ("multi_margin_loss", lambda: (_x(), torch.zeros(5, dtype=torch.long)), dict(weight=torch.ones(1, 4)),
     ValueError, "weight"),
    ("multi_margin_loss", lambda: (_x(), torch.zeros(5, dtype=torch.long)), dict(weight=torch.ones(5)),
     RuntimeError, "weight"),
    ("multi_margin_loss", lambda: (_x(), torch.zeros(5, dtype=torch.long)),
     dict(weight=torch.ones(4, requires_grad=True)), RuntimeError, "weight"),
    ("multi_margin_loss", lambda: (_x(), torch.zeros(4, dtype=torch.long)), {}, RuntimeError, "target"),
    ("multi_margin_loss", lambda: (_x(), torch.zeros(5, 1, dtype=torch.long)), {}, RuntimeError, "target"),
    ("multi_margin_loss", lambda: (_x(), torch.tensor([0, 1, 4, 2, 0])), {}, RuntimeError,
     r"target.*\[0, 4\).*got 4 at position \[2\]"),
    ("multi_margin_loss", lambda: (_x(), torch.tensor([0, 1, -1, 2, 0])), {}, RuntimeError, "target"),
    ("multi_margin_loss", lambda: (_x(), torch.zeros(5)), {}, RuntimeError, "target"),
    ("multi_margin_loss", lambda: (torch.randn(5, 0), torch.zeros(5, dtype=torch.long)), {}, RuntimeError, "input"),
    ("multi_margin_loss", lambda: (torch.randn(2, 5, 4), torch.zeros(2, dtype=torch.long)), {}, RuntimeError,
     "input"),
    ("multi_margin_loss", lambda: (_x().long(), torch.zeros(5, dtype=torch.long)), {}, NotImplementedError,
     "input"),
    ("multilabel_margin_loss", lambda: (_x(), torch.zeros(4, dtype=torch.long)), {}, RuntimeError, "target"),
    ("multilabel_margin_loss", lambda: (_x(), torch.zeros(5, 4)), {}, RuntimeError, "target"),
    ("multilabel_margin_loss", lambda: (_x(), torch.tensor([[0, 1, -1, 4]] * 5)), {}, RuntimeError,
     r"target.*got 4 at position \[0, 3\]"),
    ("multilabel_margin_loss", lambda: (_x(), torch.tensor([[0, -2, -1, 3]] * 5)), {}, RuntimeError, "target"),
    ("multilabel_margin_loss", lambda: (torch.randn(0), torch.zeros(0, dtype=torch.long)), {}, RuntimeError,
     "input"),
    ("multilabel_margin_loss", lambda: (_x(), torch.zeros(5, 4, dtype=torch.long)), dict(reduction="avg"),
     ValueError, "reduction"),
    ("multilabel_soft_margin_loss", lambda: (torch.randn(()), torch.rand(())), {}, IndexError, "input"),
    ("multilabel_soft_margin_loss", lambda: (_x(), _x() > 0), {}, NotImplementedError, "target"),
    ("multilabel_soft_margin_loss", lambda: (_x().long(), _x()), {}, NotImplementedError, "input"),
    ("multilabel_soft_margin_loss", lambda: (_x(), torch.rand(5, 3)), {}, RuntimeError, "hape"),
    ("multilabel_soft_margin_loss", lambda: (_x(), _x()), dict(weight=torch.ones(3)), RuntimeError, "hape"),
]


@pytest.mark.parametrize("name,make,kwargs,error,match", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input_raises_like_torch(name, make, kwargs, error, match):
    with pytest.raises(error, match=match):
        getattr(LF, name)(*make(), **kwargs)
    # torch's own exception type for the same input (torch 2.11 raised RuntimeError where later torch raises
    # NotImplementedError, a RuntimeError, for bool operands)
    with pytest.raises(RuntimeError if error is NotImplementedError and TORCH_VERSION < (2, 15) else error):
        TF[name](*make(), **kwargs)


def test_target_range_is_checked_before_anything_is_written():
    x = torch.randn(3, 4, requires_grad=True)
    with pytest.raises(RuntimeError, match="target"):
        LF.multilabel_margin_loss(x, torch.tensor([[0, -1, 9, 1], [0, 1, 2, 3], [1, 1, 1, 1]]))  # after the -1


# ---- autograd machinery ------------------------------------------------------------------------------------------


def _f64(shape, scale=1.0):
    return (torch.randn(shape, dtype=torch.float64) * scale).requires_grad_()


GRADCHECK = [
    ("triplet", lambda: ((_f64((4, 5)), _f64((4, 5)), _f64((1, 5))),
                         lambda a, p, n, r: LF.triplet_margin_loss(a, p, n, margin=2.0, swap=True, reduction=r))),
    ("triplet_p1", lambda: ((_f64((3, 6)), _f64((3, 6)), _f64((3, 6))),
                            lambda a, p, n, r: LF.triplet_margin_loss(a, p, n, margin=3.0, p=1, reduction=r))),
    ("triplet_p3", lambda: ((_f64((3, 6)), _f64((3, 6)), _f64((3, 6))),
                            lambda a, p, n, r: LF.triplet_margin_loss(a, p, n, margin=3.0, p=3, reduction=r))),
    ("cosine", lambda: ((_f64((5, 4)), _f64((1, 4))),
                        lambda a, b, r: LF.cosine_embedding_loss(a, b, torch.tensor([1, -1, 1, -1, 0]),
                                                                 margin=-0.9, reduction=r))),
    ("multi_margin_p1", lambda w=torch.rand(6, dtype=torch.float64): (
        (_f64((4, 6), 3.0),),
        lambda x, r: LF.multi_margin_loss(x, torch.tensor([0, 5, 2, 2]), margin=2.0, weight=w, reduction=r))),
    ("multi_margin_p2", lambda: ((_f64((4, 6), 3.0),),
                                 lambda x, r: LF.multi_margin_loss(x, torch.tensor([0, 5, 2, 2]), p=2, margin=2.0,
                                                                   reduction=r))),
    ("multilabel_margin", lambda: ((_f64((3, 5), 3.0),),
                                   lambda x, r: LF.multilabel_margin_loss(
                                       x, torch.tensor([[0, 3, -1, 0, 0], [1, 1, 4, -1, 2], [4, 3, 2, 1, 0]]),
                                       reduction=r))),
    ("multilabel_soft_margin", lambda w=torch.rand(5, dtype=torch.float64): (
        (_f64((3, 5), 3.0), torch.rand(1, 5, dtype=torch.float64).requires_grad_()),
        lambda x, t, r: LF.multilabel_soft_margin_loss(x, t, weight=w, reduction=r))),
]


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("case", GRADCHECK, ids=[c[0] for c in GRADCHECK])
def test_gradcheck_and_gradgradcheck(case, reduction):
    """Every differentiable input; double backward too (lossfuse supports it for all five, torch for triplet,
    cosine and multilabel_soft_margin)."""
    torch.manual_seed(19)
    inputs, fn = case[1]()
    f = lambda *xs: fn(*xs, reduction)  # noqa: E731
    assert torch.autograd.gradcheck(f, inputs)
    assert torch.autograd.gradgradcheck(f, inputs)


@pytest.mark.parametrize("name", ["triplet_margin_loss", "cosine_embedding_loss", "multilabel_soft_margin_loss"])
def test_double_backward_matches_torch(name):
    torch.manual_seed(20)
    if name == "triplet_margin_loss":
        args, diff = [_f64((4, 5)), _f64((4, 5)), _f64((4, 5))], 3
    elif name == "cosine_embedding_loss":
        args, diff = [_f64((4, 5)), _f64((4, 5)), torch.tensor([1, -1, 1, -1])], 2
    else:
        args, diff = [_f64((4, 5)), torch.rand(4, 5, dtype=torch.float64).requires_grad_()], 2
    results = []
    for fn in (getattr(LF, name), TF[name]):
        leaves = [a.detach().clone().requires_grad_(i < diff) for i, a in enumerate(args)]
        loss = fn(*leaves, margin=-0.5) if name == "cosine_embedding_loss" else fn(*leaves)
        grads = torch.autograd.grad(loss, leaves[:diff], create_graph=True)
        v = [torch.ones_like(g) for g in grads]
        hvp = torch.autograd.grad(grads, leaves[:diff], v, allow_unused=True)
        results.append([torch.zeros_like(leaves[i]) if h is None else h for i, h in enumerate(hvp)])
    for o, r in zip(*results):
        assert_close(o, r, torch.float64, "hessian-vector product")


def test_opcheck():
    torch.manual_seed(21)
    ops = torch.ops.lossfuse
    x = torch.randn(4, 6, requires_grad=True)
    y, z = torch.randn(4, 6, requires_grad=True), torch.randn(4, 6, requires_grad=True)
    t_class = class_targets((4,), 6)
    t_labels = label_lists(4, 6)
    t_cos = torch.tensor([1, -1, 0, 1])
    soft = torch.rand(4, 6, requires_grad=True)
    w = torch.rand(6) + 0.5
    for red in (0, 2):  # per-row and reduced losses ('mean' differs from 'sum' in the kernels' scale only)
        g = torch.rand(4) if red == 0 else torch.rand(())
        torch.library.opcheck(ops.triplet_margin_loss.default, (x, y, z, 1.0, 2.0, 1e-6, red == 2, red))
        torch.library.opcheck(ops.triplet_margin_loss_backward.default,
                              (g, x.detach(), y.detach(), z.detach(), 1.0, 2.0, 1e-6, True, red, [True, False, True]))
        torch.library.opcheck(ops.cosine_embedding_loss.default, (x, y, t_cos, 0.1, red))
        torch.library.opcheck(ops.cosine_embedding_loss_backward.default,
                              (g, x.detach(), y.detach(), t_cos, 0.1, red, [False, True]))
        torch.library.opcheck(ops.multi_margin_loss.default, (x, t_class, w if red else None, 1 + (red == 2), 1.0, red))
        torch.library.opcheck(ops.multi_margin_loss_backward.default, (g, x.detach(), t_class, w, 2, 0.5, red))
        torch.library.opcheck(ops.multilabel_margin_loss.default, (x, t_labels, red))
        torch.library.opcheck(ops.multilabel_margin_loss_backward.default, (g, x.detach(), t_labels, red))
        torch.library.opcheck(ops.multilabel_soft_margin_loss.default, (x, soft, w if red else None, red))
        torch.library.opcheck(ops.multilabel_soft_margin_loss_backward.default,
                              (g, x.detach(), soft.detach(), w, red, [True, red == 0]))


def test_torch_compile_fullgraph():
    torch.manual_seed(22)

    def losses(fns, a, p, n, x, t_class, t_labels, soft, y):
        return (fns["triplet_margin_loss"](a, p, n, swap=True) + fns["cosine_embedding_loss"](a, p, y, margin=0.1)
                + fns["multi_margin_loss"](x, t_class, p=2) + fns["multilabel_margin_loss"](x, t_labels)
                + fns["multilabel_soft_margin_loss"](x, soft, reduction="sum"))

    leaves = [torch.randn(6, 8, requires_grad=True) for _ in range(4)] + [torch.rand(6, 8, requires_grad=True)]
    a, p, n, x, soft = leaves
    t_class, t_labels, y = class_targets((6,), 8), label_lists(6, 8), cosine_targets((6,))
    ours_fns = {name: getattr(LF, name) for name in NAMES}
    compiled = torch.compile(losses, fullgraph=True, backend="aot_eager")
    ours = compiled(ours_fns, a, p, n, x, t_class, t_labels, soft, y)
    ours_grads = torch.autograd.grad(ours, leaves)
    ref = losses(TF, a, p, n, x, t_class, t_labels, soft, y)
    ref_grads = torch.autograd.grad(ref, leaves)
    torch.testing.assert_close(ours, ref)
    for o, r in zip(ours_grads, ref_grads):
        torch.testing.assert_close(o, r)


# ---- modules --------------------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:size_average and reduce args will be deprecated")
@pytest.mark.parametrize("name,kwargs,make", [
    ("TripletMarginLoss", dict(margin=0.5, p=1.0, eps=1e-3, swap=True, reduction="sum"),
     lambda: [torch.randn(4, 5) for _ in range(3)]),
    ("CosineEmbeddingLoss", dict(margin=0.2, reduction="none"),
     lambda: [torch.randn(4, 5), torch.randn(4, 5), torch.tensor([1, -1, 1, -1])]),
    ("MultiMarginLoss", dict(p=2, margin=0.7, weight=torch.rand(5) + 0.5),
     lambda: [torch.randn(4, 5), torch.tensor([0, 4, 3, 3])]),
    ("MultiLabelMarginLoss", dict(reduction="sum"), lambda: [torch.randn(4, 5), label_lists(4, 5)]),
    ("MultiLabelSoftMarginLoss", dict(weight=torch.rand(5) + 0.5, reduction="none"),
     lambda: [torch.randn(4, 5), torch.rand(4, 5)]),
    ("MultiLabelSoftMarginLoss", dict(size_average=False), lambda: [torch.randn(4, 5), torch.rand(4, 5)]),
])
def test_modules(name, kwargs, make):
    torch.manual_seed(23)
    ours_module, torch_module = getattr(LN, name)(**kwargs), getattr(torch.nn, name)(**kwargs)
    assert isinstance(ours_module, getattr(torch.nn, name))
    assert ours_module.state_dict().keys() == torch_module.state_dict().keys()
    args = make()
    x = args[0].requires_grad_()
    ours = ours_module(*args)
    gx = torch.autograd.grad(ours.sum(), x)[0]
    ref = torch_module(*args)
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(gx, torch.autograd.grad(ref.sum(), x)[0])


@pytest.mark.filterwarnings("ignore:size_average and reduce args will be deprecated")
@pytest.mark.parametrize("name", NAMES)
def test_legacy_size_average_and_reduce(name):
    torch.manual_seed(24)
    x = torch.randn(4, 5)
    others = {"triplet_margin_loss": [torch.randn(4, 5), torch.randn(4, 5)],
              "cosine_embedding_loss": [torch.randn(4, 5), torch.tensor([1, -1, 1, 0])],
              "multi_margin_loss": [torch.tensor([0, 1, 2, 3])], "multilabel_margin_loss": [label_lists(4, 5)],
              "multilabel_soft_margin_loss": [torch.rand(4, 5)]}[name]
    for size_average, reduce in [(None, False), (False, None), (True, True), (False, True)]:
        ours = getattr(LF, name)(x, *others, size_average=size_average, reduce=reduce)
        ref = TF[name](x, *others, size_average=size_average, reduce=reduce)
        torch.testing.assert_close(ours, ref)


def test_signatures_are_torch():
    import inspect
    for name in NAMES:
        assert inspect.signature(getattr(LF, name)) == inspect.signature(TF[name]).replace(
            return_annotation=inspect.Signature.empty, parameters=[
                p.replace(annotation=inspect.Parameter.empty) for p in inspect.signature(TF[name]).parameters.values()
            ]), name
