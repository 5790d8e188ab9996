// The five margin and embedding losses on CUDA: core's MarginParams (src/core/margin_problem.hpp) and the formulas of
// src/math/margin_math.hpp, the CPU kernels' scalar forms. A group of threads per row: a warp for rows of up to
// kWarpRow elements (8 rows to a block), the whole 256-thread block for longer ones; the group's threads stride over
// the row's last dim and its sums are combined in a fixed order (a butterfly in each warp, then the warps in order),
// so every run gives the same bits. Forward: a row's loss in Acc ('none'), or as a double per row summed on the device
// in a fixed tree into the loss (the same bits on every run; not the CPU's order, so the last bit may differ from it).
// Every call is a device call (core::MarginDeviceCall): weights, target check, upstream scalar and reduction on the
// device, at most one read-back (the check's). Any strides (stride 0 for broadcast inputs), 16-bit storage through
// math::Io. A class index the kernel still finds out of range (under capture, where nothing is read back) makes its
// row NaN, never an out-of-bounds access.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/margin_problem.hpp"
#include "core/targets.hpp"
#include "cuda/block_reduce.cuh"
#include "cuda/kernels.hpp"
#include "cuda/runtime.hpp"
#include "math/margin_math.hpp"
#include "math/storage.hpp"

namespace lossfuse::cuda {
namespace {

using core::MarginParams;
using math::NormKind;
using std::int64_t;

constexpr int kThreads = 256;
constexpr int64_t kWarpRow = 1024;  // rows up to this length get a warp
// multilabel_margin's label masks: in shared memory up to this many bytes a block (360,448 classes a row), else in
// device scratch of at most 64 MiB (or one mask, for rows over 512M classes). The kernel's static shared memory
// (group_reduce's slots, fold_loss's block_reduce: 2 KiB of doubles, last_block_done's flag) takes under 4 KiB of
// the 48 KiB a launch may use without opting in; the emulator fails a block past it (margin_cuda_test's
// multilabel_margin_largest_shared_mask).
constexpr int64_t kSharedMaskBytes = 44 * 1024;
constexpr int64_t kMaskBudgetWords = int64_t{16} << 20;

// A call's record on the device, zeroed before its first kernel when a field needs it.
struct MarginRecord {
  unsigned long long bad;  // the target check's: total - the first bad target's index (0: none)
  unsigned done;           // a reduced forward's finished blocks, where the record is zeroed (fold_counter)
};

struct MarginArgs {
  MarginParams p;      // device operands; p.weight, p.block_loss and p.device_call unused (below)
  const void* weight;  // Acc (D) class weights on the device, or nullptr
  double* row_loss;    // mean / sum: each row's loss, summed by the last block (fold_loss)
  unsigned* mask;      // multilabel_margin: a bitmask over the classes per group in flight (nullptr: in shared memory)
  int64_t mask_words;  // words per mask
  const unsigned long long* bad;  // the target check's record (nonzero: a bad target; write nothing), or nullptr
  const void* grad_scalar;        // mean / sum backward: the upstream scalar (Acc) on the device, or nullptr
  bool mean;                      // 'mean': the loss and the upstream scalar divided by the rows
  void* loss;                     // mean / sum forward: the one-element loss (Acc), or nullptr
  unsigned* done;                 // with loss: the finished blocks' count (fold_counter)
};

// The rows a group of G threads visits (G = 32: the block's warps take rows of their own; G = kThreads: the block
// takes one row at a time), its thread's lane, and the group's barrier.
template <int G>
struct Group {
  static constexpr int kPerBlock = kThreads / G;
  __device__ static int lane() { return static_cast<int>(threadIdx.x) % G; }
  __device__ static int64_t slot() { return static_cast<int64_t>(blockIdx.x) * kPerBlock + threadIdx.x / G; }
  __device__ static int64_t step() { return static_cast<int64_t>(gridDim.x) * kPerBlock; }
  __device__ static void sync() {
    if constexpr (G == 32) {
      __syncwarp();
    } else {
      __syncthreads();
    }
  }
};

struct Sum {
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
// The max of p = inf's norms (of |v| >= 0), NaN kept as norm_accumulate keeps it.
struct MaxNan {
  template <class V>
  __device__ V operator()(V a, V b) const {
    return (b > a || b != b) ? b : a;
  }
};

// v[0..N) reduced over the group by op (commutative), in a fixed order; every thread of the group gets the result.
template <int G, int N, class V, class Op>
__device__ void group_reduce(V (&v)[N], Op op) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = op(v[k], __shfl_xor_sync(0xffffffffu, v[k], o));
  }
  if constexpr (G > 32) {
    constexpr int kWarps = G / 32;
    __shared__ V warps[N][kWarps];
    const int warp = static_cast<int>(threadIdx.x) / 32;
    if (threadIdx.x % 32 == 0) {
#pragma unroll
      for (int k = 0; k < N; ++k) warps[k][warp] = v[k];
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < N; ++k) {
      V r = warps[k][0];
      for (int w = 1; w < kWarps; ++w) r = op(r, warps[k][w]);
      v[k] = r;
    }
    __syncthreads();  // warps[] is reused by the next reduction
  }
}

template <class T>
__device__ math::AccOf<T> ld(const void* base, int64_t i) {
  return math::Io<T>::load(static_cast<const T*>(base), i);
}
template <class T>
__device__ void st(void* base, int64_t i, math::AccOf<T> v) {
  math::Io<T>::store(static_cast<T*>(base), i, v);
}

// Row r's loss, stored by the group's first thread.
template <int G, class Acc>
__device__ void put_loss(const MarginArgs& a, int64_t r, Acc loss) {
  if (Group<G>::lane() != 0) return;
  if (a.p.loss_rows != nullptr) static_cast<Acc*>(a.p.loss_rows)[r] = loss;
  if (a.row_loss != nullptr) a.row_loss[r] = static_cast<double>(loss);
}

// Row r's upstream gradient: the device scalar (over the rows for 'mean') where the call has one, else core's.
template <class Acc>
__device__ Acc upstream(const MarginArgs& a, int64_t r) {
  if (a.grad_scalar != nullptr) {
    const auto g = static_cast<double>(*static_cast<const Acc*>(a.grad_scalar));
    return static_cast<Acc>(a.mean ? g / static_cast<double>(a.p.rows) : g);
  }
  return core::margin_upstream<Acc>(a.p, r);
}

// Whether the target check found a bad target (the kernels that read class targets then write nothing).
__device__ bool flagged(const MarginArgs& a) { return a.bad != nullptr && *a.bad != 0; }

// A reduced forward's end, reached by every thread of every block: the block that finishes last sums the rows' losses
// in a fixed order (ordered_sum, the same bits on every run) into the loss, over the rows for 'mean' (of no rows:
// 0 / 0 = NaN, as the CPU). A flagged call returns before it in every block: nothing written, the count untouched.
template <class Acc>
__device__ void fold_loss(const MarginArgs& a) {
  if (a.loss == nullptr || !last_block_done(a.done)) return;
  const double s = ordered_sum<kThreads>(a.row_loss, a.p.rows);
  if (threadIdx.x == 0) *static_cast<Acc*>(a.loss) = static_cast<Acc>(a.mean ? s / static_cast<double>(a.p.rows) : s);
}

// Element c of view v's row r (offset `row` of that row).
struct RowAt {
  int64_t row, inner;
  __device__ int64_t operator()(int64_t c) const { return row + c * inner; }
};
__device__ RowAt row_at(const MarginParams& p, int v, int64_t r) { return {p.index.offset(v, r), p.inner[v]}; }

// ---- triplet_margin -------------------------------------------------------------------------------------------

template <class T, NormKind K, int G>
__global__ void __launch_bounds__(kThreads) triplet_kernel(const MarginArgs a) {
  using Acc = math::AccOf<T>;
  using Gr = Group<G>;
  const MarginParams& p = a.p;
  const Acc eps = static_cast<Acc>(p.eps), pw = static_cast<Acc>(p.p), margin = static_cast<Acc>(p.margin);
  const bool swap = p.swap;
  for (int64_t r = Gr::slot(); r < p.rows; r += Gr::step()) {
    const RowAt xa = row_at(p, core::kMvX0, r), xp = row_at(p, core::kMvX1, r), xn = row_at(p, core::kMvX2, r);
    Acc n[3] = {0, 0, 0};  // the norm states of a - p, a - n, p - n
    for (int64_t c = Gr::lane(); c < p.D; c += G) {
      const Acc va = ld<T>(p.x[0], xa(c)), vp = ld<T>(p.x[1], xp(c)), vn = ld<T>(p.x[2], xn(c));
      n[0] = math::norm_accumulate<K>(n[0], va - vp + eps, pw);
      n[1] = math::norm_accumulate<K>(n[1], va - vn + eps, pw);
      if (swap) n[2] = math::norm_accumulate<K>(n[2], vp - vn + eps, pw);
    }
    if constexpr (K == NormKind::inf) {
      group_reduce<G>(n, MaxNan{});
    } else {
      group_reduce<G>(n, Sum{});
    }
    const Acc d_ap = math::norm_finish<K>(n[0], pw), d_an = math::norm_finish<K>(n[1], pw);
    const Acc d_pn = swap ? math::norm_finish<K>(n[2], pw) : Acc(0);
    const Acc nan = static_cast<Acc>(NAN);
    const Acc d_neg = !swap ? d_an : (d_an != d_an || d_pn != d_pn) ? nan : (d_pn < d_an ? d_pn : d_an);
    if (!p.backward) {
      put_loss<G>(a, r, math::triplet_loss(margin, d_ap, d_neg));
      continue;
    }
    const Acc z = margin + d_ap - d_neg;
    const Acc k = z > Acc(0) ? upstream<Acc>(a, r) : Acc(0);
    const math::SwapWeights<Acc> sw = math::triplet_swap_weights(swap, d_an, d_pn);
    const Acc k_an = k * sw.an, k_pn = k * sw.pn;
    // p = inf: the elements attaining each max (and NaNs) share its gradient
    Acc ties[3] = {1, 1, 1};
    if constexpr (K == NormKind::inf) {
      ties[0] = ties[1] = ties[2] = 0;
      for (int64_t c = Gr::lane(); c < p.D; c += G) {
        const Acc va = ld<T>(p.x[0], xa(c)), vp = ld<T>(p.x[1], xp(c)), vn = ld<T>(p.x[2], xn(c));
        const Acc v1 = fabs(va - vp + eps), v2 = fabs(va - vn + eps), v3 = fabs(vp - vn + eps);
        ties[0] += (v1 == d_ap || v1 != v1) ? Acc(1) : Acc(0);
        ties[1] += (v2 == d_an || v2 != v2) ? Acc(1) : Acc(0);
        ties[2] += (v3 == d_pn || v3 != v3) ? Acc(1) : Acc(0);
      }
      group_reduce<G>(ties, Sum{});
    }
    const RowAt ga = row_at(p, core::kMvG0, r), gp = row_at(p, core::kMvG1, r), gn = row_at(p, core::kMvG2, r);
    for (int64_t c = Gr::lane(); c < p.D; c += G) {
      const Acc va = ld<T>(p.x[0], xa(c)), vp = ld<T>(p.x[1], xp(c)), vn = ld<T>(p.x[2], xn(c));
      const Acc v1 = va - vp + eps, v2 = va - vn + eps, v3 = vp - vn + eps;
      Acc n_ap, n_an, n_pn = 0;
      if constexpr (K == NormKind::inf) {
        n_ap = math::norm_grad<K>(v1, d_ap, pw, fabs(v1) == d_ap || v1 != v1) / ties[0];
        n_an = math::norm_grad<K>(v2, d_an, pw, fabs(v2) == d_an || v2 != v2) / ties[1];
        if (swap) n_pn = math::norm_grad<K>(v3, d_pn, pw, fabs(v3) == d_pn || v3 != v3) / ties[2];
      } else {
        n_ap = math::norm_grad<K>(v1, d_ap, pw);
        n_an = math::norm_grad<K>(v2, d_an, pw);
        if (swap) n_pn = math::norm_grad<K>(v3, d_pn, pw);
      }
      if (p.grad[0] != nullptr) st<T>(p.grad[0], ga(c), k * n_ap - k_an * n_an);
      if (p.grad[1] != nullptr) st<T>(p.grad[1], gp(c), -k * n_ap - k_pn * n_pn);
      if (p.grad[2] != nullptr) st<T>(p.grad[2], gn(c), k_an * n_an + k_pn * n_pn);
    }
  }
  fold_loss<Acc>(a);
}

// ---- cosine_embedding -----------------------------------------------------------------------------------------

template <class T, int G>
__global__ void __launch_bounds__(kThreads) cosine_kernel(const MarginArgs a) {
  using Acc = math::AccOf<T>;
  using Gr = Group<G>;
  const MarginParams& p = a.p;
  const Acc margin = static_cast<Acc>(p.margin);
  for (int64_t r = Gr::slot(); r < p.rows; r += Gr::step()) {
    const RowAt x1 = row_at(p, core::kMvX0, r), x2 = row_at(p, core::kMvX1, r);
    const double y = core::read_as_double(p.target, p.target_dtype, p.index.offset(core::kMvTarget, r));
    Acc s[3] = {0, 0, 0};  // sum x1 x2, sum x1^2, sum x2^2
    for (int64_t c = Gr::lane(); c < p.D; c += G) {
      const Acc u = ld<T>(p.x[0], x1(c)), v = ld<T>(p.x[1], x2(c));
      s[0] += u * v;
      s[1] += u * u;
      s[2] += v * v;
    }
    group_reduce<G>(s, Sum{});
    const math::CosineRow<Acc> cr = math::cosine_row(s[0], s[1], s[2]);
    if (!p.backward) {
      put_loss<G>(a, r, math::cosine_loss(cr.cos, margin, y));
      continue;
    }
    const Acc k = math::cosine_dloss_dcos(cr.cos, margin, y) * upstream<Acc>(a, r);
    const Acc ka = k * cr.inv_den, kb1 = k * cr.cos_m1, kb2 = k * cr.cos_m2;
    const RowAt g1 = row_at(p, core::kMvG0, r), g2 = row_at(p, core::kMvG1, r);
    for (int64_t c = Gr::lane(); c < p.D; c += G) {
      const Acc u = ld<T>(p.x[0], x1(c)), v = ld<T>(p.x[1], x2(c));
      if (p.grad[0] != nullptr) st<T>(p.grad[0], g1(c), ka * v - kb1 * u);
      if (p.grad[1] != nullptr) st<T>(p.grad[1], g2(c), ka * u - kb2 * v);
    }
  }
  fold_loss<Acc>(a);
}

// ---- multi_margin ---------------------------------------------------------------------------------------------

template <class T, int P, int G>
__global__ void __launch_bounds__(kThreads) multi_margin_kernel(const MarginArgs a) {
  using Acc = math::AccOf<T>;
  using Gr = Group<G>;
  const MarginParams& p = a.p;
  const int64_t C = p.D;
  const auto* w = static_cast<const Acc*>(a.weight);
  const Acc margin = static_cast<Acc>(p.margin), nan = static_cast<Acc>(NAN);
  if (flagged(a)) return;
  for (int64_t r = Gr::slot(); r < p.rows; r += Gr::step()) {
    const RowAt x = row_at(p, core::kMvX0, r), g = row_at(p, core::kMvG0, r);
    const int64_t y = core::read_target(p.target, p.target_dtype, p.index.offset(core::kMvTarget, r));
    if (y < 0 || y >= C) {  // refused by core: a NaN row
      if (!p.backward) {
        put_loss<G>(a, r, nan);
      } else {
        for (int64_t c = Gr::lane(); c < C; c += G) st<T>(p.grad[0], g(c), nan);
      }
      continue;
    }
    const Acc x_y = ld<T>(p.x[0], x(y));
    const Acc w_y = w != nullptr ? w[y] : Acc(1);
    if (!p.backward) {
      Acc sum[1] = {0};
      for (int64_t c = Gr::lane(); c < C; c += G) {
        if (c != y) sum[0] += math::hinge_value(math::hinge_z(margin, x_y, ld<T>(p.x[0], x(c))), P) * w_y;
      }
      group_reduce<G>(sum, Sum{});
      put_loss<G>(a, r, sum[0] / static_cast<Acc>(C));
      continue;
    }
    const Acc coef = upstream<Acc>(a, r) * w_y / static_cast<Acc>(C);
    Acc total[1] = {0};
    for (int64_t c = Gr::lane(); c < C; c += G) {
      const Acc h = coef * math::hinge_slope(math::hinge_z(margin, x_y, ld<T>(p.x[0], x(c))), P);
      if (c != y) total[0] += h;
      st<T>(p.grad[0], g(c), h);
    }
    group_reduce<G>(total, Sum{});
    Gr::sync();  // the j == y term's store comes before the one below
    if (Gr::lane() == 0) st<T>(p.grad[0], g(y), -total[0]);
    Gr::sync();
  }
  fold_loss<Acc>(a);
}

// ---- multilabel_margin ----------------------------------------------------------------------------------------

// A row's labels are its targets before the first -1; mask marks them (a bit per class). Per non-label element i,
// the pairs z_ji = (1 - x_j) + x_i over the labels j (duplicates again): the loss sums the positive ones, the gradient
// counts them; a label class c counts, negated, its pairs with every non-label element, once per time it is listed.
// O(labels x classes) per row, spread over the group's threads.
template <class T, int G>
__global__ void __launch_bounds__(kThreads) multilabel_margin_kernel(const MarginArgs a) {
  using Acc = math::AccOf<T>;
  using Gr = Group<G>;
  const MarginParams& p = a.p;
  const int64_t C = p.D;
  extern __shared__ unsigned shared_masks[];
  unsigned* mask = a.mask != nullptr ? a.mask + Gr::slot() * a.mask_words
                                     : shared_masks + static_cast<int64_t>(threadIdx.x / G) * a.mask_words;
  auto is_label = [&](int64_t c) { return ((mask[c / 32] >> (c % 32)) & 1u) != 0; };
  if (flagged(a)) return;
  for (int64_t r = Gr::slot(); r < p.rows; r += Gr::step()) {
    const RowAt x = row_at(p, core::kMvX0, r), t = row_at(p, core::kMvTarget, r), g = row_at(p, core::kMvG0, r);
    auto target = [&](int64_t k) { return core::read_target(p.target, p.target_dtype, t(k)); };
    for (int64_t wi = Gr::lane(); wi < a.mask_words; wi += G) mask[wi] = 0;
    // The position of the first negative value (-1 ends the list), and whether any value of the row, also past the
    // end, lies outside [-1, C): refused by core eagerly; under capture (no check read back) a NaN row.
    int64_t labels[1] = {C};
    int bad[1] = {0};
    for (int64_t k = Gr::lane(); k < C; k += G) {
      const int64_t v = target(k);
      if (v < 0 && k < labels[0]) labels[0] = k;
      bad[0] |= (v < -1 || v >= C) ? 1 : 0;
    }
    group_reduce<G>(labels, Min{});
    group_reduce<G>(bad, Sum{});
    const int64_t L = labels[0];
    Gr::sync();  // the mask is clear
    if (bad[0] == 0) {
      for (int64_t k = Gr::lane(); k < L; k += G) {
        const int64_t j = target(k);
        atomicOr(mask + j / 32, 1u << (j % 32));
      }
    }
    Gr::sync();  // the mask is set
    const Acc nan = static_cast<Acc>(NAN);
    if (bad[0] != 0) {  // no element of the row is read
      if (!p.backward) {
        put_loss<G>(a, r, nan);
      } else {
        for (int64_t i = Gr::lane(); i < C; i += G) st<T>(p.grad[0], g(i), nan);
      }
    } else if (!p.backward) {
      Acc sum[1] = {0};
      for (int64_t i = Gr::lane(); i < C; i += G) {
        if (is_label(i)) continue;
        const Acc xi = ld<T>(p.x[0], x(i));
        for (int64_t k = 0; k < L; ++k) {
          const Acc z = (Acc(1) - ld<T>(p.x[0], x(target(k)))) + xi;
          if (z > Acc(0)) sum[0] += z;
        }
      }
      group_reduce<G>(sum, Sum{});
      put_loss<G>(a, r, sum[0] / static_cast<Acc>(C));
    } else {
      const Acc gc = upstream<Acc>(a, r) / static_cast<Acc>(C);
      for (int64_t i = Gr::lane(); i < C; i += G) {  // a non-label element: its pairs with every listing
        if (is_label(i)) continue;
        const Acc xi = ld<T>(p.x[0], x(i));
        int64_t count = 0;
        for (int64_t k = 0; k < L; ++k) count += (Acc(1) - ld<T>(p.x[0], x(target(k)))) + xi > Acc(0) ? 1 : 0;
        st<T>(p.grad[0], g(i), static_cast<Acc>(count) * gc);
      }
      // a label class: -(times listed) x (its pairs with the non-labels), counted by the group at each listing (a
      // repeated label writes the same value again, from the same thread)
      for (int64_t k = 0; k < L; ++k) {
        const int64_t c = target(k);
        const Acc base = Acc(1) - ld<T>(p.x[0], x(c));
        int64_t n[2] = {0, 0};  // pairs, listings
        for (int64_t q = Gr::lane(); q < C; q += G) n[0] += !is_label(q) && base + ld<T>(p.x[0], x(q)) > Acc(0) ? 1 : 0;
        for (int64_t q = Gr::lane(); q < L; q += G) n[1] += target(q) == c ? 1 : 0;
        group_reduce<G>(n, Sum{});
        if (Gr::lane() == 0) st<T>(p.grad[0], g(c), static_cast<Acc>(-n[1] * n[0]) * gc);
      }
    }
    Gr::sync();  // every read of the mask is done before the next row clears it
  }
  fold_loss<Acc>(a);
}

// ---- multilabel_soft_margin -----------------------------------------------------------------------------------

template <class T, int G>
__global__ void __launch_bounds__(kThreads) soft_margin_kernel(const MarginArgs a) {
  using Acc = math::AccOf<T>;
  using Gr = Group<G>;
  const MarginParams& p = a.p;
  const int64_t C = p.D;
  const auto* w = static_cast<const Acc*>(a.weight);
  for (int64_t r = Gr::slot(); r < p.rows; r += Gr::step()) {
    const RowAt x = row_at(p, core::kMvX0, r), t = row_at(p, core::kMvTarget, r);
    if (!p.backward) {
      Acc sum[1] = {0};
      for (int64_t c = Gr::lane(); c < C; c += G) {
        sum[0] += math::soft_margin_term(ld<T>(p.x[0], x(c)), ld<T>(p.target, t(c)), w != nullptr ? w[c] : Acc(1));
      }
      group_reduce<G>(sum, Sum{});
      put_loss<G>(a, r, sum[0] / static_cast<Acc>(C));  // C = 0: 0/0 = nan, as torch's sum / C
      continue;
    }
    const Acc k = upstream<Acc>(a, r) / static_cast<Acc>(C);
    const RowAt gx = row_at(p, core::kMvG0, r), gt = row_at(p, core::kMvG1, r);
    for (int64_t c = Gr::lane(); c < C; c += G) {
      const Acc xv = ld<T>(p.x[0], x(c)), kw = k * (w != nullptr ? w[c] : Acc(1));
      if (p.grad[0] != nullptr) st<T>(p.grad[0], gx(c), kw * (math::sigmoid(xv) - ld<T>(p.target, t(c))));
      if (p.grad[1] != nullptr) st<T>(p.grad[1], gt(c), -kw * xv);
    }
  }
  fold_loss<Acc>(a);
}

// ---- device-call step: the target check -----------------------------------------------------------------------

// The first bad class target in row-major order over the rows x per_row targets (per_row 1: class_index, in [0, D);
// D: label_list, in [-1, D)), kept as total - its index by an integer atomicMax (0: none).
__global__ void __launch_bounds__(kThreads)
    margin_check_kernel(const MarginParams p, bool labels, unsigned long long* rec) {
  const int64_t per_row = labels ? p.D : 1, total = p.rows * per_row, lo = labels ? -1 : 0;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / per_row, c = e - r * per_row;
    const int64_t t =
        core::read_target(p.target, p.target_dtype, p.index.offset(core::kMvTarget, r) + c * p.inner[core::kMvTarget]);
    if (t < lo || t >= p.D) {
      atomicMax(rec, static_cast<unsigned long long>(total - e));  // this thread's later elements come after
      return;
    }
  }
}

