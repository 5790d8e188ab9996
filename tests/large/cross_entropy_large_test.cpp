// Sizes past 2^31 elements: cross-entropy forward, backward from the saved lse and fused forward+backward in
// bfloat16 on (16400, 131072) logits, 2^31 + 2^21 elements (4.3 GB; 8.6 GB with the gradient; the ctest runs these
// one at a time). Row r is the base row rotated by 13 r, so every row has the same log-sum-exp and the float64
// reference of every loss, their sum and every gradient element is cheap: a kernel whose offsets wrap at 32 bits
// reads or writes the wrong rows from row 16384 on and fails (the mutation is in the issue 34 note).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "lossfuse/lossfuse.hpp"
#include "reference/reference.hpp"

namespace {

using lossfuse::DType;
using lossfuse::TensorView;

constexpr std::int64_t kRows = 16400;
constexpr std::int64_t kClasses = 131072;
constexpr std::int64_t kShift = 13;
static_assert(kRows * kClasses > (std::int64_t{1} << 31));

struct Problem {
  std::vector<std::uint16_t> base;  // one row of bf16 logits
  std::vector<double> base_value;   // the same, as doubles
  std::unique_ptr<std::uint16_t[]> logits{new std::uint16_t[kRows * kClasses]};
  std::vector<std::int64_t> target;
  double lse = 0;  // every row's log-sum-exp

  Problem() : base(kClasses), base_value(kClasses), target(kRows) {
    for (std::int64_t c = 0; c < kClasses; ++c) {
      const double v = 4.0 * std::sin(0.37 * static_cast<double>(c)) + 0.001 * static_cast<double>(c % 1000);
      base[c] = lfref::double_to_bf16_bits(v);
      base_value[c] = lfref::bf16_bits_to_double(base[c]);
    }
    double m = base_value[0];
    for (const double v : base_value) m = std::max(m, v);
    double s = 0;
    for (const double v : base_value) s += std::exp(v - m);
    lse = m + std::log(s);
    for (std::int64_t r = 0; r < kRows; ++r) {
      const std::int64_t shift = (kShift * r) % kClasses;  // row r, class c holds base[(c + shift) % V]
      std::uint16_t* row = logits.get() + r * kClasses;
      std::copy(base.begin() + shift, base.end(), row);
      std::copy(base.begin(), base.begin() + shift, row + (kClasses - shift));
      target[r] = (r * 7919) % kClasses;
    }
  }
  [[nodiscard]] double z(std::int64_t r, std::int64_t c) const {
    return base_value[(c + kShift * r) % kClasses];
  }
  [[nodiscard]] TensorView logits_view() const {
    return TensorView::contiguous(logits.get(), DType::bf16, {kRows, kClasses});
  }
  [[nodiscard]] TensorView target_view() const {
    return TensorView::contiguous(const_cast<std::int64_t*>(target.data()), DType::i64, {kRows});
  }
};

const Problem& problem() {
  static const Problem p;  // built once per process: a ctest case is a process of its own
  return p;
}

// Every gradient element of rows [first, last) against softmax - one_hot (reduction sum, upstream 1), to half a bf16
// ulp of the reference plus a float32 accumulation allowance.
void expect_gradient_rows(const Problem& p, const std::uint16_t* grad, std::int64_t first, std::int64_t last) {
  std::int64_t bad = 0;
  for (std::int64_t r = first; r < last; ++r) {
    for (std::int64_t c = 0; c < kClasses; ++c) {
      const double want = std::exp(p.z(r, c) - p.lse) - (c == p.target[r] ? 1.0 : 0.0);
      const double got = lfref::bf16_bits_to_double(grad[r * kClasses + c]);
      if (std::abs(got - want) > std::ldexp(std::abs(want), -8) + 1e-9 && ++bad <= 5) {
        ADD_FAILURE() << "grad[" << r << ", " << c << "] = " << got << ", expected " << want;
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(CrossEntropyPast2to31, ForwardEveryRowAndTheSum) {
  const Problem& p = problem();
  std::vector<float> loss(kRows);
  std::vector<double> lse(kRows);
  lossfuse::CrossEntropyOptions opt;
  opt.reduction = lossfuse::Reduction::none;
  lossfuse::cross_entropy_forward(p.logits_view(), p.target_view(), opt,
                                  {TensorView::contiguous(loss.data(), DType::f32, {kRows}),
                                   TensorView::contiguous(lse.data(), DType::f64, {kRows}), std::nullopt});
  double want_sum = 0;
  for (std::int64_t r = 0; r < kRows; ++r) {
    const double want = p.lse - p.z(r, p.target[r]);
    want_sum += want;
    ASSERT_NEAR(loss[r], want, 1e-6 * (std::abs(want) + 1)) << "row " << r;
    ASSERT_NEAR(lse[r], p.lse, 2e-6 * std::abs(p.lse)) << "row " << r;
  }
  float sum = 0;
  opt.reduction = lossfuse::Reduction::sum;
  lossfuse::cross_entropy_forward(p.logits_view(), p.target_view(), opt,
                                  {TensorView::contiguous(&sum, DType::f32, {}), std::nullopt, std::nullopt});
  EXPECT_NEAR(sum, want_sum, 1e-5 * std::abs(want_sum));
}

TEST(CrossEntropyPast2to31, BackwardFromTheSavedLseAndFusedWriteTheLastRows) {
  const Problem& p = problem();
  std::unique_ptr<std::uint16_t[]> grad{new std::uint16_t[kRows * kClasses]};
  const TensorView grad_view = TensorView::contiguous(grad.get(), DType::bf16, {kRows, kClasses});
  lossfuse::CrossEntropyOptions opt;
  opt.reduction = lossfuse::Reduction::sum;
  std::vector<double> lse(kRows, p.lse);
  lossfuse::cross_entropy_backward(p.logits_view(), p.target_view(),
                                   TensorView::contiguous(lse.data(), DType::f64, {kRows}), std::nullopt, opt,
                                   grad_view);
  expect_gradient_rows(p, grad.get(), 0, 2);
  expect_gradient_rows(p, grad.get(), 16380, kRows);  // 16384 x 131072 = 2^31: the rows past it

  std::fill_n(grad.get() + (kRows - 4) * kClasses, 4 * kClasses, std::uint16_t{0x7fc0});  // NaN: must be rewritten
  float sum = 0;
  lossfuse::cross_entropy_forward_backward(p.logits_view(), p.target_view(), opt,
                                           {TensorView::contiguous(&sum, DType::f32, {}), std::nullopt,
                                            std::nullopt},
                                           std::nullopt, grad_view);
  expect_gradient_rows(p, grad.get(), 16380, kRows);
  double want_sum = 0;
  for (std::int64_t r = 0; r < kRows; ++r) want_sum += p.lse - p.z(r, p.target[r]);
  EXPECT_NEAR(sum, want_sum, 1e-5 * std::abs(want_sum));
}

}  // namespace
