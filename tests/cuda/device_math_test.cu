// Runs the shared math of src/math on a CUDA device and checks what it computes there against the same functions
// evaluated on the host: the elementwise losses (value and every gradient), the float16 / bfloat16 conversions
// (bit for bit, every 16-bit pattern), cross-entropy rows by the online log-sum-exp over vocabulary tiles (loss,
// lse and the gradient of every logit, with and without soft-cap and label smoothing) and through RowSums
// (probability and index targets, class weights, smoothing, z-loss), whole CTC alpha / beta recursions with their
// gradient, triplet-margin rows for each norm kind, cosine-embedding rows (zero vectors included) and the hinge and
// soft-margin terms of the margin losses.
//
// For float the reference is the host's float64 evaluation of the same function on the same (float) inputs, for
// double the host's long double one (device_math_reference.cpp). The device's error against it may be 4x the
// host's own error in that precision, plus 4x the reference's move when an operand moves by one ulp and 2x a
// running error bound of the formula (elementwise losses), plus 64 ulp of the magnitude of the terms the formula
// rounds (see close): nvcc contracts a * b + c into FMAs and its libm differs from glibc's by an ulp or two. NaN and
// infinity must match the host's result.
//
// Exit status: 0 every check passed, 1 a check failed, 77 no CUDA device here (ctest reports the test skipped),
// 2 a CUDA error.
#include <cuda_runtime.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "device_math_evals.hpp"

namespace {

using namespace lossfuse::device_test;  // NOLINT(google-build-using-namespace): the test's own helpers

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "CUDA error in %s: %s\n", what, cudaGetErrorString(e));
    std::exit(2);
  }
}

// A device copy of a host vector.
template <class T>
struct DeviceArray {
  T* p = nullptr;
  std::size_t n = 0;
  explicit DeviceArray(const std::vector<T>& h) : n(h.size()) {
    cuda_ok(cudaMalloc(&p, (n ? n : 1) * sizeof(T)), "cudaMalloc");
    if (n) cuda_ok(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy to device");
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    if (n) cuda_ok(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy to host");
    return h;
  }
};

// Every check is a functor f(i) over i in [0, n), run by one device thread per i or by a host loop.
template <class F>
__global__ void each_kernel(F f, std::int64_t n) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) f(i);
}

template <class F>
void run_device(const F& f, std::int64_t n) {
  if (n == 0) return;
  const int block = 128;
  each_kernel<<<static_cast<unsigned>((n + block - 1) / block), block>>>(f, n);
  cuda_ok(cudaGetLastError(), "kernel launch");
  cuda_ok(cudaDeviceSynchronize(), "kernel run");
}

// ------------------------------------------------------------------------------------------------ comparison

// Failures are counted per check name; the first three of each are printed.
struct Tally {
  long long checked = 0;
  long long failed = 0;
  std::map<std::string, long long> failures;
  bool pass() {
    ++checked;
    return true;
  }
  bool fail(const std::string& what, long long i, long double dev, long double low, long double ref) {
    ++checked;
    ++failed;
    if (++failures[what] <= 3)
      std::fprintf(stderr, "FAIL %s [%lld]: device %.17Lg, host %.17Lg, reference %.20Lg\n", what.c_str(), i, dev, low,
                   ref);
    return false;
  }
};

Tally g_tally;

// One value computed in Acc on the device (dev) and on the host (low), and in a wider type on the host (ref: float64
// for float, the x87 long double for double). Allowed: 4x the host's own error plus 64 ulp of Acc times
// (rel |ref| + scale): scale is the magnitude below which errors count as absolute, rel > 1 where the value is an
// exponential of a difference of numbers of magnitude rel - 1 (softmax probabilities). The host's error gauges how
// ill-conditioned the formula is at that point; the 64 ulp cover nvcc's libm (an ulp or two from glibc's) and its
// contraction of a * b + c into FMAs. NaN and infinity must match the host's Acc result.
// sens (elementwise checks): how far the reference moves when one operand moves by an ulp of Acc, which gauges the
// cancellation inside the formula better than the host's error alone (that can be small by luck), plus half the
// formula's running error bound where the check has one; 4x it is allowed.
template <class Acc>
bool close(const std::string& what, long long i, Acc dev, Acc low, long double ref, double scale, double rel = 1,
           long double sens = 0) {
  if (std::isnan(low) || std::isinf(low)) {
    const bool same = std::isnan(low) ? std::isnan(dev) : dev == low;
    return same ? g_tally.pass() : g_tally.fail(what, i, dev, low, ref);
  }
  const long double ulp = sizeof(Acc) == 4 ? 1.1920928955078125e-07L : 2.220446049250313e-16L;
  const long double tol = 4 * std::fabs(low - ref) + 4 * sens + 64 * ulp * (rel * std::fabs(ref) + scale);
  return std::fabs(dev - ref) <= tol ? g_tally.pass() : g_tally.fail(what, i, dev, low, ref);
}

template <class W, class T>
std::vector<W> widen(const std::vector<T>& v) {
  return {v.begin(), v.end()};
}

// ------------------------------------------------------------------------------------------- elementwise losses

// Operand domains: the range a loss's core accepts for each operand.
enum class Domain { real, unit, positive };

