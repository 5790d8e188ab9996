// The eleven elementwise losses forward and backward on the CPU: the harness's spec tables
// (tests/cpu/pointwise_harness.hpp) against the float64 reference, then hand values from torch, central differences
// for every configuration, determinism across thread counts and the argument errors of every loss. Each loss's own
// edges are in pointwise_edges_test.cpp.
#include "lossfuse/pointwise.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cpu/pointwise_harness.hpp"
#include "error_harness.hpp"
#include "lossfuse/parallel.hpp"
#include "test_util.hpp"

namespace lftest::pointwise {
namespace {

class Pointwise : public ::testing::TestWithParam<Spec> {};
TEST_P(Pointwise, MatchesReference) { run_all(GetParam()); }

auto spec_name = [](const auto& i) { return i.param.name; };
INSTANTIATE_TEST_SUITE_P(Options, Pointwise, ::testing::ValuesIn(option_specs()), spec_name);
INSTANTIATE_TEST_SUITE_P(Configs, Pointwise, ::testing::ValuesIn(config_specs()), spec_name);
INSTANTIATE_TEST_SUITE_P(Large, Pointwise, ::testing::ValuesIn(large_specs()), spec_name);
INSTANTIATE_TEST_SUITE_P(Layouts, Pointwise, ::testing::ValuesIn(layout_specs()), spec_name);
INSTANTIATE_TEST_SUITE_P(Edge, Pointwise, ::testing::ValuesIn(edge_specs()), spec_name);
INSTANTIATE_TEST_SUITE_P(NonFinite, Pointwise, ::testing::ValuesIn(non_finite_specs()), spec_name);

// ---- hand values (from CPU torch 2.15) ------------------------------------------------------------------------

TEST(PointwiseReference, HandValuesFromTorch) {
  lfref::PwInput in;
  in.x = {0, 1, 2, -1, 3};
  in.y = {0, 0, 0, 0, 0};
  in.weight = {1, 2, 3, 4, 5};
  in.u = 0x1p-53, in.compute = lfref::kF64, in.out = lfref::kF64;
  in.loss = PwLoss::mse;
  auto r = lfref::pointwise(in);
  EXPECT_DOUBLE_EQ(r.loss, 4.2);
  EXPECT_DOUBLE_EQ(r.gx[1], 0.26666666666666666);
  in.loss = PwLoss::l1;
  r = lfref::pointwise(in);
  EXPECT_DOUBLE_EQ(r.loss, 1.8);
  EXPECT_DOUBLE_EQ(r.gx[3], -0.26666666666666666);
  EXPECT_EQ(r.gx[0], 0.0);
  in.loss = PwLoss::huber, in.opts.param = 1.0;
  r = lfref::pointwise(in);
  EXPECT_DOUBLE_EQ(r.loss, 4.0);  // mean(w l): divides by numel
  EXPECT_DOUBLE_EQ(r.gx[4], 1.0);
  in.weight.clear();
  in.reduction = Reduction::none, in.opts.param = 2.0;
  r = lfref::pointwise(in);
  EXPECT_EQ(r.elem_loss, (std::vector<double>{0, 0.5, 2, 0.5, 4}));
  EXPECT_EQ(r.gx, (std::vector<double>{0, 1, 2, -1, 2}));
  in.loss = PwLoss::smooth_l1, in.opts.param = 0.0;
  r = lfref::pointwise(in);
  EXPECT_EQ(r.elem_loss, (std::vector<double>{0, 1, 2, 1, 3}));
  EXPECT_EQ(r.gx, (std::vector<double>{0, 1, 1, -1, 1}));  // torch 2.15: 0 at d == 0 with beta == 0
  in.opts.param = 1.0;
  r = lfref::pointwise(in);
  EXPECT_EQ(r.elem_loss, (std::vector<double>{0, 0.5, 1.5, 0.5, 2.5}));
  EXPECT_EQ(r.gx, (std::vector<double>{0, 1, 1, -1, 1}));
  // l1 at NaN: torch's sign(NaN) is 0, so the gradient is 0; smooth_l1 / huber give NaN.
  in.x = {kNaN, 1, kInf}, in.y = {0, kNaN, kInf};
  in.loss = PwLoss::l1;
  r = lfref::pointwise(in);
  EXPECT_EQ(r.gx, (std::vector<double>{0, 0, 0}));
  EXPECT_TRUE(std::isnan(r.elem_loss[0]));
  // F.kl_div(x, y, reduction='batchmean') with x = log([0.25, 0.5]) rows [[., .]], y = [[0.5, 0.5]]: size(0) = 1
  in = lfref::PwInput{};
  in.loss = PwLoss::kl_div, in.opts.batchmean = true, in.rows = 1;
  in.x = {std::log(0.25), std::log(0.5)}, in.y = {0.5, 0.5};
  in.u = 0x1p-53, in.compute = lfref::kF64, in.out = lfref::kF64;
  r = lfref::pointwise(in);
  EXPECT_NEAR(r.loss, 0.5 * std::log(2.0), 1e-15);
  // F.margin_ranking_loss(1, 2, target=1, margin=0.5, reduction='sum') = 1.5, d/dinput1 = -1, d/dtarget = 1
  in = lfref::PwInput{};
  in.loss = PwLoss::margin_ranking, in.opts.margin = 0.5, in.reduction = Reduction::sum;
  in.x = {1}, in.y = {2}, in.z = {1};
  r = lfref::pointwise(in);
  EXPECT_EQ(r.loss, 1.5);
  EXPECT_EQ(r.gx[0], -1.0);
  EXPECT_EQ(r.gz[0], 1.0);
}

// A few torch facts on the library directly, float32.
TEST(PointwiseTorch, HandValues) {
  Tensor x = Tensor::make(DType::f32, {5}), y = Tensor::make(DType::f32, {5}), w = Tensor::make(DType::f32, {5});
  for (int i = 0; i < 5; ++i) x.set(i, std::vector<double>{0, 1, 2, -1, 3}[i]), y.set(i, 0), w.set(i, i + 1);
  Tensor loss = Tensor::make(DType::f32, {});
  lossfuse::mse_forward(x.view, y.view, {Reduction::mean, w.view}, loss.view);
  EXPECT_FLOAT_EQ(static_cast<float>(loss.get(0)), 4.2f);
  lossfuse::huber_forward(x.view, y.view, {Reduction::mean, 1.0, w.view}, loss.view);
  EXPECT_FLOAT_EQ(static_cast<float>(loss.get(0)), 4.0f);
  Tensor g = Tensor::make(DType::f32, {5});
  lossfuse::smooth_l1_backward(x.view, y.view, std::nullopt, {Reduction::sum, 0.0}, {g.view, std::nullopt});
  EXPECT_EQ(g.values(), (std::vector<double>{0, 1, 1, -1, 1}));
}

// torch 2.15 CPU: F.l1_loss(x=[nan, 1, inf], y=[0, nan, inf], reduction='sum') -> grad_input [0, 0, 0],
// grad_target [-0, -0, -0] (and the same for smooth_l1_loss with beta=0).
TEST(PointwiseTorch, L1GradientAtNanDifferenceIsZero) {
  Tensor x = Tensor::make(DType::f32, {3}), y = Tensor::make(DType::f32, {3});
  x.set(0, kNaN), x.set(1, 1), x.set(2, kInf);
  y.set(0, 0), y.set(1, kNaN), y.set(2, kInf);
  Tensor gx = Tensor::make(DType::f32, {3}), gy = Tensor::make(DType::f32, {3});
  lossfuse::l1_backward(x.view, y.view, std::nullopt, {Reduction::sum, std::nullopt}, {gx.view, gy.view});
  EXPECT_EQ(gx.values(), (std::vector<double>{0, 0, 0}));
  EXPECT_EQ(gy.values(), (std::vector<double>{0, 0, 0}));
  lossfuse::smooth_l1_backward(x.view, y.view, std::nullopt, {Reduction::sum, 0.0}, {gx.view, gy.view});
  EXPECT_EQ(gx.values(), (std::vector<double>{0, 0, 0}));
}

// ---- central finite differences in float64 --------------------------------------------------------------------

// Every configuration and reduction: the backward against central differences of sum(g * loss) over each operand
// torch differentiates, values kept off the kinks. Budget: 1e-6 relative, plus the forward's rounding (a few u of the
// sum of |g l|) over the step.
TEST(PointwiseFiniteDifferences, Float64) {
  std::uint64_t k = 0;
  for (const Config& c : configs())
    for (Reduction red : kReds) {
      if (!usable(c, red)) continue;
      Spec s;
      s.c = c, s.dt = DType::f64, s.red = red, s.shape = {2, 5}, s.weight = true, s.smooth = true;
      s.up = red == Reduction::none ? Up::per_elem : Up::scalar, s.up_scalar = 1.7;
      s.seed = 4000 + ++k;
      SCOPED_TRACE(base_name(s));
      Problem p = build(s);
      const std::int64_t n = 10;
      Tensor loss = Tensor::make(DType::f64, red == Reduction::none ? s.shape : std::vector<std::int64_t>{});
      const auto total = [&] {
        pw_forward(p.args(), loss.view);
        double t = 0, mag = 0;
        for (std::int64_t i = 0; i < loss.numel(); ++i) {
          const double g = p.up->v[red == Reduction::none ? i : 0] * loss.get(i);
          t += g, mag += std::fabs(g);
        }
        return std::pair{t, mag};
      };
      Tensor gx = Tensor::make(DType::f64, s.shape), gy = Tensor::make(DType::f64, s.shape);
      Tensor gz = Tensor::make(DType::f64, s.shape);
      const bool want_y = lfref::pw_y_grad(c.loss), want_z = p.z && lfref::pw_z_grad(c.loss);
      PointwiseGrads g{gx.view, std::nullopt, std::nullopt};
      if (want_y) g.target = gy.view;
      if (want_z) g.var = gz.view;
      pw_backward(p.args(), p.upv(), g);
      const auto fd = [&](Operand& op, const Tensor& grad, const char* what) {
        for (std::int64_t i = 0; i < n; ++i) {
          const double v = op.store.get(i), h = 1e-6 * std::max(1.0, std::fabs(v));
          op.store.set(i, v + h);
          const auto [lp, mag] = total();
          op.store.set(i, v - h);
          const double lm = total().first;
          op.store.set(i, v);
          const double num = (lp - lm) / (2 * h);
          EXPECT_NEAR(grad.get(i), num, 1e-6 * (1 + std::fabs(num)) + 16 * 0x1p-53 * mag / h)
              << what << " [" << i << "]";
        }
      };
      fd(p.x, gx, "input");
      if (want_y) fd(p.y, gy, "target");
      if (want_z) fd(*p.z, gz, "z");
    }
}

// ---- inputs whose elements overlap ----------------------------------------------------------------------------

// Sliding windows (strides (1, 1): element [r, c] is buffer[r + c]), a layout torch allows for inputs (unfold,
// as_strided). Adjacent dims with equal strides must not be merged into one run (core's merge_dims): every loss of
// d = x - y against the elements read one by one, reduction none and sum, with and without a weight.
TEST(PointwiseLayouts, OverlappingInputWindows) {
  Tensor buf = Tensor::make(DType::f32, {11});
  for (std::int64_t i = 0; i < 11; ++i) buf.set(i, 0.25 * static_cast<double>(i * i % 7) - 0.5);
  TensorView x = buf.view;
  x.ndim = 2, x.shape[0] = 5, x.shape[1] = 7, x.strides[0] = 1, x.strides[1] = 1;
  Tensor y = Tensor::make(DType::f32, {5, 7}), w = Tensor::make(DType::f32, {5, 7});
  for (std::int64_t i = 0; i < 35; ++i) y.set(i, 0.125 * static_cast<double>(i % 5)), w.set(i, 1 + i % 3);
  for (const Config& c : configs()) {
    if (!lfref::pw_of_difference(c.loss)) continue;
    SCOPED_TRACE(c.name);
    std::vector<double> want(35), wsum(35);
    for (std::int64_t r = 0; r < 5; ++r)
      for (std::int64_t k = 0; k < 7; ++k) {
        const double l = lfref::pw_elem(c.loss, c.o, buf.get(r + k), y.get(r * 7 + k), 0).l;
        want[r * 7 + k] = l, wsum[r * 7 + k] = l * w.get(r * 7 + k);
      }
    for (bool weighted : {false, true}) {
      const PwArgs a{c.loss,
                     c.o,
                     Reduction::none,
                     x,
                     y.view,
                     std::nullopt,
                     weighted ? std::optional<TensorView>(w.view) : std::nullopt};
      Tensor loss = Tensor::make(DType::f32, {5, 7});
      pw_forward(a, loss.view);
      const bool takes = weighted && lfref::pw_takes_weight(c.loss);
      for (std::int64_t i = 0; i < 35; ++i) EXPECT_NEAR(loss.get(i), takes ? wsum[i] : want[i], 1e-5) << i;
    }
  }
}

// ---- determinism across thread counts ------------------------------------------------------------------------

// Every configuration: the reduced losses and the input gradient bitwise the same on 1, 2 and 3 threads, from the
// separate entries and from the fused one.
TEST(PointwiseMisc, DeterministicAcrossThreads) {
  std::uint64_t k = 0;
  for (const Config& c : configs()) {
    Spec s;
    s.c = c, s.red = Reduction::mean, s.shape = {3, 40009}, s.weight = true, s.seed = 5000 + ++k;
    SCOPED_TRACE(base_name(s));
    const Problem p = build(s);
    std::vector<std::uint8_t> sum0, mean0, grad0, fused0;
    for (int threads : {1, 2, 3, 1}) {
      ThreadsGuard guard(threads);
      Tensor sum = Tensor::make(DType::f32, {}), mean = Tensor::make(DType::f32, {});
      Tensor grad = Tensor::make(DType::f32, s.shape);
      Tensor fused_loss = Tensor::make(DType::f32, {}), fused_grad = Tensor::make(DType::f32, s.shape);
      if (!c.o.batchmean) pw_forward(p.args(Reduction::sum), sum.view);
      pw_forward(p.args(), mean.view);
      pw_backward(p.args(), std::nullopt, {grad.view, std::nullopt, std::nullopt});
      pw_forward_backward(p.args(), fused_loss.view, {fused_grad.view, std::nullopt, std::nullopt});
      std::vector<std::uint8_t> fused = fused_loss.storage;
      fused.insert(fused.end(), fused_grad.storage.begin(), fused_grad.storage.end());
      if (mean0.empty()) {
        sum0 = sum.storage, mean0 = mean.storage, grad0 = grad.storage, fused0 = fused;
        EXPECT_TRUE(close_one("loss", mean.get(0), p.ref.loss, p.ref.loss_tol, DType::f32));
      }
      EXPECT_TRUE(sum.storage == sum0) << threads << " threads";
      EXPECT_TRUE(mean.storage == mean0) << threads << " threads";
      EXPECT_TRUE(grad.storage == grad0) << threads << " threads";
      EXPECT_TRUE(fused == fused0) << threads << " threads (fused)";
    }
  }
}

// ---- errors ---------------------------------------------------------------------------------------------------

constexpr std::initializer_list<PwLoss> kAll = {PwLoss::mse,           PwLoss::l1,
                                                PwLoss::smooth_l1,     PwLoss::huber,
                                                PwLoss::bce,           PwLoss::bce_with_logits,
                                                PwLoss::kl_div,        PwLoss::poisson_nll,
                                                PwLoss::gaussian_nll,  PwLoss::hinge_embedding,
                                                PwLoss::margin_ranking};
constexpr std::initializer_list<PwLoss> kWeighted = {PwLoss::mse, PwLoss::l1, PwLoss::huber, PwLoss::bce,
                                                     PwLoss::bce_with_logits};
constexpr std::initializer_list<PwLoss> kTargetGrad = {PwLoss::mse,          PwLoss::l1,
                                                       PwLoss::smooth_l1,    PwLoss::huber,
                                                       PwLoss::bce,          PwLoss::bce_with_logits,
                                                       PwLoss::kl_div,       PwLoss::poisson_nll,
                                                       PwLoss::gaussian_nll, PwLoss::margin_ranking};
constexpr std::initializer_list<PwLoss> kThird = {PwLoss::bce_with_logits, PwLoss::gaussian_nll,
                                                  PwLoss::margin_ranking};
constexpr std::initializer_list<PwLoss> kThirdGrad = {PwLoss::gaussian_nll, PwLoss::margin_ranking};

// The arguments' names in the library's messages, by loss.
struct Names {
  const char *x = "input", *y = "target", *z = "", *gx = "grad_input", *gy = "grad_target", *gz = "";
};
Names names_of(PwLoss l) {
  if (l == PwLoss::margin_ranking) return {"input1", "input2", "target", "grad_input1", "grad_input2", "grad_target"};
  if (l == PwLoss::gaussian_nll) return {"input", "target", "var", "grad_input", "grad_target", "grad_var"};
  if (l == PwLoss::bce_with_logits) return {"input", "target", "pos_weight", "grad_input", "grad_target", ""};
  return {};
}
// An argument's name: the same for every loss, or one of Names.
struct Arg {
  Arg(const char* fixed) : fixed_(fixed) {}       // NOLINT(google-explicit-constructor): written as a string
  Arg(const char* Names::*slot) : slot_(slot) {}  // NOLINT(google-explicit-constructor)
  [[nodiscard]] std::string of(PwLoss l) const { return fixed_ != nullptr ? fixed_ : names_of(l).*slot_; }

