// The evaluations of tests/cuda/device_math_test.cu: functors over an index i that run the shared math of src/math
// for one element, row or sequence, the same code on a CUDA device (one thread per i) and on the host. Included
// by the test (nvcc) and by device_math_reference.cpp (the host compiler alone), which instantiates them in long
// double for the reference of the double checks.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "math/ctc_math.hpp"
#include "math/half.hpp"
#include "math/margin_math.hpp"
#include "math/pointwise_math.hpp"
#include "math/vocab_tile_math.hpp"

namespace lossfuse::device_test {

namespace lm = lossfuse::math;

template <class F>
void run_host(const F& f, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) f(i);
}

template <class Loss, class Acc>
struct PointwiseEval {
  const Acc *x, *y, *z, *g;
  Acc a, b;
  Acc *loss, *dx, *dy, *dz;
  LF_HOST_DEVICE void operator()(std::int64_t i) const {
    const lm::ScalarOps<Acc> o;
    lm::PwConsts<Acc> k;
    k.a = a;
    k.b = b;
    loss[i] = Loss::value(o, k, x[i], y[i], z[i]);
    Acc gx = 0, gy = 0, gz = 0;
    Loss::grad(o, k, x[i], y[i], z[i], g[i], gx, gy, gz);
    dx[i] = gx;
    dy[i] = gy;
    dz[i] = gz;
  }
};

// One row per i: forward over the tiles of a row of raw logits (online log-sum-exp), then the gradient of every
// logit of the row. Index targets, optional label smoothing (unweighted), z-loss and soft-cap.
template <class Acc>
struct CeTileRowEval {
  const Acc* x;
  std::int64_t C, tile;
  const std::int64_t* y;
  Acc scale, softcap, eps, zls;
  Acc *loss, *lse, *grad;
  template <bool kCap>
  LF_HOST_DEVICE void row(std::int64_t r) const {
    lm::LogitTransform<Acc> xf;
    xf.scale = scale;
    xf.softcap = softcap;
    xf.inv_softcap = softcap > 0 ? Acc(1) / softcap : Acc(0);
    lm::CeRowParams<Acc> p;
    p.eps = eps;
    p.eps_over_c = eps / static_cast<Acc>(C);
    p.sum_w = static_cast<Acc>(C);
    p.z_loss_scale = zls;
    lm::TileRowState<Acc> st;
    const Acc* xr = x + r * C;
    for (std::int64_t v0 = 0; v0 < C; v0 += tile) {
      const std::int64_t v1 = v0 + tile < C ? v0 + tile : C;
      Acc m = lm::neg_inf<Acc>();
      for (std::int64_t c = v0; c < v1; ++c) {
        const Acc z = xf.template apply_as<kCap>(xr[c]);
        m = z > m ? z : m;
      }
      const Acc sh = lm::tile_shift(m);
      if (v0 == 0) st.ref = sh;
      Acc s = 0;
      double swz = 0;
      for (std::int64_t c = v0; c < v1; ++c) {
        const Acc z = xf.template apply_as<kCap>(xr[c]);
        s += std::exp(z - sh);
        if (eps != Acc(0)) swz += static_cast<double>(z - st.ref);
        if (c == y[r]) st.z_y = z;
      }
      lm::tile_fold(st, m, s, swz);
    }
    const lm::CeRowResult<Acc> res = lm::tile_row_finish(p, st, y[r] < 0, Acc(1));
    loss[r] = res.loss;
    lse[r] = res.lse;
    const lm::CeGradCoefs<Acc> k = lm::ce_index_grad_coefs(p, res.lse, Acc(1), Acc(1), true);
    for (std::int64_t c = 0; c < C; ++c) {
      const Acc z = xf.template apply_as<kCap>(xr[c]);
      grad[r * C + c] = lm::ce_index_grad_z(k, z, res.lse, Acc(1), c == y[r]) * xf.template derivative_from_z<kCap>(z);
    }
  }
  LF_HOST_DEVICE void operator()(std::int64_t r) const {
    if (softcap > 0)
      row<true>(r);
    else
      row<false>(r);
  }
};

