// The op catalog: what really exists. Each kernel family adds its entries here when it lands.
#include "lossfuse/catalog.hpp"

#include <algorithm>
#include <array>
#include <iterator>

namespace lossfuse {
namespace {

constexpr std::size_t kCeEntries = std::size(kFloatDTypes) * 3;
constexpr std::size_t kNllEntries = std::size(kFloatDTypes) * 2;

constexpr std::array<OpEntry, kCeEntries + kNllEntries> make_entries() {
  std::array<OpEntry, kCeEntries + kNllEntries> e{};
  std::size_t i = 0;
  for (DType t : kFloatDTypes) {
    for (Direction d : {Direction::forward, Direction::backward, Direction::forward_backward}) {
      e[i++] = {LossKind::cross_entropy, t, Device::cpu, d};
    }
  }
  for (DType t : kFloatDTypes) {
    for (Direction d : {Direction::forward, Direction::backward}) e[i++] = {LossKind::nll, t, Device::cpu, d};
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
