// CUDA cross-entropy and NLL kernels: the CPU backend's contract (src/core/cross_entropy_params.hpp) and math
// (src/math/cross_entropy_math.hpp) on the device.
//
// Cross-entropy: one thread block per row. The forward pass reads the row once (16-byte loads where the row is
// contiguous), each thread keeping an online (max, sum) pair and the label-smoothing / soft-target sums; the block
// combines them in a fixed order (bitwise the same on every run). The gradient pass recomputes exp(z - lse) from a
// second read of the row and writes the gradient (over the logits when in place: each element is read before the
// same thread writes it). Row losses for 'mean' / 'sum' go to a double per row. Class targets are read in their own
// integer dtype, and a target the kernel finds out of range makes its row NaN, never an out-of-bounds read.
// One road, the device call (CeParams::device_call, CeDeviceRows): the targets are scanned and the loss reduced on
// the device (ce_scan_kernel, reduce_rows_kernel: fixed trees, the same bits on every run, not the CPU's summation
// order), for core's calls in one launch of the row kernel and for the fused linear runner's chunks in several. A
// small eager batch (kInlineScanRows) scans inside the row kernel: one launch, no memset (tests/emu/launch_count_test).
// Accumulation in float32 (float64 for float64 logits); exp is the hardware's (__expf, a few ulp relative error at
// the arguments <= 0 used here).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/cross_entropy_params.hpp"
#include "core/targets.hpp"
#include "cuda/block_reduce.cuh"
#include "cuda/kernels.hpp"
#include "cuda/runtime.hpp"
#include "math/cross_entropy_math.hpp"
#include "math/online_lse.hpp"
#include "math/storage.hpp"

namespace lossfuse::cuda {
namespace {

using core::CeMode;
using core::CeParams;
using std::int64_t;

__host__ __device__ __forceinline__ int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }

// ---- element access -------------------------------------------------------------------------------------------

__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }
__device__ __forceinline__ float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }

template <class T>
__device__ __forceinline__ T from_acc(math::AccOf<T> v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(v);
  } else if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(v);
  } else {
    return v;
  }
}

__device__ __forceinline__ float fast_exp(float v) { return __expf(v); }
__device__ __forceinline__ double fast_exp(double v) { return exp(v); }

// f(c, x_c, 1) for the classes c in [from, to) this thread owns (from + threadIdx.x, then every blockDim.x).
template <class T, class F>
__device__ __forceinline__ void visit_scalars(const T* x, int64_t xs, int64_t from, int64_t to, F& f) {
  for (int64_t c = from + threadIdx.x; c < to; c += blockDim.x) {
    const math::AccOf<T> v[1] = {to_acc(x[c * xs])};
    f(c, v, std::integral_constant<int, 1>{});
  }
}

// f(c0, the 16 / sizeof(T) values of `raw`, that count): classes c0, c0 + 1, ...
template <class T, class F>
__device__ __forceinline__ void visit_word(const uint4& raw, int64_t c0, F& f) {
  constexpr int kV = 16 / sizeof(T);
  const T* e = reinterpret_cast<const T*>(&raw);
  math::AccOf<T> v[kV];
#pragma unroll
  for (int k = 0; k < kV; ++k) v[k] = to_acc(e[k]);
  f(c0, v, std::integral_constant<int, kV>{});
}

// Calls f(c0, v, n) for every run of classes this thread owns, in a fixed order per thread: v[0..N) holds x_c0 ..
// x_(c0+N-1) in Acc and n is std::integral_constant<int, N>, N = 16 / sizeof(T) for the 16-byte loads of a contiguous
// row (kUnroll of them in flight) and 1 for its unaligned head and tail and for strided rows.
template <class T, class F>
__device__ __forceinline__ void for_row(const T* x, int64_t xs, int64_t C, F&& f) {
  if (xs != 1) {
    visit_scalars(x, xs, 0, C, f);
    return;
  }
  constexpr int kV = 16 / sizeof(T);
  constexpr int kUnroll = 4;
  const int64_t tid = threadIdx.x, nt = blockDim.x;
  const auto addr = reinterpret_cast<std::uintptr_t>(x);
  const int64_t head = min_i64(C, static_cast<int64_t>((16 - addr % 16) % 16 / sizeof(T)));
  visit_scalars(x, 1, 0, head, f);
  const int64_t nvec = (C - head) / kV;
  const uint4* xv = reinterpret_cast<const uint4*>(x + head);
  for (int64_t i0 = tid; i0 < nvec; i0 += nt * kUnroll) {
    uint4 raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = i0 + u * nt;
      if (i < nvec) raw[u] = xv[i];  // plain loads: in place, the kernel later writes these bytes
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = i0 + u * nt;
      if (i < nvec) visit_word<T>(raw[u], head + i * kV, f);
    }
  }
  visit_scalars(x, 1, head + nvec * kV, C, f);
}

// Writes g[c * gs] = value(c, x_c) for every class: 16-byte loads and stores where both rows are contiguous and
// share their alignment (always so in place), else element by element. Each element is read before it is written,
// by the same thread.
template <class T, class F>
__device__ __forceinline__ void map_row(const T* x, int64_t xs, T* g, int64_t gs, int64_t C, F&& value) {
  const int64_t tid = threadIdx.x, nt = blockDim.x;
  constexpr int kV = 16 / sizeof(T);
  const auto ax = reinterpret_cast<std::uintptr_t>(x), ag = reinterpret_cast<std::uintptr_t>(g);
  if (xs != 1 || gs != 1 || ax % 16 != ag % 16) {
    for (int64_t c = tid; c < C; c += nt) g[c * gs] = from_acc<T>(value(c, to_acc(x[c * xs])));
    return;
  }
  const int64_t head = min_i64(C, static_cast<int64_t>((16 - ax % 16) % 16 / sizeof(T)));
  for (int64_t c = tid; c < head; c += nt) g[c] = from_acc<T>(value(c, to_acc(x[c])));
  const int64_t nvec = (C - head) / kV;
  const uint4* xv = reinterpret_cast<const uint4*>(x + head);
  uint4* gv = reinterpret_cast<uint4*>(g + head);
  for (int64_t i = tid; i < nvec; i += nt) {
    const uint4 in = xv[i];  // not __ldg: in place, g is x
    uint4 out;
    const T* e = reinterpret_cast<const T*>(&in);
    T* o = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int k = 0; k < kV; ++k) o[k] = from_acc<T>(value(head + i * kV + k, to_acc(e[k])));
    gv[i] = out;
  }
  for (int64_t c = head + nvec * kV + tid; c < C; c += nt) g[c] = from_acc<T>(value(c, to_acc(x[c])));
}

// A contiguous row of up to kKeep 16-byte vectors per thread, kept in registers between the forward's read and the
// gradient's write, so the fused entry reads the row once (a third less traffic than reading it twice). The vectors
// are those for_row's contiguous path visits; the unaligned head and tail go through memory.
template <class T, int kKeep>
struct KeptRow {
  static constexpr int kV = 16 / sizeof(T);
  using Acc = math::AccOf<T>;
  uint4 keep[kKeep];
  int64_t head = 0, nvec = 0;

