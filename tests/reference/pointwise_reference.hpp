// lossfuse tests: the float64 reference of the eleven elementwise losses (torch.nn.functional mse_loss, l1_loss,
// smooth_l1_loss, huber_loss, binary_cross_entropy(_with_logits), kl_div, poisson_nll_loss, gaussian_nll_loss,
// hinge_embedding_loss, margin_ranking_loss), forward and backward. Written from the formulas in docs/semantics.md
// and checked against CPU PyTorch 2.15, never from the library or src/math.
//
// pw_elem gives one element's loss and its derivatives by x (input / input1), y (target / input2) and z (pos_weight,
// var or the ranking target) for an upstream gradient of 1 and no weight, with each one's magnitude: the sum of the
// absolute values of the terms it adds. pointwise() applies weights, the reduction and the upstream gradient.
//
// Error budget (absolute, for a correct implementation computing in a type of unit roundoff u, first order):
//   per element pw_budget(loss) u times the magnitude (8 for the four losses of d = x - y, a few roundings of exact
//   operations; 32 for the others, whose exp / log are a few ulp each), plus 2 u of the weighted value; sums of n
//   elements (sum_condition(n) + 2 sqrt(min(n, 16384))) u sum|w l| (blocked sums of float lanes, tiles of 16384); the
//   'mean' divisor sum(w) the same; gradients their budget plus the relative error of that divisor.
// Overflow: a per-element loss beyond the compute type's range is +-inf (as torch's float32 arithmetic gives); a
// gradient beyond the output dtype's range is +-inf. A non-finite magnitude gives a budget of 0 (the value is then
// compared exactly).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "reference/reference.hpp"

