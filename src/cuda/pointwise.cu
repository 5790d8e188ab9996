// The eleven elementwise losses on CUDA: one kernel over core's PwParams (src/core/pointwise_params.hpp), the
// formulas of src/math/pointwise_losses.inc evaluated per element by math::ScalarOps (the same code the CPU's scalar
// tails run). One thread block per tile (at most PwParams::tile elements of one row, the CPU's tiles), threads striding
// over the tile; any strides, stride-0 broadcast operands, 16-bit storage through math::Io. Every call is a device
// call (core::PwDeviceCall): the upstream scalar, the weights' sum, the loss and the value check stay on the device.
// Reductions: each thread sums its elements in double, the block combines the threads in a fixed tree into the tile's
// sum, and the pass's last block to finish sums the tiles in a fixed order: the same bits on every run, no
// floating-point atomics. A backward given a loss output too (the fused entries) writes the forward's loss in the same
// pass. Only a call with a value check (bce, gaussian_nll) reads anything back (its 4-byte flag), and none under stream
// capture. An unchecked, unweighted call is one launch (a reduced backward computes its scale in the pass).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/pointwise_params.hpp"
#include "cuda/block_reduce.cuh"
#include "cuda/kernels.hpp"
#include "cuda/runtime.hpp"
#include "math/pointwise_math.hpp"
#include "math/storage.hpp"

