// Entry points of the CPU margin-loss kernels. Each takes a checked core::MarginParams and never throws; the
// forward fills p.loss_rows or p.block_loss, the backward writes the non-null p.grad[] (full input shapes).
#pragma once

#include "core/margin_problem.hpp"

namespace lossfuse::cpu {

void triplet_margin_rows(const core::MarginParams& p);          // x = anchor, positive, negative
void cosine_embedding_rows(const core::MarginParams& p);        // x = x1, x2; target per row
void multi_margin_rows(const core::MarginParams& p);            // x = input; target per row; weight
void multilabel_margin_rows(const core::MarginParams& p);       // x = input; target (rows, C)
void multilabel_soft_margin_rows(const core::MarginParams& p);  // x = input; target (rows, C); weight

}  // namespace lossfuse::cpu
