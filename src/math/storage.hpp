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

LF_HOST_DEVICE float to_float(Bf16 h) { return bf16_to_float(h.bits); }
LF_HOST_DEVICE float to_float(F16 h) { return f16_to_float(h.bits); }
LF_HOST_DEVICE void from_float(float v, Bf16* h) { h->bits = float_to_bf16(v); }
LF_HOST_DEVICE void from_float(float v, F16* h) { h->bits = float_to_f16(v); }

// Scalar loads and stores of storage type T in its accumulation type Acc (p[i], or *p).
template <class T>
struct Io {  // float, double: as they are
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "Io: float, double, Bf16 or F16");
  using Acc = T;
  LF_HOST_DEVICE static T load(const T* p, std::int64_t i = 0) { return p[i]; }
  LF_HOST_DEVICE static void store(T* p, std::int64_t i, T v) { p[i] = v; }
  LF_HOST_DEVICE static void store(T* p, T v) { *p = v; }
};
template <class H>
struct HalfIo {  // Bf16, F16: widened exactly, narrowed by round to nearest even
  using Acc = float;
  LF_HOST_DEVICE static float load(const H* p, std::int64_t i = 0) { return to_float(p[i]); }
  LF_HOST_DEVICE static void store(H* p, std::int64_t i, float v) { from_float(v, p + i); }
  LF_HOST_DEVICE static void store(H* p, float v) { from_float(v, p); }
};
template <>
struct Io<Bf16> : HalfIo<Bf16> {};
template <>
struct Io<F16> : HalfIo<F16> {};

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
