#!/usr/bin/env python3
"""lossfuse's fused linear cross-entropy vs PyTorch: time and peak memory, in one run.

Contenders, on the same inputs and threads, per (BT, H, V) shape and dtype:
  ours[S]    lossfuse.nn.functional.linear_cross_entropy(x, W, t, linear_bias=b, strategy=S) for each strategy S
             of --strategies ('auto': gradients made in the forward, chunk by chunk; 'recompute': the forward
             keeps the per-row log-sum-exp and backward recomputes the logits; 'chunked' = 'auto' here)
  torch_lce  torch.nn.functional.linear_cross_entropy(x, W, t, linear_bias=b,
             options=torch.nn.LinearCrossEntropyOptions()): torch's chunked path with its default options
             (options=None is torch's reference path, which is the unfused computation below)
  unfused    torch.nn.functional.cross_entropy(x @ W.T + b, t): the full (BT, V) logits
  gemms      the three GEMMs alone, in the input dtype, into buffers allocated once before timing:
             logits = x W^T (BT x V), dx = dlogits W (BT x H), dW = dlogits^T x (V x H) (dlogits: the logits
             buffer); in fwd, the first one only. A bound on the work, not a loss: it is timed, not checked, and
             its memory is not measured.

Inputs (fixed seeds): x (BT, H) ~ N(0, 1), W (V, H) ~ N(0, (LOGIT_STD^2 / H)) so the logits are ~ N(0, LOGIT_STD^2),
b (V) ~ N(0, 0.1^2) (--no-bias: none), int64 targets t (BT) uniform in [0, V). Reduction 'mean', no class
weights, no label smoothing.

Modes:
  fwdbwd  x, W and b require grad; loss = f(...), then torch.autograd.grad(loss, (x, W, b)): fresh gradients each
          call (.grad is never accumulated). The mode that matters.
  fwd     the loss alone under torch.no_grad() (optional, --modes fwd,fwdbwd).
A timed call runs from the call until its results (loss, gradients) are dropped, so it includes allocating,
first-touching and freeing whatever the contender allocates.

Correctness before timing: the first call of each contender (which doubles as its warm-up) is checked against
the unfused path: the loss, and in fwdbwd the gradients at sampled rows of dx (rows of x), of dW and of db (classes:
some targets, the first, the last and random ones), each within a per-dtype tolerance (TOLERANCES) relative to the
largest |reference| in the sample. A failing check of ours is an error (exit status 1); torch_lce's is a warning.
For float16 the reference is the unfused path in float32 on the same inputs (the float16 one underflows: REFERENCE),
and the float16 unfused path is checked against it too (a warning).

Timing: calls are interleaved rep by rep and the order rotates each rep (A,B,C,D, B,C,D,A, ...), so machine
noise falls on all contenders alike (torch_bench.time_config). Reported: the median per contender (--reps calls;
1 by default, 3 with --quick: at the issue's shapes one forward+backward takes tens of seconds on 2 cores).

Peak memory (torch_bench.py's method): each (contender, shape, dtype, mode) runs in a fresh subprocess with
glibc's mmap threshold fixed at 128 KiB (MALLOC_MMAP_THRESHOLD_), so every large block is mapped when allocated
and unmapped when freed. It allocates the inputs, warms up on the first min(BT, 64) rows (one-time
initialisation, cheaply), returns freed heap memory to the OS (malloc_trim), records VmRSS as the baseline, resets
the high-water mark (echo 5 > /proc/self/clear_refs) and runs one full call: peak = VmHWM - baseline, the most
memory the call held at once above its inputs, its results included. Where clear_refs cannot be written, the peak
is ru_maxrss - baseline, an upper bound, marked '~'.
  extra = peak - the bytes of the gradients every contender returns (dx, dW, db in the input dtype; 0 in fwd):
          the memory of everything else (logits, chunk buffers, float32 accumulators, saved tensors).
Reported in MB (2^20 bytes), and ours' extra as a percentage of the unfused path's extra.

Targets (from the issue), checked for fwdbwd for each strategy of ours:
  memory  ours' extra memory <= 5% of the unfused path's extra memory
  gemms   ours' median time <= 1.25x the three GEMMs' median
  torch   ours faster than torch_lce (ratio of medians from the same run)
ok/MISS per target; a missed target is reported, it does not change the exit status.

Usage (from the source tree):
  PYTHONPATH=python .venv/bin/python python/bench/linear_bench.py [options]
  build/release/lossfuse bench-linear [options]
The lossfuse package in the source tree next to this script (python/lossfuse, which loads
build/python/python/liblossfuse_torch.so) is used unless --installed is given.

Exit status: 0 ok, 1 ours disagreed with the unfused path or a contender failed, 2 bad usage.
"""

