"""Helpers shared by every loss's Python side: reductions, accumulation dtypes, output casts."""

import contextlib
import functools
import math
import sys
import threading

import torch
from torch.nn import _reduction as _torch_reduction

_REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


def reduction_code(reduction, size_average=None, reduce=None, legacy_names=True):
    """torch's rules: the deprecated size_average/reduce pair wins when given; 'elementwise_mean' is taken as
    'mean' (with torch's warning) where torch reads the reduction with get_enum (legacy_names)."""
    if size_average is not None or reduce is not None:
        reduction = _torch_reduction.legacy_get_string(size_average, reduce)
    if legacy_names and reduction == "elementwise_mean":  # torch's old name for 'mean', accepted with a warning
        return _torch_reduction.get_enum(reduction)
    try:
        return _REDUCTIONS[reduction]
    except (KeyError, TypeError):
        raise ValueError(f"{reduction} is not a valid value for reduction") from None


def finite(v):
    """math.isfinite(v) by comparisons, which Dynamo traces on a symbolic float (a scalar argument under
    torch.compile(dynamic=True)); math.isfinite it cannot."""
    return v == v and -math.inf < v < math.inf


def torch_label_smoothing(v):
    """label_smoothing as torch's kernels take it: they check only label_smoothing <= 1 (not failing for NaN) and
    smooth only above 0, so a negative or NaN value means none. A symbolic float (torch.compile(dynamic=True)) is
    passed on as it is."""
    if isinstance(v, torch.SymFloat):
        return v
    return v if float(v) > 0 else 0.0


def check_class_weight_dtype(name, weight, input):
    """torch's rule for class-index targets: the class weights have the logits' dtype (it raises 'expected scalar
    type Float but found Double'); under autocast 16-bit ones are cast to float32 first. Probability targets
    promote."""
    def seen(t):
        return torch.float32 if autocasts(t) else t.dtype

    if weight is not None and seen(weight) != seen(input):
        raise ArgumentError(f"lossfuse: {name}: weight: expected dtype {input.dtype} (the input's), got "
                            f"{weight.dtype}")


def sign_target(target, dtype):
    """A +-1 target as the kernels read it (they test t == 1 and t == -1 in the computation dtype): targets of that
    dtype and signed integers as they are; others (bool, uint8, another float dtype) as int8 1 / -1 / 0 from
    torch's own comparisons `target == 1` and `target == -1` in the target's dtype (a uint8 255 is -1, and a float64
    1 + 1e-12 is no 1, as in torch; cast first, it would round to 1)."""
    if target.dtype == dtype or target.dtype in (torch.int8, torch.int16, torch.int32, torch.int64):
        return target
    return (target == 1).to(torch.int8) - (target == -1).to(torch.int8)


def infinite(v):
    """math.isinf(v) by comparisons (see finite)."""
    return v == math.inf or v == -math.inf


_HALF = (torch.float16, torch.bfloat16)


def _autocast_on(t):
    """Whether torch.autocast is on for t's device (a device without autocast, such as meta, never has it on)."""
    if t.is_cpu:
        return torch.is_autocast_enabled("cpu")
    device = t.device.type
    return torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device)


def autocasts(t):
    """Whether torch.autocast's float32 policy would cast t (16-bit, autocast on for its device)."""
    return t.dtype in _HALF and _autocast_on(t)


def autocast_reads_16bit(first, *others):
    """Whether torch.autocast's float32 policy would cast every operand, all of one 16-bit dtype: a kernel that
    computes in float32 then reads them as they are (the same values as the casts') and returns its float32 loss,
    writing gradients in their dtype, with no float32 copies."""
    return first.dtype in _HALF and all(t.dtype == first.dtype for t in others) and _autocast_on(first)


def autocast_float32(first, *others):
    """torch.autocast's float32 policy, which torch applies to its loss ops: where autocast is on for the operands'
    device, float16 and bfloat16 operands are cast to float32 before the loss (float64 and integer ones stay), and the
    loss comes back in float32; the casts are differentiable, so gradients come back in the operands' dtypes. Returns
    (first, *others), None and non-tensors as given."""
    tensors = (first, *others)
    for t in tensors:  # the common case first: no 16-bit operand, nothing to ask
        if isinstance(t, torch.Tensor) and t.dtype in _HALF:
            break
    else:
        return tensors
    if not _autocast_on(t):
        return tensors
    return tuple(t.float() if isinstance(t, torch.Tensor) and t.dtype in _HALF else t for t in tensors)


