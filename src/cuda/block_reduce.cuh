// Fixed-order reductions over a thread block, and the last-block step of a grid-wide one: the same bits on every run
// (no floating-point atomics; the integer atomic below only counts finished blocks).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace lossfuse::cuda {

// Folds buf[0, lanes) into buf[0] in a fixed tree over kWidth lanes (a power of two, lanes <= kWidth): a function of
// kWidth and lanes alone, whatever blockDim.x (a block narrower than kWidth takes several lanes a thread). Begins and
// ends with a barrier; every thread may then read buf[0].
template <int kWidth, class V, class Op>
__device__ void tree_fold(V* buf, int lanes, Op op) {
  static_assert((kWidth & (kWidth - 1)) == 0, "a power of two");
  for (int w = kWidth / 2; w > 0; w /= 2) {
    __syncthreads();
    for (int t = static_cast<int>(threadIdx.x); t < w; t += static_cast<int>(blockDim.x)) {
      if (t + w < lanes) buf[t] = op(buf[t], buf[t + w]);
    }
  }
  __syncthreads();
}

// op over the values of a block of at most kThreads threads (a power of two), in tree_fold's tree over blockDim.x
// lanes; every thread gets the result.
template <int kThreads, class V, class Op>
__device__ V block_reduce(V v, Op op) {
  __shared__ V buf[kThreads];
  buf[threadIdx.x] = v;
  tree_fold<kThreads>(buf, static_cast<int>(blockDim.x), op);
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

struct Min {
  template <class V>
  __device__ V operator()(V a, V b) const {
    return b < a ? b : a;
  }
};

// v from lane (lane ^ lane_mask) of a full warp, for any trivially copyable V (moved 4 bytes at a time).
template <class V>
__device__ __forceinline__ V shfl_xor_any(const V& v, int lane_mask) {
  static_assert(std::is_trivially_copyable_v<V> && sizeof(V) % 4 == 0, "words of a trivially copyable value");
  unsigned w[sizeof(V) / 4];
  memcpy(w, &v, sizeof(V));
#pragma unroll
  for (unsigned& x : w) x = __shfl_xor_sync(0xffffffffu, x, lane_mask);
  V r;
  memcpy(&r, w, sizeof(V));
  return r;
}

// op over a block of whole warps (blockDim.x a multiple of 32, at most 1024): a butterfly in each warp, then the
// warps' values in warp order. op must be commutative bit for bit (a + b == b + a), so that both lanes of a butterfly
// pair hold the same bits; every thread gets the result, in two barriers. The order depends on blockDim.x alone.
template <class V, class Op>
__device__ V warp_tree_reduce(V v, Op op) {
  __shared__ V warps[32];
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v = op(v, shfl_xor_any(v, o));
  if (lane == 0) warps[warp] = v;
  __syncthreads();
  V r = warps[0];
  for (unsigned w = 1; w < nwarps; ++w) r = op(r, warps[w]);
  __syncthreads();  // warps[] is reused by the next reduction
  return r;
}

// The sum of v[0, n) over a block of at most kThreads threads in a fixed order (each thread its strided share in
// order, then the block's tree); every thread gets it. Read past L1, so a last block (last_block_done) sees the other
// blocks' stores. The reductions of every device call's loss go through it.
template <int kThreads>
__device__ double ordered_sum(const double* v, std::int64_t n) {
  double s = 0;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) s += __ldcg(v + i);  // L2: other blocks' stores
  return block_reduce<kThreads>(s, Plus{});
}

// Call once per block after the block's partial results are stored (global memory): true in the block that finished
// last, which then sees every block's stores. `count` is 0 before the launch and 0 again after it (atomicInc wraps at
// gridDim.x - 1), so a counter kept across launches in one stream's order needs no reset (stream_counter).
__device__ inline bool last_block_done(unsigned* count) {
  __shared__ bool last;
  __threadfence();  // this block's stores are visible device-wide before it is counted
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicInc(count, gridDim.x - 1) == gridDim.x - 1;
    if (last) __threadfence();  // acquire, in the thread that saw the count, before the barrier hands it on
  }
  __syncthreads();
  return last;
}

}  // namespace lossfuse::cuda
