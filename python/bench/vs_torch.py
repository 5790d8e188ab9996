"""lossfuse bench's rows against torch: each (loss, shape, dtype, forward or fwd+bwd) row of a `lossfuse bench --csv`
file timed again through Python, torch.nn.functional's loss and lossfuse.nn.functional's on the same inputs, the
calls interleaved (torch, lossfuse, torch, ...) on the same threads, medians of one run; and the row's C++ time from
the file beside them. Inputs follow the C++ bench's (N(0, 1) samples mapped into each loss's domain, reduction
'mean', default options); fwd+bwd is the loss then backward for the gradients the C++ row writes. `backward` rows (a
kernel alone, which torch has no call for) are left out. Run by `lossfuse bench` after its table when the source
tree's .venv exists (scripts/setup_python.sh; a note instead where torch or the package is missing); usage:
vs_torch.py ROWS_CSV [--threads N] [--quick] [--csv PATH].
"""

import argparse
import csv
import math
import os
import statistics
import sys
import time
import warnings

from torch_bench import _use_source_tree


def median_ms(pair, min_time, max_reps=50):
    """Median ms of each of the two calls, alternated: at least 3 calls each, then until min_time has passed."""
    for f in pair:  # warm-up
        f()
    times, start = ([], []), time.perf_counter()
    while len(times[0]) < 3 or (time.perf_counter() - start < min_time and len(times[0]) < max_reps):
        for f, t in zip(pair, times):
            t0 = time.perf_counter()
            f()
            t.append((time.perf_counter() - t0) * 1e3)
    return [statistics.median(t) for t in times]


def inputs(torch, loss, shape, dtype):
    """(the floating operands that get gradients, the other arguments, keyword options) of the C++ bench's row, or
    None for a loss this table does not know."""
    g = torch.Generator().manual_seed(7)

    def normal(*s, std=1.0):
        return torch.randn(*s, generator=g) * std

    sig = torch.sigmoid
    if loss == "cross_entropy":
        n, v = shape
        return [normal(n, v, std=2.0).to(dtype)], [torch.randint(0, v, (n,), generator=g)], {}
    if loss == "ctc":
        t, n, c, s = shape
        lp = normal(t, n, c, std=2.0).log_softmax(2).to(dtype)
        b = torch.arange(n)
        return [lp], [torch.randint(1, c, (n, s), generator=g), t - b % 5, s - b % 8], {}
    if loss in ("triplet_margin", "cosine_embedding", "multi_margin", "multilabel_margin", "multilabel_soft_margin"):
        n, d = shape
        x = normal(n, d)
        if loss == "triplet_margin":
            return [x.to(dtype), (x + normal(n, d, std=0.5)).to(dtype), (x + normal(n, d, std=0.5)).to(dtype)], [], {}
        if loss == "cosine_embedding":
            return [x.to(dtype), normal(n, d).to(dtype)], [torch.where(normal(n) >= 0, 1.0, -1.0).to(dtype)], {}
        if loss == "multi_margin":
            return [x.to(dtype)], [torch.randint(0, d, (n,), generator=g)], {}
        if loss == "multilabel_margin":
            labels = torch.full((n, d), -1, dtype=torch.int64)
            labels[:, :8] = torch.randint(0, d, (n, 8), generator=g)
            return [x.to(dtype)], [labels], {}
        return [x.to(dtype)], [(normal(n, d) >= 0).to(dtype)], {}
    if len(shape) != 1:
        return None
    (n,) = shape
    x, y, z = normal(n), normal(n), normal(n)
    sign = lambda v: torch.where(v >= 0, 1.0, -1.0)  # noqa: E731
    operands = {
        "mse": (x, [y]), "l1": (x, [y]), "smooth_l1": (x, [y]), "huber": (x, [y]), "bce": (sig(x), [sig(y)]),
        "bce_with_logits": (x, [sig(y)]), "kl_div": (-x.abs() - 0.1, [sig(y)]),
        "poisson_nll": (x, [(2 * y.abs()).floor()]), "gaussian_nll": (x, [y, 0.5 + z.abs()]),
        "hinge_embedding": (x, [sign(y)]), "margin_ranking": (x, [y, sign(z)]),
    }
    if loss not in operands:
        return None
    first, rest = operands[loss]
    return [first.to(dtype)], [r.to(dtype) for r in rest], {"reduction": "mean"} if loss == "kl_div" else {}