std::vector<double> sample(Domain dom, std::size_t n, std::mt19937_64& rng) {
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    switch (dom) {
      case Domain::real: v[i] = normal(rng) * (i % 3 == 0 ? 10.0 : 1.0); break;
      case Domain::unit: v[i] = unit(rng); break;
      case Domain::positive: v[i] = std::exp(normal(rng) * 2.0); break;
    }
  }
  // edges: exact values the formulas branch on, and large magnitudes
  const double real_edges[] = {0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 100.0, -100.0, 1e30, -1e30, 88.0, -88.0, 1e-30};
  const double unit_edges[] = {0.0, 1.0, 0.5, 1e-30, 1e-7, 1.0 - 1e-7, 0.25};
  const double pos_edges[] = {0.0, 1e-30, 1e-12, 1.0, 1e30, 0.5};
  std::size_t at = 0;
  auto put = [&](const double* e, std::size_t ne) {
    for (std::size_t j = 0; j < ne && at < n / 2; ++j, at += 7) v[at] = e[j];
  };
  switch (dom) {
    case Domain::real: put(real_edges, std::size(real_edges)); break;
    case Domain::unit: put(unit_edges, std::size(unit_edges)); break;
    case Domain::positive: put(pos_edges, std::size(pos_edges)); break;
  }
  return v;
}

// Value and the three gradients of Loss at every element, on the device or on the host. a, b: the constants
// (rounded to float first, so every precision sees the same numbers).
template <class Loss, class Acc>
std::array<std::vector<Acc>, 4> eval_pointwise(const std::vector<Acc>& x, const std::vector<Acc>& y,
                                               const std::vector<Acc>& z, const std::vector<Acc>& g, double a, double b,
                                               bool device) {
  const std::size_t n = x.size();
  const Acc ka = static_cast<Acc>(static_cast<float>(a)), kb = static_cast<Acc>(static_cast<float>(b));
  if constexpr (std::is_same_v<Acc, long double>) {
    return reference_pointwise<Loss>(x, y, z, g, ka, kb);
  } else {
    std::array<std::vector<Acc>, 4> out;
    for (auto& v : out) v.assign(n, Acc(0));
    if (!device) {
      run_host(PointwiseEval<Loss, Acc>{x.data(), y.data(), z.data(), g.data(), ka, kb, out[0].data(), out[1].data(),
                                        out[2].data(), out[3].data()},
               static_cast<std::int64_t>(n));
      return out;
    }
    DeviceArray<Acc> X(x), Y(y), Z(z), G(g), L(out[0]), DX(out[1]), DY(out[2]), DZ(out[3]);
    run_device(PointwiseEval<Loss, Acc>{X.p, Y.p, Z.p, G.p, ka, kb, L.p, DX.p, DY.p, DZ.p},
               static_cast<std::int64_t>(n));
    out[0] = L.get(), out[1] = DX.get(), out[2] = DY.get(), out[3] = DZ.get();
    return out;
  }
}

template <class Loss>
void check_pointwise(const char* name, Domain dx_dom, Domain dy_dom, Domain dz_dom, double a, double b) {
  const std::size_t n = 20000;
  std::mt19937_64 rng(0x5eed0000u + std::string(name).size() * 977u + static_cast<unsigned>(a * 1000));
  // Operands are made in float so the float and double evaluations see the same numbers; pairs with x == y are
  // planted (every 11th element) because several losses branch there.
  auto to_float = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
  std::vector<float> x = to_float(sample(dx_dom, n, rng)), y = to_float(sample(dy_dom, n, rng));
  std::vector<float> z = to_float(sample(dz_dom, n, rng)), g = to_float(sample(Domain::real, n, rng));
  for (std::size_t i = 0; i < n; i += 11)
    if (dx_dom == dy_dom) y[i] = x[i];

  std::vector<double> xd = widen<double>(x), yd = widen<double>(y), zd = widen<double>(z), gd = widen<double>(g);
  std::vector<long double> xl = widen<long double>(x), yl = widen<long double>(y), zl = widen<long double>(z),
                           gl = widen<long double>(g);
  const auto hf = eval_pointwise<Loss>(x, y, z, g, a, b, false), df = eval_pointwise<Loss>(x, y, z, g, a, b, true);
  const auto hd = eval_pointwise<Loss>(xd, yd, zd, gd, a, b, false),
             dd = eval_pointwise<Loss>(xd, yd, zd, gd, a, b, true);
  const auto hl = eval_pointwise<Loss>(xl, yl, zl, gl, a, b, false);
  // Sensitivity: each operand moved by one ulp of the checked type either way, the others kept; float's measured
  // in double, double's in long double.
  std::array<std::vector<long double>, 4> sf, sd;
  for (auto* s : {&sf, &sd})
    for (auto& v : *s) v.assign(n, 0.0L);
  for (int op = 0; op < 4; ++op) {
    for (int sign : {-1, 1}) {
      std::vector<double> pd[4] = {xd, yd, zd, gd};
      std::vector<long double> pl[4] = {xl, yl, zl, gl};
      for (std::size_t i = 0; i < n; ++i) {
        pd[op][i] *= 1 + sign * 1.1920928955078125e-07;
        pl[op][i] *= 1 + sign * 2.220446049250313e-16L;
      }
      const auto md = eval_pointwise<Loss>(pd[0], pd[1], pd[2], pd[3], a, b, false);
      const auto ml = eval_pointwise<Loss>(pl[0], pl[1], pl[2], pl[3], a, b, false);
      for (int k = 0; k < 4; ++k)
        for (std::size_t i = 0; i < n; ++i) {
          const long double ef = std::fabs(static_cast<long double>(md[k][i]) - hd[k][i]);
          const long double el = std::fabs(ml[k][i] - hl[k][i]);
          if (ef > sf[k][i]) sf[k][i] = ef;  // NaN (a domain edge crossed) is left out
          if (el > sd[k][i]) sd[k][i] = el;
        }
    }
  }
  // The formulas' own rounding: a running error bound for float and for double (device_math_reference.cpp);
  // 2x it is allowed on top of the sensitivity, and no absolute floor.
  const double fa = static_cast<float>(a), fb = static_cast<float>(b);
  const auto bf = pointwise_error_bound<Loss>(xd, yd, zd, gd, fa, fb, 0x1p-24);
  const auto bd = pointwise_error_bound<Loss>(xd, yd, zd, gd, fa, fb, 0x1p-53);
  const char* part[4] = {"value", "d/dx", "d/dy", "d/dz"};
  for (int k = 0; k < 4; ++k) {
    const std::string what = std::string(name) + " " + part[k];
    for (std::size_t i = 0; i < n; ++i) {
      close<float>(what + " float", i, df[k][i], hf[k][i], hd[k][i], 0.0, 1.0, sf[k][i] + 0.5L * bf[k][i]);
      close<double>(what + " double", i, dd[k][i], hd[k][i], hl[k][i], 0.0, 1.0, sd[k][i] + 0.5L * bd[k][i]);
    }
  }
}

