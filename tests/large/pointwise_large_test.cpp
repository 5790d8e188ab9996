// Sizes past 2^31 elements for an elementwise loss: mse in bfloat16 on a (16400, 131072) input (2^31 + 2^21
// elements, 4.3 GB; 8.6 GB with its gradient; one at a time under ctest) against a target row broadcast with
// stride 0, reduction sum forward (against a float64 sum of every element) and backward (every gradient element of
// the first rows and of those past element 2^31). Row r of the input is the base row rotated by 13 r, so a wrapped
// offset reads another row's values and changes both.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include "large/rotated_rows.hpp"
#include "lossfuse/lossfuse.hpp"
#include "reference/reference.hpp"

namespace {

using lossfuse::DType;
using lossfuse::TensorView;

constexpr std::int64_t kRows = 16400;
constexpr std::int64_t kCols = 131072;
// the input: row r is the base row rotated by 13 r (large/rotated_rows.hpp)
struct Problem {
  lftest::RotatedRows input{
      kRows, kCols, 13, {[](std::int64_t c) { return 2.0 * std::sin(0.29 * static_cast<double>(c)); }}};
  std::vector<double> target;  // bf16 values, as doubles
  std::vector<std::uint16_t> target_bits;

  Problem() : target(kCols), target_bits(kCols) {
    for (std::int64_t c = 0; c < kCols; ++c) {
      target_bits[c] = lfref::double_to_bf16_bits(std::cos(0.013 * static_cast<double>(c)));
      target[c] = lfref::bf16_bits_to_double(target_bits[c]);
    }
  }
  [[nodiscard]] double x(std::int64_t r, std::int64_t c) const { return input.at(r, c); }
  [[nodiscard]] TensorView input_view() const { return input.view(); }
  [[nodiscard]] TensorView target_view() const {  // one row, broadcast over the rows
    TensorView t = TensorView::contiguous(const_cast<std::uint16_t*>(target_bits.data()), DType::bf16, {kRows, kCols});
    t.strides[0] = 0;
    return t;
  }
};

TEST(MsePast2to31, ForwardSumAndBackwardOfTheLastRows) {
  const Problem p;
  lossfuse::MseOptions opt;
  opt.reduction = lossfuse::Reduction::sum;
  float sum = 0;
  lossfuse::mse_forward(p.input_view(), p.target_view(), opt, TensorView::contiguous(&sum, DType::f32, {}));
  double want = 0;
  for (std::int64_t r = 0; r < kRows; ++r) {
    double row = 0;
    for (std::int64_t c = 0; c < kCols; ++c) row += (p.x(r, c) - p.target[c]) * (p.x(r, c) - p.target[c]);
    want += row;
  }
  // Every target's float32 partial sums are at most 256 terms per lane (src/cpu/pointwise.cpp, kChain). 4e-6 is
  // empirical, not a bound: every target measured 9.2e-7 on this data (the roundings of the terms themselves: 4e-10),
  // and the scalar target's former 16384-term chains 1.2e-5, which it fails. The backward below checks the last rows
  // element by element.
  char err[32];
  std::snprintf(err, sizeof err, "%.3g", std::abs(sum - want) / want);
  RecordProperty("relative_error", err);
  EXPECT_NEAR(sum, want, 4e-6 * want);

  std::unique_ptr<std::uint16_t[]> grad{new std::uint16_t[kRows * kCols]};
  lossfuse::PointwiseGrads grads;
  grads.input = TensorView::contiguous(grad.get(), DType::bf16, {kRows, kCols});
  lossfuse::mse_backward(p.input_view(), p.target_view(), std::nullopt, opt, grads);
  std::int64_t bad = 0;
  for (const std::int64_t r : {std::int64_t{0}, std::int64_t{1}, std::int64_t{16383}, std::int64_t{16384},
                               std::int64_t{16385}, kRows - 2, kRows - 1}) {
    for (std::int64_t c = 0; c < kCols; ++c) {
      const double g = 2.0 * (p.x(r, c) - p.target[c]);
      const double got = lfref::bf16_bits_to_double(grad[r * kCols + c]);
      if (std::abs(got - g) > std::ldexp(std::abs(g), -8) && ++bad <= 5) {
        ADD_FAILURE() << "grad[" << r << ", " << c << "] = " << got << ", expected " << g;
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

}  // namespace
