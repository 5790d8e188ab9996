// lossfuse: fused linear + cross-entropy that never holds the N x V logits.
//
//   logits = x @ W^T + b,  loss = cross_entropy(logits, target)  (every option of cross_entropy.hpp)
//
// x: (N, H); W: (V, H); b: (V) or absent; all one float dtype (float32, float64, bfloat16, float16), any strides
// with unit stride along H (x, W) and V (b). target: (N) class indices of any integer dtype. The logits are made
// one chunk of rows at a time by the GEMM hook (gemm.hpp) in float32 (float64 for float64 inputs) and reduced
// there by the cross-entropy kernels; products for dx and dW use the 16-bit gradient of the logits, rounded once,
// for 16-bit inputs, with float32 accumulation (the built-in GEMM's; the torch binding's hook rounds each 16-bit
// product to 16 bits, as torch's matmul does, before adding it in float32).
//
// Two ways to get the gradients:
//  1. forward with grads (chunked over tokens): dx, dW, db computed during the forward pass for an upstream
//     gradient of 1 (reduction mean/sum; scale them by the real upstream gradient, they are linear in it);
//     the memory of one chunk of logits.
//  2. forward without grads, then linear_cross_entropy_backward from the saved per-row log-sum-exp, which
//     recomputes each chunk's logits: any upstream gradient (reduction 'none' included, per row), any number of
//     times (retain_graph, activation checkpointing).
// The chunk has linear_cross_entropy_chunk_rows(N, Vt, acc bytes, options) rows (below), Vt the vocabulary tile
// width (V when untiled).
// Precision as cross_entropy.hpp: the loss keeps the precision of the logits' differences for any common offset,
// and so do the gradients made from an lse (way 2, and the tiled way 1) up to 1.1e-16 |lse| per probability: each
// row's lse is kept in double inside a call, and a way-2 backward given lse in float64 (accepted beside the
// accumulation dtype) splits it back; given it rounded to float32, each probability carries up to ulp(lse) / 2.
//
// On CUDA (operands in device memory) the products run on cuBLAS (loaded at first use: libcublas.so.13), never
// through the GEMM hook, and vocabulary tiles are not served yet (vocab_tile > 0 is refused: not_implemented).
//
// Vocabulary tiles (vocab_tile > 0): the smallest memory, a chunk of rows x Vt classes of logits (a cache-sized
// tile) and no row held whole. The forward makes each tile's logits by one GEMM and folds them into every row's
// online log-sum-exp (src/math/vocab_tile_math.hpp); the backward recomputes each tile from the saved lse, turns
// it into its gradient and adds its products into dx, dW[tile] and db[tile]. Results equal the untiled ones up to
// rounding, for every option. Way 1 with tiles runs two sweeps over the tiles of each chunk: the forward, then the
// backward from the lse it just made (the GEMMs of way 2's forward and backward together). When dW needs a float32
// accumulator (a 16-bit or strided grads.w), the tiled backward runs tile-major instead (way 1: the forward of
// every chunk first): each tile's rows of dW are accumulated over all chunks in a Vt x H buffer and stored, rounded
// once, before the next tile, so no V x H accumulator exists; dx is then accumulated across tiles in an N x H
// float32 buffer when it is 16-bit or strided (no buffer for a contiguous float32 dx).
//
// Gradient filter (grad_filter = tau > 0, tiled only, off by default): in the backward (and way 1's second sweep),
// a (row r, tile T) pair whose largest softmax probability max_{c in T} q_rc is below tau keeps only the -w_c b_c
// part of its gradient d loss / d z_rc = g_r (q_rc A_r - w_c b_c) (the target and smoothing terms; see
// cross_entropy_math.hpp: A_r = (1 - eps) w_y + (eps / V) sum_c w_c + 2 z_loss_scale lse_r, g_r the row's upstream
// gradient, 1 / denominator of 'mean' included) and drops g_r q_rc A_r. A tile dropped by every row of a chunk,
// with no target in it and no label smoothing, skips its GEMMs. The forward (loss, lse) is exact. Error bound, with
// s = |logit_scale| (|dz/dx| <= s, softcap included), a_r = |g_r A_r| and D_r the number of classes in row r's
// dropped tiles, for the error E_rc of d loss / d logit_rc:
//   each entry:  |E_rc| <= s a_r tau                          (q_rc < tau)
//   per row:     sum_c |E_rc| <= s a_r min(1, D_r tau)       (the dropped q_rc also sum to <= 1)
// and through the products (x_rh = x[r, h], W_ch = W[c, h]):
//   |delta dx_rh| <= s a_r min(1, D_r tau) max_c |W_ch|
//   |delta dW_ch| <= s tau sum_r a_r |x_rh|
//   |delta db_c|  <= s tau sum_r a_r,      sum_c |delta db_c| <= s sum_r a_r min(1, D_r tau)
// plus rounding. The dropped terms of a row all have the sign of g_r A_r (q >= 0), so they do not cancel: the
// bounds are approached when every dropped q_rc is just below tau. tau = 0 gives exactly the unfiltered result.
#pragma once