void check_all_pointwise() {
  using D = Domain;
  check_pointwise<lm::MseLoss>("mse", D::real, D::real, D::real, 0, 0);
  check_pointwise<lm::L1Loss>("l1", D::real, D::real, D::real, 0, 0);
  check_pointwise<lm::SmoothL1Loss>("smooth_l1 beta=1", D::real, D::real, D::real, 1.0, 0);
  check_pointwise<lm::SmoothL1Loss>("smooth_l1 beta=0", D::real, D::real, D::real, 0.0, 0);
  check_pointwise<lm::HuberLoss>("huber delta=0.5", D::real, D::real, D::real, 0.5, 0);
  check_pointwise<lm::BceLoss>("bce", D::unit, D::unit, D::real, 1e-12, 0);
  check_pointwise<lm::BceWithLogitsLoss<false>>("bce_with_logits", D::real, D::unit, D::real, 0, 0);
  check_pointwise<lm::BceWithLogitsLoss<true>>("bce_with_logits pos_weight", D::real, D::unit, D::positive, 0, 0);
  check_pointwise<lm::KlDivLoss<false>>("kl_div", D::real, D::positive, D::real, 0, 0);
  check_pointwise<lm::KlDivLoss<true>>("kl_div log_target", D::real, D::real, D::real, 0, 0);
  const double two_pi = 6.283185307179586;
  check_pointwise<lm::PoissonNllLoss<true, false>>("poisson_nll log_input", D::real, D::positive, D::real, 1e-8,
                                                   two_pi);
  check_pointwise<lm::PoissonNllLoss<true, true>>("poisson_nll log_input full", D::real, D::positive, D::real, 1e-8,
                                                  two_pi);
  check_pointwise<lm::PoissonNllLoss<false, false>>("poisson_nll", D::positive, D::positive, D::real, 1e-8, two_pi);
  check_pointwise<lm::PoissonNllLoss<false, true>>("poisson_nll full", D::positive, D::positive, D::real, 1e-8, two_pi);
  check_pointwise<lm::GaussianNllLoss>("gaussian_nll", D::real, D::real, D::positive, 1e-6, 0);
  check_pointwise<lm::GaussianNllLoss>("gaussian_nll full", D::real, D::real, D::positive, 1e-6, 0.9189385332046727);
  check_pointwise<lm::HingeEmbeddingLoss>("hinge_embedding", D::real, D::real, D::real, 1.0, 0);
  check_pointwise<lm::MarginRankingLoss>("margin_ranking", D::real, D::real, D::real, 0.5, 0);
}

// ------------------------------------------------------------------------------------ float16 / bfloat16 bits

struct HalfEval {
  const std::uint16_t* h;  // every 16-bit pattern
  const float* f;          // floats to narrow
  float *bf_wide, *f16_wide;
  std::uint16_t *bf_narrow, *f16_narrow;
  std::int64_t n16;
  LF_HOST_DEVICE void operator()(std::int64_t i) const {
    if (i < n16) {
      bf_wide[i] = lm::bf16_to_float(h[i]);
      f16_wide[i] = lm::f16_to_float(h[i]);
    }
    bf_narrow[i] = lm::float_to_bf16(f[i]);
    f16_narrow[i] = lm::float_to_f16(f[i]);
  }
};

std::uint32_t bits_of(float v) { return lm::float_bits(v); }

