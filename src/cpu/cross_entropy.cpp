// CPU cross-entropy kernels: forward, backward from the saved log-sum-exp, and fused forward+backward.
//
// logits:  rows x C, any strides (x_cstride along classes); float32 / float64 / float16 / bfloat16
// target:  one class index per row (any integer dtype), or rows x C probabilities (dtype of the logits)
// grad:    rows x C like logits (may be the logits buffer itself when the caller asked for in place)
// outputs: per-row loss / lse / z-loss (Acc) or per-block sums for the reductions
//
// Per row, z_c = T(x_c) (logit_scale, then softcap * tanh(. / softcap)); the row is read once, in chunks of
// kChunk classes. Each chunk is one pass: z is formed in registers and exp(z - shift) summed with a shift known
// before the chunk (the running max), while the chunk's max is taken; the rare chunk whose max overtakes the
// shift by more than kSlack is summed again from L1. The chunk's (shift, sum) joins the row's online
// log-sum-exp (src/math/online_lse.hpp); label-smoothing and soft-target sums ride along. The chunk after next
// is prefetched meanwhile. The loss and gradient formulas are in src/math/cross_entropy_math.hpp. The fused
// entry keeps exp(z - shift) in a per-thread row buffer, so its gradient pass is a multiply per element; the
// backward entry recomputes it from the saved lse. Rows whose class stride is not 1 take a scalar path.
//
// Accumulation in float32 (float64 for float64 logits); row losses summed per fixed block of rows in double.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/cross_entropy.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/cross_entropy_params.hpp"
#include "core/targets.hpp"
#include "cpu/hwy_exp-inl.h"
#include "cpu/hwy_io-inl.h"
#include "hwy/cache_control.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "math/cross_entropy_math.hpp"
#include "math/online_lse.hpp"
#include "math/storage.hpp"

HWY_BEFORE_NAMESPACE();
namespace lossfuse::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using core::CeMode;
using core::CeParams;

// Classes per chunk: 8 KiB of Acc, so the chunk buffers stay in L1.
template <class Acc>
constexpr std::int64_t kChunk = 8192 / sizeof(Acc);

template <class Acc>
struct RowCtx {
  math::LogitTransform<Acc> xf;
  math::CeRowParams<Acc> rp;
  const Acc* w = nullptr;  // padded class weights or nullptr
  bool need_wz = false;    // label smoothing: the sum of w (z - ref) is needed
};

// z = T(x); with softcap also returns th = tanh(scale x / softcap) for the derivative. NaN stays NaN.
template <bool kCap, class D, class V>
HWY_INLINE V Transform(D d, V x, const math::LogitTransform<hn::TFromD<D>>& xf, V* th) {
  const V z = hn::Mul(x, hn::Set(d, xf.scale));
  if constexpr (!kCap) {
    (void)th;
    return z;
  } else {
    const V t = hn::Tanh(d, hn::Mul(z, hn::Set(d, xf.inv_softcap)));
    *th = hn::IfThenElse(hn::IsNaN(z), z, t);
    return hn::Mul(*th, hn::Set(d, xf.softcap));
  }
}

// Whether contiguous bfloat16 rows go two vectors at a time (LoadEvenOdd): rows without the position-dependent sums
// of soft targets and label smoothing. RowStats then keeps the exps of each chunk's pairs in pair order (the even
// elements' vector, then the odd ones'), and RowGradFromE reads them so.
template <class T, bool kSoft, class Acc>
HWY_INLINE bool PairRows(const RowCtx<Acc>& cx) {
  return std::is_same_v<T, hwy::bfloat16_t> && HWY_TARGET != HWY_SCALAR && !kSoft && !cx.need_wz;
}

// The end of a chunk's pairs [c0, end): where RowStats's pair loop stops (then one vector at a time).
HWY_INLINE std::int64_t PairsEnd(std::int64_t c0, std::int64_t end, std::int64_t lanes) {
  return c0 + (end - c0) / (2 * lanes) * (2 * lanes);
}

