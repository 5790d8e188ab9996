// Fused linear + cross-entropy entries: every argument checked and the targets scanned once, before anything is
// written; then the backend's runner (src/core/linear_cross_entropy_params.hpp) makes the chunks' logits, their
// cross-entropy and the gradients; the loss is reduced here (off the CPU the runner scans and reduces on its device).
#include "lossfuse/linear_cross_entropy.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/check.hpp"
#include "core/class_problem.hpp"
#include "core/linear_cross_entropy_params.hpp"
#include "core/row_index.hpp"
#include "core/targets.hpp"

namespace lossfuse {
namespace {

using core::NamedView;

using Problem = core::LceProblem;

void check_2d(const TensorView& t, const char* name, const char* dims, Device device) {
  core::check_view(t, name, device);
  if (t.ndim != 2) {
    throw Error(ErrorCode::shape_mismatch, name, std::string("2 dims ") + dims, t.shape_string());
  }
  if (t.shape[1] > 1 && t.strides[1] != 1) {
    throw Error(ErrorCode::invalid_value, std::string(name) + ".stride(1)", "1 (rows of unit stride)",
                std::to_string(t.strides[1]));
  }
}

// The cross-entropy options (label_smoothing, logit_scale, softcap, z_loss_scale, class weights) are checked by the
// cross-entropy entry itself, run on an empty batch of V classes of float32 (float64) logits on x's device, as the
// untiled chunks hand it: its checks, and nothing written.
void check_ce_options(const CrossEntropyOptions& ce, DType dt, std::int64_t V, Device device) {
  CrossEntropyOptions o = ce;
  o.reduction = Reduction::none;
  const TensorView logits = TensorView::contiguous(nullptr, accumulate_dtype(dt), {0, V}, device);
  const TensorView target = TensorView::contiguous(nullptr, DType::i64, {0}, device);
  const TensorView loss = TensorView::contiguous(nullptr, accumulate_dtype(dt), {0}, device);
  try {
    cross_entropy_forward(logits, target, o, CrossEntropyOutputs{loss, std::nullopt, std::nullopt});
  } catch (const Error& e) {
    // this API's "weight" is W: the class weights are named as its overlap checks name them
    if (e.argument() != "weight") throw;
    throw Error(e.code(), "class_weight", e.expected(), e.actual());
  }
}

// target: a view on `device` of class indices of an integer dtype.
void check_class_indices(const TensorView& target, Device device) {
  core::check_view(target, "target", device);
  if (!is_integer(target.dtype)) {
    throw Error(ErrorCode::dtype_mismatch, "target", "class indices of an integer dtype",
                std::string(dtype_name(target.dtype)));
  }
}

Problem check_problem(const TensorView& x, const TensorView& w, const std::optional<TensorView>& b,
                      const TensorView& target, const LinearCrossEntropyOptions& o) {
  const Device dev = x.device;
  check_2d(x, "x", "(N, H)", dev);
  core::check_floating(x, "x");
  check_2d(w, "weight", "(V, H)", dev);
  core::check_dtype(w, "weight", x.dtype);
  Problem p;
  p.N = x.shape[0];
  p.H = x.shape[1];
  p.V = w.shape[0];
  p.dt = x.dtype;
  if (w.shape[1] != p.H) {
    throw Error(ErrorCode::shape_mismatch, "weight", "(V, " + std::to_string(p.H) + ") to match x's H",
                w.shape_string());
  }
  if (p.V == 0) throw Error(ErrorCode::shape_mismatch, "weight", "at least one class (V >= 1)", w.shape_string());
  if (b) {
    core::check_view(*b, "bias", dev);
    core::check_dtype(*b, "bias", x.dtype);
    const std::int64_t want[1] = {p.V};
    core::check_shape(*b, "bias", want, 1);
  }
  check_class_indices(target, dev);
  const std::int64_t rows[1] = {p.N};
  core::check_shape(target, "target", rows, 1);
  core::check_reduction(o.ce.reduction);
  if (o.chunk_rows < 0)
    throw Error(ErrorCode::invalid_value, "chunk_rows", "0 (auto) or > 0", std::to_string(o.chunk_rows));
  if (o.memory_budget < 0) {
    throw Error(ErrorCode::invalid_value, "memory_budget", "0 (auto) or a byte count > 0",
                std::to_string(o.memory_budget));
  }
  if (o.vocab_tile < 0) {
    throw Error(ErrorCode::invalid_value, "vocab_tile", "0 (whole rows) or a tile width > 0",
                std::to_string(o.vocab_tile));
  }
  if (!(o.grad_filter >= 0.0 && o.grad_filter <= 1.0)) {
    throw Error(ErrorCode::invalid_value, "grad_filter", "0 (off) or a threshold in (0, 1]",
                std::to_string(o.grad_filter));
  }
  if (o.grad_filter > 0.0 && o.vocab_tile == 0) {
    throw Error(ErrorCode::invalid_value, "grad_filter", "0 unless vocab_tile > 0 (it filters vocabulary tiles)",
                std::to_string(o.grad_filter));
  }
  p.tiled = o.vocab_tile > 0;
  p.Vt = std::max<std::int64_t>(1, p.tiled ? std::min(o.vocab_tile, p.V) : p.V);
  check_ce_options(o.ce, p.dt, p.V, dev);
  p.pb.class_dim = 1;
  p.pb.classes = p.V;
  p.pb.rows = p.N;
  p.pb.row_shape[0] = p.N;
  p.pb.row_ndim = 1;
  p.pb.acc = accumulate_dtype(p.dt);
  p.pb.device = dev;
  return p;
}

void check_grads(const LinearCrossEntropyGrads& g, const Problem& p, const TensorView& x, const TensorView& w,
                 const std::optional<TensorView>& b, std::vector<NamedView>& written) {
  const DType acc = p.pb.acc;
  if (g.x) {
    core::check_view(*g.x, "grad_x", p.pb.device);
    core::check_dtype(*g.x, "grad_x", x.dtype);
    core::check_shape(*g.x, "grad_x", x.shape.data(), 2);
    written.push_back({"grad_x", &*g.x});
  }
  if (g.w) {
    core::check_view(*g.w, "grad_weight", p.pb.device);
    if (g.w->dtype != acc) core::check_dtype(*g.w, "grad_weight", w.dtype);
    core::check_shape(*g.w, "grad_weight", w.shape.data(), 2);
    written.push_back({"grad_weight", &*g.w});
  }
  if (g.b) {
    if (!b) throw Error(ErrorCode::invalid_value, "grad_bias", "absent when there is no bias", "a tensor");
    core::check_view(*g.b, "grad_bias", p.pb.device);
    if (g.b->dtype != acc) core::check_dtype(*g.b, "grad_bias", b->dtype);
    core::check_shape(*g.b, "grad_bias", b->shape.data(), 1);
    written.push_back({"grad_bias", &*g.b});
  }
}

std::int64_t chunk_rows(const LinearCrossEntropyOptions& o, const Problem& p) {
  return linear_cross_entropy_chunk_rows(p.N, p.Vt, static_cast<std::int64_t>(dtype_size(p.pb.acc)), o, p.pb.device);
}

// What the target scan yields for 'mean': the sums of target weights and the non-ignored rows.
struct Denominator {
  double value;  // the loss's (split_mean_denominator)
  double sum;    // the sum of target weights: the z-loss output's
  std::int64_t counted;
  std::int64_t weighted;  // counted rows whose target weight is not 0
  // the scale of each row's gradient under 'mean' for an upstream gradient g0: with no non-ignored row every row
  // is ignored and its gradient is 0 (0, not 0 times inf); with rows whose weights sum to 0, inf or NaN as torch
  double mean_scale(double g0) const { return counted == 0 ? 0.0 : g0 / value; }
};

template <class Acc>
Denominator scan(const Problem& p, const TensorView& target, const LinearCrossEntropyOptions& o,
                 std::vector<Acc>& wts) {
  wts = core::load_weights<Acc>(o.ce.weight, p.V, p.pb.device);
  core::RowIndex idx;
  core::set_row_view(idx, 0, target, -1);
  Denominator d{0.0, 0.0, 0, 0};
  d.sum = core::scan_targets<Acc>(core::HostCopy(target).view().data, target.dtype, idx, 0, p.N, p.V, o.ce.ignore_index,
                                  wts.empty() ? nullptr : wts.data(), &d.counted, &d.weighted);
  d.value =
      core::split_mean_denominator(d.sum, d.counted, d.weighted, o.ce.label_smoothing != 0 || o.ce.z_loss_scale != 0);
  return d;
}

// The rows of a forward output (host arrays) into `out`, on the device it lives on: as they are for 'none', else
// summed in row order in double (and divided by the denominator for 'mean').
template <class T>
void store_rows(const core::Backend& be, const TensorView& out, const std::vector<T>& rows) {
  if (!rows.empty()) be.from_host(out.data, rows.data(), rows.size() * sizeof(T));
}
template <class Acc>
void write_reduced(const core::Backend& be, const TensorView& out, const std::vector<Acc>& rows, Reduction r,
                   double denominator) {
  if (r == Reduction::none) {
    store_rows(be, out, rows);
    return;
  }
  core::write_reduced(out, std::vector<double>(rows.begin(), rows.end()), r, denominator);
}

// The runner's params; outputs and direction are set by the caller.
template <class Acc>
core::LceParams params(const Problem& p, const TensorView& x, const TensorView& w, const std::optional<TensorView>& b,
                       const TensorView& target, const LinearCrossEntropyOptions& o, const LinearCrossEntropyGrads& g,
                       const std::vector<Acc>& wts) {
  core::LceParams lp;
  lp.problem = p;
  lp.x = &x;
  lp.w = &w;
  lp.b = b ? &*b : nullptr;
  lp.target = &target;
  lp.options = &o;
  lp.grads = &g;
  lp.class_weight = wts.empty() ? nullptr : wts.data();
  lp.chunk_rows = chunk_rows(o, p);
  return lp;
}

// Off the CPU the runner takes every host step below (LceParams::device_call); a bad target it found is thrown here.
void run_on_device(const core::Backend& be, core::LceParams& lp, const LinearCrossEntropyOptions& o,
                   const std::optional<TensorView>& grad_loss, const TensorView* loss, const TensorView* z_loss) {
  const CrossEntropyOptions& ce = o.ce;
  core::CeDeviceCall call = core::make_device_call(
      ce.weight, ce.reduction, ce.label_smoothing != 0 || ce.z_loss_scale != 0, grad_loss, loss, z_loss);
  lp.device_call = &call;
  be.linear_cross_entropy(lp);
  if (call.bad_row < 0) return;
  core::RowIndex idx;
  core::set_row_view(idx, 0, *lp.target, -1);
  throw core::bad_target_error(idx, call.bad_row, call.bad_value, lp.problem.V, ce.ignore_index);
}

template <class Acc>
void forward(const core::Backend& be, const Problem& p, const TensorView& x, const TensorView& w,
             const std::optional<TensorView>& b, const TensorView& target, const LinearCrossEntropyOptions& o,
             const CrossEntropyOutputs& out, const LinearCrossEntropyGrads& g) {
  std::vector<Acc> wts;
  if (p.pb.device != Device::cpu) {
    core::LceParams lp = params(p, x, w, b, target, o, g, wts);
    lp.out = &out;
    run_on_device(be, lp, o, std::nullopt, &out.loss, out.z_loss ? &*out.z_loss : nullptr);
    return;
  }
  const Denominator denom = scan<Acc>(p, target, o, wts);
  std::vector<Acc> loss(static_cast<std::size_t>(p.N)), zl(loss.size());
  std::vector<double> lse(loss.size());
  // Upstream gradient 1 on the reduced loss: each row's term carries 1 (none, sum) or 1 / denominator (mean)
  const Acc s = o.ce.reduction == Reduction::mean ? static_cast<Acc>(denom.mean_scale(1.0)) : Acc(1);
  std::vector<Acc> scale(loss.size(), s);
  core::LceParams lp = params(p, x, w, b, target, o, g, wts);
  lp.loss_rows = loss.data();
  lp.z_rows = zl.data();
  lp.lse_rows = lse.data();
  lp.scale = scale.data();
  be.linear_cross_entropy(lp);
  write_reduced(be, out.loss, loss, o.ce.reduction, denom.value);
  if (out.lse && out.lse->dtype == DType::f64) {
    store_rows(be, *out.lse, lse);
  } else if (out.lse) {
    store_rows(be, *out.lse, std::vector<Acc>(lse.begin(), lse.end()));
  }
  if (out.z_loss) write_reduced(be, *out.z_loss, zl, o.ce.reduction, denom.sum);
}

template <class Acc>
void backward(const core::Backend& be, const Problem& p, const TensorView& x, const TensorView& w,
              const std::optional<TensorView>& b, const TensorView& target, const TensorView& lse_in,
              const std::optional<TensorView>& grad_loss, const LinearCrossEntropyOptions& o,
              const LinearCrossEntropyGrads& g) {
  std::vector<Acc> wts;
  if (p.pb.device != Device::cpu) {
    core::LceParams lp = params(p, x, w, b, target, o, g, wts);
    lp.backward = true;
    lp.lse_in = &lse_in;
    lp.grad_loss = grad_loss && o.ce.reduction == Reduction::none ? &*grad_loss : nullptr;
    run_on_device(be, lp, o, grad_loss, nullptr, nullptr);
    return;
  }
  const Denominator denom = scan<Acc>(p, target, o, wts);
  std::vector<double> lse(static_cast<std::size_t>(p.N));
  std::vector<Acc> scale(lse.size());
  const core::HostCopy lse_host(lse_in);
  for (std::int64_t r = 0; r < p.N; ++r) {
    const std::int64_t at = r * lse_in.strides[0];
    lse[r] = lse_in.dtype == DType::f64 ? static_cast<const double*>(lse_host.view().data)[at]
                                        : static_cast<double>(static_cast<const Acc*>(lse_host.view().data)[at]);
  }
  const std::optional<core::HostCopy> gl_host = grad_loss ? std::optional<core::HostCopy>(*grad_loss) : std::nullopt;
  const Acc* gl = gl_host ? static_cast<const Acc*>(gl_host->view().data) : nullptr;
  if (o.ce.reduction == Reduction::none) {
    for (std::int64_t r = 0; r < p.N; ++r) scale[r] = gl ? gl[r * grad_loss->strides[0]] : Acc(1);
  } else {
    const double g0 = gl ? static_cast<double>(*gl) : 1.0;
    const double s = o.ce.reduction == Reduction::mean ? denom.mean_scale(g0) : g0;
    std::fill(scale.begin(), scale.end(), static_cast<Acc>(s));
  }
  core::LceParams lp = params(p, x, w, b, target, o, g, wts);
  lp.backward = true;
  lp.lse_rows = lse.data();
  lp.scale = scale.data();
  be.linear_cross_entropy(lp);
}

// A held gradient as cross_entropy_scale_held's params (CeMode::scale): a 2-D view's rows, or a 1-D view as one row;
// grad_x's rows are the target rows, grad_weight's and grad_bias's pooled over every target.
core::CeParams held_params(const TensorView& g, const TensorView& target, const TensorView& grad_loss,
                           std::int64_t ignore_index, bool pooled) {
  core::CeParams p;
  p.mode = core::CeMode::scale;
  p.dtype = g.dtype;
  p.target_dtype = target.dtype;
  p.target = target.data;
  p.grad = g.data;
  p.grad_loss = grad_loss.data;
  p.grad_loss_uniform = true;
  p.ignore_index = ignore_index;
  if (g.ndim == 2) {
    p.rows = g.shape[0], p.classes = g.shape[1], p.g_cstride = g.strides[1];
    core::set_row_view(p.index, core::kGradRow, g, 1);
  } else {
    p.rows = 1, p.classes = g.shape[0], p.g_cstride = g.strides[0];  // index.ndim 0: row 0 at offset 0
  }
  if (pooled) {
    p.pooled = true;
    p.pooled_targets = target.shape[0];
    p.pooled_stride = target.strides[0];
  } else {
    core::set_row_view(p.index, core::kTargetRow, target, -1);  // the same N rows as grad_x's
  }
  return p;
}

void check_held(const std::optional<TensorView>& g, const char* name, int ndim, DType acc, Device dev,
                std::vector<NamedView>& written) {
  if (!g) return;
  core::check_view(*g, name, dev);
  core::check_floating(*g, name);
  if (accumulate_dtype(g->dtype) != acc) {
    throw Error(ErrorCode::dtype_mismatch, name,
                "a dtype accumulating in " + std::string(dtype_name(acc)) + " (grad_loss's dtype)",
                std::string(dtype_name(g->dtype)));
  }
  if (g->ndim != ndim) {
    throw Error(ErrorCode::shape_mismatch, name, ndim == 2 ? "2 dims" : "1 dim", "shape " + g->shape_string());
  }
  written.push_back({name, &*g});
}

}  // namespace

namespace core {

double lce_class_weight_sum(const LceParams& p) {
  const std::int64_t V = p.problem.V;
  if (p.class_weight == nullptr) return static_cast<double>(V);
  double s = 0;
  for (std::int64_t c = 0; c < V; ++c) {
    s += p.problem.pb.acc == DType::f64 ? static_cast<const double*>(p.class_weight)[c]
                                        : static_cast<double>(static_cast<const float*>(p.class_weight)[c]);
  }
  return s;
}

CeParams lce_chunk_params(const LceParams& p, CeMode mode, std::int64_t r0, std::int64_t rc, void* logits,
                          const void* scale) {
  ClassProblem pb = p.problem.pb;
  pb.rows = rc;
  pb.row_shape[0] = rc;
  const TensorView z = TensorView::contiguous(logits, pb.acc, {rc, p.problem.V}, pb.device);
  TensorView tgt = *p.target;
  tgt.shape[0] = rc;
  if (rc > 0) {
    tgt.data = static_cast<char*>(tgt.data) + r0 * tgt.strides[0] * static_cast<std::int64_t>(dtype_size(tgt.dtype));
  }
  const bool grad = mode != CeMode::forward;
  std::optional<TensorView> gl;
  if (grad && p.device_call == nullptr) {
    const auto* s = static_cast<const char*>(scale) + r0 * static_cast<std::int64_t>(dtype_size(pb.acc));
    gl = TensorView::contiguous(const_cast<char*>(s), pb.acc, {rc}, pb.device);
  } else if (grad && p.grad_loss != nullptr && p.options->ce.reduction == Reduction::none) {
    gl = *p.grad_loss;
    gl->shape[0] = rc;
    if (rc > 0) {
      gl->data = static_cast<char*>(gl->data) + r0 * gl->strides[0] * static_cast<std::int64_t>(dtype_size(pb.acc));
    }
  }
  const CrossEntropyOptions& o = p.options->ce;
  CeParams cp;
  cp.mode = mode;
  fill_layout(cp, pb, z, tgt, grad ? &z : nullptr, gl);
  cp.scale = o.logit_scale;
  cp.softcap = o.softcap;
  cp.eps = o.label_smoothing;
  cp.z_loss_scale = o.z_loss_scale;
  cp.ignore_index = o.ignore_index;
  cp.lse_f64 = true;
  if (p.device_call != nullptr) {
    cp.device_call = p.device_call;
    cp.grad_loss = gl ? gl->data : nullptr;
    return cp;
  }
  cp.weight = p.class_weight;
  cp.sum_w = lce_class_weight_sum(p);
  if (grad) set_grad_scale(cp, Reduction::none, gl, 1.0);
  return cp;
}

}  // namespace core

std::int64_t linear_cross_entropy_chunk_rows(std::int64_t N, std::int64_t Vt, std::int64_t acc_bytes,
                                             const LinearCrossEntropyOptions& o, Device device) {
  if (N <= 0) return 1;
  std::int64_t r = o.chunk_rows;
  if (r <= 0) {
    const std::int64_t row_bytes = std::max<std::int64_t>(1, Vt) * std::max<std::int64_t>(1, acc_bytes);
    if (o.memory_budget > 0) {
      r = o.memory_budget / row_bytes;
    } else if (device == Device::cuda) {
      r = kLinearCeCudaBudget / row_bytes;
    } else {
      constexpr std::int64_t kMinRows = 256, kMaxChunks = 16;
      r = std::max(kLinearCeBaseBudget / row_bytes, std::min(kMinRows, (N + kMaxChunks - 1) / kMaxChunks));
    }
  }
  return std::clamp<std::int64_t>(r, 1, N);
}

void linear_cross_entropy_forward(const TensorView& x, const TensorView& w, const std::optional<TensorView>& b,
                                  const TensorView& target, const LinearCrossEntropyOptions& options,
                                  const CrossEntropyOutputs& out, const LinearCrossEntropyGrads& grads) {
  const core::Backend& be = core::backend_for(x, "x");
  const Problem p = check_problem(x, w, b, target, options);
  std::vector<NamedView> written, read = {{"x", &x}, {"weight", &w}, {"target", &target}};
  if (b) read.push_back({"bias", &*b});
  if (options.ce.weight) read.push_back({"class_weight", &*options.ce.weight});
  core::check_view(out.loss, "loss", p.pb.device);
  core::check_dtype(out.loss, "loss", p.pb.acc);
  core::check_reduced_shape(out.loss, "loss", options.ce.reduction, p.pb.row_shape, 1);
  core::check_contiguous(out.loss, "loss");
  written.push_back({"loss", &out.loss});
  if (out.lse) {
    core::check_lse_view(*out.lse, p.pb);
    written.push_back({"lse", &*out.lse});
  }
  if (out.z_loss) {
    core::check_view(*out.z_loss, "z_loss", p.pb.device);
    core::check_dtype(*out.z_loss, "z_loss", p.pb.acc);
    core::check_reduced_shape(*out.z_loss, "z_loss", options.ce.reduction, p.pb.row_shape, 1);
    core::check_contiguous(*out.z_loss, "z_loss");
    written.push_back({"z_loss", &*out.z_loss});
  }
  check_grads(grads, p, x, w, b, written);
  core::check_disjoint(written, read);
  if (p.pb.acc == DType::f64) {
    forward<double>(be, p, x, w, b, target, options, out, grads);
  } else {
    forward<float>(be, p, x, w, b, target, options, out, grads);
  }
}

void linear_cross_entropy_backward(const TensorView& x, const TensorView& w, const std::optional<TensorView>& b,
                                   const TensorView& target, const TensorView& lse,
                                   const std::optional<TensorView>& grad_loss, const LinearCrossEntropyOptions& options,
                                   const LinearCrossEntropyGrads& grads) {
  const core::Backend& be = core::backend_for(x, "x");
  const Problem p = check_problem(x, w, b, target, options);
  std::vector<NamedView> written, read = {{"x", &x}, {"weight", &w}, {"target", &target}, {"lse", &lse}};
  if (b) read.push_back({"bias", &*b});
  if (options.ce.weight) read.push_back({"class_weight", &*options.ce.weight});
  core::check_view(lse, "lse", p.pb.device);
  core::check_lse_dtype(lse, p.pb);
  core::check_shape(lse, "lse", p.pb.row_shape, 1);
  core::check_grad_loss(grad_loss, p.pb, options.ce.reduction);
  if (grad_loss) read.push_back({"grad_loss", &*grad_loss});
  check_grads(grads, p, x, w, b, written);
  core::check_disjoint(written, read);
  if (p.pb.acc == DType::f64) {
    backward<double>(be, p, x, w, b, target, lse, grad_loss, options, grads);
  } else {
    backward<float>(be, p, x, w, b, target, lse, grad_loss, options, grads);
  }
}

void linear_cross_entropy_scale_held(const LinearCrossEntropyGrads& grads, const TensorView& target,
                                     const LinearCrossEntropyOptions& options, const TensorView& grad_loss) {
  const core::Backend& be = core::backend_for(target, "target");
  const Device dev = target.device;
  check_class_indices(target, dev);
  if (target.ndim != 1) {
    throw Error(ErrorCode::shape_mismatch, "target", "1 dim (N)", "shape " + target.shape_string());
  }
  core::check_reduction(options.ce.reduction);
  if (options.ce.reduction == Reduction::none) {
    throw Error(ErrorCode::invalid_value, "reduction", "mean or sum (held gradients have one upstream value)", "none");
  }
  core::check_view(grad_loss, "grad_loss", dev);
  if (grad_loss.dtype != DType::f32 && grad_loss.dtype != DType::f64) {
    throw Error(ErrorCode::dtype_mismatch, "grad_loss", "float32 or float64 (the accumulation dtype)",
                std::string(dtype_name(grad_loss.dtype)));
  }
  if (grad_loss.numel() != 1) {
    throw Error(ErrorCode::shape_mismatch, "grad_loss", "one element", "shape " + grad_loss.shape_string());
  }
  std::vector<NamedView> written, read = {{"target", &target}, {"grad_loss", &grad_loss}};
  check_held(grads.x, "grad_x", 2, grad_loss.dtype, dev, written);
  check_held(grads.w, "grad_weight", 2, grad_loss.dtype, dev, written);
  check_held(grads.b, "grad_bias", 1, grad_loss.dtype, dev, written);
  if (grads.x && grads.x->shape[0] != target.shape[0]) {
    throw Error(ErrorCode::shape_mismatch, "grad_x",
                "(N, H) with N = " + std::to_string(target.shape[0]) + " (target's)",
                "shape " + grads.x->shape_string());
  }
  if (grads.w && grads.b && grads.b->shape[0] != grads.w->shape[0]) {
    throw Error(ErrorCode::shape_mismatch, "grad_bias", "(" + std::to_string(grads.w->shape[0]) + ") (grad_weight's V)",
                "shape " + grads.b->shape_string());
  }
  core::check_disjoint(written, read);
  // One runner call: a device runner finds every operand on one device before it writes any.
  const std::int64_t ignore = options.ce.ignore_index;
  const std::optional<TensorView>* views[3] = {&grads.x, &grads.w, &grads.b};
  core::CeParams held[3];
  core::LceParams lp;
  for (int i = 0; i < 3; ++i) {
    if (*views[i] && (*views[i])->numel() > 0) {
      held[i] = held_params(**views[i], target, grad_loss, ignore, i > 0);
      lp.held[i] = &held[i];
    }
  }
  if (lp.scales_held()) be.linear_cross_entropy(lp);
}

}  // namespace lossfuse
