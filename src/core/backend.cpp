// Device -> backend table.
#include "core/backend.hpp"

#include <string>

#include "lossfuse/error.hpp"

namespace lossfuse::core {

#if !defined(LOSSFUSE_WITH_CUDA)
// The CUDA slot: a build with LOSSFUSE_WITH_CUDA takes its table from src/cuda/ instead.
const Backend* cuda_backend() noexcept { return nullptr; }
#endif

const Backend& backend_for(const TensorView& view, std::string_view argument) {
  const Backend* b = nullptr;
  switch (view.device) {
    case Device::cpu: b = cpu_backend(); break;
    case Device::cuda: b = cuda_backend(); break;
  }
  if (b == nullptr) {
    throw Error(ErrorCode::not_implemented, std::string(argument),
                "a tensor on a device this build has kernels for (cpu)",
                "a tensor on " + std::string(device_name(view.device)));
  }
  return *b;
}

}  // namespace lossfuse::core
