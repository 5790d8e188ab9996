// Fused linear + cross-entropy against the float64 reference applied to x W^T + b computed in float64:
// loss, lse, z-loss and the gradients of x, W and b, both ways (forward with grads; forward then backward from
// the saved lse with any upstream gradient), for every dtype, reduction and option, chunks that do not divide N.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "lossfuse/gemm.hpp"
#include "lossfuse/linear_cross_entropy.hpp"
#include "test_util.hpp"

namespace lftest {
namespace {

using lossfuse::CrossEntropyOutputs;
using lossfuse::LinearCrossEntropyGrads;
using lossfuse::LinearCrossEntropyOptions;

// Tolerance relative to the largest reference magnitude of an output: 16-bit runs multiply the gradient of the
// logits rounded to 16 bits (as a 16-bit autograd graph would), float32 runs accumulate H-long dot products.
double rel_tol(DType t) {
  switch (t) {
    case DType::f64: return 1e-10;
    case DType::f32: return 2e-5;
    case DType::f16: return 4e-3;
    default: return 2e-2;
  }
}

::testing::AssertionResult close_rel(const std::string& what, const std::vector<double>& got,
                                     const std::vector<double>& want, DType t) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << what << ": size " << got.size();
  double scale = 1e-3;
  for (double v : want) scale = std::max(scale, std::abs(v));
  const double tol = rel_tol(t) * scale;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const bool both_nan = std::isnan(got[i]) && std::isnan(want[i]);
    if (!both_nan && !(std::abs(got[i] - want[i]) <= tol)) {
      return ::testing::AssertionFailure() << what << "[" << i << "]: got " << got[i] << ", want " << want[i]
                                           << " (tol " << tol << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

struct Case {
  DType dt = DType::f32;
  std::int64_t N = 7, H = 5, V = 11;
  Reduction red = Reduction::mean;
  bool bias = true, weight = false;
  double eps = 0, softcap = 0, scale = 1, zls = 0;
  std::int64_t chunk = 0;
  bool all_ignored = false;
};

std::string case_name(const Case& c) {
  return nm(c.dt) + "_" + red_name(c.red) + "_N" + std::to_string(c.N) + "_H" + std::to_string(c.H) + "_V" +
         std::to_string(c.V) + (c.bias ? "_bias" : "") + (c.weight ? "_w" : "") + (c.eps ? "_ls" : "") +
         (c.softcap ? "_cap" : "") + (c.scale != 1 ? "_scale" : "") + (c.zls ? "_z" : "") + "_chunk" +
         std::to_string(c.chunk) + (c.all_ignored ? "_allignored" : "");
}

struct Data {
  Tensor x, w, b, t, cw;
  std::vector<double> xv, wv, bv;
  std::vector<std::int64_t> tv;
};

Data make_data(const Case& c, std::uint64_t seed) {
  Rng rng(seed);
  Data d;
  d.x = Tensor::make(c.dt, {c.N, c.H});
  d.w = Tensor::make(c.dt, {c.V, c.H});
  d.b = Tensor::make(c.dt, {c.V});
  d.t = Tensor::make(DType::i32, {c.N});
  d.cw = Tensor::make(c.dt == DType::f64 ? DType::f64 : DType::f32, {c.V});
  for (std::int64_t i = 0; i < c.N * c.H; ++i) d.x.set(i, rng.uniform(-1, 1));
  for (std::int64_t i = 0; i < c.V * c.H; ++i) d.w.set(i, rng.uniform(-1, 1));
  for (std::int64_t i = 0; i < c.V; ++i) d.b.set(i, rng.uniform(-0.5, 0.5));
  for (std::int64_t i = 0; i < c.V; ++i) d.cw.set(i, rng.uniform(0.2, 2.0));
  for (std::int64_t i = 0; i < c.N; ++i) {
    const bool ignored = c.all_ignored || rng.uniform() < 0.2;
    d.t.set_int(i, ignored ? -100 : static_cast<std::int64_t>(rng.next() % static_cast<std::uint64_t>(c.V)));
  }
  d.xv = d.x.values(), d.wv = d.w.values(), d.bv = d.b.values();
  for (std::int64_t i = 0; i < c.N; ++i) d.tv.push_back(d.t.get_int(i));
  return d;
}

struct Expected {
  lfref::CeResult ce;
  std::vector<double> dx, dw, db;
};

Expected expected(const Case& c, const Data& d, const std::vector<double>& grad_loss) {
  lfref::CeInput in;
  in.rows = c.N, in.C = c.V;
  in.x.assign(static_cast<std::size_t>(c.N * c.V), 0.0);
  for (std::int64_t r = 0; r < c.N; ++r) {
    for (std::int64_t v = 0; v < c.V; ++v) {
      double s = c.bias ? d.bv[v] : 0.0;
      for (std::int64_t h = 0; h < c.H; ++h) s += d.xv[r * c.H + h] * d.wv[v * c.H + h];
      in.x[r * c.V + v] = s;
    }
  }
  in.target = d.tv;
  if (c.weight) in.weight = d.cw.values();
  in.reduction = c.red, in.label_smoothing = c.eps, in.softcap = c.softcap, in.logit_scale = c.scale;
  in.z_loss_scale = c.zls, in.grad_loss = grad_loss;
  Expected e;
  e.ce = lfref::cross_entropy(in);
  e.dx.assign(static_cast<std::size_t>(c.N * c.H), 0.0);
  e.dw.assign(static_cast<std::size_t>(c.V * c.H), 0.0);
  e.db.assign(static_cast<std::size_t>(c.V), 0.0);
  for (std::int64_t r = 0; r < c.N; ++r) {
    for (std::int64_t v = 0; v < c.V; ++v) {
      const double g = e.ce.grad[r * c.V + v];
      e.db[v] += g;
      for (std::int64_t h = 0; h < c.H; ++h) {
        e.dx[r * c.H + h] += g * d.wv[v * c.H + h];
        e.dw[v * c.H + h] += g * d.xv[r * c.H + h];
      }
    }
  }
  return e;
}

LinearCrossEntropyOptions options(const Case& c, const Data& d) {
  LinearCrossEntropyOptions o;
  o.ce.reduction = c.red;
  o.ce.label_smoothing = c.eps, o.ce.softcap = c.softcap, o.ce.logit_scale = c.scale, o.ce.z_loss_scale = c.zls;
  if (c.weight) o.ce.weight = d.cw.view;
  o.chunk_rows = c.chunk;
  return o;
}

DType acc_of(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

void run_case(const Case& c, bool fused) {
  SCOPED_TRACE(case_name(c) + (fused ? " forward-with-grads" : " forward+backward"));
  const Data d = make_data(c, 1234 + static_cast<std::uint64_t>(c.N * 31 + c.V));
  const DType acc = acc_of(c.dt);
  const std::vector<std::int64_t> loss_shape =
      c.red == Reduction::none ? std::vector<std::int64_t>{c.N} : std::vector<std::int64_t>{};
  Tensor loss = Tensor::make(acc, loss_shape), lse = Tensor::make(acc, {c.N}), zl = Tensor::make(acc, loss_shape);
  Tensor gx = Tensor::make(c.dt, {c.N, c.H}, Layout::padded), gw = Tensor::make(c.dt, {c.V, c.H});
  Tensor gb = Tensor::make(acc, {c.V});  // float32 bias gradient: accepted for any input dtype
  const LinearCrossEntropyOptions o = options(c, d);
  const std::optional<TensorView> b = c.bias ? std::optional<TensorView>(d.b.view) : std::nullopt;
  LinearCrossEntropyGrads g{gx.view, gw.view, c.bias ? std::optional<TensorView>(gb.view) : std::nullopt};
  std::vector<double> grad_loss;
  Tensor gl;
  if (fused) {
    lossfuse::linear_cross_entropy_forward(d.x.view, d.w.view, b, d.t.view, o,
                                           CrossEntropyOutputs{loss.view, lse.view, zl.view}, g);
  } else {
    lossfuse::linear_cross_entropy_forward(d.x.view, d.w.view, b, d.t.view, o,
                                           CrossEntropyOutputs{loss.view, lse.view, zl.view});
    Rng rng(99);
    gl = Tensor::make(acc, loss_shape);
    for (std::int64_t i = 0; i < gl.numel(); ++i) {
      grad_loss.push_back(rng.uniform(-2, 2));
      gl.set(i, grad_loss.back());
    }
    lossfuse::linear_cross_entropy_backward(d.x.view, d.w.view, b, d.t.view, lse.view, gl.view, o, g);
  }
  const Expected e = expected(c, d, grad_loss);
  // Logits are made from the rounded inputs in float32 (float64): the loss is as accurate as cross-entropy's.
  const DType loss_t = c.dt == DType::f64 ? DType::f64 : DType::f32;
  if (c.red == Reduction::none) {
    EXPECT_TRUE(close_rel("loss", loss.values(), e.ce.row_loss, loss_t));
    EXPECT_TRUE(close_rel("z_loss", zl.values(), e.ce.row_z, loss_t));
  } else {
    EXPECT_TRUE(close_rel("loss", loss.values(), {e.ce.loss}, loss_t));
    EXPECT_TRUE(close_rel("z_loss", zl.values(), {e.ce.z}, loss_t));
  }
  EXPECT_TRUE(close_rel("lse", lse.values(), e.ce.lse, loss_t));
  EXPECT_TRUE(close_rel("grad_x", gx.values(), e.dx, c.dt));
  EXPECT_TRUE(close_rel("grad_weight", gw.values(), e.dw, c.dt));
  if (c.bias) EXPECT_TRUE(close_rel("grad_bias", gb.values(), e.db, c.dt));
  EXPECT_TRUE(gx.outside_untouched(0));
}

std::vector<Case> cases() {
  std::vector<Case> v;
  for (DType t : kFloats) {
    for (Reduction r : kReds) {
      for (std::int64_t chunk : {0, 1, 3}) {
        Case c;
        c.dt = t, c.red = r, c.chunk = chunk;
        v.push_back(c);
        c.weight = true, c.eps = 0.1, c.bias = false;
        v.push_back(c);
        c.softcap = 4.0, c.scale = 0.7, c.zls = 0.01, c.bias = true;
        v.push_back(c);
      }
      Case big;
      big.dt = t, big.red = r, big.N = 37, big.H = 24, big.V = 301, big.weight = true, big.eps = 0.05;
      big.chunk = 5;
      v.push_back(big);
      Case ign = big;
      ign.all_ignored = true, ign.N = 6, ign.chunk = 4;
      v.push_back(ign);
    }
  }
  return v;
}

class LinearCe : public ::testing::TestWithParam<Case> {};

TEST_P(LinearCe, ForwardWithGradsMatchesReference) { run_case(GetParam(), true); }
TEST_P(LinearCe, BackwardFromLseMatchesReference) { run_case(GetParam(), false); }

INSTANTIATE_TEST_SUITE_P(All, LinearCe, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return case_name(info.param); });

TEST(LinearCeEdge, EmptyBatchGivesNanMeanAndZeroGradients) {
  Case c;
  c.N = 0;
  const Data d = make_data(c, 5);
  Tensor loss = Tensor::make(DType::f32, {}), gw = Tensor::make(DType::f32, {c.V, c.H}, Layout::contiguous, kSentinel);
  Tensor gb = Tensor::make(DType::f32, {c.V}, Layout::contiguous, kSentinel);
  lossfuse::linear_cross_entropy_forward(d.x.view, d.w.view, d.b.view, d.t.view, options(c, d),
                                         CrossEntropyOutputs{loss.view, std::nullopt, std::nullopt},
                                         LinearCrossEntropyGrads{std::nullopt, gw.view, gb.view});
  EXPECT_TRUE(std::isnan(loss.get(0)));
  for (double v : gw.values()) EXPECT_EQ(v, 0.0);
  for (double v : gb.values()) EXPECT_EQ(v, 0.0);
}

// Bad input: an error naming the argument, and no output byte written.
struct BadCase {
  std::string name;
  std::function<void(Data&, std::optional<TensorView>&, LinearCrossEntropyOptions&)> spoil;
  ErrorCode code;
  std::string argument;
};

TEST(LinearCeErrors, NothingWrittenAndArgumentNamed) {
  const Case c;
  const std::vector<BadCase> bad = {
      {"target out of range", [](Data& d, auto&, auto&) { d.t.set_int(3, 11); }, ErrorCode::index_error, "target"},
      {"H mismatch", [](Data& d, auto&, auto&) { d.w = Tensor::make(DType::f32, {11, 4}); }, ErrorCode::shape_mismatch,
       "weight"},
      {"dtype mix", [](Data& d, auto&, auto&) { d.w = Tensor::make(DType::bf16, {11, 5}); }, ErrorCode::dtype_mismatch,
       "weight"},
      {"bias shape", [](Data&, auto& b, auto&) { static Tensor t = Tensor::make(DType::f32, {10}); b = t.view; },
       ErrorCode::shape_mismatch, "bias"},
      {"float target", [](Data& d, auto&, auto&) { d.t = Tensor::make(DType::f32, {7}); }, ErrorCode::dtype_mismatch,
       "target"},
      {"label smoothing", [](Data&, auto&, auto& o) { o.ce.label_smoothing = 2; }, ErrorCode::invalid_value,
       "label_smoothing"},
      {"class weight shape", [](Data&, auto&, auto& o) { static Tensor t = Tensor::make(DType::f32, {3}); o.ce.weight = t.view; },
       ErrorCode::shape_mismatch, "weight"},
  };
  for (const BadCase& bc : bad) {
    SCOPED_TRACE(bc.name);
    Data d = make_data(c, 7);
    std::optional<TensorView> b = d.b.view;
    LinearCrossEntropyOptions o = options(c, d);
    bc.spoil(d, b, o);
    Tensor loss = Tensor::make(DType::f32, {}, Layout::contiguous, kSentinel);
    Tensor lse = Tensor::make(DType::f32, {7}, Layout::contiguous, kSentinel);
    Tensor gx = Tensor::make(DType::f32, {7, 5}, Layout::contiguous, kSentinel);
    Tensor gw = Tensor::make(DType::f32, {11, 5}, Layout::contiguous, kSentinel);
    try {
      lossfuse::linear_cross_entropy_forward(d.x.view, d.w.view, b, d.t.view, o,
                                             CrossEntropyOutputs{loss.view, lse.view, std::nullopt},
                                             LinearCrossEntropyGrads{gx.view, gw.view, std::nullopt});
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), bc.code) << e.what();
      EXPECT_EQ(e.argument(), bc.argument) << e.what();
    }
    for (const Tensor* t : {&loss, &lse, &gx, &gw}) {
      EXPECT_TRUE(t->outside_untouched(kSentinel) &&
                  std::all_of(t->storage.begin(), t->storage.end(), [](std::uint8_t v) { return v == kSentinel; }));
    }
  }
}

// The GEMM hook: every product goes through it, and a hook that declines gives not_implemented.
int g_calls = 0;
bool counting_hook(const lossfuse::GemmCall& call, void*) {
  ++g_calls;
  return lossfuse::builtin_gemm(call);
}
bool declining_hook(const lossfuse::GemmCall&, void*) { return false; }

TEST(LinearCeHook, HookRunsEveryProductOrDeclines) {
  Case c;
  c.chunk = 3;  // 3 chunks of 7 rows: logits, dx and dW per chunk
  const Data d = make_data(c, 11);
  Tensor loss = Tensor::make(DType::f32, {}), gx = Tensor::make(DType::f32, {7, 5}), gw = Tensor::make(DType::f32, {11, 5});
  lossfuse::set_gemm_hook(&counting_hook);
  g_calls = 0;
  lossfuse::linear_cross_entropy_forward(d.x.view, d.w.view, d.b.view, d.t.view, options(c, d),
                                         CrossEntropyOutputs{loss.view, std::nullopt, std::nullopt},
                                         LinearCrossEntropyGrads{gx.view, gw.view, std::nullopt});
  EXPECT_EQ(g_calls, 9);
  lossfuse::set_gemm_hook(&declining_hook);
  EXPECT_THROW(lossfuse::linear_cross_entropy_forward(d.x.view, d.w.view, d.b.view, d.t.view, options(c, d),
                                                      CrossEntropyOutputs{loss.view, std::nullopt, std::nullopt}),
               Error);
  lossfuse::set_gemm_hook(nullptr);
}

}  // namespace
}  // namespace lftest
