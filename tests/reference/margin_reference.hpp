// lossfuse tests: the float64 scalar reference of the margin and embedding losses (triplet_margin,
// cosine_embedding, multi_margin, multilabel_margin, multilabel_soft_margin). Written from the formulas in
// docs/semantics.md and torch.nn.functional's definitions (checked against
// torch 2.15 on the CPU), never from the library code.
//
// Every input is a canonical row-major (rows, D) float64 matrix (D the last dim), targets are per row or per
// element. Besides values, each output carries an error budget: the absolute error a correct implementation
// computing in a type with unit roundoff u may have (running sums of D terms: ~D u of the sum of absolute
// terms; each elementwise step a few u), plus, where a hinge / swap / sign decision is within that budget of
// its threshold, the full jump the other decision would make.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "lossfuse/loss_kind.hpp"
#include "reference/reference.hpp"

namespace lfref {

struct MarginResult {
  std::vector<double> rows, rows_tol;        // per-row losses
  double loss = 0, loss_tol = 0;             // the reduction (mean/sum); rows for none
  std::vector<double> grad[3], grad_tol[3];  // (rows, D) each; empty when the loss has no such input
};

struct MarginCommon {
  std::int64_t rows = 0, D = 0;
  lossfuse::Reduction reduction = lossfuse::Reduction::mean;
  double u = 0x1p-53;            // unit roundoff of the computation
  std::vector<double> upstream;  // none: one per row (empty: 1); mean/sum: one value (empty: 1)
};

inline double upstream_of(const MarginCommon& c, std::int64_t r) {
  if (c.reduction == lossfuse::Reduction::none) return c.upstream.empty() ? 1.0 : c.upstream[r];
  const double g = c.upstream.empty() ? 1.0 : c.upstream[0];
  return c.reduction == lossfuse::Reduction::mean ? g / static_cast<double>(c.rows) : g;
}

inline void finish_reduction(const MarginCommon& c, MarginResult& res) {
  if (c.reduction == lossfuse::Reduction::none) return;
  double s = 0, t = 0, a = 0;
  for (std::size_t r = 0; r < res.rows.size(); ++r) s += res.rows[r], t += res.rows_tol[r], a += std::fabs(res.rows[r]);
  t += sum_condition(c.rows) * c.u * a;
  if (c.reduction == lossfuse::Reduction::mean) {
    // mean of nothing: 0/0 = nan (PyTorch's rule)
    s /= static_cast<double>(c.rows);
    t /= static_cast<double>(c.rows);
  }
  res.loss = s;
  res.loss_tol = std::isfinite(t) ? t : 0.0;
}

// ---- triplet_margin_loss --------------------------------------------------------------------------------------
// d(u, v) = ||u - v + eps||_p; loss = max(0, margin + d(a,p) - d_neg), d_neg = d(a,n) or min(d(a,n), d(p,n)).

struct TripletInput {
  MarginCommon c;
  std::vector<double> a, p, n;
  double margin = 1, pnorm = 2, eps = 1e-6;
  bool swap = false;
};

inline double pnorm_of(const std::vector<double>& v, double p) {
  if (p == 0) {
    double k = 0;
    for (double x : v) k += x != 0 ? 1 : 0;
    return k;
  }
  if (std::isinf(p)) {
    double m = 0;
    for (double x : v) {
      if (std::isnan(x)) return x;
      m = std::max(m, std::fabs(x));
    }
    return m;
  }
  double s = 0;
  for (double x : v) s += std::pow(std::fabs(x), p);
  return std::pow(s, 1.0 / p);
}

// Gradient of ||v||_p at every element (torch's norm_backward): sgn(v) (|v|/d)^(p-1), 0 for a zero norm or
// (p != 1) a zero element, 0 for p = 0, and for p = inf sgn(v) / (number of elements attaining the max).
inline std::vector<double> pnorm_grad(const std::vector<double>& v, double d, double p) {
  std::vector<double> g(v.size(), 0.0);
  if (p == 0) return g;
  if (std::isinf(p)) {
    double cnt = 0;
    for (double x : v) cnt += std::fabs(x) == d ? 1 : 0;
    for (std::size_t i = 0; i < v.size(); ++i)
      if (std::fabs(v[i]) == d) g[i] = (v[i] > 0 ? 1 : v[i] < 0 ? -1 : 0) / cnt;
    return g;
  }
  for (std::size_t i = 0; i < v.size(); ++i) {
    const double s = v[i] > 0 ? 1 : v[i] < 0 ? -1 : 0;
    if (p == 1)
      g[i] = s;
    else if (d == 0 || v[i] == 0)
      g[i] = 0;
    else
      g[i] = s * std::pow(std::fabs(v[i]) / d, p - 1);
  }
  return g;
}

inline MarginResult triplet_margin(const TripletInput& in) {
  const auto& c = in.c;
  const std::int64_t R = c.rows, D = c.D;
  const double u = c.u, p = in.pnorm;
  MarginResult res;
  res.rows.assign(R, 0), res.rows_tol.assign(R, 0);
  for (auto& g : res.grad) g.assign(R * D, 0.0);
  for (auto& g : res.grad_tol) g.assign(R * D, 0.0);
  for (std::int64_t r = 0; r < R; ++r) {
    std::vector<double> v[3], m[3];  // differences ap, an, pn and their element error scales
    const std::vector<double>* pairs[3][2] = {{&in.a, &in.p}, {&in.a, &in.n}, {&in.p, &in.n}};
    double d[3], td[3];
    for (int k = 0; k < 3; ++k) {
      v[k].resize(D), m[k].resize(D);
      for (std::int64_t j = 0; j < D; ++j) {
        const double x = (*pairs[k][0])[r * D + j], y = (*pairs[k][1])[r * D + j];
        v[k][j] = x - y + in.eps;
        m[k][j] = std::fabs(x) + std::fabs(y) + std::fabs(in.eps);
      }
      d[k] = pnorm_of(v[k], p);
      const double pe = (p == 0 || std::isinf(p)) ? 1.0 : p;
      td[k] = p == 0 ? 0.0 : (2.0 * static_cast<double>(D) + 16.0) * (pe + 1.0) * u * pnorm_of(m[k], p);
    }
    const bool use_pn = in.swap && d[2] < d[1];
    const bool tie = in.swap && d[2] == d[1];
    const double dneg = in.swap ? std::min(d[1], d[2]) : d[1];
    const double tneg = in.swap ? std::max(td[1], td[2]) : td[1];
    const double z = in.margin + d[0] - dneg;
    res.rows[r] = z > 0 ? z : 0;
    res.rows_tol[r] = td[0] + tneg + 4 * u * (std::fabs(in.margin) + d[0] + dneg);
    // gradient
    const double k = z > 0 ? upstream_of(c, r) : 0.0;
    const double w_an = !in.swap ? 1 : tie ? 0.5 : use_pn ? 0 : 1;
    const double w_pn = !in.swap ? 0 : tie ? 0.5 : use_pn ? 1 : 0;
    std::vector<double> ng[3], tg[3];
    for (int q = 0; q < 3; ++q) {
      ng[q] = pnorm_grad(v[q], d[q], p);
      tg[q].assign(D, 0.0);
      for (std::int64_t j = 0; j < D; ++j) {
        const double dv = 2 * u * m[q][j];
        const double av = std::fabs(v[q][j]);
        double t = 0;
        if (p == 1)
          t = av <= 4 * dv ? 2.0 : 0.0;
        else if (p == 0)
          t = 0;
        else if (std::isinf(p))
          t = 4 * u;
        else if (d[q] > 0 && av > 4 * dv) {
          t = std::fabs(ng[q][j]) * ((std::fabs(p - 1) + 1) * (dv / av + td[q] / d[q]) + 16 * u);
        } else if (d[q] > 0) {
          t = std::fabs(ng[q][j]) + std::pow((av + 4 * dv) / d[q], std::max(p - 1, 0.0)) + 16 * u;
        }
        tg[q][j] = t;
      }
    }
    // a hinge or swap decision within the budget of its threshold: either side is right
    const double up = std::fabs(upstream_of(c, r));
    const bool ambiguous =
        std::fabs(z) <= 2 * res.rows_tol[r] || (in.swap && std::fabs(d[1] - d[2]) <= 2 * (td[1] + td[2]) && z > 0);
    for (std::int64_t j = 0; j < D; ++j) {
      const double ga = k * (ng[0][j] - w_an * ng[1][j]);
      const double gp = k * (-ng[0][j] - w_pn * ng[2][j]);
      const double gn = k * (w_an * ng[1][j] + w_pn * ng[2][j]);
      res.grad[0][r * D + j] = ga, res.grad[1][r * D + j] = gp, res.grad[2][r * D + j] = gn;
      const double ta = std::fabs(k) * (tg[0][j] + w_an * tg[1][j]) + 4 * u * std::fabs(ga);
      const double tp = std::fabs(k) * (tg[0][j] + w_pn * tg[2][j]) + 4 * u * std::fabs(gp);
      const double tn = std::fabs(k) * (w_an * tg[1][j] + w_pn * tg[2][j]) + 4 * u * std::fabs(gn);
      const double big = ambiguous ? 2 * up * (std::fabs(ng[0][j]) + std::fabs(ng[1][j]) + std::fabs(ng[2][j]) + 1) : 0;
      res.grad_tol[0][r * D + j] = ta + big;
      res.grad_tol[1][r * D + j] = tp + big;
      res.grad_tol[2][r * D + j] = tn + big;
    }
  }
  finish_reduction(c, res);
  return res;
}

// ---- cosine_embedding_loss ------------------------------------------------------------------------------------
// cos = s12 / sqrt((s11 + E)(s22 + E)), E = float(1e-12) (ATen's EPSILON is a float);
// y = 1: 1 - cos; y = -1: max(0, cos - margin); else 0.

struct CosineInput {
  MarginCommon c;
  std::vector<double> x1, x2, y;  // y per row
  double margin = 0;
};

inline MarginResult cosine_embedding(const CosineInput& in) {
  const auto& c = in.c;
  const std::int64_t R = c.rows, D = c.D;
  const double u = c.u, E = static_cast<double>(1e-12f);  // ATen's `constexpr float EPSILON = 1e-12`
  MarginResult res;
  res.rows.assign(R, 0), res.rows_tol.assign(R, 0);
  for (int q = 0; q < 2; ++q) res.grad[q].assign(R * D, 0), res.grad_tol[q].assign(R * D, 0);
  for (std::int64_t r = 0; r < R; ++r) {
    double s12 = 0, s11 = 0, s22 = 0, a12 = 0;
    for (std::int64_t j = 0; j < D; ++j) {
      const double a = in.x1[r * D + j], b = in.x2[r * D + j];
      s12 += a * b, s11 += a * a, s22 += b * b, a12 += std::fabs(a * b);
    }
    const double m1 = s11 + E, m2 = s22 + E, den = std::sqrt(m1 * m2), cos = s12 / den;
    const double rel = (static_cast<double>(D) + 16) * 2 * u;
    const double tcos = rel * (a12 / den + std::fabs(cos)) + 4 * u * std::fabs(cos);
    const double y = in.y[r];
    double loss = 0, dl = 0;
    if (y == 1)
      loss = 1 - cos, dl = -1;
    else if (y == -1)
      loss = cos - in.margin > 0 ? cos - in.margin : 0, dl = cos - in.margin > 0 ? 1 : 0;
    res.rows[r] = loss;
    res.rows_tol[r] = (y == 1 || y == -1) ? tcos + 2 * u * (1 + std::fabs(cos) + std::fabs(in.margin)) : 0;
    const double k = dl * upstream_of(c, r);
    const bool ambiguous = y == -1 && std::fabs(cos - in.margin) <= 2 * res.rows_tol[r];
    const double up = std::fabs(upstream_of(c, r));
    for (std::int64_t j = 0; j < D; ++j) {
      const double a = in.x1[r * D + j], b = in.x2[r * D + j];
      const double t1 = b / den - cos * a / m1, t2 = a / den - cos * b / m2;
      res.grad[0][r * D + j] = k * t1;
      res.grad[1][r * D + j] = k * t2;
      const double e1 = rel * (std::fabs(b) / den + std::fabs(cos * a) / m1) + tcos * std::fabs(a) / m1;
      const double e2 = rel * (std::fabs(a) / den + std::fabs(cos * b) / m2) + tcos * std::fabs(b) / m2;
      res.grad_tol[0][r * D + j] = std::fabs(k) * e1 + (ambiguous ? up * (std::fabs(t1) + e1) : 0);
      res.grad_tol[1][r * D + j] = std::fabs(k) * e2 + (ambiguous ? up * (std::fabs(t2) + e2) : 0);
    }
  }
  finish_reduction(c, res);
  return res;
}

// ---- multi_margin_loss ----------------------------------------------------------------------------------------
// loss = sum_{j != y} w_y max(0, margin - x_y + x_j)^p / C.

struct MultiMarginInput {
  MarginCommon c;
  std::vector<double> x;
  std::vector<std::int64_t> y;  // per row
  std::vector<double> weight;   // (C) or empty
  double margin = 1;
  int p = 1;
};

inline MarginResult multi_margin(const MultiMarginInput& in) {
  const auto& c = in.c;
  const std::int64_t R = c.rows, C = c.D;
  const double u = c.u;
  MarginResult res;
  res.rows.assign(R, 0), res.rows_tol.assign(R, 0);
  res.grad[0].assign(R * C, 0), res.grad_tol[0].assign(R * C, 0);
  for (std::int64_t r = 0; r < R; ++r) {
    const std::int64_t y = in.y[r];
    const double xy = in.x[r * C + y], wy = in.weight.empty() ? 1.0 : in.weight[y];
    const double k = upstream_of(c, r), ak = std::fabs(k);
    double sum = 0, asum = 0, tsum = 0, hsum = 0, habs = 0, htol = 0;
    for (std::int64_t j = 0; j < C; ++j) {
      if (j == y) continue;
      const double z = in.margin - xy + in.x[r * C + j];
      const double dz = 3 * u * (std::fabs(in.margin) + std::fabs(xy) + std::fabs(in.x[r * C + j]));
      const double term = z > 0 ? (in.p == 2 ? z * z : z) * wy : 0.0;
      sum += term, asum += std::fabs(term);
      tsum += std::fabs(wy) * (in.p == 2 ? 2 * (std::fabs(z) + dz) * dz : dz) * (std::fabs(z) <= dz || z > 0 ? 1 : 0);
      const double slope = z > 0 ? (in.p == 2 ? 2 * z : 1.0) : 0.0;
      const double h = k * wy * slope / static_cast<double>(C);
      double th = ak * std::fabs(wy) / static_cast<double>(C) * (in.p == 2 ? 2 * dz : 0.0) + 4 * u * std::fabs(h);
      if (std::fabs(z) <= dz)
        th += ak * std::fabs(wy) / static_cast<double>(C) * (in.p == 2 ? 2 * (std::fabs(z) + dz) : 1.0);
      res.grad[0][r * C + j] = h, res.grad_tol[0][r * C + j] = th;
      hsum += h, habs += std::fabs(h), htol += th;
    }
    res.rows[r] = sum / static_cast<double>(C);
    res.rows_tol[r] = (tsum + (static_cast<double>(C) + 8) * u * asum) / static_cast<double>(C);
    res.grad[0][r * C + y] = -hsum;
    res.grad_tol[0][r * C + y] = htol + (static_cast<double>(C) + 8) * u * habs;
  }
  finish_reduction(c, res);
  return res;
}

// ---- multilabel_margin_loss -----------------------------------------------------------------------------------
// labels: the target row up to the first -1 (duplicates count again);
// loss = sum_{j in labels} sum_{i not a label} max(0, 1 - x_j + x_i) / C.

struct MultilabelMarginInput {
  MarginCommon c;
  std::vector<double> x;
  std::vector<std::int64_t> target;  // (rows, C)
};

inline MarginResult multilabel_margin(const MultilabelMarginInput& in) {
  const auto& c = in.c;
  const std::int64_t R = c.rows, C = c.D;
  const double u = c.u, Cd = static_cast<double>(C);
  MarginResult res;
  res.rows.assign(R, 0), res.rows_tol.assign(R, 0);
  res.grad[0].assign(R * C, 0), res.grad_tol[0].assign(R * C, 0);
  for (std::int64_t r = 0; r < R; ++r) {
    std::vector<std::int64_t> labels;
    std::vector<bool> is_label(C, false);
    for (std::int64_t j = 0; j < C; ++j) {
      const std::int64_t t = in.target[r * C + j];
      if (t == -1) break;
      labels.push_back(t);
      is_label[t] = true;
    }
    const double k = upstream_of(c, r), ak = std::fabs(k);
    double sum = 0, asum = 0, tsum = 0;
    std::vector<double> cnt(C, 0.0), amb(C, 0.0);
    for (std::int64_t j : labels) {
      const double xj = in.x[r * C + j];
      for (std::int64_t i = 0; i < C; ++i) {
        if (is_label[i]) continue;
        const double z = 1 - xj + in.x[r * C + i];
        const double dz = 3 * u * (1 + std::fabs(xj) + std::fabs(in.x[r * C + i]));
        if (z > 0) sum += z, asum += z, cnt[i] += 1, cnt[j] -= 1;
        if (z > 0 || std::fabs(z) <= dz) tsum += dz;
        if (std::fabs(z) <= dz) amb[i] += 1, amb[j] += 1;
      }
    }
    res.rows[r] = sum / Cd;
    res.rows_tol[r] = (tsum + (static_cast<double>(labels.size() * C) + 8) * u * asum) / Cd;
    for (std::int64_t i = 0; i < C; ++i) {
      const double g = k * cnt[i] / Cd;
      res.grad[0][r * C + i] = g;
      // the kernel adds g/C once per pair: (pairs + 4) u of the largest partial
      const double pairs = static_cast<double>(labels.size()) + static_cast<double>(C);
      res.grad_tol[0][r * C + i] = ak * amb[i] / Cd + (pairs + 4) * u * ak * pairs / Cd;
    }
  }
  finish_reduction(c, res);
  return res;
}

// ---- multilabel_soft_margin_loss ------------------------------------------------------------------------------
// loss = -(1/C) sum_c w_c [y log sigmoid(x) + (1 - y) log sigmoid(-x)];
// d/dx = w (sigmoid(x) - y) / C, d/dy = -w x / C.

struct SoftMarginInput {
  MarginCommon c;
  std::vector<double> x, y;    // (rows, C)
  std::vector<double> weight;  // (C) or empty
};

inline double ref_log_sigmoid(double x) { return std::min(x, 0.0) - std::log1p(std::exp(-std::fabs(x))); }
inline double ref_sigmoid(double x) { return x >= 0 ? 1 / (1 + std::exp(-x)) : std::exp(x) / (1 + std::exp(x)); }

inline MarginResult multilabel_soft_margin(const SoftMarginInput& in) {
  const auto& c = in.c;
  const std::int64_t R = c.rows, C = c.D;
  const double u = c.u, Cd = static_cast<double>(C);
  MarginResult res;
  res.rows.assign(R, 0), res.rows_tol.assign(R, 0);
  for (int q = 0; q < 2; ++q) res.grad[q].assign(R * C, 0), res.grad_tol[q].assign(R * C, 0);
  const double tiny = u == 0x1p-53 ? 0x1p-1022 : 0x1p-126;
  double max_w = 1;
  for (double w : in.weight) max_w = std::max(max_w, std::fabs(w));
  for (std::int64_t r = 0; r < R; ++r) {
    const double k = upstream_of(c, r) / Cd;
    double sum = 0, asum = 0;
    for (std::int64_t j = 0; j < C; ++j) {
      const double x = in.x[r * C + j], y = in.y[r * C + j], w = in.weight.empty() ? 1.0 : in.weight[j];
      const double lp = ref_log_sigmoid(x), ln = ref_log_sigmoid(-x);
      sum += -w * (y * lp + (1 - y) * ln);
      asum += std::fabs(w) * (std::fabs(y * lp) + std::fabs((1 - y) * ln));
      const double s = ref_sigmoid(x);
      res.grad[0][r * C + j] = k * w * (s - y);
      // + the smallest normal: a vectorized exp may flush results below it (sigmoid(-100) in float32) to 0
      res.grad_tol[0][r * C + j] = 8 * u * std::fabs(k * w) * (s + std::fabs(y)) + std::fabs(k * w) * tiny;
      res.grad[1][r * C + j] = -k * w * x;
      res.grad_tol[1][r * C + j] = 4 * u * std::fabs(k * w * x);
    }
    res.rows[r] = sum / Cd;  // C = 0: nan
    res.rows_tol[r] = (static_cast<double>(C) + 16) * 2 * u * asum / Cd + 2 * max_w * tiny;
    if (!std::isfinite(res.rows_tol[r])) res.rows_tol[r] = 0;
  }
  finish_reduction(c, res);
  return res;
}

}  // namespace lfref
