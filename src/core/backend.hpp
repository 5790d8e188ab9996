// The backend boundary: one table of kernel entry points per device, keyed by loss family, each taking the checked
// params struct core filled. Core checks the arguments, fills the params and calls the entry of the device the
// operands live on; no file in src/core includes a backend's header. A backend provides its table from one function
// (src/<device>/backend.cpp); a device with no table in this build reports ErrorCode::not_implemented.
// The entries never throw, but for linear_cross_entropy, whose GEMM hook may decline a product (not_implemented), and
// device backends' entries, on a failed runtime call (device_error).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "core/cross_entropy_params.hpp"
#include "core/ctc_params.hpp"
#include "core/linear_cross_entropy_params.hpp"
#include "core/margin_problem.hpp"
#include "core/pointwise_params.hpp"
#include "lossfuse/dtype.hpp"
#include "lossfuse/tensor.hpp"

namespace lossfuse::core {

// Whole-array value checks of the elementwise losses' operands: every one of n contiguous elements of a float dtype
// lies in [0, 1] (unit_interval), or is not negative (non_negative; NaN passes both).
enum class ValueScan { unit_interval, non_negative };

struct Backend {
  Device device;
  // Synchronous byte copies between this device's memory and the host. Core's host-side steps (class weights, the
  // target scan, an upstream gradient scalar, the reduced outputs) reach device operands through these (HostCopy,
  // read_scalar, write_reduced); the CPU's are memcpy.
  void (*to_host)(void* host, const void* src, std::size_t bytes);
  void (*from_host)(void* dst, const void* host, std::size_t bytes);
  // Whether the calling thread's stream is capturing a graph (CUDA); a call that would need host values then is
  // refused before it starts. The CPU's: never.
  bool (*capturing)();
  void (*cross_entropy)(const CeParams&);  // forward, backward or both over all rows
  void (*nll)(const CeParams&);
  void (*pointwise)(const PwParams&);                                                 // the elementwise losses
  bool (*value_scan)(DType dtype, const void* data, std::int64_t n, ValueScan scan);  // true: every element passes
  void (*ctc)(const CtcParams&);
  void (*triplet_margin)(const MarginParams&);
  void (*cosine_embedding)(const MarginParams&);
  void (*multi_margin)(const MarginParams&);
  void (*multilabel_margin)(const MarginParams&);
  void (*multilabel_soft_margin)(const MarginParams&);
  void (*linear_cross_entropy)(const LceParams&);  // the fused linear loss's runner
};

// The table of the device `view` lives on; throws Error(not_implemented) naming `argument` when this build has
// none for it.
const Backend& backend_for(const TensorView& view, std::string_view argument);

// A view's elements readable on the host: the view itself on the CPU; on another device a host copy of the bytes it
// spans (strides >= 0, as check_view requires), with the copy's view (device cpu, same shape and strides).
class HostCopy {
 public:
  explicit HostCopy(const TensorView& view);
  [[nodiscard]] const TensorView& view() const noexcept { return view_; }

 private:
  std::vector<unsigned char> bytes_;
  TensorView view_;
};

// Counts one synchronising host copy of a device backend (lossfuse::cuda_host_syncs; src/core/device.cpp).
void count_host_sync() noexcept;

// Each backend's table: nullptr when it is not built in. cpu: src/cpu/backend.cpp; cuda: src/cuda/backend.cu (in a
// build with LOSSFUSE_WITH_CUDA; else the nullptr slot in src/core/backend.cpp).
const Backend* cpu_backend() noexcept;
const Backend* cuda_backend() noexcept;

}  // namespace lossfuse::core
