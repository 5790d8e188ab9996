// CPU row kernels of the fused linear cross-entropy over vocabulary tiles (float32; see linear_tile_kernels.hpp).
//
// A tile row (a few thousand floats) sits in L1 between its GEMMs; each kernel reads it once in Highway vectors,
// the last partial vector through a padded buffer (z = -inf: no max, no exp). Sums are float32 vector partials
// combined in a fixed order, so results do not depend on the thread count. The exp is the cross-entropy kernels'
// (hwy_exp-inl.h: below -87.3 it gives 0, as the float32 cross-entropy does).

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/linear_tiles.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// (foreach_target.h must stay first; this comment keeps clang-format from regrouping it)

#include <cstdint>
#include <limits>

#include "cpu/hwy_exp-inl.h"
#include "cpu/linear_tile_kernels.hpp"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace lossfuse::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using D = hn::ScalableTag<float>;
using V = hn::Vec<D>;
constexpr float kInf = std::numeric_limits<float>::infinity();

// z = T(x + b); th (softcap only) = tanh(.) for the derivative. NaN stays NaN.
template <bool kCap>
HWY_INLINE V Transform(D d, V x, const LceTile& t) {
  const V z = hn::Mul(x, hn::Set(d, t.scale));
  if constexpr (!kCap) {
    return z;
  } else {
    const V th = hn::Tanh(d, hn::Mul(z, hn::Set(d, t.inv_softcap)));
    return hn::Mul(hn::IfThenElse(hn::IsNaN(z), z, th), hn::Set(d, t.softcap));
  }
}

// dz/dx from z (as LogitTransform::derivative_from_z).
template <bool kCap>
HWY_INLINE V Derivative(D d, V z, const LceTile& t) {
  if constexpr (!kCap) {
    return hn::Set(d, t.scale);
  } else {
    const V u = hn::Mul(z, hn::Set(d, t.inv_softcap));
    return hn::Mul(hn::Set(d, t.scale), hn::NegMulAdd(u, u, hn::Set(d, 1.0f)));
  }
}

// Calls f(j, vector of x at j) for every vector of row x (n values) and stores f's result back; the last partial
// vector goes through a buffer padded with `pad`.
template <class F>
HWY_INLINE void MapRow(D d, float* HWY_RESTRICT x, std::int64_t n, float pad, F&& f) {
  const auto N = static_cast<std::int64_t>(hn::Lanes(d));
  std::int64_t j = 0;
  for (; j + N <= n; j += N) hn::StoreU(f(j, hn::LoadU(d, x + j)), d, x + j);
  if (j < n) {
    HWY_ALIGN float buf[hn::MaxLanes(d)];
    for (std::int64_t k = 0; k < N; ++k) buf[k] = j + k < n ? x[j + k] : pad;
    hn::Store(f(j, hn::Load(d, buf)), d, buf);
    for (std::int64_t k = 0; j + k < n; ++k) x[j + k] = buf[k];
  }
}

// The bias of columns [j, j + N), zeros past n.
HWY_INLINE V LoadBias(D d, const float* b, std::int64_t j, std::int64_t n) {
  const auto N = static_cast<std::int64_t>(hn::Lanes(d));
  if (j + N <= n) return hn::LoadU(d, b + j);
  HWY_ALIGN float buf[hn::MaxLanes(d)] = {};
  for (std::int64_t k = 0; j + k < n; ++k) buf[k] = b[j + k];
  return hn::Load(d, buf);
}

template <bool kCap>
void TransformMaxRows(const LceTile& t, std::int64_t i0, std::int64_t i1, float* max) {
  const D d;
  const V ninf = hn::Set(d, -kInf);
  for (std::int64_t i = i0; i < i1; ++i) {
    V m = ninf;
    // padded with NaN, which every transform keeps and the max leaves out (a -inf pad becomes +inf under a
    // negative scale: fuzz/linear_cross_entropy_fuzz.cpp)
    MapRow(d, t.z + i * t.ld, t.n, std::numeric_limits<float>::quiet_NaN(), [&](std::int64_t j, V x) {
      if (t.bias != nullptr) x = hn::Add(x, LoadBias(d, t.bias, j, t.n));
      const V z = Transform<kCap>(d, x, t);
      m = hn::Max(m, hn::IfThenElse(hn::IsNaN(z), ninf, z));
      return z;
    });
    max[i] = hn::GetLane(hn::MaxOfLanes(d, m));
  }
}

