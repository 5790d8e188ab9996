// The plain parameter struct the margin-loss kernels take (include/lossfuse/margin.hpp), and the checks and
// layout helpers the five core entries share. Every loss here works on rows over the last dim: up to three
// floating inputs of shape (rows..., D), an optional target (per row or per element), gradients of the
// inputs' shapes and a per-row or reduced loss.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/check.hpp"
#include "core/class_problem.hpp"
#include "core/row_index.hpp"
#include "core/targets.hpp"
#include "lossfuse/error.hpp"
#include "lossfuse/loss_kind.hpp"
#include "lossfuse/tensor.hpp"
#include "math/half.hpp"
#include "math/host_device.hpp"

namespace lossfuse::core {

// The views a margin kernel addresses per row.
enum MarginView : int { kMvX0, kMvX1, kMvX2, kMvTarget, kMvG0, kMvG1, kMvG2, kMvGradLoss, kMarginViews };

using MarginIndex = RowIndexN<kMarginViews>;

// The class-target check a device call makes before writing anything: none, one class index per row in [0, D)
// (multi_margin), or every element in [-1, D) (multilabel_margin's label lists).
enum class MarginCheck : std::uint8_t { none, class_index, label_list };

// A device backend's whole call (MarginParams::device_call, set by core for operands off the CPU, after every shape,
// dtype and overlap check): the backend converts the class weights, checks the class targets, reads the upstream
// scalar and reduces the loss on its device, so core takes no host step and the call reads back at most the check's
// record (nothing under stream capture, where a bad target makes its row, and a reduced loss over it, NaN). A
// backward asking for no gradient still runs the check.
struct MarginDeviceCall {
  const void* weight = nullptr;  // the caller's (D) class weights (any floating dtype and stride), nullptr: none
  DType weight_dtype = DType::f32;
  std::int64_t weight_stride = 1;
  Reduction reduction = Reduction::mean;
  const void* grad_scalar = nullptr;  // mean / sum backward: the upstream scalar (Acc); nullptr: 1
  void* loss = nullptr;               // mean / sum forward: the one-element output (Acc)
  MarginCheck check = MarginCheck::none;
  // Out: the first bad target in row-major order (bad_row -1: none), at (bad_row, bad_col) of the rows x (1 or D)
  // targets; the call then wrote nothing.
  std::int64_t bad_row = -1, bad_col = 0, bad_value = 0;
};

struct MarginParams {
  bool backward = false;
  DType dtype = DType::f32;               // the floating inputs and gradients
  DType target_dtype = DType::i64;        // integer class targets, or the input dtype for float targets
  std::int64_t rows = 0, D = 0;           // D: the last dim (features or classes)
  std::int64_t rows_per_block = 1;        // fixed by the problem: the reduction order does not depend on threads
  const void* x[3] = {};                  // inputs (rows, D)
  const void* target = nullptr;           // per row or (rows, D)
  void* grad[3] = {};                     // gradient outputs (rows, D); null: not wanted
  std::int64_t inner[kMarginViews] = {};  // stride of the last dim per view
  MarginIndex index;
  void* loss_rows = nullptr;        // 'none': Acc (rows), contiguous
  double* block_loss = nullptr;     // 'mean'/'sum': one partial sum per block
  const void* grad_loss = nullptr;  // 'none': Acc per row through kMvGradLoss; else null and grad_scale
  double grad_scale = 1.0;
  const void* weight = nullptr;  // Acc (D) class weights or null
  double margin = 0, p = 2, eps = 0;
  bool swap = false;
  MarginDeviceCall* device_call = nullptr;  // device backends: set by core (see MarginDeviceCall); nullptr: host steps
};

// Starts p as a device call through `call` when `device` is not the CPU; the class weights then stay where they are
// (checked here) and `host` is empty, else they are loaded to the host (p.weight).
template <class Acc>
void start_margin_call(MarginParams& p, MarginDeviceCall& call, Device device, const std::optional<TensorView>& weight,
                       std::int64_t classes, std::vector<Acc>& host) {
  if (device == Device::cpu) {
    host = load_weights<Acc>(weight, classes, device);
    p.weight = host.empty() ? nullptr : host.data();
    return;
  }
  check_weights(weight, classes, device);
  if (weight) call.weight = weight->data, call.weight_dtype = weight->dtype, call.weight_stride = weight->strides[0];
  p.device_call = &call;
}
inline void start_margin_call(MarginParams& p, MarginDeviceCall& call, Device device) {
  if (device != Device::cpu) p.device_call = &call;
}

// The upstream gradient of row r, in every backend's kernel: grad_loss[r] for 'none' (1 when absent), else the scale
// (1/rows folded in for 'mean').
template <class Acc>
LF_HOST_DEVICE Acc margin_upstream(const MarginParams& p, std::int64_t r) {
  if (p.grad_loss != nullptr) return static_cast<const Acc*>(p.grad_loss)[p.index.offset(kMvGradLoss, r)];
  return static_cast<Acc>(p.grad_scale);
}

// Row dims of t (all dims when !has_last, else all but the last) into view v; the last dim's stride to inner.
inline void set_margin_view(MarginParams& p, int v, const TensorView& t, bool has_last) {
  const int nd = has_last ? t.ndim - 1 : t.ndim;
  for (int i = 0; i < nd && i < p.index.ndim; ++i) p.index.strides[v][i] = t.shape[i] == 1 ? 0 : t.strides[i];
  if (has_last && t.ndim >= 1) p.inner[v] = t.strides[t.ndim - 1];
}

// Row layout from the main input (..., D): row dims, rows, D, block size.
inline void set_margin_rows(MarginParams& p, const TensorView& x0) {
  p.dtype = x0.dtype;
  p.index.ndim = x0.ndim - 1;
  p.rows = 1;
  for (int i = 0; i + 1 < x0.ndim; ++i) {
    p.index.sizes[i] = x0.shape[i];
    p.rows *= x0.shape[i];
  }
  p.D = x0.ndim >= 1 ? x0.shape[x0.ndim - 1] : 1;
  // Heavy rows get a block each; light rows are grouped so a block is ~4K elements.
  p.rows_per_block = p.D >= 4096 ? 1 : (4096 + p.D - 1) / std::max<std::int64_t>(p.D, 1);
}

// The loss output: Acc dtype, contiguous, row shape for 'none' else one element.
inline void check_margin_loss(const TensorView& loss, Device dev, DType acc, Reduction r, const std::int64_t* row_shape,
                              int row_ndim) {
  check_view(loss, "loss", dev);
  check_dtype(loss, "loss", acc);
  check_reduced_shape(loss, "loss", r, row_shape, row_ndim);
  check_contiguous(loss, "loss");
}

inline void check_margin_grad_loss(const std::optional<TensorView>& grad_loss, Device dev, DType acc, Reduction r,
                                   const std::int64_t* row_shape, int row_ndim) {
  if (!grad_loss) return;
  check_view(*grad_loss, "grad_loss", dev);
  check_dtype(*grad_loss, "grad_loss", acc);
  check_reduced_shape(*grad_loss, "grad_loss", r, row_shape, row_ndim);
}

// The view an optional holds, or nullptr.
inline const TensorView* ptr(const std::optional<TensorView>& v) { return v ? &*v : nullptr; }

// A gradient a margin loss may write (nullptr: not asked for).
struct MarginGrad {
  std::string_view name;
  const TensorView* view;
};

// Every output of a margin loss entry, then the overlap of all it writes with all it reads: the loss (forward; Acc,
// the rows' reduced shape), the upstream gradient grad_loss (backward; read), and the gradients (backward; each
// with the dtype and shape of `like`). `read` holds the inputs.
inline void check_margin_outputs(bool backward, DType acc, Reduction r, const std::int64_t* row_shape, int row_ndim,
                                 const TensorView* loss, const std::optional<TensorView>& grad_loss,
                                 std::initializer_list<MarginGrad> grads, const TensorView& like,
                                 std::vector<NamedView> read) {
  std::vector<NamedView> written;
  if (loss != nullptr) {
    check_margin_loss(*loss, like.device, acc, r, row_shape, row_ndim);
    written.push_back({"loss", loss});
  }
  if (backward) {
    check_margin_grad_loss(grad_loss, like.device, acc, r, row_shape, row_ndim);
    if (grad_loss) read.push_back({"grad_loss", &*grad_loss});
    for (const MarginGrad& g : grads) {
      if (g.view == nullptr) continue;
      check_view(*g.view, g.name, like.device);
      check_dtype(*g.view, g.name, like.dtype);
      check_shape(*g.view, g.name, like.shape.data(), like.ndim);
      written.push_back({g.name, g.view});
    }
  }
  check_disjoint(written, read);
}

// A floating input with the device, dtype and shape of `ref`.
inline void check_same_as(const TensorView& t, std::string_view name, const TensorView& ref) {
  check_view(t, name, ref.device);
  check_floating(t, name);
  check_dtype(t, name, ref.dtype);
  check_shape(t, name, ref.shape.data(), ref.ndim);
}

inline void check_input_ndim(const TensorView& t, std::string_view name, int lo, int hi, std::string_view what) {
  if (t.ndim < lo || t.ndim > hi) {
    throw Error(ErrorCode::shape_mismatch, std::string(name), std::string(what),
                "a " + std::to_string(t.ndim) + "-d tensor of shape " + t.shape_string());
  }
}

inline void check_margin_option(double v, std::string_view name) { check_finite_option(v, name); }

// Upstream gradient: per row for 'none', else one scale with 1/rows folded in for 'mean' (a device call: the
// scalar's pointer, read by the backend, and 1/rows or 1 here).
inline void set_margin_grad_scale(MarginParams& p, Reduction r, const std::optional<TensorView>& grad_loss) {
  if (r == Reduction::none) {
    if (grad_loss) {
      p.grad_loss = grad_loss->data;
      for (int i = 0; i < grad_loss->ndim && i < p.index.ndim; ++i)
        p.index.strides[kMvGradLoss][i] = grad_loss->shape[i] == 1 ? 0 : grad_loss->strides[i];
    }
    return;
  }
  if (p.device_call != nullptr) {  // the backend reads the scalar on its device (divided by rows for 'mean')
    p.device_call->reduction = r;
    p.device_call->grad_scalar = grad_loss ? grad_loss->data : nullptr;
  }
  p.grad_scale = grad_loss && p.device_call == nullptr ? read_scalar(*grad_loss) : 1.0;
  // 'mean' over no rows: the scale is inf but no gradient element exists.
  if (r == Reduction::mean) p.grad_scale /= static_cast<double>(p.rows);
}

// Runs `kernel` on p with the loss output wired up, then finishes the reduction (block partials summed in
// block order; 'mean' divides by rows, so an empty batch gives nan and 'sum' gives 0). A device call reduces on the
// device instead.
template <class Kernel>
void run_margin_forward(MarginParams& p, const TensorView& loss, Reduction r, Kernel kernel) {
  if (p.device_call != nullptr) {  // the backend reduces on its device, into the loss itself
    p.device_call->reduction = r;
    (r == Reduction::none ? p.loss_rows : p.device_call->loss) = loss.data;
    kernel(p);
    return;
  }
  std::vector<double> blocks;
  if (r == Reduction::none) {
    p.loss_rows = loss.data;
  } else {
    blocks.assign(static_cast<std::size_t>((p.rows + p.rows_per_block - 1) / p.rows_per_block), 0.0);
    p.block_loss = blocks.data();
  }
  kernel(p);
  if (r != Reduction::none) write_reduced(loss, blocks, r, static_cast<double>(p.rows));
}

// multi_margin's and multilabel_margin's run: the forward (run_margin_forward), or the backward with grad_input wired
// up. A backward asking for no gradient is the checks (and the target scan) only: a device call still runs the
// entry, which scans there.
template <class Kernel>
void run_class_target_call(MarginParams& p, bool backward, const TensorView* loss, Reduction r,
                           const std::optional<TensorView>& grad_loss, const TensorView* grad, Kernel kernel) {
  if (!backward) {
    run_margin_forward(p, *loss, r, kernel);
    return;
  }
  if (grad != nullptr) {
    p.grad[0] = grad->data;
    set_margin_view(p, kMvG0, *grad, true);
    set_margin_grad_scale(p, r, grad_loss);
  }
  if (grad != nullptr || p.device_call != nullptr) kernel(p);
}

}  // namespace lossfuse::core
