// Elementwise-loss entries: checks (nothing written before they all pass), PwParams, the CPU kernel, the
// reduction.
#include "lossfuse/pointwise.hpp"

#include <cmath>
#include <string>
#include <vector>

#include "core/check.hpp"
#include "core/class_problem.hpp"
#include "core/pointwise_params.hpp"
#include "cpu/kernels.hpp"

namespace lossfuse {
namespace {

using core::PwKind;
using core::PwParams;

// How 'mean' divides: by the element count, or (mse, l1 with a weight) by the sum of the weights.
enum class MeanOver { numel, weight_sum };

struct PwCall {
  PwKind kind;
  Reduction reduction;
  MeanOver mean_over = MeanOver::numel;
  double a = 0, b = 0;
  const std::optional<TensorView>* weight = nullptr;
};

void check_output_view(const TensorView& t, std::string_view name) {
  for (int i = 0; i < t.ndim; ++i) {
    if (t.strides[i] == 0 && t.shape[i] > 1) {
      throw Error(ErrorCode::bad_pointer, std::string(name), "a view without repeated elements",
                  "stride 0 in dim " + std::to_string(i) + " of size " + std::to_string(t.shape[i]));
    }
  }
}

void run(const PwCall& c, const TensorView& x, const TensorView& y, const TensorView* loss,
         const std::optional<TensorView>& grad_loss, const PointwiseGrads* grads) {
  core::check_reduction(c.reduction);
  core::check_view(x, "input");
  core::check_floating(x, "input");
  core::check_view(y, "target");
  core::check_dtype(y, "target", x.dtype);
  core::check_shape(y, "target", x.shape.data(), x.ndim);
  const DType acc = accumulate_dtype(x.dtype);
  std::vector<core::NamedView> read = {{"input", &x}, {"target", &y}}, written;
  const TensorView* w = (c.weight != nullptr && *c.weight) ? &**c.weight : nullptr;
  if (w != nullptr) {
    core::check_view(*w, "weight");
    core::check_dtype(*w, "weight", x.dtype);
    core::check_shape(*w, "weight", x.shape.data(), x.ndim);
    read.push_back({"weight", w});
  }
  if (loss != nullptr) {
    core::check_view(*loss, "loss");
    core::check_dtype(*loss, "loss", acc);
    core::check_reduced_shape(*loss, "loss", c.reduction, x.shape.data(), x.ndim);
    core::check_contiguous(*loss, "loss");
    written.push_back({"loss", loss});
  }
  if (grads != nullptr) {
    if (grad_loss) {
      core::check_view(*grad_loss, "grad_loss");
      core::check_dtype(*grad_loss, "grad_loss", acc);
      core::check_reduced_shape(*grad_loss, "grad_loss", c.reduction, x.shape.data(), x.ndim);
      read.push_back({"grad_loss", &*grad_loss});
    }
    for (const auto& [g, name] : {std::pair{&grads->input, "grad_input"}, std::pair{&grads->target, "grad_target"}}) {
      if (!*g) continue;
      core::check_view(**g, name);
      core::check_dtype(**g, name, x.dtype);
      core::check_shape(**g, name, x.shape.data(), x.ndim);
      check_output_view(**g, name);
      written.push_back({name, &**g});
    }
  }
  core::check_disjoint(written, read);

  PwParams p;
  p.kind = c.kind;
  p.backward = grads != nullptr;
  p.dtype = x.dtype;
  p.a = c.a;
  p.b = c.b;
  // A 0-d problem is one row of one element.
  p.ndim = x.ndim > 0 ? x.ndim : 1;
  for (int i = 0; i < p.ndim; ++i) p.shape[i] = x.ndim > 0 ? x.shape[i] : 1;
  auto set_view = [&](int v, const TensorView* t) {
    if (t == nullptr) return;
    p.ptr[v] = t->data;
    for (int i = 0; i < x.ndim; ++i) p.strides[v][i] = t->shape[i] == 1 ? 0 : t->strides[i];
  };
  set_view(core::kPwX, &x);
  set_view(core::kPwY, &y);
  set_view(core::kPwW, w);
  if (grads != nullptr) {
    if (grads->input) set_view(core::kPwGX, &*grads->input);
    if (grads->target) set_view(core::kPwGY, &*grads->target);
    if (grad_loss && c.reduction == Reduction::none) set_view(core::kPwGO, &*grad_loss);
  }
  p.numel = x.numel();
  p.inner = p.shape[p.ndim - 1];
  p.rows = p.inner > 0 ? p.numel / p.inner : 0;
  p.tile = 16384;
  p.tiles_per_row = p.inner > 0 ? (p.inner + p.tile - 1) / p.tile : 0;
  const std::int64_t tiles = p.rows * p.tiles_per_row;

  // 'mean' denominators: numel, or the sum of the weights (taken by the kernel's own pass when needed).
  std::vector<double> tile_loss, tile_weight;
  const bool weight_mean = c.reduction == Reduction::mean && c.mean_over == MeanOver::weight_sum && w != nullptr;
  double denominator = static_cast<double>(p.numel);
  if (weight_mean) {
    tile_weight.assign(static_cast<std::size_t>(tiles), 0.0);
    p.tile_weight = tile_weight.data();
  }
  if (grads != nullptr) {
    if (weight_mean) {
      // The backward needs sum(w) before it writes: a forward-direction pass that only sums the weights.
      PwParams q = p;
      q.backward = false;
      q.tile_loss = nullptr;
      for (int v = core::kPwGX; v < core::kPwViews; ++v) q.ptr[v] = nullptr;
      cpu::pointwise_run(q);
      denominator = 0;
      for (double t : tile_weight) denominator += t;
    }
    if (c.reduction != Reduction::none) {
      p.grad_scale = grad_loss ? core::read_scalar(*grad_loss) : 1.0;
      if (c.reduction == Reduction::mean) p.grad_scale /= denominator;
    }
    p.tile_weight = nullptr;
    cpu::pointwise_run(p);
    return;
  }
  if (c.reduction == Reduction::none) {
    p.loss_rows = loss->data;
  } else {
    tile_loss.assign(static_cast<std::size_t>(tiles), 0.0);
    p.tile_loss = tile_loss.data();
  }
  cpu::pointwise_run(p);
  if (c.reduction != Reduction::none) {
    if (weight_mean) {
      denominator = 0;
      for (double t : tile_weight) denominator += t;
    }
    core::write_reduced(*loss, tile_loss, c.reduction, denominator);
  }
}

}  // namespace

void mse_forward(const TensorView& input, const TensorView& target, const MseOptions& o, const TensorView& loss) {
  run({PwKind::mse, o.reduction, MeanOver::weight_sum, 0, 0, &o.weight}, input, target, &loss, std::nullopt, nullptr);
}
void mse_backward(const TensorView& input, const TensorView& target, const std::optional<TensorView>& grad_loss,
                  const MseOptions& o, const PointwiseGrads& grads) {
  run({PwKind::mse, o.reduction, MeanOver::weight_sum, 0, 0, &o.weight}, input, target, nullptr, grad_loss, &grads);
}

void l1_forward(const TensorView& input, const TensorView& target, const L1Options& o, const TensorView& loss) {
  run({PwKind::l1, o.reduction, MeanOver::weight_sum, 0, 0, &o.weight}, input, target, &loss, std::nullopt, nullptr);
}
void l1_backward(const TensorView& input, const TensorView& target, const std::optional<TensorView>& grad_loss,
                 const L1Options& o, const PointwiseGrads& grads) {
  run({PwKind::l1, o.reduction, MeanOver::weight_sum, 0, 0, &o.weight}, input, target, nullptr, grad_loss, &grads);
}

namespace {
void check_beta(double beta) {
  if (!(std::isfinite(beta) && beta >= 0)) {
    throw Error(ErrorCode::invalid_value, "beta", "a finite value >= 0", std::to_string(beta));
  }
}
void check_delta(double delta) {
  if (!(std::isfinite(delta) && delta > 0)) {
    throw Error(ErrorCode::invalid_value, "delta", "a finite value > 0", std::to_string(delta));
  }
}
}  // namespace

void smooth_l1_forward(const TensorView& input, const TensorView& target, const SmoothL1Options& o,
                       const TensorView& loss) {
  check_beta(o.beta);
  run({PwKind::smooth_l1, o.reduction, MeanOver::numel, o.beta, 0, nullptr}, input, target, &loss, std::nullopt,
      nullptr);
}
void smooth_l1_backward(const TensorView& input, const TensorView& target, const std::optional<TensorView>& grad_loss,
                        const SmoothL1Options& o, const PointwiseGrads& grads) {
  check_beta(o.beta);
  run({PwKind::smooth_l1, o.reduction, MeanOver::numel, o.beta, 0, nullptr}, input, target, nullptr, grad_loss,
      &grads);
}

void huber_forward(const TensorView& input, const TensorView& target, const HuberOptions& o, const TensorView& loss) {
  check_delta(o.delta);
  run({PwKind::huber, o.reduction, MeanOver::numel, o.delta, 0, &o.weight}, input, target, &loss, std::nullopt,
      nullptr);
}
void huber_backward(const TensorView& input, const TensorView& target, const std::optional<TensorView>& grad_loss,
                    const HuberOptions& o, const PointwiseGrads& grads) {
  check_delta(o.delta);
  run({PwKind::huber, o.reduction, MeanOver::numel, o.delta, 0, &o.weight}, input, target, nullptr, grad_loss, &grads);
}

}  // namespace lossfuse
