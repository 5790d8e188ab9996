#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/<stem>_fuzz.cpp) with clang, AddressSanitizer and UndefinedBehaviorSanitizer on
# the library and the targets (this CPU's SIMD target only, so that the build takes minutes; no OpenMP), then runs each for SECONDS (default
# 60) from the repository's seeds (fuzz/corpus/<stem>, only read) and its own corpus (build/fuzz/corpus/<stem>,
# kept between runs). A crash, a sanitizer report or a target's own check (a wrong result, an output written by a
# failed call) stops it with the input saved as build/fuzz/crash-*. Prints the executions of each target.
# Usage: scripts/fuzz.sh [SECONDS]      (scripts/test.sh runs it with 60; long runs: a larger SECONDS)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
scripts/setup.sh
flags="-fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
flags+=" -march=native -DHWY_COMPILE_ONLY_STATIC=1"
cmake -S . -B build/fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1" "-DCMAKE_CXX_FLAGS=$flags" -DLOSSFUSE_FUZZ=ON -DLOSSFUSE_OPENMP=OFF \
  -DLOSSFUSE_BUILD_APPS=OFF -DLOSSFUSE_BUILD_TESTS=OFF -DLOSSFUSE_NVCC_CHECK=OFF -DLOSSFUSE_CUDA=OFF >/dev/null
cmake --build build/fuzz -j "$(nproc)"
for src in fuzz/*_fuzz.cpp; do
  stem=$(basename "$src" .cpp)
  mkdir -p "build/fuzz/corpus/$stem" "fuzz/corpus/$stem"
  log="build/fuzz/$stem.log"
  if ! (cd build/fuzz && "./$stem" -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix=./ \
        "corpus/$stem" "../../fuzz/corpus/$stem") >"$log" 2>&1; then
    tail -40 "$log"
    echo "fuzz: $stem failed (log: $log)"
    exit 1
  fi
  echo "fuzz: $stem: $(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | grep -o '[0-9]*') executions in" \
       "$seconds s, corpus $(ls "build/fuzz/corpus/$stem" | wc -l) inputs"
done
