// CPU multi-label margin loss.
//
// input: (rows, C), any strides; target: (rows, C) class indices of any integer dtype, checked in core to lie
// in [-1, C). A row's labels are its target entries before the first -1 (duplicates count again); is_label
// marks them. With z_ji = 1 - x_j + x_i:
//   loss = sum_{j in labels} sum_{i not a label} max(0, z_ji) / C
//   grad = (g / C) (number of pairs with z_ji > 0 where the element is i, minus those where it is j)
// O(labels * C) per row, like torch, in branch-free loops the compiler vectorizes. The row is gathered once
// into a per-thread Acc buffer. Pair counts are integers, so the gradient is one rounding of
// count * g / C (exact counts while labels * C < 2^24 in float32).
#include <limits>
#include <vector>

#include "cpu/margin_common.hpp"
#include "cpu/margin_kernels.hpp"
#include "math/margin_math.hpp"

namespace lossfuse::cpu {
namespace {

using namespace margin;

constexpr int kLanes = 8;

template <class Acc>
struct Scratch {
  std::vector<Acc> x, g, thr;
  std::vector<unsigned char> is_label;
  std::vector<std::int64_t> labels;
};

template <class T>
void run(const core::MarginParams& p) {
  using Acc = typename Io<T>::Acc;
  const auto* xs = static_cast<const T*>(p.x[0]);
  const std::int64_t C = p.D, s = p.inner[core::kMvX0], st = p.inner[core::kMvTarget];
  const auto Cs = static_cast<std::size_t>(C);
  for_rows<Acc>(p, C, [&](std::int64_t r) -> Acc {
    thread_local Scratch<Acc> sc;
    sc.x.resize(Cs);
    sc.is_label.assign(Cs, 0);
    sc.labels.clear();
    const T* x = xs + p.index.offset(core::kMvX0, r);
    const std::int64_t toff = p.index.offset(core::kMvTarget, r);
    for (std::int64_t c = 0; c < C; ++c) {
      const std::int64_t t = core::read_target(p.target, p.target_dtype, toff + c * st);
      if (t < 0) break;  // the first -1 ends the list
      sc.labels.push_back(t);
      sc.is_label[static_cast<std::size_t>(t)] = 1;
    }
    // thr: 0 for a non-label, +inf for a label, so "z > thr" is torch's "not a label and z > 0" in one compare
    sc.thr.resize(Cs);
    for (std::int64_t c = 0; c < C; ++c) {
      sc.x[c] = Io<T>::load(x, c * s);
      sc.thr[c] = sc.is_label[c] ? std::numeric_limits<Acc>::infinity() : Acc(0);
    }
    const Acc* xr = sc.x.data();
    const Acc* lab = sc.thr.data();
    if (!p.backward) {
      // Branch-free inner loop over kLanes partial sums (a fixed order: deterministic), combined in lane order.
      Acc sum = 0;
      for (const std::int64_t j : sc.labels) {
        const Acc xj = xr[j];
        Acc part[kLanes] = {};
        std::int64_t i = 0;
        for (; i + kLanes <= C; i += kLanes) {
          for (int l = 0; l < kLanes; ++l) {
            const Acc z = math::hinge_z(Acc(1), xj, xr[i + l]);
            part[l] += z > lab[i + l] ? z : Acc(0);
          }
        }
        for (; i < C; ++i) {
          const Acc z = math::hinge_z(Acc(1), xj, xr[i]);
          part[0] += z > lab[i] ? z : Acc(0);
        }
        for (int l = 0; l < kLanes; ++l) sum += part[l];
      }
      return sum / static_cast<Acc>(C);
    }
    // Backward: count, per element, the pairs with z > 0 (exact small integers), then scale once.
    sc.g.assign(Cs, Acc(0));
    Acc* cnt = sc.g.data();
    for (const std::int64_t j : sc.labels) {
      const Acc xj = xr[j];
      Acc part[kLanes] = {};
      std::int64_t i = 0;
      for (; i + kLanes <= C; i += kLanes) {
        for (int l = 0; l < kLanes; ++l) {
          const Acc on = math::hinge_z(Acc(1), xj, xr[i + l]) > lab[i + l] ? Acc(1) : Acc(0);
          cnt[i + l] += on;
          part[l] += on;
        }
      }
      for (; i < C; ++i) {
        const Acc on = math::hinge_z(Acc(1), xj, xr[i]) > lab[i] ? Acc(1) : Acc(0);
        cnt[i] += on;
        part[0] += on;
      }
      Acc n = 0;
      for (int l = 0; l < kLanes; ++l) n += part[l];
      cnt[j] -= n;
    }
    const Acc gc = upstream<Acc>(p, r) / static_cast<Acc>(C);
    Acc* g = cnt;
    for (std::int64_t c = 0; c < C; ++c) g[c] = cnt[c] * gc;
    T* go = static_cast<T*>(p.grad[0]) + p.index.offset(core::kMvG0, r);
    const std::int64_t sg = p.inner[core::kMvG0];
    for (std::int64_t c = 0; c < C; ++c) Io<T>::store(go, c * sg, g[c]);
    return Acc(0);
  });
}

}  // namespace

void multilabel_margin_rows(const core::MarginParams& p) {
  visit_float_dtype(p.dtype, [&p](auto tag) { run<decltype(tag)>(p); });
}

}  // namespace lossfuse::cpu
