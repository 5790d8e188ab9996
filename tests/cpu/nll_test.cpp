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
#include "test_util.hpp"

namespace lftest::nll {
namespace {

using lossfuse::NllOptions;



enum class Up { absent, scalar, per_row };

struct Spec {
  std::string name;
  DType dt = DType::f32, tdt = DType::i64;
  std::optional<DType> wdt;
  std::vector<std::int64_t> shape{6, 11};
  Layout layout = Layout::contiguous, grad_layout = Layout::contiguous;
  Reduction red = Reduction::mean;
  bool weight = false;
  std::int64_t ignore_index = -100;
  double ignore_frac = 0;
  Up up = Up::absent;
  double up_scalar = -0.75;
  std::uint64_t seed = 1;
  std::function<void(Rng&, std::int64_t R, std::int64_t C, std::vector<double>& x, std::vector<std::int64_t>& t)>
      edit;
};
void PrintTo(const Spec& s, std::ostream* os) { *os << s.name; }

Up default_up(Reduction r, std::uint64_t k) {
  if (r == Reduction::none) return k % 3 == 0 ? Up::absent : Up::per_row;
  return k % 2 == 0 ? Up::scalar : Up::absent;
}

struct Problem {
  Spec s;
  std::int64_t R = 0, C = 0;
  std::vector<std::int64_t> rshape;
  Tensor input, target;
  std::optional<Tensor> weight, grad_loss;
  lfref::NllInput in;
  lfref::NllResult ref;

