// Host long double evaluations of tests/cuda/device_math_evals.hpp: the references of device_math_test's double
// checks. Compiled by the host compiler alone, since nvcc does not allow long double in __host__ __device__ code.
#include <cmath>
#include <cstdint>
#include <vector>

#include "device_math_evals.hpp"

namespace lossfuse::device_test {

namespace {

// A running error bound (Wilkinson's): every value carries e, a first-order bound on the absolute error that
// evaluating it in a precision of unit roundoff u accumulates: each operation adds u |result| (2 u or 3 u for
// the library's exp / log, which are within an ulp or two) to the operands' bounds carried through its
// derivative. Evaluated in double, the elementwise formulas with these ops give how far an implementation that
// rounds differently (FMA contraction, another libm) may legitimately land from the exact value.
struct Bounded {
  double v;
  double e;
};

struct BoundOps {
  using V = Bounded;
  using M = bool;
  double u;
  V r(double v, double e, double k = 1) const { return {v, e + k * u * std::fabs(v)}; }
  V set(double c) const { return {c, 0}; }
  V add(V a, V b) const { return r(a.v + b.v, a.e + b.e); }
  V sub(V a, V b) const { return r(a.v - b.v, a.e + b.e); }
  V mul(V a, V b) const { return r(a.v * b.v, std::fabs(a.v) * b.e + std::fabs(b.v) * a.e); }
  V div(V a, V b) const {
    const double q = a.v / b.v;
    return r(q, (a.e + std::fabs(q) * b.e) / std::fabs(b.v));
  }
  V div_pos(V a, V b) const { return div(a, b); }
  V neg(V a) const { return {-a.v, a.e}; }
  V abs(V a) const { return {std::fabs(a.v), a.e}; }
  V min(V a, V b) const { return a.v < b.v ? a : b; }
  V max(V a, V b) const { return a.v > b.v ? a : b; }
  V sqrt(V a) const {
    const double q = std::sqrt(a.v);
    return r(q, q > 0 ? a.e / (2 * q) : std::sqrt(a.e));
  }
  V log(V a) const { return r(std::log(a.v), a.e / std::fabs(a.v), 2); }
  V log1p(V a) const { return r(std::log1p(a.v), a.e / std::fabs(1 + a.v), 2); }
  V xlogx(V a) const {
    if (a.v == 0) return {0, a.e};
    return r(a.v * std::log(a.v), std::fabs(std::log(a.v) + 1) * a.e, 3);
  }
  V exp(V a) const {
    const double q = std::exp(a.v);
    return r(q, q * a.e, 2);
  }
  V sigmoid(V a) const {
    const double q = 1 / (1 + std::exp(-a.v));
    return r(q, q * (1 - q) * a.e, 3);
  }
  void sigmoid_pair(V a, V& s, V& s_neg) const {
    const double q = 1 / (1 + std::exp(-a.v)), qn = 1 / (1 + std::exp(a.v));
    s = r(q, q * qn * a.e, 3);
    s_neg = r(qn, q * qn * a.e, 3);
  }
  V bce_nll(V x, V y) const {
    const double lx = std::fmax(std::log(x.v), -100.0), l1 = std::fmax(std::log1p(-x.v), -100.0);
    const double v = -(y.v * lx + (1 - y.v) * l1);
    const double dx = std::fabs((x.v - y.v) / std::fmax(x.v * (1 - x.v), 1e-300));
    return r(v, dx * x.e + std::fabs(l1 - lx) * y.e + 4 * u * (std::fabs(y.v * lx) + std::fabs((1 - y.v) * l1)));
  }
  V log1p_exp_neg_abs(V a) const {
    const double e = std::exp(-std::fabs(a.v)), l = std::log1p(e);
    return r(l, a.e * e / (1 + e) + 3 * u * l);
  }
  V softplus(V a) const {
    const double l = std::log1p(std::exp(-std::fabs(a.v)));
    const double v = (a.v > 0 ? a.v : 0) + l;
    return r(v, a.e / (1 + std::exp(-a.v)) + 3 * u * l);
  }
  M lt(V a, V b) const { return a.v < b.v; }
  M le(V a, V b) const { return a.v <= b.v; }
  M eq(V a, V b) const { return a.v == b.v; }
  V select(M m, V a, V b) const { return m ? a : b; }
  V sign(V a) const { return {a.v > 0 ? 1.0 : (a.v < 0 ? -1.0 : 0.0), 0}; }
};

}  // namespace

template <class Loss>
std::array<std::vector<double>, 4> pointwise_error_bound(const std::vector<double>& x, const std::vector<double>& y,
                                                         const std::vector<double>& z, const std::vector<double>& g,
                                                         double a, double b, double u) {
  std::array<std::vector<double>, 4> out;
  for (auto& v : out) v.assign(x.size(), 0.0);
  const BoundOps o{u};
  lm::PwConsts<double> k;
  k.a = a;
  k.b = b;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const Bounded bx{x[i], 0}, by{y[i], 0}, bz{z[i], 0}, bg{g[i], 0};
    out[0][i] = Loss::value(o, k, bx, by, bz).e;
    Bounded gx{0, 0}, gy{0, 0}, gz{0, 0};
    Loss::grad(o, k, bx, by, bz, bg, gx, gy, gz);
    out[1][i] = gx.e, out[2][i] = gy.e, out[3][i] = gz.e;
  }
  return out;
}

