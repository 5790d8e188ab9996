"""The error matrix: each bad input below goes to lossfuse.nn.functional and to torch.nn.functional with the same
arguments; lossfuse must raise the exception class the row names, with a message naming the argument (its regex).
`python python/tests/test_error_matrix.py` rewrites docs/errors.md from this table (lossfuse's and torch's outcome
side by side); test_docs_table_is_current checks the lossfuse column and the rows there against a fresh run."""

import os
import re
import sys

import pytest
import torch
import torch.nn.functional as F

import lossfuse
import lossfuse.nn.functional as LF

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "errors.md")
Arg = lossfuse.ArgumentError


def r(*shape, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)


def u(*shape):  # in (0, 1)
    return torch.rand(shape, generator=torch.Generator().manual_seed(1)) * 0.98 + 0.01


def i(*values, dtype=torch.int64):
    return torch.tensor(values, dtype=dtype)


def ctc_args(T=6, N=2, C=5, S=3, targets=None, input_lengths=None, target_lengths=None):
    lp = r(T, N, C).log_softmax(2)
    tg = targets if targets is not None else torch.ones(N, S, dtype=torch.int64)
    il = input_lengths if input_lengths is not None else torch.full((N,), T, dtype=torch.int64)
    tl = target_lengths if target_lengths is not None else torch.full((N,), S, dtype=torch.int64)
    return lp, tg, il, tl


