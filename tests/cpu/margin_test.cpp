// The margin and embedding losses on the CPU (include/lossfuse/margin.hpp) against the float64 reference
// (tests/reference/margin_reference.hpp): the spec tables of tests/cpu/margin_harness.hpp (every loss, option,
// reduction, dtype, layout, odd sizes, empty batches, extreme values), finite differences in float64, hand values
// taken from torch 2.15, determinism and every error path.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "cpu/margin_harness.hpp"

namespace lftest::margin {
namespace {

class Margin : public ::testing::TestWithParam<Spec> {};
TEST_P(Margin, MatchesReference) { check_case(GetParam()); }

auto spec_name = [](const auto& i) { return i.param.name; };
INSTANTIATE_TEST_SUITE_P(Options, Margin, ::testing::ValuesIn(option_specs()), spec_name);
INSTANTIATE_TEST_SUITE_P(Layouts, Margin, ::testing::ValuesIn(layout_specs()), spec_name);
INSTANTIATE_TEST_SUITE_P(TargetDtypes, Margin, ::testing::ValuesIn(target_specs()), spec_name);
INSTANTIATE_TEST_SUITE_P(Edge, Margin, ::testing::ValuesIn(edge_specs()), spec_name);

// ---- finite differences in float64 ----------------------------------------------------------------------------
// The library's backward against central differences of the library's own forward (reduction sum).

void fd_check(Spec s) {
  s.dt = DType::f64, s.red = Reduction::sum, s.up = false;
  for (bool& w : s.want_grad) w = true;
  Problem p = build(s);
  const Outputs out = run_lib(p);
  const double h = 1e-6;
  auto f = [&](Problem& q) {
    Tensor loss = Tensor::make(DType::f64, {});
    call_forward(q, loss.view);
    return loss.get(0);
  };
  const std::int64_t n = p.R * p.D;
  for (int k = 0; k < num_grads(s.kind); ++k) {
    Tensor* t = k < static_cast<int>(p.x.size()) ? &p.x[k] : &*p.target;  // soft margin: grad 1 is the target
    for (std::int64_t i = 0; i < n; ++i) {
      const double x0 = t->get(i);
      t->set(i, x0 + h);
      const double fp = f(p);
      t->set(i, x0 - h);
      const double fm = f(p);
      t->set(i, x0);
      const double fd = (fp - fm) / (2 * h), g = out.grads[k]->get(i);
      EXPECT_NEAR(g, fd, 1e-6 * (1 + std::fabs(fd))) << "grad " << k << " element " << i;
    }
  }
}

TEST(MarginFiniteDifference, AllLosses) {
  for (double pn : {1.0, 2.0, 3.0, 1.5, kInf}) {
    for (bool swap : {false, true}) {
      Spec s;
      s.kind = LossKind::triplet_margin, s.shape = {4, 5}, s.p = pn, s.swap = swap, s.margin = 1.5, s.eps = 0.01;
      s.seed = 11;
      SCOPED_TRACE("triplet p=" + std::to_string(pn) + (swap ? " swap" : ""));
      fd_check(s);
    }
  }
  for (double m : {-0.3, 0.0, 0.2}) {
    Spec s;
    s.kind = LossKind::cosine_embedding, s.shape = {6, 5}, s.margin = m, s.seed = 12;
    SCOPED_TRACE("cosine margin=" + std::to_string(m));
    fd_check(s);
  }
  for (int mp : {1, 2}) {
    Spec s;
    s.kind = LossKind::multi_margin, s.shape = {5, 6}, s.mp = mp, s.weight = true, s.margin = 0.7, s.seed = 13;
    SCOPED_TRACE("multi_margin p=" + std::to_string(mp));
    fd_check(s);
  }
  {
    Spec s;
    s.kind = LossKind::multilabel_margin, s.shape = {5, 6}, s.seed = 14;
    SCOPED_TRACE("multilabel_margin");
    fd_check(s);
  }
  {
    Spec s;
    s.kind = LossKind::multilabel_soft_margin, s.shape = {2, 3, 5}, s.weight = true, s.seed = 15;
    SCOPED_TRACE("multilabel_soft_margin");
    fd_check(s);
  }
}

// ---- hand values from torch 2.15 (CPU, float64) ---------------------------------------------------------------

Tensor from(DType t, std::vector<std::int64_t> shape, const std::vector<double>& v) {
  Tensor x = Tensor::make(t, std::move(shape));
  for (std::size_t i = 0; i < v.size(); ++i) x.set(static_cast<std::int64_t>(i), v[i]);
  return x;
}
Tensor from_int(DType t, std::vector<std::int64_t> shape, const std::vector<std::int64_t>& v) {
  Tensor x = Tensor::make(t, std::move(shape));
  for (std::size_t i = 0; i < v.size(); ++i) x.set_int(static_cast<std::int64_t>(i), v[i]);
  return x;
}
void expect_values(const Tensor& t, const std::vector<double>& want, double tol = 1e-12) {
  ASSERT_EQ(t.numel(), static_cast<std::int64_t>(want.size()));
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(t.get(static_cast<std::int64_t>(i)), want[i], tol) << i;
}

TEST(MarginTorch, MultiMarginWeightsAndP) {
  // x=[[.1,.2,.4,.8],[.3,-.2,.5,0]], y=[3,0], w=[1,2,3,4], margin .9
  Tensor x = from(DType::f64, {2, 4}, {0.1, 0.2, 0.4, 0.8, 0.3, -0.2, 0.5, 0.0});
  Tensor y = from_int(DType::i32, {2}, {3, 0});
  Tensor w = from(DType::f64, {4}, {1, 2, 3, 4});
  struct Want {
    int p;
    Reduction red;
    std::vector<double> loss, grad;
  };
  const std::vector<Want> wants = {
      {1, Reduction::none, {1.0, 0.525}, {1, 1, 1, -3, -0.75, 0.25, 0.25, 0.25}},
      {1, Reduction::mean, {0.7625}, {0.5, 0.5, 0.5, -1.5, -0.375, 0.125, 0.125, 0.125}},
      {2, Reduction::none, {0.38, 0.4325}, {0.4, 0.6, 1.0, -2.0, -1.05, 0.2, 0.55, 0.3}},
      {2, Reduction::sum, {0.8125}, {0.4, 0.6, 1.0, -2.0, -1.05, 0.2, 0.55, 0.3}},
  };
  for (const Want& want : wants) {
    lossfuse::MultiMarginOptions o;
    o.p = want.p, o.margin = 0.9, o.weight = w.view, o.reduction = want.red;
    Tensor loss = Tensor::make(
        DType::f64, want.red == Reduction::none ? std::vector<std::int64_t>{2} : std::vector<std::int64_t>{});
    Tensor g = Tensor::make(DType::f64, {2, 4});
    lossfuse::multi_margin_forward(x.view, y.view, o, loss.view);
    lossfuse::multi_margin_backward(x.view, y.view, std::nullopt, o, g.view);
    expect_values(loss, want.loss);
    if (want.red == Reduction::none) {
      // torch's gradient of sum(loss): grad_loss of ones
      Tensor ones = from(DType::f64, {2}, {1, 1});
      lossfuse::multi_margin_backward(x.view, y.view, ones.view, o, g.view);
    }
    expect_values(g, want.grad);
  }
  // z == 0 exactly: no loss, no gradient (torch tests z > 0)
  Tensor xb = from(DType::f64, {1, 2}, {1.0, 0.0});
  Tensor yb = from_int(DType::i64, {1}, {0});
  Tensor l = Tensor::make(DType::f64, {}), gb = Tensor::make(DType::f64, {1, 2});
  lossfuse::multi_margin_forward(xb.view, yb.view, {}, l.view);
  lossfuse::multi_margin_backward(xb.view, yb.view, std::nullopt, {}, gb.view);
  expect_values(l, {0.0});
  expect_values(gb, {0.0, 0.0});
}

TEST(MarginTorch, MultilabelMarginTerminatorAndDuplicates) {
  Tensor x = from(DType::f64, {1, 4}, {0.1, 0.2, 0.4, 0.8});
  Tensor l = Tensor::make(DType::f64, {}), g = Tensor::make(DType::f64, {1, 4});
  Tensor y = from_int(DType::i16, {1, 4}, {3, 0, -1, 1});  // the 1 after -1 is not a label
  lossfuse::multilabel_margin_forward(x.view, y.view, {}, l.view);
  lossfuse::multilabel_margin_backward(x.view, y.view, std::nullopt, {}, g.view);
  expect_values(l, {0.85});
  expect_values(g, {-0.5, 0.5, 0.5, -0.5});
  Tensor yd = from_int(DType::i64, {1, 4}, {3, 3, -1, 1});  // duplicates count twice
  lossfuse::multilabel_margin_forward(x.view, yd.view, {}, l.view);
  lossfuse::multilabel_margin_backward(x.view, yd.view, std::nullopt, {}, g.view);
  expect_values(l, {0.65});
  expect_values(g, {0.5, 0.5, 0.5, -1.5});
}

TEST(MarginTorch, SoftMarginTargetGradient) {
  Tensor x = from(DType::f64, {1, 3}, {0.1, -2.0, 30.0});
  Tensor t = from(DType::f64, {1, 3}, {1.0, 0.0, 0.5});
  Tensor w = from(DType::f64, {3}, {1, 2, 3});
  lossfuse::MultilabelSoftMarginOptions o;
  o.weight = w.view;
  Tensor l = Tensor::make(DType::f64, {}), gx = Tensor::make(DType::f64, {1, 3}), gt = Tensor::make(DType::f64, {1, 3});
  lossfuse::multilabel_soft_margin_forward(x.view, t.view, o, l.view);
  lossfuse::multilabel_soft_margin_backward(x.view, t.view, std::nullopt, o, gx.view, gt.view);
  expect_values(l, {15.299417560719931});
  expect_values(gx, {-0.1583402708, 0.0794686147, 0.5}, 1e-10);
  expect_values(gt, {-0.1 / 3, 4.0 / 3, -30.0});
  // x = -+200 with hard targets in float32: loss 200 (no overflow), gradient -+1/2
  Tensor xe = from(DType::f32, {1, 2}, {-200, 200});
  Tensor te = from(DType::f32, {1, 2}, {1, 0});
  Tensor le = Tensor::make(DType::f32, {}), ge = Tensor::make(DType::f32, {1, 2});
  lossfuse::multilabel_soft_margin_forward(xe.view, te.view, {}, le.view);
  lossfuse::multilabel_soft_margin_backward(xe.view, te.view, std::nullopt, {}, ge.view, std::nullopt);
  expect_values(le, {200.0});
  expect_values(ge, {-0.5, 0.5});
}

TEST(MarginTorch, CosineZeroVectorAndTargets) {
  // x1 = 0, x2 = [1,2,3], margin -0.5: y=1 -> 1 with grad_x1 = -x2/sqrt(1e-12 * 14); y=-1 -> 0.5; y=0,2 -> 0
  Tensor x1 = from(DType::f32, {1, 3}, {0, 0, 0});
  Tensor x2 = from(DType::f32, {1, 3}, {1, 2, 3});
  lossfuse::CosineEmbeddingOptions o;
  o.margin = -0.5;
  const double e12 = static_cast<double>(1e-12f), s = 1.0 / std::sqrt(e12 * (14 + e12));
  for (std::int64_t yv : {1, -1, 0, 2}) {
    Tensor y = from_int(DType::i64, {1}, {yv});
    Tensor l = Tensor::make(DType::f32, {}), g1 = Tensor::make(DType::f32, {1, 3}),
           g2 = Tensor::make(DType::f32, {1, 3});
    lossfuse::cosine_embedding_forward(x1.view, x2.view, y.view, o, l.view);
    lossfuse::cosine_embedding_backward(x1.view, x2.view, y.view, std::nullopt, o, g1.view, g2.view);
    const double want = yv == 1 ? 1.0 : yv == -1 ? 0.5 : 0.0;
    const double k = yv == 1 ? -1.0 : yv == -1 ? 1.0 : 0.0;
    expect_values(l, {want}, 1e-6);
    expect_values(g1, {k * s, 2 * k * s, 3 * k * s}, 1.0);  // torch: -267261.25, -534522.5, -801783.75
    expect_values(g2, {0, 0, 0});
  }
  // float64: torch adds the float constant 1e-12f (1e-12 as a double would be 2e-9 off, relative, here)
  {
    Tensor d1 = from(DType::f64, {1, 3}, {0, 0, 0}), d2 = from(DType::f64, {1, 3}, {1, 2, 3});
    Tensor y = from_int(DType::i64, {1}, {1});
    Tensor g1 = Tensor::make(DType::f64, {1, 3});
    lossfuse::cosine_embedding_backward(d1.view, d2.view, y.view, std::nullopt, {}, g1.view, std::nullopt);
    expect_values(g1, {-s, -2 * s, -3 * s}, 1e-9 * s);
  }
  // float16 is computed in float32, so 1e-12 survives: loss 1 (torch gives nan here, see margin.hpp)
  Tensor h1 = from(DType::f16, {1, 3}, {0, 0, 0}), h2 = from(DType::f16, {1, 3}, {1, 2, 3});
  Tensor y = from(DType::f16, {1}, {1});
  Tensor l = Tensor::make(DType::f32, {});
  lossfuse::cosine_embedding_forward(h1.view, h2.view, y.view, {}, l.view);
  expect_values(l, {1.0}, 1e-6);
  // 1-D inputs with a 0-d target give a 0-d 'none' loss
  Tensor a = from(DType::f64, {3}, {1, 0, 0}), b = from(DType::f64, {3}, {1, 0, 0});
  Tensor y0 = from_int(DType::i64, {}, {-1});
  Tensor l0 = Tensor::make(DType::f64, {});
  o.margin = 1.0;
  o.reduction = Reduction::none;
  lossfuse::cosine_embedding_forward(a.view, b.view, y0.view, o, l0.view);
  expect_values(l0, {0.0});  // cos - margin == 0 up to 1e-12: clamped
}

TEST(MarginTorch, TripletSwapTieAndBoundary) {
  // a=0, p=0, n=(1,0), margin 2, eps 0, swap: d_an == d_pn = 1, loss 1, gradient split in halves
  Tensor a = from(DType::f64, {1, 2}, {0, 0}), p = from(DType::f64, {1, 2}, {0, 0}),
         n = from(DType::f64, {1, 2}, {1, 0});
  lossfuse::TripletMarginOptions o;
  o.margin = 2, o.eps = 0, o.swap = true;
  Tensor l = Tensor::make(DType::f64, {});
  Tensor ga = Tensor::make(DType::f64, {1, 2}), gp = Tensor::make(DType::f64, {1, 2}),
         gn = Tensor::make(DType::f64, {1, 2});
  lossfuse::triplet_margin_forward(a.view, p.view, n.view, o, l.view);
  lossfuse::triplet_margin_backward(a.view, p.view, n.view, std::nullopt, o, ga.view, gp.view, gn.view);
  expect_values(l, {1.0});
  expect_values(ga, {0.5, 0});
  expect_values(gp, {0.5, 0});
  expect_values(gn, {-1.0, 0});
  // margin + d_ap - d_an == 0 exactly: loss 0 and no gradient (clamp_min passes only z > 0)
  Tensor p2 = from(DType::f64, {1, 2}, {1, 0}), n2 = from(DType::f64, {1, 2}, {2, 0});
  o.margin = 1, o.swap = false;
  lossfuse::triplet_margin_forward(a.view, p2.view, n2.view, o, l.view);
  lossfuse::triplet_margin_backward(a.view, p2.view, n2.view, std::nullopt, o, ga.view, gp.view, gn.view);
  expect_values(l, {0.0});
  expect_values(ga, {0, 0});
  expect_values(gn, {0, 0});
  // eps is added to the difference: d = ||a - p + eps|| ; 1-D unbatched input, a 0-d loss
  Tensor a1 = from(DType::f64, {2}, {0, 0}), p1 = from(DType::f64, {2}, {0, 0}), n1 = from(DType::f64, {2}, {0, 0});
  o.eps = 0.5, o.margin = 1;
  lossfuse::triplet_margin_forward(a1.view, p1.view, n1.view, o, l.view);
  expect_values(l, {1.0});  // both distances are ||(0.5, 0.5)||
}

// ---- determinism ----------------------------------------------------------------------------------------------

TEST(MarginMisc, DeterministicAcrossThreads) {
  const LossKind kinds[] = {LossKind::triplet_margin, LossKind::cosine_embedding, LossKind::multi_margin,
                            LossKind::multilabel_margin, LossKind::multilabel_soft_margin};
  for (LossKind kind : kinds) {
    SCOPED_TRACE(kind_name(kind));
    Spec s;
    s.kind = kind, s.shape = {3000, 37}, s.red = Reduction::mean, s.weight = true, s.swap = true;
    Problem p = build(s);
    std::vector<std::uint8_t> loss0;
    std::vector<std::vector<std::uint8_t>> grads0;
    for (int threads : {1, 2, 1}) {
      ThreadsGuard g(threads);
      const Outputs out = run_lib(p);
      std::vector<std::vector<std::uint8_t>> grads;
      for (const auto& gr : out.grads)
        if (gr) grads.push_back(gr->storage);
      if (loss0.empty()) {
        loss0 = out.loss.storage, grads0 = grads;
        EXPECT_TRUE(close_one("loss", out.loss.get(0), p.ref.loss, p.ref.loss_tol, DType::f32));
      }
      EXPECT_TRUE(out.loss.storage == loss0) << threads << " threads";
      EXPECT_TRUE(grads == grads0) << threads << " threads";
    }
  }
}

// ---- errors ---------------------------------------------------------------------------------------------------
// Every error leaves every buffer as it was (outputs are pre-filled with the sentinel).

struct ErrCase {
  Spec s;
  std::function<void(Problem&)> edit;  // break the problem (after build)
  std::initializer_list<ErrorCode> codes;
  bool forward = true, backward = true;
  std::optional<Tensor> loss_override, grad_override;
};

std::vector<std::vector<std::uint8_t>> snapshot(const Problem& p, const Tensor& loss,
                                                const std::vector<Tensor>& grads) {
  std::vector<std::vector<std::uint8_t>> s;
  for (const auto& x : p.x) s.push_back(x.storage);
  if (p.target) s.push_back(p.target->storage);
  if (p.weight) s.push_back(p.weight->storage);
  if (p.grad_loss) s.push_back(p.grad_loss->storage);
  s.push_back(loss.storage);
  for (const auto& g : grads) s.push_back(g.storage);
  return s;
}

void expect_error(const Spec& spec, const std::function<void(Problem&, Tensor& loss, std::vector<Tensor>& grads)>& edit,
                  std::initializer_list<ErrorCode> codes, bool fwd = true, bool bwd = true,
                  std::string* msg = nullptr) {
  for (int e = 0; e < 2; ++e) {
    if ((e == 0 && !fwd) || (e == 1 && !bwd)) continue;
    SCOPED_TRACE(e == 0 ? "forward" : "backward");
    Problem p = build(spec);
    Tensor loss = Tensor::make(p.acc(), loss_shape(p), Layout::contiguous, kSentinel);
    std::vector<Tensor> grads;
    for (int k = 0; k < num_grads(spec.kind); ++k)
      grads.push_back(Tensor::make(spec.dt, spec.shape, Layout::contiguous, kSentinel));
    edit(p, loss, grads);
    const auto before = snapshot(p, loss, grads);
    std::optional<TensorView> g[3];
    for (std::size_t k = 0; k < grads.size(); ++k) g[k] = grads[k].view;
    EXPECT_TRUE(throws_error([&] { e == 0 ? call_forward(p, loss.view) : call_backward(p, g); }, codes, msg));
    EXPECT_TRUE(snapshot(p, loss, grads) == before) << "a buffer was modified before the error";
  }
}

Spec err_spec(LossKind kind) {
  Spec s;
  s.kind = kind, s.shape = {4, 5}, s.red = Reduction::mean, s.weight = true;
  return s;
}

using P = Problem;
using Ts = std::vector<Tensor>;

TEST(MarginErrors, ValidFixturesRun) {
  for (LossKind kind : {LossKind::triplet_margin, LossKind::cosine_embedding, LossKind::multi_margin,
                        LossKind::multilabel_margin, LossKind::multilabel_soft_margin}) {
    SCOPED_TRACE(kind_name(kind));
    Problem p = build(err_spec(kind));
    EXPECT_NO_THROW(run_lib(p));
  }
}

// Every gradient output is optional: with none, the backward checks its arguments (a bad target still raises)
// and writes nothing.
TEST(MarginErrors, BackwardWithoutGradients) {
  for (LossKind kind : {LossKind::triplet_margin, LossKind::cosine_embedding, LossKind::multi_margin,
                        LossKind::multilabel_margin, LossKind::multilabel_soft_margin}) {
    SCOPED_TRACE(kind_name(kind));
    Problem p = build(err_spec(kind));
    const std::optional<TensorView> none[3];
    EXPECT_NO_THROW(call_backward(p, none));
    if (kind == LossKind::multi_margin || kind == LossKind::multilabel_margin) {
      p.target->set_int(0, 99);
      EXPECT_TRUE(throws_error([&] { call_backward(p, none); }, {ErrorCode::index_error}));
    }
  }
}

TEST(MarginErrors, CommonChecks) {
  for (LossKind kind : {LossKind::triplet_margin, LossKind::cosine_embedding, LossKind::multi_margin,
                        LossKind::multilabel_margin, LossKind::multilabel_soft_margin}) {
    SCOPED_TRACE(kind_name(kind));
    const Spec s = err_spec(kind);
    expect_error(s, [](P& p, Tensor&, Ts&) { p.s.red = static_cast<Reduction>(7); }, {ErrorCode::invalid_value});
    // loss: wrong shape, dtype; a 'none' loss of the wrong shape
    expect_error(
        s, [](P&, Tensor& l, Ts&) { l = Tensor::make(DType::f32, {4}, Layout::contiguous, kSentinel); },
        {ErrorCode::shape_mismatch}, true, false);
    expect_error(
        s, [](P&, Tensor& l, Ts&) { l = Tensor::make(DType::f64, {}, Layout::contiguous, kSentinel); },
        {ErrorCode::dtype_mismatch}, true, false);
    expect_error(
        s,
        [](P& p, Tensor& l, Ts&) {
          p.s.red = Reduction::none;
          l = Tensor::make(DType::f32, {5}, Layout::contiguous, kSentinel);
        },
        {ErrorCode::shape_mismatch}, true, false);
    expect_error(
        s,
        [](P& p, Tensor& l, Ts&) {  // a 'none' loss that is not contiguous (every other element)
          p.s.red = Reduction::none;
          l = Tensor::make(DType::f32, {8}, Layout::contiguous, kSentinel);
          l.view.shape[0] = 4, l.view.strides[0] = 2;
        },
        {ErrorCode::invalid_value}, true, false);
    // an integer input, a mismatched input dtype
    expect_error(s, [](P& p, Tensor&, Ts&) { p.x[0] = Tensor::make(DType::i32, {4, 5}); }, {ErrorCode::dtype_mismatch});
    // gradient: wrong shape, dtype, overlapping an input; grad_loss wrong shape / dtype
    expect_error(
        s,
        [](P&, Tensor&, Ts& g) {
          g[0] = Tensor::make(DType::f32, {4, 4}, Layout::contiguous, kSentinel);
        },
        {ErrorCode::shape_mismatch}, false, true);
    expect_error(
        s,
        [](P&, Tensor&, Ts& g) {
          g[0] = Tensor::make(DType::f16, {4, 5}, Layout::contiguous, kSentinel);
        },
        {ErrorCode::dtype_mismatch}, false, true);
    expect_error(
        s,
        [](P& p, Tensor&, Ts& g) {
          g[0] = p.x[0];
          g[0].view = p.x[0].view;
        },
        {ErrorCode::bad_pointer}, false, true);
    expect_error(
        s, [](P& p, Tensor&, Ts&) { p.grad_loss = Tensor::make(DType::f32, {4}); }, {ErrorCode::shape_mismatch}, false,
        true);
    expect_error(
        s, [](P& p, Tensor&, Ts&) { p.grad_loss = Tensor::make(DType::f64, {}); }, {ErrorCode::dtype_mismatch}, false,
        true);
    // the loss overlapping an input; a null pointer
    expect_error(
        s, [](P& p, Tensor& l, Ts&) { l.view = TensorView::contiguous(p.x[0].view.data, DType::f32, {}); },
        {ErrorCode::bad_pointer}, true, false);
    expect_error(s, [](P& p, Tensor&, Ts&) { p.x[0].view.data = nullptr; }, {ErrorCode::bad_pointer});
  }
}

TEST(MarginErrors, Triplet) {
  const Spec s = err_spec(LossKind::triplet_margin);
  expect_error(s, [](P& p, Tensor&, Ts&) { p.x[1] = Tensor::make(DType::f32, {4, 6}); }, {ErrorCode::shape_mismatch});
  expect_error(s, [](P& p, Tensor&, Ts&) { p.x[2] = Tensor::make(DType::f32, {5}); }, {ErrorCode::shape_mismatch});
  expect_error(s, [](P& p, Tensor&, Ts&) { p.x[2] = Tensor::make(DType::f64, {4, 5}); }, {ErrorCode::dtype_mismatch});
  expect_error(s, [](P& p, Tensor&, Ts&) { p.s.p = -1; }, {ErrorCode::invalid_value});
  expect_error(s, [](P& p, Tensor&, Ts&) { p.s.p = kNaN; }, {ErrorCode::invalid_value});
  expect_error(s, [](P& p, Tensor&, Ts&) { p.s.margin = kInf; }, {ErrorCode::invalid_value});
  expect_error(s, [](P& p, Tensor&, Ts&) { p.s.eps = kNaN; }, {ErrorCode::invalid_value});
  expect_error(
      s,
      [](P&, Tensor&, Ts& g) {
        g[1] = g[0];
        g[1].view = g[0].view;
      },
      {ErrorCode::bad_pointer}, false, true);
  expect_error(
      s,
      [](P& p, Tensor&, Ts&) {
        p.x[0] = Tensor::make(DType::f32, {});
        p.x[1] = p.x[0];
        p.x[2] = p.x[0];
      },
      {ErrorCode::shape_mismatch}, true, false);
}

TEST(MarginErrors, Cosine) {
  const Spec s = err_spec(LossKind::cosine_embedding);
  expect_error(s, [](P& p, Tensor&, Ts&) { p.target = Tensor::make(DType::i64, {5}); }, {ErrorCode::shape_mismatch});
  expect_error(s, [](P& p, Tensor&, Ts&) { p.target = Tensor::make(DType::f64, {4}); }, {ErrorCode::dtype_mismatch});
  expect_error(
      s,
      [](P& p, Tensor&, Ts&) {
        p.x[0] = Tensor::make(DType::f32, {2, 2, 5});
        p.x[1] = Tensor::make(DType::f32, {2, 2, 5});
      },
      {ErrorCode::shape_mismatch}, true, false);
  expect_error(s, [](P& p, Tensor&, Ts&) { p.x[1] = Tensor::make(DType::f32, {1, 5}); }, {ErrorCode::shape_mismatch});
  expect_error(s, [](P& p, Tensor&, Ts&) { p.s.margin = kNaN; }, {ErrorCode::invalid_value});
}

TEST(MarginErrors, MultiMargin) {
  const Spec s = err_spec(LossKind::multi_margin);
  std::string msg;
  expect_error(
      s, [](P& p, Tensor&, Ts&) { p.target->set_int(2, 5); }, {ErrorCode::index_error}, true, true, &msg);
  EXPECT_TRUE(std::regex_search(msg, std::regex("\\b5\\b"))) << msg;
  EXPECT_TRUE(std::regex_search(msg, std::regex("\\[2\\]"))) << msg;
  expect_error(s, [](P& p, Tensor&, Ts&) { p.target->set_int(0, -1); }, {ErrorCode::index_error});
  expect_error(s, [](P& p, Tensor&, Ts&) { p.s.mp = 3; }, {ErrorCode::invalid_value});
  expect_error(s, [](P& p, Tensor&, Ts&) { p.weight = Tensor::make(DType::f32, {4}); }, {ErrorCode::shape_mismatch});
  expect_error(s, [](P& p, Tensor&, Ts&) { p.target = Tensor::make(DType::f32, {4}); }, {ErrorCode::dtype_mismatch});
  expect_error(s, [](P& p, Tensor&, Ts&) { p.target = Tensor::make(DType::i64, {4, 5}); }, {ErrorCode::shape_mismatch});
  expect_error(
      s,
      [](P& p, Tensor&, Ts&) {
        p.x[0] = Tensor::make(DType::f32, {4, 0});
      },
      {ErrorCode::shape_mismatch}, true, false);
  expect_error(s, [](P& p, Tensor&, Ts&) { p.s.margin = kInf; }, {ErrorCode::invalid_value});
}

TEST(MarginErrors, MultilabelMargin) {
  const Spec s = err_spec(LossKind::multilabel_margin);
  std::string msg;
  // a bad value after the terminating -1 still raises, as in torch
  expect_error(
      s,
      [](P& p, Tensor&, Ts&) {
        for (std::int64_t c = 0; c < 5; ++c) p.target->set_int(1 * 5 + c, c == 0 ? -1 : 0);
        p.target->set_int(1 * 5 + 3, 5);
      },
      {ErrorCode::index_error}, true, true, &msg);
  EXPECT_TRUE(std::regex_search(msg, std::regex("\\b5\\b"))) << msg;
  EXPECT_TRUE(std::regex_search(msg, std::regex("\\[1, 3\\]"))) << msg;
  expect_error(s, [](P& p, Tensor&, Ts&) { p.target->set_int(7, -2); }, {ErrorCode::index_error});
  expect_error(s, [](P& p, Tensor&, Ts&) { p.target = Tensor::make(DType::i64, {4}); }, {ErrorCode::shape_mismatch});
  expect_error(s, [](P& p, Tensor&, Ts&) { p.target = Tensor::make(DType::f32, {4, 5}); }, {ErrorCode::dtype_mismatch});
}

TEST(MarginErrors, SoftMargin) {
  const Spec s = err_spec(LossKind::multilabel_soft_margin);
  expect_error(s, [](P& p, Tensor&, Ts&) { p.target = Tensor::make(DType::f64, {4, 5}); }, {ErrorCode::dtype_mismatch});
  expect_error(s, [](P& p, Tensor&, Ts&) { p.target = Tensor::make(DType::f32, {4, 1}); }, {ErrorCode::shape_mismatch});
  expect_error(s, [](P& p, Tensor&, Ts&) { p.weight = Tensor::make(DType::f32, {5, 1}); }, {ErrorCode::shape_mismatch});
  expect_error(
      s,
      [](P&, Tensor&, Ts& g) {
        g[1] = g[0];
        g[1].view = g[0].view;
      },
      {ErrorCode::bad_pointer}, false, true);
}

TEST(MarginCatalog, ListsEveryMarginLossOnCpu) {  // (and on cuda: tests/core/catalog_test.cpp)
  for (LossKind kind : {LossKind::triplet_margin, LossKind::cosine_embedding, LossKind::multi_margin,
                        LossKind::multilabel_margin, LossKind::multilabel_soft_margin})
    for (DType dt : kFloats) {
      EXPECT_TRUE(lossfuse::is_implemented(kind, dt, lossfuse::Device::cpu, lossfuse::Direction::forward));
      EXPECT_TRUE(lossfuse::is_implemented(kind, dt, lossfuse::Device::cpu, lossfuse::Direction::backward));
      EXPECT_FALSE(lossfuse::is_implemented(kind, dt, lossfuse::Device::cpu, lossfuse::Direction::forward_backward));
    }
}

}  // namespace
}  // namespace lftest::margin