def autocast_lower(first, *others):
    """torch.autocast's lower-precision policy, which torch applies to its linear: where autocast is on for the
    operands' device, floating operands but float64 ones are cast to the autocast dtype. Returns whether it was on,
    then (first, *others)."""
    if not (isinstance(first, torch.Tensor) and _autocast_on(first)):
        return False, (first, *others)
    low = torch.get_autocast_dtype(first.device.type)
    return True, tuple(t.to(low) if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64
                       else t for t in (first, *others))


def overridable(fn):
    """torch's __torch_function__ protocol for a public loss function, as torch.nn.functional's own have: where an
    operand overrides it (a tensor subclass, a torch.fx tracing proxy) or a torch function mode is active, the call
    goes to handle_torch_function, which hands the function and its arguments to the override or mode."""
    @functools.wraps(fn)
    def public(*args, **kwargs):
        operands = (*args, *kwargs.values()) if kwargs else args
        # (torch's subclass handling switched off, as inside a subclass's super().__torch_function__: no override;
        # Dynamo's has_torch_function does not see that switch)
        if torch._C._is_torch_function_enabled() and _has_torch_function(operands):
            relevant = tuple(a for a in operands if hasattr(type(a), "__torch_function__"))
            return torch.overrides.handle_torch_function(public, relevant, *args, **kwargs)
        return fn(*args, **kwargs)

    return public


_has_torch_function = torch.overrides.has_torch_function


def check_tensors(name, *named):
    """torch's TypeError for an operand that is not a tensor; named: (argument name, value) in position order."""
    for position, (arg, value) in enumerate(named, 1):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name}(): argument '{arg}' (position {position}) must be Tensor, not "
                            f"{type(value).__name__}")


def check_optional_tensors(name, *named):
    """check_tensors for optional operands (None allowed); named: (argument name, position, value)."""
    for arg, position, value in named:
        if value is not None and not isinstance(value, torch.Tensor):
            raise TypeError(f"{name}(): argument '{arg}' (position {position}) must be Tensor, not "
                            f"{type(value).__name__}")


def acc_dtype(t):
    """The dtype lossfuse stores losses in: float64 for float64 inputs, float32 otherwise."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def lse_dtype(t):
    """The dtype of the per-row lse that the cross_entropy and linear_cross_entropy ops save for backward: float64 for
    every logits dtype (the kernels write max + log-sum summed in double, so a gradient made from it later keeps the
    forward's precision however large the logits' common offset: a relative error up to 1.1e-16 |lse| per
    probability). Callers hand lse to users in acc_dtype."""
    return torch.float64


def new_loss(input, rows, reduction):
    return input.new_empty(tuple(rows) if reduction == 0 else (), dtype=acc_dtype(input))


def new_grad(like, wanted):
    if wanted:
        return torch.empty_like(like, memory_format=torch.contiguous_format)
    return like.new_empty((0,))


def to_input_dtype(loss, input):
    """Losses are computed and stored in float32 or wider; torch returns them in the input's dtype."""
    return loss if loss.dtype == input.dtype else loss.to(input.dtype)


def sum_to(grad, shape):
    """Reduces a full-shape gradient of a broadcast operand to the operand's own shape."""
    if grad is None or tuple(grad.shape) == tuple(shape):
        return grad
    return grad.sum_to_size(shape)


class ArgumentError(ValueError, RuntimeError):
    """A bad argument (shape, size, option out of range), named in the message. torch raises RuntimeError for most
    such arguments of its losses and ValueError for some; lossfuse's are both, so code written against either
    catches them."""


def as_argument_error(error):
    return error if isinstance(error, ArgumentError) else ArgumentError(str(error))


# ---- the eager fast path -------------------------------------------------------------------------------------------
#
# Every forward op's autograd is registered with torch.library.register_autograd, which is what torch.compile,
# FakeTensor and the other tracers need. In plain eager mode that registration costs tens of microseconds per call
# in Python (the dispatcher calls back into a generated autograd.Function, which re-reads the schema's defaults for
# setup_context on every call): several times torch's own small losses. So `register_autograd` below also builds a
# plain torch.autograd.Function from the same setup_context and backward, and `ops.<name>(...)` applies it directly
# when nothing traces the call. A plain eager call that needs no gradient (torch.no_grad, inference_mode, an
# evaluation loop, operands that do not require grad) skips the registered autograd altogether and runs the kernel
# below autograd, as that autograd's own no-grad path does after its Python redispatch. Anything else (Dynamo, a
# dispatch or function mode, a tensor subclass, forward-mode duals) goes through the registered op. Every path runs
# the same kernel; the gradient paths the same backward.


