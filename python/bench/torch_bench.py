#!/usr/bin/env python3
"""lossfuse vs PyTorch: cross-entropy time and peak memory, in one run.

Contenders, on the same inputs and threads:
  lossfuse  lossfuse.nn.functional.cross_entropy
  eager     torch.nn.functional.cross_entropy
  compile   torch.compile(torch.nn.functional.cross_entropy, dynamic=False, fullgraph=True), compiled once per
            (shape, dtype, mode) before timing (Inductor builds C++ on the CPU; its caches make later runs quicker)
  inplace   (with --inplace; fwdbwd only) lossfuse's cross_entropy(..., inplace=True), which writes the gradient over
            the logits: each call gets fresh logits, x * 1 made untimed before it (outside the memory baseline too;
            just written, so in cache, as a training step's logits fresh from its output layer), and
            autograd.grad(loss, those logits) returns their own storage. The logits, a training step's memory with
            or without inplace, are freed untimed before the next call (unmapping them is not the loss's work)

Inputs per (N, V) shape and dtype: logits (N, V) ~ N(0, 2) and int64 class targets (N) from a fixed seed;
reduction 'mean' (the default), no weights, no label smoothing.

Modes:
  fwd     the loss alone, under torch.no_grad(), on logits that do not require grad.
  fwdbwd  loss = f(x, y) on logits that require grad, then torch.autograd.grad(loss, x): a fresh gradient each
          call (.grad is never accumulated).
A timed call runs from the call until its results (loss, gradient) are dropped, so it includes allocating,
first-touching and freeing whatever the contender allocates.

Timing: before timing, each contender's loss (and sampled gradient rows) are checked against torch eager's; then
each runs once more to warm up. Timed calls are interleaved rep by rep, and the order rotates each rep
(A,B,C, B,C,A, C,A,B, ...), so machine noise and cache state fall on all contenders alike. Reported: the median
per contender and lossfuse's speedup over each torch contender (ratio of medians from the same run).
--neighbours then times lossfuse's call alone and with each other contender called between its calls
(time_neighbours), with its page faults per call: what a neighbouring workload costs it.

Peak memory: each (contender, shape, dtype, mode) runs in a fresh subprocess. It allocates the inputs and runs
the call once (a warm-up; compilation for compile); then twice: before each call it returns freed heap memory to
the OS (malloc_trim) and unmaps the block lossfuse keeps for reuse (lossfuse.empty_cache()), records the resident
set size (VmRSS) as the baseline and resets the high-water mark
(echo 5 > /proc/self/clear_refs); after it, the call's peak is VmHWM - baseline. Reported: the larger of the two,
in MB (2^20 bytes) and as a multiple of the logits' bytes (N * V * element size). On the CPU torch allocates
with the C library's malloc and keeps no cache of its own; the subprocess fixes glibc's mmap threshold at
128 KiB (MALLOC_MMAP_THRESHOLD_), so every large block is mapped when allocated and unmapped when freed, and the
figure is the most memory the call holds at once above its inputs, its results included (the gradient in
fwdbwd). For fwdbwd, 1.0x logits is the gradient alone: anything above is an N x V temporary. (A process with
glibc's default, self-raising threshold may keep freed blocks of up to 32 MB in its heap, so its RSS can exceed
this figure for the small shapes.) Where clear_refs cannot be written, the peak is ru_maxrss - baseline, an upper
bound, marked '~'.

Goals (from the issue), checked for fwdbwd at V >= 32000: lossfuse >= 3x faster than torch eager and >= 1.5x
faster than torch.compile, and no N x V temporary beyond the gradient (peak <= 1.1x logits + 1 MB, the slack for
page granularity and the O(N) outputs).

Usage (from the source tree):
  PYTHONPATH=python .venv/bin/python python/bench/torch_bench.py [options]
  build/release/lossfuse bench-torch [options]
The lossfuse package in the source tree next to this script (python/lossfuse, which loads
build/python/python/liblossfuse_torch.so) is used unless --installed is given.

Exit status: 0 ok, 1 a contender's result disagreed with torch eager's (or a contender failed), 2 bad usage.
"""

