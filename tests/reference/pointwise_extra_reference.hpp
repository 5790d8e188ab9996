// lossfuse test reference: the elementwise losses bce, bce_with_logits, kl_div, poisson_nll, gaussian_nll,
// hinge_embedding and margin_ranking of one element in float64, written from the formulas of
// torch.nn.functional (see docs/semantics.md), independently of src/math.
// Each result also carries a magnitude per output (the sum of the absolute values of the terms it adds), from
// which the tests derive their error budget: a computation in a type with unit roundoff u is within a small
// multiple of u * magnitude.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>

#include "reference/reference.hpp"

namespace lfref {

enum class PwExtraLoss { bce, bce_with_logits, kl_div, poisson_nll, gaussian_nll, hinge_embedding, margin_ranking };

struct PwOpts {
  bool pos_weight = false;  // bce_with_logits: z is pos_weight
  bool log_target = false;  // kl_div
  bool log_input = true;    // poisson_nll
  bool full = false;        // poisson_nll, gaussian_nll
  double eps = 0;           // poisson_nll, gaussian_nll
  double margin = 0;        // hinge_embedding, margin_ranking
};

// Loss l and its derivatives by x (input / input1), y (target / input2) and z (pos_weight, var, ranking target),
// for an upstream gradient of 1 and no weight; m*: magnitudes.
struct PwExtraElem {
  double l = 0, dx = 0, dy = 0, dz = 0;
  double ml = 0, mdx = 0, mdy = 0, mdz = 0;
};

namespace pwdetail {
// log(1 + e^a), exactly enough in double for any a
inline double softplus(double a) { return a > 0 ? a + std::log1p(std::exp(-a)) : std::log1p(std::exp(a)); }
inline double sigmoid(double a) { return a >= 0 ? 1 / (1 + std::exp(-a)) : std::exp(a) / (1 + std::exp(a)); }
}  // namespace pwdetail

inline PwExtraElem pointwise_extra(PwExtraLoss k, const PwOpts& o, double x, double y, double z) {
  using namespace pwdetail;
  PwExtraElem r;
  switch (k) {
    case PwExtraLoss::bce: {
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
    case PwExtraLoss::bce_with_logits: {
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
    case PwExtraLoss::kl_div: {
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
    case PwExtraLoss::poisson_nll: {
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
    case PwExtraLoss::gaussian_nll: {
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
    case PwExtraLoss::hinge_embedding: {
      const double t = o.margin - x;
      const double h = t > 0 || std::isnan(t) ? t : 0.0;  // torch's clamp_min keeps NaN
      r.l = y == 1 ? x : (y == -1 ? h : x + h);
      r.ml = std::fabs(x) + std::fabs(o.margin) + std::fabs(x);
      r.dx = (y != -1 ? 1.0 : 0.0) - ((y != 1 && t > 0) ? 1.0 : 0.0);
      r.mdx = 2;
      r.dy = 0;  // torch gives no target gradient
      break;
    }
    case PwExtraLoss::margin_ranking: {
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
  }
  return r;
}

}  // namespace lfref
