// multilabel_soft_margin entries: checks (every one before any write), plain params, the backend's
// kernel, the reduction.
#include <utility>

#include "core/backend.hpp"
#include "core/margin_problem.hpp"
#include "lossfuse/margin.hpp"

namespace lossfuse {
namespace {

template <class Acc>
void run(bool backward, const TensorView& input, const TensorView& target, const MultilabelSoftMarginOptions& o,
         const TensorView* loss, const std::optional<TensorView>& grad_loss, const std::optional<TensorView>& gx,
         const std::optional<TensorView>& gt) {
  const core::Backend& be = core::backend_for(input, "input");
  const std::int64_t C = input.shape[input.ndim - 1];
  core::MarginParams p;
  core::MarginDeviceCall call;
  std::vector<Acc> weights;
  core::start_margin_call<Acc>(p, call, input.device, o.weight, C, weights);
  const DType acc = accumulate_dtype(input.dtype);
  const int row_ndim = input.ndim - 1;
  std::vector<core::NamedView> read = {{"input", &input}, {"target", &target}};
  if (o.weight) read.push_back({"weight", &*o.weight});
  core::check_margin_outputs(backward, acc, o.reduction, input.shape.data(), row_ndim, loss, grad_loss,
                             {{"grad_input", core::ptr(gx)}, {"grad_target", core::ptr(gt)}}, input, std::move(read));

  p.backward = backward;
  core::set_margin_rows(p, input);
  p.x[0] = input.data, p.target = target.data, p.target_dtype = target.dtype;
  core::set_margin_view(p, core::kMvX0, input, true);
  core::set_margin_view(p, core::kMvTarget, target, true);
  if (!backward) {
    core::run_margin_forward(p, *loss, o.reduction, be.multilabel_soft_margin);
    return;
  }
  if (gx) p.grad[0] = gx->data, core::set_margin_view(p, core::kMvG0, *gx, true);
  if (gt) p.grad[1] = gt->data, core::set_margin_view(p, core::kMvG1, *gt, true);
  if (!gx && !gt) return;
  core::set_margin_grad_scale(p, o.reduction, grad_loss);
  be.multilabel_soft_margin(p);
}

void dispatch(bool backward, const TensorView& input, const TensorView& target, const MultilabelSoftMarginOptions& o,
              const TensorView* loss, const std::optional<TensorView>& grad_loss, const std::optional<TensorView>& gx,
              const std::optional<TensorView>& gt) {
  core::backend_for(input, "input");  // a device this build has no kernels for is refused before any check
  core::check_reduction(o.reduction);
  core::check_view(input, "input", input.device);
  core::check_floating(input, "input");
  core::check_input_ndim(input, "input", 1, kMaxDims, "shape (..., C) with at least one dim");
  core::check_view(target, "target", input.device);
  core::check_dtype(target, "target", input.dtype);
  core::check_shape(target, "target", input.shape.data(), input.ndim);
  if (accumulate_dtype(input.dtype) == DType::f64) {
    run<double>(backward, input, target, o, loss, grad_loss, gx, gt);
  } else {
    run<float>(backward, input, target, o, loss, grad_loss, gx, gt);
  }
}

}  // namespace

void multilabel_soft_margin_forward(const TensorView& input, const TensorView& target,
                                    const MultilabelSoftMarginOptions& options, const TensorView& loss) {
  dispatch(false, input, target, options, &loss, std::nullopt, std::nullopt, std::nullopt);
}

void multilabel_soft_margin_backward(const TensorView& input, const TensorView& target,
                                     const std::optional<TensorView>& grad_loss,
                                     const MultilabelSoftMarginOptions& options,
                                     const std::optional<TensorView>& grad_input,
                                     const std::optional<TensorView>& grad_target) {
  dispatch(true, input, target, options, nullptr, grad_loss, grad_input, grad_target);
}

}  // namespace lossfuse
