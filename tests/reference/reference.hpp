// lossfuse tests: the float64 scalar reference. Written from the formulas in
// docs/semantics.md (PyTorch is the oracle), never from the library code.
//
// Everything here works on a canonical row-major (rows, C) float64 matrix: row r is the r-th element of the
// target in row-major order, column c the class. The tests gather strided tensors of any dtype into that
// form, so the reference does not know about layouts or dtypes except for the 16-bit rounding helpers.
//
// Besides values, the reference returns an error budget for each output: the absolute error a correct
// implementation that computes in a type with unit roundoff `u` may have, from a first-order error model
// (lse of a row with magnitude M = 1 + |lse| + max|z| may be off by u*K*M with K = 32 + 4 log2 C, which
// allows blocked or pairwise sums and a few-ulp exp/log/tanh; the rest follows by the chain rule).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "lossfuse/loss_kind.hpp"

namespace lfref {

using lossfuse::Reduction;

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
inline constexpr double kInf = std::numeric_limits<double>::infinity();

// ------------------------------------------------------------------------------------------------------------
// Binary floating formats and round-to-nearest-even.

struct FloatFormat {
  int p;     // significand bits including the implicit one
  int emin;  // exponent of the smallest normal
  int emax;  // exponent of the largest finite
};
inline constexpr FloatFormat kBF16{8, -126, 127};
inline constexpr FloatFormat kF16{11, -14, 15};
inline constexpr FloatFormat kF32{24, -126, 127};
inline constexpr FloatFormat kF64{53, -1022, 1023};

inline double max_finite(FloatFormat f) { return std::ldexp(2.0 - std::ldexp(1.0, 1 - f.p), f.emax); }

// Exponent e with 2^e <= |x| < 2^(e+1), clamped below at emin (subnormals share emin's quantum).
inline int exponent_of(double x, FloatFormat f) {
  int k = 0;
  (void)std::frexp(x, &k);  // x = m 2^k, m in [0.5, 1)
  return std::max(k - 1, f.emin);
}

// Round to nearest, ties to even, with gradual underflow and overflow to infinity. Exact for every format
// narrower than double: x / quantum is exact (a power-of-two scaling) and nearbyint rounds ties to even
// under the default rounding mode.
inline double round_to(double x, FloatFormat f) {
  if (!std::isfinite(x) || x == 0.0) return x;
  const double q = std::ldexp(1.0, exponent_of(x, f) - f.p + 1);
  const double r = std::nearbyint(x / q) * q;
  if (std::fabs(r) > max_finite(f)) return std::copysign(kInf, x);
  return r;
}

// Distance between adjacent values of format f around x (the quantum of x's binade).
inline double ulp(double x, FloatFormat f) {
  if (std::isnan(x)) return kNaN;
  if (std::isinf(x)) return kInf;
  return std::ldexp(1.0, exponent_of(x == 0.0 ? std::ldexp(1.0, f.emin) : x, f) - f.p + 1);
}

// float <-> bfloat16 / float16 bit patterns, independent of any hardware or library conversion.
inline std::uint16_t double_to_bf16_bits(double x) {
  if (std::isnan(x)) return static_cast<std::uint16_t>(std::signbit(x) ? 0xFFC0 : 0x7FC0);
  const float r = static_cast<float>(round_to(x, kBF16));  // exact: r is a bfloat16 value
  std::uint32_t u = 0;
  std::memcpy(&u, &r, 4);
  return static_cast<std::uint16_t>(u >> 16);
}
inline double bf16_bits_to_double(std::uint16_t b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f = 0;
  std::memcpy(&f, &u, 4);
  return f;
}
inline std::uint16_t double_to_f16_bits(double x) {
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isnan(x)) return static_cast<std::uint16_t>(sign | 0x7E00);
  const double r = std::fabs(round_to(x, kF16));
  if (std::isinf(r)) return static_cast<std::uint16_t>(sign | 0x7C00);
  if (r == 0.0) return sign;
  int k = 0;
  (void)std::frexp(r, &k);
  const int e = k - 1;
  if (e < -14) {  // subnormal: r = m 2^-24, m in [1, 1023]
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(std::ldexp(r, 24)));
  }
  const auto mant = static_cast<std::uint16_t>(std::ldexp(r, 10 - e) - 1024.0);  // r = (1 + m/1024) 2^e
  return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>((e + 15) << 10) | mant);
}
inline double f16_bits_to_double(std::uint16_t b) {
  const double s = (b & 0x8000) ? -1.0 : 1.0;
  const int e = (b >> 10) & 0x1F;
  const int m = b & 0x3FF;
  if (e == 0) return s * std::ldexp(static_cast<double>(m), -24);
  if (e == 31) return m ? kNaN : s * kInf;
  return s * std::ldexp(1.0 + m / 1024.0, e - 15);
}
inline std::uint16_t float_to_bf16_bits(float f) { return double_to_bf16_bits(f); }
inline std::uint16_t float_to_f16_bits(float f) { return double_to_f16_bits(f); }
inline float bf16_bits_to_float(std::uint16_t b) { return static_cast<float>(bf16_bits_to_double(b)); }
inline float f16_bits_to_float(std::uint16_t b) { return static_cast<float>(f16_bits_to_double(b)); }

