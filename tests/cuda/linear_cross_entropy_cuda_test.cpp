// linear_cross_entropy_* on CUDA tensors against the float64 reference: the CPU suite's whole-row cases
// (tests/core/lce_harness.hpp) run through device copies of every operand, both ways, plus what only the device
// runner has: cuBLAS-sized products (chunks of auto and odd sizes), dx and dW written straight or through their
// float32 buffers (strided gradients), a saved lse of either dtype at any stride, an empty batch, vocabulary tiles
// and bad targets refused with nothing written, held gradients scaled (scale_held), graph capture, and
// bitwise-repeatable results. Without a CUDA device every test is skipped (main exits 77).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/lce_harness.hpp"
#include "cuda/cuda_memory.hpp"

namespace lftest {
namespace {

using namespace lce;

std::vector<Case> whole_row_cases() {
  std::vector<Case> v;
  for (const Case& c : cases()) {
    if (c.tile == 0) v.push_back(c);
  }
  // Degenerate sizes (one row, one feature, one class: the leading dimensions cuBLAS still wants).
  for (DType t : {DType::f32, DType::bf16}) {
    for (const std::array<std::int64_t, 3> nhv : {std::array<std::int64_t, 3>{1, 5, 11}, {7, 1, 11}, {7, 5, 1}}) {
      Case c;
      c.dt = t, c.N = nhv[0], c.H = nhv[1], c.V = nhv[2], c.chunk = 3;
      v.push_back(c);
    }
  }
  // Products of a size cuBLAS picks real kernels for: one chunk (auto) and chunks that do not divide N.
  for (DType t : kFloats) {
    for (std::int64_t chunk : {0, 97}) {
      Case c;
      c.dt = t, c.N = 300, c.H = 96, c.V = 5003, c.chunk = chunk, c.weight = true, c.eps = 0.05, c.zls = 0.001;
      v.push_back(c);
    }
  }
  return v;
}

class LinearCeCuda : public ::testing::TestWithParam<Case> {};
TEST_P(LinearCeCuda, ForwardWithGradsMatchesReference) { run_case(GetParam(), true, &kCuda); }
TEST_P(LinearCeCuda, BackwardFromLseMatchesReference) { run_case(GetParam(), false, &kCuda); }
INSTANTIATE_TEST_SUITE_P(WholeRows, LinearCeCuda, ::testing::ValuesIn(whole_row_cases()),
                         [](const auto& info) { return case_name(info.param); });

// linear_cross_entropy_scale_held on the device (the upstream value read by the kernels): the reference gradients of
// the upstream value, and torch's kept values (grad_x's ignored rows; everything when every row is ignored) for NaN.
class LinearCeCudaHeld : public ::testing::TestWithParam<Case> {};
TEST_P(LinearCeCudaHeld, ScaledHeldMatchesReference) {
  for (double g : {-0.75, 2.5}) check_held(GetParam(), g, &kCuda);
}
INSTANTIATE_TEST_SUITE_P(Reduced, LinearCeCudaHeld, ::testing::ValuesIn([] {
                           std::vector<Case> v;
                           for (const Case& c : whole_row_cases()) {
                             if (c.red != Reduction::none) v.push_back(c);
                           }
                           return v;
                         }()),
                         [](const auto& info) { return case_name(info.param); });

TEST(LinearCeCudaHeldEdge, IgnoredRowsKeepTheirValues) {
  for (bool all : {false, true}) {
    Case c;
    c.dt = DType::bf16, c.all_ignored = all;
    Data d = case_data(c);
    if (!all) d.t.set_int(2, -100), d.t.set_int(0, 3);
    const Outputs held = run_held(c, d, 1.0, &kCuda), nan = run_held(c, d, std::nan(""), &kCuda);
    for (std::int64_t r = 0; r < c.N; ++r) {
      for (std::int64_t h = 0; h < c.H; ++h) {
        const double v = nan.gx.get(r * c.H + h);
        EXPECT_TRUE(d.t.get_int(r) == -100 ? v == held.gx.get(r * c.H + h) : std::isnan(v)) << r << ", " << h;
      }
    }
    for (std::int64_t i = 0; i < c.V * c.H; ++i) {
      EXPECT_TRUE(all ? nan.gw.get(i) == held.gw.get(i) : std::isnan(nan.gw.get(i))) << i;
    }
  }
}

// dW in a transposed (non-unit inner stride) view and dx transposed: both go through float32 buffers, then stored.
// And the direct ways with 16-bit inputs: a float32 dW accumulated in place, x and dx with padded rows (ld > H).
TEST(LinearCeCudaEdge, StridedGradientsThroughBuffers) {
  for (DType t : {DType::f32, DType::bf16}) {
    for (bool fused : {true, false}) {
      for (bool strided : {true, false}) {
        Case c;
        c.dt = t, c.N = 19, c.H = 12, c.V = 37, c.chunk = 5, c.weight = true, c.eps = 0.1;
        SCOPED_TRACE(case_name(c) + (fused ? " forward-with-grads" : " forward+backward") +
                     (strided ? " strided" : ""));
        Data d = case_data(c);
        if (!strided) {  // x with padded rows, the same values
          Tensor xp = Tensor::make(t, {c.N, c.H}, Layout::padded);
          for (std::int64_t i = 0; i < c.N * c.H; ++i) xp.set(i, d.x.get(i));
          d.x = xp;
        }
        const DType acc = acc_of(t);
        Tensor loss = Tensor::make(acc, {}), lse = Tensor::make(acc, {c.N});
        Tensor gx = Tensor::make(t, {c.N, c.H}, strided ? Layout::transposed : Layout::padded);
        Tensor gw = strided ? Tensor::make(t, {c.V, c.H}, Layout::transposed) : Tensor::make(acc, {c.V, c.H});
        Tensor gb = Tensor::make(t, {c.V}, Layout::padded);
        Tensor gl = Tensor::make(acc, {});
        gl.set(0, 1.0);
        {
          Mirror m(&kCuda);
          LinearCrossEntropyOptions o = options(c, d);
          o.ce.weight = m(d.cw);
          const LinearCrossEntropyGrads g{m(gx), m(gw), m(gb)};
          const CrossEntropyOutputs out{m(loss), m(lse), std::nullopt};
          if (fused) {
            lossfuse::linear_cross_entropy_forward(m(d.x), m(d.w), m(d.b), m(d.t), o, out, g);
          } else {
            lossfuse::linear_cross_entropy_forward(m(d.x), m(d.w), m(d.b), m(d.t), o, out);
            lossfuse::linear_cross_entropy_backward(m(d.x), m(d.w), m(d.b), m(d.t), m(lse), m(gl), o, g);
          }
          m.download();
        }
        const Expected e = expected(c, d, {});
        EXPECT_TRUE(close_rel("loss", loss.values(), {e.ce.loss}, acc));
        EXPECT_TRUE(close_rel("grad_x", gx.values(), e.dx, t));
        EXPECT_TRUE(close_rel("grad_weight", gw.values(), e.dw, t));
        EXPECT_TRUE(close_rel("grad_bias", gb.values(), e.db, t));
        EXPECT_TRUE(gb.outside_untouched(0));
        EXPECT_TRUE(gx.outside_untouched(0));
      }
    }
  }
}

TEST(LinearCeCudaEdge, EmptyBatchGivesNanMeanAndZeroGradients) {
  Case c;
  c.N = 0;
  Data d = make_data(c, 5);
  Tensor loss = Tensor::make(DType::f32, {});
  Tensor gw = Tensor::make(DType::f32, {c.V, c.H}, Layout::contiguous, kSentinel);
  Tensor gb = Tensor::make(DType::f32, {c.V}, Layout::contiguous, kSentinel);
  Mirror m(&kCuda);
  lossfuse::linear_cross_entropy_forward(m(d.x), m(d.w), m(d.b), m(d.t), options(c, d),
                                         CrossEntropyOutputs{m(loss), std::nullopt, std::nullopt},
                                         LinearCrossEntropyGrads{std::nullopt, m(gw), m(gb)});
  m.download();
  EXPECT_TRUE(std::isnan(loss.get(0)));
  for (double v : gw.values()) EXPECT_EQ(v, 0.0);
  for (double v : gb.values()) EXPECT_EQ(v, 0.0);
}

// Refused before anything is written: vocabulary tiles (not served on CUDA) and a class index out of range (named
// with its position and value, as on the CPU), in the forward (with a gradient) and in the backward.
TEST(LinearCeCudaErrors, TilesAndBadTargetsWriteNothing) {
  for (int which = 0; which < 3; ++which) {
    Case c;
    c.dt = DType::bf16;
    Data d = case_data(c);
    if (which != 0) d.t.set_int(4, 11);
    LinearCrossEntropyOptions o = options(c, d);
    if (which == 0) o.vocab_tile = 4;
    Tensor loss = Tensor::make(DType::f32, {}, Layout::contiguous, kSentinel);
    Tensor gx = Tensor::make(c.dt, {c.N, c.H}, Layout::contiguous, kSentinel);
    Tensor lse = Tensor::make(DType::f32, {c.N});
    for (std::int64_t i = 0; i < c.N; ++i) lse.set(i, 3.0);
    const auto sentinel_loss = loss.storage, sentinel_gx = gx.storage;
    Mirror m(&kCuda);
    try {
      const LinearCrossEntropyGrads g{m(gx), std::nullopt, std::nullopt};
      if (which == 2) {
        lossfuse::linear_cross_entropy_backward(m(d.x), m(d.w), m(d.b), m(d.t), m(lse), std::nullopt, o, g);
      } else {
        lossfuse::linear_cross_entropy_forward(m(d.x), m(d.w), m(d.b), m(d.t), o,
                                               CrossEntropyOutputs{m(loss), std::nullopt, std::nullopt}, g);
      }
      ADD_FAILURE() << "no error";
    } catch (const lossfuse::Error& e) {
      if (which == 0) {
        EXPECT_EQ(e.code(), lossfuse::ErrorCode::not_implemented) << e.what();
        EXPECT_EQ(e.argument(), "vocab_tile") << e.what();
      } else {
        EXPECT_EQ(e.code(), lossfuse::ErrorCode::index_error) << e.what();
        EXPECT_NE(std::string(e.what()).find("[4]"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("11"), std::string::npos) << e.what();
      }
    }
    m.download();
    EXPECT_TRUE(loss.storage == sentinel_loss) << "loss written despite the error";
    EXPECT_TRUE(gx.storage == sentinel_gx) << "grad_x written despite the error";
  }
}

// The backward reads a saved lse of float32 or float64, contiguous or strided (gathered first): the same gradient
// bits as from the contiguous float32 lse the forward wrote, whose values each of them holds.
TEST(LinearCeCudaEdge, BackwardFromAnySavedLse) {
  Case c;
  c.dt = DType::bf16, c.N = 41, c.H = 16, c.V = 300, c.chunk = 13, c.weight = true, c.eps = 0.1;
  Data d = case_data(c);
  Tensor lse = Tensor::make(DType::f32, {c.N});
  {
    Tensor loss = Tensor::make(DType::f32, {});
    Mirror m(&kCuda);
    LinearCrossEntropyOptions o = options(c, d);
    o.ce.weight = m(d.cw);
    lossfuse::linear_cross_entropy_forward(m(d.x), m(d.w), m(d.b), m(d.t), o,
                                           CrossEntropyOutputs{m(loss), m(lse), std::nullopt});
    m.download();
  }
  auto grads_from = [&](Tensor& saved) {
    Tensor gx = Tensor::make(c.dt, {c.N, c.H}), gw = Tensor::make(DType::f32, {c.V, c.H});
    Tensor gb = Tensor::make(DType::f32, {c.V}), gl = Tensor::make(DType::f32, {});
    gl.set(0, 0.75);
    Mirror m(&kCuda);
    LinearCrossEntropyOptions o = options(c, d);
    o.ce.weight = m(d.cw);
    lossfuse::linear_cross_entropy_backward(m(d.x), m(d.w), m(d.b), m(d.t), m(saved), m(gl), o,
                                            LinearCrossEntropyGrads{m(gx), m(gw), m(gb)});
    m.download();
    std::vector<std::uint8_t> bits = gx.storage;
    bits.insert(bits.end(), gw.storage.begin(), gw.storage.end());
    bits.insert(bits.end(), gb.storage.begin(), gb.storage.end());
    return bits;
  };
  const auto want = grads_from(lse);
  for (DType t : {DType::f32, DType::f64}) {
    for (Layout l : {Layout::contiguous, Layout::padded}) {
      if (t == DType::f32 && l == Layout::contiguous) continue;
      SCOPED_TRACE(dname(t) + " " + layout_name(l));
      Tensor saved = Tensor::make(t, {c.N}, l);
      for (std::int64_t i = 0; i < c.N; ++i) saved.set(i, lse.get(i));
      EXPECT_TRUE(grads_from(saved) == want) << "the gradient depends on how the lse was saved";
    }
  }
}

// The fused call (then, reduced, scale_held by an upstream gradient in device memory) and the two-way call (forward,
// then backward from the saved lse with that upstream gradient) captured into a CUDA graph (run_captured) or run under
// CudaCheck::nan (run_unchecked), neither synchronising, give the eager calls' bits, for 'mean' and 'none'; neither
// reads anything back, so a bad class target makes the loss NaN instead of an error.
TEST(LinearCeCudaGraph, CapturedCallsMatchEager) {
  for (DType t : {DType::f32, DType::bf16})
    for (Reduction red : {Reduction::mean, Reduction::none})
      for (bool fused : {true, false}) {
        Case c;
        c.dt = t, c.N = 300, c.H = 96, c.V = 5003, c.chunk = 97, c.weight = true, c.eps = 0.05, c.zls = 0.001;
        c.red = red;
        SCOPED_TRACE(case_name(c) + (fused ? " forward-with-grads" : " forward+backward"));
        auto bits = [&](Data& d, RunAs how) {
          const std::vector<std::int64_t> ls =
              red == Reduction::none ? std::vector<std::int64_t>{c.N} : std::vector<std::int64_t>{};
          Tensor loss = Tensor::make(DType::f32, ls, Layout::contiguous, kSentinel);
          Tensor zl = Tensor::make(DType::f32, ls, Layout::contiguous, kSentinel);
          Tensor lse = Tensor::make(DType::f32, {c.N}, Layout::contiguous, kSentinel);
          Tensor gx = Tensor::make(t, {c.N, c.H}, Layout::contiguous, kSentinel);
          Tensor gw = Tensor::make(DType::f32, {c.V, c.H}, Layout::contiguous, kSentinel);
          Tensor gb = Tensor::make(DType::f32, {c.V}, Layout::contiguous, kSentinel);
          Tensor gl = Tensor::make(DType::f32, ls);
          for (std::int64_t i = 0; i < gl.numel(); ++i) gl.set(i, 0.5 + 0.01 * static_cast<double>(i));
          Mirror m(&kCuda);
          LinearCrossEntropyOptions o = options(c, d);
          o.ce.weight = m(d.cw);
          const TensorView x = m(d.x), w = m(d.w), b = m(d.b), tg = m(d.t), up = m(gl);
          const CrossEntropyOutputs out{m(loss), m(lse), m(zl)};
          const LinearCrossEntropyGrads g{m(gx), m(gw), m(gb)};
          auto call = [&] {
            if (fused) {
              lossfuse::linear_cross_entropy_forward(x, w, b, tg, o, out, g);
              if (red != Reduction::none) lossfuse::linear_cross_entropy_scale_held(g, tg, o, up);
            } else {
              lossfuse::linear_cross_entropy_forward(x, w, b, tg, o, out);
              lossfuse::linear_cross_entropy_backward(x, w, b, tg, *out.lse, up, o, g);
            }
          };
          run_as(how, call);
          m.download();
          std::vector<std::uint8_t> v;
          for (const Tensor* r : {&loss, &zl, &lse, &gx, &gw, &gb})
            v.insert(v.end(), r->storage.begin(), r->storage.end());
          return std::make_pair(v, loss.get(red == Reduction::none ? 4 : 0));
        };
        Data d = case_data(c);
        const auto eager = bits(d, RunAs::eager);
        EXPECT_TRUE(bits(d, RunAs::captured).first == eager.first) << "the captured calls' bits differ";
        EXPECT_TRUE(bits(d, RunAs::unchecked).first == eager.first) << "the unchecked calls' bits differ";
        d.t.set_int(4, c.V);
        EXPECT_TRUE(std::isnan(bits(d, RunAs::captured).second)) << "a bad target under capture";
        EXPECT_TRUE(std::isnan(bits(d, RunAs::unchecked).second)) << "a bad target under CudaCheck::nan";
      }
}

// No floating-point atomics: two runs give the same bits, both ways.
TEST(LinearCeCudaDeterminism, RepeatsBitwise) {
  Case c;
  c.dt = DType::bf16, c.N = 300, c.H = 96, c.V = 5003, c.chunk = 97, c.weight = true, c.eps = 0.05;
  for (bool fused : {true, false}) {
    Data d = case_data(c);
    const Outputs a = run_lce(c, d, fused, &kCuda), b = run_lce(c, d, fused, &kCuda);
    EXPECT_TRUE(a.loss.storage == b.loss.storage && a.lse.storage == b.lse.storage);
    EXPECT_TRUE(a.gx.storage == b.gx.storage && a.gw.storage == b.gw.storage && a.gb.storage == b.gb.storage);
  }
}

}  // namespace
}  // namespace lftest

int main(int argc, char** argv) { return lftest::run_cuda_tests(argc, argv); }