// Forward statistics of one contiguous row. Returns false for a non-finite row (NaN or +inf in z, or only
// -inf), whose lse is NaN.
// One pass per chunk: z is formed in registers, and exp(z - shift) summed with the shift known before the chunk
// starts (the running max; for the first chunk the max of its first vector), while the chunk's own max is taken.
// exp(z - shift) cannot overflow while z <= shift + kSlack; a chunk whose max passes that (or, for a first chunk
// with no finite guess, lies far below the shift) is summed again from L1 with its own max as the shift. Values
// far below a running max contribute < e^-kSlack relative to the sum and may underflow to 0.
// With `e` set (the fused path), also keeps e_c = exp(z_c - shift_k) for the whole row and each chunk's shift in
// `chunk_max`, so the gradient pass needs one multiply per element instead of a transform and an exp.
// With `gw` set (the fused path's gradient row, same length), its lines are prefetched for writing beside the
// logits' own prefetches, so their fetch for ownership overlaps the exps instead of stalling the gradient pass.
template <bool kCap, bool kSoft, class T, class Acc>
HWY_NOINLINE bool RowStats(const T* HWY_RESTRICT x, const T* HWY_RESTRICT pt, std::int64_t C, const RowCtx<Acc>& cx,
                           math::RowSums<Acc>& rs, Acc* HWY_RESTRICT e, Acc* HWY_RESTRICT chunk_max, const T* gw) {
  const hn::ScalableTag<Acc> d;
  using V = hn::Vec<decltype(d)>;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(d));
  constexpr std::int64_t kC = kChunk<Acc>;
  constexpr Acc kInf = std::numeric_limits<Acc>::infinity();
  constexpr Acc kSlack = 60;
  const bool sums = cx.need_wz || kSoft;
  const bool unit = !kCap && cx.xf.scale == Acc(1);  // z = x

  // The last partial vector of a chunk is read through these, padded with z = -inf, p = 0.
  HWY_ALIGN Acc zl[hn::MaxLanes(d)] = {};
  HWY_ALIGN Acc pl[hn::MaxLanes(d)] = {};
  auto load_tail = [&](std::int64_t c, std::int64_t end) {
    for (std::int64_t j = 0; j < N; ++j) {
      zl[j] = c + j < end ? cx.xf.apply(ToAcc<Acc>(x[c + j])) : -kInf;
      if constexpr (kSoft) pl[j] = c + j < end ? ToAcc<Acc>(pt[c + j]) : Acc(0);
    }
  };

  math::LseState<Acc> st;
  Acc ref = 0, row_max = -kInf;
  V swz = hn::Zero(d), swp = hn::Zero(d), swpz = hn::Zero(d);
  for (std::int64_t c0 = 0; c0 < C; c0 += kC) {
    const std::int64_t end = std::min(C, c0 + kC);
    const std::int64_t full_end = c0 + (end - c0) / N * N;
    Acc shift = st.m;
    const bool guessed = c0 == 0;
    if (guessed) {
      V th;
      if (full_end > c0) {
        shift = hn::GetLane(hn::MaxOfLanes(d, Transform<kCap>(d, LoadAcc(d, x), cx.xf, &th)));
      } else {
        load_tail(0, end);
        shift = hn::GetLane(hn::MaxOfLanes(d, hn::Load(d, zl)));
      }
      if (!(shift > -kInf && shift < kInf)) shift = 0;  // NaN / inf are caught below
      ref = shift;                                      // sums are taken relative to the first chunk's shift
    }
    const char* next = reinterpret_cast<const char*>(x + c0 + 2 * kC);
    const V vref = hn::Set(d, ref);
    V vmax = hn::Set(d, -kInf);
    Acc chunk_sum = 0;
    // Attempt 0 sums with the shift known before the chunk; attempt 1 (rare) with the chunk's own max.
    for (int attempt = 0; attempt < 2; ++attempt) {
      const V vsh = hn::Set(d, shift);
      V vs = hn::Zero(d), vs_wz = swz, vs_wp = swp, vs_wpz = swpz, vm = vmax;
      const bool with_sums = sums && attempt == 0;
      std::int64_t c = c0;
      if constexpr (std::is_same_v<T, hwy::bfloat16_t> && HWY_TARGET != HWY_SCALAR) {
        // PairRows: two vectors at a time (the sum and max do not care about lane order), exps kept in pair order
        if (PairRows<T, kSoft>(cx)) {
          V vs1 = hn::Zero(d), vm1 = vm;
          for (const std::int64_t pend = PairsEnd(c0, end, N); c < pend; c += 2 * N) {
            if (((c - c0) * static_cast<std::int64_t>(sizeof(T))) % 64 == 0) {
              __builtin_prefetch(next + (c - c0) * static_cast<std::int64_t>(sizeof(T)));
              if (gw != nullptr) __builtin_prefetch(gw + c, 1);
            }
            V z0, z1, th;
            LoadEvenOdd(d, x + c, z0, z1);
            if (!unit) {
              z0 = Transform<kCap>(d, z0, cx.xf, &th);
              z1 = Transform<kCap>(d, z1, cx.xf, &th);
            }
            vm = hn::Max(vm, z0);
            vm1 = hn::Max(vm1, z1);
            const V e0 = FastExp(d, hn::Sub(z0, vsh));
            const V e1 = FastExp(d, hn::Sub(z1, vsh));
            vs = hn::Add(vs, e0);
            vs1 = hn::Add(vs1, e1);
            if (e != nullptr) {
              hn::StoreU(e0, d, e + c);
              hn::StoreU(e1, d, e + c + N);
            }
          }
          vs = hn::Add(vs, vs1);
          vm = hn::Max(vm, vm1);
        }
      }
      for (; c < end; c += N) {
        // While this chunk is summed, the chunk after next (or the next row) is fetched: one prefetch per cache
        // line (prefetches never fault, also past the end of the logits).
        if (((c - c0) * static_cast<std::int64_t>(sizeof(T))) % 64 == 0) {
          __builtin_prefetch(next + (c - c0) * static_cast<std::int64_t>(sizeof(T)));
          if (gw != nullptr) __builtin_prefetch(gw + c, 1);
        }
        V z, pv = hn::Zero(d);
        if (c < full_end) {
          V th;
          z = LoadAcc(d, x + c);
          if (!unit) z = Transform<kCap>(d, z, cx.xf, &th);
          if constexpr (kSoft) pv = LoadAcc(d, pt + c);
        } else {
          load_tail(c, end);
          z = hn::Load(d, zl);
          if constexpr (kSoft) pv = hn::Load(d, pl);
        }
        vm = hn::Max(vm, z);
        const V ez = FastExp(d, hn::Sub(z, vsh));
        vs = hn::Add(vs, ez);
        if (e != nullptr) hn::StoreU(ez, d, e + c);  // e has room for the padding
        if (with_sums) {
          V zr = hn::Sub(z, vref);
          if (c + N > end) zr = hn::IfThenElseZero(hn::FirstN(d, static_cast<size_t>(end - c)), zr);
          const V wv = cx.w != nullptr ? hn::LoadU(d, cx.w + c) : hn::Set(d, Acc(1));
          if (cx.need_wz) vs_wz = hn::MulAdd(wv, zr, vs_wz);
          if constexpr (kSoft) {
            const V wp = hn::Mul(wv, pv);
            vs_wp = hn::Add(vs_wp, wp);
            vs_wpz = hn::MulAdd(wp, zr, vs_wpz);
          }
        }
      }
      vmax = vm;
      if (with_sums) swz = vs_wz, swp = vs_wp, swpz = vs_wpz;
      chunk_sum = hn::GetLane(hn::SumOfLanes(d, vs));
      const Acc m = hn::GetLane(hn::MaxOfLanes(d, vmax));
      if (m == kInf) return false;  // +inf in z
      // exp(z - shift) may have overflowed, or (first chunk, no finite guess) underflowed: sum again.
      if (attempt == 0 && m > -kInf && (m > shift + kSlack || (guessed && m < shift - kSlack))) {
        shift = m;
        continue;
      }
      break;
    }
    if (std::isnan(chunk_sum)) return false;  // a NaN in z (any lane)
    const Acc m = hn::GetLane(hn::MaxOfLanes(d, vmax));
    if (e != nullptr) chunk_max[c0 / kC] = m > -kInf ? shift : -kInf;
    if (m > -kInf) st = math::lse_combine(st, {shift, chunk_sum});
    row_max = std::max(row_max, m);
  }
  if (st.m == -kInf) return false;
  rs.m = ref;
  // top = the row's max z, so that log_s lies in [0, log C] and is rounded relative to that: lse - z_y =
  // (top - z_y) + log_s then keeps its relative precision down to tiny losses. The shift of the sum may lag the max
  // by up to kSlack, or lie above it by as much (0, the first chunk's fallback when its first vector holds only
  // -inf): s moves by e^(+-kSlack) at most, within float32's range.
  rs.top = row_max;
  const Acc s = row_max != st.m ? st.s * std::exp(st.m - row_max) : st.s;
  rs.log_s = std::log(s);
  rs.lse = rs.top + rs.log_s;
  rs.sum_wz = hn::GetLane(hn::SumOfLanes(d, swz));
  rs.sum_wp = hn::GetLane(hn::SumOfLanes(d, swp));
  rs.sum_wpz = hn::GetLane(hn::SumOfLanes(d, swpz));
  return true;
}

