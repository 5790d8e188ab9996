// CUDA readiness: instantiates src/math/ctc_math.hpp in device code (compiled, not run, by the test build).
#include <cstdint>

#include "math/ctc_math.hpp"

namespace lm = lossfuse::math;

// One alpha step and one beta step over l' (len entries) per block, then the gradient of one element.
template <class Acc>
__global__ void ctc_step_kernel(const Acc* prev, const Acc* next, const std::int64_t* lab, long long len, const Acc* lp,
                                Acc* alpha, Acc* beta, Acc* grad) {
  const long long s = threadIdx.x;
  if (s >= len) return;
  alpha[s] = lm::ctc_alpha_step(prev, lab, s, lp[s]);
  beta[s] = lm::ctc_beta_step(next, lab, s, len, lp[s]);
  grad[s] = lm::ctc_grad(lp[s], lm::log_add2(alpha[s], beta[s]), lm::log_add3(prev[s], next[s], lp[s]));
}

template __global__ void ctc_step_kernel<float>(const float*, const float*, const std::int64_t*, long long,
                                                const float*, float*, float*, float*);
template __global__ void ctc_step_kernel<double>(const double*, const double*, const std::int64_t*, long long,
                                                 const double*, double*, double*, double*);