import argparse
import csv
import gc
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_bench import (  # noqa: E402  (the sibling script: shared machinery; it imports only the stdlib)
    DTYPE_NAMES, MB, _malloc_trim, _parse_list, _use_source_tree, cpu_model, parse_shared_args, peak_kb_of,
    run_memory_child, time_config)

ISSUE_SHAPES = [(4096, 2048, 32000), (4096, 2048, 128256), (2048, 2304, 256000)]
QUICK_SHAPES = [(512, 256, 8000), (1024, 512, 16000)]
MODES = ["fwd", "fwdbwd"]
MODE_ALIASES = {"forward": "fwd", "fwd+bwd": "fwdbwd", "forward+backward": "fwdbwd", "fb": "fwdbwd"}
STRATEGIES = ["auto", "recompute", "chunked"]
OTHERS = ["torch_lce", "unfused", "gemms"]

X_SEED, W_SEED, B_SEED, TARGET_SEED, SAMPLE_SEED = 0x11EA5, 0x3E1647, 0xB1A5, 0x7A59E7, 1
LOGIT_STD, BIAS_STD = 2.0, 0.1
WARMUP_ROWS = 64  # rows of the memory child's warm-up call
# Agreement with the unfused path, per dtype: (loss rtol, gradient tolerance as a fraction of the largest |reference|
# in the sample). bf16/f16: the unfused path rounds the logits (and their gradient) to the input dtype, ours keeps
# them in float32, so the reference is itself off by about an ulp of the logits (2^-8 relative in bf16); the bounds
# still catch any real error (a wrong row, class or scale is off by O(1)).
TOLERANCES = {"f32": (1e-4, 1e-3), "f64": (1e-10, 1e-8), "bf16": (2e-2, 3e-2), "f16": (5e-3, 1e-2)}
# REFERENCE: for float16 the check's reference is the unfused path computed in float32 on the same (float16-valued)
# inputs, not the float16 unfused path: that one rounds the gradient of the logits, (softmax - onehot) / BT, to
# float16, where the non-target entries (about 1 / (V * BT), 7.6e-9 at V = 32000, BT = 4096) are subnormal or zero,
# so its dW and db are themselves wrong at large shapes. bfloat16 has float32's exponent range: no such loss.
GOAL_MEM_PCT, GOAL_GEMM_X = 5.0, 1.25


# ---- arguments -------------------------------------------------------------------------------------------------


def _parse_shapes(text):
    shapes = []
    for item in text.split(","):
        dims = item.strip().lower().split("x")
        try:
            bt, h, v = (int(d) for d in dims)
        except ValueError:
            raise argparse.ArgumentTypeError(f"shape '{item}' is not BTxHxV (such as 4096x2048x32000)") from None
        if min(bt, h, v) < 1:
            raise argparse.ArgumentTypeError(f"shape '{item}': BT, H and V must be >= 1")
        shapes.append((bt, h, v))
    return shapes


