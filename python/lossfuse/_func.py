"""torch.func and higher-order autograd machinery of the registered losses: when a differentiable backward is
needed, the gradients of a composition across functorch levels, and the saving of primals for forward mode."""

import contextlib
import threading

import torch


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
