// libFuzzer target: the eleven elementwise losses' forward, backward and fused entry points on inputs the bytes choose:
// the loss, the float dtype, a shape of rank 0 to 3 (sizes 0 to 4), strides per operand (negative, padded, 0 as
// torch's broadcast), weights, pos_weight, var, every option (NaN, inf and out-of-range values among them), the
// reduction (an out-of-range one too), an upstream gradient, and now and then one bad argument: a mismatched
// shape or dtype, a loss output of the wrong dtype, a gradient the loss does not give, a gradient aliasing an
// operand. A call either throws lossfuse::Error leaving every buffer as it was, or succeeds on valid arguments and,
// where every operand is finite, agrees with the float64 reference (tests/reference/pointwise_reference.hpp).
#include "fuzz_util.hpp"
#include "pointwise_call.hpp"
#include "reference/pointwise_reference.hpp"

using namespace lffuzz;
using lfref::PwLoss;
using lossfuse::Reduction;

constexpr int kKinds = 11;  // PwLoss's values, in its order

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Bytes b{data, size};
  const auto k = static_cast<PwLoss>(b.below(kKinds));
  const DType dt = b.pick(kDtypes);
  const int entry = static_cast<int>(b.below(3));             // forward, backward, both in one pass
  const bool backward = entry != 0, fused = entry == 2;       // backward: gradients written
  const auto reduction = static_cast<Reduction>(b.below(4));  // 3: out of range
  std::vector<std::int64_t> shape(static_cast<std::size_t>(b.below(4)));
  for (auto& s : shape) s = b.below(5);

  // the option values the bytes choose, the invalid ones among them
  lfref::PwOpts o;
  bool valid = reduction != static_cast<Reduction>(3);
  switch (k) {
    case PwLoss::smooth_l1:
      o.param = b.pick({1.0, 0.0, 0.5, 2.0, -1.0, kNaN});
      valid &= o.param >= 0;
      break;
    case PwLoss::huber:
      o.param = b.pick({1.0, 0.5, 2.0, 0.0, -1.0, kNaN});
      valid &= o.param > 0;
      break;
    case PwLoss::poisson_nll:
      o.eps = b.pick({1e-8, 0.25, kNaN, kInf});
      valid &= std::isfinite(o.eps);
      break;
    case PwLoss::gaussian_nll:
      o.eps = b.pick({1e-6, 0.5, kNaN, kInf});
      valid &= std::isfinite(o.eps);
      break;
    case PwLoss::hinge_embedding:
    case PwLoss::margin_ranking:
      o.margin = b.pick({1.0, 0.5, -0.25, 0.0, kNaN, kInf});
      valid &= std::isfinite(o.margin);
      break;
    default: break;
  }
  const bool flag1 = b.chance(2), flag2 = b.chance(2);
  o.batchmean = k == PwLoss::kl_div && flag1, o.log_target = flag2;
  o.log_input = flag1, o.full = k == PwLoss::gaussian_nll ? flag1 : flag2;
  if (o.batchmean) valid &= reduction == Reduction::mean;
  const bool has_w = lfref::pw_takes_weight(k) && b.chance(2);
  o.pos_weight = k == PwLoss::bce_with_logits && b.chance(2);
  const bool has_z = lfref::pw_has_z(k, o);

  // one bad argument, now and then
  const int bad = b.rarely(4) ? static_cast<int>(b.below(5)) : -1;  // 0 shape, 1 dtype, 2 loss dtype, 3 grad, 4 alias
  std::vector<std::int64_t> y_shape = shape;
  if (bad == 0) {
    if (shape.empty())
      y_shape.push_back(2);
    else
      y_shape.back() += 1;
    valid = false;
  }
  const DType y_dt = bad == 1 ? (dt == DType::f32 ? DType::f64 : DType::f32) : dt;
  valid &= bad != 1;

  static constexpr double kValues[] = {0.0,  0.5, -0.5, 1.0,  -1.0, 2.0,  -3.5,  7.25, -20.0,
                                       30.0, 0.1, 1e-3, 0.25, 0.75, kInf, -kInf, kNaN};
  Buf x(dt, shape, &b, true), y(y_dt, y_shape, &b, true), z, w;
  const auto value = [&](std::int64_t) { return b.pick(kValues); };
  std::vector<double> xv = x.fill(value), yv = y.fill(value), zv, wv;
  if (has_z) z = Buf(dt, shape, &b, true), zv = z.fill(value);
  if (has_w) w = Buf(dt, shape, &b, true), wv = w.fill(value);
  const std::int64_t n = x.numel;
  bool finite = true;
  for (std::int64_t i = 0; i < n; ++i) {
    finite &= std::isfinite(xv[i]) && (bad == 0 || std::isfinite(yv[i])) && (!has_z || std::isfinite(zv[i])) &&
              (!has_w || std::isfinite(wv[i]));
    if (k == PwLoss::bce) valid &= xv[i] >= 0 && xv[i] <= 1;
    if (k == PwLoss::gaussian_nll) valid &= !(zv[i] < 0);
  }

  valid &= !sabotage(b, x.view) && !sabotage(b, y.view);
  const bool none = reduction == Reduction::none;
  const DType acc = acc_of(dt);
  const DType loss_dt = bad == 2 ? (acc == DType::f32 ? DType::f64 : DType::f32) : acc;
  valid &= !(bad == 2 && (!backward || fused));  // a loss output of the wrong dtype
  Buf loss = Buf::canary(loss_dt, none ? shape : std::vector<std::int64_t>{});
  Buf gl;
  std::vector<double> glv;
  const bool has_gl = backward && !fused && b.chance(2);
  if (has_gl) {
    gl = Buf(acc, none ? shape : std::vector<std::int64_t>{}, &b, true);
    glv = gl.fill([&](std::int64_t) { return b.pick({1.0, -2.0, 0.5, 0.0}); });
  }
  // the gradients asked for: input always; target where the loss gives one; the third operand's where it has one
  const bool y_grad_ok = lfref::pw_y_grad(k), z_grad_ok = lfref::pw_z_grad(k);
  const bool want_y = b.chance(2) && (y_grad_ok || bad == 3), want_z = z_grad_ok && b.chance(2);
  if (bad == 3) valid &= y_grad_ok || !want_y || !backward;
  Buf gx = Buf::canary(dt, shape), gy = Buf::canary(dt, shape), gz = Buf::canary(dt, shape);
  lossfuse::PointwiseGrads grads;
  grads.input = gx.view;
  if (want_y) grads.target = gy.view;
  if (want_z) grads.var = gz.view;
  if (bad == 4 && backward && n > 0) grads.input = y.view, valid = false;  // aliases the target
  const std::optional<TensorView> glo = has_gl ? std::optional<TensorView>(gl.view) : std::nullopt;

  if (verbose) {
    trace("kind %d dtype %s entry %d reduction %d bad %d param %g flags %d %d want_y %d want_z %d valid %d\n",
          static_cast<int>(k), lossfuse::dtype_name(dt).data(), entry, static_cast<int>(reduction), bad,
          o.param + o.eps + o.margin, flag1, flag2, want_y, want_z, valid);
    show("input", x), show("target", y);
    if (has_z) show("third", z);
    if (has_w) show("weight", w);
    if (has_gl) show("grad_loss", gl);
  }
  const auto red = reduction;
  const bool ok = attempt({&x, &y, &z, &w, &loss, &gl, &gx, &gy, &gz}, [&] {
    lftest::PwArgs args{k, o, reduction, x.view, y.view, std::nullopt, std::nullopt};
    if (has_z) args.z = z.view;
    if (has_w) args.weight = w.view;
    if (fused) {
      lftest::pw_forward_backward(args, loss.view, grads);
    } else if (backward) {
      lftest::pw_backward(args, glo, grads);
    } else {
      lftest::pw_forward(args, loss.view);
    }
  });
  if (!ok) return 0;
  if (!valid) fail("accepted an invalid argument");
  if (!finite) return 0;
  ++stats.checked;

  // the reference: w l per element, the reduction's divisor, the gradients
  const double u = unit_of(dt), kb = lfref::pw_budget(k);
  double sum = 0, mag = 0, wsum = 0;
  std::vector<lfref::PwElem> el(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    el[i] = lfref::pw_elem(k, o, xv[i], yv[i], has_z ? zv[i] : 0.0);
    const double wi = has_w ? wv[i] : 1.0;
    sum += wi * el[i].l, mag += std::fabs(wi) * el[i].ml, wsum += wi;
  }
  double denom = static_cast<double>(n);
  if (has_w && lfref::pw_mean_over_weight(k)) denom = wsum;
  if (o.batchmean) denom = shape.empty() ? 1.0 : static_cast<double>(shape[0]);
  const bool mean = reduction == Reduction::mean;
  const double sum_tol = u * (kb + lfref::pw_sum_condition(n)) * mag + 1e-6;
  if (!backward || fused) {
    if (none) {
      for (std::int64_t i = 0; i < n; ++i) {
        const double wi = has_w ? wv[i] : 1.0;
        expect_close(loss.get(i), wi * el[i].l, kb * u * std::fabs(wi) * el[i].ml + 1e-6, "element loss");
      }
    } else if (!(mean && denom == 0 && has_w)) {  // (a weighted mean over weights summing to 0: inf or NaN)
      expect_close(loss.get(0), mean ? sum / denom : sum,
                   mean ? sum_tol / std::fabs(denom) + 4 * u * std::fabs(sum / denom) : sum_tol, "reduced loss");
    }
    if (!backward) return 0;
  }
  if (mean && denom == 0) return 0;
  for (std::int64_t i = 0; i < n; ++i) {
    double g = has_gl ? (none ? glv[i] : glv[0]) : 1.0;
    if (mean) g /= denom;
    const double s = (has_w ? wv[i] : 1.0) * g;
    const auto check = [&](const Buf& out, double d, double md, const char* what) {
      expect_stored(dt, out.get(i), d * s, kb * u * (md + std::fabs(d)) * std::fabs(s), what);
    };
    check(gx, el[i].dx, el[i].mdx, "input gradient");
    if (want_y) check(gy, el[i].dy, el[i].mdy, "target gradient");
    if (want_z) check(gz, el[i].dz, el[i].mdz, "third gradient");
  }
  return 0;
}
