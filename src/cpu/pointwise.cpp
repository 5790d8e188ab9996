// CPU kernels of the elementwise losses.
//
// x, y (z, w): the operands, all of one shape, any strides (stride 0 for a broadcast operand); any float dtype
// gx, gy (gz): gradients of that shape (optional); go: the upstream gradient (reduction none)
// z: third operand (bce_with_logits: pos_weight, gaussian_nll: var, margin_ranking: target; x, y = input1,
// input2 there)
// forward: l = w * f(x, y, z) per element, to a contiguous Acc output (none) or per-tile sums in double
// backward: (gx, gy, gz) = d f / d(x, y, z) * w * g; with loss_rows or tile_loss also given, the forward's loss in the
// same pass (the fused entries, g = the reduction's scale)
// The formulas are the structs of src/math/pointwise_math.hpp, evaluated here by HwyOps on vectors of lanes along
// the innermost dim (when every operand's stride there is 0 or 1) and by ScalarOps otherwise and in tails.
// The work is split into tiles of at most p.tile elements of one row; per-tile sums make the reduction order
// independent of the thread count.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/pointwise.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/pointwise_params.hpp"
#include "cpu/hwy_exp-inl.h"
#include "cpu/hwy_io-inl.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "math/pointwise_math.hpp"

HWY_BEFORE_NAMESPACE();
namespace lossfuse::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using core::PwParams;

// The ops policy of src/math/pointwise_math.hpp on Highway vectors.
template <class D>
struct HwyOps {
  using V = hn::Vec<D>;
  using M = hn::Mask<D>;
  using T = hn::TFromD<D>;
  D d;
  HWY_INLINE V set(T v) const { return hn::Set(d, v); }
  HWY_INLINE V add(V a, V b) const { return hn::Add(a, b); }
  HWY_INLINE V sub(V a, V b) const { return hn::Sub(a, b); }
  HWY_INLINE V mul(V a, V b) const { return hn::Mul(a, b); }
  HWY_INLINE V div(V a, V b) const { return hn::Div(a, b); }
  // a / b for b positive and finite. float32 on AVX-512: a times the reciprocal estimate refined by one Newton
  // step (<= 1 ulp more than the quotient), as a division takes 6 cycles a vector there.
  HWY_INLINE V div_pos(V a, V b) const {
#if LOSSFUSE_HWY_LOG_TABLE
    if constexpr (sizeof(T) == 4 && hn::MaxLanes(D()) == 16) {
      const __m512 r0 = _mm512_rcp14_ps(b.raw);
      return V{_mm512_mul_ps(a.raw, _mm512_fmadd_ps(r0, _mm512_fnmadd_ps(b.raw, r0, _mm512_set1_ps(1.0f)), r0))};
    }
#endif
    return hn::Div(a, b);
  }
  HWY_INLINE V neg(V a) const { return hn::Neg(a); }
  HWY_INLINE V abs(V a) const { return hn::Abs(a); }
  HWY_INLINE V min(V a, V b) const { return hn::Min(a, b); }
  HWY_INLINE V max(V a, V b) const { return hn::Max(a, b); }
  HWY_INLINE V sqrt(V a) const { return hn::Sqrt(a); }
  // log, log1p and exp behave as the C library outside Highway's valid ranges, where hwy::Log / Log1p / Exp
  // give garbage or 0: NaN stays NaN, log(0) = log1p(-1) = -inf, log of a negative (log1p below -1) is NaN,
  // log(+inf) = exp(+inf) = +inf, exp(-inf) = 0, exp overflows to +inf.
  HWY_INLINE V Inf() const { return hn::Set(d, std::numeric_limits<T>::infinity()); }
  HWY_INLINE V NaN() const { return hn::Set(d, std::numeric_limits<T>::quiet_NaN()); }
  HWY_INLINE V LogEdges(V a, V r) const {  // a: log's argument (log1p's plus one)
    const V zero = hn::Zero(d);
    r = hn::IfThenElse(hn::Eq(a, zero), hn::Neg(Inf()), r);
    r = hn::IfThenElse(hn::Eq(a, Inf()), a, r);
    return hn::IfThenElse(hn::Or(hn::IsNaN(a), hn::Lt(a, zero)), NaN(), r);
  }
  HWY_INLINE V log(V a) const {
#if LOSSFUSE_HWY_LOG_TABLE
    if constexpr (sizeof(T) == 4 && hn::MaxLanes(D()) == 16) return V{avx3::LogAny(a.raw)};
#endif
    const V safe =
        hn::IfThenElse(hn::Gt(a, hn::Zero(d)), hn::Min(a, hn::Set(d, hwy::HighestValue<T>())), hn::Set(d, T(1)));
    return LogEdges(a, FastLogPositive(d, safe));
  }
  HWY_INLINE V xlogx(V a) const {
#if LOSSFUSE_HWY_LOG_TABLE
    if constexpr (sizeof(T) == 4 && hn::MaxLanes(D()) == 16) return V{avx3::XLogX(a.raw)};
#endif
    return hn::IfThenZeroElse(hn::Eq(a, hn::Zero(d)), hn::Mul(a, log(a)));
  }
  HWY_INLINE V log1p(V a) const {
#if LOSSFUSE_HWY_LOG_TABLE
    if constexpr (sizeof(T) == 4 && hn::MaxLanes(D()) == 16) return V{avx3::Log1pAny(a.raw)};
#endif
    const V one = hn::Set(d, T(1));
    const V safe = hn::IfThenElse(hn::Gt(a, hn::Neg(one)), hn::Min(a, hn::Set(d, hwy::HighestValue<T>())), hn::Zero(d));
    return LogEdges(hn::Add(a, one), FastLog1pPositive(d, safe));
  }
  HWY_INLINE V exp(V a) const { return ExpAny(d, a); }
#if LOSSFUSE_HWY_LOG_TABLE
  // e = e^-|a| in [0, 1].
  static HWY_INLINE __m512 ExpNegAbsAvx3(__m512 a) {
    return avx3::ExpNonPositiveAll(_mm512_or_ps(a, _mm512_set1_ps(-0.0f)));
  }
  // e and r = 1 / (1 + e) by the reciprocal estimate and one Newton step.
  static HWY_INLINE void SigmoidPartsAvx3(__m512 a, __m512& e, __m512& r) {
    e = ExpNegAbsAvx3(a);
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 u = _mm512_add_ps(one, e);
    const __m512 r0 = _mm512_rcp14_ps(u);
    r = _mm512_fmadd_ps(r0, _mm512_fnmadd_ps(u, r0, one), r0);
  }
  // sigmoid(a) from its parts: r, or e r where a < 0; NaN stays NaN.
  static HWY_INLINE __m512 SigmoidOfPartsAvx3(__m512 a, __m512 e, __m512 r) {
    const __m512 s = _mm512_mask_mul_ps(r, _mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_LT_OQ), e, r);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), s, a);
  }
