// Loads and stores between any floating storage type and the accumulation type, vector and scalar, for the
// Highway kernels. Per-target header (include it after foreach_target.h / highway.h).
//
// bfloat16 stores round to nearest even (Highway's own demotion truncates); float16 stores use the
// hardware conversion where there is one (F16C), which rounds to nearest even. NaN stays NaN.

#if defined(LOSSFUSE_CPU_HWY_IO_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef LOSSFUSE_CPU_HWY_IO_INL_H_
#undef LOSSFUSE_CPU_HWY_IO_INL_H_
#else
#define LOSSFUSE_CPU_HWY_IO_INL_H_
#endif

#include <cstring>

#include "hwy/highway.h"
#include "math/half.hpp"

#ifndef LOSSFUSE_CPU_HWY_IO_ONCE_
#define LOSSFUSE_CPU_HWY_IO_ONCE_
namespace lossfuse::cpu {
// Whether the CPU rounds float32 to bfloat16 in hardware (AVX512_BF16), for StoreAccPairHw below.
inline bool cpu_has_bf16_convert() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has;
#else
  return false;
#endif
}
}  // namespace lossfuse::cpu
#endif

HWY_BEFORE_NAMESPACE();
namespace lossfuse::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class D>
HWY_INLINE hn::Vec<D> LoadAcc(D d, const float* p) {
  return hn::LoadU(d, p);
}
template <class D>
HWY_INLINE hn::Vec<D> LoadAcc(D d, const double* p) {
  return hn::LoadU(d, p);
}
template <class D>
HWY_INLINE hn::Vec<D> LoadAcc(D d, const hwy::bfloat16_t* p) {
  return hn::PromoteTo(d, hn::LoadU(hn::Rebind<hwy::bfloat16_t, D>(), p));
}
// Targets with F16C (AVX2 and better) convert float16 in hardware. Highway 1.0.3 emulates the conversion
// elsewhere and mishandles inf and NaN there, so those targets convert lane by lane with src/math/half.hpp.
#undef LOSSFUSE_HWY_NATIVE_F16
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
#define LOSSFUSE_HWY_NATIVE_F16 1
#else
#define LOSSFUSE_HWY_NATIVE_F16 0
#endif

template <class D>
HWY_INLINE hn::Vec<D> LoadAcc(D d, const hwy::float16_t* p) {
#if LOSSFUSE_HWY_NATIVE_F16
  return hn::PromoteTo(d, hn::LoadU(hn::Rebind<hwy::float16_t, D>(), p));
#else
  HWY_ALIGN float lanes[hn::MaxLanes(d)];
  for (size_t i = 0; i < hn::Lanes(d); ++i) {
    uint16_t b;
    std::memcpy(&b, p + i, 2);
    lanes[i] = lossfuse::math::f16_to_float(b);
  }
  return hn::Load(d, lanes);
#endif
}

template <class D>
HWY_INLINE void StoreAcc(D d, hn::Vec<D> v, float* p) {
  hn::StoreU(v, d, p);
}
template <class D>
HWY_INLINE void StoreAcc(D d, hn::Vec<D> v, double* p) {
  hn::StoreU(v, d, p);
}
template <class D>
HWY_INLINE void StoreAcc(D /*d*/, hn::Vec<D> v, hwy::bfloat16_t* p) {
  const hn::RebindToUnsigned<D> du32;
  const hn::Rebind<int32_t, D> di32;
  const hn::Rebind<uint16_t, D> du16;
  const auto u = hn::BitCast(du32, v);
  const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du32, 1u));
  auto rounded = hn::Add(u, hn::Add(hn::Set(du32, 0x7fffu), lsb));
  const auto is_nan = hn::RebindMask(du32, hn::IsNaN(v));
  rounded = hn::IfThenElse(is_nan, hn::Or(u, hn::Set(du32, 0x400000u)), rounded);
  const auto bits16 = hn::DemoteTo(du16, hn::BitCast(di32, hn::ShiftRight<16>(rounded)));
  hn::StoreU(bits16, du16, reinterpret_cast<uint16_t*>(p));
}
template <class D>
HWY_INLINE void StoreAcc(D d, hn::Vec<D> v, hwy::float16_t* p) {
#if LOSSFUSE_HWY_NATIVE_F16
  (void)d;
  const hn::Rebind<hwy::float16_t, D> df16;
  hn::StoreU(hn::DemoteTo(df16, v), df16, p);
#else
  HWY_ALIGN float lanes[hn::MaxLanes(d)];
  hn::Store(v, d, lanes);
  for (size_t i = 0; i < hn::Lanes(d); ++i) {
    const uint16_t b = lossfuse::math::float_to_f16(lanes[i]);
    std::memcpy(p + i, &b, 2);
  }
#endif
}

