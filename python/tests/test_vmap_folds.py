"""vmap's fold rules (python/lossfuse/_vmap.py): the elementwise losses, cross_entropy, nll_loss and their backward
ops take a mapped dim as more elements or rows of one kernel call. Each op is checked two ways:
- at the op level, vmap of the op against the loop rule's definition (the op called on each entry in turn): every
  reduction, weights, ignored rows and a sample whose rows are all ignored, unmapped operands, 16-bit dtypes;
- at the functional level, vmap and vmap(grad) of lossfuse's function against torch's own vmap of torch's function.
And the cases a fold leaves to the loop (mapped class weights, three-dim samples, operands of different per-sample
shapes) still give each entry's result."""

import pytest
import torch
import torch.nn.functional as F

import lossfuse  # noqa: F401  (registers the ops and their vmap rules)
import lossfuse.nn.functional as LF

lib = torch.ops.lossfuse
vmap = torch.func.vmap
B = 3


def _loop(op, in_dims, args):
    n = next(a.shape[d] for a, d in zip(args, in_dims) if d is not None)
    outs = [op(*[a.select(d, i) if d is not None else a for a, d in zip(args, in_dims)]) for i in range(n)]
    if isinstance(outs[0], (tuple, list)):
        return tuple(torch.stack([o[k] for o in outs]) for k in range(len(outs[0])))
    return torch.stack(outs)


def _tol(dtype):
    return {torch.float64: dict(rtol=1e-12, atol=1e-12), torch.float32: dict(rtol=2e-6, atol=2e-6)}.get(
        dtype, dict(rtol=8e-3, atol=8e-3))


def _same(ours, ref, dtype, msg):
    ours = ours if isinstance(ours, tuple) else (ours,)
    ref = ref if isinstance(ref, tuple) else (ref,)
    assert len(ours) == len(ref), msg
    for k, (a, b) in enumerate(zip(ours, ref)):
        assert a.shape == b.shape and a.dtype == b.dtype, (msg, k, a.shape, b.shape, a.dtype, b.dtype)
        torch.testing.assert_close(a, b, equal_nan=True, **_tol(dtype), msg=lambda m: f"{msg} output {k}: {m}")


def _check_op(op, args, in_dims, dtype, msg):
    ours = vmap(lambda *a: op(*a), in_dims=tuple(in_dims))(*args)
    _same(ours, _loop(op, in_dims, args), dtype, msg)


# ---- elementwise ops -----------------------------------------------------------------------------------------------

def _elementwise_cases(dtype, g):
    """name: (tensor operands of one entry's shape (5, 4), batched (B, 5, 4); scalar arguments after reduction)."""
    r = lambda: torch.randn(B, 5, 4, generator=g, dtype=dtype)  # noqa: E731
    p = lambda: torch.rand(B, 5, 4, generator=g, dtype=dtype) * 0.9 + 0.05  # noqa: E731
    s = lambda: (torch.randint(0, 2, (B, 5, 4), generator=g) * 2 - 1).to(dtype)  # noqa: E731
    w = torch.rand(B, 5, 4, generator=g, dtype=dtype)
    return {
        "mse_loss": ([r(), r(), w], []), "l1_loss": ([r(), r(), w], []), "smooth_l1_loss": ([r(), r()], [0.5]),
        "huber_loss": ([r(), r(), w], [0.7]), "kl_div": ([r().log_softmax(-1), p()], [False]),
        "hinge_embedding_loss": ([r(), s()], [0.5]), "margin_ranking_loss": ([r(), r(), s()], [0.2]),
        "binary_cross_entropy": ([p(), p(), w], []), "binary_cross_entropy_with_logits": ([r(), p(), w, w + 0.5], []),
        "poisson_nll_loss": ([r(), p() * 3], [True, True, 1e-8]), "gaussian_nll_loss": ([r(), r(), p()], [True, 1e-6]),
    }


def _elementwise_args(name, tensors, extra, reduction, batchmean=False):
    """The op's positional arguments: operands, then reduction and the scalars in schema order."""
    if name == "kl_div":
        return [*tensors, reduction, batchmean, *extra]
    if name in ("hinge_embedding_loss", "margin_ranking_loss", "poisson_nll_loss", "gaussian_nll_loss"):
        return [*tensors, *extra, reduction]
    return [*tensors, reduction, *extra]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(_elementwise_cases(torch.float32, torch.Generator()).keys()))
