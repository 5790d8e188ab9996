// CUDA CTC kernels: the CPU backend's contract (src/core/ctc_params.hpp) and recursions (src/math/ctc_math.hpp) on
// the device, as a device call (core::CtcDeviceCall). One thread block per sample; its threads own the positions s of
// the extended label sequence l' (2 tl + 1 long, blanks interleaved), every time step one synchronised step of the
// alpha (forward) or beta (backward) recursion in log space, in Acc (float32; float64 for float64 input; 16-bit inputs
// widened exactly).
//
// check:    an eager call first scans the lengths and labels (ctc_check_kernel) and reads back the key of the first
//           bad one (8 bytes, one synchronisation); then nothing is written. Under stream capture it does not, and a
//           sample whose lengths or labels are bad gets a NaN loss, nll, log_alpha and gradient instead (every kernel
//           checks its own sample before it reads by them).
// forward:  alpha into the caller's log_alpha (T, N, L) when given (-inf outside t < il, s < len, as on the CPU),
//           else into two rolling rows per sample; nll_b = -log_add2(alpha_{il-1}(len - 1), alpha_{il-1}(len - 2))
//           (-alpha_{il-1}(0) when tl = 0; 0 for il = tl = 0, inf for il = 0 < tl). 'mean' / 'sum': each sample's
//           share (zero_infinity applied, over max(tl, 1) for mean) summed in ordered_sum's fixed tree.
// backward: alpha (the caller's, or recomputed into a workspace), then beta from t = il - 1 down; per step the log
//           occupancy of each class, lcab(c) = log sum_{s: l'_s = c} exp(alpha_t(s) + beta_t(s)): the blank's over
//           every even s by a block reduction in a fixed tree, a label's by the thread of its first position in l',
//           walking its later positions in order; then grad[t, b, c] = g_b (exp(lp) - exp(lcab(c) + nll_b - lp)),
//           0 for t >= il and everywhere for an impossible sample under zero_infinity; g_b read from the upstream
//           gradient on the device. No atomics in any value: the same bits on every run.
#include <cuda_runtime.h>

#include <algorithm>
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

// The kernel's view of one call: core's params and device call, host arrays copied to the device, the workspaces.
template <class Acc>
struct CtcArgs {
  core::CtcParams p;
  core::CtcLengths il, tl;    // on the device
  const int64_t* start;       // concatenated: (N), sample b's first label is element start[b] * target_stride
  int64_t batch_stride;       // padded: sample b's first label is element b * batch_stride
  int64_t S;                  // labels per sample at most: (L - 1) / 2
  Reduction reduction;
  Acc *loss, *nll;            // forward: (N) for none, else one element; (N) or nullptr
  double* share;              // forward mean / sum: (N), each sample's share of the loss
  const Acc* grad_loss;       // backward: sample b's at b * grad_loss_stride; nullptr: 1
  int64_t grad_loss_stride;
  Acc* alpha;                 // full: (T, N, L); else rolling: (N, 2, L)
  bool full;
  bool caller_alpha;  // alpha is the caller's log_alpha: filled -inf outside t < il, s < len
  Acc* beta;          // (N, 2, L), backward
  Acc* lcab;          // (N, C), backward: -inf between steps
  int64_t* lab;       // (N, L): l'
  int64_t* next;      // (N, L), backward: a label position's next position with the same label (-1: none)
  bool* first;        // (N, L), backward: the label position is its label's first in l'
};

__device__ inline int64_t length_at(const core::CtcLengths& l, int64_t b) {
  return core::read_target(l.data, l.dtype, b * l.stride);
}

template <class Acc>
__device__ int64_t first_label(const CtcArgs<Acc>& a, int64_t b) {
  return a.start != nullptr ? a.start[b] * a.p.target_stride : b * a.batch_stride;
}

template <class Acc>
__device__ bool lengths_fit(const CtcArgs<Acc>& a, int64_t il, int64_t tl) {
  return il >= 0 && il <= a.p.T && tl >= 0 && tl <= a.S;
}

__device__ inline bool bad_label(const core::CtcParams& p, int64_t v) { return v < 0 || v >= p.C || v == p.blank; }

