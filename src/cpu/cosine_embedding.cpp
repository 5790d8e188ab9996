// CPU cosine embedding loss.
//
// x1, x2: (rows, D), any strides; target: one value per row (the inputs' float dtype or any integer dtype).
// Per row: s12 = sum x1 x2, s11 = sum x1^2, s22 = sum x2^2 in one pass; m_i = s_ii + 1e-12,
// cos = s12 / sqrt(m1 m2); loss = 1 - cos (y = 1), max(0, cos - margin) (y = -1), else 0.
// Backward, k = upstream * dloss/dcos:  grad_x1 = k (x2 / den - cos x1 / m1),  grad_x2 = k (x1 / den - cos x2 / m2).
#include <type_traits>

#include "cpu/margin_common.hpp"
#include "cpu/margin_kernels.hpp"
#include "math/margin_math.hpp"

namespace lossfuse::cpu {
namespace {

using namespace margin;

template <class T>
void run(const core::MarginParams& p) {
  using Acc = typename Io<T>::Acc;
  const auto* x1 = static_cast<const T*>(p.x[0]);
  const auto* x2 = static_cast<const T*>(p.x[1]);
  const std::int64_t D = p.D;
  const Acc margin_ = static_cast<Acc>(p.margin);
  // kc: every view is contiguous along D (strides known to be 1, so the loops vectorize)
  auto row = [&](auto kc, std::int64_t r) -> Acc {
    constexpr bool kContig = decltype(kc)::value;
    const std::int64_t s1 = kContig ? 1 : p.inner[core::kMvX0], s2 = kContig ? 1 : p.inner[core::kMvX1];
    const T* a = x1 + p.index.offset(core::kMvX0, r);
    const T* b = x2 + p.index.offset(core::kMvX1, r);
    const double y = read_float(p.target, p.target_dtype, p.index.offset(core::kMvTarget, r));
    Acc s12 = 0, s11 = 0, s22 = 0;
    for (std::int64_t c = 0; c < D; ++c) {
      const Acc u = Io<T>::load(a, c * s1), v = Io<T>::load(b, c * s2);
      s12 += u * v;
      s11 += u * u;
      s22 += v * v;
    }
    const math::CosineRow<Acc> cr = math::cosine_row(s12, s11, s22);
    if (!p.backward) return math::cosine_loss(cr.cos, margin_, y);

    const Acc k = math::cosine_dloss_dcos(cr.cos, margin_, y) * upstream<Acc>(p, r);
    const Acc ka = k * cr.inv_den, kb1 = k * cr.cos_m1, kb2 = k * cr.cos_m2;
    T* g1 = static_cast<T*>(p.grad[0]);
    T* g2 = static_cast<T*>(p.grad[1]);
    const std::int64_t sg1 = kContig ? 1 : p.inner[core::kMvG0], sg2 = kContig ? 1 : p.inner[core::kMvG1];
    if (g1 != nullptr) {
      g1 += p.index.offset(core::kMvG0, r);
      for (std::int64_t c = 0; c < D; ++c)
        Io<T>::store(g1, c * sg1, ka * Io<T>::load(b, c * s2) - kb1 * Io<T>::load(a, c * s1));
    }
    if (g2 != nullptr) {
      g2 += p.index.offset(core::kMvG1, r);
      for (std::int64_t c = 0; c < D; ++c)
        Io<T>::store(g2, c * sg2, ka * Io<T>::load(a, c * s1) - kb2 * Io<T>::load(b, c * s2));
    }
    return Acc(0);
  };
  const bool contig = all_unit_stride(p, {core::kMvX0, core::kMvX1, core::kMvG0, core::kMvG1});
  for_rows<Acc>(p, 2 * D,
                [&](std::int64_t r) { return contig ? row(std::true_type{}, r) : row(std::false_type{}, r); });
}

}  // namespace

void cosine_embedding_rows(const core::MarginParams& p) {
  visit_float_dtype(p.dtype, [&p](auto tag) { run<decltype(tag)>(p); });
}

}  // namespace lossfuse::cpu
