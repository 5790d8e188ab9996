// The CUDA backend's runtime helpers: error checks that become lossfuse::Error, the calling thread's stream, and
// stream-ordered scratch buffers. Every kernel, copy and scratch buffer of a call goes on the stream the caller set
// (include/lossfuse/device.hpp; default: the legacy default stream). The device calls (cross-entropy, NLL and the
// fused linear loss: core::CeDeviceCall; the elementwise losses: core::PwDeviceCall; the margin losses:
// core::MarginDeviceCall; CTC: core::CtcDeviceCall) read back at most one value and, under stream capture or
// CudaCheck::nan, none (reports_bad_values).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/backend.hpp"
#include "core/targets.hpp"
#include "lossfuse/device.hpp"
#include "lossfuse/dtype.hpp"
#include "lossfuse/error.hpp"

namespace lossfuse::cuda {

// Throws Error(device_error) naming `what` and the runtime's message unless `status` is cudaSuccess.
inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw Error(ErrorCode::device_error, what, "cudaSuccess",
                std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status));
  }
}

// The CUDA device a pointer's memory lives on; host or unregistered memory in a cuda view is refused (a kernel would
// fault on it and take the context down).
inline int device_of(const void* ptr, const char* name) {
  cudaPointerAttributes a{};
  check(cudaPointerGetAttributes(&a, ptr), "cudaPointerGetAttributes");
  if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged) {
    throw Error(ErrorCode::bad_pointer, name, "CUDA device memory (the view says cuda)", "host or unregistered memory");
  }
  return a.device;
}

// A call's device operand: its data (nullptr: absent) and its argument name.
using Operand = std::pair<const void*, const char*>;

// Makes the first present operand's device current for the call (restored after), once every other operand present
// is found there: TensorView names the device kind, not its index. With no operand present (views of no element), the
// current device stays.
class DeviceScope {
 public:
  explicit DeviceScope(const std::vector<Operand>& operands) {
    check(cudaGetDevice(&prev_), "cudaGetDevice");
    dev_ = prev_;
    const char* first = nullptr;
    for (const auto& [ptr, name] : operands) {
      if (ptr == nullptr) continue;
      const int d = device_of(ptr, name);
      if (first == nullptr) {
        dev_ = d, first = name;
      } else if (d != dev_) {
        throw Error(ErrorCode::invalid_value, name,
                    "memory on CUDA device " + std::to_string(dev_) + " (that of " + first + ")",
                    "memory on CUDA device " + std::to_string(d));
      }
    }
    if (prev_ != dev_) check(cudaSetDevice(dev_), "cudaSetDevice");
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  ~DeviceScope() {
    if (prev_ != dev_) (void)cudaSetDevice(prev_);
  }

 private:
  int dev_ = 0, prev_ = 0;
};

// Relaxed stream-capture mode for the calling thread while it lives: a one-time setup (the scratch pool, a library
// handle) may then run during a capture, which its allocations would otherwise invalidate in the global and
// thread-local modes.
class RelaxedCapture {
 public:
  RelaxedCapture() { check(cudaThreadExchangeStreamCaptureMode(&mode_), "cudaThreadExchangeStreamCaptureMode"); }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;
  ~RelaxedCapture() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

// The calling thread's stream (lossfuse::set_cuda_stream).
inline cudaStream_t stream() noexcept { return static_cast<cudaStream_t>(cuda_stream()); }

// Whether the calling thread's stream is being captured into a CUDA graph: then nothing may synchronise with it.
inline bool stream_capturing() {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(stream(), &status), "cudaStreamIsCapturing");
  return status != cudaStreamCaptureStatusNone;
}

// Whether a device call reads its check record back to raise the CPU's error for a bad value: not under stream
// capture, nor under CudaCheck::nan (lossfuse::set_cuda_check). Otherwise nothing is read back and a bad value's
// outputs are NaN.
inline bool reports_bad_values(bool capturing) { return cuda_check() == CudaCheck::report && !capturing; }
inline bool reports_bad_values() { return reports_bad_values(stream_capturing()); }

// The current device's scratch pool: lossfuse's own stream-ordered pool, which keeps up to 64 MiB of what it frees
// (scratch is small: a few values per row or class), so a call's allocations cost no driver mapping once warm. Used
// unless the caller installed an allocator (lossfuse::set_cuda_allocator).
cudaMemPool_t scratch_pool();  // src/cuda/backend.cu

// The current device's multiprocessor count (asked once per device).
int multiprocessors();

// A counter in device memory for the calling thread's stream (device and stream ID: never shared by two streams), 0
// between that stream's kernels: last_block_done leaves it so, and it is zeroed on the stream when made. A kernel that
// counts its finished blocks on it needs no memset before it. Never under stream capture (a graph may replay on
// another stream, beside that stream's own kernels): a captured call zeroes its own counter. Each is kept for the
// process (one small allocation per stream that ever ran such a call, from lossfuse's pool even where another
// allocator is installed, so that no allocator change can free it).
unsigned* stream_counter();

// The counter a folded reduction's blocks count on (last_block_done): `own`, a field of the call's record, where the
// call zeroed that record on the stream (it must under stream capture), else the stream's (stream_counter).
inline unsigned* fold_counter(bool own_zeroed, unsigned* own) { return own_zeroed ? own : stream_counter(); }

// Whether small batches take their one-launch paths (LOSSFUSE_CUDA_SMALL_BATCH unset or not "0"; read once). Off, every
// call takes the general path: ctest runs the CUDA cross-entropy suite both ways (emu.cross_entropy_cuda_test*).
bool small_batch_path();

// A device buffer of n elements of T on the calling thread's stream, from the installed allocator or the pool, and
// returned to the one it came from in that stream's order.
template <class T>
class Scratch {
 public:
  explicit Scratch(std::size_t n) : stream_(stream()), allocator_(cuda_allocator()) {
    if (n == 0) return;
    const std::size_t bytes = n * sizeof(T);
    if (allocator_.allocate != nullptr) {
      ptr_ = static_cast<T*>(allocator_.allocate(bytes, stream_, allocator_.ctx));
      if (ptr_ == nullptr) {
        throw Error(ErrorCode::device_error, "scratch", std::to_string(bytes) + " bytes from the installed allocator",
                    "no memory");
      }
    } else {
      check(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&ptr_), bytes, scratch_pool(), stream_),
            "cudaMallocFromPoolAsync");
    }
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    if (ptr_ == nullptr) return;
    if (allocator_.allocate != nullptr) {
      allocator_.release(ptr_, stream_, allocator_.ctx);
    } else {
      (void)cudaFreeAsync(ptr_, stream_);
    }
  }
  [[nodiscard]] T* get() const noexcept { return ptr_; }

 private:
  cudaStream_t stream_;
  CudaAllocator allocator_;
  T* ptr_ = nullptr;
};

