#!/usr/bin/env bash
# The concurrency tests under ThreadSanitizer (scripts/test.sh's last stage; about 1.5 minutes on 2 cores: the library
# for AVX2 only, and one test). No OpenMP in this build: tests/cpu/concurrency_test.cpp's second case installs a
# std::thread parallel_for hook, so the kernels' own splitting runs on threads TSan sees. Usage: scripts/tsan.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake --preset tsan >/dev/null
cmake --build --preset tsan -j "$(nproc)" --target test_concurrency_test
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" build/tsan/tests/test_concurrency_test
