// CTC loss on the CPU against the float64 reference (tests/reference/ctc_reference.hpp), which is itself checked
// against a brute-force sum over every path: values, gradients (also by central finite differences through a
// log_softmax in float64), every option and reduction, padded and concatenated targets of every integer dtype,
// every input dtype, the log_alpha workspace, every error path (nothing written), determinism across threads.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "math/ctc_math.hpp"
#include "reference/ctc_reference.hpp"
#include "test_util.hpp"

namespace lftest {
namespace {

using lossfuse::CtcOptions;
using lossfuse::CtcOutputs;

constexpr double kInf = std::numeric_limits<double>::infinity();

// ------------------------------------------------------------------------------------------------------------
// One problem: the inputs as tensors, plus their values as read back (16-bit inputs rounded).

struct Case {
  DType dt = DType::f64;
  std::int64_t T = 6, N = 3, C = 5, blank = 0;
  Reduction reduction = Reduction::mean;
  bool zero_infinity = false;
  bool concatenated = false;
  bool unbatched = false;
  bool strided = false;      // log_probs, grad, targets and lengths in gapped or transposed layouts
  bool lengths_1d = false;   // unbatched lengths as shape (1) instead of ()
  bool targets_row = false;  // unbatched padded targets as shape (1, S) instead of (S)
  DType tdt = DType::i64, ildt = DType::i64, tldt = DType::i64;
  std::vector<std::int64_t> il;                   // empty: all T
  std::vector<std::vector<std::int64_t>> labels;  // empty: random
  std::int64_t S = -1;                            // padded width; -1: max length (+1 of padding)
  std::optional<double> upstream;                 // scalar upstream (mean/sum) or base of per-sample values
  std::uint64_t seed = 1;
  double logit_scale = 2.0;
};

struct Problem {
  Case c;
  std::int64_t S = 0, L = 1;
  Tensor lp, targets, il, tl;
  std::vector<double> lpv;  // (T, N, C) values as the library reads them
  std::vector<std::vector<std::int64_t>> labels;
  std::vector<std::int64_t> ilv, tlv;
  std::optional<Tensor> grad_loss;
  std::vector<double> g;  // upstream gradient of each loss_b (mean divisor folded in)