# Tensor types the fast path takes: plain tensors and parameters (a subclass that overrides nothing).
_PLAIN = (torch.Tensor, torch.nn.Parameter)

# what _eager_state finds
_TRACED, _NO_GRAD, _WANTS_GRAD = 0, 1, 2


def _eager_state(args):
    """_WANTS_GRAD when the call may bypass the dispatcher's autograd for the plain Function: grad mode on, some plain
    tensor requiring grad, no tracer (Dynamo, torch.jit.trace, functorch), mode or other tensor subclass anywhere;
    _NO_GRAD in the same conditions when no tensor requires grad or grad mode is off; else _TRACED."""
    if torch.compiler.is_compiling():
        return _TRACED
    if (torch._C._is_torch_function_mode_enabled() or torch._C._len_torch_dispatch_stack() > 0
            or torch._C._are_functorch_transforms_active() or torch._C._get_tracing_state() is not None):
        return _TRACED
    wants_grad = False
    for a in args:
        if isinstance(a, torch.Tensor):
            if type(a) not in _PLAIN:
                return _TRACED
            wants_grad = wants_grad or a.requires_grad
    return _WANTS_GRAD if wants_grad and torch.is_grad_enabled() else _NO_GRAD


def _plain_eager(args):
    """True when the call may bypass the dispatcher's autograd: grad mode on, some plain tensor requiring grad, no
    tracer (Dynamo, torch.jit.trace, functorch), mode or other tensor subclass anywhere."""
    return _eager_state(args) == _WANTS_GRAD


def is_eager(t):
    """True outside every tracer and transform (Dynamo, AOTAutograd, FakeTensor, torch.func): only then may a
    backward mutate what its forward saved (the gradients handed over and rescaled in place)."""
    return (type(t) is torch.Tensor and not torch.compiler.is_compiling()
            and not torch._C._are_functorch_transforms_active())


def eager_scalar(t):
    """The value of a one-element tensor, read only where that traces nothing (eager, no mode, no transform); else
    None. Backward uses it to pick a path (an upstream gradient of 1, or one that is not finite)."""
    if is_eager(t) and torch._C._len_torch_dispatch_stack() == 0 and t.numel() == 1:
        return t.item()
    return None


def upstream_not_finite(grad_output):
    """Whether a scalar upstream gradient is NaN or infinite (eager reads only). A gradient made in the forward for
    an upstream gradient of 1 and scaled by such a value would make the ignored rows' zeros NaN (0 * NaN), where
    torch keeps them 0: the backward then makes the gradient from the saved lse instead, which never scales them."""
    v = eager_scalar(grad_output)
    return v is not None and not math.isfinite(v)


def graph_needed(grad_output, tensors, wanted):
    """Whether a backward must return a differentiable graph (differentiable_grads) rather than the kernels'
    gradients: grad mode is on (create_graph=True, or a torch.func transform) and the upstream gradient or an operand
    being differentiated tracks gradients. Under torch.func, grad mode is always on; there the graph is needed only
    if something outside the transform running this backward can differentiate it (_outer_derivative_possible)."""
    if not torch.is_grad_enabled():
        return False
    involved = [grad_output] + [t for t, w in zip(tensors, wanted) if w and t is not None]
    if not torch._C._are_functorch_transforms_active():
        # wrappers of an exited level (torch.func.vjp's function, called after the transform): plain autograd tracks
        # what they wrap
        return any(_unwrap_dead(t).requires_grad for t in involved)
    # under torch.func, requires_grad says little: vmap's batched tensors report False even where an outer transform
    # or plain autograd beneath tracks them, and wrappers of an exited level report True
    if any(_is_dead_wrapper(t) for t in involved):
        return True
    return _outer_derivative_possible([*tensors, grad_output])


_DIFFERENTIATING = (torch._C._functorch.TransformType.Grad, torch._C._functorch.TransformType.Jvp)


