// CPU multi-label soft margin loss.
//
// input, target: (rows, C), the same float dtype, any strides; weight: Acc (C) or null (padded with zeros to a
// multiple of 64, so whole vectors may be read).
//   loss = -(1/C) sum_c w_c [y_c log sigmoid(x_c) + (1 - y_c) log sigmoid(-x_c)]
//   grad_x = g w_c (sigmoid(x_c) - y_c) / C,   grad_y = -g w_c x_c / C    (torch differentiates the target)
// One pass per row. Both logs share l = log1p(exp(-|x|)): log sigmoid(+-x) = min(+-x, 0) - l.
// Rows whose input, target and gradients are all contiguous along C run in Highway vectors (exp and the log1p of
// e^-|x| in [0, 1] from hwy_exp-inl.h: a few ulp; exp results below the smallest normal flush to 0, so e.g.
// sigmoid(-100) is 0 in float32 instead of 3.7e-44), with a scalar tail (src/math/margin_math.hpp); other rows are
// scalar.
// The vector partial sums are combined in a fixed order, so results do not depend on the thread count.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/multilabel_soft_margin.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// (foreach_target.h must stay first; this comment keeps clang-format from regrouping it)

#include <cstdint>
#include <type_traits>

#include "core/margin_problem.hpp"
#include "cpu/hwy_exp-inl.h"
#include "cpu/hwy_io-inl.h"
#include "cpu/margin_common.hpp"
#include "cpu/margin_hwy-inl.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "math/margin_math.hpp"

HWY_BEFORE_NAMESPACE();
namespace lossfuse::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class T>
HWY_INLINE MarginAcc<T> LoadS(const T* p, std::int64_t i) {
  return ToAcc<MarginAcc<T>>(p[i]);
}

// One row: the loss (forward) or the gradients (backward).
template <class T>
MarginAcc<T> SoftRow(const core::MarginParams& p, std::int64_t r) {
  using Acc = MarginAcc<T>;
  const std::int64_t C = p.D;
  const auto* w = static_cast<const Acc*>(p.weight);
  const T* x = static_cast<const T*>(p.x[0]) + p.index.offset(core::kMvX0, r);
  const T* t = static_cast<const T*>(p.target) + p.index.offset(core::kMvTarget, r);
  T* gx = static_cast<T*>(p.grad[0]);
  T* gt = static_cast<T*>(p.grad[1]);
  if (gx != nullptr) gx += p.index.offset(core::kMvG0, r);
  if (gt != nullptr) gt += p.index.offset(core::kMvG1, r);
  const std::int64_t sx = p.inner[core::kMvX0], st = p.inner[core::kMvTarget];
  const std::int64_t sgx = p.inner[core::kMvG0], sgt = p.inner[core::kMvG1];
  const bool contiguous =
      sx == 1 && st == 1 && (gx == nullptr || !p.backward || sgx == 1) && (gt == nullptr || !p.backward || sgt == 1);
  const hn::ScalableTag<Acc> d;
  const auto N = static_cast<std::int64_t>(hn::Lanes(d));
  const std::int64_t vec_end = contiguous ? C - C % N : 0;
  using V = hn::Vec<decltype(d)>;
  const V zero = hn::Zero(d), one = hn::Set(d, Acc(1));

  if (!p.backward) {
    V acc = zero;
    for (std::int64_t c = 0; c < vec_end; c += N) {
      const V xv = LoadAcc(d, x + c), yv = LoadAcc(d, t + c);
      const V l = FastLog1pUnit(d, FastExp(d, hn::Neg(hn::Abs(xv))));
      const V lsp = hn::Sub(hn::Min(xv, zero), l);
      const V lsn = hn::Sub(hn::Min(hn::Neg(xv), zero), l);
      V term = hn::Add(hn::Mul(yv, lsp), hn::Mul(hn::Sub(one, yv), lsn));
      if (w != nullptr) term = hn::Mul(hn::LoadU(d, w + c), term);
      acc = hn::Sub(acc, term);
    }
    Acc sum = vec_end > 0 ? hn::GetLane(hn::SumOfLanes(d, acc)) : Acc(0);
    for (std::int64_t c = vec_end; c < C; ++c)
      sum += math::soft_margin_term(LoadS(x, c * sx), LoadS(t, c * st), w != nullptr ? w[c] : Acc(1));
    return sum / static_cast<Acc>(C);  // C = 0: 0/0 = nan, as torch's sum / C
  }

  const Acc k = core::margin_upstream<Acc>(p, r) / static_cast<Acc>(C);
  const V kv = hn::Set(d, k);
  for (std::int64_t c = 0; c < vec_end; c += N) {
    const V xv = LoadAcc(d, x + c);
    const V kw = w != nullptr ? hn::Mul(kv, hn::LoadU(d, w + c)) : kv;
    if (gx != nullptr) {
      const V e = FastExp(d, hn::Neg(hn::Abs(xv)));
      const V rr = hn::Div(one, hn::Add(one, e));
      const V s = hn::IfThenElse(hn::Ge(xv, zero), rr, hn::Mul(e, rr));  // sigmoid(x); NaN stays NaN
      StoreAcc(d, hn::Mul(kw, hn::Sub(s, LoadAcc(d, t + c))), gx + c);
    }
    if (gt != nullptr) StoreAcc(d, hn::Neg(hn::Mul(kw, xv)), gt + c);
  }
  for (std::int64_t c = vec_end; c < C; ++c) {
    const Acc xv = LoadS(x, c * sx), wc = w != nullptr ? w[c] : Acc(1);
    if (gx != nullptr) gx[c * sgx] = FromAcc<T>((k * wc) * (math::sigmoid(xv) - LoadS(t, c * st)));
    if (gt != nullptr) gt[c * sgt] = FromAcc<T>(-(k * wc) * xv);
  }
  return Acc(0);
}

void SoftMarginBlocks(const core::MarginParams& p, std::int64_t b0, std::int64_t b1) {
  VisitStorage(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    margin::run_blocks<MarginAcc<T>>(p, b0, b1, [&p](std::int64_t r) { return SoftRow<T>(p, r); });
  });
}

}  // namespace lossfuse::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "cpu/margin_kernels.hpp"
#include "lossfuse/parallel.hpp"

namespace lossfuse::cpu {

HWY_EXPORT(SoftMarginBlocks);

void multilabel_soft_margin_rows(const core::MarginParams& p) {
  parallel_for(0, margin::num_blocks(p), margin::block_grain(p, 2 * p.D), [&p](std::int64_t b0, std::int64_t b1) {
    HWY_DYNAMIC_DISPATCH(SoftMarginBlocks)(p, b0, b1);
  });
}

}  // namespace lossfuse::cpu
#endif  // HWY_ONCE