// ------------------------------------------------------------------------------------------------------------
// Error-budget helpers.

inline double lse_condition(std::int64_t C) { return 32.0 + 4.0 * std::log2(static_cast<double>(std::max<std::int64_t>(C, 1))); }
inline double sum_condition(std::int64_t n) { return 8.0 + 2.0 * std::log2(static_cast<double>(n) + 1.0); }

// ------------------------------------------------------------------------------------------------------------
// cross_entropy

struct CeInput {
  std::int64_t rows = 0, C = 0;
  std::vector<double> x;            // rows*C logits (as stored, i.e. already rounded to their dtype)
  std::vector<std::int64_t> target; // rows class indices (index targets), or empty
  std::vector<double> soft;         // rows*C probabilities (soft targets), or empty
  std::vector<double> weight;       // C, or empty for all ones
  Reduction reduction = Reduction::mean;
  std::int64_t ignore_index = -100;
  double label_smoothing = 0.0, logit_scale = 1.0, softcap = 0.0, z_loss_scale = 0.0;
  std::vector<double> grad_loss;    // empty: 1; size 1: scalar; size rows: per row (reduction none)
  double u = 0x1p-24;               // unit roundoff of the implementation's compute type (error budget)
};

struct CeResult {
  std::vector<double> lse, lse_tol;              // rows
  std::vector<double> row_loss, row_loss_tol;    // rows: the 'none' output (ignored rows 0)
  std::vector<double> row_z, row_z_tol;          // rows: the z-loss term alone
  double loss = 0, loss_tol = 0, z = 0, z_tol = 0;  // reduced ('mean'/'sum'); for 'none' unused
  double denom = 0;                              // the 'mean' denominator
  std::vector<bool> ignored;                     // rows
  std::vector<double> grad, grad_tol;            // rows*C: d(sum_i g_i loss_i)/dx
};