// The same statistics for a row with class strides xs (logits) and ts (probabilities), in scalar code.
template <bool kSoft, class T, class Acc>
HWY_NOINLINE bool RowStatsStrided(const T* x, std::int64_t xs, const T* pt, std::int64_t ts, std::int64_t C,
                                  const RowCtx<Acc>& cx, math::RowSums<Acc>& rs) {
  constexpr Acc kInf = std::numeric_limits<Acc>::infinity();
  Acc m = -kInf;
  for (std::int64_t c = 0; c < C; ++c) {
    const Acc z = cx.xf.apply(ToAcc<Acc>(x[c * xs]));
    if (std::isnan(z)) return false;
    m = std::max(m, z);
  }
  if (m == kInf || m == -kInf) return false;
  Acc s = 0, swz = 0, swp = 0, swpz = 0;
  for (std::int64_t c = 0; c < C; ++c) {
    const Acc z = cx.xf.apply(ToAcc<Acc>(x[c * xs]));
    s += std::exp(z - m);
    const Acc wc = cx.w != nullptr ? cx.w[c] : Acc(1);
    if (cx.need_wz) swz += wc * (z - m);
    if constexpr (kSoft) {
      const Acc wp = wc * ToAcc<Acc>(pt[c * ts]);
      swp += wp;
      swpz += wp * (z - m);
    }
  }
  rs = {m, m + std::log(s), swz, swp, swpz, m, std::log(s)};
  return true;
}

// sum_c w_c p_c of a probability row (the backward needs it and did not save it).
template <class T, class Acc>
HWY_NOINLINE Acc RowSumWp(const T* pt, std::int64_t ts, std::int64_t C, const Acc* w) {
  Acc s = 0;
  for (std::int64_t c = 0; c < C; ++c) s += (w != nullptr ? w[c] : Acc(1)) * ToAcc<Acc>(pt[c * ts]);
  return s;
}

// The per-row constants of the gradient pass.
template <class D>
struct GradConsts {
  hn::Vec<D> eps_c, one_m_eps, gs, one;  // eps/C, 1 - eps, upstream gradient * logit_scale, 1
  bool wterm;                            // the w_c b_c term is present (soft targets or smoothing)
};

template <bool kSoft, class D, class Acc>
HWY_INLINE GradConsts<D> MakeGradConsts(D d, const RowCtx<Acc>& cx, Acc gscale) {
  return {hn::Set(d, cx.rp.eps_over_c), hn::Set(d, Acc(1) - cx.rp.eps), hn::Set(d, cx.xf.scale * gscale),
          hn::Set(d, Acc(1)), kSoft || cx.rp.eps_over_c != Acc(0)};
}

