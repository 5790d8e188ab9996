// lossfuse math: per-element and per-row formulas of the margin and embedding losses (include/lossfuse/margin.hpp),
// shared by every backend. The kernels loop over a row's last dim and call these on Acc = float or double.
//
// Valid range and error, for Acc with unit roundoff u:
// - p-norms (triplet): the row sum of D terms is a plain running sum (error <= D u sum of terms); sqrt, pow
//   add a few ulp. Any finite input; sum |v|^p overflows to inf like torch's for |v|^p > max(Acc), and the
//   gradient of a zero norm is 0 (torch's norm_backward masks it). norm_grad is exact in sign, a few ulp in
//   magnitude, and never overflows (|v|/norm <= 1).
// - cosine: cos = s12 / sqrt((s11 + eps)(s22 + eps)), eps = float(1e-12), with the same running sums (error
//   ~ D u in each sum, relative); valid while the product of the two squared norms stays finite in Acc (as in
//   torch).
// - multi-margin / multilabel-margin hinge terms: one subtraction and one addition each (<= 2 ulp of the
//   largest operand); a term counts when its computed value is > 0 (torch's strict test).
// - soft margin: log sigmoid in the stable form min(x, 0) - log1p(exp(-|x|)), a few ulp for every finite x
//   (no overflow at +-1e38); sigmoid in the branch-free stable form, a few ulp.
#pragma once

#include <cmath>

#include "math/host_device.hpp"

