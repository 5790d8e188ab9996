// CPU multi-class margin loss.
//
// input: (rows, C), any strides; target: a class index per row (any integer dtype, checked in core); weight:
// Acc (C) or null. Per row, z_j = margin - x_y + x_j:
//   loss = sum_{j != y} w_y max(0, z_j)^p / C                      (p in {1, 2}; a NaN z_j adds 0, as torch)
//   grad_j = g w_y slope_p(z_j) / C (j != y),  grad_y = -sum_{j != y} grad_j,  slope_1 = 1, slope_2 = 2 z (z > 0).
// One pass per row after reading x_y. Rows contiguous along C (input and gradient) run in Highway vectors, the
// j == y lane masked out of the sums, with a scalar tail (src/math/margin_math.hpp); other rows are scalar. The
// vector partial sums are combined in a fixed order, so results do not depend on the thread count.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/multi_margin.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// (foreach_target.h must stay first; this comment keeps clang-format from regrouping it)

#include <cstdint>
#include <type_traits>

#include "core/margin_problem.hpp"
#include "core/targets.hpp"
#include "cpu/hwy_io-inl.h"
#include "cpu/margin_common.hpp"
#include "cpu/margin_hwy-inl.h"
#include "hwy/highway.h"
#include "math/margin_math.hpp"

HWY_BEFORE_NAMESPACE();
namespace lossfuse::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// One row: the loss (forward) or the gradients (backward).
template <class T, int P>
MarginAcc<T> MultiMarginRow(const core::MarginParams& p, std::int64_t r) {
  using Acc = MarginAcc<T>;
  const std::int64_t C = p.D;
  const auto* w = static_cast<const Acc*>(p.weight);
  const T* x = static_cast<const T*>(p.x[0]) + p.index.offset(core::kMvX0, r);
  const std::int64_t sx = p.inner[core::kMvX0], sg = p.inner[core::kMvG0];
  const std::int64_t y = core::read_target(p.target, p.target_dtype, p.index.offset(core::kMvTarget, r));
  const Acc x_y = ToAcc<Acc>(x[y * sx]);
  const Acc w_y = w != nullptr ? w[y] : Acc(1);
  const Acc base = static_cast<Acc>(p.margin) - x_y;  // z_j = base + x_j, as hinge_z rounds it
  const hn::ScalableTag<Acc> d;
  using V = hn::Vec<decltype(d)>;
  const auto N = static_cast<std::int64_t>(hn::Lanes(d));
  const bool contiguous = sx == 1 && (!p.backward || sg == 1);
  const std::int64_t vec_end = contiguous ? C - C % N : 0;
  const V vbase = hn::Set(d, base), zero = hn::Zero(d);
  const hn::RebindToSigned<decltype(d)> di;
  // the j == y lane of the vector starting at c (no lane when y lies outside it)
  auto not_y = [&](std::int64_t c) {
    using TI = hn::TFromD<decltype(di)>;
    return hn::RebindMask(d, hn::Ne(hn::Iota(di, TI(0)), hn::Set(di, static_cast<TI>(y - c))));
  };
  auto positive = [&](V z) { return hn::Gt(z, zero); };  // false for NaN

  if (!p.backward) {
    V acc = zero;
    for (std::int64_t c = 0; c < vec_end; c += N) {
      const V z = hn::Add(vbase, LoadAcc(d, x + c));
      V term = hn::IfThenElseZero(positive(z), P == 2 ? hn::Mul(z, z) : z);
      if (y >= c && y < c + N) term = hn::IfThenElseZero(not_y(c), term);
      acc = hn::Add(acc, term);
    }
    Acc sum = vec_end > 0 ? hn::GetLane(hn::SumOfLanes(d, acc)) * w_y : Acc(0);
    for (std::int64_t c = vec_end; c < C; ++c) {
      if (c != y) sum += math::hinge_value(math::hinge_z(static_cast<Acc>(p.margin), x_y, ToAcc<Acc>(x[c * sx])), P) * w_y;
    }
    return sum / static_cast<Acc>(C);
  }

  const Acc coef = core::margin_upstream<Acc>(p, r) * w_y / static_cast<Acc>(C);
  T* g = static_cast<T*>(p.grad[0]) + p.index.offset(core::kMvG0, r);
  const V vcoef = hn::Set(d, coef), two_coef = hn::Set(d, Acc(2) * coef);
  V part = zero;
  for (std::int64_t c = 0; c < vec_end; c += N) {
    const V z = hn::Add(vbase, LoadAcc(d, x + c));
    const V h = hn::IfThenElseZero(positive(z), P == 2 ? hn::Mul(two_coef, z) : vcoef);
    StoreAcc(d, h, g + c);
    part = hn::Add(part, (y >= c && y < c + N) ? hn::IfThenElseZero(not_y(c), h) : h);
  }
  Acc total = vec_end > 0 ? hn::GetLane(hn::SumOfLanes(d, part)) : Acc(0);
  for (std::int64_t c = vec_end; c < C; ++c) {
    const Acc h = coef * math::hinge_slope(math::hinge_z(static_cast<Acc>(p.margin), x_y, ToAcc<Acc>(x[c * sx])), P);
    if (c != y) total += h;
    g[c * sg] = FromAcc<T>(h);
  }
  g[y * sg] = FromAcc<T>(-total);  // written last, over the j == y term
  return Acc(0);
}

template <int P>
void BlocksFor(const core::MarginParams& p, std::int64_t b0, std::int64_t b1) {
  VisitStorage(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    margin::run_blocks<MarginAcc<T>>(p, b0, b1, [&p](std::int64_t r) { return MultiMarginRow<T, P>(p, r); });
  });
}

void MultiMarginBlocks(const core::MarginParams& p, std::int64_t b0, std::int64_t b1) {
  if (p.p == 2.0) return BlocksFor<2>(p, b0, b1);
  return BlocksFor<1>(p, b0, b1);
}

}  // namespace lossfuse::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "cpu/margin_kernels.hpp"
#include "lossfuse/parallel.hpp"

namespace lossfuse::cpu {

HWY_EXPORT(MultiMarginBlocks);

void multi_margin_rows(const core::MarginParams& p) {
  parallel_for(0, margin::num_blocks(p), margin::block_grain(p, p.D), [&p](std::int64_t b0, std::int64_t b1) {
    HWY_DYNAMIC_DISPATCH(MultiMarginBlocks)(p, b0, b1);
  });
}

}  // namespace lossfuse::cpu
#endif  // HWY_ONCE