# the torch.nn.functional name of each bench loss (the same name in lossfuse.nn.functional)
FUNCTIONS = {"cross_entropy": "cross_entropy", "ctc": "ctc_loss", "bce": "binary_cross_entropy",
             "bce_with_logits": "binary_cross_entropy_with_logits", "kl_div": "kl_div"}


def main(argv):
    p = argparse.ArgumentParser(prog="vs_torch.py", description=__doc__.split("\n\n")[0])
    p.add_argument("rows", help="the CSV of a lossfuse bench run")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    p.add_argument("--quick", action="store_true", help="0.05 s per measurement instead of 0.3")
    p.add_argument("--csv", metavar="PATH", help="also write the rows as CSV")
    p.add_argument("--remove-rows", action="store_true", help="delete ROWS_CSV at the end (a temporary file)")
    args = p.parse_args(argv)
    try:
        return compare(args)
    finally:
        if args.remove_rows:
            os.remove(args.rows)


def compare(args):
    _use_source_tree(False)
    try:
        import torch
        import torch.nn.functional as F
        import lossfuse.nn.functional as LF
    except ImportError as e:
        print(f"\nlossfuse vs torch: skipped ({e}; scripts/setup_python.sh installs torch and the package)")
        return 0
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=".*reduction: 'mean' divides the total loss.*")  # kl_div's

    with open(args.rows, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["direction"] in ("forward", "fwd+bwd") and r["check"] == "ok"]
    dtypes = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16, "f16": torch.float16}
    print(f"\nlossfuse vs torch {torch.__version__} ({torch.get_num_threads()} threads): torch.nn.functional and "
          "lossfuse.nn.functional from Python, eager, the same inputs,\ncalls interleaved, medians of this run; "
          "C++ ms: the table above (the C++ API, no Python)\n")
    header = ["loss", "shape", "dtype", "direction", "torch ms", "lossfuse ms", "speedup", "C++ ms"]
    table = []
    for r in rows:
        loss, dtype, fwd_only = r["loss"], dtypes[r["dtype"]], r["direction"] == "forward"
        shape = tuple(int(s) for s in r["shape"].split("x"))
        made = inputs(torch, loss, shape, dtype)
        if made is None:
            print(f"{loss}: not compared (no inputs for it in vs_torch.py)", flush=True)
            continue
        grads, others, kw = made
        name = FUNCTIONS.get(loss, loss + "_loss")
        leaves = [a.requires_grad_(not fwd_only) for a in grads]

        def call(fn):
            def run():
                for a in leaves:
                    a.grad = None
                out = fn(*leaves, *others, **kw)
                if not fwd_only:
                    out.backward()
            return run

        with torch.no_grad() if fwd_only else torch.enable_grad():
            try:
                call(getattr(F, name))()
            except RuntimeError as e:  # a dtype torch's CPU kernel lacks: said, and the row left out
                print(f"{loss} {r['shape']} {r['dtype']}: torch: {str(e).splitlines()[0]}", flush=True)
                continue
            theirs, ours = median_ms([call(getattr(F, name)), call(getattr(LF, name))], 0.05 if args.quick else 0.3)
        table.append([loss, r["shape"], r["dtype"], r["direction"], f"{theirs:.4f}", f"{ours:.4f}",
                      f"{theirs / ours:.1f}x", f"{float(r['median_ms']):.4f}"])
        print("  ".join(table[-1]), file=sys.stderr, flush=True)  # progress
        del grads, others, leaves
    widths = [max(len(h), *(len(t[i]) for t in table)) if table else len(h) for i, h in enumerate(header)]
    for line in [header, ["-" * w for w in widths]] + table:
        print("  ".join(c.ljust(w) if i < 4 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))))
    if table:
        ratios = [float(t[4]) / float(t[5]) for t in table]
        print(f"\nlossfuse faster on {sum(q > 1 for q in ratios)} of {len(ratios)} rows; speedup over torch: "
              f"min {min(ratios):.1f}x, median {statistics.median(ratios):.1f}x, max {max(ratios):.1f}x "
              f"(geometric mean {math.exp(statistics.fmean(math.log(q) for q in ratios)):.1f}x)")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            csv.writer(f).writerows([["loss", "shape", "dtype", "direction", "torch_ms", "lossfuse_ms", "speedup",
                                      "cpp_ms"]] + [t[:6] + [t[6].rstrip("x"), t[7]] for t in table])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
