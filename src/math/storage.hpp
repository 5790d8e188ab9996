// lossfuse math: the float storage types, their scalar loads and stores, and the one dtype switch every kernel
// uses to turn a runtime float dtype into a storage type (CPU scalar loops, Highway kernels and the CUDA backend
// pass their own 16-bit types). 16-bit values go through half.hpp (round to nearest even, NaN kept).
#pragma once

#include <cstdint>
#include <type_traits>

#include "lossfuse/dtype.hpp"
#include "math/half.hpp"
#include "math/host_device.hpp"

namespace lossfuse::math {

struct Bf16 {
  std::uint16_t bits;
};
struct F16 {
  std::uint16_t bits;
};

// Accumulation type of a storage type: double for double, float for every other float storage.
template <class T>
using AccOf = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T>
struct Io;
template <>
struct Io<float> {
  using Acc = float;
  LF_HOST_DEVICE static float load(const float* p, std::int64_t i = 0) { return p[i]; }
  LF_HOST_DEVICE static void store(float* p, std::int64_t i, float v) { p[i] = v; }
  LF_HOST_DEVICE static void store(float* p, float v) { *p = v; }
};
template <>
struct Io<double> {
  using Acc = double;
  LF_HOST_DEVICE static double load(const double* p, std::int64_t i = 0) { return p[i]; }
  LF_HOST_DEVICE static void store(double* p, std::int64_t i, double v) { p[i] = v; }
  LF_HOST_DEVICE static void store(double* p, double v) { *p = v; }
};
template <>
struct Io<Bf16> {
  using Acc = float;
  LF_HOST_DEVICE static float load(const Bf16* p, std::int64_t i = 0) { return bf16_to_float(p[i].bits); }
  LF_HOST_DEVICE static void store(Bf16* p, std::int64_t i, float v) { p[i].bits = float_to_bf16(v); }
  LF_HOST_DEVICE static void store(Bf16* p, float v) { p->bits = float_to_bf16(v); }
};
template <>
struct Io<F16> {
  using Acc = float;
  LF_HOST_DEVICE static float load(const F16* p, std::int64_t i = 0) { return f16_to_float(p[i].bits); }
  LF_HOST_DEVICE static void store(F16* p, std::int64_t i, float v) { p[i].bits = float_to_f16(v); }
  LF_HOST_DEVICE static void store(F16* p, float v) { p->bits = float_to_f16(v); }
};

// The dtype switch: fn(T{}) with T = float, double, BF16 or F16 for float32, float64, bfloat16, float16; an integer
// dtype calls nothing. Callers name their 16-bit types (Bf16 / F16 here, hwy::bfloat16_t / hwy::float16_t in the
// Highway kernels); visit_float_dtype below is the scalar loops' form.
template <class BF16, class F16T, class F>
void visit_float_storage(DType t, F&& fn) {
  switch (t) {
    case DType::f32: fn(float{}); return;
    case DType::f64: fn(double{}); return;
    case DType::bf16: fn(BF16{}); return;
    case DType::f16: fn(F16T{}); return;
    default: return;
  }
}

template <class F>
void visit_float_dtype(DType t, F&& fn) {
  visit_float_storage<Bf16, F16>(t, static_cast<F&&>(fn));
}

}  // namespace lossfuse::math
