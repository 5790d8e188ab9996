// The CTC test harness, for every backend: a case, its problem (inputs as tensors and their values as the library
// reads them), the float64 reference's expectations (tests/reference/ctc_reference.hpp, itself checked against a
// brute force in tests/cpu/ctc_test.cpp) and one run of forward and both backwards through a Mirror
// (tests/device_mirror.hpp), checked against them. tests/cpu/ctc_test.cpp runs it on the CPU,
// tests/cuda/ctc_cuda_test.cpp on CUDA.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "device_mirror.hpp"
#include "lossfuse/ctc.hpp"
#include "reference/ctc_reference.hpp"
#include "test_util.hpp"

namespace lftest::ctc {

using lossfuse::CtcOptions;
using lossfuse::CtcOutputs;

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

inline Problem make_problem(const Case& c) {
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

inline CtcOptions options_of(const Case& c) {
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

inline Expected expect(const Problem& p) {
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

// Forward (loss, nll, log_alpha when with_alpha), then the backward with and without the saved log_alpha, on the
// device `mem` gives (nullptr: the CPU): every operand and output through a Mirror, the outputs back on the host.
// `around` (when given) runs the three calls, e.g. captured into a CUDA graph.
inline Got run_lib(Problem& p, bool with_alpha = true, const DeviceMemory* mem = nullptr,
                   const std::function<void(const std::function<void()>&)>& around = nullptr) {
  Got g;
  g.loss = Tensor::make(p.acc(), p.loss_shape(), Layout::contiguous, kSentinel);
  g.nll = Tensor::make(p.acc(), p.sample_shape(), Layout::contiguous, kSentinel);
  g.alpha = Tensor::make(p.acc(), p.alpha_shape(), Layout::contiguous, kSentinel);
  const Layout gl = p.c.strided ? Layout::transposed : Layout::contiguous;
  g.grad = Tensor::make(p.c.dt, p.lp_shape(), gl, kSentinel);
  g.grad2 = Tensor::make(p.c.dt, p.lp_shape(), gl, kSentinel);
  Mirror m(mem);
  const TensorView lp = m(p.lp), targets = m(p.targets), il = m(p.il), tl = m(p.tl);
  CtcOutputs out;
  out.loss = m(g.loss);
  out.neg_log_likelihood = m(g.nll);
  if (with_alpha) out.log_alpha = m(g.alpha);
  const CtcOptions o = options_of(p.c);
  std::optional<TensorView> up;
  if (p.grad_loss) up = m(*p.grad_loss);
  const TensorView grad = m(g.grad), grad2 = m(g.grad2);
  const auto calls = [&] {
    lossfuse::ctc_forward(lp, targets, il, tl, o, out);
    lossfuse::ctc_backward(lp, targets, il, tl, up, o, grad, out.log_alpha);
    lossfuse::ctc_backward(lp, targets, il, tl, up, o, grad2);
  };
  if (around) {
    around(calls);
  } else {
    calls();
  }
  m.download();
  return g;
}

inline std::string describe(const Case& c) {
  return dname(c.dt) + " T=" + std::to_string(c.T) + " N=" + std::to_string(c.N) + " C=" + std::to_string(c.C) +
         " blank=" + std::to_string(c.blank) + " " + std::string(lossfuse::reduction_name(c.reduction)) +
         (c.zero_infinity ? " zero_inf" : "") + (c.concatenated ? " concat" : " padded") +
         (c.unbatched ? " unbatched" : "") + (c.strided ? " strided" : "") + " targets " + dname(c.tdt) + " lengths " +
         dname(c.ildt) + "/" + dname(c.tldt) + " seed " + std::to_string(c.seed);
}

inline void check_problem(Problem& p, const DeviceMemory* mem = nullptr) {
  const Case& c = p.c;
  const Expected e = expect(p);
  const Got g = run_lib(p, true, mem);
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

inline void check_case(const Case& c, const DeviceMemory* mem = nullptr) {
  SCOPED_TRACE(describe(c));
  Problem p = make_problem(c);
  check_problem(p, mem);
}

// ------------------------------------------------------------------------------------------------------------
// Bad inputs: each names its argument, the first bad one in core's order (lengths by sample, then labels in flat
// order), and nothing is written to any output. On a device the lengths and labels are checked there; host_lengths
// keeps the lengths on the host beside device operands.

struct ErrCase {
  std::string name;
  ErrorCode code;
  std::string argument;
  std::function<void(Problem&, CtcOptions&)> edit;
  std::string actual_contains;
  bool concatenated = false;
  std::function<void(Case&)> layout;  // the case's target form and layout, when not the padded (N, S) default
};

inline void check_bad_inputs(const DeviceMemory* mem = nullptr, bool host_lengths = false) {
  const std::vector<ErrCase> cases = {
      {"input_length > T", ErrorCode::invalid_value, "input_lengths",
       [](Problem& p, CtcOptions&) { p.il.set_int(1, 9); }, "9 at position [1]"},
      {"input_length < 0", ErrorCode::invalid_value, "input_lengths",
       [](Problem& p, CtcOptions&) { p.il.set_int(2, -1); }, "-1 at position [2]"},
      {"target_length > S", ErrorCode::invalid_value, "target_lengths",
       [](Problem& p, CtcOptions&) { p.tl.set_int(0, 5); }, "5 at position [0]"},
      {"target_length < 0", ErrorCode::invalid_value, "target_lengths",
       [](Problem& p, CtcOptions&) { p.tl.set_int(0, -2); }, "-2 at position [0]"},
      {"label out of range", ErrorCode::index_error, "targets",
       [](Problem& p, CtcOptions&) { p.targets.set_int(1 * p.S + 1, 5); }, "5 at position [1, 1]"},
      {"negative label", ErrorCode::index_error, "targets", [](Problem& p, CtcOptions&) { p.targets.set_int(0, -4); },
       "-4 at position [0, 0]"},
      {"label equal to blank", ErrorCode::index_error, "targets",
       [](Problem& p, CtcOptions&) { p.targets.set_int(2 * p.S + 0, 0); }, "0 at position [2, 0]"},
      {"a length before an earlier sample's label", ErrorCode::invalid_value, "input_lengths",
       [](Problem& p, CtcOptions&) { p.targets.set_int(0, 7), p.il.set_int(2, 7); }, "7 at position [2]"},
      {"the sample's input length before its target length", ErrorCode::invalid_value, "input_lengths",
       [](Problem& p, CtcOptions&) { p.tl.set_int(1, 9), p.il.set_int(1, -3); }, "-3 at position [1]"},
      {"an earlier sample's target length first", ErrorCode::invalid_value, "target_lengths",
       [](Problem& p, CtcOptions&) { p.tl.set_int(0, 9), p.il.set_int(1, -3); }, "9 at position [0]"},
      {"the first of two bad labels", ErrorCode::index_error, "targets",
       [](Problem& p, CtcOptions&) { p.targets.set_int(2 * p.S, 6), p.targets.set_int(1 * p.S + 1, -1); },
       "-1 at position [1, 1]"},
      {"concatenated: a label's flat position", ErrorCode::index_error, "targets",
       [](Problem& p, CtcOptions&) { p.targets.set_int(4, 0), p.targets.set_int(3, 0); },
       "0 at position [3] (sample 1, label 1)", true},
      {"concatenated: lengths not summing to the targets'", ErrorCode::shape_mismatch, "target_lengths",
       [](Problem& p, CtcOptions&) { p.tl.set_int(2, 2); }, "a sum of 6", true},
      {"concatenated: after a sample of no labels", ErrorCode::index_error, "targets",
       [](Problem& p, CtcOptions&) { p.targets.set_int(2, 0); }, "0 at position [2] (sample 2, label 0)", true,
       [](Case& c) {
         c.labels = {{1, 2}, {}, {4, 3}};
       }},
      {"unbatched (S) targets", ErrorCode::index_error, "targets",
       [](Problem& p, CtcOptions&) { p.targets.set_int(1, 0); }, "0 at position [1]", false,
       [](Case& c) {
         c.unbatched = true, c.labels = {{1, 2}};
       }},
      {"unbatched (1, S) targets", ErrorCode::index_error, "targets",
       [](Problem& p, CtcOptions&) { p.targets.set_int(1, 7); }, "7 at position [0, 1]", false,
       [](Case& c) {
         c.unbatched = true, c.targets_row = true, c.labels = {{1, 2}};
       }},
      {"transposed targets, strided lengths", ErrorCode::index_error, "targets",
       [](Problem& p, CtcOptions&) { p.targets.set_int(2 * p.S, -2); }, "-2 at position [2, 0]", false,
       [](Case& c) { c.strided = true; }},
      {"strided lengths", ErrorCode::invalid_value, "target_lengths",
       [](Problem& p, CtcOptions&) { p.tl.set_int(2, 6); }, "6 at position [2]", false,
       [](Case& c) { c.strided = true; }},
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
    c.T = 6, c.N = 3, c.C = 5, c.reduction = Reduction::none, c.concatenated = ec.concatenated;
    c.labels = {{1, 2}, {3, 3}, {4}};
    c.S = 4;
    if (ec.layout) ec.layout(c);
    Problem p = make_problem(c);
    CtcOptions o = options_of(c);
    const std::vector<std::int64_t> lp_shape = p.lp_shape();
    ec.edit(p, o);
    Tensor loss = Tensor::make(p.acc(), p.loss_shape(), Layout::contiguous, kSentinel);
    Tensor nll = Tensor::make(p.acc(), p.sample_shape(), Layout::contiguous, kSentinel);
    Tensor alpha = Tensor::make(p.acc(), p.alpha_shape(), Layout::contiguous, kSentinel);
    Tensor grad = Tensor::make(DType::f64, lp_shape, Layout::contiguous, kSentinel);
    Mirror m(mem);
    const TensorView lp = m(p.lp), targets = m(p.targets);
    const TensorView il = host_lengths ? p.il.view : m(p.il), tl = host_lengths ? p.tl.view : m(p.tl);
    const CtcOutputs out{m(loss), m(nll), m(alpha)};
    const TensorView g = m(grad);
    auto expect_error = [&](const char* entry, const std::function<void()>& call) {
      try {
        call();
        ADD_FAILURE() << entry << " did not throw";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ec.code) << entry << ": " << e.what();
        EXPECT_EQ(e.argument(), ec.argument) << entry << ": " << e.what();
        EXPECT_NE(e.actual().find(ec.actual_contains), std::string::npos) << entry << ": " << e.what();
        EXPECT_FALSE(e.expected().empty());
      }
    };
    expect_error("forward", [&] { lossfuse::ctc_forward(lp, targets, il, tl, o, out); });
    expect_error("backward", [&] { lossfuse::ctc_backward(lp, targets, il, tl, std::nullopt, o, g); });
    m.download();
    for (const Tensor* t : {&loss, &nll, &alpha, &grad})
      for (auto byte : t->storage) ASSERT_EQ(byte, kSentinel) << "an output was written";
  }
}

}  // namespace lftest::ctc
