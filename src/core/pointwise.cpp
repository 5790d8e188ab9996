// Elementwise-loss entries (forward, backward, both in one pass): checks (nothing written before they all pass),
// PwParams, the backend's kernel, the reduction.
#include "lossfuse/pointwise.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

#include "core/backend.hpp"
#include "core/check.hpp"
#include "core/class_problem.hpp"
#include "core/pointwise_params.hpp"
#include "core/targets.hpp"
#include "lossfuse/parallel.hpp"
#include "math/half.hpp"
#include "math/storage.hpp"

namespace lossfuse {
namespace {

using core::PwParams;

// How 'mean' divides: by the element count, or (mse, l1 with a weight) by the sum of the weights.
enum class MeanOver { numel, weight_sum };

// Value checks made before anything is written (scan_values below).
enum class Scan { none, input_unit_interval, z_nonnegative };

struct PwCall {
  LossKind kind;
  Reduction reduction;
  MeanOver mean_over = MeanOver::numel;
  double a = 0, b = 0;
  const std::optional<TensorView>* weight = nullptr;
  std::uint8_t flags = 0;
  const TensorView* z = nullptr;  // third operand (bce_with_logits: pos_weight; gaussian_nll: var; ...)
  const char* x_name = "input";
  const char* y_name = "target";
  const char* z_name = nullptr;
  bool y_differentiable = true;  // torch differentiates the target
  bool z_differentiable = false;
  double mean_denominator = -1;  // >= 0: replaces numel as 'mean' divisor (kl_div batchmean)
  Scan scan = Scan::none;
};

// The gradient outputs of one call, in operand order x, y, z, with their argument names.
struct GradOut {
  const std::optional<TensorView>* g[3] = {nullptr, nullptr, nullptr};
  const char* name[3] = {"grad_input", "grad_target", "grad_var"};
  bool held = false;  // PointwiseGrads::held
};

// Row-major position of flat index i in shape t: "[i0, i1, ...]", and its element offset.
std::string position(const TensorView& t, std::int64_t i, std::int64_t* offset) {
  std::int64_t coords[kMaxDims] = {};
  for (int k = t.ndim - 1; k >= 0; --k) {
    coords[k] = i % t.shape[k];
    i /= t.shape[k];
  }
  std::string pos = "[";
  *offset = 0;
  for (int k = 0; k < t.ndim; ++k) {
    pos += (k ? ", " : "") + std::to_string(coords[k]);
    *offset += coords[k] * t.strides[k];
  }
  return pos + "]";
}

// Throws invalid_value naming `name`, `expected` and the first element (row-major order) where ok(v) is false,
// with its position and value. A device operand is scanned in a host copy (a read-back of the whole operand, which
// run() asks for only once a kernel pass has flagged a tile).
// Blocks of elements are scanned in parallel, each without an early exit: a
// contiguous block by the backend's vectorized bit test value_scan (`kind`, the same test as ok), others
// element by element. Only a block holding a bad element is searched for the first one.
template <class Ok>
void scan_values(const TensorView& view, const char* name, const char* expected, core::ValueScan kind, Ok ok) {
  const core::HostCopy host(view);  // the view itself on the CPU; a copy of a device operand's elements
  const TensorView& t = host.view();
  const core::Backend& be = core::backend_for(t, name);
  const std::int64_t n = t.numel();
  constexpr std::int64_t kBlock = 4096;
  const std::int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<std::int64_t> first_bad(static_cast<std::size_t>(blocks), -1);
  const bool contiguous = t.is_contiguous();
  math::visit_float_dtype(t.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* data = static_cast<const T*>(t.data);
    parallel_for(0, blocks, 16, [&](std::int64_t b0, std::int64_t b1) {
      for (std::int64_t b = b0; b < b1; ++b) {
        const std::int64_t i0 = b * kBlock, i1 = std::min(n, i0 + kBlock);
        auto value = [&](std::int64_t i) {
          std::int64_t off = i;
          if (!contiguous) (void)position(t, i, &off);
          return static_cast<double>(math::Io<T>::load(data, off));
        };
        bool any = false;
        if (contiguous) {
          any = !be.value_scan(t.dtype, data + i0, i1 - i0, kind);
        } else {
          for (std::int64_t i = i0; i < i1 && !any; ++i) any = !ok(value(i));
        }
        if (!any) continue;
        for (std::int64_t i = i0; i < i1; ++i) {
          if (!ok(value(i))) {
            first_bad[static_cast<std::size_t>(b)] = i;
            break;
          }
        }
      }
    });
  });
  for (const std::int64_t i : first_bad) {
    if (i < 0) continue;
    std::int64_t off = 0;
    const std::string pos = position(t, i, &off);
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.9g", core::read_as_double(t.data, t.dtype, off));
    throw Error(ErrorCode::invalid_value, name, expected, std::string(buf) + " at position " + pos);
  }
}

// Merges adjacent dims that every view walks as one (dims of size 1 dropped; dim k joins the dims after it when each
// present view's stride there is their size times its stride on them: contiguous, or broadcast in both), so rows are
// as long as the layout allows: an (N, 1) or a contiguous (N, 4) problem is one row of N or 4N elements, not N rows of
// one or four (a tile per row: 155x slower for (4M, 1) mse). The rows' order and each element's offset are unchanged.
void merge_dims(PwParams& p) {
  std::int64_t shape[kMaxDims], strides[core::kPwViews][kMaxDims];
  int n = 0;  // merged dims, built from the last
  for (int k = p.ndim - 1; k >= 0; --k) {
    if (p.shape[k] == 1 && !(k == 0 && n == 0)) continue;  // no effect on any offset (keep one dim)
    bool joins = n > 0;
    for (int v = 0; v < core::kPwViews && joins; ++v) {
      if (p.ptr[v] != nullptr) joins = p.strides[v][k] == shape[n - 1] * strides[v][n - 1];
    }
    if (joins) {
      shape[n - 1] *= p.shape[k];
      continue;
    }
    shape[n] = p.shape[k];
    for (int v = 0; v < core::kPwViews; ++v) strides[v][n] = p.strides[v][k];
    ++n;
  }
  p.ndim = n;
  for (int k = 0; k < n; ++k) {  // back to outer-to-inner order
    p.shape[k] = shape[n - 1 - k];
    for (int v = 0; v < core::kPwViews; ++v) p.strides[v][k] = strides[v][n - 1 - k];
  }
}

void run(const PwCall& c, const TensorView& x, const TensorView& y, const TensorView* loss,
         const std::optional<TensorView>& grad_loss, const GradOut* grads) {
  const core::Backend& be = core::backend_for(x, c.x_name);
  const Device dev = x.device;  // every operand and output on the input's device
  core::check_reduction(c.reduction);
  core::check_view(x, c.x_name, dev);
  core::check_floating(x, c.x_name);
  core::check_view(y, c.y_name, dev);
  core::check_dtype(y, c.y_name, x.dtype);
  core::check_shape(y, c.y_name, x.shape.data(), x.ndim);
  const DType acc = accumulate_dtype(x.dtype);
  std::vector<core::NamedView> read = {{c.x_name, &x}, {c.y_name, &y}}, written;
  const TensorView* w = (c.weight != nullptr && *c.weight) ? &**c.weight : nullptr;
  if (w != nullptr) {
    core::check_view(*w, "weight", dev);
    core::check_dtype(*w, "weight", x.dtype);
    core::check_shape(*w, "weight", x.shape.data(), x.ndim);
    read.push_back({"weight", w});
  }
  if (c.z != nullptr) {
    core::check_view(*c.z, c.z_name, dev);
    core::check_dtype(*c.z, c.z_name, x.dtype);
    core::check_shape(*c.z, c.z_name, x.shape.data(), x.ndim);
    read.push_back({c.z_name, c.z});
  }
  if (loss != nullptr) {
    core::check_view(*loss, "loss", dev);
    core::check_dtype(*loss, "loss", acc);
    core::check_reduced_shape(*loss, "loss", c.reduction, x.shape.data(), x.ndim);
    core::check_contiguous(*loss, "loss");
    written.push_back({"loss", loss});
  }
  if (grads != nullptr) {
    if (grad_loss) {
      core::check_view(*grad_loss, "grad_loss", dev);
      core::check_dtype(*grad_loss, "grad_loss", acc);
      core::check_reduced_shape(*grad_loss, "grad_loss", c.reduction, x.shape.data(), x.ndim);
      read.push_back({"grad_loss", &*grad_loss});
    }
    const bool differentiable[3] = {true, c.y_differentiable, c.z != nullptr && c.z_differentiable};
    for (int v = 0; v < 3; ++v) {
      const std::optional<TensorView>* g = grads->g[v];
      if (g == nullptr || !*g) continue;
      const char* name = grads->name[v];
      if (!differentiable[v]) {
        const char* operand = v == 1 ? c.y_name : (c.z_name != nullptr ? c.z_name : "a third operand");
        throw Error(ErrorCode::invalid_value, name,
                    std::string("absent: this loss has no gradient for ") + operand + " (torch gives none)",
                    "a gradient view");
      }
      core::check_view(**g, name, dev);
      core::check_dtype(**g, name, x.dtype);
      core::check_shape(**g, name, x.shape.data(), x.ndim);
      written.push_back({name, &**g});
    }
  }
  core::check_disjoint(written, read);
  // Held gradients (PointwiseGrads::held) stand as they are for an upstream gradient of 1: absent, or (on the CPU)
  // read as 1 here; a device call tests it in its kernels. Their operands passed the value checks in the fused call
  // that made them, so a held call makes none.
  const bool held = grads != nullptr && grads->held && c.reduction != Reduction::none;
  if (grads != nullptr && grads->held && loss != nullptr) {
    throw Error(ErrorCode::invalid_value, "grads.held", "false (a forward_backward call writes its gradients)", "true");
  }
  if (held && (!grad_loss || (dev == Device::cpu && core::read_scalar(*grad_loss) == 1.0))) return;
  // Value checks last: they read every element, and no write happens before they pass. A reduced forward writes
  // only after its kernel, so there the kernel checks in the same pass and the scan runs only to report a failure.
  auto scan = [&] {
    if (c.scan == Scan::input_unit_interval) {
      scan_values(x, c.x_name, "every element in [0, 1]", core::ValueScan::unit_interval,
                  [](auto v) { return (v >= 0) & (v <= 1); });
    } else if (c.scan == Scan::z_nonnegative) {
      // NaN passes, as torch's any(var < 0).
      scan_values(*c.z, c.z_name, "every element >= 0", core::ValueScan::non_negative, [](auto v) { return !(v < 0); });
    }
  };
  const bool check_in_kernel = grads == nullptr && c.reduction != Reduction::none && c.scan != Scan::none;
  const core::PwCheck kernel_check =
      c.scan == Scan::input_unit_interval ? core::PwCheck::x_unit_interval : core::PwCheck::z_nonnegative;

  PwParams p;
  p.kind = c.kind;
  p.backward = grads != nullptr;
  p.dtype = x.dtype;
  p.a = c.a;
  p.b = c.b;
  p.flags = c.flags;
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
  set_view(core::kPwZ, c.z);
  set_view(core::kPwW, w);
  if (grads != nullptr) {
    for (int v = 0; v < 3; ++v) {
      if (grads->g[v] != nullptr && *grads->g[v]) set_view(core::kPwGX + v, &**grads->g[v]);
    }
    if (grad_loss && c.reduction == Reduction::none) set_view(core::kPwGO, &*grad_loss);
  }
  p.numel = x.numel();
  if (p.numel > 0) merge_dims(p);
  p.inner = p.shape[p.ndim - 1];
  p.rows = p.inner > 0 ? p.numel / p.inner : 0;
  p.tile = 16384;
  p.tiles_per_row = p.inner > 0 ? (p.inner + p.tile - 1) / p.tile : 0;
  const std::int64_t tiles = p.rows * p.tiles_per_row;
  const bool weight_mean = c.reduction == Reduction::mean && c.mean_over == MeanOver::weight_sum && w != nullptr;
  double denominator = c.mean_denominator >= 0 ? c.mean_denominator : static_cast<double>(p.numel);
  if (dev != Device::cpu) {  // a device call: every step on the device (PwDeviceCall)
    core::PwDeviceCall call;
    call.reduction = c.reduction;
    call.weight_mean = weight_mean;
    call.denominator = denominator;
    if (grads != nullptr && c.reduction != Reduction::none && grad_loss) call.grad_scalar = grad_loss->data;
    call.skip_if_one = held;
    if (loss != nullptr) (c.reduction == Reduction::none ? p.loss_rows : call.loss) = loss->data;
    call.check = c.scan == Scan::none || held ? core::PwCheck::none : kernel_check;
    p.device_call = &call;
    be.pointwise(p);
    if (!call.bad) return;
    scan();                            // throws, naming the first bad element; nothing was written
    call.check = core::PwCheck::none;  // (the exact scan passed what the kernel flagged: the call, unchecked)
    call.bad = false;
    be.pointwise(p);
    return;
  }
  if (!check_in_kernel && c.scan != Scan::none && !held) scan();  // on the CPU the scan itself is the fast pass
  // 'mean' denominators: numel, or the sum of the weights (taken by the kernel's own pass when needed).
  std::vector<double> tile_loss, tile_weight;
  if (weight_mean) {
    tile_weight.assign(static_cast<std::size_t>(tiles), 0.0);
    p.tile_weight = tile_weight.data();
  }
  if (grads != nullptr) {  // backward, or forward and backward in one pass (loss != nullptr)
    if (weight_mean) {
      // The backward needs sum(w) before it writes: a forward-direction pass that only sums the weights.
      PwParams q = p;
      q.backward = false;
      q.tile_loss = nullptr;
      for (int v = core::kPwGX; v < core::kPwViews; ++v) q.ptr[v] = nullptr;
      be.pointwise(q);
      denominator = 0;
      for (double t : tile_weight) denominator += t;
    }
    if (c.reduction != Reduction::none) {
      p.grad_scale = grad_loss ? core::read_scalar(*grad_loss) : 1.0;
      if (c.reduction == Reduction::mean) p.grad_scale /= denominator;
    }
    p.tile_weight = nullptr;
    if (loss == nullptr) {
      be.pointwise(p);
      return;
    }
  }
  if (c.reduction == Reduction::none) {
    p.loss_rows = loss->data;
  } else {
    tile_loss.assign(static_cast<std::size_t>(tiles), 0.0);
    p.tile_loss = tile_loss.data();
  }
  std::vector<char> tile_bad;
  if (check_in_kernel) {
    tile_bad.assign(static_cast<std::size_t>(tiles), 0);
    p.tile_bad = tile_bad.data();
    p.check = kernel_check;
  }
  be.pointwise(p);
  // A flagged tile may hold a bad value (the kernel's test is conservative: bce's flags -0 too); the exact scan
  // throws, naming the first bad element, or passes and the result stands.
  if (std::find(tile_bad.begin(), tile_bad.end(), char(1)) != tile_bad.end()) scan();
  if (c.reduction != Reduction::none) {
    if (weight_mean && grads == nullptr) {  // (the fused pass took it from the weights' pass above)
      denominator = 0;
      for (double t : tile_weight) denominator += t;
    }
    core::write_reduced(*loss, tile_loss, c.reduction, denominator);
  }
}

GradOut grads_of(const PointwiseGrads& g) {
  GradOut o;
  o.held = g.held;
  o.g[0] = &g.input;
  o.g[1] = &g.target;
  o.g[2] = &g.var;
  return o;
}

GradOut grads_of(const MarginRankingGrads& g) {
  GradOut o;
  o.held = g.held;
  o.g[0] = &g.input1;
  o.g[1] = &g.input2;
  o.g[2] = &g.target;
  o.name[0] = "grad_input1";
  o.name[1] = "grad_input2";
  o.name[2] = "grad_target";
  return o;
}

// The fused entry of a loss: its forward's loss and its backward's gradients for an upstream gradient of 1.
template <class Grads>
void fused(const PwCall& c, const TensorView& x, const TensorView& y, const TensorView& loss, const Grads& grads) {
  const GradOut go = grads_of(grads);
  run(c, x, y, &loss, std::nullopt, &go);
}

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
PwCall mse_call(const MseOptions& o) { return {LossKind::mse, o.reduction, MeanOver::weight_sum, 0, 0, &o.weight}; }
PwCall l1_call(const L1Options& o) { return {LossKind::l1, o.reduction, MeanOver::weight_sum, 0, 0, &o.weight}; }
PwCall smooth_l1_call(const SmoothL1Options& o) {
  check_beta(o.beta);
  return {LossKind::smooth_l1, o.reduction, MeanOver::numel, o.beta, 0, nullptr};
}
PwCall huber_call(const HuberOptions& o) {
  check_delta(o.delta);
  return {LossKind::huber, o.reduction, MeanOver::numel, o.delta, 0, &o.weight};
}
}  // namespace

