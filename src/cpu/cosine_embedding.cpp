// CPU cosine embedding loss.
//
// x1, x2: (rows, D), any strides; target: one value per row (the inputs' float dtype or any integer dtype).
// Per row: s12 = sum x1 x2, s11 = sum x1^2, s22 = sum x2^2 in one pass; m_i = s_ii + 1e-12,
// cos = s12 / sqrt(m1 m2); loss = 1 - cos (y = 1), max(0, cos - margin) (y = -1), else 0.
// Backward, k = upstream * dloss/dcos:  grad_x1 = k (x2 / den - cos x1 / m1),  grad_x2 = k (x1 / den - cos x2 / m2).
// Rows contiguous along D run in Highway vectors (dynamic dispatch) with a scalar tail; other rows are scalar. The
// vector sums are combined in a fixed order, so results do not depend on the thread count.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/cosine_embedding.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// (foreach_target.h must stay first; this comment keeps clang-format from regrouping it)

#include <cstdint>

#include "core/margin_problem.hpp"
#include "cpu/hwy_io-inl.h"
#include "cpu/margin_common.hpp"
#include "cpu/margin_hwy-inl.h"
#include "hwy/highway.h"
#include "math/margin_math.hpp"

HWY_BEFORE_NAMESPACE();
namespace lossfuse::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// One row: the loss (forward) or the gradients (backward).
template <class T>
MarginAcc<T> CosineRow(const core::MarginParams& p, std::int64_t r) {
  using Acc = MarginAcc<T>;
  const std::int64_t D = p.D;
  const T* a = static_cast<const T*>(p.x[0]) + p.index.offset(core::kMvX0, r);
  const T* b = static_cast<const T*>(p.x[1]) + p.index.offset(core::kMvX1, r);
  const std::int64_t s1 = p.inner[core::kMvX0], s2 = p.inner[core::kMvX1];
  T* g1 = static_cast<T*>(p.grad[0]);
  T* g2 = static_cast<T*>(p.grad[1]);
  const std::int64_t sg1 = p.inner[core::kMvG0], sg2 = p.inner[core::kMvG1];
  const bool contiguous = s1 == 1 && s2 == 1 &&
                          (!p.backward || ((g1 == nullptr || sg1 == 1) && (g2 == nullptr || sg2 == 1)));
  const hn::ScalableTag<Acc> d;
  using V = hn::Vec<decltype(d)>;
  const auto N = static_cast<std::int64_t>(hn::Lanes(d));
  const std::int64_t vec_end = contiguous ? D - D % N : 0;
  const double y = core::read_as_double(p.target, p.target_dtype, p.index.offset(core::kMvTarget, r));
  const Acc margin_ = static_cast<Acc>(p.margin);

  V v12 = hn::Zero(d), v11 = hn::Zero(d), v22 = hn::Zero(d);
  for (std::int64_t c = 0; c < vec_end; c += N) {
    const V u = LoadAcc(d, a + c), v = LoadAcc(d, b + c);
    v12 = hn::MulAdd(u, v, v12);
    v11 = hn::MulAdd(u, u, v11);
    v22 = hn::MulAdd(v, v, v22);
  }
  Acc s12 = 0, s11 = 0, s22 = 0;
  if (vec_end > 0) {
    s12 = hn::GetLane(hn::SumOfLanes(d, v12));
    s11 = hn::GetLane(hn::SumOfLanes(d, v11));
    s22 = hn::GetLane(hn::SumOfLanes(d, v22));
  }
  for (std::int64_t c = vec_end; c < D; ++c) {
    const Acc u = ToAcc<Acc>(a[c * s1]), v = ToAcc<Acc>(b[c * s2]);
    s12 += u * v;
    s11 += u * u;
    s22 += v * v;
  }
  const math::CosineRow<Acc> cr = math::cosine_row(s12, s11, s22);
  if (!p.backward) return math::cosine_loss(cr.cos, margin_, y);

  const Acc k = math::cosine_dloss_dcos(cr.cos, margin_, y) * core::margin_upstream<Acc>(p, r);
  const Acc ka = k * cr.inv_den, kb1 = k * cr.cos_m1, kb2 = k * cr.cos_m2;
  // grad = ka * other - kb * self
  auto grad = [&](T* g, std::int64_t sg, const T* self, std::int64_t ss, const T* other, std::int64_t so, Acc kb) {
    const V vka = hn::Set(d, ka), vkb = hn::Set(d, kb);
    for (std::int64_t c = 0; c < vec_end; c += N)
      StoreAcc(d, hn::Sub(hn::Mul(vka, LoadAcc(d, other + c)), hn::Mul(vkb, LoadAcc(d, self + c))), g + c);
    for (std::int64_t c = vec_end; c < D; ++c)
      g[c * sg] = FromAcc<T>(ka * ToAcc<Acc>(other[c * so]) - kb * ToAcc<Acc>(self[c * ss]));
  };
  if (g1 != nullptr) grad(g1 + p.index.offset(core::kMvG0, r), sg1, a, s1, b, s2, kb1);
  if (g2 != nullptr) grad(g2 + p.index.offset(core::kMvG1, r), sg2, b, s2, a, s1, kb2);
  return Acc(0);
}

void CosineBlocks(const core::MarginParams& p, std::int64_t b0, std::int64_t b1) {
  VisitStorage(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    margin::run_blocks<MarginAcc<T>>(p, b0, b1, [&p](std::int64_t r) { return CosineRow<T>(p, r); });
  });
}

}  // namespace lossfuse::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "cpu/margin_kernels.hpp"
#include "lossfuse/parallel.hpp"

namespace lossfuse::cpu {

HWY_EXPORT(CosineBlocks);

void cosine_embedding_rows(const core::MarginParams& p) {
  parallel_for(0, margin::num_blocks(p), margin::block_grain(p, 2 * p.D), [&p](std::int64_t b0, std::int64_t b1) {
    HWY_DYNAMIC_DISPATCH(CosineBlocks)(p, b0, b1);
  });
}

}  // namespace lossfuse::cpu
#endif  // HWY_ONCE