// ---- launch ---------------------------------------------------------------------------------------------------

// Runs one loss's device call (core makes every call on a device one, core::MarginDeviceCall): the class weights
// converted on the device, the target check (its record read back by an eager call: 8 bytes, one synchronisation;
// nothing under stream capture, where a bad target's row is NaN), then launch(g, grid, shared_bytes, args), g
// std::integral_constant<int, G>, whose last block sums a reduced forward's loss (fold_loss). `operands`: the loss's
// inputs, target and gradients (nullptr: absent), its device pointers, named. `labels`: a label mask per group in
// flight, in shared memory where the block's fit kSharedMaskBytes, else in device scratch (the grid then capped so that
// the masks fit kMaskBudgetWords). Nothing else waits for the device.
template <class T, class Launch>
void run_rows(const MarginParams& p, std::vector<Operand> operands, bool labels, const char* what, Launch&& launch) {
  using Acc = math::AccOf<T>;
  core::MarginDeviceCall& call = *p.device_call;
  const bool reduced = !p.backward && call.reduction != Reduction::none;
  const bool checking = call.check != core::MarginCheck::none;
  const bool grads = p.grad[0] != nullptr || p.grad[1] != nullptr || p.grad[2] != nullptr;
  if ((p.rows == 0 || (p.backward && !grads)) && !reduced && !checking) return;
  operands.insert(operands.end(), {{p.loss_rows, "loss"},
                                   {p.grad_loss, "grad_loss"},
                                   {call.loss, "loss"},
                                   {call.grad_scalar, "grad_loss"},
                                   {call.weight, "weight"}});
  const DeviceScope scope(operands);
  const bool capturing = stream_capturing();
  const bool scanning = checking && p.rows > 0 && reports_bad_values(capturing);
  // The record, made and zeroed for the check's `bad`, or for the fold's count under capture (fold_counter).
  const bool zeroed = scanning || (reduced && capturing);
  const Scratch<MarginRecord> record(zeroed ? 1 : 0);
  if (zeroed)
    check(cudaMemsetAsync(record.get(), 0, sizeof(MarginRecord), stream()), "cudaMemsetAsync (margin record)");
  if (scanning) {
    const int64_t total = p.rows * (call.check == core::MarginCheck::label_list ? p.D : 1);
    margin_check_kernel<<<static_cast<unsigned>(std::clamp<int64_t>((total + kThreads - 1) / kThreads, 1, 4096)),
                          kThreads, 0, stream()>>>(p, call.check == core::MarginCheck::label_list, &record.get()->bad);
    check(cudaGetLastError(), "margin_check_kernel");
  }
  const unsigned long long* bad = scanning ? &record.get()->bad : nullptr;
  const Scratch<double> rows_loss(reduced ? static_cast<std::size_t>(p.rows) : 0);
  if ((p.rows > 0 && (!p.backward || grads)) || reduced) {  // (a reduced forward writes the loss of no rows too)
    const bool warp_rows = p.D <= kWarpRow;
    const int64_t per_block = warp_rows ? kThreads / 32 : 1;
    int64_t blocks = std::clamp<int64_t>((p.rows + per_block - 1) / per_block, 1, int64_t{1} << 30);
    const int64_t words = labels ? (p.D + 31) / 32 : 0;
    const bool shared = per_block * words * 4 <= kSharedMaskBytes;
    if (!shared) blocks = std::clamp<int64_t>(kMaskBudgetWords / (words * per_block), 1, blocks);
    const Scratch<Acc> weights(call.weight != nullptr ? static_cast<std::size_t>(p.D) : 0);
    if (call.weight != nullptr) weights_to_acc<Acc>(call.weight, call.weight_dtype, call.weight_stride, p.D, weights.get());
    const Scratch<unsigned> mask(shared ? 0 : static_cast<std::size_t>(blocks * per_block * words));
    MarginArgs a{p,
                 weights.get(),
                 rows_loss.get(),
                 mask.get(),
                 words,
                 bad,
                 call.grad_scalar,
                 call.reduction == Reduction::mean,
                 reduced ? call.loss : nullptr,
                 reduced ? fold_counter(zeroed, zeroed ? &record.get()->done : nullptr) : nullptr};
    a.p.weight = nullptr;
    a.p.block_loss = nullptr;
    a.p.device_call = nullptr;
    const auto grid = static_cast<unsigned>(blocks);
    const auto shared_bytes = static_cast<std::size_t>(shared ? per_block * words * 4 : 0);
    if (warp_rows) {
      launch(std::integral_constant<int, 32>{}, grid, shared_bytes, a);
    } else {
      launch(std::integral_constant<int, kThreads>{}, grid, shared_bytes, a);
    }
    check(cudaGetLastError(), what);
  }
  if (bad == nullptr) return;
  const unsigned long long found = read_back(&record.get()->bad, what);
  if (found == 0) return;
  const int64_t per_row = call.check == core::MarginCheck::label_list ? p.D : 1;
  const int64_t e = p.rows * per_row - static_cast<int64_t>(found);
  call.bad_row = e / per_row;
  call.bad_col = e - call.bad_row * per_row;
  call.bad_value = read_target_back(
      p.target, p.target_dtype, p.index.offset(core::kMvTarget, call.bad_row) + call.bad_col * p.inner[core::kMvTarget]);
}