void mse_forward(const TensorView& input, const TensorView& target, const MseOptions& o, const TensorView& loss) {
  run(mse_call(o), input, target, &loss, std::nullopt, nullptr);
}
void mse_backward(const TensorView& input, const TensorView& target, const std::optional<TensorView>& grad_loss,
                  const MseOptions& o, const PointwiseGrads& grads) {
  const GradOut go = grads_of(grads);
  run(mse_call(o), input, target, nullptr, grad_loss, &go);
}

void l1_forward(const TensorView& input, const TensorView& target, const L1Options& o, const TensorView& loss) {
  run(l1_call(o), input, target, &loss, std::nullopt, nullptr);
}
void l1_backward(const TensorView& input, const TensorView& target, const std::optional<TensorView>& grad_loss,
                 const L1Options& o, const PointwiseGrads& grads) {
  const GradOut go = grads_of(grads);
  run(l1_call(o), input, target, nullptr, grad_loss, &go);
}

void smooth_l1_forward(const TensorView& input, const TensorView& target, const SmoothL1Options& o,
                       const TensorView& loss) {
  run(smooth_l1_call(o), input, target, &loss, std::nullopt, nullptr);
}
void smooth_l1_backward(const TensorView& input, const TensorView& target, const std::optional<TensorView>& grad_loss,
                        const SmoothL1Options& o, const PointwiseGrads& grads) {
  const GradOut go = grads_of(grads);
  run(smooth_l1_call(o), input, target, nullptr, grad_loss, &go);
}

