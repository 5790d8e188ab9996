// Fixed-order reductions over a thread block, and the last-block step of a grid-wide one: the same bits on every run
// (no floating-point atomics; the integer atomic below only counts finished blocks).
#pragma once

#include <cstdint>

namespace lossfuse::cuda {

// op over the values of a block of at most kThreads threads (a power of two), in a fixed tree (a function of
// blockDim.x); every thread gets the result.
template <int kThreads, class V, class Op>
__device__ V block_reduce(V v, Op op) {
  static_assert((kThreads & (kThreads - 1)) == 0, "a power of two");
  __shared__ V buf[kThreads];
  buf[threadIdx.x] = v;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    const int t = static_cast<int>(threadIdx.x);
    if (t < w && t + w < static_cast<int>(blockDim.x)) buf[t] = op(buf[t], buf[t + w]);
    __syncthreads();
  }
  const V r = buf[0];
  __syncthreads();  // buf is reused by the next reduction
  return r;
}

struct Plus {
  template <class V>
  __device__ V operator()(V a, V b) const {
    return a + b;
  }
};

// The sum of v[0, n) over a block of at most kThreads threads in a fixed order (each thread its strided share in
// order, then the block's tree); every thread gets it. The reductions of every device call's loss go through it.
template <int kThreads>
__device__ double ordered_sum(const double* v, std::int64_t n) {
  double s = 0;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) s += v[i];
  return block_reduce<kThreads>(s, Plus{});
}

// Call once per block after the block's partial results are stored (global memory): true in the block that finished
// last, which then sees every block's stores. `count` starts at 0 and ends at gridDim.x.
__device__ inline bool last_block_done(unsigned* count) {
  __shared__ bool last;
  __threadfence();  // this block's stores are visible device-wide before it is counted
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(count, 1u) == gridDim.x - 1;
  __syncthreads();
  if (last) __threadfence();
  return last;
}

}  // namespace lossfuse::cuda
