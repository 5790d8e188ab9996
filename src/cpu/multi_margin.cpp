// CPU multi-class margin loss.
//
// input: (rows, C), any strides; target: a class index per row (any integer dtype, checked in core); weight:
// Acc (C) or null. Per row, z_j = margin - x_y + x_j:
//   loss = sum_{j != y} w_y max(0, z_j)^p / C                      (p in {1, 2})
//   grad_j = g w_y slope_p(z_j) / C (j != y),  grad_y = -sum_{j != y} grad_j,  slope_1 = 1, slope_2 = 2 z (z > 0).
// One pass per row after reading x_y; the backward loop is branch-free, with 8 partial sums for grad_y.
#include <type_traits>

#include "cpu/margin_common.hpp"
#include "cpu/margin_kernels.hpp"
#include "math/margin_math.hpp"

namespace lossfuse::cpu {
namespace {

using namespace margin;

constexpr int kLanes = 8;

template <class T, int P>
void run(const core::MarginParams& p) {
  using Acc = typename Io<T>::Acc;
  const auto* xs = static_cast<const T*>(p.x[0]);
  const auto* w = static_cast<const Acc*>(p.weight);
  const std::int64_t C = p.D;
  const Acc margin_ = static_cast<Acc>(p.margin), inv_c = Acc(1) / static_cast<Acc>(C);
  // kc: input and gradient contiguous along C (strides known to be 1, so the loops vectorize)
  auto row = [&](auto kc, std::int64_t r) -> Acc {
    constexpr bool kContig = decltype(kc)::value;
    const std::int64_t s = kContig ? 1 : p.inner[core::kMvX0];
    const T* x = xs + p.index.offset(core::kMvX0, r);
    const std::int64_t y = core::read_target(p.target, p.target_dtype, p.index.offset(core::kMvTarget, r));
    const Acc x_y = Io<T>::load(x, y * s);
    const Acc w_y = w != nullptr ? w[y] : Acc(1);
    if (!p.backward) {
      // torch's order: each term times w_y, summed (j != y), then / C
      Acc sum = 0;
      for (std::int64_t j = 0; j < y; ++j)
        sum += math::hinge_value(math::hinge_z(margin_, x_y, Io<T>::load(x, j * s)), P) * w_y;
      for (std::int64_t j = y + 1; j < C; ++j)
        sum += math::hinge_value(math::hinge_z(margin_, x_y, Io<T>::load(x, j * s)), P) * w_y;
      return sum / static_cast<Acc>(C);
    }
    // Backward: grad_j = coef slope(z_j) for every j (branch-free, kLanes partial sums of the grad_j in a fixed
    // order), then grad_y = -(sum over j != y), written last over the j == y term.
    const Acc coef = upstream<Acc>(p, r) * w_y * inv_c;
    T* g = static_cast<T*>(p.grad[0]) + p.index.offset(core::kMvG0, r);
    const std::int64_t sg = kContig ? 1 : p.inner[core::kMvG0];
    Acc part[kLanes] = {};
    std::int64_t j = 0;
    for (; j + kLanes <= C; j += kLanes) {
      for (int l = 0; l < kLanes; ++l) {
        const Acc h = coef * math::hinge_slope(math::hinge_z(margin_, x_y, Io<T>::load(x, (j + l) * s)), P);
        part[l] += (j + l == y) ? Acc(0) : h;
        Io<T>::store(g, (j + l) * sg, h);
      }
    }
    for (; j < C; ++j) {
      const Acc h = coef * math::hinge_slope(math::hinge_z(margin_, x_y, Io<T>::load(x, j * s)), P);
      part[0] += j == y ? Acc(0) : h;
      Io<T>::store(g, j * sg, h);
    }
    Acc total = 0;
    for (int l = 0; l < kLanes; ++l) total += part[l];
    Io<T>::store(g, y * sg, -total);
    return Acc(0);
  };
  const bool contig = all_unit_stride(p, {core::kMvX0, core::kMvG0});
  for_rows<Acc>(p, C, [&](std::int64_t r) { return contig ? row(std::true_type{}, r) : row(std::false_type{}, r); });
}

template <class T>
void run_p(const core::MarginParams& p) {
  if (p.p == 2.0) return run<T, 2>(p);
  return run<T, 1>(p);
}

}  // namespace

void multi_margin_rows(const core::MarginParams& p) {
  visit_float_dtype(p.dtype, [&p](auto tag) { run_p<decltype(tag)>(p); });
}

}  // namespace lossfuse::cpu
