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

#include "cpu/ctc_harness.hpp"
#include "math/ctc_math.hpp"
#include "reference/ctc_reference.hpp"
#include "test_util.hpp"

namespace lftest {
namespace {

using namespace ctc;

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
    Problem p = make_problem(c);
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
    Problem pz = make_problem(c);
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
    Problem p = make_problem(c);
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
// Errors: each names its argument, and nothing is written to any output (the table: ctc_harness.hpp).

TEST(Ctc, ErrorsNameTheArgumentAndWriteNothing) {
  check_bad_inputs();

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
