// lossfuse: elementwise losses (torch.nn.functional mse_loss, l1_loss, smooth_l1_loss, huber_loss).
//
// input and target have one shape (any, 0-d included) and the input's floating dtype. An operand PyTorch would
// broadcast is passed expanded to that shape (a view with stride 0); gradients are written in that full shape
// (summing them over broadcast dims is the caller's job, as autograd does). weight, where a loss takes one,
// has the same shape (expanded as needed) and the input's dtype.
// loss: float32 (float64 for float64 input), contiguous; the input's shape for 'none', else one element.
// grad_loss: the loss's shape and dtype (absent: 1). Gradients are optional outputs with the input's dtype and
// shape, disjoint from every other buffer and with no repeated elements.
#pragma once

#include <optional>

#include "lossfuse/loss_kind.hpp"
#include "lossfuse/tensor.hpp"

namespace lossfuse {

// (x - y)^2. Weighted 'mean' is sum(w l) / sum(w), as torch.
struct MseOptions {
  Reduction reduction = Reduction::mean;
  std::optional<TensorView> weight;
};
// |x - y|, gradient sign(x - y) (0 at x == y). Weighted 'mean' is sum(w l) / sum(w).
struct L1Options {
  Reduction reduction = Reduction::mean;
  std::optional<TensorView> weight;
};
// 0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta; beta >= 0 (0 is L1).
struct SmoothL1Options {
  Reduction reduction = Reduction::mean;
  double beta = 1.0;
};
// 0.5 d^2 where |d| < delta, else delta (|d| - 0.5 delta); delta > 0. Weighted 'mean' is mean(w l), as torch.
struct HuberOptions {
  Reduction reduction = Reduction::mean;
  double delta = 1.0;
  std::optional<TensorView> weight;
};

struct PointwiseGrads {
  std::optional<TensorView> input;
  std::optional<TensorView> target;
};

void mse_forward(const TensorView& input, const TensorView& target, const MseOptions& options, const TensorView& loss);
void mse_backward(const TensorView& input, const TensorView& target, const std::optional<TensorView>& grad_loss,
                  const MseOptions& options, const PointwiseGrads& grads);
void l1_forward(const TensorView& input, const TensorView& target, const L1Options& options, const TensorView& loss);
void l1_backward(const TensorView& input, const TensorView& target, const std::optional<TensorView>& grad_loss,
                 const L1Options& options, const PointwiseGrads& grads);
void smooth_l1_forward(const TensorView& input, const TensorView& target, const SmoothL1Options& options,
                       const TensorView& loss);
void smooth_l1_backward(const TensorView& input, const TensorView& target, const std::optional<TensorView>& grad_loss,
                        const SmoothL1Options& options, const PointwiseGrads& grads);
void huber_forward(const TensorView& input, const TensorView& target, const HuberOptions& options,
                   const TensorView& loss);
void huber_backward(const TensorView& input, const TensorView& target, const std::optional<TensorView>& grad_loss,
                    const HuberOptions& options, const PointwiseGrads& grads);

}  // namespace lossfuse
