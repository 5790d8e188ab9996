// Cross-entropy and NLL as torch ops. The forward can write the gradient in the same pass (compute_grad), so a
// training step reads the logits once; the backward from the saved log-sum-exp serves reduction 'none' and
// calls that did not ask for the gradient up front.
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <array>
#include <cmath>
#include <tuple>
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
  at::Tensor lse = new_lse(logits, rows);
  at::Tensor z_loss = new_loss(logits, rows, red);
  at::Tensor grad = new_grad(logits, compute_grad);
  guarded_on(logits, [&] {
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
                                  std::int64_t ignore_index, double label_smoothing, double logit_scale, double softcap,
                                  double z_loss_scale) {
  const BackwardChecks checked;
  at::Tensor grad = new_grad(logits, true);
  guarded_on(logits, [&] {
    const auto o = ce_options(weight, red, ignore_index, label_smoothing, logit_scale, softcap, z_loss_scale);
    cross_entropy_backward(view(logits, "input"), view(target, "target"), view(lse, "lse"),
                           view(grad_loss, "grad_output"), o, view(grad, "grad_input"));
  });
  return grad;
}

// The lse and z_loss of an eager node's forward: handed out beside the node rather than as its outputs, so they need
// no mark_non_differentiable (which compiled autograd refuses in C++ nodes) and never join the graph.
using RowOutputs = std::array<at::Tensor, 2>;

// Whether the gradient a node holds was handed over: a one-element flag tensor in its saved_data. Compiled autograd
// runs a C++ node's backward on a copy of its saved_data (so erasing the held gradient there does not last), but the
// copy holds the same flag tensor, so the hand-over happens once in every case.
at::Tensor new_flag() { return at::zeros({}, at::TensorOptions().dtype(at::kBool)); }
bool& flag(torch::autograd::AutogradContext* ctx) { return *ctx->saved_data.at("handed").toTensor().data_ptr<bool>(); }

// The eager training step's cross-entropy, one C++ autograd node templated on how the forward writes the gradient
// (upstream gradient 1): into a buffer of its own (GradWrite::separate, _cross_entropy_eager) or over the logits
// (GradWrite::in_place, _cross_entropy_eager_inplace, cross_entropy(..., inplace=True)). The backward hands that
// gradient over once, scaled in place to the upstream gradient. Python's cross_entropy takes this road only for plain
// eager calls with class-index targets and reduction mean or sum (nothing tracing, no tensor subclass): it saves the
// tens of microseconds of a Python autograd.Function per step. Everything else, torch.compile included, goes through
// lossfuse::cross_entropy and its autograd registered from Python. A gradient handed over belongs to the caller (it
// may be accumulated into .grad or changed in place).
//  separate: a later backward through a retained graph computes a new gradient; a backward that must itself be
//    differentiable (create_graph=True) recomputes the loss through the registered op and differentiates it, as the
//    Python path does. Python takes the autograd.Function road where compiled autograd is on at the forward;
//    switched on later, compiled autograd calls this backward as it is (on a copy of the context).
//  in_place: a training step holds no N x V buffer beyond the logits. torch's own in-place rules apply first (not a
//    leaf that requires grad nor a view of one, not an output of split / chunk / unbind). The logits' version counter
//    is bumped, so an autograd node that saved them (a tanh before the loss, say) raises torch's in-place error in
//    its backward instead of reading the gradient as logits; backward checks the counter in turn, so a change to the
//    logits after the call raises too instead of changing the gradient. Nothing is kept for a second backward
//    through a retained graph or a differentiable backward: both raise, as the logits they would need are gone.
//    Python checks the rest first (reduction, no internal overlap, class-index targets).

// The gradient made for an upstream gradient of 1, brought in place to grad_loss by cross_entropy_scale_held: the value
// is read where it lives (on a GPU by the kernel: no synchronisation, capturable), a value of 1 writes nothing, and
// the ignored rows keep theirs (0, NaN for a NaN row), as torch's do, whatever the upstream gradient. No version bump:
// a node that saved another view of the logits' base after an in-place call (logits there) still passes its check.
at::Tensor scale_held(at::Tensor grad, const at::Tensor& grad_loss, const at::Tensor& target, std::int64_t red,
                      std::int64_t ignore_index) {
  const at::Tensor up = acc_grad_output(grad_loss, grad);
  guarded_on(grad, [&] {
    CrossEntropyOptions o;
    o.reduction = reduction(red);
    o.ignore_index = ignore_index;
    cross_entropy_scale_held(view(grad, "grad_input"), view(target, "target"), o, view(up, "grad_output"));
  });
  return grad;
}

// The separate node's backward (grad_loss defined).
at::Tensor eager_backward_separate(torch::autograd::AutogradContext* ctx, const at::Tensor& grad_loss) {
  // unpacked first in every case: raises torch's error if the logits were changed in place after the forward
  const auto saved = ctx->get_saved_variables();
  const auto a = ctx->saved_data["args"].toDoubleList();
  const auto red = static_cast<std::int64_t>(a[0]);
  const auto ignore_index = static_cast<std::int64_t>(a[1]);
  const std::optional<at::Tensor> weight = saved[2].defined() ? std::optional<at::Tensor>(saved[2]) : std::nullopt;
  if (at::GradMode::is_enabled()) {  // create_graph=True: a differentiable gradient
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("lossfuse::cross_entropy", "")
                               .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
                                   const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, std::int64_t,
                                   std::int64_t, double, double, double, double, bool)>();
    const at::Tensor loss =
        std::get<0>(op.call(saved[0], saved[1], weight, red, ignore_index, a[2], a[3], a[4], a[5], false));
    return torch::autograd::grad({loss}, {saved[0]}, {grad_loss}, /*retain_graph=*/true,
                                 /*create_graph=*/true)[0];
  }
  // The forward's gradient, handed over by the first backward. A retained graph's next backward makes a new one, by
  // the same forward kernel as the first so that it is the same to the bit (backward is reentrant, as gradcheck
  // checks), and scales it the same way.
  auto held = ctx->saved_data.find("grad");
  at::Tensor grad;
  if (held == ctx->saved_data.end() || flag(ctx)) {
    grad = std::get<3>(cross_entropy(saved[0], saved[1], weight, red, ignore_index, a[2], a[3], a[4], a[5],
                                     /*compute_grad=*/true));
  } else {
    grad = held->second.toTensor();
    ctx->saved_data.erase(held);
    flag(ctx) = true;
  }
  return scale_held(grad, grad_loss, saved[1], red, ignore_index);
}

