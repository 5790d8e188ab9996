// Reading and writing one element of any lossfuse dtype as a double (floating) or int64 (integer), through
// memcpy so that any alignment is fine. Floating stores round to nearest even (lfref's conversions); integer
// stores wrap like a C cast. Free of GoogleTest: the C++ suite (tests/test_util.hpp) and the fuzz targets
// (fuzz/fuzz_util.hpp) both use it.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "lossfuse/lossfuse.hpp"
#include "reference/reference.hpp"

namespace lftest {

template <class T>
T read_as(const void* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class T>
void write_as(void* p, T v) {
  std::memcpy(p, &v, sizeof v);
}

inline double load(lossfuse::DType t, const void* p) {
  using lossfuse::DType;
  switch (t) {
    case DType::f32: return read_as<float>(p);
    case DType::f64: return read_as<double>(p);
    case DType::f16: return lfref::f16_bits_to_double(read_as<std::uint16_t>(p));
    case DType::bf16: return lfref::bf16_bits_to_double(read_as<std::uint16_t>(p));
    case DType::u8: return read_as<std::uint8_t>(p);
    case DType::i8: return read_as<std::int8_t>(p);
    case DType::i16: return read_as<std::int16_t>(p);
    case DType::i32: return read_as<std::int32_t>(p);
    case DType::i64: return static_cast<double>(read_as<std::int64_t>(p));
  }
  return 0;
}

// A floating dtype's value truncated toward 0; 0 for NaN and values beyond int64.
inline std::int64_t load_int(lossfuse::DType t, const void* p) {
  if (t == lossfuse::DType::i64) return read_as<std::int64_t>(p);
  const double v = load(t, p);
  return std::fabs(v) < 0x1p63 ? static_cast<std::int64_t>(v) : 0;
}

// Floating dtypes only (an integer dtype is left as it was: use store_int).
inline void store(lossfuse::DType t, void* p, double v) {
  using lossfuse::DType;
  switch (t) {
    case DType::f32: return write_as(p, static_cast<float>(v));
    case DType::f64: return write_as(p, v);
    case DType::f16: return write_as(p, lfref::double_to_f16_bits(v));
    case DType::bf16: return write_as(p, lfref::double_to_bf16_bits(v));
    default: return;
  }
}

// Integer dtypes (wrapping like a C cast); a floating dtype gets the value converted.
inline void store_int(lossfuse::DType t, void* p, std::int64_t v) {
  using lossfuse::DType;
  switch (t) {
    case DType::u8: return write_as(p, static_cast<std::uint8_t>(v));
    case DType::i8: return write_as(p, static_cast<std::int8_t>(v));
    case DType::i16: return write_as(p, static_cast<std::int16_t>(v));
    case DType::i32: return write_as(p, static_cast<std::int32_t>(v));
    case DType::i64: return write_as(p, v);
    default: return store(t, p, static_cast<double>(v));
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