void check_half() {
  const std::int64_t n16 = 65536;
  // Floats to narrow: every 2^-13-spaced bit pattern from a random offset (all exponents, signs, NaNs and
  // infinities, the rounding ties of both formats), plus random patterns.
  std::vector<std::uint16_t> h(n16);
  for (std::int64_t i = 0; i < n16; ++i) h[i] = static_cast<std::uint16_t>(i);
  const std::int64_t n = 1 << 20;
  std::vector<float> f(n);
  std::mt19937 rng(7);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t u = i < n / 2 ? static_cast<std::uint32_t>(i) << 13 | (rng() & 0x1fffu) : rng();
    f[i] = lm::bits_float(i % 5 == 0 ? (u & 0xffff0000u) | 0x8000u : u);  // every 5th: an exact bf16 tie
  }
  std::vector<float> hbw(n16), hfw(n16);
  std::vector<std::uint16_t> hbn(n), hfn(n);
  run_host(HalfEval{h.data(), f.data(), hbw.data(), hfw.data(), hbn.data(), hfn.data(), n16}, n);
  DeviceArray<std::uint16_t> H(h), BN(hbn), FN(hfn);
  DeviceArray<float> F(f), BW(hbw), FW(hfw);
  run_device(HalfEval{H.p, F.p, BW.p, FW.p, BN.p, FN.p, n16}, n);
  const std::vector<float> dbw = BW.get(), dfw = FW.get();
  const std::vector<std::uint16_t> dbn = BN.get(), dfn = FN.get();
  for (std::int64_t i = 0; i < n16; ++i) {
    bits_of(dbw[i]) == bits_of(hbw[i]) ? g_tally.pass() : g_tally.fail("bf16_to_float bits", i, dbw[i], hbw[i], hbw[i]);
    bits_of(dfw[i]) == bits_of(hfw[i]) ? g_tally.pass() : g_tally.fail("f16_to_float bits", i, dfw[i], hfw[i], hfw[i]);
  }
  for (std::int64_t i = 0; i < n; ++i) {
    dbn[i] == hbn[i] ? g_tally.pass() : g_tally.fail("float_to_bf16 bits", i, dbn[i], hbn[i], f[i]);
    dfn[i] == hfn[i] ? g_tally.pass() : g_tally.fail("float_to_f16 bits", i, dfn[i], hfn[i], f[i]);
  }
}

// ------------------------------------------------------------------------ cross-entropy rows over vocab tiles

template <class Acc>
void run_ce(const std::vector<Acc>& x, std::int64_t N, std::int64_t C, std::int64_t tile,
            const std::vector<std::int64_t>& y, double scale, double softcap, double eps, double zls, bool device,
            std::vector<Acc>& loss, std::vector<Acc>& lse, std::vector<Acc>& grad) {
  if constexpr (std::is_same_v<Acc, long double>) {
    reference_ce({nullptr, C, tile, nullptr, Acc(scale), Acc(softcap), Acc(eps), Acc(zls), nullptr, nullptr, nullptr},
                 x, y, N, loss, lse, grad);
  } else {
    loss.assign(N, 0), lse.assign(N, 0), grad.assign(N * C, 0);
    if (!device) {
      run_host(CeTileRowEval<Acc>{x.data(), C, tile, y.data(), Acc(scale), Acc(softcap), Acc(eps), Acc(zls),
                                  loss.data(), lse.data(), grad.data()},
               N);
      return;
    }
    DeviceArray<Acc> X(x), L(loss), S(lse), G(grad);
    DeviceArray<std::int64_t> Y(y);
    run_device(CeTileRowEval<Acc>{X.p, C, tile, Y.p, Acc(scale), Acc(softcap), Acc(eps), Acc(zls), L.p, S.p, G.p}, N);
    loss = L.get(), lse = S.get(), grad = G.get();
  }
}

