// Scalar loads and stores between the float storage types and their accumulation type, for the CPU kernels
// that do not use Highway vectors; and the dtype switch that picks the storage type. 16-bit values go through
// src/math/half.hpp (round to nearest even, NaN kept).
#pragma once

#include <cstdint>

#include "lossfuse/dtype.hpp"
#include "math/half.hpp"

namespace lossfuse::cpu {

struct Bf16 {
  std::uint16_t bits;
};
struct F16 {
  std::uint16_t bits;
};

template <class T>
struct Io;
template <>
struct Io<float> {
  using Acc = float;
  static float load(const float* p, std::int64_t i = 0) { return p[i]; }
  static void store(float* p, std::int64_t i, float v) { p[i] = v; }
  static void store(float* p, float v) { *p = v; }
};
template <>
struct Io<double> {
  using Acc = double;
  static double load(const double* p, std::int64_t i = 0) { return p[i]; }
  static void store(double* p, std::int64_t i, double v) { p[i] = v; }
  static void store(double* p, double v) { *p = v; }
};
template <>
struct Io<Bf16> {
  using Acc = float;
  static float load(const Bf16* p, std::int64_t i = 0) { return math::bf16_to_float(p[i].bits); }
  static void store(Bf16* p, std::int64_t i, float v) { p[i].bits = math::float_to_bf16(v); }
  static void store(Bf16* p, float v) { p->bits = math::float_to_bf16(v); }
};
template <>
struct Io<F16> {
  using Acc = float;
  static float load(const F16* p, std::int64_t i = 0) { return math::f16_to_float(p[i].bits); }
  static void store(F16* p, std::int64_t i, float v) { p[i].bits = math::float_to_f16(v); }
  static void store(F16* p, float v) { p->bits = math::float_to_f16(v); }
};

// Calls fn(T{}) with T the storage type of a float dtype (float, double, Bf16, F16); other dtypes: nothing.
template <class F>
void visit_float_dtype(DType t, F&& fn) {
  switch (t) {
    case DType::f32: fn(float{}); return;
    case DType::f64: fn(double{}); return;
    case DType::bf16: fn(Bf16{}); return;
    case DType::f16: fn(F16{}); return;
    default: return;
  }
}

}  // namespace lossfuse::cpu
