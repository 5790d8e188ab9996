// The plain parameter struct the core fills after checking and every CTC kernel takes.
#pragma once

#include <cstdint>

#include "lossfuse/dtype.hpp"
#include "lossfuse/loss_kind.hpp"

namespace lossfuse::core {

// A scratch row holding n values with 2 leading and >= 2 + 64 trailing elements, so vector loops over
// [0, n) may read s - 2 .. s + 2 of whole vectors (up to 64 lanes) without bounds.
constexpr std::int64_t ctc_row_stride(std::int64_t n) { return (n + 4 + 63) / 64 * 64 + 64; }
constexpr std::int64_t kCtcLRows = 6, kCtcCRows = 4;
constexpr std::int64_t ctc_scratch_elems(std::int64_t L, std::int64_t C) {
  return kCtcLRows * ctc_row_stride(L) + kCtcCRows * ctc_row_stride(C);
}

// A lengths operand as a device kernel reads it: any integer dtype, `stride` elements apart.
struct CtcLengths {
  const void* data = nullptr;
  DType dtype = DType::i64;
  std::int64_t stride = 0;
};

// A device backend's whole call (CtcParams::device_call, set by core for log_probs off the CPU, after every shape,
// dtype and overlap check): the backend checks the lengths and labels, reads the upstream gradient and reduces the
// loss on its device, so the call reads back at most its check's record (8 bytes, one synchronisation; none under
// stream capture, where a bad sample's loss and gradient are NaN instead).
struct CtcDeviceCall {
  // On the device; data nullptr: the host arrays CtcParams::input_lengths / target_lengths, which the backend copies
  // (core refuses host arrays under capture: Backend::capturing). Unchecked, except the lengths of concatenated
  // targets, which core read and checked.
  CtcLengths input_lengths, target_lengths;
  bool concatenated = false;  // targets 1-D: sample b's labels start at element target_start[b] * target_stride
  const std::int64_t* target_start = nullptr;  // concatenated: host (N), copied by the backend
  std::int64_t target_batch_stride = 0;        // padded: sample b's labels start at element b * target_batch_stride
  Reduction reduction = Reduction::mean;
  void* loss = nullptr;  // forward: Acc, (N) for none, else one element
  void* nll = nullptr;   // forward: Acc (N), or nullptr
  // backward: the upstream gradient (Acc): per sample `grad_loss_stride` apart for none, else one element; nullptr: 1
  const void* grad_loss = nullptr;
  std::int64_t grad_loss_stride = 0;
  // Out: the first bad input in core's check order, as a key (-1: none; the call then wrote nothing): 2 b for
  // input_lengths[b], 2 b + 1 for target_lengths[b], 2 N + i for the label at flat position i of the targets
  // (padded: b * S + s; concatenated: target_start[b] + s).
  std::int64_t bad = -1;
};

struct CtcParams {
  DType dtype = DType::f32;  // log_probs and grad; Acc = double for f64, else float
  std::int64_t T = 0, N = 0, C = 0;
  std::int64_t L = 1;  // row length of the alpha workspace: 2 * S_max + 1

  const void* log_probs = nullptr;  // (T, N, C), element strides lp_st, lp_sn, lp_sc
  std::int64_t lp_st = 0, lp_sn = 0, lp_sc = 0;

  // log_probs, targets, grad and log_alpha live on the backend's device; target_offset, the lengths, nll and
  // grad_scale are host arrays (a device call's: see device_call).
  const void* targets = nullptr;  // any integer dtype, read as stored
  DType target_dtype = DType::i64;
  const std::int64_t* target_offset = nullptr;   // (N): element offset of sample b's first label (CPU only)
  std::int64_t target_stride = 1;                // element stride between consecutive labels
  const std::int64_t* input_lengths = nullptr;   // (N), checked (a device call's: by the backend): 0 <= il <= T
  const std::int64_t* target_lengths = nullptr;  // (N), checked likewise: 0 <= tl, 2 tl + 1 <= L
  std::int64_t blank = 0;
  bool zero_infinity = false;

  // Acc (T, N, L) contiguous on the device: written by the forward when set; the backward reads it, and computes
  // it first unless alpha_ready. A backward without one gets a host workspace on the CPU, nullptr elsewhere (the
  // device backend allocates its own).
  void* log_alpha = nullptr;
  bool alpha_ready = false;
  // The CPU's per-sample scratch, allocated by the core so its kernels never allocate (nullptr on other devices):
  // Acc[ctc_scratch_elems(L, C)] at b * ctc_scratch_elems(L, C) (padded rows for whole-vector loops) and int64[L]
  // at b * L (the extended label sequence l').
  void* scratch = nullptr;
  std::int64_t* label_scratch = nullptr;

  double* nll = nullptr;  // (N): -log p, written by the forward (and by the backward when set)

  void* grad = nullptr;  // backward: like log_probs, strides g_st, g_sn, g_sc
  std::int64_t g_st = 0, g_sn = 0, g_sc = 0;
  const double* grad_scale = nullptr;  // (N): upstream gradient of loss_b (mean's divisor folded in)

  // Device backends: set by core (see CtcDeviceCall); target_offset, nll and grad_scale are then nullptr, and the
  // length arrays are set only for lengths on the host.
  CtcDeviceCall* device_call = nullptr;
};

}  // namespace lossfuse::core
