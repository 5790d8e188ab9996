"""lossfuse.nn.functional binary_cross_entropy, binary_cross_entropy_with_logits, poisson_nll_loss and
gaussian_nll_loss against torch: values and gradients for every option, reduction and dtype, broadcasting, layouts,
dtype promotion, edge cases, errors, 16-bit accuracy, gradcheck/gradgradcheck, opcheck, modules and torch.compile.

torch is the oracle throughout: every expectation is torch's result on the same inputs (computed in float64 on
the inputs' rounded values where the dtype under test is lower), never lossfuse's own output."""

import math
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
# Relative tolerance (scaled by the largest reference magnitude, at least 1) against torch in float64 on the same
# rounded inputs: lossfuse computes in float32 (float64 for float64) and rounds 16-bit results once.
TOL = {torch.float64: 1e-12, torch.float32: 2e-5, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}

BCE, BCEL = "binary_cross_entropy", "binary_cross_entropy_with_logits"
POISSON, GAUSS = "poisson_nll_loss", "gaussian_nll_loss"


# ---- the cases: a loss, its options, and how its operands are made ----------------------------------------------
# Each case is (loss name, options). Options: weight / pos_weight: the shape rule of that operand ('full': the
# input's shape, 'last': the last dim only, 'col': the input's shape with last dim 1); var: 'full', 'short' (the
# input's shape minus its last dim), 'last1' (last dim 1), 'dim0' (first dim 1), or 'float'; the loss's own
# keyword arguments (log_input, full, eps) pass through.

CASES = [
    (BCE, {}), (BCE, {"weight": "full"}), (BCE, {"weight": "last"}),
    (BCEL, {}), (BCEL, {"weight": "full"}), (BCEL, {"pos_weight": "last"}),
    (BCEL, {"weight": "last", "pos_weight": "col"}), (BCEL, {"weight": "col", "pos_weight": "full"}),
    (POISSON, {}), (POISSON, {"full": True}), (POISSON, {"log_input": False}),
    (POISSON, {"log_input": False, "full": True, "eps": 0.25}),
    (GAUSS, {"var": "full"}), (GAUSS, {"var": "full", "full": True}), (GAUSS, {"var": "short"}),
    (GAUSS, {"var": "last1"}), (GAUSS, {"var": "dim0", "eps": 0.3}), (GAUSS, {"var": "float", "full": True}),
]
CASES_AND_REDUCTIONS = [(n, o, r) for n, o in CASES for r in REDUCTIONS]
LOSS_KWARGS = ("log_input", "full", "eps")


def case_id(value):
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items()) or "plain"
    return str(value)


def operand_shape(rule, shape):
    if rule in ("full", None):
        return shape
    if rule == "last":
        return shape[-1:]
    if rule in ("col", "last1"):
        return shape[:-1] + (1,) if shape else shape
    if rule == "short":
        return shape[:-1]
    if rule == "dim0":
        return (1,) + shape[1:] if shape else shape
    raise AssertionError(rule)


def make_operands(name, opts, shape, dtype, gen, kinks=True):
    """Leaf tensors of the case (float64 values rounded to `dtype`), and the index of each operand torch
    differentiates. kinks: include the values where the losses have special branches (targets 0 and 1, ...)."""
    def rand(s, lo=0.0, hi=1.0):
        return torch.rand(s, generator=gen, dtype=torch.float64) * (hi - lo) + lo

    def randn(s, scale=1.0):
        return torch.randn(s, generator=gen, dtype=torch.float64) * scale

    if name == BCE:
        x, t = rand(shape, 0.02, 0.98), rand(shape)
        if kinks and t.numel() > 2:
            t.view(-1)[:2] = torch.tensor([0.0, 1.0])
    elif name == BCEL:
        x, t = randn(shape, 3.0), rand(shape)
    elif name == POISSON:
        x = randn(shape) if opts.get("log_input", True) else rand(shape, 0.05, 3.0)
        # Counts, with targets <= 1 and > 1 (full adds Stirling's term only where the target is > 1); away from the
        # target 0 where torch's target gradient is nan with full (tested separately).
        t = torch.randint(1, 6, shape, generator=gen).double() + (rand(shape, -0.4, 0.4) if kinks else 0.3)
    else:
        x, t = randn(shape), randn(shape)
    ops = [x, t]
    diff = [0, 1]
    for key in ("weight", "pos_weight"):
        if key in opts:
            ops.append(rand(operand_shape(opts[key], shape), 0.2, 2.0))
    if name == GAUSS and opts["var"] != "float":
        lo = 0.0 if "eps" in opts else 0.1  # with eps 0.3, some var below it: the clamp and its gradient quirk
        ops.append(rand(operand_shape(opts["var"], shape), lo, 1.5))
        diff.append(2)
    return [o.to(dtype) for o in ops], diff


def call(lib, name, opts, ops, reduction):
    """The loss of `lib` (torch.nn.functional or lossfuse.nn.functional) for a case's operands."""
    kwargs = {k: v for k, v in opts.items() if k in LOSS_KWARGS}
    x, t, rest = ops[0], ops[1], list(ops[2:])
    fn = getattr(lib, name)
    if name in (BCE, BCEL):
        if "weight" in opts:
            kwargs["weight"] = rest.pop(0)
        if "pos_weight" in opts:
            kwargs["pos_weight"] = rest.pop(0)
        return fn(x, t, reduction=reduction, **kwargs)
    if name == GAUSS:
        var = 0.7 if opts["var"] == "float" else rest.pop(0)
        return fn(x, t, var, reduction=reduction, **kwargs)
    return fn(x, t, reduction=reduction, **kwargs)


def finite_scale(t):
    finite = t[torch.isfinite(t)]
    return finite.abs().max().item() if finite.numel() else 0.0


