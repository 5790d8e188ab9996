// The CUDA stream and scratch allocator settings (include/lossfuse/device.hpp); src/cuda reads them.
#include "lossfuse/device.hpp"

#include <mutex>

namespace lossfuse {
namespace {

thread_local CudaStream t_stream = nullptr;
std::mutex g_mu;
CudaAllocator g_allocator;

}  // namespace

void set_cuda_stream(CudaStream stream) noexcept { t_stream = stream; }
CudaStream cuda_stream() noexcept { return t_stream; }

void set_cuda_allocator(const CudaAllocator& allocator) noexcept {
  const std::lock_guard<std::mutex> lock(g_mu);
  g_allocator = allocator.allocate != nullptr && allocator.release != nullptr ? allocator : CudaAllocator{};
}

CudaAllocator cuda_allocator() noexcept {
  const std::lock_guard<std::mutex> lock(g_mu);
  return g_allocator;
}

}  // namespace lossfuse
