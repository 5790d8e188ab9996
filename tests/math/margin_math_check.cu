// CUDA readiness: instantiates src/math/margin_math.hpp (every function, float and double) in __global__
// kernels. Compiled (not run) by the test build when nvcc is present.
#include <cstdint>

#include "math/margin_math.hpp"

namespace lm = lossfuse::math;

template <class Acc, lm::NormKind K>
__device__ Acc triplet_row(const Acc* a, const Acc* p, const Acc* n, std::int64_t D, Acc pw, Acc eps, Acc* ga) {
  Acc s1 = 0, s2 = 0, s3 = 0;
  for (std::int64_t c = 0; c < D; ++c) {
    s1 = lm::norm_accumulate<K>(s1, a[c] - p[c] + eps, pw);
    s2 = lm::norm_accumulate<K>(s2, a[c] - n[c] + eps, pw);
    s3 = lm::norm_accumulate<K>(s3, p[c] - n[c] + eps, pw);
  }
  const Acc d1 = lm::norm_finish<K>(s1, pw), d2 = lm::norm_finish<K>(s2, pw), d3 = lm::norm_finish<K>(s3, pw);
  const lm::SwapWeights<Acc> sw = lm::triplet_swap_weights(true, d2, d3);
  for (std::int64_t c = 0; c < D; ++c) {
    ga[c] = lm::norm_grad<K>(a[c] - p[c] + eps, d1, pw, true) - sw.an * lm::norm_grad<K>(a[c] - n[c] + eps, d2, pw);
  }
  return lm::triplet_loss(Acc(1), d1, d2 < d3 ? d2 : d3);
}

template <class Acc>
__global__ void margin_kernel(const Acc* a, const Acc* p, const Acc* n, std::int64_t D, double pnorm, Acc* loss,
                              Acc* grad) {
  const std::int64_t r = blockIdx.x;
  const Acc* ar = a + r * D;
  const Acc* pr = p + r * D;
  const Acc* nr = n + r * D;
  Acc* g = grad + r * D;
  const Acc pw = static_cast<Acc>(pnorm);
  Acc l = 0;
  switch (lm::norm_kind(pnorm)) {
    case lm::NormKind::zero: l = triplet_row<Acc, lm::NormKind::zero>(ar, pr, nr, D, pw, Acc(1e-6), g); break;
    case lm::NormKind::one: l = triplet_row<Acc, lm::NormKind::one>(ar, pr, nr, D, pw, Acc(1e-6), g); break;
    case lm::NormKind::two: l = triplet_row<Acc, lm::NormKind::two>(ar, pr, nr, D, pw, Acc(1e-6), g); break;
    case lm::NormKind::inf: l = triplet_row<Acc, lm::NormKind::inf>(ar, pr, nr, D, pw, Acc(1e-6), g); break;
    case lm::NormKind::general: l = triplet_row<Acc, lm::NormKind::general>(ar, pr, nr, D, pw, Acc(1e-6), g); break;
  }
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
}

template __global__ void margin_kernel<float>(const float*, const float*, const float*, std::int64_t, double, float*,
                                              float*);
template __global__ void margin_kernel<double>(const double*, const double*, const double*, std::int64_t, double,
                                               double*, double*);