#endif
  // 1 / (1 + e^-a). float32 on AVX-512 in the stable form: e = e^-|a| in [0, 1], r = 1 / (1 + e) by the
  // reciprocal estimate and one Newton step (the quotient's error squared: 2^-28, no division, which takes 6
  // cycles a vector), and e r where a < 0; results down to the subnormals, NaN stays NaN. Elsewhere the quotient.
  HWY_INLINE V sigmoid(V a) const {
#if LOSSFUSE_HWY_LOG_TABLE
    if constexpr (sizeof(T) == 4 && hn::MaxLanes(D()) == 16) {
      __m512 e, r;
      SigmoidPartsAvx3(a.raw, e, r);
      return V{SigmoidOfPartsAvx3(a.raw, e, r)};
    }
#endif
    const V one = hn::Set(d, T(1));
    return hn::Div(one, hn::Add(one, ExpAny(d, hn::Neg(a))));
  }
  // sigmoid(a) and sigmoid(-a), each to full relative accuracy (see ScalarOps::sigmoid_pair): the pieces of
  // sigmoid above, e r and r assigned by a's sign.
  HWY_INLINE void sigmoid_pair(V a, V& s, V& s_neg) const {
#if LOSSFUSE_HWY_LOG_TABLE
    if constexpr (sizeof(T) == 4 && hn::MaxLanes(D()) == 16) {
      __m512 e, r;
      SigmoidPartsAvx3(a.raw, e, r);
      const __m512 er = _mm512_mul_ps(e, r);
      const __mmask16 neg = _mm512_cmp_ps_mask(a.raw, _mm512_setzero_ps(), _CMP_LT_OQ);
      const __mmask16 nan = _mm512_cmp_ps_mask(a.raw, a.raw, _CMP_UNORD_Q);
      s = V{_mm512_mask_blend_ps(nan, _mm512_mask_blend_ps(neg, r, er), a.raw)};
      s_neg = V{_mm512_mask_blend_ps(nan, _mm512_mask_blend_ps(neg, er, r), a.raw)};
      return;
    }
#endif
    const V one = hn::Set(d, T(1));
    const V e = ExpNonPositive(d, hn::Neg(hn::Abs(a)));
    const V r = hn::Div(one, hn::Add(one, e));
    const V er = hn::Mul(e, r);
    const M neg = hn::Lt(a, hn::Zero(d));
    const M nan = hn::IsNaN(a);
    s = hn::IfThenElse(nan, a, hn::IfThenElse(neg, er, r));
    s_neg = hn::IfThenElse(nan, a, hn::IfThenElse(neg, r, er));
  }
  // BCE's -(y max(log x, -100) + (1 - y) max(log1p(-x), -100)) for x in [0, 1] (core checked it: no NaN, no
  // negative, no value above 1, so the edge selects of log and log1p are not needed). When every lane's target is
  // exactly 0 or 1 (hard labels, the common case) one log serves: log x where y = 1, log1p(-x) = log(1 - x) +
  // its rounding correction where y = 0.
  HWY_INLINE V bce_nll(V x, V y) const {
#if LOSSFUSE_HWY_LOG_TABLE
    if constexpr (sizeof(T) == 4 && hn::MaxLanes(D()) == 16) return V{BceNllAvx3(x.raw, y.raw)};
#endif
    const V one = hn::Set(d, T(1));
    const V lo = hn::Set(d, T(-100));
    const M y1 = hn::Eq(y, one);
    if (hn::AllTrue(d, hn::Or(y1, hn::Eq(y, hn::Zero(d))))) {
      const V u = hn::IfThenElse(y1, x, hn::Sub(one, x));  // exact for x in [0.5, 1] (Sterbenz)
      V l = FastLogPositive(d, u);
      if constexpr (sizeof(T) == 4) {
        // log1p(-x) = log(u) + (-x - (u - 1)) / u for the y = 0 lanes (0 where u is 0 or the lane has y = 1).
        const V r0 = hn::ApproximateReciprocal(hn::Max(u, hn::Set(d, T(1e-30))));
        const V r1 = hn::Mul(r0, hn::NegMulAdd(u, r0, hn::Set(d, T(2))));
        const V corr = hn::Mul(hn::Sub(hn::Neg(x), hn::Sub(u, one)), r1);
        l = hn::Add(l, hn::IfThenZeroElse(y1, corr));
      } else {
        l = hn::IfThenElse(y1, l, FastLog1pPositive(d, hn::Neg(x)));
      }
      return hn::Neg(hn::IfThenElse(hn::Eq(u, hn::Zero(d)), lo, hn::Max(l, lo)));  // log 0 = -inf, clamped
    }
    const V lx = hn::IfThenElse(hn::Eq(x, hn::Zero(d)), lo, hn::Max(FastLogPositive(d, x), lo));
    const V l1mx = hn::IfThenElse(hn::Eq(x, one), lo, hn::Max(FastLog1pPositive(d, hn::Neg(x)), lo));
    return hn::Neg(hn::MulAdd(y, lx, hn::Mul(hn::Sub(one, y), l1mx)));
  }