  // Whether the row fits and the gradient row shares the logits' alignment (always so in place).
  __device__ __forceinline__ bool fits(const T* x, int64_t xs, const T* g, int64_t gs, int64_t C) {
    const auto ax = reinterpret_cast<std::uintptr_t>(x), ag = reinterpret_cast<std::uintptr_t>(g);
    head = min_i64(C, static_cast<int64_t>((16 - ax % 16) % 16 / sizeof(T)));
    nvec = (C - head) / kV;
    return xs == 1 && gs == 1 && ax % 16 == ag % 16 && nvec <= int64_t{kKeep} * blockDim.x;
  }
  // As for_row, keeping the vectors.
  template <class F>
  __device__ __forceinline__ void load(const T* x, int64_t C, F&& f) {
    const int64_t tid = threadIdx.x, nt = blockDim.x;
    const uint4* xv = reinterpret_cast<const uint4*>(x + head);
#pragma unroll
    for (int j = 0; j < kKeep; ++j) {
      if (tid + j * nt < nvec) keep[j] = xv[tid + j * nt];
    }
    visit_scalars(x, 1, 0, head, f);
#pragma unroll
    for (int j = 0; j < kKeep; ++j) {
      if (tid + j * nt < nvec) visit_word<T>(keep[j], head + (tid + j * nt) * kV, f);
    }
    visit_scalars(x, 1, head + nvec * kV, C, f);
  }
  // As map_row, from the kept vectors.
  template <class V>
  __device__ __forceinline__ void store(const T* x, T* g, int64_t C, V&& value) {
    const int64_t tid = threadIdx.x, nt = blockDim.x;
    uint4* gv = reinterpret_cast<uint4*>(g + head);
    for (int64_t c = tid; c < head; c += nt) g[c] = from_acc<T>(value(c, to_acc(x[c])));
#pragma unroll
    for (int j = 0; j < kKeep; ++j) {
      const int64_t i = tid + j * nt;
      if (i < nvec) {
        const T* e = reinterpret_cast<const T*>(&keep[j]);
        uint4 out;
        T* o = reinterpret_cast<T*>(&out);
#pragma unroll
        for (int k = 0; k < kV; ++k) o[k] = from_acc<T>(value(head + i * kV + k, to_acc(e[k])));
        gv[i] = out;
      }
    }
    for (int64_t c = head + nvec * kV + tid; c < C; c += nt) g[c] = from_acc<T>(value(c, to_acc(x[c])));
  }
};

// Threads per row at most (a small batch's rows up to kMaxWideThreads: ce_threads), and vectors per thread a fused row
// keeps: 16 x 16 bytes (64 registers), rows up to 64 KiB at 256 threads.
constexpr int kMaxRowThreads = 256;
constexpr int kMaxWideThreads = 1024;
constexpr int kKeepVectors = 16;

// ---- block reduction ------------------------------------------------------------------------------------------

// A partial row: the online log-sum-exp (m, s) and the position-dependent sums, taken relative to ref_of(m), the
// running max (0 while only -inf has been seen), so no sum cancels against a far-off first value (a masked logit).
template <class Acc>
struct Part {
  Acc m, s;         // online log-sum-exp
  Acc wz, wp, wpz;  // sum w (z - ref), sum w p, sum w p (z - ref)
  Acc sw;           // sum w over the values in wz (to move wz with ref)
  int bad;          // a NaN or +inf z was seen (set from s, or where only -inf and NaN were seen)
};

template <class Acc>
__device__ __forceinline__ Acc ref_of(Acc m) {
  return m > static_cast<Acc>(-INFINITY) ? m : Acc(0);
}

// The sums re-expressed relative to a reference d above the current one.
template <class Acc>
__device__ __forceinline__ void shift_sums(Part<Acc>& p, Acc d) {
  p.wz -= d * p.sw;
  p.wpz -= d * p.wp;
}

template <class Acc>
__device__ __forceinline__ Part<Acc> combine(Part<Acc> a, Part<Acc> b) {
  const math::LseState<Acc> l = math::lse_combine<Acc>({a.m, a.s}, {b.m, b.s});
  const Acc r = ref_of(l.m);
  if (a.sw != Acc(0) || a.wp != Acc(0)) shift_sums(a, r - ref_of(a.m));
  if (b.sw != Acc(0) || b.wp != Acc(0)) shift_sums(b, r - ref_of(b.m));
  return {l.m, l.s, a.wz + b.wz, a.wp + b.wp, a.wpz + b.wpz, a.sw + b.sw, a.bad | b.bad};
}

// The block's combined Part, returned to every thread (combine is commutative bit for bit). The combining order
// depends on the block size alone.
template <class Acc>
__device__ Part<Acc> block_combine(const Part<Acc>& p) {
  return warp_tree_reduce(p, [](const Part<Acc>& a, const Part<Acc>& b) { return combine(a, b); });
}

// ---- cross-entropy --------------------------------------------------------------------------------------------

// ---- device calls (core::CeDeviceCall): weights, target scan and reduction on the device -------------------------

// A device call's record, written by ce_scan_kernel before the row kernels read it.
struct CeScan {
  unsigned long long bad;   // rows - (the first bad target's row); 0: none (atomicMax keeps the first)
  unsigned done;            // scan blocks finished
  unsigned reduce_done;     // reduce_rows_kernel's blocks finished, or ce_rows_kernel's with a folded reduction
  double denominator;       // 'mean': sum of target weights (rows for probability targets)
  double loss_denominator;  // the loss's and its gradient's (core::split_mean_denominator)
  double grad_scale;        // mean / sum: the upstream scalar, over loss_denominator for mean
  double sum_w;             // sum of the class weights (classes when unweighted)
};

// The scan's grid: a function of the row count alone, so the denominators' summation order is fixed.
constexpr int kScanThreads = 256;
constexpr int64_t kScanRowsPerBlock = 8192;
constexpr int kMaxScanBlocks = 256;
unsigned scan_grid(int64_t rows) {
  return static_cast<unsigned>(
      std::clamp<int64_t>((rows + kScanRowsPerBlock - 1) / kScanRowsPerBlock, 1, kMaxScanBlocks));
}

template <class Acc>
struct ScanArgs {
  const Acc* w;             // class weights (Acc) or nullptr
  const void* grad_scalar;  // Acc scalar or nullptr (1)
  bool mean, split_mean;
  CeScan* scan;              // zeroed before the kernel
  double* part_w;            // [gridDim.x] each block's sum of target weights
  long long* part_counted;   // [gridDim.x] its non-ignored rows
  long long* part_weighted;  // [gridDim.x] those with a nonzero target weight
};

// A lane's share of the target scan (core::scan_targets' checks and sums): the rows first, first + step, ... below hi.
struct Tally {
  double tw;            // sum of the target weights
  long long counted;    // rows not ignored
  long long weighted;   // of those, rows whose target weight is nonzero
  long long first_bad;  // the first row with a target out of range; LLONG_MAX: none
};

