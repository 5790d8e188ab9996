// The CUDA backend's kernel entries (src/cuda/backend.cu puts them in its table). Each takes the params core
// filled: operands and outputs in device memory. Every entry is a device call (core::CeDeviceCall, PwDeviceCall,
// MarginDeviceCall, CtcDeviceCall, LceParams::device_call: every step after core's checks on the device). Entries
// return once their work is queued and their one read-back done where they have one, and throw Error(device_error)
// when a CUDA call fails.
#pragma once

#include <cstdint>
#include <memory>

#include "core/cross_entropy_params.hpp"
#include "core/ctc_params.hpp"
#include "core/linear_cross_entropy_params.hpp"
#include "core/margin_problem.hpp"
#include "core/pointwise_params.hpp"

namespace lossfuse::cuda {

void cross_entropy_rows(const core::CeParams& p);  // src/cuda/cross_entropy.cu: a device call, or CeMode::scale
void nll_rows(const core::CeParams& p);            // src/cuda/cross_entropy.cu: a device call

// A cross-entropy device call (whole.device_call) whose rows run in one launch or several (the fused linear runner's
// chunks; src/cuda/cross_entropy.cu). Construction queues the class weights and the scan of every target of `whole`
// (its mode, targets, layout and options; no logits). rows(): the row kernel over rows [r0, r0 + chunk.rows) of
// whole, whose logits, gradient and row outputs chunk holds. reduce(): the mean / sum outputs, once every row ran.
// check(): reads the first bad target back into the call (one synchronisation; none under stream capture, where a
// bad row is NaN instead) and returns whether there was none. Eager, nothing is written after a bad target.
class CeDeviceRows {
 public:
  // whole_call: the call's rows go through rows_reduced() alone, so a small batch may scan its targets in the row
  // kernel (one launch: DeviceSteps' may_inline).
  explicit CeDeviceRows(const core::CeParams& whole, bool whole_call = false);
  ~CeDeviceRows();
  CeDeviceRows(const CeDeviceRows&) = delete;
  CeDeviceRows& operator=(const CeDeviceRows&) = delete;
  void rows(const core::CeParams& chunk, std::int64_t r0);
  void reduce();
  // rows() over the whole call then reduce(): one launch up to 32 rows per row-block thread (the last block sums).
  void rows_reduced();
  bool check();

 private:
  void launch_rows(const core::CeParams& chunk, std::int64_t r0, bool fold);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

void pointwise_run(const core::PwParams& p);       // src/cuda/pointwise.cu
void ctc_run_samples(const core::CtcParams& p);    // src/cuda/ctc.cu: a device call (core::CtcDeviceCall)
// src/cuda/margin.cu
void triplet_margin_rows(const core::MarginParams& p);
void cosine_embedding_rows(const core::MarginParams& p);
void multi_margin_rows(const core::MarginParams& p);
void multilabel_margin_rows(const core::MarginParams& p);
void multilabel_soft_margin_rows(const core::MarginParams& p);
// The fused linear loss's runner (src/cuda/linear_cross_entropy.cu): a device call (LceParams::device_call), the
// products on cuBLAS. Throws Error(not_implemented) for vocabulary tiles and views cuBLAS cannot take, before writing.
void linear_cross_entropy_run(const core::LceParams& p);

}  // namespace lossfuse::cuda