void huber_forward(const TensorView& input, const TensorView& target, const HuberOptions& o, const TensorView& loss) {
  run(huber_call(o), input, target, &loss, std::nullopt, nullptr);
}
void huber_backward(const TensorView& input, const TensorView& target, const std::optional<TensorView>& grad_loss,
                    const HuberOptions& o, const PointwiseGrads& grads) {
  const GradOut go = grads_of(grads);
  run(huber_call(o), input, target, nullptr, grad_loss, &go);
}

namespace {
void check_finite(double v, const char* name) {
  if (!std::isfinite(v)) throw Error(ErrorCode::invalid_value, name, "a finite value", std::to_string(v));
}
PwCall bce_call(const BceOptions& o) {
  // torch's EPSILON is the float 1e-12 (9.99999996e-13) for every dtype: a float64 gradient at x = 0 or 1 is
  // (x - y) / 9.99999996e-13 there (checked against torch 2.15).
  PwCall c{LossKind::bce, o.reduction, MeanOver::numel, static_cast<double>(1e-12f), 0, &o.weight};
  c.scan = Scan::input_unit_interval;
  return c;
}
PwCall bce_logits_call(const BceWithLogitsOptions& o) {
  PwCall c{LossKind::bce_with_logits, o.reduction, MeanOver::numel, 0, 0, &o.weight};
  if (o.pos_weight) {
    c.z = &*o.pos_weight;
    c.z_name = "pos_weight";
    c.flags = core::kPwPosWeight;
  }
  return c;
}
PwCall kl_call(const KlDivOptions& o, const TensorView& input) {
  if (o.batchmean && o.reduction != Reduction::mean) {
    throw Error(ErrorCode::invalid_value, "batchmean", "false unless reduction is mean ('batchmean' is a mean)",
                std::string("true with reduction ") + std::string(reduction_name(o.reduction)));
  }
  PwCall c{LossKind::kl_div, o.reduction, MeanOver::numel, 0, 0, nullptr};
  c.flags = o.log_target ? core::kPwLogTarget : 0;
  // torch's 'batchmean': sum / input.size(0); a 0-d input is not divided. An input with size(0) == 0 gives
  // 0 / 0 = nan, as torch.
  if (o.batchmean && input.ndim >= 0 && input.ndim <= kMaxDims) {
    c.mean_denominator = input.ndim > 0 ? static_cast<double>(input.shape[0]) : 1.0;
  }
  return c;
}
PwCall poisson_call(const PoissonNllOptions& o) {
  check_finite(o.eps, "eps");
  PwCall c{LossKind::poisson_nll, o.reduction, MeanOver::numel, o.eps, 6.283185307179586, nullptr};  // 2 pi
  c.flags = static_cast<std::uint8_t>((o.log_input ? core::kPwLogInput : 0) | (o.full ? core::kPwFull : 0));
  return c;
}
PwCall gaussian_call(const GaussianNllOptions& o, const TensorView& var) {
  check_finite(o.eps, "eps");
  // full adds the constant 0.5 log(2 pi).
  PwCall c{LossKind::gaussian_nll, o.reduction, MeanOver::numel, o.eps, o.full ? 0.91893853320467274178 : 0.0, nullptr};
  c.z = &var;
  c.z_name = "var";
  c.z_differentiable = true;
  c.scan = Scan::z_nonnegative;
  return c;
}
PwCall hinge_call(const HingeEmbeddingOptions& o) {
  check_finite(o.margin, "margin");
  PwCall c{LossKind::hinge_embedding, o.reduction, MeanOver::numel, o.margin, 0, nullptr};
  c.y_differentiable = false;
  return c;
}
PwCall ranking_call(const MarginRankingOptions& o, const TensorView& target) {
  check_finite(o.margin, "margin");
  PwCall c{LossKind::margin_ranking, o.reduction, MeanOver::numel, o.margin, 0, nullptr};
  // x = input1, y = input2, z = target
  c.x_name = "input1";
  c.y_name = "input2";
  c.z = &target;
  c.z_name = "target";
  c.z_differentiable = true;
  return c;
}
}  // namespace

