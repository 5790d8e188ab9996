"""vmap rules for the lossfuse ops: torch.func.vmap over a loss, and per-sample gradients, vmap(grad(loss)).

Two kinds of rule.
- Fold (the elementwise losses, cross_entropy, nll_loss, the margin losses and their backward ops): the mapped dim
  becomes more elements or more rows of one kernel call with reduction 'none', and each sample's reduction (sum,
  mean, the weighted mean of class targets, kl_div's batchmean) is taken from that call's per-element or per-row
  losses. A backward op gets each sample's upstream gradient spread over the sample's elements or rows, scaled as
  the sample's reduction would scale it. A loss element or row depends on nothing outside itself, so each sample gets
  what the op gives it alone, but for the order of the additions in its sum.
- Loop (every other op, and what a fold does not cover: operands of different per-sample shapes, class weights that
  are mapped themselves, inputs of more than two dims per sample, an empty mapped dim): the op once per entry on
  that entry's slices, and the results stacked along a new dim 0. Every option, reduction and check then applies per
  sample exactly as without vmap, as torch defines vmap; the cost is one op call per entry.
"""

import math

import torch

from ._args import CeOptions
from ._func import forward_mode_missed

_MAX_DIMS = 8  # lossfuse::kMaxDims


def _entry_shape(a, d):
    return tuple(a.shape) if d is None else tuple(a.shape[:d] + a.shape[d + 1:])


def _batched(a, d, n):
    """a with its mapped dim first; an unmapped a expanded to n entries (a stride-0 view, which the kernels read)."""
    return a.movedim(d, 0) if d is not None else a.expand(n, *a.shape)


# ---- loop --------------------------------------------------------------------------------------------------------


def _by_entries(op, info, in_dims, args):
    n = info.batch_size
    if n == 0:  # no entry to run: the shapes of one entry's results, from the op's fake implementation
        entry = [torch.empty(_entry_shape(a, d), dtype=a.dtype, device="meta")
                 if d is not None and isinstance(a, torch.Tensor) else
                 (a.to("meta") if isinstance(a, torch.Tensor) else a) for a, d in zip(args, in_dims)]
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        results = op(*entry)
        several = isinstance(results, (tuple, list))
        empty = [torch.empty((0, *r.shape), dtype=r.dtype, device=device) for r in (results if several else [results])]
        return (tuple(empty), (0,) * len(empty)) if several else (empty[0], 0)
    results = []
    for i in range(n):
        results.append(op(*[a.select(d, i) if d is not None and isinstance(a, torch.Tensor) else a
                             for a, d in zip(args, in_dims)]))
    if isinstance(results[0], (tuple, list)):
        outs = tuple(torch.stack([r[k] for r in results]) for k in range(len(results[0])))
        return outs, (0,) * len(outs)
    return torch.stack(results), 0


def _vmap_by_entries(op):
    return lambda info, in_dims, *args: _by_entries(op, info, in_dims, args)


def _outputs(result, n):
    if not isinstance(result, (tuple, list)):
        return result, 0
    # a gradient the output_mask leaves out is (0) per call: (n, 0) for n entries, as the loop stacks them
    result = tuple(r.new_empty((n, 0)) if r.dim() == 1 and r.shape[0] == 0 and n else r for r in result)
    return result, (0,) * len(result)


def _spread(go, n, shape, divisor):
    """Per-sample upstream gradients (n) as per-element ones (n, *shape), divided by the samples' divisors."""
    g = go if divisor is None else go / divisor
    return g.reshape(n, *[1] * len(shape)).expand(n, *shape)


# ---- fold: the elementwise losses ----------------------------------------------------------------------------------
# Their ops take operands of one shape (the functions broadcast them first, as expanded views) and reduce over every
# element; mse_loss and l1_loss divide a weighted mean by the weight's sum, the others by the element count.

_ELEMENTWISE = {"mse_loss": True, "l1_loss": True, "smooth_l1_loss": False, "huber_loss": False, "kl_div": False,
                "hinge_embedding_loss": False, "margin_ranking_loss": False, "binary_cross_entropy": False,
                "binary_cross_entropy_with_logits": False, "poisson_nll_loss": False, "gaussian_nll_loss": False}