  [[nodiscard]] NllOptions options() const {
    NllOptions o;
    o.reduction = s.red;
    o.ignore_index = s.ignore_index;
    if (weight) o.weight = weight->view;
    return o;
  }
  [[nodiscard]] std::optional<TensorView> up() const {
    if (grad_loss) return grad_loss->view;
    return std::nullopt;
  }
  [[nodiscard]] DType acc() const { return acc_dtype(s.dt); }
};

Problem build(const Spec& s) {
  Problem p;
  p.s = s;
  p.C = s.shape[class_dim(s.shape)];
  p.rshape = row_shape(s.shape);
  p.R = prod(p.rshape);
  const std::int64_t R = p.R, C = p.C;
  Rng rng(s.seed * 104729 + static_cast<std::uint64_t>(C * 17 + R));
  std::vector<double> x(static_cast<std::size_t>(R * C));
  for (auto& v : x) v = -std::fabs(3.0 * rng.normal());  // log-probability-like (any value is allowed)
  std::vector<std::int64_t> t(static_cast<std::size_t>(R));
  for (auto& v : t) v = rng.uniform() < s.ignore_frac ? s.ignore_index : rng.index(C);
  if (s.edit) s.edit(rng, R, C, x, t);
  p.input = Tensor::make(s.dt, s.shape, s.layout, kSentinel);
  scatter_rows(p.input, x);
  p.target = Tensor::make(s.tdt, p.rshape);
  for (std::int64_t r = 0; r < R; ++r) p.target.set_int(r, t[r]);
  p.in.rows = R, p.in.C = C;
  p.in.x = gather_rows(p.input);
  for (std::int64_t r = 0; r < R; ++r) p.in.target.push_back(p.target.get_int(r));
  if (s.weight) {
    p.weight = Tensor::make(s.wdt.value_or(s.dt), {C});
    for (std::int64_t c = 0; c < C; ++c) p.weight->set(c, lfref::round_to(rng.uniform(0.25, 2.0), lfref::kBF16));
    p.in.weight = p.weight->values();
  }
  if (s.up == Up::per_row) {
    p.grad_loss = Tensor::make(p.acc(), p.rshape);
    for (std::int64_t r = 0; r < R; ++r) p.grad_loss->set(r, lfref::round_to(rng.uniform(-2.0, 2.0), lfref::kBF16));
    p.in.grad_loss = p.grad_loss->values();
    if (p.in.grad_loss.size() == 1) p.in.grad_loss.push_back(p.in.grad_loss[0]);
  } else if (s.up == Up::scalar) {
    p.grad_loss = scalar_tensor(p.acc(), s.up_scalar);
    p.in.grad_loss = {p.grad_loss->get(0)};
  }
  p.in.reduction = s.red;
  p.in.ignore_index = s.ignore_index;
  p.in.u = compute_unit(s.dt);
  p.ref = lfref::nll(p.in);
  return p;
}

void run_all(const Spec& s) {
  SCOPED_TRACE(s.name);
  Problem p = build(s);
  const auto input_before = p.input.storage;
  Tensor loss = Tensor::make(p.acc(), s.red == Reduction::none ? p.rshape : std::vector<std::int64_t>{},
                             Layout::contiguous, kSentinel);
  lossfuse::nll_forward(p.input.view, p.target.view, p.options(), loss.view);
  if (s.red == Reduction::none) {
    EXPECT_TRUE(close_all("loss", loss.values(), p.ref.row_loss, p.ref.row_loss_tol, p.acc()));
  } else {
    EXPECT_TRUE(close_one("loss", loss.get(0), p.ref.loss, p.ref.loss_tol, p.acc()));
  }
  Tensor grad = Tensor::make(s.dt, s.shape, s.grad_layout, kSentinel);
  lossfuse::nll_backward(p.input.view, p.target.view, p.up(), p.options(), grad.view);
  EXPECT_TRUE(close_all("grad", gather_rows(grad), p.ref.grad, p.ref.grad_tol, s.dt));
  EXPECT_TRUE(grad.outside_untouched(kSentinel)) << "nll_backward wrote outside grad_input";
  EXPECT_TRUE(p.input.storage == input_before) << "the input was modified";
}

class Nll : public ::testing::TestWithParam<Spec> {};
TEST_P(Nll, MatchesReference) { run_all(GetParam()); }

std::vector<Spec> option_specs() {
  std::vector<Spec> v;
  std::uint64_t k = 0;
  const std::vector<std::vector<std::int64_t>> shapes = {{7}, {9, 13}, {3, 6, 4}, {2, 5, 3, 2}, {3, 50257}};
  for (DType dt : kFloats)
    for (Reduction red : kReds)
      for (const auto& shape : shapes)
        for (int w = 0; w < 2; ++w)
          for (int ign = 0; ign < 3; ++ign) {
            Spec s;
            s.dt = dt, s.red = red, s.shape = shape, s.weight = w;
            if (ign == 1) s.ignore_frac = 0.3;
            if (ign == 2) s.ignore_index = 1, s.ignore_frac = 0.3;
            s.up = default_up(red, k);
            s.seed = ++k;
            s.name = nm(dt) + "_" + red_name(red) + "_" + shape_name(shape) + (w ? "_w" : "") +
                     (ign == 1 ? "_ign" : ign == 2 ? "_ignclass1" : "");
            v.push_back(s);
          }
  return v;
}
INSTANTIATE_TEST_SUITE_P(Options, Nll, ::testing::ValuesIn(option_specs()), [](const auto& i) { return i.param.name; });

std::vector<Spec> layout_specs() {
  std::vector<Spec> v;
  std::uint64_t k = 0;
  for (DType dt : kFloats)
    for (Layout l : {Layout::transposed, Layout::padded, Layout::class_last})
      for (Reduction red : kReds) {
        Spec s;
        s.dt = dt, s.layout = l, s.red = red, s.shape = {3, 7, 2, 5}, s.weight = true, s.ignore_frac = 0.2;
        s.grad_layout = (k % 2) ? l : Layout::contiguous;
        s.up = default_up(red, k);
        s.seed = 500 + ++k;
        s.name = nm(dt) + "_" + layout_name(l) + "_" + red_name(red) +
                 (s.grad_layout != Layout::contiguous ? "_stridedgrad" : "");
        v.push_back(s);
      }
  return v;
}
INSTANTIATE_TEST_SUITE_P(Layouts, Nll, ::testing::ValuesIn(layout_specs()), [](const auto& i) { return i.param.name; });

std::vector<Spec> target_specs() {
  std::vector<Spec> v;
  std::uint64_t k = 0;
  for (DType tdt : {DType::u8, DType::i8, DType::i16, DType::i32, DType::i64})
    for (DType dt : {DType::f32, DType::bf16})
      for (Reduction red : kReds) {
        Spec s;
        s.dt = dt, s.tdt = tdt, s.red = red;
        s.shape = {4, (tdt == DType::u8 || tdt == DType::i8) ? std::int64_t{120} : std::int64_t{3000}, 3};
        if (tdt == DType::u8) s.ignore_index = 7;
        s.ignore_frac = 0.25;
        s.weight = (k % 2) == 0;
        s.up = default_up(red, k);
        s.seed = 700 + ++k;
        s.name = nm(tdt) + "_" + nm(dt) + "_" + red_name(red);
        v.push_back(s);
      }
  {
    Spec s;
    s.tdt = DType::u8, s.shape = {5, 256}, s.red = Reduction::none;
    s.edit = [](Rng&, std::int64_t R, std::int64_t, std::vector<double>&, std::vector<std::int64_t>& t) {
      for (std::int64_t r = 0; r < R; ++r) t[r] = 251 + r;
    };
    s.name = "u8_targets_above_127";
    v.push_back(s);
  }
  return v;
}
INSTANTIATE_TEST_SUITE_P(TargetDtypes, Nll, ::testing::ValuesIn(target_specs()),
                         [](const auto& i) { return i.param.name; });

std::vector<Spec> edge_specs() {
  std::vector<Spec> v;
  std::uint64_t k = 0;
  for (DType dt : kFloats)
    for (Reduction red : kReds) {
      {
        Spec s;
        s.dt = dt, s.red = red, s.shape = {0, 5}, s.weight = true;
        s.seed = 900 + ++k;
        s.name = "empty_" + nm(dt) + "_" + red_name(red);
        v.push_back(s);
      }
      {
        Spec s;
        s.dt = dt, s.red = red, s.shape = {6, 5}, s.weight = true, s.ignore_frac = 1.0;
        s.up = default_up(red, k);
        s.seed = 900 + ++k;
        s.name = "all_ignored_" + nm(dt) + "_" + red_name(red);
        v.push_back(s);
      }
      {  // NaN / -inf / +inf inputs: only the target entry matters, the gradient never reads the input
        Spec s;
        s.dt = dt, s.red = red, s.shape = {6, 5};
        s.up = default_up(red, k);
        s.seed = 900 + ++k;
        s.edit = [](Rng&, std::int64_t, std::int64_t C, std::vector<double>& x, std::vector<std::int64_t>& t) {
          t[0] = 2, x[0 * C + 2] = -kInf;   // loss +inf
          t[1] = 2, x[1 * C + 3] = kNaN;    // NaN off the target: no effect
          t[2] = 1, x[2 * C + 1] = kNaN;    // NaN at the target: loss NaN
          t[3] = 0, x[3 * C + 4] = kInf;    // +inf off the target: no effect
          t[4] = -100, x[4 * C + 0] = kNaN;  // ignored: 0
        };
        s.name = "nonfinite_" + nm(dt) + "_" + red_name(red);
        v.push_back(s);
      }
      {
        Spec s;
        s.dt = dt, s.red = red, s.shape = {6, 5}, s.weight = true, s.seed = 900 + ++k;
        s.edit = [dt](Rng& rng, std::int64_t R, std::int64_t C, std::vector<double>& x, std::vector<std::int64_t>&) {
          const double mag = dt == DType::f16 ? 6e4 : dt == DType::f64 ? 1e300 : 1e30;
          for (std::int64_t i = 0; i < R * C; ++i) x[i] = mag * rng.uniform(-1.0, 1.0);
        };
        s.name = "huge_" + nm(dt) + "_" + red_name(red);
        v.push_back(s);
      }
    }
  return v;
}
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