// Given t = q_c A for classes [c, c + lanes): g = gs dz/dx (t - w_c b_c), b_c = soft ? (1 - eps) p_c + eps/C
// : eps/C (an index target's own term is added by the caller); th = tanh(.) of the softcap.
template <bool kCap, bool kSoft, class D, class T, class Acc>
HWY_INLINE hn::Vec<D> GradValue(D d, hn::Vec<D> t, hn::Vec<D> th, std::int64_t c, const T* pt, const RowCtx<Acc>& cx,
                                const GradConsts<D>& k) {
  if (k.wterm) {
    auto b = k.eps_c;
    if constexpr (kSoft) b = hn::MulAdd(LoadAcc(d, pt + c), k.one_m_eps, k.eps_c);
    if (cx.w != nullptr) b = hn::Mul(b, hn::LoadU(d, cx.w + c));
    t = hn::Sub(t, b);
  }
  if constexpr (kCap) {
    t = hn::Mul(t, hn::Mul(k.gs, hn::NegMulAdd(th, th, k.one)));
  } else {
    (void)th;
    t = hn::Mul(t, k.gs);
  }
  return t;
}

// Whether bfloat16 gradient rows are stored two vectors at a time by the hardware conversion (StoreAccPairHw).
template <class T>
HWY_INLINE bool PairHw() {
#if LOSSFUSE_HWY_BF16_PAIR
  if constexpr (std::is_same_v<T, hwy::bfloat16_t>) return cpu_has_bf16_convert();
#endif
  return false;
}

// Stores value(c), the gradient vector at class c, for c = c0, c0 + lanes, ... while a whole vector fits before
// `end`; returns the first class not stored. kPairHw (see PairHw): two vectors per store. kStream: float32 vectors
// and bfloat16 pairs by streaming stores, g + c0 being 64-byte aligned (the caller fences).
template <bool kPairHw, bool kStream, class D, class T, class F>
HWY_INLINE std::int64_t StoreVectors(D d, std::int64_t c, std::int64_t end, T* g, const F& value) {
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(d));
#if LOSSFUSE_HWY_BF16_PAIR
  if constexpr (kPairHw && std::is_same_v<T, hwy::bfloat16_t>) {
    for (; c + 2 * N <= end; c += 2 * N) {
      const auto lo = value(c);
      StoreAccPairHw<kStream>(d, lo, value(c + N), g + c);
    }
  }
#endif
  if constexpr (kStream && std::is_same_v<T, float>) {
    for (; c + N <= end; c += N) hn::Stream(value(c), d, g + c);
  }
  for (; c + N <= end; c += N) StoreAcc(d, value(c), g + c);
  return c;
}

// For PairRows: stores pair(i, even, odd), the gradient vectors of the even and odd classes in [i, i + 2 lanes), for
// i = c, c + 2 lanes, ... below `end` (a PairsEnd); returns `end`. kPairHw, kStream: as StoreVectors.
template <bool kPairHw, bool kStream, class D, class F>
HWY_INLINE std::int64_t StorePairs(D d, std::int64_t c, std::int64_t end, hwy::bfloat16_t* g, const F& pair) {
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(d));
  for (; c < end; c += 2 * N) {
    hn::Vec<D> even, odd;
    pair(c, even, odd);
    StoreEvenOdd<kPairHw, kStream>(d, even, odd, g + c);
  }
  return c;
}

// Gradients of at least this many bytes are written by streaming stores where the layout allows (float32 rows,
// bfloat16 rows with the hardware conversion; each row 64-byte aligned): they exceed the last-level cache, so
// cached stores would first read every line they overwrite (a third more memory traffic for fwd+bwd). Smaller
// gradients stay in cache for whatever reads them next.
constexpr double kStreamBytes = 32.0 * (1 << 20);

// The scalar form of GradValue for one class, stored, strides xs / ts along the classes.
template <bool kSoft, class T, class Acc>
HWY_INLINE T GradScalar(Acc t, Acc xv, const T* pt, std::int64_t ts, std::int64_t c, const RowCtx<Acc>& cx,
                        Acc gscale) {
  if (kSoft || cx.rp.eps_over_c != Acc(0)) {
    Acc b = cx.rp.eps_over_c;
    if constexpr (kSoft) b += (Acc(1) - cx.rp.eps) * ToAcc<Acc>(pt[c * ts]);
    if (cx.w != nullptr) b *= cx.w[c];
    t -= b;
  }
  return FromAcc<T>(t * gscale * cx.xf.derivative(xv));
}

