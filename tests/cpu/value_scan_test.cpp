// cpu::value_scan_passes, the bit tests behind core's whole-array checks (bce's input in [0, 1], gaussian_nll's
// var >= 0), against the float predicates they stand for: every bfloat16 and float16 bit pattern, special and
// random float32 bit patterns, special float64 values, each at the start, middle and end of arrays whose lengths
// cover vector bodies and tails (the suite also runs on every lesser SIMD target).

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cpu/kernels.hpp"
#include "math/half.hpp"

namespace {

using lossfuse::DType;
using lossfuse::cpu::value_scan_passes;
using lossfuse::cpu::ValueScan;

bool unit_ok(double v) { return v >= 0 && v <= 1; }
bool nonneg_ok(double v) { return !(v < 0); }  // NaN passes

// Counts the arrays (one bad-or-good pattern among fillers of 0.5) whose scan disagrees with the predicates.
template <class U>
int mismatches(DType dt, U bits, double value, U half) {
  int bad = 0;
  for (std::int64_t n : {1, 7, 64, 97}) {
    std::vector<U> a(static_cast<std::size_t>(n), half);
    for (std::int64_t pos : {std::int64_t{0}, n / 2, n - 1}) {
      std::fill(a.begin(), a.end(), half);
      a[static_cast<std::size_t>(pos)] = bits;
      if (value_scan_passes(dt, a.data(), n, ValueScan::unit_interval) != unit_ok(value)) ++bad;
      if (value_scan_passes(dt, a.data(), n, ValueScan::non_negative) != nonneg_ok(value)) ++bad;
    }
  }
  return bad;
}

double f32_of(std::uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
double f64_of(std::uint64_t b) {
  double f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

TEST(ValueScan, EveryBfloat16AndFloat16Pattern) {
  int bad_bf16 = 0, bad_f16 = 0;
  for (std::uint32_t u = 0; u < 0x10000u; ++u) {
    const auto h = static_cast<std::uint16_t>(u);
    bad_bf16 += mismatches<std::uint16_t>(DType::bf16, h, lossfuse::math::bf16_to_float(h), 0x3f00u);
    bad_f16 += mismatches<std::uint16_t>(DType::f16, h, lossfuse::math::f16_to_float(h), 0x3800u);
  }
  EXPECT_EQ(bad_bf16, 0);
  EXPECT_EQ(bad_f16, 0);
}

TEST(ValueScan, Float32SpecialAndRandomPatterns) {
  std::vector<std::uint32_t> bits = {0x00000000u, 0x80000000u, 0x00000001u, 0x80000001u, 0x00800000u, 0x80800000u,
                                     0x3f000000u, 0x3f7fffffu, 0x3f800000u, 0x3f800001u, 0xbf800000u, 0x40000000u,
                                     0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u,
                                     0x7f800001u, 0xff800001u, 0xffffffffu, 0x7fffffffu};
  std::mt19937 rng(7);
  for (int i = 0; i < 20000; ++i) bits.push_back(static_cast<std::uint32_t>(rng()));
  int bad = 0;
  for (const std::uint32_t b : bits) bad += mismatches<std::uint32_t>(DType::f32, b, f32_of(b), 0x3f000000u);
  EXPECT_EQ(bad, 0);
}

TEST(ValueScan, Float64SpecialPatterns) {
  const std::vector<std::uint64_t> bits = {
      0x0ull,
      0x8000000000000000ull,
      0x1ull,
      0x8000000000000001ull,
      0x3fe0000000000000ull,
      0x3fefffffffffffffull,
      0x3ff0000000000000ull,
      0x3ff0000000000001ull,
      0xbff0000000000000ull,
      0x7ff0000000000000ull,
      0xfff0000000000000ull,
      0x7ff8000000000000ull,
      0xfff8000000000000ull,
      0x7ff0000000000001ull,
      0xfff0000000000001ull,
      0xffffffffffffffffull,
      0x7fefffffffffffffull,
      0xffefffffffffffffull};
  int bad = 0;
  for (const std::uint64_t b : bits) bad += mismatches<std::uint64_t>(DType::f64, b, f64_of(b), 0x3fe0000000000000ull);
  EXPECT_EQ(bad, 0);
}

TEST(ValueScan, EmptyArraysPass) {
  const float none = 0;
  EXPECT_TRUE(value_scan_passes(DType::f32, &none, 0, ValueScan::unit_interval));
  EXPECT_TRUE(value_scan_passes(DType::f32, &none, 0, ValueScan::non_negative));
}

}  // namespace
