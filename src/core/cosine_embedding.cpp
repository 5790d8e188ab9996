// cosine_embedding entries: checks (every one before any write), plain params, the backend's kernel, the reduction.
#include "core/backend.hpp"
#include "core/margin_problem.hpp"
#include "lossfuse/margin.hpp"

namespace lossfuse {
namespace {

void run(bool backward, const TensorView& x1, const TensorView& x2, const TensorView& target,
         const CosineEmbeddingOptions& o, const TensorView* loss, const std::optional<TensorView>& grad_loss,
         const std::optional<TensorView>& g1, const std::optional<TensorView>& g2) {
  const core::Backend& be = core::backend_for(x1, "x1");
  core::check_reduction(o.reduction);
  core::check_view(x1, "x1", x1.device);
  core::check_floating(x1, "x1");
  core::check_input_ndim(x1, "x1", 1, 2, "shape (N, D) or (D)");
  core::check_same_as(x2, "x2", x1);
  core::check_view(target, "target", x1.device);
  if (is_floating(target.dtype) && target.dtype != x1.dtype) {
    throw Error(ErrorCode::dtype_mismatch, "target",
                "an integer dtype or the inputs' dtype " + std::string(dtype_name(x1.dtype)),
                std::string(dtype_name(target.dtype)));
  }
  // (N, D) inputs take a (N) target, (D) inputs a 0-d one (torch: "0D or 1D target tensor expected")
  core::check_shape(target, "target", x1.shape.data(), x1.ndim - 1);
  core::check_margin_option(o.margin, "margin");
  const DType acc = accumulate_dtype(x1.dtype);
  const int row_ndim = x1.ndim - 1;
  core::check_margin_outputs(backward, acc, o.reduction, x1.shape.data(), row_ndim, loss, grad_loss,
                             {{"grad_x1", core::ptr(g1)}, {"grad_x2", core::ptr(g2)}}, x1,
                             {{"x1", &x1}, {"x2", &x2}, {"target", &target}});

  core::MarginParams p;
  core::MarginDeviceCall call;
  core::start_margin_call(p, call, x1.device);
  p.backward = backward;
  core::set_margin_rows(p, x1);
  p.x[0] = x1.data, p.x[1] = x2.data, p.target = target.data, p.target_dtype = target.dtype;
  core::set_margin_view(p, core::kMvX0, x1, true);
  core::set_margin_view(p, core::kMvX1, x2, true);
  core::set_margin_view(p, core::kMvTarget, target, false);
  p.margin = o.margin;
  if (!backward) {
    core::run_margin_forward(p, *loss, o.reduction, be.cosine_embedding);
    return;
  }
  if (g1) p.grad[0] = g1->data, core::set_margin_view(p, core::kMvG0, *g1, true);
  if (g2) p.grad[1] = g2->data, core::set_margin_view(p, core::kMvG1, *g2, true);
  if (!g1 && !g2) return;
  core::set_margin_grad_scale(p, o.reduction, grad_loss);
  be.cosine_embedding(p);
}

}  // namespace

void cosine_embedding_forward(const TensorView& x1, const TensorView& x2, const TensorView& target,
                              const CosineEmbeddingOptions& options, const TensorView& loss) {
  run(false, x1, x2, target, options, &loss, std::nullopt, std::nullopt, std::nullopt);
}

void cosine_embedding_backward(const TensorView& x1, const TensorView& x2, const TensorView& target,
                               const std::optional<TensorView>& grad_loss, const CosineEmbeddingOptions& options,
                               const std::optional<TensorView>& grad_x1, const std::optional<TensorView>& grad_x2) {
  run(true, x1, x2, target, options, nullptr, grad_loss, grad_x1, grad_x2);
}

}  // namespace lossfuse