#if LOSSFUSE_HWY_LOG_TABLE
  // bce_nll on AVX-512. Hard labels (every lane's y is 0 or 1): one log, of x where y = 1 and of 1 - x where
  // y = 0, taken from x itself, not from the rounded 1 - x: with u = 1 - x = 2^e m, r = (1 - x) 2^-e invc - 1 =
  // (sc - 1) - x sc for sc = invc 2^-e, where sc - 1 is exact (Sterbenz for sc in [1/2, 2]; sc < 2^24 on a grid of
  // at most 1 otherwise) and the FMA rounds once. x = 0 (or 1) makes its log NaN or -inf, and max of either with
  // -100 is -100 (vmaxps returns its second operand for a NaN). Other targets: both logs, by BceLogsAvx3.
  static HWY_INLINE __m512 BceNllAvx3(__m512 x, __m512 y) {
    const __m512 one = _mm512_set1_ps(1.0f);
    const __mmask16 y1 = _mm512_cmp_ps_mask(y, one, _CMP_EQ_OQ);
    if (_kor_mask16(y1, _mm512_cmp_ps_mask(y, _mm512_setzero_ps(), _CMP_EQ_OQ)) == 0xffff) return BceHardAvx3(x, y1);
    __m512 ls, lc;
    const __mmask16 hi = BceLogsAvx3(x, ls, lc);
    const __m512 lx = _mm512_mask_blend_ps(hi, ls, lc), l1mx = _mm512_mask_blend_ps(hi, lc, ls);
    return _mm512_fnmsub_ps(y, lx, _mm512_mul_ps(_mm512_sub_ps(one, y), l1mx));  // -(y lx) - (1 - y) l1mx
  }
  // the hard-label loss; y1: the lanes whose target is 1 (the others' is 0)
  static HWY_INLINE __m512 BceHardAvx3(__m512 x, __mmask16 y1) {
    const __m512 one = _mm512_set1_ps(1.0f);
    const avx3::Reduced q = avx3::Reduce(_mm512_mask_blend_ps(y1, _mm512_sub_ps(one, x), x));
    const __m512 sc = _mm512_scalef_ps(q.invc, _mm512_sub_ps(_mm512_setzero_ps(), q.e));
    const __m512 r = _mm512_mask_blend_ps(y1, _mm512_fnmadd_ps(x, sc, _mm512_sub_ps(sc, one)),
                                          _mm512_fmsub_ps(q.m, q.invc, one));
    return _mm512_sub_ps(_mm512_setzero_ps(), _mm512_max_ps(avx3::Finish(q, r), _mm512_set1_ps(-100.0f)));
  }
  // log1p(r) for |r| <= 0.0162: Taylor to r^4 (the truncation, r^5 / 5, is below 0.25 ulp of r)
  static HWY_INLINE __m512 Log1pSmallAvx3(__m512 r) {
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(-0.25f), r, _mm512_set1_ps(0.333333343f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(-0.5f));
    return _mm512_fmadd_ps(_mm512_mul_ps(r, r), p, r);
  }
  // t[idx & 31] for a 32-entry table
  static HWY_INLINE __m512 Lookup32(const float* t, __m512i idx) {
    return _mm512_permutex2var_ps(_mm512_load_ps(t), idx, _mm512_load_ps(t + 16));
  }
  // max(log x, -100) and max(log(1 - x), -100) for x in [0, 1], from s = min(x, 1 - x), which is exact (x below
  // 1/2; Sterbenz above), and the two logs of that one number on their fixed ranges:
  // - log s for s in [0, 1/2]: s = 2^e m, m in [1, 2) (getexp / getmant, subnormals included); the top 5 fraction
  //   bits of m pick invc ~ 1/c for c near the interval's middle and log c = -log invc, r = m invc - 1 in one FMA,
  //   |r| <= 1/64; log s = e ln2 + log c + log1p(r). s = 0 gives -inf, clamped to -100.
  //   (Both tables: invc of 14 bits, picked near 1/c so that log c lies within 0.1 ulp of the float stored.)
  // - log(1 - s) for 1 - s in [1/2, 1], with no exponent step: j = round(62 s) picks invc ~ 1 / (1 - j/62) and
  //   log c, r = (1 - s) invc - 1 = (invc - 1) - s invc in one FMA from s itself (invc - 1 is exact), so 1 - s is
  //   never rounded; |r| <= 0.0162. Never below log(1/2): no clamp.
  // Returns the lanes where x > 1/2, whose log x is log(1 - s) and log(1 - x) is log s (the other way round
  // elsewhere). About 25 vector operations for both logs, against about 40 for two table logs with their exponent
  // steps.
  static HWY_INLINE __mmask16 BceLogsAvx3(__m512 x, __m512& ls, __m512& lc) {
    alignas(64) static constexpr float kMantInvC[32] = {
        0.984313965f, 0.954650879f, 0.92791748f, 0.900878906f, 0.876281738f, 0.853149414f, 0.831665039f,
        0.810424805f, 0.790771484f, 0.77154541f, 0.752746582f, 0.736083984f, 0.718811035f, 0.703308105f,
        0.688110352f, 0.673278809f, 0.660400391f, 0.64630127f, 0.634338379f, 0.622070312f, 0.609802246f,
        0.597412109f, 0.58782959f, 0.577331543f, 0.566467285f, 0.556213379f, 0.547058105f, 0.538330078f,
        0.528747559f, 0.520446777f, 0.511901855f, 0.504272461f};
    alignas(64) static constexpr float kMantLogC[32] = {
        0.015810363f, 0.0464095771f, 0.0748124719f, 0.10438443f, 0.132067621f, 0.158820584f, 0.184325516f,
        0.210196719f, 0.234746248f, 0.259359747f, 0.284026653f, 0.306411058f, 0.330156773f, 0.351960212f,
        0.373806059f, 0.395595759f, 0.414908975f, 0.436489522f, 0.455172747f, 0.47470215f, 0.494620562f,
        0.515148103f, 0.531318188f, 0.549338579f, 0.56833595f, 0.586603284f, 0.603200257f, 0.619283378f,
        0.637244165f, 0.653067648f, 0.669622362f, 0.68463856f};
    alignas(64) static constexpr float kCompInvC[32] = {
        1.0f, 1.01501465f, 1.0345459f, 1.04956055f, 1.06811523f, 1.08666992f, 1.10803223f, 1.12634277f, 1.14770508f,
        1.17102051f, 1.19262695f, 1.21484375f, 1.24108887f, 1.26647949f, 1.29174805f, 1.31970215f, 1.34729004f,
        1.37890625f, 1.40820312f, 1.44055176f, 1.47753906f, 1.51306152f, 1.54882812f, 1.58947754f, 1.63085938f,
        1.67626953f, 1.7220459f, 1.7713623f, 1.82446289f, 1.87768555f, 1.93725586f, 2.0f};
    alignas(64) static constexpr float kCompLogC[32] = {
        0.0f, -0.0149030443f, -0.033962585f, -0.0483715497f, -0.0658956319f, -0.0831179023f, -0.102585673f,
        -0.1189759f, -0.137764364f, -0.157875597f, -0.176158398f, -0.194615468f, -0.215989113f, -0.236240998f,
        -0.255996376f, -0.277406067f, -0.298095196f, -0.321290612f, -0.342314512f, -0.365026206f, -0.390377909f,
        -0.414135098f, -0.437498599f, -0.463405371f, -0.489107102f, -0.516570807f, -0.54351306f, -0.571748912f,
        -0.601285636f, -0.63003993f, -0.661272466f, -0.693147182f};
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 s = _mm512_min_ps(x, _mm512_sub_ps(one, x));
    const __m512 m = _mm512_getmant_ps(s, _MM_MANT_NORM_1_2, _MM_MANT_SIGN_zero);
    const __m512i jm = _mm512_srli_epi32(_mm512_castps_si512(m), 18);  // vpermt2ps reads the low 5 bits
    const __m512 rm = _mm512_fmsub_ps(m, Lookup32(kMantInvC, jm), one);
    ls = _mm512_max_ps(
        _mm512_add_ps(_mm512_fmadd_ps(_mm512_getexp_ps(s), _mm512_set1_ps(0.693147182f), Lookup32(kMantLogC, jm)),
                      Log1pSmallAvx3(rm)),
        _mm512_set1_ps(-100.0f));
    const __m512i jc = _mm512_castps_si512(_mm512_fmadd_ps(s, _mm512_set1_ps(62.0f), _mm512_set1_ps(12582912.0f)));
    const __m512 invc = Lookup32(kCompInvC, jc);
    lc = _mm512_add_ps(Lookup32(kCompLogC, jc),
                       Log1pSmallAvx3(_mm512_fnmadd_ps(s, invc, _mm512_sub_ps(invc, one))));
    return _mm512_cmp_ps_mask(x, _mm512_set1_ps(0.5f), _CMP_GT_OQ);
  }
  // acc plus the bce losses of x, y: by BceHardAvx3 when `hard` (every target is 0 or 1), else both logs, each
  // times its weight, subtracted by one FMA apiece (masked subtractions make the weights: no blend of the logs).
  static HWY_INLINE __m512 BceSubLossesAvx3(__m512 acc, __m512 x, __m512 y, bool hard) {
    const __m512 one = _mm512_set1_ps(1.0f);
    if (hard) return _mm512_add_ps(acc, BceHardAvx3(x, _mm512_cmp_ps_mask(y, one, _CMP_EQ_OQ)));
    __m512 ls, lc;
    const __mmask16 hi = BceLogsAvx3(x, ls, lc);
    acc = _mm512_fnmadd_ps(_mm512_mask_sub_ps(y, _knot_mask16(hi), one, y), lc, acc);  // 1 - y where x <= 1/2
    return _mm512_fnmadd_ps(_mm512_mask_sub_ps(y, hi, one, y), ls, acc);                 // 1 - y where x > 1/2
  }
