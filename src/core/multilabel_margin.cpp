// multilabel_margin entries: checks (every one before any write, every target value scanned first), plain
// params, the CPU kernel, the reduction.
#include "core/margin_problem.hpp"
#include "core/targets.hpp"
#include "cpu/margin_kernels.hpp"
#include "lossfuse/margin.hpp"

namespace lossfuse {
namespace {

void run(bool backward, const TensorView& input, const TensorView& target, const MultilabelMarginOptions& o,
         const TensorView* loss, const std::optional<TensorView>& grad_loss, const TensorView* grad) {
  core::check_reduction(o.reduction);
  core::check_view(input, "input");
  core::check_floating(input, "input");
  core::check_input_ndim(input, "input", 1, 2, "shape (N, C) or (C)");
  const std::int64_t C = input.shape[input.ndim - 1];
  if (C < 1) {
    throw Error(ErrorCode::shape_mismatch, "input", "at least one class in the last dim",
                "shape " + input.shape_string());
  }
  core::check_view(target, "target");
  if (!is_integer(target.dtype)) {
    throw Error(ErrorCode::dtype_mismatch, "target", "class indices of an integer dtype",
                std::string(dtype_name(target.dtype)));
  }
  core::check_shape(target, "target", input.shape.data(), input.ndim);
  const DType acc = accumulate_dtype(input.dtype);
  const int row_ndim = input.ndim - 1;
  core::check_margin_outputs(backward, acc, o.reduction, input.shape.data(), row_ndim, loss, grad_loss,
                             {{"grad_input", grad}}, input, {{"input", &input}, {"target", &target}});

  core::MarginParams p;
  p.backward = backward;
  core::set_margin_rows(p, input);
  p.x[0] = input.data, p.target = target.data, p.target_dtype = target.dtype;
  core::set_margin_view(p, core::kMvX0, input, true);
  core::set_margin_view(p, core::kMvTarget, target, true);
  // torch checks every value, also past the terminating -1: all must lie in [-1, C)
  for (std::int64_t r = 0; r < p.rows; ++r) {
    const std::int64_t off = p.index.offset(core::kMvTarget, r);
    for (std::int64_t c = 0; c < C; ++c) {
      const std::int64_t t = core::read_target(target.data, target.dtype, off + c * p.inner[core::kMvTarget]);
      if (t < -1 || t >= C) {
        const std::string pos = input.ndim == 2 ? std::to_string(r) + ", " + std::to_string(c) : std::to_string(c);
        throw Error(ErrorCode::index_error, "target",
                    "class indices in [0, " + std::to_string(C) + ") or -1 (ends the label list)",
                    std::to_string(t) + " at position [" + pos + "]");
      }
    }
  }
  if (!backward) {
    core::run_margin_forward(p, *loss, o.reduction, cpu::multilabel_margin_rows);
    return;
  }
  if (grad == nullptr) return;  // no gradient asked for: the checks (and the target scan) only
  p.grad[0] = grad->data;
  core::set_margin_view(p, core::kMvG0, *grad, true);
  core::set_margin_grad_scale(p, o.reduction, grad_loss);
  cpu::multilabel_margin_rows(p);
}

}  // namespace

void multilabel_margin_forward(const TensorView& input, const TensorView& target,
                               const MultilabelMarginOptions& options, const TensorView& loss) {
  run(false, input, target, options, &loss, std::nullopt, nullptr);
}

void multilabel_margin_backward(const TensorView& input, const TensorView& target,
                                const std::optional<TensorView>& grad_loss, const MultilabelMarginOptions& options,
                                const std::optional<TensorView>& grad_input) {
  run(true, input, target, options, nullptr, grad_loss, grad_input ? &*grad_input : nullptr);
}

}  // namespace lossfuse
