// Each elementwise loss's own edges, beside the generic suites of pointwise_test.cpp: bce's kernel paths (hard and
// soft labels, its two logs over every bfloat16, its reduced forward), bce_with_logits' subnormal losses, values at
// the ends of each domain checked against torch 2.15 by hand (probabilities 0 and 1, logits +-100, var = 0, kl_div
// at y <= 0, poisson_nll's Stirling mask), the range checks that raise with the element's position (bce's input,
// gaussian_nll's var) before anything is written, and held gradients refused by the fused entry.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "lossfuse/pointwise.hpp"
#include "test_util.hpp"

namespace {

using namespace lftest;

// bce_with_logits where y = 1 and x is large: the loss is softplus(-x) = log1p(e^-x), below the normal range for
// x > 87.3 (subnormal, down to 0 past about 103.9). The SIMD kernels take a cheaper exp that flushes there unless a
// lane of the vector needs it: vectors with none, some and all lanes in that range, reduction none and sum, checked
// against the float64 formula rounded to float32 (fails if the tiny results are flushed to 0).
TEST(PointwiseEdges, BceWithLogitsSubnormalLosses) {
  namespace lf = lossfuse;
  const int n = 48;  // three vectors of 16 float lanes: ordinary, mixed, all tiny
  Tensor x = Tensor::make(DType::f32, {n}), y = Tensor::make(DType::f32, {n});
  std::vector<double> want(n);
  for (int i = 0; i < n; ++i) {
    const bool tiny = i >= 32 || (i >= 16 && i % 3 == 0);
    const double xv = tiny ? static_cast<double>(static_cast<float>(87.5 + 0.37 * (i % 17))) : 0.25 * (i % 9) - 1.0;
    x.set(i, xv);
    y.set(i, 1.0);
    want[i] = static_cast<double>(static_cast<float>(std::log1p(std::exp(-xv))));
  }
  Tensor loss = Tensor::make(DType::f32, {n});
  lf::bce_with_logits_forward(x.view, y.view, {Reduction::none, std::nullopt, std::nullopt}, loss.view);
  double tiny_sum = 0;
  for (int i = 0; i < n; ++i) {
    if (i >= 32) tiny_sum += want[i];
    // 1 ulp of a normal result; 2^-148 (one float subnormal ulp, twice) below
    EXPECT_NEAR(loss.get(i), want[i], std::max(std::fabs(want[i]) * 2.4e-7, 2.9e-45)) << i << " x " << x.get(i);
    if (i >= 32 && x.get(i) < 103) EXPECT_GT(loss.get(i), 0.0) << i;
  }
  Tensor tail_x = Tensor::make(DType::f32, {16}), tail_y = Tensor::make(DType::f32, {16});
  for (int i = 0; i < 16; ++i) tail_x.set(i, x.get(32 + i)), tail_y.set(i, 1.0);
  Tensor sum = Tensor::make(DType::f32, {});
  lf::bce_with_logits_forward(tail_x.view, tail_y.view, {Reduction::sum, std::nullopt, std::nullopt}, sum.view);
  EXPECT_GT(tiny_sum, 0.0);
  EXPECT_NEAR(sum.get(0), tiny_sum, tiny_sum * 1e-5 + 2e-44);
}

// Values checked against torch 2.15 (CPU, float64) by hand.
TEST(PointwiseEdges, ExtremeValuesMatchTorch) {
  namespace lf = lossfuse;
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    SCOPED_TRACE(dname(dt));
    const DType acc = acc_dtype(dt);
    // 31 elements so the pattern lands in vector bodies and tails: bce with x, y in {0, 1}
    const double xs[4] = {0, 1, 0, 1}, ys[4] = {0, 1, 1, 0};
    const double l_t[4] = {0, 0, 100, 100}, dx_t[4] = {0, 0, -1e12, 1e12};
    const double dy_t[4] = {INFINITY, -INFINITY, INFINITY, -INFINITY};
    Tensor x = Tensor::make(dt, {31}), y = Tensor::make(dt, {31});
    for (int i = 0; i < 31; ++i) x.set(i, xs[i % 4]), y.set(i, ys[i % 4]);
    Tensor loss = Tensor::make(acc, {31});
    lf::bce_forward(x.view, y.view, {Reduction::none, std::nullopt}, loss.view);
    Tensor gx = Tensor::make(dt, {31}), gy = Tensor::make(dt, {31});
    lf::bce_backward(x.view, y.view, std::nullopt, {Reduction::sum, std::nullopt}, {gx.view, gy.view, std::nullopt});
    for (int i = 0; i < 31; ++i) {
      EXPECT_EQ(loss.get(i), l_t[i % 4]) << i;
      EXPECT_NEAR(gx.get(i), dx_t[i % 4], std::fabs(dx_t[i % 4]) * 1e-2) << i;
      EXPECT_EQ(gy.get(i), dy_t[i % 4]) << i;
    }
    // bce_with_logits at x = +-100: 100 (200 with pos_weight 2 where y = 1), gradients +-1 (-2)
    Tensor xl = Tensor::make(dt, {31}), yl = Tensor::make(dt, {31}), pw = Tensor::make(dt, {31});
    for (int i = 0; i < 31; ++i) xl.set(i, i % 2 ? -100 : 100), yl.set(i, i % 2 ? 1 : 0), pw.set(i, 2);
    lf::bce_with_logits_forward(xl.view, yl.view, {Reduction::none, std::nullopt, std::nullopt}, loss.view);
    for (int i = 0; i < 31; ++i) EXPECT_EQ(loss.get(i), 100) << i;
    lf::bce_with_logits_forward(xl.view, yl.view, {Reduction::none, std::nullopt, pw.view}, loss.view);
    for (int i = 0; i < 31; ++i) EXPECT_EQ(loss.get(i), i % 2 ? 200 : 100) << i;
    lf::bce_with_logits_backward(xl.view, yl.view, std::nullopt, {Reduction::sum, std::nullopt, pw.view},
                                 {gx.view, gy.view, std::nullopt});
    for (int i = 0; i < 31; ++i) {
      EXPECT_EQ(gx.get(i), i % 2 ? -2 : 1) << i;
      EXPECT_NEAR(gy.get(i), i % 2 ? 200 : -100, 1.0) << i;
    }
    // gaussian_nll with var = 0: clamped to eps; d/dvar taken at eps and passed through (torch: -1.25e11)
    Tensor gxx = Tensor::make(dt, {31}), gyy = Tensor::make(dt, {31}), var = Tensor::make(dt, {31});
    for (int i = 0; i < 31; ++i) gxx.set(i, 0.5), gyy.set(i, 0), var.set(i, 0);
    lf::gaussian_nll_forward(gxx.view, gyy.view, var.view, {Reduction::none, true, 1e-6}, loss.view);
    const double eps_c = dt == DType::f64 ? 1e-6 : static_cast<double>(1e-6f);
    const double lv = 0.5 * (std::log(eps_c) + 0.25 / eps_c) + 0.5 * std::log(2 * M_PI);
    Tensor gv = Tensor::make(dt, {31});
    lf::gaussian_nll_backward(gxx.view, gyy.view, var.view, std::nullopt, {Reduction::sum, true, 1e-6},
                              {gx.view, gy.view, gv.view});
    for (int i = 0; i < 31; ++i) {
      EXPECT_NEAR(loss.get(i), lv, lv * 1e-6) << i;
      EXPECT_NEAR(gv.get(i), -1.25e11, 1.25e11 * 1e-2) << i;
      EXPECT_NEAR(gx.get(i), 5e5, 5e5 * 1e-2) << i;
    }
    // kl_div: y = 0 gives 0 (target gradient NaN, as torch's autograd); y < 0 gives NaN
    Tensor kx = Tensor::make(dt, {31}), ky = Tensor::make(dt, {31});
    for (int i = 0; i < 31; ++i) kx.set(i, -1), ky.set(i, i % 3 == 0 ? 0.0 : (i % 3 == 1 ? -0.125 : 0.5));
    lf::kl_div_forward(kx.view, ky.view, {Reduction::none, false, false}, loss.view);
    lf::kl_div_backward(kx.view, ky.view, std::nullopt, {Reduction::sum, false, false}, {gx.view, gy.view, {}});
    for (int i = 0; i < 31; ++i) {
      if (i % 3 == 0) {
        EXPECT_EQ(loss.get(i), 0.0) << i;
      }
      if (i % 3 == 1) {
        EXPECT_TRUE(std::isnan(loss.get(i))) << i;
      }
      if (i % 3 == 2) {
        EXPECT_NEAR(loss.get(i), 0.5 * (std::log(0.5) + 1), 1e-6) << i;
      }
      EXPECT_EQ(gx.get(i), -ky.get(i)) << i;
      if (i % 3 != 2) {
        EXPECT_TRUE(std::isnan(gy.get(i))) << i;
      }
    }
    // poisson_nll full: target gradient NaN for y <= 0 (torch), 0 Stirling contribution for 0 < y <= 1
    Tensor px = Tensor::make(dt, {31}), py = Tensor::make(dt, {31});
    for (int i = 0; i < 31; ++i) px.set(i, 0.5), py.set(i, i % 3 == 0 ? 0.0 : (i % 3 == 1 ? 1.0 : 3.0));
    lf::poisson_nll_backward(px.view, py.view, std::nullopt, {Reduction::sum, true, true, 1e-8},
                             {gx.view, gy.view, {}});
    for (int i = 0; i < 31; ++i) {
      if (i % 3 == 0) {
        EXPECT_TRUE(std::isnan(gy.get(i))) << i;
      }
      if (i % 3 == 1) {
        EXPECT_EQ(gy.get(i), -0.5) << i;
      }
      if (i % 3 == 2) {
        EXPECT_NEAR(gy.get(i), -0.5 + std::log(3.0) + 0.5 / 3, 1e-2) << i;
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------------------
// Errors: each raised before anything is written.

struct Outputs {
  Tensor loss = Tensor::make(DType::f32, {7}, Layout::contiguous, kSentinel);
  Tensor loss0 = Tensor::make(DType::f32, {}, Layout::contiguous, kSentinel);
  Tensor gx = Tensor::make(DType::f32, {7}, Layout::contiguous, kSentinel);
  Tensor gy = Tensor::make(DType::f32, {7}, Layout::contiguous, kSentinel);
  Tensor gz = Tensor::make(DType::f32, {7}, Layout::contiguous, kSentinel);
  bool untouched() const {
    for (const Tensor* t : {&loss, &loss0, &gx, &gy, &gz})
      for (auto b : t->storage)
        if (b != kSentinel) return false;
    return true;
  }
};

TEST(PointwiseEdgeErrors, BceInputOutOfRange) {
  namespace lf = lossfuse;
  for (double bad : {1.5, -0.25, static_cast<double>(NAN)}) {
    Tensor x = Tensor::make(DType::f32, {7}), y = Tensor::make(DType::f32, {7});
    for (int i = 0; i < 7; ++i) x.set(i, 0.5);
    x.set(4, bad);
    Outputs o;
    std::string msg;
    EXPECT_TRUE(throws_error(
        [&] {
          lf::bce_forward(x.view, y.view, {Reduction::none, std::nullopt}, o.loss.view);
        },
        {ErrorCode::invalid_value}, &msg));
    EXPECT_NE(msg.find("input"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[0, 1]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[4]"), std::string::npos) << msg;
    EXPECT_TRUE(throws_error(
        [&] {
          lf::bce_forward(x.view, y.view, {Reduction::sum, std::nullopt}, o.loss0.view);
        },
        {ErrorCode::invalid_value}));
    EXPECT_TRUE(throws_error(
        [&] {
          lf::bce_backward(x.view, y.view, std::nullopt, {Reduction::none, std::nullopt},
                           {o.gx.view, o.gy.view, std::nullopt});
        },
        {ErrorCode::invalid_value}));
    for (Reduction r : {Reduction::none, Reduction::mean}) {  // the fused entry: neither loss nor gradients
      EXPECT_TRUE(throws_error(
          [&] {
            lf::bce_forward_backward(x.view, y.view, {r, std::nullopt},
                                     r == Reduction::none ? o.loss.view : o.loss0.view,
                                     {o.gx.view, o.gy.view, std::nullopt});
          },
          {ErrorCode::invalid_value}, &msg));
      EXPECT_NE(msg.find("[4]"), std::string::npos) << msg;
    }
    EXPECT_TRUE(o.untouched());
  }
  // 2-D position in the message
  Tensor x = Tensor::make(DType::bf16, {3, 4}, Layout::transposed), y = Tensor::make(DType::bf16, {3, 4});
  for (int i = 0; i < 12; ++i) x.set(i, 0.25);
  x.set(6, 2.0);  // [1, 2]
  Tensor loss = Tensor::make(DType::f32, {3, 4}, Layout::contiguous, kSentinel);
  std::string msg;
  EXPECT_TRUE(throws_error(
      [&] {
        lf::bce_forward(x.view, y.view, {Reduction::none, std::nullopt}, loss.view);
      },
      {ErrorCode::invalid_value}, &msg));
  EXPECT_NE(msg.find("2 at position [1, 2]"), std::string::npos) << msg;
  for (auto b : loss.storage) EXPECT_EQ(b, kSentinel);
}

// A reduced forward checks bce's input range and gaussian_nll's var inside its kernel (one pass): a bad element in
// the vector body or in a tail, in any tile, is still reported with its position, and the loss is not written.
// -0 is a valid bce input (-0 >= 0, as torch); the reduced forward's in-kernel check flags it conservatively and
// core's exact scan must let it pass: log(-0) = -inf, clamped to -100.
TEST(PointwiseEdgeErrors, BceNegativeZeroInputIsValid) {
  namespace lf = lossfuse;
  for (DType t : {DType::f32, DType::bf16, DType::f64}) {
    SCOPED_TRACE(dtype_name(t));
    const std::int64_t n = 1000;
    Tensor x = Tensor::make(t, {n}), y = Tensor::make(t, {n});
    double want = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const bool nz = i == 3 || i == 500 || i == n - 1;
      x.set(i, nz ? -0.0 : 0.25), y.set(i, 0.5);
      want += nz ? 50.0 : -(0.5 * std::log(0.25) + 0.5 * std::log1p(-0.25));
    }
    EXPECT_TRUE(std::signbit(x.get(3)));
    for (Reduction r : {Reduction::mean, Reduction::sum}) {
      Tensor loss = Tensor::make(t == DType::f64 ? DType::f64 : DType::f32, {});
      lf::bce_forward(x.view, y.view, {r, std::nullopt}, loss.view);
      const double w = r == Reduction::mean ? want / static_cast<double>(n) : want;
      EXPECT_NEAR(loss.get(0), w, std::fabs(w) * 1e-5);
    }
  }
}

TEST(PointwiseEdgeErrors, ReducedForwardChecksInKernel) {
  namespace lf = lossfuse;
  for (DType t : {DType::f32, DType::bf16, DType::f64}) {
    for (std::int64_t n : {std::int64_t{1000}, std::int64_t{2 * 16384 + 37}}) {
      for (std::int64_t pos : {std::int64_t{3}, n / 2, n - 1}) {
        for (Reduction r : {Reduction::mean, Reduction::sum}) {
          SCOPED_TRACE(std::string(dtype_name(t)) + " n " + std::to_string(n) + " pos " + std::to_string(pos));
          const DType acc = t == DType::f64 ? DType::f64 : DType::f32;
          Tensor x = Tensor::make(t, {n}), y = Tensor::make(t, {n}), v = Tensor::make(t, {n});
          for (std::int64_t i = 0; i < n; ++i) x.set(i, 0.25), y.set(i, i % 2), v.set(i, 1.0);
          const std::string where = "[" + std::to_string(pos) + "]";
          for (double bad : {1.5, -0.25, static_cast<double>(NAN)}) {
            x.set(pos, bad);
            Tensor loss = Tensor::make(acc, {}, Layout::contiguous, kSentinel);
            std::string msg;
            EXPECT_TRUE(throws_error(
                [&] {
                  lf::bce_forward(x.view, y.view, {r, std::nullopt}, loss.view);
                },
                {ErrorCode::invalid_value}, &msg));
            EXPECT_NE(msg.find(where), std::string::npos) << msg;
            for (auto b : loss.storage) EXPECT_EQ(b, kSentinel);
            Tensor grad = Tensor::make(t, {n}, Layout::contiguous, kSentinel);
            EXPECT_TRUE(throws_error(
                [&] {
                  lf::bce_forward_backward(x.view, y.view, {r, std::nullopt}, loss.view,
                                           {grad.view, std::nullopt, std::nullopt});
                },
                {ErrorCode::invalid_value}, &msg));
            EXPECT_NE(msg.find(where), std::string::npos) << msg;
            for (const Tensor* out : {&loss, &grad})
              for (auto b : out->storage) EXPECT_EQ(b, kSentinel);
          }
          x.set(pos, 0.25);
          v.set(pos, -1e-3);
          Tensor loss = Tensor::make(acc, {}, Layout::contiguous, kSentinel);
          std::string msg;
          EXPECT_TRUE(throws_error([&] { lf::gaussian_nll_forward(x.view, y.view, v.view, {r}, loss.view); },
                                   {ErrorCode::invalid_value}, &msg));
          EXPECT_NE(msg.find("var"), std::string::npos) << msg;
          EXPECT_NE(msg.find(where), std::string::npos) << msg;
          for (auto b : loss.storage) EXPECT_EQ(b, kSentinel);
          v.set(pos, NAN);  // passes the check, as torch's any(var < 0), and gives NaN
          lf::gaussian_nll_forward(x.view, y.view, v.view, {r}, loss.view);
          EXPECT_TRUE(std::isnan(loss.get(0)));
          v.set(pos, 1.0);
          lf::bce_forward(x.view, y.view, {r, std::nullopt}, loss.view);  // all valid again: a finite loss
          EXPECT_TRUE(std::isfinite(loss.get(0)));
        }
      }
    }
  }
}

TEST(PointwiseEdgeErrors, GaussianNegativeVar) {
  namespace lf = lossfuse;
  Tensor x = Tensor::make(DType::f64, {7}), y = Tensor::make(DType::f64, {7}), v = Tensor::make(DType::f64, {7});
  for (int i = 0; i < 7; ++i) v.set(i, 1.0);
  v.set(6, -1e-3);
  Tensor loss = Tensor::make(DType::f64, {7}, Layout::contiguous, kSentinel);
  Tensor gx = Tensor::make(DType::f64, {7}, Layout::contiguous, kSentinel);
  Tensor gv = Tensor::make(DType::f64, {7}, Layout::contiguous, kSentinel);
  std::string msg;
  EXPECT_TRUE(throws_error([&] { lf::gaussian_nll_forward(x.view, y.view, v.view, {Reduction::none}, loss.view); },
                           {ErrorCode::invalid_value}, &msg));
  EXPECT_NE(msg.find("var"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[6]"), std::string::npos) << msg;
  EXPECT_TRUE(throws_error(
      [&] {
        lf::gaussian_nll_backward(x.view, y.view, v.view, std::nullopt, {Reduction::mean}, {gx.view, {}, gv.view});
      },
      {ErrorCode::invalid_value}));
  EXPECT_TRUE(throws_error(
      [&] {
        lf::gaussian_nll_forward_backward(x.view, y.view, v.view, {Reduction::none}, loss.view, {gx.view, {}, gv.view});
      },
      {ErrorCode::invalid_value}, &msg));
  EXPECT_NE(msg.find("[6]"), std::string::npos) << msg;
  for (const Tensor* t : {&loss, &gx, &gv})
    for (auto b : t->storage) EXPECT_EQ(b, kSentinel);
  // NaN var passes the check (torch's any(var < 0)) and gives NaN
  v.set(6, NAN);
  lf::gaussian_nll_forward(x.view, y.view, v.view, {Reduction::none}, loss.view);
  EXPECT_TRUE(std::isnan(loss.get(6)));
}

// Held gradients (PointwiseGrads::held) belong to a backward: a forward_backward call given them is refused, naming
// grads.held, and writes nothing. (run_all checks what a held backward writes, in every spec table.)
TEST(PointwiseEdgeErrors, HeldGradientsRefusedByTheFusedEntry) {
  namespace lf = lossfuse;
  Tensor x = Tensor::make(DType::f32, {5}), y = Tensor::make(DType::f32, {5});
  Tensor loss = Tensor::make(DType::f32, {}, Layout::contiguous, kSentinel);
  Tensor gx = Tensor::make(DType::f32, {5}, Layout::contiguous, kSentinel);
  lf::PointwiseGrads held{gx.view, std::nullopt, std::nullopt};
  held.held = true;
  std::string msg;
  EXPECT_TRUE(throws_error([&] { lf::mse_forward_backward(x.view, y.view, {Reduction::mean}, loss.view, held); },
                           {ErrorCode::invalid_value}, &msg));
  EXPECT_NE(msg.find("grads.held"), std::string::npos) << msg;
  for (const Tensor* t : {&loss, &gx})
    for (auto b : t->storage) EXPECT_EQ(b, kSentinel);
}

// Hard labels (every target exactly 0 or 1) take a one-log path in the SIMD kernels, soft ones two logs: check
// both against the float64 formula over x spanning exact 0 and 1, tiny (subnormal in float32), ordinary and
// next-to-1 values.
TEST(PointwiseEdges, BceHardAndSoftLabelsMatchFormula) {
  namespace lf = lossfuse;
  for (DType dt : {DType::f32, DType::f64, DType::bf16})
    for (bool soft : {false, true}) {
      SCOPED_TRACE(dname(dt));
      SCOPED_TRACE(soft ? "soft labels" : "hard labels");
      const DType acc = acc_dtype(dt);
      const std::int64_t n = 1003;
      Tensor x = Tensor::make(dt, {n}), y = Tensor::make(dt, {n}), loss = Tensor::make(acc, {n});
      Rng rng(77);
      for (std::int64_t i = 0; i < n; ++i) {
        const double u = rng.uniform();
        const double v = i % 5 == 0 ? std::pow(10.0, -40 * u) : i % 5 == 1 ? 1 - std::pow(10.0, -8 * u) : u;
        x.set(i, i % 97 == 3 ? 0.0 : i % 89 == 4 ? 1.0 : v);
        y.set(i, soft ? rng.uniform() : (rng.next() & 1) ? 1.0 : 0.0);
      }
      lf::bce_forward(x.view, y.view, {Reduction::none, std::nullopt}, loss.view);
      const double u = dt == DType::f64 ? 0x1p-52 : 0x1p-23;
      for (std::int64_t i = 0; i < n; ++i) {
        const double xv = x.get(i), yv = y.get(i);
        const double want = -(yv * std::max(std::log(xv), -100.0) + (1 - yv) * std::max(std::log1p(-xv), -100.0));
        EXPECT_NEAR(loss.get(i), want, 4 * u * std::max(std::fabs(want), 1e-30)) << i << " x=" << xv << " y=" << yv;
      }
    }
}

// bce's two logs for soft targets (the s = min(x, 1 - x) kernel on AVX-512, the generic one elsewhere), one at a
// time, over every bfloat16 in [0, 1] and a sweep of float32 bit patterns: each x is placed once with y = 1 (the
// loss is -max(log x, -100)) and once with y = 0 (-max(log1p(-x), -100)) in vectors whose first two lanes hold
// y = 1/2, which keeps the hard-label path out. Checked in ulps of the float32 result against float64.
TEST(PointwiseEdges, BceSoftLabelLogsWithinTwoUlpOverEveryBf16AndAFloatSweep) {
  namespace lf = lossfuse;
  for (DType dt : {DType::bf16, DType::f32}) {
    SCOPED_TRACE(dname(dt));
    std::vector<double> xs;
    auto add_bits = [&xs](std::uint32_t b) {
      float f;
      std::memcpy(&f, &b, sizeof f);
      xs.push_back(static_cast<double>(f));
    };
    if (dt == DType::bf16) {
      for (std::uint32_t b = 0; b <= 0x3f80u; ++b) add_bits(b << 16);
    } else {  // every 997th pattern in [0, 1], and every 13th in [1/2, 1]
      for (std::uint32_t b = 0; b <= 0x3f800000u; b += 997) add_bits(b);
      for (std::uint32_t b = 0x3f000000u; b <= 0x3f800000u; b += 13) add_bits(b);
    }
    // rows of 16: lanes 0 and 1 soft (x = 1/2), then 7 x values with y = 1 and the same 7 with y = 0
    const std::int64_t rows = (static_cast<std::int64_t>(xs.size()) + 6) / 7, n = rows * 16;
    Tensor x = Tensor::make(dt, {n}), y = Tensor::make(dt, {n}), loss = Tensor::make(DType::f32, {n});
    for (std::int64_t r = 0; r < rows; ++r) {
      for (int l = 0; l < 16; ++l) {
        const std::int64_t i = r * 16 + l;
        const auto k = static_cast<std::size_t>(std::min<std::int64_t>(r * 7 + (l + 5) % 7, std::ssize(xs) - 1));
        x.set(i, l < 2 ? 0.5 : xs[k]);
        y.set(i, l < 2 ? 0.5 : l < 9 ? 1.0 : 0.0);
      }
    }
    lf::bce_forward(x.view, y.view, {Reduction::none, std::nullopt}, loss.view);
    double worst = 0;
    std::int64_t worst_i = -1;
    for (std::int64_t i = 0; i < n; ++i) {
      if (i % 16 < 2) continue;
      const double xv = x.get(i);
      const double want = -std::max(y.get(i) == 1.0 ? std::log(xv) : std::log1p(-xv), -100.0);
      const double ulp = want == 0 ? 0x1p-149 : std::ldexp(1.0, std::ilogb(static_cast<float>(want)) - 23);
      const double e = std::fabs(loss.get(i) - want) / ulp;
      if (e > worst) worst = e, worst_i = i;
    }
    EXPECT_LE(worst, 2.0) << "at x = " << x.get(worst_i) << ", y = " << y.get(worst_i);
  }
}

// The reduced forwards of bce and bce_with_logits (their own loops: bce's hard- and soft-label vectors,
// bce_with_logits' log of a product; the per-element formula in tails and on other targets) against a float64 sum
// over the stored values: hard labels only, soft only, blocks of both, confident logits (tiny log1p terms, where a
// product of factors near 1 must keep its multiplies' roundings) and logits of +-1e8 (whose (1 - y) x and
// max(-x, 0) must cancel within the element). Within 1e-4 of the sum of the elements' magnitudes (float32 sums of a
// tile, one lane on the scalar target). Sizes around the 16- and 32-element blocks and past a tile.
TEST(PointwiseEdges, BceReducedForwardsMatchFloat64Sums) {
  namespace lf = lossfuse;
  enum class Kind { hard, soft, mixed, confident, huge };
  for (DType dt : {DType::f32, DType::bf16})
    for (bool logits : {false, true})
      for (Kind kind : {Kind::hard, Kind::soft, Kind::mixed, Kind::confident, Kind::huge})
        for (std::int64_t n : {16, 32, 33, 1000, 16384 * 2 + 37}) {
          if (!logits && (kind == Kind::confident || kind == Kind::huge)) continue;
          SCOPED_TRACE(dname(dt) + (logits ? " bce_with_logits" : " bce") + " kind " +
                       std::to_string(static_cast<int>(kind)) + " n " + std::to_string(n));
          Tensor x = Tensor::make(dt, {n}), y = Tensor::make(dt, {n});
          Rng rng(static_cast<std::uint64_t>(n) * 31 + static_cast<std::uint64_t>(kind));
          for (std::int64_t i = 0; i < n; ++i) {
            const bool hard = kind == Kind::hard || kind == Kind::confident || kind == Kind::huge ||
                              (kind == Kind::mixed && (i / 32) % 2 == 0);
            const double label = (rng.next() & 1) ? 1.0 : 0.0;
            y.set(i, hard ? label : rng.uniform());
            double v = logits ? 3 * rng.normal() : rng.uniform();
            if (kind == Kind::confident) v = (label == 1.0 ? 1 : -1) * (9.0 + 4.0 * rng.uniform());
            if (kind == Kind::huge) v = i % 2 == 0 ? 5.0 : (label == 1.0 ? 1e8 : -1e8);
            x.set(i, v);
          }
          double want = 0, scale = 0;
          for (std::int64_t i = 0; i < n; ++i) {
            const double xv = x.get(i), yv = y.get(i);
            const double l =
                logits ? (1 - yv) * xv + std::max(-xv, 0.0) + std::log1p(std::exp(-std::fabs(xv)))
                       : -(yv * std::max(std::log(xv), -100.0) + (1 - yv) * std::max(std::log1p(-xv), -100.0));
            want += l, scale += std::fabs(l);
          }
          for (Reduction r : {Reduction::sum, Reduction::mean}) {
            Tensor out = Tensor::make(DType::f32, {});
            if (logits) {
              lf::bce_with_logits_forward(x.view, y.view, {r, std::nullopt, std::nullopt}, out.view);
            } else {
              lf::bce_forward(x.view, y.view, {r, std::nullopt}, out.view);
            }
            const double div = r == Reduction::mean ? static_cast<double>(n) : 1.0;
            EXPECT_NEAR(out.get(0), want / div, 1e-4 * scale / div + 1e-30) << (r == Reduction::sum ? "sum" : "mean");
          }
        }
}

}  // namespace
