// CPU multi-label margin loss.
//
// input: (rows, C), any strides; target: (rows, C) class indices of any integer dtype, checked in core to lie
// in [-1, C). A row's labels are its target entries before the first -1 (duplicates count again). With
// z_ji = 1 - x_j + x_i:
//   loss = sum_{j in labels} sum_{i not a label} max(0, z_ji) / C
//   grad = (g / C) (number of pairs with z_ji > 0 where the element is i, minus those where it is j)
// O(labels * C) per row, like torch, in Highway vectors over i (dynamic dispatch). The row is gathered once into a
// per-thread Acc buffer padded to whole vectors, beside a threshold per element: 0 for a non-label and +inf for a
// label or a pad lane, so "z > thr" is torch's "not a label and z > 0" in one compare and no lane needs a tail.
// Pair counts are integers, so the gradient is one rounding of count * g / C (exact counts while labels * C <
// 2^24 in float32). Vector sums are combined in a fixed order: results do not depend on the thread count.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/multilabel_margin.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// (foreach_target.h must stay first; this comment keeps clang-format from regrouping it)

#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/margin_problem.hpp"
#include "core/targets.hpp"
#include "cpu/hwy_io-inl.h"
#include "cpu/margin_common.hpp"
#include "cpu/margin_hwy-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace lossfuse::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class Acc>
struct MlScratch {
  std::vector<Acc> x, cnt, thr;
  std::vector<std::int64_t> labels;
};

// One row: the loss (forward) or the gradients (backward).
template <class T>
MarginAcc<T> MultilabelRow(const core::MarginParams& p, std::int64_t r) {
  using Acc = MarginAcc<T>;
  thread_local MlScratch<Acc> sc;
  const hn::ScalableTag<Acc> d;
  using V = hn::Vec<decltype(d)>;
  const auto N = static_cast<std::int64_t>(hn::Lanes(d));
  const std::int64_t C = p.D, s = p.inner[core::kMvX0], st = p.inner[core::kMvTarget];
  const std::int64_t Cp = (C + N - 1) / N * N;
  const auto Cps = static_cast<std::size_t>(Cp);
  const Acc inf = std::numeric_limits<Acc>::infinity();
  sc.labels.clear();
  const T* x = static_cast<const T*>(p.x[0]) + p.index.offset(core::kMvX0, r);
  const std::int64_t toff = p.index.offset(core::kMvTarget, r);
  for (std::int64_t c = 0; c < C; ++c) {
    const std::int64_t t = core::read_target(p.target, p.target_dtype, toff + c * st);
    if (t < 0) break;  // the first -1 ends the list
    sc.labels.push_back(t);
  }
  sc.thr.assign(Cps, Acc(0));
  for (std::int64_t c = C; c < Cp; ++c) sc.thr[c] = inf;
  for (const std::int64_t t : sc.labels) sc.thr[t] = inf;
  sc.x.resize(Cps);
  std::int64_t c0 = 0;
  if (s == 1) {
    for (; c0 + N <= C; c0 += N) hn::StoreU(LoadAcc(d, x + c0), d, sc.x.data() + c0);
  }
  for (std::int64_t c = c0; c < C; ++c) sc.x[c] = ToAcc<Acc>(x[c * s]);
  for (std::int64_t c = C; c < Cp; ++c) sc.x[c] = Acc(0);
  const Acc* xr = sc.x.data();
  const Acc* thr = sc.thr.data();
  const V zero = hn::Zero(d);
  if (!p.backward) {
    V acc = zero;
    for (const std::int64_t j : sc.labels) {
      const V base = hn::Set(d, Acc(1) - xr[j]);  // z = (1 - x_j) + x_i, as hinge_z rounds it
      for (std::int64_t i = 0; i < Cp; i += N) {
        const V z = hn::Add(base, hn::LoadU(d, xr + i));
        acc = hn::Add(acc, hn::IfThenElseZero(hn::Gt(z, hn::LoadU(d, thr + i)), z));
      }
    }
    const Acc sum = hn::GetLane(hn::SumOfLanes(d, acc));
    return sum / static_cast<Acc>(C);
  }
  // Backward: count, per element, the pairs with z > 0 (exact small integers), then scale once.
  sc.cnt.assign(Cps, Acc(0));
  Acc* cnt = sc.cnt.data();
  const V one = hn::Set(d, Acc(1));
  for (const std::int64_t j : sc.labels) {
    const V base = hn::Set(d, Acc(1) - xr[j]);
    V part = zero;
    for (std::int64_t i = 0; i < Cp; i += N) {
      const V on = hn::IfThenElseZero(hn::Gt(hn::Add(base, hn::LoadU(d, xr + i)), hn::LoadU(d, thr + i)), one);
      hn::StoreU(hn::Add(hn::LoadU(d, cnt + i), on), d, cnt + i);
      part = hn::Add(part, on);
    }
    cnt[j] -= hn::GetLane(hn::SumOfLanes(d, part));
  }
  const Acc gc = core::margin_upstream<Acc>(p, r) / static_cast<Acc>(C);
  T* go = static_cast<T*>(p.grad[0]) + p.index.offset(core::kMvG0, r);
  const std::int64_t sg = p.inner[core::kMvG0];
  std::int64_t c = 0;
  if (sg == 1) {
    for (; c + N <= C; c += N) StoreAcc(d, hn::Mul(hn::LoadU(d, cnt + c), hn::Set(d, gc)), go + c);
  }
  for (; c < C; ++c) go[c * sg] = FromAcc<T>(cnt[c] * gc);
  return Acc(0);
}

void MultilabelMarginBlocks(const core::MarginParams& p, std::int64_t b0, std::int64_t b1) {
  VisitStorage(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    margin::run_blocks<MarginAcc<T>>(p, b0, b1, [&p](std::int64_t r) { return MultilabelRow<T>(p, r); });
  });
}

}  // namespace lossfuse::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "cpu/margin_kernels.hpp"
#include "lossfuse/parallel.hpp"

namespace lossfuse::cpu {

HWY_EXPORT(MultilabelMarginBlocks);

void multilabel_margin_rows(const core::MarginParams& p) {
  parallel_for(0, margin::num_blocks(p), margin::block_grain(p, p.D), [&p](std::int64_t b0, std::int64_t b1) {
    HWY_DYNAMIC_DISPATCH(MultilabelMarginBlocks)(p, b0, b1);
  });
}

}  // namespace lossfuse::cpu
#endif  // HWY_ONCE
