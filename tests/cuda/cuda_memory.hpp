// lossfuse's CUDA tests: device memory for tests/device_mirror.hpp's Mirror, and the main that skips (exit 77, which
// ctest reports as skipped, never passed) on a machine without a CUDA device.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <stdexcept>
#include <string>

#include "device_mirror.hpp"

namespace lftest {

inline void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

inline const DeviceMemory kCuda{
    lossfuse::Device::cuda,
    [](std::size_t bytes) {
      void* p = nullptr;
      cuda_ok(cudaMalloc(&p, bytes), "cudaMalloc");
      return p;
    },
    [](void* p) { (void)cudaFree(p); },
    [](void* dst, const void* host, std::size_t bytes) {
      cuda_ok(cudaMemcpy(dst, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    },
    [](void* host, const void* src, std::size_t bytes) {
      cuda_ok(cudaMemcpy(host, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
    },
};

inline int run_cuda_tests(int argc, char** argv) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no CUDA device on this machine: every CUDA test skipped\n");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

}  // namespace lftest
