// Cross-entropy and NLL as torch ops. The forward can write the gradient in the same pass (compute_grad), so a
// training step reads the logits once; the backward from the saved log-sum-exp serves reduction 'none' and
// calls that did not ask for the gradient up front.
#include <vector>

#include "binding.hpp"
#include "lossfuse/cross_entropy.hpp"
#include "lossfuse/nll.hpp"

namespace lossfuse::torch_binding {
namespace {

CrossEntropyOptions ce_options(const std::optional<at::Tensor>& weight, std::int64_t red, std::int64_t ignore_index,
                               double label_smoothing, double logit_scale, double softcap, double z_loss_scale) {
  CrossEntropyOptions o;
  o.reduction = reduction(red);
  o.ignore_index = ignore_index;
  o.label_smoothing = label_smoothing;
  o.weight = view(weight, "weight");
  o.logit_scale = logit_scale;
  o.softcap = softcap;
  o.z_loss_scale = z_loss_scale;
  return o;
}

// The per-row shape: the logits' shape without the class dim (dim 1, or 0 when unbatched).
std::vector<std::int64_t> row_shape(const at::Tensor& logits) {
  std::vector<std::int64_t> rows(logits.sizes().begin(), logits.sizes().end());
  if (!rows.empty()) rows.erase(rows.begin() + (rows.size() >= 2 ? 1 : 0));
  return rows;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> cross_entropy(
    const at::Tensor& logits, const at::Tensor& target, const std::optional<at::Tensor>& weight, std::int64_t red,
    std::int64_t ignore_index, double label_smoothing, double logit_scale, double softcap, double z_loss_scale,
    bool compute_grad) {
  const auto rows = row_shape(logits);
  at::Tensor loss = new_loss(logits, rows, red);
  at::Tensor lse = new_acc(logits, rows);
  at::Tensor z_loss = new_loss(logits, rows, red);
  at::Tensor grad = new_grad(logits, compute_grad);
  guarded([&] {
    const auto o = ce_options(weight, red, ignore_index, label_smoothing, logit_scale, softcap, z_loss_scale);
    const CrossEntropyOutputs out{view(loss, "loss"), view(lse, "lse"), view(z_loss, "z_loss")};
    if (compute_grad) {
      cross_entropy_forward_backward(view(logits, "input"), view(target, "target"), o, out, std::nullopt,
                                     view(grad, "grad_input"));
    } else {
      cross_entropy_forward(view(logits, "input"), view(target, "target"), o, out);
    }
  });
  return {loss, lse, z_loss, grad};
}

at::Tensor cross_entropy_backward(const at::Tensor& grad_loss, const at::Tensor& logits, const at::Tensor& target,
                                  const at::Tensor& lse, const std::optional<at::Tensor>& weight, std::int64_t red,
                                  std::int64_t ignore_index, double label_smoothing, double logit_scale,
                                  double softcap, double z_loss_scale) {
  at::Tensor grad = new_grad(logits, true);
  guarded([&] {
    const auto o = ce_options(weight, red, ignore_index, label_smoothing, logit_scale, softcap, z_loss_scale);
    cross_entropy_backward(view(logits, "input"), view(target, "target"), view(lse, "lse"),
                           view(grad_loss, "grad_output"), o, view(grad, "grad_input"));
  });
  return grad;
}

NllOptions nll_options(const std::optional<at::Tensor>& weight, std::int64_t red, std::int64_t ignore_index) {
  NllOptions o;
  o.reduction = reduction(red);
  o.ignore_index = ignore_index;
  o.weight = view(weight, "weight");
  return o;
}

at::Tensor nll_loss(const at::Tensor& input, const at::Tensor& target, const std::optional<at::Tensor>& weight,
                    std::int64_t red, std::int64_t ignore_index) {
  at::Tensor loss = new_loss(input, row_shape(input), red);
  guarded([&] {
    nll_forward(view(input, "input"), view(target, "target"), nll_options(weight, red, ignore_index),
                view(loss, "loss"));
  });
  return loss;
}

at::Tensor nll_loss_backward(const at::Tensor& grad_loss, const at::Tensor& input, const at::Tensor& target,
                             const std::optional<at::Tensor>& weight, std::int64_t red, std::int64_t ignore_index) {
  at::Tensor grad = new_grad(input, true);
  guarded([&] {
    nll_backward(view(input, "input"), view(target, "target"), view(grad_loss, "grad_output"),
                 nll_options(weight, red, ignore_index), view(grad, "grad_input"));
  });
  return grad;
}

}  // namespace
}  // namespace lossfuse::torch_binding

TORCH_LIBRARY_FRAGMENT(lossfuse, m) {
  m.def(
      "cross_entropy(Tensor input, Tensor target, Tensor? weight, int reduction, int ignore_index, "
      "float label_smoothing, float logit_scale, float softcap, float z_loss_scale, bool compute_grad) "
      "-> (Tensor loss, Tensor lse, Tensor z_loss, Tensor grad_input)");
  m.def(
      "cross_entropy_backward(Tensor grad_output, Tensor input, Tensor target, Tensor lse, Tensor? weight, "
      "int reduction, int ignore_index, float label_smoothing, float logit_scale, float softcap, "
      "float z_loss_scale) -> Tensor");
  m.def("nll_loss(Tensor input, Tensor target, Tensor? weight, int reduction, int ignore_index) -> Tensor");
  m.def(
      "nll_loss_backward(Tensor grad_output, Tensor input, Tensor target, Tensor? weight, int reduction, "
      "int ignore_index) -> Tensor");
}

TORCH_LIBRARY_IMPL(lossfuse, CPU, m) {
  using namespace lossfuse::torch_binding;
  m.impl("cross_entropy", &cross_entropy);
  m.impl("cross_entropy_backward", &cross_entropy_backward);
  m.impl("nll_loss", &nll_loss);
  m.impl("nll_loss_backward", &nll_loss_backward);
}