# (loss, bad input, function name, args, kwargs, lossfuse's exception class, regex its message matches); None, None:
# an input that looks bad but is valid, accepted as torch accepts it (the row checks that it stays accepted)
ROWS = [
    ("cross_entropy", "class index = C", "cross_entropy", (r(4, 5), i(0, 1, 5, 2)), {}, IndexError, r"target.*5"),
    ("cross_entropy", "class index -1 (not ignore_index)", "cross_entropy", (r(4, 5), i(0, -1, 2, 2)), {},
     IndexError, r"target.*-1"),
    ("cross_entropy", "uint8 class index = C", "cross_entropy", (r(4, 5), i(0, 1, 5, 2, dtype=torch.uint8)), {},
     IndexError, r"target.*5"),
    ("cross_entropy", "int16 class index past C", "cross_entropy", (r(3, 5), i(300, 1, 2, dtype=torch.int16)), {},
     IndexError, r"target.*300"),
    ("cross_entropy", "target rows != input rows", "cross_entropy", (r(4, 5), i(0, 1, 2)), {}, RuntimeError,
     r"target"),
    ("cross_entropy", "target of 2 dims for (N, C) input", "cross_entropy", (r(4, 5), i(0, 1, 2, 3).view(2, 2)), {},
     RuntimeError, r"target"),
    ("cross_entropy", "weight of C + 1 classes", "cross_entropy", (r(4, 5), i(0, 1, 2, 3), r(6)), {}, RuntimeError,
     r"weight"),
    ("cross_entropy", "weight of another float dtype", "cross_entropy", (r(4, 5), i(0, 1, 2, 3), r(5).double()), {},
     RuntimeError, r"weight"),
    ("cross_entropy", "label_smoothing = 1.5", "cross_entropy", (r(4, 5), i(0, 1, 2, 3)), {"label_smoothing": 1.5},
     RuntimeError, r"label_smoothing"),
    ("cross_entropy", "label_smoothing = NaN", "cross_entropy", (r(4, 5), i(0, 1, 2, 3)),
     {"label_smoothing": float("nan")}, None, None),
    ("cross_entropy", "reduction = 'avg'", "cross_entropy", (r(4, 5), i(0, 1, 2, 3)), {"reduction": "avg"},
     ValueError, r"reduction|avg"),
    ("cross_entropy", "probability target of another shape", "cross_entropy", (r(4, 5), u(4, 6)), {},
     RuntimeError, r"target"),
    ("cross_entropy", "probability target with ignore_index", "cross_entropy", (r(4, 5), u(4, 5)),
     {"ignore_index": 1}, RuntimeError, r"ignore_index"),
    ("cross_entropy", "integer logits", "cross_entropy", (i(1, 2, 3, 4).view(2, 2), i(0, 1)), {}, RuntimeError,
     r"input|logits|dtype"),
    ("cross_entropy", "float target of integer values", "cross_entropy", (r(4, 5), r(4)), {}, RuntimeError,
     r"target"),
    ("cross_entropy", "0-d input", "cross_entropy", (r(), i(0).view(())), {}, RuntimeError, r"input.*0-d"),
    ("cross_entropy", "softcap = -1 (lossfuse extra)", "cross_entropy", (r(4, 5), i(0, 1, 2, 3)), {"softcap": -1.0},
     RuntimeError, r"softcap"),
    ("cross_entropy", "z_loss_scale = inf (lossfuse extra)", "cross_entropy", (r(4, 5), i(0, 1, 2, 3)),
     {"z_loss_scale": float("inf")}, RuntimeError, r"z_loss_scale"),
    ("cross_entropy", "logit_scale = NaN (lossfuse extra)", "cross_entropy", (r(4, 5), i(0, 1, 2, 3)),
     {"logit_scale": float("nan")}, RuntimeError, r"logit_scale"),
    ("nll_loss", "class index = C", "nll_loss", (r(4, 5), i(0, 1, 5, 2)), {}, IndexError, r"target.*5"),
    ("nll_loss", "int32 class index -7", "nll_loss", (r(4, 5), i(0, -7, 1, 2, dtype=torch.int32)), {},
     IndexError, r"target.*-7"),
    ("nll_loss", "0-d input", "nll_loss", (r(), i(0).view(())), {}, ValueError, r"input.*0-d"),
    ("nll_loss", "3-d input with 1-d target", "nll_loss", (r(2, 5, 3), i(0, 1)), {}, RuntimeError, r"target"),
    ("nll_loss", "weight of C - 1 classes", "nll_loss", (r(4, 5), i(0, 1, 2, 3), r(4)), {}, RuntimeError,
     r"weight"),
    ("mse_loss", "shapes that do not broadcast", "mse_loss", (r(3, 4), r(3, 5)), {}, RuntimeError, r"target|shape"),
    ("mse_loss", "reduction = 'total'", "mse_loss", (r(3), r(3)), {"reduction": "total"}, ValueError,
     r"reduction|total"),
    ("mse_loss", "integer input", "mse_loss", (i(1, 2), i(1, 2)), {}, RuntimeError, r"input|dtype"),
    ("l1_loss", "shapes that do not broadcast", "l1_loss", (r(2, 3), r(4, 3)), {}, RuntimeError, r"target|shape"),
    ("smooth_l1_loss", "beta = -1", "smooth_l1_loss", (r(3), r(3)), {"beta": -1.0}, RuntimeError, r"beta"),
    ("huber_loss", "delta = 0", "huber_loss", (r(3), r(3)), {"delta": 0.0}, RuntimeError, r"delta"),
    ("huber_loss", "delta = -2", "huber_loss", (r(3), r(3)), {"delta": -2.0}, RuntimeError, r"delta"),
    ("binary_cross_entropy", "input 1.5 (outside [0, 1])", "binary_cross_entropy", (torch.tensor([0.5, 1.5]),
     torch.tensor([0.0, 1.0])), {}, RuntimeError, r"input"),
    ("binary_cross_entropy", "input NaN", "binary_cross_entropy", (torch.tensor([0.5, float("nan")]),
     torch.tensor([0.0, 1.0])), {}, RuntimeError, r"input"),
    ("binary_cross_entropy", "target of another shape", "binary_cross_entropy", (u(3), u(4)), {}, ValueError,
     r"target|size"),
    ("binary_cross_entropy", "weight that does not broadcast", "binary_cross_entropy", (u(2, 3), u(2, 3), r(4)), {},
     RuntimeError, r"weight"),
    ("binary_cross_entropy_with_logits", "target of another shape", "binary_cross_entropy_with_logits",
     (r(3), u(4)), {}, ValueError, r"target|size"),
    ("binary_cross_entropy_with_logits", "pos_weight that does not broadcast", "binary_cross_entropy_with_logits",
     (r(2, 3), u(2, 3)), {"pos_weight": r(4)}, RuntimeError, r"pos_weight"),
    ("kl_div", "shapes that do not broadcast", "kl_div", (r(2, 3), u(2, 4)), {}, RuntimeError, r"target|shape"),
    ("kl_div", "reduction = 'mean_batch'", "kl_div", (r(2, 3), u(2, 3)), {"reduction": "mean_batch"},
     ValueError, r"reduction|mean_batch"),
    ("poisson_nll_loss", "shapes that do not broadcast", "poisson_nll_loss", (r(2, 3), u(3, 2)), {}, RuntimeError,
     r"target|shape"),
    ("gaussian_nll_loss", "var < 0", "gaussian_nll_loss", (r(3), r(3), torch.tensor([1.0, -1.0, 1.0])), {},
     ValueError, r"var"),
    ("gaussian_nll_loss", "var of an unbroadcastable shape", "gaussian_nll_loss", (r(2, 3), r(2, 3), u(2, 2)), {},
     ValueError, r"var"),
    ("gaussian_nll_loss", "reduction = 'max'", "gaussian_nll_loss", (r(3), r(3), u(3)), {"reduction": "max"},
     ValueError, r"reduction|max"),
    ("hinge_embedding_loss", "shapes that do not broadcast", "hinge_embedding_loss", (r(2, 3), r(3, 2).sign()), {},
     RuntimeError, r"target|shape"),
    ("margin_ranking_loss", "input2 of another shape", "margin_ranking_loss", (r(3), r(4), r(3).sign()), {},
     RuntimeError, r"input2|shape"),
    ("margin_ranking_loss", "0-d inputs (one pair)", "margin_ranking_loss", (r(), r(), r().sign()), {}, None, None),
    ("triplet_margin_loss", "positive of another feature size", "triplet_margin_loss", (r(2, 3), r(2, 4), r(2, 3)),
     {}, RuntimeError, r"positive|shape"),
    ("triplet_margin_loss", "margin = 0", "triplet_margin_loss", (r(2, 3), r(2, 3), r(2, 3)), {"margin": 0.0},
     ValueError, r"margin"),
    ("triplet_margin_loss", "3-d operands (rows over the leading dims)", "triplet_margin_loss",
     (r(2, 3, 4), r(2, 3, 4), r(2, 3, 4)), {}, None, None),
    ("cosine_embedding_loss", "target of another batch", "cosine_embedding_loss", (r(3, 4), r(3, 4), r(2).sign()),
     {}, RuntimeError, r"target"),
    ("cosine_embedding_loss", "input2 of another feature size", "cosine_embedding_loss",
     (r(3, 4), r(3, 5), r(3).sign()), {}, RuntimeError, r"input2|shape"),
    ("multi_margin_loss", "class index = C", "multi_margin_loss", (r(3, 4), i(0, 4, 1)), {}, RuntimeError,
     r"target.*4"),
    ("multi_margin_loss", "p = 3", "multi_margin_loss", (r(3, 4), i(0, 1, 2)), {"p": 3}, ValueError, r"\bp\b"),
    ("multi_margin_loss", "weight of C + 1 classes", "multi_margin_loss", (r(3, 4), i(0, 1, 2)), {"weight": r(5)},
     RuntimeError, r"weight"),
    ("multilabel_margin_loss", "label = C", "multilabel_margin_loss", (r(2, 4), i(0, 4, -1, 0, 1, 2, 3, -1)
     .view(2, 4)), {}, RuntimeError, r"target.*4"),
    ("multilabel_margin_loss", "target of another shape", "multilabel_margin_loss", (r(2, 4), i(0, 1, -1)), {},
     RuntimeError, r"target"),
    ("multilabel_soft_margin_loss", "target of another shape", "multilabel_soft_margin_loss", (r(2, 4), u(2, 5)),
     {}, RuntimeError, r"target|shape"),
    ("multilabel_soft_margin_loss", "weight of C + 1 classes", "multilabel_soft_margin_loss", (r(2, 4), u(2, 4)),
     {"weight": r(5)}, RuntimeError, r"weight"),
    ("ctc_loss", "blank = C", "ctc_loss", ctc_args(), {"blank": 5}, RuntimeError, r"blank"),
    ("ctc_loss", "target label = blank", "ctc_loss", ctc_args(targets=torch.zeros(2, 3, dtype=torch.int64)), {},
     IndexError, r"targets.*got 0 at position"),
    ("ctc_loss", "target label = C", "ctc_loss", ctc_args(targets=torch.full((2, 3), 5, dtype=torch.int64)), {},
     IndexError, r"targets.*got 5 at position"),
    ("ctc_loss", "input_length > T", "ctc_loss", ctc_args(input_lengths=i(6, 7)), {}, RuntimeError,
     r"input_length"),
    ("ctc_loss", "target_length > S", "ctc_loss", ctc_args(target_lengths=i(3, 4)), {}, RuntimeError,
     r"target_length"),
    ("ctc_loss", "negative target_length", "ctc_loss", ctc_args(target_lengths=i(3, -1)), {}, RuntimeError,
     r"target_length"),
    ("ctc_loss", "input_lengths of another batch", "ctc_loss", ctc_args(input_lengths=i(6, 6, 6)), {},
     RuntimeError, r"input_lengths"),
    ("linear_cross_entropy", "class index = V", "linear_cross_entropy", (r(3, 4), r(6, 4), i(0, 6, 1)), {},
     IndexError, r"target.*6"),
    ("linear_cross_entropy", "weight of another in_features", "linear_cross_entropy", (r(3, 4), r(6, 5),
     i(0, 1, 2)), {}, RuntimeError, r"linear_weight"),
    ("linear_cross_entropy", "bias of V + 1", "linear_cross_entropy", (r(3, 4), r(6, 4), i(0, 1, 2)),
     {"linear_bias": r(7)}, RuntimeError, r"linear_bias"),
    ("linear_cross_entropy", "target rows != input rows", "linear_cross_entropy", (r(3, 4), r(6, 4), i(0, 1)), {},
     RuntimeError, r"target"),
]
IDS = [f"{n:02d}-{row[0]}-{re.sub(r'[^a-z0-9]+', '_', row[1].lower()).strip('_')}" for n, row in enumerate(ROWS)]


