// lossfuse tests: the float64 reference of the elementwise losses (torch.nn.functional mse_loss, l1_loss,
// smooth_l1_loss, huber_loss), forward and backward. Written from the formulas in
// docs/semantics.md and checked against CPU PyTorch 2.15, never from the library.
//
// Works on flat float64 vectors in logical row-major order (an expanded operand is passed expanded); the
// tests gather strided tensors of any dtype into that form. d = x - y.
//   mse        l = d^2                                          dl/dx = 2 d
//   l1         l = |d|                                          dl/dx = sign(d), 0 at d == 0 and at d = NaN
//   smooth_l1  l = 0.5 d^2 / beta if |d| < beta else |d| - 0.5 beta
//              dl/dx = d / beta if |d| < beta else sign(d); beta == 0 is exactly l1 (torch 2.15 routes it to
//              l1_loss: gradient 0 at d == 0 and at d = NaN)
//   huber      l = 0.5 d^2 if |d| < delta else delta (|d| - 0.5 delta)
//              dl/dx = d if |d| <= delta else delta sign(d)
//   dl/dy = -dl/dx. With a weight w: l <- w l. 'mean' divides by sum(w) (mse, l1 with a weight) or by numel
//   (huber with a weight, and every loss without one). Empty: mean is NaN, sum 0.
//   smooth_l1 / huber at d = NaN: the gradient is NaN (torch's branches compare false and fall to d / beta, d).
//
// Error budget (absolute, for a correct implementation computing in a type of unit roundoff u, first order):
//   per element a few u of the terms that make up the value (|d|, beta, delta); sums of n elements
//   (sum_condition(n) + 2 sqrt(min(n, 16384))) u sum|w l| (blocked sums of float lanes, tiles of 16384); the
//   'mean' divisor sum(w) the same; gradients 8 u |g| plus the relative error of that divisor.
// Overflow: a per-element loss beyond the compute type's range is +inf (as torch's float32 arithmetic gives);
// a gradient beyond the output dtype's range is +-inf.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "reference/reference.hpp"

namespace lfref {

enum class PwLoss { mse, l1, smooth_l1, huber };

struct PwInput {
  PwLoss loss = PwLoss::mse;
  std::vector<double> x, y;    // numel each
  std::vector<double> weight;  // numel or empty
  Reduction reduction = Reduction::mean;
  double param = 1.0;             // beta (smooth_l1) or delta (huber)
  std::vector<double> grad_loss;  // empty: 1; size 1: the scalar (mean/sum); numel: per element (none)
  double u = 0x1p-24;             // unit roundoff of the compute type
  FloatFormat compute = kF32;     // the compute (and loss) type: overflow of per-element losses
  FloatFormat out = kF32;         // the gradients' dtype: overflow of gradients
};

struct PwResult {
  std::vector<double> elem_loss, elem_loss_tol;  // w l per element ('none')
  double loss = 0, loss_tol = 0;                 // reduced ('mean' / 'sum')
  double denom = 0;
  std::vector<double> gx, gx_tol, gy, gy_tol;
};

// sign with sign(0) = 0 and sign(NaN) = 0 (torch.sign / torch.sgn)
inline double pw_sign0(double d) { return d > 0 ? 1.0 : d < 0 ? -1.0 : 0.0; }

// Value, its error budget before the weight (in units of u) and dl/dd of one element.
struct PwElem {
  double value, tol_u, grad;
};

inline PwElem pw_elem(PwLoss loss, double d, double p) {
  const double a = std::fabs(d);
  switch (loss) {
    case PwLoss::mse: return {d * d, 4 * d * d, 2 * d};
    case PwLoss::l1: return {a, 2 * a, pw_sign0(d)};
    case PwLoss::smooth_l1:
      if (p == 0) return {a, 2 * a, pw_sign0(d)};
      if (std::isnan(d)) return {d, 0, d};
      if (a < p) return {0.5 * d * d / p, 8 * 0.5 * d * d / p, d / p};
      return {a - 0.5 * p, 3 * (a + 0.5 * p), pw_sign0(d)};
    case PwLoss::huber:
      if (std::isnan(d)) return {d, 0, d};
      if (a < p) return {0.5 * d * d, 4 * 0.5 * d * d, d};
      return {p * (a - 0.5 * p), 4 * p * (a + 0.5 * p), a <= p ? d : p * pw_sign0(d)};
  }
  return {0, 0, 0};
}

inline bool pw_mean_over_weight(PwLoss loss) { return loss == PwLoss::mse || loss == PwLoss::l1; }

// Error factor (in units of u) of a float sum of n terms, blocked over lanes and tiles of 16384.
inline double pw_sum_condition(std::int64_t n) {
  return sum_condition(n) + 2.0 * std::sqrt(static_cast<double>(std::min<std::int64_t>(n, 16384)));
}

inline double pw_overflow(double v, FloatFormat f) { return std::isinf(round_to(v, f)) ? round_to(v, f) : v; }

inline PwResult pointwise(const PwInput& in) {
  const auto n = static_cast<std::int64_t>(in.x.size());
  const double u = in.u;
  PwResult r;
  r.elem_loss.assign(n, 0), r.elem_loss_tol.assign(n, 0);
  r.gx.assign(n, 0), r.gx_tol.assign(n, 0);
  const bool has_w = !in.weight.empty();
  double sum = 0, sabs = 0, tol_sum = 0, wsum = 0, wabs = 0;
  std::vector<PwElem> el(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const double d = in.x[i] - in.y[i];
    const double w = has_w ? in.weight[i] : 1.0;
    el[i] = pw_elem(in.loss, d, in.param);
    double v = pw_overflow(el[i].value, in.compute);
    v = pw_overflow(w * v, in.compute);
    r.elem_loss[i] = v;
    r.elem_loss_tol[i] = u * (std::fabs(w) * el[i].tol_u + 2 * std::fabs(v));
    sum += v, sabs += std::fabs(v), tol_sum += r.elem_loss_tol[i];
    wsum += w, wabs += std::fabs(w);
  }
  const double sc = pw_sum_condition(n);
  double denom = static_cast<double>(n), denom_rel = 0;  // relative error of the divisor
  if (has_w && pw_mean_over_weight(in.loss)) {
    denom = wsum;
    denom_rel = u * sc * wabs / std::fabs(wsum);
  }
  r.denom = denom;
  const double tol_s = tol_sum + u * sc * sabs;
  if (in.reduction == Reduction::mean) {
    r.loss = sum / denom;  // 0/0 = NaN for an empty input
    r.loss_tol = tol_s / std::fabs(denom) + std::fabs(r.loss) * (denom_rel + u);
  } else {
    r.loss = sum;
    r.loss_tol = tol_s;
  }
  for (std::int64_t i = 0; i < n; ++i) {
    double g = 1.0;
    if (in.grad_loss.size() == 1 && in.reduction != Reduction::none) g = in.grad_loss[0];
    if (in.reduction == Reduction::none && !in.grad_loss.empty()) g = in.grad_loss[i];
    if (in.reduction == Reduction::mean) g /= denom;
    const double w = has_w ? in.weight[i] : 1.0;
    const double gx = el[i].grad * w * g;
    r.gx[i] = pw_overflow(gx, in.out);
    r.gx_tol[i] = std::fabs(gx) * (8 * u + (in.reduction == Reduction::mean ? denom_rel : 0.0));
  }
  r.gy.resize(n), r.gy_tol = r.gx_tol;
  for (std::int64_t i = 0; i < n; ++i) r.gy[i] = -r.gx[i];
  return r;
}

}  // namespace lfref
