"""The lossfuse-vs-torch benchmark script runs end to end (a smoke test: it prints figures, nothing is timed here)."""

import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "bench", "torch_bench.py")


def test_torch_bench_runs_with_the_inplace_contender():
    """One small shape, both modes, with the in-place contender and the peak-memory subprocesses: the script checks
    every contender's loss and sampled gradient rows against torch eager's and exits 0 only if they agree; the
    in-place contender appears in fwdbwd only, and its peak memory is reported."""
    p = subprocess.run([sys.executable, SCRIPT, "--installed", "--shapes", "16x2000", "--reps", "2", "--no-compile",
                        "--inplace", "--dtypes", "f32", "--neighbours"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [line.split() for line in p.stdout.splitlines() if line.startswith("16x2000")]
    assert len(rows) == 2, p.stdout
    header = next(line.split() for line in p.stdout.splitlines() if line.startswith("shape"))
    assert header[3:6] == ["lossfuse", "eager", "inplace"], header
    for row in rows:
        inplace_ms = row[5]
        assert (inplace_ms == "-") == (row[2] == "fwd"), row
    assert "FAIL" not in p.stdout
    # --neighbours: lossfuse alone, then with each other contender between its calls, then with both
    neighbours = [line for line in p.stdout.splitlines() if line.startswith("neighbours 16x2000 f32")]
    assert len(neighbours) == 2, p.stdout
    assert "alone" in neighbours[1] and "+eager" in neighbours[1] and "+eager+inplace" in neighbours[1], neighbours


def test_plot_makes_charts_and_the_leaderboard_from_each_bench_csv(tmp_path):
    """python/bench/plot.py (`lossfuse plot`) on CSVs written by the bench scripts' own writers (and the C++ bench's
    header): one PNG per loss / (dtype, mode), and the leaderboard's float32 forward rows with GB/s of the logits."""
    bench_dir = os.path.join(os.path.dirname(__file__), "..", "bench")
    sys.path.insert(0, bench_dir)
    try:
        import linear_bench
        import plot
        import torch_bench
    finally:
        sys.path.remove(bench_dir)
    torch_rows = [dict(n=n, v=v, dtype="f32", mode=mode, contender=c, median_ms=ms, error="")
                  for n, v in [(32, 32000), (128, 32000), (4096, 32000)] for mode in ("fwd", "fwdbwd")
                  for c, ms in (("lossfuse", 0.05), ("eager", 0.2), ("compile", 0.1))]
    torch_bench.write_csv(tmp_path / "torch.csv", torch_rows)
    linear_bench.write_csv(tmp_path / "linear.csv", [
        {c: dict(bt=1024, h=512, v=32000, dtype="bf16", mode="fwdbwd", contender=c, median_ms=ms, peak_mb=mb)
         for c, ms, mb in (("lossfuse", 40.0, 70.0), ("torch_lce", 90.0, 400.0))}])
    with open(tmp_path / "bench.csv", "w") as f:  # the header of bench/bench_common.cpp's write_csv
        f.write("loss,shape,dtype,direction,median_ms,gbps,probe_gbps,pct_of_probe,baseline_ms,speedup,reps,"
                "baseline_reps,check,note\n"
                "cross_entropy,4096x32000,f32,forward,10.0,52.4,60.0,87.3,0,0,9,0,ok,\n"
                "mse,16777216,bf16,forward_backward,5.0,40.0,50.0,80.0,0,0,9,0,ok,\n")
    out = tmp_path / "plots"
    assert plot.main([str(tmp_path / n) for n in ("bench.csv", "torch.csv", "linear.csv")] + ["--out", str(out)]) == 0
    for name in ("bench_cross_entropy.png", "bench_mse.png", "torch_f32_fwd.png", "torch_f32_fwdbwd.png",
                 "linear_bf16_fwdbwd.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    board = (out / "leaderboard.md").read_text().splitlines()
    assert board[0] == "| shape (N, V) | backend | time (us) | GB/s |"
    # only the leaderboard's shapes in float32 forward: 2 shapes x 3 contenders; 32 * 32000 * 4 bytes in 50 us
    assert len(board) == 2 + 6
    assert board[2] == f"| (32, 32000) | lossfuse (CPU) | 50.0 | {32 * 32000 * 4 / 50e3:.1f} |"
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    with pytest.raises(SystemExit, match="other.csv: expected the CSV of lossfuse bench"):
        plot.main([str(tmp_path / "other.csv")])


def test_vs_torch_times_the_bench_rows_against_torch(tmp_path):
    """python/bench/vs_torch.py (run by `lossfuse bench` after its table) on rows in the C++ bench's CSV format: each
    forward and fwd+bwd row that passed its check is timed through torch and lossfuse (a backward row and a failed
    one are left out), and its CSV carries both times, their ratio and the C++ time."""
    header = "loss,shape,dtype,direction,median_ms,gbps,probe_gbps,pct_of_probe,baseline_ms,speedup,reps,baseline_reps,"
    rows = tmp_path / "rows.csv"
    rows.write_text(header + "check,note\n" + "\n".join([
        "cross_entropy,8x300,f32,fwd+bwd,0.01,1,1,1,,,3,,ok,", "mse,1000,bf16,forward,0.002,1,1,1,,,3,,ok,",
        "mse,1000,bf16,backward,0.002,1,1,1,,,3,,ok,", "multilabel_margin,4x16,f32,fwd+bwd,0.003,1,1,1,,,3,,ok,",
        "ctc,20x3x6x5,f32,forward,0.004,1,1,1,,,3,,ok,", "l1,1000,f32,forward,0.002,1,1,1,,,3,,FAIL,"]) + "\n")
    out = tmp_path / "out.csv"
    script = os.path.join(os.path.dirname(__file__), "..", "bench", "vs_torch.py")
    p = subprocess.run([sys.executable, script, str(rows), "--threads", "1", "--quick", "--csv", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    got = [line.split(",") for line in out.read_text().splitlines()]
    assert got[0] == ["loss", "shape", "dtype", "direction", "torch_ms", "lossfuse_ms", "speedup", "cpp_ms"]
    assert [r[:4] for r in got[1:]] == [["cross_entropy", "8x300", "f32", "fwd+bwd"],
                                         ["mse", "1000", "bf16", "forward"],
                                         ["multilabel_margin", "4x16", "f32", "fwd+bwd"],
                                         ["ctc", "20x3x6x5", "f32", "forward"]], p.stdout
    for r in got[1:]:
        torch_ms, ours_ms, ratio = float(r[4]), float(r[5]), float(r[6])
        assert torch_ms > 0 and ours_ms > 0 and abs(ratio - torch_ms / ours_ms) <= 0.05 * ratio + 0.05, r
    assert "lossfuse faster on" in p.stdout
