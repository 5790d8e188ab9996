// Per-target pieces of the Highway margin-loss kernels (src/cpu/{multi_margin,multilabel_margin,
// multilabel_soft_margin,cosine_embedding,triplet_margin}.cpp): the accumulation type of a storage type, and the
// dtype switch that calls a kernel with its storage type. Include after foreach_target.h / highway.h.

#if defined(LOSSFUSE_CPU_MARGIN_HWY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef LOSSFUSE_CPU_MARGIN_HWY_INL_H_
#undef LOSSFUSE_CPU_MARGIN_HWY_INL_H_
#else
#define LOSSFUSE_CPU_MARGIN_HWY_INL_H_
#endif

#include <type_traits>

#include "hwy/highway.h"
#include "lossfuse/dtype.hpp"

HWY_BEFORE_NAMESPACE();
namespace lossfuse::cpu::HWY_NAMESPACE {

// float32 accumulation for float32, bfloat16 and float16 storage; float64 for float64
template <class T>
using MarginAcc = std::conditional_t<std::is_same_v<T, double>, double, float>;

// fn(T{}) with T the Highway storage type of a float dtype; other dtypes: nothing
template <class F>
HWY_INLINE void VisitStorage(DType t, F&& fn) {
  switch (t) {
    case DType::f32: return fn(float{});
    case DType::f64: return fn(double{});
    case DType::bf16: return fn(hwy::bfloat16_t{});
    case DType::f16: return fn(hwy::float16_t{});
    default: return;
  }
}

}  // namespace lossfuse::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