import argparse
import csv
import ctypes
import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

DEFAULT_SHAPES = [(32, 32000), (128, 32000), (32, 50257), (4096, 32000), (4096, 128256)]
QUICK_SHAPES = [(32, 32000), (128, 32000)]
DTYPE_NAMES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16", "f64": "float64"}
DTYPE_ALIASES = {"float32": "f32", "float": "f32", "bfloat16": "bf16", "float16": "f16", "half": "f16",
                 "float64": "f64", "double": "f64"}
MODES = ["fwd", "fwdbwd"]
MODE_ALIASES = {"forward": "fwd", "fwd+bwd": "fwdbwd", "forward+backward": "fwdbwd", "fb": "fwdbwd"}
CONTENDERS = ["lossfuse", "eager", "compile", "inplace"]

LOGIT_SEED, TARGET_SEED, LOGIT_STD = 0x1F05E5ED, 0x7A59E7, 2.0
# Agreement with torch eager, per dtype: (loss rtol, gradient atol as a fraction of the largest |gradient| in the
# sampled rows). bf16/f16: torch rounds log_softmax to the input dtype before its gradient, so it is itself off
# by about an ulp of the logits (2^-8 relative in bf16); the bounds still catch any real error.
TOLERANCES = {"f32": (1e-4, 1e-3), "f64": (1e-10, 1e-8), "bf16": (2e-2, 3e-2), "f16": (5e-3, 1e-2)}
GOAL_V, GOAL_EAGER, GOAL_COMPILE = 32000, 3.0, 1.5
GOAL_MEM_X, GOAL_MEM_SLACK_MB = 1.1, 1.0
MB = float(1 << 20)


def _use_source_tree(installed):
    """Put the source tree's python/ first on sys.path (unless --installed), so `import lossfuse` finds it."""
    src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not installed and os.path.isfile(os.path.join(src, "lossfuse", "__init__.py")):
        sys.path.insert(0, src)


# ---- arguments -------------------------------------------------------------------------------------------------


def _parse_shapes(text):
    shapes = []
    for item in text.split(","):
        dims = item.strip().lower().split("x")
        try:
            n, v = (int(d) for d in dims)
        except ValueError:
            raise argparse.ArgumentTypeError(f"shape '{item}' is not NxV (such as 4096x32000)") from None
        if n < 1 or v < 1:
            raise argparse.ArgumentTypeError(f"shape '{item}': N and V must be >= 1")
        shapes.append((n, v))
    return shapes


def _parse_list(text, allowed, aliases, what):
    out = []
    for item in text.split(","):
        name = aliases.get(item.strip().lower(), item.strip().lower())
        if name not in allowed:
            raise argparse.ArgumentTypeError(f"unknown {what} '{item}' (one of {', '.join(allowed)})")
        if name not in out:
            out.append(name)
    return out


