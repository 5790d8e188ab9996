// The elementwise losses as torch ops: mse_loss, l1_loss, smooth_l1_loss, huber_loss, kl_div,
// hinge_embedding_loss, margin_ranking_loss, binary_cross_entropy, binary_cross_entropy_with_logits,
// poisson_nll_loss, gaussian_nll_loss, each with a backward op that writes only the gradients its output_mask asks
// for (the others come back as empty (0,) tensors), and an internal fused op, _<loss>_fused: the loss and those
// gradients for an upstream gradient of 1 in one pass (<loss>_forward_backward), which Python's eager training step
// takes (register_loss in _register.py; never traced, so it has no fake).
//
// The operands reach the ops already promoted to one floating dtype and broadcast to one shape (expanded views
// with stride 0 where torch broadcasts: a target, weight, pos_weight or var); the Python side does both, so that
// autograd sums the gradients of broadcast operands back to their shapes.
#include <array>
#include <string>
#include <tuple>

#include "binding.hpp"
#include "lossfuse/pointwise.hpp"

namespace lossfuse::torch_binding {
namespace {

// ---- helpers for any elementwise loss ------------------------------------------------------------------

// The held backward ops, _<loss>_backward_held(<the backward op's arguments>, Tensor(a!)[] held) -> (): the backward
// op's function run over the fused op's gradients `held` (one per gradient the backward op gives; an empty (0,)
// tensor where the mask is off) with PointwiseGrads::held set, so they are rewritten only where the upstream gradient
// is not 1, a test the kernels make on the device (the eager training step's backward, _register.py: nothing read
// back). HeldScope hands `held` to run_backward for the one call; never traced (no fake).
thread_local const at::TensorList* t_held = nullptr;
class HeldScope {
 public:
  explicit HeldScope(const at::TensorList& held) { t_held = &held; }
  HeldScope(const HeldScope&) = delete;
  HeldScope& operator=(const HeldScope&) = delete;
  ~HeldScope() { t_held = nullptr; }
};
bool held_now() noexcept { return t_held != nullptr; }

template <auto Backward>
struct Held;
template <class R, class... Args, R (*Backward)(Args...)>
struct Held<Backward> {
  static void call(Args... args, at::TensorList held) {
    const HeldScope scope(held);
    (void)Backward(args...);
  }
};

// Runs `kernel(grads)` with new gradient tensors for the operands the mask asks for (each of its operand's shape
// and dtype, contiguous) and empty (0,) tensors for the others; in a held op, with the held tensors instead.
template <std::size_t N, class Kernel>
std::array<at::Tensor, N> run_grads(const std::array<const at::Tensor*, N>& operands,
                                    const std::array<const char*, N>& names, std::array<bool, N> mask,
                                    Kernel&& kernel) {
  std::array<at::Tensor, N> grads;
  if (t_held != nullptr) {
    TORCH_CHECK(t_held->size() == N, "lossfuse: held gradients: expected ", N, ", got ", t_held->size());
    for (std::size_t i = 0; i < N; ++i) grads[i] = mask[i] ? (*t_held)[i] : new_grad(*operands[i], false);
  } else {
    for (std::size_t i = 0; i < N; ++i) grads[i] = new_grad(*operands[i], mask[i]);
  }
  guarded_on(*operands[0], [&] {
    std::array<std::optional<TensorView>, N> views;
    for (std::size_t i = 0; i < N; ++i) views[i] = grad_view(grads[i], mask[i], names[i]);
    kernel(views);
  });
  return grads;
}

// A backward op's run_grads, under BackwardChecks: its forward checked the operands (the fused op, a forward, takes
// run_grads itself and checks them).
template <std::size_t N, class Kernel>
std::array<at::Tensor, N> run_backward(const std::array<const at::Tensor*, N>& operands,
                                       const std::array<const char*, N>& names, std::array<bool, N> mask,
                                       Kernel&& kernel) {
  const BackwardChecks checked;
  return run_grads<N>(operands, names, mask, std::forward<Kernel>(kernel));
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
                             grads.held = held_now();
                             kernel(grads);
                           });
  return {g[0], g[1]};
}