#endif
  // log(1 + e^a) without overflow: max(a, 0) + log1p(exp(-|a|)); NaN stays NaN. exp(-|a|) lies in [0, 1] for
  // every non-NaN a (an infinite a gives 0), so neither exp's nor log1p's edge handling is needed (and log1p of
  // [0, 1] is one polynomial): one select for NaN at the end.
  HWY_INLINE V softplus(V a) const {
    return hn::IfThenElse(hn::IsNaN(a), a, hn::Add(hn::Max(a, hn::Zero(d)), log1p_exp_neg_abs(a)));
  }
  // log1p(exp(-|a|)) for a not NaN (NaN gives an unspecified value: the callers' other terms carry it)
  HWY_INLINE V log1p_exp_neg_abs(V a) const {
    V e;
#if LOSSFUSE_HWY_LOG_TABLE
    if constexpr (sizeof(T) == 4 && hn::MaxLanes(D()) == 16) {
      e = V{ExpNegAbsAvx3(a.raw)};
    } else
#endif
    {
      e = ExpNonPositive(d, hn::Neg(hn::Abs(a)));
    }
    return FastLog1pUnit(d, e);
  }
  HWY_INLINE M lt(V a, V b) const { return hn::Lt(a, b); }
  HWY_INLINE M le(V a, V b) const { return hn::Le(a, b); }
  HWY_INLINE M eq(V a, V b) const { return hn::Eq(a, b); }
  HWY_INLINE V select(M m, V a, V b) const { return hn::IfThenElse(m, a, b); }
  // (a > 0) - (a < 0): 0 for 0 and for NaN, as torch.sign and ScalarOps::sign
  HWY_INLINE V sign(V a) const {
    const V one = hn::Set(d, T(1));
    return hn::Sub(hn::IfThenElseZero(hn::Gt(a, hn::Zero(d)), one), hn::IfThenElseZero(hn::Lt(a, hn::Zero(d)), one));
  }
};

// The formulas of src/math/pointwise_math.hpp, compiled for this target.
namespace lm {
#include "math/pointwise_losses.inc"  // NOLINT(bugprone-suspicious-include)
}  // namespace lm

// What a loss reads besides x and y, and the value check its reduced forward can be asked for (the contiguous
// loops below are compiled for these; any other combination takes the general loop).
template <class Loss>
constexpr bool kLossUsesZ = false;
template <>
constexpr bool kLossUsesZ<lm::BceWithLogitsLoss<true>> = true;
template <>
constexpr bool kLossUsesZ<lm::GaussianNllLoss> = true;
template <>
constexpr bool kLossUsesZ<lm::MarginRankingLoss> = true;
template <class Loss>
constexpr core::PwCheck kLossCheck = core::PwCheck::none;
template <>
constexpr core::PwCheck kLossCheck<lm::BceLoss> = core::PwCheck::x_unit_interval;
template <>
constexpr core::PwCheck kLossCheck<lm::GaussianNllLoss> = core::PwCheck::z_nonnegative;

// The reduced forward of bce_with_logits without pos_weight, float lanes: the sum of (1 - y) x + max(-x, 0) +
// log1p(e), e = e^-|x| in [0, 1], with the log1p terms summed as the log of their product, so that an element
// costs one exp and no log. q = 1 + e in [1, 2] is rounded; what the rounding dropped, delta = e - (q - 1)
// (exact), is added to the sum in place of log1p(delta / q) (error delta (1 - 1/q) <= 2^-24 log1p(e), so tiny e
// keep every bit); so is each multiply's rounding (found by an FMA, added as its ratio to the product). Each lane's
// product of kFold factors stays below 2^kFold and is folded into the sum by one log. Infinite and NaN x or y give
// what the per-element formula gives: NaN from (1 - y) x, or -inf + inf.
template <class D>
struct SoftplusProductSum {
  using V = hn::Vec<D>;
  static constexpr int kFold = 64;
  D d;
  V sum, prod, corr;
  int since = 0;
  SoftplusProductSum(D d_, V start) : d(d_), sum(start), prod(hn::Set(d_, 1.0f)), corr(hn::Zero(d_)) {}
  HWY_INLINE void add(V x, V y) {
#if LOSSFUSE_HWY_LOG_TABLE
    if constexpr (hn::MaxLanes(D()) == 16) {
      add(x, y, V{HwyOps<D>::ExpNegAbsAvx3(x.raw)});
      return;
    }
#endif
    add(x, y, ExpNonPositive(d, hn::Neg(hn::Abs(x))));
  }
  // The same with e = e^-|x| given.
  HWY_INLINE void add(V x, V y, V e) {
    const V one = hn::Set(d, 1.0f);
    const V q = hn::Add(one, e);
    // the element's linear terms first, (1 - y) x + max(-x, 0) in one FMA, so that large |x| cancel within it (to 0
    // for hard labels), and only then delta, which a large term would absorb
    const V lin = hn::MulSub(hn::Sub(one, y), x, hn::Min(x, hn::Zero(d)));
    sum = hn::Add(sum, hn::Add(lin, hn::Sub(e, hn::Sub(q, one))));
    const V p = hn::Mul(prod, q);
    // what the product's rounding dropped, relative to it (prod q - p exactly, by an FMA, over p): added to the sum
    // in place of log1p of it, so a product of factors near 1 (tiny e: confident logits) keeps every bit
    corr = hn::MulAdd(hn::MulAdd(prod, q, hn::Neg(p)), hn::ApproximateReciprocal(p), corr);
    prod = p;
    if (++since == kFold) fold();
  }
  HWY_INLINE V fold() {
    sum = hn::Add(sum, hn::Add(FastLogPositive(d, prod), corr));
    prod = hn::Set(d, 1.0f);
    corr = hn::Zero(d);
    since = 0;
    return sum;
  }
};

