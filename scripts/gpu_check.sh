#!/usr/bin/env bash
# The one command that verifies and measures lossfuse's CUDA backend on a machine with an NVIDIA GPU.
# Usage: scripts/gpu_check.sh OUT_DIR. Writes OUT_DIR/gpu_check.log and the CSVs cuda_bench.csv (lossfuse and the
# device's read / copy probes) and torch_bench.csv (torch eager and compiled at the same shapes).
# Steps: the CUDA C++ tests (every cross-entropy / NLL, elementwise, margin, CTC and whole-row fused linear case of the
# CPU suite on device tensors, against the float64 reference), compute-sanitizer memcheck and racecheck on subsets,
# the lossfuse bench, then the torch extension built with its CUDA route (against this machine's torch, Highway from
# .gpu/hwy), the torch bench (torch eager and compiled; Liger-Kernel and lossfuse through torch where they import)
# and the extension's CUDA tests (python/tests/test_cuda.py, the CUDA cases of test_distributed.py and, where
# transformers is installed, of test_transformers.py). Executables come from .gpu/bin when scripts/gpu_build.sh made
# them elsewhere (machines without Highway / GoogleTest), else are built here. Exit status: the number of failed
# steps. The steps' limits add up to more than one device session's time; a first pass on a new machine can run
#   GPU_CHECK_ONLY='^(build|cuda (pointwise|margin|ctc|linear) tests|memcheck (pointwise|margin|ctc|linear))$' \
#     scripts/gpu_check.sh OUT
set -uo pipefail
out=${1:?usage: scripts/gpu_check.sh OUT_DIR}
cd "$(dirname "$0")/.."
mkdir -p "$out"
exec > >(tee "$out/gpu_check.log") 2>&1
failed=0
step() {  # step NAME TIMEOUT_S COMMAND...; GPU_CHECK_ONLY (an extended regex) runs only the steps it matches
  local name=$1 limit=$2 t0=$SECONDS rc
  shift 2
  if [ -n "${GPU_CHECK_ONLY:-}" ] && ! [[ "$name" =~ $GPU_CHECK_ONLY ]]; then
    echo "=== $name: skipped (GPU_CHECK_ONLY)"
    return
  fi
  echo "=== $name"
  timeout "$limit" "$@"
  rc=$?
  echo "=== $name: rc=$rc in $((SECONDS - t0)) s"
  [ "$rc" -eq 0 ] || failed=$((failed + 1))
}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true
if [ -x .gpu/bin/test_cross_entropy_cuda_test ]; then
  bin=.gpu/bin
  export LD_LIBRARY_PATH=$PWD/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
else
  step build 600 bash -c 'cmake -S . -B build/gpu -DCMAKE_BUILD_TYPE=Release -DLOSSFUSE_ONEDNN=OFF \
      -DCMAKE_CUDA_ARCHITECTURES=90a-real >/dev/null &&
    cmake --build build/gpu -j "$(nproc)" --target test_cross_entropy_cuda_test test_pointwise_cuda_test \
      test_margin_cuda_test test_ctc_cuda_test test_linear_cross_entropy_cuda_test lossfuse_cuda_bench lossfuse_cli'
  mkdir -p build/gpu/bin && cp build/gpu/tests/test_cross_entropy_cuda_test build/gpu/tests/test_pointwise_cuda_test \
    build/gpu/tests/test_margin_cuda_test build/gpu/tests/test_ctc_cuda_test \
    build/gpu/tests/test_linear_cross_entropy_cuda_test \
    build/gpu/lossfuse_cuda_bench build/gpu/lossfuse build/gpu/bin/
  bin=build/gpu/bin
fi

step "cuda tests" 300 "$bin/test_cross_entropy_cuda_test" --gtest_brief=1
# the general path (scan kernel, 256-thread blocks) for the specs a small batch otherwise takes in one launch
step "cuda tests, general path" 120 env LOSSFUSE_CUDA_SMALL_BATCH=0 "$bin/test_cross_entropy_cuda_test" \
  --gtest_brief=1 --gtest_filter='Options/*:Soft/*:Edge/*:*Errors*:*Graph*'
