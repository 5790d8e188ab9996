// The vectorized float32 exp of the cross-entropy kernels, swept over its stated valid range.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/kernels.hpp"

namespace {

// Distance in units in the last place between two finite non-negative floats.
std::int64_t ulp_distance(float a, float b) {
  std::int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return std::llabs(static_cast<std::int64_t>(ia) - ib);
}

TEST(FastExp, AtMostTwoUlpOverValidRange) {
  const int n = 2000003;
  std::vector<float> x(n), y(n);
  const double lo = -87.3, hi = 88.3;
  for (int i = 0; i < n; ++i) x[i] = static_cast<float>(lo + (hi - lo) * i / (n - 1));
  lossfuse::cpu::fast_exp(x.data(), y.data(), n);
  std::int64_t worst = 0;
  float worst_x = 0;
  for (int i = 0; i < n; ++i) {
    if (x[i] < -87.3f) continue;  // the first point may round below the documented bound
    const float exact = static_cast<float>(std::exp(static_cast<double>(x[i])));
    const std::int64_t d = ulp_distance(y[i], exact);
    if (d > worst) {
      worst = d;
      worst_x = x[i];
    }
  }
  EXPECT_LE(worst, 2) << "at x = " << worst_x;
}

TEST(FastExp, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {0.0f, -0.0f, -inf, -87.4f, -100.0f, -1e30f, std::nanf(""), 1.0f, -1.0f};
  std::vector<float> y(x.size());
  lossfuse::cpu::fast_exp(x.data(), y.data(), static_cast<std::int64_t>(x.size()));
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], 1.0f);
  EXPECT_EQ(y[2], 0.0f);
  EXPECT_EQ(y[3], 0.0f);
  EXPECT_EQ(y[4], 0.0f);
  EXPECT_EQ(y[5], 0.0f);
  EXPECT_TRUE(std::isnan(y[6]));
  EXPECT_LE(ulp_distance(y[7], static_cast<float>(std::exp(1.0))), 1);
  EXPECT_LE(ulp_distance(y[8], static_cast<float>(std::exp(-1.0))), 1);
}

}  // namespace

namespace {

// x spread log-uniformly over [lo, hi] (both > 0), n points.
std::vector<float> log_sweep(double lo, double hi, int n) {
  std::vector<float> x(n);
  for (int i = 0; i < n; ++i) x[i] = static_cast<float>(lo * std::pow(hi / lo, static_cast<double>(i) / (n - 1)));
  return x;
}

std::int64_t worst_ulp(const std::vector<float>& x, const std::vector<float>& y, double (*ref)(double), float* at) {
  std::int64_t worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double exact = ref(static_cast<double>(x[i]));
    const float e = static_cast<float>(exact);
    float a = y[i], b = e;
    if ((a < 0) != (b < 0)) return 1 << 30;  // sign error
    a = std::fabs(a), b = std::fabs(b);
    const std::int64_t dist = ulp_distance(a, b);
    if (dist > worst) worst = dist, *at = x[i];
  }
  return worst;
}

TEST(FastLog, AtMostTwoUlpOverPositiveFloats) {
  std::vector<float> x = log_sweep(1.4e-45, 3.4e38, 2000003);  // subnormals to the largest float
  const std::vector<float> near_one = log_sweep(0.5, 2.0, 1000003);
  x.insert(x.end(), near_one.begin(), near_one.end());
  std::vector<float> y(x.size());
  lossfuse::cpu::fast_log(x.data(), y.data(), static_cast<std::int64_t>(x.size()));
  float at = 0;
  EXPECT_LE(worst_ulp(x, y, [](double v) { return std::log(v); }, &at), 2) << "at x = " << at;
  const float one = 1.0f;
  float r = -1;
  lossfuse::cpu::fast_log(&one, &r, 1);
  EXPECT_EQ(r, 0.0f);
}

TEST(FastLog1p, AtMostTwoUlpAboveMinusOne) {
  std::vector<float> x;
  for (float v : log_sweep(1e-30, 1e30, 1000003)) {
    x.push_back(v);
    if (v < 1) x.push_back(-v);  // (-1, 0) too
  }
  std::vector<float> y(x.size());
  lossfuse::cpu::fast_log1p(x.data(), y.data(), static_cast<std::int64_t>(x.size()));
  float at = 0;
  EXPECT_LE(worst_ulp(x, y, [](double v) { return std::log1p(v); }, &at), 2) << "at x = " << at;
}

}  // namespace
