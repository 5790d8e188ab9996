// The CUDA stream, check and scratch allocator settings and the host-sync count (include/lossfuse/device.hpp); src/cuda
// reads them.
#include "lossfuse/device.hpp"

#include <atomic>
#include <mutex>

#include "core/backend.hpp"

namespace lossfuse {
namespace {

thread_local CudaStream t_stream = nullptr;
thread_local CudaCheck t_check = CudaCheck::report;
std::atomic<std::uint64_t> g_host_syncs{0};
std::mutex g_mu;
CudaAllocator g_allocator;

}  // namespace

void set_cuda_stream(CudaStream stream) noexcept { t_stream = stream; }
CudaStream cuda_stream() noexcept { return t_stream; }

void set_cuda_check(CudaCheck check) noexcept { t_check = check; }
CudaCheck cuda_check() noexcept { return t_check; }

std::uint64_t cuda_host_syncs() noexcept { return g_host_syncs.load(std::memory_order_relaxed); }
void core::count_host_sync() noexcept { g_host_syncs.fetch_add(1, std::memory_order_relaxed); }

void set_cuda_allocator(const CudaAllocator& allocator) noexcept {
  const std::lock_guard<std::mutex> lock(g_mu);
  g_allocator = allocator.allocate != nullptr && allocator.release != nullptr ? allocator : CudaAllocator{};
}

CudaAllocator cuda_allocator() noexcept {
  const std::lock_guard<std::mutex> lock(g_mu);
  return g_allocator;
}

}  // namespace lossfuse
