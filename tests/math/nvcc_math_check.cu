// CUDA readiness: instantiates every shared math header in device code. Compiled (not run) by the test
// build when nvcc is present, so src/math stays usable by the CUDA backend.
#include <cstdint>

#include "math/cross_entropy_math.hpp"
#include "math/half.hpp"
#include "math/online_lse.hpp"
#include "math/storage.hpp"

namespace lm = lossfuse::math;

template <class Acc>
__global__ void ce_row_kernel(const Acc* z, std::int64_t C, const std::int64_t* y, Acc* loss, Acc* grad) {
  const std::int64_t row = blockIdx.x;
  lm::LseState<Acc> st;
  for (std::int64_t c = 0; c < C; ++c) st = lm::lse_combine(st, lm::LseState<Acc>{z[row * C + c], Acc(1)});
  lm::RowSums<Acc> rs{st.m, lm::lse_finalize(st), Acc(0), Acc(0), Acc(0), st.m, std::log(st.s)};
  lm::CeRowParams<Acc> p;
  lm::LogitTransform<Acc> xf;
  const Acc zy = xf.apply(z[row * C + y[row]]);
  loss[row] = lm::ce_index_row_loss(p, rs, Acc(1), zy) + lm::ce_soft_row_loss(p, rs) + lm::z_loss_row(p, rs.lse);
  grad[row] = lm::ce_index_grad_a(p, rs.lse, Acc(1)) * xf.derivative(zy) + lm::ce_soft_grad_a(p, rs);
}

__global__ void half_kernel(const float* in, std::uint16_t* bf, std::uint16_t* h, float* back, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    bf[i] = lm::float_to_bf16(in[i]);
    h[i] = lm::float_to_f16(in[i]);
    back[i] = lm::bf16_to_float(bf[i]) + lm::f16_to_float(h[i]);
  }
}

// The storage loads and stores of every float dtype, converted through the accumulation type.
template <class T>
__global__ void storage_kernel(const T* in, T* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) lm::Io<T>::store(out, i, lm::Io<T>::load(in, i) * typename lm::Io<T>::Acc(2));
}

template __global__ void storage_kernel<float>(const float*, float*, int);
template __global__ void storage_kernel<double>(const double*, double*, int);
template __global__ void storage_kernel<lm::Bf16>(const lm::Bf16*, lm::Bf16*, int);
template __global__ void storage_kernel<lm::F16>(const lm::F16*, lm::F16*, int);
template __global__ void ce_row_kernel<float>(const float*, std::int64_t, const std::int64_t*, float*, float*);
template __global__ void ce_row_kernel<double>(const double*, std::int64_t, const std::int64_t*, double*, double*);
