// lossfuse: the margin and embedding losses of torch.nn.functional, computed row by row over the last dim.
//
//   triplet_margin_loss, cosine_embedding_loss, multi_margin_loss, multilabel_margin_loss,
//   multilabel_soft_margin_loss
//
// Common to all:
// - Floating inputs are float32, float64, float16 or bfloat16; the math runs in float32 (float64 for float64
//   inputs) on the exactly widened 16-bit values.
// - loss: float32 (float64 for float64 inputs), contiguous; the row shape (the input's shape without its last
//   dim, as listed per loss) for reduction 'none', else one element. 'mean' divides the sum by the number of
//   rows: an empty batch gives nan under 'mean' and 0 under 'sum'.
// - grad_loss: optional, the forward loss's shape (any strides) and dtype; absent means 1.
// - Gradient outputs are optional (absent: not computed), with the differentiated input's dtype and shape,
//   any strides, disjoint from every input and from each other. Nothing is written unless every check passes.
// - Broadcasting: where torch broadcasts its inputs (triplet's anchor/positive/negative, cosine's x1/x2,
//   multilabel_soft_margin's target), these functions take them already expanded to the common shape
//   (stride-0 views are fine) and write gradients of that full shape. Summing a gradient over the broadcast
//   dims is the caller's (the binding's) job.
// - Bad class targets raise ErrorCode::index_error naming the position and value; torch's wording is
//   "target out of range". Any integer target dtype is accepted (torch wants int64).
#pragma once

#include <cstdint>
#include <optional>

#include "lossfuse/loss_kind.hpp"
#include "lossfuse/tensor.hpp"

namespace lossfuse {

// ---- triplet_margin_loss ------------------------------------------------------------------------------------
// anchor, positive, negative: the same shape (..., D), ndim >= 1 (1-D is one unbatched row); loss rows: the
// shape without the last dim. d(a, b) = ||a - b + eps||_p over the last dim (eps is added to the difference),
// loss = max(0, margin + d(a, p) - d(a, n)); with swap, d(a, n) is replaced by min(d(a, n), d(p, n)) (a tie
// sends half the gradient to each, as torch's minimum does). The gradient passes only where the loss is > 0.
// p: any p >= 0 or +inf (p = 0 counts the nonzero entries and has zero gradient); a norm of 0 has gradient 0.
// torch also accepts p < 0; here it raises invalid_value.
struct TripletMarginOptions {
  double margin = 1.0;
  double p = 2.0;
  double eps = 1e-6;
  bool swap = false;
  Reduction reduction = Reduction::mean;
};

void triplet_margin_forward(const TensorView& anchor, const TensorView& positive, const TensorView& negative,
                            const TripletMarginOptions& options, const TensorView& loss);
void triplet_margin_backward(const TensorView& anchor, const TensorView& positive, const TensorView& negative,
                             const std::optional<TensorView>& grad_loss, const TripletMarginOptions& options,
                             const std::optional<TensorView>& grad_anchor,
                             const std::optional<TensorView>& grad_positive,
                             const std::optional<TensorView>& grad_negative);

// ---- cosine_embedding_loss ----------------------------------------------------------------------------------
// x1, x2: (N, D) with target (N), or (D) with a 0-d target (loss rows: (N) or ()). target: the inputs' float
// dtype or any integer dtype. cos = sum x1 x2 / sqrt((sum x1^2 + e) (sum x2^2 + e)) exactly as torch forms it,
// e = 1e-12 rounded to float (ATen's EPSILON is a float constant, also for float64 inputs); loss = 1 - cos for
// y == 1, max(0, cos - margin) for y == -1, 0 for any other y (NaN included). A zero vector has cos = 0 (loss 1
// for y = 1). float16 inputs are computed in float32, where e does not vanish (torch adds it in float16, where
// it does, and gives nan for a zero vector).
struct CosineEmbeddingOptions {
  double margin = 0.0;
  Reduction reduction = Reduction::mean;
};

void cosine_embedding_forward(const TensorView& x1, const TensorView& x2, const TensorView& target,
                              const CosineEmbeddingOptions& options, const TensorView& loss);
void cosine_embedding_backward(const TensorView& x1, const TensorView& x2, const TensorView& target,
                               const std::optional<TensorView>& grad_loss, const CosineEmbeddingOptions& options,
                               const std::optional<TensorView>& grad_x1, const std::optional<TensorView>& grad_x2);

// ---- multi_margin_loss --------------------------------------------------------------------------------------
// input (N, C) with target (N), or (C) with target () or (1) (loss rows: the target's shape). Per row,
// loss = sum_{j != y} w_y max(0, margin - x_y + x_j)^p / C, p in {1, 2}; 'mean' divides by N (not by the
// weights). Terms with margin - x_y + x_j <= 0 have zero gradient. weight: (C), any float dtype.
struct MultiMarginOptions {
  int p = 1;
  double margin = 1.0;
  std::optional<TensorView> weight;
  Reduction reduction = Reduction::mean;
};

void multi_margin_forward(const TensorView& input, const TensorView& target, const MultiMarginOptions& options,
                          const TensorView& loss);
void multi_margin_backward(const TensorView& input, const TensorView& target,
                           const std::optional<TensorView>& grad_loss, const MultiMarginOptions& options,
                           const std::optional<TensorView>& grad_input);

// ---- multilabel_margin_loss ---------------------------------------------------------------------------------
// input (N, C) or (C); target: the input's shape, any integer dtype (loss rows: (N) or ()). A row's labels are
// its target entries up to the first -1 (duplicates count twice, as in torch); every target value, also past
// the -1, must be in [-1, C). loss = sum_{j in labels} sum_{i not a label} max(0, 1 - x_j + x_i) / C.
struct MultilabelMarginOptions {
  Reduction reduction = Reduction::mean;
};

void multilabel_margin_forward(const TensorView& input, const TensorView& target,
                               const MultilabelMarginOptions& options, const TensorView& loss);
void multilabel_margin_backward(const TensorView& input, const TensorView& target,
                                const std::optional<TensorView>& grad_loss, const MultilabelMarginOptions& options,
                                const std::optional<TensorView>& grad_input);

// ---- multilabel_soft_margin_loss ----------------------------------------------------------------------------
// input (..., C), ndim >= 1; target: the input's shape and dtype (loss rows: the shape without the last dim).
// loss = -(1/C) sum_c w_c [y log sigmoid(x) + (1 - y) log sigmoid(-x)]; d/dx = w_c (sigmoid(x) - y) / C, and,
// as torch differentiates the target too, d/dy = -w_c x / C. weight: (C), any float dtype.
struct MultilabelSoftMarginOptions {
  std::optional<TensorView> weight;
  Reduction reduction = Reduction::mean;
};

void multilabel_soft_margin_forward(const TensorView& input, const TensorView& target,
                                    const MultilabelSoftMarginOptions& options, const TensorView& loss);
void multilabel_soft_margin_backward(const TensorView& input, const TensorView& target,
                                     const std::optional<TensorView>& grad_loss,
                                     const MultilabelSoftMarginOptions& options,
                                     const std::optional<TensorView>& grad_input,
                                     const std::optional<TensorView>& grad_target);

}  // namespace lossfuse
