// The elementwise losses as torch ops: mse_loss, l1_loss, smooth_l1_loss, huber_loss, kl_div,
// hinge_embedding_loss, margin_ranking_loss, each with a backward op that writes only the gradients its
// output_mask asks for (the others come back as empty (0,) tensors).
//
// The operands reach the ops already promoted to one floating dtype and broadcast to one shape (expanded views
// with stride 0 where torch broadcasts); the Python side does both, so that autograd sums the gradients of
// broadcast operands back to their shapes.
#include <array>
#include <tuple>

#include "binding.hpp"
#include "lossfuse/pointwise.hpp"

namespace lossfuse::torch_binding {
namespace {

// ---- helpers for any elementwise loss (shareable) ---------------------------------------------------------------

// Runs `kernel(grads)` with new gradient tensors for the operands the mask asks for (each of its operand's shape
// and dtype, contiguous) and empty (0,) tensors for the others.
template <std::size_t N, class Kernel>
std::array<at::Tensor, N> run_backward(const std::array<const at::Tensor*, N>& operands,
                                       const std::array<const char*, N>& names, std::array<bool, N> mask,
                                       Kernel&& kernel) {
  std::array<at::Tensor, N> grads;
  for (std::size_t i = 0; i < N; ++i) grads[i] = new_grad(*operands[i], mask[i]);
  guarded([&] {
    std::array<std::optional<TensorView>, N> views;
    for (std::size_t i = 0; i < N; ++i) views[i] = grad_view(grads[i], mask[i], names[i]);
    kernel(views);
  });
  return grads;
}

// An (input, target) backward: the two gradients requested by output_mask.
template <class Kernel>
std::tuple<at::Tensor, at::Tensor> run_backward2(const at::Tensor& input, const at::Tensor& target,
                                                 std::array<bool, 2> mask, Kernel&& kernel) {
  auto g = run_backward<2>({&input, &target}, {"grad_input", "grad_target"}, mask,
                           [&](const std::array<std::optional<TensorView>, 2>& v) {
                             PointwiseGrads grads;
                             grads.input = v[0];
                             grads.target = v[1];
                             kernel(grads);
                           });
  return {g[0], g[1]};
}

// ---- mse_loss, l1_loss --------------------------------------------------------------------------------------

template <class Options>
Options weighted_options(const std::optional<at::Tensor>& weight, std::int64_t red) {
  Options o;
  o.reduction = reduction(red);
  o.weight = view(weight, "weight");
  return o;
}

at::Tensor mse_loss(const at::Tensor& input, const at::Tensor& target, const std::optional<at::Tensor>& weight,
                    std::int64_t red) {
  return run_forward(input, red, [&](const TensorView& loss) {
    mse_forward(view(input, "input"), view(target, "target"), weighted_options<MseOptions>(weight, red), loss);
  });
}

std::tuple<at::Tensor, at::Tensor> mse_loss_backward(const at::Tensor& grad_output, const at::Tensor& input,
                                                     const at::Tensor& target, const std::optional<at::Tensor>& weight,
                                                     std::int64_t red, std::array<bool, 2> output_mask) {
  const at::Tensor go = acc_grad_output(grad_output, input);
  return run_backward2(input, target, output_mask, [&](const PointwiseGrads& grads) {
    mse_backward(view(input, "input"), view(target, "target"), view(go, "grad_output"),
                 weighted_options<MseOptions>(weight, red), grads);
  });
}

at::Tensor l1_loss(const at::Tensor& input, const at::Tensor& target, const std::optional<at::Tensor>& weight,
                   std::int64_t red) {
  return run_forward(input, red, [&](const TensorView& loss) {
    l1_forward(view(input, "input"), view(target, "target"), weighted_options<L1Options>(weight, red), loss);
  });
}

std::tuple<at::Tensor, at::Tensor> l1_loss_backward(const at::Tensor& grad_output, const at::Tensor& input,
                                                    const at::Tensor& target, const std::optional<at::Tensor>& weight,
                                                    std::int64_t red, std::array<bool, 2> output_mask) {
  const at::Tensor go = acc_grad_output(grad_output, input);
  return run_backward2(input, target, output_mask, [&](const PointwiseGrads& grads) {
    l1_backward(view(input, "input"), view(target, "target"), view(go, "grad_output"),
                weighted_options<L1Options>(weight, red), grads);
  });
}

// ---- smooth_l1_loss, huber_loss -----------------------------------------------------------------------------

SmoothL1Options smooth_l1_options(std::int64_t red, double beta) {
  SmoothL1Options o;
  o.reduction = reduction(red);
  o.beta = beta;
  return o;
}

at::Tensor smooth_l1_loss(const at::Tensor& input, const at::Tensor& target, std::int64_t red, double beta) {
  return run_forward(input, red, [&](const TensorView& loss) {
    smooth_l1_forward(view(input, "input"), view(target, "target"), smooth_l1_options(red, beta), loss);
  });
}

std::tuple<at::Tensor, at::Tensor> smooth_l1_loss_backward(const at::Tensor& grad_output, const at::Tensor& input,
                                                           const at::Tensor& target, std::int64_t red, double beta,
                                                           std::array<bool, 2> output_mask) {
  const at::Tensor go = acc_grad_output(grad_output, input);
  return run_backward2(input, target, output_mask, [&](const PointwiseGrads& grads) {
    smooth_l1_backward(view(input, "input"), view(target, "target"), view(go, "grad_output"),
                       smooth_l1_options(red, beta), grads);
  });
}

HuberOptions huber_options(const std::optional<at::Tensor>& weight, std::int64_t red, double delta) {
  auto o = weighted_options<HuberOptions>(weight, red);
  o.delta = delta;
  return o;
}

at::Tensor huber_loss(const at::Tensor& input, const at::Tensor& target, const std::optional<at::Tensor>& weight,
                      std::int64_t red, double delta) {
  return run_forward(input, red, [&](const TensorView& loss) {
    huber_forward(view(input, "input"), view(target, "target"), huber_options(weight, red, delta), loss);
  });
}

std::tuple<at::Tensor, at::Tensor> huber_loss_backward(const at::Tensor& grad_output, const at::Tensor& input,
                                                       const at::Tensor& target,
                                                       const std::optional<at::Tensor>& weight, std::int64_t red,
                                                       double delta, std::array<bool, 2> output_mask) {
  const at::Tensor go = acc_grad_output(grad_output, input);
  return run_backward2(input, target, output_mask, [&](const PointwiseGrads& grads) {
    huber_backward(view(input, "input"), view(target, "target"), view(go, "grad_output"),
                   huber_options(weight, red, delta), grads);
  });
}

// ---- kl_div -------------------------------------------------------------------------------------------------

KlDivOptions kl_div_options(std::int64_t red, bool batchmean, bool log_target) {
  KlDivOptions o;
  o.reduction = reduction(red);
  o.batchmean = batchmean;
  o.log_target = log_target;
  return o;
}

at::Tensor kl_div(const at::Tensor& input, const at::Tensor& target, std::int64_t red, bool batchmean,
                  bool log_target) {
  return run_forward(input, red, [&](const TensorView& loss) {
    kl_div_forward(view(input, "input"), view(target, "target"), kl_div_options(red, batchmean, log_target), loss);
  });
}

std::tuple<at::Tensor, at::Tensor> kl_div_backward(const at::Tensor& grad_output, const at::Tensor& input,
                                                   const at::Tensor& target, std::int64_t red, bool batchmean,
                                                   bool log_target, std::array<bool, 2> output_mask) {
  const at::Tensor go = acc_grad_output(grad_output, input);
  return run_backward2(input, target, output_mask, [&](const PointwiseGrads& grads) {
    lossfuse::kl_div_backward(view(input, "input"), view(target, "target"), view(go, "grad_output"),
                              kl_div_options(red, batchmean, log_target), grads);
  });
}

// ---- hinge_embedding_loss (gradient for the input only, as torch) ---------------------------------------------

HingeEmbeddingOptions hinge_options(double margin, std::int64_t red) {
  HingeEmbeddingOptions o;
  o.reduction = reduction(red);
  o.margin = margin;
  return o;
}

at::Tensor hinge_embedding_loss(const at::Tensor& input, const at::Tensor& target, double margin, std::int64_t red) {
  return run_forward(input, red, [&](const TensorView& loss) {
    hinge_embedding_forward(view(input, "input"), view(target, "target"), hinge_options(margin, red), loss);
  });
}

at::Tensor hinge_embedding_loss_backward(const at::Tensor& grad_output, const at::Tensor& input,
                                         const at::Tensor& target, double margin, std::int64_t red) {
  const at::Tensor go = acc_grad_output(grad_output, input);
  return std::get<0>(run_backward2(input, target, {true, false}, [&](const PointwiseGrads& grads) {
    hinge_embedding_backward(view(input, "input"), view(target, "target"), view(go, "grad_output"),
                             hinge_options(margin, red), grads);
  }));
}

// ---- margin_ranking_loss ------------------------------------------------------------------------------------

MarginRankingOptions ranking_options(double margin, std::int64_t red) {
  MarginRankingOptions o;
  o.reduction = reduction(red);
  o.margin = margin;
  return o;
}

at::Tensor margin_ranking_loss(const at::Tensor& input1, const at::Tensor& input2, const at::Tensor& target,
                               double margin, std::int64_t red) {
  return run_forward(input1, red, [&](const TensorView& loss) {
    margin_ranking_forward(view(input1, "input1"), view(input2, "input2"), view(target, "target"),
                           ranking_options(margin, red), loss);
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> margin_ranking_loss_backward(
    const at::Tensor& grad_output, const at::Tensor& input1, const at::Tensor& input2, const at::Tensor& target,
    double margin, std::int64_t red, std::array<bool, 3> output_mask) {
  const at::Tensor go = acc_grad_output(grad_output, input1);
  auto g =
      run_backward<3>({&input1, &input2, &target}, {"grad_input1", "grad_input2", "grad_target"}, output_mask,
                      [&](const std::array<std::optional<TensorView>, 3>& v) {
                        margin_ranking_backward(view(input1, "input1"), view(input2, "input2"), view(target, "target"),
                                                view(go, "grad_output"), ranking_options(margin, red),
                                                MarginRankingGrads{v[0], v[1], v[2]});
                      });
  return {g[0], g[1], g[2]};
}

}  // namespace
}  // namespace lossfuse::torch_binding

TORCH_LIBRARY_FRAGMENT(lossfuse, m) {
  m.def("mse_loss(Tensor input, Tensor target, Tensor? weight, int reduction) -> Tensor");
  m.def(
      "mse_loss_backward(Tensor grad_output, Tensor input, Tensor target, Tensor? weight, int reduction, "
      "bool[2] output_mask) -> (Tensor grad_input, Tensor grad_target)");
  m.def("l1_loss(Tensor input, Tensor target, Tensor? weight, int reduction) -> Tensor");
  m.def(
      "l1_loss_backward(Tensor grad_output, Tensor input, Tensor target, Tensor? weight, int reduction, "
      "bool[2] output_mask) -> (Tensor grad_input, Tensor grad_target)");
  m.def("smooth_l1_loss(Tensor input, Tensor target, int reduction, float beta) -> Tensor");
  m.def(
      "smooth_l1_loss_backward(Tensor grad_output, Tensor input, Tensor target, int reduction, float beta, "
      "bool[2] output_mask) -> (Tensor grad_input, Tensor grad_target)");
  m.def("huber_loss(Tensor input, Tensor target, Tensor? weight, int reduction, float delta) -> Tensor");
  m.def(
      "huber_loss_backward(Tensor grad_output, Tensor input, Tensor target, Tensor? weight, int reduction, "
      "float delta, bool[2] output_mask) -> (Tensor grad_input, Tensor grad_target)");
  m.def("kl_div(Tensor input, Tensor target, int reduction, bool batchmean, bool log_target) -> Tensor");
  m.def(
      "kl_div_backward(Tensor grad_output, Tensor input, Tensor target, int reduction, bool batchmean, "
      "bool log_target, bool[2] output_mask) -> (Tensor grad_input, Tensor grad_target)");
  m.def("hinge_embedding_loss(Tensor input, Tensor target, float margin, int reduction) -> Tensor");
  m.def(
      "hinge_embedding_loss_backward(Tensor grad_output, Tensor input, Tensor target, float margin, "
      "int reduction) -> Tensor");
  m.def("margin_ranking_loss(Tensor input1, Tensor input2, Tensor target, float margin, int reduction) -> Tensor");
  m.def(
      "margin_ranking_loss_backward(Tensor grad_output, Tensor input1, Tensor input2, Tensor target, float margin, "
      "int reduction, bool[3] output_mask) -> (Tensor grad_input1, Tensor grad_input2, Tensor grad_target)");
}

TORCH_LIBRARY_IMPL(lossfuse, CPU, m) {
  using namespace lossfuse::torch_binding;
  m.impl("mse_loss", &mse_loss);
  m.impl("mse_loss_backward", &mse_loss_backward);
  m.impl("l1_loss", &l1_loss);
  m.impl("l1_loss_backward", &l1_loss_backward);
  m.impl("smooth_l1_loss", &smooth_l1_loss);
  m.impl("smooth_l1_loss_backward", &smooth_l1_loss_backward);
  m.impl("huber_loss", &huber_loss);
  m.impl("huber_loss_backward", &huber_loss_backward);
  m.impl("kl_div", &kl_div);
  m.impl("kl_div_backward", &kl_div_backward);
  m.impl("hinge_embedding_loss", &hinge_embedding_loss);
  m.impl("hinge_embedding_loss_backward", &hinge_embedding_loss_backward);
  m.impl("margin_ranking_loss", &margin_ranking_loss);
  m.impl("margin_ranking_loss_backward", &margin_ranking_loss_backward);
}
