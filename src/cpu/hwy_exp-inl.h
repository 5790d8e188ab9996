// exp and log for the inner loops, cheaper than the general hwy::Exp / hwy::Log. Per-target header.
//
// float32: Cody-Waite reduction x = n ln2 + r (|r| <= ln2/2, ln2 split in two parts), a degree-6 polynomial
// for e^r (1 + r (1 + r P(r))), and a multiply by 2^n built in the exponent bits (NaN stays NaN).
// Valid range: x <= 88.3 (the kernels call it on z - max or z - lse, which are <= ~0). Below -87.3 the result
// is exactly 0 (true value < 1.2e-38, lost against the >= 1 sums it joins); -inf gives 0; NaN gives NaN.
// Max error: 2 ulp over [-87.3, 88.3] (swept by tests/cpu/hwy_exp_test.cpp). On AVX-512 targets a 16-entry table
// of 2^(j/16) and a degree-3 polynomial instead (avx3::ExpTable: same contract, 3 multiply-adds fewer).
// float64: hwy::Exp (1 ulp over [-DBL_MAX, 706]), with NaN kept NaN.

#if defined(LOSSFUSE_CPU_HWY_EXP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef LOSSFUSE_CPU_HWY_EXP_INL_H_
#undef LOSSFUSE_CPU_HWY_EXP_INL_H_
#else
#define LOSSFUSE_CPU_HWY_EXP_INL_H_
#endif