def _outer_derivative_possible(tensors):
    """For a backward run by a torch.func grad transform on tensors wrapped at its level: whether a derivative of its
    result can still be taken, by a differentiating transform of a lower level (grad over grad, jacrev over grad) or
    by plain autograd on the tensors underneath every wrapper. vmap(grad(loss)) has neither: the kernels serve."""
    tensors = [t for t in tensors if isinstance(t, torch.Tensor)]
    level = max((torch._C._functorch.maybe_get_level(t) for t in tensors), default=-1)
    if any(i.key() in _DIFFERENTIATING and i.level() < level for i in _interpreters()):
        return True
    for t in tensors:
        while torch._C._functorch.is_functorch_wrapped_tensor(t):
            t = torch._C._functorch.get_unwrapped(t)
        if t.requires_grad:
            return True
    return False


_JVP = torch._C._functorch.TransformType.Jvp


def _interpreters():
    from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters
    return retrieve_all_functorch_interpreters()


@torch._dynamo.assume_constant_result
def _one_grad_level():
    """The level when the functorch stack is one torch.func.grad level (grad, vjp, jacrev's forward), else -1. A
    constant to Dynamo, which calls it while tracing and guards the compiled code on the functorch stack."""
    levels = _interpreters()
    one = len(levels) == 1 and levels[0].key() == torch._C._functorch.TransformType.Grad
    return levels[0].level() if one else -1


def _outer_grad(args, level):
    """Under one grad level inside torch.compile: whether an operand, unwrapped from that level, requires grad
    itself (an autograd graph around the transform: the gradient may be differentiated again, which the Function
    without a jvp does not trace). Traceable: Dynamo knows the unwrapped example's requires_grad."""
    return any(torch._C._functorch._unwrap_for_grad(a, level).requires_grad
               for a in args if isinstance(a, torch.Tensor))


def _unwrap_dead(t):
    return torch._C._functorch.unwrap_if_dead(t) if isinstance(t, torch.Tensor) else t


def _is_dead_wrapper(t):
    # a torch.func wrapper whose level has exited: what the backward of vmap's generated rule is given
    return isinstance(t, torch.Tensor) and torch._C._functorch.maybe_get_level(t) == -2


def differentiable_grads(loss_fn, tensors, wanted, grad_output):
    """Gradients of loss_fn(*tensors) for the tensors flagged in `wanted` (None for the others), as a graph that can
    be differentiated again. Under vmap's generated rule (inside jacrev, or a vmap that is differentiated) the saved
    tensors are batched tensors, which do not require grad, or wrappers of an exited torch.func level, which hold no
    graph: they are unwrapped to the levels still active and differentiated by torch.func.vjp, whose result the
    outer transforms (and plain autograd) can differentiate."""
    idx = [i for i, w in enumerate(wanted) if w]
    out = [None] * len(wanted)
    if not idx:
        return out
    # dead wrappers are differentiated through what they wrap (outside torch.func too, as graph_needed judged)
    live = [_unwrap_dead(t) for t in tensors]
    in_func = torch._C._are_functorch_transforms_active()
    if (in_func and (any(_is_dead_wrapper(t) for t in tensors) or not all(tensors[i].requires_grad for i in idx))) \
            or (not in_func and torch.compiler.is_compiling()):
        # batched tensors of vmap's generated backward, or dead wrappers: differentiated at a new level; and inside
        # torch.compile, where Dynamo traces torch.func.vjp (torch.autograd.grad it would detach)
        def of_wanted(*diff):
            full = list(live)
            for i, t in zip(idx, diff):
                full[i] = t
            return loss_fn(*full)

        _, vjp = torch.func.vjp(of_wanted, *[live[i] for i in idx])
        computed = vjp(_unwrap_dead(grad_output))
    else:
        computed = _autograd_grads(loss_fn, live, idx, _unwrap_dead(grad_output))
    for i, g in zip(idx, computed):
        out[i] = g
    return out


