// NLL entries: checks shared with cross-entropy (core/class_problem.hpp), then the CPU kernel.
#include "lossfuse/nll.hpp"

#include <vector>

#include "core/backend.hpp"
#include "core/check.hpp"
#include "core/class_problem.hpp"
#include "core/targets.hpp"

namespace lossfuse {
namespace {

template <class Acc>
void run(core::CeMode mode, const TensorView& input, const TensorView& target, const NllOptions& o,
         const TensorView* loss, const std::optional<TensorView>& grad_loss, const TensorView* grad,
         const core::ClassProblem& pb) {
  const bool on_device = pb.device != Device::cpu;  // the backend takes the host steps below (CeDeviceCall)
  const std::vector<Acc> weights = core::host_class_weights<Acc>(o.weight, pb);
  const Acc* w = weights.empty() ? nullptr : weights.data();
  std::vector<core::NamedView> written, read = {{"input", &input}, {"target", &target}};
  if (o.weight) read.push_back({"weight", &*o.weight});
  if (loss != nullptr) {
    core::check_view(*loss, "loss", pb.device);
    core::check_dtype(*loss, "loss", pb.acc);
    core::check_reduced_shape(*loss, "loss", o.reduction, pb.row_shape, pb.row_ndim);
    core::check_contiguous(*loss, "loss");
    written.push_back({"loss", loss});
  }
  if (grad != nullptr) {
    core::check_grad_output(*grad, "grad_input", input, "input", false);
    core::check_grad_loss(grad_loss, pb, o.reduction);
    if (grad_loss) read.push_back({"grad_loss", &*grad_loss});
    written.push_back({"grad_input", grad});
  }
  core::check_disjoint(written, read);

  core::CeParams p;
  p.mode = mode;
  core::fill_layout(p, pb, input, target, grad, grad_loss);
  p.ignore_index = o.ignore_index;
  if (loss != nullptr && o.reduction == Reduction::none) p.loss_rows = loss->data;
  const core::Backend& be = core::backend_for(input, "input");
  if (on_device) {
    core::run_device_call(p, be.nll, o.weight, o.reduction, false, grad != nullptr ? grad_loss : std::nullopt, loss,
                          nullptr);
    return;
  }
  const double denominator = core::scan_targets<Acc>(core::HostCopy(target).view().data, target.dtype, p.index,
                                                     core::kTargetRow, pb.rows, pb.classes, o.ignore_index, w);
  p.weight = w;
  std::vector<double> blocks;
  if (loss != nullptr && o.reduction != Reduction::none) {
    blocks.assign(static_cast<std::size_t>((pb.rows + p.rows_per_block - 1) / p.rows_per_block), 0.0);
    p.block_loss = blocks.data();
  }
  if (grad != nullptr) core::set_grad_scale(p, o.reduction, grad_loss, denominator);
  be.nll(p);
  if (loss != nullptr && o.reduction != Reduction::none) core::write_reduced(*loss, blocks, o.reduction, denominator);
}

void dispatch(core::CeMode mode, const TensorView& input, const TensorView& target, const NllOptions& o,
              const TensorView* loss, const std::optional<TensorView>& grad_loss, const TensorView* grad) {
  core::backend_for(input, "input");  // a device this build has no kernels for is refused before any check
  const core::ClassProblem pb = core::check_class_problem(input, "input", target, o.reduction, false);
  if (pb.acc == DType::f64) {
    run<double>(mode, input, target, o, loss, grad_loss, grad, pb);
  } else {
    run<float>(mode, input, target, o, loss, grad_loss, grad, pb);
  }
}

}  // namespace

void nll_forward(const TensorView& input, const TensorView& target, const NllOptions& options, const TensorView& loss) {
  dispatch(core::CeMode::forward, input, target, options, &loss, std::nullopt, nullptr);
}

void nll_backward(const TensorView& input, const TensorView& target, const std::optional<TensorView>& grad_loss,
                  const NllOptions& options, const TensorView& grad_input) {
  dispatch(core::CeMode::backward, input, target, options, nullptr, grad_loss, &grad_input);
}

}  // namespace lossfuse