template <class Acc>
__device__ Acc* alpha_row(const CtcArgs<Acc>& a, int64_t b, int64_t t) {
  return a.full ? a.alpha + (t * a.p.N + b) * a.p.L : a.alpha + (b * 2 + (t & 1)) * a.p.L;
}

template <class T>
__device__ math::AccOf<T> lp_at(const core::CtcParams& p, int64_t t, int64_t b, int64_t c) {
  return math::Io<T>::load(static_cast<const T*>(p.log_probs), t * p.lp_st + b * p.lp_sn + c * p.lp_sc);
}

// The key (CtcDeviceCall::bad) of every bad length and label, into *record by atomicMin (an integer: the smallest,
// whatever the order): 2 b, 2 b + 1, 2 N + flat label position.
template <class Acc>
__global__ void __launch_bounds__(kThreads) ctc_check_kernel(const CtcArgs<Acc> a, unsigned long long* record) {
  const core::CtcParams& p = a.p;
  for (int64_t b = blockIdx.x; b < p.N; b += gridDim.x) {
    const int64_t il = length_at(a.il, b), tl = length_at(a.tl, b);
    if (threadIdx.x == 0 && (il < 0 || il > p.T)) atomicMin(record, static_cast<unsigned long long>(2 * b));
    if (tl < 0 || tl > a.S) {
      if (threadIdx.x == 0) atomicMin(record, static_cast<unsigned long long>(2 * b + 1));
      continue;  // its labels are not read
    }
    const int64_t at = first_label(a, b), flat = 2 * p.N + (a.start != nullptr ? a.start[b] : b * a.S);
    for (int64_t s = threadIdx.x; s < tl; s += blockDim.x) {
      if (bad_label(p, core::read_target(p.targets, p.target_dtype, at + s * p.target_stride))) {
        atomicMin(record, static_cast<unsigned long long>(flat + s));
      }
    }
  }
}

// Sample b's l' into a.lab when its lengths fit; every thread returns whether its lengths and labels are good (the
// block's threads agree; a barrier).
template <class Acc>
__device__ bool make_labels(const CtcArgs<Acc>& a, int64_t b, int64_t il, int64_t tl) {
  const core::CtcParams& p = a.p;
  bool bad = !lengths_fit(a, il, tl);
  if (!bad) {
    int64_t* lab = a.lab + b * p.L;
    const int64_t at = first_label(a, b);
    for (int64_t s = threadIdx.x; s < 2 * tl + 1; s += blockDim.x) {
      int64_t v = p.blank;
      if (s & 1) {
        v = core::read_target(p.targets, p.target_dtype, at + (s >> 1) * p.target_stride);
        bad = bad || bad_label(p, v);
      }
      lab[s] = v;
    }
  }
  return __syncthreads_or(bad) == 0;
}

// -log p of sample b from its alpha row il - 1 (complete): 0 for il = tl = 0, inf for il = 0 < tl.
template <class Acc>
__device__ double nll_from_alpha(const CtcArgs<Acc>& a, int64_t b, int64_t il, int64_t tl) {
  if (il == 0) return tl == 0 ? 0.0 : pos_inf();
  const Acc* last = alpha_row(a, b, il - 1);
  const int64_t len = 2 * tl + 1;
  return -static_cast<double>(tl == 0 ? last[0] : math::log_add2(last[len - 1], last[len - 2]));
}

// Alpha over t < il for sample b, whose l' is made; returns nll (every thread). `fill`: the workspace's entries
// outside t < il, s < len are set to -inf (the caller's log_alpha, as the CPU writes it).
template <class T>
__device__ double forward_sample(const CtcArgs<math::AccOf<T>>& a, int64_t b, int64_t il, int64_t tl, bool fill) {
  using Acc = math::AccOf<T>;
  const core::CtcParams& p = a.p;
  const int64_t len = 2 * tl + 1;
  const Acc ninf = math::neg_inf<Acc>();
  const int64_t* lab = a.lab + b * p.L;
  if (fill && a.full) {
    for (int64_t t = 0; t < p.T; ++t) {
      Acc* row = alpha_row(a, b, t);
      for (int64_t s = (t < il ? len : 0) + threadIdx.x; s < p.L; s += blockDim.x) row[s] = ninf;
    }
  }
  if (il == 0) return nll_from_alpha(a, b, il, tl);
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
  return nll_from_alpha(a, b, il, tl);
}