def parse_shared_args(p, argv):
    """Adds the options every bench script takes (dtypes, threads, memory, csv, installed, and the memory child's)
    to p, which has its own and a --reps, then parses argv and checks the shared ones."""
    p.add_argument("--dtypes", type=lambda s: _parse_list(s, list(DTYPE_NAMES), DTYPE_ALIASES, "dtype"),
                   default=["f32", "bf16"], metavar="LIST",
                   help="comma-separated: f32, bf16, f16, f64 (default f32,bf16)")
    p.add_argument("--threads", type=int, metavar="N",
                   help="torch.set_num_threads(N) for all contenders (default: torch.get_num_threads())")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    p.add_argument("--csv", metavar="PATH", help="also write the results as CSV, one row per contender")
    p.add_argument("--installed", action="store_true",
                   help="use the installed lossfuse package instead of the source tree's python/lossfuse")
    p.add_argument("--_memory-child", dest="memory_child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.threads is not None and a.threads < 1:
        p.error("--threads must be >= 1")
    if a.reps is not None and a.reps < 1:
        p.error("--reps must be >= 1")
    return a


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="lossfuse bench-torch" if os.environ.get("LOSSFUSE_CLI") else "torch_bench.py",
        description="Times lossfuse's cross_entropy against torch.nn.functional.cross_entropy, eager and under "
        "torch.compile, forward and forward+backward, and measures each one's peak memory in a fresh process. "
        "Progress goes to stderr, the table to stdout.",
        epilog="The docstring of python/bench/torch_bench.py describes exactly what is measured. Exit status: 0 ok, "
        "1 a result disagreed with torch eager's or a contender failed, 2 bad usage.",
    )
    p.add_argument("--shapes", type=_parse_shapes, metavar="LIST",
                   help="comma-separated NxV shapes (default: " + ",".join(f"{n}x{v}" for n, v in DEFAULT_SHAPES)
                   + "; with --quick: " + ",".join(f"{n}x{v}" for n, v in QUICK_SHAPES) + ")")
    p.add_argument("--modes", type=lambda s: _parse_list(s, MODES, MODE_ALIASES, "mode"), default=list(MODES),
                   metavar="LIST", help="comma-separated: fwd (loss only), fwdbwd (loss and gradient) (default both)")
    p.add_argument("--reps", type=int, metavar="N",
                   help="timed calls per contender (default: adaptive, 5 to 50 until --min-time; 3 to 15 with --quick)")
    p.add_argument("--min-time", type=float, metavar="S",
                   help="seconds of timed calls per contender when reps adapt (default 1.0; 0.1 with --quick)")
    p.add_argument("--quick", action="store_true", help="only the small shapes, few reps (a smoke test)")
    p.add_argument("--no-compile", action="store_true", help="leave out torch.compile")
    p.add_argument("--inplace", action="store_true",
                   help="also time lossfuse's cross_entropy(inplace=True) (fwdbwd), on fresh logits each call")
    p.add_argument("--neighbours", action="store_true",
                   help="also time lossfuse alone and with each other contender called between its calls")
    a = parse_shared_args(p, argv)
    if a.min_time is not None and not a.min_time > 0:
        p.error("--min-time must be > 0")
    if a.shapes is None:
        a.shapes = QUICK_SHAPES if a.quick else DEFAULT_SHAPES
    if a.min_time is None:
        a.min_time = 0.1 if a.quick else 1.0
    a.min_reps, a.max_reps = (3, 15) if a.quick else (5, 50)
    return a


# ---- the contenders ----------------------------------------------------------------------------------------------


def make_inputs(torch, n, v, dtype_name):
    """Logits (N, V) ~ N(0, LOGIT_STD) in the dtype and int64 targets (N), from fixed seeds."""
    g = torch.Generator().manual_seed(LOGIT_SEED)
    x = torch.empty(n, v, dtype=torch.float32)
    x.normal_(0.0, LOGIT_STD, generator=g)
    x = x.to(getattr(torch, DTYPE_NAMES[dtype_name]))
    y = torch.randint(0, v, (n,), generator=torch.Generator().manual_seed(TARGET_SEED), dtype=torch.int64)
    return x, y


def make_contender(name, torch_ce, lossfuse_ce):
    """The callable for a contender; 'compile' is compiled freshly (torch._dynamo.reset()) for each config."""
    if name == "lossfuse":
        return lossfuse_ce
    if name == "inplace":
        return lambda x, y: lossfuse_ce(x, y, inplace=True)
    if name == "eager":
        return torch_ce
    import torch
    torch._dynamo.reset()

    def torch_cross_entropy(x, y):
        return torch_ce(x, y)

    return torch.compile(torch_cross_entropy, dynamic=False, fullgraph=True)


def make_call(torch, fn, mode, x, y, fresh=False):
    """A zero-argument call running one contender once in the mode; it drops its results before returning. fresh
    (the in-place contender): each call differentiates new logits, x * 1 made by call.prepare(), run untimed before
    it."""
    if mode == "fwd":
        def call():
            with torch.no_grad():
                fn(x, y)
    elif fresh:
        xg = x.detach().requires_grad_()
        made, spent = [], []

        def call():
            z = made.pop() if made else xg * 1
            loss = fn(z, y)
            torch.autograd.grad(loss, z)
            spent.append(z)  # the logits, now the gradient: freed by the next prepare, untimed

        def prepare():
            spent.clear()
            made.append(xg * 1)

        call.prepare = prepare
    else:
        xg = x.detach().requires_grad_()

        def call():
            loss = fn(xg, y)
            torch.autograd.grad(loss, xg)
    return call


