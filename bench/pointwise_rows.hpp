// lossfuse bench: the elementwise losses' rows (one per LossKind: operands, their domain, the three entries, the
// closed forms the checks use), shared by the CPU bench (bench/pointwise_bench.cpp) and the CUDA bench
// (bench/cuda/cuda_bench.cu). The entries take views on any device.
#pragma once

#include <cmath>
#include <optional>
#include <vector>

#include "lossfuse/loss_kind.hpp"
#include "lossfuse/pointwise.hpp"
#include "lossfuse/tensor.hpp"

namespace lossfuse::bench {

inline constexpr double kParam = 1.0;  // beta / delta

using Kind = LossKind;
using Ops = std::vector<TensorView>;  // operand j: input, target, third

inline PointwiseGrads input_grad(const TensorView& g) {
  PointwiseGrads r;
  r.input = g;
  return r;
}
inline constexpr std::nullopt_t kNoUp = std::nullopt;
inline double sigmoid(double t) { return 1.0 / (1.0 + std::exp(-t)); }
inline double sign(double v) { return v >= 0 ? 1.0 : -1.0; }  // +-1 labels
inline double sgn(double d) { return d > 0 ? 1.0 : d < 0 ? -1.0 : 0.0; }

// One row per elementwise loss (a LossKind): its operand count (3: gaussian_nll's var, margin_ranking's
// (input1, input2, target)); how operand j is drawn from an N(0, 1) sample v (nullptr: v itself); its forward
// (reduction mean, default options), backward (the first operand's gradient only) and both in one call; and, where
// the loss is a closed form in d = x - y, that form and its derivative in float64 for the check (nullptr: checked
// finite).
struct PwBench {
  Kind kind;
  int operands;
  double (*domain)(int j, double v);
  void (*forward)(const Ops& o, const TensorView& loss);
  void (*backward)(const Ops& o, const TensorView& grad);
  void (*fused)(const Ops& o, const TensorView& loss, const TensorView& grad);
  double (*value)(double d);
  double (*derivative)(double d);
};

inline const PwBench kRows[] = {
    {Kind::mse, 2, nullptr, [](const Ops& o, const TensorView& l) { mse_forward(o[0], o[1], MseOptions{}, l); },
     [](const Ops& o, const TensorView& g) { mse_backward(o[0], o[1], kNoUp, MseOptions{}, input_grad(g)); },
     [](const Ops& o, const TensorView& l, const TensorView& g) {
       mse_forward_backward(o[0], o[1], MseOptions{}, l, input_grad(g));
     },
     [](double d) { return d * d; }, [](double d) { return 2 * d; }},
    {Kind::l1, 2, nullptr, [](const Ops& o, const TensorView& l) { l1_forward(o[0], o[1], L1Options{}, l); },
     [](const Ops& o, const TensorView& g) { l1_backward(o[0], o[1], kNoUp, L1Options{}, input_grad(g)); },
     [](const Ops& o, const TensorView& l, const TensorView& g) {
       l1_forward_backward(o[0], o[1], L1Options{}, l, input_grad(g));
     },
     [](double d) { return std::fabs(d); }, [](double d) { return sgn(d); }},
    {Kind::smooth_l1, 2, nullptr,
     [](const Ops& o, const TensorView& l) {
       smooth_l1_forward(o[0], o[1], SmoothL1Options{Reduction::mean, kParam}, l);
     },
     [](const Ops& o, const TensorView& g) {
       smooth_l1_backward(o[0], o[1], kNoUp, SmoothL1Options{Reduction::mean, kParam}, input_grad(g));
     },
     [](const Ops& o, const TensorView& l, const TensorView& g) {
       smooth_l1_forward_backward(o[0], o[1], SmoothL1Options{Reduction::mean, kParam}, l, input_grad(g));
     },
     [](double d) { return std::fabs(d) < kParam ? 0.5 * d * d / kParam : std::fabs(d) - 0.5 * kParam; },
     [](double d) { return std::fabs(d) < kParam ? d / kParam : sgn(d); }},
    {Kind::huber, 2, nullptr,
     [](const Ops& o, const TensorView& l) {
       huber_forward(o[0], o[1], HuberOptions{Reduction::mean, kParam, std::nullopt}, l);
     },
     [](const Ops& o, const TensorView& g) {
       huber_backward(o[0], o[1], kNoUp, HuberOptions{Reduction::mean, kParam, std::nullopt}, input_grad(g));
     },
     [](const Ops& o, const TensorView& l, const TensorView& g) {
       huber_forward_backward(o[0], o[1], HuberOptions{Reduction::mean, kParam, std::nullopt}, l, input_grad(g));
     },
     [](double d) { return std::fabs(d) < kParam ? 0.5 * d * d : kParam * (std::fabs(d) - 0.5 * kParam); },
     [](double d) { return std::fabs(d) <= kParam ? d : kParam * sgn(d); }},
    {Kind::bce, 2, [](int, double v) { return sigmoid(v); },  // probabilities, target too
     [](const Ops& o, const TensorView& l) { bce_forward(o[0], o[1], BceOptions{}, l); },
     [](const Ops& o, const TensorView& g) { bce_backward(o[0], o[1], kNoUp, BceOptions{}, input_grad(g)); },
     [](const Ops& o, const TensorView& l, const TensorView& g) {
       bce_forward_backward(o[0], o[1], BceOptions{}, l, input_grad(g));
     },
     nullptr, nullptr},
    {Kind::bce_with_logits, 2, [](int j, double v) { return j == 0 ? v : sigmoid(v); },  // logits, soft targets
     [](const Ops& o, const TensorView& l) { bce_with_logits_forward(o[0], o[1], BceWithLogitsOptions{}, l); },
     [](const Ops& o, const TensorView& g) {
       bce_with_logits_backward(o[0], o[1], kNoUp, BceWithLogitsOptions{}, input_grad(g));
     },
     [](const Ops& o, const TensorView& l, const TensorView& g) {
       bce_with_logits_forward_backward(o[0], o[1], BceWithLogitsOptions{}, l, input_grad(g));
     },
     nullptr, nullptr},
    {Kind::kl_div, 2, [](int j, double v) { return j == 0 ? -std::fabs(v) - 0.1 : sigmoid(v); },  // log-p, p
     [](const Ops& o, const TensorView& l) { kl_div_forward(o[0], o[1], KlDivOptions{}, l); },
     [](const Ops& o, const TensorView& g) { kl_div_backward(o[0], o[1], kNoUp, KlDivOptions{}, input_grad(g)); },
     [](const Ops& o, const TensorView& l, const TensorView& g) {
       kl_div_forward_backward(o[0], o[1], KlDivOptions{}, l, input_grad(g));
     },
     nullptr, nullptr},
    {Kind::poisson_nll, 2, [](int j, double v) { return j == 0 ? v : std::floor(2 * std::fabs(v)); },  // counts
     [](const Ops& o, const TensorView& l) { poisson_nll_forward(o[0], o[1], PoissonNllOptions{}, l); },
     [](const Ops& o, const TensorView& g) {
       poisson_nll_backward(o[0], o[1], kNoUp, PoissonNllOptions{}, input_grad(g));
     },
     [](const Ops& o, const TensorView& l, const TensorView& g) {
       poisson_nll_forward_backward(o[0], o[1], PoissonNllOptions{}, l, input_grad(g));
     },
     nullptr, nullptr},
    {Kind::gaussian_nll, 3, [](int j, double v) { return j == 2 ? 0.5 + std::fabs(v) : v; },  // var > 0
     [](const Ops& o, const TensorView& l) { gaussian_nll_forward(o[0], o[1], o[2], GaussianNllOptions{}, l); },
     [](const Ops& o, const TensorView& g) {
       gaussian_nll_backward(o[0], o[1], o[2], kNoUp, GaussianNllOptions{}, input_grad(g));
     },
     [](const Ops& o, const TensorView& l, const TensorView& g) {
       gaussian_nll_forward_backward(o[0], o[1], o[2], GaussianNllOptions{}, l, input_grad(g));
     },
     nullptr, nullptr},
    {Kind::hinge_embedding, 2, [](int j, double v) { return j == 0 ? v : sign(v); },
     [](const Ops& o, const TensorView& l) { hinge_embedding_forward(o[0], o[1], HingeEmbeddingOptions{}, l); },
     [](const Ops& o, const TensorView& g) {
       hinge_embedding_backward(o[0], o[1], kNoUp, HingeEmbeddingOptions{}, input_grad(g));
     },
     [](const Ops& o, const TensorView& l, const TensorView& g) {
       hinge_embedding_forward_backward(o[0], o[1], HingeEmbeddingOptions{}, l, input_grad(g));
     },
     nullptr, nullptr},
    {Kind::margin_ranking, 3, [](int j, double v) { return j == 2 ? sign(v) : v; },
     [](const Ops& o, const TensorView& l) { margin_ranking_forward(o[0], o[1], o[2], MarginRankingOptions{}, l); },
     [](const Ops& o, const TensorView& g) {
       MarginRankingGrads mg;
       mg.input1 = g;
       margin_ranking_backward(o[0], o[1], o[2], kNoUp, MarginRankingOptions{}, mg);
     },
     [](const Ops& o, const TensorView& l, const TensorView& g) {
       MarginRankingGrads mg;
       mg.input1 = g;
       margin_ranking_forward_backward(o[0], o[1], o[2], MarginRankingOptions{}, l, mg);
     },
     nullptr, nullptr},
};

}  // namespace lossfuse::bench
