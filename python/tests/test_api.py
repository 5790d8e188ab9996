"""The package's surface: torch-compatible signatures and modules, patch_torch, threads and the OpenMP runtime."""

import inspect
import os
import random
import types

import pytest
import torch
import torch.nn.functional as F

import lossfuse
import lossfuse.nn.functional as LF

# Every loss of torch.nn.functional that lossfuse's catalog covers.
TORCH_LOSSES = [
    "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
    "binary_cross_entropy_with_logits", "kl_div", "poisson_nll_loss", "gaussian_nll_loss", "hinge_embedding_loss",
    "margin_ranking_loss", "triplet_margin_loss", "cosine_embedding_loss", "multi_margin_loss",
    "multilabel_margin_loss", "multilabel_soft_margin_loss", "ctc_loss", "linear_cross_entropy",
]
TORCH_MODULES = [
    "CrossEntropyLoss", "NLLLoss", "MSELoss", "L1Loss", "SmoothL1Loss", "HuberLoss", "BCELoss", "BCEWithLogitsLoss",
    "KLDivLoss", "PoissonNLLLoss", "GaussianNLLLoss", "HingeEmbeddingLoss", "MarginRankingLoss",
    "TripletMarginLoss", "CosineEmbeddingLoss", "MultiMarginLoss", "MultiLabelMarginLoss",
    "MultiLabelSoftMarginLoss", "CTCLoss", "LinearCrossEntropyLoss",
]


@pytest.mark.parametrize("name", TORCH_LOSSES)
def test_functional_signature_matches_torch(name):
    assert name in LF.__all__, f"lossfuse.nn.functional lacks {name}"
    if not hasattr(F, name):
        pytest.skip(f"this torch ({torch.__version__}) has no {name} to compare with")
    ours = inspect.signature(getattr(LF, name)).parameters
    theirs = inspect.signature(getattr(F, name)).parameters
    ours_list = list(ours.values())
    for i, p in enumerate(theirs.values()):
        q = ours_list[i]
        assert (q.name, q.kind, q.default) == (p.name, p.kind, p.default), f"{name}: parameter {i}: {q} vs {p}"
    for q in ours_list[len(theirs):]:
        assert q.kind == inspect.Parameter.KEYWORD_ONLY, f"{name}: extra parameter {q.name} must be keyword-only"
        assert q.default is not inspect.Parameter.empty, f"{name}: extra parameter {q.name} needs a default"


@pytest.mark.parametrize("name", TORCH_MODULES)
def test_modules_subclass_torch(name):
    assert name in lossfuse.nn.__all__, f"lossfuse.nn lacks {name}"
    cls = getattr(lossfuse.nn, name)
    # torch < 2.13 has no LinearCrossEntropyLoss: lossfuse's is then a weighted loss module of its own
    assert issubclass(cls, getattr(torch.nn, name, torch.nn.modules.loss._WeightedLoss))


def test_patch_torch_keeps_forward_mode_of_cross_entropy():
    """The mean of a smoothed cross-entropy composes torch's nll_loss for its tangent: torch's own, not the patched
    one (which, called inside that composition's forward-mode level, raised NotImplementedError)."""
    x = torch.randn(4, 5, dtype=torch.float64)
    v, y = torch.randn_like(x), torch.tensor([0, 2, 1, 4])
    crit = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    want = torch.func.jvp(lambda a: crit(a, y), (x,), (v,))
    lossfuse.patch_torch()
    try:
        got = torch.func.jvp(lambda a: crit(a, y), (x,), (v,))
        got_z = torch.func.jvp(lambda a: LF.cross_entropy(a, y, z_loss_scale=0.0, label_smoothing=0.1), (x,), (v,))
    finally:
        lossfuse.unpatch_torch()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_z, want)


def test_patch_torch_routes_and_restores():
    original = F.cross_entropy
    try:
        names = lossfuse.patch_torch()
        assert "cross_entropy" in names and F.cross_entropy.__wrapped__ is LF.cross_entropy.__wrapped__
        lossfuse.patch_torch()  # twice is harmless
        x = torch.randn(4, 10, requires_grad=True)
        t = torch.tensor([1, 2, 3, 4])
        loss = torch.nn.CrossEntropyLoss()(x, t)  # the module calls the patched function
        assert "lossfuse" in loss.grad_fn.name()  # the C++ node of the eager training path
        loss.backward()  # double backward in lossfuse uses torch's own function, never the patched one
        x2 = x.detach().double().requires_grad_()
        g, = torch.autograd.grad(F.cross_entropy(x2, t), x2, create_graph=True)
        g.sum().backward()
    finally:
        lossfuse.unpatch_torch()
    assert F.cross_entropy is original