void check_ce(std::int64_t C, std::int64_t tile, double scale, double softcap, double eps, double zls) {
  const std::int64_t N = 48;
  std::mt19937_64 rng(static_cast<std::uint64_t>(C * 31 + tile));
  std::normal_distribution<double> normal;
  std::vector<float> x(N * C);
  for (std::int64_t r = 0; r < N; ++r) {
    const double offset = (r % 4 == 1) ? 1000.0 : (r % 4 == 2 ? -300.0 : 0.0);  // large common offsets
    const double spread = (r % 3 == 0) ? 20.0 : 3.0;
    for (std::int64_t c = 0; c < C; ++c) x[r * C + c] = static_cast<float>(offset + spread * normal(rng));
  }
  for (std::int64_t c = 0; c < C; ++c) x[5 * C + c] = -INFINITY;  // a row of only -inf: NaN loss
  x[7 * C + 3] = -INFINITY;                                       // one -inf logit
  x[9 * C + C / 2] = NAN;                                         // a NaN logit
  std::vector<std::int64_t> y(N);
  for (std::int64_t r = 0; r < N; ++r) y[r] = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(C));
  y[11] = -100;  // ignored
  std::vector<double> xd = widen<double>(x);
  std::vector<long double> xl = widen<long double>(x);
  std::vector<float> lf, sf, gf, dlf, dsf, dgf;
  std::vector<double> ld, sd, gd, dld, dsd, dgd;
  std::vector<long double> lL, sL, gL;
  run_ce(x, N, C, tile, y, scale, softcap, eps, zls, false, lf, sf, gf);
  run_ce(xd, N, C, tile, y, scale, softcap, eps, zls, false, ld, sd, gd);
  run_ce(xl, N, C, tile, y, scale, softcap, eps, zls, false, lL, sL, gL);
  run_ce(x, N, C, tile, y, scale, softcap, eps, zls, true, dlf, dsf, dgf);
  run_ce(xd, N, C, tile, y, scale, softcap, eps, zls, true, dld, dsd, dgd);
  char tag[160];
  std::snprintf(tag, sizeof tag, "ce C=%lld tile=%lld scale=%g softcap=%g eps=%g zls=%g", static_cast<long long>(C),
                static_cast<long long>(tile), scale, softcap, eps, zls);
  const std::string t(tag);
  for (std::int64_t r = 0; r < N; ++r) {
    // the loss and lse of a row carry the rounding of the row's magnitude (its lse)
    close<float>(t + " loss float", r, dlf[r], lf[r], ld[r], std::fabs(sd[r]));
    close<float>(t + " lse float", r, dsf[r], sf[r], sd[r], 0.0);
    close<double>(t + " loss double", r, dld[r], ld[r], lL[r], std::fabs(sd[r]));
    close<double>(t + " lse double", r, dsd[r], sd[r], sL[r], 0.0);
  }
  // gradient: softmax probabilities exp(z - lse), whose relative error follows the absolute error of z - lse
  // (rel 1 + |lse|), times the soft-cap's derivative 1 - tanh^2 taken from the rounded z, whose absolute error is a
  // few ulp of 1 (rel 1 / (1 - tanh^2)); with label smoothing, q A - eps / C cancels to the error of a term of
  // size eps / C; 1e-3 / C of absolute slack for the tiniest probabilities.
  const double tiny = 1e-3 / static_cast<double>(C);
  for (std::int64_t i = 0; i < N * C; ++i) {
    const double lse_rel = 1 + std::fabs(sd[i / C]);
    double rel = lse_rel, dzdx = scale;
    if (softcap > 0) {
      const double th = std::tanh(xd[i] * scale / softcap);
      rel += 4 / std::fmax(1 - th * th, 1e-300);
      dzdx *= 1 - th * th;
    }
    // the absolute part scales with the element's dz/dx like the gradient itself
    const double abs_scale = (tiny + lse_rel * eps / static_cast<double>(C)) * dzdx;
    close<float>(t + " grad float", i, dgf[i], gf[i], gd[i], abs_scale, rel);
    close<double>(t + " grad double", i, dgd[i], gd[i], gL[i], abs_scale, rel);
  }
}

// --------------------------------------------------------------------------------------------- whole CTC rows

template <class Acc>
void run_ctc(const std::vector<Acc>& lp, const std::vector<std::int64_t>& labels, std::int64_t N, std::int64_t T,
             std::int64_t C, std::int64_t S, bool device, std::vector<Acc>& nll, std::vector<Acc>& grad) {
  if constexpr (std::is_same_v<Acc, long double>) {
    reference_ctc(lp, labels, N, T, C, S, nll, grad);
  } else {
    const std::int64_t L = 2 * S + 1;
    nll.assign(N, 0), grad.assign(N * T * C, 0);
    std::vector<std::int64_t> ext(N * L);
    std::vector<Acc> alpha(N * T * L), beta(N * T * L);
    if (!device) {
      run_host(CtcEval<Acc>{lp.data(), labels.data(), T, C, S, ext.data(), alpha.data(), beta.data(), nll.data(),
                            grad.data()},
               N);
      return;
    }
    DeviceArray<Acc> LP(lp), A(alpha), B(beta), NL(nll), G(grad);
    DeviceArray<std::int64_t> LB(labels), E(ext);
    run_device(CtcEval<Acc>{LP.p, LB.p, T, C, S, E.p, A.p, B.p, NL.p, G.p}, N);
    nll = NL.get(), grad = G.get();
  }
}

void check_ctc() {
  const std::int64_t N = 8, T = 60, C = 12, S = 20;
  std::mt19937_64 rng(11);
  std::normal_distribution<double> normal;
  std::vector<float> lp(N * T * C);
  for (std::int64_t nt = 0; nt < N * T; ++nt) {
    double row[64], mx = -1e300, sum = 0;
    for (std::int64_t c = 0; c < C; ++c) row[c] = 3.0 * normal(rng), mx = row[c] > mx ? row[c] : mx;
    for (std::int64_t c = 0; c < C; ++c) sum += std::exp(row[c] - mx);
    for (std::int64_t c = 0; c < C; ++c) lp[nt * C + c] = static_cast<float>(row[c] - mx - std::log(sum));
  }
  std::vector<std::int64_t> labels(N * S);
  for (std::int64_t i = 0; i < N * S; ++i) labels[i] = 1 + static_cast<std::int64_t>(rng() % (C - 1));
  for (std::int64_t s = 1; s < S; s += 3) labels[s] = labels[s - 1];  // repeats: the skip transition is off
  std::vector<double> lpd = widen<double>(lp);
  std::vector<long double> lpl = widen<long double>(lp);
  std::vector<float> nf, gf, dnf, dgf;
  std::vector<double> nd, gd, dnd, dgd;
  std::vector<long double> nL, gL;
  run_ctc(lp, labels, N, T, C, S, false, nf, gf);
  run_ctc(lpd, labels, N, T, C, S, false, nd, gd);
  run_ctc(lpl, labels, N, T, C, S, false, nL, gL);
  run_ctc(lp, labels, N, T, C, S, true, dnf, dgf);
  run_ctc(lpd, labels, N, T, C, S, true, dnd, dgd);
  // The recursions round at the magnitude of log alpha (up to the nll): errors scale with it.
  for (std::int64_t n = 0; n < N; ++n) {
    close<float>("ctc nll float", n, dnf[n], nf[n], nd[n], std::fabs(nd[n]));
    close<double>("ctc nll double", n, dnd[n], nd[n], nL[n], std::fabs(nd[n]));
  }
  for (std::int64_t i = 0; i < N * T * C; ++i) {
    const double scale = std::fabs(nd[i / (T * C)]);
    close<float>("ctc grad float", i, dgf[i], gf[i], gd[i], scale);
    close<double>("ctc grad double", i, dgd[i], gd[i], gL[i], scale);
  }
}

