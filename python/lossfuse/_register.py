"""One registration per op: torch.library.register_autograd plus its eager fast path (ops.<name>), built from one
setup_context / backward pair and the op's torch composition."""

import torch

from ._args import as_argument_error
from ._cuda import cuda_check
from ._func import (_JVP, _OwnSaved, _in_function_forward, _interpreters, _keep_primals, _one_grad_level, _outer_grad,
                    _primals, _setup_saving_primals, differentiable_grads, graph_needed)
from ._outputs import in_acc_dtype, new_grad, new_loss
from ._roads import (_NO_GRAD, _PLAIN, _WANTS_GRAD, _below_autograd, _dual_masks, _eager_state, _fwad, _has_tangent,
                     forward_ad_active, is_eager)


class _Ops:
    """torch.ops.lossfuse, where the ops registered through register_autograd take the eager fast path."""

    def __getattr__(self, name):
        return getattr(torch.ops.lossfuse, name)


ops = _Ops()


def register_autograd(name, backward, setup_context, composition=None, outputs=1, differentiable=None,
                      eager_forward=None):
    """torch.library.register_autograd for lossfuse::<name>, plus its eager fast path as ops.<name>.

    composition(*args): the op's first output (the loss) computed by differentiable torch operations, in the dtype
    the op returns it; with it, forward-mode AD (torch.func.jvp, jacfwd, hessian, torch.autograd.forward_ad) works
    through the op: its tangent is the composition's. `outputs`: how many tensors the op returns (the others get no
    tangent). `differentiable`: the positions of the arguments that carry tangents, or a function of the arguments
    giving them (default: every tensor); the others (class weights whose tangent torch ignores too) are constants.
    `eager_forward(ctx, args)`: the op's output made another way on the eager autograd.Function road (the gradients
    too, kept on ctx for backward), or None for the op itself."""
    torch.library.register_autograd(f"lossfuse::{name}", backward, setup_context=setup_context)
    op = getattr(torch.ops.lossfuse, name).default

    def forward(ctx, *args):
        output = eager_forward(ctx, args) if eager_forward is not None else None
        if output is None:
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


def register_loss_fakes(name, rows):
    """The fake (meta) implementations of lossfuse::<name> and lossfuse::<name>_backward, read off their schemas: the
    forward's loss has shape rows(*args) for reduction 'none' (else 0-d), in the accumulation dtype of the first
    operand; the backward's gradients have the shapes and dtypes of the tensors after grad_output, one per entry of its
    output_mask (an empty tensor where the mask is off), or the first one's alone where it has no mask."""
    forward = getattr(torch.ops.lossfuse, name).default
    reduction = [a.name for a in forward._schema.arguments].index("reduction")
    backward = getattr(torch.ops.lossfuse, name + "_backward").default
    names = [a.name for a in backward._schema.arguments]
    mask = names.index("output_mask") if "output_mask" in names else None

    def fake(*args):
        return new_loss(args[0], rows(*args), args[reduction])

    def fake_backward(*args):
        if mask is None:
            return new_grad(args[1], True)
        return tuple(new_grad(t, wanted) for t, wanted in zip(args[1:], args[mask]))

    torch.library.register_fake(f"lossfuse::{name}")(fake)
    torch.library.register_fake(f"lossfuse::{name}_backward")(fake_backward)


def same_shape(input, *args):
    """rows for the elementwise losses: the input's shape."""
    return input.shape


def row_dims(input, *args):
    """rows for the losses over the last dim: every dim but the last."""
    return input.shape[:-1]


