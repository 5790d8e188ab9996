// The CUDA backend's kernel entries (src/cuda/backend.cu puts them in its table). Each takes the params core
// filled: operands and row outputs in device memory; class weights (p.weight) and the mean / sum block partials
// (p.block_loss, p.block_zloss) in host memory, as for the CPU (but for the device calls, core::CeDeviceCall and
// core::PwDeviceCall: every step on the device). They return once the device has finished (a device call: once its
// work is queued, and its one read-back done where it has one) and throw Error(device_error) when a CUDA call fails.
#pragma once

#include "core/cross_entropy_params.hpp"
#include "core/ctc_params.hpp"
#include "core/linear_cross_entropy_params.hpp"
#include "core/margin_problem.hpp"
#include "core/pointwise_params.hpp"

namespace lossfuse::cuda {

void cross_entropy_rows(const core::CeParams& p);  // src/cuda/cross_entropy.cu
void nll_rows(const core::CeParams& p);            // src/cuda/cross_entropy.cu
void pointwise_run(const core::PwParams& p);       // src/cuda/pointwise.cu
void ctc_run_samples(const core::CtcParams& p);    // src/cuda/ctc.cu: host arrays and nll as CtcParams says
// src/cuda/margin.cu
void triplet_margin_rows(const core::MarginParams& p);
void cosine_embedding_rows(const core::MarginParams& p);
void multi_margin_rows(const core::MarginParams& p);
void multilabel_margin_rows(const core::MarginParams& p);
void multilabel_soft_margin_rows(const core::MarginParams& p);
// The fused linear loss's runner (src/cuda/linear_cross_entropy.cu): row arrays in host memory (LceParams); the
// products on cuBLAS. Throws Error(not_implemented) for vocabulary tiles and views cuBLAS cannot take, before writing.
void linear_cross_entropy_run(const core::LceParams& p);

}  // namespace lossfuse::cuda