template <class F>
void visit(DType dtype, F&& f) {
  math::visit_float_dtype(dtype, [&](auto tag) { f(tag); });
}

}  // namespace

void triplet_margin_rows(const MarginParams& p) {
  visit(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    auto with = [&](auto kind) {
      run_rows<T>(p,
                  {{p.x[0], "anchor"},
                   {p.x[1], "positive"},
                   {p.x[2], "negative"},
                   {p.grad[0], "grad_anchor"},
                   {p.grad[1], "grad_positive"},
                   {p.grad[2], "grad_negative"}},
                  false, "triplet_kernel", [](auto g, unsigned grid, std::size_t smem, const MarginArgs& a) {
                    triplet_kernel<T, decltype(kind)::value, decltype(g)::value><<<grid, kThreads, smem, stream()>>>(a);
                  });
    };
    switch (math::norm_kind(p.p)) {
      case NormKind::zero: return with(std::integral_constant<NormKind, NormKind::zero>{});
      case NormKind::one: return with(std::integral_constant<NormKind, NormKind::one>{});
      case NormKind::two: return with(std::integral_constant<NormKind, NormKind::two>{});
      case NormKind::inf: return with(std::integral_constant<NormKind, NormKind::inf>{});
      case NormKind::general: return with(std::integral_constant<NormKind, NormKind::general>{});
    }
  });
}