def register_loss(name, formula, n_tensors, n_grads, weight_grad=None, differentiable=None):
    """The autograd of a loss op lossfuse::<name>(*tensors, *scalars) whose backward op <name>_backward(grad_output,
    *tensors, *scalars[, output_mask]) gives the gradients of the first n_grads tensors (all of them by its output_mask,
    or the first alone where the schema has none). weight_grad(tensors, loss, grad_output, scalars): the gradient of
    tensor n_grads (a weight torch differentiates), computed here. formula(*tensors, *scalars): the loss by torch's
    differentiable ops, differentiated instead where a double backward may follow, and the tangent of forward mode
    (through the positions `differentiable`, default every tensor)."""
    backward_op = getattr(ops, name + "_backward")
    masked = "output_mask" in [a.name for a in backward_op.default._schema.arguments]
    n_wanted = n_grads + (weight_grad is not None)
    # the fused op where the loss has one (_<name>_fused: the loss and the masked gradients for an upstream gradient
    # of 1, one pass: the elementwise losses)
    fused_op = getattr(torch.ops.lossfuse, f"_{name}_fused", None)
    held_op = getattr(torch.ops.lossfuse, f"_{name}_backward_held", None)
    reduction_at = fused_op and [a.name for a in fused_op.default._schema.arguments].index("reduction")

    def fused_call(args, mask):
        """The fused op's gradients, one per differentiable operand (None where the mask is off; an op without a mask
        gives the first operand's alone, as its backward op), and its loss."""
        with _below_autograd():
            loss, *grads = fused_op.default(*args, mask) if masked else fused_op.default(*args)
        return loss, [g if w else None for g, w in zip(grads + [None] * (n_grads - len(grads)), mask)]

    def fused_forward(ctx, args):
        """A plain eager training step with reduction mean or sum, no weight gradient wanted: the fused op, its
        gradients kept on ctx (ctx.fused) for backward to hand over. None elsewhere (the forward op then)."""
        mask = list(ctx.needs_input_grad[:n_grads])
        if (args[reduction_at] == 0 or not (any(mask) if masked else mask[0]) or type(args[0]) not in _PLAIN
                or torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active() or forward_ad_active()
                or (weight_grad is not None and args[n_grads] is not None and ctx.needs_input_grad[n_grads])):
            return None
        loss, ctx.fused = fused_call(args, mask)
        ctx.fused_mask = mask
        return loss

    def handed_over(ctx, tensors, grad_output):
        """The fused forward's gradients for this upstream gradient, or None (the backward op then): handed over once,
        after the held backward op, which leaves them as they are for an upstream gradient of 1 and else writes the
        backward op's values over them (once rounded, as torch's), the test made on the upstream gradient's device:
        nothing is read back. A retained graph's next backward runs the fused op again, so that it gives the same bits
        (backward is reentrant, as gradcheck checks)."""
        mask = getattr(ctx, "fused_mask", None)
        if mask is None or not is_eager(grad_output) or torch._C._len_torch_dispatch_stack() > 0:
            return None  # (a traced backward, compiled autograd's say: the backward op, which has a fake)
        fused, ctx.fused = ctx.fused, None
        if fused is None:
            with cuda_check("nan"):  # the forward checked these inputs
                fused = fused_call((*tensors, *ctx.args), mask)[1]
        empty = grad_output.new_empty(0)
        with _below_autograd():
            held_op.default(grad_output, *tensors, *ctx.args, *([mask] if masked else []),
                            [g if g is not None else empty for g in fused])
        return fused

    def setup_context(ctx, inputs, output):
        ctx.args = tuple(inputs[n_tensors:])
        # the loss is needed by a weight's gradient only
        keep_loss = weight_grad is not None and inputs[n_grads] is not None and inputs[n_grads].requires_grad
        ctx.save_for_backward(*inputs[:n_tensors], output if keep_loss else None)

    def backward(ctx, grad_output):
        *tensors, loss = ctx.saved_tensors
        wanted = list(ctx.needs_input_grad[:n_wanted])
        grads = [None] * n_tensors
        if graph_needed(grad_output, tensors, wanted):  # a double backward may follow: a differentiable graph
            # in the loss's (accumulation) dtype, the dtype of grad_output; each gradient comes back in its tensor's
            acc = grad_output.dtype
            grads[:n_wanted] = differentiable_grads(
                lambda *ts: formula(*[t.to(acc) if t is not None and t.is_floating_point() else t for t in ts],
                                    *ctx.args),
                tensors, wanted + [False] * (n_tensors - n_wanted), grad_output)[:n_wanted]
            return (*grads, *[None] * len(ctx.args))
        mask = wanted[:n_grads]
        fused = handed_over(ctx, tensors, grad_output)
        if fused is not None:
            grads[:n_grads] = [g if w else None for g, w in zip(fused, mask)]
        elif masked and any(mask):
            computed = backward_op(grad_output, *tensors, *ctx.args, mask)
            grads[:n_grads] = [g if w else None for g, w in zip(computed, mask)]
        elif mask[0]:
            grads[0] = backward_op(grad_output, *tensors, *ctx.args)
        if weight_grad is not None and wanted[n_grads]:
            grads[n_grads] = weight_grad(tensors, loss, grad_output, ctx.args)
        return (*grads, *[None] * len(ctx.args))

    register_autograd(name, backward, setup_context,
                      lambda *inputs: formula(*in_acc_dtype(inputs[:n_tensors]), *inputs[n_tensors:]),
                      differentiable=differentiable, eager_forward=fused_forward if fused_op else None)
