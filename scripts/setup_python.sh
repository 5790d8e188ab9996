#!/usr/bin/env bash
# Creates the project's Python environment (.venv) with torch from PyPI, the test tools, transformers and matplotlib,
# then builds and installs the lossfuse package into it against that torch (no build isolation). Idempotent;
# rebuilds are incremental (build/python). Usage: scripts/setup_python.sh [--deps]   (--deps: the environment only)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${LOSSFUSE_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup_python: creating $VENV"
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
NEEDED="torch, numpy, pytest, xdist, hypothesis, expecttest, scikit_build_core, transformers, matplotlib"
if ! "$PY" -c "import $NEEDED" 2>/dev/null; then
  echo "setup_python: installing torch, the test tools, transformers and matplotlib from PyPI"
  "$PY" -m pip install -q --upgrade pip
  "$PY" -m pip install -q "torch>=2.10" numpy pytest pytest-xdist hypothesis expecttest "scikit-build-core>=0.10" \
    "transformers>=4.51" matplotlib
fi
[ "${1:-}" = "--deps" ] && exit 0
echo "setup_python: building the lossfuse package"
"$PY" -m pip install -q --no-build-isolation --no-deps .