template <class Acc>
__device__ Tally tally_targets(const CeParams& p, const Acc* w, int64_t first, int64_t hi, int64_t step) {
  Tally t{0, 0, 0, LLONG_MAX};
  if (p.soft) return t;
  for (int64_t r = first; r < hi; r += step) {
    const int64_t y = core::read_target(p.target, p.target_dtype, p.index.offset(core::kTargetRow, r));
    if (y == p.ignore_index) continue;
    ++t.counted;
    if (y < 0 || y >= p.classes) {
      if (t.first_bad == LLONG_MAX) t.first_bad = r;  // this thread's rows ascend
      continue;
    }
    const double wt = w != nullptr ? static_cast<double>(w[y]) : 1.0;
    t.tw += wt;
    t.weighted += wt != 0;
  }
  return t;
}

// A scan lane's share of the class weights' sum: classes lane, lane + kScanThreads, ... in order.
template <class Acc>
__device__ double lane_weight_sum(const Acc* w, int64_t classes, int lane) {
  double s = 0;
  for (int64_t c = lane; c < classes; c += kScanThreads) s += static_cast<double>(w[c]);
  return s;
}

// The record's sums from the scan's totals: the denominators and the gradient's scale.
template <class Acc>
__device__ void complete_scan(const CeParams& p, double total, long long n, long long nz, double sum_w,
                              const void* grad_scalar, bool mean, bool split_mean, CeScan& out) {
  const double den = p.soft ? static_cast<double>(p.rows) : total;
  const double loss_den = !p.soft && split_mean ? core::split_mean_denominator(den, n, nz, true) : den;
  double gs = grad_scalar != nullptr ? static_cast<double>(*static_cast<const Acc*>(grad_scalar)) : 1.0;
  if (mean) gs /= loss_den;
  out.denominator = den;
  out.loss_denominator = loss_den;
  out.grad_scale = gs;
  out.sum_w = sum_w;
}

// Each block scans its contiguous range of rows; the last block to finish sums the blocks' partials in block order
// and the class weights, and completes the record.
template <class Acc>
__global__ void __launch_bounds__(kScanThreads) ce_scan_kernel(const CeParams p, const ScanArgs<Acc> a) {
  const int64_t per = (p.rows + gridDim.x - 1) / gridDim.x;
  const int64_t lo = static_cast<int64_t>(blockIdx.x) * per, hi = min_i64(p.rows, lo + per);
  const Tally t = tally_targets(p, a.w, lo + threadIdx.x, hi, blockDim.x);
  if (t.first_bad != LLONG_MAX) atomicMax(&a.scan->bad, static_cast<unsigned long long>(p.rows - t.first_bad));
  const double tw = block_reduce<kScanThreads>(t.tw, Plus{});
  const long long counted = block_reduce<kScanThreads>(t.counted, Plus{});
  const long long weighted = block_reduce<kScanThreads>(t.weighted, Plus{});
  if (threadIdx.x == 0) {
    a.part_w[blockIdx.x] = tw;
    a.part_counted[blockIdx.x] = counted;
    a.part_weighted[blockIdx.x] = weighted;
  }
  if (!last_block_done(&a.scan->done)) return;
  double sum_w = static_cast<double>(p.classes);
  if (a.w != nullptr) sum_w = block_reduce<kScanThreads>(lane_weight_sum(a.w, p.classes, threadIdx.x), Plus{});
  if (threadIdx.x != 0) return;
  const volatile double* pw = a.part_w;
  const volatile long long* pc = a.part_counted;
  const volatile long long* pz = a.part_weighted;
  double total = 0;
  long long n = 0, nz = 0;
  for (unsigned b = 0; b < gridDim.x; ++b) total += pw[b], n += pc[b], nz += pz[b];
  complete_scan<Acc>(p, total, n, nz, sum_w, a.grad_scalar, a.mean, a.split_mean, *a.scan);
}

// 'mean' / 'sum' of a device call: each block of the scan's grid (scan_grid, a function of the row count) sums its
// contiguous range of the rows' losses (and z-losses) in a fixed tree, and the last block to finish sums the blocks'
// partials in block order, over the record's denominators for mean, into the one-element outputs.
template <class Acc>
__global__ void __launch_bounds__(kScanThreads)
    reduce_rows_kernel(const double* row_loss, const double* row_zloss, int64_t rows, CeScan* scan, bool skip_bad,
                       bool mean, double* part, Acc* loss, Acc* z_loss) {
  if (skip_bad && scan->bad != 0) return;
  const int64_t per = (rows + gridDim.x - 1) / gridDim.x;
  const int64_t lo = static_cast<int64_t>(blockIdx.x) * per, hi = min_i64(rows, lo + per);
  const int64_t n = hi > lo ? hi - lo : 0;
  double l = ordered_sum<kScanThreads>(row_loss + lo, n);
  double z = row_zloss != nullptr ? ordered_sum<kScanThreads>(row_zloss + lo, n) : 0.0;
  if (threadIdx.x == 0) {
    part[2 * blockIdx.x] = l;
    part[2 * blockIdx.x + 1] = z;
  }
  if (!last_block_done(&scan->reduce_done) || threadIdx.x != 0) return;
  const volatile double* pv = part;
  l = z = 0;
  for (unsigned b = 0; b < gridDim.x; ++b) l += pv[2 * b], z += pv[2 * b + 1];
  // 'mean' of nothing is 0 / 0 = NaN, as core::write_reduced
  if (loss != nullptr) *loss = static_cast<Acc>(mean ? l / scan->loss_denominator : l);
  if (z_loss != nullptr) *z_loss = static_cast<Acc>(mean ? z / scan->denominator : z);
}

// The scan inline (DeviceSteps::inline_scan, a small batch): the row kernel tallies every row's target itself
// (inline_scan), and block 0 writes the record's `bad` for the read-back. record nullptr: the scan ran on the stream.
struct InlineScan {
  CeScan* record = nullptr;
  const void* grad_scalar = nullptr;  // Acc scalar or nullptr (1)
  bool mean = false, split_mean = false;
};

template <class T>
struct CeKernelArgs {
  CeParams p;               // device pointers, but for p.weight (see w), the host-side block sums and device_call
  const math::AccOf<T>* w;  // class weights on the device, or nullptr
  double* row_loss;         // mean / sum: each row's loss (and z-loss), summed per block afterwards
  double* row_zloss;
  const CeScan* scan;  // a device call's record (grad_scale, sum_w from it), or nullptr
  bool skip_bad;       // with scan: a bad target makes the kernel write nothing
  const void* held_scalar = nullptr;  // CeDeviceCall::held: the upstream scalar (Acc); its value 1 writes nothing
  // A folded reduction (CeDeviceRows::rows_reduced): the block finishing last sums row_loss / row_zloss into these,
  // as reduce_rows_kernel would, counting on scan's reduce_done; nullptr both: none.
  math::AccOf<T>* loss = nullptr;
  math::AccOf<T>* z_loss = nullptr;
  unsigned* reduce_done = nullptr;
  bool mean = false;
  InlineScan in{};  // with in.record, scan is nullptr
};

