// lossfuse: fused linear + cross-entropy that never holds the N x V logits.
//
//   logits = x @ W^T + b,  loss = cross_entropy(logits, target)  (every option of cross_entropy.hpp)
//
// x: (N, H); W: (V, H); b: (V) or absent; all one float dtype (float32, float64, bfloat16, float16), any strides
// with unit stride along H (x, W) and V (b). target: (N) class indices of any integer dtype. The logits are made
// one chunk of rows at a time by the GEMM hook (gemm.hpp) in float32 (float64 for float64 inputs) and reduced
// there by the cross-entropy kernels; products for dx and dW use the 16-bit gradient of the logits, rounded once,
// for 16-bit inputs, with float32 accumulation.
//
// Two ways to get the gradients:
//  1. forward with grads (chunked over tokens): dx, dW, db computed during the forward pass for an upstream
//     gradient of 1 (reduction mean/sum; scale them by the real upstream gradient, they are linear in it);
//     the memory of one chunk of logits.
//  2. forward without grads, then linear_cross_entropy_backward from the saved per-row log-sum-exp, which
//     recomputes each chunk's logits: any upstream gradient (reduction 'none' included, per row), any number of
//     times (retain_graph, activation checkpointing).
// The chunk has max(1, min(N, chunk_rows or memory_budget / (V * 4 bytes))) rows.
#pragma once

#include <cstdint>
#include <optional>

#include "lossfuse/cross_entropy.hpp"
#include "lossfuse/tensor.hpp"

namespace lossfuse {

struct LinearCrossEntropyOptions {
  CrossEntropyOptions ce;                          // index targets only (no soft targets)
  std::int64_t chunk_rows = 0;                     // 0: from memory_budget
  std::int64_t memory_budget = std::int64_t{64} << 20;  // bytes for one chunk of float32 logits (and its gradient)
};

struct LinearCrossEntropyGrads {
  std::optional<TensorView> x;  // (N, H), x's dtype
  std::optional<TensorView> w;  // (V, H), W's dtype or float32 (then written without a second rounding)
  std::optional<TensorView> b;  // (V), b's dtype or float32
};

// outputs: loss (the row shape (N) for 'none', else one element), optional lse (N) and z_loss, as
// cross_entropy_forward. grads: optional; when any is given they are computed in the same pass (way 1) for an
// upstream gradient of 1 (reduction 'none': 1 per row).
void linear_cross_entropy_forward(const TensorView& x, const TensorView& w, const std::optional<TensorView>& b,
                                  const TensorView& target, const LinearCrossEntropyOptions& options,
                                  const CrossEntropyOutputs& outputs, const LinearCrossEntropyGrads& grads = {});

// Way 2. lse: (N), as the forward wrote it. grad_loss: the loss's shape (absent: 1). Gradients are overwritten.
void linear_cross_entropy_backward(const TensorView& x, const TensorView& w, const std::optional<TensorView>& b,
                                   const TensorView& target, const TensorView& lse,
                                   const std::optional<TensorView>& grad_loss, const LinearCrossEntropyOptions& options,
                                   const LinearCrossEntropyGrads& grads);

}  // namespace lossfuse