@torch.compiler.disable
def _autograd_grads(loss_fn, live, idx, grad_output):
    """torch.autograd.grad of loss_fn(*live) for live[i], i in idx, as a graph (create_graph=True). Never compiled:
    Dynamo cannot trace torch.autograd.grad, and where it compiles frame by frame (the eager rest of a frame it gave
    up on, as a torch.func transform after a graph break) it would compile loss_fn alone, whose compiled backward
    has no derivative: the gradient would come back disconnected from the operands.

    Each operand differentiated is a fresh alias (a view, still in the caller's graph), so its gradient is the partial
    derivative at its own position: an operand made from another (mse_loss(y, 2 * y), or the same tensor twice) gave
    the total derivative through both positions."""
    leaves = [live[i].view_as(live[i]) if live[i].requires_grad else live[i].detach().requires_grad_() for i in idx]
    for i, leaf in zip(idx, leaves):
        live[i] = leaf
    return torch.autograd.grad(loss_fn(*live), leaves, grad_output, create_graph=True, allow_unused=True)


_below_autograd = torch._C._AutoDispatchBelowAutograd

_function_forwards = threading.local()


@contextlib.contextmanager
def _in_function_forward():
    _function_forwards.depth = getattr(_function_forwards, "depth", 0) + 1
    try:
        yield
    finally:
        _function_forwards.depth -= 1


def forward_mode_missed():
    """For a vmap rule: True when a torch.func forward-mode level is active beneath it and the op was not called by
    the forward of a lossfuse Function (whose jvp carries the tangents). That is the op traced straight into a
    torch.compile graph under jvp of vmap: the op has no forward rule, and its tangents would come back zero."""
    return getattr(_function_forwards, "depth", 0) == 0 and any(i.key() == _JVP for i in _interpreters())


class _Ops:
    """torch.ops.lossfuse, where the ops registered through register_autograd take the eager fast path."""

    def __getattr__(self, name):
        return getattr(torch.ops.lossfuse, name)


ops = _Ops()


_fwad = torch.autograd.forward_ad


class _DualMasks(threading.local):
    """Per thread, for each Function applied on torch.autograd.forward_ad duals: which arguments are duals."""

    def __init__(self):
        self.stack = []


_dual_masks = _DualMasks()


def compiled_autograd_on():
    """Whether torch's compiled autograd is on (torch._dynamo.config.compiled_autograd, or its context active now):
    it traces every node's backward into a graph, which cross_entropy's eager C++ node does not allow (torch asserts
    against C++ nodes with outputs marked non-differentiable, and the node reads the upstream gradient's value), so
    such calls take the autograd.Function road, which it traces."""
    config = sys.modules.get("torch._dynamo.config")
    if config is None:
        return False
    module = sys.modules.get("torch._dynamo.compiled_autograd")
    return bool(config.compiled_autograd or (module is not None and module.compiled_autograd_enabled))


def forward_ad_active():
    return torch.autograd.forward_ad._current_level >= 0


def _has_tangent(args):
    return any(isinstance(a, torch.Tensor) and torch.autograd.forward_ad.unpack_dual(a).tangent is not None
               for a in args)


def _keep_primals(ctx, inputs, output):
    ctx.primals = inputs
    ctx.loss_dtype = (output[0] if isinstance(output, (tuple, list)) else output).dtype


class _CtxView:
    """A ctx seen through: attributes and methods are the wrapped ctx's, but for what this class defines."""

    def __init__(self, ctx):
        object.__setattr__(self, "_ctx", ctx)

    def __getattr__(self, key):
        return getattr(self._ctx, key)

    def __setattr__(self, key, value):
        setattr(self._ctx, key, value)


class _SaveRecorder(_CtxView):
    """An op's setup_context runs on this: what it saves for backward is recorded, not saved."""

    saved = ()

    def save_for_backward(self, *tensors):
        object.__setattr__(self, "saved", tensors)

    def mark_non_differentiable(self, *tensors):
        # Under vmap's generated setup_context marking reaches the batched tensors inside, not the outputs torch
        # checks, and torch refuses None tangents for unmarked outputs: where a forward-mode level may ask for them,
        # such outputs get zero tangents (of one entry, see jvp) instead. Elsewhere they are marked, and get none.
        if isinstance(self._ctx, _CtxCustomSave) and any(i.key() == _JVP for i in _interpreters()):
            self._ctx.zero_other_tangents = True
        else:
            self._ctx.mark_non_differentiable(*tensors)


class _OwnSaved(_CtxView):
    """The ctx an op's backward sees under torch.func: its own saved tensors, not the primals saved after them."""

    @property
    def saved_tensors(self):
        return self._ctx.saved_tensors[:self._ctx.n_saved]


