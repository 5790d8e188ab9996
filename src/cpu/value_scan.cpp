// Value scans of the elementwise losses' operands: the whole-array checks core makes before anything is written
// (bce's input in [0, 1], gaussian_nll's var >= 0). They test the bits of each element, as unsigned integers of
// its width, so that one vector of bfloat16 is 32 elements and no element is converted:
// - in [0, 1]: the bits are at most those of 1 (negatives, NaN and infinities are above), or are exactly -0;
// - not negative (NaN passes, as torch's any(var < 0)): the bits are not those of a negative number from -0
//   (excluded) to -inf (included), a range that one unsigned compare tests after one subtraction.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/value_scan.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <cstdint>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace lossfuse::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// True when every one of the n words at p passes; one: the bits of 1.0, sign: the sign bit (the bits of -0),
// neg_inf: the bits of -inf.
template <class U>
HWY_INLINE bool AllPass(const U* p, std::int64_t n, bool unit, U one, U sign, U neg_inf) {
  const hn::ScalableTag<U> d;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(d));
  using V = hn::Vec<decltype(d)>;
  const V vone = hn::Set(d, one), vsign = hn::Set(d, sign), vlow = hn::Set(d, static_cast<U>(sign + 1));
  const V vspan = hn::Set(d, static_cast<U>(neg_inf - sign));  // bad: 0 <= bits - (sign + 1) < neg_inf - sign
  V fail = hn::Zero(d);
  std::int64_t i = 0;
  for (; i + N <= n; i += N) {
    const V v = hn::LoadU(d, p + i);
    const auto bad = unit ? hn::AndNot(hn::Eq(v, vsign), hn::Gt(v, vone)) : hn::Lt(hn::Sub(v, vlow), vspan);
    fail = hn::Or(fail, hn::VecFromMask(d, bad));
  }
  if (!hn::AllTrue(d, hn::Eq(fail, hn::Zero(d)))) return false;
  for (; i < n; ++i) {
    const U v = p[i];
    const bool bad = unit ? (v > one && v != sign) : static_cast<U>(v - static_cast<U>(sign + 1)) <
                                                         static_cast<U>(neg_inf - sign);
    if (bad) return false;
  }
  return true;
}

bool ValuesPassU16(const std::uint16_t* p, std::int64_t n, bool unit, std::uint16_t one, std::uint16_t neg_inf) {
  return AllPass<std::uint16_t>(p, n, unit, one, 0x8000u, neg_inf);
}
bool ValuesPassU32(const std::uint32_t* p, std::int64_t n, bool unit) {
  return AllPass<std::uint32_t>(p, n, unit, 0x3f800000u, 0x80000000u, 0xff800000u);
}
bool ValuesPassU64(const std::uint64_t* p, std::int64_t n, bool unit) {
  return AllPass<std::uint64_t>(p, n, unit, 0x3ff0000000000000ull, 0x8000000000000000ull, 0xfff0000000000000ull);
}

}  // namespace lossfuse::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "cpu/kernels.hpp"

namespace lossfuse::cpu {

HWY_EXPORT(ValuesPassU16);
HWY_EXPORT(ValuesPassU32);
HWY_EXPORT(ValuesPassU64);

bool value_scan_passes(DType dtype, const void* data, std::int64_t n, ValueScan scan) {
  const bool unit = scan == ValueScan::unit_interval;
  switch (dtype) {
    case DType::f32:
      return HWY_DYNAMIC_DISPATCH(ValuesPassU32)(static_cast<const std::uint32_t*>(data), n, unit);
    case DType::f64:
      return HWY_DYNAMIC_DISPATCH(ValuesPassU64)(static_cast<const std::uint64_t*>(data), n, unit);
    case DType::bf16:
      return HWY_DYNAMIC_DISPATCH(ValuesPassU16)(static_cast<const std::uint16_t*>(data), n, unit, 0x3f80u, 0xff80u);
    case DType::f16:
      return HWY_DYNAMIC_DISPATCH(ValuesPassU16)(static_cast<const std::uint16_t*>(data), n, unit, 0x3c00u, 0xfc00u);
    default: return false;
  }
}

}  // namespace lossfuse::cpu
#endif  // HWY_ONCE
