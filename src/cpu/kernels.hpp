// Entry points of the CPU kernels. Each takes only a checked, plain parameter struct and never throws.
#pragma once

#include <cstdint>

#include "core/cross_entropy_params.hpp"

namespace lossfuse::cpu {

// Cross-entropy rows (forward, backward or both) over all rows of p, split across threads.
void cross_entropy_rows(const core::CeParams& p);

// NLL: the forward fills p.loss_rows or p.block_loss; the backward writes p.grad (the whole input shape).
void nll_rows(const core::CeParams& p);

// y = exp(x) with the vectorized float32 exp of the kernels (src/cpu/hwy_exp-inl.h); for its range test.
void fast_exp(const float* x, float* y, std::int64_t n);

}  // namespace lossfuse::cpu