def _fmt_shapes(shapes):
    return ",".join("x".join(map(str, s)) for s in shapes)


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="lossfuse bench-linear" if os.environ.get("LOSSFUSE_CLI") else "linear_bench.py",
        description="Times lossfuse's fused linear_cross_entropy against torch.nn.functional.linear_cross_entropy "
        "(chunked), the unfused cross_entropy(x @ W.T + b, t) and the three GEMMs alone, and measures peak memory "
        "in a fresh process. Progress goes to stderr, the results to stdout.",
        epilog="The docstring of python/bench/linear_bench.py describes exactly what is measured. Exit status: 0 ok, "
        "1 ours disagreed with the unfused path or a contender failed, 2 bad usage.",
    )
    p.add_argument("--shapes", type=_parse_shapes, metavar="LIST",
                   help="comma-separated BTxHxV shapes (default: the issue's " + _fmt_shapes(ISSUE_SHAPES)
                   + "; with --quick: " + _fmt_shapes(QUICK_SHAPES) + ")")
    p.add_argument("--modes", type=lambda s: _parse_list(s, MODES, MODE_ALIASES, "mode"), default=["fwdbwd"],
                   metavar="LIST", help="comma-separated: fwdbwd (loss and gradients), fwd (loss only) "
                   "(default fwdbwd)")
    p.add_argument("--strategies", type=lambda s: _parse_list(s, STRATEGIES, {}, "strategy"), default=["auto"],
                   metavar="LIST", help="lossfuse strategies to run, comma-separated: auto, recompute, chunked "
                   "(default auto)")
    p.add_argument("--chunk-rows", type=int, default=0, metavar="N",
                   help="lossfuse's chunk_rows (default 0: from --memory-budget)")
    p.add_argument("--memory-budget", type=float, metavar="MB",
                   help="lossfuse's memory_budget in MB of float32 logits per chunk (default: lossfuse's auto, 32 "
                   "raised to min(256, BT/16) rows)")
    p.add_argument("--vocab-tile", type=int, default=None, metavar="N",
                   help="lossfuse's vocab_tile (default: lossfuse's, 1024 for 16-bit weights, else 0: whole rows)")
    p.add_argument("--no-bias", action="store_true", help="no linear bias (default: a bias that requires grad)")
    p.add_argument("--reps", type=int, metavar="N", help="timed calls per contender (default 1; 3 with --quick)")
    p.add_argument("--quick", action="store_true", help="small shapes, 3 reps (a smoke test)")
    p.add_argument("--no-torch-lce", action="store_true", help="leave out torch's linear_cross_entropy")
    a = parse_shared_args(p, argv)
    if a.chunk_rows < 0:
        p.error("--chunk-rows must be >= 0")
    if a.vocab_tile is not None and a.vocab_tile < 0:
        p.error("--vocab-tile must be >= 0")
    if a.memory_budget is not None and not a.memory_budget > 0:
        p.error("--memory-budget must be > 0")
    if a.shapes is None:
        a.shapes = QUICK_SHAPES if a.quick else ISSUE_SHAPES
    if a.reps is None:
        a.reps = 3 if a.quick else 1
    return a


# ---- inputs and contenders ---------------------------------------------------------------------------------------


def make_inputs(torch, bt, h, v, dtype_name, bias):
    """x, W, b (or None) in the dtype, int64 targets; from fixed seeds (drawn in float32, then cast)."""
    dtype = getattr(torch, DTYPE_NAMES[dtype_name])

    def normal(shape, std, seed):
        t = torch.empty(shape, dtype=torch.float32)
        t.normal_(0.0, std, generator=torch.Generator().manual_seed(seed))
        return t.to(dtype)

    x = normal((bt, h), 1.0, X_SEED)
    w = normal((v, h), LOGIT_STD / h ** 0.5, W_SEED)
    b = normal((v,), BIAS_STD, B_SEED) if bias else None
    t = torch.randint(0, v, (bt,), generator=torch.Generator().manual_seed(TARGET_SEED), dtype=torch.int64)
    return x, w, b, t


