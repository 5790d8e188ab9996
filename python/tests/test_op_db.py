"""Every sample and error input PyTorch's own OpInfo database (torch.testing._internal.common_methods_invocations)
holds for the losses lossfuse covers: lossfuse must give torch's values and gradients (on the CPU, and on CUDA for the
losses with CUDA kernels where a device is there), and raise the same exception types on torch's error inputs."""

import pytest
import torch

import lossfuse
import lossfuse.nn.functional as LF

op_db = pytest.importorskip("torch.testing._internal.common_methods_invocations").op_db

NAMES = set(LF.__all__)
OPS = [op for op in op_db if op.name.startswith("nn.functional.") and op.name[len("nn.functional."):] in NAMES]
FLOATS = [torch.float64, torch.float32, torch.bfloat16, torch.float16]
TOL = {torch.float64: (1e-10, 1e-10), torch.float32: (1e-4, 1e-5), torch.bfloat16: (3e-2, 3e-2),
       torch.float16: (5e-3, 5e-3)}


def _id(op):
    return op.name[len("nn.functional."):] + (f".{op.variant_test_name}" if op.variant_test_name else "")


def _leaves(sample):
    return [t for t in [sample.input, *sample.args, *sample.kwargs.values()]
            if torch.is_tensor(t) and t.requires_grad]


def _clone(sample):
    """A copy of the sample's tensors as fresh leaves (same requires_grad), so two calls never share a graph."""
    def c(t):
        return t.detach().clone().requires_grad_(t.requires_grad) if torch.is_tensor(t) else t
    return c(sample.input), [c(a) for a in sample.args], {k: c(v) for k, v in sample.kwargs.items()}


def test_the_database_covers_lossfuse():
    assert len(OPS) >= 19, sorted(_id(op) for op in OPS)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("op", OPS, ids=_id)
