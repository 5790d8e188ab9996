// The margin and embedding losses as torch ops: triplet_margin_loss, cosine_embedding_loss, multi_margin_loss,
// multilabel_margin_loss, multilabel_soft_margin_loss, each with a backward op that computes only the gradients
// asked for (output_mask; the others come back as empty (0,) tensors).
//
// The ops take what the kernels take (include/lossfuse/margin.hpp): operands of one floating dtype, broadcast
// ones already expanded to the common shape, (C)-shaped class weights. The Python functions
// (python/lossfuse/_margin.py) do torch's promotion, broadcasting and argument checks first.
#include <array>
#include <utility>
#include <vector>

#include "binding.hpp"
#include "lossfuse/margin.hpp"

namespace lossfuse::torch_binding {
namespace {

// torch reports a bad class target of these losses as a RuntimeError ("target out of range"), where
// cross_entropy's is an IndexError: the same exception type here, with lossfuse's message (position and value). Runs on
// `on`'s device, as guarded_on.
template <class F>
void guarded_runtime(const at::Tensor& on, F&& f) {
  const DeviceCall call(on);
  try {
    std::forward<F>(f)();
  } catch (const Error& e) {
    if (e.code() == ErrorCode::index_error) TORCH_CHECK(false, e.what());
    rethrow(e);
  }
}

// The shape without the last dim: the loss rows of the losses computed over the last dim.
std::vector<std::int64_t> rows_of(const at::Tensor& t) {
  std::vector<std::int64_t> rows(t.sizes().begin(), t.sizes().end());
  if (!rows.empty()) rows.pop_back();
  return rows;
}

// ---- triplet_margin_loss ------------------------------------------------------------------------------------

TripletMarginOptions triplet_options(double margin, double p, double eps, bool swap, std::int64_t red) {
  TripletMarginOptions o;
  o.margin = margin;
  o.p = p;
  o.eps = eps;
  o.swap = swap;
  o.reduction = reduction(red);
  return o;
}

at::Tensor triplet_margin_loss(const at::Tensor& anchor, const at::Tensor& positive, const at::Tensor& negative,
                               double margin, double p, double eps, bool swap, std::int64_t red) {
  at::Tensor loss = new_loss(anchor, rows_of(anchor), red);
  guarded_on(anchor, [&] {
    triplet_margin_forward(view(anchor, "anchor"), view(positive, "positive"), view(negative, "negative"),
                           triplet_options(margin, p, eps, swap, red), view(loss, "loss"));
  });
  return loss;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> triplet_margin_loss_backward(
    const at::Tensor& grad_output, const at::Tensor& anchor, const at::Tensor& positive, const at::Tensor& negative,
    double margin, double p, double eps, bool swap, std::int64_t red, std::array<bool, 3> output_mask) {
  const BackwardChecks checked;
  at::Tensor ga = new_grad(anchor, output_mask[0]);
  at::Tensor gp = new_grad(positive, output_mask[1]);
  at::Tensor gn = new_grad(negative, output_mask[2]);
  guarded_on(anchor, [&] {
    triplet_margin_backward(view(anchor, "anchor"), view(positive, "positive"), view(negative, "negative"),
                            view(grad_output, "grad_output"), triplet_options(margin, p, eps, swap, red),
                            grad_view(ga, output_mask[0], "grad_anchor"),
                            grad_view(gp, output_mask[1], "grad_positive"),
                            grad_view(gn, output_mask[2], "grad_negative"));
  });
  return {ga, gp, gn};
}

// ---- cosine_embedding_loss ----------------------------------------------------------------------------------

CosineEmbeddingOptions cosine_options(double margin, std::int64_t red) {
  CosineEmbeddingOptions o;
  o.margin = margin;
  o.reduction = reduction(red);
  return o;
}

at::Tensor cosine_embedding_loss(const at::Tensor& input1, const at::Tensor& input2, const at::Tensor& target,
                                 double margin, std::int64_t red) {
  at::Tensor loss = new_loss(input1, rows_of(input1), red);
  guarded_on(input1, [&] {
    cosine_embedding_forward(view(input1, "input1"), view(input2, "input2"), view(target, "target"),
                             cosine_options(margin, red), view(loss, "loss"));
  });
  return loss;
}

std::tuple<at::Tensor, at::Tensor> cosine_embedding_loss_backward(const at::Tensor& grad_output,
                                                                  const at::Tensor& input1, const at::Tensor& input2,
                                                                  const at::Tensor& target, double margin,
                                                                  std::int64_t red, std::array<bool, 2> output_mask) {
  const BackwardChecks checked;
  at::Tensor g1 = new_grad(input1, output_mask[0]);
  at::Tensor g2 = new_grad(input2, output_mask[1]);
  guarded_on(input1, [&] {
    cosine_embedding_backward(view(input1, "input1"), view(input2, "input2"), view(target, "target"),
                              view(grad_output, "grad_output"), cosine_options(margin, red),
                              grad_view(g1, output_mask[0], "grad_input1"),
                              grad_view(g2, output_mask[1], "grad_input2"));
  });
  return {g1, g2};
}

// ---- multi_margin_loss --------------------------------------------------------------------------------------

MultiMarginOptions multi_margin_options(std::int64_t p, double margin, const std::optional<at::Tensor>& weight,
                                        std::int64_t red) {
  MultiMarginOptions o;
  TORCH_CHECK_VALUE(p == 1 || p == 2, "lossfuse: multi_margin_loss: p: expected 1 or 2, got ", p);
  o.p = static_cast<int>(p);
  o.margin = margin;
  o.weight = view(weight, "weight");
  o.reduction = reduction(red);
  return o;
}

at::Tensor multi_margin_loss(const at::Tensor& input, const at::Tensor& target, const std::optional<at::Tensor>& weight,
                             std::int64_t p, double margin, std::int64_t red) {
  at::Tensor loss = new_loss(input, target.sizes(), red);  // the loss rows have the target's shape
  guarded_runtime(input, [&] {
    multi_margin_forward(view(input, "input"), view(target, "target"), multi_margin_options(p, margin, weight, red),
                         view(loss, "loss"));
  });
  return loss;
}

at::Tensor multi_margin_loss_backward(const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& target,
                                      const std::optional<at::Tensor>& weight, std::int64_t p, double margin,
                                      std::int64_t red) {
  const BackwardChecks checked;
  at::Tensor grad = new_grad(input, true);
  guarded_runtime(input, [&] {
    multi_margin_backward(view(input, "input"), view(target, "target"), view(grad_output, "grad_output"),
                          multi_margin_options(p, margin, weight, red), view(grad, "grad_input"));
  });
  return grad;
}

// ---- multilabel_margin_loss ---------------------------------------------------------------------------------

MultilabelMarginOptions multilabel_margin_options(std::int64_t red) {
  MultilabelMarginOptions o;
  o.reduction = reduction(red);
  return o;
}

at::Tensor multilabel_margin_loss(const at::Tensor& input, const at::Tensor& target, std::int64_t red) {
  at::Tensor loss = new_loss(input, rows_of(input), red);
  guarded_runtime(input, [&] {
    multilabel_margin_forward(view(input, "input"), view(target, "target"), multilabel_margin_options(red),
                              view(loss, "loss"));
  });
  return loss;
}

at::Tensor multilabel_margin_loss_backward(const at::Tensor& grad_output, const at::Tensor& input,
                                           const at::Tensor& target, std::int64_t red) {
  const BackwardChecks checked;
  at::Tensor grad = new_grad(input, true);
  guarded_runtime(input, [&] {
    multilabel_margin_backward(view(input, "input"), view(target, "target"), view(grad_output, "grad_output"),
                               multilabel_margin_options(red), view(grad, "grad_input"));
  });
  return grad;
}

// ---- multilabel_soft_margin_loss ----------------------------------------------------------------------------

MultilabelSoftMarginOptions multilabel_soft_margin_options(const std::optional<at::Tensor>& weight, std::int64_t red) {
  MultilabelSoftMarginOptions o;
  o.weight = view(weight, "weight");
  o.reduction = reduction(red);
  return o;
}

at::Tensor multilabel_soft_margin_loss(const at::Tensor& input, const at::Tensor& target,
                                       const std::optional<at::Tensor>& weight, std::int64_t red) {
  at::Tensor loss = new_loss(input, rows_of(input), red);
  guarded_on(input, [&] {
    multilabel_soft_margin_forward(view(input, "input"), view(target, "target"),
                                   multilabel_soft_margin_options(weight, red), view(loss, "loss"));
  });
  return loss;
}

std::tuple<at::Tensor, at::Tensor> multilabel_soft_margin_loss_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& target,
    const std::optional<at::Tensor>& weight, std::int64_t red, std::array<bool, 2> output_mask) {
  const BackwardChecks checked;
  at::Tensor gx = new_grad(input, output_mask[0]);
  at::Tensor gt = new_grad(target, output_mask[1]);
  guarded_on(input, [&] {
    multilabel_soft_margin_backward(view(input, "input"), view(target, "target"), view(grad_output, "grad_output"),
                                    multilabel_soft_margin_options(weight, red),
                                    grad_view(gx, output_mask[0], "grad_input"),
                                    grad_view(gt, output_mask[1], "grad_target"));
  });
  return {gx, gt};
}

}  // namespace
}  // namespace lossfuse::torch_binding

