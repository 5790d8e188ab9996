// Fixed-order reductions over a thread block, and the last-block step of a grid-wide one: the same bits on every run
// (no floating-point atomics; the integer atomic below only counts finished blocks).
#pragma once

namespace lossfuse::cuda {

// op over the kThreads values of a block of kThreads threads (a power of two), in a fixed tree; every thread gets
// the result.
template <int kThreads, class V, class Op>
__device__ V block_reduce(V v, Op op) {
  static_assert((kThreads & (kThreads - 1)) == 0, "a power of two");
  __shared__ V buf[kThreads];
  buf[threadIdx.x] = v;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (static_cast<int>(threadIdx.x) < w) buf[threadIdx.x] = op(buf[threadIdx.x], buf[threadIdx.x + w]);
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