#include <cstdint>
#include <optional>

#include "lossfuse/cross_entropy.hpp"
#include "lossfuse/tensor.hpp"

namespace lossfuse {

struct LinearCrossEntropyOptions {
  CrossEntropyOptions ce;          // index targets only (no soft targets)
  std::int64_t chunk_rows = 0;     // 0: from memory_budget
  std::int64_t memory_budget = 0;  // bytes for one chunk of float32 logits (and its gradient); 0: auto (below)
  std::int64_t vocab_tile = 0;     // 0: whole vocabulary rows; > 0: tile width in classes
  double grad_filter = 0.0;        // 0: off; in (0, 1]: threshold (tiled only; see above)
};

struct LinearCrossEntropyGrads {
  std::optional<TensorView> x;  // (N, H), x's dtype
  std::optional<TensorView> w;  // (V, H), W's dtype or float32 (then written without a second rounding)
  std::optional<TensorView> b;  // (V), b's dtype or float32
};

// Rows per chunk: chunk_rows when > 0; else memory_budget / (Vt * acc_bytes) when memory_budget > 0 (a strict
// budget); else (auto) the larger of kLinearCeBaseBudget / (Vt * acc_bytes) and min(256, ceil(N / 16)). Each chunk
// adds its products into the whole V x H weight gradient (a read-modify-write of V x H) with an inner dimension of
// its row count, so at large V a 32 MiB chunk (65 rows at V = 128256) spends more on that traffic and on thin GEMMs
// than on the work: auto gives a chunk at least 256 rows while that stays within 1/16 of the N x Vt logits (at most
// 16 chunks). On cuda, auto is kLinearCeCudaBudget / (Vt * acc_bytes) (2093 rows at V = 128256): each chunk's
// read-modify-write of a float32 dW (8 V H bytes) takes an H100 as long as about 400 rows of the chunk's GEMMs
// (6 V H flops a row), so thin chunks would spend a large share on it. Always clamped to [1, N] (1 when N = 0).
// acc_bytes: 4, 8 for float64 inputs.
inline constexpr std::int64_t kLinearCeBaseBudget = std::int64_t{32} << 20;
inline constexpr std::int64_t kLinearCeCudaBudget = std::int64_t{1} << 30;
std::int64_t linear_cross_entropy_chunk_rows(std::int64_t N, std::int64_t Vt, std::int64_t acc_bytes,
                                             const LinearCrossEntropyOptions& options, Device device = Device::cpu);

// outputs: loss (the row shape (N) for 'none', else one element), optional lse (N) and z_loss, as
// cross_entropy_forward. grads: optional; when any is given they are computed in the same pass (way 1) for an
// upstream gradient of 1 (reduction 'none': 1 per row).
void linear_cross_entropy_forward(const TensorView& x, const TensorView& w, const std::optional<TensorView>& b,
                                  const TensorView& target, const LinearCrossEntropyOptions& options,
                                  const CrossEntropyOutputs& outputs, const LinearCrossEntropyGrads& grads = {});

// Way 2. lse: (N), as the forward wrote it (float64, or the accumulation dtype). grad_loss: the loss's shape
// (absent: 1). Gradients are overwritten.
void linear_cross_entropy_backward(const TensorView& x, const TensorView& w, const std::optional<TensorView>& b,
                                   const TensorView& target, const TensorView& lse,
                                   const std::optional<TensorView>& grad_loss, const LinearCrossEntropyOptions& options,
                                   const LinearCrossEntropyGrads& grads);

// Way 1's gradients (made by the forward for an upstream gradient of 1; reduction mean or sum) brought in place to
// the upstream gradient grad_loss: one element of the accumulation dtype, read where it lives (on a device by the
// kernels: nothing is read back). Each element times grad_loss in the accumulation dtype, rounded once. Kept as they
// are, as torch's gradients there do not depend on the upstream value (NaN and inf included): grad_x's rows whose
// target is ignore_index, and grad_weight and grad_bias when every row's is. Nothing is written when grad_loss is 1.
// target and options.ce (reduction, ignore_index) as the forward's.
void linear_cross_entropy_scale_held(const LinearCrossEntropyGrads& grads, const TensorView& target,
                                     const LinearCrossEntropyOptions& options, const TensorView& grad_loss);

}  // namespace lossfuse
