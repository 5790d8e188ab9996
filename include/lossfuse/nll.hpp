// lossfuse: negative log-likelihood, torch.nn.functional.nll_loss.
//
// input: log-probabilities (C), (N, C) or (N, C, d1..dk), class dim 1 (0 when unbatched); any float dtype.
// target: class indices of any integer dtype, the input's shape minus the class dim.
// loss = -w_y x_y; ignored rows give 0; 'mean' divides by sum w_y over non-ignored rows (nan when none).
#pragma once

#include <cstdint>
#include <optional>

#include "lossfuse/loss_kind.hpp"
#include "lossfuse/tensor.hpp"

namespace lossfuse {

struct NllOptions {
  Reduction reduction = Reduction::mean;
  std::int64_t ignore_index = -100;
  std::optional<TensorView> weight;  // (C); any floating dtype, read in the accumulation dtype
};

// loss: row shape for 'none', else a scalar; float32 (float64 for float64 input), contiguous.
void nll_forward(const TensorView& input, const TensorView& target, const NllOptions& options,
                 const TensorView& loss);

// grad_input: dtype and shape of input. grad_loss: shape of the forward loss (absent: 1).
void nll_backward(const TensorView& input, const TensorView& target, const std::optional<TensorView>& grad_loss,
                  const NllOptions& options, const TensorView& grad_input);

}  // namespace lossfuse