// Gradient of one row from lse = top + log_s (math::RowSums; a saved lse split into its rounding and remainder):
// q_c = exp((z_c - top) - log_s), then GradValue.
template <bool kCap, bool kSoft, bool kPairHw, bool kStream, class T, class Acc>
HWY_NOINLINE void RowGrad(const T* x, std::int64_t xs, const T* pt, std::int64_t ts, T* g, std::int64_t gs_,
                          std::int64_t C, const RowCtx<Acc>& cx, Acc top, Acc log_s, Acc gscale, Acc A) {
  std::int64_t c = 0;
  if (xs == 1 && gs_ == 1 && (!kSoft || ts == 1)) {
    const hn::ScalableTag<Acc> d;
    using V = hn::Vec<decltype(d)>;
    const auto k = MakeGradConsts<kSoft>(d, cx, gscale);
    const V vtop = hn::Set(d, top), vlog_s = hn::Set(d, log_s), vA = hn::Set(d, A);
    if constexpr (std::is_same_v<T, hwy::bfloat16_t> && HWY_TARGET != HWY_SCALAR) {
      if (PairRows<T, kSoft>(cx)) {
        const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(d));
        c = StorePairs<kPairHw, kStream>(d, c, PairsEnd(0, C, N), g, [&](std::int64_t i, V& even, V& odd) {
          V z0, z1, th0 = k.one, th1 = k.one;
          LoadEvenOdd(d, x + i, z0, z1);
          z0 = Transform<kCap>(d, z0, cx.xf, &th0);
          z1 = Transform<kCap>(d, z1, cx.xf, &th1);
          const V q0 = FastExp(d, hn::Sub(hn::Sub(z0, vtop), vlog_s));
          const V q1 = FastExp(d, hn::Sub(hn::Sub(z1, vtop), vlog_s));
          even = GradValue<kCap, kSoft>(d, hn::Mul(q0, vA), th0, i, pt, cx, k);
          odd = GradValue<kCap, kSoft>(d, hn::Mul(q1, vA), th1, i, pt, cx, k);
        });
      }
    }
    c = StoreVectors<kPairHw, kStream>(d, c, C, g, [&](std::int64_t i) {
      V th = k.one;
      const V z = Transform<kCap>(d, LoadAcc(d, x + i), cx.xf, &th);
      const V q = FastExp(d, hn::Sub(hn::Sub(z, vtop), vlog_s));
      return GradValue<kCap, kSoft>(d, hn::Mul(q, vA), th, i, pt, cx, k);
    });
  }
  for (; c < C; ++c) {
    const Acc xv = ToAcc<Acc>(x[c * xs]);
    g[c * gs_] = GradScalar<kSoft, T>(std::exp((cx.xf.apply(xv) - top) - log_s) * A, xv, pt, ts, c, cx, gscale);
  }
}

// The fused gradient of a contiguous row from the e_c and chunk maxima RowStats kept:
// q_c = e_c exp((m_k - top) - log_s), then GradValue. x is read only for the softcap derivative.
template <bool kCap, bool kSoft, bool kPairHw, bool kStream, class T, class Acc>
HWY_NOINLINE void RowGradFromE(const Acc* HWY_RESTRICT e, const Acc* chunk_max, const T* x, const T* pt, T* g,
                               std::int64_t C, const RowCtx<Acc>& cx, Acc top, Acc log_s, Acc gscale, Acc A) {
  const hn::ScalableTag<Acc> d;
  using V = hn::Vec<decltype(d)>;
  constexpr std::int64_t kC = kChunk<Acc>;
  const auto k = MakeGradConsts<kSoft>(d, cx, gscale);
  for (std::int64_t c0 = 0; c0 < C; c0 += kC) {
    const std::int64_t end = std::min(C, c0 + kC);
    const Acc fa = std::exp((chunk_max[c0 / kC] - top) - log_s) * A;
    const V vfa = hn::Set(d, fa);
    std::int64_t c = c0;
    if constexpr (std::is_same_v<T, hwy::bfloat16_t> && HWY_TARGET != HWY_SCALAR) {
      if (PairRows<T, kSoft>(cx)) {  // the exps of [c0, PairsEnd) are in pair order
        const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(d));
        c = StorePairs<kPairHw, kStream>(d, c, PairsEnd(c0, end, N), g, [&](std::int64_t i, V& even, V& odd) {
          V th0 = k.one, th1 = k.one;
          if constexpr (kCap) {
            V x0, x1;
            LoadEvenOdd(d, x + i, x0, x1);
            (void)Transform<true>(d, x0, cx.xf, &th0);
            (void)Transform<true>(d, x1, cx.xf, &th1);
          }
          even = GradValue<kCap, kSoft>(d, hn::Mul(hn::LoadU(d, e + i), vfa), th0, i, pt, cx, k);
          odd = GradValue<kCap, kSoft>(d, hn::Mul(hn::LoadU(d, e + i + N), vfa), th1, i, pt, cx, k);
        });
      }
    }
    c = StoreVectors<kPairHw, kStream>(d, c, end, g, [&](std::int64_t i) {
      V th = k.one;
      if constexpr (kCap) (void)Transform<true>(d, LoadAcc(d, x + i), cx.xf, &th);
      return GradValue<kCap, kSoft>(d, hn::Mul(hn::LoadU(d, e + i), vfa), th, i, pt, cx, k);
    });
    for (; c < end; ++c) g[c] = GradScalar<kSoft, T>(e[c] * fa, ToAcc<Acc>(x[c]), pt, 1, c, cx, gscale);
  }
}

// One row's gradient: from the kept exps when there are some (e), else from the lse (rs.top + rs.log_s).
template <bool kCap, bool kSoft, bool kPairHw, bool kStream, class T, class Acc>
HWY_INLINE void GradRow(const Acc* e, const Acc* chunk_max, const T* x, const T* pt, T* g, const CeParams& p,
                        std::int64_t C, const RowCtx<Acc>& cx, const math::RowSums<Acc>& rs, Acc gscale, Acc A) {
  if (e != nullptr) {
    RowGradFromE<kCap, kSoft, kPairHw, kStream>(e, chunk_max, x, pt, g, C, cx, rs.top, rs.log_s, gscale, A);
  } else {
    RowGrad<kCap, kSoft, kPairHw, kStream>(x, p.x_cstride, pt, p.t_cstride, g, p.g_cstride, C, cx, rs.top, rs.log_s,
                                           gscale, A);
  }
}