def assert_close(ours, ref, dtype, what):
    ours, ref = ours.double(), ref.double()
    assert ours.shape == ref.shape, f"{what}: shape {tuple(ours.shape)} != {tuple(ref.shape)}"
    tol = TOL[dtype]
    torch.testing.assert_close(ours, ref, rtol=tol, atol=tol * max(finite_scale(ref), 1.0), equal_nan=True,
                               msg=lambda m: f"{what}: {m}")


def check_against_torch(name, opts, reduction, ops, diff, build=None):
    """Runs lossfuse on the operands as given (through `build`, which may make views of them) and torch in float64
    on the same values; compares the loss (value, shape, dtype as torch's on the given dtypes) and the gradients of
    the operands in `diff`."""
    build = build or (lambda ts: ts)
    ours_in = [o.detach().clone().requires_grad_(i in diff) for i, o in enumerate(ops)]
    ref_in = [o.detach().double().requires_grad_(i in diff) for i, o in enumerate(ops)]
    ours = call(LF, name, opts, build(ours_in), reduction)
    ref = call(F, name, opts, build(ref_in), reduction)
    with torch.no_grad():
        expected = call(F, name, opts, build([o.detach() for o in ops]), reduction)
    assert ours.dtype == expected.dtype, f"dtype {ours.dtype}, torch gives {expected.dtype}"
    dtype = max((o.dtype for o in ops), key=lambda d: TOL[d])
    assert_close(ours, ref, dtype, "loss")
    if ref.numel() == 0 or not diff:
        return
    g = torch.randn(ref.shape, dtype=torch.float64).to(ours.dtype)  # rounded once: both sides use this value
    ours_g = torch.autograd.grad(ours, [ours_in[i] for i in diff], g)
    ref_g = torch.autograd.grad(ref, [ref_in[i] for i in diff], g.double())
    for i, a, b in zip(diff, ours_g, ref_g):
        assert a.dtype == ops[i].dtype, f"grad of operand {i}: dtype {a.dtype}"
        assert_close(a, b, dtype, f"grad of operand {i}")


# ---- every loss, option, reduction and dtype ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name,opts,reduction", CASES_AND_REDUCTIONS, ids=case_id)
def test_against_torch(name, opts, reduction, dtype):
    # A seed per case that is the same in every run (hash() of strings is not).
    gen = torch.Generator().manual_seed(zlib.crc32(repr((name, case_id(opts), reduction)).encode()))
    ops, diff = make_operands(name, opts, (6, 9), dtype, gen)
    check_against_torch(name, opts, reduction, ops, diff)


@pytest.mark.parametrize("name,opts", CASES, ids=case_id)
def test_large_zero_dim_and_empty(name, opts):
    """Many elements (several blocks of the parallel kernels), a 0-d input (scalar var rules), and no elements
    (mean nan, sum 0)."""
    gen = torch.Generator().manual_seed(1)
    for reduction in REDUCTIONS:
        ops, diff = make_operands(name, opts, (2, 9001), torch.float32, gen)
        check_against_torch(name, opts, reduction, ops, diff)
        ops, diff = make_operands(name, opts, (), torch.float64, gen)
        check_against_torch(name, opts, reduction, ops, diff)
        ops, diff = make_operands(name, opts, (0, 4), torch.float32, gen)
        check_against_torch(name, opts, reduction, ops, diff)


@pytest.mark.parametrize("name,opts", CASES, ids=case_id)
def test_more_dims_than_the_kernels_take(name, opts):
    gen = torch.Generator().manual_seed(4)
    shape = (2, 1, 3, 1, 2, 1, 1, 2, 1, 3)  # 10 dims; the kernels take 8
    ops, diff = make_operands(name, opts, shape, torch.float64, gen)
    for reduction in REDUCTIONS:
        check_against_torch(name, opts, reduction, ops, diff)


def layout(t, kind):
    """t's values in another layout, differentiably: 'transposed' (a transposed copy's transpose), 'strided' (every
    other element of a wider last dim), 'expanded' (dim 0 broadcast from the first row: stride 0)."""
    if t.dim() == 0 or kind == "contiguous":
        return t
    if kind == "transposed":
        return t.mT.contiguous().mT if t.dim() >= 2 else t
    if kind == "strided":
        wide = t.new_zeros(*t.shape[:-1], 2 * t.shape[-1])
        wide[..., ::2] = t
        return wide[..., ::2]
    return t[:1].expand(t.shape) if t.shape[0] > 0 else t


