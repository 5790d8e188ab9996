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
