// CPU triplet margin loss.
//
// anchor, positive, negative: (rows, D), any strides (stride 0 for broadcast inputs); loss (rows) or reduced.
// d(u, v) = ||u - v + eps||_p over D; loss = max(0, margin + d(a, p) - d_neg), d_neg = d(a, n), or with swap
// min(d(a, n), d(p, n)). Backward, with k = upstream gradient where the loss is > 0 (else 0) and n'(v) the
// norm gradient (src/math/margin_math.hpp):
//   grad_a = k (n'(v_ap) - s_an n'(v_an)),  grad_p = k (-n'(v_ap) - s_pn n'(v_pn)),
//   grad_n = k (s_an n'(v_an) + s_pn n'(v_pn)),  (s_an, s_pn) the swap weights ((1, 0) without swap).
// Per row: one pass for the three norms; the backward adds a pass writing the gradients (p = inf also counts
// the elements attaining each max, which share its gradient). For p in {0, 1, 2}, rows contiguous along D run in
// Highway vectors (dynamic dispatch; the 2-norm's gradient v / d as v times 1 / d) with a scalar tail; p = inf,
// other p and strided rows are scalar. Vector sums are combined in a fixed order: results do not depend on the
// thread count.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/triplet_margin.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// (foreach_target.h must stay first; this comment keeps clang-format from regrouping it)

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/margin_problem.hpp"
#include "cpu/hwy_io-inl.h"
#include "cpu/margin_common.hpp"
#include "cpu/margin_hwy-inl.h"
#include "hwy/highway.h"
#include "math/margin_math.hpp"

HWY_BEFORE_NAMESPACE();
namespace lossfuse::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using math::NormKind;

// The vector forms of norm_accumulate and norm_grad (src/math/margin_math.hpp) for p in {0, 1, 2}.
template <NormKind K, class D>
HWY_INLINE hn::Vec<D> NormAccumulateV(D d, hn::Vec<D> acc, hn::Vec<D> v) {
  if constexpr (K == NormKind::zero) return hn::Add(acc, hn::IfThenZeroElse(hn::Eq(v, hn::Zero(d)), hn::Set(d, 1)));
  if constexpr (K == NormKind::one) return hn::Add(acc, hn::Abs(v));
  return hn::MulAdd(v, v, acc);
}
// inv: 1 / norm (0 where the norm is 0), for p = 2
template <NormKind K, class D>
HWY_INLINE hn::Vec<D> NormGradV(D d, hn::Vec<D> v, hn::Vec<D> inv) {
  using T = hn::TFromD<D>;
  if constexpr (K == NormKind::zero) return hn::Zero(d);
  if constexpr (K == NormKind::one) {  // sign(v), 0 for 0 and NaN
    const hn::Vec<D> one = hn::Set(d, T(1));
    return hn::Sub(hn::IfThenElseZero(hn::Gt(v, hn::Zero(d)), one), hn::IfThenElseZero(hn::Lt(v, hn::Zero(d)), one));
  }
  return hn::Mul(v, inv);
}