// The in-place node's backward (grad_loss defined).
at::Tensor eager_backward_in_place(torch::autograd::AutogradContext* ctx, const at::Tensor& grad_loss) {
  TORCH_CHECK(!at::GradMode::is_enabled(),
              "lossfuse: cross_entropy(inplace=True): a differentiable backward (create_graph=True) needs the "
              "logits, which the forward overwrote with their gradient; call it with inplace=False");
  auto held = ctx->saved_data.find("grad");
  TORCH_CHECK(held != ctx->saved_data.end() && !flag(ctx),
              "lossfuse: cross_entropy(inplace=True): the gradient was handed over by an earlier backward through "
              "this graph, and it cannot be made again: the forward overwrote the logits with it; call it with "
              "inplace=False to backward more than once");
  at::Tensor grad = held->second.toTensor();
  const std::int64_t version = ctx->saved_data["version"].toInt();
  TORCH_CHECK(grad._version() == version,
              "lossfuse: cross_entropy(inplace=True): the logits, which hold their gradient since the forward, "
              "were modified in place after it (version ",
              grad._version(), ", expected ", version,
              "); leave them alone until backward, or call it with inplace=False");
  const at::Tensor target = ctx->saved_data["target"].toTensor();
  const std::int64_t ignore_index = ctx->saved_data["ignore_index"].toInt();
  ctx->saved_data.erase("grad");
  ctx->saved_data.erase("target");
  flag(ctx) = true;
  // (An inf upstream gradient gives NaN where a probability underflowed to 0 in the stored gradient, where torch's
  // may be inf.)
  return scale_held(grad, grad_loss, target, ctx->saved_data["red"].toInt(), ignore_index);
}