template <class T, class Acc>
HWY_INLINE void FillRow(T* g, std::int64_t gs_, std::int64_t C, Acc v) {
  const T t = FromAcc<T>(v);
  for (std::int64_t c = 0; c < C; ++c) g[c * gs_] = t;
}

template <bool kCap, bool kSoft, class T, class Acc>
void Blocks(const CeParams& p, std::int64_t b0, std::int64_t b1) {
  constexpr Acc kNaN = std::numeric_limits<Acc>::quiet_NaN();
  const std::int64_t C = p.classes;
  RowCtx<Acc> cx;
  cx.xf.scale = static_cast<Acc>(p.scale);
  cx.xf.softcap = static_cast<Acc>(p.softcap);
  cx.xf.inv_softcap = p.softcap > 0 ? static_cast<Acc>(1.0 / p.softcap) : Acc(0);
  cx.rp.eps = static_cast<Acc>(p.eps);
  cx.rp.eps_over_c = static_cast<Acc>(p.eps / static_cast<double>(C));
  cx.rp.sum_w = static_cast<Acc>(p.sum_w);
  cx.rp.z_loss_scale = static_cast<Acc>(p.z_loss_scale);
  cx.w = static_cast<const Acc*>(p.weight);
  cx.need_wz = p.eps != 0.0;

  const T* logits = static_cast<const T*>(p.logits);
  T* grad = static_cast<T*>(p.grad);
  constexpr bool kBf16 = std::is_same_v<T, hwy::bfloat16_t>;  // the only dtype with a pair store
  const bool pair_hw = PairHw<T>();
  constexpr bool kStreamable = std::is_same_v<T, float> || kBf16;
  const bool stream = kStreamable && (!kBf16 || pair_hw) && p.mode != CeMode::forward && p.g_cstride == 1 &&
                      static_cast<double>(p.rows) * static_cast<double>(p.classes) * sizeof(T) >= kStreamBytes;
  const bool fwd = p.mode != CeMode::backward;
  const bool bwd = p.mode != CeMode::forward;
  const bool contiguous = p.x_cstride == 1 && (!kSoft || p.t_cstride == 1);
  // Fused contiguous rows keep exp(z - chunk max) in a per-thread row buffer (O(C) per thread, reused across
  // calls). If it cannot be allocated the gradient pass recomputes the exps instead: kernels never throw.
  Acc* ebuf = nullptr;
  Acc* chunk_max = nullptr;
  if (fwd && bwd && contiguous && p.g_cstride == 1) {
    thread_local std::vector<Acc> row_buffer;
    const std::size_t chunks = static_cast<std::size_t>((C + kChunk<Acc> - 1) / kChunk<Acc>);
    const std::size_t need = static_cast<std::size_t>(C) + 64 + chunks;
    try {
      if (row_buffer.size() < need) row_buffer.resize(need);
      ebuf = row_buffer.data();
      chunk_max = ebuf + C + 64;
    } catch (...) {
      ebuf = nullptr;
    }
  }

  for (std::int64_t blk = b0; blk < b1; ++blk) {
    double block_loss = 0, block_zloss = 0;
    const std::int64_t r_end = std::min(p.rows, (blk + 1) * p.rows_per_block);
    for (std::int64_t r = blk * p.rows_per_block; r < r_end; ++r) {
      const T* x = logits + p.index.offset(core::kLogitsRow, r);
      const T* pt = nullptr;
      std::int64_t y = 0;
      if constexpr (kSoft) {
        pt = static_cast<const T*>(p.target) + p.index.offset(core::kTargetRow, r);
      } else {
        y = core::read_target(p.target, p.target_dtype, p.index.offset(core::kTargetRow, r));
      }
      const bool ignored = !kSoft && y == p.ignore_index;
      const Acc w_y = ignored || kSoft ? Acc(0) : (cx.w != nullptr ? cx.w[y] : Acc(1));
      const Acc x_y = ignored || kSoft ? Acc(0) : ToAcc<Acc>(x[y * p.x_cstride]);  // read before any in-place write

      math::RowSums<Acc> rs{};
      bool ok = true;
      if (fwd) {
        // fused: the gradient row's lines are fetched for writing while the row's exps are computed
        const T* gw = ebuf != nullptr && !stream ? grad + p.index.offset(core::kGradRow, r) : nullptr;
        ok = contiguous ? RowStats<kCap, kSoft>(x, pt, C, cx, rs, ebuf, chunk_max, gw)
                        : RowStatsStrided<kSoft>(x, p.x_cstride, pt, p.t_cstride, C, cx, rs);
        if (!ok) rs.lse = kNaN;
        Acc loss = 0, zl = 0;
        if (!ignored) {
          if (ok) {
            loss =
                kSoft ? math::ce_soft_row_loss(cx.rp, rs) : math::ce_index_row_loss(cx.rp, rs, w_y, cx.xf.apply(x_y));
            zl = math::z_loss_row(cx.rp, rs.lse);
            loss += zl;
          } else {
            loss = zl = kNaN;  // as PyTorch: NaN or +inf logits, or a row of only -inf, make the loss NaN
          }
        }
        if (p.lse_rows != nullptr) {
          if (p.lse_f64) {
            static_cast<double*>(p.lse_rows)[r] = ok ? static_cast<double>(rs.top) + static_cast<double>(rs.log_s)
                                                     : std::numeric_limits<double>::quiet_NaN();
          } else {
            static_cast<Acc*>(p.lse_rows)[r] = rs.lse;
          }
        }
        if (p.loss_rows != nullptr) static_cast<Acc*>(p.loss_rows)[r] = loss;
        if (p.zloss_rows != nullptr) static_cast<Acc*>(p.zloss_rows)[r] = zl;
        block_loss += static_cast<double>(loss);
        block_zloss += static_cast<double>(zl);
      } else {
        if (p.lse_f64) {
          // top + log_s = the saved double: (top - z) + log_s then keeps the forward's precision
          const double saved = static_cast<const double*>(p.lse_in)[r];
          rs.top = static_cast<Acc>(saved);
          rs.log_s = std::isfinite(rs.top) ? static_cast<Acc>(saved - static_cast<double>(rs.top)) : Acc(0);
          rs.lse = rs.top;
        } else {
          rs.lse = static_cast<const Acc*>(p.lse_in)[r];
          rs.top = rs.lse;  // only the rounded lse is known here
          rs.log_s = 0;
        }
        ok = !std::isnan(rs.lse);
        if (kSoft && ok) rs.sum_wp = RowSumWp<T, Acc>(pt, p.t_cstride, C, cx.w);
      }
      if (!bwd) continue;

      T* g = grad + p.index.offset(core::kGradRow, r);
      if (!ok) {
        // PyTorch's log_softmax backward gives NaN on such a row, even when its target is ignored.
        FillRow<T>(g, p.g_cstride, C, kNaN);
        continue;
      }
      if (ignored) {
        FillRow<T>(g, p.g_cstride, C, Acc(0));  // ignored rows get no gradient
        continue;
      }
      Acc gscale = static_cast<Acc>(p.grad_scale);
      if (p.grad_loss != nullptr) {
        gscale = static_cast<Acc>(static_cast<const Acc*>(p.grad_loss)[p.index.offset(core::kGradLossRow, r)] *
                                  p.grad_scale);
      }
      const Acc A = kSoft ? math::ce_soft_grad_a(cx.rp, rs) : math::ce_index_grad_a(cx.rp, rs.lse, w_y);
      if (stream && reinterpret_cast<std::uintptr_t>(g) % 64 == 0) {
        GradRow<kCap, kSoft, kBf16, kStreamable>(ebuf, chunk_max, x, pt, g, p, C, cx, rs, gscale, A);
      } else if (pair_hw) {
        GradRow<kCap, kSoft, kBf16, false>(ebuf, chunk_max, x, pt, g, p, C, cx, rs, gscale, A);
      } else {
        GradRow<kCap, kSoft, false, false>(ebuf, chunk_max, x, pt, g, p, C, cx, rs, gscale, A);
      }
      if constexpr (!kSoft) {
        // The target's own term, computed from the saved logit so in-place and separate agree bitwise.
        const Acc q_y = std::exp(-math::lse_minus(rs, cx.xf.apply(x_y)));
        const Acc b_y = cx.rp.eps_over_c * w_y + (Acc(1) - cx.rp.eps) * w_y;
        g[y * p.g_cstride] = FromAcc<T>((q_y * A - b_y) * gscale * cx.xf.derivative(x_y));
      }
    }
    if (p.block_loss != nullptr) {
      p.block_loss[blk] = block_loss;
      p.block_zloss[blk] = block_zloss;
    }
  }
  if (stream) hwy::FlushStream();  // streaming stores are weakly ordered: make them visible before returning
}

