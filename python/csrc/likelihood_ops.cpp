// The likelihood losses as torch ops: binary_cross_entropy, binary_cross_entropy_with_logits, poisson_nll_loss,
// gaussian_nll_loss, each with a backward op that writes only the gradients its output_mask asks for (the others
// come back as empty (0,) tensors).
//
// The operands reach the ops already cast to one floating dtype and broadcast to one shape (expanded views with
// stride 0 where torch broadcasts: a weight, pos_weight or var); the Python side does both, so that autograd sums
// the gradients of broadcast operands back to their shapes.
#include <array>
#include <string>
#include <tuple>

#include "binding.hpp"
#include "lossfuse/pointwise.hpp"

namespace lossfuse::torch_binding {
namespace {

// Runs `kernel(grads)` with new gradients (each of its operand's shape and dtype, contiguous) for the operands
// the mask asks for, and empty (0,) tensors for the others.
template <std::size_t N, class Kernel>
std::array<at::Tensor, N> run_backward(const std::array<const at::Tensor*, N>& operands, std::array<bool, N> mask,
                                       Kernel&& kernel) {
  static constexpr std::array<const char*, 3> kNames = {"grad_input", "grad_target", "grad_var"};
  std::array<at::Tensor, N> grads;
  for (std::size_t i = 0; i < N; ++i) grads[i] = new_grad(*operands[i], mask[i]);
  guarded([&] {
    PointwiseGrads g;
    std::optional<TensorView>* slots[3] = {&g.input, &g.target, &g.var};
    for (std::size_t i = 0; i < N; ++i) *slots[i] = grad_view(grads[i], mask[i], kNames[i]);
    kernel(g);
  });
  return grads;
}

// Runs a bce kernel. torch raises RuntimeError for an input outside [0, 1] ("all elements of input should be
// between 0 and 1"), where lossfuse's invalid_value would become a ValueError: that one error is raised as a
// RuntimeError with lossfuse's message (naming the first bad element); every other error goes to `guarded`.
template <class F>
void bce_kernel(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    if (e.code() == ErrorCode::invalid_value && e.argument() == "input") TORCH_CHECK(false, e.what());
    throw;
  }
}

// torch (2.15) also requires every target element in [0, 1] (nan is out) in the forward, after the input's check;
// lossfuse's bce kernels leave the target's range to the caller. One vectorized min/max pass (nan propagates into
// both); only on failure is the first bad element looked for, to name its position and value.
void check_bce_target(const at::Tensor& target) {
  if (target.numel() == 0) return;
  const auto [lo, hi] = at::aminmax(target);
  if (lo.item<double>() >= 0.0 && hi.item<double>() <= 1.0) return;
  const at::Tensor bad = (target.lt(0) | target.gt(1) | target.isnan()).flatten().nonzero();
  const std::int64_t first = bad[0].item<std::int64_t>();
  std::string position = "[";
  std::int64_t rest = first;
  for (std::int64_t d = target.dim() - 1, i = 0; d >= 0; --d, ++i) {
    position.insert(1, std::to_string(rest % target.size(d)) + (i ? ", " : ""));
    rest /= target.size(d);
  }
  TORCH_CHECK(false, "lossfuse: target: expected every element in [0, 1] (all elements of target should be between ",
              "0 and 1), got ", target.flatten()[first].item<double>(), " at position ", position, "]");
}

// ---- binary_cross_entropy -------------------------------------------------------------------------------------

BceOptions bce_options(const std::optional<at::Tensor>& weight, std::int64_t red) {
  BceOptions o;
  o.reduction = reduction(red);
  o.weight = view(weight, "weight");
  return o;
}

at::Tensor binary_cross_entropy(const at::Tensor& input, const at::Tensor& target,
                                const std::optional<at::Tensor>& weight, std::int64_t red) {
  return run_forward(input, red, [&](const TensorView& loss) {
    bce_kernel([&] { bce_forward(view(input, "input"), view(target, "target"), bce_options(weight, red), loss); });
    check_bce_target(target);
  });
}

std::tuple<at::Tensor, at::Tensor> binary_cross_entropy_backward(const at::Tensor& grad_output, const at::Tensor& input,
                                                                 const at::Tensor& target,
                                                                 const std::optional<at::Tensor>& weight,
                                                                 std::int64_t red, std::array<bool, 2> output_mask) {
  const at::Tensor go = acc_grad_output(grad_output, input);
  auto g = run_backward<2>({&input, &target}, output_mask, [&](const PointwiseGrads& grads) {
    bce_kernel([&] {
      bce_backward(view(input, "input"), view(target, "target"), view(go, "grad_output"), bce_options(weight, red),
                   grads);
    });
  });
  return {g[0], g[1]};
}

// ---- binary_cross_entropy_with_logits -------------------------------------------------------------------------

BceWithLogitsOptions bce_logits_options(const std::optional<at::Tensor>& weight,
                                        const std::optional<at::Tensor>& pos_weight, std::int64_t red) {
  BceWithLogitsOptions o;
  o.reduction = reduction(red);
  o.weight = view(weight, "weight");
  o.pos_weight = view(pos_weight, "pos_weight");
  return o;
}

at::Tensor binary_cross_entropy_with_logits(const at::Tensor& input, const at::Tensor& target,
                                            const std::optional<at::Tensor>& weight,
                                            const std::optional<at::Tensor>& pos_weight, std::int64_t red) {
  return run_forward(input, red, [&](const TensorView& loss) {
    bce_with_logits_forward(view(input, "input"), view(target, "target"), bce_logits_options(weight, pos_weight, red),
                            loss);
  });
}

std::tuple<at::Tensor, at::Tensor> binary_cross_entropy_with_logits_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& target,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& pos_weight, std::int64_t red,
    std::array<bool, 2> output_mask) {
  const at::Tensor go = acc_grad_output(grad_output, input);
  auto g = run_backward<2>({&input, &target}, output_mask, [&](const PointwiseGrads& grads) {
    bce_with_logits_backward(view(input, "input"), view(target, "target"), view(go, "grad_output"),
                             bce_logits_options(weight, pos_weight, red), grads);
  });
  return {g[0], g[1]};
}

