// The plain parameter struct of the fused linear cross-entropy (include/lossfuse/linear_cross_entropy.hpp) that
// core fills after checking every argument and scanning the targets once, and a backend's runner takes: the views as
// the caller gave them, the options, the per-row upstream gradients and the row outputs. The runner makes the
// logits a chunk (and vocabulary tile) at a time (the CPU's through the GEMM hook, CUDA's on cuBLAS) and reduces them
// by the cross-entropy kernels' params; it writes only the row outputs and the gradients, and throws only
// Error(not_implemented) when the GEMM hook declines a product or the device runner an option (before writing), and
// a device runner Error(device_error) on a failed runtime call.
#pragma once

#include <cstdint>
#include <optional>

#include "core/class_problem.hpp"
#include "core/cross_entropy_params.hpp"
#include "lossfuse/linear_cross_entropy.hpp"

namespace lossfuse::core {

struct LceProblem {
  std::int64_t N = 0, H = 0, V = 0;
  std::int64_t Vt = 1;  // classes per vocabulary tile: V when untiled, else min(vocab_tile, V) (1 when V = 0)
  bool tiled = false;
  DType dt = DType::f32;  // x, W (and b)
  ClassProblem pb;        // rows N, classes V, acc: for the output checks shared with cross-entropy
};

struct LceParams {
  LceProblem problem;
  const TensorView* x = nullptr;  // (N, H)
  const TensorView* w = nullptr;  // (V, H)
  const TensorView* b = nullptr;  // (V) or nullptr
  const TensorView* target = nullptr;
  const LinearCrossEntropyOptions* options = nullptr;
  const LinearCrossEntropyGrads* grads = nullptr;  // the wanted gradients (none: forward only)
  const void* class_weight = nullptr;  // Acc[V rounded up to 64], zero padded (core::load_weights), or nullptr
  std::int64_t chunk_rows = 1;         // linear_cross_entropy_chunk_rows
  bool backward = false;               // way 2: gradients from lse_rows (read); else lse_rows is written
  void* loss_rows = nullptr;           // Acc (N), forward only
  void* z_rows = nullptr;              // Acc (N), forward only
  double* lse_rows = nullptr;          // (N): each row's lse, max + log-sum summed in double
  const void* scale = nullptr;         // Acc (N): the upstream gradient of each row's loss term (grads only)
  // loss_rows, z_rows, lse_rows and scale are host arrays; every view lives on x's device.

  // A device runner's whole call, set by core off the CPU: the runner reads the class weights, scans the targets
  // (CeDeviceCall: weights, reduction, upstream scalar, reduced outputs, the first bad target out) and writes every
  // output below on its device; class_weight, loss_rows, z_rows, lse_rows and scale are unused (nullptr) then.
  CeDeviceCall* device_call = nullptr;
  const CrossEntropyOutputs* out = nullptr;  // forward: loss ('none': its rows), lse, z_loss, as the caller gave them
  const TensorView* lse_in = nullptr;        // backward: the saved lse, Acc or float64, (N) at any stride
  const TensorView* grad_loss = nullptr;     // backward, reduction 'none': Acc (N) at any stride; nullptr: 1

  // linear_cross_entropy_scale_held: the held gradients' (x, W, b) CeMode::scale params, nullptr where absent; when
  // any is set the runner only runs the cross-entropy entry on each, and reads no other field.
  const CeParams* held[3] = {nullptr, nullptr, nullptr};
  [[nodiscard]] bool scales_held() const noexcept {
    return held[0] != nullptr || held[1] != nullptr || held[2] != nullptr;
  }
};

// The sum of the class weights (V when unweighted), in double.
double lce_class_weight_sum(const LceParams& p);

// The cross-entropy kernel's params for rows [r0, r0 + rc) whose logits are the contiguous rc x V Acc block `logits`
// on the operands' device: reduction 'none', the gradient written over the logits when `mode` has one, row r's
// upstream gradient scale[r] (an N-element Acc array on that device, from row 0; grads only), the lse in double.
// With a device call: no class weights and no scale (the call's record has them), 'none''s upstream gradient from
// p.grad_loss's rows. The row outputs and lse_in are the runner's to set. Untiled chunks only.
CeParams lce_chunk_params(const LceParams& p, CeMode mode, std::int64_t r0, std::int64_t rc, void* logits,
                          const void* scale);

}  // namespace lossfuse::core
