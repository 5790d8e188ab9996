"""The lossfuse-vs-torch benchmark script runs end to end (a smoke test: it prints figures, nothing is timed here)."""

import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "bench", "torch_bench.py")


def test_torch_bench_runs_with_the_inplace_contender():
    """One small shape, both modes, with the in-place contender and the peak-memory subprocesses: the script checks
    every contender's loss and sampled gradient rows against torch eager's and exits 0 only if they agree; the
    in-place contender appears in fwdbwd only, and its peak memory is reported."""
    p = subprocess.run([sys.executable, SCRIPT, "--installed", "--shapes", "16x2000", "--reps", "2", "--no-compile",
                        "--inplace", "--dtypes", "f32"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [line.split() for line in p.stdout.splitlines() if line.startswith("16x2000")]
    assert len(rows) == 2, p.stdout
    header = next(line.split() for line in p.stdout.splitlines() if line.startswith("shape"))
    assert header[3:6] == ["lossfuse", "eager", "inplace"], header
    for row in rows:
        inplace_ms = row[5]
        assert (inplace_ms == "-") == (row[2] == "fwd"), row
    assert "FAIL" not in p.stdout