// The scan of a small batch inside each block of a row kernel: every block tallies all p.rows targets (at most
// kInlineScanRows reads, from L2 after the first block) and, with label smoothing, the class weights (which its rows
// read anyway). The sums take ce_scan_kernel's order for one scan block (kScanThreads lanes, each its strided rows or
// classes in order, then block_reduce's tree at that width: tree_fold), whatever this block's size, so the record has
// the bits the general path's has (an eager call and a captured one agree) and every block holds the same. Block 0
// writes the record's `bad`.
template <class Acc>
__device__ CeScan inline_scan(const CeParams& p, const Acc* w, const InlineScan& in) {
  struct Sums {
    double tw, sw;
  };
  __shared__ Sums lanes[kScanThreads];
  const bool smoothing_weights = w != nullptr && p.eps != 0.0;  // sum_w is used with label smoothing alone
  Tally mine{0, 0, 0, LLONG_MAX};
  for (int v = threadIdx.x; v < kScanThreads; v += blockDim.x) {
    const Tally t = tally_targets(p, w, v, p.rows, kScanThreads);
    lanes[v] = {t.tw, smoothing_weights ? lane_weight_sum(w, p.classes, v) : 0.0};
    mine.counted += t.counted;
    mine.weighted += t.weighted;
    mine.first_bad = Min{}(mine.first_bad, t.first_bad);
  }
  tree_fold<kScanThreads>(lanes, kScanThreads, [](const Sums& x, const Sums& y) {
    return Sums{x.tw + y.tw, x.sw + y.sw};
  });
  const Tally n = warp_tree_reduce(mine, [](const Tally& x, const Tally& y) {
    return Tally{0, x.counted + y.counted, x.weighted + y.weighted, Min{}(x.first_bad, y.first_bad)};
  });
  CeScan s{};
  s.bad = n.first_bad == LLONG_MAX ? 0 : static_cast<unsigned long long>(p.rows - n.first_bad);
  const double total = 0.0 + lanes[0].tw;  // as ce_scan_kernel's sum over its one block
  complete_scan<Acc>(p, total, n.counted, n.weighted, smoothing_weights ? lanes[0].sw : static_cast<double>(p.classes),
                     in.grad_scalar, in.mean, in.split_mean, s);
  if (blockIdx.x == 0 && threadIdx.x == 0) in.record->bad = s.bad;
  return s;
}

// The record a row kernel goes by, in every thread (a block-wide step: call it from every thread): the stream's scan or
// the kernel's own (inline_scan); false: the call has neither.
template <class Acc>
__device__ bool read_record(const CeParams& p, const Acc* w, const CeScan* scan, const InlineScan& in, CeScan& out) {
  if (in.record != nullptr) {
    out = inline_scan(p, w, in);
    return true;
  }
  if (scan == nullptr) return false;
  out = *scan;
  return true;
}

