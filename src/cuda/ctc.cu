// CUDA CTC kernels: the CPU backend's contract (src/core/ctc_params.hpp) and recursions (src/math/ctc_math.hpp) on
// the device. One thread block per sample; its threads own the positions s of the extended label sequence l'
// (2 tl + 1 long, blanks interleaved), every time step one synchronised step of the alpha (forward) or beta
// (backward) recursion in log space, in Acc (float32; float64 for float64 input; 16-bit inputs widened exactly).
//
// forward:  alpha into the caller's log_alpha (T, N, L) when given (-inf outside t < il, s < len, as on the CPU),
//           else into two rolling rows per sample; nll_b = -log_add2(alpha_{il-1}(len - 1), alpha_{il-1}(len - 2))
//           (-alpha_{il-1}(0) when tl = 0; 0 for il = tl = 0, inf for il = 0 < tl).
// backward: alpha (the caller's, or recomputed into a workspace), then beta from t = il - 1 down; per step the log
//           occupancy of each class, lcab(c) = log sum_{s: l'_s = c} exp(alpha_t(s) + beta_t(s)): the blank's over
//           every even s by a block reduction in a fixed tree, a label's by the thread of its first position in l',
//           walking its later positions in order; then grad[t, b, c] = g_b (exp(lp) - exp(lcab(c) + nll_b - lp)),
//           0 for t >= il and everywhere for an impossible sample under zero_infinity. No atomics: the same bits on
//           every run.
// Labels were checked by core (in [0, C), not blank); lengths too (il <= T, 2 tl + 1 <= L).
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <string>

#include "core/ctc_params.hpp"
#include "core/targets.hpp"
#include "cuda/block_reduce.cuh"
#include "cuda/kernels.hpp"
#include "cuda/runtime.hpp"
#include "math/ctc_math.hpp"
#include "math/online_lse.hpp"
#include "math/storage.hpp"