def run_call(call):
    """One call, its untimed preparation first."""
    prepare = getattr(call, "prepare", None)
    if prepare is not None:
        prepare()
    call()


def run_outputs(torch, fn, mode, x, y, rows, fresh=False):
    """The loss (float64 scalar) and, in fwdbwd, the gradient's sampled rows (float64), for the check."""
    if mode == "fwd":
        with torch.no_grad():
            return fn(x, y).double().item(), None
    xg = x.detach().requires_grad_()
    z = xg * 1 if fresh else xg
    loss = fn(z, y)
    (grad,) = torch.autograd.grad(loss, z)
    return loss.detach().double().item(), grad[rows].double()


def check(ref, got, dtype_name):
    """'' when got agrees with ref (torch eager's outputs), else what differs."""
    loss_rtol, grad_tol = TOLERANCES[dtype_name]
    (ref_loss, ref_grad), (loss, grad) = ref, got
    errors = []
    if not (abs(loss - ref_loss) <= loss_rtol * abs(ref_loss) + 1e-12):
        errors.append(f"loss {loss:.7g} vs eager {ref_loss:.7g}")
    if ref_grad is not None:
        scale = max(ref_grad.abs().max().item(), 1e-30)
        err = (grad - ref_grad).abs().max().item()
        if not err <= grad_tol * scale:
            errors.append(f"grad max error {err / scale:.3g} of max |grad|")
    return "; ".join(errors)


# ---- memory (the child process) ----------------------------------------------------------------------------------


