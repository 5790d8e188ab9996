// Cross-entropy entries: check every argument (nothing is written before all checks pass), fill CeParams,
// run the backend, finish the reduction.
#include "lossfuse/cross_entropy.hpp"

#include <cmath>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/check.hpp"
#include "core/class_problem.hpp"
#include "core/targets.hpp"

namespace lossfuse {
namespace {

using core::CeMode;
using core::NamedView;

// A finite double whose float32 rounding is finite and, for a nonzero value, nonzero.
bool float32_holds(double v) {
  const auto f = static_cast<float>(v);
  return std::isfinite(f) && (v == 0.0 || f != 0.0f);
}

void check_ignore_index(const CrossEntropyOptions& o, bool soft) {
  if (soft && o.ignore_index != -100) {
    throw Error(ErrorCode::invalid_value, "ignore_index", "the default -100 with probability targets",
                std::to_string(o.ignore_index));
  }
}

void check_options(const CrossEntropyOptions& o, bool soft, DType acc) {
  if (!(o.label_smoothing >= 0.0 && o.label_smoothing <= 1.0)) {
    throw Error(ErrorCode::invalid_value, "label_smoothing", "a value in [0, 1]", std::to_string(o.label_smoothing));
  }
  core::check_finite_option(o.logit_scale, "logit_scale");
  if (!(std::isfinite(o.softcap) && o.softcap >= 0.0)) {
    throw Error(ErrorCode::invalid_value, "softcap", "0 (off) or a finite value > 0", std::to_string(o.softcap));
  }
  if (!(std::isfinite(o.z_loss_scale) && o.z_loss_scale >= 0.0)) {
    throw Error(ErrorCode::invalid_value, "z_loss_scale", "a finite value >= 0", std::to_string(o.z_loss_scale));
  }
  check_ignore_index(o, soft);
  if (acc == DType::f32) {
    // The kernels take them in the accumulation dtype: softcap also as its inverse.
    const char* held = "a value that float32 holds (logits other than float64 accumulate in float32)";
    if (!float32_holds(o.logit_scale)) {
      throw Error(ErrorCode::invalid_value, "logit_scale", held, core::number_string(o.logit_scale));
    }
    if (o.softcap > 0 && !(float32_holds(o.softcap) && float32_holds(1.0 / o.softcap))) {
      throw Error(ErrorCode::invalid_value, "softcap",
                  "0 (off) or a value that float32 holds, with its inverse (logits other than float64 accumulate in "
                  "float32)",
                  core::number_string(o.softcap));
    }
    if (!float32_holds(o.z_loss_scale)) {
      throw Error(ErrorCode::invalid_value, "z_loss_scale", held, core::number_string(o.z_loss_scale));
    }
  }
}

template <class Acc>
void run(CeMode mode, const TensorView& logits, const TensorView& target, const CrossEntropyOptions& o,
         const CrossEntropyOutputs* out, const TensorView* lse_in, const std::optional<TensorView>& grad_loss,
         const TensorView* grad, GradWrite write, bool held, const core::ClassProblem& pb) {
  const bool on_device = pb.device != Device::cpu;  // the backend takes the host steps below (CeDeviceCall)
  const std::vector<Acc> weights = core::host_class_weights<Acc>(o.weight, pb);
  const Acc* w = weights.empty() ? nullptr : weights.data();

  std::vector<NamedView> written, read = {{"logits", &logits}, {"target", &target}};
  if (o.weight) read.push_back({"weight", &*o.weight});
  if (out != nullptr) {
    core::check_view(out->loss, "loss", pb.device);
    core::check_dtype(out->loss, "loss", pb.acc);
    core::check_reduced_shape(out->loss, "loss", o.reduction, pb.row_shape, pb.row_ndim);
    core::check_contiguous(out->loss, "loss");
    written.push_back({"loss", &out->loss});
    if (out->lse) {
      core::check_lse_view(*out->lse, pb);
      written.push_back({"lse", &*out->lse});
    }
    if (out->z_loss) {
      core::check_view(*out->z_loss, "z_loss", pb.device);
      core::check_dtype(*out->z_loss, "z_loss", pb.acc);
      core::check_reduced_shape(*out->z_loss, "z_loss", o.reduction, pb.row_shape, pb.row_ndim);
      core::check_contiguous(*out->z_loss, "z_loss");
      written.push_back({"z_loss", &*out->z_loss});
    }
  }
  if (lse_in != nullptr) {
    core::check_lse_view(*lse_in, pb);
    read.push_back({"lse", lse_in});
  }
  if (grad != nullptr) {
    core::check_grad_output(*grad, "grad_logits", logits, "logits", write == GradWrite::in_place);
    core::check_grad_loss(grad_loss, pb, o.reduction);
    if (grad_loss) read.push_back({"grad_loss", &*grad_loss});
    if (write == GradWrite::separate) written.push_back({"grad_logits", grad});
  }
  core::check_disjoint(written, read);
  // cross_entropy_backward_held: at an upstream value of 1 the held gradient stands (a device reads it itself)
  if (held && !on_device && core::read_scalar(*grad_loss) == 1.0) return;
  if (grad != nullptr && write == GradWrite::in_place) {
    // The gradient replaces the logits by request; it must still miss every other buffer.
    for (const NamedView& v : written) core::check_no_overlap(*grad, "grad_logits", *v.view, v.name);
    for (const NamedView& v : read) {
      if (v.view != &logits) core::check_no_overlap(*grad, "grad_logits", *v.view, v.name);
    }
  }

  core::CeParams p;
  p.mode = mode;
  core::fill_layout(p, pb, logits, target, grad, grad_loss);
  p.scale = o.logit_scale;
  p.softcap = o.softcap;
  p.eps = o.label_smoothing;
  p.z_loss_scale = o.z_loss_scale;
  p.ignore_index = o.ignore_index;
  p.lse_in = lse_in != nullptr ? lse_in->data : nullptr;
  if (lse_in != nullptr) p.lse_f64 = lse_in->dtype == DType::f64;
  if (out != nullptr && out->lse) p.lse_f64 = out->lse->dtype == DType::f64;
  if (out != nullptr) {
    if (out->lse) p.lse_rows = out->lse->data;
    if (o.reduction == Reduction::none) {
      p.loss_rows = out->loss.data;
      if (out->z_loss) p.zloss_rows = out->z_loss->data;
    }
  }
  const core::Backend& be = core::backend_for(logits, "logits");
  if (on_device) {
    core::run_device_call(p, be.cross_entropy, o.weight, o.reduction, o.label_smoothing != 0 || o.z_loss_scale != 0,
                          grad != nullptr ? grad_loss : std::nullopt, out != nullptr ? &out->loss : nullptr,
                          out != nullptr && out->z_loss ? &*out->z_loss : nullptr, held);
    return;
  }

  // Targets last: the scan also yields the 'mean' denominator.
  double denominator = static_cast<double>(pb.rows);  // probability targets: mean over rows
  double loss_denominator = denominator;              // the loss's and its gradient's (split_mean_denominator)
  if (!pb.soft) {
    std::int64_t counted = 0, weighted = 0;
    denominator = core::scan_targets<Acc>(core::HostCopy(target).view().data, target.dtype, p.index, core::kTargetRow,
                                          pb.rows, pb.classes, o.ignore_index, w, &counted, &weighted);
    loss_denominator =
        core::split_mean_denominator(denominator, counted, weighted, o.label_smoothing != 0 || o.z_loss_scale != 0);
  }

  p.weight = w;
  p.sum_w = static_cast<double>(pb.classes);
  if (w != nullptr) {
    p.sum_w = 0;
    for (std::int64_t c = 0; c < pb.classes; ++c) p.sum_w += static_cast<double>(w[c]);
  }
  if (grad != nullptr) core::set_grad_scale(p, o.reduction, grad_loss, loss_denominator);

  std::vector<double> block_loss, block_zloss;
  if (out != nullptr && o.reduction != Reduction::none) {
    const std::int64_t blocks = (pb.rows + p.rows_per_block - 1) / p.rows_per_block;
    block_loss.assign(static_cast<std::size_t>(blocks), 0.0);
    block_zloss.assign(static_cast<std::size_t>(blocks), 0.0);
    p.block_loss = block_loss.data();
    p.block_zloss = block_zloss.data();
  }

  be.cross_entropy(p);

  if (out != nullptr && o.reduction != Reduction::none) {
    core::write_reduced(out->loss, block_loss, o.reduction, loss_denominator);
    if (out->z_loss) core::write_reduced(*out->z_loss, block_zloss, o.reduction, denominator);
  }
}

void dispatch(CeMode mode, const TensorView& logits, const TensorView& target, const CrossEntropyOptions& o,
              const CrossEntropyOutputs* out, const TensorView* lse_in, const std::optional<TensorView>& grad_loss,
              const TensorView* grad, GradWrite write, bool held = false) {
  core::backend_for(logits, "logits");  // a device this build has no kernels for is refused before any check
  const core::ClassProblem pb = core::check_class_problem(logits, "logits", target, o.reduction, true);
  check_options(o, pb.soft, pb.acc);
  if (write != GradWrite::separate && write != GradWrite::in_place) {
    throw Error(ErrorCode::invalid_value, "write", "GradWrite::separate or GradWrite::in_place",
                "code " + std::to_string(static_cast<int>(write)));
  }
  if (pb.acc == DType::f64) {
    run<double>(mode, logits, target, o, out, lse_in, grad_loss, grad, write, held, pb);
  } else {
    run<float>(mode, logits, target, o, out, lse_in, grad_loss, grad, write, held, pb);
  }
}

}  // namespace

void cross_entropy_forward(const TensorView& logits, const TensorView& target, const CrossEntropyOptions& options,
                           const CrossEntropyOutputs& out) {
  dispatch(CeMode::forward, logits, target, options, &out, nullptr, std::nullopt, nullptr, GradWrite::separate);
}

void cross_entropy_backward(const TensorView& logits, const TensorView& target, const TensorView& lse,
                            const std::optional<TensorView>& grad_loss, const CrossEntropyOptions& options,
                            const TensorView& grad_logits, GradWrite write) {
  dispatch(CeMode::backward, logits, target, options, nullptr, &lse, grad_loss, &grad_logits, write);
}

void cross_entropy_forward_backward(const TensorView& logits, const TensorView& target,
                                    const CrossEntropyOptions& options, const CrossEntropyOutputs& out,
                                    const std::optional<TensorView>& grad_loss, const TensorView& grad_logits,
                                    GradWrite write) {
  dispatch(CeMode::forward_backward, logits, target, options, &out, nullptr, grad_loss, &grad_logits, write);
}

void cross_entropy_scale_held(const TensorView& grad_logits, const TensorView& target,
                              const CrossEntropyOptions& options, const std::optional<TensorView>& grad_loss) {
  const core::Backend& be = core::backend_for(grad_logits, "grad_logits");
  const core::ClassProblem pb = core::check_class_problem(grad_logits, "grad_logits", target, options.reduction, true);
  check_ignore_index(options, pb.soft);
  core::check_grad_loss(grad_loss, pb, options.reduction);
  std::vector<NamedView> read = {{"target", &target}};
  if (grad_loss) read.push_back({"grad_loss", &*grad_loss});
  core::check_disjoint({{"grad_logits", &grad_logits}}, read);
  if (!grad_loss || pb.rows == 0 || pb.classes == 0) return;  // absent: 1
  core::CeParams p;
  p.mode = CeMode::scale;
  core::fill_layout(p, pb, grad_logits, target, &grad_logits, grad_loss);
  p.grad_loss = grad_loss->data;  // one element for mean / sum: every row's offset is 0 (fill_layout)
  p.grad_loss_uniform = true;
  for (int i = 0; i < p.index.ndim; ++i) p.grad_loss_uniform &= p.index.strides[core::kGradLossRow][i] == 0;
  p.ignore_index = options.ignore_index;
  be.cross_entropy(p);
}

void cross_entropy_backward_held(const TensorView& logits, const TensorView& target, const TensorView& lse,
                                 const TensorView& grad_loss, const CrossEntropyOptions& options,
                                 const TensorView& grad_logits) {
  if (options.reduction == Reduction::none) {
    throw Error(ErrorCode::invalid_value, "reduction", "mean or sum (a held gradient has one upstream value)", "none");
  }
  dispatch(CeMode::backward, logits, target, options, nullptr, &lse, grad_loss, &grad_logits, GradWrite::separate,
           true);
}

}  // namespace lossfuse