// One sequence per i: log_probs (T, C) of that sequence, labels (S), alpha and beta over l' (T, 2S+1) in
// workspace, then the gradient (T, C) by ctc_grad.
template <class Acc>
struct CtcEval {
  const Acc* lp;
  const std::int64_t* labels;  // (N, S)
  std::int64_t T, C, S;
  std::int64_t* ext;  // (N, 2S+1) workspace: l'
  Acc *alpha, *beta;  // (N, T, 2S+1) workspace
  Acc *nll, *grad;    // (N), (N, T, C)
  LF_HOST_DEVICE void operator()(std::int64_t n) const {
    const std::int64_t L = 2 * S + 1;
    const Acc* lpn = lp + n * T * C;
    std::int64_t* l = ext + n * L;
    for (std::int64_t s = 0; s < L; ++s) l[s] = (s % 2 == 0) ? 0 : labels[n * S + s / 2];  // blank = 0
    Acc* a = alpha + n * T * L;
    Acc* b = beta + n * T * L;
    for (std::int64_t s = 0; s < L; ++s) a[s] = s < 2 ? lpn[l[s]] : lm::neg_inf<Acc>();
    for (std::int64_t t = 1; t < T; ++t)
      for (std::int64_t s = 0; s < L; ++s) a[t * L + s] = lm::ctc_alpha_step(a + (t - 1) * L, l, s, lpn[t * C + l[s]]);
    for (std::int64_t s = 0; s < L; ++s) b[(T - 1) * L + s] = s >= L - 2 ? lpn[(T - 1) * C + l[s]] : lm::neg_inf<Acc>();
    for (std::int64_t t = T - 2; t >= 0; --t)
      for (std::int64_t s = 0; s < L; ++s)
        b[t * L + s] = lm::ctc_beta_step(b + (t + 1) * L, l, s, L, lpn[t * C + l[s]]);
    const Acc nl = -lm::log_add2(a[(T - 1) * L + L - 1], a[(T - 1) * L + L - 2]);
    nll[n] = nl;
    for (std::int64_t t = 0; t < T; ++t) {
      for (std::int64_t c = 0; c < C; ++c) {
        Acc occ = lm::neg_inf<Acc>();
        for (std::int64_t s = 0; s < L; ++s)
          if (l[s] == c) occ = lm::log_add2(occ, a[t * L + s] + b[t * L + s]);
        grad[(n * T + t) * C + c] = lm::ctc_grad(lpn[t * C + c], occ, nl);
      }
    }
  }
};

template <class Acc, lm::NormKind K>
LF_HOST_DEVICE Acc triplet_row(const Acc* a, const Acc* p, const Acc* n, std::int64_t D, Acc pw, Acc eps, bool swap,
                               Acc* ga) {
  Acc s1 = 0, s2 = 0, s3 = 0;
  for (std::int64_t c = 0; c < D; ++c) {
    s1 = lm::norm_accumulate<K>(s1, a[c] - p[c] + eps, pw);
    s2 = lm::norm_accumulate<K>(s2, a[c] - n[c] + eps, pw);
    s3 = lm::norm_accumulate<K>(s3, p[c] - n[c] + eps, pw);
  }
  const Acc d1 = lm::norm_finish<K>(s1, pw), d2 = lm::norm_finish<K>(s2, pw), d3 = lm::norm_finish<K>(s3, pw);
  const lm::SwapWeights<Acc> sw = lm::triplet_swap_weights(swap, d2, d3);
  for (std::int64_t c = 0; c < D; ++c)
    ga[c] = lm::norm_grad<K>(a[c] - p[c] + eps, d1, pw, std::fabs(a[c] - p[c] + eps) == d1) -
            sw.an * lm::norm_grad<K>(a[c] - n[c] + eps, d2, pw, std::fabs(a[c] - n[c] + eps) == d2);
  return lm::triplet_loss(Acc(1), d1, swap && d3 < d2 ? d3 : d2);
}

template <class Acc>
struct TripletEval {
  const Acc *a, *p, *n;
  std::int64_t D;
  double pnorm;
  bool swap;
  Acc *loss, *grad;
  LF_HOST_DEVICE void operator()(std::int64_t r) const {
    const Acc pw = static_cast<Acc>(pnorm);
    const Acc* ar = a + r * D;
    const Acc* pr = p + r * D;
    const Acc* nr = n + r * D;
    Acc* g = grad + r * D;
    const Acc e = Acc(1e-6);
    switch (lm::norm_kind(pnorm)) {
      case lm::NormKind::zero: loss[r] = triplet_row<Acc, lm::NormKind::zero>(ar, pr, nr, D, pw, e, swap, g); break;
      case lm::NormKind::one: loss[r] = triplet_row<Acc, lm::NormKind::one>(ar, pr, nr, D, pw, e, swap, g); break;
      case lm::NormKind::two: loss[r] = triplet_row<Acc, lm::NormKind::two>(ar, pr, nr, D, pw, e, swap, g); break;
      case lm::NormKind::inf: loss[r] = triplet_row<Acc, lm::NormKind::inf>(ar, pr, nr, D, pw, e, swap, g); break;
      case lm::NormKind::general:
        loss[r] = triplet_row<Acc, lm::NormKind::general>(ar, pr, nr, D, pw, e, swap, g);
        break;
    }
  }
};