// kSums: label smoothing or soft targets (the position-dependent sums); kCap: softcap on; kKeep: a fused call whose
// rows fit KeptRow (blocks of at most 256 threads, two per multiprocessor, 128 registers per thread); the others up to
// 1024 threads (ce_threads), 64 registers per thread.
template <class T, bool kSoft, bool kCap, bool kSums, bool kKeep>
__global__ void __launch_bounds__(kKeep ? kMaxRowThreads : kMaxWideThreads, kKeep ? 2 : 1)
    ce_rows_kernel(const CeKernelArgs<T> a) {
  using Acc = math::AccOf<T>;
  const CeParams& p = a.p;
  const Acc nan = static_cast<Acc>(NAN), inf = static_cast<Acc>(INFINITY);
  const int64_t C = p.classes;
  math::LogitTransform<Acc> xf;
  xf.scale = static_cast<Acc>(p.scale);
  xf.softcap = static_cast<Acc>(p.softcap);
  xf.inv_softcap = p.softcap > 0 ? static_cast<Acc>(1.0 / p.softcap) : Acc(0);
  math::CeRowParams<Acc> rp;
  rp.eps = static_cast<Acc>(p.eps);
  rp.eps_over_c = static_cast<Acc>(p.eps / static_cast<double>(C));
  rp.sum_w = static_cast<Acc>(p.sum_w);
  rp.z_loss_scale = static_cast<Acc>(p.z_loss_scale);
  double grad_scale = p.grad_scale;
  // uniform over the grid: a held gradient stands at an upstream value of 1
  if (a.held_scalar != nullptr && *static_cast<const Acc*>(a.held_scalar) == Acc(1)) return;
  double den = 0, loss_den = 0;  // the folded reduction's
  if (CeScan s; read_record(p, a.w, a.scan, a.in, s)) {
    if (a.skip_bad && s.bad != 0) return;  // uniform over the grid: nothing is written
    grad_scale = s.grad_scale;
    rp.sum_w = static_cast<Acc>(s.sum_w);
    den = s.denominator;
    loss_den = s.loss_denominator;
  }
  const Acc* w = a.w;
  const bool need_wz = p.eps != 0.0;
  const bool fwd = p.mode != CeMode::backward;
  const bool bwd = p.mode != CeMode::forward;

  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const T* x = static_cast<const T*>(p.logits) + p.index.offset(core::kLogitsRow, r);
    const T* pt = nullptr;
    int64_t y = 0;
    if constexpr (kSoft) {
      pt = static_cast<const T*>(p.target) + p.index.offset(core::kTargetRow, r);
    } else {
      y = core::read_target(p.target, p.target_dtype, p.index.offset(core::kTargetRow, r));
    }
    // The target's weight and logit, read once the row's own loads are in flight (the target load above is issued
    // first and used here) and before any in-place write.
    bool ignored = false, valid = true;
    Acc w_y = 0, x_y = 0;
    auto resolve_target = [&] {
      ignored = !kSoft && y == p.ignore_index;
      valid = kSoft || ignored || (y >= 0 && y < C);
      if (!kSoft && !ignored && valid) {
        w_y = w != nullptr ? w[y] : Acc(1);
        x_y = to_acc(x[y * p.x_cstride]);
      }
    };
    T* g = bwd ? static_cast<T*>(p.grad) + p.index.offset(core::kGradRow, r) : nullptr;
    KeptRow<T, kKeep ? kKeepVectors : 1> kept;
    const bool keep = kKeep && kept.fits(x, p.x_cstride, g, p.g_cstride, C);  // the same for the whole block

    math::RowSums<Acc> rs{};
    bool ok = true;
    if (fwd) {
      Part<Acc> part{-inf, 0, 0, 0, 0, 0, 0};
      auto stats = [&](int64_t c0, const Acc* v, auto n) {
        constexpr int N = decltype(n)::value;
        Acc z[N];
        Acc vmax = -inf;  // NaN is skipped here: it reaches s (or bad) below
#pragma unroll
        for (int k = 0; k < N; ++k) {
          z[k] = xf.template apply_as<kCap>(v[k]);
          vmax = z[k] > vmax ? z[k] : vmax;
        }
        if (vmax > part.m) {  // one rescale per run; +inf makes s NaN below, as NaN does
          if constexpr (kSums) shift_sums(part, ref_of(vmax) - ref_of(part.m));
          part.s *= fast_exp(part.m - vmax);
          part.m = vmax;
        }
        if (part.m > -inf) {
#pragma unroll
          for (int k = 0; k < N; ++k) part.s += fast_exp(z[k] - part.m);
        } else {
#pragma unroll
          for (int k = 0; k < N; ++k) part.bad |= isnan(z[k]);  // only -inf or NaN so far
        }
        if constexpr (kSums) {
          const Acc ref = ref_of(part.m);
#pragma unroll
          for (int k = 0; k < N; ++k) {
            const Acc wc = w != nullptr ? w[c0 + k] : Acc(1);
            if (need_wz) {
              part.wz += wc * (z[k] - ref);
              part.sw += wc;
            }
            if constexpr (kSoft) {
              const Acc pc = to_acc(pt[(c0 + k) * p.t_cstride]);
              part.wp += wc * pc;
              part.wpz += wc * pc * (z[k] - ref);
            }
          }
        }
      };
      if (keep) {
        kept.load(x, C, stats);
      } else {
        for_row(x, p.x_cstride, C, stats);
      }
      part.bad |= isnan(part.s);  // a NaN or +inf z
      resolve_target();
      part = block_combine(part);
      ok = valid && !part.bad && part.m > -inf;
      rs.m = ref_of(part.m);
      rs.top = part.m;
      rs.log_s = log(part.s);
      rs.lse = ok ? rs.top + rs.log_s : nan;
      rs.sum_wz = part.wz;
      rs.sum_wp = part.wp;
      rs.sum_wpz = part.wpz;
      if (threadIdx.x == 0) {
        Acc loss = 0, zl = 0;
        if (!ignored) {
          if (ok) {
            loss = kSoft ? math::ce_soft_row_loss(rp, rs) : math::ce_index_row_loss(rp, rs, w_y, xf.apply(x_y));
            zl = math::z_loss_row(rp, rs.lse);
            loss += zl;
          } else {
            loss = zl = nan;
          }
        }
        if (p.lse_rows != nullptr) {
          if (p.lse_f64) {
            static_cast<double*>(p.lse_rows)[r] =
                ok ? static_cast<double>(rs.top) + static_cast<double>(rs.log_s) : static_cast<double>(NAN);
          } else {
            static_cast<Acc*>(p.lse_rows)[r] = rs.lse;
          }
        }
        if (p.loss_rows != nullptr) static_cast<Acc*>(p.loss_rows)[r] = loss;
        if (p.zloss_rows != nullptr) static_cast<Acc*>(p.zloss_rows)[r] = zl;
        if (a.row_loss != nullptr) {
          a.row_loss[r] = static_cast<double>(loss);
          a.row_zloss[r] = static_cast<double>(zl);
        }
      }
    } else {
      resolve_target();
      if (p.lse_f64) {
        const double saved = static_cast<const double*>(p.lse_in)[r];
        rs.top = static_cast<Acc>(saved);
        rs.log_s = isfinite(rs.top) ? static_cast<Acc>(saved - static_cast<double>(rs.top)) : Acc(0);
        rs.lse = rs.top;
      } else {
        rs.lse = static_cast<const Acc*>(p.lse_in)[r];
        rs.top = rs.lse;
        rs.log_s = 0;
      }
      ok = valid && !isnan(rs.lse);
      if constexpr (kSoft) {
        Part<Acc> part{-inf, 0, 0, 0, 0, 0, 0};
        for_row(pt, p.t_cstride, C, [&](int64_t c0, const Acc* v, auto n) {
#pragma unroll
          for (int k = 0; k < decltype(n)::value; ++k) part.wp += (w != nullptr ? w[c0 + k] : Acc(1)) * v[k];
        });
        rs.sum_wp = block_combine(part).wp;
      }
    }
    if (!bwd) continue;
    __syncthreads();  // every thread has read x_y before any gradient (in place: the logits) is written

    if (!ok || ignored) {
      // PyTorch's log_softmax backward gives NaN on a non-finite row, even when its target is ignored.
      const Acc fill = ok ? Acc(0) : nan;
      map_row(x, p.x_cstride, g, p.g_cstride, C, [&](int64_t, Acc) { return fill; });
      continue;
    }
    Acc gscale = static_cast<Acc>(grad_scale);
    if (p.grad_loss != nullptr) {
      gscale =
          static_cast<Acc>(static_cast<const Acc*>(p.grad_loss)[p.index.offset(core::kGradLossRow, r)] * grad_scale);
    }
    const Acc A = kSoft ? math::ce_soft_grad_a(rp, rs) : math::ce_index_grad_a(rp, rs.lse, w_y);
    const Acc one_m = Acc(1) - rp.eps;
    auto value = [&](int64_t c, Acc xv) {
      const Acc z = xf.template apply_as<kCap>(xv);
      Acc t = fast_exp((z - rs.top) - rs.log_s) * A;
      if constexpr (kSums) {
        Acc b = rp.eps_over_c;
        if constexpr (kSoft) b += one_m * to_acc(pt[c * p.t_cstride]);
        if (w != nullptr) b *= w[c];
        t -= b;
      }
      if (!kSoft && c == y) t -= one_m * w_y;
      return t * gscale * xf.template derivative_from_z<kCap>(z);
    };
    if (keep) {
      kept.store(x, g, C, value);
    } else {
      map_row(x, p.x_cstride, g, p.g_cstride, C, value);
    }
  }
  if (a.reduce_done == nullptr || !last_block_done(a.reduce_done)) return;
  constexpr int kWidth = kKeep ? kMaxRowThreads : kMaxWideThreads;  // the tree's bits depend on blockDim.x alone
  const double l = ordered_sum<kWidth>(a.row_loss, p.rows);
  const double z = a.z_loss != nullptr ? ordered_sum<kWidth>(a.row_zloss, p.rows) : 0.0;
  if (threadIdx.x != 0) return;
  // 'mean' of nothing is 0 / 0 = NaN, as core::write_reduced
  if (a.loss != nullptr) *a.loss = static_cast<Acc>(a.mean ? l / loss_den : l);
  if (a.z_loss != nullptr) *a.z_loss = static_cast<Acc>(a.mean ? z / den : z);
}

// ---- NLL ------------------------------------------------------------------------------------------------------

