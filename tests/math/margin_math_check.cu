// CUDA readiness: instantiates the functions of src/math/margin_math.hpp that tests/cuda/device_math_test.cu does
// not run (cosine, hinge and soft-margin terms), float and double, in __global__ kernels. Compiled (not run) by
// the test build when nvcc is present.
#include <cstdint>

#include "math/margin_math.hpp"

namespace lm = lossfuse::math;

template <class Acc>
__global__ void margin_kernel(const Acc* a, const Acc* p, const Acc* n, std::int64_t D, double pnorm, Acc* loss,
                              Acc* grad) {
  const std::int64_t r = blockIdx.x;
  const Acc* ar = a + r * D;
  const Acc* pr = p + r * D;
  const Acc* nr = n + r * D;
  // triplet_margin's norms are run and checked on a device by tests/cuda/device_math_test.cu
  Acc l = static_cast<Acc>(lm::norm_kind(pnorm) == lm::NormKind::two);
  // cosine
  Acc s12 = 0, s11 = 0, s22 = 0;
  for (std::int64_t c = 0; c < D; ++c) s12 += ar[c] * pr[c], s11 += ar[c] * ar[c], s22 += pr[c] * pr[c];
  const lm::CosineRow<Acc> cr = lm::cosine_row(s12, s11, s22);
  l += lm::cosine_loss(cr.cos, Acc(0.1), -1.0) * lm::cosine_dloss_dcos(cr.cos, Acc(0.1), 1.0) + cr.inv_den + cr.cos_m1 +
       cr.cos_m2;
  // hinge terms (multi_margin, multilabel_margin)
  const Acc z = lm::hinge_z(Acc(1), ar[0], ar[D - 1]);
  l += lm::hinge_value(z, 1) + lm::hinge_value(z, 2) + lm::hinge_slope(z, 1) + lm::hinge_slope(z, 2);
  // soft margin
  l += lm::soft_margin_term(ar[0], pr[0], nr[0]) + lm::soft_margin_dx(ar[0], pr[0], nr[0]) +
       lm::soft_margin_dy(ar[0], nr[0]) + lm::log_sigmoid(ar[0]) + lm::sigmoid(ar[0]);
  loss[r] = l;
  grad[r * D] = l;
}

template __global__ void margin_kernel<float>(const float*, const float*, const float*, std::int64_t, double, float*,
                                              float*);
template __global__ void margin_kernel<double>(const double*, const double*, const double*, std::int64_t, double,
                                               double*, double*);