  [[nodiscard]] DType acc() const { return acc_dtype(c.dt); }
  [[nodiscard]] std::vector<std::int64_t> lp_shape() const {
    return c.unbatched ? std::vector<std::int64_t>{c.T, c.C} : std::vector<std::int64_t>{c.T, c.N, c.C};
  }
  [[nodiscard]] std::vector<std::int64_t> sample_shape() const {
    return c.unbatched ? std::vector<std::int64_t>{} : std::vector<std::int64_t>{c.N};
  }
  [[nodiscard]] std::vector<std::int64_t> loss_shape() const {
    return c.reduction == Reduction::none ? sample_shape() : std::vector<std::int64_t>{};
  }
  [[nodiscard]] std::vector<std::int64_t> alpha_shape() const {
    return c.unbatched ? std::vector<std::int64_t>{c.T, L} : std::vector<std::int64_t>{c.T, c.N, L};
  }
  // Logical row-major index of (t, b, k) in log_probs / grad.
  [[nodiscard]] std::int64_t idx(std::int64_t t, std::int64_t b, std::int64_t k) const {
    return (t * c.N + b) * c.C + k;
  }
  [[nodiscard]] std::vector<double> sample_lp(std::int64_t b) const {
    std::vector<double> v(static_cast<std::size_t>(c.T * c.C));
    for (std::int64_t t = 0; t < c.T; ++t)
      for (std::int64_t k = 0; k < c.C; ++k) v[t * c.C + k] = lpv[idx(t, b, k)];
    return v;
  }
};

Problem make_problem(const Case& c) {
  Problem p;
  p.c = c;
  if (c.unbatched) p.c.N = 1;
  const std::int64_t T = c.T, N = p.c.N, C = c.C;
  Rng rng(c.seed * 7919 + static_cast<std::uint64_t>(T * 131 + N * 17 + C));
  // labels and lengths
  p.labels = c.labels;
  if (p.labels.empty()) {
    for (std::int64_t b = 0; b < N; ++b) {
      const std::int64_t n = rng.index(std::max<std::int64_t>(1, T / 2 + 1));
      std::vector<std::int64_t> l;
      for (std::int64_t i = 0; i < n; ++i) {
        std::int64_t v = rng.index(C - 1);
        if (v >= c.blank) ++v;  // skip the blank
        l.push_back(v);
      }
      p.labels.push_back(l);
    }
  }
  std::int64_t smax = 0, total = 0;
  for (const auto& l : p.labels) {
    smax = std::max<std::int64_t>(smax, static_cast<std::int64_t>(l.size()));
    total += static_cast<std::int64_t>(l.size());
    p.tlv.push_back(static_cast<std::int64_t>(l.size()));
  }
  p.ilv = c.il.empty() ? std::vector<std::int64_t>(static_cast<std::size_t>(N), T) : c.il;
  p.S = c.concatenated ? smax : (c.S >= 0 ? c.S : smax + 1);
  p.L = 2 * p.S + 1;
  // log_probs: log_softmax of N(0, scale) logits, rounded to the dtype
  p.lp = Tensor::make(c.dt, p.lp_shape(), c.strided ? Layout::padded : Layout::contiguous, kSentinel);
  p.lpv.assign(static_cast<std::size_t>(T * N * C), 0.0);
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t b = 0; b < N; ++b) {
      std::vector<double> z(static_cast<std::size_t>(C));
      double m = -kInf;
      for (auto& v : z) v = c.logit_scale * rng.normal(), m = std::max(m, v);
      double s = 0;
      for (double v : z) s += std::exp(v - m);
      for (std::int64_t k = 0; k < C; ++k) {
        const std::int64_t i = p.idx(t, b, k);
        p.lp.set(i, z[k] - m - std::log(s));
        p.lpv[i] = p.lp.get(i);
      }
    }
  // targets: padded rows filled past their length with an out-of-range value that must be ignored
  if (c.concatenated) {
    p.targets = Tensor::make(c.tdt, {total}, c.strided ? Layout::padded : Layout::contiguous);
    std::int64_t pos = 0;
    for (const auto& l : p.labels)
      for (std::int64_t v : l) p.targets.set_int(pos++, v);
  } else {
    const Layout tlay = c.strided ? (c.unbatched ? Layout::padded : Layout::transposed) : Layout::contiguous;
    const std::vector<std::int64_t> tshape =
        c.unbatched && !c.targets_row ? std::vector<std::int64_t>{p.S} : std::vector<std::int64_t>{N, p.S};
    p.targets = Tensor::make(c.tdt, tshape, tlay);
    for (std::int64_t b = 0; b < N; ++b)
      for (std::int64_t s = 0; s < p.S; ++s) {
        const std::int64_t v = s < p.tlv[b] ? p.labels[b][s] : (s % 2 ? c.blank : C + 3);
        p.targets.set_int(b * p.S + s, v);
      }
  }
  const auto lshape = c.unbatched && c.lengths_1d ? std::vector<std::int64_t>{1} : p.sample_shape();
  p.il = Tensor::make(c.ildt, lshape, c.strided ? Layout::padded : Layout::contiguous);
  p.tl = Tensor::make(c.tldt, lshape, c.strided ? Layout::padded : Layout::contiguous);
  for (std::int64_t b = 0; b < N; ++b) p.il.set_int(b, p.ilv[b]), p.tl.set_int(b, p.tlv[b]);
  // upstream gradient
  p.g.assign(static_cast<std::size_t>(N), 1.0);
  if (c.upstream) {
    p.grad_loss = Tensor::make(p.acc(), p.loss_shape());
    for (std::int64_t i = 0; i < p.grad_loss->numel(); ++i)
      p.grad_loss->set(i, *c.upstream - 0.5 * static_cast<double>(i));
    for (std::int64_t b = 0; b < N; ++b)
      p.g[b] = c.reduction == Reduction::none ? p.grad_loss->get(b) : p.grad_loss->get(0);
  }
  if (c.reduction == Reduction::mean)
    for (std::int64_t b = 0; b < N; ++b)
      p.g[b] /= static_cast<double>(N) * static_cast<double>(std::max<std::int64_t>(p.tlv[b], 1));
  return p;
}

CtcOptions options_of(const Case& c) {
  CtcOptions o;
  o.blank = c.blank;
  o.reduction = c.reduction;
  o.zero_infinity = c.zero_infinity;
  return o;
}

struct Expected {
  std::vector<double> nll, nll_tol, loss, loss_tol, grad, grad_tol;
  std::vector<std::vector<std::vector<double>>> log_alpha;  // per sample (il, 2 tl + 1)
  std::vector<double> alpha_tol;
};

Expected expect(const Problem& p) {
  const auto& c = p.c;
  const double u = compute_unit(c.dt);
  Expected e;
  std::vector<double> per, per_tol;
  e.grad.assign(static_cast<std::size_t>(c.T * c.N * c.C), 0.0);
  e.grad_tol = e.grad;
  double max_lp = 0;
  for (double v : p.lpv) max_lp = std::max(max_lp, std::fabs(v));
  for (std::int64_t b = 0; b < c.N; ++b) {
    const auto r = lfref::ctc_sample(p.sample_lp(b), c.T, c.C, p.ilv[b], p.labels[b], c.blank);
    // error model: each of the il steps of the recursion adds u (|log alpha| + 8), |log alpha| <= the nll
    // (when finite; else il * max|lp| bounds it)
    const double mag = std::isfinite(r.nll) ? std::fabs(r.nll) : static_cast<double>(p.ilv[b]) * max_lp;
    const double tol = 2.0 * u * static_cast<double>(p.ilv[b] + 1) * (mag + 8.0);
    e.log_alpha.push_back(r.log_alpha);
    e.alpha_tol.push_back(tol);
    e.nll.push_back(r.nll);
    e.nll_tol.push_back(tol);
    const bool zeroed = c.zero_infinity && r.nll == kInf;
    per.push_back(zeroed ? 0.0 : r.nll);
    per_tol.push_back(tol);
    for (std::int64_t t = 0; t < c.T; ++t)
      for (std::int64_t k = 0; k < c.C; ++k) {
        const std::int64_t i = p.idx(t, b, k);
        e.grad[i] = zeroed ? 0.0 : r.grad[t * c.C + k] * p.g[b];
        e.grad_tol[i] = std::fabs(p.g[b]) * (8.0 * u + 3.0 * tol);
      }
  }
  if (c.reduction == Reduction::none) {
    e.loss = per, e.loss_tol = per_tol;
  } else {
    double s = 0, st = 0;
    for (std::int64_t b = 0; b < c.N; ++b) {
      const double d = c.reduction == Reduction::mean ? static_cast<double>(std::max<std::int64_t>(p.tlv[b], 1)) : 1.0;
      s += per[b] / d, st += per_tol[b] / d;
    }
    if (c.reduction == Reduction::mean) s /= static_cast<double>(c.N), st /= static_cast<double>(c.N);
    e.loss = {s}, e.loss_tol = {st};
  }
  return e;
}

struct Got {
  Tensor loss, nll, alpha, grad, grad2;
};

Got run_lib(const Problem& p, bool with_alpha = true) {
  Got g;
  g.loss = Tensor::make(p.acc(), p.loss_shape(), Layout::contiguous, kSentinel);
  g.nll = Tensor::make(p.acc(), p.sample_shape(), Layout::contiguous, kSentinel);
  g.alpha = Tensor::make(p.acc(), p.alpha_shape(), Layout::contiguous, kSentinel);
  CtcOutputs out;
  out.loss = g.loss.view;
  out.neg_log_likelihood = g.nll.view;
  if (with_alpha) out.log_alpha = g.alpha.view;
  const CtcOptions o = options_of(p.c);
  lossfuse::ctc_forward(p.lp.view, p.targets.view, p.il.view, p.tl.view, o, out);
  const Layout gl = p.c.strided ? Layout::transposed : Layout::contiguous;
  g.grad = Tensor::make(p.c.dt, p.lp_shape(), gl, kSentinel);
  g.grad2 = Tensor::make(p.c.dt, p.lp_shape(), gl, kSentinel);
  std::optional<TensorView> up;
  if (p.grad_loss) up = p.grad_loss->view;
  lossfuse::ctc_backward(p.lp.view, p.targets.view, p.il.view, p.tl.view, up, o, g.grad.view,
                         with_alpha ? std::optional<TensorView>(g.alpha.view) : std::nullopt);
  lossfuse::ctc_backward(p.lp.view, p.targets.view, p.il.view, p.tl.view, up, o, g.grad2.view);
  return g;
}

std::string describe(const Case& c) {
  return dname(c.dt) + " T=" + std::to_string(c.T) + " N=" + std::to_string(c.N) + " C=" + std::to_string(c.C) +
         " blank=" + std::to_string(c.blank) + " " + std::string(lossfuse::reduction_name(c.reduction)) +
         (c.zero_infinity ? " zero_inf" : "") + (c.concatenated ? " concat" : " padded") +
         (c.unbatched ? " unbatched" : "") + (c.strided ? " strided" : "") + " targets " + dname(c.tdt) + " lengths " +
         dname(c.ildt) + "/" + dname(c.tldt) + " seed " + std::to_string(c.seed);
}

void check_problem(const Problem& p) {
  const Case& c = p.c;
  const Expected e = expect(p);
  const Got g = run_lib(p);
  EXPECT_TRUE(close_all("loss", g.loss.values(), e.loss, e.loss_tol, p.acc()));
  EXPECT_TRUE(close_all("neg_log_likelihood", g.nll.values(), e.nll, e.nll_tol, p.acc()));
  EXPECT_TRUE(close_all("grad", g.grad.values(), e.grad, e.grad_tol, c.dt));
  EXPECT_TRUE(g.grad.outside_untouched(kSentinel)) << "grad written outside its view";
  // backward without the workspace recomputes alpha the same way: bitwise equal
  const auto a = g.grad.values(), b = g.grad2.values();
  for (std::size_t i = 0; i < a.size(); ++i)
    ASSERT_TRUE(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i]))) << "grad with/without log_alpha at " << i;
  // the workspace: -inf outside t < il, s <= 2 tl; finite or -inf inside
  for (std::int64_t t = 0; t < c.T; ++t)
    for (std::int64_t bb = 0; bb < p.c.N; ++bb)
      for (std::int64_t s = 0; s < p.L; ++s) {
        const double v = g.alpha.get((t * p.c.N + bb) * p.L + s);
        if (t >= p.ilv[bb] || s > 2 * p.tlv[bb]) {
          ASSERT_EQ(v, -kInf) << "log_alpha(" << t << ", " << bb << ", " << s << ")";
        } else {
          const double ref = e.log_alpha[bb][t][s];
          ASSERT_TRUE(
              close_one("log_alpha(" + std::to_string(t) + ", " + std::to_string(bb) + ", " + std::to_string(s) + ")",
                        v, ref, e.alpha_tol[bb] * (1.0 + std::fabs(ref) / (std::fabs(e.nll[bb]) + 8.0)), p.acc()));
        }
      }
}