TORCH_LIBRARY_FRAGMENT(lossfuse, m) {
  m.def(
      "triplet_margin_loss(Tensor anchor, Tensor positive, Tensor negative, float margin, float p, float eps, "
      "bool swap, int reduction) -> Tensor");
  m.def(
      "triplet_margin_loss_backward(Tensor grad_output, Tensor anchor, Tensor positive, Tensor negative, "
      "float margin, float p, float eps, bool swap, int reduction, bool[3] output_mask) -> (Tensor, Tensor, Tensor)");
  m.def("cosine_embedding_loss(Tensor input1, Tensor input2, Tensor target, float margin, int reduction) -> Tensor");
  m.def(
      "cosine_embedding_loss_backward(Tensor grad_output, Tensor input1, Tensor input2, Tensor target, "
      "float margin, int reduction, bool[2] output_mask) -> (Tensor, Tensor)");
  m.def(
      "multi_margin_loss(Tensor input, Tensor target, Tensor? weight, int p, float margin, int reduction) "
      "-> Tensor");
  m.def(
      "multi_margin_loss_backward(Tensor grad_output, Tensor input, Tensor target, Tensor? weight, int p, "
      "float margin, int reduction) -> Tensor");
  m.def("multilabel_margin_loss(Tensor input, Tensor target, int reduction) -> Tensor");
  m.def(
      "multilabel_margin_loss_backward(Tensor grad_output, Tensor input, Tensor target, int reduction) "
      "-> Tensor");
  m.def("multilabel_soft_margin_loss(Tensor input, Tensor target, Tensor? weight, int reduction) -> Tensor");
  m.def(
      "multilabel_soft_margin_loss_backward(Tensor grad_output, Tensor input, Tensor target, Tensor? weight, "
      "int reduction, bool[2] output_mask) -> (Tensor, Tensor)");
}

namespace lossfuse::torch_binding {
namespace {

void register_kernels(torch::Library& m) {
  m.impl("triplet_margin_loss", &triplet_margin_loss);
  m.impl("triplet_margin_loss_backward", &triplet_margin_loss_backward);
  m.impl("cosine_embedding_loss", &cosine_embedding_loss);
  m.impl("cosine_embedding_loss_backward", &cosine_embedding_loss_backward);
  m.impl("multi_margin_loss", &multi_margin_loss);
  m.impl("multi_margin_loss_backward", &multi_margin_loss_backward);
  m.impl("multilabel_margin_loss", &multilabel_margin_loss);
  m.impl("multilabel_margin_loss_backward", &multilabel_margin_loss_backward);
  m.impl("multilabel_soft_margin_loss", &multilabel_soft_margin_loss);
  m.impl("multilabel_soft_margin_loss_backward", &multilabel_soft_margin_loss_backward);
}

}  // namespace
}  // namespace lossfuse::torch_binding

LOSSFUSE_DEVICE_KERNELS(lossfuse::torch_binding::register_kernels)