class _Elementwise:
    def __init__(self, op, weight_mean, first):
        """first: the position of the first operand (1 for a backward op, after grad_output)."""
        names = [a.name for a in op._schema.arguments]
        self.op, self.first = op, first
        self.reduction = names.index("reduction")
        self.batchmean = names.index("batchmean") if "batchmean" in names else None
        self.weight = names.index("weight") if weight_mean else None

    def prepare(self, info, in_dims, args):
        """The operands with the mapped dim first, the per-sample shape, the reduction and its divisor (None for a
        sum); None where the fold does not apply."""
        n = info.batch_size
        # compared pairwise, not gathered in a set: under torch.compile(dynamic=True) a shape holds SymInts, which do
        # not hash
        shapes = [_entry_shape(a, d) for a, d in zip(args[self.first:], in_dims[self.first:])
                  if isinstance(a, torch.Tensor)]
        if n == 0 or not shapes or any(s != shapes[0] for s in shapes[1:]):
            return None
        shape = shapes[0]
        if args[self.reduction] not in (0, 1, 2) or len(shape) >= _MAX_DIMS or (
                self.batchmean is not None and args[self.batchmean] and args[self.reduction] != 1):
            return None  # the op's own error per entry; or samples of kMaxDims dims, one more once folded
        if self.first and _entry_shape(args[0], in_dims[0]) != (shape if args[self.reduction] == 0 else ()):
            return None  # an upstream gradient of another shape: the op's own error (or (1) accepted), per entry
        args = list(args)
        for i in range(self.first, len(args)):
            if isinstance(args[i], torch.Tensor):
                args[i] = _batched(args[i], in_dims[i], n)
        reduction = args[self.reduction]
        batchmean = self.batchmean is not None and args[self.batchmean]
        args[self.reduction] = 0
        if batchmean:
            args[self.batchmean] = False
            divisor = shape[0] if shape else 1
        elif reduction == 1:
            weight = args[self.weight] if self.weight is not None else None
            divisor = math.prod(shape) if weight is None else weight.reshape(n, -1).to(torch.float64).sum(1)
        else:
            divisor = None
        return args, shape, reduction != 0 or batchmean, divisor

    def forward(self, info, in_dims, *args):
        prepared = self.prepare(info, in_dims, args)
        if prepared is None:
            return _by_entries(self.op, info, in_dims, args)
        args, _, reduced, divisor = prepared
        loss = self.op(*args)  # (n, *shape), float32 (float64 for float64 operands)
        if not reduced:
            return loss, 0
        total = loss.reshape(info.batch_size, -1).sum(1)
        return (total if divisor is None else (total / divisor).to(loss.dtype)), 0

    def backward(self, info, in_dims, *args):
        prepared = self.prepare(info, in_dims, args)
        if prepared is None:
            return _by_entries(self.op, info, in_dims, args)
        args, shape, reduced, divisor = prepared
        n = info.batch_size
        go = _batched(args[0], in_dims[0], n)
        if reduced:
            go = _spread(go.to(torch.float64) if isinstance(divisor, torch.Tensor) else go, n, shape, divisor)
            go = go.to(args[0].dtype)
        args[0] = go
        return _outputs(self.op(*args), n)


# ---- fold: cross_entropy and nll_loss --------------------------------------------------------------------------------
# Inputs (C) or (N, C) per sample become the rows of one (rows, C) call; (C) takes a 0-d class index or (C)
# probabilities, (N, C) takes (N) or (N, C). The mean of class indices divides by the sum of the target classes'
# weights over the rows not ignored (their count without weights); the mean of probabilities by the row count.