def test_sample_inputs_match_torch(op, dtype, device):
    name = op.name[len("nn.functional."):]
    if device == "cuda":
        if not (torch.cuda.is_available() and torch.ops.lossfuse._has_cuda()):
            pytest.skip("needs a CUDA device and lossfuse built with its CUDA route")
        if "cuda" not in lossfuse._patch.devices(name):
            pytest.skip("lossfuse has no CUDA kernels for this loss")
    if dtype not in op.supported_dtypes(device):
        pytest.skip(f"torch itself does not support {dtype} here")
    ours_fn = getattr(LF, name)
    rtol, atol = TOL[dtype]
    checked = 0
    for sample in op.sample_inputs(device, dtype, requires_grad=dtype in (torch.float64, torch.float32)):
        x, args, kwargs = _clone(sample)
        try:
            # torch's chunked linear CE (`options`) trades accuracy for memory; its plain form is the reference
            ref = op(x, *args, **{k: v for k, v in kwargs.items() if k != "options"})
        except RuntimeError:  # a configuration torch itself refuses (e.g. its chunked linear CE in float64)
            continue
        x2, args2, kwargs2 = _clone(sample)
        ours = ours_fn(x2, *args2, **kwargs2)
        assert ours.dtype == ref.dtype and ours.shape == ref.shape, (sample, ours.dtype, ref.dtype)
        if dtype in (torch.bfloat16, torch.float16):
            # torch's own 16-bit arithmetic is not the oracle: against the float64 result on the same inputs, ours
            # must be no further off than torch's (plus one rounding of the 16-bit output).
            x3, args3, kwargs3 = _clone(sample)
            up = lambda t: t.detach().double() if torch.is_tensor(t) and t.is_floating_point() else t  # noqa: E731
            # `options` only picks torch's algorithm (its chunked one refuses float64): the exact value is without it
            kw64 = {k: up(v) for k, v in kwargs3.items() if k != "options"}
            exact = op(up(x3), *[up(a) for a in args3], **kw64)
            ulp = torch.finfo(dtype).eps * exact.abs()
            ours_err = (ours.double() - exact).abs()
            theirs_err = (ref.double() - exact).abs()
            bad = ~((ours_err <= theirs_err + ulp + atol) | (ours_err.isnan() & exact.isnan()))
            assert not bad.any(), f"{sample}: ours {ours} torch {ref} float64 {exact}"
            checked += 1
            continue
        torch.testing.assert_close(ours, ref, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{sample}: {m}")
        leaves, leaves2 = [x, *args, *kwargs.values()], [x2, *args2, *kwargs2.values()]
        diff = [i for i, t in enumerate(leaves) if torch.is_tensor(t) and t.requires_grad]
        if diff and ref.requires_grad:
            g = torch.randn_like(ref)
            ref_g = torch.autograd.grad(ref, [leaves[i] for i in diff], g, allow_unused=True)
            our_g = torch.autograd.grad(ours, [leaves2[i] for i in diff], g, allow_unused=True)
            for i, a, b in zip(diff, our_g, ref_g):
                if b is None:
                    continue
                assert a is not None, f"{sample}: no gradient for operand {i}"
                # Absolute tolerance relative to the gradient's scale: sums of many products (a linear layer's dW).
                scale = max(1.0, b.abs().max().item()) if b.numel() and b.isfinite().all() else 1.0
                torch.testing.assert_close(a, b, rtol=rtol, atol=max(atol, rtol) * scale, equal_nan=True,
                                           msg=lambda m: f"{sample}: grad of operand {i}: {m}")
        checked += 1
    if checked == 0:
        pytest.skip("torch refuses every sample of this variant at this dtype")


@pytest.mark.parametrize("op", [op for op in OPS if op.error_inputs_func is not None], ids=_id)
def test_error_inputs_raise_like_torch(op):
    ours_fn = getattr(LF, op.name[len("nn.functional."):])
    for err in op.error_inputs("cpu"):
        s = err.sample_input
        with pytest.raises(err.error_type):
            ours_fn(s.input, *s.args, **s.kwargs)


class _PassThrough(torch.utils._python_dispatch.TorchDispatchMode):
    """A dispatch mode that changes nothing: while it is active lossfuse takes its registered ops (the tracers'
    path) instead of the eager fast path."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _lossfuse_nodes(t):
    """The names of the lossfuse autograd nodes in t's graph."""
    seen, todo, names = set(), [t.grad_fn], []
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if "lossfuse" in type(node).__name__:
            names.append(type(node).__name__)
        todo.extend(n for n, _ in node.next_functions)
    return names


# The elementwise losses, whose plain eager training step (reduction mean or sum) runs the fused op
# (_<loss>_fused: loss and gradients in one pass) where the registered op's road runs the forward and backward ops.
FUSED_EAGER = {"mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div", "hinge_embedding_loss",
               "margin_ranking_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits", "poisson_nll_loss",
               "gaussian_nll_loss"}


@pytest.mark.parametrize("op", OPS, ids=_id)
def test_eager_fast_path_equals_registered_op(op):
    """Plain eager calls apply an autograd.Function directly; under a dispatch mode the same call goes through the
    registered op and its torch.library autograd. Both must give bitwise the same loss and gradients; for the
    elementwise losses' fused eager step, the same within float32's rounding (the same formulas in one loop, where
    the compiler may fuse a multiply and an add that it keeps apart in the two loops: 1 ulp here and there)."""
    name = op.name[len("nn.functional."):]
    ours_fn = getattr(LF, name)

    def same(a, b, kwargs):
        a, b = a.nan_to_num(7.0), b.nan_to_num(7.0)
        if name not in FUSED_EAGER or kwargs.get("reduction", "mean") == "none":
            return torch.equal(a, b)
        torch.testing.assert_close(a, b, rtol=4 * torch.finfo(a.dtype).eps, atol=1e-30)
        return True

    compared = 0
    for sample in op.sample_inputs("cpu", torch.float32, requires_grad=True):
        results = []
        for mode in (None, _PassThrough()):
            x, args, kwargs = _clone(sample)
            leaves = [t for t in [x, *args, *kwargs.values()] if torch.is_tensor(t) and t.requires_grad]
            try:
                if mode is None:
                    out = ours_fn(x, *args, **kwargs)
                else:
                    with mode:
                        out = ours_fn(x, *args, **kwargs)
            except (RuntimeError, ValueError, IndexError) as e:
                results.append(type(e))
                continue
            nodes = _lossfuse_nodes(out) if out.requires_grad else []
            grads = torch.autograd.grad(out, leaves, torch.ones_like(out), allow_unused=True) if nodes else ()
            results.append((out.detach(), grads, nodes))
        eager, traced = results
        if isinstance(eager, type) or isinstance(traced, type):
            assert eager == traced, f"{sample}: {eager} vs {traced}"
            continue
        assert same(eager[0], traced[0], sample.kwargs), sample
        for a, b in zip(eager[1], traced[1]):
            assert (a is None) == (b is None), sample
            if a is not None:
                assert same(a, b, sample.kwargs), sample
        if eager[2]:
            assert all(n.startswith("lossfuse_") for n in eager[2]), eager[2]
            assert all(n.startswith("GeneratedBackwardFor_lossfuse") for n in traced[2]), traced[2]
            compared += 1
    assert compared > 0, "no sample with a gradient"


@pytest.mark.parametrize("op", OPS, ids=_id)
def test_vmap_equals_a_loop_over_entries(op):
    """torch.func.vmap over the input and the positional tensor operands (keyword tensors shared), forward and
    per-entry input gradients (vmap of vjp): the same as calling torch's function on each entry in turn, which is
    what vmap means. Entry 0 is torch's sample, entry 1 the same with the input scaled by 0.75."""
    ours_fn = getattr(LF, op.name[len("nn.functional."):])
    checked = 0
    for sample in op.sample_inputs("cpu", torch.float64, requires_grad=False):
        kwargs = {k: v for k, v in sample.kwargs.items() if k != "options"}
        operands = [sample.input, *sample.args]
        mapped = [i for i, t in enumerate(operands) if torch.is_tensor(t)]

        def entry(k):
            ops_k = list(operands)
            ops_k[0] = ops_k[0] * (1.0 if k == 0 else 0.75)
            return ops_k

        def call(fn, ts):
            full = list(operands)
            for i, t in zip(mapped, ts):
                full[i] = t
            return fn(*full, **kwargs)

        try:
            refs, ref_grads = [], []
            for k in range(2):
                ops_k = entry(k)
                x = ops_k[0].detach().clone().requires_grad_()
                out = op(x, *ops_k[1:], **kwargs)
                refs.append(out.detach())
                ref_grads.append(torch.autograd.grad(out, x, torch.ones_like(out))[0])
        except RuntimeError:  # a configuration torch itself refuses
            continue
        batched = [torch.stack([entry(k)[i] for k in range(2)]) for i in mapped]
        ours = torch.func.vmap(lambda *ts: call(ours_fn, ts))(*batched)
        torch.testing.assert_close(ours, torch.stack(refs), equal_nan=True, msg=lambda m: f"{sample}: {m}")

        def input_grad(*ts):
            out, vjp = torch.func.vjp(lambda x: call(ours_fn, (x, *ts[1:])), ts[0])
            return vjp(torch.ones_like(out))[0]

        grads = torch.func.vmap(input_grad)(*batched)
        torch.testing.assert_close(grads, torch.stack(ref_grads), equal_nan=True,
                                   msg=lambda m: f"{sample}: input gradient: {m}")
        checked += 1
    assert checked > 0, "torch refused every sample"


def test_vmap_of_grad_gives_per_sample_gradients():
    """The per-sample-gradient recipe of torch.func: vmap(grad(loss of one sample)) over a batch, a model's weights
    shared, against a loop of autograd over single samples."""
    g = torch.Generator().manual_seed(11)
    w = torch.randn(5, 12, generator=g, dtype=torch.float64)
    x = torch.randn(6, 5, generator=g, dtype=torch.float64)
    y = torch.randint(0, 12, (6,), generator=g)

    def loss(fn, w, xi, yi):
        return fn((xi @ w).unsqueeze(0), yi.unsqueeze(0), label_smoothing=0.1)

    ours = torch.func.vmap(torch.func.grad(lambda w, xi, yi: loss(LF.cross_entropy, w, xi, yi)),
                           in_dims=(None, 0, 0))(w, x, y)
    refs = []
    for i in range(6):
        wi = w.clone().requires_grad_()
        refs.append(torch.autograd.grad(loss(torch.nn.functional.cross_entropy, wi, x[i], y[i]), wi)[0])
    torch.testing.assert_close(ours, torch.stack(refs))


@pytest.mark.parametrize("op", OPS, ids=_id)
def test_forward_mode_ad_equals_torch(op):
    """Forward-mode AD through every loss: the tangent of the loss along a random direction of the input, by
    torch.func.jvp and by torch.autograd.forward_ad's dual tensors, in float64, equal to torch's; where torch has no
    forward derivative (multi_margin_loss, multilabel_margin_loss), equal to central differences. ctc_loss has none in
    torch nor in lossfuse: NotImplementedError."""
    ours_fn = getattr(LF, op.name[len("nn.functional."):])
    fwad = torch.autograd.forward_ad
    checked = 0
    for k, sample in enumerate(op.sample_inputs("cpu", torch.float64, requires_grad=False)):
        kwargs = {key: v for key, v in sample.kwargs.items() if key != "options"}
        args = list(sample.args)
        direction = torch.randn(sample.input.shape, dtype=torch.float64,
                                generator=torch.Generator().manual_seed(k))
        if op.name == "nn.functional.ctc_loss":
            with pytest.raises(NotImplementedError):
                torch.func.jvp(lambda x: ours_fn(x, *args, **kwargs), (sample.input,), (direction,))
            checked += 1
            continue
        try:
            _, ref = torch.func.jvp(lambda x: op(x, *args, **kwargs), (sample.input,), (direction,))
            tol = {}
        except (NotImplementedError, RuntimeError):  # torch has no forward derivative here
            h = 1e-6
            ref = (op(sample.input + h * direction, *args, **kwargs)
                   - op(sample.input - h * direction, *args, **kwargs)) / (2 * h)
            tol = {"rtol": 1e-5, "atol": 1e-6}
        _, ours = torch.func.jvp(lambda x: ours_fn(x, *args, **kwargs), (sample.input,), (direction,))
        torch.testing.assert_close(ours, ref, equal_nan=True, **tol, msg=lambda m: f"{sample}: torch.func.jvp: {m}")
        with fwad.dual_level():
            dual = ours_fn(fwad.make_dual(sample.input, direction), *args, **kwargs)
            tangent = fwad.unpack_dual(dual).tangent
        torch.testing.assert_close(tangent, ref, equal_nan=True, **tol, msg=lambda m: f"{sample}: forward_ad: {m}")
        checked += 1
    assert checked > 0


@pytest.mark.parametrize("op", OPS, ids=_id)
def test_forward_mode_over_vmap_equals_a_loop_over_entries(op):
    """jvp of vmap (forward mode over per-sample losses, the form torch.func's jacfwd of a vmapped loss takes): two
    entries (torch's sample, and the same with the input scaled by 0.75) mapped over the input and the positional
    tensor operands, each with its own direction; equal to lossfuse's own jvp of each entry in turn (which
    test_forward_mode_ad_equals_torch checks against torch)."""
    if op.name == "nn.functional.ctc_loss":
        pytest.skip("ctc_loss has no forward derivative, in torch nor in lossfuse (checked above)")
    ours_fn = getattr(LF, op.name[len("nn.functional."):])
    checked = 0
    for k, sample in enumerate(op.sample_inputs("cpu", torch.float64, requires_grad=False)):
        kwargs = {key: v for key, v in sample.kwargs.items() if key != "options"}
        operands = [sample.input, *sample.args]
        mapped = [i for i, t in enumerate(operands) if torch.is_tensor(t)]
        g = torch.Generator().manual_seed(k)
        entries = [[t * 0.75 if (e == 1 and i == 0) else t for i, t in enumerate(operands)] for e in range(2)]
        directions = [torch.randn(sample.input.shape, dtype=torch.float64, generator=g) for _ in range(2)]

        def call(x, ts):
            full = list(operands)
            for i, t in zip(mapped[1:], ts):
                full[i] = t
            full[0] = x
            return ours_fn(*full, **kwargs)

        try:
            refs = [torch.func.jvp(lambda x: call(x, [entries[e][i] for i in mapped[1:]]), (entries[e][0],),
                                   (directions[e],)) for e in range(2)]
        except RuntimeError:  # a configuration lossfuse (as torch) refuses
            continue
        batched = [torch.stack([entries[e][i] for e in range(2)]) for i in mapped]
        values, tangents = torch.func.jvp(lambda x: torch.func.vmap(lambda xi, *ts: call(xi, ts))(x, *batched[1:]),
                                          (batched[0],), (torch.stack(directions),))
        torch.testing.assert_close(values, torch.stack([r[0] for r in refs]), equal_nan=True,
                                   msg=lambda m: f"{sample}: values: {m}")
        torch.testing.assert_close(tangents, torch.stack([r[1] for r in refs]), equal_nan=True,
                                   msg=lambda m: f"{sample}: tangents: {m}")
        checked += 1
    assert checked > 0, "every sample refused"


def test_forward_mode_over_forward_mode_is_refused():
    """jvp of jvp (jacfwd of jacfwd) would give a second derivative of 0 through lossfuse's forward rule: refused with
    NotImplementedError, naming the transforms that work; those give torch's Hessian."""
    x = torch.randn(4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    t = torch.tensor([0, 3, 1, 4])
    ours = lambda z: LF.cross_entropy(z, t, label_smoothing=0.1)  # noqa: E731
    theirs = lambda z: torch.nn.functional.cross_entropy(z, t, label_smoothing=0.1)  # noqa: E731
    with pytest.raises(NotImplementedError, match="forward mode over forward mode"):
        torch.func.jacfwd(torch.func.jacfwd(ours))(x)
    for second in (torch.func.hessian, lambda f: torch.func.jacrev(torch.func.jacfwd(f))):
        torch.testing.assert_close(second(ours)(x), second(theirs)(x))


def test_forward_mode_weight_tangents_and_forward_ad_under_vmap():
    # class weights carry tangents for probability targets only (torch ignores them for class indices); dual tensors
    # of torch.autograd.forward_ad through a vmapped loss are refused by name (torch.func.jvp of it works, above)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 5, generator=g, dtype=torch.float64)
    w, vw = torch.rand(5, generator=g, dtype=torch.float64) + 0.5, torch.randn(5, generator=g, dtype=torch.float64)
    for target in (torch.tensor([0, 3, 1]), torch.rand(3, 5, generator=g, dtype=torch.float64).softmax(-1)):
        ours = torch.func.jvp(lambda v: LF.cross_entropy(x, target, weight=v), (w,), (vw,))
        theirs = torch.func.jvp(lambda v: torch.nn.functional.cross_entropy(x, target, weight=v), (w,), (vw,))
        torch.testing.assert_close(ours, theirs)
    fwad = torch.autograd.forward_ad
    with fwad.dual_level(), pytest.raises(NotImplementedError, match="forward_ad's dual tensors through a vmapped"):
        torch.func.vmap(LF.mse_loss)(fwad.make_dual(x, x), x.flip(0))


def _forward_ad_tangent(loss, x, t, v):
    fwad = torch.autograd.forward_ad
    with fwad.dual_level():
        return fwad.unpack_dual(loss(fwad.make_dual(x.clone(), v.clone()), t)).tangent


@pytest.mark.parametrize("name", ["cross_entropy", "mse_loss"])
def test_forward_mode_inside_torch_compile_is_right_or_refused(name):
    """jvp, jacfwd, jvp of vmap, vmap of jvp and torch.autograd.forward_ad inside torch.compile: torch's tangents
    (Dynamo traces the loss's Function or runs it eagerly after a graph break), never the zeros (or None) that a
    registered op without a forward rule gave. Under fullgraph=True a graph break is an error, which is allowed: a
    wrong value is not."""
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 4, 6, dtype=torch.float64, generator=g)
    v = torch.randn(3, 4, 6, dtype=torch.float64, generator=g)
    if name == "cross_entropy":
        t = torch.randint(0, 6, (3, 4), generator=g)
    else:
        t = torch.randn(3, 4, 6, dtype=torch.float64, generator=g)

    def cases(F):
        loss = getattr(F, name)
        return {
            # first: after a fullgraph attempt that Dynamo refuses inside torch.func.jvp, make_dual in a compiled
            # function reports a forward gradient already present (torch's own state, with torch's losses too)
            "forward_ad": lambda a: _forward_ad_tangent(loss, a[2], t[2], v[2]),
            "jvp": lambda a: torch.func.jvp(lambda p: loss(p[0], t[0]), (a,), (v,))[1],
            "jacfwd": lambda a: torch.func.jacfwd(lambda p: loss(p[1], t[1]))(a),
            "jvp(vmap)": lambda a: torch.func.jvp(lambda p: torch.func.vmap(loss)(p, t), (a,), (v,))[1],
            # per-sample jvp: the target is batched by the outer vmap, the input is the inner jvp's
            "vmap(jvp)": lambda a: torch.func.vmap(
                lambda p, q, w: torch.func.jvp(lambda r: loss(r, q), (p,), (w,))[1])(a, t, v),
        }

    want = {k: f(x) for k, f in cases(torch.nn.functional).items()}
    for case, f in cases(LF).items():
        got = torch.compile(f)(x)
        torch.testing.assert_close(got, want[case], msg=lambda m, c=case: f"{c}: {m}")
        try:
            got = torch.compile(f, fullgraph=True)(x)
        except Exception:  # noqa: BLE001 - Dynamo's graph-break error (its type varies across torch versions)
            continue
        torch.testing.assert_close(got, want[case], msg=lambda m, c=case: f"{c}, fullgraph: {m}")
    torch._dynamo.reset()


@pytest.mark.parametrize("op", OPS, ids=_id)
def test_compiled_grad_and_jacrev_trace_into_one_graph(op):
    """torch.func.grad and jacrev of a loss inside torch.compile(fullgraph=True): one graph, and torch's gradient.
    Under a single grad level the compiled call takes a Function without a jvp, which Dynamo traces (it refuses a
    Function with one: every such call used to be a graph break, an error under fullgraph)."""
    torch._dynamo.reset()
    samples = [s for s in op.sample_inputs("cpu", torch.float64, requires_grad=True) if s.input.requires_grad]
    sample = samples[min(1, len(samples) - 1)]
    args = [a.detach() if torch.is_tensor(a) else a for a in sample.args]
    kwargs = {k: v.detach() if torch.is_tensor(v) else v for k, v in sample.kwargs.items() if k != "options"}
    ours_fn = getattr(LF, op.name[len("nn.functional."):])
    x = sample.input.detach()
    for transform in (torch.func.grad, torch.func.jacrev):
        want = transform(lambda p: op(p, *args, **kwargs).sum())(x)
        got = torch.compile(transform(lambda p: ours_fn(p, *args, **kwargs).sum()), fullgraph=True)(x)
        torch.testing.assert_close(got, want, rtol=1e-7, atol=1e-9, equal_nan=True,
                                   msg=lambda m, t=transform: f"{sample}, {t.__name__}: {m}")
    torch._dynamo.reset()


@pytest.mark.parametrize("op", OPS, ids=_id)
def test_meta_tensors_and_inference_mode(op):
    """Tensors on the meta device (shape inference, model summaries), float32 and bfloat16: torch's output shape and
    dtype, on meta (an autocast check once raised there for 16-bit operands: meta has no autocast). Under
    torch.inference_mode: torch's values (float32; bfloat16 ones run)."""
    fn = getattr(LF, op.name[len("nn.functional."):])
    checked = 0
    # bfloat16 samples too: the autocast checks look at the device only for a 16-bit operand
    samples = [*list(op.sample_inputs("cpu", torch.float32))[:10], *list(op.sample_inputs("cpu", torch.bfloat16))[:10]]
    for sample in samples:
        kwargs = {k: v for k, v in sample.kwargs.items() if k != "options"}
        try:
            want = op(sample.input, *sample.args, **kwargs)
        except (RuntimeError, ValueError, IndexError):
            continue
        with torch.inference_mode():
            x, args, kw = _clone(sample)
            got = fn(x, *args, **kw)
        if sample.input.dtype == torch.float32:  # (bfloat16 values: ours are float32 arithmetic, torch's partly not)
            torch.testing.assert_close(got, want, equal_nan=True, msg=lambda m: f"{sample}: {m}")
        checked += 1

        def meta(t):
            return t.to("meta") if torch.is_tensor(t) else t

        try:
            want_meta = op(meta(sample.input), *map(meta, sample.args), **{k: meta(v) for k, v in kwargs.items()})
        except (RuntimeError, NotImplementedError):  # torch's own op reads values here (gaussian_nll's var check)
            continue
        got = fn(meta(sample.input), *map(meta, sample.args), **{k: meta(v) for k, v in sample.kwargs.items()})
        assert (got.device.type, got.shape, got.dtype) == ("meta", want_meta.shape, want_meta.dtype), sample
    assert checked > 0


@pytest.mark.parametrize("op", OPS, ids=_id)
def test_calls_needing_no_gradient_equal_torch(op):
    """A plain eager call that needs no gradient runs the kernel below autograd (no registered autograd): under
    torch.no_grad with operands that require grad, and with grad mode on and no operand requiring grad, the value,
    requires_grad and grad_fn are torch's; a call that needs the gradient afterwards still gets torch's."""
    fn = getattr(LF, op.name[len("nn.functional."):])
    checked = 0
    for sample in list(op.sample_inputs("cpu", torch.float64, requires_grad=True))[:8]:
        kwargs = {k: v for k, v in sample.kwargs.items() if k != "options"}
        try:
            with torch.no_grad():
                want = op(sample.input, *sample.args, **kwargs)
        except (RuntimeError, ValueError, IndexError):
            continue
        x, args, kw = _clone(sample)
        with torch.no_grad():
            got = fn(x, *args, **kw)
        assert (got.requires_grad, got.grad_fn) == (False, None), sample
        torch.testing.assert_close(got, want, equal_nan=True, msg=lambda m: f"{sample}, no_grad: {m}")
        detached = [t.detach() if torch.is_tensor(t) else t for t in (x, *args)]
        got = fn(*detached, **{k: v.detach() if torch.is_tensor(v) else v for k, v in kw.items()})
        assert (got.requires_grad, got.grad_fn) == (False, None), sample
        torch.testing.assert_close(got, want, equal_nan=True, msg=lambda m: f"{sample}, detached: {m}")
        if x.requires_grad:
            want_grad = torch.autograd.grad(op(sample.input, *sample.args, **kwargs).sum(), sample.input)[0]
            got_grad = torch.autograd.grad(fn(x, *args, **kw).sum(), x)[0]
            torch.testing.assert_close(got_grad, want_grad, equal_nan=True, msg=lambda m: f"{sample}, grad: {m}")
        checked += 1
    assert checked > 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("op", OPS, ids=_id)
def test_autocast_equals_torch(op, dtype):
    """Inside torch.autocast (CPU, dtype), torch casts the 16-bit operands of its loss ops to float32 (and those of
    its linear to the autocast dtype): each loss gives torch's dtype, and torch's value and gradients (in the
    operands' dtypes). Before, ours ran the 16-bit operands as they came and returned 16-bit losses (or refused
    binary_cross_entropy's float32 target beside a bfloat16 input)."""
    fn = getattr(LF, op.name[len("nn.functional."):])
    # float32 samples with their floating tensors in the 16-bit dtype (torch's kernels need not take it: autocast
    # casts first), or only the input so (16-bit beside float32 operands); as they are too for linear_cross_entropy,
    # whose linear casts them down
    modes = ["all", "input"] + (["none"] if op.name == "nn.functional.linear_cross_entropy" else [])
    checked = 0
    for mode in modes:
        for sample in list(op.sample_inputs("cpu", torch.float32, requires_grad=True))[:12]:
            results = []
            for f in (op, fn):
                x, args, kwargs = _clone(sample)

                def c(t):
                    return t.detach().to(dtype).requires_grad_(t.requires_grad) if torch.is_tensor(t) and \
                        t.is_floating_point() else t
                if mode == "all":
                    x, args, kwargs = c(x), [c(a) for a in args], {k: c(v) for k, v in kwargs.items()}
                elif mode == "input":
                    x = c(x)
                if f is op:
                    kwargs = {k: v for k, v in kwargs.items() if k != "options"}
                    called = ([x, *args], kwargs)
                leaves = [t for t in [x, *args, *kwargs.values()] if torch.is_tensor(t) and t.requires_grad]
                try:
                    with torch.autocast("cpu", dtype=dtype):
                        out = f(x, *args, **kwargs)
                except (RuntimeError, ValueError, IndexError) as e:
                    results.append(type(e))
                    continue
                grads = torch.autograd.grad(out.float().sum(), leaves, allow_unused=True) if leaves else ()
                results.append((out, grads))
            want, got = results
            if isinstance(want, type):  # torch refuses the sample
                continue
            assert not isinstance(got, type), f"{sample}: {got}"
            assert got[0].dtype == want[0].dtype, (sample, got[0].dtype, want[0].dtype)
            if not torch.allclose(got[0], want[0], rtol=1e-4, atol=1e-5, equal_nan=True):
                # where torch computes in 16 bits (its compositions: weighted mse / l1, gaussian_nll,
                # multilabel_soft_margin; its linear's logits), ours (float32) may differ from it, but must be no
                # further than torch from float64 on the same operands
                ref = op(*[t.detach().double() if torch.is_tensor(t) and t.is_floating_point() else t
                           for t in called[0]], **{k: v.detach().double() if torch.is_tensor(v) and
                                                   v.is_floating_point() else v for k, v in called[1].items()})
                err_ours, err_torch = ((r.double() - ref).abs().nan_to_num().max() for r in (got[0], want[0]))
                assert err_ours <= err_torch + 1e-5 + 1e-4 * ref.abs().nan_to_num().max(), \
                    (sample, mode, err_ours, err_torch)
            for gg, gw in zip(got[1], want[1]):
                assert (gg is None) == (gw is None), sample
                if gw is not None:
                    assert gg.dtype == gw.dtype, (sample, gg.dtype, gw.dtype)
                    torch.testing.assert_close(gg.float(), gw.float(), equal_nan=True, rtol=3e-2, atol=3e-2,
                                               msg=lambda m, s=sample: f"{s}: grad: {m}")
            checked += 1
    assert checked > 0


@pytest.mark.parametrize("op", OPS, ids=_id)
def test_compiled_with_dynamic_shapes_equals_eager(op):
    """torch.compile(dynamic=True, fullgraph=True): shapes are symbolic, and so are the float arguments (margin,
    eps, beta, delta), which math.isfinite cannot take (every sample of eleven losses failed so); a warning Dynamo
    cannot trace (linear_cross_entropy's probability targets) failed too. The loss and its gradient equal eager's on
    up to 8 samples spread over each op's list."""
    fn = getattr(LF, op.name[len("nn.functional."):])
    samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=True))
    picked = sorted({round(i * (len(samples) - 1) / 7) for i in range(8)}) if len(samples) > 8 else range(len(samples))
    if op.name == "nn.functional.linear_cross_entropy":  # and its probability targets, wherever they are listed
        picked = sorted(set(picked) | {next(i for i, s in enumerate(samples) if s.args[1].is_floating_point())})
    checked = 0
    for i in picked:
        sample = samples[i]
        args = [a.detach() if torch.is_tensor(a) else a for a in sample.args]
        kwargs = {k: v.detach() if torch.is_tensor(v) else v for k, v in sample.kwargs.items() if k != "options"}

        def run(f):
            x = sample.input.detach().clone().requires_grad_(sample.input.requires_grad)
            out = f(x, *args, **kwargs)
            return out, (torch.autograd.grad(out.sum(), x)[0] if x.requires_grad else None)

        try:
            want = run(fn)
        except (RuntimeError, ValueError, IndexError):  # an error sample: the eager call's refusal is tested elsewhere
            continue
        torch._dynamo.reset()
        got = run(torch.compile(fn, dynamic=True, fullgraph=True))
        torch.testing.assert_close(got[0], want[0], equal_nan=True, msg=lambda m, s=sample: f"{s}: loss: {m}")
        if want[1] is not None:
            torch.testing.assert_close(got[1], want[1], equal_nan=True, msg=lambda m, s=sample: f"{s}: grad: {m}")
        checked += 1
    torch._dynamo.reset()
    assert checked > 0


