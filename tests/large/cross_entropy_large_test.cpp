// Sizes past 2^31 elements: cross-entropy forward, backward from the saved lse and fused forward+backward in
// bfloat16 on (16400, 131072) logits, 2^31 + 2^21 elements (4.3 GB; 8.6 GB with the gradient; the ctest runs these
// one at a time). Row r is base row r % 3 rotated by 13 r (large/rotated_rows.hpp), so the float64 reference of
// every loss, lse, their sum and every gradient element is cheap, and the three bases' log-sum-exps differ, so a
// kernel that reads another row's lse fails. A kernel whose element offsets are 32-bit overflows from row 16384 on
// and crashes or fails (the mutation is in docs/hardening.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "large/rotated_rows.hpp"
#include "lossfuse/lossfuse.hpp"
#include "reference/reference.hpp"

namespace {

using lossfuse::DType;
using lossfuse::TensorView;

constexpr std::int64_t kRows = 16400;
constexpr std::int64_t kClasses = 131072;
static_assert(kRows * kClasses > (std::int64_t{1} << 31));

double base_logit(double amplitude, std::int64_t c) {
  return amplitude * std::sin(0.37 * static_cast<double>(c)) + 0.001 * static_cast<double>(c % 1000);
}

struct Problem {
  lftest::RotatedRows logits{
      kRows,
      kClasses,
      13,
      {[](std::int64_t c) { return base_logit(4.0, c); }, [](std::int64_t c) { return base_logit(2.5, c); },
       [](std::int64_t c) { return base_logit(6.0, c); }}};
  std::vector<std::int64_t> target;
  std::vector<double> base_lse;  // each base row's log-sum-exp

  Problem() : target(kRows) {
    for (std::size_t k = 0; k < 3; ++k) {
      const std::vector<double>& b = logits.base(k);
      const double m = *std::max_element(b.begin(), b.end());
      double s = 0;
      for (const double v : b) s += std::exp(v - m);
      base_lse.push_back(m + std::log(s));
    }
    for (std::int64_t r = 0; r < kRows; ++r) target[r] = (r * 7919) % kClasses;
  }
  [[nodiscard]] double z(std::int64_t r, std::int64_t c) const { return logits.at(r, c); }
  [[nodiscard]] double lse(std::int64_t r) const { return base_lse[logits.base_of(r)]; }
  [[nodiscard]] TensorView logits_view() const { return logits.view(); }
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
      const double want = std::exp(p.z(r, c) - p.lse(r)) - (c == p.target[r] ? 1.0 : 0.0);
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
    const double want = p.lse(r) - p.z(r, p.target[r]);
    want_sum += want;
    ASSERT_NEAR(loss[r], want, 1e-6 * (std::abs(want) + 1)) << "row " << r;
    ASSERT_NEAR(lse[r], p.lse(r), 2e-6 * std::abs(p.lse(r))) << "row " << r;
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
  std::vector<double> lse(kRows);
  for (std::int64_t r = 0; r < kRows; ++r) lse[r] = p.lse(r);
  lossfuse::cross_entropy_backward(p.logits_view(), p.target_view(),
                                   TensorView::contiguous(lse.data(), DType::f64, {kRows}), std::nullopt, opt,
                                   grad_view);
  expect_gradient_rows(p, grad.get(), 0, 2);
  expect_gradient_rows(p, grad.get(), 16380, kRows);  // 16384 x 131072 = 2^31: the rows past it

  std::fill_n(grad.get() + (kRows - 4) * kClasses, 4 * kClasses, std::uint16_t{0x7fc0});  // NaN: must be rewritten
  float sum = 0;
  lossfuse::cross_entropy_forward_backward(p.logits_view(), p.target_view(), opt,
                                           {TensorView::contiguous(&sum, DType::f32, {}), std::nullopt, std::nullopt},
                                           std::nullopt, grad_view);
  expect_gradient_rows(p, grad.get(), 16380, kRows);
  double want_sum = 0;
  for (std::int64_t r = 0; r < kRows; ++r) want_sum += p.lse(r) - p.z(r, p.target[r]);
  EXPECT_NEAR(sum, want_sum, 1e-5 * std::abs(want_sum));
}

}  // namespace