// Rows grid-strided, one a thread. Inline (in.record, a small batch): one block of kScanThreads threads, which scans
// the targets itself and, given loss, sums the rows' losses into it in reduce_rows_kernel's order for one block
// (thread t's rows t, t + kScanThreads, ... in order, then the block's tree): one launch, the general path's bits.
template <class T>
__global__ void __launch_bounds__(kScanThreads)
    nll_forward_kernel(const CeParams p, const math::AccOf<T>* w, double* row_loss, const CeScan* scan, bool skip_bad,
                       const InlineScan in, math::AccOf<T>* loss_out) {
  using Acc = math::AccOf<T>;
  CeScan s{};
  if (read_record(p, w, scan, in, s) && skip_bad && s.bad != 0) return;  // uniform over the grid: nothing written
  double mine = 0;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < p.rows; r += step) {
    const int64_t y = core::read_target(p.target, p.target_dtype, p.index.offset(core::kTargetRow, r));
    Acc loss = 0;  // ignored rows contribute exactly 0 (never 0 * x)
    if (y != p.ignore_index) {
      if (y >= 0 && y < p.classes) {
        const Acc w_y = w != nullptr ? w[y] : Acc(1);
        loss = -w_y * to_acc(static_cast<const T*>(p.logits)[p.index.offset(core::kLogitsRow, r) + y * p.x_cstride]);
      } else {
        loss = static_cast<Acc>(NAN);
      }
    }
    if (p.loss_rows != nullptr) static_cast<Acc*>(p.loss_rows)[r] = loss;
    if (row_loss != nullptr) row_loss[r] = static_cast<double>(loss);
    mine += static_cast<double>(loss);
  }
  if (loss_out == nullptr) return;
  const double l = 0.0 + block_reduce<kScanThreads>(mine, Plus{});  // 0 + the one block's partial, as the fold's
  if (threadIdx.x == 0) *loss_out = static_cast<Acc>(in.mean ? l / s.loss_denominator : l);
}

template <class T>
__global__ void __launch_bounds__(kMaxRowThreads)
    nll_backward_kernel(const CeParams p, const math::AccOf<T>* w, const CeScan* scan, bool skip_bad,
                        const InlineScan in) {
  using Acc = math::AccOf<T>;
  double grad_scale = p.grad_scale;
  if (CeScan s; read_record(p, w, scan, in, s)) {
    if (skip_bad && s.bad != 0) return;
    grad_scale = s.grad_scale;
  }
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const int64_t y = core::read_target(p.target, p.target_dtype, p.index.offset(core::kTargetRow, r));
    const bool ignored = y == p.ignore_index;
    const bool bad = !ignored && !(y >= 0 && y < p.classes);  // core refused it already: a NaN row, no wild write
    Acc v = 0;
    if (!ignored && !bad) {
      Acc gs = static_cast<Acc>(grad_scale);
      if (p.grad_loss != nullptr) {
        gs = static_cast<Acc>(static_cast<const Acc*>(p.grad_loss)[p.index.offset(core::kGradLossRow, r)] * grad_scale);
      }
      v = -(w != nullptr ? w[y] : Acc(1)) * gs;
    }
    T* g = static_cast<T*>(p.grad) + p.index.offset(core::kGradRow, r);
    for (int64_t c = threadIdx.x; c < p.classes; c += blockDim.x) {
      g[c * p.g_cstride] = from_acc<T>(bad ? static_cast<Acc>(NAN) : c == y ? v : Acc(0));
    }
  }
}

// CeMode::scale (cross_entropy_scale_held): each block takes rows grid-strided, its threads along the classes. One
// upstream value for every row (p.grad_loss_uniform): a value of 1 returns at once.
template <class T>
__global__ void __launch_bounds__(kMaxRowThreads) ce_scale_kernel(const CeParams p) {
  using Acc = math::AccOf<T>;
  const Acc* up = static_cast<const Acc*>(p.grad_loss);
  if (p.grad_loss_uniform && up[0] == Acc(1)) return;
  if (p.pooled) {  // kept whole when every target is ignored: each block reads them (only when the value is not 1)
    bool counted = false;
    for (int64_t i = threadIdx.x; i < p.pooled_targets && !counted; i += blockDim.x) {
      counted = core::read_target(p.target, p.target_dtype, i * p.pooled_stride) != p.ignore_index;
    }
    if (__syncthreads_or(counted) == 0) return;
  }
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const Acc s = up[p.index.offset(core::kGradLossRow, r)];
    if (s == Acc(1)) continue;
    if (!p.soft && !p.pooled &&
        core::read_target(p.target, p.target_dtype, p.index.offset(core::kTargetRow, r)) == p.ignore_index) {
      continue;
    }
    T* g = static_cast<T*>(p.grad) + p.index.offset(core::kGradRow, r);
    for (int64_t c = threadIdx.x; c < p.classes; c += blockDim.x) {
      g[c * p.g_cstride] = from_acc<T>(to_acc(g[c * p.g_cstride]) * s);
    }
  }
}

// ---- launch ---------------------------------------------------------------------------------------------------

// Threads per row block: a warp per 256 elements, at least one and at most 8 warps (the kernels' launch bounds), so
// that several rows are in flight on each multiprocessor to hide each row's serial steps (target, combine, loss).
int row_threads(int64_t classes) {
  const int64_t warps = std::clamp<int64_t>((classes + 255) / 256, 1, kMaxRowThreads / 32);
  return static_cast<int>(warps * 32);
}

unsigned row_grid(int64_t rows) { return static_cast<unsigned>(std::min<int64_t>(rows, 1 << 30)); }

// Threads per cross-entropy row block: row_threads, widened where the batch leaves the device short of the 32 warps
// per multiprocessor that 64 registers a thread allow (at most 3 rows per multiprocessor): up to 32 warps a row, so
// that a row has up to 4x the loads in flight. Not for KeptRow's variants (256 threads at most). A row's combine order
// follows its block size, so such a batch's rows may differ in the last bit from the same rows in a larger batch
// (bitwise repeatable for one shape on one device).
int ce_threads(int64_t classes, int64_t rows, bool keep) {
  const int base = row_threads(classes);
  if (keep || !small_batch_path() || rows <= 0) return base;
  const int64_t sms = multiprocessors();
  const int64_t rows_per_sm = (rows + sms - 1) / std::max<int64_t>(sms, 1);
  const int64_t cap = std::clamp<int64_t>(32 / rows_per_sm, kMaxRowThreads / 32, kMaxWideThreads / 32);
  return static_cast<int>(std::clamp<int64_t>((classes + 255) / 256, 1, cap) * 32);
}

// Up to this many rows per row-block thread a reduced call sums its rows' losses in the row kernel's last block (one
// launch fewer; at most 32 loads a thread, as reduce_rows_kernel's 8192 rows over 256 threads); beyond,
// reduce_rows_kernel spreads the sum over the scan's grid.
constexpr int64_t kFoldRowsPerThread = 32;

// Up to this many rows a whole cross-entropy call scans its targets inside the row kernel (inline_scan) and folds its
// reduction there too (rows <= kFoldRowsPerThread x 32 threads, the fewest a block has): one kernel launch, and no
// memset (the fold counts on stream_counter). Each block then reads every target: at most 8 KiB (int64).
constexpr int64_t kInlineScanRows = 1024;
static_assert(kInlineScanRows <= kFoldRowsPerThread * 32, "an inline call always folds its reduction");
static_assert(kInlineScanRows <= kScanRowsPerBlock, "inline_scan takes the order of one scan block");

void check_launch(const char* what) { check(cudaGetLastError(), what); }

