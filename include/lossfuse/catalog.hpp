// lossfuse: which (kind, dtype, device, direction) are implemented. Callers and tests enumerate coverage
// from here instead of guessing.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "lossfuse/dtype.hpp"
#include "lossfuse/loss_kind.hpp"

namespace lossfuse {

enum class Direction : std::uint8_t {
  forward,           // loss (and saved state such as the log-sum-exp)
  backward,          // gradient from saved state and an upstream gradient
  forward_backward,  // loss and gradient in one pass over the inputs
};

constexpr std::string_view direction_name(Direction d) noexcept {
  return d == Direction::forward ? "forward" : d == Direction::backward ? "backward" : "forward_backward";
}

struct OpEntry {
  LossKind kind;
  DType dtype;  // dtype of the floating input (logits / log-probabilities / predictions)
  Device device;
  Direction direction;
};

// Every implemented entry, in a fixed order.
[[nodiscard]] std::span<const OpEntry> implemented_ops() noexcept;
[[nodiscard]] bool is_implemented(LossKind kind, DType dtype, Device device, Direction direction) noexcept;

// The catalog as text (`lossfuse catalog`, lossfuse.catalog() in Python, README's support table):
//   lines:    one entry per line, "cross_entropy float32 cpu forward"
//   csv:      the same with a header line "loss,dtype,device,direction"
//   markdown: one row per loss, one column per float dtype, cells such as "cpu: fwd, bwd, fused" (a device absent
//             from a loss's row has no entry for it; "-" when the dtype has none at all)
enum class CatalogFormat : std::uint8_t { lines, csv, markdown };
[[nodiscard]] std::string catalog_text(CatalogFormat format);

}  // namespace lossfuse