def test_elementwise_folds_equal_the_loop(name, dtype):
    g = torch.Generator().manual_seed(3)
    tensors, extra = _elementwise_cases(dtype, g)[name]
    op, backward = getattr(lib, name).default, getattr(lib, name + "_backward").default
    n_out = len(backward._schema.returns)
    variants = [(r, False) for r in (0, 1, 2)] + ([(1, True)] if name == "kl_div" else [])
    for reduction, batchmean in variants:
        for shared in (None, 1):  # every operand mapped, or the second one shared (unmapped)
            ts = [t if i != shared else t[0] for i, t in enumerate(tensors)]
            args = _elementwise_args(name, ts, extra, reduction, batchmean)
            dims = [None if i == shared or not isinstance(a, torch.Tensor) else 0 for i, a in enumerate(args)]
            msg = f"{name} reduction {reduction} batchmean {batchmean} shared {shared}"
            _check_op(op, args, dims, dtype, msg)
            loss = vmap(op, in_dims=tuple(dims))(*args)
            go = torch.randn(loss.shape, generator=g, dtype=loss.dtype)
            mask = [True] * n_out if n_out > 1 else None
            bargs = [go, *args] + ([mask] if mask else [])
            _check_op(backward, bargs, [0, *dims] + ([None] if mask else []), dtype, msg + " backward")
            if reduction:  # an unmapped upstream gradient (the same for every entry)
                _check_op(backward, [go[0], *bargs[1:]], [None, *dims] + ([None] if mask else []), dtype,
                          msg + " backward, shared upstream")


def test_elementwise_fold_weighted_mean_of_zero_weight_and_empty_entries():
    # mse_loss's weighted mean divides by the entry's weight sum: 0 there gives what the op gives alone (NaN or
    # inf); entries of no element give torch's mean of nothing (NaN).
    x, y = torch.randn(B, 4, dtype=torch.float64), torch.randn(B, 4, dtype=torch.float64)
    w = torch.rand(B, 4, dtype=torch.float64)
    w[1] = 0
    w[2] = torch.tensor([1.0, -1.0, 0.5, -0.5], dtype=torch.float64)
    for op in (lib.mse_loss.default, lib.l1_loss.default):
        _check_op(op, [x, y, w, 1], [0, 0, 0, None], torch.float64, "zero weight sum")
        _check_op(op, [x[:, :0], y[:, :0], None, 1], [0, 0, None, None], torch.float64, "empty entries")
        go = torch.ones(B, dtype=torch.float64)
        _check_op(getattr(lib, op._schema.name.split("::")[1] + "_backward").default,
                  [go, x, y, w, 1, [True, True]], [0, 0, 0, 0, None, None], torch.float64, "zero weight sum backward")


# ---- cross_entropy and nll_loss --------------------------------------------------------------------------------------

