#!/usr/bin/env bash
# Builds the CUDA test and bench executables on this machine for scripts/gpu_check.sh to run on a GPU machine that
# cannot build them itself (this workplace's GPU machines have nvcc but neither Highway nor GoogleTest, and no
# network). Output: .gpu/bin (executables, the CUDA runtime linked in statically), .gpu/lib (the shared
# libraries they need beyond glibc) and .gpu/hwy (Highway's headers, libraries and CMake package, a prefix for the
# torch extension's build there), to be carried with the working tree (.gpu/ is ignored by git).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build/gpu -DCMAKE_BUILD_TYPE=Release -DLOSSFUSE_ONEDNN=OFF -DLOSSFUSE_NVCC_CHECK=OFF \
  -DLOSSFUSE_INSTALL=OFF >/dev/null
cmake --build build/gpu -j "$(nproc)" --target test_cross_entropy_cuda_test test_pointwise_cuda_test \
  test_margin_cuda_test test_ctc_cuda_test test_linear_cross_entropy_cuda_test lossfuse_cuda_bench lossfuse_cli
rm -rf .gpu && mkdir -p .gpu/bin .gpu/lib
cp build/gpu/tests/test_cross_entropy_cuda_test build/gpu/tests/test_pointwise_cuda_test \
  build/gpu/tests/test_margin_cuda_test build/gpu/tests/test_ctc_cuda_test \
  build/gpu/tests/test_linear_cross_entropy_cuda_test \
  build/gpu/lossfuse_cuda_bench build/gpu/lossfuse .gpu/bin/
for lib in libhwy.so.1 libhwy_contrib.so.1 libgomp.so.1; do
  cp -L "$(ldconfig -p | awk -v l="$lib" '$1 == l && /x86-64/ {print $NF; exit}')" .gpu/lib/
done
# Highway as an install prefix (its CMake package finds its files relative to itself)
arch=$(gcc -print-multiarch)
mkdir -p .gpu/hwy/include ".gpu/hwy/lib/$arch/cmake"
cp -r /usr/include/hwy .gpu/hwy/include/
cp -a /usr/lib/"$arch"/libhwy*.so* ".gpu/hwy/lib/$arch/"
cp -r /usr/lib/"$arch"/cmake/hwy ".gpu/hwy/lib/$arch/cmake/"
# Liger-Kernel's wheel (pure Python, under 1 MB) for gpu_torch_bench.py's comparison; none when PyPI is unreachable
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python
"$py" -m pip download -q --no-deps -d .gpu/wheels liger-kernel || echo "gpu_build: no Liger-Kernel wheel"
du -sh .gpu