def contender_names(args):
    return [f"ours[{s}]" for s in args.strategies] + [c for c in OTHERS if not (args.no_torch_lce and c == "torch_lce")]


class Fns:
    """The loss functions: torch's captured at import (before lossfuse could patch them), and ours."""

    def __init__(self, torch, args):
        import torch.nn.functional as F
        self.torch = torch
        self.torch_ce = F.cross_entropy
        self.torch_lce = F.linear_cross_entropy
        self.lce_options = torch.nn.LinearCrossEntropyOptions()
        import lossfuse.nn.functional as LF
        self.ours = LF.linear_cross_entropy
        self.ours_kw = {"chunk_rows": args.chunk_rows, "vocab_tile": args.vocab_tile}
        if args.memory_budget is not None:
            self.ours_kw["memory_budget"] = int(args.memory_budget * MB)

    def loss_fn(self, name):
        """f(x, W, t, b) -> loss for a contender other than 'gemms'."""
        if name.startswith("ours["):
            strategy = name[len("ours["):-1]
            return lambda x, w, t, b: self.ours(x, w, t, linear_bias=b, strategy=strategy, **self.ours_kw)
        if name == "torch_lce":
            return lambda x, w, t, b: self.torch_lce(x, w, t, linear_bias=b, options=self.lce_options)
        if name == "unfused":
            return lambda x, w, t, b: self.torch_ce(x @ w.T + b if b is not None else x @ w.T, t)
        raise ValueError(name)


def leaves(x, w, b):
    """Fresh leaves that require grad, sharing the inputs' storage."""
    return [a.detach().requires_grad_() if a is not None else None for a in (x, w, b)]


def make_call(torch, fns, name, mode, x, w, b, t):
    """A zero-argument call running one contender once in the mode; it drops its results before returning."""
    if name == "gemms":
        xd, wd = x.detach(), w.detach()
        logits = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype)
        dx, dw = torch.empty_like(xd), torch.empty_like(wd)

        def call():
            with torch.no_grad():
                torch.mm(xd, wd.t(), out=logits)
                if mode == "fwdbwd":
                    torch.mm(logits, wd, out=dx)  # dlogits W
                    torch.mm(logits.t(), xd, out=dw)  # dlogits^T x
        return call
    f = fns.loss_fn(name)
    if mode == "fwd":
        def call():
            with torch.no_grad():
                f(x, w, t, b)
        return call
    xg, wg, bg = leaves(x, w, b)
    diff = [a for a in (xg, wg, bg) if a is not None]

    def call():
        loss = f(xg, wg, t, bg)
        torch.autograd.grad(loss, diff)
    return call


def run_outputs(torch, fns, name, mode, x, w, b, t, rows, classes):
    """The first call of a contender: (loss, {grad name: sampled float64 values}) for the check."""
    f = fns.loss_fn(name)
    if mode == "fwd":
        with torch.no_grad():
            return f(x, w, t, b).double().item(), {}
    xg, wg, bg = leaves(x, w, b)
    loss = f(xg, wg, t, bg)
    diff = [a for a in (xg, wg, bg) if a is not None]
    grads = torch.autograd.grad(loss, diff)
    out = {"dx": grads[0][rows].double(), "dW": grads[1][classes].double()}
    if bg is not None:
        out["db"] = grads[2][classes].double()
    return loss.detach().double().item(), out


def check(ref, got, dtype_name):
    """'' when got agrees with ref (the unfused path's outputs; see REFERENCE for float16), else what differs."""
    loss_rtol, grad_tol = TOLERANCES[dtype_name]
    (ref_loss, ref_grads), (loss, grads) = ref, got
    errors = []
    if not abs(loss - ref_loss) <= loss_rtol * abs(ref_loss) + 1e-12:
        errors.append(f"loss {loss:.7g} vs reference {ref_loss:.7g}")
    for k, r in ref_grads.items():
        scale = max(r.abs().max().item(), 1e-30)
        err = (grads[k] - r).abs().max().item()
        if not err <= grad_tol * scale:
            errors.append(f"{k} max error {err / scale:.3g} of max |{k}| (tolerance {grad_tol:g})")
    return "; ".join(errors)