@settings(max_examples=50, deadline=None)
@given(case=st.sampled_from(CASES), dtype=st.sampled_from(DTYPES), reduction=st.sampled_from(REDUCTIONS),
       shape=st.lists(st.integers(0, 5), min_size=1, max_size=4),
       kinds=st.lists(st.sampled_from(["contiguous", "transposed", "strided", "expanded"]), min_size=3, max_size=3),
       smaller_input=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_random_shapes_layouts_broadcasting(case, dtype, reduction, shape, kinds, smaller_input, seed):
    """Random shapes and dtypes; each operand in a random layout; for poisson and gaussian (which broadcast input
    and target) sometimes an input smaller than the target, broadcast by torch."""
    name, opts = case
    gen = torch.Generator().manual_seed(seed)
    ops, diff = make_operands(name, opts, tuple(shape), dtype, gen)
    if smaller_input and name in (POISSON, GAUSS) and opts.get("var") != "float":
        ops[0] = ops[0][..., :1]  # torch broadcasts it against the target (var's shape rules follow the input)
        if name == GAUSS and opts["var"] in ("full", "dim0"):
            ops[2] = ops[2][..., :1]
    check_against_torch(name, opts, reduction, ops, diff,
                        build=lambda ts: [layout(t, k) for t, k in zip(ts, kinds)] + list(ts[len(kinds):]))


@pytest.mark.parametrize("name,opts", CASES, ids=case_id)
def test_leaves_behind_views(name, opts):
    """Gradients reach leaves that the operands are views of (expanded, transposed): autograd sums them back."""
    gen = torch.Generator().manual_seed(3)
    ops, diff = make_operands(name, opts, (7, 5), torch.float64, gen)

    def build(ts):
        out = list(ts)
        out[0] = out[0].t().contiguous().t()
        out[1] = out[1][:1].expand(7, 5)
        return out

    for reduction in REDUCTIONS:
        check_against_torch(name, opts, reduction, ops, diff, build)


# ---- edge cases (torch-loss-semantics.md) ------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_bce_log_clamp_and_gradient_at_0_and_1(reduction):
    """Each log is clamped to >= -100 (x = 0, y = 1 gives 100); the input gradient divides by max(x(1-x), 1e-12);
    the target gradient -logit(x) is infinite at x = 0 and 1, as torch's."""
    x = torch.tensor([0.0, 1.0, 0.0, 1.0, 1e-30, 0.5, 1 - 1e-7], dtype=torch.float64)
    t = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.3, 0.5, 0.0], dtype=torch.float64)
    w = torch.tensor([0.5, 2.0, 1.0, 1.0, 1.0, 3.0, 1.0], dtype=torch.float64)
    for dtype in (torch.float32, torch.float64):
        check_against_torch(BCE, {"weight": "full"}, reduction, [x.to(dtype), t.to(dtype), w.to(dtype)], [0, 1])
    # In 16 bits the gradients near x = 0 and 1 overflow: compared with torch's float32 results on the same rounded
    # inputs, rounded to the dtype (infinities and signs included). torch's own float16 gives nan at x = y = 0 and
    # x = y = 1, its 1e-12 floor underflowing to 0 (0 / 0); lossfuse keeps the floor in float32 and gives 0, as
    # torch does in float32 and float64.
    for dtype in (torch.bfloat16, torch.float16):
        results = []
        for lib, compute in ((LF, dtype), (F, torch.float32)):
            xs, ts = x.to(dtype).to(compute).requires_grad_(), t.to(dtype).to(compute).requires_grad_()
            loss = lib.binary_cross_entropy(xs, ts, w.to(dtype).to(compute), reduction=reduction)
            results.append([r.to(dtype) for r in (loss, *torch.autograd.grad(loss.sum(), [xs, ts]))])
        for what, a, b in zip(["loss", "grad_input", "grad_target"], *results):
            torch.testing.assert_close(a.detach().double(), b.detach().double(), rtol=TOL[dtype], atol=TOL[dtype],
                                       msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("bad", [1.5, -0.1, math.nan, math.inf])
def test_bce_input_or_target_outside_unit_interval_raises_as_torch(bad):
    """torch 2.15 checks both (the input first); lossfuse's message names the argument and the first bad
    element's position."""
    x = torch.tensor([[0.2, 0.5, 0.3], [0.1, bad, bad]])
    t = torch.rand(2, 3)
    for args, arg in [((x, t), "input"), ((t, x), "target"), ((x, x), "input")]:
        with pytest.raises(RuntimeError, match=arg):
            F.binary_cross_entropy(*args)
        with pytest.raises(RuntimeError, match=arg + r".*\[1, 1\]"):
            LF.binary_cross_entropy(*args)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_bce_with_logits_is_stable_for_large_logits(reduction):
    """x = +-100 gives 100, not inf; 1000 too."""
    x = torch.tensor([100.0, -100.0, 1000.0, -1000.0, 30.0, -30.0, 0.0])
    t = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.5, 0.25, 1.0])
    pw = torch.tensor([3.0]).expand(7)
    for dtype in DTYPES:
        check_against_torch(BCEL, {}, reduction, [x.to(dtype), t.to(dtype)], [0, 1])
        check_against_torch(BCEL, {"pos_weight": "full"}, reduction, [x.to(dtype), t.to(dtype), pw.to(dtype)], [0, 1])


@pytest.mark.parametrize("log_input", [True, False])
def test_poisson_full_special_targets(log_input):
    """Stirling's term only where y > 1; y = 0 and y < 0 give torch's nan target gradient (and values)."""
    x = torch.tensor([0.5, 0.5, 0.5, 0.5, 0.5, 2.0, 1e-3], dtype=torch.float64)
    t = torch.tensor([0.0, 1.0, 1.0 + 1e-9, 0.5, -1.0, 7.0, 0.0], dtype=torch.float64)
    for reduction in REDUCTIONS:
        for full in (False, True):
            opts = {"full": full, "log_input": log_input}
            check_against_torch(POISSON, opts, reduction, [x, t], [0, 1])
            check_against_torch(POISSON, opts, reduction, [x.float(), t.float()], [0, 1])


def test_poisson_eps_and_zero_input():
    """x = 0 without log_input: log(0 + eps)."""
    x = torch.tensor([0.0, 1e-9, 0.3])
    t = torch.tensor([2.0, 1.0, 0.0])
    for eps in (1e-8, 0.0, 1.0):
        check_against_torch(POISSON, {"log_input": False, "eps": eps}, "none", [x, t], [0, 1])


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_gaussian_clamp_gradient_quirk(reduction):
    """var below eps (0 included) is clamped outside autograd: its gradient is taken at eps and passed through,
    as torch's (not 0, as a differentiable clamp would give)."""
    x = torch.tensor([0.3, -1.0, 2.0, 0.0, 1.0], dtype=torch.float64)
    t = torch.tensor([0.0, 0.5, 2.0, 0.0, -1.0], dtype=torch.float64)
    v = torch.tensor([0.0, 1e-9, 0.05, 0.2, 1.0], dtype=torch.float64)
    for dtype in DTYPES:
        check_against_torch(GAUSS, {"var": "full", "eps": 0.1}, reduction, [x.to(dtype), t.to(dtype), v.to(dtype)],
                            [0, 1, 2])
    xg, vg = x.clone().requires_grad_(), v.clone().requires_grad_()
    LF.gaussian_nll_loss(xg, t, vg, eps=0.1, reduction="sum").backward()
    assert vg.grad[0] != 0  # passed through the clamp


