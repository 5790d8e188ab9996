// The eleven elementwise losses on CUDA: one kernel over core's PwParams (src/core/pointwise_params.hpp), the
// formulas of src/math/pointwise_losses.inc evaluated per element by math::ScalarOps (the same code the CPU's scalar
// tails run). One thread block per tile (at most PwParams::tile elements of one row, the CPU's tiles), threads striding
// over the tile; any strides, stride-0 broadcast operands, 16-bit storage through math::Io. Reductions: each thread
// sums its elements in double, the block combines the threads in a fixed tree, and the tile's sum (and weight sum,
// and value-check flag) goes to the host arrays core passes, as on the CPU: the same bits on every run. A backward
// given a loss output too (the fused entries) writes the forward's loss in the same pass.
#include <algorithm>
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

template <class Loss, class T>
__global__ void __launch_bounds__(kThreads)
    pointwise_kernel(const PwParams p, double* tile_loss, double* tile_weight, char* tile_bad) {
  using Acc = math::AccOf<T>;
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
  const Acc gscale = static_cast<Acc>(p.grad_scale);
  const bool want_loss = loss_rows != nullptr || tile_loss != nullptr;  // (with p.backward: the fused entries)
  const bool checking = tile_bad != nullptr && p.check != core::PwCheck::none;
  const bool sums = tile_loss != nullptr || tile_weight != nullptr || tile_bad != nullptr;
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
        if (GX != nullptr) Io::store(GX, at(core::kPwGX, i), dx);
        if (GY != nullptr) Io::store(GY, at(core::kPwGY, i), dy);
        if (GZ != nullptr) Io::store(GZ, at(core::kPwGZ, i), dz);
      }
      if (!want_loss) continue;  // the check-only pass, a backward
      Acc l = Loss::value(o, k, x, y, z);
      if (W != nullptr) l *= w;
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
      if (tile_loss != nullptr) tile_loss[t] = sl;
      if (tile_weight != nullptr) tile_weight[t] = sw;
      if (tile_bad != nullptr) tile_bad[t] = any_bad != 0 ? 1 : 0;
    }
  }
}

// A device array of n tile values copied into the host array `host` (nullptr: not wanted) after the kernel.
template <class V>
struct TileArray {
  V* host;
  Scratch<V> dev;
  TileArray(V* h, int64_t n) : host(h), dev(h != nullptr ? static_cast<std::size_t>(n) : 0) {}
  void copy_back(int64_t n) const {
    if (host == nullptr) return;
    check(cudaMemcpyAsync(host, dev.get(), static_cast<std::size_t>(n) * sizeof(V), cudaMemcpyDeviceToHost, stream()),
          "cudaMemcpyAsync (tile sums)");
  }
};

}  // namespace

void pointwise_run(const PwParams& p) {
  const int64_t tiles = p.rows * p.tiles_per_row;
  if (tiles == 0) return;
  const char* names[core::kPwViews] = {"input",      "target",      "third operand", "weight",
                                       "grad_input", "grad_target", "grad_third",    "grad_loss"};
  std::vector<Operand> operands{{p.ptr[core::kPwX], names[core::kPwX]}};
  for (int v = 1; v < core::kPwViews; ++v) operands.emplace_back(p.ptr[v], names[v]);
  operands.emplace_back(p.loss_rows, "loss");
  const DeviceScope scope(operands);
  const TileArray<double> loss(p.tile_loss, tiles), weight(p.tile_weight, tiles);
  const TileArray<char> bad(p.tile_bad, tiles);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(tiles, int64_t{1} << 30));
  math::visit_pointwise_loss(p.kind, core::pw_option1(p), core::pw_option2(p), [&](auto tag) {
    using Loss = decltype(tag);
    math::visit_float_dtype(p.dtype, [&](auto storage) {
      using T = decltype(storage);
      pointwise_kernel<Loss, T><<<grid, kThreads, 0, stream()>>>(p, loss.dev.get(), weight.dev.get(), bad.dev.get());
    });
  });
  check(cudaGetLastError(), "pointwise_kernel");
  loss.copy_back(tiles);
  weight.copy_back(tiles);
  bad.copy_back(tiles);
  check(cudaStreamSynchronize(stream()), "pointwise kernels");
}

}  // namespace lossfuse::cuda