template <GradWrite kWrite>
struct CrossEntropyEagerNode : torch::autograd::Function<CrossEntropyEagerNode<kWrite>> {
  static constexpr bool kInPlace = kWrite == GradWrite::in_place;

  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits,
                                                const at::Tensor& target, const std::optional<at::Tensor>& weight,
                                                std::int64_t red, std::int64_t ignore_index, double label_smoothing,
                                                double logit_scale, double softcap, double z_loss_scale,
                                                RowOutputs* rows_out) {
    TORCH_CHECK(red == 1 || red == 2, "lossfuse: ", kInPlace ? "_cross_entropy_eager_inplace" : "_cross_entropy_eager",
                ": expected reduction 1 (mean) or 2 (sum), got ", red);
    at::Tensor loss, lse, z_loss, grad;
    if constexpr (kInPlace) {
      const auto rows = row_shape(logits);
      loss = new_loss(logits, rows, red);
      lse = new_lse(logits, rows);
      z_loss = new_loss(logits, rows, red);
      guarded_on(logits, [&] {
        const auto o = ce_options(weight, red, ignore_index, label_smoothing, logit_scale, softcap, z_loss_scale);
        const TensorView x = view(logits, "input");
        cross_entropy_forward_backward(
            x, view(target, "target"), o,
            CrossEntropyOutputs{view(loss, "loss"), view(lse, "lse"), view(z_loss, "z_loss")}, std::nullopt, x,
            GradWrite::in_place);
      });
      torch::autograd::impl::bump_version(logits);
      grad = logits.detach();  // the logits' storage, now their gradient (same version counter)
      ctx->saved_data["version"] = static_cast<std::int64_t>(logits._version());
      ctx->saved_data["target"] = target;  // for scale_held's ignored rows
      ctx->saved_data["ignore_index"] = ignore_index;
      ctx->saved_data["red"] = red;
    } else {
      std::tie(loss, lse, z_loss, grad) = cross_entropy(logits, target, weight, red, ignore_index, label_smoothing,
                                                        logit_scale, softcap, z_loss_scale, /*compute_grad=*/true);
      ctx->saved_data["args"] = c10::List<double>({static_cast<double>(red), static_cast<double>(ignore_index),
                                                   label_smoothing, logit_scale, softcap, z_loss_scale});
      ctx->save_for_backward({logits, target, weight.has_value() ? *weight : at::Tensor()});
    }
    *rows_out = {lse, z_loss};
    ctx->set_materialize_grads(false);
    // Not saved through save_for_backward: backward scales it in place (a saved variable would fail its version
    // check) and then lets it go.
    ctx->saved_data["grad"] = grad;
    ctx->saved_data["handed"] = new_flag();
    // in the input's dtype, as torch returns it (no separate conversion node in the graph)
    return {loss.scalar_type() == logits.scalar_type() ? loss : loss.to(logits.scalar_type())};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    torch::autograd::variable_list out(10);
    if (!grads[0].defined()) return out;
    const BackwardChecks checked;  // also the forward kernel a retained graph's next backward runs
    out[0] = kInPlace ? eager_backward_in_place(ctx, grads[0]) : eager_backward_separate(ctx, grads[0]);
    return out;
  }
};

