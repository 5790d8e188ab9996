// CPU triplet margin loss.
//
// anchor, positive, negative: (rows, D), any strides (stride 0 for broadcast inputs); loss (rows) or reduced.
// d(u, v) = ||u - v + eps||_p over D; loss = max(0, margin + d(a, p) - d_neg), d_neg = d(a, n), or with swap
// min(d(a, n), d(p, n)). Backward, with k = upstream gradient where the loss is > 0 (else 0) and n'(v) the
// norm gradient (src/math/margin_math.hpp):
//   grad_a = k (n'(v_ap) - s_an n'(v_an)),  grad_p = k (-n'(v_ap) - s_pn n'(v_pn)),
//   grad_n = k (s_an n'(v_an) + s_pn n'(v_pn)),  (s_an, s_pn) the swap weights ((1, 0) without swap).
// Per row: one pass for the three norms; the backward adds a pass writing the gradients (p = inf also counts
// the elements attaining each max, which share its gradient). Scalar loops over the row.
#include <cmath>
#include <limits>
#include <type_traits>

#include "cpu/margin_common.hpp"
#include "cpu/margin_kernels.hpp"
#include "math/margin_math.hpp"

namespace lossfuse::cpu {
namespace {

using math::NormKind;
using namespace margin;

template <class T, NormKind K>
void run(const core::MarginParams& p) {
  using Acc = typename Io<T>::Acc;
  const auto* xa = static_cast<const T*>(p.x[0]);
  const auto* xp = static_cast<const T*>(p.x[1]);
  const auto* xn = static_cast<const T*>(p.x[2]);
  const std::int64_t D = p.D;
  const Acc eps = static_cast<Acc>(p.eps), pw = static_cast<Acc>(p.p), margin_ = static_cast<Acc>(p.margin);
  const bool swap = p.swap;
  // kc: every view is contiguous along D (strides known to be 1, so the loops vectorize)
  auto row = [&](auto kc, std::int64_t r) -> Acc {
    constexpr bool kContig = decltype(kc)::value;
    const std::int64_t sa = kContig ? 1 : p.inner[core::kMvX0], sp = kContig ? 1 : p.inner[core::kMvX1];
    const std::int64_t sn = kContig ? 1 : p.inner[core::kMvX2];
    const T* a = xa + p.index.offset(core::kMvX0, r);
    const T* b = xp + p.index.offset(core::kMvX1, r);
    const T* n = xn + p.index.offset(core::kMvX2, r);
    Acc nap = 0, nan_ = 0, npn = 0;
    for (std::int64_t c = 0; c < D; ++c) {
      const Acc va = Io<T>::load(a, c * sa), vp = Io<T>::load(b, c * sp), vn = Io<T>::load(n, c * sn);
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
    const Acc k = z > Acc(0) ? upstream<Acc>(p, r) : Acc(0);  // clamp_min passes the gradient where z > 0
    const math::SwapWeights<Acc> sw = math::triplet_swap_weights(swap, d_an, d_pn);
    const Acc k_an = k * sw.an, k_pn = k * sw.pn;
    // p = inf: the gradient of a max is shared by every element attaining it (and NaNs), as in torch.
    Acc c_ap = 1, c_an = 1, c_pn = 1;
    if constexpr (K == NormKind::inf) {
      c_ap = c_an = c_pn = 0;
      for (std::int64_t c = 0; c < D; ++c) {
        const Acc va = Io<T>::load(a, c * sa), vp = Io<T>::load(b, c * sp), vn = Io<T>::load(n, c * sn);
        const Acc v1 = std::fabs(va - vp + eps), v2 = std::fabs(va - vn + eps), v3 = std::fabs(vp - vn + eps);
        c_ap += (v1 == d_ap || v1 != v1) ? Acc(1) : Acc(0);
        c_an += (v2 == d_an || v2 != v2) ? Acc(1) : Acc(0);
        c_pn += (v3 == d_pn || v3 != v3) ? Acc(1) : Acc(0);
      }
    }
    T* ga = static_cast<T*>(p.grad[0]);
    T* gp = static_cast<T*>(p.grad[1]);
    T* gn = static_cast<T*>(p.grad[2]);
    if (ga != nullptr) ga += p.index.offset(core::kMvG0, r);
    if (gp != nullptr) gp += p.index.offset(core::kMvG1, r);
    if (gn != nullptr) gn += p.index.offset(core::kMvG2, r);
    const std::int64_t sga = kContig ? 1 : p.inner[core::kMvG0], sgp = kContig ? 1 : p.inner[core::kMvG1];
    const std::int64_t sgn = kContig ? 1 : p.inner[core::kMvG2];
    for (std::int64_t c = 0; c < D; ++c) {
      const Acc va = Io<T>::load(a, c * sa), vp = Io<T>::load(b, c * sp), vn = Io<T>::load(n, c * sn);
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
      if (ga != nullptr) Io<T>::store(ga, c * sga, k * n_ap - k_an * n_an);
      if (gp != nullptr) Io<T>::store(gp, c * sgp, -k * n_ap - k_pn * n_pn);
      if (gn != nullptr) Io<T>::store(gn, c * sgn, k_an * n_an + k_pn * n_pn);
    }
    return Acc(0);
  };
  const bool contig =
      all_unit_stride(p, {core::kMvX0, core::kMvX1, core::kMvX2, core::kMvG0, core::kMvG1, core::kMvG2});
  for_rows<Acc>(p, 3 * D,
                [&](std::int64_t r) { return contig ? row(std::true_type{}, r) : row(std::false_type{}, r); });
}

template <class T>
void run_kind(const core::MarginParams& p) {
  switch (math::norm_kind(p.p)) {
    case NormKind::zero: return run<T, NormKind::zero>(p);
    case NormKind::one: return run<T, NormKind::one>(p);
    case NormKind::two: return run<T, NormKind::two>(p);
    case NormKind::inf: return run<T, NormKind::inf>(p);
    case NormKind::general: return run<T, NormKind::general>(p);
  }
}

}  // namespace

void triplet_margin_rows(const core::MarginParams& p) {
  visit_float_dtype(p.dtype, [&p](auto tag) { run_kind<decltype(tag)>(p); });
}

}  // namespace lossfuse::cpu
