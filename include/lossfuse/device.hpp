// lossfuse: where a call's CUDA work runs. Its kernels, copies and scratch buffers go on the calling thread's current
// CUDA stream (default: the legacy default stream), and its scratch comes from the installed allocator (default:
// lossfuse's own stream-ordered pool). A framework binding sets both to its own (the PyTorch binding: torch's current
// stream and its caching allocator), so lossfuse's work is ordered with the framework's and the memory is shared.
// This header needs no CUDA: a stream is an opaque pointer (a cudaStream_t). Builds without CUDA keep the settings
// and never use them.
#pragma once

#include <cstddef>
#include <cstdint>

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

// How a CUDA call treats a bad value that the CPU would name in an error (a class target out of range, a CTC length or
// label, a probability outside [0, 1], a negative variance), for the calls the calling thread makes next:
//   report: the call reads back one 8-byte check record (one synchronisation) and throws the CPU's error, having
//           written nothing. The default.
//   nan:    no check record is read back: the bad value's row (CTC: sample; elementwise: every output) is NaN, as
//           under stream capture. Core's host copies still run (CTC's concatenated targets bring their lengths to the
//           host), as they are refused under capture. For calls whose inputs are known good: a backward of checked
//           targets (the PyTorch binding's backward passes run so), or a training step that must not synchronise.
// The CPU checks on the host, which costs no synchronisation, and always reports. Tests: every CUDA capture test also
// runs its calls as RunAs::unchecked (tests/cuda/cuda_memory.hpp); DeviceSettings.* (tests/core/device_test.cpp).
enum class CudaCheck : std::uint8_t { report, nan };
void set_cuda_check(CudaCheck check) noexcept;
[[nodiscard]] CudaCheck cuda_check() noexcept;

// Sets the calling thread's CudaCheck for a scope; the previous one is restored after.
class CudaCheckScope {
 public:
  explicit CudaCheckScope(CudaCheck check) noexcept : prev_(cuda_check()) { set_cuda_check(check); }
  CudaCheckScope(const CudaCheckScope&) = delete;
  CudaCheckScope& operator=(const CudaCheckScope&) = delete;
  ~CudaCheckScope() { set_cuda_check(prev_); }

 private:
  CudaCheck prev_;
};

// The synchronising copies lossfuse's CUDA calls have made in this process, on any thread: check records and bad
// values read back, and core's host copies (CTC's concatenated lengths, for one). A diagnostic: a call that reads
// nothing back leaves it as it was.
[[nodiscard]] std::uint64_t cuda_host_syncs() noexcept;

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
