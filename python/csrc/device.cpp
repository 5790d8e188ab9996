// The torch binding's CUDA route (device.hpp). With LOSSFUSE_TORCH_CUDA: loading the library installs torch's caching
// allocator as lossfuse's CUDA scratch allocator, and each call sets torch's device guard and current stream.
#include "device.hpp"

#include <torch/library.h>

#include <optional>

#include "lossfuse/device.hpp"

#if defined(LOSSFUSE_TORCH_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace lossfuse::torch_binding {

#if defined(LOSSFUSE_TORCH_CUDA)
namespace {

// torch's caching allocator behind lossfuse's scratch: freed blocks are reused by torch and lossfuse alike, in the
// stream order of the stream they were allocated on. Out of memory: nullptr, which lossfuse reports as device_error.
void* torch_allocate(std::size_t bytes, CudaStream stream, void*) {
  try {
    return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, static_cast<cudaStream_t>(stream));
  } catch (const c10::Error&) {
    return nullptr;
  }
}
// Called from a destructor: an error (a pointer torch does not know) must not escape; the block is then lost.
void torch_release(void* ptr, CudaStream, void*) noexcept {
  try {
    c10::cuda::CUDACachingAllocator::raw_delete(ptr);
  } catch (const c10::Error&) {
  }
}

const bool g_allocator_installed = [] {
  set_cuda_allocator({torch_allocate, torch_release, nullptr});
  return true;
}();

}  // namespace

struct DeviceCall::State {
  c10::cuda::CUDAGuard guard;
  CudaStreamScope stream;
  explicit State(const at::Tensor& t)
      : guard(t.device()), stream(c10::cuda::getCurrentCUDAStream(t.device().index()).stream()) {}
};

bool has_cuda() noexcept { return true; }
bool capturing(const at::Tensor& t) {
  return t.is_cuda() && c10::cuda::captureStatusMayInitCtx(c10::cuda::getCurrentCUDAStream(t.device().index())) !=
                            c10::cuda::CaptureStatus::None;
}
DeviceCall::DeviceCall(const at::Tensor& t) {
  if (t.is_cuda()) state_ = std::make_unique<State>(t);
}
#else
struct DeviceCall::State {};
bool has_cuda() noexcept { return false; }
bool capturing(const at::Tensor&) { return false; }
DeviceCall::DeviceCall(const at::Tensor&) {}
#endif
DeviceCall::~DeviceCall() = default;

}  // namespace lossfuse::torch_binding