namespace lossfuse::cuda {
namespace {

using std::int64_t;

constexpr int kThreads = 256;
__device__ inline double pos_inf() { return -math::neg_inf<double>(); }

// The kernel's view of one call: core's params, its host arrays on the device, and the device workspaces.
template <class Acc>
struct CtcArgs {
  core::CtcParams p;
  const int64_t *offset, *il, *tl;  // (N) each
  const double* gscale;             // (N), backward
  double* nll;                      // (N)
  Acc* alpha;                       // full: (T, N, L); else rolling: (N, 2, L)
  bool full;
  bool caller_alpha;  // alpha is the caller's log_alpha: filled -inf outside t < il, s < len
  Acc* beta;          // (N, 2, L), backward
  Acc* lcab;          // (N, C), backward: -inf between steps
  int64_t* lab;       // (N, L): l'
  int64_t* next;      // (N, L), backward: a label position's next position with the same label (-1: none)
  bool* first;        // (N, L), backward: the label position is its label's first in l'
};

template <class Acc>
__device__ Acc* alpha_row(const CtcArgs<Acc>& a, int64_t b, int64_t t) {
  return a.full ? a.alpha + (t * a.p.N + b) * a.p.L : a.alpha + (b * 2 + (t & 1)) * a.p.L;
}

template <class T>
__device__ math::AccOf<T> lp_at(const core::CtcParams& p, int64_t t, int64_t b, int64_t c) {
  return math::Io<T>::load(static_cast<const T*>(p.log_probs), t * p.lp_st + b * p.lp_sn + c * p.lp_sc);
}

// Sample b's l' into a.lab, then alpha over t < il; returns nll (every thread). `fill`: the workspace's entries
// outside t < il, s < len are set to -inf (the caller's log_alpha, as the CPU writes it).
template <class T>
__device__ double forward_sample(const CtcArgs<math::AccOf<T>>& a, int64_t b, bool fill) {
  using Acc = math::AccOf<T>;
  const core::CtcParams& p = a.p;
  const int64_t il = a.il[b], tl = a.tl[b], len = 2 * tl + 1;
  const Acc ninf = math::neg_inf<Acc>();
  int64_t* lab = a.lab + b * p.L;
  for (int64_t s = threadIdx.x; s < len; s += blockDim.x) {
    lab[s] = (s & 1) ? core::read_target(p.targets, p.target_dtype, a.offset[b] + (s >> 1) * p.target_stride) : p.blank;
  }
  if (fill && a.full) {
    for (int64_t t = 0; t < p.T; ++t) {
      Acc* row = alpha_row(a, b, t);
      for (int64_t s = (t < il ? len : 0) + threadIdx.x; s < p.L; s += blockDim.x) row[s] = ninf;
    }
  }
  __syncthreads();
  if (il == 0) return tl == 0 ? 0.0 : pos_inf();
  Acc* row0 = alpha_row(a, b, 0);
  for (int64_t s = threadIdx.x; s < len; s += blockDim.x) {
    row0[s] = s == 0 ? lp_at<T>(p, 0, b, p.blank) : s == 1 ? lp_at<T>(p, 0, b, lab[1]) : ninf;
  }
  for (int64_t t = 1; t < il; ++t) {
    __syncthreads();
    const Acc* prev = alpha_row(a, b, t - 1);
    Acc* cur = alpha_row(a, b, t);
    for (int64_t s = threadIdx.x; s < len; s += blockDim.x) {
      cur[s] = math::ctc_alpha_step(prev, lab, static_cast<long long>(s), lp_at<T>(p, t, b, lab[s]));
    }
  }
  __syncthreads();
  const Acc* last = alpha_row(a, b, il - 1);
  const Acc ll = tl == 0 ? last[0] : math::log_add2(last[len - 1], last[len - 2]);
  return -static_cast<double>(ll);
}

template <class T>
__global__ void __launch_bounds__(kThreads) ctc_forward_kernel(const CtcArgs<math::AccOf<T>> a) {
  const int64_t b = blockIdx.x;
  const double nll = forward_sample<T>(a, b, true);
  if (threadIdx.x == 0) a.nll[b] = nll;
}

template <class T>
__global__ void __launch_bounds__(kThreads) ctc_backward_kernel(const CtcArgs<math::AccOf<T>> a) {
  using Acc = math::AccOf<T>;
  const core::CtcParams& p = a.p;
  const int64_t b = blockIdx.x;
  const int64_t il = a.il[b], tl = a.tl[b], len = 2 * tl + 1;
  const Acc ninf = math::neg_inf<Acc>();
  double nll;
  if (p.alpha_ready) {  // l' still to make; alpha is the caller's
    int64_t* lab = a.lab + b * p.L;
    for (int64_t s = threadIdx.x; s < len; s += blockDim.x) {
      lab[s] =
          (s & 1) ? core::read_target(p.targets, p.target_dtype, a.offset[b] + (s >> 1) * p.target_stride) : p.blank;
    }
    __syncthreads();
    if (il == 0) {
      nll = tl == 0 ? 0.0 : pos_inf();
    } else {
      const Acc* last = alpha_row(a, b, il - 1);
      nll = -static_cast<double>(tl == 0 ? last[0] : math::log_add2(last[len - 1], last[len - 2]));
    }
  } else {
    nll = forward_sample<T>(a, b, a.caller_alpha);
  }
  if (threadIdx.x == 0 && a.nll != nullptr) a.nll[b] = nll;
  T* grad = static_cast<T*>(p.grad);
  auto store = [&](int64_t t, int64_t c, Acc v) { math::Io<T>::store(grad, t * p.g_st + b * p.g_sn + c * p.g_sc, v); };
  const bool impossible = nll == pos_inf();
  const int64_t live = p.zero_infinity && impossible ? 0 : il;
  for (int64_t e = threadIdx.x; e < (p.T - live) * p.C; e += blockDim.x) store(live + e / p.C, e % p.C, Acc(0));
  if (live == 0) return;

  const int64_t* lab = a.lab + b * p.L;
  int64_t* next = a.next + b * p.L;
  bool* first = a.first + b * p.L;
  Acc* lcab = a.lcab + b * p.C;
  for (int64_t s = 1 + 2 * threadIdx.x; s < len; s += 2 * blockDim.x) {  // label positions: O(tl) each
    int64_t n = -1;
    for (int64_t u = s + 2; u < len && n < 0; u += 2) n = lab[u] == lab[s] ? u : -1;
    bool f = true;
    for (int64_t u = s - 2; u >= 1 && f; u -= 2) f = lab[u] != lab[s];
    next[s] = n;
    first[s] = f;
  }
  for (int64_t c = threadIdx.x; c < p.C; c += blockDim.x) lcab[c] = ninf;
  const auto g = static_cast<Acc>(a.gscale[b]);
  const auto nll_acc = static_cast<Acc>(nll);
  Acc* nxt = a.beta + b * 2 * p.L;
  Acc* cur = nxt + p.L;
  const auto max_op = [](Acc x, Acc y) { return x > y ? x : y; };
  const auto add_op = [](Acc x, Acc y) { return x + y; };
  for (int64_t t = il - 1; t >= 0; --t) {
    __syncthreads();  // the previous step's beta row, next/first and lcab are complete
    for (int64_t s = threadIdx.x; s < len; s += blockDim.x) {
      const Acc e = lp_at<T>(p, t, b, lab[s]);
      if (t == il - 1) {
        cur[s] = (s == len - 1 || s == len - 2) ? e : ninf;
      } else {
        cur[s] = math::ctc_beta_step(nxt, lab, static_cast<long long>(s), static_cast<long long>(len), e);
      }
    }
    __syncthreads();
    const Acc* al = alpha_row(a, b, t);
    // the blank's occupancy: every even position
    Acc m = ninf;
    for (int64_t s = 2 * threadIdx.x; s < len; s += 2 * blockDim.x) m = max_op(m, al[s] + cur[s]);
    m = block_reduce<kThreads>(m, max_op);
    Acc sum = 0;
    if (m != ninf) {
      for (int64_t s = 2 * threadIdx.x; s < len; s += 2 * blockDim.x) sum += std::exp(al[s] + cur[s] - m);
    }
    sum = block_reduce<kThreads>(sum, add_op);
    if (threadIdx.x == 0) lcab[p.blank] = m == ninf ? ninf : m + std::log(sum);
    // each label's occupancy, by the thread of its first position
    for (int64_t s = 1 + 2 * threadIdx.x; s < len; s += 2 * blockDim.x) {
      if (!first[s]) continue;
      Acc lm = ninf;
      for (int64_t u = s; u >= 0; u = next[u]) lm = max_op(lm, al[u] + cur[u]);
      Acc ls = 0;
      if (lm != ninf) {
        for (int64_t u = s; u >= 0; u = next[u]) ls += std::exp(al[u] + cur[u] - lm);
      }
      lcab[lab[s]] = lm == ninf ? ninf : lm + std::log(ls);
    }
    __syncthreads();
    for (int64_t c = threadIdx.x; c < p.C; c += blockDim.x) {
      store(t, c, g * math::ctc_grad(lp_at<T>(p, t, b, c), lcab[c], nll_acc));
      lcab[c] = ninf;
    }
    Acc* w = nxt;
    nxt = cur;
    cur = w;
  }
}

template <class T>
void ctc_run(const core::CtcParams& p) {
  using Acc = math::AccOf<T>;
  if (p.N == 0) return;
  if (p.N > INT32_MAX) {  // a block per sample
    throw Error(ErrorCode::not_implemented, "log_probs", "at most 2^31 - 1 samples on cuda", std::to_string(p.N));
  }
  const DeviceScope scope(
      {{p.log_probs, "log_probs"}, {p.targets, "targets"}, {p.grad, "grad_log_probs"}, {p.log_alpha, "log_alpha"}});
  const auto n = [](int64_t v) { return static_cast<std::size_t>(v); };
  const bool backward = p.grad != nullptr;
  const Scratch<int64_t> host_arrays(n(3 * p.N));
  check(cudaMemcpyAsync(host_arrays.get(), p.target_offset, n(p.N) * sizeof(int64_t), cudaMemcpyHostToDevice, stream()),
        "cudaMemcpyAsync (target offsets)");
  check(cudaMemcpyAsync(host_arrays.get() + p.N, p.input_lengths, n(p.N) * sizeof(int64_t), cudaMemcpyHostToDevice,
                        stream()),
        "cudaMemcpyAsync (input lengths)");
  check(cudaMemcpyAsync(host_arrays.get() + 2 * p.N, p.target_lengths, n(p.N) * sizeof(int64_t), cudaMemcpyHostToDevice,
                        stream()),
        "cudaMemcpyAsync (target lengths)");
  const Scratch<double> gscale(backward ? n(p.N) : 0), nll(n(p.N));
  if (backward) upload(p.grad_scale, n(p.N), gscale);
  // alpha: the caller's; else a whole workspace for a backward, two rolling rows per sample for a forward
  const bool own_alpha = p.log_alpha == nullptr;
  const Scratch<Acc> alpha_ws(own_alpha ? (backward ? n(p.T * p.N * p.L) : n(p.N * 2 * p.L)) : 0);
  const Scratch<Acc> beta(backward ? n(p.N * 2 * p.L) : 0), lcab(backward ? n(p.N * p.C) : 0);
  const Scratch<int64_t> lab(n(p.N * p.L)), next(backward ? n(p.N * p.L) : 0);
  const Scratch<bool> first(backward ? n(p.N * p.L) : 0);
  CtcArgs<Acc> a{p,
                 host_arrays.get(),
                 host_arrays.get() + p.N,
                 host_arrays.get() + 2 * p.N,
                 gscale.get(),
                 nll.get(),
                 own_alpha ? alpha_ws.get() : static_cast<Acc*>(p.log_alpha),
                 !own_alpha || backward,
                 !own_alpha,
                 beta.get(),
                 lcab.get(),
                 lab.get(),
                 next.get(),
                 first.get()};
  a.p.alpha_ready = p.alpha_ready && !own_alpha;
  const auto grid = static_cast<unsigned>(p.N);
  if (backward) {
    ctc_backward_kernel<T><<<grid, kThreads, 0, stream()>>>(a);
  } else {
    ctc_forward_kernel<T><<<grid, kThreads, 0, stream()>>>(a);
  }
  check(cudaGetLastError(), backward ? "ctc_backward_kernel" : "ctc_forward_kernel");
  if (p.nll != nullptr) {
    check(cudaMemcpyAsync(p.nll, nll.get(), n(p.N) * sizeof(double), cudaMemcpyDeviceToHost, stream()),
          "cudaMemcpyAsync (nll)");
  }
  check(cudaStreamSynchronize(stream()), "ctc kernels");
}

}  // namespace

void ctc_run_samples(const core::CtcParams& p) {
  math::visit_float_dtype(p.dtype, [&](auto tag) { ctc_run<decltype(tag)>(p); });
}

}  // namespace lossfuse::cuda
