// CUDA readiness: instantiates src/math/vocab_tile_math.hpp (and LogitTransform's element-loop forms) in
// __global__ kernels, float and double. Compiled (not run) by the test build when nvcc is present.
#include <cstdint>

#include "math/vocab_tile_math.hpp"

namespace lm = lossfuse::math;

// One thread per row: forward over the tiles of a row of raw logits, then the gradient of the same row.
template <class Acc, bool kCap>
__global__ void tile_row_kernel(const Acc* x, std::int64_t C, std::int64_t tile, const std::int64_t* y, Acc* loss,
                                Acc* lse_out, Acc* grad) {
  const std::int64_t row = blockIdx.x;
  lm::LogitTransform<Acc> xf;
  lm::CeRowParams<Acc> p;
  lm::TileRowState<Acc> st;
  for (std::int64_t v0 = 0; v0 < C; v0 += tile) {
    const std::int64_t v1 = v0 + tile < C ? v0 + tile : C;
    Acc m = lm::neg_inf<Acc>();
    for (std::int64_t c = v0; c < v1; ++c) {
      const Acc z = xf.template apply_as<kCap>(x[row * C + c]);
      m = z > m ? z : m;
    }
    const Acc sh = lm::tile_shift(m);
    if (v0 == 0) st.ref = sh;
    Acc s = 0, swz = 0;
    for (std::int64_t c = v0; c < v1; ++c) {
      const Acc z = xf.template apply_as<kCap>(x[row * C + c]);
      s += std::exp(z - sh);
      swz += z - st.ref;
      if (c == y[row]) st.z_y = z;
    }
    lm::tile_fold(st, m, s, swz);
  }
  const lm::CeRowResult<Acc> r = lm::tile_row_finish(p, st, y[row] < 0, Acc(1));
  loss[row] = r.loss + r.z_loss;
  lse_out[row] = r.lse;
  const lm::CeGradCoefs<Acc> k =
      lm::ce_index_grad_coefs(p, r.lse, Acc(1), Acc(1), lm::grad_filter_keeps(st.lse.m, r.lse, Acc(1e-4)));
  for (std::int64_t c = 0; c < C; ++c) {
    const Acc z = xf.template apply_as<kCap>(x[row * C + c]);
    grad[row * C + c] = lm::ce_index_grad_z(k, z, r.lse, Acc(1), c == y[row]) * xf.template derivative_from_z<kCap>(z);
  }
}

template __global__ void tile_row_kernel<float, false>(const float*, std::int64_t, std::int64_t, const std::int64_t*,
                                                       float*, float*, float*);
template __global__ void tile_row_kernel<float, true>(const float*, std::int64_t, std::int64_t, const std::int64_t*,
                                                      float*, float*, float*);
template __global__ void tile_row_kernel<double, false>(const double*, std::int64_t, std::int64_t, const std::int64_t*,
                                                        double*, double*, double*);
template __global__ void tile_row_kernel<double, true>(const double*, std::int64_t, std::int64_t, const std::int64_t*,
                                                       double*, double*, double*);