def outcome(fn, args, kwargs):
    """'ok' or 'ExceptionClass: first line of its message' (lossfuse's prefix dropped, at most 110 characters)."""
    try:
        fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001  (the outcome is the record)
        text = str(e).splitlines()[0].replace("lossfuse: ", "") if str(e) else ""
        text = text if len(text) <= 110 else text[:107] + "..."
        name = "ArgumentError" if isinstance(e, Arg) else type(e).__name__
        return f"{name}: {text}".replace("|", "\\|")
    return "ok"


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_lossfuse_raises_the_rows_error(row):
    _, _, name, args, kwargs, error, pattern = row
    if error is None:
        getattr(LF, name)(*args, **kwargs)
        return
    with pytest.raises(error) as info:
        getattr(LF, name)(*args, **kwargs)
    assert re.search(pattern, str(info.value)), str(info.value)


def table():
    lines = ["| # | loss | bad input | lossfuse | torch " + torch.__version__.split("+")[0] + " |",
             "|---|---|---|---|---|"]
    for n, (loss, what, name, args, kwargs, _, _) in enumerate(ROWS):
        extra = "lossfuse extra" in what
        theirs = "(no such option)" if extra else outcome(getattr(F, name), args, kwargs)
        lines.append(f"| {n} | {loss} | {what} | {outcome(getattr(LF, name), args, kwargs)} | {theirs} |")
    return lines