def _setup_saving_primals(setup_context, ctx, inputs, output):
    """setup_context under torch.func: the op's saved tensors, then the tensor primals, saved for backward and for
    forward alike. vmap's generated rule keeps one list of batch dims for both (the last saved), and hands jvp only
    what was saved: so the primals are saved, not kept on ctx, when a Function may run under vmap."""
    recorder = _SaveRecorder(ctx)
    setup_context(recorder, inputs, output)
    saved = (*recorder.saved, *[a for a in inputs if isinstance(a, torch.Tensor)])
    ctx.save_for_backward(*saved)
    ctx.save_for_forward(*saved)
    ctx.n_saved = len(recorder.saved)
    ctx.other_outputs = [(tuple(o.shape), o.dtype) for o in output[1:]] if isinstance(output, (tuple, list)) else []
    _keep_primals(ctx, inputs, output)


try:  # the ctxs of vmap's generated rule: its setup_context's, and its jvp's and backward's (saved tensors batched)
    from torch._functorch.autograd_function import CtxCustomSave as _CtxCustomSave
    from torch._functorch.autograd_function import CtxWithSavedTensors as _CtxWithSavedTensors
except ImportError:  # pragma: no cover
    _CtxCustomSave = _CtxWithSavedTensors = ()


def _primals(ctx):
    """The op's arguments in jvp. Under vmap's generated jvp the tensors kept on ctx are the batched tensors of the
    forward's vmap, gone by now: the saved ones take their places. Otherwise the arguments as given, which carry
    the tangents of the levels around."""
    if not isinstance(ctx, _CtxWithSavedTensors):
        return ctx.primals
    tensors = iter(ctx.saved_tensors[ctx.n_saved:])
    return [next(tensors) if isinstance(p, torch.Tensor) else p for p in ctx.primals]


def class_target_mean(loss, z, t, weight, ignore_index, label_smoothing, split):
    """'mean' of a composed cross-entropy over class-index targets t (class dim 1, or 0 unbatched) from its per-row
    losses and logits z: over the target weights of the kept rows. split (label smoothing or a z-loss present):
    torch's division is by term, the (1 - eps) class term over the sum plus the rest over it, which is NaN (0/0)
    where the sum is 0, not the total's inf (the kernels' split_mean_denominator)."""
    valid = t != ignore_index
    wy = weight[torch.where(valid, t, 0)] if weight is not None else torch.ones_like(loss)
    denom = torch.where(valid, wy, torch.zeros_like(wy)).sum()
    total = loss.sum()
    if not split:
        return total / denom
    # torch's own kernel (of any number of dims; reduction 2: sum), which patch_torch() leaves alone: lossfuse's
    # nll_loss inside this composition's forward-mode AD would meet its own transform level
    cls = (1 - label_smoothing) * torch._C._nn.nll_loss_nd(
        torch.log_softmax(z, 1 if z.dim() >= 2 else 0), t, weight, 2, ignore_index)
    return cls / denom + (total - cls) / denom


def in_acc_dtype(tensors):
    """The floating tensors in the accumulation dtype of the first (the dtype lossfuse returns losses in)."""
    acc = acc_dtype(tensors[0])
    return [t.to(acc) if t is not None and t.is_floating_point() else t for t in tensors]