// ----------------------------------------------------------------------------------------- triplet-margin rows

template <class Acc>
void run_triplet(const std::vector<Acc>& a, const std::vector<Acc>& p, const std::vector<Acc>& n, std::int64_t N,
                 std::int64_t D, double pnorm, bool swap, bool device, std::vector<Acc>& loss, std::vector<Acc>& grad) {
  if constexpr (std::is_same_v<Acc, long double>) {
    reference_triplet(a, p, n, N, D, pnorm, swap, loss, grad);
  } else {
    loss.assign(N, 0), grad.assign(N * D, 0);
    if (!device) {
      run_host(TripletEval<Acc>{a.data(), p.data(), n.data(), D, pnorm, swap, loss.data(), grad.data()}, N);
      return;
    }
    DeviceArray<Acc> A(a), P(p), Q(n), L(loss), G(grad);
    run_device(TripletEval<Acc>{A.p, P.p, Q.p, D, pnorm, swap, L.p, G.p}, N);
    loss = L.get(), grad = G.get();
  }
}

void check_triplet(double pnorm, bool swap) {
  const std::int64_t N = 256, D = 37;
  std::mt19937_64 rng(static_cast<std::uint64_t>(pnorm * 100) + swap);
  std::vector<double> a = sample(Domain::real, N * D, rng), p = sample(Domain::real, N * D, rng),
                      n = sample(Domain::real, N * D, rng);
  // keep the operands moderate: norms of 1e30 entries overflow float for p >= 2 (checked elsewhere)
  for (auto* v : {&a, &p, &n})
    for (double& e : *v) e = std::fabs(e) > 1e3 ? std::copysign(3.0, e) : e;
  std::vector<float> af(a.begin(), a.end()), pf(p.begin(), p.end()), nf(n.begin(), n.end());
  std::vector<double> ad = widen<double>(af), pd = widen<double>(pf), nd = widen<double>(nf);
  std::vector<long double> aL = widen<long double>(af), pL = widen<long double>(pf), nL = widen<long double>(nf);
  std::vector<float> lf, gf, dlf, dgf;
  std::vector<double> ld, gd, dld, dgd;
  std::vector<long double> lL, gL;
  run_triplet(af, pf, nf, N, D, pnorm, swap, false, lf, gf);
  run_triplet(ad, pd, nd, N, D, pnorm, swap, false, ld, gd);
  run_triplet(aL, pL, nL, N, D, pnorm, swap, false, lL, gL);
  run_triplet(af, pf, nf, N, D, pnorm, swap, true, dlf, dgf);
  run_triplet(ad, pd, nd, N, D, pnorm, swap, true, dld, dgd);
  char tag[64];
  std::snprintf(tag, sizeof tag, "triplet p=%g swap=%d", pnorm, static_cast<int>(swap));
  const std::string t(tag);
  for (std::int64_t r = 0; r < N; ++r) {
    close<float>(t + " loss float", r, dlf[r], lf[r], ld[r], 1.0);
    close<double>(t + " loss double", r, dld[r], ld[r], lL[r], 1.0);
  }
  for (std::int64_t i = 0; i < N * D; ++i) {
    close<float>(t + " grad float", i, dgf[i], gf[i], gd[i], 1.0);
    close<double>(t + " grad double", i, dgd[i], gd[i], gL[i], 1.0);
  }
}

// ------------------------------------------------------------------------- row sums, cosine and margin terms

// Runs f (an Io functor in Acc) over [0, n): on the device, on the host, or (long double) by the reference TU.
template <class F, class Acc, int In, int Out>
std::array<std::vector<Acc>, Out> io_run(F f, const std::array<std::vector<Acc>, In>& in,
                                         const std::array<std::size_t, Out>& out_sizes, std::int64_t n, bool device) {
  if constexpr (std::is_same_v<Acc, long double>) {
    return reference_io<F, In, Out>(f, in, out_sizes, n);
  } else {
    if (!device) return host_io<F, Acc, In, Out>(f, in, out_sizes, n);
    std::vector<std::unique_ptr<DeviceArray<Acc>>> din, dout;
    for (int k = 0; k < In; ++k) {
      din.push_back(std::make_unique<DeviceArray<Acc>>(in[k]));
      f.io.in[k] = din.back()->p;
    }
    for (int k = 0; k < Out; ++k) {
      dout.push_back(std::make_unique<DeviceArray<Acc>>(std::vector<Acc>(out_sizes[k], Acc(0))));
      f.io.out[k] = dout.back()->p;
    }
    run_device(f, n);
    std::array<std::vector<Acc>, Out> out;
    for (int k = 0; k < Out; ++k) out[k] = dout[k]->get();
    return out;
  }
}

