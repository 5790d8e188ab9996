#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/<stem>_fuzz.cpp) with clang, AddressSanitizer and UndefinedBehaviorSanitizer on
# the library and the targets (this CPU's SIMD target only, so that the build takes minutes; no OpenMP), then runs
# each, as many at once as there are cores, from the repository's seeds (fuzz/corpus/<stem>.hex: one input per line
# in hex) and its own corpus (build/fuzz/corpus/<stem>, kept between runs). A crash, a sanitizer report or a target's
# own check (a wrong result, a buffer written by a failed call) stops it with the input saved as
# build/fuzz/crash-*; the script then fails. Prints each target's executions, their rate and how the calls ended.
# Usage: scripts/fuzz.sh [--runs N | SECONDS] [STEM...]
#   SECONDS (default 60) per target, from a random seed; --runs N: N executions per target from seed 1, the same
#   inputs on every run of one build (scripts/test.sh: --runs 100000; long runs: --runs 10000000).
#   STEMs: only these targets (e.g. ctc linear_cross_entropy); default every one.
#        scripts/fuzz.sh --save-seeds [STEM...]: rewrites fuzz/corpus/<stem>.hex from build/fuzz/corpus/<stem>
#   (libFuzzer's merge keeps the inputs that add coverage; at most 400 of them, spread over their lengths).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh  # clang and its sanitizer and fuzzer runtimes
limit="-max_total_time=60"
save=0
if [ "${1:-}" = "--save-seeds" ]; then
  save=1
  shift
elif [ "${1:-}" = "--runs" ]; then
  limit="-runs=$2 -seed=1"
  shift 2
elif [ $# -gt 0 ] && [[ "$1" =~ ^[0-9]+$ ]]; then
  limit="-max_total_time=$1"
  shift
fi
stems=("$@")
if [ ${#stems[@]} -eq 0 ]; then
  for src in fuzz/*_fuzz.cpp; do stems+=("$(basename "$src" _fuzz.cpp)"); done
fi

flags="-fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
flags+=" -march=native -DHWY_COMPILE_ONLY_STATIC=1"
cmake -S . -B build/fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1" "-DCMAKE_CXX_FLAGS=$flags" -DLOSSFUSE_FUZZ=ON -DLOSSFUSE_OPENMP=OFF \
  -DLOSSFUSE_BUILD_APPS=OFF -DLOSSFUSE_BUILD_TESTS=OFF -DLOSSFUSE_NVCC_CHECK=OFF -DLOSSFUSE_CUDA=OFF >/dev/null
cmake --build build/fuzz -j "$(nproc)"

if [ "$save" = 1 ]; then
  for stem in "${stems[@]}"; do
    rm -rf "build/fuzz/merged/$stem" && mkdir -p "build/fuzz/merged/$stem"
    "build/fuzz/${stem}_fuzz" -merge=1 "build/fuzz/merged/$stem" "build/fuzz/corpus/$stem" >/dev/null 2>&1
    python3 - "build/fuzz/merged/$stem" "fuzz/corpus/$stem.hex" <<'PY'
import pathlib, sys
inputs = sorted((p.read_bytes() for p in pathlib.Path(sys.argv[1]).iterdir()), key=lambda b: (len(b), b))
inputs = [inputs[i * len(inputs) // 400] for i in range(400)] if len(inputs) > 400 else inputs
pathlib.Path(sys.argv[2]).write_text("".join(b.hex() + "\n" for b in inputs))
PY
    echo "fuzz: fuzz/corpus/$stem.hex: $(wc -l <"fuzz/corpus/$stem.hex") seeds"
  done
  exit 0
fi

# the seeds, one file per input
for stem in "${stems[@]}"; do
  rm -rf "build/fuzz/seeds/$stem" && mkdir -p "build/fuzz/seeds/$stem"
  [ -f "fuzz/corpus/$stem.hex" ] || continue
  python3 - "fuzz/corpus/$stem.hex" "build/fuzz/seeds/$stem" <<'PY'
import pathlib, sys
for i, line in enumerate(pathlib.Path(sys.argv[1]).read_text().split()):
    (pathlib.Path(sys.argv[2]) / f"seed{i:04d}").write_bytes(bytes.fromhex(line))
PY
done

run_one() {
  local stem=$1 limit=$2 t0=$SECONDS
  local log="build/fuzz/${stem}_fuzz.log"
  mkdir -p "build/fuzz/corpus/$stem"
  # shellcheck disable=SC2086  # (limit: one or two flags)
  # OMP_NUM_THREADS=1: oneDNN's GEMM (the linear target) otherwise starts an OpenMP team whose threads spin between
  # the tiny calls, and with a target per core they took the cores from each other (about 230 executions a second
  # against 1100)
  if ! (cd build/fuzz && OMP_NUM_THREADS=1 LOSSFUSE_FUZZ_STATS=1 "./${stem}_fuzz" $limit -print_final_stats=1 \
        -artifact_prefix=./ -max_len=512 "corpus/$stem" "seeds/$stem") >"$log" 2>&1; then
    tail -30 "$log"
    echo "fuzz: ${stem}_fuzz failed (log: $log)"
    return 1
  fi
  local runs secs
  runs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | grep -o '[0-9]*$')
  secs=$((SECONDS - t0))
  echo "fuzz: ${stem}_fuzz: $runs executions in $secs s ($((runs / (secs > 0 ? secs : 1)))/s);" \
       "$(grep -o '[0-9]* calls.*' "$log" | tail -1)"
}
export -f run_one
printf '%s\n' "${stems[@]}" | xargs -P "$(nproc)" -I{} bash -c 'run_one "$@"' _ {} "$limit"
