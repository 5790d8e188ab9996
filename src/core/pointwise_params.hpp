// The plain parameter struct of the elementwise-loss kernels (src/cpu/pointwise.cpp), filled by
// src/core/pointwise.cpp after every check.
#pragma once

#include <cstdint>

#include "lossfuse/dtype.hpp"
#include "lossfuse/loss_kind.hpp"
#include "lossfuse/tensor.hpp"
#include "math/host_device.hpp"

namespace lossfuse::core {

// PwParams::flags: the loss's boolean options, turned into template parameters at the kernels' switch point
// (visit_pointwise_loss in src/math/pointwise_losses.inc: option1 is bit 1, option2 bit 2).
enum PwFlag : std::uint8_t {
  kPwPosWeight = 1,  // bce_with_logits: z holds pos_weight
  kPwLogTarget = 1,  // kl_div: log_target
  kPwLogInput = 1,   // poisson_nll: log_input
  kPwFull = 2,       // poisson_nll: full
};

// The value checks a kernel can make: x in [0, 1] (bce's input; NaN fails), z not below 0 (gaussian_nll's var;
// NaN passes, as torch's any(var < 0)).
enum class PwCheck : std::uint8_t { none, x_unit_interval, z_nonnegative };

// Views in stride-table order: inputs x (input), y (target), z (third operand), w (weight); gradient outputs
// gx, gy, gz; go (upstream gradient, reduction none).
enum PwView : int { kPwX = 0, kPwY, kPwZ, kPwW, kPwGX, kPwGY, kPwGZ, kPwGO, kPwViews };

// A device backend's whole call (PwParams::device_call, set by core for operands off the CPU): the backend reads the
// upstream scalar, sums the weights and the loss and makes the value check on its device, so the call reads nothing
// back but the check's flag (bce, gaussian_nll; none under stream capture) and never synchronises otherwise. PwParams'
// host-side fields (grad_scale, tile_loss, tile_weight, check, tile_bad) are unused then.
struct PwDeviceCall {
  Reduction reduction = Reduction::none;
  bool weight_mean = false;           // 'mean' over the sum of the weights, else over `denominator`
  double denominator = 1;             // 'mean' divisor (numel, or kl_div's batchmean) when !weight_mean
  const void* grad_scalar = nullptr;  // reduced backward: the upstream scalar (Acc) on the device; nullptr: 1
  bool skip_if_one = false;           // held gradients (PointwiseGrads::held): no pass writes if grad_scalar is 1
  void* loss = nullptr;               // reduced forward or fused: the one-element output (Acc); nullptr: none
  PwCheck check = PwCheck::none;      // the value check, made before any output is written
  // Out: an element failed the check (read back, so an eager call synchronises once); the call then wrote nothing.
  // Under stream capture nothing is read back: `bad` stays false and the call's outputs are NaN instead.
  bool bad = false;
};

struct PwParams {
  LossKind kind = LossKind::mse;  // one of the eleven elementwise kinds (include/lossfuse/pointwise.hpp)
  bool backward = false;
  DType dtype = DType::f32;        // every floating operand and gradient
  const void* ptr[kPwViews] = {};  // nullptr: absent
  int ndim = 1;                    // >= 1 (a 0-d problem is one row of one element)
  std::int64_t shape[kMaxDims] = {};
  std::int64_t strides[kPwViews][kMaxDims] = {};
  std::int64_t numel = 0, inner = 1, rows = 0;
  std::int64_t tile = 1, tiles_per_row = 1;  // tiles: pieces of at most `tile` elements of one row
  double a = 0, b = 0;                       // the loss's constants (beta, delta, margin, eps)
  std::uint8_t flags = 0;                    // PwFlag bits
  void* loss_rows = nullptr;                 // reduction none: Acc[numel], contiguous
  double grad_scale = 1;                     // upstream gradient scale (1/denominator folded in for mean)
  double* tile_loss = nullptr;               // reductions: per tile sum of (w) l, in double
  double* tile_weight = nullptr;             // weighted mean over sum(w): per tile sum of w
  // Reduced forward: core's value check made in the same pass instead of a pass of its own. A tile holding an
  // element outside the valid range gets tile_bad[t] = 1; core then finds and reports the first one (the reduced
  // loss is written after the kernel, so nothing has been written). Host steps only (device calls: PwDeviceCall).
  PwCheck check = PwCheck::none;
  char* tile_bad = nullptr;

  PwDeviceCall* device_call = nullptr;  // device backends: set by core (see PwDeviceCall); nullptr: host steps
};

// Every view's element offset of (row, element i0 of the row): rows are the dims before the last, in row-major
// order. Shared by every backend's kernels.
struct PwOffsets {
  std::int64_t v[kPwViews];
};
LF_HOST_DEVICE PwOffsets pw_row_offsets(const PwParams& p, std::int64_t row, std::int64_t i0) {
  std::int64_t coords[kMaxDims] = {};
  for (int k = p.ndim - 2; k >= 0; --k) {
    coords[k] = row % p.shape[k];
    row /= p.shape[k];
  }
  coords[p.ndim - 1] = i0;
  PwOffsets o{};
  for (int v = 0; v < kPwViews; ++v) {
    std::int64_t off = 0;
    for (int k = 0; k < p.ndim; ++k) off += coords[k] * p.strides[v][k];
    o.v[v] = off;
  }
  return o;
}

// The flags as visit_pointwise_loss's two options.
inline bool pw_option1(const PwParams& p) noexcept { return (p.flags & 1) != 0; }
inline bool pw_option2(const PwParams& p) noexcept { return (p.flags & 2) != 0; }

}  // namespace lossfuse::core