// The vector part [0, n) of one tile (n a multiple of the lane count) when every operand present is contiguous
// along the row and there is no weight: the general loop's per-vector tests of stride, weight and mode are hoisted
// out, leaving the loads, the formula and the store or sum. x..gz point at the block's first element.
template <class Loss, class T, class Acc, class D>
HWY_INLINE void ContiguousTile(D d, const PwParams& p, const math::PwConsts<Acc>& k, std::int64_t n, const T* x,
                               const T* y, const T* z, T* gx, T* gy, T* gz, const Acc* go, Acc* rows,
                               hn::Vec<D>& vl, hn::Mask<D>& bad) {
  using V = hn::Vec<D>;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(d));
  const HwyOps<D> vo{d};
  auto zload = [&](std::int64_t j) -> V {
    if constexpr (kLossUsesZ<Loss>) {
      return LoadAcc(d, z + j);
    } else {
      (void)j;
      return hn::Zero(d);
    }
  };
  if (!p.backward) {
    if (rows != nullptr) {
      for (std::int64_t j = 0; j < n; j += N) {
        hn::StoreU(Loss::value(vo, k, LoadAcc(d, x + j), LoadAcc(d, y + j), zload(j)), d, rows + j);
      }
      return;
    }
    // x in [0, 1] for float32: its bits, unsigned, are at most those of 1.0f; NaN and negatives are above (so is
    // -0, a valid input: the flag is conservative, and core's exact scan has the last word). One max per vector.
    constexpr bool kBitsCheck = kLossCheck<Loss> == core::PwCheck::x_unit_interval && sizeof(Acc) == 4;
    const hn::RebindToUnsigned<D> du;
    auto max_bits = hn::Zero(du);
    auto step = [&](V xv, V yv, V zv) {
      if constexpr (kBitsCheck) {
        max_bits = hn::Max(max_bits, hn::BitCast(du, xv));
      } else if constexpr (kLossCheck<Loss> == core::PwCheck::x_unit_interval) {
        bad = hn::Or(bad, hn::Not(hn::And(hn::Ge(xv, hn::Zero(d)), hn::Le(xv, hn::Set(d, Acc(1))))));
      } else if constexpr (kLossCheck<Loss> == core::PwCheck::z_nonnegative) {
        bad = hn::Or(bad, hn::Lt(zv, hn::Zero(d)));
      }
      vl = hn::Add(vl, Loss::value(vo, k, xv, yv, zv));
    };
    std::int64_t j = 0;
    // (only where MulAdd is a fused multiply-add: the product's rounding is found by one)
    if constexpr (std::is_same_v<Loss, lm::BceWithLogitsLoss<false>> && sizeof(Acc) == 4 && HWY_NATIVE_FMA) {
      SoftplusProductSum<D> acc(d, vl);
      if constexpr (std::is_same_v<T, hwy::bfloat16_t> && HWY_TARGET != HWY_SCALAR) {
        for (; j + 2 * N <= n; j += 2 * N) {
          V x0, x1, y0, y1;
          LoadEvenOdd(d, x + j, x0, x1);
          LoadEvenOdd(d, y + j, y0, y1);
          acc.add(x0, y0);
          acc.add(x1, y1);
        }
      }
      for (; j < n; j += N) acc.add(LoadAcc(d, x + j), LoadAcc(d, y + j));
      vl = acc.fold();
      return;
    }
#if LOSSFUSE_HWY_LOG_TABLE
    if constexpr (std::is_same_v<Loss, lm::BceLoss> && hn::MaxLanes(D()) == 16 && sizeof(Acc) == 4 &&
                  (std::is_same_v<T, float> || std::is_same_v<T, hwy::bfloat16_t>)) {
      // bce on AVX-512: HwyOps::BceSubLossesAvx3 on each vector. bfloat16 by pairs of vectors (32 elements in one
      // load per operand), with the range check of x and the hard-label test of y made on the 32 raw words at once
      // (x in [0, 1]: its bits, unsigned, at most those of 1; hard: every word is +0 or 1, so -0 takes the general
      // path, which is right for it too). float32: the same tests on the 16 float lanes.
      const __m512 one = _mm512_set1_ps(1.0f);
      __m512 acc = vl.raw;
      bool over = false;
      if constexpr (std::is_same_v<T, hwy::bfloat16_t>) {
        const __m512i one16 = _mm512_set1_epi16(0x3f80), hi16 = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
        __m512i max_bits = _mm512_setzero_si512();
        for (; j + 2 * N <= n; j += 2 * N) {
          const __m512i wx = _mm512_loadu_si512(x + j), wy = _mm512_loadu_si512(y + j);
          max_bits = _mm512_max_epu16(max_bits, wx);
          const bool hard =
              (_mm512_cmpeq_epi16_mask(wy, one16) | _mm512_cmpeq_epi16_mask(wy, _mm512_setzero_si512())) == 0xffffffffu;
          acc = HwyOps<D>::BceSubLossesAvx3(acc, _mm512_castsi512_ps(_mm512_slli_epi32(wx, 16)),
                                            _mm512_castsi512_ps(_mm512_slli_epi32(wy, 16)), hard);
          acc = HwyOps<D>::BceSubLossesAvx3(acc, _mm512_castsi512_ps(_mm512_and_si512(wx, hi16)),
                                            _mm512_castsi512_ps(_mm512_and_si512(wy, hi16)), hard);
        }
        over = _mm512_cmpgt_epu16_mask(max_bits, one16) != 0;
      }
      __m512i max_bits = _mm512_setzero_si512();
      for (; j < n; j += N) {
        const __m512 xv = LoadAcc(d, x + j).raw, yv = LoadAcc(d, y + j).raw;
        max_bits = _mm512_max_epu32(max_bits, _mm512_castps_si512(xv));
        const bool hard = (_mm512_cmp_ps_mask(yv, one, _CMP_EQ_OQ) |
                           _mm512_cmp_ps_mask(yv, _mm512_setzero_ps(), _CMP_EQ_OQ)) == 0xffff;
        acc = HwyOps<D>::BceSubLossesAvx3(acc, xv, yv, hard);
      }
      over = over || _mm512_cmpgt_epu32_mask(max_bits, _mm512_castps_si512(one)) != 0;
      if (over) bad = hn::FirstN(d, 1);
      vl = V{acc};
      return;
    }
#endif
    if constexpr (std::is_same_v<T, hwy::bfloat16_t> && HWY_TARGET != HWY_SCALAR) {
      // A sum does not care which lane holds which element: pairs of vectors by LoadEvenOdd.
      for (; j + 2 * N <= n; j += 2 * N) {
        V x0, x1, y0, y1, z0 = hn::Zero(d), z1 = hn::Zero(d);
        LoadEvenOdd(d, x + j, x0, x1);
        LoadEvenOdd(d, y + j, y0, y1);
        if constexpr (kLossUsesZ<Loss>) LoadEvenOdd(d, z + j, z0, z1);
        step(x0, y0, z0);
        step(x1, y1, z1);
      }
    }
    for (; j < n; j += N) step(LoadAcc(d, x + j), LoadAcc(d, y + j), zload(j));
    if constexpr (kBitsCheck) bad = hn::Or(bad, hn::RebindMask(d, hn::Gt(max_bits, hn::Set(du, 0x3f800000u))));
    return;
  }
  const V gs = hn::Set(d, static_cast<Acc>(p.grad_scale));
  // The input's gradient alone (the common case) gets a loop of its own, so the other gradients' formulas
  // (bce's two logs for the target's) are not computed only to be dropped. with_loss: the fused entries' loss too,
  // stored to rows or summed into vl.
  auto backward = [&](auto input_only, auto with_loss) {
    constexpr bool kInputOnly = decltype(input_only)::value, kWithLoss = decltype(with_loss)::value;
    std::int64_t j = 0;
#if LOSSFUSE_HWY_LOG_TABLE
    if constexpr (kInputOnly && kWithLoss && std::is_same_v<Loss, lm::BceWithLogitsLoss<false>> && sizeof(Acc) == 4 &&
                  hn::MaxLanes(D()) == 16) {
      if (go == nullptr && rows == nullptr) {
        // bce_with_logits' fused entry, reduced: one e = e^-|x| an element serves both the gradient's sigmoid (the bits
        // of HwyOps::sigmoid, so of the backward's) and the loss, summed as the reduced forward sums it
        // (SoftplusProductSum, the same bits): one exp and no log1p an element, not two exps and a log1p.
        SoftplusProductSum<D> acc(d, vl);
        auto dx_of = [&](V xv, V yv) {
          __m512 e, r;
          HwyOps<D>::SigmoidPartsAvx3(xv.raw, e, r);
          acc.add(xv, yv, V{e});
          return hn::Mul(gs, hn::Sub(V{HwyOps<D>::SigmoidOfPartsAvx3(xv.raw, e, r)}, yv));
        };
        auto pairs = [&](auto hw) {
          if constexpr (std::is_same_v<T, hwy::bfloat16_t>) {  // in the forward's order, stored in element order
            for (; j + 2 * N <= n; j += 2 * N) {
              V x0, x1, y0, y1;
              LoadEvenOdd(d, x + j, x0, x1);
              LoadEvenOdd(d, y + j, y0, y1);
              const V dx0 = dx_of(x0, y0), dx1 = dx_of(x1, y1);
              StoreEvenOdd<decltype(hw)::value, false>(d, dx0, dx1, gx + j);
            }
          }
        };
        if (cpu_has_bf16_convert()) {
          pairs(std::true_type{});
        } else {
          pairs(std::false_type{});
        }
        for (; j < n; j += N) StoreAcc(d, dx_of(LoadAcc(d, x + j), LoadAcc(d, y + j)), gx + j);
        vl = acc.fold();
        return;
      }
    }
#endif
    if constexpr (kInputOnly && std::is_same_v<T, hwy::bfloat16_t> && HWY_TARGET != HWY_SCALAR) {
      // bfloat16 input gradients with one upstream gradient for all (the reductions) two vectors at a time: the
      // even and odd elements by LoadEvenOdd, stored back in element order by StoreEvenOdd (a fused loss summed in
      // that order too; a loss per element takes the loop below)
      if (go == nullptr && rows == nullptr) {
        auto pairs = [&](auto hw) {
          // (the test again: clang 14 instantiates this generic lambda's body for every T, discarded or not)
          if constexpr (std::is_same_v<T, hwy::bfloat16_t>) {
            for (; j + 2 * N <= n; j += 2 * N) {
              V x0, x1, y0, y1, z0 = hn::Zero(d), z1 = hn::Zero(d);
              LoadEvenOdd(d, x + j, x0, x1);
              LoadEvenOdd(d, y + j, y0, y1);
              if constexpr (kLossUsesZ<Loss>) LoadEvenOdd(d, z + j, z0, z1);
              V dx0 = hn::Zero(d), dx1 = hn::Zero(d), dy = hn::Zero(d), dz = hn::Zero(d);
              Loss::grad(vo, k, x0, y0, z0, gs, dx0, dy, dz);
              Loss::grad(vo, k, x1, y1, z1, gs, dx1, dy, dz);
              StoreEvenOdd<decltype(hw)::value, false>(d, dx0, dx1, gx + j);
              if constexpr (kWithLoss) {
                vl = hn::Add(vl, Loss::value(vo, k, x0, y0, z0));
                vl = hn::Add(vl, Loss::value(vo, k, x1, y1, z1));
              }
            }
          }
        };
        if (cpu_has_bf16_convert()) {
          pairs(std::true_type{});
        } else {
          pairs(std::false_type{});
        }
      }
    }
#if LOSSFUSE_HWY_BF16_PAIR
    if constexpr (kInputOnly && !kWithLoss && std::is_same_v<T, hwy::bfloat16_t>) {
      // per-element upstream gradients: two vectors in element order, rounded together by the hardware where it can
      if (go != nullptr && cpu_has_bf16_convert()) {
        auto dx_at = [&](std::int64_t i) {
          const V g = go != nullptr ? hn::Mul(gs, hn::LoadU(d, go + i)) : gs;
          V dx = hn::Zero(d), dy = hn::Zero(d), dz = hn::Zero(d);
          Loss::grad(vo, k, LoadAcc(d, x + i), LoadAcc(d, y + i), zload(i), g, dx, dy, dz);
          return dx;
        };
        for (; j + 2 * N <= n; j += 2 * N) StoreAccPairHw<false>(d, dx_at(j), dx_at(j + N), gx + j);
      }
    }
#endif
    for (; j < n; j += N) {
      const V g = go != nullptr ? hn::Mul(gs, hn::LoadU(d, go + j)) : gs;
      const V xv = LoadAcc(d, x + j), yv = LoadAcc(d, y + j), zv = zload(j);
      V dx = hn::Zero(d), dy = hn::Zero(d), dz = hn::Zero(d);
      Loss::grad(vo, k, xv, yv, zv, g, dx, dy, dz);
      if constexpr (kWithLoss) {
        const V l = Loss::value(vo, k, xv, yv, zv);
        if (rows != nullptr) {
          hn::StoreU(l, d, rows + j);
        } else {
          vl = hn::Add(vl, l);
        }
      }
      if constexpr (kInputOnly) {
        StoreAcc(d, dx, gx + j);
      } else {
        if (gx != nullptr) StoreAcc(d, dx, gx + j);
        if (gy != nullptr) StoreAcc(d, dy, gy + j);
        if (gz != nullptr) StoreAcc(d, dz, gz + j);
      }
    }
  };
  const bool input_only = gx != nullptr && gy == nullptr && gz == nullptr;
  if (rows != nullptr || p.tile_loss != nullptr) {
    input_only ? backward(std::true_type{}, std::true_type{}) : backward(std::false_type{}, std::true_type{});
  } else {
    input_only ? backward(std::true_type{}, std::false_type{}) : backward(std::false_type{}, std::false_type{});
  }
}

