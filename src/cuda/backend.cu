// The CUDA backend's table: every loss family (src/cuda/kernels.hpp), its scratch pool and the class-weight conversion.
// The elementwise losses' value checks scan host copies (core), so value_scan is never given device memory.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>

#include "core/backend.hpp"
#include "cuda/kernels.hpp"
#include "cuda/runtime.hpp"

namespace lossfuse::cuda {

namespace {

constexpr int kMaxDevices = 64;

int current_device() {
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  if (dev < 0 || dev >= kMaxDevices) {
    throw Error(ErrorCode::device_error, "device", "a CUDA device index below 64", std::to_string(dev));
  }
  return dev;
}

}  // namespace

cudaMemPool_t scratch_pool() {
  static std::mutex mu;
  static cudaMemPool_t pools[kMaxDevices] = {};
  const int dev = current_device();
  const std::lock_guard<std::mutex> lock(mu);
  if (pools[dev] == nullptr) {
    const RelaxedCapture relaxed;  // the first call may come during a stream capture (a CUDA graph)
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = dev;
    cudaMemPool_t pool = nullptr;
    check(cudaMemPoolCreate(&pool, &props), "cudaMemPoolCreate");
    std::uint64_t keep = std::uint64_t{64} << 20;  // up to 64 MiB stays mapped between calls
    check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), "cudaMemPoolSetAttribute");
    pools[dev] = pool;
  }
  return pools[dev];
}

int multiprocessors() {
  static std::mutex mu;
  static int counts[kMaxDevices] = {};
  const int dev = current_device();
  const std::lock_guard<std::mutex> lock(mu);
  if (counts[dev] == 0) {
    check(cudaDeviceGetAttribute(&counts[dev], cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
  }
  return counts[dev];
}

unsigned* stream_counter() {
  static std::mutex mu;
  // (device, stream ID, thread for the per-thread default stream, whose handle every thread shares)
  static std::map<std::tuple<int, unsigned long long, std::thread::id>, unsigned*> counters;
  struct Last {
    int dev = -1;
    unsigned long long id = 0;
    unsigned* counter = nullptr;
  };
  thread_local Last last;  // this thread's last stream: no lock on the way back to it
  const int dev = current_device();
  unsigned long long id = 0;
  check(cudaStreamGetId(stream(), &id), "cudaStreamGetId");
  if (last.counter != nullptr && last.dev == dev && last.id == id) return last.counter;
  const std::thread::id thread = stream() == cudaStreamPerThread ? std::this_thread::get_id() : std::thread::id{};
  const std::lock_guard<std::mutex> lock(mu);
  unsigned*& c = counters[{dev, id, thread}];
  if (c == nullptr) {  // kept for the process, from lossfuse's pool (never released, whatever allocator is installed)
    void* p = nullptr;
    check(cudaMallocFromPoolAsync(&p, sizeof(unsigned), scratch_pool(), stream()), "cudaMallocFromPoolAsync (counter)");
    check(cudaMemsetAsync(p, 0, sizeof(unsigned), stream()), "cudaMemsetAsync (counter)");
    c = static_cast<unsigned*>(p);
  }
  last = {dev, id, c};
  return c;
}

bool small_batch_path() {
  static const bool on = [] {
    const char* v = std::getenv("LOSSFUSE_CUDA_SMALL_BATCH");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return on;
}

void* read_back_buffer() {
  struct Buffer {
    void* p = nullptr;
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    Buffer() = default;
    ~Buffer() {
      if (p != nullptr) (void)cudaFreeHost(p);
    }
  };
  thread_local Buffer buffer;
  if (buffer.p == nullptr) {
    check(cudaHostAlloc(&buffer.p, kReadBackBytes, cudaHostAllocPortable), "cudaHostAlloc (read-back buffer)");
  }
  return buffer.p;
}

namespace {

// The caller's class weights (any floating dtype and stride) in Acc, as core::load_weights converts them.
template <class Acc>
__global__ void weights_kernel(const void* w, DType dtype, std::int64_t stride, std::int64_t n, Acc* out) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t o = i * stride;
    Acc v = 0;
    switch (dtype) {
      case DType::f32: v = static_cast<Acc>(static_cast<const float*>(w)[o]); break;
      case DType::f64: v = static_cast<Acc>(static_cast<const double*>(w)[o]); break;
      case DType::f16: v = static_cast<Acc>(__half2float(static_cast<const __half*>(w)[o])); break;
      case DType::bf16: v = static_cast<Acc>(__bfloat162float(static_cast<const __nv_bfloat16*>(w)[o])); break;
      default: break;
    }
    out[i] = v;
  }
}

}  // namespace

template <class Acc>
void weights_to_acc(const void* w, DType dtype, std::int64_t stride, std::int64_t n, Acc* out) {
  if (n == 0) return;
  const auto blocks = static_cast<unsigned>(std::min<std::int64_t>((n + 255) / 256, 4096));
  weights_kernel<Acc><<<blocks, 256, 0, stream()>>>(w, dtype, stride, n, out);
  check(cudaGetLastError(), "weights_kernel");
}
template void weights_to_acc<float>(const void*, DType, std::int64_t, std::int64_t, float*);
template void weights_to_acc<double>(const void*, DType, std::int64_t, std::int64_t, double*);


}  // namespace lossfuse::cuda

namespace lossfuse::core {
namespace {

// A host copy under stream capture would invalidate the capture: refused, the capture left as it was.
void refuse_under_capture(const char* what) {
  if (cuda::stream_capturing()) {
    throw Error(ErrorCode::invalid_value, "stream", "a stream that is not capturing a CUDA graph", what);
  }
}

// On the caller's stream, so that a copy sees that stream's earlier work (an operand a framework kernel just wrote).
void to_host(void* host, const void* src, std::size_t bytes) {
  refuse_under_capture("a capturing stream (this call reads device values on the host)");
  cuda::check(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, cuda::stream()),
              "cudaMemcpyAsync (device to host)");
  cuda::check(cudaStreamSynchronize(cuda::stream()), "cudaStreamSynchronize (device to host)");
  count_host_sync();
}

// The host buffer may be reused once this returns: the stream is synchronised (pageable memory is staged anyway).
void from_host(void* dst, const void* host, std::size_t bytes) {
  refuse_under_capture("a capturing stream (this call copies host values to the device)");
  cuda::check(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, cuda::stream()),
              "cudaMemcpyAsync (host to device)");
  cuda::check(cudaStreamSynchronize(cuda::stream()), "cudaStreamSynchronize (host to device)");
  count_host_sync();
}

bool value_scan_not_on_cuda(DType, const void*, std::int64_t, ValueScan) {
  throw Error(ErrorCode::not_implemented, "value_scan", "host memory (core scans a host copy)", "device memory");
}

}  // namespace

const Backend* cuda_backend() noexcept {
  static constexpr Backend kCuda{
      Device::cuda,
      to_host,
      from_host,
      cuda::stream_capturing,
      cuda::cross_entropy_rows,
      cuda::nll_rows,
      cuda::pointwise_run,
      value_scan_not_on_cuda,
      cuda::ctc_run_samples,
      cuda::triplet_margin_rows,
      cuda::cosine_embedding_rows,
      cuda::multi_margin_rows,
      cuda::multilabel_margin_rows,
      cuda::multilabel_soft_margin_rows,
      cuda::linear_cross_entropy_run,
  };
  return &kCuda;
}

}  // namespace lossfuse::core