void cosine_embedding_rows(const MarginParams& p) {
  visit(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    run_rows<T>(p,
                {{p.x[0], "x1"}, {p.x[1], "x2"}, {p.target, "target"}, {p.grad[0], "grad_x1"}, {p.grad[1], "grad_x2"}},
                false, "cosine_kernel", [](auto g, unsigned grid, std::size_t smem, const MarginArgs& a) {
                  cosine_kernel<T, decltype(g)::value><<<grid, kThreads, smem, stream()>>>(a);
                });
  });
}

void multi_margin_rows(const MarginParams& p) {
  visit(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    auto with = [&](auto power) {
      run_rows<T>(p, {{p.x[0], "input"}, {p.target, "target"}, {p.grad[0], "grad_input"}}, false, "multi_margin_kernel",
                  [](auto g, unsigned grid, std::size_t smem, const MarginArgs& a) {
                    multi_margin_kernel<T, decltype(power)::value, decltype(g)::value>
                        <<<grid, kThreads, smem, stream()>>>(a);
                  });
    };
    if (p.p == 2.0) return with(std::integral_constant<int, 2>{});
    with(std::integral_constant<int, 1>{});
  });
}

void multilabel_margin_rows(const MarginParams& p) {
  visit(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    run_rows<T>(p, {{p.x[0], "input"}, {p.target, "target"}, {p.grad[0], "grad_input"}}, true,
                "multilabel_margin_kernel", [](auto g, unsigned grid, std::size_t smem, const MarginArgs& a) {
                  multilabel_margin_kernel<T, decltype(g)::value><<<grid, kThreads, smem, stream()>>>(a);
                });
  });
}

void multilabel_soft_margin_rows(const MarginParams& p) {
  visit(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    run_rows<T>(p, {{p.x[0], "input"}, {p.target, "target"}, {p.grad[0], "grad_input"}, {p.grad[1], "grad_target"}},
                false, "soft_margin_kernel", [](auto g, unsigned grid, std::size_t smem, const MarginArgs& a) {
                  soft_margin_kernel<T, decltype(g)::value><<<grid, kThreads, smem, stream()>>>(a);
                });
  });
}

}  // namespace lossfuse::cuda
