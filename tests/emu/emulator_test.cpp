// The emulator's own checks (docs/cuda.md#the-emulator), each on a small kernel written for it: what the CUDA suites
// rely on it to catch must be caught, and a correct kernel must pass. Kernels are plain C++ against the emulator's
// headers, launched as cu_to_cpp.py rewrites a `<<<...>>>` launch.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <vector>

namespace {

// The launch's error, as a caller sees it after the kernel.
template <class K, class... A>
cudaError_t launch(unsigned threads, K kernel, A... args) {
  (void)cudaGetLastError();
  ::lfemu::Launch(dim3(2), dim3(threads))([kernel](auto... p) { kernel(p...); }, args...);
  const cudaError_t e = cudaDeviceSynchronize();
  (void)cudaGetLastError();
  return e;
}

struct Device {
  explicit Device(std::size_t bytes) : bytes(bytes) { EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess); }
  ~Device() { (void)cudaFree(p); }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  template <class T>
  std::vector<T> read() const {
    std::vector<T> v(bytes / sizeof(T));
    EXPECT_EQ(cudaMemcpy(v.data(), p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
  void* p = nullptr;
  std::size_t bytes;
};

// Thread t stores t in shared memory; with the barrier, thread t then reads thread (t + 1)'s value.
void neighbour(int* out, bool barrier) {
  static int s[64];  // cu_to_cpp.py's rewrite of `__shared__ int s[64];`
  ::lfemu::static_shared(&s, sizeof(s));
  s[threadIdx.x] = static_cast<int>(threadIdx.x + 64 * blockIdx.x);
  if (barrier) __syncthreads();
  out[blockIdx.x * 64 + threadIdx.x] = s[(threadIdx.x + 1) % 64];
}

TEST(Emulator, CorrectKernelPasses) {
  Device out(2 * 64 * sizeof(int));
  ASSERT_EQ(launch(64, neighbour, static_cast<int*>(out.p), true), cudaSuccess);
  const std::vector<int> v = out.read<int>();
  for (int i = 0; i < 128; ++i) EXPECT_EQ(v[i], (i % 64 + 1) % 64 + i / 64 * 64) << i;
}

TEST(Emulator, MissingBarrierIsARace) {
  if (std::getenv("LFEMU_RACECHECK") == nullptr) GTEST_SKIP() << "the race check is off (ctest sets LFEMU_RACECHECK=1)";
  Device out(2 * 64 * sizeof(int));
  EXPECT_EQ(launch(64, neighbour, static_cast<int*>(out.p), false), cudaErrorLaunchFailure);
}

void split_barrier(int*) {
  if (threadIdx.x < 32) {
    __syncthreads();
  } else {
    __syncthreads();
  }
}

TEST(Emulator, BarriersAtDifferentLinesFail) {
  EXPECT_EQ(launch(64, split_barrier, static_cast<int*>(nullptr)), cudaErrorLaunchFailure);
}

void split_shuffle(int* out) {
  int v = static_cast<int>(threadIdx.x);
  if (threadIdx.x % 2 == 0) {
    v = __shfl_xor_sync(0xffffffffu, v, 1);
  } else {
    v = __shfl_xor_sync(0xffffffffu, v, 1);
  }
  out[blockIdx.x * 32 + threadIdx.x] = v;
}

TEST(Emulator, ShufflesAtDifferentLinesFail) {
  Device out(2 * 32 * sizeof(int));
  EXPECT_EQ(launch(32, split_shuffle, static_cast<int*>(out.p)), cudaErrorLaunchFailure);
}

// The lower half-warp shuffles among itself but lane l reads lane l ^ 16, outside the mask.
void outside_mask(int* out) {
  int v = static_cast<int>(threadIdx.x);
  if (threadIdx.x < 16) v = __shfl_xor_sync(0x0000ffffu, v, 16);
  out[blockIdx.x * 32 + threadIdx.x] = v;
}

TEST(Emulator, ShuffleSourceOutsideTheMaskFails) {
  Device out(2 * 32 * sizeof(int));
  EXPECT_EQ(launch(32, outside_mask, static_cast<int*>(out.p)), cudaErrorLaunchFailure);
}

void write_at(unsigned char* p, int i) {
  if (threadIdx.x == 0 && blockIdx.x == 0) p[i] = 1;
}

TEST(Emulator, WriteIntoTheSlackIsAnIllegalAddress) {
  Device buf(100);
  EXPECT_EQ(launch(32, write_at, static_cast<unsigned char*>(buf.p), 99), cudaSuccess);
  EXPECT_EQ(launch(32, write_at, static_cast<unsigned char*>(buf.p), 100), cudaErrorIllegalAddress);
}

TEST(Emulator, FreshMemoryIsNaN) {
  Device buf(4 * sizeof(float));
  for (const float f : buf.read<float>()) EXPECT_TRUE(std::isnan(f));
}

// The upper warp exits; the lower one then waits at a barrier.
void barrier_after_exit(int*) {
  if (threadIdx.x >= 32) return;
  __syncthreads();
}

TEST(Emulator, BarrierAfterExitFails) {
  EXPECT_EQ(launch(64, barrier_after_exit, static_cast<int*>(nullptr)), cudaErrorLaunchFailure);
}

// out[0] = 0 / in[0] (in: float): NaN where in[0] is NaN, 0 where it is finite.
void divide_by(const float* in, float* out) {
  if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = 0.0f / in[0];
}

// A result computed from device memory nothing wrote (fresh 0xff bytes, NaN as a float) is reported under the race
// check, even where NaN is what a test would expect (0 / NaN): the second run sees finite bytes there. The same
// kernel passes once the input is written.
TEST(Emulator, ResultFromUnwrittenMemoryFails) {
  if (std::getenv("LFEMU_RACECHECK") == nullptr) GTEST_SKIP() << "the race check is off (ctest sets LFEMU_RACECHECK=1)";
  Device in(sizeof(float)), out(sizeof(float));
  ASSERT_EQ(cudaMemset(out.p, 0, out.bytes), cudaSuccess);
  EXPECT_EQ(launch(32, divide_by, static_cast<const float*>(in.p), static_cast<float*>(out.p)), cudaErrorLaunchFailure);
  const float two = 2;
  ASSERT_EQ(cudaMemcpy(in.p, &two, sizeof two, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(launch(32, divide_by, static_cast<const float*>(in.p), static_cast<float*>(out.p)), cudaSuccess);
  EXPECT_EQ(out.read<float>()[0], 0.0f);
}

// A kernel's own writes count as written: the second launch reads what the first wrote.
void write_then_read(float* buf, float* out, bool read) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  if (read) {
    out[0] = buf[0] + 1;
  } else {
    buf[0] = 1;
  }
}

TEST(Emulator, KernelWritesAreWritten) {
  Device buf(2 * sizeof(float)), out(sizeof(float));
  ASSERT_EQ(launch(32, write_then_read, static_cast<float*>(buf.p), static_cast<float*>(out.p), false), cudaSuccess);
  ASSERT_EQ(launch(32, write_then_read, static_cast<float*>(buf.p), static_cast<float*>(out.p), true), cudaSuccess);
  EXPECT_EQ(out.read<float>()[0], 2.0f);
  EXPECT_TRUE(std::isnan(buf.read<float>()[1]));  // the byte nothing wrote is still fresh
}

// Dynamic shared memory read before any thread writes it: reported as a read of unwritten memory.
void shared_first(float* out) {
  float* const s = ::lfemu::dynamic_shared_as<float>();
  if (threadIdx.x == 0) out[blockIdx.x] = s[0] == s[0] ? 1.0f : 0.0f;  // (NaN under one fill, 0.75 under the other)
}

TEST(Emulator, UnwrittenSharedMemoryFails) {
  if (std::getenv("LFEMU_RACECHECK") == nullptr) GTEST_SKIP() << "the race check is off (ctest sets LFEMU_RACECHECK=1)";
  Device out(2 * sizeof(float));
  ASSERT_EQ(cudaMemset(out.p, 0, out.bytes), cudaSuccess);
  (void)cudaGetLastError();
  ::lfemu::Launch(dim3(2), dim3(32), sizeof(float))([](float* o) { shared_first(o); }, static_cast<float*>(out.p));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  (void)cudaGetLastError();
}

// A static shared array that only block 0 writes (or, with `all`, every block): block 1 reads what no thread of it
// wrote, which a device leaves undefined (the emulator's static storage would otherwise hold block 0's values).
void static_shared_per_block(float* out, bool all) {
  static float s[32];  // cu_to_cpp.py's rewrite of `__shared__ float s[32];`
  ::lfemu::static_shared(&s, sizeof(s));
  if (all || blockIdx.x == 0) s[threadIdx.x] = static_cast<float>(threadIdx.x);
  __syncthreads();
  out[blockIdx.x * 32 + threadIdx.x] = s[(threadIdx.x + 1) % 32];
}

TEST(Emulator, StaticSharedMemoryIsUnwrittenInEachBlock) {
  Device out(2 * 32 * sizeof(float));
  ASSERT_EQ(launch(32, static_shared_per_block, static_cast<float*>(out.p), true), cudaSuccess);
  std::vector<float> v = out.read<float>();
  for (int i = 0; i < 64; ++i) EXPECT_EQ(v[i], static_cast<float>((i % 32 + 1) % 32)) << i;
  const cudaError_t e = launch(32, static_shared_per_block, static_cast<float*>(out.p), false);
  if (std::getenv("LFEMU_RACECHECK") != nullptr) {
    EXPECT_EQ(e, cudaErrorLaunchFailure);  // block 1's values differ between the two fills
  } else {
    ASSERT_EQ(e, cudaSuccess);
    v = out.read<float>();
    for (int i = 32; i < 64; ++i) EXPECT_TRUE(std::isnan(v[i])) << i;  // 0xff bytes
  }
}

// 40 KiB of static shared memory beside the launch's dynamic bytes: within a launch's 48 KiB or past it.
void big_static(float* out) {
  static float s[10 * 1024];  // cu_to_cpp.py's rewrite of `__shared__ float s[10 * 1024];`
  ::lfemu::static_shared(&s, sizeof(s));
  s[threadIdx.x] = 1;
  __syncthreads();
  out[blockIdx.x * 32 + threadIdx.x] = s[(threadIdx.x + 1) % 32];
}

TEST(Emulator, StaticAndDynamicSharedMemoryShareOneLimit) {
  Device out(2 * 32 * sizeof(float));
  for (const std::size_t dynamic : {std::size_t{8} << 10, std::size_t{9} << 10}) {
    (void)cudaGetLastError();
    ::lfemu::Launch(dim3(2), dim3(32), dynamic)([](float* o) { big_static(o); }, static_cast<float*>(out.p));
    EXPECT_EQ(cudaDeviceSynchronize(), dynamic == (std::size_t{8} << 10) ? cudaSuccess : cudaErrorLaunchFailure)
        << dynamic;
    (void)cudaGetLastError();
  }
}

// Reads the first int of scratch memory, then leaves 5 there.
void read_then_set(int* scratch, int* out) {
  out[0] = scratch[0];
  scratch[0] = 5;
}

// Memory a capture allocates is undefined at each replay: both replays see fresh bytes (0xff...), not the first
// replay's 5.
TEST(Emulator, GraphMemoryIsFreshAtEachReplay) {
  Device out(sizeof(int));
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  void* scratch = nullptr;
  ASSERT_EQ(cudaMallocAsync(&scratch, sizeof(int), s), cudaSuccess);
  ::lfemu::Launch(dim3(1), dim3(1), 0, s)([](int* a, int* b) { read_then_set(a, b); }, static_cast<int*>(scratch),
                                          static_cast<int*>(out.p));
  ASSERT_EQ(cudaFreeAsync(scratch, s), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph), cudaSuccess);
  for (int replay = 0; replay < 2; ++replay) {
    ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_EQ(out.read<int>()[0], -1) << "replay " << replay;
  }
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

TEST(Emulator, CountsWhatIsAsked) {
  Device out(2 * 64 * sizeof(int));
  const lfemu::Counts before = lfemu::counts();
  ASSERT_EQ(cudaMemsetAsync(out.p, 0, out.bytes, nullptr), cudaSuccess);
  ASSERT_EQ(launch(64, neighbour, static_cast<int*>(out.p), true), cudaSuccess);
  (void)out.read<int>();
  const lfemu::Counts after = lfemu::counts();
  EXPECT_EQ(after.kernels - before.kernels, 1u);
  EXPECT_EQ(after.memsets - before.memsets, 1u);
  EXPECT_EQ(after.copies - before.copies, 1u);
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
