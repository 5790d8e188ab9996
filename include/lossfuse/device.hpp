// lossfuse: where a call's CUDA work runs. Its kernels, copies and scratch buffers go on the calling thread's current
// CUDA stream (default: the legacy default stream), and its scratch comes from the installed allocator (default:
// lossfuse's own stream-ordered pool). A framework binding sets both to its own (the PyTorch binding: torch's current
// stream and its caching allocator), so lossfuse's work is ordered with the framework's and the memory is shared.
// This header needs no CUDA: a stream is an opaque pointer (a cudaStream_t). Builds without CUDA keep the settings
// and never use them.
#pragma once

#include <cstddef>

namespace lossfuse {

using CudaStream = void*;  // a cudaStream_t; nullptr: the legacy default stream

// The calling thread's current stream, for the calls it makes next.
void set_cuda_stream(CudaStream stream) noexcept;
[[nodiscard]] CudaStream cuda_stream() noexcept;

// Sets the calling thread's stream for a scope; the previous one is restored after.
class CudaStreamScope {
 public:
  explicit CudaStreamScope(CudaStream stream) noexcept : prev_(cuda_stream()) { set_cuda_stream(stream); }
  CudaStreamScope(const CudaStreamScope&) = delete;
  CudaStreamScope& operator=(const CudaStreamScope&) = delete;
  ~CudaStreamScope() { set_cuda_stream(prev_); }

 private:
  CudaStream prev_;
};

// Device scratch. allocate(bytes, stream, ctx): memory of the current device usable in stream order on `stream`
// (nullptr when it cannot); release(ptr, stream, ctx) returns it in stream order. Both may be called from any thread.
struct CudaAllocator {
  void* (*allocate)(std::size_t bytes, CudaStream stream, void* ctx) = nullptr;
  void (*release)(void* ptr, CudaStream stream, void* ctx) = nullptr;
  void* ctx = nullptr;
};

// Process-wide. An allocator without `allocate` restores lossfuse's pool. Change it only while no call runs: a
// buffer is released by the allocator that gave it.
void set_cuda_allocator(const CudaAllocator& allocator) noexcept;
[[nodiscard]] CudaAllocator cuda_allocator() noexcept;

}  // namespace lossfuse
