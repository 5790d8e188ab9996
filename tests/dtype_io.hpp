// Reading and writing one element of any lossfuse dtype as a double (floating) or int64 (integer), through
// memcpy so that any alignment is fine. Floating stores round to nearest even (lfref's conversions); integer
// stores wrap like a C cast. Free of GoogleTest: the C++ suite (tests/test_util.hpp) and the fuzz targets
// (fuzz/fuzz_util.hpp) both use it.
#pragma once

#include <cstdint>
#include <cstring>

#include "lossfuse/lossfuse.hpp"
#include "reference/reference.hpp"

namespace lftest {

inline double load(lossfuse::DType t, const void* p) {
  using lossfuse::DType;
  switch (t) {
    case DType::f32: { float v; std::memcpy(&v, p, 4); return v; }
    case DType::f64: { double v; std::memcpy(&v, p, 8); return v; }
    case DType::f16: { std::uint16_t v; std::memcpy(&v, p, 2); return lfref::f16_bits_to_double(v); }
    case DType::bf16: { std::uint16_t v; std::memcpy(&v, p, 2); return lfref::bf16_bits_to_double(v); }
    case DType::u8: { std::uint8_t v; std::memcpy(&v, p, 1); return v; }
    case DType::i8: { std::int8_t v; std::memcpy(&v, p, 1); return v; }
    case DType::i16: { std::int16_t v; std::memcpy(&v, p, 2); return v; }
    case DType::i32: { std::int32_t v; std::memcpy(&v, p, 4); return v; }
    case DType::i64: { std::int64_t v; std::memcpy(&v, p, 8); return static_cast<double>(v); }
  }
  return 0;
}

inline std::int64_t load_int(lossfuse::DType t, const void* p) {
  if (t != lossfuse::DType::i64) return static_cast<std::int64_t>(load(t, p));
  std::int64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// Floating dtypes only (an integer dtype is left as it was: use store_int).
inline void store(lossfuse::DType t, void* p, double v) {
  using lossfuse::DType;
  switch (t) {
    case DType::f32: { const float f = static_cast<float>(v); std::memcpy(p, &f, 4); return; }
    case DType::f64: std::memcpy(p, &v, 8); return;
    case DType::f16: { const std::uint16_t b = lfref::double_to_f16_bits(v); std::memcpy(p, &b, 2); return; }
    case DType::bf16: { const std::uint16_t b = lfref::double_to_bf16_bits(v); std::memcpy(p, &b, 2); return; }
    default: return;
  }
}

// Integer dtypes; a floating dtype gets the value converted.
inline void store_int(lossfuse::DType t, void* p, std::int64_t v) {
  using lossfuse::DType;
  switch (t) {
    case DType::u8: { const auto b = static_cast<std::uint8_t>(v); std::memcpy(p, &b, 1); return; }
    case DType::i8: { const auto b = static_cast<std::int8_t>(v); std::memcpy(p, &b, 1); return; }
    case DType::i16: { const auto b = static_cast<std::int16_t>(v); std::memcpy(p, &b, 2); return; }
    case DType::i32: { const auto b = static_cast<std::int32_t>(v); std::memcpy(p, &b, 4); return; }
    case DType::i64: std::memcpy(p, &v, 8); return;
    default: store(t, p, static_cast<double>(v)); return;
  }
}

// The same, for element i of a dense array of dtype t at base.
inline void* element(lossfuse::DType t, void* base, std::int64_t i) {
  return static_cast<std::uint8_t*>(base) + i * static_cast<std::int64_t>(lossfuse::dtype_size(t));
}
inline const void* element(lossfuse::DType t, const void* base, std::int64_t i) {
  return static_cast<const std::uint8_t*>(base) + i * static_cast<std::int64_t>(lossfuse::dtype_size(t));
}
inline double load(lossfuse::DType t, const void* base, std::int64_t i) { return load(t, element(t, base, i)); }
inline std::int64_t load_int(lossfuse::DType t, const void* base, std::int64_t i) {
  return load_int(t, element(t, base, i));
}
inline void store(lossfuse::DType t, void* base, std::int64_t i, double v) { store(t, element(t, base, i), v); }
inline void store_int(lossfuse::DType t, void* base, std::int64_t i, std::int64_t v) {
  store_int(t, element(t, base, i), v);
}

}  // namespace lftest