 private:
  const char* fixed_ = nullptr;
  const char* Names::*slot_ = nullptr;
};

// Valid operands of every loss ((4, 5), float32: x in [0, 0.76], y 0.5, z and the weight 1) and guarded outputs.
struct ErrFixture : GuardedBuffers {
  Tensor input = Tensor::make(DType::f32, {4, 5}, Layout::contiguous, kSentinel);
  Tensor target = Tensor::make(DType::f32, {4, 5}, Layout::contiguous, kSentinel);
  Tensor third = Tensor::make(DType::f32, {4, 5}, Layout::contiguous, kSentinel);
  Tensor weight = Tensor::make(DType::f32, {4, 5}, Layout::contiguous, kSentinel);
  Tensor loss = Tensor::make(DType::f32, {}, Layout::contiguous, kSentinel);
  Tensor gx = Tensor::make(DType::f32, {4, 5}, Layout::contiguous, kSentinel);
  Tensor gy = Tensor::make(DType::f32, {4, 5}, Layout::contiguous, kSentinel);
  Tensor gz = Tensor::make(DType::f32, {4, 5}, Layout::contiguous, kSentinel);
  Tensor up = Tensor::make(DType::f32, {}, Layout::contiguous, kSentinel);
  PwArgs a;
  ErrFixture() {
    for (std::int64_t i = 0; i < 20; ++i) {
      input.set(i, 0.04 * static_cast<double>(i)), target.set(i, 0.5), third.set(i, 1.0), weight.set(i, 1.0);
    }
    up.set(0, 1.0);
    guard("input", input), guard("target", target), guard("third", third), guard("weight", weight);
    guard("loss", loss), guard("grad_input", gx), guard("grad_target", gy), guard("grad_z", gz);
    guard("grad_loss", up);
  }
  // The loss's valid call: pos_weight given to bce_with_logits, every gradient the loss has.
  void set_loss(PwLoss l) {
    a.loss = l, a.opts = PwOpts{}, a.opts.pos_weight = true, a.red = Reduction::mean;
    a.x = input.view, a.y = target.view, a.z = third.view, a.weight = weight.view;
  }
  [[nodiscard]] PointwiseGrads grads() const {
    PointwiseGrads g{gx.view, std::nullopt, std::nullopt};
    if (lfref::pw_y_grad(a.loss)) g.target = gy.view;
    if (lfref::pw_z_grad(a.loss)) g.var = gz.view;
    return g;
  }
};
struct Views {
  std::optional<TensorView> input, target, third, weight, loss, gx, gy, gz, up;
};
// fused: <loss>_forward_backward, which takes the forward's loss and the backward's gradients (not grad_loss)
enum class Entry { forward, backward, fused };

void expect_error(const std::function<Views(ErrFixture&)>& setup, std::initializer_list<ErrorCode> codes,
                  const Arg& argument,
                  std::initializer_list<Entry> entries = {Entry::forward, Entry::backward, Entry::fused},
                  std::initializer_list<PwLoss> losses = kAll) {
  for (PwLoss l : losses) {
    SCOPED_TRACE(names_of(l).x + std::string(" of loss ") + std::to_string(static_cast<int>(l)));
    expect_entry_errors<ErrFixture, Entry, Views>(
        [&](ErrFixture& f) {
          f.set_loss(l);
          return setup(f);
        },
        codes, entries,
        [](const ErrFixture& f, Entry e, const Views& v) {
          PwArgs a = f.a;
          a.x = v.input.value_or(a.x), a.y = v.target.value_or(a.y), a.z = v.third.value_or(*a.z);
          a.weight = v.weight.value_or(*a.weight);
          if (e == Entry::forward) return pw_forward(a, v.loss.value_or(f.loss.view));
          PointwiseGrads g = f.grads();
          g.input = v.gx.value_or(*g.input);
          if (v.gy) g.target = v.gy;
          if (v.gz) g.var = v.gz;
          if (e == Entry::fused) return pw_forward_backward(a, v.loss.value_or(f.loss.view), g);
          pw_backward(a, v.up ? v.up : std::optional<TensorView>(f.up.view), g);
        },
        [](Entry e) {
          return std::string(e == Entry::forward ? "forward" : e == Entry::backward ? "backward" : "forward_backward");
        },
        argument.of(l));
  }
}
// kBoth: every entry; kFwd: those writing the loss; kBwd: those writing gradients; kUp: the one taking grad_loss.
constexpr std::initializer_list<Entry> kBoth = {Entry::forward, Entry::backward, Entry::fused};
constexpr std::initializer_list<Entry> kFwd = {Entry::forward, Entry::fused}, kBwd = {Entry::backward, Entry::fused};
constexpr std::initializer_list<Entry> kUp = {Entry::backward};
constexpr Reduction kNone = Reduction::none, kMean = Reduction::mean;

// Setups for expect_error: one view of the call replaced, after setting the reduction.
using Slot = std::optional<TensorView> Views::*;
using ErrSetup = std::function<Views(ErrFixture&)>;
// ... by a fixed view.
ErrSetup put(Slot slot, const TensorView& t, Reduction red = kMean) {
  return [slot, t, red](ErrFixture& f) {
    f.a.red = red;
    Views v;
    v.*slot = t;
    return v;
  };
}
// ... by one of the fixture's own buffers (an alias of it).
ErrSetup alias(Slot slot, Tensor ErrFixture::*buffer) {
  return [slot, buffer](ErrFixture& f) {
    Views v;
    v.*slot = (f.*buffer).view;
    return v;
  };
}
// ... by that buffer's view with a null data pointer.
ErrSetup null_data(Slot slot, Tensor ErrFixture::*buffer) {
  return [slot, setup = alias(slot, buffer)](ErrFixture& f) {
    Views v = setup(f);
    (v.*slot)->data = nullptr;
    return v;
  };
}
// ... by editing the options.
ErrSetup options(const std::function<void(PwArgs&)>& edit) {
  return [edit](ErrFixture& f) {
    edit(f.a);
    return Views{};
  };
}

TEST(PointwiseErrors, ValidFixtureRuns) {
  for (PwLoss l : kAll) {
    ErrFixture f;
    f.set_loss(l);
    EXPECT_NO_THROW(pw_forward(f.a, f.loss.view));
    EXPECT_NO_THROW(pw_backward(f.a, f.up.view, f.grads()));
    EXPECT_NO_THROW(pw_backward(f.a, std::nullopt, {std::nullopt, std::nullopt, std::nullopt}));
    EXPECT_NO_THROW(pw_forward_backward(f.a, f.loss.view, f.grads()));
  }
}
TEST(PointwiseErrors, OperandDtypeAndShape) {
  static const Tensor t64 = Tensor::make(DType::f64, {4, 5}), t16 = Tensor::make(DType::bf16, {4, 5}),
                      ti = Tensor::make(DType::i64, {4, 5});
  static const Tensor t54 = Tensor::make(DType::f32, {5, 4}), t4 = Tensor::make(DType::f32, {4}),
                      t451 = Tensor::make(DType::f32, {4, 5, 1});
  for (const Tensor* t : {&t64, &t16, &ti}) {
    expect_error(put(&Views::target, t->view), {ErrorCode::dtype_mismatch}, &Names::y);
    expect_error(put(&Views::third, t->view), {ErrorCode::dtype_mismatch}, &Names::z, kBoth, kThird);
  }
  for (const Tensor* t : {&t54, &t4, &t451}) {
    expect_error(put(&Views::target, t->view), {ErrorCode::shape_mismatch}, &Names::y);
    expect_error(put(&Views::third, t->view), {ErrorCode::shape_mismatch}, &Names::z, kBoth, kThird);
  }
  static const Tensor xi = Tensor::make(DType::i32, {4, 5});
  expect_error(put(&Views::input, xi.view), {ErrorCode::dtype_mismatch}, &Names::x);
}
TEST(PointwiseErrors, WeightDtypeAndShape) {
  static const Tensor w64 = Tensor::make(DType::f64, {4, 5}), w5 = Tensor::make(DType::f32, {5}),
                      w54 = Tensor::make(DType::f32, {5, 4});
  expect_error(put(&Views::weight, w64.view), {ErrorCode::dtype_mismatch}, "weight", kBoth, kWeighted);
  expect_error(put(&Views::weight, w5.view), {ErrorCode::shape_mismatch}, "weight", kBoth, kWeighted);
  expect_error(put(&Views::weight, w54.view), {ErrorCode::shape_mismatch}, "weight", kBoth, kWeighted);
}
TEST(PointwiseErrors, LossDtypeShapeLayout) {
  static const Tensor l64 = Tensor::make(DType::f64, {}), l16 = Tensor::make(DType::f16, {}),
                      l45 = Tensor::make(DType::f32, {4, 5}), l0 = Tensor::make(DType::f32, {}),
                      l54 = Tensor::make(DType::f32, {5, 4}), lt = Tensor::make(DType::f32, {4, 5}, Layout::transposed);
  expect_error(put(&Views::loss, l64.view), {ErrorCode::dtype_mismatch}, "loss", kFwd);
  expect_error(put(&Views::loss, l16.view), {ErrorCode::dtype_mismatch}, "loss", kFwd);
  expect_error(put(&Views::loss, l45.view), {ErrorCode::shape_mismatch}, "loss", kFwd);
  expect_error(put(&Views::loss, l0.view, kNone), {ErrorCode::shape_mismatch}, "loss", kFwd);
  expect_error(put(&Views::loss, l54.view, kNone), {ErrorCode::shape_mismatch}, "loss", kFwd);
  expect_error(put(&Views::loss, lt.view, kNone), {ErrorCode::invalid_value, ErrorCode::bad_pointer}, "loss", kFwd);
}
TEST(PointwiseErrors, GradLossDtypeAndShape) {
  static const Tensor u64 = Tensor::make(DType::f64, {}), u16 = Tensor::make(DType::bf16, {}),
                      u45 = Tensor::make(DType::f32, {4, 5}), u0 = Tensor::make(DType::f32, {}),
                      u5 = Tensor::make(DType::f32, {5});
  expect_error(put(&Views::up, u64.view), {ErrorCode::dtype_mismatch}, "grad_loss", kUp);
  expect_error(put(&Views::up, u16.view), {ErrorCode::dtype_mismatch}, "grad_loss", kUp);
  expect_error(put(&Views::up, u45.view), {ErrorCode::shape_mismatch}, "grad_loss", kUp);
  expect_error(put(&Views::up, u0.view, kNone), {ErrorCode::shape_mismatch}, "grad_loss", kUp);
  expect_error(put(&Views::up, u5.view, kNone), {ErrorCode::shape_mismatch}, "grad_loss", kUp);
}
TEST(PointwiseErrors, GradientDtypeShapeStride) {
  static const Tensor g64 = Tensor::make(DType::f64, {4, 5}), g54 = Tensor::make(DType::f32, {5, 4}),
                      g20 = Tensor::make(DType::f32, {20}), g5 = Tensor::make(DType::f32, {1, 5}),
                      g4 = Tensor::make(DType::f32, {4, 1});
  struct G {
    Slot slot;
    const char* Names::*name;
    std::initializer_list<PwLoss> losses;
  };
  for (const G& s : {G{&Views::gx, &Names::gx, kAll}, G{&Views::gy, &Names::gy, kTargetGrad},
                     G{&Views::gz, &Names::gz, kThirdGrad}}) {
    expect_error(put(s.slot, g64.view), {ErrorCode::dtype_mismatch}, s.name, kBwd, s.losses);
    expect_error(put(s.slot, g54.view), {ErrorCode::shape_mismatch}, s.name, kBwd, s.losses);
    expect_error(put(s.slot, g20.view), {ErrorCode::shape_mismatch}, s.name, kBwd, s.losses);
    // a zero stride on a dim of size > 1: repeated elements
    TensorView rows = g5.view, cols = g4.view;
    rows.shape[0] = 4, rows.strides[0] = 0;
    cols.shape[1] = 5, cols.strides[1] = 0;
    for (const TensorView& t : {rows, cols}) {
      expect_error(put(s.slot, t), {ErrorCode::bad_pointer, ErrorCode::invalid_value}, s.name, kBwd, s.losses);
    }
    // no zero stride, but rows that overlap: strides (1, 1) and (4, 1) over a (4, 5) gradient
    for (std::int64_t row_stride : {1, 4}) {
      TensorView t = g20.view;
      t.ndim = 2, t.shape[0] = 4, t.shape[1] = 5, t.strides[0] = row_stride, t.strides[1] = 1;
      expect_error(put(s.slot, t), {ErrorCode::bad_pointer}, s.name, kBwd, s.losses);
    }
  }
}
TEST(PointwiseErrors, GradientsTheLossDoesNotGive) {
  static const Tensor g = Tensor::make(DType::f32, {4, 5});
  expect_error(put(&Views::gy, g.view), {ErrorCode::invalid_value}, "grad_target", kBwd, {PwLoss::hinge_embedding});
  expect_error(put(&Views::gz, g.view), {ErrorCode::invalid_value}, "", kBwd,
               {PwLoss::mse, PwLoss::bce, PwLoss::bce_with_logits, PwLoss::kl_div, PwLoss::hinge_embedding});
}
TEST(PointwiseErrors, OverlappingBuffers) {
  // a gradient over an operand; two gradients on one buffer
  expect_error(alias(&Views::gx, &ErrFixture::input), {ErrorCode::bad_pointer}, &Names::gx, kBwd);
  expect_error(alias(&Views::gy, &ErrFixture::target), {ErrorCode::bad_pointer}, &Names::gy, kBwd, kTargetGrad);
  expect_error(alias(&Views::gy, &ErrFixture::input), {ErrorCode::bad_pointer}, &Names::gy, kBwd, kTargetGrad);
  expect_error(alias(&Views::gx, &ErrFixture::third), {ErrorCode::bad_pointer}, &Names::gx, kBwd, kThird);
  expect_error(alias(&Views::gz, &ErrFixture::target), {ErrorCode::bad_pointer}, &Names::gz, kBwd, kThirdGrad);
  expect_error(alias(&Views::gy, &ErrFixture::gx), {ErrorCode::bad_pointer}, &Names::gx, kBwd, kTargetGrad);
  expect_error(alias(&Views::gz, &ErrFixture::gy), {ErrorCode::bad_pointer}, &Names::gy, kBwd, kThirdGrad);
  // the two gradients shifted by one element
  static Tensor big = Tensor::make(DType::f32, {64}, Layout::contiguous, kSentinel);
  expect_error(
      [](ErrFixture&) {
        Views v;
        v.gx = TensorView::contiguous(big.storage.data(), DType::f32, {4, 5});
        v.gy = TensorView::contiguous(big.storage.data() + 4 * 19, DType::f32, {4, 5});
        return v;
      },
      {ErrorCode::bad_pointer}, &Names::gx, kBwd, kTargetGrad);
  // a gradient over the weight / the upstream gradient; the loss over an operand
  expect_error(alias(&Views::gx, &ErrFixture::weight), {ErrorCode::bad_pointer}, &Names::gx, kBwd, kWeighted);
  const auto over = [](Slot slot, Tensor ErrFixture::*buffer, Reduction red, std::vector<std::int64_t> shape) {
    return ErrSetup([=](ErrFixture& f) {
      f.a.red = red;
      Views v;
      v.*slot = TensorView::contiguous((f.*buffer).view.data, DType::f32, shape.data(), static_cast<int>(shape.size()));
      return v;
    });
  };
  expect_error(over(&Views::up, &ErrFixture::gx, kMean, {}), {ErrorCode::bad_pointer}, &Names::gx, kUp);
  // the fused entry's loss over a gradient
  expect_error(over(&Views::loss, &ErrFixture::gx, kMean, {}), {ErrorCode::bad_pointer}, "loss", {Entry::fused});
  expect_error(over(&Views::loss, &ErrFixture::input, kMean, {}), {ErrorCode::bad_pointer}, "loss", kFwd);
  expect_error(over(&Views::loss, &ErrFixture::target, kNone, {4, 5}), {ErrorCode::bad_pointer}, "loss", kFwd);
  expect_error(over(&Views::loss, &ErrFixture::third, kNone, {4, 5}), {ErrorCode::bad_pointer}, "loss", kFwd, kThird);
}
TEST(PointwiseErrors, NullAndMisalignedPointers) {
  static Tensor raw = Tensor::make(DType::f32, {64}, Layout::contiguous, kSentinel);
  const TensorView misaligned = TensorView::contiguous(raw.storage.data() + 2, DType::f32, {4, 5});
  expect_error(null_data(&Views::input, &ErrFixture::input), {ErrorCode::bad_pointer}, &Names::x);
  expect_error(null_data(&Views::target, &ErrFixture::target), {ErrorCode::bad_pointer}, &Names::y);
  expect_error(null_data(&Views::third, &ErrFixture::third), {ErrorCode::bad_pointer}, &Names::z, kBoth, kThird);
  expect_error(put(&Views::input, misaligned), {ErrorCode::bad_pointer}, &Names::x);
  expect_error(put(&Views::target, misaligned), {ErrorCode::bad_pointer}, &Names::y);
  expect_error(put(&Views::third, misaligned), {ErrorCode::bad_pointer}, &Names::z, kBoth, kThird);
  expect_error(put(&Views::weight, misaligned), {ErrorCode::bad_pointer}, "weight", kBoth, kWeighted);
  expect_error(null_data(&Views::loss, &ErrFixture::loss), {ErrorCode::bad_pointer}, "loss", kFwd);
  expect_error(null_data(&Views::gx, &ErrFixture::gx), {ErrorCode::bad_pointer}, &Names::gx, kBwd);
  expect_error(put(&Views::gy, misaligned), {ErrorCode::bad_pointer}, &Names::gy, kBwd, kTargetGrad);
  expect_error(put(&Views::gz, misaligned), {ErrorCode::bad_pointer}, &Names::gz, kBwd, kThirdGrad);
  expect_error(null_data(&Views::up, &ErrFixture::up), {ErrorCode::bad_pointer}, "grad_loss", kUp);
}
TEST(PointwiseErrors, OptionsAndReduction) {
  for (double beta : {-1.0, -1e-300, kNaN, kInf})
    expect_error(options([=](PwArgs& a) { a.opts.param = beta; }), {ErrorCode::invalid_value}, "beta", kBoth,
                 {PwLoss::smooth_l1});
  for (double delta : {0.0, -0.0, -2.0, kNaN, kInf})
    expect_error(options([=](PwArgs& a) { a.opts.param = delta; }), {ErrorCode::invalid_value}, "delta", kBoth,
                 {PwLoss::huber});
  for (double bad : {kNaN, kInf, -kInf}) {
    expect_error(options([=](PwArgs& a) { a.opts.eps = bad; }), {ErrorCode::invalid_value}, "eps", kBoth,
                 {PwLoss::poisson_nll, PwLoss::gaussian_nll});
    expect_error(options([=](PwArgs& a) { a.opts.margin = bad; }), {ErrorCode::invalid_value}, "margin", kBoth,
                 {PwLoss::hinge_embedding, PwLoss::margin_ranking});
  }
  // batchmean is a mean
  static const Tensor l45 = Tensor::make(DType::f32, {4, 5});
  expect_error(options([](PwArgs& a) { a.opts.batchmean = true, a.red = Reduction::sum; }), {ErrorCode::invalid_value},
               "batchmean", kBoth, {PwLoss::kl_div});
  expect_error(
      [](ErrFixture& f) {
        f.a.opts.batchmean = true, f.a.red = kNone;
        return Views{.loss = l45.view};
      },
      {ErrorCode::invalid_value}, "batchmean", kFwd, {PwLoss::kl_div});
  expect_error(options([](PwArgs& a) { a.red = static_cast<Reduction>(7); }), {ErrorCode::invalid_value}, "reduction");
}

}  // namespace
}  // namespace lftest::pointwise