def _class_cases(dtype, g, per_sample):
    """(input, hard target, soft target) batched: per-sample input (C) or (N, C); entry 1's rows are all ignored, and
    (N, C) entries have one more ignored row."""
    c = 7
    x = torch.randn(B, *per_sample, c, generator=g, dtype=dtype)
    t = torch.randint(0, c, (B, *per_sample), generator=g)
    t[1] = -100
    if per_sample:
        t[2, 0] = -100
    soft = torch.rand(B, *per_sample, c, generator=g, dtype=dtype).softmax(-1)
    return x, t, soft


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("per_sample", [(), (5,)], ids=["C", "NxC"])
def test_cross_entropy_and_nll_folds_equal_the_loop(per_sample, dtype):
    g = torch.Generator().manual_seed(4)
    x, t, soft = _class_cases(dtype, g, per_sample)
    w = torch.rand(7, generator=g, dtype=dtype)
    w[t[0].reshape(-1)[0]] = 0  # a zero weight on a row that is not ignored
    options = [(0.0, 1.0, 0.0, 0.0), (0.2, 1.0, 0.0, 0.0), (0.1, 0.5, 3.0, 1e-2)]  # smoothing, scale, softcap, z
    for reduction in (0, 1, 2):
        for target, weight in ((t, None), (t, w), (soft, None), (soft, w)):
            for opts in options:
                for compute_grad in (False, True):
                    args = [x, target, weight, reduction, -100, *opts, compute_grad]
                    msg = f"cross_entropy {reduction} weight {weight is not None} soft {target is soft} {opts} " \
                          f"grad {compute_grad}"
                    _check_op(lib.cross_entropy.default, args, [0, 0, None] + [None] * 7, dtype, msg)
                    # lse is per row: the backward op's per-row input, mapped; the upstream gradient mapped or not
                    lse = vmap(lib.cross_entropy.default, in_dims=(0, 0) + (None,) * 8)(*args)[1]
                    loss = vmap(lib.cross_entropy.default, in_dims=(0, 0) + (None,) * 8)(*args)[0]
                    go = torch.rand(loss.shape, generator=g, dtype=loss.dtype)
                    bargs = [go, x, target, lse, weight, reduction, -100, *opts]
                    _check_op(lib.cross_entropy_backward.default, bargs, [0, 0, 0, 0] + [None] * 7, dtype,
                              msg + " backward")
                    if reduction:
                        _check_op(lib.cross_entropy_backward.default, [go[0], *bargs[1:]],
                                  [None, 0, 0, 0] + [None] * 7, dtype, msg + " backward, shared upstream")
            if target is t:
                logp = x.float().log_softmax(-1).to(dtype)
                args = [logp, t, weight, reduction, -100]
                _check_op(lib.nll_loss.default, args, [0, 0, None, None, None], dtype, f"nll {reduction}")
                loss = vmap(lib.nll_loss.default, in_dims=(0, 0, None, None, None))(*args)
                go = torch.rand(loss.shape, generator=g, dtype=loss.dtype)
                _check_op(lib.nll_loss_backward.default, [go, *args], [0, 0, 0, None, None, None], dtype,
                          f"nll {reduction} backward")


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_cross_entropy_fold_of_a_sample_whose_target_weights_sum_to_zero(eps):
    """A sample's kept rows all weigh 0: torch's mean of it is NaN (0/0, plus s/0 with label smoothing, not inf),
    and so is its gradient; the other samples keep theirs. vmap and vmap(grad) against torch on each sample."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(3, 4, 5, generator=g, dtype=torch.float64)
    t = torch.tensor([[0, 1, -100, 0], [2, 3, 4, 2], [-100] * 4])
    w = torch.tensor([0.0, 0.0, 1.0, 2.0, 3.0], dtype=torch.float64)

    def ours(a, b):
        return LF.cross_entropy(a, b, weight=w, label_smoothing=eps)

    def theirs(a, b):
        return F.cross_entropy(a, b, weight=w, label_smoothing=eps)

    want = torch.stack([theirs(x[i], t[i]) for i in range(3)])
    assert torch.isnan(want[0]) and torch.isfinite(want[1])
    torch.testing.assert_close(vmap(ours)(x, t), want, equal_nan=True)
    want_grad = torch.stack([torch.func.grad(theirs)(x[i], t[i]) for i in range(3)])
    torch.testing.assert_close(vmap(torch.func.grad(ours))(x, t), want_grad, equal_nan=True)


def _row_cases(dtype, g, per_sample):
    """name: (tensor operands batched (B, *per_sample, F) or per row (B, *per_sample), scalar arguments before the
    reduction, a shared class weight or None)."""
    f = 6
    r = lambda: torch.randn(B, *per_sample, f, generator=g, dtype=dtype)  # noqa: E731
    classes = torch.randint(0, f, (B, *per_sample), generator=g)
    labels = torch.randint(-1, f, (B, *per_sample, f), generator=g)  # -1 ends each row's label list
    signs = (torch.randint(0, 2, (B, *per_sample), generator=g) * 2 - 1).to(dtype)
    w = torch.rand(f, generator=g, dtype=dtype) + 0.5
    return {
        "multi_margin_loss": ([r(), classes], [w, 2, 0.7]),
        "multilabel_margin_loss": ([r(), labels], []),
        "multilabel_soft_margin_loss": ([r(), torch.rand(B, *per_sample, f, generator=g, dtype=dtype)], [w]),
        "triplet_margin_loss": ([r(), r(), r()], [1.0, 2.0, 1e-6, True]),
        "cosine_embedding_loss": ([r(), r(), signs], [0.2]),
    }


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("per_sample", [(), (5,)], ids=["F", "NxF"])
def test_row_folds_equal_the_loop(per_sample, dtype):
    """The margin losses fold each sample's rows into one call: forward and backward ops, every reduction, every
    output mask, against the op on each entry in turn."""
    g = torch.Generator().manual_seed(21)
    for name, (tensors, scalars) in _row_cases(dtype, g, per_sample).items():
        op, bop = getattr(lib, name).default, getattr(lib, name + "_backward").default
        masks = {"triplet_margin_loss": [[True, True, True], [False, True, False]],
                 "cosine_embedding_loss": [[True, True], [True, False]],
                 "multilabel_soft_margin_loss": [[True, True], [False, True]]}.get(name, [None])
        nd = len(tensors)
        # multi_margin and multilabel_soft_margin take their weight after the tensors; the rest take scalars only
        weighted = name in ("multi_margin_loss", "multilabel_soft_margin_loss")
        for weight in ([scalars[0], None] if weighted else [None]):
            extra = ([weight] if weighted else []) + (scalars[1:] if weighted else scalars)
            for reduction in (0, 1, 2):
                args = [*tensors, *extra, reduction]
                dims = [0] * nd + [None] * (len(args) - nd)
                msg = f"{name} reduction {reduction} weight {weight is not None}"
                _check_op(op, args, dims, dtype, msg)
                loss = vmap(lambda *a: op(*a), in_dims=tuple(dims))(*args)
                go = torch.rand(loss.shape, generator=g, dtype=loss.dtype)
                for mask in masks:
                    bargs = [go, *args] + ([mask] if mask is not None else [])
                    _check_op(bop, bargs, [0] + dims + ([None] if mask is not None else []), dtype,
                              f"{msg} backward {mask}")
                    if reduction:
                        _check_op(bop, [go[0], *bargs[1:]], [None] + dims + ([None] if mask is not None else []),
                                  dtype, f"{msg} backward, shared upstream")


def test_row_folds_leave_what_they_do_not_cover_to_the_loop():
    # a mapped class weight and three-dim samples go to the loop; an unmapped operand folds (expanded)
    g = torch.Generator().manual_seed(22)
    x = torch.randn(B, 4, 6, generator=g, dtype=torch.float64)
    t = torch.randint(0, 6, (B, 4), generator=g)
    w = torch.rand(B, 6, generator=g, dtype=torch.float64) + 0.5
    _check_op(lib.multi_margin_loss.default, [x, t, w, 1, 1.0, 1], [0, 0, 0, None, None, None], torch.float64,
              "mapped weight")
    x2 = torch.randn(4, 6, generator=g, dtype=torch.float64)
    s = (torch.randint(0, 2, (B, 4), generator=g) * 2 - 1).double()
    _check_op(lib.cosine_embedding_loss.default, [x, x2, s, 0.1, 0], [0, None, 0, None, None], torch.float64,
              "unmapped operand")
    x3 = torch.randn(B, 2, 4, 6, generator=g, dtype=torch.float64)
    _check_op(lib.triplet_margin_loss.default, [x3, x3 + 1, x3 - 1, 1.0, 2.0, 1e-6, False, 2], [0, 0, 0] + [None] * 5,
              torch.float64, "three-dim samples")


def test_class_folds_leave_what_they_do_not_cover_to_the_loop():
    # mapped class weights, (N, C, d) samples, targets of another per-sample shape: each entry as the op gives it
    # (the last one is the op's own shape error)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(B, 4, 5, 2, generator=g, dtype=torch.float64)
    t = torch.randint(0, 5, (B, 4, 2), generator=g)
    w = torch.rand(B, 5, generator=g, dtype=torch.float64)
    ce = lib.cross_entropy.default
    _check_op(ce, [x, t, None, 1, -100, 0.0, 1.0, 0.0, 0.0, True], [0, 0] + [None] * 8, torch.float64, "NxCxd")
    _check_op(ce, [x[..., 0], t[..., 0], w, 1, -100, 0.0, 1.0, 0.0, 0.0, True], [0, 0, 0] + [None] * 7,
              torch.float64, "mapped weight")
    with pytest.raises(ValueError, match="target"):
        vmap(ce, in_dims=(0, 0) + (None,) * 8)(x[..., 0], t, None, 1, -100, 0.0, 1.0, 0.0, 0.0, False)


# ---- the functions, entry by entry against torch ----------------------------------------------------------------

@pytest.mark.filterwarnings("ignore:reduction. 'mean' divides the total loss")  # kl_div's, as torch's
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_functions_under_vmap_and_per_sample_grad_equal_torch(reduction):
    g = torch.Generator().manual_seed(9)
    x = torch.randn(B, 5, 7, generator=g, dtype=torch.float64)
    t = torch.randint(0, 7, (B, 5), generator=g)
    t[1] = -100
    t[2, 1] = -100
    w = torch.rand(7, generator=g, dtype=torch.float64) + 0.1
    y = torch.randn(B, 5, 7, generator=g, dtype=torch.float64)
    p = torch.rand(B, 5, 7, generator=g, dtype=torch.float64) * 0.9 + 0.05
    cases = [
        ("cross_entropy", (x, t), dict(weight=w, label_smoothing=0.1)),
        ("cross_entropy", (x[:, 0], t[:, 0]), dict(weight=w)),
        ("cross_entropy", (x, y.softmax(-1)), dict(label_smoothing=0.2)),
        ("nll_loss", (x.log_softmax(-1), t), dict(weight=w)),
        ("mse_loss", (x, y), {}), ("huber_loss", (x, y), dict(delta=0.5)),
        ("binary_cross_entropy", (p, p.flip(0)), dict(weight=w)),
        ("binary_cross_entropy_with_logits", (x, p), dict(pos_weight=w)),
        ("kl_div", (x.log_softmax(-1), p), dict(log_target=False)),
        ("poisson_nll_loss", (x, p), dict(full=True)),  # (torch vmaps no gaussian_nll_loss: its var check)
    ]
    for name, operands, kw in cases:
        ours_fn, torch_fn = (lambda f: lambda *a: f(*a, reduction=reduction, **kw))(getattr(LF, name)), \
            (lambda f: lambda *a: f(*a, reduction=reduction, **kw))(getattr(F, name))
        msg = f"{name} {reduction} {[tuple(o.shape) for o in operands]}"
        # torch's reference: its function on each entry in turn (torch's own vmap refuses some of these cases)
        entries = [[o[i] for o in operands] for i in range(B)]
        theirs = torch.stack([torch_fn(*e) for e in entries])
        torch.testing.assert_close(vmap(ours_fn)(*operands), theirs, equal_nan=True, msg=msg)
        if reduction == "none":
            continue
        wanted = tuple(i for i, o in enumerate(operands) if o.is_floating_point())
        ours = vmap(torch.func.grad(ours_fn, argnums=wanted))(*operands)
        for k, i in enumerate(wanted):
            grads = []
            for e in entries:
                e = [o.clone().requires_grad_(j in wanted) for j, o in enumerate(e)]
                grads.append(torch.autograd.grad(torch_fn(*e), [e[j] for j in wanted])[k])
            torch.testing.assert_close(ours[k], torch.stack(grads), equal_nan=True, msg=f"{msg} grad of {i}")


@pytest.mark.parametrize("name", ["mse_loss", "huber_loss", "binary_cross_entropy_with_logits"])
def test_elementwise_fold_traces_symbolic_sample_shapes(name):
    """Under torch.compile(dynamic=True) the per-sample shapes hold SymInts, which do not hash: the fold compares
    them pairwise (a set of them raised inside the trace)."""
    torch._dynamo.reset()
    f = getattr(LF, name)
    compiled = torch.compile(lambda a, b: torch.func.vmap(f)(a, b), fullgraph=True, dynamic=True)
    for n in (4, 6):
        a, b = torch.randn(3, n, 5, dtype=torch.float64), torch.rand(3, n, 5, dtype=torch.float64)
        torch.testing.assert_close(compiled(a, b), torch.func.vmap(getattr(F, name))(a, b))


def test_folds_read_targets_as_the_kernels_do():
    # the kernels compare class indices with ignore_index as 64-bit integers: a uint8 class 156 is not -100, nor is
    # an int32 class 44 the ignore_index 300 (as the mean's divisor and its gradient's rows must agree)
    g = torch.Generator().manual_seed(12)
    x = torch.randn(B, 3, 300, generator=g, dtype=torch.float64)
    for dtype, cls, ignore in ((torch.uint8, 156, -100), (torch.int32, 44, 300), (torch.uint8, 255, -1)):
        t = torch.randint(0, 200, (B, 3), generator=g).to(dtype)
        t[:, 0] = cls
        for reduction in (1, 2):
            args = [x, t, None, reduction, ignore, 0.1, 1.0, 0.0, 0.0, True]
            _check_op(lib.cross_entropy.default, args, [0, 0] + [None] * 8, torch.float64, f"{dtype} {ignore}")
            logp = x.log_softmax(-1)
            _check_op(lib.nll_loss.default, [logp, t, None, reduction, ignore], [0, 0, None, None, None],
                      torch.float64, f"nll {dtype} {ignore}")
        fn = lambda a, b: LF.cross_entropy(a, b, ignore_index=ignore)  # noqa: E731
        ref = torch.stack([torch.func.grad(fn)(x[i], t[i]) for i in range(B)])
        torch.testing.assert_close(vmap(torch.func.grad(fn))(x, t), ref)


def test_folds_of_samples_at_the_dims_limit_and_masked_gradients():
    # samples of 8 dims (the kernels' limit, which the mapped dim would pass) are left to the loop; a gradient the
    # output_mask leaves out is (n, 0), as the loop stacks it, so vmap over vmap(grad) works
    x = torch.randn(2, 1, 1, 1, 1, 1, 1, 2, 3, dtype=torch.float64)
    y = torch.randn_like(x)
    torch.testing.assert_close(vmap(LF.mse_loss)(x, y), torch.stack([LF.mse_loss(x[i], y[i]) for i in range(2)]))
    torch.testing.assert_close(vmap(vmap(LF.l1_loss))(x, y),
                               torch.stack([torch.stack([LF.l1_loss(x[i, j], y[i, j]) for j in range(1)])
                                            for i in range(2)]))
    a, b = torch.randn(2, 3, 5, 4, dtype=torch.float64), torch.randn(2, 3, 5, 4, dtype=torch.float64)
    for name in ("mse_loss", "huber_loss", "binary_cross_entropy_with_logits", "margin_ranking_loss"):
        ours_fn, torch_fn = getattr(LF, name), getattr(F, name)
        operands = (a, b.sigmoid()) if "logits" in name else (a, b) if name != "margin_ranking_loss" else \
            (a, b, b.sign())
        ours = vmap(vmap(torch.func.grad(ours_fn)))(*operands)
        theirs = vmap(vmap(torch.func.grad(torch_fn)))(*operands)
        torch.testing.assert_close(ours, theirs, msg=name)
    go = torch.ones(2, dtype=torch.float64)
    _check_op(lib.mse_loss_backward.default, [go, a[:, 0], b[:, 0], None, 1, [True, False]],
              [0, 0, 0, None, None, None], torch.float64, "masked gradient")


def test_folds_leave_bad_arguments_to_the_op():
    # a reduction outside 0..2, kl_div's batchmean with another reduction, an lse or upstream gradient of the wrong
    # shape: the op's own error, as without vmap
    g = torch.Generator().manual_seed(13)
    x = torch.randn(B, 4, 5, generator=g, dtype=torch.float64)
    y = torch.randn(B, 4, 5, generator=g, dtype=torch.float64)
    t = torch.randint(0, 5, (B, 4), generator=g)
    cases = [
        (lib.mse_loss.default, [x, y, None, 3], [0, 0, None, None]),
        (lib.kl_div.default, [x, y, 2, True, False], [0, 0, None, None, None]),
        (lib.cross_entropy.default, [x, t, None, 5, -100, 0.0, 1.0, 0.0, 0.0, False], [0, 0] + [None] * 8),
        (lib.cross_entropy_backward.default,
         [torch.ones(B, dtype=torch.float64), x, t, torch.zeros(B, 2, 2, dtype=torch.float64), None, 1, -100, 0.0,
          1.0, 0.0, 0.0], [0, 0, 0, 0] + [None] * 7),
        (lib.mse_loss_backward.default, [torch.ones(B, 2, 2, dtype=torch.float64), x, y, None, 0, [True, True]],
         [0, 0, 0, None, None, None]),
    ]
    for op, args, dims in cases:
        with pytest.raises((ValueError, RuntimeError)) as looped:
            _loop(op, dims, args)
        with pytest.raises(type(looped.value)):
            vmap(lambda *a: op(*a), in_dims=tuple(dims))(*args)