namespace lossfuse::math {

// ---- p-norm of a difference (triplet_margin) -----------------------------------------------------------------

// The form of the norm: p is classified once per call so row loops see a constant.
enum class NormKind : int { zero, one, two, inf, general };

LF_HOST_DEVICE NormKind norm_kind(double p) {
  if (p == 0.0) return NormKind::zero;
  if (p == 1.0) return NormKind::one;
  if (p == 2.0) return NormKind::two;
  if (std::isinf(p)) return NormKind::inf;
  return NormKind::general;
}

// Accumulates one element v of the difference into the running norm state `acc` (start from 0).
template <NormKind K, class Acc>
LF_HOST_DEVICE Acc norm_accumulate(Acc acc, Acc v, Acc p) {
  const Acc a = std::fabs(v);
  if constexpr (K == NormKind::zero) return acc + (v != Acc(0) ? Acc(1) : Acc(0));
  if constexpr (K == NormKind::one) return acc + a;
  if constexpr (K == NormKind::two) return acc + v * v;
  if constexpr (K == NormKind::inf) return (a > acc || a != a) ? a : acc;  // NaN propagates like torch's amax
  if constexpr (K == NormKind::general) return acc + std::pow(a, p);
  return acc;
}

template <NormKind K, class Acc>
LF_HOST_DEVICE Acc norm_finish(Acc acc, Acc p) {
  if constexpr (K == NormKind::two) return std::sqrt(acc);
  if constexpr (K == NormKind::general) return std::pow(acc, Acc(1) / p);
  return acc;
}

// d||v||_p / dv_i at element v of a vector with norm `norm`, as torch's norm_backward gives it:
// sgn(v) (|v| / norm)^(p-1); 0 when norm == 0 or (p != 1) v == 0; p = 0: 0. For p = inf the caller divides
// by the number of elements attaining the max (ties share the gradient) and passes is_max.
template <NormKind K, class Acc>
LF_HOST_DEVICE Acc norm_grad(Acc v, Acc norm, Acc p, bool is_max = false) {
  const Acc s = v > Acc(0) ? Acc(1) : (v < Acc(0) ? Acc(-1) : Acc(0));
  if constexpr (K == NormKind::zero) return Acc(0);
  if constexpr (K == NormKind::one) return s;
  if constexpr (K == NormKind::two) return norm == Acc(0) ? Acc(0) : v / norm;
  if constexpr (K == NormKind::inf) return is_max ? s : Acc(0);
  if constexpr (K == NormKind::general) {
    if (norm == Acc(0) || v == Acc(0)) return Acc(0);
    return s * std::pow(std::fabs(v) / norm, p - Acc(1));
  }
  return Acc(0);
}

// Triplet loss of a row from its distances; with swap, d_neg = min(d_an, d_pn).
template <class Acc>
LF_HOST_DEVICE Acc triplet_loss(Acc margin, Acc d_ap, Acc d_neg) {
  const Acc z = margin + d_ap - d_neg;
  return z > Acc(0) ? z : (z != z ? z : Acc(0));  // clamp_min keeps NaN
}

// Weights of d(a,n) and d(p,n) in d_neg = min(d_an, d_pn): (1, 0) without swap; a tie splits (1/2, 1/2)
// as torch's minimum backward does.
template <class Acc>
struct SwapWeights {
  Acc an, pn;
};
template <class Acc>
LF_HOST_DEVICE SwapWeights<Acc> triplet_swap_weights(bool swap, Acc d_an, Acc d_pn) {
  if (!swap) return {Acc(1), Acc(0)};
  if (d_an < d_pn) return {Acc(1), Acc(0)};
  if (d_pn < d_an) return {Acc(0), Acc(1)};
  return {Acc(0.5), Acc(0.5)};
}

// ---- cosine_embedding ----------------------------------------------------------------------------------------

// torch's EPSILON, added to each squared norm before the product. ATen declares it `constexpr float EPSILON =
// 1e-12`, so float64 inputs see the float value 9.99999996e-13 (checked against torch 2.15: 1e-12 as a double
// is off by 2e-9 relative in the gradient of a zero vector).
inline constexpr double kCosineEps = static_cast<double>(1e-12f);

template <class Acc>
struct CosineRow {
  Acc cos;      // s12 / den
  Acc inv_den;  // 1 / sqrt(m1 m2)
  Acc cos_m1;   // cos / m1
  Acc cos_m2;   // cos / m2
};

template <class Acc>
LF_HOST_DEVICE CosineRow<Acc> cosine_row(Acc s12, Acc s11, Acc s22) {
  const Acc m1 = s11 + static_cast<Acc>(kCosineEps);
  const Acc m2 = s22 + static_cast<Acc>(kCosineEps);
  const Acc den = std::sqrt(m1 * m2);
  const Acc cos = s12 / den;
  return {cos, Acc(1) / den, cos / m1, cos / m2};
}

// y == 1: 1 - cos; y == -1: max(0, cos - margin); else 0.
template <class Acc>
LF_HOST_DEVICE Acc cosine_loss(Acc cos, Acc margin, double y) {
  if (y == 1.0) return Acc(1) - cos;
  if (y == -1.0) {
    const Acc z = cos - margin;
    return z > Acc(0) ? z : (z != z ? z : Acc(0));
  }
  return Acc(0);
}

// d loss / d cos (then grad_x1 = k (x2 / den - cos x1 / m1), grad_x2 = k (x1 / den - cos x2 / m2)).
template <class Acc>
LF_HOST_DEVICE Acc cosine_dloss_dcos(Acc cos, Acc margin, double y) {
  if (y == 1.0) return Acc(-1);
  if (y == -1.0) return cos - margin > Acc(0) ? Acc(1) : Acc(0);
  return Acc(0);
}

// ---- multi_margin / multilabel_margin hinge terms ------------------------------------------------------------

// z = margin - x_y + x_j, in that order (torch's).
template <class Acc>
LF_HOST_DEVICE Acc hinge_z(Acc margin, Acc x_y, Acc x_j) {
  return margin - x_y + x_j;
}

// max(0, z)^p for p in {1, 2}; d/dz of it (z > 0 only).
template <class Acc>
LF_HOST_DEVICE Acc hinge_value(Acc z, int p) {
  return z > Acc(0) ? (p == 2 ? z * z : z) : Acc(0);
}
template <class Acc>
LF_HOST_DEVICE Acc hinge_slope(Acc z, int p) {
  return z > Acc(0) ? (p == 2 ? Acc(2) * z : Acc(1)) : Acc(0);
}

// ---- multilabel_soft_margin ----------------------------------------------------------------------------------

// log sigmoid(x) = min(x, 0) - log1p(exp(-|x|)).
template <class Acc>
LF_HOST_DEVICE Acc log_sigmoid(Acc x) {
  return (x < Acc(0) ? x : Acc(0)) - std::log1p(std::exp(-std::fabs(x)));
}

template <class Acc>
LF_HOST_DEVICE Acc sigmoid(Acc x) {
  const Acc e = std::exp(-std::fabs(x));  // in (0, 1]
  const Acc r = Acc(1) / (Acc(1) + e);
  return x >= Acc(0) ? r : e * r;
}

// One element's contribution before the 1/C: -w [y log sigmoid(x) + (1 - y) log sigmoid(-x)]. Both logs share
// l = log1p(exp(-|x|)) (|x| = |-x|), so this is log_sigmoid(x) and log_sigmoid(-x) bit for bit at one exp + log1p.
template <class Acc>
LF_HOST_DEVICE Acc soft_margin_term(Acc x, Acc y, Acc w) {
  const Acc l = std::log1p(std::exp(-std::fabs(x)));
  const Acc ls_pos = (x < Acc(0) ? x : Acc(0)) - l;   // log sigmoid(x)
  const Acc ls_neg = (x > Acc(0) ? -x : Acc(0)) - l;  // log sigmoid(-x)
  return -w * (y * ls_pos + (Acc(1) - y) * ls_neg);
}

// d/dx and d/dy of soft_margin_term: w (sigmoid(x) - y) and -w x.
template <class Acc>
LF_HOST_DEVICE Acc soft_margin_dx(Acc x, Acc y, Acc w) {
  return w * (sigmoid(x) - y);
}
template <class Acc>
LF_HOST_DEVICE Acc soft_margin_dy(Acc x, Acc w) {
  return -w * x;
}

}  // namespace lossfuse::math
