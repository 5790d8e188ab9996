// lossfuse math: per-row cross-entropy value and gradient coefficients, shared by every backend.
//
// The kernels reduce a row of z (logits after scale and soft-cap) to a few sums taken relative to the row
// maximum M, so no sum cancels catastrophically when the logits carry a large common offset:
//   lse               = log sum_c exp(z_c)
//   sum_w             = sum_c w_c                  (C when unweighted)
//   sum_wz            = sum_c w_c (z_c - M)        (label smoothing only)
//   soft: sum_wp      = sum_c w_c p_c,  sum_wpz = sum_c w_c p_c (z_c - M)
// The loss of a row (see include/lossfuse/cross_entropy.hpp for the definition) is then
//   index target: (1-eps) w_y (lse - z_y) + (eps/C) (sum_w (lse - M) - sum_wz) + zls lse^2
//   soft target:  (lse - M) sum_wp' - sum_wpz' + zls lse^2,
//                 sum_wp' = (1-eps) sum_wp + (eps/C) sum_w,  sum_wpz' = (1-eps) sum_wpz + (eps/C) sum_wz
// and the gradient with respect to z_c, for an upstream gradient g, is
//   g (q_c A - w_c b_c),  q_c = exp(z_c - lse) (z_c - lse as -lse_minus where the forward knows both parts),
//   index: A = (1-eps) w_y + (eps/C) sum_w + 2 zls lse, b_c = eps/C + (1-eps) [c == y] w_y / w_c
//   soft:  A = sum_wp' + 2 zls lse,                     b_c = (1-eps) p_c + eps/C
// Valid range: finite z and lse. Rows with NaN or +inf in z, or only -inf, have lse = NaN (as PyTorch's
// log_softmax gives) and are handled by the kernels: loss NaN unless ignored, gradient NaN.
#pragma once

#include <cmath>

#include "math/host_device.hpp"

namespace lossfuse::math {

// z from a raw logit x: z = scale * x, then softcap * tanh(z / softcap) when softcap > 0.
template <class Acc>
struct LogitTransform {
  Acc scale = 1;
  Acc softcap = 0;  // 0: off
  Acc inv_softcap = 0;

  LF_HOST_DEVICE Acc apply(Acc x) const { return softcap > 0 ? apply_as<true>(x) : apply_as<false>(x); }
  // dz/dx at x
  LF_HOST_DEVICE Acc derivative(Acc x) const {
    if (!(softcap > 0)) return scale;
    const Acc t = std::tanh(x * scale * inv_softcap);
    return scale * (Acc(1) - t * t);
  }
  // For element loops, with the softcap test taken once outside: kCap must equal (softcap > 0).
  template <bool kCap>
  LF_HOST_DEVICE Acc apply_as(Acc x) const {
    const Acc z = x * scale;
    if constexpr (kCap) {
      return softcap * std::tanh(z * inv_softcap);
    } else {
      return z;
    }
  }
  // dz/dx from z itself (z = softcap tanh(.), so tanh(.) = z / softcap): no second tanh. Exact up to the rounding
  // of z, which moves 1 - tanh^2 by a few ulp of 1 (absolute), where the derivative is near 0 anyway.
  template <bool kCap>
  LF_HOST_DEVICE Acc derivative_from_z(Acc z) const {
    if constexpr (kCap) {
      const Acc t = z * inv_softcap;
      return scale * (Acc(1) - t * t);
    } else {
      return scale;
    }
  }
};

template <class Acc>
struct RowSums {
  Acc m;        // the reference of the sums below (the row max, or the first chunk's shift)
  Acc lse;      // log-sum-exp of z
  Acc sum_wz;   // sum w_c (z_c - m); 0 unless needed
  Acc sum_wp;   // soft targets: sum w_c p_c
  Acc sum_wpz;  // soft targets: sum w_c p_c (z_c - m)
  // lse split as top + log_s, top the row's max z and log_s = log sum exp(z_c - top) in [0, log C]: differences
  // lse - v are taken as (top - v) + log_s (lse_minus), so they keep the bits that rounding lse to the magnitude of z
  // drops (for |z| >> 1: at z ~ 1e3 in float32 a loss of 5e-5 would be off by 1e-5). Where only a saved lse is known
  // (backward), top = the saved lse rounded to Acc and log_s = the remainder of a float64 one (else 0).
  Acc top;
  Acc log_s;
};

// lse - v for v inside the row's range (a z, the reference m), as (top - v) + log_s (see RowSums).
template <class Acc>
LF_HOST_DEVICE Acc lse_minus(const RowSums<Acc>& r, Acc v) {
  return (r.top - v) + r.log_s;
}

template <class Acc>
struct CeRowParams {
  Acc eps = 0;           // label smoothing
  Acc eps_over_c = 0;    // eps / C
  Acc sum_w = 0;         // sum of all class weights (C when unweighted)
  Acc z_loss_scale = 0;
};

// Cross-entropy part of an index-target row; w_y is the weight of the target class, z_y its z.
template <class Acc>
LF_HOST_DEVICE Acc ce_index_row_loss(const CeRowParams<Acc>& p, const RowSums<Acc>& r, Acc w_y, Acc z_y) {
  Acc loss = (Acc(1) - p.eps) * w_y * lse_minus(r, z_y);
  if (p.eps != Acc(0)) loss += p.eps_over_c * (p.sum_w * lse_minus(r, r.m) - r.sum_wz);
  return loss;
}

template <class Acc>
LF_HOST_DEVICE Acc ce_soft_row_loss(const CeRowParams<Acc>& p, const RowSums<Acc>& r) {
  const Acc one_m = Acc(1) - p.eps;
  Acc wp = one_m * r.sum_wp;
  Acc wpz = one_m * r.sum_wpz;
  if (p.eps != Acc(0)) {
    wp += p.eps_over_c * p.sum_w;
    wpz += p.eps_over_c * r.sum_wz;
  }
  return lse_minus(r, r.m) * wp - wpz;
}

template <class Acc>
LF_HOST_DEVICE Acc z_loss_row(const CeRowParams<Acc>& p, Acc lse) {
  return p.z_loss_scale * lse * lse;
}

// (eps/C) sum_w, the smoothing part of A: 0 without smoothing even where a class weight is NaN or inf, as torch,
// whose gradient reads no weight but the target's then (python/tests/test_cross_entropy.py
// test_non_finite_weight_of_an_untargeted_class).
template <class Acc>
LF_HOST_DEVICE Acc ce_smoothing_weight(const CeRowParams<Acc>& p) {
  return p.eps_over_c != Acc(0) ? p.eps_over_c * p.sum_w : Acc(0);
}

// A in the gradient formula above.
template <class Acc>
LF_HOST_DEVICE Acc ce_index_grad_a(const CeRowParams<Acc>& p, Acc lse, Acc w_y) {
  return (Acc(1) - p.eps) * w_y + ce_smoothing_weight(p) + Acc(2) * p.z_loss_scale * lse;
}

template <class Acc>
LF_HOST_DEVICE Acc ce_soft_grad_a(const CeRowParams<Acc>& p, const RowSums<Acc>& r) {
  return (Acc(1) - p.eps) * r.sum_wp + ce_smoothing_weight(p) + Acc(2) * p.z_loss_scale * r.lse;
}

}  // namespace lossfuse::math
