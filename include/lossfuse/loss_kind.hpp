// lossfuse: the loss catalog and reductions.
#pragma once

#include <cstdint>
#include <string_view>

namespace lossfuse {

enum class LossKind : std::uint8_t {
  mse, nll, cross_entropy, bce, kl_div, l1, smooth_l1, hinge_embedding, margin_ranking, triplet_margin,
  ctc, poisson_nll, huber, bce_with_logits, gaussian_nll, cosine_embedding, multi_margin, multilabel_margin,
  multilabel_soft_margin, linear_cross_entropy,
};

inline constexpr int kNumLossKinds = 20;

constexpr std::string_view loss_kind_name(LossKind k) noexcept {
  constexpr std::string_view names[kNumLossKinds] = {
      "mse", "nll", "cross_entropy", "bce", "kl_div", "l1", "smooth_l1", "hinge_embedding", "margin_ranking",
      "triplet_margin", "ctc", "poisson_nll", "huber", "bce_with_logits", "gaussian_nll", "cosine_embedding",
      "multi_margin", "multilabel_margin", "multilabel_soft_margin", "linear_cross_entropy"};
  const auto i = static_cast<int>(k);
  return i < kNumLossKinds ? names[i] : std::string_view("?");
}

enum class Reduction : std::uint8_t { none, mean, sum };

constexpr std::string_view reduction_name(Reduction r) noexcept {
  return r == Reduction::none ? "none" : r == Reduction::mean ? "mean" : "sum";
}

}  // namespace lossfuse