@pytest.mark.parametrize("input_shape,var_shape", [
    ((4, 3), (4, 3)), ((4, 3), (4,)), ((4, 3), (4, 1)), ((4, 3), (1, 3)), ((2, 3, 4), (2, 1, 4)), ((5,), ()),
    ((5,), (1,)), ((), ()), ((2, 3, 4), (2, 3)),
])
def test_gaussian_var_shapes(input_shape, var_shape):
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(input_shape, generator=gen, dtype=torch.float64)
    t = torch.randn(input_shape, generator=gen, dtype=torch.float64)
    v = torch.rand(var_shape, generator=gen, dtype=torch.float64) + 0.1
    for reduction in REDUCTIONS:
        check_against_torch(GAUSS, {"var": "given"}, reduction, [x, t, v], [0, 1, 2])


def test_gaussian_float_var_and_nan_var():
    x, t = torch.randn(3, 4), torch.randn(3, 4)
    for var in (0.0, 0.5, 3.0):
        for reduction in REDUCTIONS:
            torch.testing.assert_close(LF.gaussian_nll_loss(x, t, var, reduction=reduction),
                                       F.gaussian_nll_loss(x, t, var, reduction=reduction))
    v = torch.rand(3, 4)
    v[1, 2] = math.nan  # passes the check (nan < 0 is false), as torch
    torch.testing.assert_close(LF.gaussian_nll_loss(x, t, v, reduction="none"),
                               F.gaussian_nll_loss(x, t, v, reduction="none"), equal_nan=True)


def test_gaussian_input_and_target_broadcast():
    """torch broadcasts input and target (and var against them): the loss can be larger than the input."""
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(3, generator=gen, dtype=torch.float64)
    t = torch.randn(4, 3, generator=gen, dtype=torch.float64)
    v = torch.rand(3, generator=gen, dtype=torch.float64) + 0.2
    v_rows = torch.rand(4, generator=gen, dtype=torch.float64) + 0.2
    for reduction in REDUCTIONS:
        check_against_torch(GAUSS, {"var": "given"}, reduction, [x, t, v], [0, 1, 2])
        check_against_torch(GAUSS, {"var": "given"}, reduction, [x, t, v[:1]], [0, 1, 2])
        check_against_torch(GAUSS, {"var": "given"}, reduction, [t, x, v_rows], [0, 1, 2])
        check_against_torch(POISSON, {}, reduction, [x, t], [0, 1])


@pytest.mark.parametrize("name", [BCE, BCEL])
def test_weights_broadcast_to_the_input(name):
    """weight (and pos_weight) of any shape that broadcasts to the input's: (C), (N, 1), (1, C), 0-d."""
    gen = torch.Generator().manual_seed(10)
    ops, diff = make_operands(name, {}, (4, 5), torch.float64, gen)
    for wshape in [(5,), (4, 1), (1, 5), (), (4, 5)]:
        w = torch.rand(wshape, generator=gen, dtype=torch.float64) + 0.5
        check_against_torch(name, {"weight": "given"}, "none", ops + [w], diff)
        if name == BCEL:
            check_against_torch(name, {"pos_weight": "given"}, "mean", ops + [w], diff)


# ---- dtype promotion ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtypes", [
    (torch.float32, torch.float64), (torch.float64, torch.float32), (torch.float16, torch.float32),
    (torch.bfloat16, torch.float16), (torch.float32, torch.bfloat16),
], ids=str)
@pytest.mark.parametrize("name,opts", [(BCEL, {"weight": "full", "pos_weight": "last"}), (POISSON, {}),
                                       (POISSON, {"log_input": False, "full": True}), (GAUSS, {"var": "full"}),
                                       (GAUSS, {"var": "float"})], ids=case_id)
def test_mixed_dtypes_promote_as_torch(name, opts, dtypes):
    """Each operand in its own dtype: the loss gets torch's dtype (bce_with_logits: the target's; the others: the
    promoted one) and each gradient its operand's."""
    gen = torch.Generator().manual_seed(11)
    ops, diff = make_operands(name, opts, (3, 4), torch.float64, gen)
    ops = [o.to(dtypes[i % 2]) for i, o in enumerate(ops)]
    for reduction in REDUCTIONS:
        check_against_torch(name, opts, reduction, ops, diff)


@pytest.mark.parametrize("name,zero_dim", [(POISSON, 1), (POISSON, 0), (GAUSS, 1), (GAUSS, 2)])
def test_zero_dim_operands_promote_as_torch(name, zero_dim):
    """A 0-d float64 operand does not widen a float16 n-d one (torch's zero-dim rule)."""
    gen = torch.Generator().manual_seed(12)
    opts = {"var": "given"} if name == GAUSS else {}
    ops, diff = make_operands(name, {"var": "full"} if name == GAUSS else {}, (3, 4), torch.float16, gen)
    ops[zero_dim] = ops[zero_dim][0, 0].double()
    if name == GAUSS and zero_dim == 2:
        ops = [o[0] for o in ops[:2]] + [ops[2]]  # a 0-d var needs a 1-d input
    check_against_torch(name, opts, "none", ops, diff)


def test_weight_dtypes():
    """bce and bce_with_logits take a weight of any dtype (integer ones included) and keep the loss's dtype."""
    x, t = torch.rand(3, 4), torch.rand(3, 4)
    for w in (torch.rand(4, dtype=torch.float64), torch.arange(4), torch.rand(4).half()):
        for name in (BCE, BCEL):
            ours, theirs = getattr(LF, name)(x, t, w), getattr(F, name)(x, t, w)
            assert ours.dtype == theirs.dtype
            torch.testing.assert_close(ours, theirs)
    ours = LF.binary_cross_entropy_with_logits(x, t, pos_weight=torch.arange(4))
    torch.testing.assert_close(ours, F.binary_cross_entropy_with_logits(x, t, pos_weight=torch.arange(4)))