void bce_forward(const TensorView& input, const TensorView& target, const BceOptions& o, const TensorView& loss) {
  run(bce_call(o), input, target, &loss, std::nullopt, nullptr);
}
void bce_backward(const TensorView& input, const TensorView& target, const std::optional<TensorView>& grad_loss,
                  const BceOptions& o, const PointwiseGrads& grads) {
  const GradOut go = grads_of(grads);
  run(bce_call(o), input, target, nullptr, grad_loss, &go);
}

void bce_with_logits_forward(const TensorView& input, const TensorView& target, const BceWithLogitsOptions& o,
                             const TensorView& loss) {
  run(bce_logits_call(o), input, target, &loss, std::nullopt, nullptr);
}
void bce_with_logits_backward(const TensorView& input, const TensorView& target,
                              const std::optional<TensorView>& grad_loss, const BceWithLogitsOptions& o,
                              const PointwiseGrads& grads) {
  const GradOut go = grads_of(grads);
  run(bce_logits_call(o), input, target, nullptr, grad_loss, &go);
}

void kl_div_forward(const TensorView& input, const TensorView& target, const KlDivOptions& o, const TensorView& loss) {
  run(kl_call(o, input), input, target, &loss, std::nullopt, nullptr);
}
void kl_div_backward(const TensorView& input, const TensorView& target, const std::optional<TensorView>& grad_loss,
                     const KlDivOptions& o, const PointwiseGrads& grads) {
  const GradOut go = grads_of(grads);
  run(kl_call(o, input), input, target, nullptr, grad_loss, &go);
}

