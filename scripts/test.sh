#!/usr/bin/env bash
# Sets up, builds and runs every test: the C++ Release suite (every SIMD target), the installed C++ package's
# consumer (examples/cpp), the Python package's suite (pytest, against torch from PyPI in .venv), then the C++ suite
# again under AddressSanitizer and UndefinedBehaviorSanitizer (clang, AVX2 only), and the concurrency tests
# under ThreadSanitizer, and 100000 inputs (from a fixed seed) through every libFuzzer target (scripts/fuzz.sh).
# Prints each stage's time.
# Usage: scripts/test.sh [--fast]   (--fast: no sanitizer runs)
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=$(nproc)
# Every stage runs a process per core; OpenMP's threads (the library's, torch's) spinning between parallel regions
# took the cores from each other: pytest ran twice as long, one C++ test 15 times (tests/CMakeLists.txt)
export OMP_WAIT_POLICY=passive
stage() {
  local name=$1 t0=$SECONDS
  shift
  "$@"
  echo "test.sh: stage '$name' took $((SECONDS - t0)) s"
}

quiet() { "$@" >/dev/null; }

install_consumer() {
  rm -rf build/install build/example
  cmake --install build/release --prefix build/install >/dev/null
  cmake -S examples/cpp -B build/example -DCMAKE_PREFIX_PATH="$PWD/build/install" >/dev/null
  cmake --build build/example -j "$jobs" >/dev/null
  build/example/cross_entropy_example
}

# a pytest-xdist worker per core; test_large.py (8.6 GB) afterwards, alone, as ctest runs its 2^31 tests
run_pytest() {
  .venv/bin/python -m pytest python/tests -q -p no:cacheprovider -n "$jobs" --ignore=python/tests/test_large.py
  .venv/bin/python -m pytest python/tests/test_large.py -q -p no:cacheprovider
}

stage setup scripts/setup.sh
# The Python environment (torch and the test tools from PyPI: mostly download and unpacking) is made while the
# release build compiles; the python-setup stage waits for it, then builds the package.
mkdir -p build
setsid -w scripts/setup_python.sh --deps >build/python-deps.log 2>&1 &
python_deps=$!
trap 'kill -- -"$python_deps" 2>/dev/null || true' EXIT  # a failed stage (or Ctrl-C) stops it with the script
python_setup() {
  wait "$python_deps" || { cat build/python-deps.log; return 1; }
  scripts/setup_python.sh
}
# a compiler cache, so the Python package's build takes the library's objects, C++ and CUDA, from the release
# build's (read by CMake when it first configures a build tree: a fresh clone, as CI's). ccache keys on the
# compiler's name too: both builds name it g++ (CMake would call it c++ in one and g++ in the other). The two
# builds' -D flags differ (oneDNN), so the CUDA objects hit in ccache's preprocessed mode.
if command -v ccache >/dev/null; then
  export CMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER:-ccache}
  export CMAKE_CUDA_COMPILER_LAUNCHER=${CMAKE_CUDA_COMPILER_LAUNCHER:-ccache}
fi
export CXX=${CXX:-g++}
stage release-configure quiet cmake --preset release
stage release-build cmake --build --preset release -j "$jobs"
stage release-ctest ctest --preset release -j "$jobs"
stage install-consumer install_consumer

stage python-setup python_setup
stage pytest run_pytest

if [ "${1:-}" != "--fast" ]; then
  stage asan-configure quiet cmake --preset asan
  stage asan-build cmake --build --preset asan -j "$jobs"
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
  stage asan-ctest ctest --preset asan -j "$jobs"
  stage tsan scripts/tsan.sh
  stage fuzz scripts/fuzz.sh --runs 100000
fi
echo "test.sh: all tests passed in $SECONDS s"