class _Overriding(torch.Tensor):
    """A subclass overriding __torch_function__: it answers mse_loss itself."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is F.mse_loss:
            return torch.tensor(42.0)
        return super().__torch_function__(func, types, args, kwargs or {})


class _Plain(torch.Tensor):
    pass


class _Recording(torch.overrides.TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(getattr(func, "__name__", ""))
        return func(*args, **(kwargs or {}))


def test_patch_torch_leaves_overrides_subclasses_and_other_devices_to_torch(monkeypatch):
    """Patched functions keep torch's __torch_function__ protocol (subclass overrides, torch.fx tracing, modes) and
    leave tensor subclasses and tensors on devices lossfuse has no kernels for to torch's own function."""
    a, b = torch.randn(3), torch.randn(3)
    x, t = torch.randn(4, 5, requires_grad=True), torch.tensor([0, 1, 2, 3])
    try:
        lossfuse.patch_torch()
        assert F.mse_loss(a.as_subclass(_Overriding), b.as_subclass(_Overriding)).item() == 42.0
        plain = a.as_subclass(_Plain).requires_grad_()
        node = F.mse_loss(plain, b.as_subclass(_Plain)).grad_fn  # the result's as_subclass, then the loss's node
        assert node.name() == "AliasBackward0" and node.next_functions[0][0].name() == "MseLossBackward0"  # torch's
        traced = torch.fx.symbolic_trace(lambda u, v: F.mse_loss(u, v))
        torch.testing.assert_close(traced(a, b), F.mse_loss(a, b))
        mode = _Recording()
        with mode:
            loss = F.cross_entropy(x, t)
        assert "cross_entropy" in mode.names and "lossfuse" in loss.grad_fn.name()  # the mode saw it; lossfuse ran
        assert "lossfuse" in F.mse_loss(a.requires_grad_(), b).grad_fn.name()
        # as if the CPU were a device lossfuse lacks
        monkeypatch.setattr(lossfuse._patch, "devices", lambda name: ("meta",))
        assert F.mse_loss(a, b).grad_fn.name() == "MseLossBackward0"
        assert F.cross_entropy(x, t).grad_fn.name() == "NllLossBackward0"
    finally:
        lossfuse.unpatch_torch()


class _Answering(torch.Tensor):
    """A subclass answering every call with the called function's name."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return getattr(func, "__name__", None)


def test_functions_follow_the_torch_function_protocol():
    """Every lossfuse.nn.functional function hands a call with an overriding operand (a subclass, a torch.fx proxy)
    or under a torch function mode to the override, as torch.nn.functional's do: torch.fx traces a model holding
    lossfuse's loss modules."""
    for name in LF.__all__:
        fn = getattr(LF, name)
        required = [p for p in inspect.signature(fn).parameters.values()
                    if p.default is inspect.Parameter.empty and p.kind is p.POSITIONAL_OR_KEYWORD]
        operand = torch.zeros(2).as_subclass(_Answering)
        assert fn(*[operand] * len(required)) == name, name

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 5)
            self.crit = lossfuse.nn.CrossEntropyLoss(label_smoothing=0.1)

        def forward(self, x, y):
            return self.crit(self.lin(x), y) + LF.mse_loss(x, 2 * x)

    model = Model()
    traced = torch.fx.symbolic_trace(model)
    targets = {n.target for n in traced.graph.nodes if n.op == "call_function"}
    assert LF.cross_entropy in targets and LF.mse_loss in targets
    x, y = torch.randn(6, 4), torch.randint(0, 5, (6,))
    torch.testing.assert_close(traced(x, y), model(x, y))


