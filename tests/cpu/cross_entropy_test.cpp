// cross_entropy_forward / _backward / _forward_backward on the CPU against the float64 reference
// (tests/reference/reference.hpp), which follows torch.nn.functional.cross_entropy.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <regex>
#include <string>
#include <vector>

#include "cpu/ce_harness.hpp"
#include "cpu/ce_specs.hpp"
#include "error_harness.hpp"

namespace lftest::ce {
namespace {

class CrossEntropy : public ::testing::TestWithParam<Spec> {};
TEST_P(CrossEntropy, MatchesReference) { run_all(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Vocab, CrossEntropy, ::testing::ValuesIn(vocab_specs()),
                         [](const auto& i) { return i.param.name; });
INSTANTIATE_TEST_SUITE_P(Options, CrossEntropy, ::testing::ValuesIn(option_specs()),
                         [](const auto& i) { return i.param.name; });
INSTANTIATE_TEST_SUITE_P(Soft, CrossEntropy, ::testing::ValuesIn(soft_specs()),
                         [](const auto& i) { return i.param.name; });
INSTANTIATE_TEST_SUITE_P(Shapes, CrossEntropy, ::testing::ValuesIn(shape_specs()),
                         [](const auto& i) { return i.param.name; });
INSTANTIATE_TEST_SUITE_P(TargetDtypes, CrossEntropy, ::testing::ValuesIn(target_specs()),
                         [](const auto& i) { return i.param.name; });
INSTANTIATE_TEST_SUITE_P(Adversarial, CrossEntropy, ::testing::ValuesIn(adversarial_specs()),
                         [](const auto& i) { return i.param.name; });
INSTANTIATE_TEST_SUITE_P(Edge, CrossEntropy, ::testing::ValuesIn(edge_specs()),
                         [](const auto& i) { return i.param.name; });

// The reference itself, on values worked out by hand (so that a wrong reference cannot pass silently).
TEST(CrossEntropyReference, HandValues) {
  lfref::CeInput in;
  in.rows = 2, in.C = 3;
  in.x = {0, 0, 0, std::log(1.0), std::log(2.0), std::log(5.0)};  // softmax row 1: (1/8, 2/8, 5/8)
  in.target = {1, 2};
  in.reduction = Reduction::mean;
  auto r = lfref::cross_entropy(in);
  EXPECT_NEAR(r.loss, (std::log(3.0) + std::log(8.0 / 5.0)) / 2, 1e-15);
  EXPECT_NEAR(r.lse[1], std::log(8.0), 1e-15);
  EXPECT_NEAR(r.grad[3 + 2], (5.0 / 8 - 1) / 2, 1e-15);
  // weights + smoothing + ignore, torch's rule: both terms over sum w[y] of the kept rows
  in.weight = {1, 2, 3};
  in.label_smoothing = 0.3;
  in.target = {1, -100};
  r = lfref::cross_entropy(in);
  const double l0 = std::log(3.0);  // every -log q_c of row 0
  EXPECT_NEAR(r.loss, (0.7 * 2 * l0 + 0.1 * (1 + 2 + 3) * l0) / 2.0, 1e-15);
  // the row 1 gradient is exactly zero (ignored, finite)
  for (int c = 0; c < 3; ++c) EXPECT_EQ(r.grad[3 + c], 0.0);
  // soft targets: mean over rows, not weights
  in.target.clear();
  in.soft = {1, 0, 0, 0, 0, 1};
  in.label_smoothing = 0;
  r = lfref::cross_entropy(in);
  EXPECT_NEAR(r.loss, (1 * l0 + 3 * std::log(8.0 / 5.0)) / 2.0, 1e-15);
  // a NaN row: lse, loss and gradient NaN
  in.x[1] = std::numeric_limits<double>::quiet_NaN();
  r = lfref::cross_entropy(in);
  EXPECT_TRUE(std::isnan(r.lse[0]) && std::isnan(r.loss) && std::isnan(r.grad[2]));
  EXPECT_FALSE(std::isnan(r.grad[3]));
}

TEST(CrossEntropyReference, SixteenBitRounding) {
  // round-to-nearest-even at a tie, subnormals, overflow
  EXPECT_EQ(lfref::double_to_bf16_bits(1.0), 0x3F80);
  EXPECT_EQ(lfref::double_to_bf16_bits(1.0 + 0x1p-8), 0x3F80);            // tie -> even
  EXPECT_EQ(lfref::double_to_bf16_bits(1.0 + 3 * 0x1p-8), 0x3F82);        // tie -> even (up)
  EXPECT_EQ(lfref::double_to_bf16_bits(-2.0), 0xC000);
  EXPECT_EQ(lfref::double_to_bf16_bits(3.5e38), 0x7F80);                  // rounds past max: +inf
  EXPECT_EQ(lfref::double_to_f16_bits(65504.0), 0x7BFF);
  EXPECT_EQ(lfref::double_to_f16_bits(65520.0), 0x7C00);                  // the tie above max: inf
  EXPECT_EQ(lfref::double_to_f16_bits(0x1p-24), 0x0001);                  // smallest subnormal
  EXPECT_EQ(lfref::double_to_f16_bits(0x1p-25), 0x0000);                  // tie -> even (zero)
  EXPECT_EQ(lfref::double_to_f16_bits(1.0 + 0x1p-11), 0x3C00);
  EXPECT_EQ(lfref::double_to_f16_bits(-0.5), 0xB800);
  EXPECT_EQ(lfref::f16_bits_to_double(0x3555), 0.333251953125);
  for (std::uint32_t b = 0; b < 0x10000; ++b) {  // every finite 16-bit value survives a round trip
    const auto h = static_cast<std::uint16_t>(b);
    const double f = lfref::f16_bits_to_double(h), g = lfref::bf16_bits_to_double(h);
    if (std::isfinite(f)) ASSERT_EQ(lfref::double_to_f16_bits(f), h) << b;
    if (std::isfinite(g)) ASSERT_EQ(lfref::double_to_bf16_bits(g), h) << b;
  }
}

// ---- bf16 / f16 accuracy: within half an ulp of the 16-bit type -----------------------------------------------
// Any implementation that stores the loss in the 16-bit type (as PyTorch does) has an error of up to half an
// ulp of that type; ours are stored in float32, so the error must be below that bound.
class HalfAccuracy : public ::testing::TestWithParam<std::tuple<DType, Reduction, int>> {};
TEST_P(HalfAccuracy, LossWithinHalfUlpOf16Bit) {
  const auto [dt, red, variant] = GetParam();
  Spec s;
  s.dt = dt, s.red = red, s.shape = {8, 32000}, s.stdev = 2.0, s.seed = 16000 + variant;
  if (variant == 1) s.weight = true, s.eps = 0.1, s.ignore_frac = 0.2;
  if (variant == 2) s.soft = true, s.eps = 0.05;
  if (variant == 3) s.stdev = 8.0, s.shape = {16, 4099};  // wide logits: losses ~5..60
  Problem p = build(s);
  Fwd f = make_outputs(p, true, false);
  lossfuse::cross_entropy_forward(p.logits.view, p.target.view, p.options(), f.out);
  const lfref::FloatFormat half = format_of(dt);
  const std::vector<double> got = f.loss.values();
  const std::vector<double>& want = red == Reduction::none ? p.ref.row_loss : std::vector<double>{p.ref.loss};
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (red == Reduction::none && p.ref.ignored[i]) continue;
    const double bound = 0.5 * lfref::ulp(want[i], half);
    EXPECT_LE(std::fabs(got[i] - want[i]), bound)
        << "row " << i << ": ours " << got[i] << ", reference " << want[i] << ", half ulp of " << nm(dt) << " "
        << bound;
  }
}
INSTANTIATE_TEST_SUITE_P(Half, HalfAccuracy,
                         ::testing::Combine(::testing::Values(DType::bf16, DType::f16),
                                            ::testing::Values(Reduction::none, Reduction::mean),
                                            ::testing::Values(0, 1, 2, 3)));

// ---- determinism --------------------------------------------------------------------------------------------
struct Outputs {
  Tensor loss, lse, z, grad, grad2;
};
Outputs run_once(const Problem& p) {
  Fwd f = make_outputs(p, true, true);
  Tensor grad = p.new_grad(Layout::contiguous);
  lossfuse::cross_entropy_forward_backward(p.logits.view, p.target.view, p.options(), f.out, p.up(), grad.view);
  Fwd g = make_outputs(p, true, true);
  lossfuse::cross_entropy_forward(p.logits.view, p.target.view, p.options(), g.out);
  Tensor grad2 = p.new_grad(Layout::contiguous);
  lossfuse::cross_entropy_backward(p.logits.view, p.target.view, g.lse.view, p.up(), p.options(), grad2.view);
  return {f.loss, f.lse, f.z, grad, grad2};
}

class Determinism : public ::testing::TestWithParam<Spec> {};
TEST_P(Determinism, BitwiseAcrossRunsAndThreadCounts) {
  const Problem p = build(GetParam());
  Outputs base;
  {
    ThreadsGuard g(1);
    base = run_once(p);
  }
  check_forward(p, base.loss, &base.lse, &base.z, "1 thread");  // and it is right
  check_grad(p, base.grad, "1 thread");
  for (int threads : {1, 2, 3, 2, 0}) {
    ThreadsGuard g(threads);
    for (int rep = 0; rep < 2; ++rep) {
      const Outputs o = run_once(p);
      EXPECT_TRUE(same_bytes(o.loss, base.loss)) << threads << " threads: loss bits differ";
      EXPECT_TRUE(same_bytes(o.lse, base.lse)) << threads << " threads: lse bits differ";
      EXPECT_TRUE(same_bytes(o.z, base.z)) << threads << " threads: z_loss bits differ";
      EXPECT_TRUE(same_bytes(o.grad, base.grad)) << threads << " threads: forward_backward grad bits differ";
      EXPECT_TRUE(same_bytes(o.grad2, base.grad2)) << threads << " threads: backward grad bits differ";
    }
  }
}
std::vector<Spec> determinism_specs() {
  std::vector<Spec> v;
  for (Reduction red : {Reduction::mean, Reduction::sum, Reduction::none}) {
    Spec a;  // many rows
    a.shape = {300, 1271}, a.red = red, a.weight = true, a.eps = 0.1, a.zs = 1e-3, a.ignore_frac = 0.1;
    a.up = red == Reduction::none ? Up::per_row : Up::scalar;
    a.name = "rows300_V1271_" + red_name(red);
    v.push_back(a);
    Spec b;  // few rows, a large vocabulary (a kernel may split the classes of a row)
    b.shape = {2, 128256}, b.red = red, b.dt = DType::bf16, b.eps = 0.1, b.zs = 1e-3;
    b.name = "rows2_V128256_bf16_" + red_name(red);
    v.push_back(b);
  }
  Spec c;
  c.shape = {64, 2000}, c.soft = true, c.dt = DType::f64, c.eps = 0.1, c.name = "soft_f64_mean";
  v.push_back(c);
  Spec d;
  d.shape = {4, 5, 30, 20}, d.dt = DType::f16, d.red = Reduction::mean, d.weight = true, d.name = "spatial_f16";
  v.push_back(d);
  return v;
}
INSTANTIATE_TEST_SUITE_P(CrossEntropy, Determinism, ::testing::ValuesIn(determinism_specs()),
                         [](const auto& i) { return i.param.name; });

// ---- errors: each bad argument throws lossfuse::Error with the right code and writes nothing -------------------
enum class Entry { forward, backward, forward_backward, scale_held, backward_held };

struct ErrFixture : GuardedBuffers {
  Tensor logits = Tensor::make(DType::f32, {4, 5});
  Tensor target = Tensor::make(DType::i64, {4});
  Tensor loss = Tensor::make(DType::f32, {}, Layout::contiguous, kSentinel);
  Tensor lse = Tensor::make(DType::f32, {4}, Layout::contiguous, kSentinel);
  Tensor z = Tensor::make(DType::f32, {}, Layout::contiguous, kSentinel);
  Tensor grad = Tensor::make(DType::f32, {4, 5}, Layout::contiguous, kSentinel);
  Tensor lse_in = Tensor::make(DType::f32, {4});
  Tensor two = scalar_tensor(DType::f32, 2.0);  // backward_held's upstream gradient when grad_loss is not set
  std::optional<Tensor> grad_loss;
  CrossEntropyOptions o;
  CrossEntropyOutputs out;
  GradWrite write = GradWrite::separate;

