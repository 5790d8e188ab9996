// The block driver of the CPU margin-loss kernels (src/cpu/{triplet_margin,cosine_embedding,multi_margin,
// multilabel_margin,multilabel_soft_margin}.cpp): it splits rows over threads in fixed blocks and writes per-row
// losses or per-block partial sums (double), so reductions are deterministic for any thread count.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/margin_problem.hpp"
#include "lossfuse/parallel.hpp"

namespace lossfuse::cpu::margin {

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