void check_case(const Case& c) {
  SCOPED_TRACE(describe(c));
  check_problem(make_problem(c));
}

// ------------------------------------------------------------------------------------------------------------
// The reference against the brute force.

TEST(CtcReference, MatchesBruteForce) {
  Rng rng(5);
  int impossible = 0;
  for (int k = 0; k < 60; ++k) {
    const std::int64_t T = 1 + rng.index(6), C = 2 + rng.index(3), blank = rng.index(C);
    const std::int64_t il = rng.index(T + 1);
    std::vector<std::int64_t> labels;
    const std::int64_t n = rng.index(4);
    for (std::int64_t i = 0; i < n; ++i) {
      std::int64_t v = rng.index(C - 1);
      labels.push_back(v >= blank ? v + 1 : v);
    }
    if (k % 5 == 0 && !labels.empty()) labels.push_back(labels.back());  // a repeat needs a blank between
    std::vector<double> lp(static_cast<std::size_t>(T * C));
    for (std::int64_t t = 0; t < T; ++t) {
      double s = 0;
      for (std::int64_t c = 0; c < C; ++c) lp[t * C + c] = rng.normal(), s += std::exp(lp[t * C + c]);
      for (std::int64_t c = 0; c < C; ++c) lp[t * C + c] -= std::log(s);
    }
    const auto a = lfref::ctc_sample(lp, T, C, il, labels, blank);
    const auto b = lfref::ctc_brute_force(lp, T, C, il, labels, blank);
    SCOPED_TRACE("case " + std::to_string(k));
    if (std::isinf(b.nll)) {
      ++impossible;
      EXPECT_EQ(a.nll, kInf);
    } else {
      EXPECT_NEAR(a.nll, b.nll, 1e-12 * (1 + std::fabs(b.nll)));
    }
    for (std::size_t i = 0; i < a.grad.size(); ++i) {
      if (std::isnan(b.grad[i]))
        EXPECT_TRUE(std::isnan(a.grad[i])) << i;
      else
        EXPECT_NEAR(a.grad[i], b.grad[i], 1e-12) << i;
    }
  }
  EXPECT_GT(impossible, 3);  // the sweep does reach impossible alignments
}