@pytest.mark.parametrize("op", OPS, ids=_id)
def test_compiled_vjp_function_under_outer_autograd(op):
    """Inside torch.compile, the function torch.func.vjp returns is called and its result differentiated again by
    plain autograd, for every loss: the second derivative of eager torch (of our eager loss where torch has none).
    Dynamo gives up on such a frame and runs it eagerly, compiling what it calls frame by frame; our Function's
    methods compiled there ran on wrappers without storage (kl_div, margin_ranking, hinge_embedding: an error) or
    lost the derivative of what they compiled (binary_cross_entropy_with_logits, multilabel_soft_margin,
    multilabel_margin: off by up to 9, silently)."""
    fn = getattr(LF, op.name[len("nn.functional."):])
    samples = [s for s in op.sample_inputs("cpu", torch.float64, requires_grad=True) if s.input.requires_grad][:2]
    assert samples
    for sample in samples:
        args = [a.detach() if torch.is_tensor(a) else a for a in sample.args]
        kwargs = {k: v.detach() if torch.is_tensor(v) else v for k, v in sample.kwargs.items() if k != "options"}

        def second(f, compile_it):
            torch._dynamo.reset()
            step = lambda p: torch.func.vjp(lambda q: f(q, *args, **kwargs).sum(), p)[1](  # noqa: E731
                torch.ones((), dtype=p.dtype))[0]
            if compile_it:
                step = torch.compile(step)
            x = sample.input.detach().clone().requires_grad_()
            return torch.autograd.grad((x - 0.5 * step(x)).pow(2).sum(), x)[0]

        try:
            want = second(op, False)
        except RuntimeError:  # torch has no double backward here: our eager one is the reference
            try:
                want = second(fn, False)
            except RuntimeError:  # nor ours (ctc_loss, as torch): compiled, the same refusal
                with pytest.raises(RuntimeError, match="not implemented"):
                    second(fn, True)
                continue
        torch.testing.assert_close(second(fn, True), want, rtol=1e-7, atol=1e-9, equal_nan=True,
                                   msg=lambda m, s=sample: f"{s}: {m}")
    torch._dynamo.reset()


