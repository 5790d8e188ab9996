// lossfuse: connectionist temporal classification, torch.nn.functional.ctc_loss.
//
// log_probs: (T, N, C) log-probabilities, or (T, C) unbatched; float32, float64, float16 or bfloat16, any
//   strides. Computed in float64 for float64 input, else in float32 (16-bit inputs are widened exactly).
// targets: any integer dtype, read as stored. Padded (N, S): sample b's labels are targets[b, 0:tl_b]
//   (entries past tl_b are ignored). Concatenated (sum tl_b): sample b's labels follow sample b-1's.
//   Unbatched: (S) or (1, S), padded. Every used label is in [0, C) and differs from blank.
// input_lengths, target_lengths: (N) (unbatched: one element, 0-d or (1)), any integer dtype and strides;
//   0 <= il_b <= T, 0 <= tl_b (<= S when padded; the sum equals the length of concatenated targets).
//
// loss_b = -log p(l_b | x_b), p summed over every alignment of the first il_b frames that collapses to l_b
// (repeats merged, then blanks removed). An impossible alignment gives inf; with zero_infinity, 0 (gradient
// 0). mean = mean_b(loss_b / max(tl_b, 1)) (nan for N = 0); sum = sum_b loss_b; both summed in sample order in
// double, the same for any thread count.
#pragma once

#include <cstdint>
#include <optional>

#include "lossfuse/loss_kind.hpp"
#include "lossfuse/tensor.hpp"

namespace lossfuse {

struct CtcOptions {
  std::int64_t blank = 0;  // in [0, C)
  Reduction reduction = Reduction::mean;
  bool zero_infinity = false;
};

// Outputs of the forward. Acc is float64 for float64 log_probs, else float32; all contiguous.
struct CtcOutputs {
  TensorView loss;  // reduction none: (N) (0-d unbatched); else one element; Acc
  // Per-sample -log p(l_b | x_b) before zero_infinity (inf when impossible): (N) (0-d unbatched); Acc.
  std::optional<TensorView> neg_log_likelihood;
  // The forward variables log alpha_t(s) over the extended label sequence l' = (blank, l1, blank, ...,
  // l_tl, blank): (T, N, L) ((T, L) unbatched), L = 2 * S_max + 1 with S_max = S for padded targets and
  // max_b tl_b for concatenated ones (0 when N = 0); Acc. Entry (t, b, s) is log alpha_t(s) for t < il_b and
  // s <= 2 tl_b, -inf elsewhere. Pass it to ctc_backward with the same inputs to skip recomputing alpha.
  std::optional<TensorView> log_alpha;
};

void ctc_forward(const TensorView& log_probs, const TensorView& targets, const TensorView& input_lengths,
                 const TensorView& target_lengths, const CtcOptions& options, const CtcOutputs& outputs);

// grad_log_probs: dtype and shape of log_probs, any strides, disjoint from every input. grad_loss: Acc, the
// forward loss's shape (absent: 1). log_alpha: the workspace a ctc_forward with the same inputs wrote (its
// contents are trusted, not checked); absent: recomputed.
//
// The gradient is PyTorch's (ctc_loss_backward), which treats log_probs as the output of a log_softmax:
//   grad[t, b, c] = g_b * (exp(lp[t, b, c]) - sum_{s: l'_s = c} exp(log alpha_t(s) + log beta_t(s)
//                                                                  + loss_b - lp[t, b, c]))
// for t < il_b, and 0 for t >= il_b; g_b is the upstream gradient of loss_b (g / (N max(tl_b, 1)) for mean).
// An impossible sample gives nan over t < il_b (as torch) unless zero_infinity, which gives 0; so does a
// log-probability of -inf at t < il_b for its element (exp(-inf + inf), as torch).
// Errors (lossfuse::Error, nothing written): shapes, dtypes and N that disagree, blank outside [0, C), an
// input length outside [0, T], a target length < 0 or > S (padded) or lengths not summing to the concatenated
// targets' length, a used label outside [0, C) or equal to blank (its position and value are reported),
// outputs that overlap an input or each other.
void ctc_backward(const TensorView& log_probs, const TensorView& targets, const TensorView& input_lengths,
                  const TensorView& target_lengths, const std::optional<TensorView>& grad_loss,
                  const CtcOptions& options, const TensorView& grad_log_probs,
                  const std::optional<TensorView>& log_alpha = std::nullopt);

}  // namespace lossfuse