// ------------------------------------------------------------------------------------------------------------
// The library against the reference.

TEST(Ctc, EveryDtypeReductionAndTargetForm) {
  for (DType dt : {DType::f64, DType::f32, DType::f16, DType::bf16})
    for (Reduction r : {Reduction::none, Reduction::mean, Reduction::sum})
      for (bool concat : {false, true})
        for (bool zi : {false, true}) {
          Case c;
          c.dt = dt, c.reduction = r, c.concatenated = concat, c.zero_infinity = zi, c.strided = zi;
          c.T = 9, c.N = 4, c.C = 6, c.blank = 2;
          c.il = {9, 7, 1, 0};
          c.seed = static_cast<std::uint64_t>(static_cast<int>(dt) * 100 + static_cast<int>(r) * 10 + concat * 2 + zi);
          c.upstream = r == Reduction::none ? std::optional<double>(1.5) : std::optional<double>(0.75);
          // sample 2 (il 1) with 2 labels is impossible; sample 3 (il 0) with none is possible (loss 0)
          c.labels = {{1, 3, 3, 4}, {5, 5, 5}, {1, 4}, {}};
          check_case(c);
        }
}

TEST(Ctc, EveryTargetAndLengthIntegerDtype) {
  int k = 0;
  for (DType tdt : lossfuse::kIntDTypes)
    for (DType ldt : lossfuse::kIntDTypes)
      for (bool concat : {false, true}) {
        Case c;
        c.dt = DType::f32, c.tdt = tdt, c.ildt = ldt, c.tldt = k % 2 ? ldt : DType::i32, c.concatenated = concat;
        c.T = 12, c.N = 3, c.C = 7, c.blank = 6, c.seed = static_cast<std::uint64_t>(++k);
        c.il = {12, 10, 5};
        c.reduction = Reduction::none;
        check_case(c);
      }
}

TEST(Ctc, RepeatedLabelsNeedABlankBetween) {
  // l = (1, 1, 2, 2) needs at least 6 frames (1 b 1 2 b 2): 6 frames is possible, 5 is not.
  for (DType dt : {DType::f64, DType::f32}) {
    Case c;
    c.dt = dt, c.T = 6, c.N = 2, c.C = 3, c.reduction = Reduction::none;
    c.labels = {{1, 1, 2, 2}, {1, 1, 2, 2}};
    c.il = {6, 5};
    check_case(c);
    const Problem p = make_problem(c);
    const Got g = run_lib(p);
    EXPECT_TRUE(std::isfinite(g.loss.get(0)));
    EXPECT_EQ(g.loss.get(1), kInf);
    // the impossible sample's gradient is nan over t < il (torch's), 0 past il
    for (std::int64_t t = 0; t < c.T; ++t)
      for (std::int64_t k = 0; k < c.C; ++k) {
        const double v = g.grad.get(p.idx(t, 1, k));
        if (t < 5)
          EXPECT_TRUE(std::isnan(v));
        else
          EXPECT_EQ(v, 0.0);
      }
    c.zero_infinity = true;
    const Problem pz = make_problem(c);
    const Got gz = run_lib(pz);
    EXPECT_EQ(gz.loss.get(1), 0.0);
    EXPECT_EQ(gz.nll.get(1), kInf);  // the raw nll is kept
    for (std::int64_t t = 0; t < c.T; ++t)
      for (std::int64_t k = 0; k < c.C; ++k) EXPECT_EQ(gz.grad.get(pz.idx(t, 1, k)), 0.0);
  }
}

TEST(Ctc, EmptyTargetsAndShortInputs) {
  for (Reduction r : {Reduction::none, Reduction::mean, Reduction::sum}) {
    Case c;
    c.T = 7, c.N = 4, c.C = 4, c.blank = 3, c.reduction = r;
    c.labels = {{}, {}, {0}, {2, 1}};
    c.il = {7, 0, 3, 2};
    check_case(c);
  }
}

