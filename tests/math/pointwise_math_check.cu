// CUDA readiness: instantiates every elementwise-loss formula of src/math/pointwise_math.hpp (value and grad)
// with ScalarOps<float> and ScalarOps<double> in __global__ kernels. Compiled (not run) by the test build when
// nvcc is present.
#include <cstdint>

#include "math/pointwise_math.hpp"

namespace lm = lossfuse::math;

// x, y, z, g: (n) operands; loss, dx, dy, dz: (n) outputs
template <class Loss, class Acc>
__global__ void pointwise_kernel(const Acc* x, const Acc* y, const Acc* z, const Acc* g, std::int64_t n, Acc a, Acc b,
                                 Acc* loss, Acc* dx, Acc* dy, Acc* dz) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const lm::ScalarOps<Acc> o;
  lm::PwConsts<Acc> k;
  k.a = a;
  k.b = b;
  loss[i] = Loss::value(o, k, x[i], y[i], z[i]);
  Acc gx = 0, gy = 0, gz = 0;
  Loss::grad(o, k, x[i], y[i], z[i], g[i], gx, gy, gz);
  dx[i] = gx;
  dy[i] = gy;
  dz[i] = gz;
}

#define LF_PW_INSTANTIATE(LOSS, ACC)                                                                                 \
  template __global__ void pointwise_kernel<LOSS, ACC>(const ACC*, const ACC*, const ACC*, const ACC*, std::int64_t, \
                                                       ACC, ACC, ACC*, ACC*, ACC*, ACC*);
// Template ids with commas cannot pass through a macro: name them.
using Mse = lm::MseLoss;
using L1 = lm::L1Loss;
using SmoothL1 = lm::SmoothL1Loss;
using Huber = lm::HuberLoss;
using Bce = lm::BceLoss;
using BceLogits = lm::BceWithLogitsLoss<false>;
using BceLogitsPw = lm::BceWithLogitsLoss<true>;
using Kl = lm::KlDivLoss<false>;
using KlLog = lm::KlDivLoss<true>;
using Poisson00 = lm::PoissonNllLoss<false, false>;
using Poisson01 = lm::PoissonNllLoss<false, true>;
using Poisson10 = lm::PoissonNllLoss<true, false>;
using Poisson11 = lm::PoissonNllLoss<true, true>;
using Gaussian = lm::GaussianNllLoss;
using Hinge = lm::HingeEmbeddingLoss;
using Ranking = lm::MarginRankingLoss;

#define LF_PW_INSTANTIATE_BOTH(LOSS) \
  LF_PW_INSTANTIATE(LOSS, float)     \
  LF_PW_INSTANTIATE(LOSS, double)

LF_PW_INSTANTIATE_BOTH(Mse)
LF_PW_INSTANTIATE_BOTH(L1)
LF_PW_INSTANTIATE_BOTH(SmoothL1)
LF_PW_INSTANTIATE_BOTH(Huber)
LF_PW_INSTANTIATE_BOTH(Bce)
LF_PW_INSTANTIATE_BOTH(BceLogits)
LF_PW_INSTANTIATE_BOTH(BceLogitsPw)
LF_PW_INSTANTIATE_BOTH(Kl)
LF_PW_INSTANTIATE_BOTH(KlLog)
LF_PW_INSTANTIATE_BOTH(Poisson00)
LF_PW_INSTANTIATE_BOTH(Poisson01)
LF_PW_INSTANTIATE_BOTH(Poisson10)
LF_PW_INSTANTIATE_BOTH(Poisson11)
LF_PW_INSTANTIATE_BOTH(Gaussian)
LF_PW_INSTANTIATE_BOTH(Hinge)
LF_PW_INSTANTIATE_BOTH(Ranking)