template <class T>
__global__ void __launch_bounds__(kThreads) ctc_forward_kernel(const CtcArgs<math::AccOf<T>> a) {
  using Acc = math::AccOf<T>;
  const core::CtcParams& p = a.p;
  const int64_t b = blockIdx.x;
  const int64_t il = length_at(a.il, b), tl = length_at(a.tl, b);
  double nll = NAN;
  if (make_labels(a, b, il, tl)) {
    nll = forward_sample<T>(a, b, il, tl, a.caller_alpha);
  } else if (a.caller_alpha) {
    for (int64_t e = threadIdx.x; e < p.T * p.L; e += blockDim.x) alpha_row(a, b, e / p.L)[e % p.L] = Acc(NAN);
  }
  if (threadIdx.x != 0) return;
  if (a.nll != nullptr) a.nll[b] = static_cast<Acc>(nll);
  // zero_infinity replaces an impossible sample's inf by 0 (torch: where(loss == inf, 0, loss)).
  const double loss = p.zero_infinity && nll == pos_inf() ? 0.0 : nll;
  if (a.reduction == Reduction::none) {
    a.loss[b] = static_cast<Acc>(loss);
  } else {
    a.share[b] = a.reduction == Reduction::mean ? loss / static_cast<double>(tl > 1 ? tl : 1) : loss;
  }
}

// 'mean' / 'sum': the samples' shares in ordered_sum's fixed tree, over N for mean (N = 0: 0 / 0 = NaN, as torch's
// mean of nothing).
template <class Acc>
__global__ void __launch_bounds__(kThreads) ctc_reduce_kernel(const double* share, int64_t n, bool mean, Acc* loss) {
  const double s = ordered_sum<kThreads>(share, n);
  if (threadIdx.x == 0) *loss = static_cast<Acc>(mean ? s / static_cast<double>(n) : s);
}