@pytest.mark.parametrize("op", OPS, ids=_id)
def test_linearize_equals_torch(op):
    """torch.func.linearize traces the jvp (make_fx over forward_ad duals): lossfuse's Function may not test the
    tangents' values (it did, to drop the zero tangents of non-dual operands, and the trace stopped). Where torch's own
    linearize works, ours gives its values; where torch has no forward rule, ours gives our jvp's or refuses."""
    fn = getattr(LF, op.name[len("nn.functional."):])
    checked = 0
    for sample in op.sample_inputs("cpu", torch.float64, requires_grad=True):
        if not sample.input.requires_grad or checked == 2:
            continue
        checked += 1
        args = [a.detach() if torch.is_tensor(a) else a for a in sample.args]
        kwargs = {k: v.detach() if torch.is_tensor(v) else v for k, v in sample.kwargs.items() if k != "options"}
        x = sample.input.detach()
        v = torch.randn(x.shape, dtype=x.dtype, generator=torch.Generator().manual_seed(checked))
        try:
            want_out, want_jvp = torch.func.linearize(lambda p: op(p, *args, **kwargs), x)
            want = want_jvp(v)
        except (NotImplementedError, RuntimeError):  # torch has no forward rule here (or checks values)
            try:
                want_out, want = torch.func.jvp(lambda p: fn(p, *args, **kwargs), (x,), (v,))
            except NotImplementedError:  # nor ours (ctc_loss)
                with pytest.raises(NotImplementedError):
                    torch.func.linearize(lambda p: fn(p, *args, **kwargs), x)
                continue
        out, jvp_fn = torch.func.linearize(lambda p: fn(p, *args, **kwargs), x)
        torch.testing.assert_close(out, want_out, equal_nan=True, msg=lambda m: f"{sample}: value: {m}")
        torch.testing.assert_close(jvp_fn(v), want, equal_nan=True, msg=lambda m: f"{sample}: tangent: {m}")
    assert checked > 0


