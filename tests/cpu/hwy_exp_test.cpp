// The vectorized float32 exp of the cross-entropy kernels, swept over its stated valid range.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <iostream>
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
  const int n = 20000003;
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
  std::cout << "fast_exp worst error: " << worst << " ulp at " << worst_x << "\n";
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

// The elementwise losses' exp: every float from -110 (results rounding to 0, through the subnormals) to 90
// (overflow), within 2 ulp of the correctly rounded value; NaN, +-inf as the C library.
TEST(ExpAny, AtMostTwoUlpOverEveryFloatAndTheCLibrarysEdges) {
  std::vector<float> x;
  // about 2.5M points, steps of 1e-5 relative (1e-8 near 0); every float of the last few thousand before overflow
  for (float v = -110.0f; v <= 88.7f; v = std::nextafter(v + std::max(std::fabs(v) * 1e-5f, 1e-8f), 100.0f)) {
    x.push_back(v);
  }
  for (float v = 88.7f; v <= 90.0f; v = std::nextafter(v, 100.0f)) x.push_back(v);
  std::vector<float> y(x.size());
  lossfuse::cpu::exp_any(x.data(), y.data(), static_cast<std::int64_t>(x.size()));
  std::int64_t worst = 0;
  float at = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float exact = static_cast<float>(std::exp(static_cast<double>(x[i])));
    const std::int64_t d = std::isinf(exact) ? (std::isinf(y[i]) ? 0 : 1 << 30) : ulp_distance(y[i], exact);
    if (d > worst) worst = d, at = x[i];
  }
  std::cout << "exp_any worst error: " << worst << " ulp at " << at << "\n";
  EXPECT_LE(worst, 2) << "at x = " << at;
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> e = {std::nanf(""), inf, -inf, 89.0f, 1e30f, -1e30f, -std::numeric_limits<float>::max(), 0.0f};
  std::vector<float> r(e.size());
  lossfuse::cpu::exp_any(e.data(), r.data(), static_cast<std::int64_t>(e.size()));
  EXPECT_TRUE(std::isnan(r[0]));
  EXPECT_EQ(r[1], inf);
  EXPECT_EQ(r[2], 0.0f);
  EXPECT_EQ(r[3], inf);
  EXPECT_EQ(r[4], inf);
  EXPECT_EQ(r[5], 0.0f);
  EXPECT_EQ(r[6], 0.0f);
  EXPECT_EQ(r[7], 1.0f);
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

// Every 97th float of a bit-pattern range [first, last] (and the last), as floats.
std::vector<float> pattern_sweep(std::uint32_t first, std::uint32_t last) {
  std::vector<float> x;
  for (std::uint64_t b = first; b <= last; b += 97) {
    float v;
    const auto bits = static_cast<std::uint32_t>(b);
    std::memcpy(&v, &bits, 4);
    x.push_back(v);
  }
  float v;
  std::memcpy(&v, &last, 4);
  x.push_back(v);
  return x;
}

// Every float of [0.5, 2) (where the table-driven log meets its cancellation-free intervals next to 1) and every
// 97th bit pattern of the positive floats, subnormals included.
TEST(FastLog, AtMostTwoUlpOverEveryFloatNearOneAndABitPatternSweep) {
  std::vector<float> x = pattern_sweep(0x00000001u, 0x7f7fffffu);
  for (float v = 0.5f; v < 2.0f; v = std::nextafter(v, 4.0f)) x.push_back(v);
  std::vector<float> y(x.size());
  lossfuse::cpu::fast_log(x.data(), y.data(), static_cast<std::int64_t>(x.size()));
  float at = 0;
  const std::int64_t worst = worst_ulp(x, y, [](double v) { return std::log(v); }, &at);
  std::cout << "fast_log worst error: " << worst << " ulp at " << at << "\n";
  EXPECT_LE(worst, 2) << "at x = " << at;
}

// Every 97th bit pattern of (-1, 0) and of the positive floats, and every float of [-2^-10, 2^-10] at stride 97
// (where log1p(a) ~ a must keep all of a's bits).
TEST(FastLog1p, AtMostTwoUlpOverABitPatternSweep) {
  std::vector<float> x = pattern_sweep(0x00000001u, 0x7f7fffffu);
  for (float v : pattern_sweep(0x80000001u, 0xbf7fffffu)) x.push_back(v);  // -tiny .. -(1 - 2^-24)
  std::vector<float> y(x.size());
  lossfuse::cpu::fast_log1p(x.data(), y.data(), static_cast<std::int64_t>(x.size()));
  float at = 0;
  const std::int64_t worst = worst_ulp(x, y, [](double v) { return std::log1p(v); }, &at);
  std::cout << "fast_log1p worst error: " << worst << " ulp at " << at << "\n";
  EXPECT_LE(worst, 2) << "at x = " << at;
}

// The log1p of [0, 1]: every 97th bit pattern of (0, 1] (subnormals included), every float of [0.5, 1], and the
// two ends.
TEST(FastLog1pUnit, AtMostTwoUlpOverItsRange) {
  std::vector<float> x = pattern_sweep(0x00000001u, 0x3f800000u);
  for (float v = 0.5f; v <= 1.0f; v = std::nextafter(v, 2.0f)) x.push_back(v);
  std::vector<float> y(x.size());
  lossfuse::cpu::fast_log1p_unit(x.data(), y.data(), static_cast<std::int64_t>(x.size()));
  float at = 0;
  const std::int64_t worst = worst_ulp(x, y, [](double v) { return std::log1p(v); }, &at);
  std::cout << "fast_log1p_unit worst error: " << worst << " ulp at " << at << "\n";
  EXPECT_LE(worst, 2) << "at x = " << at;  // 1 with fused multiply-adds, 2 on targets without them
  const float z[2] = {0.0f, 1.0f};
  float r[2];
  lossfuse::cpu::fast_log1p_unit(z, r, 2);
  EXPECT_EQ(r[0], 0.0f);
  EXPECT_LE(ulp_distance(r[1], static_cast<float>(std::log(2.0))), 2);
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
