// exp and log for the inner loops, cheaper than the general hwy::Exp / hwy::Log. Per-target header.
//
// float32: Cody-Waite reduction x = n ln2 + r (|r| <= ln2/2, ln2 split in two parts), a degree-6 polynomial
// for e^r (1 + r (1 + r P(r))), and a multiply by 2^n built in the exponent bits (NaN stays NaN).
// Valid range: x <= 88.3 (the kernels call it on z - max or z - lse, which are <= ~0). Below -87.3 the result
// is exactly 0 (true value < 1.2e-38, lost against the >= 1 sums it joins); -inf gives 0; NaN gives NaN.
// Max error: 2 ulp over [-87.3, 88.3] (swept by tests/cpu/exp_test.cpp).
// float64: hwy::Exp (1 ulp over [-DBL_MAX, 706]), with NaN kept NaN.

#if defined(LOSSFUSE_CPU_HWY_EXP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef LOSSFUSE_CPU_HWY_EXP_INL_H_
#undef LOSSFUSE_CPU_HWY_EXP_INL_H_
#else
#define LOSSFUSE_CPU_HWY_EXP_INL_H_
#endif

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace lossfuse::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class D, HWY_IF_FLOAT(hn::TFromD<D>)>
HWY_INLINE hn::Vec<D> FastExp(D d, hn::Vec<D> x) {
  if constexpr (sizeof(hn::TFromD<D>) == 8) {
    // hwy::Exp maps NaN to 0. (Highway's Ne is an ordered compare on AVX-512: use IsNaN.)
    return hn::IfThenElse(hn::IsNaN(x), x, hn::Exp(d, x));
  } else {
    const hn::RebindToSigned<D> di;
    const auto kMagic = hn::Set(d, 12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
    const auto t = hn::MulAdd(x, hn::Set(d, 1.44269504088896341f), kMagic);
    const auto n = hn::Sub(t, kMagic);
    auto r = hn::NegMulAdd(n, hn::Set(d, 0.693359375f), x);  // ln2 high part, exact product
    r = hn::NegMulAdd(n, hn::Set(d, -2.12194440e-4f), r);    // ln2 low part
    // e^r = 1 + r (1 + r P(r)), P of degree 4 fitted for least relative error on [-ln2/2, ln2/2]: < 1 ulp
    // before the scaling by 2^n, in 6 FMAs.
    auto p = hn::Set(d, 1.381461275741458e-3f);
    p = hn::MulAdd(p, r, hn::Set(d, 8.368710055947304e-3f));
    p = hn::MulAdd(p, r, hn::Set(d, 4.166838899254799e-2f));
    p = hn::MulAdd(p, r, hn::Set(d, 1.666652113199234e-1f));
    p = hn::MulAdd(p, r, hn::Set(d, 4.999999403953552e-1f));
    const auto one = hn::Set(d, 1.0f);
    const auto e_r = hn::MulAdd(hn::MulAdd(p, r, one), r, one);
    // 2^n as a float: (n + 127) << 23, n taken from the low bits of t
    const auto ni = hn::Sub(hn::BitCast(di, t), hn::BitCast(di, kMagic));
    const auto two_n = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(ni, hn::Set(di, 127))));
    const auto y = hn::Mul(e_r, two_n);
    return hn::IfThenZeroElse(hn::Lt(x, hn::Set(d, -87.3f)), y);
  }
}

// log for x > 0 and finite (subnormals included; the callers map 0, negatives, inf and NaN themselves).
// float32: x = 2^e m with m in [sqrt(1/2), sqrt(2)), f = m - 1, log(1 + f) = f - f^2/2 + f^3 P(f) with the
// degree-8 polynomial of Cephes' logf, e ln2 added in two parts. No division. Max error: 2 ulp (swept by
// tests/cpu/exp_test.cpp). float64: hwy::Log.
template <class D, HWY_IF_FLOAT(hn::TFromD<D>)>
HWY_INLINE hn::Vec<D> FastLogPositive(D d, hn::Vec<D> x) {
  if constexpr (sizeof(hn::TFromD<D>) == 8) {
    return hn::Log(d, x);
  } else {
    const hn::RebindToSigned<D> di;
    const auto sub = hn::Lt(x, hn::Set(d, 1.17549435e-38f));
    x = hn::IfThenElse(sub, hn::Mul(x, hn::Set(d, 33554432.0f)), x);  // 2^25: subnormals become normal
    const auto t = hn::Add(hn::BitCast(di, x), hn::Set(di, 0x3f800000 - 0x3f3504f3));
    const auto e = hn::Sub(hn::ShiftRight<23>(t), hn::Set(di, 127));
    const auto m = hn::BitCast(d, hn::Add(hn::And(t, hn::Set(di, 0x007fffff)), hn::Set(di, 0x3f3504f3)));
    const auto ef = hn::Sub(hn::ConvertTo(d, e), hn::IfThenElseZero(sub, hn::Set(d, 25.0f)));
    const auto f = hn::Sub(m, hn::Set(d, 1.0f));
    auto p = hn::Set(d, 7.0376836292e-2f);
    p = hn::MulAdd(p, f, hn::Set(d, -1.1514610310e-1f));
    p = hn::MulAdd(p, f, hn::Set(d, 1.1676998740e-1f));
    p = hn::MulAdd(p, f, hn::Set(d, -1.2420140846e-1f));
    p = hn::MulAdd(p, f, hn::Set(d, 1.4249322787e-1f));
    p = hn::MulAdd(p, f, hn::Set(d, -1.6668057665e-1f));
    p = hn::MulAdd(p, f, hn::Set(d, 2.0000714765e-1f));
    p = hn::MulAdd(p, f, hn::Set(d, -2.4999993993e-1f));
    p = hn::MulAdd(p, f, hn::Set(d, 3.3333331174e-1f));
    const auto f2 = hn::Mul(f, f);
    auto y = hn::Mul(hn::Mul(f2, f), p);
    y = hn::MulAdd(ef, hn::Set(d, -2.12194440e-4f), y);
    y = hn::NegMulAdd(f2, hn::Set(d, 0.5f), y);
    return hn::MulAdd(ef, hn::Set(d, 0.693359375f), hn::Add(f, y));
  }
}

// log1p for a > -1 and finite: log(u) + (a - (u - 1)) / u with u = 1 + a rounded (the correction restores what
// the rounding of u lost). Max error: 2 ulp (swept by tests/cpu/exp_test.cpp).
template <class D, HWY_IF_FLOAT(hn::TFromD<D>)>
HWY_INLINE hn::Vec<D> FastLog1pPositive(D d, hn::Vec<D> a) {
  if constexpr (sizeof(hn::TFromD<D>) == 8) {
    return hn::Log1p(d, a);
  } else {
    const auto one = hn::Set(d, 1.0f);
    const auto u = hn::Add(a, one);
    // 1/u: the hardware estimate (12 or 14 bits) and one Newton step (~24 bits): the correction can be as large
    // as the result itself when a is tiny, so it needs full precision.
    const auto r0 = hn::ApproximateReciprocal(u);
    const auto r1 = hn::Mul(r0, hn::NegMulAdd(u, r0, hn::Set(d, 2.0f)));
    const auto corr = hn::Mul(hn::Sub(a, hn::Sub(u, one)), r1);
    return hn::Add(FastLogPositive(d, u), corr);
  }
}

}  // namespace lossfuse::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