def test_integer_operands_as_torch():
    """Integer operands, which torch computes with its promotion rules (or rejects): the same result or
    exception type."""
    x, t, v = torch.randint(0, 4, (3, 4)), torch.randint(0, 4, (3, 4)), torch.rand(3, 4) + 0.1
    cases = [
        lambda lib: lib.poisson_nll_loss(x, t),
        lambda lib: lib.poisson_nll_loss(x, t.float(), log_input=False, full=True),
        lambda lib: lib.poisson_nll_loss(x.double(), t, reduction="none"),
        lambda lib: lib.gaussian_nll_loss(x, t, v),
        lambda lib: lib.gaussian_nll_loss(x, t, 0.5, reduction="none"),
        lambda lib: lib.gaussian_nll_loss(x.float(), t.float(), v.long()),
        lambda lib: lib.binary_cross_entropy_with_logits(x.float(), t),
        lambda lib: lib.binary_cross_entropy_with_logits(x, t.float()),
        lambda lib: lib.binary_cross_entropy_with_logits(x.float(), t.bool()),
        lambda lib: lib.binary_cross_entropy(x, t),
        lambda lib: lib.binary_cross_entropy(x.float() / 4, t.double() / 4),
        lambda lib: lib.binary_cross_entropy(x.float() / 4, t),
    ]
    for case in cases:
        try:
            theirs = case(F)
        except Exception as e:  # noqa: BLE001 -- the exception type torch raises is the expectation
            with pytest.raises(type(e)):
                case(LF)
            continue
        ours = case(LF)
        assert ours.dtype == theirs.dtype
        torch.testing.assert_close(ours, theirs)


# ---- options -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,opts", [(BCE, {"weight": "full"}), (BCEL, {"pos_weight": "last"}), (POISSON, {})],
                         ids=case_id)
@pytest.mark.parametrize("legacy", [(None, False), (False, None), (True, None), (False, True), (None, True)],
                         ids=str)
def test_legacy_size_average_and_reduce(name, opts, legacy):
    size_average, reduce = legacy
    gen = torch.Generator().manual_seed(13)
    ops, _ = make_operands(name, opts, (3, 4), torch.float64, gen)
    kw = dict(size_average=size_average, reduce=reduce)
    if name == BCE:
        args, kw["weight"] = ops[:2], ops[2]
    elif name == BCEL:
        args, kw["pos_weight"] = ops[:2], ops[2]
    else:
        args = ops
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's deprecation warning
        torch.testing.assert_close(getattr(LF, name)(*args, **kw), getattr(F, name)(*args, **kw))


@pytest.mark.parametrize("eps", [math.inf, math.nan])
def test_non_finite_eps(eps):
    """eps the kernels do not take: torch's own computation, same values."""
    x, t, v = torch.rand(3, 4) + 0.1, torch.rand(3, 4) * 3, torch.rand(3, 4)
    torch.testing.assert_close(LF.poisson_nll_loss(x, t, log_input=False, eps=eps, reduction="none"),
                               F.poisson_nll_loss(x, t, log_input=False, eps=eps, reduction="none"), equal_nan=True)
    torch.testing.assert_close(LF.gaussian_nll_loss(x, t, v, eps=eps, reduction="none"),
                               F.gaussian_nll_loss(x, t, v, eps=eps, reduction="none"), equal_nan=True)
    with pytest.raises(ValueError, match="var"):
        LF.gaussian_nll_loss(x, t, -v, eps=eps)


# ---- 16-bit accuracy ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("name,opts", CASES, ids=case_id)
def test_16bit_error_not_above_torch(name, opts, reduction, dtype):
    """lossfuse's error against float64 (on the same rounded inputs) is at most torch's own 16-bit error, plus one
    unit in the last place of the result's magnitude: both round their result to the 16-bit dtype once at least,
    so a correctly rounded result can still land one ulp away from a luckier torch rounding."""
    gen = torch.Generator().manual_seed(17)
    ops, diff = make_operands(name, opts, (8, 64), dtype, gen)
    leaves = [[o.detach().clone().requires_grad_(i in diff) for i, o in enumerate(ops)] for _ in range(2)]
    ref_in = [o.detach().double().requires_grad_(i in diff) for i, o in enumerate(ops)]
    results = [call(LF, name, opts, leaves[0], reduction), call(F, name, opts, leaves[1], reduction),
               call(F, name, opts, ref_in, reduction)]
    eps = torch.finfo(dtype).eps

    def check(ours, theirs, ref, what):
        ours, theirs = ours.double(), theirs.double()
        ours_err = (ours - ref).abs().max().item()
        torch_err = (theirs - ref).abs().max().item()
        assert ours_err <= torch_err + eps * max(finite_scale(ref), torch.finfo(dtype).tiny), \
            f"{what}: lossfuse error {ours_err}, torch {torch_err}"

    check(*[r.detach() for r in results], "loss")
    grads = [torch.autograd.grad(r.sum(), [lv[i] for i in diff]) for r, lv in zip(results, leaves + [ref_in])]
    for k, i in enumerate(diff):
        check(grads[0][k], grads[1][k], grads[2][k], f"grad of operand {i}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", ["var_short", "var_last1", "var_dim0", "poisson_input_row"])
