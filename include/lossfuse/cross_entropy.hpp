// lossfuse: cross-entropy over large vocabularies.
//
// logits: (C), (N, C) or (N, C, d1..dk); the class dim is 1 (0 when unbatched). Any strides.
// target: class indices of any integer dtype with the logits' shape minus the class dim, used as they are,
//         or probabilities ("soft targets") of the logits' dtype and shape.
//
// With z = softcap > 0 ? softcap * tanh(logit_scale * x / softcap) : logit_scale * x over the classes of a
// row, lse = log sum_c exp(z_c), w the class weights (1 when absent) and eps = label_smoothing:
//   index target y: loss = (1 - eps) w_y (lse - z_y) + (eps / C) sum_c w_c (lse - z_c) + z_loss_scale lse^2
//   soft target p:  loss = sum_c w_c p'_c (lse - z_c) + z_loss_scale lse^2, with p' = (1 - eps) p + eps / C
// Rows whose target is ignore_index contribute 0 and no gradient. Reduction 'mean' divides the sum by
// sum_rows w_y over non-ignored rows (index targets; PyTorch's rule, also for the smoothing term) or by the
// number of rows (soft targets). The z-loss term uses the same reduction and denominator and is also
// reported alone in `z_loss`. This is torch.nn.functional.cross_entropy when logit_scale = 1, softcap = 0
// and z_loss_scale = 0.
// Precision: the forward takes each row's lse as its max z plus log sum exp(z - max), so the loss (lse - z_y) and
// the gradient of forward_backward keep the precision of the differences of z, however large the logits' common
// offset, as torch's log_softmax. A gradient made from a saved lse (cross_entropy_backward) sees lse rounded to its
// dtype: each probability carries a relative error up to ulp(lse) / 2 (float32: 6e-8 |lse|, 6e-5 at |lse| ~ 1e3).
// Saved in float64 (accepted beside the accumulation dtype), lse is max + log-sum summed in double, which the
// backward splits into its rounding to the accumulation dtype and the remainder: 1.1e-16 |lse|, below float32's
// rounding for |lse| < 5e8.
#pragma once

#include <cstdint>
#include <optional>

#include "lossfuse/loss_kind.hpp"
#include "lossfuse/tensor.hpp"

namespace lossfuse {

struct CrossEntropyOptions {
  Reduction reduction = Reduction::mean;
  std::int64_t ignore_index = -100;  // any value; must stay -100 with soft targets
  double label_smoothing = 0.0;      // in [0, 1]
  std::optional<TensorView> weight;  // (C); any floating dtype, read in the accumulation dtype
  double logit_scale = 1.0;          // finite
  double softcap = 0.0;              // 0 disables soft-capping; else finite and > 0
  double z_loss_scale = 0.0;         // finite, >= 0
};

// Outputs are contiguous, float32 (float64 for float64 logits): losses are never stored in 16 bits.
struct CrossEntropyOutputs {
  TensorView loss;                    // reduction none: the row shape (target shape); else a scalar
  std::optional<TensorView> lse;      // row shape: the per-row log-sum-exp of z, saved for backward; float64 is
                                      // also accepted (see Precision above)
  std::optional<TensorView> z_loss;   // shape of `loss`: the z-loss term alone, reduced like the loss
};

// How the gradient is written. In place overwrites the logits with their gradient and must be asked for:
// any other overlap between grad_logits and logits is an error.
enum class GradWrite : std::uint8_t { separate, in_place };

// Forward: reads each logit once (online log-sum-exp over vocabulary chunks).
void cross_entropy_forward(const TensorView& logits, const TensorView& target, const CrossEntropyOptions& options,
                           const CrossEntropyOutputs& out);

// Backward from the saved log-sum-exp: one read of the logits, one write of grad_logits (dtype and shape of
// the logits). grad_loss has the shape of the forward loss (absent: 1).
void cross_entropy_backward(const TensorView& logits, const TensorView& target, const TensorView& lse,
                            const std::optional<TensorView>& grad_loss, const CrossEntropyOptions& options,
                            const TensorView& grad_logits, GradWrite write = GradWrite::separate);

// Forward and backward in one call: the gradient is written while the rows are hot in cache, scaled by
// grad_loss (absent: 1), so a training step needs no second pass over the logits.
void cross_entropy_forward_backward(const TensorView& logits, const TensorView& target,
                                    const CrossEntropyOptions& options, const CrossEntropyOutputs& out,
                                    const std::optional<TensorView>& grad_loss, const TensorView& grad_logits,
                                    GradWrite write = GradWrite::separate);

// A gradient held from forward_backward (made there for an upstream gradient of 1: grad_loss absent) brought to
// grad_loss (the forward loss's shape), in place: each row is multiplied by its upstream gradient, except the rows
// whose target is ignore_index, which keep theirs (0, NaN for a NaN row) whatever it is, as torch's. A row whose
// upstream gradient is exactly 1 is not written. The value is read where it lives (on a device, by the kernel), so
// the call never synchronises and can be captured in a CUDA graph. grad_logits: the gradient, in its own buffer or
// over the logits (GradWrite::in_place); of the options only reduction and ignore_index are used. The product is
// rounded once from the accumulation dtype, as a multiply of the gradient by the value would be.
void cross_entropy_scale_held(const TensorView& grad_logits, const TensorView& target,
                              const CrossEntropyOptions& options, const std::optional<TensorView>& grad_loss);

// A gradient held from forward_backward (made there for an upstream gradient of 1) made again from the saved lse for
// grad_loss, in place, unless grad_loss is exactly 1, where it stands as it is. The value is read where it lives (on a
// device by the kernel), so the call never synchronises and can be captured. Unlike scale_held, the result is rounded
// once from the accumulation dtype at any upstream value (cross_entropy_backward's bits), as torch's float32 loss of
// 16-bit logits under autocast is. Reduction mean or sum (one upstream value); grad_logits in its own buffer (the
// logits are read). The targets were checked by the forward that made the gradient: on a device they are not checked
// again (a target changed since makes its row NaN, as under stream capture); on the CPU a call that remakes it
// checks them.
void cross_entropy_backward_held(const TensorView& logits, const TensorView& target, const TensorView& lse,
                                 const TensorView& grad_loss, const CrossEntropyOptions& options,
                                 const TensorView& grad_logits);

}  // namespace lossfuse