// The fused op: a new loss and the gradients the mask asks for, `kernel(loss_view, grad_views)`.
template <std::size_t N, class Kernel>
std::array<at::Tensor, N + 1> run_fused(const std::array<const at::Tensor*, N>& operands,
                                        const std::array<const char*, N>& names, std::array<bool, N> mask,
                                        std::int64_t red, Kernel&& kernel) {
  const at::Tensor loss = new_loss(*operands[0], operands[0]->sizes(), red);
  const std::array<at::Tensor, N> g =
      run_grads<N>(operands, names, mask,
                   [&](const std::array<std::optional<TensorView>, N>& v) { kernel(output_view(loss, "loss"), v); });
  std::array<at::Tensor, N + 1> out;
  out[0] = loss;
  for (std::size_t i = 0; i < N; ++i) out[i + 1] = g[i];
  return out;
}

// An (input, target) fused op: (loss, grad_input, grad_target).
template <class Kernel>
std::tuple<at::Tensor, at::Tensor, at::Tensor> run_fused2(const at::Tensor& input, const at::Tensor& target,
                                                          std::array<bool, 2> mask, std::int64_t red, Kernel&& kernel) {
  const auto r = run_fused<2>({&input, &target}, {"grad_input", "grad_target"}, mask, red,
                              [&](const TensorView& loss, const std::array<std::optional<TensorView>, 2>& v) {
                                kernel(loss, PointwiseGrads{v[0], v[1], std::nullopt});
                              });
  return {r[0], r[1], r[2]};
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

std::tuple<at::Tensor, at::Tensor, at::Tensor> mse_loss_fused(const at::Tensor& input, const at::Tensor& target,
                                                              const std::optional<at::Tensor>& weight, std::int64_t red,
                                                              std::array<bool, 2> output_mask) {
  return run_fused2(input, target, output_mask, red, [&](const TensorView& loss, const PointwiseGrads& grads) {
    mse_forward_backward(view(input, "input"), view(target, "target"), weighted_options<MseOptions>(weight, red), loss,
                         grads);
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

std::tuple<at::Tensor, at::Tensor, at::Tensor> l1_loss_fused(const at::Tensor& input, const at::Tensor& target,
                                                             const std::optional<at::Tensor>& weight, std::int64_t red,
                                                             std::array<bool, 2> output_mask) {
  return run_fused2(input, target, output_mask, red, [&](const TensorView& loss, const PointwiseGrads& grads) {
    l1_forward_backward(view(input, "input"), view(target, "target"), weighted_options<L1Options>(weight, red), loss,
                        grads);
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

std::tuple<at::Tensor, at::Tensor, at::Tensor> smooth_l1_loss_fused(const at::Tensor& input, const at::Tensor& target,
                                                                    std::int64_t red, double beta,
                                                                    std::array<bool, 2> output_mask) {
  return run_fused2(input, target, output_mask, red, [&](const TensorView& loss, const PointwiseGrads& grads) {
    smooth_l1_forward_backward(view(input, "input"), view(target, "target"), smooth_l1_options(red, beta), loss, grads);
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

std::tuple<at::Tensor, at::Tensor, at::Tensor> huber_loss_fused(const at::Tensor& input, const at::Tensor& target,
                                                                const std::optional<at::Tensor>& weight,
                                                                std::int64_t red, double delta,
                                                                std::array<bool, 2> output_mask) {
  return run_fused2(input, target, output_mask, red, [&](const TensorView& loss, const PointwiseGrads& grads) {
    huber_forward_backward(view(input, "input"), view(target, "target"), huber_options(weight, red, delta), loss,
                           grads);
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

std::tuple<at::Tensor, at::Tensor, at::Tensor> kl_div_fused(const at::Tensor& input, const at::Tensor& target,
                                                            std::int64_t red, bool batchmean, bool log_target,
                                                            std::array<bool, 2> output_mask) {
  return run_fused2(input, target, output_mask, red, [&](const TensorView& loss, const PointwiseGrads& grads) {
    kl_div_forward_backward(view(input, "input"), view(target, "target"), kl_div_options(red, batchmean, log_target),
                            loss, grads);
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

std::tuple<at::Tensor, at::Tensor> hinge_embedding_loss_fused(const at::Tensor& input, const at::Tensor& target,
                                                              double margin, std::int64_t red) {
  const auto r = run_fused2(input, target, {true, false}, red, [&](const TensorView& loss, const PointwiseGrads& g) {
    hinge_embedding_forward_backward(view(input, "input"), view(target, "target"), hinge_options(margin, red), loss, g);
  });
  return {std::get<0>(r), std::get<1>(r)};
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
                                                MarginRankingGrads{v[0], v[1], v[2], held_now()});
                      });
  return {g[0], g[1], g[2]};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> margin_ranking_loss_fused(const at::Tensor& input1,
                                                                                     const at::Tensor& input2,
                                                                                     const at::Tensor& target,
                                                                                     double margin, std::int64_t red,
                                                                                     std::array<bool, 3> output_mask) {
  const auto r = run_fused<3>({&input1, &input2, &target}, {"grad_input1", "grad_input2", "grad_target"}, output_mask,
                              red, [&](const TensorView& loss, const std::array<std::optional<TensorView>, 3>& v) {
                                margin_ranking_forward_backward(view(input1, "input1"), view(input2, "input2"),
                                                                view(target, "target"), ranking_options(margin, red),
                                                                loss, MarginRankingGrads{v[0], v[1], v[2]});
                              });
  return {r[0], r[1], r[2], r[3]};
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
// both) and one value read back (on CUDA, a synchronisation); only on failure is the first bad element looked for, to
// name its position and value. Under CUDA-graph capture nothing can be read back, nor is under CudaCheck::nan, and
// the range goes unchecked.
void check_bce_target(const at::Tensor& target) {
  if (target.numel() == 0 || capturing(target) || (target.is_cuda() && cuda_check() == CudaCheck::nan)) return;
  const auto [lo, hi] = at::aminmax(target);
  if (((lo >= 0.0) & (hi <= 1.0)).item<bool>()) return;
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
  return run_backward2(input, target, output_mask, [&](const PointwiseGrads& grads) {
    bce_kernel([&] {
      bce_backward(view(input, "input"), view(target, "target"), view(go, "grad_output"), bce_options(weight, red),
                   grads);
    });
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> binary_cross_entropy_fused(const at::Tensor& input,
                                                                          const at::Tensor& target,
                                                                          const std::optional<at::Tensor>& weight,
                                                                          std::int64_t red,
                                                                          std::array<bool, 2> output_mask) {
  return run_fused2(input, target, output_mask, red, [&](const TensorView& loss, const PointwiseGrads& grads) {
    bce_kernel([&] {
      bce_forward_backward(view(input, "input"), view(target, "target"), bce_options(weight, red), loss, grads);
    });
    check_bce_target(target);
  });
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
  return run_backward2(input, target, output_mask, [&](const PointwiseGrads& grads) {
    bce_with_logits_backward(view(input, "input"), view(target, "target"), view(go, "grad_output"),
                             bce_logits_options(weight, pos_weight, red), grads);
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> binary_cross_entropy_with_logits_fused(
    const at::Tensor& input, const at::Tensor& target, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& pos_weight, std::int64_t red, std::array<bool, 2> output_mask) {
  return run_fused2(input, target, output_mask, red, [&](const TensorView& loss, const PointwiseGrads& grads) {
    bce_with_logits_forward_backward(view(input, "input"), view(target, "target"),
                                     bce_logits_options(weight, pos_weight, red), loss, grads);
  });
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
  return run_backward2(input, target, output_mask, [&](const PointwiseGrads& grads) {
    poisson_nll_backward(view(input, "input"), view(target, "target"), view(go, "grad_output"),
                         poisson_options(log_input, full, eps, red), grads);
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> poisson_nll_loss_fused(const at::Tensor& input, const at::Tensor& target,
                                                                      bool log_input, bool full, double eps,
                                                                      std::int64_t red,
                                                                      std::array<bool, 2> output_mask) {
  return run_fused2(input, target, output_mask, red, [&](const TensorView& loss, const PointwiseGrads& grads) {
    poisson_nll_forward_backward(view(input, "input"), view(target, "target"),
                                 poisson_options(log_input, full, eps, red), loss, grads);
  });
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
  auto g = run_backward<3>({&input, &target, &var}, {"grad_input", "grad_target", "grad_var"}, output_mask,
                           [&](const std::array<std::optional<TensorView>, 3>& v) {
                             gaussian_nll_backward(view(input, "input"), view(target, "target"), view(var, "var"),
                                                   view(go, "grad_output"), gaussian_options(full, eps, red),
                                                   PointwiseGrads{v[0], v[1], v[2], held_now()});
                           });
  return {g[0], g[1], g[2]};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> gaussian_nll_loss_fused(const at::Tensor& input,
                                                                                   const at::Tensor& target,
                                                                                   const at::Tensor& var, bool full,
                                                                                   double eps, std::int64_t red,
                                                                                   std::array<bool, 3> output_mask) {
  const auto r = run_fused<3>({&input, &target, &var}, {"grad_input", "grad_target", "grad_var"}, output_mask, red,
                              [&](const TensorView& loss, const std::array<std::optional<TensorView>, 3>& v) {
                                gaussian_nll_forward_backward(view(input, "input"), view(target, "target"),
                                                              view(var, "var"), gaussian_options(full, eps, red), loss,
                                                              PointwiseGrads{v[0], v[1], v[2]});
                              });
  return {r[0], r[1], r[2], r[3]};
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
  m.def(
      "_mse_loss_fused(Tensor input, Tensor target, Tensor? weight, int reduction, bool[2] output_mask) -> "
      "(Tensor, Tensor, Tensor)");
  m.def(
      "_l1_loss_fused(Tensor input, Tensor target, Tensor? weight, int reduction, bool[2] output_mask) -> "
      "(Tensor, Tensor, Tensor)");
  m.def(
      "_smooth_l1_loss_fused(Tensor input, Tensor target, int reduction, float beta, bool[2] output_mask) -> "
      "(Tensor, Tensor, Tensor)");
  m.def(
      "_huber_loss_fused(Tensor input, Tensor target, Tensor? weight, int reduction, float delta, "
      "bool[2] output_mask) -> (Tensor, Tensor, Tensor)");
  m.def(
      "_kl_div_fused(Tensor input, Tensor target, int reduction, bool batchmean, bool log_target, "
      "bool[2] output_mask) -> (Tensor, Tensor, Tensor)");
  m.def("_hinge_embedding_loss_fused(Tensor input, Tensor target, float margin, int reduction) -> (Tensor, Tensor)");
  m.def(
      "_margin_ranking_loss_fused(Tensor input1, Tensor input2, Tensor target, float margin, int reduction, "
      "bool[3] output_mask) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "_binary_cross_entropy_fused(Tensor input, Tensor target, Tensor? weight, int reduction, bool[2] output_mask) "
      "-> (Tensor, Tensor, Tensor)");
  m.def(
      "_binary_cross_entropy_with_logits_fused(Tensor input, Tensor target, Tensor? weight, Tensor? pos_weight, "
      "int reduction, bool[2] output_mask) -> (Tensor, Tensor, Tensor)");
  m.def(
      "_poisson_nll_loss_fused(Tensor input, Tensor target, bool log_input, bool full, float eps, int reduction, "
      "bool[2] output_mask) -> (Tensor, Tensor, Tensor)");
  m.def(
      "_gaussian_nll_loss_fused(Tensor input, Tensor target, Tensor var, bool full, float eps, int reduction, "
      "bool[3] output_mask) -> (Tensor, Tensor, Tensor, Tensor)");
  // Internal: the eager training step's backward over the fused op's gradients (Held above).
  m.def(
      "_mse_loss_backward_held(Tensor grad_output, Tensor input, Tensor target, Tensor? weight, int reduction, "
      "bool[2] output_mask, Tensor(a!)[] held) -> ()");
  m.def(
      "_l1_loss_backward_held(Tensor grad_output, Tensor input, Tensor target, Tensor? weight, int reduction, "
      "bool[2] output_mask, Tensor(a!)[] held) -> ()");
  m.def(
      "_smooth_l1_loss_backward_held(Tensor grad_output, Tensor input, Tensor target, int reduction, "
      "float beta, bool[2] output_mask, Tensor(a!)[] held) -> ()");
  m.def(
      "_huber_loss_backward_held(Tensor grad_output, Tensor input, Tensor target, Tensor? weight, "
      "int reduction, float delta, bool[2] output_mask, Tensor(a!)[] held) -> ()");
  m.def(
      "_kl_div_backward_held(Tensor grad_output, Tensor input, Tensor target, int reduction, bool batchmean, "
      "bool log_target, bool[2] output_mask, Tensor(a!)[] held) -> ()");
  m.def(
      "_hinge_embedding_loss_backward_held(Tensor grad_output, Tensor input, Tensor target, float margin, "
      "int reduction, Tensor(a!)[] held) -> ()");
  m.def(
      "_margin_ranking_loss_backward_held(Tensor grad_output, Tensor input1, Tensor input2, Tensor target, "
      "float margin, int reduction, bool[3] output_mask, Tensor(a!)[] held) -> ()");
  m.def(
      "_binary_cross_entropy_backward_held(Tensor grad_output, Tensor input, Tensor target, Tensor? weight, "
      "int reduction, bool[2] output_mask, Tensor(a!)[] held) -> ()");
  m.def(
      "_binary_cross_entropy_with_logits_backward_held(Tensor grad_output, Tensor input, Tensor target, "
      "Tensor? weight, Tensor? pos_weight, int reduction, bool[2] output_mask, Tensor(a!)[] held) -> ()");
  m.def(
      "_poisson_nll_loss_backward_held(Tensor grad_output, Tensor input, Tensor target, bool log_input, "
      "bool full, float eps, int reduction, bool[2] output_mask, Tensor(a!)[] held) -> ()");
  m.def(
      "_gaussian_nll_loss_backward_held(Tensor grad_output, Tensor input, Tensor target, Tensor var, "
      "bool full, float eps, int reduction, bool[3] output_mask, Tensor(a!)[] held) -> ()");
}

namespace lossfuse::torch_binding {
namespace {
// The device kernels: the same functions on the CPU and, with the CUDA route, on CUDA (device.hpp).
void register_kernels(torch::Library& m) {
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
  m.impl("binary_cross_entropy", &binary_cross_entropy);
  m.impl("binary_cross_entropy_backward", &binary_cross_entropy_backward);
  m.impl("binary_cross_entropy_with_logits", &binary_cross_entropy_with_logits);
  m.impl("binary_cross_entropy_with_logits_backward", &binary_cross_entropy_with_logits_backward);
  m.impl("poisson_nll_loss", &poisson_nll_loss);
  m.impl("poisson_nll_loss_backward", &poisson_nll_loss_backward);
  m.impl("gaussian_nll_loss", &gaussian_nll_loss);
  m.impl("gaussian_nll_loss_backward", &gaussian_nll_loss_backward);
  m.impl("_mse_loss_fused", &mse_loss_fused);
  m.impl("_l1_loss_fused", &l1_loss_fused);
  m.impl("_smooth_l1_loss_fused", &smooth_l1_loss_fused);
  m.impl("_huber_loss_fused", &huber_loss_fused);
  m.impl("_kl_div_fused", &kl_div_fused);
  m.impl("_hinge_embedding_loss_fused", &hinge_embedding_loss_fused);
  m.impl("_margin_ranking_loss_fused", &margin_ranking_loss_fused);
  m.impl("_binary_cross_entropy_fused", &binary_cross_entropy_fused);
  m.impl("_binary_cross_entropy_with_logits_fused", &binary_cross_entropy_with_logits_fused);
  m.impl("_poisson_nll_loss_fused", &poisson_nll_loss_fused);
  m.impl("_gaussian_nll_loss_fused", &gaussian_nll_loss_fused);
  m.impl("_mse_loss_backward_held", &Held<&mse_loss_backward>::call);
  m.impl("_l1_loss_backward_held", &Held<&l1_loss_backward>::call);
  m.impl("_smooth_l1_loss_backward_held", &Held<&smooth_l1_loss_backward>::call);
  m.impl("_huber_loss_backward_held", &Held<&huber_loss_backward>::call);
  m.impl("_kl_div_backward_held", &Held<&kl_div_backward>::call);
  m.impl("_hinge_embedding_loss_backward_held", &Held<&hinge_embedding_loss_backward>::call);
  m.impl("_margin_ranking_loss_backward_held", &Held<&margin_ranking_loss_backward>::call);
  m.impl("_binary_cross_entropy_backward_held", &Held<&binary_cross_entropy_backward>::call);
  m.impl("_binary_cross_entropy_with_logits_backward_held", &Held<&binary_cross_entropy_with_logits_backward>::call);
  m.impl("_poisson_nll_loss_backward_held", &Held<&poisson_nll_loss_backward>::call);
  m.impl("_gaussian_nll_loss_backward_held", &Held<&gaussian_nll_loss_backward>::call);
}
}  // namespace
}  // namespace lossfuse::torch_binding

LOSSFUSE_DEVICE_KERNELS(lossfuse::torch_binding::register_kernels)
