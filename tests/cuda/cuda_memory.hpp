// lossfuse's CUDA tests: device memory for tests/device_mirror.hpp's Mirror, a CUDA-graph capture of a call (and of a
// call that must be refused), an eager call under CudaCheck::nan, and the main that skips (exit 77, which ctest
// reports as skipped, never passed) on a machine without a CUDA device.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>

#include "device_mirror.hpp"
#include "lossfuse/device.hpp"
#include "lossfuse/error.hpp"

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

// A test failure naming `what` unless e is cudaSuccess.
inline bool graph_ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  ADD_FAILURE() << what << ": " << cudaGetErrorString(e);
  return false;
}

// Runs `call` captured into a CUDA graph on a stream of its own (torch's capture mode: global, so any host
// synchronisation in the call fails the capture), then replays the graph twice. Stops at the first failure; the
// capture always ends.
template <class F>
void run_captured(F&& call) {
  cudaStream_t stream = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  if (!graph_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags")) return;
  bool ok = false;
  {
    const lossfuse::CudaStreamScope scope(stream);
    if (graph_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture")) {
      try {
        call();
      } catch (const std::exception& e) {
        ADD_FAILURE() << "under capture: " << e.what();
      }
      ok = graph_ok(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
    }
  }
  ok = ok && graph_ok(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  for (int i = 0; ok && i < 2; ++i) ok = graph_ok(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
  if (ok) (void)graph_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  if (exec != nullptr) (void)cudaGraphExecDestroy(exec);
  if (graph != nullptr) (void)cudaGraphDestroy(graph);
  (void)cudaStreamDestroy(stream);
}

// Runs `call` eagerly under CudaCheck::nan (lossfuse::set_cuda_check): a test failure unless it reads nothing back
// (lossfuse::cuda_host_syncs unchanged); a bad value then makes its outputs NaN, as under capture.
template <class F>
void run_unchecked(F&& call) {
  const std::uint64_t before = lossfuse::cuda_host_syncs();
  {
    const lossfuse::CudaCheckScope scope(lossfuse::CudaCheck::nan);
    try {
      call();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "under CudaCheck::nan: " << e.what();
    }
  }
  EXPECT_EQ(lossfuse::cuda_host_syncs(), before) << "a call under CudaCheck::nan synchronised with the host";
}

// How a test runs a call: eagerly, captured into a CUDA graph and replayed twice (run_captured), or eagerly under
// CudaCheck::nan (run_unchecked). The last two read nothing back, and a bad value makes its outputs NaN.
enum class RunAs { eager, captured, unchecked };
inline const char* run_name(RunAs how) {
  return how == RunAs::eager ? "eager" : how == RunAs::captured ? "captured" : "unchecked";
}
template <class F>
void run_as(RunAs how, F&& call) {
  if (how == RunAs::captured) {
    run_captured(call);
  } else if (how == RunAs::unchecked) {
    run_unchecked(call);
  } else {
    call();
  }
}

// Runs `call` under a CUDA-graph capture (global mode) on a stream of its own and returns the lossfuse::Error it
// threw (nullopt: none). A test failure unless the capture is still valid when it ends: a refusal must leave the
// caller's capture as it was.
template <class F>
std::optional<lossfuse::Error> error_under_capture(F&& call) {
  cudaStream_t stream = nullptr;
  if (!graph_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags")) {
    return std::nullopt;
  }
  std::optional<lossfuse::Error> error;
  {
    const lossfuse::CudaStreamScope scope(stream);
    if (graph_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture")) {
      try {
        call();
      } catch (const lossfuse::Error& e) {
        error = e;
      }
      cudaGraph_t graph = nullptr;
      (void)graph_ok(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture (after the call)");
      if (graph != nullptr) (void)cudaGraphDestroy(graph);
    }
  }
  (void)cudaStreamDestroy(stream);
  return error;
}

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