namespace lfref {

enum class PwLoss {
  mse,
  l1,
  smooth_l1,
  huber,
  bce,
  bce_with_logits,
  kl_div,
  poisson_nll,
  gaussian_nll,
  hinge_embedding,
  margin_ranking
};

struct PwOpts {
  double param = 1.0;       // smooth_l1's beta, huber's delta
  bool pos_weight = false;  // bce_with_logits: z is pos_weight
  bool log_target = false;  // kl_div
  bool batchmean = false;   // kl_div: 'mean' divides by input.size(0)
  bool log_input = true;    // poisson_nll
  bool full = false;        // poisson_nll, gaussian_nll
  double eps = 0;           // poisson_nll, gaussian_nll
  double margin = 0;        // hinge_embedding, margin_ranking
};

// Which operands a loss takes and which gradients torch gives.
inline bool pw_takes_weight(PwLoss k) {
  return k == PwLoss::mse || k == PwLoss::l1 || k == PwLoss::huber || k == PwLoss::bce || k == PwLoss::bce_with_logits;
}
inline bool pw_has_z(PwLoss k, const PwOpts& o) {
  return (k == PwLoss::bce_with_logits && o.pos_weight) || k == PwLoss::gaussian_nll || k == PwLoss::margin_ranking;
}
inline bool pw_y_grad(PwLoss k) { return k != PwLoss::hinge_embedding; }
inline bool pw_z_grad(PwLoss k) { return k == PwLoss::gaussian_nll || k == PwLoss::margin_ranking; }
inline bool pw_of_difference(PwLoss k) { return k <= PwLoss::huber; }  // a function of d = x - y
inline double pw_budget(PwLoss k) { return pw_of_difference(k) ? 8.0 : 32.0; }

// Loss l and its derivatives by x, y, z; m*: magnitudes.
struct PwElem {
  double l = 0, dx = 0, dy = 0, dz = 0;
  double ml = 0, mdx = 0, mdy = 0, mdz = 0;
};

namespace pwdetail {
// sign with sign(0) = 0 and sign(NaN) = 0 (torch.sign / torch.sgn)
inline double sign0(double d) { return d > 0 ? 1.0 : d < 0 ? -1.0 : 0.0; }
// log(1 + e^a), exactly enough in double for any a
inline double softplus(double a) { return a > 0 ? a + std::log1p(std::exp(-a)) : std::log1p(std::exp(a)); }
inline double sigmoid(double a) { return a >= 0 ? 1 / (1 + std::exp(-a)) : std::exp(a) / (1 + std::exp(a)); }

// The losses of d = x - y: value and dl/dd; dl/dx = dl/dd, dl/dy = -dl/dd.
//   mse        d^2                                            2 d
//   l1         |d|                                            sign(d), 0 at d == 0 and at d = NaN
//   smooth_l1  0.5 d^2 / beta if |d| < beta else |d| - 0.5 beta    d / beta or sign(d); beta == 0 is exactly l1
//              (torch 2.15 routes it to l1_loss)
//   huber      0.5 d^2 if |d| < delta else delta (|d| - 0.5 delta)  d if |d| <= delta else delta sign(d)
// smooth_l1 / huber at d = NaN: value and gradient NaN (torch's branches compare false and fall to d / beta, d).
inline PwElem of_difference(PwLoss k, double d, double p) {
  const double a = std::fabs(d);
  PwElem r;
  const auto set = [&r](double l, double ml, double g) {
    r.l = l, r.ml = ml, r.dx = g, r.dy = -g, r.mdx = r.mdy = std::fabs(g);
  };
  if (k == PwLoss::mse) set(d * d, d * d, 2 * d);
  if (k == PwLoss::l1 || (k == PwLoss::smooth_l1 && p == 0)) set(a, a, sign0(d));
  if (k == PwLoss::smooth_l1 && p != 0) {
    if (std::isnan(d))
      set(d, 0, d);
    else if (a < p)
      set(0.5 * d * d / p, 0.5 * d * d / p, d / p);
    else
      set(a - 0.5 * p, a + 0.5 * p, sign0(d));
  }
  if (k == PwLoss::huber) {
    if (std::isnan(d))
      set(d, 0, d);
    else if (a < p)
      set(0.5 * d * d, 0.5 * d * d, d);
    else
      set(p * (a - 0.5 * p), p * (a + 0.5 * p), a <= p ? d : p * sign0(d));
  }
  return r;
}
}  // namespace pwdetail

inline PwElem pw_elem(PwLoss k, const PwOpts& o, double x, double y, double z) {
  using namespace pwdetail;
  if (pw_of_difference(k)) return of_difference(k, x - y, o.param);
  PwElem r;
  switch (k) {
    case PwLoss::bce: {
      // -(y log x + (1 - y) log(1 - x)), each log clamped to >= -100; d/dx = (x - y) / max(x (1 - x), 1e-12);
      // d/dy = -(log x - log(1 - x)) unclamped. torch's 1e-12 is a float (9.99999996e-13) in every dtype.
      const double lx = std::log(x), l1x = std::log(1 - x);
      const double cx = std::max(lx, -100.0), c1x = std::max(l1x, -100.0);
      r.l = -(y * cx + (1 - y) * c1x);
      r.ml = std::fabs(y * cx) + std::fabs((1 - y) * c1x);
      const double eps = static_cast<double>(1e-12f);
      r.dx = (x - y) / std::max(x * (1 - x), eps);
      r.mdx = (std::fabs(x) + std::fabs(y)) / std::max(x * (1 - x), eps);
      r.dy = -(lx - l1x);
      r.mdy = std::fabs(lx) + std::fabs(l1x);
      break;
    }
    case PwLoss::bce_with_logits: {
      // -[pw y log s(x) + (1 - y) log(1 - s(x))] = pw y softplus(-x) + (1 - y) softplus(x), evaluated in torch's
      // form (1 - y) x + (1 + (pw - 1) y) softplus(-x), which decides where infinities give NaN
      const double pw = o.pos_weight ? z : 1.0;
      const double sn = softplus(-x), sp = softplus(x);
      r.l = (1 - y) * x + (o.pos_weight ? 1 + (pw - 1) * y : 1.0) * sn;
      r.ml = std::fabs(pw * y * sn) + std::fabs((1 - y) * sp) + std::fabs((1 - y) * x);
      const double s = sigmoid(x);
      r.dx = o.pos_weight ? (pw * y + 1 - y) * s - pw * y : s - y;  // torch's forms
      r.mdx = std::fabs(pw * y) + std::fabs((pw * y + 1 - y) * s) + std::fabs(y * s);
      r.dy = o.pos_weight ? pw * sn - sp : -x;
      r.mdy = std::fabs(pw * sn) + std::fabs(sp) + std::fabs(x);
      break;
    }
    case PwLoss::kl_div: {
      if (o.log_target) {  // e^y (y - x)
        const double e = std::exp(y);
        r.l = e * (y - x);
        r.ml = e * (std::fabs(y) + std::fabs(x));
        r.dx = -e;
        r.mdx = e;
        r.dy = e * (y - x + 1);
        r.mdy = e * (std::fabs(y) + std::fabs(x) + 1);
      } else {  // y log y - y x; 0 log 0 = 0, log of y < 0 is NaN; torch's autograd gives NaN d/dy at y <= 0
        const double ylogy = y == 0 ? 0.0 : (y > 0 ? y * std::log(y) : kNaN);
        r.l = ylogy - y * x;
        r.ml = std::fabs(ylogy) + std::fabs(y * x);
        r.dx = -y;
        r.mdx = std::fabs(y);
        r.dy = y > 0 ? std::log(y) + y / y - x : kNaN;  // torch's autograd of xlogy: y / y, NaN at y = inf
        r.mdy = y > 0 ? std::fabs(std::log(y)) + 1 + std::fabs(x) : 0;
      }
      break;
    }
    case PwLoss::poisson_nll: {
      if (o.log_input) {
        const double e = std::exp(x);
        r.l = e - y * x;
        r.ml = e + std::fabs(y * x);
        r.dx = e - y;
        r.mdx = e + std::fabs(y);
        r.dy = -x;
        r.mdy = std::fabs(x);
      } else {
        const double xe = x + o.eps;
        r.l = x - y * std::log(xe);
        // (+ |y|, + 1: x + eps is rounded before its log)
        r.ml = std::fabs(x) + std::fabs(y) * (std::fabs(std::log(xe)) + 1);
        r.dx = 1 - y / xe;
        r.mdx = 1 + std::fabs(y / xe);
        r.dy = -std::log(xe);
        r.mdy = std::fabs(r.dy) + 1;
      }
      if (o.full) {  // Stirling's term where y > 1; torch's autograd leaves NaN in d/dy where y <= 0
        if (y > 1) {
          const double st = y * std::log(y) - y + 0.5 * std::log(2 * M_PI * y);
          r.l += st;
          r.ml += std::fabs(y * std::log(y)) + y + std::fabs(0.5 * std::log(2 * M_PI * y)) + 1;
          r.dy += std::log(y) + 0.5 / y;
          r.mdy += std::fabs(std::log(y)) + 0.5 / y;
        } else if (!(y > 0)) {
          r.dy = kNaN;
        }
      }
      break;
    }
    case PwLoss::gaussian_nll: {
      // v = max(var, eps) (NaN stays); 0.5 (log v + (x - y)^2 / v) (+ 0.5 log 2 pi); d/dvar at v, passed through
      const double v = std::isnan(z) ? z : std::max(z, o.eps);
      const double d = x - y;
      const double c = o.full ? 0.5 * std::log(2 * M_PI) : 0.0;
      r.l = 0.5 * (std::log(v) + d * d / v) + c;
      r.ml = 0.5 * (std::fabs(std::log(v)) + (std::fabs(x) + std::fabs(y)) * std::fabs(d) / v) + c;
      r.dx = d / v;
      r.dy = -d / v;
      r.mdx = r.mdy = (std::fabs(x) + std::fabs(y)) / v;
      r.dz = 0.5 * (1 / v - d * d / (v * v));
      r.mdz = 0.5 * (1 / v + (std::fabs(x) + std::fabs(y)) * std::fabs(d) / (v * v));
      break;
    }
    case PwLoss::hinge_embedding: {
      const double t = o.margin - x;
      const double h = t > 0 || std::isnan(t) ? t : 0.0;  // torch's clamp_min keeps NaN
      r.l = y == 1 ? x : (y == -1 ? h : x + h);
      r.ml = std::fabs(x) + std::fabs(o.margin) + std::fabs(x);
      r.dx = (y != -1 ? 1.0 : 0.0) - ((y != 1 && t > 0) ? 1.0 : 0.0);
      r.mdx = 2;
      r.dy = 0;  // torch gives no target gradient
      break;
    }
    case PwLoss::margin_ranking: {
      // max(0, margin - z (x - y)), z the ranking target
      const double t = o.margin - z * (x - y);
      r.l = t > 0 || std::isnan(t) ? t : 0.0;  // torch's clamp_min keeps NaN
      r.ml = std::fabs(o.margin) + std::fabs(z) * (std::fabs(x) + std::fabs(y));
      // torch's autograd multiplies the masked gradient through: 0 * NaN or 0 * inf stay NaN
      const double gt = t > 0 ? 1.0 : 0.0;
      r.dx = -gt * z;
      r.dy = gt * z;
      r.dz = -gt * (x - y);
      r.mdx = r.mdy = std::fabs(z);
      r.mdz = std::fabs(x) + std::fabs(y);
      break;
    }
    default: break;
  }
  return r;
}

// ------------------------------------------------------------------------------------------------------------
// A whole call: flat float64 vectors in logical row-major order (an expanded operand is passed expanded).

struct PwInput {
  PwLoss loss = PwLoss::mse;
  PwOpts opts;
  std::vector<double> x, y, z;  // numel each (z: empty where the loss has none)
  std::vector<double> weight;   // numel or empty
  std::int64_t rows = 1;        // input.size(0), 1 for a 0-d input: batchmean's divisor
  Reduction reduction = Reduction::mean;
  std::vector<double> grad_loss;  // empty: 1; size 1: the scalar (mean/sum); numel: per element (none)
  double u = 0x1p-24;             // unit roundoff of the compute type
  FloatFormat compute = kF32;     // the compute (and loss) type: overflow of per-element losses
  FloatFormat out = kF32;         // the gradients' dtype: overflow of gradients
};

struct PwResult {
  std::vector<double> elem_loss, elem_loss_tol;  // w l per element ('none')
  double loss = 0, loss_tol = 0;                 // reduced ('mean' / 'sum')
  double denom = 0;
  std::vector<double> gx, gx_tol, gy, gy_tol, gz, gz_tol;
};

// 'mean' divides by sum(w) for mse and l1 with a weight, by input.size(0) for kl_div's batchmean, else by numel.
inline bool pw_mean_over_weight(PwLoss k) { return k == PwLoss::mse || k == PwLoss::l1; }

// Error factor (in units of u) of a float sum of n terms, blocked over lanes and tiles of 16384.
inline double pw_sum_condition(std::int64_t n) {
  return sum_condition(n) + 2.0 * std::sqrt(static_cast<double>(std::min<std::int64_t>(n, 16384)));
}

inline double pw_overflow(double v, FloatFormat f) { return std::isinf(round_to(v, f)) ? round_to(v, f) : v; }
inline double pw_finite_or_0(double m) { return std::isfinite(m) ? m : 0.0; }

inline PwResult pointwise(const PwInput& in) {
  const auto n = static_cast<std::int64_t>(in.x.size());
  const double u = in.u, k = pw_budget(in.loss);
  PwResult r;
  r.elem_loss.assign(n, 0), r.elem_loss_tol.assign(n, 0);
  const bool has_w = !in.weight.empty(), has_z = !in.z.empty();
  double sum = 0, sabs = 0, tol_sum = 0, wsum = 0, wabs = 0;
  std::vector<PwElem> el(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const double w = has_w ? in.weight[i] : 1.0;
    el[i] = pw_elem(in.loss, in.opts, in.x[i], in.y[i], has_z ? in.z[i] : 0.0);
    const double v = pw_overflow(w * pw_overflow(el[i].l, in.compute), in.compute);
    r.elem_loss[i] = v;
    r.elem_loss_tol[i] = u * (k * std::fabs(w) * pw_finite_or_0(el[i].ml) + 2 * pw_finite_or_0(std::fabs(v)));
    sum += v, sabs += std::fabs(v), tol_sum += r.elem_loss_tol[i];
    wsum += w, wabs += std::fabs(w);
  }
  const double sc = pw_sum_condition(n);
  double denom = static_cast<double>(n), denom_rel = 0;  // relative error of the divisor
  if (has_w && pw_mean_over_weight(in.loss)) {
    denom = wsum;
    denom_rel = u * sc * wabs / std::fabs(wsum);
  }
  if (in.loss == PwLoss::kl_div && in.opts.batchmean) denom = static_cast<double>(in.rows);
  r.denom = denom;
  const double tol_s = tol_sum + u * sc * sabs;
  if (in.reduction == Reduction::mean) {
    r.loss = sum / denom;  // 0/0 = NaN for an empty input
    r.loss_tol = tol_s / std::fabs(denom) + std::fabs(r.loss) * (denom_rel + u);
  } else {
    r.loss = sum;
    r.loss_tol = tol_s;
  }
  const double rel = in.reduction == Reduction::mean ? denom_rel : 0.0;
  const auto grad = [&](double PwElem::*d, double PwElem::*m, std::vector<double>& g, std::vector<double>& tol) {
    g.assign(n, 0), tol.assign(n, 0);
    for (std::int64_t i = 0; i < n; ++i) {
      double up = 1.0;
      if (in.grad_loss.size() == 1 && in.reduction != Reduction::none) up = in.grad_loss[0];
      if (in.reduction == Reduction::none && !in.grad_loss.empty()) up = in.grad_loss[i];
      if (in.reduction == Reduction::mean) up /= denom;
      const double s = (has_w ? in.weight[i] : 1.0) * up;
      const double v = el[i].*d * s;  // 0 * inf = NaN, as torch's autograd
      g[i] = pw_overflow(v, in.out);
      tol[i] = u * k * std::fabs(s) * pw_finite_or_0(el[i].*m) + std::fabs(v) * rel;
    }
  };
  grad(&PwElem::dx, &PwElem::mdx, r.gx, r.gx_tol);
  grad(&PwElem::dy, &PwElem::mdy, r.gy, r.gy_tol);
  if (has_z) grad(&PwElem::dz, &PwElem::mdz, r.gz, r.gz_tol);
  return r;
}

}  // namespace lfref