// Functors with their operands and results as arrays of pointers (In inputs, Out outputs), run by one generic
// runner (io_run in the test, reference_io for long double): the row formulas of cross_entropy_math.hpp and the
// cosine / hinge / soft-margin pieces of margin_math.hpp.
template <class Acc, int In, int Out>
struct Io {
  const Acc* in[In];
  Acc* out[Out];
};

// Whole cross-entropy rows through RowSums (the non-tiled kernels' formulas): per row, z = x (no transform), the
// online log-sum-exp element by element, then with probability targets p (in[1]) and class weights w (in[2]):
// out[0] the soft-target loss + z-loss, out[1] the index-target loss (target argmax of p) + z-loss, out[2] / out[3]
// the gradients of both (N x C).
template <class Acc>
struct CeRowSumsEval {
  Io<Acc, 3, 4> io;
  std::int64_t C;
  Acc eps, zls;
  LF_HOST_DEVICE void operator()(std::int64_t r) const {
    const Acc* x = io.in[0] + r * C;
    const Acc* pt = io.in[1] + r * C;
    const Acc* w = io.in[2];
    lm::CeRowParams<Acc> p;
    p.eps = eps;
    p.eps_over_c = eps / static_cast<Acc>(C);
    p.z_loss_scale = zls;
    lm::LseState<Acc> st;
    std::int64_t y = 0;
    for (std::int64_t c = 0; c < C; ++c) {
      st = lm::lse_combine(st, lm::LseState<Acc>{x[c], Acc(1)});
      p.sum_w += w[c];
      if (pt[c] > pt[y]) y = c;
    }
    lm::RowSums<Acc> rs{st.m, lm::lse_finalize(st), Acc(0), Acc(0), Acc(0), st.m, std::log(st.s)};
    for (std::int64_t c = 0; c < C; ++c) {
      rs.sum_wz += w[c] * (x[c] - rs.m);
      rs.sum_wp += w[c] * pt[c];
      rs.sum_wpz += w[c] * pt[c] * (x[c] - rs.m);
    }
    const Acc zl = lm::z_loss_row(p, rs.lse);
    io.out[0][r] = lm::ce_soft_row_loss(p, rs) + zl;
    io.out[1][r] = lm::ce_index_row_loss(p, rs, w[y], x[y]) + zl;
    const Acc a_soft = lm::ce_soft_grad_a(p, rs), a_index = lm::ce_index_grad_a(p, rs.lse, w[y]);
    for (std::int64_t c = 0; c < C; ++c) {
      const Acc q = std::exp(x[c] - rs.lse);
      io.out[2][r * C + c] = q * a_soft - w[c] * ((Acc(1) - eps) * pt[c] + p.eps_over_c);
      io.out[3][r * C + c] = q * a_index - w[c] * p.eps_over_c - (c == y ? (Acc(1) - eps) * w[y] : Acc(0));
    }
  }
};

// Cosine-embedding rows (D wide): out[0] the loss for the row's target (in[2][r]: 1, -1 or 0), out[1] / out[2] the
// gradients of x1 and x2.
template <class Acc>
struct CosineEval {
  Io<Acc, 3, 3> io;
  std::int64_t D;
  Acc margin;
  LF_HOST_DEVICE void operator()(std::int64_t r) const {
    const Acc* a = io.in[0] + r * D;
    const Acc* b = io.in[1] + r * D;
    const double y = static_cast<double>(io.in[2][r]);
    Acc s12 = 0, s11 = 0, s22 = 0;
    for (std::int64_t c = 0; c < D; ++c) s12 += a[c] * b[c], s11 += a[c] * a[c], s22 += b[c] * b[c];
    const lm::CosineRow<Acc> cr = lm::cosine_row(s12, s11, s22);
    io.out[0][r] = lm::cosine_loss(cr.cos, margin, y);
    const Acc k = lm::cosine_dloss_dcos(cr.cos, margin, y);
    for (std::int64_t c = 0; c < D; ++c) {
      io.out[1][r * D + c] = k * (b[c] * cr.inv_den - a[c] * cr.cos_m1);
      io.out[2][r * D + c] = k * (a[c] * cr.inv_den - b[c] * cr.cos_m2);
    }
  }
};

