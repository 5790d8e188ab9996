#!/usr/bin/env bash
# Sets up, builds and runs every test: the C++ Release suite, the Python package's suite (pytest, against torch
# from PyPI in .venv), then the C++ suite again under AddressSanitizer and UndefinedBehaviorSanitizer.
# Usage: scripts/test.sh [--fast]   (--fast: no sanitizer rerun)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
jobs=$(nproc)

cmake --preset release >/dev/null
cmake --build --preset release -j "$jobs"
ctest --preset release -j "$jobs"

scripts/setup_python.sh
.venv/bin/python -m pytest python/tests -q -p no:cacheprovider

if [ "${1:-}" != "--fast" ]; then
  cmake --preset asan >/dev/null
  cmake --build --preset asan -j "$jobs"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 ctest --preset asan -j "$jobs"
fi
echo "test.sh: all tests passed"
