// The plain parameter struct the core fills after checking and every cross-entropy / NLL kernel takes.
#pragma once

#include <cstdint>

#include "core/row_index.hpp"
#include "lossfuse/dtype.hpp"
#include "lossfuse/loss_kind.hpp"

namespace lossfuse::core {

// scale: cross_entropy_scale_held (and linear_cross_entropy_scale_held). grad (rows x classes, g_cstride, kGradRow)
// times each row's upstream gradient grad_loss[index.offset(kGradLossRow, r)] (Acc; one element for mean / sum), in
// Acc and rounded once; rows whose value is 1 or whose class target is ignore_index (or, pooled, every target) are
// left as they are. No fields but these and the grad_loss_uniform / pooled ones are read.
enum class CeMode : std::uint8_t { forward, backward, forward_backward, scale };

// Views in RowIndex order.
enum RowView : int { kLogitsRow = 0, kTargetRow = 1, kGradRow = 2, kGradLossRow = 3 };

// A device backend's whole call (CeParams::device_call, set by core for operands off the CPU): the backend reads the
// class weights, scans the targets, scales the gradient and reduces the loss on its device, so core takes no host step
// and the call at most one read-back (the first bad target's row; none under stream capture). CeParams' host-side
// fields (weight, sum_w, grad_scale, rows_per_block, block_loss, block_zloss) are unused then.
struct CeDeviceCall {
  const void* weight = nullptr;  // the caller's class weights (`classes` floating elements), nullptr: unweighted
  DType weight_dtype = DType::f32;
  std::int64_t weight_stride = 1;
  Reduction reduction = Reduction::mean;
  bool split_mean = false;            // label smoothing or z-loss on: split_mean_denominator gives the loss's mean
  const void* grad_scalar = nullptr;  // mean / sum with a gradient: the upstream scalar (Acc); nullptr: 1
  void* loss = nullptr;               // mean / sum forward: the one-element outputs (Acc); nullptr: not wanted
  void* z_loss = nullptr;
  // cross_entropy_backward_held: the targets were checked by the forward that made the held gradient, so nothing is
  // read back (as under stream capture), and the rows are not written when the upstream scalar is exactly 1.
  bool held = false;
  // Out: the first bad class target in row order (bad_row -1: none), found before any output is written; the call
  // then writes nothing. Under stream capture nothing is read back: bad_row stays -1 and a bad row is NaN instead.
  std::int64_t bad_row = -1, bad_value = 0;
};

struct CeParams {
  CeMode mode = CeMode::forward;
  DType dtype = DType::f32;         // logits and gradient
  DType target_dtype = DType::i64;  // integer: class indices; floating (== dtype): probabilities
  bool soft = false;

  const void* logits = nullptr;  // rows x classes, strided (x_cstride along classes)
  const void* target = nullptr;  // index: one per row; soft: rows x classes (t_cstride)
  void* grad = nullptr;          // like logits (g_cstride); may equal logits (in place)
  std::int64_t rows = 0, classes = 0;
  std::int64_t x_cstride = 1, t_cstride = 1, g_cstride = 1;
  RowIndex index;

  // Operands and row outputs live on the backend's device; weight and the block sums below in host memory.
  const void* weight = nullptr;  // Acc[classes rounded up to 64], zero padded; nullptr: unweighted
  double sum_w = 0;              // sum of all class weights (classes when unweighted)
  double scale = 1, softcap = 0, eps = 0, z_loss_scale = 0;
  std::int64_t ignore_index = -100;

  // Row outputs, Acc typed and contiguous; nullptr when not wanted.
  void* loss_rows = nullptr;     // reduction none
  void* lse_rows = nullptr;      // double when lse_f64
  void* zloss_rows = nullptr;    // reduction none
  const void* lse_in = nullptr;  // backward: the saved log-sum-exp, double when lse_f64
  // lse_rows / lse_in hold double whatever Acc is: the forward writes top + log_s summed in double, and the
  // backward splits a saved value back into top (rounded to Acc) and log_s (the remainder), so a gradient from a
  // saved lse keeps the forward's precision at any common offset of the logits.
  bool lse_f64 = false;

  // Upstream gradient of row r: grad_loss[index.offset(kGradLossRow, r)] * grad_scale when grad_loss is set
  // (reduction none), else grad_scale (mean/sum, with 1/denominator folded in).
  const void* grad_loss = nullptr;
  double grad_scale = 1;
  bool grad_loss_uniform = false;  // scale: one upstream value for every row (set by core), so a 1 skips the call
  // scale: the gradient's rows are not target rows but pooled over all of them (the fused linear loss's weight and
  // bias gradients): kept whole when each of the pooled_targets targets (target, pooled_stride apart) is
  // ignore_index, else every row scaled.
  bool pooled = false;
  std::int64_t pooled_targets = 0, pooled_stride = 0;

  // Reductions mean/sum: the sums of each block of rows_per_block rows, in double. The block split depends
  // on the problem only, never on the thread count, so the reduction order is fixed.
  std::int64_t rows_per_block = 1;
  double* block_loss = nullptr;
  double* block_zloss = nullptr;

  CeDeviceCall* device_call = nullptr;  // device backends: set by core (see CeDeviceCall); nullptr: host steps
};

}  // namespace lossfuse::core