  ErrFixture() {
    Rng rng(99);
    for (std::int64_t i = 0; i < 20; ++i) logits.set(i, rng.normal());
    for (std::int64_t i = 0; i < 4; ++i) target.set_int(i, i), lse_in.set(i, 3.0);
    bind();
    guard("logits", logits), guard("target", target), guard("loss", loss), guard("lse", lse), guard("z_loss", z);
    guard("grad_logits", grad);
  }
  void bind() {
    out.loss = loss.view;
    out.lse = lse.view;
    out.z_loss = z.view;
  }
  std::optional<TensorView> up() const {
    if (grad_loss) return grad_loss->view;
    return std::nullopt;
  }
  // Calls `e` with the current views.
  void call(Entry e, const TensorView& lg, const TensorView& tg, const TensorView& gr) const {
    switch (e) {
      case Entry::forward: lossfuse::cross_entropy_forward(lg, tg, o, out); break;
      case Entry::backward: lossfuse::cross_entropy_backward(lg, tg, lse_in.view, up(), o, gr, write); break;
      case Entry::forward_backward: lossfuse::cross_entropy_forward_backward(lg, tg, o, out, up(), gr, write); break;
      case Entry::scale_held: lossfuse::cross_entropy_scale_held(gr, tg, o, up()); break;
      case Entry::backward_held:
        lossfuse::cross_entropy_backward_held(lg, tg, lse_in.view, up().value_or(two.view), o, gr);
        break;
    }
  }
};

const char* entry_name(Entry e) {
  switch (e) {
    case Entry::forward: return "forward";
    case Entry::backward: return "backward";
    case Entry::forward_backward: return "forward_backward";
    case Entry::scale_held: return "scale_held";
    case Entry::backward_held: return "backward_held";
  }
  return "?";
}

// Expects every listed entry point to throw one of `codes` with all buffers untouched; `setup` mutates the
// fixture and may return replacement views for logits/target/grad.
struct Views {
  std::optional<TensorView> logits, target, grad;
};
void expect_error(const std::function<Views(ErrFixture&)>& setup, std::initializer_list<ErrorCode> codes,
                  std::initializer_list<Entry> entries = {Entry::forward, Entry::backward, Entry::forward_backward},
                  std::string* message = nullptr) {
  expect_entry_errors<ErrFixture, Entry, Views>(
      setup, codes, entries,
      [](const ErrFixture& f, Entry e, const Views& v) {
        f.call(e, v.logits.value_or(f.logits.view), v.target.value_or(f.target.view), v.grad.value_or(f.grad.view));
      },
      entry_name, {}, message);
}

TEST(CrossEntropyErrors, ValidFixtureRuns) {  // the base of the error tests is itself valid
  for (Entry e : {Entry::forward, Entry::backward, Entry::forward_backward, Entry::backward_held}) {
    ErrFixture f;
    EXPECT_NO_THROW(f.call(e, f.logits.view, f.target.view, f.grad.view)) << entry_name(e);
  }
}

TEST(CrossEntropyErrors, TargetOutOfRangeNamesPositionAndValue) {
  std::string msg;
  expect_error([](ErrFixture& f) { f.target.set_int(3, 7); return Views{}; }, {ErrorCode::index_error},
               {Entry::forward, Entry::backward, Entry::forward_backward}, &msg);
  EXPECT_TRUE(std::regex_search(msg, std::regex("\\b7\\b"))) << "message does not name the value 7: " << msg;
  EXPECT_TRUE(std::regex_search(msg, std::regex("\\b3\\b"))) << "message does not name row 3: " << msg;
  // a multi-dim target: the position is named by its coordinates or its flat index
  ErrFixture f;
  Tensor lg = Tensor::make(DType::f32, {2, 5, 3});
  Tensor tg = Tensor::make(DType::i32, {2, 3});
  for (std::int64_t i = 0; i < 6; ++i) tg.set_int(i, 1);
  tg.set_int(4, 9);  // (1, 1)
  f.snapshot();
  CrossEntropyOutputs out;
  out.loss = f.loss.view;  // a scalar: reduction mean
  ASSERT_TRUE(throws_error([&] { lossfuse::cross_entropy_forward(lg.view, tg.view, f.o, out); },
                           {ErrorCode::index_error}, &msg));
  EXPECT_TRUE(std::regex_search(msg, std::regex("\\b9\\b"))) << msg;
  EXPECT_TRUE(std::regex_search(msg, std::regex("\\b4\\b|1, 1")))
      << "message does not name position (1, 1): " << msg;
  EXPECT_TRUE(f.untouched());
}
TEST(CrossEntropyErrors, TargetEqualToClassCount) {
  expect_error([](ErrFixture& f) { f.target.set_int(0, 5); return Views{}; }, {ErrorCode::index_error});
}
TEST(CrossEntropyErrors, NegativeTargetOtherThanIgnoreIndex) {
  expect_error([](ErrFixture& f) { f.target.set_int(2, -1); return Views{}; }, {ErrorCode::index_error});
  expect_error([](ErrFixture& f) { f.target.set_int(2, -100); f.o.ignore_index = -1; return Views{}; },
               {ErrorCode::index_error});
}
TEST(CrossEntropyErrors, WrongSizeWeight) {
  static Tensor w6 = Tensor::make(DType::f32, {6});
  static Tensor w45 = Tensor::make(DType::f32, {4, 5});
  expect_error([](ErrFixture& f) { f.o.weight = w6.view; return Views{}; },
               {ErrorCode::shape_mismatch, ErrorCode::invalid_value});
  expect_error([](ErrFixture& f) { f.o.weight = w45.view; return Views{}; },
               {ErrorCode::shape_mismatch, ErrorCode::invalid_value});
}
TEST(CrossEntropyErrors, IntegerWeight) {
  static Tensor w = Tensor::make(DType::i32, {5});
  expect_error([](ErrFixture& f) { f.o.weight = w.view; return Views{}; }, {ErrorCode::dtype_mismatch});
}
TEST(CrossEntropyErrors, LabelSmoothingOutsideUnitInterval) {
  for (double eps : {-0.1, 1.1, kNaN, kInf})
    expect_error([eps](ErrFixture& f) { f.o.label_smoothing = eps; return Views{}; }, {ErrorCode::invalid_value});
}
TEST(CrossEntropyErrors, SoftTargetsWithIgnoreIndex) {
  static Tensor soft = Tensor::make(DType::f32, {4, 5});
  expect_error([](ErrFixture& f) { f.o.ignore_index = 0; return Views{{}, soft.view, {}}; },
               {ErrorCode::invalid_value});
}
TEST(CrossEntropyErrors, TargetShapeMismatch) {
  static Tensor t3 = Tensor::make(DType::i64, {3});
  static Tensor t41 = Tensor::make(DType::i64, {4, 1});
  static Tensor t0d = Tensor::make(DType::i64, {});
  for (Tensor* t : {&t3, &t41, &t0d})
    expect_error([t](ErrFixture&) { return Views{{}, t->view, {}}; }, {ErrorCode::shape_mismatch});
}
TEST(CrossEntropyErrors, FloatTargetWithOtherShapeOrDtype) {
  static Tensor s46 = Tensor::make(DType::f32, {4, 6});
  static Tensor s4 = Tensor::make(DType::f32, {4});
  static Tensor s45d = Tensor::make(DType::f64, {4, 5});
  expect_error([](ErrFixture&) { return Views{{}, s46.view, {}}; },
               {ErrorCode::shape_mismatch, ErrorCode::dtype_mismatch});
  expect_error([](ErrFixture&) { return Views{{}, s4.view, {}}; },
               {ErrorCode::shape_mismatch, ErrorCode::dtype_mismatch});
  expect_error([](ErrFixture&) { return Views{{}, s45d.view, {}}; }, {ErrorCode::dtype_mismatch});
}
TEST(CrossEntropyErrors, LossShapeAndDtype) {
  static Tensor l4 = Tensor::make(DType::f32, {4}, Layout::contiguous, kSentinel);
  static Tensor l0 = Tensor::make(DType::f32, {}, Layout::contiguous, kSentinel);
  static Tensor l64 = Tensor::make(DType::f64, {}, Layout::contiguous, kSentinel);
  static Tensor l16 = Tensor::make(DType::bf16, {}, Layout::contiguous, kSentinel);
  const std::initializer_list<Entry> fw = {Entry::forward, Entry::forward_backward};
  expect_error([](ErrFixture& f) { f.out.loss = l4.view; return Views{}; }, {ErrorCode::shape_mismatch}, fw);
  expect_error([](ErrFixture& f) { f.o.reduction = Reduction::none; f.out.loss = l0.view; f.out.z_loss.reset();
                                   return Views{}; }, {ErrorCode::shape_mismatch}, fw);
  expect_error([](ErrFixture& f) { f.out.loss = l64.view; return Views{}; }, {ErrorCode::dtype_mismatch}, fw);
  expect_error([](ErrFixture& f) { f.out.loss = l16.view; return Views{}; }, {ErrorCode::dtype_mismatch}, fw);
  expect_error([](ErrFixture& f) { f.out.z_loss = l4.view; return Views{}; }, {ErrorCode::shape_mismatch}, fw);
}
TEST(CrossEntropyErrors, NonContiguousLossOutput) {
  static Tensor l = Tensor::make(DType::f32, {8}, Layout::contiguous, kSentinel);
  expect_error([](ErrFixture& f) {
    f.o.reduction = Reduction::none;
    f.out.loss = TensorView::contiguous(l.view.data, DType::f32, {4});
    f.out.loss.strides[0] = 2;  // every other element
    f.out.z_loss.reset();
                                   return Views{}; },
               {ErrorCode::invalid_value, ErrorCode::shape_mismatch, ErrorCode::bad_pointer},
               {Entry::forward, Entry::forward_backward});
}
// lse: the accumulation dtype or float64 (LargeCommonOffsetKeepsLossAndGradientPrecision uses float64).
TEST(CrossEntropyErrors, LseShapeAndDtype) {
  static Tensor l5 = Tensor::make(DType::f32, {5}, Layout::contiguous, kSentinel);
  static Tensor l16 = Tensor::make(DType::bf16, {4}, Layout::contiguous, kSentinel);
  static Tensor l64x5 = Tensor::make(DType::f64, {5}, Layout::contiguous, kSentinel);
  expect_error([](ErrFixture& f) { f.out.lse = l5.view; return Views{}; }, {ErrorCode::shape_mismatch},
               {Entry::forward, Entry::forward_backward});
  expect_error([](ErrFixture& f) { f.out.lse = l64x5.view; return Views{}; }, {ErrorCode::shape_mismatch},
               {Entry::forward, Entry::forward_backward});
  expect_error([](ErrFixture& f) { f.out.lse = l16.view; return Views{}; }, {ErrorCode::dtype_mismatch},
               {Entry::forward, Entry::forward_backward});
  expect_error([](ErrFixture& f) { f.lse_in = l5; return Views{}; }, {ErrorCode::shape_mismatch}, {Entry::backward});
  expect_error([](ErrFixture& f) { f.lse_in = l16; return Views{}; }, {ErrorCode::dtype_mismatch}, {Entry::backward});
}
TEST(CrossEntropyErrors, GradShapeAndDtype) {
  static Tensor g46 = Tensor::make(DType::f32, {4, 6}, Layout::contiguous, kSentinel);
  static Tensor g54 = Tensor::make(DType::f32, {5, 4}, Layout::contiguous, kSentinel);
  static Tensor g64 = Tensor::make(DType::f64, {4, 5}, Layout::contiguous, kSentinel);
  static Tensor g16 = Tensor::make(DType::bf16, {4, 5}, Layout::contiguous, kSentinel);
  const std::initializer_list<Entry> bw = {Entry::backward, Entry::forward_backward, Entry::backward_held};
  expect_error([](ErrFixture&) { return Views{{}, {}, g46.view}; }, {ErrorCode::shape_mismatch}, bw);
  expect_error([](ErrFixture&) { return Views{{}, {}, g54.view}; }, {ErrorCode::shape_mismatch}, bw);
  expect_error([](ErrFixture&) { return Views{{}, {}, g64.view}; }, {ErrorCode::dtype_mismatch}, bw);
  expect_error([](ErrFixture&) { return Views{{}, {}, g16.view}; }, {ErrorCode::dtype_mismatch}, bw);
}
TEST(CrossEntropyErrors, GradLossShapeAndDtype) {
  const std::initializer_list<Entry> bw = {Entry::backward, Entry::forward_backward, Entry::scale_held};
  const std::initializer_list<Entry> all = {Entry::backward, Entry::forward_backward, Entry::scale_held,
                                            Entry::backward_held};
  expect_error(
      [](ErrFixture& f) {
        f.grad_loss = Tensor::make(DType::f32, {4});
        return Views{};
      },
      {ErrorCode::shape_mismatch}, all);
  expect_error(
      [](ErrFixture& f) {
        f.grad_loss = Tensor::make(DType::f64, {});
        return Views{};
      },
      {ErrorCode::dtype_mismatch}, all);
  expect_error([](ErrFixture& f) {
    f.o.reduction = Reduction::none;
    f.loss = Tensor::make(DType::f32, {4}, Layout::contiguous, kSentinel);
    f.z = Tensor::make(DType::f32, {4}, Layout::contiguous, kSentinel);
    f.bind();
    f.grad_loss = Tensor::make(DType::f32, {5});
    return Views{};
  }, {ErrorCode::shape_mismatch}, bw);
}
// cross_entropy_scale_held checks the gradient, the target and grad_loss as the backward does (the logits play no
// part), and refuses a gradient sharing memory with either; nothing is written then. A target out of range is not
// its concern: it only compares targets with ignore_index.
TEST(CrossEntropyErrors, ScaleHeldOperands) {
  const std::initializer_list<Entry> held = {Entry::scale_held};
  auto with_up = [](ErrFixture& f) { f.grad_loss = scalar_tensor(DType::f32, 2.0); };
  static Tensor int_grad = Tensor::make(DType::i32, {4, 5});
  static Tensor short_target = Tensor::make(DType::i64, {5});
  static Tensor soft_target = Tensor::make(DType::f32, {4, 5});
  expect_error(
      [&](ErrFixture& f) {
        with_up(f);
        return Views{{}, {}, int_grad.view};
      },
      {ErrorCode::dtype_mismatch, ErrorCode::invalid_value}, held);
  expect_error(
      [&](ErrFixture& f) {
        with_up(f);
        return Views{{}, short_target.view, {}};
      },
      {ErrorCode::shape_mismatch}, held);
  expect_error(
      [&](ErrFixture& f) {  // the target inside the gradient's memory
        with_up(f);
        return Views{{}, TensorView::contiguous(f.grad.view.data, DType::i32, {4}), {}};
      },
      {ErrorCode::bad_pointer}, held);
  expect_error(
      [&](ErrFixture& f) {  // grad_loss inside it
        with_up(f);
        f.grad_loss->view.data = f.grad.view.data;
        return Views{};
      },
      {ErrorCode::bad_pointer}, held);
  expect_error(
      [&](ErrFixture& f) {
        with_up(f);
        f.o.ignore_index = 0;
        return Views{{}, soft_target.view, {}};
      },
      {ErrorCode::invalid_value}, held);
}

TEST(CrossEntropyScaleHeld, RowsKeptAndScaled) {
  // rows: ignored, upstream 1, upstream -0.5, NaN upstream; the target of the third is out of range (not checked)
  Tensor grad = Tensor::make(DType::bf16, {4, 3});
  for (std::int64_t i = 0; i < 12; ++i) grad.set(i, 0.25 * static_cast<double>(i + 1));
  grad.set(1, kNaN);  // a NaN in the ignored row stays NaN
  Tensor target = Tensor::make(DType::u8, {4});
  for (std::int64_t r = 0; r < 4; ++r) target.set_int(r, std::array<std::int64_t, 4>{200, 1, 9, 0}[r]);
  Tensor up = Tensor::make(DType::f32, {4});
  for (std::int64_t r = 0; r < 4; ++r) up.set(r, std::array<double, 4>{3.0, 1.0, -0.5, kNaN}[r]);
  CrossEntropyOptions o;
  o.reduction = Reduction::none;
  o.ignore_index = 200;  // compared with the uint8 target's value
  const Tensor before = grad;
  lossfuse::cross_entropy_scale_held(grad.view, target.view, o, up.view);
  for (std::int64_t c = 0; c < 3; ++c) {
    const double b0 = before.get(c), b1 = before.get(3 + c), b2 = before.get(6 + c);
    EXPECT_TRUE(grad.get(c) == b0 || (std::isnan(b0) && std::isnan(grad.get(c)))) << c;
    EXPECT_EQ(grad.get(3 + c), b1) << c;
    EXPECT_EQ(grad.get(6 + c), -0.5 * b2) << c;
    EXPECT_TRUE(std::isnan(grad.get(9 + c))) << c;
  }
  // no upstream gradient: 1, nothing written
  const Tensor scaled = grad;
  lossfuse::cross_entropy_scale_held(grad.view, target.view, o, std::nullopt);
  EXPECT_TRUE(same_bytes(grad, scaled));
}

// cross_entropy_backward_held serves one upstream value: reduction none is refused, naming it, before anything is
// written (also at an upstream gradient of 1, where a reduced call writes nothing).
TEST(CrossEntropyErrors, BackwardHeldNeedsAReducedLoss) {
  for (double up : {2.0, 1.0}) {
    std::string msg;
    expect_error(
        [up](ErrFixture& f) {
          f.o.reduction = Reduction::none;
          f.grad_loss = Tensor::make(DType::f32, {4});
          for (std::int64_t r = 0; r < 4; ++r) f.grad_loss->set(r, up);
          return Views{};
        },
        {ErrorCode::invalid_value}, {Entry::backward_held}, &msg);
    EXPECT_NE(msg.find("reduction"), std::string::npos) << msg;
  }
}

TEST(CrossEntropyErrors, GradOverlapsLogitsWithoutInPlace) {
  const std::initializer_list<Entry> bw = {Entry::backward, Entry::forward_backward, Entry::backward_held};
  expect_error([](ErrFixture& f) { return Views{{}, {}, f.logits.view}; }, {ErrorCode::bad_pointer}, bw);
  // partial overlap: logits rows 0..3 and grad rows 1..4 of one buffer
  static Tensor big = Tensor::make(DType::f32, {5, 5});
  expect_error([](ErrFixture&) {
    TensorView lg = TensorView::contiguous(big.view.data, DType::f32, {4, 5});
    TensorView gr = TensorView::contiguous(static_cast<float*>(big.view.data) + 5, DType::f32, {4, 5});
    return Views{lg, {}, gr};
  }, {ErrorCode::bad_pointer}, bw);
  // interleaved: logits the even columns, grad the odd columns of one buffer (disjoint elements, but
  // overlapping extents: either accepting it or calling it aliasing is defensible, so only the outputs are
  // checked when it runs)
}
TEST(CrossEntropyErrors, OutputsOverlapInputs) {
  expect_error([](ErrFixture& f) { f.out.lse = TensorView::contiguous(f.logits.view.data, DType::f32, {4});
                                   return Views{}; }, {ErrorCode::bad_pointer},
               {Entry::forward, Entry::forward_backward});
  expect_error([](ErrFixture& f) { f.out.loss = TensorView::contiguous(f.grad.view.data, DType::f32, {});
                                   return Views{}; }, {ErrorCode::bad_pointer}, {Entry::forward_backward});
}
TEST(CrossEntropyErrors, InPlaceWithAnotherBuffer) {
  const std::initializer_list<Entry> bw = {Entry::backward, Entry::forward_backward};
  expect_error([](ErrFixture& f) { f.write = GradWrite::in_place; return Views{}; },
               {ErrorCode::bad_pointer, ErrorCode::invalid_value}, bw);
  // the logits' buffer with other strides
  expect_error([](ErrFixture& f) {
    f.write = GradWrite::in_place;
    TensorView gr = f.logits.view;
    gr.strides[0] = 1, gr.strides[1] = 4;
    return Views{{}, {}, gr};
  }, {ErrorCode::bad_pointer, ErrorCode::invalid_value}, bw);
}
TEST(CrossEntropyErrors, GradRepeatingElements) {
  // a gradient view whose elements share memory: the rows' writes would race (and land in thread order)
  const std::initializer_list<Entry> bw = {Entry::backward, Entry::forward_backward};
  for (const auto& strides : {std::array<std::int64_t, 2>{0, 1}, std::array<std::int64_t, 2>{1, 1},
                              std::array<std::int64_t, 2>{2, 1}}) {
    std::string msg;
    expect_error([strides](ErrFixture& f) {
      TensorView gr = f.grad.view;
      gr.strides[0] = strides[0], gr.strides[1] = strides[1];
      return Views{{}, {}, gr};
    }, {ErrorCode::bad_pointer}, bw, &msg);
    EXPECT_NE(msg.find("grad_logits"), std::string::npos) << msg;
    EXPECT_NE(msg.find("do not share memory"), std::string::npos) << msg;
  }
  // in place: logits whose rows are one row of memory are refused too (their gradient would overwrite logits that
  // other rows have yet to read)
  expect_error([](ErrFixture& f) {
    f.write = GradWrite::in_place;
    TensorView lg = f.logits.view;
    lg.strides[0] = 0;
    return Views{lg, {}, lg};
  }, {ErrorCode::bad_pointer}, bw);
}
TEST(CrossEntropyErrors, ScalesFloat32CannotHold) {
  // float32 logits accumulate in float32, which takes softcap (and its inverse), logit_scale and z_loss_scale
  expect_error([](ErrFixture& f) { f.o.softcap = 1e-300; return Views{}; }, {ErrorCode::invalid_value});
  expect_error([](ErrFixture& f) { f.o.softcap = 1e-45; return Views{}; }, {ErrorCode::invalid_value});
  expect_error([](ErrFixture& f) { f.o.softcap = 1e39; return Views{}; }, {ErrorCode::invalid_value});
  expect_error([](ErrFixture& f) { f.o.logit_scale = -1e39; return Views{}; }, {ErrorCode::invalid_value});
  expect_error([](ErrFixture& f) { f.o.logit_scale = 1e-300; return Views{}; }, {ErrorCode::invalid_value});
  expect_error([](ErrFixture& f) { f.o.z_loss_scale = 1e39; return Views{}; }, {ErrorCode::invalid_value});
  // float64 logits take them in double: the softcap of 1e-300 caps every logit at 1e-300, so the loss is log C
  Tensor lg = Tensor::make(DType::f64, {2, 5}), tg = Tensor::make(DType::i64, {2});
  for (std::int64_t i = 0; i < 10; ++i) lg.set(i, 0.5 * static_cast<double>(i % 7) - 1.0);
  tg.set_int(0, 1), tg.set_int(1, 4);
  Tensor loss = Tensor::make(DType::f64, {});
  CrossEntropyOptions o;
  o.softcap = 1e-300;
  lossfuse::cross_entropy_forward(lg.view, tg.view, o, CrossEntropyOutputs{loss.view, std::nullopt, std::nullopt});
  EXPECT_NEAR(loss.get(0), std::log(5.0), 1e-12);
}
TEST(CrossEntropyErrors, NullData) {
  expect_error([](ErrFixture& f) { TensorView v = f.logits.view; v.data = nullptr; return Views{v, {}, {}}; },
               {ErrorCode::bad_pointer});
  expect_error([](ErrFixture& f) { TensorView v = f.target.view; v.data = nullptr; return Views{{}, v, {}}; },
               {ErrorCode::bad_pointer});
  expect_error([](ErrFixture& f) { TensorView v = f.grad.view; v.data = nullptr; return Views{{}, {}, v}; },
               {ErrorCode::bad_pointer}, {Entry::backward, Entry::forward_backward});
  expect_error([](ErrFixture& f) { f.out.loss.data = nullptr; return Views{}; }, {ErrorCode::bad_pointer},
               {Entry::forward, Entry::forward_backward});
}
TEST(CrossEntropyErrors, MisalignedPointer) {
  static Tensor raw = Tensor::make(DType::f32, {32});
  static Tensor raw64 = Tensor::make(DType::i64, {8});
  expect_error([](ErrFixture&) {
    return Views{TensorView::contiguous(raw.storage.data() + 1, DType::f32, {4, 5}), {}, {}};
  }, {ErrorCode::bad_pointer});
  expect_error([](ErrFixture&) {
    return Views{{}, TensorView::contiguous(raw64.storage.data() + 4, DType::i64, {4}), {}};
  }, {ErrorCode::bad_pointer});
  expect_error([](ErrFixture& f) {
    f.out.loss = TensorView::contiguous(raw.storage.data() + 2, DType::f32, {});
    return Views{};
  }, {ErrorCode::bad_pointer}, {Entry::forward});
}
TEST(CrossEntropyErrors, NegativeSizes) {
  expect_error([](ErrFixture& f) { TensorView v = f.logits.view; v.shape[0] = -1; return Views{v, {}, {}}; },
               {ErrorCode::invalid_value, ErrorCode::shape_mismatch});
  expect_error([](ErrFixture& f) {
    TensorView lg = f.logits.view, tg = f.target.view, gr = f.grad.view;
    lg.shape[0] = tg.shape[0] = gr.shape[0] = -4;
    return Views{lg, tg, gr};
  }, {ErrorCode::invalid_value, ErrorCode::shape_mismatch});
}
TEST(CrossEntropyErrors, SizeProductOverflowsInt64) {
  expect_error([](ErrFixture& f) {
    TensorView lg = f.logits.view, tg = f.target.view, gr = f.grad.view;
    lg.shape[0] = tg.shape[0] = gr.shape[0] = std::int64_t{1} << 40;
    lg.shape[1] = gr.shape[1] = std::int64_t{1} << 40;
    lg.strides[0] = gr.strides[0] = std::int64_t{1} << 40;
    return Views{lg, tg, gr};
  }, {ErrorCode::invalid_value, ErrorCode::shape_mismatch});
}
TEST(CrossEntropyErrors, IntegerLogits) {
  static Tensor li = Tensor::make(DType::i32, {4, 5});
  expect_error([](ErrFixture&) { return Views{li.view, {}, {}}; }, {ErrorCode::dtype_mismatch}, {Entry::forward});
}
TEST(CrossEntropyErrors, ZeroDimLogits) {
  static Tensor l0 = Tensor::make(DType::f32, {});
  static Tensor t0 = Tensor::make(DType::i64, {});
  expect_error([](ErrFixture&) { return Views{l0.view, t0.view, {}}; }, {ErrorCode::shape_mismatch},
               {Entry::forward});
}
TEST(CrossEntropyErrors, BadSoftcapScaleZLoss) {
  for (double cap : {-1.0, kInf, kNaN})
    expect_error([cap](ErrFixture& f) { f.o.softcap = cap; return Views{}; }, {ErrorCode::invalid_value});
  for (double sc : {kInf, -kInf, kNaN})
    expect_error([sc](ErrFixture& f) { f.o.logit_scale = sc; return Views{}; }, {ErrorCode::invalid_value});
  for (double zs : {-1e-3, kInf, kNaN})
    expect_error([zs](ErrFixture& f) { f.o.z_loss_scale = zs; return Views{}; }, {ErrorCode::invalid_value});
}
TEST(CrossEntropyErrors, BadReductionValue) {
  expect_error([](ErrFixture& f) { f.o.reduction = static_cast<Reduction>(7); return Views{}; },
               {ErrorCode::invalid_value});
}
TEST(CrossEntropyErrors, BadGradWriteValue) {
  expect_error([](ErrFixture& f) { f.write = static_cast<GradWrite>(5); return Views{}; },
               {ErrorCode::invalid_value}, {Entry::backward, Entry::forward_backward});
}
TEST(CrossEntropyErrors, CudaViewsWithoutCudaKernels) {
  expect_error([](ErrFixture& f) {
    TensorView lg = f.logits.view;
    lg.device = lossfuse::Device::cuda;
    return Views{lg, {}, {}};
  }, {ErrorCode::not_implemented, ErrorCode::invalid_value});
}
TEST(CrossEntropyErrors, OutOfRangeTargetInLargeBatchWritesNothing) {
  // a bad target far into a batch that is split across threads: still nothing written
  Spec s;
  s.shape = {512, 300}, s.red = Reduction::none;
  Problem p = build(s);
  p.target.set_int(500, 300);
  Fwd f = make_outputs(p, true, true);
  Tensor grad = p.new_grad(Layout::contiguous);
  const auto loss0 = f.loss.storage, lse0 = f.lse.storage, g0 = grad.storage;
  std::string msg;
  EXPECT_TRUE(throws_error([&] {
    lossfuse::cross_entropy_forward_backward(p.logits.view, p.target.view, p.options(), f.out, std::nullopt, grad.view);
  }, {ErrorCode::index_error}, &msg));
  EXPECT_TRUE(std::regex_search(msg, std::regex("\\b500\\b"))) << msg;
  EXPECT_TRUE(f.loss.storage == loss0 && f.lse.storage == lse0 && grad.storage == g0);
}

// ---- a few more behaviours ----------------------------------------------------------------------------------
TEST(CrossEntropyMisc, EmptyBatchWithNullData) {
  for (Reduction red : kReds) {
    SCOPED_TRACE(red_name(red));
    const std::int64_t zero_shape[2] = {0, 5};
    TensorView lg = TensorView::contiguous(nullptr, DType::f32, zero_shape, 2);
    TensorView tg = TensorView::contiguous(nullptr, DType::i64, zero_shape, 1);
    Tensor loss = Tensor::make(DType::f32, red == Reduction::none ? std::vector<std::int64_t>{0}
                                                                  : std::vector<std::int64_t>{});
    CrossEntropyOptions o;
    o.reduction = red;
    CrossEntropyOutputs out;
    out.loss = loss.view;
    if (red == Reduction::none) out.loss.data = nullptr;
    ASSERT_NO_THROW(lossfuse::cross_entropy_forward(lg, tg, o, out));
    if (red == Reduction::mean) EXPECT_TRUE(std::isnan(loss.get(0))) << loss.get(0);
    if (red == Reduction::sum) EXPECT_EQ(loss.get(0), 0.0);
    ASSERT_NO_THROW(lossfuse::cross_entropy_backward(lg, tg, TensorView::contiguous(nullptr, DType::f32, zero_shape, 1),
                                                     std::nullopt, o, TensorView::contiguous(nullptr, DType::f32,
                                                                                             zero_shape, 2)));
  }
}

TEST(CrossEntropyMisc, StridedWeight) {
  // weight given as every other element of a longer buffer
  Spec s;
  s.shape = {6, 9}, s.weight = true, s.eps = 0.1, s.red = Reduction::mean, s.ignore_frac = 0.2;
  Problem p = build(s);
  Tensor wide = Tensor::make(DType::f32, {18});
  for (std::int64_t c = 0; c < 9; ++c) wide.set(2 * c, p.in.weight[c]), wide.set(2 * c + 1, 1e6);
  TensorView wv = TensorView::contiguous(wide.view.data, DType::f32, {9});
  wv.strides[0] = 2;
  CrossEntropyOptions o = p.options();
  o.weight = wv;
  Fwd f = make_outputs(p, true, true);
  Tensor grad = p.new_grad(Layout::contiguous);
  lossfuse::cross_entropy_forward_backward(p.logits.view, p.target.view, o, f.out, std::nullopt, grad.view);
  check_forward(p, f.loss, &f.lse, &f.z, "strided weight");
  check_grad(p, grad, "strided weight");
}

TEST(CrossEntropyMisc, BackwardFromReferenceLse) {
  // backward depends only on the lse it is given: feeding the reference lse (rounded to float32) gives the
  // reference gradient too
  Spec s;
  s.shape = {5, 1271}, s.weight = true, s.eps = 0.1, s.zs = 0.01, s.red = Reduction::sum, s.ignore_frac = 0.2;
  Problem p = build(s);
  Tensor lse = p.new_lse();
  for (std::int64_t r = 0; r < p.R; ++r) lse.set(r, p.ref.lse[r]);
  Tensor grad = p.new_grad(Layout::contiguous);
  lossfuse::cross_entropy_backward(p.logits.view, p.target.view, lse.view, std::nullopt, p.options(), grad.view);
  check_grad(p, grad, "backward from reference lse");
}

// Logits with a large common offset O (|z| >> 1): lse ~ O is rounded to ulp(O), which lse - z_y and exp(z - lse)
// would carry whole (float32 at O = 2^20: ulp 0.125, a loss off by up to 0.06 and every probability by up to 6%).
// The forward keeps lse as (row max) + log(sum exp(z - max)) for those differences, as torch's log_softmax does, so
// the loss and the fused gradient keep the precision of the differences z_c - z_y, whatever O. The values
// O + k / 2^f are exact in the dtype, and the long double reference works on k / 2^f alone. Rows: random
// k in [-24, 24] (z spread over 6); and a confident row (the target 10 above the rest: loss ~ C e^-10).
TEST(CrossEntropyMisc, LargeCommonOffsetKeepsLossAndGradientPrecision) {
  struct Case {
    DType dt;
    double offset, step, u;
  };
  for (const Case& k : {Case{DType::f32, 1048576.0, 0.125, 0x1p-24}, Case{DType::f32, -1048576.0, 0.125, 0x1p-24},
                        Case{DType::f64, 1099511627776.0, 0x1p-10, 0x1p-53}})
    for (const std::int64_t C : {std::int64_t{3}, std::int64_t{3000}})
      for (const double eps : {0.0, 0.1}) {
        SCOPED_TRACE(std::string(dname(k.dt)) + " offset " + std::to_string(k.offset) + " C " + std::to_string(C) +
                     " eps " + std::to_string(eps));
        const std::int64_t R = 4;
        Rng rng(7);
        std::vector<long double> v(static_cast<std::size_t>(R * C));
        Tensor logits = Tensor::make(k.dt, {R, C});
        Tensor target = Tensor::make(DType::i64, {R});
        for (std::int64_t r = 0; r < R; ++r) {
          const std::int64_t y = static_cast<std::int64_t>(rng.uniform(0.0, C - 1.0));
          target.set_int(r, y);
          for (std::int64_t c = 0; c < C; ++c) {
            const double kk = r == R - 1 ? (c == y ? 0.0 : -80.0) : std::round(rng.uniform(-24.0, 24.0));
            v[r * C + c] = static_cast<long double>(kk * k.step);
            logits.set(r * C + c, k.offset + kk * k.step);
            ASSERT_EQ(logits.get(r * C + c), k.offset + kk * k.step);  // exact in the dtype
          }
        }
        CrossEntropyOptions o;
        o.label_smoothing = eps;
        o.reduction = Reduction::none;
        Tensor rows = Tensor::make(acc_dtype(k.dt), {R});
        lossfuse::cross_entropy_forward(logits.view, target.view, o,
                                        CrossEntropyOutputs{rows.view, std::nullopt, std::nullopt});
        o.reduction = Reduction::sum;
        Tensor total = Tensor::make(acc_dtype(k.dt), {});
        Tensor grad = Tensor::make(k.dt, {R, C});
        lossfuse::cross_entropy_forward_backward(logits.view, target.view, o,
                                                 CrossEntropyOutputs{total.view, std::nullopt, std::nullopt},
                                                 std::nullopt, grad.view);
        // The gradient from a saved float64 lse (reduction none's road) keeps the same precision for float32
        // logits (float64 logits: the saved lse is rounded to double, ulp(2^40) / 2 = 2^-13 here; not checked).
        o.reduction = Reduction::none;
        Tensor lse64 = Tensor::make(DType::f64, {R});
        lossfuse::cross_entropy_forward(logits.view, target.view, o,
                                        CrossEntropyOutputs{rows.view, lse64.view, std::nullopt});
        Tensor grad_saved = Tensor::make(k.dt, {R, C});
        lossfuse::cross_entropy_backward(logits.view, target.view, lse64.view, std::nullopt, o, grad_saved.view);
        const long double log_c = std::log(static_cast<long double>(C));
        for (std::int64_t r = 0; r < R; ++r) {
          const std::int64_t y = target.get_int(r);
          long double m = -1e300L, sum = 0, smooth = 0;
          for (std::int64_t c = 0; c < C; ++c) m = std::max(m, v[r * C + c]);
          for (std::int64_t c = 0; c < C; ++c) sum += std::exp(v[r * C + c] - m);
          const long double lse = m + std::log(sum);  // of the offset-free values
          for (std::int64_t c = 0; c < C; ++c) smooth += lse - v[r * C + c];
          const long double want = (1 - eps) * (lse - v[r * C + y]) + eps / C * smooth;
          EXPECT_NEAR(rows.get(r), static_cast<double>(want), 64 * k.u * static_cast<double>(want + log_c + 1))
              << "loss of row " << r;
          for (std::int64_t c = 0; c < C; ++c) {
            const long double q = std::exp(v[r * C + c] - lse);
            const long double g = q - eps / C - (c == y ? 1 - eps : 0.0);
            // relative to the terms' size: q - 1 at a confident target cancels, in torch's softmax - 1 too
            EXPECT_NEAR(grad.get(r * C + c), static_cast<double>(g),
                        32 * k.u * static_cast<double>(q + (c == y) + 0.01))
                << "gradient of row " << r << " class " << c;
            if (k.dt != DType::f64) {
              EXPECT_NEAR(grad_saved.get(r * C + c), static_cast<double>(g),
                          32 * k.u * static_cast<double>(q + (c == y) + 0.01))
                  << "gradient from the saved float64 lse, row " << r << " class " << c;
            }
            if (HasFailure()) return;
          }
        }
      }
}

// A row whose first vector holds only -inf starts its sum at shift 0 (no finite guess); with every value in
// [-60, 0) it is never re-summed, so the sum's shift lies above the row max. lse - z_y and the fused q_y must still
// come from the row max (log_s in [0, log C]): a confident row at z ~ -40 (loss 9.5e-6) is within a few ulp of 1,
// where lse rounded at |z| would be off by up to ulp(40) / 2 = 1.9e-6 (1.85e-6 here). The sum taken from a shift far
// from the max carries the exps' error relative to the max's term (a few ulp of 1 on the scalar target, whose exp
// is the least accurate), so the tolerance is 16 ulp of 1 (9.5e-7), as log(1 + small) near a confident target.
TEST(CrossEntropyMisc, RowStartingWithInfinitiesKeepsLossPrecision) {
  const std::int64_t C = 64, R = 2;
  Tensor logits = Tensor::make(DType::f32, {R, C});
  Tensor target = Tensor::make(DType::i64, {R});
  const double inf = std::numeric_limits<double>::infinity();
  for (std::int64_t r = 0; r < R; ++r) {
    target.set_int(r, 40);
    for (std::int64_t c = 0; c < C; ++c) logits.set(r * C + c, c < 32 ? -inf : (c == 40 ? -40.0 : -55.0 - r));
  }
  CrossEntropyOptions o;
  o.reduction = Reduction::none;
  Tensor rows = Tensor::make(DType::f32, {R});
  lossfuse::cross_entropy_forward(logits.view, target.view, o,
                                  CrossEntropyOutputs{rows.view, std::nullopt, std::nullopt});
  o.reduction = Reduction::sum;
  Tensor total = Tensor::make(DType::f32, {});
  Tensor grad = Tensor::make(DType::f32, {R, C});
  lossfuse::cross_entropy_forward_backward(logits.view, target.view, o,
                                           CrossEntropyOutputs{total.view, std::nullopt, std::nullopt}, std::nullopt,
                                           grad.view);
  const double u = 0x1p-24;
  for (std::int64_t r = 0; r < R; ++r) {
    const double rest = 31.0 * std::exp(-15.0 - static_cast<double>(r));  // sum of exp(z_c - z_y) over c != y
    const double loss = std::log1p(rest), g_y = -rest / (1.0 + rest);
    EXPECT_NEAR(rows.get(r), loss, 16 * u + 8 * u * loss) << "row " << r;
    EXPECT_NEAR(grad.get(r * C + 40), g_y, 16 * u + 8 * u * std::fabs(g_y)) << "row " << r;
    EXPECT_EQ(grad.get(r * C), 0.0) << "row " << r;  // exp(-inf)
  }
}

// Gradients of 32 MiB and more are written by streaming stores, row by row where a row starts 64-byte aligned
// (float32; bfloat16 where the hardware rounds pairs). Streaming changes how values are stored, never which:
// the same problem with its gradient buffer misaligned (every store cached) must give the same bits. C = 8200
// float32 puts every other row on a 64-byte boundary, so one gradient mixes both kinds of row. Without label
// smoothing bfloat16 rows go by pairs of vectors (even and odd classes), stored by their own path.
TEST(CrossEntropyMisc, StreamedGradientsEqualCachedOnes) {
  for (const double eps : {0.1, 0.0})
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE("label_smoothing " + std::to_string(eps));
    const std::int64_t C = 8200;
    const std::int64_t R = dt == DType::f32 ? 1024 : 2048;  // 32.8 MB: above the threshold
    const std::size_t esz = lossfuse::dtype_size(dt);
    const std::size_t bytes = static_cast<std::size_t>(R * C) * esz;
    Rng rng(91);
    Tensor logits = Tensor::make(dt, {R, C});
    for (std::int64_t i = 0; i < R * C; ++i) logits.set(i, rng.normal() * 2.0);
    Tensor target = Tensor::make(DType::i64, {R});
    for (std::int64_t r = 0; r < R; ++r) target.set_int(r, static_cast<std::int64_t>(rng.uniform(0.0, C - 1.0)));
    CrossEntropyOptions o;
    o.reduction = Reduction::sum;
    o.label_smoothing = eps;
    std::vector<std::uint8_t> aligned_buf(bytes + 128), offset_buf(bytes + 128);
    auto at = [&](std::vector<std::uint8_t>& b, std::size_t skew) {
      const auto addr = reinterpret_cast<std::uintptr_t>(b.data());
      return reinterpret_cast<void*>((addr + 63) / 64 * 64 + skew);
    };
    const TensorView g_aligned = TensorView::contiguous(at(aligned_buf, 0), dt, {R, C});
    const TensorView g_skewed = TensorView::contiguous(at(offset_buf, esz), dt, {R, C});
    auto same_bits = [&](const char* what) {
      EXPECT_EQ(std::memcmp(g_aligned.data, g_skewed.data, bytes), 0) << dname(dt) << " " << what;
    };
    Tensor loss = Tensor::make(acc_dtype(dt), {});
    Tensor lse = Tensor::make(acc_dtype(dt), {R});
    CrossEntropyOutputs out{loss.view, lse.view, std::nullopt};
    lossfuse::cross_entropy_forward_backward(logits.view, target.view, o, out, std::nullopt, g_aligned);
    lossfuse::cross_entropy_forward_backward(logits.view, target.view, o, out, std::nullopt, g_skewed);
    same_bits("forward_backward");
    std::fill(aligned_buf.begin(), aligned_buf.end(), 0);
    std::fill(offset_buf.begin(), offset_buf.end(), 0);
    lossfuse::cross_entropy_backward(logits.view, target.view, lse.view, std::nullopt, o, g_aligned);
    lossfuse::cross_entropy_backward(logits.view, target.view, lse.view, std::nullopt, o, g_skewed);
    same_bits("backward");
    // and the values are the gradient: a few rows against the float64 reference formula
    for (std::int64_t r : {std::int64_t{0}, std::int64_t{1}, R - 1}) {
      const std::int64_t y = target.get_int(r);
      double m = -1e300, sum = 0;
      for (std::int64_t c = 0; c < C; ++c) m = std::max(m, logits.get(r * C + c));
      for (std::int64_t c = 0; c < C; ++c) sum += std::exp(logits.get(r * C + c) - m);
      const double l = m + std::log(sum);
      for (std::int64_t c = 0; c < C; c += 97) {
        const double want =
            std::exp(logits.get(r * C + c) - l) - eps / static_cast<double>(C) - (c == y ? 1.0 - eps : 0.0);
        const double got = load(dt, g_aligned.data, r * C + c);
        EXPECT_NEAR(got, want, 1e-6 + std::fabs(want) * (dt == DType::f32 ? 1e-5 : 8e-3)) << "row " << r << " class " << c;
      }
    }
  }
}

}  // namespace
}  // namespace lftest::ce