template <class T>
__global__ void __launch_bounds__(kThreads) ctc_backward_kernel(const CtcArgs<math::AccOf<T>> a) {
  using Acc = math::AccOf<T>;
  const core::CtcParams& p = a.p;
  const int64_t b = blockIdx.x;
  const int64_t il = length_at(a.il, b), tl = length_at(a.tl, b), len = 2 * tl + 1;
  const Acc ninf = math::neg_inf<Acc>();
  T* grad = static_cast<T*>(p.grad);
  auto store = [&](int64_t t, int64_t c, Acc v) { math::Io<T>::store(grad, t * p.g_st + b * p.g_sn + c * p.g_sc, v); };
  if (!make_labels(a, b, il, tl)) {
    for (int64_t e = threadIdx.x; e < p.T * p.C; e += blockDim.x) store(e / p.C, e % p.C, Acc(NAN));
    return;
  }
  // alpha: the caller's, or made here
  const double nll = p.alpha_ready ? nll_from_alpha(a, b, il, tl) : forward_sample<T>(a, b, il, tl, a.caller_alpha);
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
  // The upstream gradient of loss_b, as the CPU's core forms it: in double, mean's divisors folded in.
  double up = a.grad_loss != nullptr ? static_cast<double>(a.grad_loss[b * a.grad_loss_stride]) : 1.0;
  if (a.reduction == Reduction::mean) up = up / static_cast<double>(p.N) / static_cast<double>(tl > 1 ? tl : 1);
  const auto g = static_cast<Acc>(up);
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
  core::CtcDeviceCall& call = *p.device_call;  // core makes every call on a device one
  const bool backward = p.grad != nullptr;
  const bool reduced = !backward && call.reduction != Reduction::none;
  if (p.N == 0 && !reduced) return;
  if (p.N > INT32_MAX) {  // a block per sample
    throw Error(ErrorCode::not_implemented, "log_probs", "at most 2^31 - 1 samples on cuda", std::to_string(p.N));
  }
  const DeviceScope scope({{p.log_probs, "log_probs"},
                           {p.targets, "targets"},
                           {p.grad, "grad_log_probs"},
                           {p.log_alpha, "log_alpha"},
                           {call.input_lengths.data, "input_lengths"},
                           {call.target_lengths.data, "target_lengths"},
                           {call.loss, "loss"},
                           {call.nll, "neg_log_likelihood"},
                           {call.grad_loss, "grad_loss"}});
  const bool reports = reports_bad_values();
  const auto n = [](int64_t v) { return static_cast<std::size_t>(v); };
  // Host arrays (eager calls only; refused by core under capture): core's vectors are pageable, and a copy from
  // pageable memory returns once they are staged, so they may go when the call returns (upload).
  const Scratch<int64_t> host_il(p.input_lengths != nullptr ? n(p.N) : 0),
      host_tl(p.target_lengths != nullptr ? n(p.N) : 0), start(call.target_start != nullptr ? n(p.N) : 0);
  const auto on_device = [&](const int64_t* host, const Scratch<int64_t>& buf, const core::CtcLengths& given) {
    return host != nullptr ? core::CtcLengths{upload(host, n(p.N), buf), DType::i64, 1} : given;
  };
  CtcArgs<Acc> a{};
  a.p = p;
  a.p.device_call = nullptr;
  a.il = on_device(p.input_lengths, host_il, call.input_lengths);
  a.tl = on_device(p.target_lengths, host_tl, call.target_lengths);
  a.start = upload(call.target_start, n(p.N), start);
  a.batch_stride = call.target_batch_stride;
  a.S = (p.L - 1) / 2;
  a.reduction = call.reduction;
  if (reports && p.N > 0) {
    const Scratch<unsigned long long> record(1);
    check(cudaMemsetAsync(record.get(), 0xff, sizeof(unsigned long long), stream()), "cudaMemsetAsync (check record)");
    ctc_check_kernel<Acc><<<static_cast<unsigned>(std::min<int64_t>(p.N, 4096)), kThreads, 0, stream()>>>(a,
                                                                                                          record.get());
    check(cudaGetLastError(), "ctc_check_kernel");
    const unsigned long long key = read_back(record.get(), "ctc_check_kernel");
    if (key != ~0ULL) {
      call.bad = static_cast<int64_t>(key);
      return;
    }
  }
  // alpha: the caller's; else a whole workspace for a backward, two rolling rows per sample for a forward
  const bool own_alpha = p.log_alpha == nullptr;
  const Scratch<Acc> alpha_ws(own_alpha ? (backward ? n(p.T * p.N * p.L) : n(p.N * 2 * p.L)) : 0);
  const Scratch<Acc> beta(backward ? n(p.N * 2 * p.L) : 0), lcab(backward ? n(p.N * p.C) : 0);
  const Scratch<int64_t> lab(n(p.N * p.L)), next(backward ? n(p.N * p.L) : 0);
  const Scratch<bool> first(backward ? n(p.N * p.L) : 0);
  const Scratch<double> share(reduced ? n(p.N) : 0);
  a.loss = static_cast<Acc*>(call.loss);
  a.nll = static_cast<Acc*>(call.nll);
  a.share = share.get();
  a.grad_loss = static_cast<const Acc*>(call.grad_loss);
  a.grad_loss_stride = call.grad_loss_stride;
  a.alpha = own_alpha ? alpha_ws.get() : static_cast<Acc*>(p.log_alpha);
  a.full = !own_alpha || backward;
  a.caller_alpha = !own_alpha;
  a.beta = beta.get(), a.lcab = lcab.get(), a.lab = lab.get(), a.next = next.get(), a.first = first.get();
  a.p.alpha_ready = p.alpha_ready && !own_alpha;
  const auto grid = static_cast<unsigned>(p.N);
  if (backward) {
    ctc_backward_kernel<T><<<grid, kThreads, 0, stream()>>>(a);
    check(cudaGetLastError(), "ctc_backward_kernel");
    return;
  }
  if (p.N > 0) {
    ctc_forward_kernel<T><<<grid, kThreads, 0, stream()>>>(a);
    check(cudaGetLastError(), "ctc_forward_kernel");
  }
  if (reduced) {
    ctc_reduce_kernel<Acc><<<1, kThreads, 0, stream()>>>(share.get(), p.N, call.reduction == Reduction::mean, a.loss);
    check(cudaGetLastError(), "ctc_reduce_kernel");
  }
}

}  // namespace

void ctc_run_samples(const core::CtcParams& p) {
  math::visit_float_dtype(p.dtype, [&](auto tag) { ctc_run<decltype(tag)>(p); });
}

}  // namespace lossfuse::cuda