// n host values into `buf` (n or more elements) on the calling thread's stream; returns buf's pointer, or nullptr
// when `host` is. `host` is pageable memory (core's vectors): the copy returns once it is staged for the transfer
// (the CUDA runtime's rule for pageable memory), so the array may go after it; never under stream capture.
template <class T>
const T* upload(const T* host, std::size_t n, const Scratch<T>& buf) {
  if (host == nullptr) return nullptr;
  check(cudaMemcpyAsync(buf.get(), host, n * sizeof(T), cudaMemcpyHostToDevice, stream()),
        "cudaMemcpyAsync (to device)");
  return buf.get();
}

// The calling thread's pinned host buffer of kReadBackBytes (made on first use, freed when the thread ends): a
// read-back lands there by one DMA, without the staging copy of pageable memory (backend.cu).
constexpr std::size_t kReadBackBytes = 64;
void* read_back_buffer();

// `bytes` (at most kReadBackBytes) at `src` in device memory into `out`, on the calling thread's stream after its
// queued work: one synchronisation (`what` names that work in an error).
inline void read_back_bytes(void* out, const void* src, std::size_t bytes, const char* what) {
  void* host = read_back_buffer();
  check(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream()), "cudaMemcpyAsync (read-back)");
  check(cudaStreamSynchronize(stream()), what);
  core::count_host_sync();
  std::memcpy(out, host, bytes);
}

// A check record (an integer in device memory; 0 for nothing found, except CTC's key: all ones) read back.
template <class T>
T read_back(const T* record, const char* what) {
  static_assert(sizeof(T) <= kReadBackBytes);
  T v{};
  read_back_bytes(&v, record, sizeof v, what);
  return v;
}

// The class target at element `offset` of a device target of integer `dtype`, read back: one synchronisation.
inline std::int64_t read_target_back(const void* target, DType dtype, std::int64_t offset) {
  const std::size_t bytes = dtype_size(dtype);
  unsigned char value[8] = {};
  read_back_bytes(value, static_cast<const unsigned char*>(target) + offset * static_cast<std::int64_t>(bytes), bytes,
                  "cudaStreamSynchronize (bad target)");
  return core::read_target(value, dtype, 0);
}

// The caller's n class weights (any floating dtype, `stride` elements apart) into out (Acc, device), on the calling
// thread's stream, as core::load_weights converts them (backend.cu; float and double).
template <class Acc>
void weights_to_acc(const void* w, DType dtype, std::int64_t stride, std::int64_t n, Acc* out);

}  // namespace lossfuse::cuda
