// lossfuse math: scalar float16 / bfloat16 <-> float conversions, host and device.
//
// Valid range: every bit pattern. Error: widening is exact; narrowing rounds to nearest, ties to even,
// overflows to +-inf as IEEE 754 does, keeps NaN a NaN (quiet) and keeps subnormals.
#pragma once

#include <cstdint>
#include <cstring>

#include "math/host_device.hpp"

namespace lossfuse::math {

LF_HOST_DEVICE std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
LF_HOST_DEVICE float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

LF_HOST_DEVICE float bf16_to_float(std::uint16_t h) { return bits_float(static_cast<std::uint32_t>(h) << 16); }

LF_HOST_DEVICE std::uint16_t float_to_bf16(float f) {
  const std::uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>((u + rounding) >> 16);
}

LF_HOST_DEVICE float f16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp == 0) {
    // zero or subnormal: mant * 2^-24, exact in float
    const float mag = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -mag : mag;
  }
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

LF_HOST_DEVICE std::uint16_t float_to_f16(float f) {
  const std::uint32_t u = float_bits(f);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));  // NaN
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to >= 65536: inf
  if (abs < 0x38800000u) {
    // below the smallest normal half (2^-14): round abs / 2^-24 to an integer, ties to even
    const float mag = bits_float(abs) * 16777216.0f;  // exact scaling by 2^24
    auto q = static_cast<std::uint32_t>(mag);
    const float frac = mag - static_cast<float>(q);
    if (frac > 0.5f || (frac == 0.5f && (q & 1u))) ++q;
    return static_cast<std::uint16_t>(sign | q);
  }
  // normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even
  const std::uint32_t rebiased = abs - (112u << 23);
  const std::uint32_t rounded = rebiased + 0xfffu + ((rebiased >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | (rounded >> 13));
}

}  // namespace lossfuse::math
