// The CPU backend's table: every loss family's entry (src/cpu/kernels.hpp, margin_kernels.hpp).
#include "core/backend.hpp"

#include <cstring>

#include "cpu/kernels.hpp"
#include "cpu/margin_kernels.hpp"

namespace lossfuse::core {
namespace {

void copy_bytes(void* dst, const void* src, std::size_t bytes) { std::memcpy(dst, src, bytes); }
bool never() { return false; }

}  // namespace

const Backend* cpu_backend() noexcept {
  static constexpr Backend kCpu{
      Device::cpu,
      copy_bytes,
      copy_bytes,
      never,
      cpu::cross_entropy_rows,
      cpu::nll_rows,
      cpu::pointwise_run,
      cpu::value_scan_passes,
      cpu::ctc_samples,
      cpu::triplet_margin_rows,
      cpu::cosine_embedding_rows,
      cpu::multi_margin_rows,
      cpu::multilabel_margin_rows,
      cpu::multilabel_soft_margin_rows,
      cpu::linear_cross_entropy_run,
  };
  return &kCpu;
}

}  // namespace lossfuse::core