def _proc_status_kb(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{key} not in /proc/self/status")


def _malloc_trim():
    """Returns freed heap memory to the OS; also unmaps the large block lossfuse keeps for reuse, so the measured
    call has to map its gradient afresh (the block it leaves behind is its result's memory, counted in the peak)."""
    lossfuse = sys.modules.get("lossfuse")
    if lossfuse is not None and hasattr(lossfuse, "empty_cache"):
        lossfuse.empty_cache()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def peak_kb_of(call):
    """(kilobytes call() adds to the resident high-water mark, exact): after a collection and malloc_trim, the
    high-water mark is reset through /proc/self/clear_refs; where that is refused (exact False), ru_maxrss, the
    process's high-water mark since it started, stands in."""
    gc.collect()
    _malloc_trim()
    baseline_kb = _proc_status_kb("VmRSS")
    exact = True
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        exact = False
    call()
    # ru_maxrss: kilobytes on Linux
    high_kb = _proc_status_kb("VmHWM") if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return high_kb - baseline_kb, exact


def run_memory_child(cmd, env_extra):
    """Runs a memory child (cmd) in a fresh interpreter; returns the dict of its last output line, or
    {'error': ...}. MALLOC_MMAP_THRESHOLD_: a fixed threshold (glibc's initial one, 128 KiB) stops glibc from raising
    it after frees, so every large block is mmap'ed and unmapped on free, and resident memory follows the live
    blocks."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", **env_extra)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        tail = (p.stderr.strip().splitlines() or ["exit status %d" % p.returncode])[-1]
        return {"error": tail}
    return json.loads(p.stdout.strip().splitlines()[-1])


def memory_child(spec, torch, torch_ce, lossfuse_ce):
    """Runs one (contender, shape, dtype, mode) as described in the module docstring; prints one JSON line."""
    n, v, dtype_name, mode, contender = spec["n"], spec["v"], spec["dtype"], spec["mode"], spec["contender"]
    x, y = make_inputs(torch, n, v, dtype_name)
    call = make_call(torch, make_contender(contender, torch_ce, lossfuse_ce), mode, x, y, contender == "inplace")
    run_call(call)  # warm-up: one-time initialisation, and compilation for 'compile'
    peaks = []
    for _ in range(2):
        prepare = getattr(call, "prepare", None)
        if prepare is not None:
            prepare()  # the in-place contender's fresh logits: an input, made before the baseline
        peaks.append(peak_kb_of(call))
    print(json.dumps({"peak_bytes": max(kb for kb, _ in peaks) * 1024, "exact": all(e for _, e in peaks)}))


def measure_memory(spec, args):
    """Runs memory_child in a fresh interpreter; returns its dict, or {'error': ...}."""
    cmd = [sys.executable, os.path.abspath(__file__), "--_memory-child", json.dumps(spec)]
    if args.installed:
        cmd.append("--installed")
    if args.threads is not None:
        cmd += ["--threads", str(args.threads)]
    # TORCHINDUCTOR_COMPILE_THREADS=1: compile in-process, no worker pool to start
    return run_memory_child(cmd, {"TORCHINDUCTOR_COMPILE_THREADS": "1"})


# ---- timing ------------------------------------------------------------------------------------------------------


def time_config(torch, calls, args):
    """Interleaved timed calls; returns {contender: [seconds, ...]}."""
    names = list(calls)
    samples = {c: [] for c in names}
    rep = 0
    while True:
        order = names[rep % len(names):] + names[:rep % len(names)]
        for c in order:
            prepare = getattr(calls[c], "prepare", None)
            if prepare is not None:
                prepare()
            t0 = time.perf_counter()
            calls[c]()
            samples[c].append(time.perf_counter() - t0)
        rep += 1
        if args.reps is not None:
            if rep >= args.reps:
                break
        elif rep >= args.max_reps or (rep >= args.min_reps and
                                      min(sum(s) for s in samples.values()) >= args.min_time):
            break
    return samples


def bench_config(torch, torch_ce, lossfuse_ce, n, v, dtype_name, mode, args, log):
    """One (shape, dtype, mode): check, warm up, time, then measure memory. Returns one result dict per
    contender."""
    names = contender_names(args, mode)
    results = {c: {"contender": c, "n": n, "v": v, "dtype": dtype_name, "mode": mode, "error": ""} for c in names}
    x, y = make_inputs(torch, n, v, dtype_name)
    rows = sorted({0, n // 2, n - 1} | set(torch.randint(0, n, (4,), generator=torch.Generator().manual_seed(1))
                                          .tolist()))
    fns = {}
    ref = None
    for c in names:
        try:
            t0 = time.perf_counter()
            fns[c] = make_contender(c, torch_ce, lossfuse_ce)
            out = run_outputs(torch, fns[c], mode, x, y, rows, c == "inplace")  # the first call: compiles for 'compile'
            results[c]["first_call_s"] = time.perf_counter() - t0
            if c == "eager":
                ref = out
            results[c]["out"] = out
        except Exception as e:  # noqa: BLE001  (a contender that fails is reported, the others still run)
            results[c]["error"] = f"{type(e).__name__}: {e}".splitlines()[0]
            fns.pop(c, None)
        if c == "compile" and c in fns:
            log(f"    compile: first call (compilation) {results[c]['first_call_s']:.1f} s")
    for c in names:
        out = results[c].pop("out", None)
        if out is not None and ref is not None and c != "eager":
            results[c]["error"] = check(ref, out, dtype_name)
    calls = {c: make_call(torch, fns[c], mode, x, y, c == "inplace") for c in names if c in fns}
    for call in calls.values():  # warm-up
        run_call(call)
    samples = time_config(torch, calls, args)
    for c, s in samples.items():
        results[c].update(reps=len(s), median_ms=statistics.median(s) * 1e3, min_ms=min(s) * 1e3)
    if args.neighbours and "lossfuse" in calls and len(calls) > 1:
        print_neighbours(f"{n}x{v} {dtype_name} {mode}", time_neighbours(calls))
    del calls, fns, x
    gc.collect()

    logits_bytes = n * v * torch.empty((), dtype=getattr(torch, DTYPE_NAMES[dtype_name])).element_size()
    for c in names:
        results[c]["logits_mb"] = logits_bytes / MB
        if args.no_memory or (results[c]["error"] and "median_ms" not in results[c]):
            continue
        log(f"    memory: {c}")
        m = measure_memory({"n": n, "v": v, "dtype": dtype_name, "mode": mode, "contender": c}, args)
        if "error" in m:
            results[c]["mem_error"] = m["error"]
        else:
            results[c].update(peak_mb=m["peak_bytes"] / MB, peak_x=m["peak_bytes"] / logits_bytes,
                              peak_exact=m["exact"])
    lf = results.get("lossfuse", {}).get("median_ms")
    for c in names:
        t = results[c].get("median_ms")
        results[c]["lossfuse_speedup"] = t / lf if (lf and t) else None
    return [results[c] for c in names]


def time_neighbours(calls, blocks=6, reps=6):
    """lossfuse's call alone and with each other contender (then all of them) called between its calls: its seconds
    and minor page faults per call by arrangement. The arrangements take turns in blocks of reps calls, so that the
    machine's drift falls on each alike."""
    others = [c for c in calls if c != "lossfuse"]
    arrangements = {"alone": [], **{f"+{c}": [c] for c in others}}
    if len(others) > 1:
        arrangements["+" + "+".join(others)] = others
    seen = {a: ([], []) for a in arrangements}
    for _ in range(blocks):
        for a, between in arrangements.items():
            for _ in range(reps):
                faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                t0 = time.perf_counter()
                run_call(calls["lossfuse"])
                seen[a][0].append(time.perf_counter() - t0)
                seen[a][1].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)
                for c in between:
                    run_call(calls[c])
    return seen