#include <cstdint>
#include <limits>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace lossfuse::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// AVX-512 targets (16 float lanes, with vgetmant / vgetexp / vpermps / vscalef): log by a 16-entry table, and
// an exp valid over every float.
// u = 2^e m with m in [0.75, 1.5) (getmant / getexp, subnormals included); the top 4 fraction bits of m pick c
// (1 for the two intervals next to 1, else a float near the interval's midpoint chosen so that log c is within
// 1e-4 ulp of a float); r = m / c - 1 = m invc - 1 in one FMA, |r| <= 1/16; log u = e ln2 + log c + log1p(r),
// log1p(r) = r + r^2 Q(r) with Q of degree 3 fitted for least relative error on [-1/32, 1/16] (< 0.1 ulp).
#undef LOSSFUSE_HWY_LOG_TABLE
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
#define LOSSFUSE_HWY_LOG_TABLE 1
namespace avx3 {
alignas(64) constexpr float kInvC[16] = {1.0f,        0.914476097f, 0.864982545f, 0.820661068f,
                                         0.780449152f, 0.744424522f, 0.711086273f, 0.681020498f,
                                         1.30651367f,  1.25516284f,  1.20758951f,  1.16362619f,
                                         1.12307632f,  1.08437932f,  1.04952693f,  1.0f};
alignas(64) constexpr float kLogC[16] = {0.0f,          0.0894039497f,  0.145045951f,   0.197645083f,
                                         0.247885689f,  0.295143813f,   0.340961516f,   0.384162873f,
                                         -0.267362267f, -0.227265313f,  -0.18862623f,   -0.151541159f,
                                         -0.116071634f, -0.0810077637f, -0.0483395196f, 0.0f};
struct Reduced {
  __m512 m, e, invc, logc;
};
HWY_INLINE Reduced Reduce(__m512 u) {
  const __m512 one = _mm512_set1_ps(1.0f);
  Reduced q;
  q.m = _mm512_getmant_ps(u, _MM_MANT_NORM_p75_1p5, _MM_MANT_SIGN_zero);
  // getexp gives floor(log2 u); m < 1 means getmant halved the [1, 2) mantissa: one more in the exponent
  const __m512 e = _mm512_getexp_ps(u);
  q.e = _mm512_mask_add_ps(e, _mm512_cmp_ps_mask(q.m, one, _CMP_LT_OQ), e, one);
  const __m512i idx = _mm512_srli_epi32(_mm512_castps_si512(q.m), 19);  // vpermps reads the low 4 bits
  q.invc = _mm512_permutexvar_ps(idx, _mm512_load_ps(kInvC));
  q.logc = _mm512_permutexvar_ps(idx, _mm512_load_ps(kLogC));
  return q;
}
// e ln2 + log c + log1p(r); ln2 in two parts (e ln2_hi is exact)
HWY_INLINE __m512 Finish(const Reduced& q, __m512 r) {
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(0.188245118f), r, _mm512_set1_ps(-0.250063688f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.333345205f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(-0.5f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(r, r), p, r);
  const __m512 lo = _mm512_fmadd_ps(q.e, _mm512_set1_ps(-2.12194440e-4f), p);
  const __m512 hi = _mm512_fmadd_ps(q.e, _mm512_set1_ps(0.693359375f), q.logc);
  return _mm512_add_ps(hi, lo);
}
// log and log1p for every float, edges as the C library: after the table log of the argument's magnitude, one
// vfixupimmps replaces the lanes whose argument (log1p: 1 + a rounded) is 0 (-inf), negative or -inf (NaN), +inf
// (+inf) or NaN (that NaN, quieted). getmant / getexp never fault on those lanes; their values are discarded.
constexpr int kLogFixup = 0x03530422;  // tokens by class: POS_VALUE and POS_ONE keep, NEG_VALUE 3, +INF 5,
                                       // -INF 3, ZERO 4, SNaN and QNaN 2
template <int kFixup = kLogFixup>
HWY_INLINE __m512 LogAny(__m512 a) {
  const Reduced q = Reduce(a);
  const __m512 l = Finish(q, _mm512_fmsub_ps(q.m, q.invc, _mm512_set1_ps(1.0f)));
  return _mm512_fixupimm_ps(l, a, _mm512_set1_epi32(kFixup), 0);
}
// a log a, 0 at a = 0 (xlogy(a, a)): the log's fixup gives +0 there instead of -inf
HWY_INLINE __m512 XLogX(__m512 a) { return _mm512_mul_ps(a, LogAny<0x03530822>(a)); }
// log1p for a > -1 (finite): u = 1 + a rounded, and what the rounding dropped, delta = (1 + a) - u exactly
// (Knuth's two-sum); r = (u + delta) 2^-e invc - 1 = (m invc - 1) + delta (invc 2^-e), so log1p(a) keeps every
// bit of a. Every other a: the edges of log(1 + a).
HWY_INLINE __m512 Log1pAny(__m512 a) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 u = _mm512_add_ps(a, one);
  const __m512 bb = _mm512_sub_ps(u, a);
  const __m512 delta = _mm512_add_ps(_mm512_sub_ps(a, _mm512_sub_ps(u, bb)), _mm512_sub_ps(one, bb));
  const Reduced q = Reduce(u);
  const __m512 sc = _mm512_scalef_ps(q.invc, _mm512_sub_ps(_mm512_setzero_ps(), q.e));
  const __m512 r = _mm512_fmadd_ps(delta, sc, _mm512_fmsub_ps(q.m, q.invc, one));
  return _mm512_fixupimm_ps(Finish(q, r), u, _mm512_set1_epi32(kLogFixup), 0);
}
// e^x for every float x: as FastExp below (same reduction and polynomial) but the 2^n is applied by vscalef,
// which rounds subnormal results correctly and overflows to +inf on its own. NaN gives NaN, -inf gives 0.
// kNonPositive: the caller passes x <= 0 or -inf and does not need NaN kept (3 operations fewer).
template <bool kNonPositive = false>
HWY_INLINE __m512 ExpAll(__m512 x) {
  // -104 and 89 bound every finite result (e^-104 rounds to 0, e^89 overflows); NaN is put back at the end
  const __m512 xl = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
  const __m512 xc = kNonPositive ? xl : _mm512_min_ps(xl, _mm512_set1_ps(89.0f));
  const __m512 n =
      _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(1.381461275741458e-3f), r, _mm512_set1_ps(8.368710055947304e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.166838899254799e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.666652113199234e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.999999403953552e-1f));
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 e_r = _mm512_fmadd_ps(_mm512_fmadd_ps(p, r, one), r, one);
  const __m512 y = _mm512_scalef_ps(e_r, n);
  if constexpr (kNonPositive) return y;
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), y, x);
}
// e^x for x <= 88.3 (FastExp's contract): x = (16k + j) ln2/16 + r with |r| <= ln2/32, e^x = 2^k 2^(j/16) e^r.
// t = x 16/ln2 + 1.5 * 2^23 holds n = 16k + j in its low bits, so vpermd picks 2^(j/16) by t's bits alone, and
// t << 19 is k << 23 plus j << 19: the table stores the bits of 2^(j/16) less j << 19, and one integer add
// gives the bits of 2^k 2^(j/16). e^r - 1 = r (1 + r (c2 + r c3)), fitted for least relative error on
// [-ln2/32, ln2/32] (0.03 ulp). The result T (1 + p) is rounded once; the table's own rounding (<= 0.5 ulp) adds
// to it. Below -87.3 (k would leave the normal range) the result is 0 by the final FMA's mask; NaN stays NaN.
// 7 multiply-adds against 10 for the polynomial of degree 6 (Zen 4 issues one 512-bit FMA per cycle).
alignas(64) constexpr std::uint32_t kExp2Bits[16] = {
    0x3f800000u, 0x3f7daac3u, 0x3f7b95c2u, 0x3f79c3d3u, 0x3f7837f0u, 0x3f76f532u, 0x3f75fed7u, 0x3f75583fu,
    0x3f7504f3u, 0x3f7508a4u, 0x3f75672au, 0x3f76248cu, 0x3f7744fdu, 0x3f78ccdfu, 0x3f7ac0c7u, 0x3f7d257du};
