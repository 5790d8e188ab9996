// lossfuse's CUDA emulator (tests/emu/): __half with the conversions src/cuda uses (round to nearest even).
#pragma once

#include <cstdint>
#include <cstring>

#include "cuda_runtime.h"

struct __half {
  std::uint16_t bits;
};

inline float __half2float(__half h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h.bits & 0x8000u) << 16;
  const std::uint32_t exp = (h.bits >> 10) & 0x1fu, man = h.bits & 0x3ffu;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(man), -24);
    if (sign) f = -f;
    return f;
  }
  const std::uint32_t u = sign | (exp == 0x1f ? 0x7f800000u | (man << 13) : ((exp + 112u) << 23) | (man << 13));
  std::memcpy(&f, &u, 4);
  return f;
}

inline __half __float2half_rn(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return {static_cast<std::uint16_t>(sign | 0x7e00u)};   // NaN
  if (a >= 0x477ff000u) return {static_cast<std::uint16_t>(sign | 0x7c00u)};  // rounds to inf
  if (a < 0x38800000u) {  // subnormal or zero in half: a multiple of 2^-24, rounded to nearest even by the FPU
    float v;
    std::memcpy(&v, &a, 4);
    const float scaled = v * 16777216.0f;  // exact
    const auto m = static_cast<std::uint16_t>(std::nearbyint(scaled));
    return {static_cast<std::uint16_t>(sign | m)};
  }
  const std::uint32_t rounded = a + 0xfffu + ((a >> 13) & 1u);
  return {static_cast<std::uint16_t>(sign | ((rounded - 0x38000000u) >> 13))};
}
inline __half __float2half(float f) { return __float2half_rn(f); }
