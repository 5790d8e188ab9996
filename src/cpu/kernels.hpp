// Entry points of the CPU kernels. Each takes only a checked, plain parameter struct and never throws.
#pragma once

#include "core/cross_entropy_params.hpp"

namespace lossfuse::cpu {

// Cross-entropy rows (forward, backward or both) over all rows of p, split across threads.
void cross_entropy_rows(const core::CeParams& p);

// NLL: the forward fills p.loss_rows or p.block_loss; the backward writes p.grad (the whole input shape).
void nll_rows(const core::CeParams& p);

}  // namespace lossfuse::cpu