// The call's device operands, the logits (named `first`) first.
std::vector<Operand> operands(const CeParams& p, const char* first) {
  std::vector<Operand> v = {{p.logits, first},     {p.target, "target"},      {p.grad, "grad"},
                            {p.loss_rows, "loss"}, {p.lse_rows, "lse"},       {p.zloss_rows, "z_loss"},
                            {p.lse_in, "lse"},     {p.grad_loss, "grad_loss"}};
  if (const core::CeDeviceCall* c = p.device_call) {
    v.insert(v.end(), {{c->weight, "weight"}, {c->grad_scalar, "grad_loss"}, {c->loss, "loss"}, {c->z_loss, "z_loss"}});
  }
  return v;
}

// A device call's steps around its row kernels: the class weights in Acc and the scan record, made on the stream
// at construction; finish() reads the first bad target back into the call (not when reports_bad_values() is false,
// where nothing synchronises and a bad row is NaN instead, nor for a held gradient's call, whose targets were checked).
//
// may_inline: the call's rows go through one row kernel (a whole call: CeDeviceRows::rows_reduced, nll_run), so a
// small batch (kInlineScanRows, not under stream capture) leaves the scan to it: no memset and no scan kernel here.
template <class Acc>
class DeviceSteps {
 public:
  DeviceSteps(const CeParams& p, bool may_inline) : DeviceSteps(p, may_inline, stream_capturing()) {}
  DeviceSteps(const CeParams& p, bool may_inline, bool capturing)
      : call_(*p.device_call),
        no_read_back_(call_.held || !reports_bad_values(capturing)),
        inline_(may_inline && small_batch_path() && p.rows > 0 && p.rows <= kInlineScanRows && !capturing),
        weights_(call_.weight != nullptr ? static_cast<std::size_t>(p.classes) : 0),
        scan_(1),
        grid_(inline_ ? 0 : scan_grid(p.rows)),
        part_w_(2 * std::size_t{grid_}),
        part_n_(2 * std::size_t{grid_}) {
    if (call_.weight != nullptr) {
      weights_to_acc<Acc>(call_.weight, call_.weight_dtype, call_.weight_stride, p.classes, weights_.get());
    }
    if (inline_) return;
    check(cudaMemsetAsync(scan_.get(), 0, sizeof(CeScan), stream()), "cudaMemsetAsync (scan record)");
    const ScanArgs<Acc> a{weights_.get(), call_.grad_scalar, mean(),        call_.split_mean,
                          scan_.get(),    part_w_.get(),     part_n_.get(), part_n_.get() + grid_};
    ce_scan_kernel<Acc><<<grid_, kScanThreads, 0, stream()>>>(p, a);
    check(cudaGetLastError(), "ce_scan_kernel");
  }
  [[nodiscard]] const Acc* weights() const noexcept { return weights_.get(); }
  [[nodiscard]] bool inline_scan() const noexcept { return inline_; }
  // The stream's scan record, or nullptr when the row kernel scans (inline_args).
  [[nodiscard]] const CeScan* scan() const noexcept { return inline_ ? nullptr : scan_.get(); }
  [[nodiscard]] InlineScan inline_args() const noexcept {
    if (!inline_) return {};
    return {scan_.get(), call_.grad_scalar, mean(), call_.split_mean};
  }
  // The fold's counter: the scan record's, zeroed with it, or the stream's when inline (no memset).
  [[nodiscard]] unsigned* reduce_done() const { return fold_counter(!inline_, &scan_.get()->reduce_done); }
  [[nodiscard]] bool mean() const noexcept { return call_.reduction == Reduction::mean; }
  [[nodiscard]] void* loss() const noexcept { return call_.loss; }
  [[nodiscard]] void* z_loss() const noexcept { return call_.z_loss; }
  [[nodiscard]] bool skip_bad() const noexcept { return !no_read_back_; }

  // 'mean' / 'sum' outputs from the rows' losses (reduce_rows_kernel), when the call wants them. Not inline (the row
  // kernel folds those).
  void reduce(const double* row_loss, const double* row_zloss, int64_t rows) const {
    if (call_.loss == nullptr && call_.z_loss == nullptr) return;
    if (inline_)
      throw Error(ErrorCode::device_error, "reduce", "a call whose scan ran on the stream", "an inline scan");
    // part_w_ is the scan's, done with by now (stream order)
    reduce_rows_kernel<Acc><<<grid_, kScanThreads, 0, stream()>>>(row_loss, row_zloss, rows, scan_.get(), skip_bad(),
                                                                  mean(), part_w_.get(), static_cast<Acc*>(call_.loss),
                                                                  static_cast<Acc*>(call_.z_loss));
    check(cudaGetLastError(), "reduce_rows_kernel");
  }

  void finish(const CeParams& p) {
    if (no_read_back_) return;
    const unsigned long long bad = read_back(&scan_.get()->bad, "cross_entropy / nll kernels");
    if (bad == 0) return;
    call_.bad_row = p.rows - static_cast<int64_t>(bad);
    call_.bad_value = read_target_back(p.target, p.target_dtype, p.index.offset(core::kTargetRow, call_.bad_row));
  }

 private:
  core::CeDeviceCall& call_;
  bool no_read_back_;
  bool inline_;
  Scratch<Acc> weights_;
  Scratch<CeScan> scan_;
  unsigned grid_;
  Scratch<double> part_w_;
  Scratch<long long> part_n_;
};

// The runtime flags as template arguments: soft targets imply the sums.
template <class T, bool... kFlags>
void launch_ce_as(unsigned grid, int threads, const CeKernelArgs<T>& a) {
  ce_rows_kernel<T, kFlags...><<<grid, threads, 0, stream()>>>(a);
}
template <class T>
void launch_ce(bool soft, bool cap, bool sums, bool keep, unsigned grid, int threads, const CeKernelArgs<T>& a) {
  auto with_keep = [&](auto soft_c, auto cap_c, auto sums_c) {
    if constexpr (!soft_c() && !std::is_same_v<T, double>) {  // the kept variants (soft and float64 rows would spill)
      if (keep) return launch_ce_as<T, soft_c(), cap_c(), sums_c(), true>(grid, threads, a);
    }
    launch_ce_as<T, soft_c(), cap_c(), sums_c(), false>(grid, threads, a);
  };
  auto with_sums = [&](auto soft_c, auto cap_c) {
    if constexpr (soft_c()) {
      with_keep(soft_c, cap_c, std::true_type{});
    } else if (sums) {
      with_keep(soft_c, cap_c, std::true_type{});
    } else {
      with_keep(soft_c, cap_c, std::false_type{});
    }
  };
  auto with_cap = [&](auto soft_c) {
    cap ? with_sums(soft_c, std::true_type{}) : with_sums(soft_c, std::false_type{});
  };
  soft ? with_cap(std::true_type{}) : with_cap(std::false_type{});
}