// One row: the loss (forward) or the gradients (backward).
template <class T, NormKind K>
MarginAcc<T> TripletRow(const core::MarginParams& p, std::int64_t r) {
  using Acc = MarginAcc<T>;
  const std::int64_t D = p.D;
  const Acc eps = static_cast<Acc>(p.eps), pw = static_cast<Acc>(p.p), margin_ = static_cast<Acc>(p.margin);
  const bool swap = p.swap;
  const std::int64_t sa = p.inner[core::kMvX0], sp = p.inner[core::kMvX1], sn = p.inner[core::kMvX2];
  const T* a = static_cast<const T*>(p.x[0]) + p.index.offset(core::kMvX0, r);
  const T* b = static_cast<const T*>(p.x[1]) + p.index.offset(core::kMvX1, r);
  const T* n = static_cast<const T*>(p.x[2]) + p.index.offset(core::kMvX2, r);
  T* ga = static_cast<T*>(p.grad[0]);
  T* gp = static_cast<T*>(p.grad[1]);
  T* gn = static_cast<T*>(p.grad[2]);
  const std::int64_t sga = p.inner[core::kMvG0], sgp = p.inner[core::kMvG1], sgn = p.inner[core::kMvG2];
  constexpr bool kVector = K == NormKind::zero || K == NormKind::one || K == NormKind::two;
  const bool contiguous = sa == 1 && sp == 1 && sn == 1 &&
                          (!p.backward || ((ga == nullptr || sga == 1) && (gp == nullptr || sgp == 1) &&
                                           (gn == nullptr || sgn == 1)));
  const hn::ScalableTag<Acc> d;
  using V = hn::Vec<decltype(d)>;
  const auto N = static_cast<std::int64_t>(hn::Lanes(d));
  const std::int64_t vec_end = kVector && contiguous ? D - D % N : 0;
  const V veps = hn::Set(d, eps);

  Acc nap = 0, nan_ = 0, npn = 0;
  if constexpr (kVector) {
    V vap = hn::Zero(d), van = hn::Zero(d), vpn = hn::Zero(d);
    for (std::int64_t c = 0; c < vec_end; c += N) {
      const V va = LoadAcc(d, a + c), vp = LoadAcc(d, b + c), vn = LoadAcc(d, n + c);
      vap = NormAccumulateV<K>(d, vap, hn::Add(hn::Sub(va, vp), veps));
      van = NormAccumulateV<K>(d, van, hn::Add(hn::Sub(va, vn), veps));
      if (swap) vpn = NormAccumulateV<K>(d, vpn, hn::Add(hn::Sub(vp, vn), veps));
    }
    if (vec_end > 0) {
      nap = hn::GetLane(hn::SumOfLanes(d, vap));
      nan_ = hn::GetLane(hn::SumOfLanes(d, van));
      npn = hn::GetLane(hn::SumOfLanes(d, vpn));
    }
  }
  for (std::int64_t c = vec_end; c < D; ++c) {
    const Acc va = ToAcc<Acc>(a[c * sa]), vp = ToAcc<Acc>(b[c * sp]), vn = ToAcc<Acc>(n[c * sn]);
    nap = math::norm_accumulate<K>(nap, va - vp + eps, pw);
    nan_ = math::norm_accumulate<K>(nan_, va - vn + eps, pw);
    if (swap) npn = math::norm_accumulate<K>(npn, vp - vn + eps, pw);
  }
  const Acc d_ap = math::norm_finish<K>(nap, pw), d_an = math::norm_finish<K>(nan_, pw);
  const Acc d_pn = swap ? math::norm_finish<K>(npn, pw) : Acc(0);
  // torch's minimum: NaN if either is NaN
  const Acc d_neg = !swap                            ? d_an
                    : (d_an != d_an || d_pn != d_pn) ? std::numeric_limits<Acc>::quiet_NaN()
                                                     : std::min(d_an, d_pn);
  const Acc loss = math::triplet_loss(margin_, d_ap, d_neg);
  if (!p.backward) return loss;

  const Acc z = margin_ + d_ap - d_neg;
  const Acc k = z > Acc(0) ? core::margin_upstream<Acc>(p, r) : Acc(0);  // clamp_min passes the gradient where z > 0
  const math::SwapWeights<Acc> sw = math::triplet_swap_weights(swap, d_an, d_pn);
  const Acc k_an = k * sw.an, k_pn = k * sw.pn;
  // p = inf: the gradient of a max is shared by every element attaining it (and NaNs), as in torch.
  Acc c_ap = 1, c_an = 1, c_pn = 1;
  if constexpr (K == NormKind::inf) {
    c_ap = c_an = c_pn = 0;
    for (std::int64_t c = 0; c < D; ++c) {
      const Acc va = ToAcc<Acc>(a[c * sa]), vp = ToAcc<Acc>(b[c * sp]), vn = ToAcc<Acc>(n[c * sn]);
      const Acc v1 = std::fabs(va - vp + eps), v2 = std::fabs(va - vn + eps), v3 = std::fabs(vp - vn + eps);
      c_ap += (v1 == d_ap || v1 != v1) ? Acc(1) : Acc(0);
      c_an += (v2 == d_an || v2 != v2) ? Acc(1) : Acc(0);
      c_pn += (v3 == d_pn || v3 != v3) ? Acc(1) : Acc(0);
    }
  }
  if (ga != nullptr) ga += p.index.offset(core::kMvG0, r);
  if (gp != nullptr) gp += p.index.offset(core::kMvG1, r);
  if (gn != nullptr) gn += p.index.offset(core::kMvG2, r);
  if constexpr (kVector) {
    const V inv_ap = hn::Set(d, d_ap == Acc(0) ? Acc(0) : Acc(1) / d_ap);
    const V inv_an = hn::Set(d, d_an == Acc(0) ? Acc(0) : Acc(1) / d_an);
    const V inv_pn = hn::Set(d, d_pn == Acc(0) ? Acc(0) : Acc(1) / d_pn);
    const V vk = hn::Set(d, k), vk_an = hn::Set(d, k_an), vk_pn = hn::Set(d, k_pn);
    for (std::int64_t c = 0; c < vec_end; c += N) {
      const V va = LoadAcc(d, a + c), vp = LoadAcc(d, b + c), vn = LoadAcc(d, n + c);
      const V n_ap = NormGradV<K>(d, hn::Add(hn::Sub(va, vp), veps), inv_ap);
      const V n_an = NormGradV<K>(d, hn::Add(hn::Sub(va, vn), veps), inv_an);
      const V n_pn = swap ? NormGradV<K>(d, hn::Add(hn::Sub(vp, vn), veps), inv_pn) : hn::Zero(d);
      if (ga != nullptr) StoreAcc(d, hn::Sub(hn::Mul(vk, n_ap), hn::Mul(vk_an, n_an)), ga + c);
      if (gp != nullptr) StoreAcc(d, hn::Sub(hn::Neg(hn::Mul(vk, n_ap)), hn::Mul(vk_pn, n_pn)), gp + c);
      if (gn != nullptr) StoreAcc(d, hn::Add(hn::Mul(vk_an, n_an), hn::Mul(vk_pn, n_pn)), gn + c);
    }
  }
  for (std::int64_t c = vec_end; c < D; ++c) {
    const Acc va = ToAcc<Acc>(a[c * sa]), vp = ToAcc<Acc>(b[c * sp]), vn = ToAcc<Acc>(n[c * sn]);
    const Acc v1 = va - vp + eps, v2 = va - vn + eps;
    Acc n_ap, n_an, n_pn = 0;
    if constexpr (K == NormKind::inf) {
      n_ap = math::norm_grad<K>(v1, d_ap, pw, std::fabs(v1) == d_ap || v1 != v1) / c_ap;
      n_an = math::norm_grad<K>(v2, d_an, pw, std::fabs(v2) == d_an || v2 != v2) / c_an;
      if (swap) {
        const Acc v3 = vp - vn + eps;
        n_pn = math::norm_grad<K>(v3, d_pn, pw, std::fabs(v3) == d_pn || v3 != v3) / c_pn;
      }
    } else {
      n_ap = math::norm_grad<K>(v1, d_ap, pw);
      n_an = math::norm_grad<K>(v2, d_an, pw);
      if (swap) n_pn = math::norm_grad<K>(vp - vn + eps, d_pn, pw);
    }
    if (ga != nullptr) ga[c * sga] = FromAcc<T>(k * n_ap - k_an * n_an);
    if (gp != nullptr) gp[c * sgp] = FromAcc<T>(-k * n_ap - k_pn * n_pn);
    if (gn != nullptr) gn[c * sgn] = FromAcc<T>(k_an * n_an + k_pn * n_pn);
  }
  return Acc(0);
}

