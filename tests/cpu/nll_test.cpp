// nll_forward / nll_backward on the CPU against the float64 reference (torch.nn.functional.nll_loss).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "error_harness.hpp"
#include "cpu/nll_harness.hpp"
#include "test_util.hpp"

namespace lftest::nll {
namespace {

class Nll : public ::testing::TestWithParam<Spec> {};
TEST_P(Nll, MatchesReference) { run_all(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Options, Nll, ::testing::ValuesIn(option_specs()), [](const auto& i) { return i.param.name; });
INSTANTIATE_TEST_SUITE_P(Layouts, Nll, ::testing::ValuesIn(layout_specs()), [](const auto& i) { return i.param.name; });
INSTANTIATE_TEST_SUITE_P(TargetDtypes, Nll, ::testing::ValuesIn(target_specs()),
                         [](const auto& i) { return i.param.name; });
INSTANTIATE_TEST_SUITE_P(Edge, Nll, ::testing::ValuesIn(edge_specs()), [](const auto& i) { return i.param.name; });

TEST(NllReference, HandValues) {
  lfref::NllInput in;
  in.rows = 3, in.C = 2;
  in.x = {-1, -2, -3, -4, -5, -6};
  in.target = {1, 0, -100};
  in.weight = {0.5, 2};
  in.reduction = Reduction::mean;
  auto r = lfref::nll(in);
  EXPECT_DOUBLE_EQ(r.loss, (2 * 2 + 0.5 * 3) / 2.5);
  EXPECT_DOUBLE_EQ(r.grad[1], -2 / 2.5);
  EXPECT_DOUBLE_EQ(r.grad[4], 0.0);
}

TEST(NllMisc, Determinism) {
  Spec s;
  s.shape = {2000, 300}, s.red = Reduction::mean, s.weight = true, s.ignore_frac = 0.1;
  const Problem p = build(s);
  std::vector<std::uint8_t> loss0, grad0;
  for (int threads : {1, 2, 3, 1}) {
    ThreadsGuard g(threads);
    Tensor loss = Tensor::make(DType::f32, {});
    Tensor grad = Tensor::make(DType::f32, s.shape);
    lossfuse::nll_forward(p.input.view, p.target.view, p.options(), loss.view);
    lossfuse::nll_backward(p.input.view, p.target.view, std::nullopt, p.options(), grad.view);
    if (loss0.empty()) {
      loss0 = loss.storage, grad0 = grad.storage;
      EXPECT_TRUE(close_one("loss", loss.get(0), p.ref.loss, p.ref.loss_tol, DType::f32));
    }
    EXPECT_TRUE(loss.storage == loss0) << threads << " threads";
    EXPECT_TRUE(grad.storage == grad0) << threads << " threads";
  }
}

// ---- errors -------------------------------------------------------------------------------------------------
struct ErrFixture : GuardedBuffers {
  Tensor input = Tensor::make(DType::f32, {4, 5});
  Tensor target = Tensor::make(DType::i64, {4});
  Tensor loss = Tensor::make(DType::f32, {}, Layout::contiguous, kSentinel);
  Tensor grad = Tensor::make(DType::f32, {4, 5}, Layout::contiguous, kSentinel);
  std::optional<Tensor> grad_loss;
  NllOptions o;
  ErrFixture() {
    for (std::int64_t i = 0; i < 20; ++i) input.set(i, -0.1 * static_cast<double>(i));
    for (std::int64_t i = 0; i < 4; ++i) target.set_int(i, i);
    guard("input", input), guard("target", target), guard("loss", loss), guard("grad_input", grad);
  }
};
struct Views {
  std::optional<TensorView> input, target, loss, grad;
};
enum class Entry { forward, backward };
void expect_error(const std::function<Views(ErrFixture&)>& setup, std::initializer_list<ErrorCode> codes,
                  std::initializer_list<Entry> entries = {Entry::forward, Entry::backward},
                  std::string* message = nullptr) {
  expect_entry_errors<ErrFixture, Entry, Views>(
      setup, codes, entries,
      [](const ErrFixture& f, Entry e, const Views& v) {
        const TensorView in = v.input.value_or(f.input.view), tg = v.target.value_or(f.target.view);
        std::optional<TensorView> up;
        if (f.grad_loss) up = f.grad_loss->view;
        if (e == Entry::forward) {
          lossfuse::nll_forward(in, tg, f.o, v.loss.value_or(f.loss.view));
        } else {
          lossfuse::nll_backward(in, tg, up, f.o, v.grad.value_or(f.grad.view));
        }
      },
      [](Entry e) { return std::string(e == Entry::forward ? "forward" : "backward"); }, {}, message);
}

TEST(NllErrors, ValidFixtureRuns) {
  ErrFixture f;
  EXPECT_NO_THROW(lossfuse::nll_forward(f.input.view, f.target.view, f.o, f.loss.view));
  EXPECT_NO_THROW(lossfuse::nll_backward(f.input.view, f.target.view, std::nullopt, f.o, f.grad.view));
}
TEST(NllErrors, TargetOutOfRange) {
  std::string msg;
  expect_error([](ErrFixture& f) { f.target.set_int(3, 7); return Views{}; }, {ErrorCode::index_error},
               {Entry::forward, Entry::backward}, &msg);
  EXPECT_TRUE(std::regex_search(msg, std::regex("\\b7\\b"))) << msg;
  EXPECT_TRUE(std::regex_search(msg, std::regex("\\b3\\b"))) << msg;
  expect_error([](ErrFixture& f) { f.target.set_int(1, -1); return Views{}; }, {ErrorCode::index_error});
  expect_error([](ErrFixture& f) { f.target.set_int(1, 5); return Views{}; }, {ErrorCode::index_error});
  expect_error([](ErrFixture& f) { f.target.set_int(1, -100); f.o.ignore_index = 2; return Views{}; },
               {ErrorCode::index_error});
}
TEST(NllErrors, WrongSizeWeight) {
  static Tensor w = Tensor::make(DType::f32, {4});
  expect_error([](ErrFixture& f) { f.o.weight = w.view; return Views{}; },
               {ErrorCode::shape_mismatch, ErrorCode::invalid_value});
}
TEST(NllErrors, ShapeMismatch) {
  static Tensor t5 = Tensor::make(DType::i64, {5});
  static Tensor t45 = Tensor::make(DType::i64, {4, 5});
  expect_error([](ErrFixture&) { return Views{{}, t5.view, {}, {}}; }, {ErrorCode::shape_mismatch});
  expect_error([](ErrFixture&) { return Views{{}, t45.view, {}, {}}; }, {ErrorCode::shape_mismatch});
}
TEST(NllErrors, FloatTarget) {
  static Tensor tf = Tensor::make(DType::f32, {4});
  static Tensor tf45 = Tensor::make(DType::f32, {4, 5});
  expect_error([](ErrFixture&) { return Views{{}, tf.view, {}, {}}; }, {ErrorCode::dtype_mismatch});
  expect_error([](ErrFixture&) { return Views{{}, tf45.view, {}, {}}; },
               {ErrorCode::dtype_mismatch, ErrorCode::shape_mismatch});
}
TEST(NllErrors, IntegerInput) {
  static Tensor xi = Tensor::make(DType::i16, {4, 5});
  expect_error([](ErrFixture&) { return Views{xi.view, {}, {}, {}}; }, {ErrorCode::dtype_mismatch},
               {Entry::forward});
}
TEST(NllErrors, LossShapeAndDtype) {
  static Tensor l4 = Tensor::make(DType::f32, {4}, Layout::contiguous, kSentinel);
  static Tensor l64 = Tensor::make(DType::f64, {}, Layout::contiguous, kSentinel);
  expect_error([](ErrFixture&) { return Views{{}, {}, l4.view, {}}; }, {ErrorCode::shape_mismatch}, {Entry::forward});
  expect_error([](ErrFixture&) { return Views{{}, {}, l64.view, {}}; }, {ErrorCode::dtype_mismatch},
               {Entry::forward});
  static Tensor l0 = Tensor::make(DType::f32, {}, Layout::contiguous, kSentinel);
  expect_error([](ErrFixture& f) { f.o.reduction = Reduction::none; return Views{{}, {}, l0.view, {}}; },
               {ErrorCode::shape_mismatch}, {Entry::forward});
}
TEST(NllErrors, GradShapeDtypeOverlap) {
  static Tensor g = Tensor::make(DType::f32, {4, 4}, Layout::contiguous, kSentinel);
  static Tensor g16 = Tensor::make(DType::f16, {4, 5}, Layout::contiguous, kSentinel);
  expect_error([](ErrFixture&) { return Views{{}, {}, {}, g.view}; }, {ErrorCode::shape_mismatch}, {Entry::backward});
  expect_error([](ErrFixture&) { return Views{{}, {}, {}, g16.view}; }, {ErrorCode::dtype_mismatch},
               {Entry::backward});
  expect_error([](ErrFixture& f) { return Views{{}, {}, {}, f.input.view}; }, {ErrorCode::bad_pointer},
               {Entry::backward});
  expect_error([](ErrFixture& f) {
    return Views{{}, {}, TensorView::contiguous(f.input.view.data, DType::f32, {}), {}};
  }, {ErrorCode::bad_pointer}, {Entry::forward});
}
TEST(NllErrors, GradLoss) {
  expect_error([](ErrFixture& f) { f.grad_loss = Tensor::make(DType::f32, {4}); return Views{}; },
               {ErrorCode::shape_mismatch}, {Entry::backward});
  expect_error([](ErrFixture& f) { f.grad_loss = Tensor::make(DType::f16, {}); return Views{}; },
               {ErrorCode::dtype_mismatch}, {Entry::backward});
}
TEST(NllErrors, PointersAndSizes) {
  static Tensor raw = Tensor::make(DType::f32, {32});
  expect_error([](ErrFixture& f) { TensorView v = f.input.view; v.data = nullptr; return Views{v, {}, {}, {}}; },
               {ErrorCode::bad_pointer});
  expect_error([](ErrFixture&) {
    return Views{TensorView::contiguous(raw.storage.data() + 2, DType::f32, {4, 5}), {}, {}, {}};
  }, {ErrorCode::bad_pointer});
  expect_error([](ErrFixture& f) { TensorView v = f.input.view; v.shape[1] = -5; return Views{v, {}, {}, {}}; },
               {ErrorCode::invalid_value, ErrorCode::shape_mismatch});
  expect_error([](ErrFixture& f) {
    TensorView in = f.input.view, tg = f.target.view, gr = f.grad.view;
    in.shape[0] = tg.shape[0] = gr.shape[0] = std::int64_t{1} << 62;
    in.shape[1] = gr.shape[1] = 16;
    return Views{in, tg, {}, gr};
  }, {ErrorCode::invalid_value, ErrorCode::shape_mismatch});
  expect_error([](ErrFixture& f) { f.o.reduction = static_cast<Reduction>(9); return Views{}; },
               {ErrorCode::invalid_value});
}

}  // namespace
}  // namespace lftest::nll
