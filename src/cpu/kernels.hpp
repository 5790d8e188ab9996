// Entry points of the CPU kernels, reached through the CPU backend's table (src/cpu/backend.cpp). Each takes only a
// checked, plain parameter struct and never throws (linear_cross_entropy_run: but for a GEMM hook's decline).
#pragma once

#include <cstdint>

#include "core/cross_entropy_params.hpp"
#include "core/backend.hpp"
#include "core/ctc_params.hpp"
#include "core/linear_cross_entropy_params.hpp"
#include "core/pointwise_params.hpp"
#include "lossfuse/dtype.hpp"

namespace lossfuse::cpu {

// Cross-entropy rows (forward, backward or both) over all rows of p, split across threads.
void cross_entropy_rows(const core::CeParams& p);

// NLL: the forward fills p.loss_rows or p.block_loss; the backward writes p.grad (the whole input shape).
void nll_rows(const core::CeParams& p);

// Whole-array value checks of the elementwise losses' operands (src/cpu/value_scan.cpp; core::ValueScan).
using core::ValueScan;
bool value_scan_passes(DType dtype, const void* data, std::int64_t n, ValueScan scan);

// Elementwise losses: forward fills p.loss_rows or the per-tile sums (p.tile_loss, p.tile_weight); backward
// writes the gradients present in p.ptr.
void pointwise_run(const core::PwParams& p);

// CTC over the N samples of p, split across threads: the forward writes p.nll (and p.log_alpha when set);
// the backward (p.grad set) writes every element of p.grad.
void ctc_samples(const core::CtcParams& p);

// The fused linear cross-entropy's runner (src/cpu/linear_cross_entropy.cpp).
void linear_cross_entropy_run(const core::LceParams& p);

// The vectorized float32 exp, log (x > 0, finite), log1p (x > -1, finite; _unit: x in [0, 1]) of the
// kernels (src/cpu/hwy_exp-inl.h), and the elementwise losses' exp of any x (ExpAny), applied to arrays; for their range tests.
void fast_exp(const float* x, float* y, std::int64_t n);
void exp_any(const float* x, float* y, std::int64_t n);
void fast_log(const float* x, float* y, std::int64_t n);
void fast_log1p(const float* x, float* y, std::int64_t n);
void fast_log1p_unit(const float* x, float* y, std::int64_t n);

}  // namespace lossfuse::cpu