// Stores of two vectors at once, [p, p + 2 lanes): the pair is one 64-byte store where the hardware can round
// both to bfloat16 together.
// AVX-512 targets, bfloat16, and only where cpu_has_bf16_convert(): vcvtne2ps2bf16 rounds to nearest even and
// quiets NaN exactly as StoreAcc does, but flushes subnormal inputs to zero, so a pair holding any subnormal
// (rare: values below 1.2e-38) takes StoreAcc's rounding instead. Written as inline assembly, so the target's
// other code needs no AVX512_BF16 and runs on every AVX-512 CPU.
#undef LOSSFUSE_HWY_BF16_PAIR
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
#define LOSSFUSE_HWY_BF16_PAIR 1
// kStream: p is 64-byte aligned, and the store is a streaming (non-temporal) one.
template <bool kStream, class D>
HWY_INLINE void StoreAccPairHw(D d, hn::Vec<D> lo, hn::Vec<D> hi, hwy::bfloat16_t* p) {
  static_assert(hn::MaxLanes(D()) == 16, "16 float lanes");
  const __mmask16 sub = static_cast<__mmask16>(_mm512_fpclass_ps_mask(lo.raw, 0x20) |
                                               _mm512_fpclass_ps_mask(hi.raw, 0x20));  // 0x20: subnormal
  if (HWY_UNLIKELY(sub != 0)) {
    StoreAcc(d, lo, p);
    StoreAcc(d, hi, p + 16);
    return;
  }
  __m512i r;
  // AT&T order: the first source gives the low 16 results
  asm("vcvtne2ps2bf16 %2, %1, %0" : "=v"(r) : "v"(hi.raw), "v"(lo.raw));
  if constexpr (kStream) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(p), r);
  } else {
    _mm512_storeu_si512(p, r);
  }
}
#else
#define LOSSFUSE_HWY_BF16_PAIR 0
#endif

// Scalar conversions.
template <class Acc>
HWY_INLINE Acc ToAcc(float v) {
  return static_cast<Acc>(v);
}
template <class Acc>
HWY_INLINE Acc ToAcc(double v) {
  return static_cast<Acc>(v);
}
template <class Acc>
HWY_INLINE Acc ToAcc(hwy::bfloat16_t v) {
  uint16_t b;
  std::memcpy(&b, &v, 2);
  return static_cast<Acc>(lossfuse::math::bf16_to_float(b));
}
template <class Acc>
HWY_INLINE Acc ToAcc(hwy::float16_t v) {
  uint16_t b;
  std::memcpy(&b, &v, 2);
  return static_cast<Acc>(lossfuse::math::f16_to_float(b));
}

template <class T, class Acc>
HWY_INLINE T FromAcc(Acc v) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    return static_cast<T>(v);
  } else {
    const uint16_t b = std::is_same_v<T, hwy::bfloat16_t> ? lossfuse::math::float_to_bf16(static_cast<float>(v))
                                                         : lossfuse::math::float_to_f16(static_cast<float>(v));
    T t{};
    std::memcpy(&t, &b, 2);
    return t;
  }
}

}  // namespace lossfuse::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
