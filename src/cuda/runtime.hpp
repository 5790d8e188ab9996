// The CUDA backend's runtime helpers: error checks that become lossfuse::Error, and stream-ordered scratch buffers.
// Every kernel runs on the legacy default stream (the C++ API takes no stream yet), so work is ordered with the
// caller's own default-stream work; the host copies in backend.cu synchronise it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "lossfuse/error.hpp"

namespace lossfuse::cuda {

// Throws Error(device_error) naming `what` and the runtime's message unless `status` is cudaSuccess.
inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw Error(ErrorCode::device_error, what, "cudaSuccess",
                std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status));
  }
}

// The current device's scratch pool: lossfuse's own stream-ordered pool, which keeps up to 64 MiB of what it frees
// (scratch is small: a few values per row or class), so a call's allocations cost no driver mapping once warm.
cudaMemPool_t scratch_pool();  // src/cuda/backend.cu

// A device buffer of n elements of T from the scratch pool, freed in stream order.
template <class T>
class Scratch {
 public:
  explicit Scratch(std::size_t n) {
    if (n > 0) {
      check(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&ptr_), n * sizeof(T), scratch_pool(), nullptr),
            "cudaMallocFromPoolAsync");
    }
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    if (ptr_ != nullptr) (void)cudaFreeAsync(ptr_, nullptr);
  }
  [[nodiscard]] T* get() const noexcept { return ptr_; }

 private:
  T* ptr_ = nullptr;
};

}  // namespace lossfuse::cuda
