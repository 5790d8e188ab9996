// CTC loss as torch ops. The forward can keep its forward variables (log alpha) so the backward only runs the
// beta pass; without them (no gradient wanted at forward time) the backward recomputes alpha.
#include <algorithm>
#include <tuple>
#include <utility>
#include <vector>

#include "binding.hpp"
#include "lossfuse/ctc.hpp"

namespace lossfuse::torch_binding {
namespace {

// Like guarded(), but with the exception types torch's ctc_loss raises: every bad shape, length or blank is a
// RuntimeError there (TORCH_CHECK), never a ValueError. A bad label stays an IndexError (torch does not check
// labels at all).
template <class F>
decltype(auto) ctc_guarded(F&& f) {
  try {
    return std::forward<F>(f)();
  } catch (const Error& e) {
    if (e.code() == ErrorCode::index_error || e.code() == ErrorCode::not_implemented) rethrow(e);
    TORCH_CHECK(false, e.what());
  }
}

CtcOptions ctc_options(std::int64_t blank, std::int64_t red, bool zero_infinity) {
  CtcOptions o;
  o.blank = blank;
  o.reduction = reduction(red);
  o.zero_infinity = zero_infinity;
  return o;
}

bool is_batched(const at::Tensor& log_probs) { return log_probs.dim() == 3; }

// The shape of log_alpha, (T, N, 2 S_max + 1) or unbatched (T, 2 S + 1). S_max is the padded targets' width, or
// for concatenated targets the largest target length (read here: a plain memory read for lengths on the CPU, a
// device read-back for CUDA ones). Clamped to [0, number of targets] so that a bad length the core is about to
// report cannot make this allocation fail first; for inputs of the wrong rank the core reports the rank before it
// looks at log_alpha, so any shape does.
std::vector<std::int64_t> alpha_shape(const at::Tensor& log_probs, const at::Tensor& targets,
                                      const at::Tensor& target_lengths) {
  if (log_probs.dim() != 2 && log_probs.dim() != 3) return {0};
  std::int64_t s = targets.dim() >= 1 ? targets.size(-1) : 0;
  if (is_batched(log_probs) && targets.dim() == 1) {
    s = 0;
    if (target_lengths.numel() > 0 && !target_lengths.is_complex()) {
      s = std::clamp<std::int64_t>(target_lengths.max().item<std::int64_t>(), 0, targets.size(0));
    }
  }
  if (is_batched(log_probs)) return {log_probs.size(0), log_probs.size(1), 2 * s + 1};
  return {log_probs.size(0), 2 * s + 1};
}

std::tuple<at::Tensor, at::Tensor> ctc_loss(const at::Tensor& log_probs, const at::Tensor& targets,
                                            const at::Tensor& input_lengths, const at::Tensor& target_lengths,
                                            std::int64_t blank, std::int64_t red, bool zero_infinity,
                                            bool save_log_alpha) {
  std::vector<std::int64_t> rows;
  if (is_batched(log_probs)) rows.push_back(log_probs.size(1));
  at::Tensor loss = new_loss(log_probs, rows, red);
  at::Tensor log_alpha =
      save_log_alpha ? new_acc(log_probs, alpha_shape(log_probs, targets, target_lengths)) : new_acc(log_probs, {0});
  const DeviceCall call(log_probs);
  ctc_guarded([&] {
    CtcOutputs out{output_view(loss, "loss"), std::nullopt, std::nullopt};
    if (save_log_alpha) out.log_alpha = output_view(log_alpha, "log_alpha");
    ctc_forward(view(log_probs, "log_probs"), view(targets, "targets"), view(input_lengths, "input_lengths"),
                view(target_lengths, "target_lengths"), ctc_options(blank, red, zero_infinity), out);
  });
  return {loss, log_alpha};
}

// The saved forward variables, with the strides output_view gave them when empty.
std::optional<TensorView> alpha_view(const std::optional<at::Tensor>& log_alpha) {
  if (!log_alpha.has_value() || !log_alpha->defined()) return std::nullopt;
  return log_alpha->is_contiguous() ? output_view(*log_alpha, "log_alpha") : view(*log_alpha, "log_alpha");
}

at::Tensor ctc_loss_backward(const at::Tensor& grad_output, const at::Tensor& log_probs, const at::Tensor& targets,
                             const at::Tensor& input_lengths, const at::Tensor& target_lengths,
                             const std::optional<at::Tensor>& log_alpha, std::int64_t blank, std::int64_t red,
                             bool zero_infinity) {
  const BackwardChecks checked;
  at::Tensor grad = new_grad(log_probs, true);
  const DeviceCall call(log_probs);
  ctc_guarded([&] {
    ctc_backward(view(log_probs, "log_probs"), view(targets, "targets"), view(input_lengths, "input_lengths"),
                 view(target_lengths, "target_lengths"), view(grad_output, "grad_output"),
                 ctc_options(blank, red, zero_infinity), view(grad, "grad_log_probs"), alpha_view(log_alpha));
  });
  return grad;
}

}  // namespace
}  // namespace lossfuse::torch_binding

TORCH_LIBRARY_FRAGMENT(lossfuse, m) {
  m.def(
      "ctc_loss(Tensor log_probs, Tensor targets, Tensor input_lengths, Tensor target_lengths, int blank, "
      "int reduction, bool zero_infinity, bool save_log_alpha) -> (Tensor loss, Tensor log_alpha)");
  m.def(
      "ctc_loss_backward(Tensor grad_output, Tensor log_probs, Tensor targets, Tensor input_lengths, "
      "Tensor target_lengths, Tensor? log_alpha, int blank, int reduction, bool zero_infinity) -> Tensor");
}

namespace lossfuse::torch_binding {
namespace {

void register_kernels(torch::Library& m) {
  m.impl("ctc_loss", &ctc_loss);
  m.impl("ctc_loss_backward", &ctc_loss_backward);
}

}  // namespace
}  // namespace lossfuse::torch_binding

LOSSFUSE_DEVICE_KERNELS(lossfuse::torch_binding::register_kernels)