class _Deferring(torch.Tensor):
    """A subclass whose __torch_function__ defers to torch's default."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


def test_protocol_under_compile_and_tracing():
    """torch.compile(fullgraph=True) of a loss of a subclass deferring to torch's default traces (the protocol's
    inner call re-entered handle_torch_function under Dynamo); patched, the fake tensors of non-strict export and
    make_fx stay with lossfuse's op (they went to torch's kernels)."""
    x, t = torch.randn(4, 5), torch.tensor([0, 4, 2, 1])
    got = torch.compile(lambda u: LF.mse_loss(u, 2 * u), backend="aot_eager", fullgraph=True)(x.as_subclass(_Deferring))
    assert type(got) is _Deferring
    torch.testing.assert_close(got.as_subclass(torch.Tensor), F.mse_loss(x, 2 * x))

    class Loss(torch.nn.Module):
        def forward(self, u, v):
            return F.cross_entropy(u, v)

    try:
        lossfuse.patch_torch()
        graphs = [torch.export.export(Loss(), (x, t), strict=False).graph,
                  torch.fx.experimental.proxy_tensor.make_fx(Loss(), tracing_mode="fake")(x, t).graph]
    finally:
        lossfuse.unpatch_torch()
    for graph in graphs:
        assert any("lossfuse.cross_entropy" in str(n.target) for n in graph.nodes), graph


def test_warnings_name_the_caller():
    """lossfuse's warnings (as torch's) are attributed to the line that called the loss, directly or patched."""
    x, t = torch.randn(3, 4), torch.randn(4)
    calls = [lambda: LF.mse_loss(x, t), lambda: LF.kl_div(x, x),
             lambda: LF.linear_cross_entropy(x, torch.randn(5, 4), torch.rand(3, 5))]
    for call in calls:
        with pytest.warns(UserWarning) as record:
            call()
        assert record[0].filename == __file__
    try:
        lossfuse.patch_torch()
        with pytest.warns(UserWarning, match="target size") as record:
            F.mse_loss(x, t)
        assert record[0].filename == __file__
    finally:
        lossfuse.unpatch_torch()


def test_results_identical_for_any_torch_thread_count():
    torch.manual_seed(0)
    x = torch.randn(512, 3000, requires_grad=True)
    t = torch.randint(0, 3000, (512,))
    before = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            loss = LF.cross_entropy(x, t, label_smoothing=0.1)
            results.append((loss.detach(), torch.autograd.grad(loss, x)[0]))
    finally:
        torch.set_num_threads(before)
    for loss, grad in results[1:]:
        assert torch.equal(loss, results[0][0]) and torch.equal(grad, results[0][1])


def test_kernels_spread_over_torch_threads():
    before = torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            assert torch.ops.lossfuse._parallel_threads(64) == n
    finally:
        torch.set_num_threads(before)


def _openmp_runtimes():
    names = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            base = os.path.basename(path)
            if base.startswith(("libgomp", "libiomp", "libomp")):
                names.add(os.path.realpath(path))
    return names


def test_one_openmp_runtime():
    LF.cross_entropy(torch.randn(64, 1000), torch.randint(0, 1000, (64,)))
    assert len(_openmp_runtimes()) <= 1, _openmp_runtimes()


def _lossfuse_node(t):
    """The name of the first lossfuse autograd node in t's graph."""
    todo = [t.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None:
            if "lossfuse" in type(node).__name__:
                return type(node).__name__
            todo.extend(n for n, _ in node.next_functions)
    return None


def test_eager_fast_path_takes_parameters_and_leaves_tracers_to_the_op():
    """Plain eager calls (parameters included) run lossfuse's own autograd.Function; a tensor subclass gets the
    registered op, whose autograd is torch.library's. An active torch function mode sees the function's call (as
    torch.nn.functional's), which it runs with itself disabled: a plain eager call then."""
    lin = torch.nn.Linear(8, 5)
    x = torch.randn(6, 8, requires_grad=True)
    t = torch.randint(0, 5, (6,))
    loss = LF.linear_cross_entropy(x, lin.weight, t, linear_bias=lin.bias)
    assert _lossfuse_node(loss).startswith("lossfuse_"), _lossfuse_node(loss)
    loss.backward()
    assert lin.weight.grad is not None and x.grad is not None

    class Sub(torch.Tensor):
        pass

    xs = torch.randn(4, 5).as_subclass(Sub).requires_grad_()
    loss = LF.cross_entropy(xs, torch.tensor([0, 1, 2, 3]))
    assert _lossfuse_node(loss).startswith("GeneratedBackwardFor_lossfuse"), _lossfuse_node(loss)
    mode = _Recording()
    with mode:
        loss = LF.mse_loss(x, torch.randn(6, 8))
    assert mode.names[-1] == "mse_loss" and _lossfuse_node(loss).startswith("lossfuse_"), _lossfuse_node(loss)


@pytest.mark.parametrize("name", ["cross_entropy", "linear_cross_entropy", "mse_loss", "gaussian_nll_loss",
                                  "binary_cross_entropy_with_logits", "kl_div", "multi_margin_loss",
                                  "cosine_embedding_loss", "ctc_loss"])
def test_torch_func_grad(name):
    # torch.func transforms cannot run a custom op's registered autograd; lossfuse's ops take a transformable
    # autograd.Function there (vmap: tests/test_op_db.py).
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 7, generator=g, dtype=torch.float64)
    y = torch.randn(4, 7, generator=g, dtype=torch.float64)
    p = torch.rand(4, 7, generator=g, dtype=torch.float64)
    t = torch.randint(0, 7, (4,), generator=g)
    w = torch.randn(9, 7, generator=g, dtype=torch.float64)
    lp = torch.randn(12, 4, 7, generator=g, dtype=torch.float64).log_softmax(2)
    calls = {
        "cross_entropy": lambda lib, a: lib.cross_entropy(a, t, label_smoothing=0.1),
        "linear_cross_entropy": lambda lib, a: lib.linear_cross_entropy(a, w, t),
        "mse_loss": lambda lib, a: lib.mse_loss(a, y),
        "gaussian_nll_loss": lambda lib, a: lib.gaussian_nll_loss(a, y, p + 0.5),
        "binary_cross_entropy_with_logits": lambda lib, a: lib.binary_cross_entropy_with_logits(a, p),
        "kl_div": lambda lib, a: lib.kl_div(a, p, reduction="batchmean"),
        "multi_margin_loss": lambda lib, a: lib.multi_margin_loss(a, t),
        "cosine_embedding_loss": lambda lib, a: lib.cosine_embedding_loss(a, y, torch.tensor([1.0, -1, 1, -1])),
        "ctc_loss": lambda lib, a: lib.ctc_loss(a, t.view(4, 1).clamp_min(1), torch.full((4,), 12),
                                                torch.ones(4, dtype=torch.long)),
    }
    arg = lp if name == "ctc_loss" else x
    fn = calls[name]
    if name == "linear_cross_entropy" and not hasattr(F, "linear_cross_entropy"):
        pytest.skip("this torch has no linear_cross_entropy to compare with")
    ours = torch.func.grad(lambda a: fn(LF, a))(arg)
    theirs = torch.func.grad(lambda a: fn(F, a))(arg)
    torch.testing.assert_close(ours, theirs)
    if name in ("ctc_loss", "multi_margin_loss"):  # torch has no second derivative of these
        return
    # second derivatives by torch.func: a Hessian by reverse over reverse (jacrev runs its backward under vmap), and
    # grad over grad per sample under vmap
    hessian = torch.func.jacrev(torch.func.jacrev(lambda a: fn(LF, a)))(arg)
    torch.testing.assert_close(hessian, torch.func.jacrev(torch.func.jacrev(lambda a: fn(F, a)))(arg))

    def grad_of_grad(lib):
        return torch.func.vmap(torch.func.grad(lambda a: torch.func.grad(lambda b: fn(lib, b))(a).square().sum()))
    batch = torch.stack([arg, arg * 0.5])
    torch.testing.assert_close(grad_of_grad(LF)(batch), grad_of_grad(F)(batch))
    # forward over reverse (torch.func.hessian = jacfwd(jacrev)), where torch's own backward has a forward derivative
    try:
        theirs = torch.func.hessian(lambda a: fn(F, a))(arg)
    except (NotImplementedError, RuntimeError):
        return
    torch.testing.assert_close(torch.func.hessian(lambda a: fn(LF, a))(arg), theirs)


