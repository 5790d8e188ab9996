#include "core/class_problem.hpp"

#include <string>

#include "core/backend.hpp"
#include "core/check.hpp"
#include "core/targets.hpp"

namespace lossfuse::core {

ClassProblem check_class_problem(const TensorView& input, std::string_view input_name, const TensorView& target,
                                 Reduction reduction, bool allow_soft) {
  check_reduction(reduction);
  check_view(input, input_name, input.device);  // the caller resolved backend_for(input) first
  check_floating(input, input_name);
  if (input.ndim < 1) {
    throw Error(ErrorCode::shape_mismatch, std::string(input_name), "shape (C), (N, C) or (N, C, d1, ..., dk)",
                "a 0-d tensor");
  }
  ClassProblem pb;
  pb.device = input.device;
  pb.acc = accumulate_dtype(input.dtype);
  pb.class_dim = input.ndim == 1 ? 0 : 1;
  pb.classes = input.shape[pb.class_dim];
  if (pb.classes < 1) {
    throw Error(ErrorCode::shape_mismatch, std::string(input_name),
                "at least one class in dim " + std::to_string(pb.class_dim), "shape " + input.shape_string());
  }
  pb.rows = 1;
  for (int i = 0; i < input.ndim; ++i) {
    if (i == pb.class_dim) continue;
    pb.row_shape[pb.row_ndim++] = input.shape[i];
    pb.rows *= input.shape[i];
  }
  check_view(target, "target", pb.device);
  if (is_floating(target.dtype)) {
    if (!allow_soft) {
      throw Error(ErrorCode::dtype_mismatch, "target", "class indices of an integer dtype",
                  std::string(dtype_name(target.dtype)));
    }
    if (target.dtype != input.dtype) {
      throw Error(ErrorCode::dtype_mismatch, "target",
                  "class indices of an integer dtype, or probabilities of the " + std::string(input_name) + "' dtype " +
                      std::string(dtype_name(input.dtype)),
                  std::string(dtype_name(target.dtype)));
    }
    check_shape(target, "target", input.shape.data(), input.ndim);
    pb.soft = true;
  } else {
    check_shape(target, "target", pb.row_shape, pb.row_ndim);
  }
  return pb;
}

void check_grad_output(const TensorView& grad, std::string_view grad_name, const TensorView& input,
                       std::string_view input_name, bool in_place) {
  check_view(grad, grad_name, input.device);
  check_dtype(grad, grad_name, input.dtype);
  check_shape(grad, grad_name, input.shape.data(), input.ndim);
  if (in_place) {
    bool same = grad.data == input.data;
    for (int i = 0; same && i < input.ndim; ++i) same = grad.strides[i] == input.strides[i] || input.shape[i] <= 1;
    if (!same) {
      throw Error(ErrorCode::bad_pointer, std::string(grad_name),
                  "the " + std::string(input_name) + "' own buffer and strides for GradWrite::in_place",
                  "a different buffer or strides");
    }
    check_no_self_overlap(grad, grad_name);  // the logits are written: rows sharing memory would race
  } else {
    check_no_overlap(grad, grad_name, input, input_name);
  }
}

void check_grad_loss(const std::optional<TensorView>& grad_loss, const ClassProblem& pb, Reduction reduction) {
  if (!grad_loss) return;
  check_view(*grad_loss, "grad_loss", pb.device);
  check_dtype(*grad_loss, "grad_loss", pb.acc);
  check_reduced_shape(*grad_loss, "grad_loss", reduction, pb.row_shape, pb.row_ndim);
}

void check_row_output(const TensorView& t, std::string_view name, const ClassProblem& pb) {
  check_view(t, name, pb.device);
  check_dtype(t, name, pb.acc);
  check_shape(t, name, pb.row_shape, pb.row_ndim);
  check_contiguous(t, name);
}

void check_lse_dtype(const TensorView& t, const ClassProblem& pb) {
  if (t.dtype != pb.acc && t.dtype != DType::f64) {
    throw Error(ErrorCode::dtype_mismatch, "lse", std::string(dtype_name(pb.acc)) + " or float64",
                std::string(dtype_name(t.dtype)));
  }
}

void check_lse_view(const TensorView& t, const ClassProblem& pb) {
  check_view(t, "lse", pb.device);
  check_lse_dtype(t, pb);
  check_shape(t, "lse", pb.row_shape, pb.row_ndim);
  check_contiguous(t, "lse");
}

void check_disjoint(const std::vector<NamedView>& written, const std::vector<NamedView>& read) {
  for (const NamedView& w : written) check_no_self_overlap(*w.view, w.name);
  for (std::size_t i = 0; i < written.size(); ++i) {
    for (std::size_t j = i + 1; j < written.size(); ++j) {
      check_no_overlap(*written[i].view, written[i].name, *written[j].view, written[j].name);
    }
    for (const NamedView& r : read) check_no_overlap(*written[i].view, written[i].name, *r.view, r.name);
  }
}

void fill_layout(CeParams& p, const ClassProblem& pb, const TensorView& input, const TensorView& target,
                 const TensorView* grad, const std::optional<TensorView>& grad_loss) {
  p.dtype = input.dtype;
  p.target_dtype = target.dtype;
  p.soft = pb.soft;
  p.logits = input.data;
  p.target = target.data;
  p.rows = pb.rows;
  p.classes = pb.classes;
  p.x_cstride = input.strides[pb.class_dim];
  set_row_view(p.index, kLogitsRow, input, pb.class_dim);
  set_row_view(p.index, kTargetRow, target, pb.soft ? pb.class_dim : -1);
  if (pb.soft) p.t_cstride = target.strides[pb.class_dim];
  if (grad != nullptr) {
    p.grad = grad->data;
    p.g_cstride = grad->strides[pb.class_dim];
    set_row_view(p.index, kGradRow, *grad, pb.class_dim);
  }
  if (grad_loss && grad_loss->numel() > 1) set_row_view(p.index, kGradLossRow, *grad_loss, -1);
  // rows of a 0-d / one-element view all map to offset 0 through zero strides
  for (int v = 0; v < kMaxViews; ++v) {
    for (int i = 0; i < p.index.ndim; ++i) {
      if (p.index.sizes[i] == 1) p.index.strides[v][i] = 0;
    }
  }
  // Heavy rows get a block each; light rows are grouped so a block is ~4K elements. Depends on the problem
  // only, so the reduction order does not change with the thread count.
  p.rows_per_block = pb.classes >= 4096 ? 1 : (4096 + pb.classes - 1) / pb.classes;
}

double read_scalar(const TensorView& t) {
  const HostCopy host(t);
  return t.dtype == DType::f64 ? *static_cast<const double*>(host.view().data)
                               : static_cast<double>(*static_cast<const float*>(host.view().data));
}

void set_grad_scale(CeParams& p, Reduction reduction, const std::optional<TensorView>& grad_loss, double denominator) {
  if (reduction == Reduction::none) {
    p.grad_loss = grad_loss ? grad_loss->data : nullptr;
    return;
  }
  p.grad_scale = grad_loss ? read_scalar(*grad_loss) : 1.0;
  if (reduction == Reduction::mean) p.grad_scale /= denominator;
}

CeDeviceCall make_device_call(const std::optional<TensorView>& weight, Reduction reduction, bool split_mean,
                              const std::optional<TensorView>& grad_loss, const TensorView* loss,
                              const TensorView* z_loss) {
  CeDeviceCall call;
  if (weight) {
    call.weight = weight->data;
    call.weight_dtype = weight->dtype;
    call.weight_stride = weight->strides[0];
  }
  call.reduction = reduction;
  call.split_mean = split_mean;
  if (reduction != Reduction::none) {
    call.grad_scalar = grad_loss ? grad_loss->data : nullptr;
    call.loss = loss != nullptr ? loss->data : nullptr;
    call.z_loss = z_loss != nullptr ? z_loss->data : nullptr;
  }
  return call;
}

void run_device_call(CeParams& p, void (*entry)(const CeParams&), const std::optional<TensorView>& weight,
                     Reduction reduction, bool split_mean, const std::optional<TensorView>& grad_loss,
                     const TensorView* loss, const TensorView* z_loss, bool held) {
  CeDeviceCall call = make_device_call(weight, reduction, split_mean, grad_loss, loss, z_loss);
  call.held = held;
  if (reduction == Reduction::none) p.grad_loss = grad_loss ? grad_loss->data : nullptr;
  p.device_call = &call;
  entry(p);
  p.device_call = nullptr;
  if (call.bad_row >= 0) throw bad_target_error(p.index, call.bad_row, call.bad_value, p.classes, p.ignore_index);
}

void write_reduced(const TensorView& out, const std::vector<double>& blocks, Reduction reduction, double denominator) {
  double total = 0;
  for (double b : blocks) total += b;
  // 'mean' of nothing is 0 / 0 = nan, PyTorch's rule (also when every target is ignored).
  if (reduction == Reduction::mean) total /= denominator;
  const Backend& b = backend_for(out, "loss");
  if (out.dtype == DType::f64) {
    b.from_host(out.data, &total, sizeof total);
  } else {
    const auto f = static_cast<float>(total);
    b.from_host(out.data, &f, sizeof f);
  }
}

}  // namespace lossfuse::core
