// Shared pieces of the CPU margin-loss kernels (src/cpu/{triplet_margin,cosine_embedding,multi_margin,
// multilabel_margin,multilabel_soft_margin}.cpp): a float target of any dtype widened to double, the upstream
// gradient of a row, and the block driver that splits rows over threads in fixed blocks and writes per-row
// losses or per-block partial sums (double), so reductions are deterministic for any thread count.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/margin_problem.hpp"
#include "core/targets.hpp"
#include "lossfuse/parallel.hpp"
#include "math/half.hpp"

namespace lossfuse::cpu::margin {

// A floating value of any float dtype at element offset i, widened to double.
inline double read_float(const void* base, DType t, std::int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(base)[i];
    case DType::f64: return static_cast<const double*>(base)[i];
    case DType::f16: return math::f16_to_float(static_cast<const std::uint16_t*>(base)[i]);
    case DType::bf16: return math::bf16_to_float(static_cast<const std::uint16_t*>(base)[i]);
    default: return static_cast<double>(core::read_target(base, t, i));
  }
}

// The upstream gradient of row r: grad_loss[r] for 'none' (1 when absent), else the scale (1/rows folded in).
template <class Acc>
inline Acc upstream(const core::MarginParams& p, std::int64_t r) {
  if (p.grad_loss != nullptr) return static_cast<const Acc*>(p.grad_loss)[p.index.offset(core::kMvGradLoss, r)];
  return static_cast<Acc>(p.grad_scale);
}

// Rows of blocks [b0, b1): row(r) -> Acc loss. Forward: stores the row loss (p.loss_rows) or adds it to its
// block's partial (p.block_loss, double, row order). Backward: the row writes its gradients and its return
// value is ignored.
template <class Acc, class Row>
void run_blocks(const core::MarginParams& p, std::int64_t b0, std::int64_t b1, Row&& row) {
  for (std::int64_t blk = b0; blk < b1; ++blk) {
    double block_loss = 0;
    const std::int64_t r_end = std::min(p.rows, (blk + 1) * p.rows_per_block);
    for (std::int64_t r = blk * p.rows_per_block; r < r_end; ++r) {
      const Acc loss = row(r);
      if (p.backward) continue;
      if (p.loss_rows != nullptr) static_cast<Acc*>(p.loss_rows)[r] = loss;
      block_loss += static_cast<double>(loss);
    }
    if (!p.backward && p.block_loss != nullptr) p.block_loss[blk] = block_loss;
  }
}

inline std::int64_t num_blocks(const core::MarginParams& p) {
  return (p.rows + p.rows_per_block - 1) / p.rows_per_block;
}
// Blocks per task: about 64K elements of work. work: elements touched per row.
inline std::int64_t block_grain(const core::MarginParams& p, std::int64_t work) {
  return std::max<std::int64_t>(1, 65536 / std::max<std::int64_t>(1, work * p.rows_per_block));
}

// Runs row(r) over every row, blocks of p.rows_per_block rows split across threads (see run_blocks).
template <class Acc, class Row>
void for_rows(const core::MarginParams& p, std::int64_t work, Row&& row) {
  parallel_for(0, num_blocks(p), block_grain(p, work),
               [&](std::int64_t b0, std::int64_t b1) { run_blocks<Acc>(p, b0, b1, row); });
}

}  // namespace lossfuse::cpu::margin
