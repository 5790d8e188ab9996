// lossfuse: elementwise losses (torch.nn.functional mse_loss, l1_loss, smooth_l1_loss, huber_loss,
// binary_cross_entropy, binary_cross_entropy_with_logits, kl_div, poisson_nll_loss, gaussian_nll_loss,
// hinge_embedding_loss, margin_ranking_loss).
//
// input and target have one shape (any, 0-d included) and the input's floating dtype. An operand PyTorch would
// broadcast is passed expanded to that shape (a view with stride 0); gradients are written in that full shape
// (summing them over broadcast dims is the caller's job, as autograd does). weight, where a loss takes one,
// has the same shape (expanded as needed) and the input's dtype.
// loss: float32 (float64 for float64 input), contiguous; the input's shape for 'none', else one element.
// grad_loss: the loss's shape and dtype (absent: 1). Gradients are optional outputs with the input's dtype and
// shape, disjoint from every other buffer and with no repeated elements.
// <loss>_forward_backward: the forward's loss and the backward's gradients for grad_loss absent (1; reduction none: 1
// per element) in one pass over the operands, after every check of both entries (nothing written unless all pass:
// bce's input and gaussian_nll's var are read once more before it, by their value check).
// Loss and gradients come from the same formulas as the two entries' and keep their error bounds (every spec table of
// tests/cpu/pointwise_harness.hpp checks all three entries), not always their bits: the compiler may fuse a formula's
// multiplies and adds differently in the one loop.
// A backward given grads with `held` set: the views already hold what <loss>_forward_backward wrote for these operands
// and options (the gradients for an upstream gradient of 1), and are written only where grad_loss is not exactly 1,
// a test made where grad_loss lives (on a device by the kernels, so nothing is read back): a training step's
// backward with no host synchronisation. It makes no value check (the fused call that made them did). Reductions mean
// and sum (with 'none' they are written as usual); a <loss>_forward_backward call refuses it (invalid_value).
// tests/cpu/pointwise_harness.hpp's run_all and pointwise_edges_test check it.
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
  std::optional<TensorView> target;  // rejected (invalid_value) where torch gives none: hinge_embedding
  std::optional<TensorView> var;     // gaussian_nll only (rejected by the others)
  bool held = false;                 // the views hold the gradients for an upstream gradient of 1 (above)
};