// Whether a fused call takes a kept variant (launch_ce): class targets, float32 or 16-bit logits, and rows that fit
// KeptRow at row_threads.
bool keeps_row(const CeParams& p) {
  return p.mode == CeMode::forward_backward && !p.soft && p.dtype != DType::f64 && p.x_cstride == 1 &&
         p.g_cstride == 1 &&
         p.classes * static_cast<int64_t>(dtype_size(p.dtype)) <=
             int64_t{16} * kKeepVectors * (row_threads(p.classes) - 1);
}

// A held gradient scaled on the stream: nothing is read back (core passes no empty call).
template <class T>
void ce_scale(const CeParams& p) {
  const DeviceScope scope(operands(p, "grad_logits"));
  constexpr int64_t kScaleBlocks = 2048;  // a few resident blocks per multiprocessor; rows beyond are grid-strided
  ce_scale_kernel<T>
      <<<static_cast<unsigned>(std::min(p.rows, kScaleBlocks)), row_threads(p.classes), 0, stream()>>>(p);
  check_launch("ce_scale_kernel");
}

// A small batch (DeviceSteps::inline_scan) is one launch: its forward one block (nll_forward_kernel), its backward
// the row blocks, each scanning the targets itself.
template <class T>
void nll_run(const CeParams& p) {
  using Acc = math::AccOf<T>;
  const bool reduced = p.device_call->loss != nullptr;
  if (p.rows == 0 && !reduced) return;
  const DeviceScope scope(operands(p, "input"));
  DeviceSteps<Acc> steps(p, true);
  CeParams q = p;
  q.device_call = nullptr;
  if (p.mode == CeMode::forward) {
    const bool one_block = steps.inline_scan();
    const Scratch<double> rows_loss(reduced && !one_block ? static_cast<std::size_t>(p.rows) : 0);
    if (p.rows > 0) {
      const auto grid = static_cast<unsigned>(one_block ? 1 : (p.rows + kScanThreads - 1) / kScanThreads);
      nll_forward_kernel<T><<<grid, kScanThreads, 0, stream()>>>(
          q, steps.weights(), rows_loss.get(), steps.scan(), steps.skip_bad(), steps.inline_args(),
          one_block ? static_cast<Acc*>(p.device_call->loss) : nullptr);
      check_launch("nll_forward_kernel");
    }
    if (reduced && !one_block) steps.reduce(rows_loss.get(), nullptr, p.rows);
  } else if (p.rows > 0) {
    nll_backward_kernel<T><<<row_grid(p.rows), row_threads(p.classes), 0, stream()>>>(
        q, steps.weights(), steps.scan(), steps.skip_bad(), steps.inline_args());
    check_launch("nll_backward_kernel");
  }
  steps.finish(p);
}

template <class F>
void visit(DType dtype, F&& f) {
  math::visit_float_storage<__nv_bfloat16, __half>(dtype, [&](auto tag) { f(tag); });
}

}  // namespace

struct CeDeviceRows::Impl {
  Impl(const CeParams& p, bool whole_call)
      : whole(p),
        reduced(p.device_call->loss != nullptr || p.device_call->z_loss != nullptr),
        row_loss(reduced ? static_cast<std::size_t>(2 * p.rows) : 0) {
    if (p.dtype == DType::f64) {
      f64 = std::make_unique<DeviceSteps<double>>(p, whole_call);
    } else {
      f32 = std::make_unique<DeviceSteps<float>>(p, whole_call);
    }
  }
  template <class Acc>
  DeviceSteps<Acc>& steps() {
    if constexpr (std::is_same_v<Acc, double>) {
      return *f64;
    } else {
      return *f32;
    }
  }
  const CeParams whole;
  const bool reduced;
  Scratch<double> row_loss;  // reduced: each row's loss, then each row's z-loss
  std::unique_ptr<DeviceSteps<float>> f32;
  std::unique_ptr<DeviceSteps<double>> f64;
};

CeDeviceRows::CeDeviceRows(const CeParams& whole, bool whole_call) : impl_(std::make_unique<Impl>(whole, whole_call)) {}
CeDeviceRows::~CeDeviceRows() = default;

void CeDeviceRows::rows(const CeParams& chunk, int64_t r0) { launch_rows(chunk, r0, false); }

void CeDeviceRows::rows_reduced() {
  const CeParams& p = impl_->whole;
  const int threads = ce_threads(p.classes, p.rows, keeps_row(p));
  if (p.rows > 0 && p.rows <= kFoldRowsPerThread * threads) return launch_rows(p, 0, true);
  rows(p, 0);
  reduce();
}

void CeDeviceRows::launch_rows(const CeParams& chunk, int64_t r0, bool fold) {
  if (chunk.rows == 0) return;
  visit(chunk.dtype, [&](auto tag) {
    using T = decltype(tag);
    using Acc = math::AccOf<T>;
    DeviceSteps<Acc>& steps = impl_->steps<Acc>();
    double* rl = impl_->reduced ? impl_->row_loss.get() + r0 : nullptr;
    CeKernelArgs<T> a{chunk, steps.weights(), rl, rl != nullptr ? rl + impl_->whole.rows : nullptr,
                      steps.scan(), steps.skip_bad()};
    const core::CeDeviceCall& call = *impl_->whole.device_call;
    if (call.held) a.held_scalar = call.grad_scalar;
    a.mean = steps.mean();
    a.in = steps.inline_args();  // a whole call (rows_reduced, fold) of a small batch: the kernel scans the targets
    if (fold && impl_->reduced) {
      a.loss = static_cast<Acc*>(steps.loss());
      a.z_loss = static_cast<Acc*>(steps.z_loss());
      a.reduce_done = steps.reduce_done();
    }
    a.p.device_call = nullptr;
    const bool keep = keeps_row(chunk);
    launch_ce<T>(chunk.soft, chunk.softcap > 0, chunk.eps != 0.0, keep, row_grid(chunk.rows),
                 ce_threads(chunk.classes, chunk.rows, keep), a);
  });
  check_launch("ce_rows_kernel");
}

void CeDeviceRows::reduce() {
  if (!impl_->reduced) return;
  const int64_t n = impl_->whole.rows;
  const double* rl = impl_->row_loss.get();
  if (impl_->f64) {
    impl_->f64->reduce(rl, rl + n, n);
  } else {
    impl_->f32->reduce(rl, rl + n, n);
  }
}

bool CeDeviceRows::check() {
  if (impl_->f64) {
    impl_->f64->finish(impl_->whole);
  } else {
    impl_->f32->finish(impl_->whole);
  }
  return impl_->whole.device_call->bad_row < 0;
}

void cross_entropy_rows(const CeParams& p) {
  if (p.mode == CeMode::scale) return visit(p.dtype, [&](auto tag) { ce_scale<decltype(tag)>(p); });
  const bool reduced = p.device_call->loss != nullptr || p.device_call->z_loss != nullptr;
  if (p.rows == 0 && !reduced) return;
  const DeviceScope scope(operands(p, "logits"));
  CeDeviceRows call(p, true);
  call.rows_reduced();
  call.check();
}

void nll_rows(const CeParams& p) {
  visit(p.dtype, [&](auto tag) { nll_run<decltype(tag)>(p); });
}

}  // namespace lossfuse::cuda