def samples(torch, bt, v, t):
    """Sampled rows of x and classes (rows of W, entries of b) for the check: fixed and seeded random ones."""
    g = torch.Generator().manual_seed(SAMPLE_SEED)
    rows = sorted({0, bt // 2, bt - 1} | set(torch.randint(0, bt, (5,), generator=g).tolist()))
    classes = sorted({0, v - 1} | set(t[rows[:4]].tolist()) | set(torch.randint(0, v, (5,), generator=g).tolist()))
    return rows, classes


def result_bytes(bt, h, v, elsize, mode, bias):
    """The gradients every contender returns in fwdbwd (dx, dW, db in the input dtype)."""
    return 0 if mode == "fwd" else (bt * h + v * h + (v if bias else 0)) * elsize


# ---- memory (the child process) ----------------------------------------------------------------------------------


def memory_child(spec, torch, fns):
    """Runs one (contender, shape, dtype, mode) as described in the module docstring; prints one JSON line."""
    bt, h, v, dtype_name, mode, name = (spec[k] for k in ("bt", "h", "v", "dtype", "mode", "contender"))
    x, w, b, t = make_inputs(torch, bt, h, v, dtype_name, spec["bias"])
    r = min(bt, WARMUP_ROWS)
    make_call(torch, fns, name, mode, x[:r].clone(), w, b, t[:r].clone())()  # warm-up, on a few rows
    peak_kb, exact = peak_kb_of(make_call(torch, fns, name, mode, x, w, b, t))
    print(json.dumps({"peak_bytes": peak_kb * 1024, "exact": exact}))


def measure_memory(spec, args):
    """Runs memory_child in a fresh interpreter; returns its dict, or {'error': ...}."""
    cmd = [sys.executable, os.path.abspath(__file__), "--_memory-child", json.dumps(spec),
           "--chunk-rows", str(args.chunk_rows)]
    if args.vocab_tile is not None:
        cmd += ["--vocab-tile", str(args.vocab_tile)]
    if args.memory_budget is not None:
        cmd += ["--memory-budget", repr(args.memory_budget)]
    if args.installed:
        cmd.append("--installed")
    if args.threads is not None:
        cmd += ["--threads", str(args.threads)]
    return run_memory_child(cmd, {})


# ---- one configuration -------------------------------------------------------------------------------------------


def bench_config(torch, fns, bt, h, v, dtype_name, mode, args, log):
    """Check (first calls), time, then measure memory. Returns {contender: result dict}."""
    names = contender_names(args)
    bias = not args.no_bias
    results = {c: {"contender": c, "bt": bt, "h": h, "v": v, "dtype": dtype_name, "mode": mode, "error": "",
                   "check": ""} for c in names}
    x, w, b, t = make_inputs(torch, bt, h, v, dtype_name, bias)
    rows, classes = samples(torch, bt, v, t)
    outs = {}
    ref = None
    if dtype_name == "f16":  # the reference: the unfused path in float32 on the same inputs (see REFERENCE)
        log("    reference: unfused in float32")
        up = [a.float() if a is not None else None for a in (x, w, b)]
        ref = run_outputs(torch, fns, "unfused", mode, *up, t, rows, classes)
        del up
    checked = ["unfused"] + [c for c in names if c not in ("unfused", "gemms")]  # the reference first
    for c in checked:
        log(f"    first call (check, warm-up): {c}")
        try:
            t0 = time.perf_counter()
            outs[c] = run_outputs(torch, fns, c, mode, x, w, b, t, rows, classes)
            results[c]["first_call_s"] = time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001  (a contender that fails is reported, the others still run)
            results[c]["error"] = f"{type(e).__name__}: {e}".splitlines()[0]
    if ref is None:
        ref = outs.get("unfused")
        checked.remove("unfused")
    for c in checked:
        if c in outs and ref is not None:
            results[c]["check"] = check(ref, outs[c], dtype_name) or "ok"
    del outs, ref
    gc.collect()
    calls = {c: make_call(torch, fns, c, mode, x, w, b, t) for c in names if not results[c]["error"]}
    if "gemms" in calls:
        log("    warm-up: gemms")
        calls["gemms"]()
    log(f"    timing: {args.reps} interleaved call{'s' if args.reps > 1 else ''} each of {', '.join(calls)}")
    for c, s in time_config(torch, calls, args).items():
        results[c].update(reps=len(s), median_ms=statistics.median(s) * 1e3, min_ms=min(s) * 1e3)
    del calls, x, w, b, t
    gc.collect()
    _malloc_trim()

    elsize = torch.empty((), dtype=getattr(torch, DTYPE_NAMES[dtype_name])).element_size()
    res_bytes = result_bytes(bt, h, v, elsize, mode, bias)
    for c in names:
        results[c]["result_mb"] = res_bytes / MB
        if args.no_memory or c == "gemms" or results[c]["error"]:
            continue
        log(f"    memory: {c}")
        m = measure_memory({"bt": bt, "h": h, "v": v, "dtype": dtype_name, "mode": mode, "contender": c,
                            "bias": bias}, args)
        if "error" in m:
            results[c]["mem_error"] = m["error"]
        else:
            results[c].update(peak_mb=m["peak_bytes"] / MB, extra_mb=(m["peak_bytes"] - res_bytes) / MB,
                              peak_exact=m["exact"])
    add_ratios(results)
    return results


def add_ratios(results):
    """Ours vs each other contender: time ratios and extra memory as % of the unfused path's; the targets."""
    gemms = results.get("gemms", {}).get("median_ms")
    lce = results.get("torch_lce", {}).get("median_ms")
    unf = results.get("unfused", {})
    for c, r in results.items():
        if not c.startswith("ours[") or "median_ms" not in r:
            continue
        t = r["median_ms"]
        r["x_gemms"] = t / gemms if gemms else None
        r["speedup_torch_lce"] = lce / t if lce else None
        r["speedup_unfused"] = unf["median_ms"] / t if unf.get("median_ms") else None
        if "extra_mb" in r and unf.get("extra_mb", 0) > 0:
            r["extra_pct_unfused"] = 100.0 * r["extra_mb"] / unf["extra_mb"]
        if r["mode"] == "fwdbwd":
            r["goal_memory"] = ok_miss(r.get("extra_pct_unfused"), lambda p: p <= GOAL_MEM_PCT)
            r["goal_gemms"] = ok_miss(r["x_gemms"], lambda q: q <= GOAL_GEMM_X)
            r["goal_torch"] = ok_miss(r["speedup_torch_lce"], lambda s: s > 1.0)


def ok_miss(value, passes):
    return "-" if value is None else ("ok" if passes(value) else "MISS")


# ---- reporting ---------------------------------------------------------------------------------------------------


def _cell(value, fmt, width, default="-"):
    return f"{value:{fmt}}".rjust(width) if value is not None else default.rjust(width)


def _ratio(value, width):
    """'1.23x' right-aligned, or '-'."""
    return (f"{value:.2f}x" if value is not None else "-").rjust(width)


def print_config(results, out):
    """One block per (shape, dtype, mode): a line per contender, then ours' ratios and targets."""
    r0 = next(iter(results.values()))
    tflop = 2 * r0["bt"] * r0["h"] * r0["v"] * (3 if r0["mode"] == "fwdbwd" else 1) / 1e12
    print(f"\n(BT, H, V) = ({r0['bt']}, {r0['h']}, {r0['v']})  {r0['dtype']}  {r0['mode']}  "
          f"(GEMMs {tflop:.3g} TFLOP; gradients returned {r0['result_mb']:.1f} MB)", file=out)
    head = (f"  {'contender':<16} {'median ms':>11} {'min ms':>11} {'GFLOP/s':>8} {'x GEMMs':>8} {'peak MB':>10} "
            f"{'extra MB':>10} {'extra %unf':>10}  check")
    print(head, file=out)
    unf_extra = results.get("unfused", {}).get("extra_mb")
    gemms = results.get("gemms", {}).get("median_ms")
    for c, r in results.items():
        t = r.get("median_ms")
        peak = (("" if r["peak_exact"] else "~") + f"{r['peak_mb']:.1f}") if "peak_mb" in r else \
            ("error" if "mem_error" in r else "-")
        pct = 100.0 * r["extra_mb"] / unf_extra if ("extra_mb" in r and unf_extra and unf_extra > 0) else None
        line = (f"  {c:<16} " + (_cell(t, "11.1f", 11) if t is not None else "failed".rjust(11)) + " "
                + _cell(r.get("min_ms"), "11.1f", 11) + " "
                + _cell(tflop * 1e3 / (t * 1e-3) if t else None, "8.1f", 8) + " "
                + _ratio(t / gemms if (t and gemms) else None, 8) + " "
                + f"{peak:>10} " + _cell(r.get("extra_mb"), "10.1f", 10) + " "
                + (f"{pct:9.1f}%" if pct is not None else "-".rjust(10))
                + "  " + (r["error"] or r["check"] or "-"))
        print(line, file=out)
    for c, r in results.items():
        if not c.startswith("ours[") or "median_ms" not in r:
            continue
        parts = []
        q = r.get("x_gemms")
        parts.append(f"time {q:.2f}x GEMMs (<= {GOAL_GEMM_X:g}x)" if q is not None else "time vs GEMMs -")
        s = r.get("speedup_torch_lce")
        parts.append(f"{s:.2f}x faster than torch_lce (> 1x)" if s is not None else "torch_lce -")
        s = r.get("speedup_unfused")
        parts.append(f"{s:.2f}x faster than unfused" if s is not None else "unfused -")
        p = r.get("extra_pct_unfused")
        parts.append(f"extra memory {p:.1f}% of unfused (<= {GOAL_MEM_PCT:g}%)" if p is not None else
                     "extra memory -")
        print(f"  {c}: " + "; ".join(parts), file=out)
        if r["mode"] == "fwdbwd":
            print(f"  {c} targets: memory {r['goal_memory']}, time vs GEMMs {r['goal_gemms']}, "
                  f"vs torch_lce {r['goal_torch']}", file=out)
    out.flush()


def print_summary(all_results, out):
    """One line per (shape, dtype, mode, strategy) with the ratios and targets."""
    print(f"\nsummary (ours vs the others; targets: extra memory <= {GOAL_MEM_PCT:g}% of unfused, "
          f"time <= {GOAL_GEMM_X:g}x GEMMs, faster than torch_lce)", file=out)
    head = (f"{'shape':<18} {'dtype':<5} {'mode':<6} {'strategy':<16} {'ours ms':>10} {'x GEMMs':>8} "
            f"{'vs lce':>7} {'vs unf':>7} {'extra MB':>9} {'%unf':>6}  memory gemms torch")
    print(head, file=out)
    print("-" * len(head), file=out)
    for results in all_results:
        for c, r in results.items():
            if not c.startswith("ours["):
                continue
            shape = f"{r['bt']}x{r['h']}x{r['v']}"
            print(f"{shape:<18} {r['dtype']:<5} {r['mode']:<6} {c:<16} " + _cell(r.get("median_ms"), "10.1f", 10)
                  + " " + _ratio(r.get("x_gemms"), 8) + " " + _ratio(r.get("speedup_torch_lce"), 7)
                  + " " + _ratio(r.get("speedup_unfused"), 7) + " " + _cell(r.get("extra_mb"), "9.1f", 9)
                  + " " + (f"{r['extra_pct_unfused']:5.1f}%" if "extra_pct_unfused" in r else "-".rjust(6)) + "  "
                  + f"{r.get('goal_memory', '-'):<6} {r.get('goal_gemms', '-'):<5} {r.get('goal_torch', '-')}",
                  file=out)


def write_csv(path, all_results):
    fields = ["bt", "h", "v", "dtype", "mode", "contender", "threads", "reps", "median_ms", "min_ms", "first_call_s",
              "x_gemms", "speedup_torch_lce", "speedup_unfused", "result_mb", "peak_mb", "extra_mb",
              "extra_pct_unfused", "peak_exact", "goal_memory", "goal_gemms", "goal_torch", "check", "error",
              "mem_error"]
    with open(path, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        wr.writeheader()
        for results in all_results:
            for r in results.values():
                wr.writerow({k: (f"{r[k]:.6g}" if isinstance(r.get(k), float) else r.get(k, "")) for k in fields})


# ---- main --------------------------------------------------------------------------------------------------------


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    _use_source_tree(args.installed)
    import torch
    fns = Fns(torch, args)  # captures torch's functions before importing lossfuse
    import lossfuse
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.memory_child:
        memory_child(json.loads(args.memory_child), torch, fns)
        return 0

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    threads = torch.get_num_threads()
    budget = f"{args.memory_budget:g} MB" if args.memory_budget is not None else "default"
    print("lossfuse vs torch: linear_cross_entropy, reduction mean, int64 targets, "
          f"{'no bias' if args.no_bias else 'bias'}, logits ~ N(0, {LOGIT_STD:g}^2)")
    print(f"  torch {torch.__version__}, lossfuse {lossfuse.__version__} from {os.path.dirname(lossfuse.__file__)}")
    print(f"  {cpu_model()}, {threads} thread{'' if threads == 1 else 's'}, {os.cpu_count()} CPUs")
    print(f"  {args.reps} timed call{'s' if args.reps > 1 else ''} per contender, interleaved; ours: chunk_rows "
          f"{args.chunk_rows}, memory_budget {budget}; torch_lce: LinearCrossEntropyOptions() defaults")
    print("  fwdbwd: loss + torch.autograd.grad w.r.t. x, W" + ("" if args.no_bias else ", b") + ". Memory: peak RSS "
          "above the inputs in a fresh process ('~': upper bound); extra = peak - the returned gradients",
          flush=True)
    all_results = []
    for bt, h, v in args.shapes:
        for dt in args.dtypes:
            for mode in args.modes:
                log(f"{bt}x{h}x{v} {dt} {mode}")
                results = bench_config(torch, fns, bt, h, v, dt, mode, args, log)
                for r in results.values():
                    r["threads"] = threads
                print_config(results, sys.stdout)
                all_results.append(results)
    print_summary(all_results, sys.stdout)
    if args.csv:
        write_csv(args.csv, all_results)
        print(f"wrote {args.csv}")
    status = 0
    for results in all_results:
        for c, r in results.items():
            where = f"{r['bt']}x{r['h']}x{r['v']} {r['dtype']} {r['mode']} {c}"
            if r["error"]:
                print(f"FAIL {where}: {r['error']}")
                status = 1
            elif r["check"] not in ("", "ok"):
                ours = c.startswith("ours[")
                ref = "the unfused path" + (" in float32" if r["dtype"] == "f16" else "")
                print(f"{'FAIL' if ours else 'warning'} {where} disagrees with {ref}: {r['check']}")
                status = 1 if ours else status
            if r.get("mem_error"):
                print(f"warning {where} (memory): {r['mem_error']}")
    return status


if __name__ == "__main__":
    sys.exit(main())