def test_16bit_broadcast_gradient_rounded_once(case, dtype):
    """The gradient of a broadcast operand is a sum over the broadcast dims whose terms can cancel; it is summed
    from float32 terms and rounded once, so it lies within one unit in the last place of the exact sum (terms
    rounded to 16 bits first put it several units away in about 1 of 300 random cases)."""
    for seed in range(40):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(6, 9, generator=gen).to(dtype)
        y = torch.randn(6, 9, generator=gen).to(dtype)
        if case == "poisson_input_row":
            x = x[:1]
            operands, idx = [x, y.abs()], 0
            fn = lambda lib, o: lib.poisson_nll_loss(o[0], o[1], reduction="sum")  # noqa: E731
        else:
            var_shape = {"var_short": (6,), "var_last1": (6, 1), "var_dim0": (1, 9)}[case]
            v = (torch.rand(var_shape, generator=gen) + 0.1).to(dtype)
            operands, idx = [x, y, v], 2
            fn = lambda lib, o: lib.gaussian_nll_loss(o[0], o[1], o[2], reduction="sum")  # noqa: E731
        ours_in = [o.clone().requires_grad_(k == idx) for k, o in enumerate(operands)]
        ref_in = [o.double().requires_grad_(k == idx) for k, o in enumerate(operands)]
        ours = torch.autograd.grad(fn(LF, ours_in), ours_in[idx])[0]
        exact = torch.autograd.grad(fn(F, ref_in), ref_in[idx])[0]
        assert ours.dtype == dtype
        # one ulp of the exact value in the 16-bit dtype (its spacing at |exact|, at least the smallest normal's)
        tiny = torch.finfo(dtype).tiny
        ulp = torch.finfo(dtype).eps * torch.exp2(torch.floor(torch.log2(exact.abs().clamp_min(tiny))))
        err = (ours.double() - exact).abs()
        assert bool((err <= ulp).all()), f"seed {seed}: error {(err / ulp).max().item():.2f} ulp"


# ---- errors --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [BCE, BCEL, POISSON, GAUSS])
def test_bad_reduction(name):
    x, t = torch.rand(3), torch.rand(3)
    args = (x, t, torch.ones(3)) if name == GAUSS else (x, t)
    with pytest.raises(ValueError, match="avg"):
        getattr(F, name)(*args, reduction="avg")
    with pytest.raises(ValueError, match="avg"):
        getattr(LF, name)(*args, reduction="avg")


@pytest.mark.parametrize("name", [BCE, BCEL, POISSON, GAUSS])
def test_elementwise_mean_as_torch(name):
    """The binary cross-entropies still take the deprecated 'elementwise_mean' (as 'mean', with torch's warning);
    the others refuse it, as torch."""
    x, t = torch.rand(3), torch.rand(3)
    args = (x, t, torch.ones(3)) if name == GAUSS else (x, t)
    if name in (POISSON, GAUSS):
        for lib in (F, LF):
            with pytest.raises(ValueError, match="elementwise_mean"):
                getattr(lib, name)(*args, reduction="elementwise_mean")
        return
    results = []
    for lib in (F, LF):
        with pytest.warns(UserWarning, match="deprecated"):
            results.append(getattr(lib, name)(*args, reduction="elementwise_mean"))
    torch.testing.assert_close(*results)


def raises_like_torch(fn_torch, fn_ours, match):
    """torch raises some exception type; lossfuse raises the same type, with a message matching `match` (the
    argument's name)."""
    with pytest.raises(Exception) as theirs:
        fn_torch()
    with pytest.raises(theirs.type, match=match):
        fn_ours()


def test_bad_arguments_name_the_argument():
    x, t = torch.rand(3, 4), torch.rand(3, 4)
    cases = [
        # input and target of different shapes
        (lambda lib: lib.binary_cross_entropy(x, t[0]), "target size"),
        (lambda lib: lib.binary_cross_entropy_with_logits(x, t[:, :1]), "Target size"),
        # bce: target dtype, input dtype
        (lambda lib: lib.binary_cross_entropy(x, t.double()), "target"),
        (lambda lib: lib.binary_cross_entropy(x.long(), t.long()), "input"),
        # weights that do not broadcast to the input
        (lambda lib: lib.binary_cross_entropy(x, t, torch.rand(2, 3, 4)), "weight"),
        (lambda lib: lib.binary_cross_entropy(x, t, torch.rand(3)), "weight|shape"),
        (lambda lib: lib.binary_cross_entropy_with_logits(x, t, torch.rand(2, 3, 4)), "weight"),
        (lambda lib: lib.binary_cross_entropy_with_logits(x, t, pos_weight=torch.rand(5)), "pos_weight"),
        (lambda lib: lib.binary_cross_entropy_with_logits(x, t, pos_weight=torch.rand(2, 3, 4)), "pos_weight"),
        # weights that require a gradient (torch differentiates none)
        (lambda lib: lib.binary_cross_entropy(x, t, torch.rand(4, requires_grad=True)), "weight"),
        (lambda lib: lib.binary_cross_entropy_with_logits(x, t, torch.rand(4, requires_grad=True)), "weight"),
        (lambda lib: lib.binary_cross_entropy_with_logits(x, t, pos_weight=torch.rand(4, requires_grad=True)),
         "pos_weight"),
        # gaussian var: negative, of incorrect size, not a tensor or float, not broadcastable after the size rule
        (lambda lib: lib.gaussian_nll_loss(x, t, -torch.rand(3, 4)), "var"),
        (lambda lib: lib.gaussian_nll_loss(x, t, -1.0), "var"),
        (lambda lib: lib.gaussian_nll_loss(x, t, torch.rand(3, 2)), "var"),
        (lambda lib: lib.gaussian_nll_loss(x, t, torch.rand(2)), "var"),
        (lambda lib: lib.gaussian_nll_loss(x, t, torch.rand(())), "var"),
        (lambda lib: lib.gaussian_nll_loss(x, t, torch.rand(1, 3, 4)), "var"),
        (lambda lib: lib.gaussian_nll_loss(x, t, 1), "var|any"),
        (lambda lib: lib.gaussian_nll_loss(x, t, torch.rand(0, 1)), "var"),
        (lambda lib: lib.gaussian_nll_loss(x, t, torch.rand(3, 4), reduction="avg"), "avg is not valid"),
        # input and target that do not broadcast
        (lambda lib: lib.poisson_nll_loss(x, torch.rand(2, 4)), "target"),
        (lambda lib: lib.gaussian_nll_loss(x, torch.rand(2, 4), torch.rand(3, 4)), "target"),
    ]
    for case, match in cases:
        raises_like_torch(lambda: case(F), lambda: case(LF), match)