step "cuda pointwise tests" 240 "$bin/test_pointwise_cuda_test" --gtest_brief=1
step "cuda margin tests" 240 "$bin/test_margin_cuda_test" --gtest_brief=1
step "cuda ctc tests" 240 "$bin/test_ctc_cuda_test" --gtest_brief=1
step "cuda linear tests" 240 "$bin/test_linear_cross_entropy_cuda_test" --gtest_brief=1
# sanitize STEP TOOL TEST_BINARY GTEST_FILTER [TIMEOUT_S]: compute-sanitizer's TOOL on a subset of one CUDA test binary
sanitize() {
  step "$1" "${5:-180}" compute-sanitizer --tool "$2" --error-exitcode 1 --print-limit 20 "$bin/$3" --gtest_brief=1 \
    --gtest_filter="$4"
}
sanitize "memcheck" memcheck test_cross_entropy_cuda_test 'Options/*f32_mean*:*Errors*:TargetDtypes/*i8*:*Graph*' 240
sanitize "memcheck pointwise" memcheck test_pointwise_cuda_test 'Layouts/*f32*:Edge/*bf16*:*Errors*'
sanitize "memcheck margin" memcheck test_margin_cuda_test 'Layouts/*:Edge/*f32*:LongRows/*f32*:*Errors*'
sanitize "memcheck linear" memcheck test_linear_cross_entropy_cuda_test '*f32_mean_N7*:*Edge*:*Errors*'
sanitize "memcheck ctc" memcheck test_ctc_cuda_test '*Empty*:*Bad*:*IntegerDtypes*'
sanitize "racecheck ctc" racecheck test_ctc_cuda_test '*DtypesReductions*:*Repeats*'
sanitize "racecheck margin" racecheck test_margin_cuda_test 'Layouts/*:LongRows/*bf16*:*Determinism*'
sanitize "racecheck" racecheck test_cross_entropy_cuda_test 'Shapes/*bf16*mean*:Soft/*bf16*:*Graph*'
cuda_bench=("$bin/lossfuse" bench --device cuda --csv)  # lossfuse_cuda_bench itself where a .gpu lacks the command
[ -x "$bin/lossfuse" ] || cuda_bench=("$bin/lossfuse_cuda_bench")
step "lossfuse bench" 240 "${cuda_bench[@]}" "$out/cuda_bench.csv"
# The torch extension against this machine's torch (its C++ ABI), into .gpu/py; Highway from scripts/gpu_build.sh
step "torch extension" 420 env CMAKE_PREFIX_PATH="$PWD/.gpu/hwy" python3 -m pip install -q --no-build-isolation \
  --no-deps --target .gpu/py -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real -C build-dir=build/gpu-python .
# Liger-Kernel for the torch bench's comparison, from the wheel scripts/gpu_build.sh downloaded (pure Python)
liger=$(ls .gpu/wheels/liger_kernel-*.whl 2>/dev/null | head -1)
[ -n "$liger" ] && python3 -m zipfile -e "$liger" .gpu/liger
pyenv=(env PYTHONPATH="$PWD/.gpu/py:$PWD/.gpu/liger" LD_LIBRARY_PATH="$PWD/.gpu/lib:$PWD/.gpu/hwy/lib/$(gcc \
  -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
step "torch bench" 240 "${pyenv[@]}" python3 scripts/gpu_torch_bench.py "$out/torch_bench.csv"
step "torch cuda tests" 300 "${pyenv[@]}" python3 -m pytest -q -rs -p no:cacheprovider python/tests/test_cuda.py
step "torch distributed and transformers" 240 "${pyenv[@]}" python3 -m pytest -q -rs -p no:cacheprovider \
  python/tests/test_distributed.py::test_cuda_tensors \
  python/tests/test_transformers.py::test_cuda_loss_and_every_gradient_match_the_unpatched_model
echo "=== failed steps: $failed"
exit "$failed"