inline CeResult cross_entropy(const CeInput& in) {
  const std::int64_t R = in.rows, C = in.C;
  const bool soft = !in.soft.empty();
  const double eps = in.label_smoothing, scale = in.logit_scale, cap = in.softcap, zs = in.z_loss_scale;
  const double u = in.u, K = lse_condition(C);
  auto w = [&](std::int64_t c) { return in.weight.empty() ? 1.0 : in.weight[static_cast<std::size_t>(c)]; };
  double wsum = 0, wabs = 0;
  for (std::int64_t c = 0; c < C; ++c) wsum += w(c), wabs += std::fabs(w(c));

  CeResult r;
  r.lse.assign(R, 0); r.lse_tol.assign(R, 0);
  r.row_loss.assign(R, 0); r.row_loss_tol.assign(R, 0);
  r.row_z.assign(R, 0); r.row_z_tol.assign(R, 0);
  r.ignored.assign(R, false);
  r.grad.assign(R * C, 0); r.grad_tol.assign(R * C, 0);

  // Per row: z, dz/dx, lse, loss, and the coefficients of the gradient w.r.t. z:
  //   dloss/dz_c = A s_c - B_c with s = softmax(z).
  std::vector<double> z(C), dz(C), B(C);
  // cls, rest: each row's class term (1 - eps) nll and the rest of its loss (label smoothing, z-loss)
  std::vector<double> A(R, 0), Amag(R, 0), M(R, 0), cls(R, 0), rest(R, 0);
  std::vector<std::int64_t> ys(R, -1);
  std::vector<std::vector<double>> Bs(R), zrows(R), dzrows(R);
  double denom = 0, denom_abs = 0;
  for (std::int64_t i = 0; i < R; ++i) {
    const double* xi = in.x.data() + i * C;
    for (std::int64_t c = 0; c < C; ++c) {
      if (cap > 0) {
        const double t = std::tanh(scale * xi[c] / cap);
        z[c] = cap * t;
        dz[c] = scale * (1.0 - t * t);
      } else {
        z[c] = scale * xi[c];
        dz[c] = scale;
      }
    }
    // Non-finite rule (torch's log_softmax): NaN or +inf anywhere, or every entry -inf, makes the row NaN.
    bool bad = false;
    double m = -kInf, zmax_abs = 0;
    for (std::int64_t c = 0; c < C; ++c) {
      if (std::isnan(z[c]) || z[c] == kInf) bad = true;
      if (z[c] > m) m = z[c];
      if (std::isfinite(z[c])) zmax_abs = std::max(zmax_abs, std::fabs(z[c]));
    }
    if (m == -kInf) bad = true;
    double lse = kNaN;
    if (!bad) {
      double s = 0;
      for (std::int64_t c = 0; c < C; ++c) s += std::exp(z[c] - m);
      lse = m + std::log(s);
    }
    r.lse[i] = lse;
    M[i] = 1.0 + std::fabs(lse) + zmax_abs;
    r.lse_tol[i] = u * K * M[i];

    const bool ign = !soft && in.target[i] == in.ignore_index;
    r.ignored[i] = ign;
    const std::int64_t y = soft || ign ? -1 : in.target[i];
    ys[i] = y;
    if (!ign) denom += soft ? 1.0 : w(y), denom_abs += soft ? 1.0 : std::fabs(w(y));

    // loss = Atot lse - sum_c B_c z_c + zs lse^2, written the way torch evaluates it.
    double loss = 0, atot = 0, babs = 0, bz = 0;
    for (std::int64_t c = 0; c < C; ++c) B[c] = 0;
    if (soft) {
      const double* p = in.soft.data() + i * C;
      for (std::int64_t c = 0; c < C; ++c) {
        const double pc = eps > 0 ? p[c] * (1.0 - eps) + eps / static_cast<double>(C) : p[c];
        B[c] = w(c) * pc;
        loss += B[c] * (lse - z[c]);  // -(w p' log q)
        atot += B[c];
        babs += std::fabs(B[c]);
        if (B[c] != 0) bz += std::fabs(B[c] * z[c]);
      }
    } else if (!ign) {
      const double nll = w(y) * (lse - z[y]);
      cls[i] = (1.0 - eps) * nll;
      B[y] = (1.0 - eps) * w(y);
      atot = (1.0 - eps) * w(y);
      if (eps > 0) {
        double smooth = 0;
        for (std::int64_t c = 0; c < C; ++c) {
          smooth += w(c) * (lse - z[c]);
          B[c] += eps / static_cast<double>(C) * w(c);
        }
        loss = (1.0 - eps) * nll + eps / static_cast<double>(C) * smooth;
        rest[i] = eps / static_cast<double>(C) * smooth;
        atot += eps / static_cast<double>(C) * wsum;
      } else {
        loss = nll;
      }
      for (std::int64_t c = 0; c < C; ++c) {
        babs += std::fabs(B[c]);
        if (B[c] != 0) bz += std::fabs(B[c] * z[c]);
      }
    }
    const double zterm = zs * lse * lse;
    if (!ign) {
      if (soft) rest[i] = loss;
      rest[i] += zterm;
      loss += zterm;
      r.row_loss[i] = loss;
      r.row_z[i] = zterm;
      r.row_loss_tol[i] = u * K * M[i] * (std::fabs(atot) + babs + 2 * zs * std::fabs(lse)) +
                          4 * u * (std::fabs(atot * lse) + bz + zterm);
      r.row_z_tol[i] = u * K * M[i] * 2 * zs * std::fabs(lse) + 4 * u * zterm;
    }
    A[i] = ign ? 0.0 : atot + 2 * zs * lse;
    Amag[i] = ign ? 0.0 : std::fabs(atot) + 2 * zs * (std::fabs(lse) + 1.0);
    Bs[i].assign(B.begin(), B.begin() + C);
    zrows[i].assign(z.begin(), z.begin() + C);
    dzrows[i].assign(dz.begin(), dz.begin() + C);
    (void)babs;
  }
  r.denom = denom;

  // Reductions (torch: mean of an empty or all-ignored batch is 0/0 = nan; sum is 0). torch divides the class
  // term and the rest (its label smoothing term) by the denominator separately: where rows remain but their
  // target weights sum to 0, the mean is 0/0 + s/0 = NaN, not the sum's s/0 = inf.
  double lsum = 0, csum = 0, rsum = 0, zsum = 0, ltol = 0, ztol = 0, labs = 0, zabs = 0;
  for (std::int64_t i = 0; i < R; ++i) {
    lsum += r.row_loss[i], csum += cls[i], rsum += rest[i], zsum += r.row_z[i];
    ltol += r.row_loss_tol[i], ztol += r.row_z_tol[i];
    labs += std::fabs(r.row_loss[i]), zabs += std::fabs(r.row_z[i]);
  }
  const double sc = sum_condition(R);
  if (in.reduction == Reduction::mean) {
    r.loss = csum / denom + rsum / denom;
    r.z = zsum / denom;
    r.loss_tol = (ltol + u * sc * labs) / std::fabs(denom) + u * sc * denom_abs / std::fabs(denom) * std::fabs(r.loss);
    r.z_tol = (ztol + u * sc * zabs) / std::fabs(denom) + u * sc * denom_abs / std::fabs(denom) * std::fabs(r.z);
  } else {
    r.loss = lsum, r.z = zsum;
    r.loss_tol = ltol + u * sc * labs;
    r.z_tol = ztol + u * sc * zabs;
  }

  // Gradient: g_i * (1/denom for mean) * dz/dx * (A s_c - B_c). A NaN row is NaN everywhere (also when
  // ignored: torch's log_softmax backward computes 0 - exp(nan) * 0); an ignored finite row is exactly 0.
  const double tiny = u < 1e-10 ? 0x1p-1000 : 0x1p-120;  // underflow of s_c in the compute type
  for (std::int64_t i = 0; i < R; ++i) {
    double g = 1.0;
    if (in.grad_loss.size() == 1) g = in.grad_loss[0];
    if (in.grad_loss.size() > 1) g = in.grad_loss[static_cast<std::size_t>(i)];
    double f = in.reduction == Reduction::mean ? g / denom : g;
    const double lse = r.lse[i];
    double* gi = r.grad.data() + i * C;
    double* ti = r.grad_tol.data() + i * C;
    if (std::isnan(lse)) {
      for (std::int64_t c = 0; c < C; ++c) gi[c] = kNaN;
      continue;
    }
    if (r.ignored[i]) continue;  // exactly 0
    for (std::int64_t c = 0; c < C; ++c) {
      const double zc = zrows[i][c], dzc = dzrows[i][c], Bc = Bs[i][c];
      const double s = std::exp(zc - lse);
      const double dl = A[i] * s - Bc;
      // the class term's part, (1 - eps) w_y (s - [c = y]), times f on its own as torch does (inf times 0 is NaN)
      const double dcls = ys[i] < 0 ? 0.0 : (1.0 - eps) * w(ys[i]) * (s - (c == ys[i] ? 1.0 : 0.0));
      gi[c] = f * dzc * dcls + f * dzc * (dl - dcls);
      ti[c] = std::fabs(f) * (std::fabs(dzc) * (u * K * M[i] * Amag[i] * s + 4 * u * (Amag[i] * s + std::fabs(Bc)) +
                                                 tiny * (Amag[i] + 1.0)) +
                              8 * u * std::fabs(scale) * std::fabs(dl)) +
              4 * u * std::fabs(gi[c]);
    }
  }
  return r;
}