template <NormKind K>
void BlocksFor(const core::MarginParams& p, std::int64_t b0, std::int64_t b1) {
  VisitStorage(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    margin::run_blocks<MarginAcc<T>>(p, b0, b1, [&p](std::int64_t r) { return TripletRow<T, K>(p, r); });
  });
}

void TripletBlocks(const core::MarginParams& p, std::int64_t b0, std::int64_t b1) {
  switch (math::norm_kind(p.p)) {
    case NormKind::zero: return BlocksFor<NormKind::zero>(p, b0, b1);
    case NormKind::one: return BlocksFor<NormKind::one>(p, b0, b1);
    case NormKind::two: return BlocksFor<NormKind::two>(p, b0, b1);
    case NormKind::inf: return BlocksFor<NormKind::inf>(p, b0, b1);
    case NormKind::general: return BlocksFor<NormKind::general>(p, b0, b1);
  }
}

}  // namespace lossfuse::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "cpu/margin_kernels.hpp"
#include "lossfuse/parallel.hpp"

namespace lossfuse::cpu {

HWY_EXPORT(TripletBlocks);

void triplet_margin_rows(const core::MarginParams& p) {
  parallel_for(0, margin::num_blocks(p), margin::block_grain(p, 3 * p.D), [&p](std::int64_t b0, std::int64_t b1) {
    HWY_DYNAMIC_DISPATCH(TripletBlocks)(p, b0, b1);
  });
}

}  // namespace lossfuse::cpu
#endif  // HWY_ONCE