template <class W, int In>
std::array<std::vector<W>, In> widen_all(const std::array<std::vector<float>, In>& in) {
  std::array<std::vector<W>, In> out;
  for (int k = 0; k < In; ++k) out[k] = widen<W>(in[k]);
  return out;
}

// Runs make<Acc>() (the functor for Acc) on the float inputs in float and double, device and host, and in long
// double, and checks every output. tol(k, i) gives {scale, rel} of output k's element i (see close). sensitive: the
// functor is elementwise (n == every input's size), so the reference's move under a one-ulp move of each operand
// is measured and allowed for.
template <int In, int Out, class Make, class Tol>
void check_io(const std::string& name, const Make& make, const std::array<std::vector<float>, In>& in,
              const std::array<std::size_t, Out>& out_sizes, std::int64_t n, const Tol& tol, bool sensitive) {
  const auto ind = widen_all<double, In>(in);
  const auto inl = widen_all<long double, In>(in);
  const auto hf = io_run<decltype(make.template operator()<float>()), float, In, Out>(make.template operator()<float>(),
                                                                                      in, out_sizes, n, false);
  const auto df = io_run<decltype(make.template operator()<float>()), float, In, Out>(make.template operator()<float>(),
                                                                                      in, out_sizes, n, true);
  const auto hd = io_run<decltype(make.template operator()<double>()), double, In, Out>(
      make.template operator()<double>(), ind, out_sizes, n, false);
  const auto dd = io_run<decltype(make.template operator()<double>()), double, In, Out>(
      make.template operator()<double>(), ind, out_sizes, n, true);
  const auto hl = io_run<decltype(make.template operator()<long double>()), long double, In, Out>(
      make.template operator()<long double>(), inl, out_sizes, n, false);
  std::array<std::vector<long double>, Out> sf, sd;
  for (int k = 0; k < Out; ++k) sf[k].assign(out_sizes[k], 0.0L), sd[k].assign(out_sizes[k], 0.0L);
  if (sensitive) {
    for (int op = 0; op < In; ++op) {
      for (int sign : {-1, 1}) {
        auto pd = ind;
        auto pl = inl;
        for (auto& v : pd[op]) v *= 1 + sign * 1.1920928955078125e-07;
        for (auto& v : pl[op]) v *= 1 + sign * 2.220446049250313e-16L;
        const auto md = io_run<decltype(make.template operator()<double>()), double, In, Out>(
            make.template operator()<double>(), pd, out_sizes, n, false);
        const auto ml = io_run<decltype(make.template operator()<long double>()), long double, In, Out>(
            make.template operator()<long double>(), pl, out_sizes, n, false);
        for (int k = 0; k < Out; ++k)
          for (std::size_t i = 0; i < out_sizes[k]; ++i) {
            const long double ef = std::fabs(static_cast<long double>(md[k][i]) - hd[k][i]);
            const long double el = std::fabs(ml[k][i] - hl[k][i]);
            if (ef > sf[k][i]) sf[k][i] = ef;
            if (el > sd[k][i]) sd[k][i] = el;
          }
      }
    }
  }
  for (int k = 0; k < Out; ++k) {
    const std::string what = name + " out" + std::to_string(k);
    for (std::size_t i = 0; i < out_sizes[k]; ++i) {
      const std::array<double, 2> t = tol(k, i, hd);
      close<float>(what + " float", i, df[k][i], hf[k][i], hd[k][i], t[0], t[1], sf[k][i]);
      close<double>(what + " double", i, dd[k][i], hd[k][i], hl[k][i], t[0], t[1], sd[k][i]);
    }
  }
}

void check_ce_row_sums(double eps, double zls) {
  const std::int64_t N = 32, C = 4000;
  std::mt19937_64 rng(static_cast<std::uint64_t>(eps * 1000 + zls * 1e6) + 3);
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> unit(0.5, 2.0);
  std::vector<float> x(N * C), pt(N * C), w(C);
  std::vector<double> row_mag(N, 0.0);
  for (std::int64_t r = 0; r < N; ++r) {
    const double offset = (r % 4 == 1) ? 500.0 : (r % 4 == 2 ? -200.0 : 0.0);
    double sum = 0;
    for (std::int64_t c = 0; c < C; ++c) {
      x[r * C + c] = static_cast<float>(offset + 4.0 * normal(rng));
      row_mag[r] = std::fmax(row_mag[r], std::fabs(x[r * C + c]));
      const double e = std::exp(2.0 * normal(rng));
      pt[r * C + c] = static_cast<float>(e);
      sum += e;
    }
    for (std::int64_t c = 0; c < C; ++c) pt[r * C + c] = static_cast<float>(pt[r * C + c] / sum);
  }
  for (auto& v : w) v = static_cast<float>(unit(rng));
  const auto make = [&]<class Acc>() {
    return CeRowSumsEval<Acc>{{}, C, static_cast<Acc>(eps), static_cast<Acc>(zls)};
  };
  const double tiny = 1e-3 / static_cast<double>(C);
  // losses round at the row's magnitude (lse, max z); gradients are exp(z - lse) (rel) less w eps / C terms
  const auto tol = [&](int k, std::size_t i, const std::array<std::vector<double>, 4>&) -> std::array<double, 2> {
    if (k < 2) return {row_mag[i] * (1 + 2 * zls * row_mag[i]) + 1, 1};
    const double rel = 1 + row_mag[i / C] * (1 + 2 * zls * row_mag[i / C]);
    return {tiny + rel * (eps / static_cast<double>(C) + 1e-30), rel};
  };
  char tag[64];
  std::snprintf(tag, sizeof tag, "ce row sums eps=%g zls=%g", eps, zls);
  check_io<3, 4>(tag, make, {x, pt, w}, {std::size_t(N), std::size_t(N), std::size_t(N * C), std::size_t(N * C)}, N,
                 tol, false);
}