void poisson_nll_forward(const TensorView& input, const TensorView& target, const PoissonNllOptions& o,
                         const TensorView& loss) {
  run(poisson_call(o), input, target, &loss, std::nullopt, nullptr);
}
void poisson_nll_backward(const TensorView& input, const TensorView& target, const std::optional<TensorView>& grad_loss,
                          const PoissonNllOptions& o, const PointwiseGrads& grads) {
  const GradOut go = grads_of(grads);
  run(poisson_call(o), input, target, nullptr, grad_loss, &go);
}

void gaussian_nll_forward(const TensorView& input, const TensorView& target, const TensorView& var,
                          const GaussianNllOptions& o, const TensorView& loss) {
  run(gaussian_call(o, var), input, target, &loss, std::nullopt, nullptr);
}
void gaussian_nll_backward(const TensorView& input, const TensorView& target, const TensorView& var,
                           const std::optional<TensorView>& grad_loss, const GaussianNllOptions& o,
                           const PointwiseGrads& grads) {
  const GradOut go = grads_of(grads);
  run(gaussian_call(o, var), input, target, nullptr, grad_loss, &go);
}

void hinge_embedding_forward(const TensorView& input, const TensorView& target, const HingeEmbeddingOptions& o,
                             const TensorView& loss) {
  run(hinge_call(o), input, target, &loss, std::nullopt, nullptr);
}
void hinge_embedding_backward(const TensorView& input, const TensorView& target,
                              const std::optional<TensorView>& grad_loss, const HingeEmbeddingOptions& o,
                              const PointwiseGrads& grads) {
  const GradOut go = grads_of(grads);
  run(hinge_call(o), input, target, nullptr, grad_loss, &go);
}