// The one switch point: runtime dtype and flags become template parameters.
template <class T, class Acc>
void BlocksFor(const CeParams& p, std::int64_t b0, std::int64_t b1) {
  if (p.softcap > 0) {
    p.soft ? Blocks<true, true, T, Acc>(p, b0, b1) : Blocks<true, false, T, Acc>(p, b0, b1);
  } else {
    p.soft ? Blocks<false, true, T, Acc>(p, b0, b1) : Blocks<false, false, T, Acc>(p, b0, b1);
  }
}

void CrossEntropyBlocks(const CeParams& p, std::int64_t b0, std::int64_t b1) {
  math::visit_float_storage<hwy::bfloat16_t, hwy::float16_t>(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    BlocksFor<T, math::AccOf<T>>(p, b0, b1);
  });
}

// CeMode::scale (cross_entropy_scale_held): rows [r0, r1) of the gradient times their upstream gradient, in Acc
// (pooled: every row; the call has checked the targets).
template <class T, class Acc>
HWY_NOINLINE void ScaleRowsFor(const CeParams& p, std::int64_t r0, std::int64_t r1) {
  const hn::ScalableTag<Acc> d;
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  const std::int64_t C = p.classes, gs = p.g_cstride;
  for (std::int64_t r = r0; r < r1; ++r) {
    const Acc s = static_cast<const Acc*>(p.grad_loss)[p.index.offset(core::kGradLossRow, r)];
    if (s == Acc(1)) continue;
    if (!p.soft && !p.pooled &&
        core::read_target(p.target, p.target_dtype, p.index.offset(core::kTargetRow, r)) == p.ignore_index) {
      continue;
    }
    T* g = static_cast<T*>(p.grad) + p.index.offset(core::kGradRow, r);
    std::int64_t c = 0;
    if (gs == 1) {
      const auto vs = hn::Set(d, s);
      for (; c + lanes <= C; c += lanes) StoreAcc(d, hn::Mul(LoadAcc(d, g + c), vs), g + c);
    }
    for (; c < C; ++c) g[c * gs] = FromAcc<T>(ToAcc<Acc>(g[c * gs]) * s);
  }
}