template <class Loss, class T, class Acc>
void Tiles(const PwParams& p, std::int64_t t0, std::int64_t t1) {
  const hn::ScalableTag<Acc> d;
  using V = hn::Vec<decltype(d)>;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(d));
  const HwyOps<decltype(d)> vo{d};
  const math::ScalarOps<Acc> so{};
  math::PwConsts<Acc> k{static_cast<Acc>(p.a), static_cast<Acc>(p.b)};
  const int last = p.ndim - 1;
  std::int64_t s[core::kPwViews];
  bool vec_ok = true;
  for (int v = 0; v < core::kPwViews; ++v) {
    s[v] = p.strides[v][last];
    if (p.ptr[v] != nullptr && s[v] != 0 && s[v] != 1) vec_ok = false;
    if (v >= core::kPwGX && v <= core::kPwGZ && p.ptr[v] != nullptr && s[v] != 1) vec_ok = false;
  }
  const T* X = static_cast<const T*>(p.ptr[core::kPwX]);
  const T* Y = static_cast<const T*>(p.ptr[core::kPwY]);
  const T* Z = static_cast<const T*>(p.ptr[core::kPwZ]);
  const T* W = static_cast<const T*>(p.ptr[core::kPwW]);
  T* GX = static_cast<T*>(const_cast<void*>(p.ptr[core::kPwGX]));
  T* GY = static_cast<T*>(const_cast<void*>(p.ptr[core::kPwGY]));
  T* GZ = static_cast<T*>(const_cast<void*>(p.ptr[core::kPwGZ]));
  const Acc* GO = static_cast<const Acc*>(p.ptr[core::kPwGO]);
  const Acc gscale = static_cast<Acc>(p.grad_scale);
  const bool want_loss = p.loss_rows != nullptr || p.tile_loss != nullptr;  // (with p.backward: the fused entries)
  const core::PwCheck check = p.tile_bad != nullptr ? p.check : core::PwCheck::none;
  Acc* loss_rows = static_cast<Acc*>(p.loss_rows);
  // The contiguous loops serve: every operand present of stride 1 along the row, no weight, z exactly when the
  // loss reads it, and no value check other than the loss's own (made in the reduced forward only).
  bool contiguous = vec_ok && W == nullptr && (Z != nullptr) == kLossUsesZ<Loss> &&
                    (check == core::PwCheck::none || (check == kLossCheck<Loss> && loss_rows == nullptr)) &&
                    (p.backward || p.tile_weight == nullptr);
  for (int v = 0; v < core::kPwViews; ++v) {
    if (p.ptr[v] != nullptr && s[v] != 1) contiguous = false;
  }

  // A vector (or stride-0 broadcast) of operand v at element offset `off`.
  auto vload = [&](const T* base, int v, std::int64_t off) -> V {
    return s[v] == 0 ? hn::Set(d, ToAcc<Acc>(base[off])) : LoadAcc(d, base + off);
  };

  for (std::int64_t t = t0; t < t1; ++t) {
    const std::int64_t row = t / p.tiles_per_row;
    const std::int64_t i0 = (t % p.tiles_per_row) * p.tile;
    const std::int64_t i1 = std::min(p.inner, i0 + p.tile);
    const core::PwOffsets o = core::pw_row_offsets(p, row, i0);
    V vl = hn::Zero(d), vw = hn::Zero(d);
    double tl = 0, tw = 0;
    auto bad = hn::FirstN(d, 0);  // all false
    bool bad_tail = false;
    // A lane's float chain (vl, vw) is at most kChain vectors long before it moves into the tile's double sums, so
    // every target's reduction error has one bound (the scalar target's single lane once summed 16384 elements in
    // one chain: 1.2e-5 relative on tests/large's 2^31-element mse).
    constexpr std::int64_t kChain = 256;
    const auto flush = [&] {
      tl += static_cast<double>(hn::GetLane(hn::SumOfLanes(d, vl)));
      tw += static_cast<double>(hn::GetLane(hn::SumOfLanes(d, vw)));
      vl = vw = hn::Zero(d);
    };
    std::int64_t i = i0;
    if (contiguous) {
      const std::int64_t n = (i1 - i0) / N * N;
      const auto at = [&](auto* base, int v, std::int64_t j) { return base != nullptr ? base + o.v[v] + j : nullptr; };
      for (std::int64_t j = 0; j < n && (p.backward || want_loss); j += kChain * N) {
        ContiguousTile<Loss, T, Acc>(d, p, k, std::min(kChain * N, n - j), at(X, core::kPwX, j),
                                     at(Y, core::kPwY, j), at(Z, core::kPwZ, j), at(GX, core::kPwGX, j),
                                     at(GY, core::kPwGY, j), at(GZ, core::kPwGZ, j), at(GO, core::kPwGO, j),
                                     loss_rows != nullptr ? loss_rows + row * p.inner + i0 + j : nullptr, vl, bad);
        flush();
      }
      i = i0 + n;
    } else if (vec_ok) {
      for (std::int64_t left = kChain; i + N <= i1; i += N) {
        const std::int64_t j = i - i0;
        if (left-- == 0) flush(), left = kChain - 1;
        const V x = vload(X, core::kPwX, o.v[core::kPwX] + j * s[core::kPwX]);
        const V y = vload(Y, core::kPwY, o.v[core::kPwY] + j * s[core::kPwY]);
        const V z = Z != nullptr ? vload(Z, core::kPwZ, o.v[core::kPwZ] + j * s[core::kPwZ]) : hn::Zero(d);
        const V w = W != nullptr ? vload(W, core::kPwW, o.v[core::kPwW] + j * s[core::kPwW]) : hn::Set(d, Acc(1));
        if (!p.backward) {
          if (W != nullptr) vw = hn::Add(vw, w);
          if (!want_loss) continue;
          if (check == core::PwCheck::x_unit_interval) {
            bad = hn::Or(bad, hn::Not(hn::And(hn::Ge(x, hn::Zero(d)), hn::Le(x, hn::Set(d, Acc(1))))));
          } else if (check == core::PwCheck::z_nonnegative) {
            bad = hn::Or(bad, hn::Lt(z, hn::Zero(d)));
          }
        } else {
          V g = hn::Mul(w, hn::Set(d, gscale));
          if (GO != nullptr) {
            g = hn::Mul(
                g, s[core::kPwGO] == 0 ? hn::Set(d, GO[o.v[core::kPwGO]]) : hn::LoadU(d, GO + o.v[core::kPwGO] + j));
          }
          V dx = hn::Zero(d), dy = hn::Zero(d), dz = hn::Zero(d);
          Loss::grad(vo, k, x, y, z, g, dx, dy, dz);
          if (GX != nullptr) StoreAcc(d, dx, GX + o.v[core::kPwGX] + j);
          if (GY != nullptr) StoreAcc(d, dy, GY + o.v[core::kPwGY] + j);
          if (GZ != nullptr) StoreAcc(d, dz, GZ + o.v[core::kPwGZ] + j);
          if (!want_loss) continue;
        }
        V l = Loss::value(vo, k, x, y, z);
        if (W != nullptr) l = hn::Mul(l, w);
        if (loss_rows != nullptr) {
          hn::StoreU(l, d, loss_rows + row * p.inner + i);
        } else {
          vl = hn::Add(vl, l);
        }
      }
    }
    for (; i < i1; ++i) {
      const std::int64_t j = i - i0;
      const Acc x = ToAcc<Acc>(X[o.v[core::kPwX] + j * s[core::kPwX]]);
      const Acc y = ToAcc<Acc>(Y[o.v[core::kPwY] + j * s[core::kPwY]]);
      const Acc z = Z != nullptr ? ToAcc<Acc>(Z[o.v[core::kPwZ] + j * s[core::kPwZ]]) : Acc(0);
      const Acc w = W != nullptr ? ToAcc<Acc>(W[o.v[core::kPwW] + j * s[core::kPwW]]) : Acc(1);
      if (!p.backward) {
        tw += static_cast<double>(w);
        if (!want_loss) continue;
        if (check == core::PwCheck::x_unit_interval) bad_tail |= !((x >= Acc(0)) & (x <= Acc(1)));
        if (check == core::PwCheck::z_nonnegative) bad_tail |= z < Acc(0);
      } else {
        Acc g = w * gscale;
        if (GO != nullptr) g *= GO[o.v[core::kPwGO] + j * s[core::kPwGO]];
        Acc dx = 0, dy = 0, dz = 0;
        Loss::grad(so, k, x, y, z, g, dx, dy, dz);
        if (GX != nullptr) GX[o.v[core::kPwGX] + j * s[core::kPwGX]] = FromAcc<T>(dx);
        if (GY != nullptr) GY[o.v[core::kPwGY] + j * s[core::kPwGY]] = FromAcc<T>(dy);
        if (GZ != nullptr) GZ[o.v[core::kPwGZ] + j * s[core::kPwGZ]] = FromAcc<T>(dz);
        if (!want_loss) continue;
      }
      Acc l = Loss::value(so, k, x, y, z);
      if (W != nullptr) l *= w;
      if (loss_rows != nullptr) {
        loss_rows[row * p.inner + i] = l;
      } else {
        tl += static_cast<double>(l);
      }
    }
    if (p.tile_bad != nullptr && (bad_tail || !hn::AllFalse(d, bad))) p.tile_bad[t] = 1;
    flush();
    if (p.tile_loss != nullptr) p.tile_loss[t] = tl;
    if (p.tile_weight != nullptr) p.tile_weight[t] = tw;
  }
}