class _Classes:
    def __init__(self, op, first):
        names = self.names = [a.name for a in op._schema.arguments]
        self.op, self.first = op, first
        self.input, self.target, self.weight = names.index("input"), names.index("target"), names.index("weight")
        self.reduction, self.ignore = names.index("reduction"), names.index("ignore_index")

    def prepare(self, info, in_dims, args):
        """The rows of every sample as one problem: (args, per-sample input shape, reduction, per-row divisor of a
        mean), or None where the fold does not apply."""
        n = info.batch_size
        input, target, weight = args[self.input], args[self.target], args[self.weight]
        if n == 0 or (weight is not None and in_dims[self.weight] is not None) or args[self.reduction] not in (0, 1, 2):
            return None
        shape = _entry_shape(input, in_dims[self.input])
        soft = target.is_floating_point()
        if len(shape) not in (1, 2) or _entry_shape(target, in_dims[self.target]) != (shape if soft else shape[:-1]):
            return None
        if self.first and (_entry_shape(args[0], in_dims[0]) != (shape[:-1] if args[self.reduction] == 0 else ())
                           or ("lse" in self.names and _entry_shape(args[self.names.index("lse")],
                                                                      in_dims[self.names.index("lse")]) != shape[:-1])):
            return None  # upstream gradient or lse of another shape: the op's own check, per entry
        rows, c = n * math.prod(shape[:-1]), shape[-1]
        args = list(args)
        for i in range(self.first, len(args)):
            if isinstance(args[i], torch.Tensor) and i != self.weight:
                a = _batched(args[i], in_dims[i], n)
                args[i] = a.reshape(rows, c) if i == self.input or (i == self.target and soft) else a.reshape(rows)
        reduction = args[self.reduction]
        args[self.reduction] = 0
        return args, shape, reduction

    def divisor(self, args, n, shape, loss=False):
        """Each sample's mean divisor (n), float64, after the op has checked the targets. loss: the loss's and its
        gradient's, NaN for a sample whose kept rows' target weights sum to 0 when cross-entropy has a label smoothing
        or z-loss term (torch divides each term on its own: 0/0 + s/0; the kernels' split_mean_denominator)."""
        target, weight = args[self.target], args[self.weight]
        if target.is_floating_point():
            return torch.full((n,), math.prod(shape[:-1]), dtype=torch.float64, device=target.device)
        valid = target.long() != args[self.ignore]
        if weight is None:
            w = valid.to(torch.float64)
        else:
            w = torch.where(valid, weight.to(torch.float64)[torch.where(valid, target.long(), 0)], 0.0)
        total = w.reshape(n, -1).sum(1)
        if loss and any(name in self.names and args[self.names.index(name)] != 0
                        for name in ("label_smoothing", "z_loss_scale")):
            split = (total == 0) & valid.reshape(n, -1).any(1)
            if weight is not None:
                split = split & (weight >= 0).all()  # negative weights that cancel: the sum over 0, as the kernels
            total = torch.where(split, math.nan, total)
        return total

    def row_scales(self, args, n, shape, per_sample):
        """Per-sample factors (n) as per-row ones, 0 on the ignored rows (whose gradient the kernels leave 0 however
        the sample's mean scales it, also by 1 / 0)."""
        rows = _spread(per_sample, n, (math.prod(shape[:-1]),), None).reshape(-1)
        target = args[self.target]
        return rows if target.is_floating_point() else torch.where(target.long() != args[self.ignore], rows, 0.0)


class _CrossEntropy(_Classes):
    def __init__(self):
        super().__init__(torch.ops.lossfuse.cross_entropy.default, 0)

    def __call__(self, info, in_dims, *args):
        prepared = self.prepare(info, in_dims, args)
        if prepared is None:
            return _by_entries(self.op, info, in_dims, args)
        args, shape, reduction = prepared
        n, compute_grad = info.batch_size, args[-1]
        input = args[self.input]
        if reduction == 1 and compute_grad and input.element_size() < 4:
            args[-1] = False  # the gradient below, from the backward op: a 16-bit one rounded once
        loss, lse, z_loss, grad = self.op(*args)
        per_row = shape[:-1]
        lse = lse.reshape(n, *per_row)
        if reduction == 0:
            loss, z_loss = loss.reshape(n, *per_row), z_loss.reshape(n, *per_row)
        else:
            divisor = self.divisor(args, n, shape, loss=True) if reduction == 1 else None
            loss = self._reduce(loss, n, divisor)
            z_loss = self._reduce(z_loss, n, self.divisor(args, n, shape) if reduction == 1 else None)
        if not compute_grad:
            grad = input.new_empty((n, 0))
        else:
            if reduction == 1:
                scale = self.row_scales(args, n, shape, 1.0 / divisor)
                if args[-1]:
                    grad = (grad * scale.unsqueeze(1)).to(grad.dtype)
                else:
                    upstream = scale.to(torch.float64 if input.dtype == torch.float64 else torch.float32)
                    grad = torch.ops.lossfuse.cross_entropy_backward(
                        upstream, input, args[self.target], lse.reshape(-1), args[self.weight],
                        *CeOptions(*args[3:9])._replace(reduction=0))
            grad = grad.reshape(n, *shape)
        return (loss, lse, z_loss, grad), (0, 0, 0, 0)

    @staticmethod
    def _reduce(t, n, divisor):
        total = t.reshape(n, -1).sum(1)
        return total if divisor is None else (total / divisor).to(t.dtype)


