// CPU NLL kernels.
//
// input: rows x C log-probabilities (any strides), target: one class index per row (any integer dtype)
// forward:  loss_r = -w_y x_y (0 for ignored rows); per-row output or per-block sums
// backward: grad = 0 except grad[r, y] = -w_y g_r, where g_r is the upstream gradient (1/denominator folded
//           in for 'mean'). Memory bound: the forward reads one element per row; the backward is a fill.
#include <algorithm>
#include <cstring>

#include "core/targets.hpp"
#include "cpu/kernels.hpp"
#include "lossfuse/parallel.hpp"
#include "math/storage.hpp"

namespace lossfuse::cpu {
namespace {

using math::Io;

template <class T>
void nll_blocks(const core::CeParams& p, std::int64_t b0, std::int64_t b1) {
  using Acc = typename Io<T>::Acc;
  const auto* w = static_cast<const Acc*>(p.weight);
  const auto* in = static_cast<const T*>(p.logits);
  auto* grad = static_cast<T*>(p.grad);
  const std::int64_t C = p.classes;
  for (std::int64_t blk = b0; blk < b1; ++blk) {
    double block_loss = 0;
    const std::int64_t r_end = std::min(p.rows, (blk + 1) * p.rows_per_block);
    for (std::int64_t r = blk * p.rows_per_block; r < r_end; ++r) {
      const std::int64_t y = core::read_target(p.target, p.target_dtype, p.index.offset(core::kTargetRow, r));
      const bool ignored = y == p.ignore_index;
      const Acc w_y = ignored ? Acc(0) : (w != nullptr ? w[y] : Acc(1));
      if (p.mode == core::CeMode::forward) {
        // Ignored rows contribute exactly 0 (never 0 * x, which would turn an inf or NaN input into NaN).
        const Acc loss = ignored ? Acc(0) : -w_y * Io<T>::load(in + p.index.offset(core::kLogitsRow, r) +
                                                                    y * p.x_cstride);
        if (p.loss_rows != nullptr) static_cast<Acc*>(p.loss_rows)[r] = loss;
        block_loss += static_cast<double>(loss);
        continue;
      }
      T* g = grad + p.index.offset(core::kGradRow, r);
      if (p.g_cstride == 1) {
        std::memset(static_cast<void*>(g), 0, static_cast<std::size_t>(C) * sizeof(T));
      } else {
        for (std::int64_t c = 0; c < C; ++c) Io<T>::store(g + c * p.g_cstride, Acc(0));
      }
      if (ignored) continue;
      Acc gs = static_cast<Acc>(p.grad_scale);
      if (p.grad_loss != nullptr) {
        gs = static_cast<Acc>(static_cast<const Acc*>(p.grad_loss)[p.index.offset(core::kGradLossRow, r)] *
                              p.grad_scale);
      }
      Io<T>::store(g + y * p.g_cstride, -w_y * gs);
    }
    if (p.block_loss != nullptr) p.block_loss[blk] = block_loss;
  }
}

template <class T>
void run(const core::CeParams& p) {
  const std::int64_t blocks = (p.rows + p.rows_per_block - 1) / p.rows_per_block;
  const std::int64_t work = p.mode == core::CeMode::forward ? p.rows_per_block : p.classes * p.rows_per_block;
  const std::int64_t grain = std::max<std::int64_t>(1, 65536 / std::max<std::int64_t>(1, work));
  parallel_for(0, blocks, grain, [&p](std::int64_t b0, std::int64_t b1) { nll_blocks<T>(p, b0, b1); });
}

}  // namespace

void nll_rows(const core::CeParams& p) {
  math::visit_float_dtype(p.dtype, [&p](auto tag) { run<decltype(tag)>(p); });
}

}  // namespace lossfuse::cpu