// ------------------------------------------------------------------------------------------------------------
// nll_loss

struct NllInput {
  std::int64_t rows = 0, C = 0;
  std::vector<double> x;             // rows*C log-probabilities
  std::vector<std::int64_t> target;  // rows
  std::vector<double> weight;        // C or empty
  Reduction reduction = Reduction::mean;
  std::int64_t ignore_index = -100;
  std::vector<double> grad_loss;     // empty: 1; size 1: scalar; size rows: per row
  double u = 0x1p-24;
};

struct NllResult {
  std::vector<double> row_loss, row_loss_tol;
  double loss = 0, loss_tol = 0, denom = 0;
  std::vector<double> grad, grad_tol;  // rows*C
};

inline NllResult nll(const NllInput& in) {
  const std::int64_t R = in.rows, C = in.C;
  const double u = in.u;
  auto w = [&](std::int64_t c) { return in.weight.empty() ? 1.0 : in.weight[static_cast<std::size_t>(c)]; };
  NllResult r;
  r.row_loss.assign(R, 0); r.row_loss_tol.assign(R, 0);
  r.grad.assign(R * C, 0); r.grad_tol.assign(R * C, 0);
  double sum = 0, sabs = 0, denom = 0, dabs = 0;
  for (std::int64_t i = 0; i < R; ++i) {
    const std::int64_t y = in.target[i];
    if (y == in.ignore_index) continue;
    const double l = -w(y) * in.x[i * C + y];
    r.row_loss[i] = l;
    r.row_loss_tol[i] = 2 * u * std::fabs(l);
    sum += l, sabs += std::fabs(l), denom += w(y), dabs += std::fabs(w(y));
  }
  r.denom = denom;
  const double sc = sum_condition(R);
  if (in.reduction == Reduction::mean) {
    r.loss = sum / denom;
    r.loss_tol = u * sc * (sabs + dabs * std::fabs(r.loss)) / std::fabs(denom);
  } else {
    r.loss = sum;
    r.loss_tol = u * sc * sabs;
  }
  for (std::int64_t i = 0; i < R; ++i) {
    const std::int64_t y = in.target[i];
    if (y == in.ignore_index) continue;
    double g = 1.0;
    if (in.grad_loss.size() == 1) g = in.grad_loss[0];
    if (in.grad_loss.size() > 1) g = in.grad_loss[static_cast<std::size_t>(i)];
    const double f = in.reduction == Reduction::mean ? g / denom : g;
    r.grad[i * C + y] = -w(y) * f;
    r.grad_tol[i * C + y] = 4 * u * std::fabs(r.grad[i * C + y]);
  }
  return r;
}

}  // namespace lfref