template <GradWrite kWrite>
std::tuple<at::Tensor, at::Tensor, at::Tensor> cross_entropy_eager(const at::Tensor& logits, const at::Tensor& target,
                                                                   const std::optional<at::Tensor>& weight,
                                                                   std::int64_t red, std::int64_t ignore_index,
                                                                   double label_smoothing, double logit_scale,
                                                                   double softcap, double z_loss_scale) {
  // torch's in-place rules, checked here in grad mode (forward runs without it, where they pass everything)
  if constexpr (kWrite == GradWrite::in_place) torch::autograd::check_inplace(logits, /*requires_grad=*/true);
  RowOutputs rows;
  auto out = CrossEntropyEagerNode<kWrite>::apply(logits, target, weight, red, ignore_index, label_smoothing,
                                                  logit_scale, softcap, z_loss_scale, &rows);
  return {out[0], rows[0], rows[1]};
}

// The backward from the saved lse, written over the logits (GradWrite::in_place): lossfuse.distributed's
// vocab_parallel_cross_entropy(inplace=True) turns its saved slice into its gradient. The version counter is bumped,
// so a later use of the saved logits (a retained graph's next backward) raises torch's in-place error.
void cross_entropy_backward_inplace(const at::Tensor& grad_loss, const at::Tensor& logits, const at::Tensor& target,
                                    const at::Tensor& lse, const std::optional<at::Tensor>& weight, std::int64_t red,
                                    std::int64_t ignore_index, double label_smoothing, double logit_scale,
                                    double softcap, double z_loss_scale) {
  const BackwardChecks checked;
  guarded_on(logits, [&] {
    const auto o = ce_options(weight, red, ignore_index, label_smoothing, logit_scale, softcap, z_loss_scale);
    const TensorView x = view(logits, "input");
    cross_entropy_backward(x, view(target, "target"), view(lse, "lse"), view(grad_loss, "grad_output"), o, x,
                           GradWrite::in_place);
  });
  torch::autograd::impl::bump_version(logits);
}

// The autograd.Function road's hand-over of an autocast float32 loss's gradient (Python's cross_entropy backward):
// cross_entropy_backward_held, made again from the lse unless the upstream value is 1 (read by the kernel).
void cross_entropy_backward_held_op(const at::Tensor& grad, const at::Tensor& grad_loss, const at::Tensor& logits,
                                    const at::Tensor& target, const at::Tensor& lse,
                                    const std::optional<at::Tensor>& weight, std::int64_t red,
                                    std::int64_t ignore_index, double label_smoothing, double logit_scale,
                                    double softcap, double z_loss_scale) {
  guarded_on(logits, [&] {
    const auto o = ce_options(weight, red, ignore_index, label_smoothing, logit_scale, softcap, z_loss_scale);
    cross_entropy_backward_held(view(logits, "input"), view(target, "target"), view(lse, "lse"),
                                view(grad_loss, "grad_output"), o, view(grad, "grad_input"));
  });
}

// The autograd.Function road's hand-over (Python's cross_entropy backward): scale_held as an op.
void cross_entropy_scale_held_op(const at::Tensor& grad, const at::Tensor& grad_loss, const at::Tensor& target,
                                 std::int64_t red, std::int64_t ignore_index) {
  (void)scale_held(grad, grad_loss, target, red, ignore_index);
}

// torch's rules for writing t in place (not a leaf that requires grad nor a view of one, not an output of split,
// chunk or unbind), checked in the caller's grad mode: torch's error, or nothing.
void check_inplace(const at::Tensor& t) { torch::autograd::check_inplace(t, /*requires_grad=*/true); }

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
  guarded_on(input, [&] {
    nll_forward(view(input, "input"), view(target, "target"), nll_options(weight, red, ignore_index),
                view(loss, "loss"));
  });
  return loss;
}

