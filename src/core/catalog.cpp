// The op catalog: what really exists. Each loss family adds one line to kFamilies when its kernels land.
#include "lossfuse/catalog.hpp"

#include <algorithm>
#include <array>
#include <iterator>

namespace lossfuse {
namespace {

struct Family {
  LossKind kind;
  bool fused;  // also a forward_backward entry
};

// CPU kernels, each in float32, float64, float16 and bfloat16, forward and backward.
constexpr Family kFamilies[] = {
    {LossKind::cross_entropy, true}, {LossKind::nll, false},       {LossKind::ctc, false},
    {LossKind::mse, false},          {LossKind::l1, false},        {LossKind::smooth_l1, false},
    {LossKind::huber, false},
    {LossKind::bce, false},          {LossKind::bce_with_logits, false}, {LossKind::kl_div, false},
    {LossKind::poisson_nll, false},  {LossKind::gaussian_nll, false},    {LossKind::hinge_embedding, false},
    {LossKind::margin_ranking, false},
    {LossKind::triplet_margin, false}, {LossKind::cosine_embedding, false}, {LossKind::multi_margin, false},
    {LossKind::multilabel_margin, false}, {LossKind::multilabel_soft_margin, false},
    {LossKind::fused_linear_cross_entropy, true},
};

constexpr std::size_t count_entries() {
  std::size_t n = 0;
  for (const Family& f : kFamilies) n += std::size(kFloatDTypes) * (f.fused ? 3 : 2);
  return n;
}

constexpr std::array<OpEntry, count_entries()> make_entries() {
  std::array<OpEntry, count_entries()> e{};
  std::size_t i = 0;
  for (const Family& f : kFamilies) {
    for (DType t : kFloatDTypes) {
      e[i++] = {f.kind, t, Device::cpu, Direction::forward};
      e[i++] = {f.kind, t, Device::cpu, Direction::backward};
      if (f.fused) e[i++] = {f.kind, t, Device::cpu, Direction::forward_backward};
    }
  }
  return e;
}

constexpr auto kEntries = make_entries();

}  // namespace

std::span<const OpEntry> implemented_ops() noexcept { return kEntries; }

bool is_implemented(LossKind kind, DType dtype, Device device, Direction direction) noexcept {
  return std::any_of(kEntries.begin(), kEntries.end(), [&](const OpEntry& e) {
    return e.kind == kind && e.dtype == dtype && e.device == device && e.direction == direction;
  });
}

}  // namespace lossfuse