template <class Loss>
void TilesFor(const PwParams& p, std::int64_t t0, std::int64_t t1) {
  switch (p.dtype) {
    case DType::f32: return Tiles<Loss, float, float>(p, t0, t1);
    case DType::f64: return Tiles<Loss, double, double>(p, t0, t1);
    case DType::bf16: return Tiles<Loss, hwy::bfloat16_t, float>(p, t0, t1);
    case DType::f16: return Tiles<Loss, hwy::float16_t, float>(p, t0, t1);
    default: return;
  }
}

// The loss kind (the formulas' own switch, compiled for this target) and the dtype become template parameters.
void PointwiseTiles(const PwParams& p, std::int64_t t0, std::int64_t t1) {
  lm::visit_pointwise_loss(p.kind, core::pw_option1(p), core::pw_option2(p),
                           [&](auto loss) { TilesFor<decltype(loss)>(p, t0, t1); });
}

}  // namespace lossfuse::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "cpu/kernels.hpp"
#include "lossfuse/parallel.hpp"

namespace lossfuse::cpu {

HWY_EXPORT(PointwiseTiles);

void pointwise_run(const core::PwParams& p) {
  const std::int64_t tiles = p.rows * p.tiles_per_row;
  const std::int64_t grain = std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(1, std::min(p.inner, p.tile)));
  parallel_for(0, tiles, grain, [&p](std::int64_t t0, std::int64_t t1) {
    HWY_DYNAMIC_DISPATCH(PointwiseTiles)(p, t0, t1);
  });
}

}  // namespace lossfuse::cpu
#endif  // HWY_ONCE