// ---- poisson_nll_loss -----------------------------------------------------------------------------------------

PoissonNllOptions poisson_options(bool log_input, bool full, double eps, std::int64_t red) {
  PoissonNllOptions o;
  o.reduction = reduction(red);
  o.log_input = log_input;
  o.full = full;
  o.eps = eps;
  return o;
}

at::Tensor poisson_nll_loss(const at::Tensor& input, const at::Tensor& target, bool log_input, bool full, double eps,
                            std::int64_t red) {
  return run_forward(input, red, [&](const TensorView& loss) {
    poisson_nll_forward(view(input, "input"), view(target, "target"), poisson_options(log_input, full, eps, red), loss);
  });
}

std::tuple<at::Tensor, at::Tensor> poisson_nll_loss_backward(const at::Tensor& grad_output, const at::Tensor& input,
                                                             const at::Tensor& target, bool log_input, bool full,
                                                             double eps, std::int64_t red,
                                                             std::array<bool, 2> output_mask) {
  const at::Tensor go = acc_grad_output(grad_output, input);
  auto g = run_backward<2>({&input, &target}, output_mask, [&](const PointwiseGrads& grads) {
    poisson_nll_backward(view(input, "input"), view(target, "target"), view(go, "grad_output"),
                         poisson_options(log_input, full, eps, red), grads);
  });
  return {g[0], g[1]};
}

// ---- gaussian_nll_loss ----------------------------------------------------------------------------------------

GaussianNllOptions gaussian_options(bool full, double eps, std::int64_t red) {
  GaussianNllOptions o;
  o.reduction = reduction(red);
  o.full = full;
  o.eps = eps;
  return o;
}

at::Tensor gaussian_nll_loss(const at::Tensor& input, const at::Tensor& target, const at::Tensor& var, bool full,
                             double eps, std::int64_t red) {
  return run_forward(input, red, [&](const TensorView& loss) {
    gaussian_nll_forward(view(input, "input"), view(target, "target"), view(var, "var"),
                         gaussian_options(full, eps, red), loss);
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> gaussian_nll_loss_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& target, const at::Tensor& var, bool full,
    double eps, std::int64_t red, std::array<bool, 3> output_mask) {
  const at::Tensor go = acc_grad_output(grad_output, input);
  auto g = run_backward<3>({&input, &target, &var}, output_mask, [&](const PointwiseGrads& grads) {
    gaussian_nll_backward(view(input, "input"), view(target, "target"), view(var, "var"), view(go, "grad_output"),
                          gaussian_options(full, eps, red), grads);
  });
  return {g[0], g[1], g[2]};
}

}  // namespace
}  // namespace lossfuse::torch_binding

TORCH_LIBRARY_FRAGMENT(lossfuse, m) {
  m.def("binary_cross_entropy(Tensor input, Tensor target, Tensor? weight, int reduction) -> Tensor");
  m.def(
      "binary_cross_entropy_backward(Tensor grad_output, Tensor input, Tensor target, Tensor? weight, int reduction, "
      "bool[2] output_mask) -> (Tensor grad_input, Tensor grad_target)");
  m.def(
      "binary_cross_entropy_with_logits(Tensor input, Tensor target, Tensor? weight, Tensor? pos_weight, "
      "int reduction) -> Tensor");
  m.def(
      "binary_cross_entropy_with_logits_backward(Tensor grad_output, Tensor input, Tensor target, Tensor? weight, "
      "Tensor? pos_weight, int reduction, bool[2] output_mask) -> (Tensor grad_input, Tensor grad_target)");
  m.def("poisson_nll_loss(Tensor input, Tensor target, bool log_input, bool full, float eps, int reduction) -> Tensor");
  m.def(
      "poisson_nll_loss_backward(Tensor grad_output, Tensor input, Tensor target, bool log_input, bool full, "
      "float eps, int reduction, bool[2] output_mask) -> (Tensor grad_input, Tensor grad_target)");
  m.def("gaussian_nll_loss(Tensor input, Tensor target, Tensor var, bool full, float eps, int reduction) -> Tensor");
  m.def(
      "gaussian_nll_loss_backward(Tensor grad_output, Tensor input, Tensor target, Tensor var, bool full, float eps, "
      "int reduction, bool[3] output_mask) -> (Tensor grad_input, Tensor grad_target, Tensor grad_var)");
}

TORCH_LIBRARY_IMPL(lossfuse, CPU, m) {
  using namespace lossfuse::torch_binding;
  m.impl("binary_cross_entropy", &binary_cross_entropy);
  m.impl("binary_cross_entropy_backward", &binary_cross_entropy_backward);
  m.impl("binary_cross_entropy_with_logits", &binary_cross_entropy_with_logits);
  m.impl("binary_cross_entropy_with_logits_backward", &binary_cross_entropy_with_logits_backward);
  m.impl("poisson_nll_loss", &poisson_nll_loss);
  m.impl("poisson_nll_loss_backward", &poisson_nll_loss_backward);
  m.impl("gaussian_nll_loss", &gaussian_nll_loss);
  m.impl("gaussian_nll_loss_backward", &gaussian_nll_loss_backward);
}
