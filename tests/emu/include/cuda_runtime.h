// lossfuse's CUDA emulator (tests/emu/): the CUDA runtime API and the device built-ins src/cuda uses, on the host, so
// the backend's kernels and host steps are tested on machines without a GPU. A launch runs its blocks one after
// another on the calling thread, each block's threads as fibers that switch at __syncthreads and warp shuffles. It
// checks logic (indices, barriers, reductions, read-backs, capture rules, out-of-bounds device accesses), not the
// device's timing, memory model or intrinsics (__expf is expf). The rules it enforces: docs/cuda.md#the-emulator.
#pragma once

#include <math.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#define LOSSFUSE_CUDA_EMULATOR 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
// No __shared__: cu_to_cpp.py makes each declaration a static that lfemu::static_shared refills per block (one block
// runs at a time), so one it missed does not compile.
#define __launch_bounds__(...)

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchFailure = 719,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureWrongThread = 908,
  cudaErrorStreamCaptureImplicit = 906,
};
using cudaError = cudaError_t;

struct CUstream_st;
using cudaStream_t = CUstream_st*;
// The per-thread default stream's handle; the emulator runs no stream of that kind (using it is an error there).
inline cudaStream_t const cudaStreamPerThread = reinterpret_cast<cudaStream_t>(0x2);
struct CUgraph_st;
using cudaGraph_t = CUgraph_st*;
struct CUgraphExec_st;
using cudaGraphExec_t = CUgraphExec_st*;
struct CUmemPool_st;
using cudaMemPool_t = CUmemPool_st*;
struct CUevent_st;
using cudaEvent_t = CUevent_st*;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};
enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3
};
struct cudaPointerAttributes {
  cudaMemoryType type;
  int device;
  void* devicePointer;
  void* hostPointer;
};
enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2
};
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2
};
enum cudaMemAllocationType { cudaMemAllocationTypeInvalid = 0, cudaMemAllocationTypePinned = 1 };
enum cudaMemLocationType { cudaMemLocationTypeInvalid = 0, cudaMemLocationTypeDevice = 1 };
enum cudaMemPoolAttr { cudaMemPoolAttrReleaseThreshold = 4 };
struct cudaMemLocation {
  cudaMemLocationType type;
  int id;
};
struct cudaMemPoolProps {
  cudaMemAllocationType allocType;
  int handleTypes;
  cudaMemLocation location;
  void* win32SecurityAttributes;
  std::size_t maxSize;
  unsigned short usage;
  unsigned char reserved[54];
};
constexpr unsigned cudaStreamDefault = 0, cudaStreamNonBlocking = 1;
constexpr unsigned cudaHostAllocDefault = 0, cudaHostAllocPortable = 1;

const char* cudaGetErrorName(cudaError_t e);
const char* cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
cudaError_t cudaGetDeviceCount(int* n);
cudaError_t cudaGetDevice(int* d);
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);  // 132 multiprocessors (an H100's)
cudaError_t cudaSetDevice(int d);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaMalloc(void** p, std::size_t bytes);
cudaError_t cudaFree(void* p);
cudaError_t cudaHostAlloc(void** p, std::size_t bytes, unsigned flags);
cudaError_t cudaMallocHost(void** p, std::size_t bytes);
cudaError_t cudaFreeHost(void* p);
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p);
cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s = nullptr);
cudaError_t cudaMemset(void* p, int value, std::size_t bytes);
cudaError_t cudaMemsetAsync(void* p, int value, std::size_t bytes, cudaStream_t s = nullptr);
cudaError_t cudaStreamCreate(cudaStream_t* s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status);
cudaError_t cudaStreamGetId(cudaStream_t s, unsigned long long* id);  // unique in the process, never reused
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph);
cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaMemPoolCreate(cudaMemPool_t* pool, const cudaMemPoolProps* props);
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value);
cudaError_t cudaMallocFromPoolAsync(void** p, std::size_t bytes, cudaMemPool_t pool, cudaStream_t s);
cudaError_t cudaMallocAsync(void** p, std::size_t bytes, cudaStream_t s);
cudaError_t cudaFreeAsync(void* p, cudaStream_t s);
cudaError_t cudaEventCreate(cudaEvent_t* e);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b);