def print_neighbours(config, seen):
    parts = [f"{a} {statistics.median(t) * 1e3:.2f} ms ({statistics.median(f):.0f} faults)"
             for a, (t, f) in seen.items()]
    print(f"neighbours {config}: lossfuse's median call {', '.join(parts)}", flush=True)


def contender_names(args, mode=None):
    """The contenders run (for a mode: the in-place one only in fwdbwd)."""
    return [c for c in CONTENDERS if not (args.no_compile and c == "compile")
            and not (c == "inplace" and (not args.inplace or mode == "fwd"))]


# ---- reporting ---------------------------------------------------------------------------------------------------


def goal_text(rows_by_contender):
    """The issue's goals for fwdbwd at V >= 32000: 'ok' or what is missed; '-' where no goal applies."""
    lf = rows_by_contender.get("lossfuse", {})
    if lf.get("mode") != "fwdbwd" or lf.get("v", 0) < GOAL_V:
        return "-"
    missed = []
    for c, goal in (("eager", GOAL_EAGER), ("compile", GOAL_COMPILE)):
        s = rows_by_contender.get(c, {}).get("lossfuse_speedup")
        if s is not None and s < goal:
            missed.append(f"<{goal:g}x {c}")
    if "peak_mb" in lf and lf["peak_mb"] > GOAL_MEM_X * lf["logits_mb"] + GOAL_MEM_SLACK_MB:
        missed.append("memory")
    return "ok" if not missed else "MISS " + ", ".join(missed)