void check_cosine() {
  const std::int64_t N = 512, D = 33;
  std::mt19937_64 rng(21);
  std::vector<double> a = sample(Domain::real, N * D, rng), b = sample(Domain::real, N * D, rng);
  for (auto* v : {&a, &b})
    for (double& e : *v) e = std::fabs(e) > 1e3 ? std::copysign(3.0, e) : e;
  for (std::int64_t c = 0; c < D; ++c) a[5 * D + c] = 0.0, b[6 * D + c] = 0.0, b[7 * D + c] = 2 * a[7 * D + c];
  std::vector<float> y(N);
  for (std::int64_t r = 0; r < N; ++r) y[r] = r % 3 == 0 ? 1.0f : (r % 3 == 1 ? -1.0f : 0.0f);
  const auto make = [&]<class Acc>() { return CosineEval<Acc>{{}, D, static_cast<Acc>(0.1)}; };
  const auto tol = [&](int, std::size_t, const std::array<std::vector<double>, 3>&) -> std::array<double, 2> {
    return {1.0, 1.0};
  };
  check_io<3, 3>("cosine_embedding", make,
                 {std::vector<float>(a.begin(), a.end()), std::vector<float>(b.begin(), b.end()), y},
                 {std::size_t(N), std::size_t(N * D), std::size_t(N * D)}, N, tol, false);
}

void check_margin_terms() {
  const std::size_t n = 20000;
  std::mt19937_64 rng(33);
  const std::vector<double> a = sample(Domain::real, n, rng), b = sample(Domain::real, n, rng),
                            t = sample(Domain::unit, n, rng);
  const auto make = [&]<class Acc>() { return MarginTermsEval<Acc>{}; };
  // The magnitude of each output's terms: the hinge terms and d/dy are exact up to their last rounding (relative
  // only); the soft-margin term rounds at |w| (|a| + 1), its d/dx cancels sigmoid(a) - t at |w|, log_sigmoid
  // rounds at |min(a, 0)|, sigmoid is relative.
  const auto tol = [&](int k, std::size_t i, const std::array<std::vector<double>, 9>&) -> std::array<double, 2> {
    const double fa = static_cast<float>(a[i]), fb = static_cast<float>(b[i]);
    switch (k) {
      case 4: return {std::fabs(fb) * (std::fabs(fa) + 1), 1.0};
      case 5: return {std::fabs(fb), 1.0};
      case 7: return {std::fmax(-fa, 0.0), 1.0};
      default: return {0.0, 1.0};
    }
  };
  std::array<std::size_t, 9> sizes;
  sizes.fill(n);
  check_io<3, 9>("margin terms", make,
                 {std::vector<float>(a.begin(), a.end()), std::vector<float>(b.begin(), b.end()),
                  std::vector<float>(t.begin(), t.end())},
                 sizes, static_cast<std::int64_t>(n), tol, true);
}

}  // namespace

int main() {
  int count = 0;
  const cudaError_t found = cudaGetDeviceCount(&count);
  if (found != cudaSuccess || count == 0) {
    std::printf("no usable CUDA device (%s): skipped\n", found != cudaSuccess ? cudaGetErrorString(found) : "none");
    return 77;
  }
  cudaDeviceProp prop{};
  cuda_ok(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("device: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);

  check_all_pointwise();
  check_half();
  for (double eps : {0.0, 0.1})
    for (double softcap : {0.0, 30.0}) check_ce(32000, 4096, 1.0, softcap, eps, eps > 0 ? 1e-4 : 0.0);
  check_ce(50257, 50257, 0.5, 0.0, 0.0, 0.0);
  check_ce(1000, 128, 2.0, 15.0, 0.2, 0.0);
  check_ctc();
  for (double pnorm : {0.0, 1.0, 2.0, 3.0, static_cast<double>(INFINITY)})
    for (bool swap : {false, true}) check_triplet(pnorm, swap);
  for (double eps : {0.0, 0.1})
    for (double zls : {0.0, 1e-4}) check_ce_row_sums(eps, zls);
  check_cosine();
  check_margin_terms();

  for (const auto& [what, count] : g_tally.failures) std::printf("failed: %s: %lld\n", what.c_str(), count);
  std::printf("%lld values checked, %lld failed\n", g_tally.checked, g_tally.failed);
  return g_tally.failed == 0 ? 0 : 1;
}
