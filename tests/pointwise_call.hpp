// The eleven elementwise losses' public entry points (include/lossfuse/pointwise.hpp) called by the reference's
// (loss, options): the one dispatch the C++ tests and the fuzz target share. No test framework in it.
#pragma once

#include <optional>
#include <type_traits>

#include "lossfuse/pointwise.hpp"
#include "reference/pointwise_reference.hpp"

namespace lftest {

// One call's arguments. z: pos_weight (bce_with_logits, passed where opts.pos_weight), var (gaussian_nll) or the
// ranking target (margin_ranking); required by the last two. weight: passed to the losses that take one.
struct PwArgs {
  lfref::PwLoss loss = lfref::PwLoss::mse;
  lfref::PwOpts opts;
  lossfuse::Reduction red = lossfuse::Reduction::mean;
  lossfuse::TensorView x, y;
  std::optional<lossfuse::TensorView> z, weight;
};

// Calls `entry(options)` with the loss's options struct built from `a`.
template <class Entry>
void pw_with_options(const PwArgs& a, Entry&& entry) {
  namespace lf = lossfuse;
  using lfref::PwLoss;
  const auto& o = a.opts;
  const std::optional<lf::TensorView> w = lfref::pw_takes_weight(a.loss) ? a.weight : std::nullopt;
  switch (a.loss) {
    case PwLoss::mse: return entry(lf::MseOptions{a.red, w});
    case PwLoss::l1: return entry(lf::L1Options{a.red, w});
    case PwLoss::smooth_l1: return entry(lf::SmoothL1Options{a.red, o.param});
    case PwLoss::huber: return entry(lf::HuberOptions{a.red, o.param, w});
    case PwLoss::bce: return entry(lf::BceOptions{a.red, w});
    case PwLoss::bce_with_logits: return entry(lf::BceWithLogitsOptions{a.red, w, o.pos_weight ? a.z : std::nullopt});
    case PwLoss::kl_div: return entry(lf::KlDivOptions{a.red, o.batchmean, o.log_target});
    case PwLoss::poisson_nll: return entry(lf::PoissonNllOptions{a.red, o.log_input, o.full, o.eps});
    case PwLoss::gaussian_nll: return entry(lf::GaussianNllOptions{a.red, o.full, o.eps});
    case PwLoss::hinge_embedding: return entry(lf::HingeEmbeddingOptions{a.red, o.margin});
    case PwLoss::margin_ranking: return entry(lf::MarginRankingOptions{a.red, o.margin});
  }
}

inline void pw_forward(const PwArgs& a, const lossfuse::TensorView& loss) {
  namespace lf = lossfuse;
  const lf::TensorView &x = a.x, &y = a.y;
  pw_with_options(a, [&](const auto& opt) {
    using O = std::decay_t<decltype(opt)>;
    if constexpr (std::is_same_v<O, lf::MseOptions>) lf::mse_forward(x, y, opt, loss);
    if constexpr (std::is_same_v<O, lf::L1Options>) lf::l1_forward(x, y, opt, loss);
    if constexpr (std::is_same_v<O, lf::SmoothL1Options>) lf::smooth_l1_forward(x, y, opt, loss);
    if constexpr (std::is_same_v<O, lf::HuberOptions>) lf::huber_forward(x, y, opt, loss);
    if constexpr (std::is_same_v<O, lf::BceOptions>) lf::bce_forward(x, y, opt, loss);
    if constexpr (std::is_same_v<O, lf::BceWithLogitsOptions>) lf::bce_with_logits_forward(x, y, opt, loss);
    if constexpr (std::is_same_v<O, lf::KlDivOptions>) lf::kl_div_forward(x, y, opt, loss);
    if constexpr (std::is_same_v<O, lf::PoissonNllOptions>) lf::poisson_nll_forward(x, y, opt, loss);
    if constexpr (std::is_same_v<O, lf::GaussianNllOptions>) lf::gaussian_nll_forward(x, y, a.z.value(), opt, loss);
    if constexpr (std::is_same_v<O, lf::HingeEmbeddingOptions>) lf::hinge_embedding_forward(x, y, opt, loss);
    if constexpr (std::is_same_v<O, lf::MarginRankingOptions>) lf::margin_ranking_forward(x, y, a.z.value(), opt, loss);
  });
}

// g.var is the third operand's gradient (margin_ranking's target gradient).
inline void pw_backward(const PwArgs& a, const std::optional<lossfuse::TensorView>& up,
                        const lossfuse::PointwiseGrads& g) {
  namespace lf = lossfuse;
  const lf::TensorView &x = a.x, &y = a.y;
  pw_with_options(a, [&](const auto& opt) {
    using O = std::decay_t<decltype(opt)>;
    if constexpr (std::is_same_v<O, lf::MseOptions>) lf::mse_backward(x, y, up, opt, g);
    if constexpr (std::is_same_v<O, lf::L1Options>) lf::l1_backward(x, y, up, opt, g);
    if constexpr (std::is_same_v<O, lf::SmoothL1Options>) lf::smooth_l1_backward(x, y, up, opt, g);
    if constexpr (std::is_same_v<O, lf::HuberOptions>) lf::huber_backward(x, y, up, opt, g);
    if constexpr (std::is_same_v<O, lf::BceOptions>) lf::bce_backward(x, y, up, opt, g);
    if constexpr (std::is_same_v<O, lf::BceWithLogitsOptions>) lf::bce_with_logits_backward(x, y, up, opt, g);
    if constexpr (std::is_same_v<O, lf::KlDivOptions>) lf::kl_div_backward(x, y, up, opt, g);
    if constexpr (std::is_same_v<O, lf::PoissonNllOptions>) lf::poisson_nll_backward(x, y, up, opt, g);
    if constexpr (std::is_same_v<O, lf::GaussianNllOptions>) lf::gaussian_nll_backward(x, y, a.z.value(), up, opt, g);
    if constexpr (std::is_same_v<O, lf::HingeEmbeddingOptions>) lf::hinge_embedding_backward(x, y, up, opt, g);
    if constexpr (std::is_same_v<O, lf::MarginRankingOptions>) {
      lf::margin_ranking_backward(x, y, a.z.value(), up, opt, lf::MarginRankingGrads{g.input, g.target, g.var, g.held});
    }
  });
}

// Forward and backward in one pass (<loss>_forward_backward): the loss, and the gradients for an upstream of 1.
inline void pw_forward_backward(const PwArgs& a, const lossfuse::TensorView& loss, const lossfuse::PointwiseGrads& g) {
  namespace lf = lossfuse;
  const lf::TensorView &x = a.x, &y = a.y;
  pw_with_options(a, [&](const auto& opt) {
    using O = std::decay_t<decltype(opt)>;
    if constexpr (std::is_same_v<O, lf::MseOptions>) lf::mse_forward_backward(x, y, opt, loss, g);
    if constexpr (std::is_same_v<O, lf::L1Options>) lf::l1_forward_backward(x, y, opt, loss, g);
    if constexpr (std::is_same_v<O, lf::SmoothL1Options>) lf::smooth_l1_forward_backward(x, y, opt, loss, g);
    if constexpr (std::is_same_v<O, lf::HuberOptions>) lf::huber_forward_backward(x, y, opt, loss, g);
    if constexpr (std::is_same_v<O, lf::BceOptions>) lf::bce_forward_backward(x, y, opt, loss, g);
    if constexpr (std::is_same_v<O, lf::BceWithLogitsOptions>) lf::bce_with_logits_forward_backward(x, y, opt, loss, g);
    if constexpr (std::is_same_v<O, lf::KlDivOptions>) lf::kl_div_forward_backward(x, y, opt, loss, g);
    if constexpr (std::is_same_v<O, lf::PoissonNllOptions>) lf::poisson_nll_forward_backward(x, y, opt, loss, g);
    if constexpr (std::is_same_v<O, lf::GaussianNllOptions>) {
      lf::gaussian_nll_forward_backward(x, y, a.z.value(), opt, loss, g);
    }
    if constexpr (std::is_same_v<O, lf::HingeEmbeddingOptions>)
      lf::hinge_embedding_forward_backward(x, y, opt, loss, g);
    if constexpr (std::is_same_v<O, lf::MarginRankingOptions>) {
      lf::margin_ranking_forward_backward(x, y, a.z.value(), opt, loss,
                                          lf::MarginRankingGrads{g.input, g.target, g.var, g.held});
    }
  });
}

}  // namespace lftest