def test_docs_table_is_current():
    """docs/errors.md lists these rows with lossfuse's outcome of a fresh run (torch's column may follow another
    torch release: it is not compared)."""
    with open(DOC) as f:
        doc = [line for line in f.read().splitlines() if re.match(r"\| \d+ \|", line)]
    fresh = [line for line in table() if re.match(r"\| \d+ \|", line)]
    assert len(ROWS) >= 60
    assert [line.rsplit(" | ", 1)[0] for line in doc] == [line.rsplit(" | ", 1)[0] for line in fresh]


HEADER = """# Errors: what each bad input gets

Each row is a bad input given to `lossfuse.nn.functional` and to `torch.nn.functional` with the same arguments
(small CPU tensors), and the first line of what each raised. Every row is a test
(`python/tests/test_error_matrix.py`: lossfuse raises the row's exception class, its message naming the argument);
`.venv/bin/python python/tests/test_error_matrix.py` rewrites this page. `ArgumentError` is lossfuse's, both a
`ValueError` and a `RuntimeError` (torch raises one or the other, by loss and argument); a bad class index is an
`IndexError` with its position and value. Nothing is written to an output when a call fails (the C++ suite checks
this on sentinel-filled outputs: tests/error_harness.hpp).

"""

if __name__ == "__main__":
    with open(DOC, "w") as f:
        f.write(HEADER + "\n".join(table()) + "\n")
    print(f"wrote {DOC}", file=sys.stderr)