class _ClassesBackward(_Classes):
    """cross_entropy_backward and nll_loss_backward: (grad_output, input, target, ...)."""

    def __init__(self, op):
        super().__init__(op, 1)

    def __call__(self, info, in_dims, *args):
        prepared = self.prepare(info, in_dims, args)
        if prepared is None:
            return _by_entries(self.op, info, in_dims, args)
        args, shape, reduction = prepared
        n, per_row = info.batch_size, shape[:-1]
        go = _batched(args[0], in_dims[0], n)
        if reduction == 0:
            go = go.reshape(-1)
        elif reduction == 2:
            go = _spread(go, n, (math.prod(per_row),), None).reshape(-1)
        else:
            go = go.to(torch.float64) / self.divisor(args, n, shape, loss=True)
            go = self.row_scales(args, n, shape, go).to(args[0].dtype)
        args[0] = go
        return self.op(*args).reshape(n, *shape), 0


class _Nll(_Classes):
    def __init__(self):
        super().__init__(torch.ops.lossfuse.nll_loss.default, 0)

    def __call__(self, info, in_dims, *args):
        prepared = self.prepare(info, in_dims, args)
        if prepared is None:
            return _by_entries(self.op, info, in_dims, args)
        args, shape, reduction = prepared
        n = info.batch_size
        loss = self.op(*args)
        if reduction == 0:
            return loss.reshape(n, *shape[:-1]), 0
        total = loss.reshape(n, -1).sum(1)
        return (total if reduction == 2 else (total / self.divisor(args, n, shape)).to(loss.dtype)), 0


# ---- fold: the row losses (margin losses) -------------------------------------------------------------------------
# multi_margin, multilabel_margin, multilabel_soft_margin, triplet_margin and cosine_embedding: each sample is (N, F)
# or (F) (one row) for the first operand, and every other tensor operand is of that shape or per row ((N) or ()); a
# class weight, unmapped, is shared. The rows of every sample become the rows of one call with reduction 'none';
# torch's 'mean' of these losses is over the rows.

_ROWS = ("multi_margin_loss", "multilabel_margin_loss", "multilabel_soft_margin_loss", "triplet_margin_loss",
         "cosine_embedding_loss")