void margin_ranking_forward(const TensorView& input1, const TensorView& input2, const TensorView& target,
                            const MarginRankingOptions& o, const TensorView& loss) {
  run(ranking_call(o, target), input1, input2, &loss, std::nullopt, nullptr);
}
void margin_ranking_backward(const TensorView& input1, const TensorView& input2, const TensorView& target,
                             const std::optional<TensorView>& grad_loss, const MarginRankingOptions& o,
                             const MarginRankingGrads& grads) {
  const GradOut go = grads_of(grads);
  run(ranking_call(o, target), input1, input2, nullptr, grad_loss, &go);
}

void mse_forward_backward(const TensorView& input, const TensorView& target, const MseOptions& o,
                          const TensorView& loss, const PointwiseGrads& grads) {
  fused(mse_call(o), input, target, loss, grads);
}
void l1_forward_backward(const TensorView& input, const TensorView& target, const L1Options& o, const TensorView& loss,
                         const PointwiseGrads& grads) {
  fused(l1_call(o), input, target, loss, grads);
}
void smooth_l1_forward_backward(const TensorView& input, const TensorView& target, const SmoothL1Options& o,
                                const TensorView& loss, const PointwiseGrads& grads) {
  fused(smooth_l1_call(o), input, target, loss, grads);
}
void huber_forward_backward(const TensorView& input, const TensorView& target, const HuberOptions& o,
                            const TensorView& loss, const PointwiseGrads& grads) {
  fused(huber_call(o), input, target, loss, grads);
}
void bce_forward_backward(const TensorView& input, const TensorView& target, const BceOptions& o,
                          const TensorView& loss, const PointwiseGrads& grads) {
  fused(bce_call(o), input, target, loss, grads);
}
void bce_with_logits_forward_backward(const TensorView& input, const TensorView& target, const BceWithLogitsOptions& o,
                                      const TensorView& loss, const PointwiseGrads& grads) {
  fused(bce_logits_call(o), input, target, loss, grads);
}
void kl_div_forward_backward(const TensorView& input, const TensorView& target, const KlDivOptions& o,
                             const TensorView& loss, const PointwiseGrads& grads) {
  fused(kl_call(o, input), input, target, loss, grads);
}
void poisson_nll_forward_backward(const TensorView& input, const TensorView& target, const PoissonNllOptions& o,
                                  const TensorView& loss, const PointwiseGrads& grads) {
  fused(poisson_call(o), input, target, loss, grads);
}
void gaussian_nll_forward_backward(const TensorView& input, const TensorView& target, const TensorView& var,
                                   const GaussianNllOptions& o, const TensorView& loss, const PointwiseGrads& grads) {
  fused(gaussian_call(o, var), input, target, loss, grads);
}
void hinge_embedding_forward_backward(const TensorView& input, const TensorView& target, const HingeEmbeddingOptions& o,
                                      const TensorView& loss, const PointwiseGrads& grads) {
  fused(hinge_call(o), input, target, loss, grads);
}
void margin_ranking_forward_backward(const TensorView& input1, const TensorView& input2, const TensorView& target,
                                     const MarginRankingOptions& o, const TensorView& loss,
                                     const MarginRankingGrads& grads) {
  fused(ranking_call(o, target), input1, input2, loss, grads);
}

}  // namespace lossfuse
