"""lossfuse.nn.functional.ctc_loss / lossfuse.nn.CTCLoss against torch: values, gradients, options, target and
length forms, dtypes, layouts, edge cases, errors, gradcheck, double backward, opcheck, torch.compile."""

import inspect
import math
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
INT_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
LAYOUTS = ["padded", "concatenated", "unbatched"]
# Tolerances against torch computing in float64 on the same (already rounded) inputs. ROUND: the rounding of the
# result (and of the upstream gradient) to the output dtype. ACC: float32 accumulation; the CTC recursions sum
# logs over T steps and the gradient subtracts terms of the size of the sample's loss, so the absolute error grows
# with that loss (torch's own float32 kernel has the same error: see test_float32_error_not_above_torch).
ROUND = {torch.float64: 1e-13, torch.float32: 2e-7, torch.bfloat16: 8e-3, torch.float16: 1e-3}
ACC = {torch.float64: 1e-10, torch.float32: 4e-6, torch.bfloat16: 4e-6, torch.float16: 4e-6}


def finite_max(t):
    t = t.detach().double().abs()
    t = t[torch.isfinite(t)]
    return t.max().item() if t.numel() else 0.0


def assert_close(ours, ref, atol, rtol, what):
    ours, ref = ours.detach().double(), ref.detach().double()
    assert ours.shape == ref.shape, f"{what}: shape {tuple(ours.shape)} != {tuple(ref.shape)}"
    torch.testing.assert_close(ours, ref, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{what}: {m}")


def make_case(T, N, C, S, dtype, layout="padded", blank=0, scale=3.0, target_dtype=torch.int64,
              length_dtype=torch.int64, full_lengths=False, generator=None):
    """Random log-probabilities, labels (never blank) and lengths; some input lengths may be too short to align
    (an impossible sample) unless full_lengths."""
    g = generator
    n = 1 if layout == "unbatched" else N
    lp = (torch.randn(T, n, C, dtype=torch.float64, generator=g) * scale).log_softmax(2).to(dtype)
    labels = torch.randint(0, C - 1, (n, S), generator=g)
    labels += (labels >= blank).long()  # skip the blank
    tl = torch.randint(0, S + 1, (n,), generator=g) if not full_lengths else torch.full((n,), S)
    il = torch.randint(0, T + 1, (n,), generator=g) if not full_lengths else torch.full((n,), T)
    if layout == "unbatched":  # torch reads unbatched targets as concatenated: exactly tl labels
        return lp[:, 0], labels[0, :tl[0]].to(target_dtype), il[0].to(length_dtype), tl[0].to(length_dtype)
    targets = concatenate(labels, tl) if layout == "concatenated" else labels
    return lp, targets.to(target_dtype), il.to(length_dtype), tl.to(length_dtype)


def concatenate(padded, tl):
    """Padded (N, S) targets as torch's concatenated form: each sample's first tl_b labels, one after another."""
    return torch.cat([padded[b, :tl[b]] for b in range(len(tl))] + [padded.new_empty(0)])


def as_long(t):
    return t.long() if torch.is_tensor(t) else t


def torch_targets(t):
    # torch's CPU kernel misreads non-contiguous concatenated (1-D) targets: it steps a sample's start by the
    # label count, not by count * stride (torch 2.15: targets[::2] gives other losses than targets[::2].clone()).
    # The reference gets a contiguous copy; lossfuse reads every layout as given.
    return t.long().contiguous()


def check_against_torch(lp, targets, il, tl, dtype, upstream_seed=0, **kwargs):
    """Ours on the inputs as given, torch in float64 (on int64 targets and lengths); loss and gradient."""
    x = lp.detach().requires_grad_()
    ours = LF.ctc_loss(x, targets, il, tl, **kwargs)
    x64 = lp.detach().double().requires_grad_()
    ref = F.ctc_loss(x64, torch_targets(targets), as_long(il), as_long(tl), **kwargs)
    per_sample = F.ctc_loss(x64.detach(), torch_targets(targets), as_long(il), as_long(tl),
                            blank=kwargs.get("blank", 0), reduction="none")
    loss_scale = max(1.0, finite_max(per_sample))
    assert ours.dtype == lp.dtype
    assert_close(ours, ref, (ROUND[dtype] + ACC[dtype]) * loss_scale, ROUND[dtype] + ACC[dtype], "loss")
    gen = torch.Generator().manual_seed(upstream_seed)
    g = torch.randn(ref.shape, dtype=torch.float64, generator=gen) if ref.dim() else torch.tensor(1.7).double()
    g = g.to(dtype).double()  # the upstream gradient as ours sees it
    (ours_g,) = torch.autograd.grad(ours, x, g.to(ours.dtype))
    (ref_g,) = torch.autograd.grad(ref, x64, g)
    assert ours_g.dtype == lp.dtype
    g_scale = max(1.0, g.abs().max().item() if g.numel() else 0.0)
    atol = ROUND[dtype] * max(1.0, finite_max(ref_g)) + ACC[dtype] * loss_scale * g_scale
    assert_close(ours_g, ref_g, atol, ROUND[dtype], "grad of log_probs")
    return ours, ref


# ---- values and gradients against torch ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("zero_infinity", [False, True])
@pytest.mark.parametrize("blank", [0, 6])
def test_ctc_matches_torch(dtype, reduction, layout, zero_infinity, blank):
    # A seed per case that is the same in every run (hash() of strings is not).
    gen = torch.Generator().manual_seed(zlib.crc32(repr((dtype, reduction, layout, zero_infinity, blank)).encode()))
    lp, targets, il, tl = make_case(12, 5, 7, 4, dtype, "padded" if layout == "concatenated" else layout,
                                    blank=blank, generator=gen)
    if layout != "unbatched":
        # An impossible sample: inf (or 0 with zero_infinity), nan gradient (or 0).
        targets[0], il[0], tl[0] = torch.tensor([1, 2, 3, 1]), 2, 4
        if layout == "concatenated":
            targets = concatenate(targets, tl)
    check_against_torch(lp, targets, il, tl, dtype, blank=blank, reduction=reduction, zero_infinity=zero_infinity)


@settings(max_examples=40, deadline=None)
@given(T=st.integers(1, 40), N=st.integers(1, 5), C=st.integers(2, 12), S=st.integers(0, 10),
       dtype=st.sampled_from(DTYPES), reduction=st.sampled_from(REDUCTIONS), layout=st.sampled_from(LAYOUTS),
       zero_infinity=st.booleans(), blank_at_end=st.booleans(), scale=st.sampled_from([0.1, 3.0, 20.0]),
       target_dtype=st.sampled_from(INT_DTYPES), length_dtype=st.sampled_from(INT_DTYPES),
       full_lengths=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_ctc_random(T, N, C, S, dtype, reduction, layout, zero_infinity, blank_at_end, scale, target_dtype,
                    length_dtype, full_lengths, seed):
    blank = C - 1 if blank_at_end else 0
    gen = torch.Generator().manual_seed(seed)
    lp, targets, il, tl = make_case(T, N, C, S, dtype, layout, blank, scale, target_dtype, length_dtype,
                                    full_lengths, gen)
    check_against_torch(lp, targets, il, tl, dtype, seed, blank=blank, reduction=reduction,
                        zero_infinity=zero_infinity)


@pytest.mark.parametrize("target_dtype", INT_DTYPES, ids=str)
@pytest.mark.parametrize("length_dtype", INT_DTYPES, ids=str)
def test_any_integer_dtype_for_targets_and_lengths(target_dtype, length_dtype):
    gen = torch.Generator().manual_seed(1)
    lp, targets, il, tl = make_case(9, 4, 6, 3, torch.float64, "padded", target_dtype=target_dtype,
                                    length_dtype=length_dtype, generator=gen)
    check_against_torch(lp, targets, il, tl, torch.float64)
    lp, targets, il, tl = make_case(9, 4, 6, 3, torch.float64, "concatenated", target_dtype=target_dtype,
                                    length_dtype=length_dtype, generator=gen)
    check_against_torch(lp, targets, il, tl, torch.float64, reduction="none")


def test_floating_targets_are_truncated_like_torch():
    gen = torch.Generator().manual_seed(2)
    lp, targets, il, tl = make_case(9, 3, 6, 3, torch.float64, "padded", full_lengths=True, generator=gen)
    ftargets = targets.double() + 0.25
    assert_close(LF.ctc_loss(lp, ftargets, il, tl), F.ctc_loss(lp, ftargets, il, tl), 1e-12, 1e-12, "loss")


@pytest.mark.parametrize("form", ["tuple", "list", "size", "0-d tensors", "2-D tensors"])
def test_lengths_as_sequences_and_any_shape(form):
    gen = torch.Generator().manual_seed(3)
    lp, targets, il, tl = make_case(10, 4, 5, 3, torch.float64, "concatenated", generator=gen)
    convert = {"tuple": lambda t: tuple(t.tolist()), "list": lambda t: t.tolist(), "size": lambda t: torch.Size(t),
               "0-d tensors": lambda t: [v for v in t], "2-D tensors": lambda t: t.view(2, 2)}[form]
    for reduction in REDUCTIONS:
        x = lp.detach().requires_grad_()
        ours = LF.ctc_loss(x, targets, convert(il), convert(tl), reduction=reduction)
        ref = F.ctc_loss(x, targets, convert(il), convert(tl), reduction=reduction)
        assert_close(ours, ref, 1e-12, 1e-12, "loss")
        g = torch.ones_like(ref)
        assert_close(torch.autograd.grad(ours, x, g)[0], torch.autograd.grad(ref, x, g)[0], 1e-12, 1e-12, "grad")


@pytest.mark.parametrize("lengths", ["0-d", "(1)", "tuple"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_unbatched_length_forms(lengths, reduction):
    gen = torch.Generator().manual_seed(4)
    lp, targets, il, tl = make_case(8, 1, 5, 3, torch.float64, "unbatched", full_lengths=True, generator=gen)
    il, tl = {"0-d": (il, tl), "(1)": (il.view(1), tl.view(1)), "tuple": ((int(il),), (int(tl),))}[lengths]
    ours, ref = check_against_torch(lp, targets, il, tl, torch.float64, reduction=reduction)
    assert ours.shape == ref.shape == ()


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_unbatched_padded_targets(reduction):
    # Deviation (a superset): torch requires exactly target_length unbatched labels (it reads them as concatenated,
    # else "Expected tensor to have size 2 at dimension 0, but got size 4 for argument #2 'targets'"); lossfuse
    # also accepts padded ones, (S) with target_length <= S, as for batched targets, and ignores the padding.
    lp = torch.randn(9, 5, dtype=torch.float64).log_softmax(1).requires_grad_()
    padded, il, tl = torch.tensor([3, 1, 4, 4]), torch.tensor(9), torch.tensor(2)
    with pytest.raises(RuntimeError):
        F.ctc_loss(lp, padded, il, tl, reduction=reduction)
    ours = LF.ctc_loss(lp, padded, il, tl, reduction=reduction)
    ref = F.ctc_loss(lp, padded[:2], il, tl, reduction=reduction)
    assert_close(ours, ref, 1e-12, 1e-12, "loss")
    assert_close(torch.autograd.grad(ours, lp)[0], torch.autograd.grad(ref, lp)[0], 1e-12, 1e-12, "grad")


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_unbatched_targets_of_one_padded_row(reduction):
    # torch unsqueezes only unbatched log_probs, so its one sample's targets may also be padded (1, S)
    lp = torch.randn(9, 5, dtype=torch.float64).log_softmax(1).requires_grad_()
    for padded, tl in [(torch.tensor([[3, 1, 4]]), 3), (torch.tensor([[3, 1, 4, 4]], dtype=torch.int16), 2)]:
        ours = LF.ctc_loss(lp, padded, torch.tensor(9), torch.tensor(tl), reduction=reduction)
        ref = F.ctc_loss(lp, padded, torch.tensor(9), torch.tensor(tl), reduction=reduction)
        assert ours.shape == ref.shape == ()
        assert_close(ours, ref, 1e-12, 1e-12, "loss")
        assert_close(torch.autograd.grad(ours, lp)[0], torch.autograd.grad(ref, lp)[0], 1e-12, 1e-12, "grad")
    with pytest.raises(IndexError, match=r"got 7 at position \[0, 1\]"):
        LF.ctc_loss(lp, torch.tensor([[3, 7, 4]]), torch.tensor(9), torch.tensor(3), reduction=reduction)
    with pytest.raises(RuntimeError):
        F.ctc_loss(lp, torch.tensor([[3, 1], [4, 1]]), torch.tensor(9), torch.tensor(2), reduction=reduction)
    with pytest.raises(RuntimeError, match=r"targets: expected \(S\) or \(1, S\) for unbatched"):
        LF.ctc_loss(lp, torch.tensor([[3, 1], [4, 1]]), torch.tensor(9), torch.tensor(2), reduction=reduction)


def test_integer_log_probs_raise_not_implemented():
    lp, targets = torch.zeros(8, 2, 5, dtype=torch.long), torch.tensor([[1, 2], [1, 2]])
    with pytest.raises(NotImplementedError):
        F.ctc_loss(lp, targets, [8, 8], [2, 2])
    with pytest.raises(NotImplementedError, match="ctc_loss: log_probs: expected a floating dtype"):
        LF.ctc_loss(lp, targets, [8, 8], [2, 2])


def test_signatures_are_torchs():
    assert inspect.signature(LF.ctc_loss) == inspect.signature(F.ctc_loss)
    assert inspect.signature(lossfuse.nn.CTCLoss) == inspect.signature(torch.nn.CTCLoss)
    assert inspect.signature(lossfuse.nn.CTCLoss.forward) == inspect.signature(torch.nn.CTCLoss.forward)


def test_module_matches_torch_module():
    gen = torch.Generator().manual_seed(5)
    lp, targets, il, tl = make_case(10, 4, 6, 3, torch.float32, "padded", generator=gen)
    targets = targets.clamp_max(4)  # neither 0 nor 5: valid for both blanks used below
    for kwargs in [{}, dict(blank=5, reduction="sum", zero_infinity=True), dict(blank=5, reduction="none")]:
        ours_m, torch_m = lossfuse.nn.CTCLoss(**kwargs), torch.nn.CTCLoss(**kwargs)
        assert isinstance(ours_m, torch.nn.CTCLoss)
        x = lp.detach().requires_grad_()
        ours = ours_m(x, targets, il, tl)
        ref = torch_m(x, targets, il, tl)
        assert_close(ours, ref, 1e-4, 1e-5, "loss")
        g = torch.ones_like(ref)
        assert_close(torch.autograd.grad(ours, x, g)[0], torch.autograd.grad(ref, x, g)[0], 1e-4, 1e-5, "grad")


# ---- layouts ----------------------------------------------------------------------------------------------------


def test_non_contiguous_and_expanded_inputs():
    gen = torch.Generator().manual_seed(6)
    lp, targets, il, tl = make_case(14, 6, 9, 5, torch.float32, "padded", generator=gen)
    # log_probs: strided slices, the class dim not innermost, a sample broadcast over the batch (stride 0).
    variants = [lp[::2, ::2], lp.permute(2, 0, 1).contiguous().permute(1, 2, 0), lp[:, :1].expand(14, 6, 9)]
    for x in variants:
        n = x.shape[1]
        check_against_torch(x, targets[:n], il[:n].clamp_max(x.shape[0]), tl[:n], torch.float32, reduction="none")
    # targets and lengths with strides: a transposed padded block, every other entry, an expanded length.
    t_strided = targets.t().contiguous().t()
    il_strided = torch.stack([il, il], 1)[:, 0]
    tl_expanded = tl[:1].expand(6)
    check_against_torch(lp, t_strided, il_strided, tl_expanded, torch.float32, reduction="sum")
    cat = torch.stack([make_case(14, 6, 9, 5, torch.float32, generator=gen)[1].flatten()] * 2, 1)[:, 1]
    tl_cat = torch.tensor([5, 5, 5, 5, 5, 5])
    check_against_torch(lp, cat[:30], il, tl_cat, torch.float32)


# ---- edge cases (docs/semantics.md, CTC) -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_mean_divides_by_target_length_at_least_one(dtype):
    gen = torch.Generator().manual_seed(7)
    lp, targets, il, tl = make_case(10, 4, 6, 3, dtype, "padded", full_lengths=True, generator=gen)
    tl = torch.tensor([0, 1, 3, 0])
    ours, ref = check_against_torch(lp, targets, il, tl, dtype, reduction="mean")
    per = F.ctc_loss(lp.double(), targets, il, tl, reduction="none")
    assert_close(ours, (per / tl.clamp_min(1)).mean(), 1e-5, 1e-5, "mean by hand")


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("zero_infinity", [False, True])
def test_impossible_alignment(reduction, zero_infinity):
    lp = torch.randn(3, 2, 4, dtype=torch.float64).log_softmax(2)
    targets = torch.tensor([[1, 1, 2], [1, 2, 3]])  # sample 0 needs 4 frames (a blank between the repeats)
    il, tl = torch.tensor([3, 3]), torch.tensor([3, 3])
    ours, _ = check_against_torch(lp, targets, il, tl, torch.float64, reduction=reduction,
                                  zero_infinity=zero_infinity)
    per = LF.ctc_loss(lp, targets, il, tl, reduction="none", zero_infinity=zero_infinity)
    assert per[0].item() == (0.0 if zero_infinity else math.inf)


def test_minus_inf_log_probs_like_torch():
    gen = torch.Generator().manual_seed(8)
    lp, targets, il, tl = make_case(8, 3, 5, 2, torch.float64, "padded", full_lengths=True, generator=gen)
    lp[2, 0, 1:] = -math.inf
    lp[2, 0, 0] = 0.0  # only blank possible at t = 2 for sample 0
    lp[4, 1, 3] = -math.inf
    for reduction in REDUCTIONS:
        for zero_infinity in (False, True):
            check_against_torch(lp, targets, il, tl, torch.float64, reduction=reduction, zero_infinity=zero_infinity)


def test_zero_length_inputs_and_targets():
    lp = torch.randn(5, 3, 4, dtype=torch.float64).log_softmax(2)
    targets = torch.tensor([[1, 2], [3, 3], [2, 1]])
    for il, tl in [([0, 5, 5], [0, 2, 0]), ([0, 0, 0], [0, 0, 0]), ([5, 5, 0], [0, 0, 1])]:
        for reduction in REDUCTIONS:
            check_against_torch(lp, targets, torch.tensor(il), torch.tensor(tl), torch.float64, reduction=reduction)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_empty_batch_and_no_frames(reduction):
    # Deviation: torch raises "log_probs tensor must not be empty"; lossfuse follows torch's reductions of nothing
    # (mean nan, sum 0, none an empty tensor) and, for T = 0, the losses torch gives with one frame left unread.
    lp = torch.empty(7, 0, 5, requires_grad=True)
    e = torch.empty(0, dtype=torch.long)
    loss = LF.ctc_loss(lp, torch.empty(0, 3, dtype=torch.long), e, e, reduction=reduction)
    expected = {"none": torch.empty(0), "mean": torch.empty(0).mean(), "sum": torch.empty(0).sum()}[reduction]
    assert_close(loss, expected, 0, 0, "empty batch")
    assert torch.autograd.grad(loss.sum(), lp)[0].shape == lp.shape
    lp0 = torch.empty(0, 2, 5, dtype=torch.float64, requires_grad=True)
    loss = LF.ctc_loss(lp0, e, (0, 0), (0, 0), reduction=reduction)
    lp1 = torch.randn(1, 2, 5, dtype=torch.float64).log_softmax(2)
    assert_close(loss, F.ctc_loss(lp1, e, (0, 0), (0, 0), reduction=reduction), 0, 0, "no frames")
    assert torch.autograd.grad(loss.sum(), lp0)[0].shape == lp0.shape


def test_results_identical_for_any_thread_count():
    gen = torch.Generator().manual_seed(9)
    lp, targets, il, tl = make_case(50, 16, 20, 12, torch.float32, "padded", generator=gen)
    x = lp.requires_grad_()
    before = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            loss = LF.ctc_loss(x, targets, il, tl)
            results.append((loss.detach(), torch.autograd.grad(loss, x)[0]))
    finally:
        torch.set_num_threads(before)
    for loss, grad in results[1:]:  # bit-identical (an impossible sample's nan gradient included)
        torch.testing.assert_close(loss, results[0][0], rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(grad, results[0][1], rtol=0, atol=0, equal_nan=True)


# ---- 16-bit and float32 accuracy: never worse than torch's -------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_16bit_error_not_above_torch(dtype, reduction):
    # torch's CPU ctc_loss has no 16-bit kernel ("not implemented for 'Half'"), so the torch user's way is the
    # baseline: compute in float32, round the loss (and the gradient) to the 16-bit dtype.
    gen = torch.Generator().manual_seed(10)
    lp, targets, il, tl = make_case(60, 8, 30, 15, dtype, "padded", full_lengths=True, generator=gen)
    x64 = lp.double().requires_grad_()
    exact = F.ctc_loss(x64, targets, il, tl, reduction=reduction)
    exact_grad = torch.autograd.grad(exact, x64)[0]
    x = lp.detach().requires_grad_()
    ours = LF.ctc_loss(x, targets, il, tl, reduction=reduction)
    ours_grad = torch.autograd.grad(ours, x)[0].double()
    x32 = lp.float().requires_grad_()
    theirs32 = F.ctc_loss(x32, targets, il, tl, reduction=reduction)
    theirs = theirs32.to(dtype)
    theirs_grad = torch.autograd.grad(theirs32, x32)[0].to(dtype).double()
    # Both are one rounding of a float32 result to 16 bits; the float32 values differ in their last bits, so a
    # rounding tie may go the other way: allow half an ulp of the output on top of the baseline's error.
    half_ulp = 0.5 * torch.finfo(dtype).eps
    assert abs(ours.double() - exact).item() <= abs(theirs.double() - exact).item() + half_ulp * abs(exact.item())
    assert (ours_grad - exact_grad).abs().max() <= (theirs_grad - exact_grad).abs().max() + \
        half_ulp * exact_grad.abs().max()
    assert (ours_grad - exact_grad).norm() <= (theirs_grad - exact_grad).norm() * 1.01


def test_float32_error_not_above_torch():
    gen = torch.Generator().manual_seed(11)
    lp, targets, il, tl = make_case(150, 6, 20, 40, torch.float32, "padded", full_lengths=True, generator=gen)
    x64 = lp.double().requires_grad_()
    exact = F.ctc_loss(x64, targets, il, tl, reduction="none")
    exact_grad = torch.autograd.grad(exact.sum(), x64)[0]
    errors = []
    for fn in (LF.ctc_loss, F.ctc_loss):
        x = lp.detach().requires_grad_()
        loss = fn(x, targets, il, tl, reduction="none")
        grad = torch.autograd.grad(loss.sum(), x)[0].double()
        errors.append(((loss.double() - exact).abs().max().item(), (grad - exact_grad).norm().item()))
    (ours_loss, ours_grad), (theirs_loss, theirs_grad) = errors
    # Both accumulate in float32 in a different order: a 25% margin on torch's error (a few ulps of the loss).
    assert ours_loss <= theirs_loss * 1.25 + 4 * torch.finfo(torch.float32).eps * exact.abs().max().item()
    assert ours_grad <= theirs_grad * 1.25


# ---- errors -----------------------------------------------------------------------------------------------------


def _valid():
    lp = torch.randn(6, 3, 5).log_softmax(2)
    return lp, torch.tensor([[1, 2, 3], [4, 1, 2], [3, 3, 1]]), torch.tensor([6, 5, 4]), torch.tensor([3, 2, 1])


BAD = {
    # name: (changes to the valid call, exception, text the message must contain); torch raises the same type.
    "blank >= C": (dict(blank=5), RuntimeError, "blank"),
    "blank < 0": (dict(blank=-1), RuntimeError, "blank"),
    "input length > T": (dict(input_lengths=torch.tensor([7, 5, 4])), RuntimeError, "input_lengths"),
    "input length < 0": (dict(input_lengths=torch.tensor([6, -1, 4])), RuntimeError, "input_lengths"),
    "target length > S": (dict(target_lengths=torch.tensor([3, 4, 1])), RuntimeError, "target_lengths"),
    "target length < 0": (dict(target_lengths=torch.tensor([3, -2, 1])), RuntimeError, "target_lengths"),
    "input lengths wrong N": (dict(input_lengths=torch.tensor([6, 5])), RuntimeError, "input_lengths"),
    "target lengths wrong N": (dict(target_lengths=torch.tensor([3, 2, 1, 1])), RuntimeError, "target_lengths"),
    "targets wrong N": (dict(targets=torch.tensor([[1, 2, 3], [4, 1, 2]])), RuntimeError, "targets"),
    "targets 3-D": (dict(targets=torch.ones(3, 3, 1, dtype=torch.long)), RuntimeError, "targets"),
    "concatenated too short": (dict(targets=torch.tensor([1, 2, 3, 4, 1])), RuntimeError, "target_lengths"),
    "concatenated too long": (dict(targets=torch.tensor([1, 2, 3, 4, 1, 2, 3])), RuntimeError, "target_lengths"),
    "log_probs 4-D": (dict(log_probs=torch.zeros(6, 3, 5, 1)), RuntimeError, "log_probs"),
    "log_probs 1-D": (dict(log_probs=torch.zeros(6)), RuntimeError, "log_probs"),
    "floating lengths": (dict(input_lengths=torch.tensor([6.0, 5.0, 4.0])), RuntimeError, "input_lengths"),
    "bad reduction": (dict(reduction="avg"), ValueError, "reduction"),
    "lengths of floats": (dict(input_lengths=(6.0, 5.0, 4.0), target_lengths=(3, 2, 1)), TypeError,
                          "input_lengths"),
}


@pytest.mark.parametrize("case", BAD, ids=str)
def test_bad_input_raises_like_torch(case):
    changes, exc, text = BAD[case]
    lp, targets, il, tl = _valid()
    kwargs = dict(log_probs=lp, targets=targets, input_lengths=il, target_lengths=tl)
    kwargs.update(changes)
    with pytest.raises(exc):
        F.ctc_loss(**kwargs)
    with pytest.raises(exc, match=text):
        LF.ctc_loss(**kwargs)


@pytest.mark.parametrize("targets, where", [
    (torch.tensor([[1, 2, 3], [4, 5, 2], [3, 3, 1]]), r"got 5 at position \[1, 1\]"),
    (torch.tensor([[1, 2, 3], [4, 1, 2], [-1, 3, 1]]), r"got -1 at position \[2, 0\]"),
    (torch.tensor([[1, 2, 3], [4, 1, 2], [3, -1, 99]]), None),  # past the target lengths: padding, not read
    (torch.tensor([[1, 0, 3], [4, 1, 2], [3, 3, 1]]), r"blank \(0\).*got 0 at position \[0, 1\]"),
    (torch.tensor([1, 2, 3, 4, 1, 9]), r"got 9 at position \[5\] \(sample 2, label 0\)"),
])
def test_bad_label_reports_position_and_value(targets, where):
    # Deviation: torch does not check labels (out of range reads memory it should not; a blank label is used
    # as is); lossfuse raises IndexError, as for a bad class target of nll_loss, with the label's place.
    lp, _, il, tl = _valid()
    if where is None:
        assert_close(LF.ctc_loss(lp, targets, il, tl), F.ctc_loss(lp.double(), targets, il, tl), 1e-5, 1e-5, "loss")
        return
    with pytest.raises(IndexError, match="targets.*" + where):
        LF.ctc_loss(lp, targets.to(torch.int32), il, tl)


# ---- autograd machinery ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("zero_infinity", [False, True])
def test_gradcheck(reduction, layout, zero_infinity):
    gen = torch.Generator().manual_seed(12)
    lp, targets, il, tl = make_case(6, 3, 4, 2, torch.float64, layout, full_lengths=True, generator=gen)
    if zero_infinity and layout == "padded":
        targets[0] = torch.tensor([1, 1])
        il[0] = 2  # impossible: its loss and gradient are 0
    # torch's gradient (which lossfuse reproduces) treats log_probs as a log_softmax output: it is the true
    # derivative only through the log_softmax (torch's own ctc_loss fails gradcheck on free log_probs), so the
    # check runs on the logits.
    def fn(z):
        return LF.ctc_loss(z.log_softmax(-1), targets, il, tl, reduction=reduction, zero_infinity=zero_infinity)

    assert torch.autograd.gradcheck(fn, (lp.exp().requires_grad_(),))


def test_double_backward_unsupported_like_torch():
    # torch's ctc_loss has no double backward: the first backward with create_graph=True works, and its result's
    # grad_fn raises when differentiated. lossfuse does the same (a derivative-not-implemented RuntimeError).
    gen = torch.Generator().manual_seed(13)
    lp, targets, il, tl = make_case(6, 3, 4, 2, torch.float64, "padded", full_lengths=True, generator=gen)
    for fn in (F.ctc_loss, LF.ctc_loss):
        x = lp.detach().requires_grad_()
        (g,) = torch.autograd.grad(fn(x, targets, il, tl), x, create_graph=True)
        assert g.requires_grad
        with pytest.raises(RuntimeError, match="derivative for .*ctc_loss_backward is not implemented"):
            torch.autograd.grad(g.sum(), x)
        with pytest.raises(RuntimeError, match="derivative for .*ctc_loss_backward is not implemented"):
            torch.autograd.gradgradcheck(lambda x: fn(x, targets, il, tl), (x,))


def test_retain_graph_second_backward_is_right():
    gen = torch.Generator().manual_seed(14)
    lp, targets, il, tl = make_case(8, 3, 5, 3, torch.float64, "padded", full_lengths=True, generator=gen)
    x = lp.requires_grad_()
    loss = LF.ctc_loss(x, targets, il, tl)
    g1 = torch.autograd.grad(loss, x, torch.tensor(3.0, dtype=torch.float64), retain_graph=True)[0]
    g2 = torch.autograd.grad(loss, x, torch.tensor(-0.5, dtype=torch.float64))[0]
    ref = torch.autograd.grad(F.ctc_loss(x, targets, il, tl), x)[0]
    assert_close(g1, 3.0 * ref, 1e-12, 1e-12, "first backward")
    assert_close(g2, -0.5 * ref, 1e-12, 1e-12, "second backward")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_backward_without_saved_log_alpha_recomputes_it(layout):
    gen = torch.Generator().manual_seed(15)
    lp, targets, il, tl = make_case(9, 3, 5, 3, torch.float64, layout, generator=gen)
    ops = torch.ops.lossfuse
    for red, reduction in enumerate(REDUCTIONS):
        loss, log_alpha = ops.ctc_loss(lp, targets, il, tl, 0, red, True, False)
        assert log_alpha.shape == (0,)
        g = torch.rand(loss.shape, dtype=torch.float64)
        ours = ops.ctc_loss_backward(g, lp, targets, il, tl, None, 0, red, True)
        x = lp.detach().requires_grad_()
        ref = torch.autograd.grad(F.ctc_loss(x, targets, il, tl, reduction=reduction, zero_infinity=True), x, g)[0]
        assert_close(ours, ref, 1e-12, 1e-12, f"grad ({reduction})")
        _, saved = ops.ctc_loss(lp, targets, il, tl, 0, red, True, True)
        assert_close(ops.ctc_loss_backward(g, lp, targets, il, tl, saved, 0, red, True), ref, 1e-12, 1e-12,
                     "grad from the saved log alpha")


def test_log_alpha_saved_only_when_a_gradient_is_wanted(monkeypatch):
    lp, targets, il, tl = _valid()
    ops = torch.ops.lossfuse
    _, la = ops.ctc_loss(lp, targets, il, tl, 0, 1, False, True)
    assert la.shape == (6, 3, 7) and la.dtype == torch.float32  # (T, N, 2 S + 1)
    _, la = ops.ctc_loss(lp.double(), torch.tensor([1, 2, 3, 4, 1, 2]), il, tl, 0, 1, False, True)
    assert la.shape == (6, 3, 7) and la.dtype == torch.float64  # 2 max(target_lengths) + 1
    _, la = ops.ctc_loss(lp.double(), torch.tensor([1, 2, 3, 4, 1]), il, torch.tensor([1, 2, 2]), 0, 1, False, True)
    assert la.shape == (6, 3, 5)
    calls = []

    class Spy:
        def __getattr__(self, name):
            return getattr(ops, name)

        def ctc_loss(self, *args):
            calls.append(args[-1])
            return ops.ctc_loss(*args)

    monkeypatch.setattr(lossfuse._ctc, "_ops", Spy())
    x = lp.requires_grad_()
    LF.ctc_loss(x, targets, il, tl).backward()
    LF.ctc_loss(x.detach(), targets, il, tl)
    with torch.no_grad():
        LF.ctc_loss(x, targets, il, tl)
    assert calls == [True, False, False]


OPCHECK_CASES = {
    "padded": lambda: _valid(),
    "concatenated": lambda: (_valid()[0], torch.tensor([1, 2, 3, 4, 1, 2], dtype=torch.int32),
                             torch.tensor([6, 5, 4], dtype=torch.int16), torch.tensor([3, 2, 1], dtype=torch.uint8)),
    "unbatched": lambda: (_valid()[0][:, 0], torch.tensor([1, 2, 3]), torch.tensor(6), torch.tensor(3)),
}


@pytest.mark.parametrize("case", OPCHECK_CASES)
@pytest.mark.parametrize("save_log_alpha", [False, True])
def test_opcheck(case, save_log_alpha):
    lp, targets, il, tl = OPCHECK_CASES[case]()
    ops = torch.ops.lossfuse
    x = lp.detach().requires_grad_()
    for red in (0, 1, 2):
        torch.library.opcheck(ops.ctc_loss.default, (x, targets, il, tl, 0, red, red == 2, save_log_alpha))
    loss, log_alpha = ops.ctc_loss(lp, targets, il, tl, 0, 0, False, save_log_alpha)
    torch.library.opcheck(ops.ctc_loss_backward.default,
                          (torch.rand(loss.shape), lp, targets, il, tl, log_alpha if save_log_alpha else None, 0, 0,
                           False))


@pytest.mark.parametrize("layout", ["padded", "concatenated"])
def test_torch_compile_training_step(layout):
    # torch's own ctc_loss cannot be compiled with fullgraph=True (its output shape depends on the lengths'
    # values); lossfuse's can, with padded and with concatenated targets.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 6))
    ref_model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 6))
    ref_model.load_state_dict(model.state_dict())
    x = torch.randn(20, 4, 8)
    _, targets, il, tl = make_case(20, 4, 6, 5, torch.float32, layout, full_lengths=False,
                                   generator=torch.Generator().manual_seed(16))
    il = il.clamp_min(12)

    def forward(m, loss_fn, x, targets, il, tl):
        return loss_fn(m(x).log_softmax(2), targets, il, tl)

    compiled = torch.compile(forward, fullgraph=True)
    ours = compiled(model, LF.ctc_loss, x, targets, il, tl)
    ours.backward()
    ref = forward(ref_model, F.ctc_loss, x, targets, il, tl)
    ref.backward()
    torch.testing.assert_close(ours, ref)
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
