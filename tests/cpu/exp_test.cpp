// The vectorized float32 exp of the cross-entropy kernels, swept over its stated valid range.
#include <gtest/gtest.h>

#include <cmath>
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