class _Rows:
    def __init__(self, op, first):
        names = [a.name for a in op._schema.arguments]
        self.op, self.first = op, first
        self.reduction = names.index("reduction")
        self.weight = names.index("weight") if "weight" in names else None

    def prepare(self, info, in_dims, args):
        """(args with the samples' rows as the rows of one call, the per-sample shape of the first operand, its rows
        per sample, the reduction), or None where the fold does not apply."""
        n = info.batch_size
        if n == 0 or args[self.reduction] not in (0, 1, 2):
            return None
        first = args[self.first]
        shape = _entry_shape(first, in_dims[self.first])
        if len(shape) not in (1, 2):
            return None
        rows = shape[0] if len(shape) == 2 else 1
        args = list(args)
        for i in range(self.first, len(args)):
            a = args[i]
            if not isinstance(a, torch.Tensor):
                continue
            if i == self.weight:
                if in_dims[i] is not None or a.dim() > 1:
                    return None  # a weight per sample or per row: the loop
                continue
            entry = _entry_shape(a, in_dims[i])
            if entry == shape:
                args[i] = _batched(a, in_dims[i], n).reshape(n * rows, shape[-1])
            elif entry == shape[:-1]:
                args[i] = _batched(a, in_dims[i], n).reshape(n * rows)
            else:
                return None  # broadcast or mismatched operands: the op's own rules, per entry
        if self.first and _entry_shape(args[0], in_dims[0]) != (shape[:-1] if args[self.reduction] == 0 else ()):
            return None  # an upstream gradient of another shape: the op's own error, per entry
        reduction = args[self.reduction]
        args[self.reduction] = 0
        return args, shape, rows, reduction

    def forward(self, info, in_dims, *args):
        prepared = self.prepare(info, in_dims, args)
        if prepared is None:
            return _by_entries(self.op, info, in_dims, args)
        args, shape, rows, reduction = prepared
        n = info.batch_size
        loss = self.op(*args)  # (n * rows), float32 (float64 for float64 operands)
        if reduction == 0:
            return loss.reshape(n, *shape[:-1]), 0
        total = loss.reshape(n, rows).sum(1)
        return (total if reduction == 2 else total / rows), 0  # an empty sample's mean: 0 / 0, NaN as torch

    def backward(self, info, in_dims, *args):
        prepared = self.prepare(info, in_dims, args)
        if prepared is None:
            return _by_entries(self.op, info, in_dims, args)
        args, shape, rows, reduction = prepared
        n = info.batch_size
        go = _batched(args[0], in_dims[0], n)
        if reduction == 0:
            go = go.reshape(n * rows)
        else:
            go = _spread(go, n, (rows,), rows if reduction == 1 else None).reshape(n * rows).to(args[0].dtype)
        args[0] = go
        result = self.op(*args)
        several = isinstance(result, (tuple, list))
        # each gradient of a folded operand back to (n, its per-sample shape); one left out by output_mask is (0)
        full = n * math.prod(shape)
        grads = [g if g.dim() == 1 and g.numel() == 0 and full else g.reshape(n, *shape)
                 for g in (result if several else [result])]
        return _outputs(tuple(grads) if several else grads[0], n)


def register_vmap_rules():
    """vmap rules for every public lossfuse op that returns tensors (not the internal ops named with a leading
    underscore)."""
    lib = torch.ops.lossfuse
    folds = {"cross_entropy": _CrossEntropy(), "nll_loss": _Nll(),
             "cross_entropy_backward": _ClassesBackward(lib.cross_entropy_backward.default),
             "nll_loss_backward": _ClassesBackward(lib.nll_loss_backward.default)}
    for name in _ROWS:
        folds[name] = _Rows(getattr(lib, name).default, 0).forward
        folds[name + "_backward"] = _Rows(getattr(lib, name + "_backward").default, 1).backward
    for name, weight_mean in _ELEMENTWISE.items():
        folds[name] = _Elementwise(getattr(lib, name).default, weight_mean, 0).forward
        folds[name + "_backward"] = _Elementwise(getattr(lib, name + "_backward").default, weight_mean, 1).backward
    for qualname in torch._C._dispatch_get_all_op_names():
        namespace, _, name = qualname.partition("::")
        if namespace != "lossfuse" or name.startswith("_"):
            continue
        op = getattr(lib, name).default
        if op._schema.is_mutable or not op._schema.returns:
            continue
        rule = folds.get(name) or _vmap_by_entries(op)
        torch.library.register_vmap(qualname, _refusing_missed_forward_mode(name, rule))


def _refusing_missed_forward_mode(name, rule):
    def checked(info, in_dims, *args, **kwargs):
        if forward_mode_missed():
            raise NotImplementedError(
                f"lossfuse: {name}: forward-mode AD (jvp, jacfwd) of a vmapped loss inside torch.compile is not "
                "supported; call the transform outside torch.compile, or vmap inside the forward-mode transform")
        return rule(info, in_dims, *args, **kwargs)
    return checked
