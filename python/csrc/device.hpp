// The torch binding's CUDA route: which device a call runs on and how. A build with LOSSFUSE_TORCH_CUDA (torch with
// CUDA and lossfuse's CUDA backend) runs the ops of the losses with CUDA kernels on CUDA tensors, on torch's current
// stream with scratch from torch's caching allocator; without it every op is CPU-only.
#pragma once

#include <ATen/ATen.h>

#include <memory>

namespace lossfuse::torch_binding {

// Whether this build serves CUDA tensors (for the families with CUDA kernels).
bool has_cuda() noexcept;

// Whether t is a CUDA tensor whose device's current torch stream is being captured into a CUDA graph: then nothing
// may read a value back (false without the CUDA route).
bool capturing(const at::Tensor& t);

// For the scope of one lossfuse call on `t`'s device: on CUDA, that device is current and lossfuse's stream is
// torch's current stream there; on the CPU, nothing.
class DeviceCall {
 public:
  explicit DeviceCall(const at::Tensor& t);
  DeviceCall(const DeviceCall&) = delete;
  DeviceCall& operator=(const DeviceCall&) = delete;
  ~DeviceCall();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace lossfuse::torch_binding
