// triplet_margin entries: checks (every one before any write), plain params, the backend's kernel, the reduction.
#include <cmath>

#include "core/backend.hpp"
#include "core/margin_problem.hpp"
#include "lossfuse/margin.hpp"

namespace lossfuse {
namespace {

void run(bool backward, const TensorView& a, const TensorView& pos, const TensorView& neg,
         const TripletMarginOptions& o, const TensorView* loss, const std::optional<TensorView>& grad_loss,
         const std::optional<TensorView>* grads) {
  const core::Backend& be = core::backend_for(a, "anchor");
  core::check_reduction(o.reduction);
  core::check_view(a, "anchor", a.device);
  core::check_floating(a, "anchor");
  core::check_input_ndim(a, "anchor", 1, kMaxDims, "shape (..., D) with at least one dim");
  core::check_same_as(pos, "positive", a);
  core::check_same_as(neg, "negative", a);
  if (std::isnan(o.p) || o.p < 0) {
    throw Error(ErrorCode::invalid_value, "p", "a norm degree p >= 0 (or +inf)", std::to_string(o.p));
  }
  core::check_margin_option(o.margin, "margin");
  core::check_margin_option(o.eps, "eps");
  const DType acc = accumulate_dtype(a.dtype);
  const int row_ndim = a.ndim - 1;
  core::check_margin_outputs(backward, acc, o.reduction, a.shape.data(), row_ndim, loss, grad_loss,
                             {{"grad_anchor", core::ptr(grads[0])},
                              {"grad_positive", core::ptr(grads[1])},
                              {"grad_negative", core::ptr(grads[2])}},
                             a, {{"anchor", &a}, {"positive", &pos}, {"negative", &neg}});

  core::MarginParams p;
  core::MarginDeviceCall call;
  core::start_margin_call(p, call, a.device);
  p.backward = backward;
  core::set_margin_rows(p, a);
  const TensorView* xs[3] = {&a, &pos, &neg};
  for (int i = 0; i < 3; ++i) {
    p.x[i] = xs[i]->data;
    core::set_margin_view(p, core::kMvX0 + i, *xs[i], true);
  }
  p.margin = o.margin, p.p = o.p, p.eps = o.eps, p.swap = o.swap;
  if (!backward) {
    core::run_margin_forward(p, *loss, o.reduction, be.triplet_margin);
    return;
  }
  for (int i = 0; i < 3; ++i) {
    if (!grads[i]) continue;
    p.grad[i] = grads[i]->data;
    core::set_margin_view(p, core::kMvG0 + i, *grads[i], true);
  }
  if (p.grad[0] == nullptr && p.grad[1] == nullptr && p.grad[2] == nullptr) return;
  core::set_margin_grad_scale(p, o.reduction, grad_loss);
  be.triplet_margin(p);
}

}  // namespace

void triplet_margin_forward(const TensorView& anchor, const TensorView& positive, const TensorView& negative,
                            const TripletMarginOptions& options, const TensorView& loss) {
  const std::optional<TensorView> none[3];
  run(false, anchor, positive, negative, options, &loss, std::nullopt, none);
}

void triplet_margin_backward(const TensorView& anchor, const TensorView& positive, const TensorView& negative,
                             const std::optional<TensorView>& grad_loss, const TripletMarginOptions& options,
                             const std::optional<TensorView>& grad_anchor,
                             const std::optional<TensorView>& grad_positive,
                             const std::optional<TensorView>& grad_negative) {
  const std::optional<TensorView> grads[3] = {grad_anchor, grad_positive, grad_negative};
  run(true, anchor, positive, negative, options, nullptr, grad_loss, grads);
}

}  // namespace lossfuse