def print_table(all_rows, names, out):
    groups = {}
    for r in all_rows:
        groups.setdefault((r["n"], r["v"], r["dtype"], r["mode"]), {})[r["contender"]] = r
    others = [c for c in names if c != "lossfuse"]
    head1 = f"{'':<14} {'':<5} {'':<7}" + f" {'median ms':^{10 * len(names)}}" + \
        f" {'lossfuse speedup':^{11 * len(others)}}" + f" {'peak memory MB (x logits)':^{17 * len(names)}}"
    head2 = f"{'shape':<14} {'dtype':<5} {'mode':<7}" + "".join(f" {c:>9}" for c in names) + \
        "".join(f" {'vs ' + c:>10}" for c in others) + "".join(f" {c:>16}" for c in names) + "  goal"
    print(head1.rstrip(), file=out)
    print(head2, file=out)
    print("-" * len(head2), file=out)
    errors = []
    for (n, v, dt, mode), rs in groups.items():
        line = f"{f'{n}x{v}':<14} {dt:<5} {mode:<7}"
        for c in names:
            t = rs.get(c, {}).get("median_ms")
            line += f" {t:9.3f}" if t is not None else f" {'failed' if c in rs else '-':>9}"
        for c in others:
            s = rs.get(c, {}).get("lossfuse_speedup")
            line += f" {s:9.2f}x" if s is not None else f" {'-':>10}"
        for c in names:
            r = rs.get(c, {})
            if "peak_mb" in r:
                cell = f"{'' if r['peak_exact'] else '~'}{r['peak_mb']:.1f} ({r['peak_x']:.2f})"
            else:
                cell = "error" if "mem_error" in r else "-"
            line += f" {cell:>16}"
        line += "  " + goal_text(rs)
        print(line, file=out)
        for c in names:
            r = rs.get(c, {})
            if r.get("error"):
                errors.append(f"{n}x{v} {dt} {mode} {c}: {r['error']}")
            if r.get("mem_error"):
                errors.append(f"{n}x{v} {dt} {mode} {c} (memory): {r['mem_error']}")
    return errors


def write_csv(path, all_rows):
    fields = ["n", "v", "dtype", "mode", "contender", "threads", "reps", "median_ms", "min_ms", "lossfuse_speedup",
              "first_call_s", "logits_mb", "peak_mb", "peak_x", "peak_exact", "error", "mem_error"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in all_rows:
            w.writerow({k: (f"{r[k]:.6g}" if isinstance(r.get(k), float) else r.get(k, "")) for k in fields})


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


# ---- main --------------------------------------------------------------------------------------------------------


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    _use_source_tree(args.installed)
    import torch
    torch_ce = torch.nn.functional.cross_entropy  # torch's own, captured before lossfuse could patch it
    import lossfuse
    import lossfuse.nn.functional as LF
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.memory_child:
        memory_child(json.loads(args.memory_child), torch, torch_ce, LF.cross_entropy)
        return 0

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    names = contender_names(args)
    threads = torch.get_num_threads()
    print(f"lossfuse vs torch: cross_entropy, reduction mean, int64 targets, logits ~ N(0, {LOGIT_STD:g})")
    print(f"  torch {torch.__version__}, lossfuse {lossfuse.__version__} from {os.path.dirname(lossfuse.__file__)}")
    print(f"  {cpu_model()}, {threads} thread{'' if threads == 1 else 's'}, {os.cpu_count()} CPUs")
    if args.reps is not None:
        print(f"  {args.reps} timed calls per contender, interleaved")
    else:
        print(f"  {args.min_reps} to {args.max_reps} timed calls per contender (until {args.min_time:g} s each), "
              "interleaved")
    print("  fwd: loss under no_grad; fwdbwd: loss + torch.autograd.grad. Memory: peak RSS above the inputs, in a "
          "fresh process ('~': upper bound)", flush=True)
    all_rows = []
    for n, v in args.shapes:
        for dt in args.dtypes:
            for mode in args.modes:
                log(f"{n}x{v} {dt} {mode}")
                rows = bench_config(torch, torch_ce, LF.cross_entropy, n, v, dt, mode, args, log)
                for r in rows:
                    r["threads"] = threads
                all_rows += rows
    print(flush=True)
    errors = print_table(all_rows, names, sys.stdout)
    print(f"\ngoal (fwdbwd, V >= {GOAL_V}): lossfuse >= {GOAL_EAGER:g}x eager and >= {GOAL_COMPILE:g}x compile, "
          f"peak <= {GOAL_MEM_X:g}x logits + {GOAL_MEM_SLACK_MB:g} MB (the gradient, no N x V temporary)")
    if args.csv:
        write_csv(args.csv, all_rows)
        print(f"wrote {args.csv}")
    failed = [e for e in errors if "(memory)" not in e]
    for e in errors:
        print(("FAIL " if "(memory)" not in e else "warning ") + e)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
