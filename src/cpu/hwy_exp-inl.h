// exp for the cross-entropy inner loops, cheaper than the general hwy::Exp. Per-target header.
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

}  // namespace lossfuse::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