@pytest.mark.parametrize("name", ["cross_entropy", "mse_loss", "linear_cross_entropy"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_transforms_under_outer_autograd_keep_the_second_derivative(name, compiled):
    """The gradient a torch.func transform returns is differentiated again by plain autograd (MAML's inner step,
    a gradient penalty): grad, jacrev and the function vjp returns, eager and inside torch.compile, give torch's
    second derivative. (Compiled, one grad level took the Function that Dynamo traces, whose backward lost the outer
    graph; eager, vjp's function differentiated the wrappers of its exited level, disconnected from the input.)"""
    g = torch.Generator().manual_seed(3)
    x0 = torch.randn(4, 6, dtype=torch.float64, generator=g)
    w = torch.randn(6, 6, dtype=torch.float64, generator=g)
    y = torch.randn(4, 6, dtype=torch.float64, generator=g)
    t = torch.randint(0, 6, (4,), generator=g)

    def loss(F):
        if name == "cross_entropy":
            return lambda p: F.cross_entropy(p @ w, t)
        if name == "mse_loss":
            return lambda p: F.mse_loss(p @ w, y)
        if F is LF:
            return lambda p: LF.linear_cross_entropy(p, w, t)
        return lambda p: torch.nn.functional.cross_entropy(p @ w.T, t)

    transforms = {"grad": torch.func.grad, "jacrev": torch.func.jacrev,
                  "vjp": lambda f: (lambda p: torch.func.vjp(f, p)[1](torch.ones((), dtype=p.dtype))[0])}
    for tname, transform in transforms.items():
        results = []
        for F, compile_it in ((torch.nn.functional, False), (LF, compiled)):
            torch._dynamo.reset()
            step = transform(loss(F))
            if compile_it:
                step = torch.compile(step)
            x = x0.clone().requires_grad_()
            outer = (x - 0.5 * step(x)).pow(2).sum()
            results.append(torch.autograd.grad(outer, x)[0])
        torch.testing.assert_close(results[1], results[0], msg=lambda m, n=tname: f"{n}: {m}")
    torch._dynamo.reset()


@pytest.mark.parametrize("name", ["cross_entropy", "mse_loss"])
def test_compiled_grad_of_a_model_loss(name):
    """torch.func.grad of a model's loss with respect to its input (adversarial examples), compiled: torch's gradient
    with the model's parameters requiring grad (an autograd graph around the transform: the loss runs after a graph
    break, see README) and, with them frozen, in one graph (fullgraph=True)."""
    g = torch.Generator().manual_seed(8)
    model = torch.nn.Linear(4, 6).double()
    x = torch.randn(5, 4, dtype=torch.float64, generator=g)
    t = torch.randint(0, 6, (5,), generator=g)
    y = torch.randn(5, 6, dtype=torch.float64, generator=g)

    def step(F):
        if name == "cross_entropy":
            return torch.func.grad(lambda inp: F.cross_entropy(model(inp), t))
        return torch.func.grad(lambda inp: F.mse_loss(model(inp), y))

    for frozen in (False, True):
        model.requires_grad_(not frozen)
        want = step(torch.nn.functional)(x)
        torch._dynamo.reset()
        got = torch.compile(step(LF), fullgraph=frozen)(x)
        torch.testing.assert_close(got, want, msg=lambda m, f=frozen: f"frozen {f}: {m}")
    torch._dynamo.reset()