def test_negative_var_message_has_position_and_value():
    v = torch.rand(3, 4)
    v[2, 1] = -0.5
    with pytest.raises(ValueError, match=r"var.*-0\.5.*\[2, 1\]"):
        LF.gaussian_nll_loss(torch.rand(3, 4), torch.rand(3, 4), v)


def test_weight_requiring_grad_is_fine_without_grad_mode():
    """torch refuses such a weight only when a graph would be recorded."""
    x, t, w = torch.rand(3, 4), torch.rand(3, 4), torch.rand(4, requires_grad=True)
    with torch.no_grad():
        torch.testing.assert_close(LF.binary_cross_entropy(x, t, w), F.binary_cross_entropy(x, t, w))
        torch.testing.assert_close(LF.binary_cross_entropy_with_logits(x, t, pos_weight=w),
                                   F.binary_cross_entropy_with_logits(x, t, pos_weight=w))


@pytest.mark.parametrize("arg", ["weight", "pos_weight"])
def test_bce_with_logits_weights_differentiated_under_torch_func(arg):
    """torch refuses a gradient for these in plain autograd but gives one under torch.func; so does lossfuse."""
    gen = torch.Generator().manual_seed(21)
    x = torch.randn(4, 5, generator=gen, dtype=torch.float64)
    t = torch.rand(4, 5, generator=gen, dtype=torch.float64)
    w = torch.rand(5, generator=gen, dtype=torch.float64) + 0.5
    for reduction in ["none", "mean", "sum"]:
        def loss(f):
            return lambda ww: f.binary_cross_entropy_with_logits(x, t, reduction=reduction, **{arg: ww})
        torch.testing.assert_close(torch.func.jacrev(loss(LF))(w), torch.func.jacrev(loss(F))(w))
    with pytest.raises(RuntimeError, match="not differentiable"):
        LF.binary_cross_entropy_with_logits(x, t, **{arg: w.clone().requires_grad_()})


def test_ops_check_their_operands():
    """The ops themselves reject what the functions never pass: mismatched shapes or dtypes, and options out of
    range, naming the argument."""
    ops = torch.ops.lossfuse
    x = torch.rand(3, 4)
    with pytest.raises(ValueError, match="target"):
        ops.binary_cross_entropy(x, torch.rand(3, 5), None, 1)
    with pytest.raises(RuntimeError, match="input"):
        ops.binary_cross_entropy(x + 1, x, None, 1)
    with pytest.raises(RuntimeError, match="target"):
        ops.binary_cross_entropy_with_logits(x, x.double(), None, None, 1)
    with pytest.raises(ValueError, match="pos_weight"):
        ops.binary_cross_entropy_with_logits(x, x, None, torch.rand(4), 1)
    with pytest.raises(ValueError, match="eps"):
        ops.poisson_nll_loss(x, x, False, False, math.inf, 1)
    with pytest.raises(ValueError, match="eps"):
        ops.gaussian_nll_loss(x, x, x, False, math.nan, 1)
    with pytest.raises(ValueError, match="var"):
        ops.gaussian_nll_loss(x, x, -x, False, 1e-6, 1)
    with pytest.raises(ValueError, match="reduction"):
        ops.poisson_nll_loss(x, x, True, False, 1e-8, 3)


# ---- autograd machinery --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,opts,reduction", CASES_AND_REDUCTIONS, ids=case_id)
def test_gradcheck_and_gradgradcheck(name, opts, reduction):
    gen = torch.Generator().manual_seed(14)
    ops, diff = make_operands(name, opts, (2, 3), torch.float64, gen, kinks=False)
    if name == GAUSS and "eps" in opts:
        ops[2] = ops[2] + 0.4  # finite differences across the clamp disagree with torch's pass-through gradient
    inputs = [o.requires_grad_(i in diff) for i, o in enumerate(ops)]

    def fn(*ts):
        return call(LF, name, opts, ts, reduction)

    assert torch.autograd.gradcheck(fn, inputs)
    if reduction != "sum":  # 'sum' differs from 'mean' by a constant only: spared to keep the file fast
        assert torch.autograd.gradgradcheck(fn, inputs)


def test_double_backward_matches_torch():
    """create_graph=True: the gradient is itself differentiable, and its gradient equals torch's."""
    gen = torch.Generator().manual_seed(18)
    for name, opts in CASES:
        ops, diff = make_operands(name, opts, (3, 4), torch.float64, gen, kinks=False)
        results = []
        for lib in (LF, F):
            leaves = [o.detach().clone().requires_grad_(i in diff) for i, o in enumerate(ops)]
            loss = call(lib, name, opts, leaves, "sum")
            grads = torch.autograd.grad(loss, [leaves[i] for i in diff], create_graph=True)
            results.append(torch.autograd.grad(sum((g * g).sum() for g in grads), [leaves[i] for i in diff]))
        for a, b in zip(*results):
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name,opts", CASES, ids=case_id)
def test_one_operand_requiring_grad(name, opts):
    """Gradients for one operand at a time (the backward ops' output_mask asks for that one only)."""
    gen = torch.Generator().manual_seed(20)
    ops, diff = make_operands(name, opts, (3, 4), torch.float32, gen)
    for i in diff:
        check_against_torch(name, opts, "none", ops, [i])


