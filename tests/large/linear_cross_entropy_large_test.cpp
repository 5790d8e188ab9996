// The fused linear loss with N x V past 2^31: (16400, 8) x (131072, 8) float32, reduction sum, gradients of x and W
// in the forward's pass (way 1) and from the saved lse (way 2). Row r of x is the unit vector e_(r mod 8), so row
// r's logits are column r mod 8 of W: 8 distinct log-sum-exps, and the float64 reference of the loss, of every dx
// element and of every dW element is cheap (dW[c, h] = n_h p_hc - #{r : r mod 8 = h, target r = c}).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "lossfuse/lossfuse.hpp"

namespace {

using lossfuse::DType;
using lossfuse::TensorView;

constexpr std::int64_t kRows = 16400;
constexpr std::int64_t kClasses = 131072;
constexpr std::int64_t kHidden = 8;
static_assert(kRows * kClasses > (std::int64_t{1} << 31));

struct Reference {
  std::vector<float> x, w;
  std::vector<std::int64_t> target;
  std::vector<double> lse, p, dx_row, dx_mag, dw;  // lse (H); p (H x V); dx of a row with unit h and the
  // magnitude of its sum, sum_c p |w| (H x H); dW (V x H)
  double loss = 0;

  Reference()
      : x(kRows * kHidden, 0.0f),
        w(kClasses * kHidden),
        target(kRows),
        lse(kHidden),
        p(kHidden * kClasses),
        dx_row(kHidden * kHidden, 0.0),
        dx_mag(kHidden * kHidden, 0.0),
        dw(kClasses * kHidden, 0.0) {
    for (std::int64_t c = 0; c < kClasses; ++c) {
      for (std::int64_t h = 0; h < kHidden; ++h) {
        w[c * kHidden + h] = static_cast<float>(3.0 * std::sin(0.37 * static_cast<double>(c) + 1.1 * h));
      }
    }
    for (std::int64_t h = 0; h < kHidden; ++h) {
      double m = -INFINITY, s = 0;
      for (std::int64_t c = 0; c < kClasses; ++c) m = std::max(m, double{w[c * kHidden + h]});
      for (std::int64_t c = 0; c < kClasses; ++c) s += std::exp(double{w[c * kHidden + h]} - m);
      lse[h] = m + std::log(s);
      for (std::int64_t c = 0; c < kClasses; ++c) {
        p[h * kClasses + c] = std::exp(double{w[c * kHidden + h]} - lse[h]);
        for (std::int64_t j = 0; j < kHidden; ++j) {
          dx_row[h * kHidden + j] += p[h * kClasses + c] * w[c * kHidden + j];
          dx_mag[h * kHidden + j] += p[h * kClasses + c] * std::abs(w[c * kHidden + j]);
        }
      }
    }
    std::vector<std::int64_t> rows_of(kHidden, 0);
    for (std::int64_t r = 0; r < kRows; ++r) {
      const std::int64_t h = r % kHidden;
      x[r * kHidden + h] = 1.0f;
      target[r] = (r * 7919) % kClasses;
      loss += lse[h] - w[target[r] * kHidden + h];
      dw[target[r] * kHidden + h] -= 1.0;
      ++rows_of[h];
    }
    for (std::int64_t c = 0; c < kClasses; ++c) {
      for (std::int64_t h = 0; h < kHidden; ++h) dw[c * kHidden + h] += rows_of[h] * p[h * kClasses + c];
    }
  }
  [[nodiscard]] double dx(std::int64_t r, std::int64_t j) const {
    return dx_row[(r % kHidden) * kHidden + j] - w[target[r] * kHidden + j];
  }
  // dx is a float32 sum of V terms p w (a GEMM's, in its kernel's order), which can cancel: within sqrt(V) units of
  // float32 roundoff of the terms' magnitude (measured: 58 on oneDNN's AVX-512 kernel, 45 on its AVX2 one), far
  // below what a wrong index gives (an error of the order of |dx|).
  [[nodiscard]] double dx_tol(std::int64_t r, std::int64_t j) const {
    const double mag = dx_mag[(r % kHidden) * kHidden + j] + std::abs(w[target[r] * kHidden + j]);
    return 1e-4 * std::abs(dx(r, j)) + std::sqrt(static_cast<double>(kClasses)) * 0x1p-24 * mag;
  }
};

void expect_grads(const Reference& ref, const std::vector<float>& dx, const std::vector<float>& dw) {
  std::int64_t bad = 0;
  for (std::int64_t r = 0; r < kRows; ++r) {
    for (std::int64_t j = 0; j < kHidden; ++j) {
      const double want = ref.dx(r, j);
      if (std::abs(dx[r * kHidden + j] - want) > ref.dx_tol(r, j) && ++bad <= 5) {
        ADD_FAILURE() << "dx[" << r << ", " << j << "] = " << dx[r * kHidden + j] << ", expected " << want;
      }
    }
  }
  for (std::int64_t i = 0; i < kClasses * kHidden; ++i) {
    if (std::abs(dw[i] - ref.dw[i]) > 1e-3 * std::abs(ref.dw[i]) + 1e-6 && ++bad <= 10) {
      ADD_FAILURE() << "dW[" << i / kHidden << ", " << i % kHidden << "] = " << dw[i] << ", expected " << ref.dw[i];
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(LinearCrossEntropyPast2to31, BothWaysMatchTheReference) {
  const Reference ref;
  const TensorView x = TensorView::contiguous(const_cast<float*>(ref.x.data()), DType::f32, {kRows, kHidden});
  const TensorView w = TensorView::contiguous(const_cast<float*>(ref.w.data()), DType::f32, {kClasses, kHidden});
  const TensorView t = TensorView::contiguous(const_cast<std::int64_t*>(ref.target.data()), DType::i64, {kRows});
  lossfuse::LinearCrossEntropyOptions opt;
  opt.ce.reduction = lossfuse::Reduction::sum;
  std::vector<float> dx(kRows * kHidden), dw(kClasses * kHidden);
  std::vector<double> lse(kRows);
  float loss = 0;
  lossfuse::linear_cross_entropy_forward(
      x, w, std::nullopt, t, opt,
      {TensorView::contiguous(&loss, DType::f32, {}), TensorView::contiguous(lse.data(), DType::f64, {kRows}),
       std::nullopt},
      {TensorView::contiguous(dx.data(), DType::f32, {kRows, kHidden}),
       TensorView::contiguous(dw.data(), DType::f32, {kClasses, kHidden}), std::nullopt});
  EXPECT_NEAR(loss, ref.loss, 1e-5 * std::abs(ref.loss));
  for (const std::int64_t r : {std::int64_t{0}, kRows - 1}) EXPECT_NEAR(lse[r], ref.lse[r % kHidden], 1e-5);
  expect_grads(ref, dx, dw);

  std::fill(dx.begin(), dx.end(), NAN);
  std::fill(dw.begin(), dw.end(), NAN);
  lossfuse::linear_cross_entropy_backward(
      x, w, std::nullopt, t, TensorView::contiguous(lse.data(), DType::f64, {kRows}), std::nullopt, opt,
      {TensorView::contiguous(dx.data(), DType::f32, {kRows, kHidden}),
       TensorView::contiguous(dw.data(), DType::f32, {kClasses, kHidden}), std::nullopt});
  expect_grads(ref, dx, dw);
}

}  // namespace