at::Tensor nll_loss_backward(const at::Tensor& grad_loss, const at::Tensor& input, const at::Tensor& target,
                             const std::optional<at::Tensor>& weight, std::int64_t red, std::int64_t ignore_index) {
  const BackwardChecks checked;
  at::Tensor grad = new_grad(input, true);
  guarded_on(input, [&] {
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
  // Internal: the eager fast path of lossfuse.nn.functional.cross_entropy (see CrossEntropyEagerNode); not traceable.
  m.def(
      "_cross_entropy_eager(Tensor input, Tensor target, Tensor? weight, int reduction, int ignore_index, "
      "float label_smoothing, float logit_scale, float softcap, float z_loss_scale) "
      "-> (Tensor loss, Tensor lse, Tensor z_loss)");
  // Internal: cross_entropy(..., inplace=True) in plain eager mode (see CrossEntropyEagerNode); not traceable.
  m.def(
      "_cross_entropy_eager_inplace(Tensor(a!) input, Tensor target, Tensor? weight, int reduction, "
      "int ignore_index, float label_smoothing, float logit_scale, float softcap, float z_loss_scale) "
      "-> (Tensor loss, Tensor lse, Tensor z_loss)");
  // Internal: vocab_parallel_cross_entropy(inplace=True)'s backward, and its check of torch's in-place rules.
  m.def(
      "_cross_entropy_backward_inplace(Tensor grad_output, Tensor(a!) input, Tensor target, Tensor lse, "
      "Tensor? weight, int reduction, int ignore_index, float label_smoothing, float logit_scale, float softcap, "
      "float z_loss_scale) -> ()");
  m.def("_check_inplace(Tensor input) -> ()");
  // Internal: a gradient made in the forward for an upstream gradient of 1 brought to grad_output in place
  // (lossfuse::cross_entropy_scale_held: nothing is read back).
  m.def(
      "_cross_entropy_scale_held_(Tensor(a!) grad, Tensor grad_output, Tensor target, int reduction, "
      "int ignore_index) -> ()");
  // Internal: the same gradient made again from the lse for grad_output, unless that is 1, rounded once
  // (lossfuse::cross_entropy_backward_held: nothing is read back).
  m.def(
      "_cross_entropy_backward_held_(Tensor(a!) grad, Tensor grad_output, Tensor input, Tensor target, Tensor lse, "
      "Tensor? weight, int reduction, int ignore_index, float label_smoothing, float logit_scale, float softcap, "
      "float z_loss_scale) -> ()");
  m.def("nll_loss(Tensor input, Tensor target, Tensor? weight, int reduction, int ignore_index) -> Tensor");
  m.def(
      "nll_loss_backward(Tensor grad_output, Tensor input, Tensor target, Tensor? weight, int reduction, "
      "int ignore_index) -> Tensor");
}

namespace lossfuse::torch_binding {
namespace {
// The device kernels: the same functions on the CPU and, with the CUDA route, on CUDA (device.hpp).
void register_kernels(torch::Library& m) {
  m.impl("cross_entropy", &cross_entropy);
  m.impl("cross_entropy_backward", &cross_entropy_backward);
  m.impl("_cross_entropy_backward_inplace", &cross_entropy_backward_inplace);
  m.impl("_cross_entropy_scale_held_", &cross_entropy_scale_held_op);
  m.impl("_cross_entropy_backward_held_", &cross_entropy_backward_held_op);
  m.impl("nll_loss", &nll_loss);
  m.impl("nll_loss_backward", &nll_loss_backward);
}
}  // namespace
}  // namespace lossfuse::torch_binding

LOSSFUSE_DEVICE_KERNELS(lossfuse::torch_binding::register_kernels)

TORCH_LIBRARY_IMPL(lossfuse, CompositeImplicitAutograd, m) {
  m.impl("_cross_entropy_eager", &lossfuse::torch_binding::cross_entropy_eager<lossfuse::GradWrite::separate>);
  m.impl("_cross_entropy_eager_inplace", &lossfuse::torch_binding::cross_entropy_eager<lossfuse::GradWrite::in_place>);
  m.impl("_check_inplace", &lossfuse::torch_binding::check_inplace);
}