namespace lfemu {

// The running thread's built-in variables (set by the scheduler before it resumes each fiber).
struct Builtins {
  uint3 thread, block;
  dim3 block_dim, grid_dim;
};
extern thread_local Builtins builtins;

void sync_block(const void* site);
int sync_block_or(int predicate, const void* site);
// `bytes` of `mine` from lane src of the calling thread's warp into out, once every lane of `mask` arrived.
// The lanes of one exchange must call it from one source line (file, line) and name a source lane in the mask.
void warp_exchange(unsigned mask, const void* mine, void* out, std::size_t bytes, unsigned src, const char* file,
                   int line);
void* dynamic_shared();  // the launch's dynamic shared memory, zero bytes unless asked
// A static `__shared__` array at p (cu_to_cpp.py's rewrite): at the block's first pass over its declaration, set to
// the bytes unwritten memory holds in this run (0xff; the race check's second run 0x3f), as dynamic shared memory.
// A block whose static arrays reached so far and the launch's dynamic bytes pass 48 KiB fails the launch.
void static_shared(void* p, std::size_t bytes);

// What the process has asked of the emulated runtime so far, counted when asked (captured work when captured, not
// when a graph replays it): kernel launches, memsets, copies. tests/emu/launch_count_test.cpp reads them.
struct Counts {
  std::uint64_t kernels = 0, memsets = 0, copies = 0;
};
Counts counts() noexcept;

// A kernel launch: grid, block, dynamic shared bytes, stream; run (or recorded under capture) by operator().
class Launch {
 public:
  Launch(dim3 grid, dim3 block, std::size_t smem = 0, cudaStream_t stream = nullptr)
      : grid_(grid), block_(block), smem_(smem), stream_(stream) {}
  template <class F, class... Args>
  void operator()(F f, Args&&... args) const {
    auto body = [f, t = std::tuple<std::decay_t<Args>...>(std::forward<Args>(args)...)]() { std::apply(f, t); };
    submit(new Body<decltype(body)>(std::move(body)));
  }

  struct Task {
    virtual ~Task() = default;
    virtual void run() = 0;  // one thread's kernel call
  };

 private:
  template <class B>
  struct Body final : Task {
    explicit Body(B b) : body(std::move(b)) {}
    void run() override { body(); }
    B body;
  };
  void submit(Task* task) const;  // takes ownership
  dim3 grid_, block_;
  std::size_t smem_;
  cudaStream_t stream_;
};

inline unsigned lane() {
  const Builtins& b = builtins;
  return (b.thread.x + b.block_dim.x * (b.thread.y + b.block_dim.y * b.thread.z)) % 32u;
}

template <class T>
T* dynamic_shared_as() {
  return static_cast<T*>(dynamic_shared());
}

}  // namespace lfemu

#define threadIdx (::lfemu::builtins.thread)
#define blockIdx (::lfemu::builtins.block)
#define blockDim (::lfemu::builtins.block_dim)
#define gridDim (::lfemu::builtins.grid_dim)
#define warpSize 32

// Each barrier names its source line: the threads of a block meeting at different barriers is an error here.
#define LFEMU_STR2(x) #x
#define LFEMU_STR(x) LFEMU_STR2(x)
#define LFEMU_SITE (__FILE__ ":" LFEMU_STR(__LINE__))
#define __syncthreads() ::lfemu::sync_block(LFEMU_SITE)
#define __syncthreads_or(p) ::lfemu::sync_block_or((p), LFEMU_SITE)

inline void __threadfence() {}
inline void __threadfence_block() {}

template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32, const char* file = __builtin_FILE(),
                  int line = __builtin_LINE()) {
  static_assert(sizeof(T) <= 16, "a warp slot holds 16 bytes");
  const unsigned lane = ::lfemu::lane();
  unsigned src = lane ^ static_cast<unsigned>(lane_mask);
  if ((src & ~static_cast<unsigned>(width - 1)) != (lane & ~static_cast<unsigned>(width - 1))) src = lane;
  T out;
  ::lfemu::warp_exchange(mask, &v, &out, sizeof(T), src, file, line);
  return out;
}

inline void __syncwarp(unsigned mask = 0xffffffffu, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  const unsigned char none = 0;
  unsigned char out;
  ::lfemu::warp_exchange(mask, &none, &out, 1, ::lfemu::lane(), file, line);
}

template <class T>
T __ldg(const T* p) {
  return *p;
}
template <class T>
T __ldcg(const T* p) {
  return *p;
}
inline float __expf(float v) { return std::exp(v); }

// Atomics: one launch runs at a time and its threads one at a time, so a plain read and write is atomic here.
namespace lfemu {
template <class T, class F>
T update(T* p, F f) {
  const T old = *p;
  *p = f(old);
  return old;
}
}  // namespace lfemu
// clang-format off
template <class T> T atomicAdd(T* p, T v) { return ::lfemu::update(p, [v](T o) { return static_cast<T>(o + v); }); }
template <class T> T atomicMax(T* p, T v) { return ::lfemu::update(p, [v](T o) { return v > o ? v : o; }); }
template <class T> T atomicMin(T* p, T v) { return ::lfemu::update(p, [v](T o) { return v < o ? v : o; }); }
template <class T> T atomicOr(T* p, T v) { return ::lfemu::update(p, [v](T o) { return static_cast<T>(o | v); }); }
template <class T> T atomicAnd(T* p, T v) { return ::lfemu::update(p, [v](T o) { return static_cast<T>(o & v); }); }
template <class T> T atomicExch(T* p, T v) { return ::lfemu::update(p, [v](T) { return v; }); }
template <class T> T atomicCAS(T* p, T c, T v) { return ::lfemu::update(p, [c, v](T o) { return o == c ? v : o; }); }
inline unsigned atomicInc(unsigned* p, unsigned v) { return ::lfemu::update(p, [v](unsigned o) { return o >= v ? 0u : o + 1; }); }
// clang-format on