#define LF_POINTWISE_ERROR_BOUND(...)                                                                                 \
  template std::array<std::vector<double>, 4> pointwise_error_bound<__VA_ARGS__>(                                     \
      const std::vector<double>&, const std::vector<double>&, const std::vector<double>&, const std::vector<double>&, \
      double, double, double);
LF_DEVICE_TEST_LOSSES(LF_POINTWISE_ERROR_BOUND)

template <class Loss>
std::array<std::vector<long double>, 4> reference_pointwise(const std::vector<long double>& x,
                                                            const std::vector<long double>& y,
                                                            const std::vector<long double>& z,
                                                            const std::vector<long double>& g, long double a,
                                                            long double b) {
  std::array<std::vector<long double>, 4> out;
  for (auto& v : out) v.assign(x.size(), 0.0L);
  run_host(PointwiseEval<Loss, long double>{x.data(), y.data(), z.data(), g.data(), a, b, out[0].data(), out[1].data(),
                                            out[2].data(), out[3].data()},
           static_cast<std::int64_t>(x.size()));
  return out;
}

#define LF_REFERENCE_POINTWISE(...)                                                                      \
  template std::array<std::vector<long double>, 4> reference_pointwise<__VA_ARGS__>(                     \
      const std::vector<long double>&, const std::vector<long double>&, const std::vector<long double>&, \
      const std::vector<long double>&, long double, long double);
LF_DEVICE_TEST_LOSSES(LF_REFERENCE_POINTWISE)

void reference_ce(const CeTileRowEval<long double>& shape, const std::vector<long double>& x,
                  const std::vector<std::int64_t>& y, std::int64_t N, std::vector<long double>& loss,
                  std::vector<long double>& lse, std::vector<long double>& grad) {
  loss.assign(N, 0), lse.assign(N, 0), grad.assign(N * shape.C, 0);
  CeTileRowEval<long double> f = shape;
  f.x = x.data(), f.y = y.data(), f.loss = loss.data(), f.lse = lse.data(), f.grad = grad.data();
  run_host(f, N);
}

void reference_ctc(const std::vector<long double>& lp, const std::vector<std::int64_t>& labels, std::int64_t N,
                   std::int64_t T, std::int64_t C, std::int64_t S, std::vector<long double>& nll,
                   std::vector<long double>& grad) {
  const std::int64_t L = 2 * S + 1;
  nll.assign(N, 0), grad.assign(N * T * C, 0);
  std::vector<std::int64_t> ext(N * L);
  std::vector<long double> alpha(N * T * L), beta(N * T * L);
  run_host(CtcEval<long double>{lp.data(), labels.data(), T, C, S, ext.data(), alpha.data(), beta.data(), nll.data(),
                                grad.data()},
           N);
}

template <class F, int In, int Out>
std::array<std::vector<long double>, Out> reference_io(const F& f, const std::array<std::vector<long double>, In>& in,
                                                       const std::array<std::size_t, Out>& out_sizes, std::int64_t n) {
  return host_io<F, long double, In, Out>(f, in, out_sizes, n);
}
template std::array<std::vector<long double>, 4> reference_io<CeRowSumsEval<long double>, 3, 4>(
    const CeRowSumsEval<long double>&, const std::array<std::vector<long double>, 3>&,
    const std::array<std::size_t, 4>&, std::int64_t);
template std::array<std::vector<long double>, 3> reference_io<CosineEval<long double>, 3, 3>(
    const CosineEval<long double>&, const std::array<std::vector<long double>, 3>&, const std::array<std::size_t, 3>&,
    std::int64_t);
template std::array<std::vector<long double>, 9> reference_io<MarginTermsEval<long double>, 3, 9>(
    const MarginTermsEval<long double>&, const std::array<std::vector<long double>, 3>&,
    const std::array<std::size_t, 9>&, std::int64_t);

void reference_triplet(const std::vector<long double>& a, const std::vector<long double>& p,
                       const std::vector<long double>& n, std::int64_t N, std::int64_t D, double pnorm, bool swap,
                       std::vector<long double>& loss, std::vector<long double>& grad) {
  loss.assign(N, 0), grad.assign(N * D, 0);
  run_host(TripletEval<long double>{a.data(), p.data(), n.data(), D, pnorm, swap, loss.data(), grad.data()}, N);
}

}  // namespace lossfuse::device_test