namespace lossfuse::cuda {
namespace {

using core::PwParams;
using std::int64_t;

constexpr int kThreads = 256;

// A call's record on the device, zeroed before its first kernel when a field below needs it (bad, done).
struct PwRecord {
  unsigned bad;       // some element failed the value check (an integer OR: the same on every run)
  unsigned done;      // the reducing pass's finished blocks, where the record is zeroed (fold_counter)
  double weight_sum;  // a reduced backward's weighted 'mean': the weights' sum (pw_scale_kernel)
  double grad_scale;  // a reduced backward: the upstream scalar, over the 'mean' denominator (pw_scale_kernel)
};

// What one pass of pointwise_kernel does beyond PwParams.
struct PwPass {
  double* tile_loss;    // per tile: the sum of (w) l, nullptr: not wanted
  double* tile_weight;  // per tile: the sum of w, nullptr: not wanted
  PwRecord* rec;
  bool check;           // this pass makes the value check (PwParams::check), flagging rec->bad
  bool gated;           // a check pass ran first: a flagged call writes nothing, or NaN when `poison`
  bool poison;          // nothing is read back to raise the error (reports_bad_values)
  bool scaled;          // a reduced backward: the gradient's scale is rec->grad_scale, else 1
  const void* skip_if;  // held gradients: the upstream scalar (Acc); the pass does nothing when it is 1
  // scaled without pw_scale_kernel (no weights' sum needed): the scale is grad_scale_of(grad_scalar, mean,
  // denominator), computed in the pass.
  bool scale_here = false;
  const void* grad_scalar = nullptr;
  // The reduction folded into the pass (loss non-null): its last block to finish (counted on `done`) sums tile_loss
  // (and tile_weight) into the one-element loss, as reduce_tiles says.
  void* loss = nullptr;
  unsigned* done = nullptr;
  bool mean = false, weight_mean = false;
  double denominator = 1;
};

// A reduced backward's gradient scale: the upstream scalar (nullptr: 1), over the 'mean' denominator.
template <class Acc>
__device__ double grad_scale_of(const Acc* grad_scalar, bool mean, double denominator) {
  const double g = grad_scalar != nullptr ? static_cast<double>(*grad_scalar) : 1.0;
  return mean ? g / denominator : g;
}

// The one-element loss from the tiles' sums (call from every thread of one block, the last of its pass): in a fixed
// order, over the 'mean' denominator (`denominator`; with weight_mean the weights' sum, from tile_weight, else from
// the record). A flagged call (checked: the record's bad is live) writes nothing, or NaN under capture (`poison`).
// 'mean' of nothing is 0 / 0 = NaN, as on the CPU.
template <class Acc>
__device__ void reduce_tiles(const double* tile_loss, const double* tile_weight, int64_t tiles, const PwRecord* rec,
                             bool checked, bool mean, bool weight_mean, double denominator, bool poison, Acc* loss) {
  const double l = ordered_sum<kThreads>(tile_loss, tiles);
  const double ws = tile_weight != nullptr ? ordered_sum<kThreads>(tile_weight, tiles) : 0.0;
  if (threadIdx.x != 0) return;
  if (checked && __ldcg(&rec->bad) != 0) {  // other blocks' flags (last_block_done made them visible)
    if (poison) *loss = static_cast<Acc>(NAN);
    return;
  }
  // the weights' sum: this pass's, pw_scale_kernel's (a fused call), or 0 for no tiles (the record was not written)
  if (weight_mean) denominator = tile_weight != nullptr || tiles == 0 ? ws : rec->weight_sum;
  *loss = static_cast<Acc>(mean ? l / denominator : l);
}

template <class Loss, class T>
__global__ void __launch_bounds__(kThreads)
    pointwise_kernel(const PwParams p, const PwPass a) {
  using Acc = math::AccOf<T>;
  if (a.skip_if != nullptr && *static_cast<const Acc*>(a.skip_if) == Acc(1)) return;
  bool poisoned = false;
  if (a.gated && a.rec->bad != 0) {
    if (!a.poison) return;
    poisoned = true;
  }
  using Io = math::Io<T>;
  const math::ScalarOps<Acc> o{};
  const math::PwConsts<Acc> k{static_cast<Acc>(p.a), static_cast<Acc>(p.b)};
  const int last = p.ndim - 1;
  const T* X = static_cast<const T*>(p.ptr[core::kPwX]);
  const T* Y = static_cast<const T*>(p.ptr[core::kPwY]);
  const T* Z = static_cast<const T*>(p.ptr[core::kPwZ]);
  const T* W = static_cast<const T*>(p.ptr[core::kPwW]);
  T* GX = static_cast<T*>(const_cast<void*>(p.ptr[core::kPwGX]));
  T* GY = static_cast<T*>(const_cast<void*>(p.ptr[core::kPwGY]));
  T* GZ = static_cast<T*>(const_cast<void*>(p.ptr[core::kPwGZ]));
  const Acc* GO = static_cast<const Acc*>(p.ptr[core::kPwGO]);
  Acc* loss_rows = static_cast<Acc*>(p.loss_rows);
  const Acc gscale =
      !a.scaled      ? Acc(1)
      : a.scale_here ? static_cast<Acc>(grad_scale_of(static_cast<const Acc*>(a.grad_scalar), a.mean, a.denominator))
                     : static_cast<Acc>(a.rec->grad_scale);
  const Acc nan = static_cast<Acc>(NAN);
  const bool want_loss = loss_rows != nullptr || a.tile_loss != nullptr;  // (with p.backward: the fused entries)
  const bool checking = a.check && p.check != core::PwCheck::none;
  const bool sums = a.tile_loss != nullptr || a.tile_weight != nullptr || checking;
  const int64_t tiles = p.rows * p.tiles_per_row;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t row = t / p.tiles_per_row;
    const int64_t i0 = (t % p.tiles_per_row) * p.tile;
    const int64_t i1 = i0 + p.tile < p.inner ? i0 + p.tile : p.inner;
    const core::PwOffsets off = core::pw_row_offsets(p, row, 0);
    const auto at = [&](int v, int64_t i) { return off.v[v] + i * p.strides[v][last]; };
    double tl = 0, tw = 0;
    bool bad = false;
    for (int64_t i = i0 + threadIdx.x; i < i1; i += kThreads) {
      const Acc w = W != nullptr ? Io::load(W, at(core::kPwW, i)) : Acc(1);
      if (!p.backward) {
        tw += static_cast<double>(w);
        if (!want_loss && !checking) continue;  // the weight-sum pass
      }
      const Acc x = Io::load(X, at(core::kPwX, i));
      const Acc y = Io::load(Y, at(core::kPwY, i));
      const Acc z = Z != nullptr ? Io::load(Z, at(core::kPwZ, i)) : Acc(0);
      if (!p.backward) {
        if (p.check == core::PwCheck::x_unit_interval) bad |= !((x >= Acc(0)) & (x <= Acc(1)));
        if (p.check == core::PwCheck::z_nonnegative) bad |= z < Acc(0);
      } else {
        Acc g = w * gscale;
        if (GO != nullptr) g *= GO[at(core::kPwGO, i)];
        Acc dx = 0, dy = 0, dz = 0;
        Loss::grad(o, k, x, y, z, g, dx, dy, dz);
        if (poisoned) dx = dy = dz = nan;
        if (GX != nullptr) Io::store(GX, at(core::kPwGX, i), dx);
        if (GY != nullptr) Io::store(GY, at(core::kPwGY, i), dy);
        if (GZ != nullptr) Io::store(GZ, at(core::kPwGZ, i), dz);
      }
      if (!want_loss) continue;  // the check-only pass, a backward
      Acc l = Loss::value(o, k, x, y, z);
      if (W != nullptr) l *= w;
      if (poisoned) l = nan;
      if (loss_rows != nullptr) {
        loss_rows[row * p.inner + i] = l;  // contiguous ('none')
      } else {
        tl += static_cast<double>(l);
      }
    }
    if (!sums) continue;  // (uniform over the block; a backward has none)
    const double sl = block_reduce<kThreads>(tl, Plus{}), sw = block_reduce<kThreads>(tw, Plus{});
    const int any_bad = __syncthreads_or(bad ? 1 : 0);
    if (threadIdx.x == 0) {
      if (a.tile_loss != nullptr) a.tile_loss[t] = sl;
      if (a.tile_weight != nullptr) a.tile_weight[t] = sw;
      if (any_bad != 0) atomicOr(&a.rec->bad, 1u);
    }
  }
  if (a.loss == nullptr || !last_block_done(a.done)) return;
  reduce_tiles<Acc>(a.tile_loss, a.tile_weight, tiles, a.rec, a.check || a.gated, a.mean, a.weight_mean, a.denominator,
                    a.poison, static_cast<Acc*>(a.loss));
}

// A reduced backward's gradient scale into the record: the upstream scalar (nullptr: 1), over the 'mean' denominator:
// `denominator`, or the weights' sum from tile_weight (then also kept in rec->weight_sum for the fused loss).
template <class Acc>
__global__ void __launch_bounds__(kThreads) pw_scale_kernel(const double* tile_weight, int64_t tiles, PwRecord* rec,
                                                            const Acc* grad_scalar, bool mean, double denominator,
                                                            const Acc* skip_if) {
  if (skip_if != nullptr && *skip_if == Acc(1)) return;  // (held gradients: the weight pass did not run either)
  const double ws = ordered_sum<kThreads>(tile_weight, tiles);  // (tile_weight is null only with no tiles)
  if (threadIdx.x != 0) return;
  rec->weight_sum = denominator = ws;  // (run only for a weighted 'mean': 0 for no tiles)
  rec->grad_scale = grad_scale_of(grad_scalar, mean, denominator);
}

}  // namespace

