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

#include <cstdint>
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
// 2N bfloat16 values from p as two float vectors, the even-indexed elements and the odd-indexed ones: they load
// as N 32-bit words whose low halves (shifted up) are the even elements and whose high halves (masked) the odd
// ones. Two operations per two vectors, against a widening shuffle and a shift per vector for LoadAcc (on Zen 4
// the shuffle costs about 2 cycles per vector). For sums and maxima, which do not care which lane holds which
// element, and for elementwise results stored back in element order by StoreEvenOdd.
template <class D>
HWY_INLINE void LoadEvenOdd(D d, const hwy::bfloat16_t* p, hn::Vec<D>& even, hn::Vec<D>& odd) {
  static_assert(sizeof(hn::TFromD<D>) == 4, "float lanes");
  const hn::RebindToUnsigned<D> du;
  const auto w = hn::LoadU(du, reinterpret_cast<const std::uint32_t*>(p));
  even = hn::BitCast(d, hn::ShiftLeft<16>(w));
  odd = hn::BitCast(d, hn::And(w, hn::Set(du, 0xffff0000u)));
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
// float lanes rounded to bfloat16 (to nearest even; NaN quieted, sign and payload's top bits kept): the result's
// bits are the high half of each 32-bit lane (the low half is not cleared).
template <class D>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<D>> Bf16High(D /*d*/, hn::Vec<D> v) {
  const hn::RebindToUnsigned<D> du32;
  const auto u = hn::BitCast(du32, v);
  const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du32, 1u));
  const auto rounded = hn::Add(u, hn::Add(hn::Set(du32, 0x7fffu), lsb));
  return hn::IfThenElse(hn::RebindMask(du32, hn::IsNaN(v)), hn::Or(u, hn::Set(du32, 0x400000u)), rounded);
}
template <class D>
HWY_INLINE void StoreAcc(D d, hn::Vec<D> v, hwy::bfloat16_t* p) {
  const hn::Rebind<int32_t, D> di32;
  const hn::Rebind<uint16_t, D> du16;
  const auto bits16 = hn::DemoteTo(du16, hn::BitCast(di32, hn::ShiftRight<16>(Bf16High(d, v))));
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

// The inverse of LoadEvenOdd for a store: [p, p + 2 lanes) = even[0], odd[0], even[1], odd[1], ... rounded to
// bfloat16 as StoreAcc. kHw (AVX-512 with cpu_has_bf16_convert() only): vcvtne2ps2bf16 and one word shuffle, a
// pair holding a subnormal by the integer rounding (see StoreAccPairHw); else the integer rounding of both
// vectors, merged into one store. kStream: p is aligned to the pair's size, and the store is a streaming one.
template <bool kHw, bool kStream, class D>
HWY_INLINE void StoreEvenOdd(D d, hn::Vec<D> even, hn::Vec<D> odd, hwy::bfloat16_t* p) {
  static_assert(sizeof(hn::TFromD<D>) == 4, "float lanes");
#if LOSSFUSE_HWY_BF16_PAIR
  if constexpr (kHw && hn::MaxLanes(D()) == 16) {
    const __mmask16 sub = static_cast<__mmask16>(_mm512_fpclass_ps_mask(even.raw, 0x20) |
                                                 _mm512_fpclass_ps_mask(odd.raw, 0x20));  // 0x20: subnormal
    if (HWY_LIKELY(sub == 0)) {
      __m512i r;
      asm("vcvtne2ps2bf16 %2, %1, %0" : "=v"(r) : "v"(odd.raw), "v"(even.raw));  // words: 16 even, 16 odd
      alignas(64) static constexpr std::uint16_t kIdx[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                             21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                             11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
      r = _mm512_permutexvar_epi16(_mm512_load_si512(kIdx), r);
      if constexpr (kStream) {
        _mm512_stream_si512(reinterpret_cast<__m512i*>(p), r);
      } else {
        _mm512_storeu_si512(p, r);
      }
      return;
    }
  }
#endif
  const hn::RebindToUnsigned<D> du;
  const auto w = hn::Or(hn::ShiftRight<16>(Bf16High(d, even)), hn::And(Bf16High(d, odd), hn::Set(du, 0xffff0000u)));
  auto* q = reinterpret_cast<std::uint32_t*>(p);
  if constexpr (kStream) {
    hn::Stream(w, du, q);
  } else {
    hn::StoreU(w, du, q);
  }
}

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