// Per element, operands a, b, t (in[0..2]; t in [0, 1]): the hinge terms of z = hinge_z(1, a, b) for p = 1, 2
// (out[0..3]: values, slopes), the soft-margin term with target t and weight b, its d/dx and d/dy (out[4..6]),
// log_sigmoid(a) and sigmoid(a) (out[7], out[8]).
template <class Acc>
struct MarginTermsEval {
  Io<Acc, 3, 9> io;
  LF_HOST_DEVICE void operator()(std::int64_t i) const {
    const Acc a = io.in[0][i], b = io.in[1][i], t = io.in[2][i];
    const Acc z = lm::hinge_z(Acc(1), a, b);
    io.out[0][i] = lm::hinge_value(z, 1);
    io.out[1][i] = lm::hinge_value(z, 2);
    io.out[2][i] = lm::hinge_slope(z, 1);
    io.out[3][i] = lm::hinge_slope(z, 2);
    io.out[4][i] = lm::soft_margin_term(a, t, b);
    io.out[5][i] = lm::soft_margin_dx(a, t, b);
    io.out[6][i] = lm::soft_margin_dy(a, b);
    io.out[7][i] = lm::log_sigmoid(a);
    io.out[8][i] = lm::sigmoid(a);
  }
};

// Runs f over [0, n) on the host with its pointers set to `in` and to fresh outputs of the given sizes.
template <class F, class Acc, int In, int Out>
std::array<std::vector<Acc>, Out> host_io(F f, const std::array<std::vector<Acc>, In>& in,
                                          const std::array<std::size_t, Out>& out_sizes, std::int64_t n) {
  std::array<std::vector<Acc>, Out> out;
  for (int k = 0; k < In; ++k) f.io.in[k] = in[k].data();
  for (int k = 0; k < Out; ++k) {
    out[k].assign(out_sizes[k], Acc(0));
    f.io.out[k] = out[k].data();
  }
  run_host(f, n);
  return out;
}

// The elementwise losses the test checks (X is applied to each type).
#define LF_DEVICE_TEST_LOSSES(X)                                                                                   \
  X(lm::MseLoss)                                                                                                   \
  X(lm::L1Loss)                                                                                                    \
  X(lm::SmoothL1Loss)                                                                                              \
  X(lm::HuberLoss) X(lm::BceLoss) X(lm::BceWithLogitsLoss<false>) X(lm::BceWithLogitsLoss<true>)                   \
      X(lm::KlDivLoss<false>) X(lm::KlDivLoss<true>) X(lm::PoissonNllLoss<true, false>)                            \
          X(lm::PoissonNllLoss<true, true>) X(lm::PoissonNllLoss<false, false>) X(lm::PoissonNllLoss<false, true>) \
              X(lm::GaussianNllLoss) X(lm::HingeEmbeddingLoss) X(lm::MarginRankingLoss)

// Host long double evaluations (device_math_reference.cpp): the references of the double checks.
template <class Loss>
std::array<std::vector<long double>, 4> reference_pointwise(const std::vector<long double>& x,
                                                            const std::vector<long double>& y,
                                                            const std::vector<long double>& z,
                                                            const std::vector<long double>& g, long double a,
                                                            long double b);
void reference_ce(const CeTileRowEval<long double>& shape, const std::vector<long double>& x,
                  const std::vector<std::int64_t>& y, std::int64_t N, std::vector<long double>& loss,
                  std::vector<long double>& lse, std::vector<long double>& grad);
void reference_ctc(const std::vector<long double>& lp, const std::vector<std::int64_t>& labels, std::int64_t N,
                   std::int64_t T, std::int64_t C, std::int64_t S, std::vector<long double>& nll,
                   std::vector<long double>& grad);
// A first-order bound on the absolute rounding error of the elementwise formulas evaluated with unit roundoff u
// (value, d/dx, d/dy, d/dz), from the formulas themselves run with bound-tracking ops in double.
template <class Loss>
std::array<std::vector<double>, 4> pointwise_error_bound(const std::vector<double>& x, const std::vector<double>& y,
                                                         const std::vector<double>& z, const std::vector<double>& g,
                                                         double a, double b, double u);
// host_io of E<long double>, for E in CeRowSumsEval, CosineEval, MarginTermsEval (f's other fields as given).
template <class F, int In, int Out>
std::array<std::vector<long double>, Out> reference_io(const F& f, const std::array<std::vector<long double>, In>& in,
                                                       const std::array<std::size_t, Out>& out_sizes, std::int64_t n);
void reference_triplet(const std::vector<long double>& a, const std::vector<long double>& p,
                       const std::vector<long double>& n, std::int64_t N, std::int64_t D, double pnorm, bool swap,
                       std::vector<long double>& loss, std::vector<long double>& grad);

}  // namespace lossfuse::device_test