// -w [y max(log x, -100) + (1 - y) max(log(1 - x), -100)]; every input element in [0, 1], else Error
// invalid_value naming 'input' and the first bad position and value (NaN is bad too, as torch); the target's
// range is not checked. Weighted 'mean' is mean(w l), as torch. d/dtarget = -logit(x), unclamped (inf at 0, 1).
struct BceOptions {
  Reduction reduction = Reduction::mean;
  std::optional<TensorView> weight;
};
// -w [pw y log sigmoid(x) + (1 - y) log(1 - sigmoid(x))], computed stably. pos_weight: torch broadcasts its
// (C) along the last dim; here pass it expanded to the input's shape (strides (0, .., 0, 1)). Weighted 'mean'
// is mean(w l). Gradients for input and target (torch differentiates neither weight nor pos_weight).
struct BceWithLogitsOptions {
  Reduction reduction = Reduction::mean;
  std::optional<TensorView> weight;
  std::optional<TensorView> pos_weight;
};
// input: log-probabilities. y (log y - x) (y = 0 gives 0, y < 0 NaN); log_target: exp(y) (y - x).
// 'mean' divides by numel, as torch (which warns); batchmean (torch's reduction='batchmean') needs
// reduction == mean and divides the sum by input.size(0) instead (C for a 1-D input; 0-d: by 1).
struct KlDivOptions {
  Reduction reduction = Reduction::mean;
  bool batchmean = false;
  bool log_target = false;
};
// log_input: exp(x) - y x, else x - y log(x + eps); full adds y log y - y + 0.5 log(2 pi y) where y > 1.
// Gradients for input and target (torch's target gradient, NaN included: with full, y <= 0 gives NaN).
struct PoissonNllOptions {
  Reduction reduction = Reduction::mean;
  bool log_input = true;
  bool full = false;
  double eps = 1e-8;  // finite
};
// 0.5 (log max(var, eps) + (x - y)^2 / max(var, eps)) (+ 0.5 log(2 pi) when full). var is passed expanded to the
// input's shape: torch's three var shapes become views with stride 0 -- var of the input's shape minus the last
// dim: strides (.., 0); var with last dim 1: stride 0 in the last dim. Every var element >= 0, else Error
// invalid_value naming 'var' (NaN passes, as torch). The clamp is outside autograd, as torch: d/dvar is taken at
// max(var, eps) and passed straight through. Gradients for input, target and var (grads.var); for an expanded
// var, sum grads.var over the broadcast dims.
struct GaussianNllOptions {
  Reduction reduction = Reduction::mean;
  bool full = false;
  double eps = 1e-6;  // finite
};
// y == 1: x; y == -1: max(0, margin - x); any other y: both terms summed. Gradient for input only.
struct HingeEmbeddingOptions {
  Reduction reduction = Reduction::mean;
  double margin = 1.0;  // finite
};
// max(0, -y (x1 - x2) + margin). Operands: input1, input2, target of one shape (broadcast ones passed expanded,
// stride 0). Gradients for all three.
struct MarginRankingOptions {
  Reduction reduction = Reduction::mean;
  double margin = 0.0;  // finite
};
struct MarginRankingGrads {
  std::optional<TensorView> input1;
  std::optional<TensorView> input2;
  std::optional<TensorView> target;
  bool held = false;  // as PointwiseGrads::held
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

void bce_forward(const TensorView& input, const TensorView& target, const BceOptions& options, const TensorView& loss);
void bce_backward(const TensorView& input, const TensorView& target, const std::optional<TensorView>& grad_loss,
                  const BceOptions& options, const PointwiseGrads& grads);
void bce_with_logits_forward(const TensorView& input, const TensorView& target, const BceWithLogitsOptions& options,
                             const TensorView& loss);
void bce_with_logits_backward(const TensorView& input, const TensorView& target,
                              const std::optional<TensorView>& grad_loss, const BceWithLogitsOptions& options,
                              const PointwiseGrads& grads);
void kl_div_forward(const TensorView& input, const TensorView& target, const KlDivOptions& options,
                    const TensorView& loss);
void kl_div_backward(const TensorView& input, const TensorView& target, const std::optional<TensorView>& grad_loss,
                     const KlDivOptions& options, const PointwiseGrads& grads);
void poisson_nll_forward(const TensorView& input, const TensorView& target, const PoissonNllOptions& options,
                         const TensorView& loss);
void poisson_nll_backward(const TensorView& input, const TensorView& target, const std::optional<TensorView>& grad_loss,
                          const PoissonNllOptions& options, const PointwiseGrads& grads);
void gaussian_nll_forward(const TensorView& input, const TensorView& target, const TensorView& var,
                          const GaussianNllOptions& options, const TensorView& loss);
void gaussian_nll_backward(const TensorView& input, const TensorView& target, const TensorView& var,
                           const std::optional<TensorView>& grad_loss, const GaussianNllOptions& options,
                           const PointwiseGrads& grads);
void hinge_embedding_forward(const TensorView& input, const TensorView& target, const HingeEmbeddingOptions& options,
                             const TensorView& loss);
void hinge_embedding_backward(const TensorView& input, const TensorView& target,
                              const std::optional<TensorView>& grad_loss, const HingeEmbeddingOptions& options,
                              const PointwiseGrads& grads);
void margin_ranking_forward(const TensorView& input1, const TensorView& input2, const TensorView& target,
                            const MarginRankingOptions& options, const TensorView& loss);
void margin_ranking_backward(const TensorView& input1, const TensorView& input2, const TensorView& target,
                             const std::optional<TensorView>& grad_loss, const MarginRankingOptions& options,
                             const MarginRankingGrads& grads);

void mse_forward_backward(const TensorView& input, const TensorView& target, const MseOptions& options,
                          const TensorView& loss, const PointwiseGrads& grads);
void l1_forward_backward(const TensorView& input, const TensorView& target, const L1Options& options,
                         const TensorView& loss, const PointwiseGrads& grads);
void smooth_l1_forward_backward(const TensorView& input, const TensorView& target, const SmoothL1Options& options,
                                const TensorView& loss, const PointwiseGrads& grads);
void huber_forward_backward(const TensorView& input, const TensorView& target, const HuberOptions& options,
                            const TensorView& loss, const PointwiseGrads& grads);
void bce_forward_backward(const TensorView& input, const TensorView& target, const BceOptions& options,
                          const TensorView& loss, const PointwiseGrads& grads);
void bce_with_logits_forward_backward(const TensorView& input, const TensorView& target,
                                      const BceWithLogitsOptions& options, const TensorView& loss,
                                      const PointwiseGrads& grads);
void kl_div_forward_backward(const TensorView& input, const TensorView& target, const KlDivOptions& options,
                             const TensorView& loss, const PointwiseGrads& grads);
void poisson_nll_forward_backward(const TensorView& input, const TensorView& target, const PoissonNllOptions& options,
                                  const TensorView& loss, const PointwiseGrads& grads);
void gaussian_nll_forward_backward(const TensorView& input, const TensorView& target, const TensorView& var,
                                   const GaussianNllOptions& options, const TensorView& loss,
                                   const PointwiseGrads& grads);
void hinge_embedding_forward_backward(const TensorView& input, const TensorView& target,
                                      const HingeEmbeddingOptions& options, const TensorView& loss,
                                      const PointwiseGrads& grads);
void margin_ranking_forward_backward(const TensorView& input1, const TensorView& input2, const TensorView& target,
                                     const MarginRankingOptions& options, const TensorView& loss,
                                     const MarginRankingGrads& grads);

}  // namespace lossfuse