TEST(Ctc, UnbatchedStridedAndBlankAnywhere) {
  for (DType dt : {DType::f64, DType::f32, DType::bf16})
    for (std::int64_t blank : {0, 3, 7})
      for (bool unbatched : {false, true}) {
        Case c;
        c.dt = dt, c.T = 15, c.N = 3, c.C = 8, c.blank = blank, c.unbatched = unbatched, c.strided = true;
        c.reduction = unbatched ? Reduction::none : Reduction::sum, c.upstream = 2.0;
        c.seed = static_cast<std::uint64_t>(blank + 11);
        if (unbatched) c.il = {11};
        check_case(c);
        if (unbatched) {
          c.lengths_1d = true, c.concatenated = false;
          check_case(c);
          c.targets_row = true;  // torch's unbatched targets may also be one padded row
          check_case(c);
        }
      }
}

TEST(Ctc, LongerSequencesAndOddSizes) {
  for (DType dt : {DType::f64, DType::f32, DType::f16})
    for (std::int64_t C : {2, 31, 67}) {
      Case c;
      c.dt = dt, c.T = 57, c.N = 5, c.C = C, c.blank = C - 1, c.seed = static_cast<std::uint64_t>(C);
      c.il = {57, 40, 33, 1, 50};
      c.reduction = Reduction::mean;
      check_case(c);
    }
}

// PyTorch's gradient equals d loss / d z for lp = log_softmax(z): checked by central differences in float64.
TEST(Ctc, GradientMatchesFiniteDifferences) {
  for (Reduction r : {Reduction::none, Reduction::mean, Reduction::sum}) {
    Case c;
    c.T = 6, c.N = 2, c.C = 4, c.blank = 1, c.reduction = r, c.logit_scale = 1.0;
    c.labels = {{2, 2, 3}, {0}};
    c.il = {6, 4};
    c.upstream = 1.25;
    Problem p = make_problem(c);
    // logits z = lp (already normalized, so log_softmax(z) = lp up to rounding)
    const std::vector<double> z = p.lpv;
    auto objective = [&](const std::vector<double>& zz) {
      for (std::int64_t t = 0; t < c.T; ++t)
        for (std::int64_t b = 0; b < c.N; ++b) {
          double m = -kInf, s = 0;
          for (std::int64_t k = 0; k < c.C; ++k) m = std::max(m, zz[p.idx(t, b, k)]);
          for (std::int64_t k = 0; k < c.C; ++k) s += std::exp(zz[p.idx(t, b, k)] - m);
          for (std::int64_t k = 0; k < c.C; ++k) p.lp.set(p.idx(t, b, k), zz[p.idx(t, b, k)] - m - std::log(s));
        }
      Tensor loss = Tensor::make(DType::f64, p.loss_shape());
      CtcOutputs out;
      out.loss = loss.view;
      lossfuse::ctc_forward(p.lp.view, p.targets.view, p.il.view, p.tl.view, options_of(c), out);
      double v = 0;  // sum of grad_loss * loss
      for (std::int64_t i = 0; i < loss.numel(); ++i) v += loss.get(i) * p.grad_loss->get(i);
      return v;
    };
    objective(z);
    Tensor grad = Tensor::make(DType::f64, p.lp_shape());
    lossfuse::ctc_backward(p.lp.view, p.targets.view, p.il.view, p.tl.view, p.grad_loss->view, options_of(c),
                           grad.view);
    const double h = 1e-6;
    for (std::size_t i = 0; i < z.size(); ++i) {
      std::vector<double> zp = z, zm = z;
      zp[i] += h, zm[i] -= h;
      const double fd = (objective(zp) - objective(zm)) / (2 * h);
      EXPECT_NEAR(grad.get(static_cast<std::int64_t>(i)), fd, 1e-7) << lossfuse::reduction_name(r) << " element " << i;
    }
  }
}

TEST(Ctc, DeterministicAcrossThreadCounts) {
  for (DType dt : {DType::f32, DType::bf16}) {
    Case c;
    c.dt = dt, c.T = 40, c.N = 13, c.C = 9, c.reduction = Reduction::mean;
    const Problem p = make_problem(c);
    lossfuse::set_num_threads(1);
    const Got a = run_lib(p);
    lossfuse::set_num_threads(2);
    const Got b = run_lib(p);
    lossfuse::set_num_threads(0);
    EXPECT_EQ(a.loss.storage, b.loss.storage);
    EXPECT_EQ(a.grad.storage, b.grad.storage);
    EXPECT_EQ(a.alpha.storage, b.alpha.storage);
  }
}

TEST(Ctc, EmptyBatch) {
  for (Reduction r : {Reduction::none, Reduction::mean, Reduction::sum}) {
    Case c;
    c.T = 5, c.N = 0, c.C = 3, c.reduction = r;
    c.labels = {};
    Problem p = make_problem(c);
    const Got g = run_lib(p);
    if (r == Reduction::mean) EXPECT_TRUE(std::isnan(g.loss.get(0)));
    if (r == Reduction::sum) EXPECT_EQ(g.loss.get(0), 0.0);
  }
}

// No time steps at all (T = 0): only the empty target is possible. One class (only the blank): only empty
// targets exist, and the loss is -sum_t lp_t(blank).
TEST(Ctc, NoTimeStepsAndOnlyTheBlankClass) {
  for (Reduction r : {Reduction::none, Reduction::sum}) {
    Case c;
    c.T = 0, c.N = 2, c.C = 3, c.reduction = r, c.upstream = 1.0;
    c.labels = {{}, {2}};
    c.il = {0, 0};
    check_case(c);
    c.zero_infinity = true;
    check_case(c);
  }
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    Case c;
    c.dt = dt, c.T = 9, c.N = 3, c.C = 1, c.reduction = Reduction::none;
    c.labels = {{}, {}, {}};
    c.il = {9, 4, 0};
    check_case(c);
  }
}

