// Fused linear + cross-entropy against the float64 reference applied to x W^T + b computed in float64:
// loss, lse, z-loss and the gradients of x, W and b, both ways (forward with grads; forward then backward from
// the saved lse with any upstream gradient), for every dtype, reduction and option, chunks that do not divide N,
// whole vocabulary rows or vocabulary tiles that do not divide V; the gradient filter's documented error bound.
#include "lossfuse/linear_cross_entropy.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/lce_harness.hpp"
#include "lossfuse/gemm.hpp"
#include "test_util.hpp"

namespace lftest {
namespace {

using namespace lce;

class LinearCe : public ::testing::TestWithParam<Case> {};

TEST_P(LinearCe, ForwardWithGradsMatchesReference) { run_case(GetParam(), true); }
TEST_P(LinearCe, BackwardFromLseMatchesReference) { run_case(GetParam(), false); }

INSTANTIATE_TEST_SUITE_P(All, LinearCe, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return case_name(info.param); });

// linear_cross_entropy_scale_held after the fused forward gives the reference gradients of the upstream value.
class LinearCeHeld : public ::testing::TestWithParam<Case> {};
TEST_P(LinearCeHeld, ScaledHeldMatchesReference) {
  for (double g : {-0.75, 2.5}) check_held(GetParam(), g);
}
INSTANTIATE_TEST_SUITE_P(Reduced, LinearCeHeld, ::testing::ValuesIn(reduced_cases()),
                         [](const auto& info) { return case_name(info.param); });

// What torch's gradients keep whatever the upstream value: grad_x's ignored rows, and every gradient when every row
// is ignored; an upstream value of 1 writes nothing. A NaN upstream value reaches every other element.
TEST(LinearCeHeldEdge, IgnoredRowsKeepTheirValues) {
  for (bool all : {false, true}) {
    Case c;
    c.all_ignored = all;
    Data d = case_data(c);
    if (!all) d.t.set_int(2, -100), d.t.set_int(0, 3);
    const Outputs held = run_held(c, d, 1.0);
    const Outputs nan = run_held(c, d, std::nan(""));
    EXPECT_TRUE(held.gx.storage == run_lce(c, d, true).gx.storage) << "an upstream value of 1 changed grad_x";
    for (std::int64_t r = 0; r < c.N; ++r) {
      for (std::int64_t h = 0; h < c.H; ++h) {
        const double v = nan.gx.get(r * c.H + h);
        if (d.t.get_int(r) == -100) {
          EXPECT_EQ(v, held.gx.get(r * c.H + h)) << "row " << r;
        } else {
          EXPECT_TRUE(std::isnan(v)) << "row " << r;
        }
      }
    }
    for (const auto& [got, kept] : {std::pair{&nan.gw, &held.gw}, std::pair{&nan.gb, &held.gb}}) {
      for (std::int64_t i = 0; i < got->numel(); ++i) {
        if (all) {
          EXPECT_EQ(got->get(i), kept->get(i)) << i;
        } else {
          EXPECT_TRUE(std::isnan(got->get(i))) << i;
        }
      }
    }
  }
}

TEST(LinearCeHeldEdge, BadArgumentsNamedAndNothingWritten) {
  Case c;
  Data d = case_data(c);
  Tensor gx = Tensor::make(DType::f32, {c.N, c.H}, Layout::contiguous, kSentinel);
  Tensor gw = Tensor::make(DType::f32, {c.V, c.H}, Layout::contiguous, kSentinel);
  Tensor gw64 = Tensor::make(DType::f64, {c.V, c.H});
  Tensor gx_short = Tensor::make(DType::f32, {c.N - 1, c.H});
  Tensor up = Tensor::make(DType::f32, {}), up2 = Tensor::make(DType::f32, {2}), up16 = Tensor::make(DType::bf16, {});
  up.set(0, 2.0), up2.set(0, 2.0), up16.set(0, 2.0);
  const auto before_x = gx.storage, before_w = gw.storage;
  struct Bad {
    const char* arg;
    ErrorCode code;
    std::optional<TensorView> x, w;
    TensorView up;
    Reduction red;
  };
  const Bad bad[] = {{"reduction", ErrorCode::invalid_value, gx.view, gw.view, up.view, Reduction::none},
                     {"grad_loss", ErrorCode::shape_mismatch, gx.view, gw.view, up2.view, Reduction::mean},
                     {"grad_loss", ErrorCode::dtype_mismatch, gx.view, gw.view, up16.view, Reduction::sum},
                     {"grad_x", ErrorCode::shape_mismatch, gx_short.view, gw.view, up.view, Reduction::mean},
                     {"grad_weight", ErrorCode::dtype_mismatch, gx.view, gw64.view, up.view, Reduction::mean},
                     {"target", ErrorCode::dtype_mismatch, gx.view, gw.view, up.view, Reduction::mean}};
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.arg);
    LinearCrossEntropyOptions o = options(c, d);
    o.ce.reduction = b.red;
    const TensorView target = std::string(b.arg) == "target" ? d.cw.view : d.t.view;
    try {
      lossfuse::linear_cross_entropy_scale_held({b.x, b.w, std::nullopt}, target, o, b.up);
      ADD_FAILURE() << "no error";
    } catch (const lossfuse::Error& e) {
      EXPECT_EQ(e.code(), b.code) << e.what();
      EXPECT_EQ(e.argument(), b.arg) << e.what();
    }
    EXPECT_TRUE(gx.storage == before_x && gw.storage == before_w) << "written despite the error";
  }
}

