// The op catalog: what really exists. Each loss family adds one line to kFamilies when its kernels land.
#include "lossfuse/catalog.hpp"

#include <algorithm>
#include <array>
#include <iterator>
#include <string>

namespace lossfuse {
namespace {

#if defined(LOSSFUSE_WITH_CUDA)
constexpr bool kCuda = true;
#else
constexpr bool kCuda = false;
#endif

struct Family {
  LossKind kind;
  bool fused;  // also a forward_backward entry
  bool cuda;   // also CUDA kernels (src/cuda/), in a build with the CUDA backend
};

// Kernels on the CPU (and CUDA where marked), each in float32, float64, float16 and bfloat16, forward and backward.
constexpr Family kFamilies[] = {
    {LossKind::cross_entropy, true, true},
    {LossKind::nll, false, true},
    {LossKind::ctc, false, true},
    {LossKind::mse, true, true},
    {LossKind::l1, true, true},
    {LossKind::smooth_l1, true, true},
    {LossKind::huber, true, true},
    {LossKind::bce, true, true},
    {LossKind::bce_with_logits, true, true},
    {LossKind::kl_div, true, true},
    {LossKind::poisson_nll, true, true},
    {LossKind::gaussian_nll, true, true},
    {LossKind::hinge_embedding, true, true},
    {LossKind::margin_ranking, true, true},
    {LossKind::triplet_margin, false, true},
    {LossKind::cosine_embedding, false, true},
    {LossKind::multi_margin, false, true},
    {LossKind::multilabel_margin, false, true},
    {LossKind::multilabel_soft_margin, false, true},
    {LossKind::linear_cross_entropy, true, true},
};

constexpr std::size_t count_entries() {
  std::size_t n = 0;
  for (const Family& f : kFamilies) n += std::size(kFloatDTypes) * (f.fused ? 3 : 2);
  for (const Family& f : kFamilies) n += kCuda && f.cuda ? std::size(kFloatDTypes) * (f.fused ? 3 : 2) : 0;
  return n;
}

constexpr std::array<OpEntry, count_entries()> make_entries() {
  std::array<OpEntry, count_entries()> e{};
  std::size_t i = 0;
  auto add = [&](const Family& f, Device dev) {
    for (DType t : kFloatDTypes) {
      e[i++] = {f.kind, t, dev, Direction::forward};
      e[i++] = {f.kind, t, dev, Direction::backward};
      if (f.fused) e[i++] = {f.kind, t, dev, Direction::forward_backward};
    }
  };
  for (const Family& f : kFamilies) add(f, Device::cpu);
  for (const Family& f : kFamilies)
    if (kCuda && f.cuda) add(f, Device::cuda);
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

std::string catalog_text(CatalogFormat format) {
  std::string out;
  if (format != CatalogFormat::markdown) {
    if (format == CatalogFormat::csv) out += "loss,dtype,device,direction\n";
    const char sep = format == CatalogFormat::csv ? ',' : ' ';
    for (const OpEntry& e : kEntries) {
      for (std::string_view part : {loss_kind_name(e.kind), dtype_name(e.dtype), device_name(e.device)}) {
        out.append(part);
        out += sep;
      }
      out.append(direction_name(e.direction));
      out += '\n';
    }
    return out;
  }
  constexpr std::string_view kShort[] = {"fwd", "bwd", "fused"};
  out += "loss";
  for (DType t : kFloatDTypes) out.append(" | ").append(dtype_name(t));
  out += "\n---";
  for (std::size_t i = 0; i < std::size(kFloatDTypes); ++i) out += " | ---";
  out += '\n';
  for (const Family& f : kFamilies) {
    out.append(loss_kind_name(f.kind));
    for (DType t : kFloatDTypes) {
      std::string cell;
      for (Device dev : {Device::cpu, Device::cuda}) {
        std::string dirs;
        for (Direction d : {Direction::forward, Direction::backward, Direction::forward_backward}) {
          if (!is_implemented(f.kind, t, dev, d)) continue;
          if (!dirs.empty()) dirs += ", ";
          dirs.append(kShort[static_cast<int>(d)]);
        }
        if (dirs.empty()) continue;
        if (!cell.empty()) cell += "; ";
        cell.append(device_name(dev)).append(": ").append(dirs);
      }
      out.append(" | ").append(cell.empty() ? "-" : cell);
    }
    out += '\n';
  }
  return out;
}

}  // namespace lossfuse