// A log-probability of -inf (a zero probability) at t < il: torch's gradient is nan for that element (and
// every alignment through it has probability 0); the loss stays finite when another alignment exists.
TEST(Ctc, NegativeInfinityLogProbabilities) {
  for (DType dt : {DType::f64, DType::f32, DType::f16}) {
    Case c;
    c.dt = dt, c.T = 8, c.N = 2, c.C = 5, c.reduction = Reduction::none;
    c.labels = {{1, 2}, {3, 3}};
    c.il = {8, 6};
    Problem p = make_problem(c);
    for (const auto [t, b, k] : {std::array<std::int64_t, 3>{2, 0, 4}, {5, 0, 1}, {3, 1, 0}, {7, 1, 2}}) {
      p.lp.set(p.idx(t, b, k), -kInf);
      p.lpv[p.idx(t, b, k)] = -kInf;
    }
    SCOPED_TRACE(describe(c));
    check_problem(p);
    const Got g = run_lib(p);
    EXPECT_TRUE(std::isfinite(g.loss.get(0)) && std::isfinite(g.loss.get(1)));
    EXPECT_TRUE(std::isnan(g.grad.get(p.idx(2, 0, 4))));
    EXPECT_EQ(g.grad.get(p.idx(7, 1, 2)), 0.0);  // past il
  }
}

TEST(Ctc, CatalogListsCpuForwardAndBackward) {
  for (DType dt : lossfuse::kFloatDTypes) {
    EXPECT_TRUE(
        lossfuse::is_implemented(lossfuse::LossKind::ctc, dt, lossfuse::Device::cpu, lossfuse::Direction::forward));
    EXPECT_TRUE(
        lossfuse::is_implemented(lossfuse::LossKind::ctc, dt, lossfuse::Device::cpu, lossfuse::Direction::backward));
    EXPECT_FALSE(lossfuse::is_implemented(lossfuse::LossKind::ctc, dt, lossfuse::Device::cpu,
                                          lossfuse::Direction::forward_backward));
  }
}

// ------------------------------------------------------------------------------------------------------------
// The math helpers over their valid range, against long double, within the stated u (|m| + 6).

TEST(CtcMath, LogAddWithinStatedError) {
  Rng rng(3);
  const double ninf = -kInf;
  auto exact3 = [](long double a, long double b, long double c) {
    const long double m = std::max({a, b, c});
    if (m == -INFINITY) return -INFINITY * 1.0L;
    return m + std::log(std::exp(a - m) + std::exp(b - m) + std::exp(c - m));
  };
  for (int k = 0; k < 20000; ++k) {
    const double scale = std::pow(10.0, rng.uniform(-3, 4));
    double v[3];
    for (double& x : v) x = rng.uniform() < 0.15 ? ninf : scale * (rng.uniform() * 2 - 1);
    const long double ref3 = exact3(v[0], v[1], v[2]);
    const long double ref2 = exact3(v[0], v[1], ninf);
    const double m3 = std::max({v[0], v[1], v[2]}), m2 = std::max(v[0], v[1]);
    const double r64 = lossfuse::math::log_add3(v[0], v[1], v[2]);
    const double r64b = lossfuse::math::log_add2(v[0], v[1]);
    if (m3 == ninf) {
      EXPECT_EQ(r64, ninf);
    } else {
      EXPECT_LE(std::fabs(static_cast<long double>(r64) - ref3), 0x1p-53 * (std::fabs(m3) + 6))
          << v[0] << " " << v[1] << " " << v[2];
    }
    if (m2 == ninf)
      EXPECT_EQ(r64b, ninf);
    else
      EXPECT_LE(std::fabs(static_cast<long double>(r64b) - ref2), 0x1p-53 * (std::fabs(m2) + 6));
    const float f[3] = {static_cast<float>(v[0]), static_cast<float>(v[1]), static_cast<float>(v[2])};
    const float r32 = lossfuse::math::log_add3(f[0], f[1], f[2]);
    const double mf = std::max({f[0], f[1], f[2]});
    if (mf == ninf)
      EXPECT_EQ(r32, -INFINITY);
    else
      EXPECT_LE(std::fabs(static_cast<long double>(r32) - exact3(f[0], f[1], f[2])), 0x1p-24 * (std::fabs(mf) + 6));
  }
  // exact for one finite argument; nan in, nan out; +inf gives nan
  EXPECT_EQ(lossfuse::math::log_add3(-3.5, ninf, ninf), -3.5);
  EXPECT_EQ(lossfuse::math::log_add2(-INFINITY, 2.25f), 2.25f);
  EXPECT_TRUE(std::isnan(lossfuse::math::log_add3(ninf, std::nan(""), ninf)));
  EXPECT_TRUE(std::isnan(lossfuse::math::log_add2(std::nan(""), 1.0)));
  EXPECT_TRUE(std::isnan(lossfuse::math::log_add2(kInf, 1.0)));
}

// ------------------------------------------------------------------------------------------------------------
// Errors: each names its argument, and nothing is written to any output.

struct ErrCase {
  std::string name;
  ErrorCode code;
  std::string argument;
  std::function<void(Problem&, CtcOptions&)> edit;
  std::string actual_contains;
};

