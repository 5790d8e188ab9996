// Device -> backend table.
#include "core/backend.hpp"

#include <string>

#include "lossfuse/dtype.hpp"

#include "lossfuse/error.hpp"

namespace lossfuse::core {

#if !defined(LOSSFUSE_WITH_CUDA)
// The CUDA slot: a build with LOSSFUSE_WITH_CUDA takes its table from src/cuda/ instead.
const Backend* cuda_backend() noexcept { return nullptr; }
#endif

namespace {

std::string kernel_devices() {
  return cuda_backend() != nullptr ? "a tensor on a device this build has kernels for (cpu, cuda)"
                                   : "a tensor on a device this build has kernels for (cpu)";
}

}  // namespace

const Backend& backend_for(const TensorView& view, std::string_view argument) {
  const Backend* b = nullptr;
  switch (view.device) {
    case Device::cpu: b = cpu_backend(); break;
    case Device::cuda: b = cuda_backend(); break;
  }
  if (b == nullptr) {
    throw Error(ErrorCode::not_implemented, std::string(argument),
                kernel_devices(),
                "a tensor on " + std::string(device_name(view.device)));
  }
  return *b;
}

HostCopy::HostCopy(const TensorView& view) : view_(view) {
  if (view.device == Device::cpu || view.numel() == 0) return;
  std::int64_t last = 0;
  for (int i = 0; i < view.ndim; ++i) last += (view.shape[i] - 1) * view.strides[i];
  const std::size_t bytes = static_cast<std::size_t>(last + 1) * dtype_size(view.dtype);
  bytes_.resize(bytes);
  backend_for(view, "view").to_host(bytes_.data(), view.data, bytes);
  view_.data = bytes_.data();
  view_.device = Device::cpu;
}

}  // namespace lossfuse::core