HWY_INLINE __m512 ExpTable(__m512 x) {
  const __m512 magic = _mm512_set1_ps(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const __m512 t = _mm512_fmadd_ps(x, _mm512_set1_ps(23.08312f), magic);  // 16 / ln2
  const __m512 n = _mm512_sub_ps(t, magic);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.0433349609f), x);  // ln2/16 high part: n hi is exact
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-1.3262153e-5f), r);       // ln2/16 low part
  const __m512i ti = _mm512_castps_si512(t);
  const __m512 scale = _mm512_castsi512_ps(_mm512_add_epi32(
      _mm512_permutexvar_epi32(ti, _mm512_load_si512(kExp2Bits)), _mm512_slli_epi32(ti, 19)));
  __m512 q = _mm512_fmadd_ps(_mm512_set1_ps(0.16666721f), r, _mm512_set1_ps(0.5000162f));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.0f));
  const __m512 p = _mm512_mul_ps(q, r);
  const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_NLT_UQ);  // NaN kept
  return _mm512_maskz_fmadd_ps(keep, scale, p, scale);
}
// e^x for x <= 0 or -inf with results down to the subnormals (NaN gives an unspecified value): the table exp
// unless a lane's result lies below the normal range, which that one flushes to 0.
HWY_INLINE __m512 ExpNonPositiveAll(__m512 x) {
  return _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_LT_OQ) == 0 ? ExpTable(x) : ExpAll<true>(x);
}
}  // namespace avx3
#else
#define LOSSFUSE_HWY_LOG_TABLE 0
#endif