TEST(Ctc, ErrorsNameTheArgumentAndWriteNothing) {
  auto set_len = [](Tensor& t, std::int64_t b, std::int64_t v) { t.set_int(b, v); };
  const std::vector<ErrCase> cases = {
      {"input_length > T", ErrorCode::invalid_value, "input_lengths",
       [&](Problem& p, CtcOptions&) { set_len(p.il, 1, 9); }, "9 at position [1]"},
      {"input_length < 0", ErrorCode::invalid_value, "input_lengths",
       [&](Problem& p, CtcOptions&) { set_len(p.il, 2, -1); }, "-1 at position [2]"},
      {"target_length > S", ErrorCode::invalid_value, "target_lengths",
       [&](Problem& p, CtcOptions&) { set_len(p.tl, 0, 5); }, "5"},
      {"target_length < 0", ErrorCode::invalid_value, "target_lengths",
       [&](Problem& p, CtcOptions&) { set_len(p.tl, 0, -2); }, "-2"},
      {"label out of range", ErrorCode::index_error, "targets",
       [](Problem& p, CtcOptions&) { p.targets.set_int(1 * p.S + 1, 5); }, "5 at position [1, 1]"},
      {"negative label", ErrorCode::index_error, "targets", [](Problem& p, CtcOptions&) { p.targets.set_int(0, -4); },
       "-4 at position [0, 0]"},
      {"label equal to blank", ErrorCode::index_error, "targets",
       [](Problem& p, CtcOptions&) { p.targets.set_int(2 * p.S + 0, 0); }, "0 at position [2, 0]"},
      {"blank out of range", ErrorCode::invalid_value, "blank", [](Problem&, CtcOptions& o) { o.blank = 5; }, "5"},
      {"negative blank", ErrorCode::invalid_value, "blank", [](Problem&, CtcOptions& o) { o.blank = -1; }, "-1"},
      {"float targets", ErrorCode::dtype_mismatch, "targets",
       [](Problem& p, CtcOptions&) {
         p.targets = Tensor::make(DType::f32, {3, p.S});
       },
       "float32"},
      {"float lengths", ErrorCode::dtype_mismatch, "input_lengths",
       [](Problem& p, CtcOptions&) { p.il = Tensor::make(DType::f64, {3}); }, "float64"},
      {"integer log_probs", ErrorCode::dtype_mismatch, "log_probs",
       [](Problem& p, CtcOptions&) {
         p.lp = Tensor::make(DType::i32, {6, 3, 5});
       },
       ""},
      {"log_probs 4-D", ErrorCode::shape_mismatch, "log_probs",
       [](Problem& p, CtcOptions&) {
         p.lp = Tensor::make(DType::f64, {6, 3, 5, 1});
       },
       "(6, 3, 5, 1)"},
      {"targets N mismatch", ErrorCode::shape_mismatch, "targets",
       [](Problem& p, CtcOptions&) {
         p.targets = Tensor::make(DType::i64, {2, p.S});
       },
       "(2, "},
      {"targets 3-D", ErrorCode::shape_mismatch, "targets",
       [](Problem& p, CtcOptions&) {
         p.targets = Tensor::make(DType::i64, {3, p.S, 1});
       },
       ""},
      {"input_lengths N mismatch", ErrorCode::shape_mismatch, "input_lengths",
       [](Problem& p, CtcOptions&) { p.il = Tensor::make(DType::i64, {4}); }, "(4)"},
      {"target_lengths N mismatch", ErrorCode::shape_mismatch, "target_lengths",
       [](Problem& p, CtcOptions&) { p.tl = Tensor::make(DType::i32, {2}); }, "(2)"},
      {"bad reduction", ErrorCode::invalid_value, "reduction",
       [](Problem&, CtcOptions& o) { o.reduction = static_cast<Reduction>(7); }, "7"},
  };
  for (const auto& ec : cases) {
    SCOPED_TRACE(ec.name);
    Case c;
    c.T = 6, c.N = 3, c.C = 5, c.reduction = Reduction::none;
    c.labels = {{1, 2}, {3, 3}, {4}};
    c.S = 4;
    Problem p = make_problem(c);
    CtcOptions o = options_of(c);
    ec.edit(p, o);
    Tensor loss = Tensor::make(p.acc(), p.loss_shape(), Layout::contiguous, kSentinel);
    Tensor nll = Tensor::make(p.acc(), p.sample_shape(), Layout::contiguous, kSentinel);
    Tensor alpha = Tensor::make(p.acc(), p.alpha_shape(), Layout::contiguous, kSentinel);
    Tensor grad = Tensor::make(DType::f64, {6, 3, 5}, Layout::contiguous, kSentinel);
    CtcOutputs out{loss.view, nll.view, alpha.view};
    try {
      lossfuse::ctc_forward(p.lp.view, p.targets.view, p.il.view, p.tl.view, o, out);
      ADD_FAILURE() << "forward did not throw";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ec.code) << e.what();
      EXPECT_EQ(e.argument(), ec.argument) << e.what();
      EXPECT_NE(e.actual().find(ec.actual_contains), std::string::npos) << e.what();
      EXPECT_FALSE(e.expected().empty());
    }
    try {
      lossfuse::ctc_backward(p.lp.view, p.targets.view, p.il.view, p.tl.view, std::nullopt, o, grad.view);
      ADD_FAILURE() << "backward did not throw";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), ec.argument) << e.what();
    }
    for (const Tensor* t : {&loss, &nll, &alpha, &grad})
      for (auto byte : t->storage) ASSERT_EQ(byte, kSentinel) << "an output was written";
  }

  // Concatenated targets whose lengths do not sum to their length; output shapes, dtypes and overlap.
  Case c;
  c.T = 6, c.N = 3, c.C = 5, c.concatenated = true, c.reduction = Reduction::mean;
  c.labels = {{1, 2}, {3, 3}, {4}};
  Problem p = make_problem(c);
  Tensor loss = Tensor::make(p.acc(), {}, Layout::contiguous, kSentinel);
  auto expect_error = [&](const std::string& arg, ErrorCode code, const std::function<void()>& fn) {
    try {
      fn();
      ADD_FAILURE() << arg << ": no throw";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), arg) << e.what();
      EXPECT_EQ(e.code(), code) << e.what();
    }
    for (auto byte : loss.storage) ASSERT_EQ(byte, kSentinel) << arg;
  };
  const CtcOptions o = options_of(c);
  {
    Tensor tl = p.tl;
    tl.set_int(2, 2);  // sum 6 != 5
    expect_error("target_lengths", ErrorCode::shape_mismatch, [&] {
      lossfuse::ctc_forward(p.lp.view, p.targets.view, p.il.view, tl.view, o, CtcOutputs{loss.view, {}, {}});
    });
  }
  {
    Tensor t = p.targets;
    t.set_int(3, 0);  // blank in sample 1, label 1 -> flat position 3
    try {
      lossfuse::ctc_forward(p.lp.view, t.view, p.il.view, p.tl.view, o, CtcOutputs{loss.view, {}, {}});
      ADD_FAILURE();
    } catch (const Error& e) {
      EXPECT_NE(e.actual().find("0 at position [3] (sample 1, label 1)"), std::string::npos) << e.what();
    }
  }
  Tensor wrong_dtype = Tensor::make(DType::f32, {}, Layout::contiguous, kSentinel);
  expect_error("loss", ErrorCode::dtype_mismatch, [&] {
    lossfuse::ctc_forward(p.lp.view, p.targets.view, p.il.view, p.tl.view, o, CtcOutputs{wrong_dtype.view, {}, {}});
  });
  Tensor per = Tensor::make(p.acc(), {3}, Layout::contiguous, kSentinel);
  expect_error("loss", ErrorCode::shape_mismatch, [&] {
    lossfuse::ctc_forward(p.lp.view, p.targets.view, p.il.view, p.tl.view, o, CtcOutputs{per.view, {}, {}});
  });
  Tensor alpha = Tensor::make(p.acc(), {6, 3, 4}, Layout::contiguous, kSentinel);  // L = 5
  expect_error("log_alpha", ErrorCode::shape_mismatch, [&] {
    lossfuse::ctc_forward(p.lp.view, p.targets.view, p.il.view, p.tl.view, o, CtcOutputs{loss.view, {}, alpha.view});
  });
  Tensor grad_bad = Tensor::make(DType::f32, {6, 3, 5}, Layout::contiguous, kSentinel);
  expect_error("grad_log_probs", ErrorCode::dtype_mismatch, [&] {
    lossfuse::ctc_backward(p.lp.view, p.targets.view, p.il.view, p.tl.view, std::nullopt, o, grad_bad.view);
  });
  Tensor grad = Tensor::make(p.c.dt, {6, 3, 5}, Layout::contiguous, kSentinel);
  Tensor up = Tensor::make(p.acc(), {3}, Layout::contiguous, kSentinel);
  expect_error("grad_loss", ErrorCode::shape_mismatch,
               [&] { lossfuse::ctc_backward(p.lp.view, p.targets.view, p.il.view, p.tl.view, up.view, o, grad.view); });
  expect_error("grad_log_probs", ErrorCode::bad_pointer, [&] {
    lossfuse::ctc_backward(p.lp.view, p.targets.view, p.il.view, p.tl.view, std::nullopt, o, p.lp.view);
  });
  // a gradient whose samples share memory (stride 0 over N): refused, not raced on
  expect_error("grad_log_probs", ErrorCode::bad_pointer, [&] {
    TensorView g = grad.view;
    g.strides[1] = 0;
    lossfuse::ctc_backward(p.lp.view, p.targets.view, p.il.view, p.tl.view, std::nullopt, o, g);
  });
  // a padded width no workspace can have (a stride-0 view claims it): an error, not a wrapped size
  {
    Tensor tl = Tensor::make(DType::i64, {3});
    for (std::int64_t b = 0; b < 3; ++b) tl.set_int(b, 0);
    TensorView t = p.targets.view;
    t.ndim = 2, t.shape[0] = 3, t.shape[1] = 512409557603043100, t.strides[0] = 0, t.strides[1] = 0;
    expect_error("targets", ErrorCode::invalid_value, [&] {
      lossfuse::ctc_forward(p.lp.view, t, p.il.view, tl.view, o, CtcOutputs{loss.view, {}, {}});
    });
    // with no sample the workspace is empty, but 2 S + 1 itself must not overflow
    Tensor lp0 = Tensor::make(p.c.dt, {6, 0, 5}), len0 = Tensor::make(DType::i64, {0});
    TensorView t0 = t;
    t0.shape[0] = 0, t0.shape[1] = std::numeric_limits<std::int64_t>::max() / 2 + 7;
    expect_error("targets", ErrorCode::invalid_value, [&] {
      lossfuse::ctc_forward(lp0.view, t0, len0.view, len0.view, o, CtcOutputs{loss.view, {}, {}});
    });
  }
  for (auto byte : grad.storage) ASSERT_EQ(byte, kSentinel);
  for (auto byte : grad_bad.storage) ASSERT_EQ(byte, kSentinel);
}

}  // namespace
}  // namespace lftest