def test_second_backward_of_retained_graph():
    x = torch.rand(4, 5, dtype=torch.float64, requires_grad=True)
    t = torch.rand(4, 5, dtype=torch.float64, requires_grad=True)
    loss = LF.binary_cross_entropy(x, t)
    g1 = torch.autograd.grad(loss, [x, t], torch.tensor(2.0, dtype=torch.float64), retain_graph=True)
    g2 = torch.autograd.grad(loss, [x, t], torch.tensor(-0.5, dtype=torch.float64))
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a * -0.25, b)


def _op_cases():
    """(op, args) for every forward and backward op: expanded (stride 0) operands, weights, every reduction,
    partial masks."""
    gen = torch.Generator().manual_seed(16)
    x = (torch.rand(3, 4, generator=gen) * 0.9 + 0.05).requires_grad_()
    t = torch.rand(4, generator=gen).expand(3, 4).requires_grad_()  # a stride-0 (expanded) leaf
    w = torch.rand(4, generator=gen).expand(3, 4)
    pw = torch.rand(4, generator=gen).expand(3, 4) + 0.5
    v = (torch.rand(3, 1, generator=gen) + 0.1).expand(3, 4).requires_grad_()
    xd, td, vd = x.detach(), t.detach(), v.detach()
    g0, g1 = torch.rand(3, 4, generator=gen), torch.tensor(0.7)
    ops = torch.ops.lossfuse
    return [
        (ops.binary_cross_entropy, (x, t, w, 1)),
        (ops.binary_cross_entropy_with_logits, (x, t, w, pw, 2)),
        (ops.poisson_nll_loss, (x, t, False, True, 0.1, 0)),
        (ops.gaussian_nll_loss, (x, t, v, True, 0.3, 0)),
        (ops.binary_cross_entropy_backward, (g0, xd, td, None, 0, [False, True])),
        (ops.binary_cross_entropy_with_logits_backward, (g1, xd, td, w, pw, 1, [True, False])),
        (ops.poisson_nll_loss_backward, (g1, xd, td, True, True, 1e-8, 2, [True, True])),
        (ops.gaussian_nll_loss_backward, (g0, xd, td, vd, True, 0.3, 0, [False, True, True])),
    ]


@pytest.mark.parametrize("case", range(len(_op_cases())))
def test_opcheck(case):
    op, args = _op_cases()[case]
    torch.library.opcheck(op, args)


def test_torch_compile_training_step():
    """All four losses in one fullgraph-compiled forward (broadcast weights and var, a float var and mixed dtypes
    included); AOTAutograd compiles the backward from the ops' fake implementations and autograd registrations."""
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 8)
    ref_model = torch.nn.Linear(6, 8)
    ref_model.load_state_dict(model.state_dict())
    x = torch.randn(5, 6)
    t = torch.rand(5, 8)
    w = torch.rand(8) + 0.5
    counts = torch.randint(0, 5, (5, 8)).float()

    def forward(m, lib, x, t, w, counts):
        z = m(x)
        var = torch.nn.functional.softplus(z[:, :1])
        return (lib.binary_cross_entropy(torch.sigmoid(z), t, weight=w)
                + lib.binary_cross_entropy_with_logits(z, t, w, pos_weight=w * 2, reduction="sum")
                + lib.poisson_nll_loss(z, counts, full=True)
                + lib.gaussian_nll_loss(z, t, var, full=True) + lib.gaussian_nll_loss(z, t, 0.5)
                + lib.poisson_nll_loss(z.exp(), counts, log_input=False, reduction="none").sum(1).mean()
                + lib.poisson_nll_loss(z, counts.double()) + lib.gaussian_nll_loss(z.half(), t, var.double()))

    compiled = torch.compile(forward, fullgraph=True, backend="aot_eager")
    ours = compiled(model, LF, x, t, w, counts)
    ref = forward(ref_model, F, x, t, w, counts)
    ours.backward()
    ref.backward()
    torch.testing.assert_close(ours, ref)
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


# ---- modules -------------------------------------------------------------------------------------------------------

MODULES = [
    ("BCELoss", {}), ("BCELoss", {"weight": torch.rand(5) + 0.5, "reduction": "sum"}),
    ("BCEWithLogitsLoss", {"pos_weight": torch.rand(5) + 0.5}),
    ("BCEWithLogitsLoss", {"weight": torch.rand(4, 1), "reduction": "none"}),
    ("PoissonNLLLoss", {}), ("PoissonNLLLoss", {"log_input": False, "full": True, "eps": 1e-3, "reduction": "sum"}),
    ("GaussianNLLLoss", {}), ("GaussianNLLLoss", {"full": True, "eps": 0.2, "reduction": "none"}),
]


@pytest.mark.parametrize("cls,kwargs", MODULES, ids=lambda v: v if isinstance(v, str) else ",".join(v))
def test_modules_match_torch(cls, kwargs):
    ours, theirs = getattr(lossfuse.nn, cls)(**kwargs), getattr(torch.nn, cls)(**kwargs)
    assert isinstance(ours, getattr(torch.nn, cls))
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    gen = torch.Generator().manual_seed(19)
    x = torch.rand(4, 5, generator=gen, dtype=torch.float64).requires_grad_()
    t = torch.rand(4, 5, generator=gen, dtype=torch.float64)
    args = (x, t, torch.rand(4, 1, generator=gen, dtype=torch.float64) + 0.1) if cls == "GaussianNLLLoss" else (x, t)
    ours_loss = ours.double()(*args)
    theirs_loss = theirs.double()(*args)
    torch.testing.assert_close(ours_loss, theirs_loss)
    torch.testing.assert_close(torch.autograd.grad(ours_loss.sum(), x)[0], torch.autograd.grad(theirs_loss.sum(), x)[0])