void ScaleRows(const CeParams& p, std::int64_t r0, std::int64_t r1) {
  math::visit_float_storage<hwy::bfloat16_t, hwy::float16_t>(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    ScaleRowsFor<T, math::AccOf<T>>(p, r0, r1);
  });
}

template <class F>
void ApplyArray(const float* x, float* y, std::int64_t n, F f) {
  const hn::ScalableTag<float> d;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(d));
  std::int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(f(d, hn::LoadU(d, x + i)), d, y + i);
  if (i < n) {
    HWY_ALIGN float buf[hn::MaxLanes(d)] = {};
    for (std::int64_t j = i; j < n; ++j) buf[j - i] = x[j];
    for (std::int64_t j = n - i; j < N; ++j) buf[j] = 1.0f;  // a valid argument for every function here
    hn::Store(f(d, hn::Load(d, buf)), d, buf);
    for (std::int64_t j = i; j < n; ++j) y[j] = buf[j - i];
  }
}

void FastLogArray(const float* x, float* y, std::int64_t n) {
  ApplyArray(x, y, n, [](auto d, auto v) { return FastLogPositive(d, v); });
}

void FastLog1pArray(const float* x, float* y, std::int64_t n) {
  ApplyArray(x, y, n, [](auto d, auto v) { return FastLog1pPositive(d, v); });
}

void FastExpArray(const float* x, float* y, std::int64_t n) {
  ApplyArray(x, y, n, [](auto d, auto v) { return FastExp(d, v); });
}

void FastLog1pUnitArray(const float* x, float* y, std::int64_t n) {
  ApplyArray(x, y, n, [](auto d, auto v) { return FastLog1pUnit(d, v); });
}

void ExpAnyArray(const float* x, float* y, std::int64_t n) {
  ApplyArray(x, y, n, [](auto d, auto v) { return ExpAny(d, v); });
}

}  // namespace lossfuse::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "cpu/kernels.hpp"
#include "lossfuse/parallel.hpp"

namespace lossfuse::cpu {

HWY_EXPORT(CrossEntropyBlocks);
HWY_EXPORT(ScaleRows);
HWY_EXPORT(FastExpArray);
HWY_EXPORT(ExpAnyArray);
HWY_EXPORT(FastLogArray);
HWY_EXPORT(FastLog1pArray);
HWY_EXPORT(FastLog1pUnitArray);

void fast_exp(const float* x, float* y, std::int64_t n) { HWY_DYNAMIC_DISPATCH(FastExpArray)(x, y, n); }
void exp_any(const float* x, float* y, std::int64_t n) { HWY_DYNAMIC_DISPATCH(ExpAnyArray)(x, y, n); }
void fast_log(const float* x, float* y, std::int64_t n) { HWY_DYNAMIC_DISPATCH(FastLogArray)(x, y, n); }
void fast_log1p(const float* x, float* y, std::int64_t n) { HWY_DYNAMIC_DISPATCH(FastLog1pArray)(x, y, n); }
void fast_log1p_unit(const float* x, float* y, std::int64_t n) { HWY_DYNAMIC_DISPATCH(FastLog1pUnitArray)(x, y, n); }

void cross_entropy_rows(const core::CeParams& p) {
  if (p.mode == core::CeMode::scale) {
    // one upstream value for every row: a value of 1 returns before any task starts
    const double up = p.dtype == DType::f64 ? *static_cast<const double*>(p.grad_loss)
                                            : static_cast<double>(*static_cast<const float*>(p.grad_loss));
    if (p.grad_loss_uniform && up == 1.0) return;
    if (p.pooled) {  // kept whole when every target is ignored
      bool counted = false;
      for (std::int64_t i = 0; i < p.pooled_targets && !counted; ++i) {
        counted = core::read_target(p.target, p.target_dtype, i * p.pooled_stride) != p.ignore_index;
      }
      if (!counted) return;
    }
    const std::int64_t grain = std::max<std::int64_t>(1, 65536 / std::max<std::int64_t>(1, p.classes));
    parallel_for(0, p.rows, grain, [&p](std::int64_t r0, std::int64_t r1) {
      HWY_DYNAMIC_DISPATCH(ScaleRows)(p, r0, r1);
    });
    return;
  }
  const std::int64_t blocks = (p.rows + p.rows_per_block - 1) / p.rows_per_block;
  // about 64K elements of work per task
  const std::int64_t grain = std::max<std::int64_t>(1, 65536 / std::max<std::int64_t>(1, p.classes * p.rows_per_block));
  parallel_for(0, blocks, grain, [&p](std::int64_t b0, std::int64_t b1) {
    HWY_DYNAMIC_DISPATCH(CrossEntropyBlocks)(p, b0, b1);
  });
}

}  // namespace lossfuse::cpu
#endif  // HWY_ONCE