void pointwise_run(const PwParams& p) {
  core::PwDeviceCall& call = *p.device_call;  // core makes every call on a device a device call
  const int64_t tiles = p.rows * p.tiles_per_row;
  if (tiles == 0 && call.loss == nullptr) return;
  const char* names[core::kPwViews] = {"input",      "target",      "third operand", "weight",
                                       "grad_input", "grad_target", "grad_third",    "grad_loss"};
  std::vector<Operand> operands{{p.ptr[core::kPwX], names[core::kPwX]}};
  for (int v = 1; v < core::kPwViews; ++v) operands.emplace_back(p.ptr[v], names[v]);
  operands.insert(operands.end(), {{p.loss_rows, "loss"}, {call.loss, "loss"}, {call.grad_scalar, "grad_loss"}});
  const DeviceScope scope(operands);
  const bool capturing = stream_capturing();
  const bool poison = !reports_bad_values(capturing);  // nothing read back: a flagged call's outputs are NaN
  const bool checking = call.check != core::PwCheck::none;
  const bool reduced = call.reduction != Reduction::none, mean = call.reduction == Reduction::mean;
  // A reduced forward checks in its own pass (it writes only the loss, after it); the rest after a check pass.
  const bool check_in_pass = checking && reduced && !p.backward;
  const bool weights = call.weight_mean && p.ptr[core::kPwW] != nullptr;
  const bool scaled = p.backward && reduced;
  const bool scale_kernel = scaled && weights;  // the weights' sum first: else the pass computes its scale
  const bool folded = call.loss != nullptr;
  const Scratch<PwRecord> rec(1);
  const Scratch<double> tile_loss(folded ? static_cast<std::size_t>(tiles) : 0);
  const Scratch<double> tile_weight(weights ? static_cast<std::size_t>(tiles) : 0);
  // Zeroed for the check's flag, or for the fold's count under capture (fold_counter).
  const bool zeroed = checking || (folded && capturing);
  if (zeroed) {
    check(cudaMemsetAsync(rec.get(), 0, sizeof(PwRecord), stream()), "cudaMemsetAsync (pointwise record)");
  }
  const unsigned grid = static_cast<unsigned>(std::clamp<int64_t>(tiles, 1, int64_t{1} << 30));
  // A forward-direction pass over the operands alone (no output written): the check's, or the weights' sum.
  PwParams reads = p;
  reads.backward = false;
  reads.loss_rows = nullptr;
  for (int v = core::kPwGX; v < core::kPwViews; ++v) reads.ptr[v] = nullptr;
  reads.check = call.check;
  math::visit_pointwise_loss(p.kind, core::pw_option1(p), core::pw_option2(p), [&](auto tag) {
    using Loss = decltype(tag);
    math::visit_float_dtype(p.dtype, [&](auto storage) {
      using T = decltype(storage);
      using Acc = math::AccOf<T>;
      auto launch = [&](const PwParams& q, const PwPass& a) {
        if (tiles == 0 && a.loss == nullptr) return;  // (a folded reduction still writes the loss of nothing)
        pointwise_kernel<Loss, T><<<grid, kThreads, 0, stream()>>>(q, a);
        check(cudaGetLastError(), "pointwise_kernel");
      };
      const void* skip_if = call.skip_if_one ? call.grad_scalar : nullptr;
      if (checking && !check_in_pass) {
        launch(reads, {nullptr, nullptr, rec.get(), true, false, poison, false, skip_if});
      }
      if (scale_kernel) {
        launch(reads, {nullptr, tile_weight.get(), rec.get(), false, false, poison, false, skip_if});
        pw_scale_kernel<Acc><<<1, kThreads, 0, stream()>>>(tile_weight.get(), tiles, rec.get(),
                                                           static_cast<const Acc*>(call.grad_scalar), mean,
                                                           call.denominator, static_cast<const Acc*>(skip_if));
        check(cudaGetLastError(), "pw_scale_kernel");
      }
      PwParams q = p;
      q.check = check_in_pass ? call.check : core::PwCheck::none;
      PwPass a{tile_loss.get(),
               weights && !p.backward ? tile_weight.get() : nullptr,
               rec.get(),
               check_in_pass,
               checking && !check_in_pass,
               poison,
               scaled,
               skip_if};
      a.scale_here = scaled && !scale_kernel;
      a.grad_scalar = call.grad_scalar;
      a.mean = mean;
      a.weight_mean = weights;
      a.denominator = call.denominator;
      if (folded) {
        a.loss = call.loss;
        a.done = fold_counter(zeroed, &rec.get()->done);
      }
      launch(q, a);
    });
  });
  if (!checking || poison) return;
  call.bad = read_back(&rec.get()->bad, "pointwise kernels") != 0;
}

}  // namespace lossfuse::cuda