def test_bad_arguments_are_caught_as_torch_raises_them():
    # torch raises RuntimeError for most bad arguments of its losses and ValueError for some; each lossfuse error of
    # this kind is caught by the exception type torch raises for the same call (ArgumentError is both).
    x = torch.randn(4, 10)
    t = torch.zeros(4, dtype=torch.long)
    calls = [
        lambda lib: lib.cross_entropy(x, t, weight=torch.ones(9)),
        lambda lib: lib.cross_entropy(x, t, label_smoothing=1.5),
        lambda lib: lib.cross_entropy(x.detach().requires_grad_(), t, label_smoothing=1.5),
        lambda lib: lib.cross_entropy(torch.randn(2, 3, 4), torch.zeros(2, 5, dtype=torch.long)),
        lambda lib: lib.cross_entropy(x, torch.rand(4, 10), ignore_index=3),
        lambda lib: lib.cross_entropy(x, t[:3]),
        lambda lib: lib.multi_margin_loss(x, t, p=3),
        lambda lib: lib.gaussian_nll_loss(x, x, torch.ones(3)),
    ]
    for k, call in enumerate(calls):
        with pytest.raises(Exception) as theirs:
            call(F)
        with pytest.raises(type(theirs.value)) as ours:
            call(LF)
        assert "lossfuse" in str(ours.value) or type(ours.value) is type(theirs.value), f"call {k}: {ours.value}"


# Operands of each loss with one given as a list instead of a tensor: torch raises TypeError for every one.
def _list_operand_calls():
    x = torch.rand(3, 4)
    soft = [[0.5] * 4] * 3
    return {
        "kl_div": lambda lib: lib.kl_div(x, soft),
        "poisson_nll_loss": lambda lib: lib.poisson_nll_loss(x.tolist(), x),
        "gaussian_nll_loss": lambda lib: lib.gaussian_nll_loss(x, soft, x),
        "hinge_embedding_loss": lambda lib: lib.hinge_embedding_loss(x, soft),
        "multilabel_soft_margin_loss": lambda lib: lib.multilabel_soft_margin_loss(x.tolist(), x),
        "multi_margin_loss": lambda lib: lib.multi_margin_loss(x, [0, 1, 2]),
        "multilabel_margin_loss": lambda lib: lib.multilabel_margin_loss(x, [[0, -1, 0, 0]] * 3),
        "cosine_embedding_loss": lambda lib: lib.cosine_embedding_loss(x, x, [1, -1, 1]),
        "triplet_margin_loss": lambda lib: lib.triplet_margin_loss(x, x, soft),
        "cross_entropy": lambda lib: lib.cross_entropy(x.tolist(), torch.tensor([0, 1, 2])),
        "cross_entropy weight": lambda lib: lib.cross_entropy(x, torch.tensor([0, 1, 2]), weight=[1.0] * 4),
        "nll_loss weight": lambda lib: lib.nll_loss(x, torch.tensor([0, 1, 2]), weight=[1.0] * 4),
        "bce_with_logits weight": lambda lib: lib.binary_cross_entropy_with_logits(x, x, weight=[1.0] * 4),
        "bce_with_logits pos_weight": lambda lib: lib.binary_cross_entropy_with_logits(x, x, pos_weight=[1.0] * 4),
        "multilabel_soft_margin weight": lambda lib: lib.multilabel_soft_margin_loss(x, x, weight=[1.0] * 4),
    }


@pytest.mark.parametrize("name", sorted(_list_operand_calls()))
def test_non_tensor_operand_raises_type_error_as_torch(name):
    call = _list_operand_calls()[name]
    with pytest.raises(TypeError):
        call(F)
    with pytest.raises(TypeError, match="must be Tensor, not list"):
        call(LF)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.complex64])
def test_cross_entropy_of_non_floating_logits_raises_not_implemented_as_torch(dtype):
    x = torch.ones(2, 3, dtype=dtype)
    t = torch.tensor([0, 1])
    with pytest.raises(NotImplementedError):
        F.cross_entropy(x, t)
    with pytest.raises(NotImplementedError, match="logits"):
        LF.cross_entropy(x, t)