TEST(LinearCeEdge, EmptyBatchGivesNanMeanAndZeroGradients) {
  for (std::int64_t tile : {0, 4}) {
    SCOPED_TRACE("vocab_tile " + std::to_string(tile));
    Case c;
    c.N = 0, c.tile = tile;
    const Data d = make_data(c, 5);
    Tensor loss = Tensor::make(DType::f32, {});
    Tensor gw = Tensor::make(DType::f32, {c.V, c.H}, Layout::contiguous, kSentinel);
    Tensor gb = Tensor::make(DType::f32, {c.V}, Layout::contiguous, kSentinel);
    lossfuse::linear_cross_entropy_forward(d.x.view, d.w.view, d.b.view, d.t.view, options(c, d),
                                           CrossEntropyOutputs{loss.view, std::nullopt, std::nullopt},
                                           LinearCrossEntropyGrads{std::nullopt, gw.view, gb.view});
    EXPECT_TRUE(std::isnan(loss.get(0)));
    for (double v : gw.values()) EXPECT_EQ(v, 0.0);
    for (double v : gb.values()) EXPECT_EQ(v, 0.0);
  }
}

// A NaN logit makes its row's lse and loss NaN (0 when ignored) and its gradient NaN (also when ignored), the
// other rows' results unchanged: tiles agree with whole rows, both ways.
TEST(LinearCeEdge, NonFiniteRowsAgreeTiledAndWhole) {
  Case c;
  c.red = Reduction::none, c.chunk = 3, c.eps = 0.1;
  Data d = make_data(c, 21);
  d.x.set(2 * c.H + 1, std::nan(""));  // row 2: NaN logits
  d.x.set(5 * c.H, std::nan(""));      // row 5: NaN logits, ignored
  d.t.set_int(2, 3);
  d.t.set_int(5, -100);
  for (bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "forward-with-grads" : "forward+backward");
    Case tiled = c;
    tiled.tile = 4;
    const Outputs whole = run_lce(c, d, fused), tiles = run_lce(tiled, d, fused);
    EXPECT_TRUE(std::isnan(tiles.loss.get(2)) && tiles.loss.get(5) == 0.0 && std::isnan(tiles.lse.get(5)));
    EXPECT_TRUE(std::isnan(tiles.gx.get(2 * c.H)) && std::isnan(tiles.gx.get(5 * c.H)));
    EXPECT_TRUE(close_rel("loss", tiles.loss.values(), whole.loss.values(), DType::f32));
    EXPECT_TRUE(close_rel("lse", tiles.lse.values(), whole.lse.values(), DType::f32));
    EXPECT_TRUE(close_rel("grad_x", tiles.gx.values(), whole.gx.values(), DType::f32));
    EXPECT_TRUE(close_rel("grad_weight", tiles.gw.values(), whole.gw.values(), DType::f32));
    EXPECT_TRUE(close_rel("grad_bias", tiles.gb.values(), whole.gb.values(), DType::f32));
  }
}

// A float32 dW gradient with a non-unit inner stride needs an accumulator: tiled, the backward then runs tile-major
// (dW one tile at a time, dx accumulated across tiles straight into a float32 output). Both ways, chunks and tiles
// that do not divide N and V, against the float64 reference.
TEST(LinearCeEdge, TileMajorBackwardWithStridedWeightGrad) {
  for (bool fused : {true, false}) {
    for (DType t : {DType::f32, DType::bf16}) {
      Case c;
      c.dt = t, c.N = 10, c.V = 13, c.chunk = 3, c.tile = 4, c.weight = true, c.eps = 0.1;
      SCOPED_TRACE(case_name(c) + (fused ? " forward-with-grads" : " forward+backward"));
      const Data d = case_data(c);
      const DType acc = acc_of(t);
      const std::vector<std::int64_t> none{};
      Tensor loss = Tensor::make(acc, none), lse = Tensor::make(acc, {c.N});
      Tensor gx = Tensor::make(t, {c.N, c.H}), gw = Tensor::make(t, {c.V, c.H}, Layout::transposed);
      Tensor gb = Tensor::make(acc, {c.V});
      const LinearCrossEntropyOptions o = options(c, d);
      const LinearCrossEntropyGrads g{gx.view, gw.view, gb.view};
      const CrossEntropyOutputs out{loss.view, lse.view, std::nullopt};
      std::vector<double> grad_loss;
      if (fused) {
        lossfuse::linear_cross_entropy_forward(d.x.view, d.w.view, d.b.view, d.t.view, o, out, g);
      } else {
        lossfuse::linear_cross_entropy_forward(d.x.view, d.w.view, d.b.view, d.t.view, o, out);
        Tensor gl = Tensor::make(acc, none);
        gl.set(0, -0.75);
        grad_loss.push_back(-0.75);
        lossfuse::linear_cross_entropy_backward(d.x.view, d.w.view, d.b.view, d.t.view, lse.view, gl.view, o, g);
      }
      const Expected e = expected(c, d, grad_loss);
      EXPECT_TRUE(close_rel("loss", loss.values(), {e.ce.loss}, DType::f32));
      EXPECT_TRUE(close_rel("grad_x", gx.values(), e.dx, t));
      EXPECT_TRUE(close_rel("grad_weight", gw.values(), e.dw, t));
      EXPECT_TRUE(close_rel("grad_bias", gb.values(), e.db, t));
    }
  }
}

