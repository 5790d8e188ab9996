// Per-target pieces of the Highway margin-loss kernels (src/cpu/{multi_margin,multilabel_margin,
// multilabel_soft_margin,cosine_embedding,triplet_margin}.cpp): the accumulation type of a storage type, and the
// dtype switch that calls a kernel with its storage type. Include after foreach_target.h / highway.h.

#if defined(LOSSFUSE_CPU_MARGIN_HWY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef LOSSFUSE_CPU_MARGIN_HWY_INL_H_
#undef LOSSFUSE_CPU_MARGIN_HWY_INL_H_
#else
#define LOSSFUSE_CPU_MARGIN_HWY_INL_H_
#endif

#include "hwy/highway.h"
#include "lossfuse/dtype.hpp"
#include "math/storage.hpp"

HWY_BEFORE_NAMESPACE();
namespace lossfuse::cpu::HWY_NAMESPACE {

// fn(T{}) with T the Highway storage type of a float dtype (math::visit_float_storage); Acc: MarginAcc<T>
template <class T>
using MarginAcc = math::AccOf<T>;

template <class F>
HWY_INLINE void VisitStorage(DType t, F&& fn) {
  math::visit_float_storage<hwy::bfloat16_t, hwy::float16_t>(t, static_cast<F&&>(fn));
}

}  // namespace lossfuse::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
