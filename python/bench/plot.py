"""lossfuse plot: PNG charts and a leaderboard from the CSV files that `lossfuse bench`, `bench-torch` and
`bench-linear` write with --csv.

    lossfuse plot bench.csv torch.csv linear.csv --out plots/

Each file's kind is told by its header:
  bench         bench_<loss>.png: % of the bandwidth probe measured in the same run, by shape, one bar per
                (dtype, direction)
  bench-torch   torch_<dtype>_<mode>.png: median time by shape, one bar per contender (lossfuse, torch eager,
                torch.compile, in place); leaderboard.md: cross-entropy, float32 forward at (32, 32000), (128, 32000)
                and (32, 50257) (the shapes the CSV holds): backend, time, GB/s of the logits read
  bench-linear  linear_<dtype>_<mode>.png: median time and peak memory by shape, one bar per contender
Needs matplotlib (scripts/setup_python.sh installs it). Files are written under --out; their paths are printed.
"""

import argparse
import csv
import os
import sys

KINDS = {  # a header column only that kind's CSV has -> kind
    "pct_of_probe": "bench", "lossfuse_speedup": "bench-torch", "speedup_torch_lce": "bench-linear"}
LEADERBOARD_SHAPES = [(32, 32000), (128, 32000), (32, 50257)]
BYTES = {"f32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "f16": 2, "float16": 2, "f64": 8, "float64": 8}


def parse_args(argv):
    prog = "lossfuse plot" if os.environ.get("LOSSFUSE_CLI") else None
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n")[2])
    p.add_argument("csv", nargs="+", help="CSV files written by the bench commands' --csv")
    p.add_argument("--out", default="plots", help="output directory (default: plots)")
    return p.parse_args(argv)


def read(path):
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        rows = list(reader)
    kind = next((k for col, k in KINDS.items() if col in header), None)
    if kind is None:
        raise SystemExit(f"lossfuse plot: {path}: expected the CSV of lossfuse bench, bench-torch or bench-linear "
                         f"(a column {', '.join(KINDS)}), got columns {', '.join(header) or 'none'}")
    return kind, rows


def number(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return float("nan")


def bars(ax, groups, series, value, ylabel, title):
    """Grouped bars: one group per x label, one bar per series; value(group, series) -> float (nan: no bar)."""
    width = 0.8 / max(len(series), 1)
    for i, s in enumerate(series):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [value(g, s) for g in groups], width, label=" ".join(s) if isinstance(s, tuple) else str(s))
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)


def unique(values):
    return list(dict.fromkeys(values))


def plot_bench(plt, rows, out):
    paths = []
    for loss in unique(r["loss"] for r in rows):
        mine = [r for r in rows if r["loss"] == loss]
        shapes = unique(r["shape"] for r in mine)
        series = unique((r["dtype"], r["direction"]) for r in mine)
        pct = {(r["shape"], r["dtype"], r["direction"]): number(r["pct_of_probe"]) for r in mine}
        fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(shapes) + 2), 3.6))
        bars(ax, shapes, series, lambda g, s: pct.get((g, *s), float("nan")),
             "% of the bandwidth probe", f"lossfuse bench: {loss}")
        paths.append(save(fig, out, f"bench_{loss}.png"))
    return paths


def plot_by_contender(plt, rows, out, stem, shape_of, panels):
    """One PNG per (dtype, mode): a panel per (column, label), bars by shape and contender."""
    paths = []
    for dtype, mode in unique((r["dtype"], r["mode"]) for r in rows):
        mine = [r for r in rows if (r["dtype"], r["mode"]) == (dtype, mode)]
        shapes = unique(shape_of(r) for r in mine)
        contenders = unique(r["contender"] for r in mine)
        fig, axes = plt.subplots(1, len(panels), figsize=(len(panels) * max(5, 1.2 * len(shapes) + 2), 3.6),
                                 squeeze=False)
        for ax, (column, label) in zip(axes[0], panels):
            got = {(shape_of(r), r["contender"]): number(r[column]) for r in mine}
            bars(ax, shapes, contenders, lambda g, c: got.get((g, c), float("nan")), label,
                 f"{stem} {dtype} {mode}: {label}")
        paths.append(save(fig, out, f"{stem}_{dtype}_{mode}.png"))
    return paths


def leaderboard(rows):
    """Markdown: float32 forward cross-entropy at the leaderboard shapes, one row per (shape, contender)."""
    lines = ["| shape (N, V) | backend | time (us) | GB/s |", "|---|---|---|---|"]
    names = {"lossfuse": "lossfuse (CPU)", "eager": "torch F.cross_entropy (CPU)",
             "compile": "torch.compile(F.cross_entropy) (CPU)"}
    for n, v in LEADERBOARD_SHAPES:
        for r in rows:
            if (int(r["n"]), int(r["v"]), r["dtype"], r["mode"]) == (n, v, "f32", "fwd") and not r["error"]:
                us = number(r["median_ms"]) * 1e3
                gbps = n * v * BYTES["f32"] / (us * 1e3)
                lines.append(f"| ({n}, {v}) | {names.get(r['contender'], r['contender'])} | {us:.1f} | {gbps:.1f} |")
    return "\n".join(lines) + "\n" if len(lines) > 2 else None


def save(fig, out, name):
    path = os.path.join(out, name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt
    plt.close(fig)
    return path


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    files = [(path, *read(path)) for path in args.csv]
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("lossfuse plot: needs matplotlib (scripts/setup_python.sh installs it)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(args.out, exist_ok=True)
    for path, kind, rows in files:
        print(f"lossfuse plot: {path} ({kind}, {len(rows)} rows)", file=sys.stderr)
        if kind == "bench":
            written = plot_bench(plt, rows, args.out)
        elif kind == "bench-torch":
            written = plot_by_contender(plt, rows, args.out, "torch", lambda r: f"{r['n']}x{r['v']}",
                                        [("median_ms", "median time (ms)")])
            table = leaderboard(rows)
            if table:
                written.append(os.path.join(args.out, "leaderboard.md"))
                with open(written[-1], "w") as f:
                    f.write(table)
        else:
            written = plot_by_contender(plt, rows, args.out, "linear", lambda r: f"{r['bt']}x{r['h']}x{r['v']}",
                                        [("median_ms", "median time (ms)"), ("peak_mb", "peak memory (MB)")])
        for p in written:
            print(p)
        plt.close("all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