// Logits with a large common offset O (float32 at O = +-2^20: ulp 0.125): lse rounded to float32 would carry up to
// 0.06 into every probability's exponent. Each row's lse is kept in double within a call and split back for the
// gradient, and a way-2 backward given the float64 lse the forward wrote does the same: the gradients made from an
// lse (way 2 untiled and tiled, and the tiled way 1) keep the precision of the logits' differences. x is the
// identity and W the logits' transpose, so x W^T is the logits exactly and dW = G^T is the logits' gradient G.
// Reduction none with an upstream gradient per row (way 2), or sum (way 1); tiled, dW also as a strided (transposed)
// view, which takes the tile-major backward with a dW accumulator. Reference: long double, offset-free.
TEST(LinearCeEdge, LargeCommonOffsetKeepsGradientPrecision) {
  const std::int64_t N = 4, V = 300;
  const double u = 0x1p-24, step = 0.125;
  for (const double offset : {1048576.0, -1048576.0}) {
    Rng rng(17);
    Tensor x = Tensor::make(DType::f32, {N, N});
    Tensor w = Tensor::make(DType::f32, {V, N});
    Tensor t = Tensor::make(DType::i64, {N});
    std::vector<long double> v(static_cast<std::size_t>(N * V));
    for (std::int64_t i = 0; i < N; ++i) {
      x.set(i * N + i, 1.0);
      const std::int64_t y = static_cast<std::int64_t>(rng.uniform(0.0, V - 1.0));
      t.set_int(i, y);
      for (std::int64_t c = 0; c < V; ++c) {
        const double k = i == N - 1 ? (c == y ? 0.0 : -80.0) : std::round(rng.uniform(-24.0, 24.0));
        v[i * V + c] = static_cast<long double>(k * step);
        w.set(c * N + i, offset + k * step);  // W[c, i] = logit (i, c)
      }
    }
    const std::vector<double> upstream = {0.5, 1.0, 2.0, 0.25};
    for (const std::int64_t tile : {std::int64_t{0}, std::int64_t{64}}) {
      for (const int mode : {0, 1, 2}) {  // forward+backward, forward-with-grads, forward+backward into strided dW
        const bool fused = mode == 1;
        if (tile == 0 && mode != 0) continue;  // untiled way 1: the fused cross-entropy kernel, tested with it
        SCOPED_TRACE("offset " + std::to_string(offset) + " tile " + std::to_string(tile) +
                     (fused ? " forward-with-grads" : " forward+backward") + (mode == 2 ? " strided dW" : ""));
        LinearCrossEntropyOptions o;
        o.vocab_tile = tile;
        o.chunk_rows = 3;
        o.ce.reduction = fused ? Reduction::sum : Reduction::none;
        Tensor loss = Tensor::make(DType::f32, fused ? std::vector<std::int64_t>{} : std::vector<std::int64_t>{N});
        Tensor lse = Tensor::make(DType::f64, {N});
        Tensor gw = Tensor::make(DType::f32, {V, N}, mode == 2 ? Layout::transposed : Layout::contiguous);
        const LinearCrossEntropyGrads g{std::nullopt, gw.view, std::nullopt};
        const CrossEntropyOutputs out{loss.view, lse.view, std::nullopt};
        if (fused) {
          lossfuse::linear_cross_entropy_forward(x.view, w.view, std::nullopt, t.view, o, out, g);
        } else {
          lossfuse::linear_cross_entropy_forward(x.view, w.view, std::nullopt, t.view, o, out);
          Tensor gl = Tensor::make(DType::f32, {N});
          for (std::int64_t i = 0; i < N; ++i) gl.set(i, upstream[i]);
          lossfuse::linear_cross_entropy_backward(x.view, w.view, std::nullopt, t.view, lse.view, gl.view, o, g);
        }
        for (std::int64_t i = 0; i < N; ++i) {
          const long double go = fused ? 1.0L : static_cast<long double>(upstream[i]);
          long double m = -1e300L, sum = 0;
          for (std::int64_t c = 0; c < V; ++c) m = std::max(m, v[i * V + c]);
          for (std::int64_t c = 0; c < V; ++c) sum += std::exp(v[i * V + c] - m);
          const long double l = m + std::log(sum);
          EXPECT_NEAR(lse.get(i), offset + static_cast<double>(l), 1e-9 * std::abs(offset)) << "lse of row " << i;
          for (std::int64_t c = 0; c < V; ++c) {
            const long double q = std::exp(v[i * V + c] - l);
            const bool at_y = c == t.get_int(i);
            const long double want = go * (q - (at_y ? 1 : 0));
            EXPECT_NEAR(gw.get(c * N + i), static_cast<double>(want),
                        32 * u * static_cast<double>(go * (q + (at_y ? 1 : 0) + 0.01L)))
                << "gradient of row " << i << " class " << c;
            if (HasFailure()) return;
          }
        }
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------------------
// The gradient filter (tiled backward).

// A GEMM hook counting the calls (the built-in GEMM does them), and one declining every call.
int g_calls = 0;
bool counting_hook(const lossfuse::GemmCall& call, void*) {
  ++g_calls;
  return lossfuse::builtin_gemm(call);
}
bool declining_hook(const lossfuse::GemmCall&, void*) { return false; }

bool same_bits(const Tensor& a, const Tensor& b) { return a.storage == b.storage; }

// The filter compares a tile's largest probability with the threshold from the whole lse: two tied logits at a
// large common offset (q = 1/2 each, tiles of one class, threshold 0.49) keep both tiles. Tested against the lse
// rounded to float32 alone (at 2^20, 2^20 + log 2 rounds to 2^20 + 0.75 and exp(-0.75) = 0.47), both were dropped
// and the gradient was (-1, 0). float32 and bfloat16 operands (the latter tile-major, with a dW accumulator), both
// ways; x = 1 and W = the logits, so dW is the logits' gradient.
TEST(LinearCeFilter, LargeCommonOffsetKeepsTilesAtTheThreshold) {
  for (DType dt : {DType::f32, DType::bf16}) {
    for (const double offset : {1048576.0, -2097152.0}) {
      for (const bool fused : {true, false}) {
        SCOPED_TRACE(nm(dt) + " offset " + std::to_string(offset) + (fused ? " forward-with-grads" : " backward"));
        Tensor x = Tensor::make(dt, {1, 1}), w = Tensor::make(dt, {2, 1}), t = Tensor::make(DType::i64, {1});
        x.set(0, 1.0), w.set(0, offset), w.set(1, offset), t.set_int(0, 0);
        LinearCrossEntropyOptions o;
        o.vocab_tile = 1, o.grad_filter = 0.49, o.ce.reduction = Reduction::sum;
        Tensor loss = Tensor::make(DType::f32, {}), lse = Tensor::make(DType::f32, {1});
        Tensor gw = Tensor::make(dt, {2, 1});
        const LinearCrossEntropyGrads g{std::nullopt, gw.view, std::nullopt};
        const CrossEntropyOutputs out{loss.view, lse.view, std::nullopt};
        if (fused) {
          lossfuse::linear_cross_entropy_forward(x.view, w.view, std::nullopt, t.view, o, out, g);
        } else {
          Tensor lse64 = Tensor::make(DType::f64, {1});
          lossfuse::linear_cross_entropy_forward(x.view, w.view, std::nullopt, t.view, o,
                                                 CrossEntropyOutputs{loss.view, lse64.view, std::nullopt});
          lossfuse::linear_cross_entropy_backward(x.view, w.view, std::nullopt, t.view, lse64.view, std::nullopt, o, g);
        }
        EXPECT_NEAR(gw.get(0), -0.5, 1e-6);
        EXPECT_NEAR(gw.get(1), 0.5, 1e-6);
      }
    }
  }
}

// A threshold below every tile's largest probability drops nothing: bit for bit the unfiltered result.
TEST(LinearCeFilter, ThresholdThatDropsNothingEqualsUnfilteredExactly) {
  for (DType t : {DType::f32, DType::f64, DType::bf16}) {
    for (bool fused : {true, false}) {
      Case c;
      c.dt = t, c.tile = 4, c.chunk = 3, c.weight = true, c.eps = 0.1, c.zls = 0.01;
      SCOPED_TRACE(case_name(c) + (fused ? " forward-with-grads" : " forward+backward"));
      Data d = case_data(c);
      const Outputs off = run_lce(c, d, fused);
      c.filter = 1e-30;
      const Outputs tiny = run_lce(c, d, fused);
      EXPECT_TRUE(same_bits(off.loss, tiny.loss) && same_bits(off.lse, tiny.lse));
      EXPECT_TRUE(same_bits(off.gx, tiny.gx));
      EXPECT_TRUE(same_bits(off.gw, tiny.gw));
      EXPECT_TRUE(same_bits(off.gb, tiny.gb));
    }
  }
}

// The bound of linear_cross_entropy.hpp: with s = |logit_scale|, a_r = |g_r A_r| and D_r the classes of row r's
// dropped tiles, |delta dx_rh| <= s a_r min(1, D_r tau) max_c |W_ch|, |delta dW_ch| <= s tau sum_r a_r |x_rh|,
// |delta db_c| <= s tau sum_r a_r and sum_c |delta db_c| <= s sum_r a_r min(1, D_r tau). D_r is counted from the
// float64 reference (a tile whose largest probability lies within 1e-9 of tau counts as dropped: a larger D_r only
// loosens the bound). The loss and lse are unchanged.
struct FilterCase {
  DType dt;
  Reduction red;
  double eps, softcap, scale, zls;
  bool weight;
};

class LinearCeFilterBound : public ::testing::TestWithParam<FilterCase> {};

TEST_P(LinearCeFilterBound, ErrorWithinDocumentedBound) {
  const FilterCase fc = GetParam();
  Case c;
  c.dt = fc.dt, c.red = fc.red, c.N = 23, c.H = 8, c.V = 97, c.tile = 8, c.chunk = 5;
  c.eps = fc.eps, c.softcap = fc.softcap, c.scale = fc.scale, c.zls = fc.zls, c.weight = fc.weight;
  Data d = case_data(c);
  const Outputs off = run_lce(c, d, false);
  const Expected e = expected(c, d, off.grad_loss);
  // Per row: a_r and the softmax q_rc of the reference.
  const std::vector<double> cw = d.cw.values();
  double sum_w = 0;
  for (std::int64_t v = 0; v < c.V; ++v) sum_w += c.weight ? cw[v] : 1.0;
  std::vector<double> a(static_cast<std::size_t>(c.N), 0.0), q(static_cast<std::size_t>(c.N * c.V));
  for (std::int64_t r = 0; r < c.N; ++r) {
    for (std::int64_t v = 0; v < c.V; ++v) {
      double z = c.scale * e.logits[r * c.V + v];
      if (c.softcap > 0) z = c.softcap * std::tanh(z / c.softcap);
      q[r * c.V + v] = std::exp(z - e.ce.lse[r]);
    }
    const std::int64_t y = d.tv[r];
    if (y == -100) continue;
    const double g =
        c.red == Reduction::none ? off.grad_loss[r] : off.grad_loss[0] / (c.red == Reduction::mean ? e.ce.denom : 1.0);
    const double w_y = c.weight ? cw[y] : 1.0;
    a[r] = std::abs(g * ((1 - c.eps) * w_y + c.eps / static_cast<double>(c.V) * sum_w + 2 * c.zls * e.ce.lse[r]));
  }
  const double s = std::abs(c.scale);
  const std::vector<double> x = d.xv, w = d.wv;
  const double slack_rel = c.dt == DType::f64 ? 1e-12 : rel_tol(c.dt);
  bool dropped_any = false;
  for (double tau : {1e-3, 1e-2, 0.1, 1.0}) {
    SCOPED_TRACE(case_name(c) + " tau " + std::to_string(tau));
    Case fcase = c;
    fcase.filter = tau;
    const Outputs on = run_lce(fcase, d, false);
    EXPECT_TRUE(same_bits(off.loss, on.loss) && same_bits(off.lse, on.lse));
    std::vector<double> D(static_cast<std::size_t>(c.N), 0.0);
    for (std::int64_t r = 0; r < c.N; ++r) {
      for (std::int64_t v0 = 0; v0 < c.V; v0 += c.tile) {
        const std::int64_t v1 = std::min(c.V, v0 + c.tile);
        double mq = 0;
        for (std::int64_t v = v0; v < v1; ++v) mq = std::max(mq, q[r * c.V + v]);
        if (mq < tau * (1 + 1e-9)) D[r] += static_cast<double>(v1 - v0);
      }
    }
    auto check = [&](const char* what, const std::vector<double>& got, const std::vector<double>& ref,
                     const std::function<double(std::int64_t)>& bound) {
      double mag = 1e-3;
      for (double v : ref) mag = std::max(mag, std::abs(v));
      for (std::size_t i = 0; i < got.size(); ++i) {
        const double err = std::abs(got[i] - ref[i]);
        if (err > 0) dropped_any = true;
        EXPECT_LE(err, bound(static_cast<std::int64_t>(i)) + slack_rel * mag) << what << "[" << i << "]";
      }
    };
    const std::vector<double> dx_off = off.gx.values(), dw_off = off.gw.values(), db_off = off.gb.values();
    check("grad_x", on.gx.values(), dx_off, [&](std::int64_t i) {
      const std::int64_t r = i / c.H, h = i % c.H;
      double wmax = 0;
      for (std::int64_t v = 0; v < c.V; ++v) wmax = std::max(wmax, std::abs(w[v * c.H + h]));
      return s * a[r] * std::min(1.0, D[r] * tau) * wmax;
    });
    check("grad_weight", on.gw.values(), dw_off, [&](std::int64_t i) {
      const std::int64_t h = i % c.H;
      double t = 0;
      for (std::int64_t r = 0; r < c.N; ++r) t += a[r] * std::abs(x[r * c.H + h]);
      return s * tau * t;
    });
    double sum_a = 0, sum_a_min = 0;
    for (std::int64_t r = 0; r < c.N; ++r) sum_a += a[r], sum_a_min += a[r] * std::min(1.0, D[r] * tau);
    const std::vector<double> db_on = on.gb.values();
    check("grad_bias", db_on, db_off, [&](std::int64_t) { return s * tau * sum_a; });
    double db_l1 = 0, mag = 1e-3;
    for (std::size_t i = 0; i < db_on.size(); ++i) db_l1 += std::abs(db_on[i] - db_off[i]);
    for (double v : db_off) mag = std::max(mag, std::abs(v));
    EXPECT_LE(db_l1, s * sum_a_min + slack_rel * mag * static_cast<double>(c.V));
  }
  EXPECT_TRUE(dropped_any) << "the filter dropped nothing: the test data is not peaked enough";
}

std::vector<FilterCase> filter_cases() {
  std::vector<FilterCase> v;
  for (Reduction r : {Reduction::none, Reduction::mean, Reduction::sum}) {
    v.push_back({DType::f64, r, 0.0, 0.0, 4.0, 0.0, false});
    v.push_back({DType::f64, r, 0.1, 0.0, 4.0, 0.01, true});
    v.push_back({DType::f64, r, 0.0, 6.0, -5.0, 0.02, true});
  }
  v.push_back({DType::f32, Reduction::mean, 0.05, 5.0, 4.0, 0.01, true});
  return v;
}

INSTANTIATE_TEST_SUITE_P(All, LinearCeFilterBound, ::testing::ValuesIn(filter_cases()), [](const auto& info) {
  const FilterCase& f = info.param;
  return nm(f.dt) + "_" + red_name(f.red) + (f.eps ? "_ls" : "") + (f.softcap ? "_cap" : "") + (f.zls ? "_z" : "") +
         (f.weight ? "_w" : "") + (f.scale < 0 ? "_negscale" : "");
});

// A tile that no row keeps, with no target in it and no label smoothing, skips its products: with threshold 1
// every (row, tile) drops its q term, so with one row per chunk only the target's tile multiplies (dx and dW);
// ignored rows multiply nothing. Their dx rows are still written (zeros), and the bound holds (tested above).
TEST(LinearCeFilter, TilesNoRowKeepsSkipTheirProducts) {
  Case c;
  c.tile = 2, c.chunk = 1;  // 7 chunks x 6 tiles
  Data d = case_data(c);
  d.t.set_int(1, -100), d.tv[1] = -100;
  Tensor lse = Tensor::make(DType::f32, {c.N}), loss = Tensor::make(DType::f32, {});
  const double sentinel = Tensor::make(DType::f32, {1}, Layout::contiguous, kSentinel).get(0);
  lossfuse::set_gemm_hook(&counting_hook);
  lossfuse::linear_cross_entropy_forward(d.x.view, d.w.view, d.b.view, d.t.view, options(c, d),
                                         CrossEntropyOutputs{loss.view, lse.view, std::nullopt});
  std::int64_t want_off = 0, want_on = 0;
  for (std::int64_t y : d.tv) {
    want_off += y == -100 ? 6 : 6 * 3;
    want_on += y == -100 ? 6 : 6 + 2;
  }
  for (double tau : {0.0, 1.0}) {
    LinearCrossEntropyOptions o = options(c, d);
    o.grad_filter = tau;
    Tensor gx = Tensor::make(DType::f32, {c.N, c.H}, Layout::contiguous, kSentinel);
    Tensor gw = Tensor::make(DType::f32, {c.V, c.H}, Layout::contiguous, kSentinel);
    g_calls = 0;
    lossfuse::linear_cross_entropy_backward(d.x.view, d.w.view, d.b.view, d.t.view, lse.view, std::nullopt, o,
                                            LinearCrossEntropyGrads{gx.view, gw.view, std::nullopt});
    EXPECT_EQ(g_calls, tau == 0 ? want_off : want_on) << "tau " << tau;
    for (std::int64_t r = 0; r < c.N; ++r) {
      for (std::int64_t h = 0; h < c.H; ++h) {
        if (d.tv[r] == -100) EXPECT_EQ(gx.get(r * c.H + h), 0.0);
        EXPECT_NE(gx.get(r * c.H + h), sentinel);
      }
    }
    for (double v : gw.values()) EXPECT_NE(v, sentinel);  // every row written, skipped tiles included
  }
  lossfuse::set_gemm_hook(nullptr);
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
      {"H mismatch",
       [](Data& d, auto&, auto&) {
         d.w = Tensor::make(DType::f32, {11, 4});
       },
       ErrorCode::shape_mismatch, "weight"},
      {"dtype mix",
       [](Data& d, auto&, auto&) {
         d.w = Tensor::make(DType::bf16, {11, 5});
       },
       ErrorCode::dtype_mismatch, "weight"},
      {"bias shape",
       [](Data&, auto& b, auto&) {
         static Tensor t = Tensor::make(DType::f32, {10});
         b = t.view;
       },
       ErrorCode::shape_mismatch, "bias"},
      {"float target", [](Data& d, auto&, auto&) { d.t = Tensor::make(DType::f32, {7}); }, ErrorCode::dtype_mismatch,
       "target"},
      {"label smoothing", [](Data&, auto&, auto& o) { o.ce.label_smoothing = 2; }, ErrorCode::invalid_value,
       "label_smoothing"},
      // the class weights by this API's name for them ("weight" is W here)
      {"class weight shape",
       [](Data&, auto&, auto& o) {
         static Tensor t = Tensor::make(DType::f32, {3});
         o.ce.weight = t.view;
       },
       ErrorCode::shape_mismatch, "class_weight"},
      {"no classes",
       [](Data& d, auto& b, auto&) {
         d.w = Tensor::make(DType::f32, {0, 5}), b.reset();
       },
       ErrorCode::shape_mismatch, "weight"},
      {"softcap float32 cannot hold", [](Data&, auto&, auto& o) { o.ce.softcap = 1e39; }, ErrorCode::invalid_value,
       "softcap"},
      {"vocab_tile < 0", [](Data&, auto&, auto& o) { o.vocab_tile = -1; }, ErrorCode::invalid_value, "vocab_tile"},
      {"memory_budget < 0", [](Data&, auto&, auto& o) { o.memory_budget = -1; }, ErrorCode::invalid_value,
       "memory_budget"},
      {"grad_filter < 0", [](Data&, auto&, auto& o) { o.vocab_tile = 4, o.grad_filter = -0.1; },
       ErrorCode::invalid_value, "grad_filter"},
      {"grad_filter NaN", [](Data&, auto&, auto& o) { o.vocab_tile = 4, o.grad_filter = std::nan(""); },
       ErrorCode::invalid_value, "grad_filter"},
      {"grad_filter > 1", [](Data&, auto&, auto& o) { o.vocab_tile = 4, o.grad_filter = 1.5; },
       ErrorCode::invalid_value, "grad_filter"},
      {"grad_filter without tiles", [](Data&, auto&, auto& o) { o.grad_filter = 0.01; }, ErrorCode::invalid_value,
       "grad_filter"},
      // The tiled path checks the cross-entropy options itself, before any write.
      {"tiled label smoothing", [](Data&, auto&, auto& o) { o.vocab_tile = 4, o.ce.label_smoothing = -1; },
       ErrorCode::invalid_value, "label_smoothing"},
      {"tiled softcap", [](Data&, auto&, auto& o) { o.vocab_tile = 4, o.ce.softcap = -2; }, ErrorCode::invalid_value,
       "softcap"},
      {"tiled z_loss_scale", [](Data&, auto&, auto& o) { o.vocab_tile = 4, o.ce.z_loss_scale = std::nan(""); },
       ErrorCode::invalid_value, "z_loss_scale"},
      {"tiled target", [](Data& d, auto&, auto& o) { o.vocab_tile = 4, d.t.set_int(6, -1); }, ErrorCode::index_error,
       "target"},
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

TEST(LinearCeErrors, GradientsRepeatingElements) {
  // gradient views whose elements share memory would be written in thread order: refused, nothing written
  const Case c;
  for (int which = 0; which < 2; ++which) {
    SCOPED_TRACE(which == 0 ? "grad_x strides (0, 1)" : "grad_w strides (1, 1)");
    Data d = make_data(c, 7);
    Tensor loss = Tensor::make(DType::f32, {}, Layout::contiguous, kSentinel);
    Tensor gx = Tensor::make(DType::f32, {7, 5}, Layout::contiguous, kSentinel);
    Tensor gw = Tensor::make(DType::f32, {11, 5}, Layout::contiguous, kSentinel);
    TensorView vx = gx.view, vw = gw.view;
    if (which == 0) vx.strides[0] = 0;
    if (which == 1) vw.strides[0] = 1;
    try {
      lossfuse::linear_cross_entropy_forward(d.x.view, d.w.view, d.b.view, d.t.view, options(c, d),
                                             CrossEntropyOutputs{loss.view, std::nullopt, std::nullopt},
                                             LinearCrossEntropyGrads{vx, vw, std::nullopt});
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::bad_pointer) << e.what();
      EXPECT_EQ(e.argument(), which == 0 ? "grad_x" : "grad_weight") << e.what();
    }
    for (const Tensor* t : {&loss, &gx, &gw}) {
      EXPECT_TRUE(std::all_of(t->storage.begin(), t->storage.end(), [](std::uint8_t v) { return v == kSentinel; }));
    }
  }
}

TEST(LinearCeErrors, BackwardBadTileOptionsWriteNothing) {
  const Case c;
  const Data d = make_data(c, 7);
  Tensor lse = Tensor::make(DType::f32, {7});
  for (int k = 0; k < 3; ++k) {
    LinearCrossEntropyOptions o = options(c, d);
    o.vocab_tile = k == 0 ? -5 : 4;
    o.grad_filter = k == 1 ? -1.0 : (k == 2 ? std::nan("") : 0.0);
    const std::string want = k == 0 ? "vocab_tile" : "grad_filter";
    Tensor gx = Tensor::make(DType::f32, {7, 5}, Layout::contiguous, kSentinel);
    Tensor gw = Tensor::make(DType::f32, {11, 5}, Layout::contiguous, kSentinel);
    try {
      lossfuse::linear_cross_entropy_backward(d.x.view, d.w.view, d.b.view, d.t.view, lse.view, std::nullopt, o,
                                              LinearCrossEntropyGrads{gx.view, gw.view, std::nullopt});
      ADD_FAILURE() << "no error for " << want;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_value) << e.what();
      EXPECT_EQ(e.argument(), want) << e.what();
    }
    for (const Tensor* t : {&gx, &gw}) {
      EXPECT_TRUE(std::all_of(t->storage.begin(), t->storage.end(), [](std::uint8_t v) { return v == kSentinel; }));
    }
  }
}

// The GEMM hook: every product goes through it, and a hook that declines gives not_implemented.

TEST(LinearCeHook, HookRunsEveryProductOrDeclines) {
  Case c;
  c.chunk = 3;  // 3 chunks of 7 rows: logits, dx and dW per chunk
  const Data d = make_data(c, 11);
  Tensor loss = Tensor::make(DType::f32, {}), gx = Tensor::make(DType::f32, {7, 5}),
         gw = Tensor::make(DType::f32, {11, 5});
  lossfuse::set_gemm_hook(&counting_hook);
  g_calls = 0;
  lossfuse::linear_cross_entropy_forward(d.x.view, d.w.view, d.b.view, d.t.view, options(c, d),
                                         CrossEntropyOutputs{loss.view, std::nullopt, std::nullopt},
                                         LinearCrossEntropyGrads{gx.view, gw.view, std::nullopt});
  EXPECT_EQ(g_calls, 9);
  // Tiles: 3 chunks x 3 tiles (4 + 4 + 3 classes). Forward with grads: per tile the logits, then in the second
  // sweep the logits again, dx and dW.
  LinearCrossEntropyOptions o = options(c, d);
  o.vocab_tile = 4;
  g_calls = 0;
  lossfuse::linear_cross_entropy_forward(d.x.view, d.w.view, d.b.view, d.t.view, o,
                                         CrossEntropyOutputs{loss.view, std::nullopt, std::nullopt},
                                         LinearCrossEntropyGrads{gx.view, gw.view, std::nullopt});
  EXPECT_EQ(g_calls, 3 * 3 * 4);
  // The chunk from memory_budget counts tile-wide rows: 48 bytes = 3 rows of 4 float32 logits.
  o.chunk_rows = 0, o.memory_budget = 48;
  g_calls = 0;
  lossfuse::linear_cross_entropy_forward(d.x.view, d.w.view, d.b.view, d.t.view, o,
                                         CrossEntropyOutputs{loss.view, std::nullopt, std::nullopt});
  EXPECT_EQ(g_calls, 3 * 3);
  lossfuse::set_gemm_hook(&declining_hook);
  EXPECT_THROW(lossfuse::linear_cross_entropy_forward(d.x.view, d.w.view, d.b.view, d.t.view, options(c, d),
                                                      CrossEntropyOutputs{loss.view, std::nullopt, std::nullopt}),
               Error);
  lossfuse::set_gemm_hook(nullptr);
}

// The documented rule, by hand: chunk_rows wins; a positive budget is strict; auto (budget 0) takes 32 MiB of
// logits, raised to min(256, ceil(N / 16)) rows.
TEST(LinearCeChunks, RowsFollowTheDocumentedRule) {
  using lossfuse::linear_cross_entropy_chunk_rows;
  LinearCrossEntropyOptions o;
  ASSERT_EQ(o.memory_budget, 0);  // auto by default
  // (4096, V = 32000): 32 MiB / 128000 B = 262 rows, above 256
  EXPECT_EQ(linear_cross_entropy_chunk_rows(4096, 32000, 4, o), 262);
  // (4096, V = 128256): 32 MiB gives 65 rows; raised to 256 (16 chunks)
  EXPECT_EQ(linear_cross_entropy_chunk_rows(4096, 128256, 4, o), 256);
  // (2048, V = 256000): 32 rows from the budget; ceil(2048 / 16) = 128
  EXPECT_EQ(linear_cross_entropy_chunk_rows(2048, 256000, 4, o), 128);
  // float64 rows are twice the bytes: (100000, V = 128256): 32 rows from the budget, 256 from the floor
  EXPECT_EQ(linear_cross_entropy_chunk_rows(100000, 128256, 8, o), 256);
  // few rows: the floor is ceil(20 / 16) = 2 rows; the budget's 8 rows win at V = 10^6, and all 20 fit at V = 10
  EXPECT_EQ(linear_cross_entropy_chunk_rows(20, 1000000, 4, o), 8);
  EXPECT_EQ(linear_cross_entropy_chunk_rows(20, 10, 4, o), 20);
  EXPECT_EQ(linear_cross_entropy_chunk_rows(0, 10, 4, o), 1);
  // a positive budget is strict, even below the floor: 1 MiB / (128256 * 4 B) = 2 rows
  o.memory_budget = std::int64_t{1} << 20;
  EXPECT_EQ(linear_cross_entropy_chunk_rows(4096, 128256, 4, o), 2);
  o.memory_budget = 1;
  EXPECT_EQ(linear_cross_entropy_chunk_rows(4096, 128256, 4, o), 1);
  // chunk_rows wins over both, clamped to N
  o.chunk_rows = 7;
  EXPECT_EQ(linear_cross_entropy_chunk_rows(4096, 128256, 4, o), 7);
  o.chunk_rows = 9999;
  EXPECT_EQ(linear_cross_entropy_chunk_rows(4096, 128256, 4, o), 4096);
}

}  // namespace
}  // namespace lftest