@pytest.mark.parametrize("fn", ["cross_entropy", "nll_loss"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_unbatched_input_takes_a_one_element_target_as_torch(fn, reduction):
    x = torch.randn(7, dtype=torch.float64, requires_grad=True)
    for t in (torch.tensor([4]), torch.tensor([4], dtype=torch.uint8)):
        ours = getattr(LF, fn)(x, t, reduction=reduction)
        theirs = getattr(F, fn)(x, t.long(), reduction=reduction)
        assert ours.shape == theirs.shape == ()
        torch.testing.assert_close(ours, theirs)
        # torch 2.15 cannot differentiate this call (its backward raises a size mismatch); the gradient must be
        # that of the same call with a 0-d target
        (g,) = torch.autograd.grad(ours, x)
        (g0,) = torch.autograd.grad(getattr(F, fn)(x, t.long().reshape(()), reduction=reduction), x)
        torch.testing.assert_close(g, g0)
    with pytest.raises(ValueError):
        getattr(F, fn)(x, torch.tensor([1, 2]))
    with pytest.raises(ValueError):
        getattr(LF, fn)(x, torch.tensor([1, 2]))
    # one class: cross_entropy reads a (1) target of a (1) input as probabilities (an integer one is an error);
    # nll_loss takes it as the class index
    x1, t1 = torch.randn(1, dtype=torch.float64), torch.tensor([0])
    if fn == "cross_entropy":
        with pytest.raises(RuntimeError):
            F.cross_entropy(x1, t1)
        with pytest.raises(RuntimeError):
            LF.cross_entropy(x1, t1)
    else:
        torch.testing.assert_close(LF.nll_loss(x1, t1, reduction=reduction), F.nll_loss(x1, t1, reduction=reduction))


@pytest.mark.filterwarnings("ignore:Using a target size")
@pytest.mark.parametrize("dtypes", [(torch.int64, torch.int64), (torch.int32, torch.int16), (torch.uint8, torch.int8)])
def test_l1_loss_of_integer_tensors_as_torch(dtypes):
    a = torch.tensor([[1, 5, 3], [0, 7, 2]], dtype=dtypes[0])
    b = torch.tensor([2, 2, 9], dtype=dtypes[1])  # broadcast over the rows
    w = torch.tensor([[1.0, 2.0, 0.5], [3.0, 0.0, 1.0]])
    for kwargs in (dict(reduction="none"), dict(reduction="sum"), dict(reduction="none", weight=w),
                   dict(reduction="sum", weight=w), dict(reduction="mean", weight=w)):
        theirs = F.l1_loss(a, b, **kwargs)
        ours = LF.l1_loss(a, b, **kwargs)
        assert ours.dtype == theirs.dtype, kwargs
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    with pytest.raises(RuntimeError) as theirs:  # RuntimeError in torch 2.11, NotImplementedError (one) in 2.15
        F.l1_loss(a, b)
    with pytest.raises(theirs.type):
        LF.l1_loss(a, b)


@pytest.mark.filterwarnings("ignore:Using a target size")
@pytest.mark.parametrize("dtypes", [(torch.complex64, torch.complex64), (torch.complex128, torch.complex64),
                                    (torch.float32, torch.complex64)])
def test_l1_loss_of_complex_tensors_as_torch(dtypes):
    # |input - target| is real; torch differentiates the complex operands (Wirtinger gradients)
    g = torch.Generator().manual_seed(5)
    a = torch.randn(3, 4, dtype=dtypes[0], generator=g).requires_grad_()
    b = torch.randn(4, dtype=dtypes[1], generator=g)  # broadcast over the rows
    w = torch.rand(3, 4, generator=g)
    for kwargs in (dict(reduction="none"), dict(reduction="sum"), dict(reduction="mean"),
                   dict(reduction="none", weight=w), dict(reduction="mean", weight=w)):
        theirs = F.l1_loss(a, b, **kwargs)
        ours = LF.l1_loss(a, b, **kwargs)
        assert ours.dtype == theirs.dtype and not ours.is_complex(), kwargs
        torch.testing.assert_close(ours, theirs)
        (g_theirs,) = torch.autograd.grad(theirs.sum(), a)
        (g_ours,) = torch.autograd.grad(ours.sum(), a)
        torch.testing.assert_close(g_ours, g_theirs)


def test_vmap_in_dims_nesting_and_empty_batches():
    # vmap's forms beyond dim 0 of every operand (tests/test_op_db.py covers each loss): another mapped dim, a shared
    # operand, nested vmaps, chunks, and a mapped dim of size 0 (torch gives empty results of the entries' shape).
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 4, 5, generator=g, dtype=torch.float64)
    y = torch.randint(0, 5, (3, 4), generator=g)
    vmap = torch.func.vmap
    torch.testing.assert_close(vmap(LF.cross_entropy, in_dims=(1, 1))(x, y),
                               vmap(F.cross_entropy, in_dims=(1, 1))(x, y))
    torch.testing.assert_close(vmap(LF.cross_entropy, in_dims=(0, None))(x, y[0]),
                               vmap(F.cross_entropy, in_dims=(0, None))(x, y[0]))
    torch.testing.assert_close(vmap(vmap(LF.mse_loss))(x, 2 * x), vmap(vmap(F.mse_loss))(x, 2 * x))
    torch.testing.assert_close(vmap(LF.l1_loss, in_dims=(2, 2), chunk_size=2)(x, x.flip(0)),
                               vmap(F.l1_loss, in_dims=(2, 2))(x, x.flip(0)))
    none = lambda fn: lambda a, b: fn(a, b, reduction="none")  # noqa: E731
    for lib_fn, torch_fn in [(LF.cross_entropy, F.cross_entropy), (none(LF.cross_entropy), none(F.cross_entropy)),
                             (LF.mse_loss, F.mse_loss)]:
        operands = (x[:0], y[:0]) if lib_fn is not LF.mse_loss else (x[:0], x[:0])
        ours, theirs = vmap(lib_fn)(*operands), vmap(torch_fn)(*operands)
        assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, (ours.shape, theirs.shape)


def test_per_sample_gradients_stay_differentiable_from_outside():
    # vmap(grad(loss)) takes the kernels' backward when nothing outside can differentiate its result; a transform
    # around it (grad over vmap(grad)) or plain autograd on the tensors underneath (meta-learning's outer loop) can,
    # and must get the second derivative.
    g = torch.Generator().manual_seed(8)
    w = torch.randn(5, 7, generator=g, dtype=torch.float64, requires_grad=True)
    x = torch.randn(4, 5, generator=g, dtype=torch.float64)
    y = torch.randint(0, 7, (4,), generator=g)

    def per_sample(lib, w):
        def one(xi, yi):
            return torch.func.grad(lambda v: lib.cross_entropy((v @ w).unsqueeze(0), yi.unsqueeze(0)))(xi)
        return torch.func.vmap(one)(x, y)

    ours, theirs = per_sample(LF, w), per_sample(F, w)
    torch.testing.assert_close(ours, theirs)
    outer = [torch.autograd.grad(r.square().sum(), w)[0] for r in (ours, theirs)]
    torch.testing.assert_close(*outer)
    wd = w.detach()
    torch.testing.assert_close(torch.func.grad(lambda v: per_sample(LF, v).square().sum())(wd),
                               torch.func.grad(lambda v: per_sample(F, v).square().sum())(wd))


def test_derivatives_through_vmap_and_of_weights():
    # A vmapped loss differentiated twice (its backward runs under vmap on batched tensors, which report no
    # requires_grad), by torch.func and by plain autograd; and forward-mode tangents with respect to the weights
    # torch differentiates.
    g = torch.Generator().manual_seed(13)
    x, z = (torch.randn(3, 5, generator=g, dtype=torch.float64) for _ in range(2))
    y = torch.randint(0, 5, (3,), generator=g)

    def twice(lib):
        inner = torch.func.grad(lambda r: torch.func.vmap(lib.cross_entropy)(r, y).sum())
        return torch.func.grad(lambda q: inner(q).square().sum())(x)

    torch.testing.assert_close(twice(LF), twice(F))

    def plain(lib):
        q = x.clone().requires_grad_()
        first, = torch.autograd.grad(torch.func.vmap(lib.mse_loss)(q * q, z).sum(), q, create_graph=True)
        return torch.autograd.grad(first.sum(), q)[0]

    torch.testing.assert_close(plain(LF), plain(F))
    p, hard = z.softmax(1), (z > 0).to(torch.float64)
    w, tw = torch.rand(5, generator=g, dtype=torch.float64), torch.randn(5, generator=g, dtype=torch.float64)
    for call in (lambda lib, ww: lib.cross_entropy(x, p, weight=ww),
                 lambda lib, ww: lib.multilabel_soft_margin_loss(x, hard, weight=ww),
                 lambda lib, ww: lib.binary_cross_entropy_with_logits(x, hard, pos_weight=ww),
                 lambda lib, ww: lib.binary_cross_entropy_with_logits(x, hard, weight=ww)):
        ours = torch.func.jvp(lambda ww: call(LF, ww), (w,), (tw,))[1]
        theirs = torch.func.jvp(lambda ww: call(F, ww), (w,), (tw,))[1]
        torch.testing.assert_close(ours, theirs)


_SIGNS = torch.sign(torch.randn(4, 5, generator=torch.Generator().manual_seed(12), dtype=torch.float64))
# Losses whose operands are all made from one tensor y (2 y, y flipped, a function of y): each operand's gradient is
# the partial derivative at its own position, and y's gradient their sum through the chain rule.
_ONE_TENSOR_OPERANDS = {
    "mse_loss": lambda M, y: M.mse_loss(y, 2 * y, reduction="sum"),
    "l1_loss": lambda M, y: M.l1_loss(y, y.flip(0)),
    "smooth_l1_loss": lambda M, y: M.smooth_l1_loss(y, 2 * y),
    "huber_loss": lambda M, y: M.huber_loss(y, y.flip(1), delta=0.5),
    "kl_div": lambda M, y: M.kl_div(y, y.flip(0), log_target=True, reduction="batchmean"),
    "margin_ranking_loss": lambda M, y: M.margin_ranking_loss(y, y.flip(0), _SIGNS),
    "triplet_margin_loss": lambda M, y: M.triplet_margin_loss(y, y.flip(0), 2 * y, swap=True),
    "cross_entropy": lambda M, y: M.cross_entropy(y, y.softmax(-1).flip(0)),
    "multilabel_soft_margin_loss": lambda M, y: M.multilabel_soft_margin_loss(y, y.sigmoid()),
    "binary_cross_entropy_with_logits": lambda M, y: M.binary_cross_entropy_with_logits(y, y.sigmoid().flip(0)),
    "binary_cross_entropy": lambda M, y: M.binary_cross_entropy(y.sigmoid(), y.flip(0).sigmoid()),
    "poisson_nll_loss": lambda M, y: M.poisson_nll_loss(y, y.exp()),
    "gaussian_nll_loss": lambda M, y: M.gaussian_nll_loss(y, y.flip(0), y.exp()),
    "cosine_embedding_loss": lambda M, y: M.cosine_embedding_loss(y, y.flip(0), _SIGNS[:, 0]),
    "same_tensor_twice": lambda M, y: M.mse_loss(y, y) + M.l1_loss(y.exp(), y.exp()),
    # tied embeddings: the hidden states are made from the classifier's weight
    "linear_cross_entropy": lambda M, y: M.linear_cross_entropy(torch.tanh(y[[0, 2, 3, 1, 1]]), y,
                                                                torch.tensor([1, 0, 3, 2, 2])),
}


def _torch_functional(name):
    """torch.nn.functional; for linear_cross_entropy on torch < 2.13, which lacks it, its definition in torch."""
    if name != "linear_cross_entropy" or hasattr(F, name):
        return F
    return types.SimpleNamespace(linear_cross_entropy=lambda x, w, t: F.cross_entropy(F.linear(x, w), t))


@pytest.mark.parametrize("name", list(_ONE_TENSOR_OPERANDS))
def test_operands_made_from_one_tensor_get_partial_derivatives(name):
    """Operands computed from one tensor that requires grad: the gradient and the second derivative (create_graph=True,
    torch.func.grad, the function torch.func.vjp returns, each differentiated again by plain autograd) are torch's.
    The backward that builds a differentiable graph differentiated each operand through all of them (the total
    derivative: mse_loss(y, 2 y) gave 6 y where torch gives 2 y)."""
    loss = _ONE_TENSOR_OPERANDS[name]
    y0 = torch.randn(4, 5, generator=torch.Generator().manual_seed(13), dtype=torch.float64)

    def second(g, y):  # the derivative of |g|^2; 0 where torch's gradient has no graph (piecewise-linear losses)
        d = torch.autograd.grad(g.square().sum(), y, allow_unused=True)[0] if g.requires_grad else None
        return torch.zeros_like(y) if d is None else d

    vjp = lambda f, y: torch.func.vjp(f, y)[1](torch.ones((), dtype=y.dtype))[0]  # noqa: E731
    ways = {"create_graph": lambda f, y: torch.autograd.grad(f(y), y, create_graph=True)[0],
            "func.grad": lambda f, y: torch.func.grad(f)(y), "func.vjp": vjp}
    for way, run in ways.items():
        for requires_grad in (False, True):
            if way == "create_graph" and not requires_grad:
                continue
            results = []
            for M in (_torch_functional(name), LF):
                y = y0.clone().requires_grad_(requires_grad)
                g = run(lambda q, M=M: loss(M, q), y)
                results.append((g, second(g, y) if requires_grad else None))
            (want, want2), (got, got2) = results
            torch.testing.assert_close(got, want, msg=lambda m: f"{way}, requires_grad={requires_grad}: {m}")
            if requires_grad:
                torch.testing.assert_close(got2, want2, msg=lambda m: f"{way}, second derivative: {m}")


def test_compile_caches_are_tagged_with_this_build(tmp_path):
    """torch.compile's on-disk caches key a graph by its ops, not by the Python behind a custom op (its fake outputs,
    its autograd formula): a graph compiled against another build of lossfuse was reused (outputs of the old dtypes
    after the cross_entropy op's lse became float64 for float32 logits). Importing lossfuse adds a digest of its build
    to torch.compiler.config.cache_key_tag, which every such key includes; it changes with the contents of any source
    file and of the kernels' file (not with their times: every install of a build shares its caches), a caller's own
    tag set before the import is kept, and files it cannot read (an editor's dangling lock link) are left out."""
    from lossfuse import _library as lib
    assert lib.TAG.startswith("lossfuse-") and lib.TAG in torch.compiler.config.cache_key_tag.split("+")
    assert lossfuse.cache_key_tag == lib.TAG
    package = tmp_path / "pkg"
    (package / "nn").mkdir(parents=True)
    (package / "a.py").write_text("x = 1\n")
    (package / "nn" / "b.py").write_text("y = 2\n")
    library = tmp_path / "lib.so"
    library.write_bytes(b"\0" * 64)
    first = lib.build_tag(str(package), str(library))
    assert first == lib.build_tag(str(package), str(library))
    os.symlink(str(tmp_path / "gone"), str(package / ".#a.py"))  # dangling, as emacs leaves while editing
    (package / "nn" / "unreadable.py").symlink_to(tmp_path / "gone")
    os.utime(library, ns=(1, 1))
    assert lib.build_tag(str(package), str(library)) == first
    (package / "nn" / "b.py").write_text("y = 3\n")
    second = lib.build_tag(str(package), str(library))
    assert second != first
    library.write_bytes(b"\1" * 64)
    assert lib.build_tag(str(package), str(library)) != second
    assert lib.joined_tag("", first) == first
    assert lib.joined_tag("mine", first) == "mine+" + first
    assert lib.joined_tag("mine+" + first, second) == "mine+" + second


# The catalog's loss names -> lossfuse.nn.functional's functions (torch.nn.functional's names).
CATALOG_FUNCTIONS = {
    "mse": "mse_loss", "nll": "nll_loss", "cross_entropy": "cross_entropy", "bce": "binary_cross_entropy",
    "kl_div": "kl_div", "l1": "l1_loss", "smooth_l1": "smooth_l1_loss", "hinge_embedding": "hinge_embedding_loss",
    "margin_ranking": "margin_ranking_loss", "triplet_margin": "triplet_margin_loss", "ctc": "ctc_loss",
    "poisson_nll": "poisson_nll_loss", "huber": "huber_loss", "bce_with_logits": "binary_cross_entropy_with_logits",
    "gaussian_nll": "gaussian_nll_loss", "cosine_embedding": "cosine_embedding_loss", "multi_margin": "multi_margin_loss",
    "multilabel_margin": "multilabel_margin_loss", "multilabel_soft_margin": "multilabel_soft_margin_loss",
    "linear_cross_entropy": "linear_cross_entropy",
}


SEPARATE_ONLY = ("nll", "ctc", "triplet_margin", "cosine_embedding", "multi_margin", "multilabel_margin",
                 "multilabel_soft_margin")  # no forward_backward entry


def test_catalog_lists_every_loss_of_the_functional_api():
    entries = lossfuse.catalog()
    assert len(entries) == len(set(entries))
    assert {e.loss for e in entries} == set(CATALOG_FUNCTIONS)
    for name in CATALOG_FUNCTIONS.values():
        assert callable(getattr(LF, name)), name
    for loss in CATALOG_FUNCTIONS:
        for dtype in ("float32", "float64", "float16", "bfloat16"):
            directions = {e.direction for e in entries if e.loss == loss and e.dtype == dtype and e.device == "cpu"}
            # the C++ library's entries: a fused one for cross-entropy, the fused linear loss and the elementwise kinds
            fused = set() if loss in SEPARATE_ONLY else {"forward_backward"}
            assert directions == {"forward", "backward"} | fused, (loss, dtype)
    # CUDA kernels: every loss, in a build that found nvcc
    assert {e.loss for e in entries if e.device == "cuda"} in (set(), set(CATALOG_FUNCTIONS))
    assert entries[0] == lossfuse.CatalogEntry("cross_entropy", "float32", "cpu", "forward")


def test_patch_serves_cuda_only_where_the_build_has_cuda_kernels():
    """patch_torch sends a loss's CUDA calls to lossfuse only where the catalog lists CUDA kernels for it and the
    binding has its CUDA route (every loss, in a build with both)."""
    cuda_route = torch.ops.lossfuse._has_cuda()
    with_kernels = {e.loss for e in lossfuse.catalog() if e.device == "cuda"}
    for loss, name in CATALOG_FUNCTIONS.items():
        assert lossfuse._patch._catalog_name(name) == loss
        served = lossfuse._patch.devices(name)
        assert {"cpu", "meta"} <= set(served), name
        assert ("cuda" in served) == (cuda_route and loss in with_kernels), name


def test_cuda_check_is_scoped_per_thread_and_leaves_cpu_calls_checked():
    """lossfuse.cuda_check sets this thread's CUDA check policy for its block and restores the previous one, even
    after an error; another thread keeps its own. CPU calls raise for a bad target whatever the policy, and make no
    host synchronisation (lossfuse.cuda_host_syncs() unchanged)."""
    import threading

    current = torch.ops.lossfuse._cuda_check  # sets a policy and returns the previous one
    syncs = lossfuse.cuda_host_syncs()
    assert isinstance(syncs, int)
    x, t = torch.randn(4, 5, requires_grad=True), torch.tensor([1, 2, 3, 5])
    with lossfuse.cuda_check("nan"):
        assert current(1) == 1
        seen = []
        thread = threading.Thread(target=lambda: seen.append(current(0)))
        thread.start()
        thread.join()
        assert seen == [0], "another thread sees the default ('report')"
        with pytest.raises(IndexError, match="got 5 at position"):
            LF.cross_entropy(x, t)
        with pytest.raises(IndexError, match="got 5 at position"):
            with lossfuse.cuda_check("report"):
                assert current(0) == 0
                LF.cross_entropy(x, t)
        assert current(1) == 1, "the inner block restored 'nan' after its error"
    assert current(0) == 0
    assert lossfuse.cuda_host_syncs() == syncs
    with pytest.raises(lossfuse.ArgumentError, match="expected 'report' or 'nan', got 'off'"):
        with lossfuse.cuda_check("off"):
            pass


def test_broadcast_shape_matches_torch():
    """lossfuse's eager broadcast of plain shapes (_args._plain_broadcast) gives torch.broadcast_shapes's result, or
    an error where torch raises one, over random shapes of 0 to 4 dims with sizes 0, 1, 2 and 3."""
    from lossfuse._args import broadcast_shape
    rng = random.Random(5)
    for _ in range(3000):
        shapes = [tuple(rng.choice((0, 1, 1, 2, 3)) for _ in range(rng.randint(0, 4)))
                  for _ in range(rng.randint(1, 3))]
        try:
            want = torch.broadcast_shapes(*shapes)
        except RuntimeError:
            want = None
        operands = {f"op{i}": s for i, s in enumerate(shapes)}
        if want is None:
            with pytest.raises(RuntimeError, match="do not broadcast to one shape"):
                broadcast_shape("f", **operands)
        else:
            got = broadcast_shape("f", **operands)
            assert got == want and isinstance(got, torch.Size), shapes