template <class D, HWY_IF_FLOAT(hn::TFromD<D>)>
HWY_INLINE hn::Vec<D> FastExp(D d, hn::Vec<D> x) {
  if constexpr (sizeof(hn::TFromD<D>) == 8) {
    // hwy::Exp maps NaN to 0. (Highway's Ne is an ordered compare on AVX-512: use IsNaN.)
    return hn::IfThenElse(hn::IsNaN(x), x, hn::Exp(d, x));
#if LOSSFUSE_HWY_LOG_TABLE
  } else if constexpr (hn::MaxLanes(D()) == 16) {
    (void)d;
    return hn::Vec<D>{avx3::ExpTable(x.raw)};
#endif
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

// e^x for x <= 0 or -inf (NaN gives an unspecified value): float32 on AVX-512 avx3::ExpAll (results down to the
// subnormals), else hwy::Exp (<= 1 ulp; it gives 0 below about -87.3).
template <class D, HWY_IF_FLOAT(hn::TFromD<D>)>
HWY_INLINE hn::Vec<D> ExpNonPositive(D d, hn::Vec<D> x) {
#if LOSSFUSE_HWY_LOG_TABLE
  if constexpr (sizeof(hn::TFromD<D>) == 4 && hn::MaxLanes(D()) == 16) return hn::Vec<D>{avx3::ExpAll<true>(x.raw)};
#endif
  return hn::Exp(d, hn::Max(x, hn::Set(d, hwy::LowestValue<hn::TFromD<D>>())));
}

// e^x for every x as the C library gives it: NaN stays NaN, +inf and overflow give +inf, -inf gives 0. float32 on
// AVX-512: avx3::ExpTable for vectors within +-87.3, else avx3::ExpAll (<= 2 ulp, subnormal results included);
// elsewhere hwy::Exp inside its valid range.
template <class D, HWY_IF_FLOAT(hn::TFromD<D>)>
HWY_INLINE hn::Vec<D> ExpAny(D d, hn::Vec<D> a) {
  using T = hn::TFromD<D>;
#if LOSSFUSE_HWY_LOG_TABLE
  if constexpr (sizeof(T) == 4 && hn::MaxLanes(D()) == 16) {
    // the table exp (<= 1 ulp, 4 multiply-adds fewer) when every lane's result is normal and finite
    const __mmask16 in = _mm512_cmp_ps_mask(_mm512_abs_ps(a.raw), _mm512_set1_ps(87.3f), _CMP_LE_OQ);
    return hn::Vec<D>{in == 0xffff ? avx3::ExpTable(a.raw) : avx3::ExpAll(a.raw)};
  }
#endif
  // hi: the least value whose exp rounds to +inf (the one below it, lo, is the largest argument passed on)
  const T hi = sizeof(T) == 4 ? T(88.7228394f) : T(709.782712893384);
  const T lo = sizeof(T) == 4 ? T(88.7228317f) : T(709.7827128933838);
  const auto inf = hn::Set(d, std::numeric_limits<T>::infinity());
  const auto r = hn::Exp(d, hn::Min(hn::Max(a, hn::Set(d, hwy::LowestValue<T>())), hn::Set(d, lo)));
  return hn::IfThenElse(hn::IsNaN(a), a, hn::IfThenElse(hn::Ge(a, hn::Set(d, hi)), inf, r));
}

// log for x > 0 and finite (subnormals included; the callers map 0, negatives, inf and NaN themselves).
// float32 on AVX-512: the table above. Elsewhere: x = 2^e m with m in [sqrt(1/2), sqrt(2)), f = m - 1, log(1 + f) = f - f^2/2 + f^3 P(f) with the
// degree-8 polynomial of Cephes' logf, e ln2 added in two parts. No division. Max error: 2 ulp (swept by
// tests/cpu/hwy_exp_test.cpp). float64: hwy::Log.
template <class D, HWY_IF_FLOAT(hn::TFromD<D>)>
HWY_INLINE hn::Vec<D> FastLogPositive(D d, hn::Vec<D> x) {
  if constexpr (sizeof(hn::TFromD<D>) == 8) {
    return hn::Log(d, x);
#if LOSSFUSE_HWY_LOG_TABLE
  } else if constexpr (hn::MaxLanes(D()) == 16) {
    (void)d;
    const avx3::Reduced q = avx3::Reduce(x.raw);
    return hn::Vec<D>{avx3::Finish(q, _mm512_fmsub_ps(q.m, q.invc, _mm512_set1_ps(1.0f)))};
#endif
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
// the rounding of u lost). Max error: 2 ulp (swept by tests/cpu/hwy_exp_test.cpp).
template <class D, HWY_IF_FLOAT(hn::TFromD<D>)>
HWY_INLINE hn::Vec<D> FastLog1pPositive(D d, hn::Vec<D> a) {
  if constexpr (sizeof(hn::TFromD<D>) == 8) {
    return hn::Log1p(d, a);
#if LOSSFUSE_HWY_LOG_TABLE
  } else if constexpr (hn::MaxLanes(D()) == 16) {
    (void)d;
    return hn::Vec<D>{avx3::Log1pAny(a.raw)};  // the fixup leaves a > -1 alone
#endif
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

// log1p for t in [0, 1] (softplus's log1p(e^-|a|)): float32 by one polynomial, no reduction: t + t^2 Q(t), Q of
// degree 8 fitted for least relative error on [0, 1] (0.2 ulp before rounding; t^2 Q is at most 0.44 of the
// result, so the evaluation's roundings stay small). Max error: 1 ulp with FMA, 2 on targets without (swept by
// tests/cpu/hwy_exp_test.cpp).
// float64: FastLog1pPositive.
template <class D, HWY_IF_FLOAT(hn::TFromD<D>)>
HWY_INLINE hn::Vec<D> FastLog1pUnit(D d, hn::Vec<D> t) {
  if constexpr (sizeof(hn::TFromD<D>) == 8) {
    return FastLog1pPositive(d, t);
  } else {
    auto q = hn::Set(d, -0.00324376812f);
    q = hn::MulAdd(q, t, hn::Set(d, 0.0198503137f));
    q = hn::MulAdd(q, t, hn::Set(d, -0.0569574013f));
    q = hn::MulAdd(q, t, hn::Set(d, 0.106034413f));
    q = hn::MulAdd(q, t, hn::Set(d, -0.153054684f));
    q = hn::MulAdd(q, t, hn::Set(d, 0.196758971f));
    q = hn::MulAdd(q, t, hn::Set(d, -0.249541253f));
    q = hn::MulAdd(q, t, hn::Set(d, 0.333299607f));
    q = hn::MulAdd(q, t, hn::Set(d, -0.499999017f));
    return hn::MulAdd(hn::Mul(t, t), q, t);
  }
}

}  // namespace lossfuse::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