void LceTileTransformMax(const LceTile& t, std::int64_t i0, std::int64_t i1, float* max) {
  if (t.softcap > 0) {
    TransformMaxRows<true>(t, i0, i1, max);
  } else {
    TransformMaxRows<false>(t, i0, i1, max);
  }
}

void LceTileSumExp(const LceTile& t, std::int64_t i0, std::int64_t i1, const float* shift, float* sum) {
  const D d;
  const auto N = static_cast<std::int64_t>(hn::Lanes(d));
  for (std::int64_t i = i0; i < i1; ++i) {
    const float* z = t.z + i * t.ld;
    const V sh = hn::Set(d, shift[i]);
    V s0 = hn::Zero(d), s1 = hn::Zero(d);
    std::int64_t j = 0;
    for (; j + 2 * N <= t.n; j += 2 * N) {
      s0 = hn::Add(s0, FastExp(d, hn::Sub(hn::LoadU(d, z + j), sh)));
      s1 = hn::Add(s1, FastExp(d, hn::Sub(hn::LoadU(d, z + j + N), sh)));
    }
    for (; j < t.n; j += N) {
      V v;
      if (j + N <= t.n) {
        v = hn::LoadU(d, z + j);
      } else {
        HWY_ALIGN float buf[hn::MaxLanes(d)];
        for (std::int64_t k = 0; k < N; ++k) buf[k] = j + k < t.n ? z[j + k] : -kInf;
        v = hn::Load(d, buf);
      }
      s0 = hn::Add(s0, FastExp(d, hn::Sub(v, sh)));
    }
    sum[i] = hn::GetLane(hn::SumOfLanes(d, hn::Add(s0, s1)));
  }
}

template <bool kCap>
void GradRows(const LceTile& t, const LceTileGradRows& g, std::int64_t i0, std::int64_t i1) {
  const D d;
  const hn::RebindToSigned<D> di;
  using TI = hn::TFromD<decltype(di)>;
  const auto iota = hn::Iota(di, TI(0));
  for (std::int64_t i = i0; i < i1; ++i) {
    const V lse = hn::Set(d, g.lse[i]), qa = hn::Set(d, g.qa[i]), wb = hn::Set(d, g.wb[i]), ty = hn::Set(d, g.ty[i]);
    const std::int64_t y = g.target_col[i];
    const bool has_y = y >= 0 && y < t.n;
    MapRow(d, t.z + i * t.ld, t.n, 0.0f, [&](std::int64_t j, V x) {
      if (!g.transformed) {
        if (t.bias != nullptr) x = hn::Add(x, LoadBias(d, t.bias, j, t.n));
        x = Transform<kCap>(d, x, t);
      }
      const V w = g.class_weight != nullptr ? LoadBias(d, g.class_weight, j, t.n) : hn::Set(d, 1.0f);
      V v = hn::NegMulAdd(wb, w, hn::Mul(qa, FastExp(d, hn::Sub(x, lse))));
      if (has_y && y >= j && y < j + static_cast<std::int64_t>(hn::Lanes(d))) {
        const auto at_y = hn::RebindMask(d, hn::Eq(iota, hn::Set(di, static_cast<TI>(y - j))));
        v = hn::Sub(v, hn::IfThenElseZero(at_y, ty));
      }
      return hn::Mul(v, Derivative<kCap>(d, x, t));
    });
  }
}

void LceTileGrad(const LceTile& t, const LceTileGradRows& g, std::int64_t i0, std::int64_t i1) {
  if (t.softcap > 0) {
    GradRows<true>(t, g, i0, i1);
  } else {
    GradRows<false>(t, g, i0, i1);
  }
}

}  // namespace lossfuse::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lossfuse::cpu {

HWY_EXPORT(LceTileTransformMax);
HWY_EXPORT(LceTileSumExp);
HWY_EXPORT(LceTileGrad);

void lce_tile_transform_max(const LceTile& t, std::int64_t i0, std::int64_t i1, float* max) {
  HWY_DYNAMIC_DISPATCH(LceTileTransformMax)(t, i0, i1, max);
}

void lce_tile_sum_exp(const LceTile& t, std::int64_t i0, std::int64_t i1, const float* shift, float* sum) {
  HWY_DYNAMIC_DISPATCH(LceTileSumExp)(t, i0, i1, shift, sum);
}

void lce_tile_grad(const LceTile& t, const LceTileGradRows& g, std::int64_t i0, std::int64_t i1) {
  HWY_DYNAMIC_DISPATCH(LceTileGrad)(t, g, i0, i1);
}

}  // namespace lossfuse::cpu
#endif  // HWY_ONCE
