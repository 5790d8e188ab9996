// multi_margin entries: checks (every one before any write, targets scanned first), plain params, the
// backend's kernel, the reduction.
#include <utility>

#include "core/backend.hpp"
#include "core/margin_problem.hpp"
#include "core/targets.hpp"
#include "lossfuse/margin.hpp"

namespace lossfuse {
namespace {

Error bad_target(std::int64_t classes, std::int64_t value, std::int64_t row) {
  return {ErrorCode::index_error, "target", "a class index in [0, " + std::to_string(classes) + ")",
          std::to_string(value) + " at position [" + std::to_string(row) + "]"};
}

template <class Acc>
void run(bool backward, const TensorView& input, const TensorView& target, const MultiMarginOptions& o,
         const TensorView* loss, const std::optional<TensorView>& grad_loss, const TensorView* grad) {
  const core::Backend& be = core::backend_for(input, "input");
  const std::int64_t C = input.shape[input.ndim - 1];
  core::MarginParams p;
  core::MarginDeviceCall call;
  std::vector<Acc> weights;
  core::start_margin_call<Acc>(p, call, input.device, o.weight, C, weights);
  const DType acc = accumulate_dtype(input.dtype);
  std::vector<core::NamedView> read = {{"input", &input}, {"target", &target}};
  if (o.weight) read.push_back({"weight", &*o.weight});
  // the loss rows have the target's shape: (N), () or (1)
  core::check_margin_outputs(backward, acc, o.reduction, target.shape.data(), target.ndim, loss, grad_loss,
                             {{"grad_input", grad}}, input, std::move(read));

  p.backward = backward;
  core::set_margin_rows(p, input);
  p.x[0] = input.data, p.target = target.data, p.target_dtype = target.dtype;
  core::set_margin_view(p, core::kMvX0, input, true);
  if (input.ndim == 2) core::set_margin_view(p, core::kMvTarget, target, false);
  if (p.device_call != nullptr) {
    call.check = core::MarginCheck::class_index;  // scanned by the backend on its device
  } else {
    for (std::int64_t r = 0; r < p.rows; ++r) {
      const std::int64_t t = core::read_target(target.data, target.dtype, p.index.offset(core::kMvTarget, r));
      if (t < 0 || t >= C) throw bad_target(C, t, r);
    }
  }
  p.margin = o.margin, p.p = o.p;
  core::run_class_target_call(p, backward, loss, o.reduction, grad_loss, grad, be.multi_margin);
  if (call.bad_row >= 0) throw bad_target(C, call.bad_value, call.bad_row);
}

void dispatch(bool backward, const TensorView& input, const TensorView& target, const MultiMarginOptions& o,
              const TensorView* loss, const std::optional<TensorView>& grad_loss, const TensorView* grad) {
  core::backend_for(input, "input");  // a device this build has no kernels for is refused before any check
  core::check_reduction(o.reduction);
  core::check_view(input, "input", input.device);
  core::check_floating(input, "input");
  core::check_input_ndim(input, "input", 1, 2, "shape (N, C) or (C)");
  if (input.shape[input.ndim - 1] < 1) {
    throw Error(ErrorCode::shape_mismatch, "input", "at least one class in the last dim",
                "shape " + input.shape_string());
  }
  core::check_view(target, "target", input.device);
  if (!is_integer(target.dtype)) {
    throw Error(ErrorCode::dtype_mismatch, "target", "class indices of an integer dtype",
                std::string(dtype_name(target.dtype)));
  }
  if (input.ndim == 2) {
    core::check_shape(target, "target", input.shape.data(), 1);
  } else if (!(target.ndim == 0 || (target.ndim == 1 && target.shape[0] == 1))) {
    throw Error(ErrorCode::shape_mismatch, "target", "shape () or (1) for a (C) input",
                "shape " + target.shape_string());
  }
  if (o.p != 1 && o.p != 2) {
    throw Error(ErrorCode::invalid_value, "p", "1 or 2 (torch: only p == 1 and p == 2 supported)", std::to_string(o.p));
  }
  core::check_margin_option(o.margin, "margin");
  if (accumulate_dtype(input.dtype) == DType::f64) {
    run<double>(backward, input, target, o, loss, grad_loss, grad);
  } else {
    run<float>(backward, input, target, o, loss, grad_loss, grad);
  }
}

}  // namespace

void multi_margin_forward(const TensorView& input, const TensorView& target, const MultiMarginOptions& options,
                          const TensorView& loss) {
  dispatch(false, input, target, options, &loss, std::nullopt, nullptr);
}

void multi_margin_backward(const TensorView& input, const TensorView& target,
                           const std::optional<TensorView>& grad_loss, const MultiMarginOptions& options,
                           const std::optional<TensorView>& grad_input) {
  dispatch(true, input, target, options, nullptr, grad_loss, grad_input ? &*grad_input : nullptr);
}

}  // namespace lossfuse