def register_autograd(name, backward, setup_context, composition=None, outputs=1, differentiable=None):
    """torch.library.register_autograd for lossfuse::<name>, plus its eager fast path as ops.<name>.

    composition(*args): the op's first output (the loss) computed by differentiable torch operations, in the dtype
    the op returns it; with it, forward-mode AD (torch.func.jvp, jacfwd, hessian, torch.autograd.forward_ad) works
    through the op: its tangent is the composition's. `outputs`: how many tensors the op returns (the others get no
    tangent). `differentiable`: the positions of the arguments that carry tangents, or a function of the arguments
    giving them (default: every tensor); the others (class weights whose tangent torch ignores too) are constants."""
    torch.library.register_autograd(f"lossfuse::{name}", backward, setup_context=setup_context)
    op = getattr(torch.ops.lossfuse, name).default

    def forward(ctx, *args):
        with _below_autograd():  # straight to the kernel, past the registered autograd
            output = op(*args)
        setup_context(ctx, args, output)
        if composition is not None and forward_ad_active():
            _keep_primals(ctx, args, output)
        return output

    def jvp(ctx, *tangents):
        if composition is None:
            raise NotImplementedError(f"lossfuse: {name}: forward-mode AD is not supported (nor by torch)")
        if torch._C._are_functorch_transforms_active() and \
                sum(i.key() == _JVP for i in _interpreters()) > 1:
            # the tangent computed here would not carry the outer level's: a second derivative of 0, silently
            raise NotImplementedError(
                f"lossfuse: {name}: forward mode over forward mode (jvp of jvp, jacfwd of jacfwd) is not supported; "
                "take second derivatives with a reverse-mode level in them: torch.func.hessian (jacfwd of jacrev), "
                "jacrev(jacfwd(...)) or jacrev(jacrev(...))")
        primals = _primals(ctx)
        carried = differentiable(primals) if callable(differentiable) else differentiable
        moved = [i for i, (p, t) in enumerate(zip(primals, tangents))
                 if isinstance(p, torch.Tensor) and t is not None and (carried is None or i in carried)]

        def substituted(base, values):
            full = list(base)
            for i, v in zip(moved, values):
                full[i] = v
            return composition(*full)

        # contiguous: an expanded primal (a broadcast operand) cannot take its tangent's layout in place
        if not moved:  # tangents only for constants (class weights)
            tangent = torch.zeros_like(composition(*primals)).detach()
        elif torch._C._are_functorch_transforms_active():
            if not any(i.key() == _JVP for i in _interpreters()):  # forward_ad's duals under vmap: not batchable
                raise NotImplementedError(
                    f"lossfuse: {name}: torch.autograd.forward_ad's dual tensors through a vmapped loss are not "
                    "supported; torch.func.jvp of the vmapped loss is")
            _, tangent = torch.func.jvp(lambda *values: substituted(primals, values),
                                        tuple(primals[i].contiguous() for i in moved),
                                        tuple(tangents[i].contiguous() for i in moved))
        else:  # torch.autograd.forward_ad, whose levels do not nest: duals of the level running this jvp
            fwad = torch.autograd.forward_ad
            # torch hands zero tangents for the operands that are not duals; they add nothing, and torch's own forward
            # formulas fail on some of them made dual (a weight of binary_cross_entropy_with_logits). Which operands
            # were duals is noted by the caller (a test of the tangents' values would stop a trace, as
            # torch.func.linearize's); zero tangents are dropped where it is not (inside torch.compile).
            duals = _dual_masks.stack[-1] if _dual_masks.stack else None
            moved[:] = [i for i in moved if (duals[i] if duals is not None else bool(tangents[i].ne(0).any()))]
            plain = [fwad.unpack_dual(p).primal if isinstance(p, torch.Tensor) else p for p in primals]
            with fwad._set_fwd_grad_enabled(True):
                duals = [fwad.make_dual(plain[i].contiguous(), fwad.unpack_dual(tangents[i]).primal) for i in moved]
                out = substituted(plain, duals)
                tangent = fwad.unpack_dual(out).tangent if moved else None
            if tangent is None:
                tangent = torch.zeros_like(out)
            tangent = tangent.detach()
        tangent = tangent.to(ctx.loss_dtype)
        if outputs == 1:
            return tangent
        if getattr(ctx, "zero_other_tangents", False):  # the other outputs, left unmarked: zeros (of one entry)
            return (tangent, *[torch.zeros(shape, dtype=dtype, device=tangent.device)
                               for shape, dtype in ctx.other_outputs])
        return (tangent, *[None] * (outputs - 1))

    # forward(ctx, ...) rather than a separate setup_context: torch binds the defaults of a setup_context-style
    # Function through inspect.signature on every call. (torch.func transforms, which need that style, take the
    # registered op: see _plain_eager.)
    function = type(f"lossfuse_{name}", (torch.autograd.Function,),
                    {"forward": staticmethod(forward), "backward": staticmethod(backward), "jvp": staticmethod(jvp)})

    # The same pair in the form torch.func transforms need (a separate setup_context): the registered op's autograd
    # cannot run under them. torch.func.grad, jacrev and the like work through it, and vmap by the rule torch
    # generates from the forward and backward, whose lossfuse ops have the vmap rules of register_vmap_rules.
    # torch.func's generated jvp rule lines a list argument's items up against its one tangent (and fails): list
    # arguments (linear_cross_entropy's grad_mask) reach this Function as their items, in their place
    # read from the schema here, once: torch 2.11's Dynamo cannot trace a FunctionSchema inside the traced calls
    arity = len(op._schema.arguments)
    sizes = {i: a.N for i, a in enumerate(op._schema.arguments) if isinstance(a.type, torch.ListType)}

    def spread(args, grads=False):
        """args with the lists' items in their place; grads: a None per item for each list's (None) gradient."""
        out = []
        for i, a in enumerate(args):
            out.extend(([None] * sizes[i] if grads else list(a)) if i in sizes else [a])
        return out

    def gather(flat, as_none=False):
        out, k = [], 0
        for i in range(arity):
            n = sizes.get(i)
            out.append(flat[k] if n is None else (None if as_none else list(flat[k:k + n])))
            k += 1 if n is None else n
        return out

    def forward_alone(*args):
        with _below_autograd(), _in_function_forward():
            return op(*gather(args))

    def setup_for_transforms(ctx, inputs, output):
        _setup_saving_primals(setup_context, ctx, gather(inputs), output)

    def backward_for_transforms(ctx, *grads):
        result = backward(_OwnSaved(ctx), *grads)
        return tuple(spread(result if isinstance(result, tuple) else (result,), grads=True))

    def jvp_for_transforms(ctx, *tangents):
        return jvp(ctx, *gather(tangents, as_none=True))

    # Dynamo refuses this Function (its jvp): it runs eagerly, after a graph break, and where Dynamo gave up on the
    # whole frame (a torch.func transform) it would still compile the Function's methods frame by frame, on functorch
    # wrappers -- those of an exited level (torch.func.vjp's function) have no storage, and their compiled backward no
    # derivative. The methods are never compiled.
    eager = torch.compiler.disable
    transformable = type(f"lossfuse_{name}_func", (torch.autograd.Function,),
                         {"forward": staticmethod(eager(forward_alone)),
                          "setup_context": staticmethod(eager(setup_for_transforms)),
                          "backward": staticmethod(eager(backward_for_transforms)),
                          "jvp": staticmethod(eager(jvp_for_transforms)), "generate_vmap_rule": True})

    def forward_traced(*args):  # the forward runs without grad: the op's autograd passes it through
        return op(*gather(args))

    reverse_only = type(f"lossfuse_{name}_rev", (torch.autograd.Function,),
                        {"forward": staticmethod(forward_traced), "setup_context": staticmethod(setup_for_transforms),
                         "backward": staticmethod(backward_for_transforms), "generate_vmap_rule": True})

    def call(*args):
        if torch.compiler.is_compiling():
            # Under a torch.func transform whose innermost level is not vmap's, Dynamo gets the Function: it traces
            # its jvp (the registered op has no forward rule, so tangents through it came back zero) or runs it
            # eagerly after a graph break. An input batched by vmap keeps the op, whose batching rule Dynamo
            # traces. (The input, not any tensor: an outer vmap batches a target that an inner jvp leaves alone.)
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if torch._C._are_functorch_transforms_active() and not (
                    first is not None and torch._C._functorch.is_batchedtensor(first)):
                # one grad level and no forward_ad duals: the Function without a jvp, which Dynamo traces (it
                # refuses a jvp)
                level = _one_grad_level()
                rev = level >= 0 and not forward_ad_active() and not _outer_grad(args, level)
                return (reverse_only if rev else transformable).apply(*spread(args))
            if forward_ad_active():  # torch.autograd.forward_ad's duals: the same, by the plain Function
                return function.apply(*args)
            return op(*args)
        try:
            state = _eager_state(args)
            if state == _WANTS_GRAD:
                return function.apply(*args)
            if state == _NO_GRAD and not forward_ad_active():  # no gradient: straight to the kernel
                with _below_autograd():
                    return op(*args)
            if torch._C._are_functorch_transforms_active():
                return transformable.apply(*spread(args))
            if forward_ad_active() and _has_tangent(args):
                _dual_masks.stack.append([isinstance(a, torch.Tensor) and _fwad.unpack_dual(a).tangent is not None
                                          for a in args])
                try:
                    return function.apply(*args)
                finally:
                    _dual_masks.stack.pop()
            return op(*args)
        except ValueError as e:
            raise as_argument_error(e) from None

    call.__name__ = name
    setattr(ops, name, call)
