// libFuzzer target: the eleven elementwise losses' forward and backward entry points on inputs the bytes choose:
// the loss, the float dtype, a shape of rank 0 to 3 (sizes 0 to 4), strides per operand (negative, padded, 0 as
// torch's broadcast), weights, pos_weight, var, every option (NaN, inf and out-of-range values among them), the
// reduction (an out-of-range one too), an upstream gradient, and now and then one bad argument: a mismatched
// shape or dtype, a loss output of the wrong dtype, a gradient the loss does not give, a gradient aliasing an
// operand. A call either throws lossfuse::Error leaving every buffer as it was, or succeeds on valid arguments and,
// where every operand is finite, agrees with the float64 references (tests/reference/pointwise*_reference.hpp).
#include "fuzz_util.hpp"
#include "reference/pointwise_extra_reference.hpp"
#include "reference/pointwise_reference.hpp"

using namespace lffuzz;
using lossfuse::Reduction;

namespace {

enum class Kind { mse, l1, smooth_l1, huber, bce, bce_with_logits, kl_div, poisson_nll, gaussian_nll, hinge, ranking };
constexpr int kKinds = 11;

struct Elem {
  double l = 0, ml = 0, dx = 0, mdx = 0, dy = 0, mdy = 0, dz = 0, mdz = 0;
};

struct Opts {
  double param = 1.0;  // beta, delta, eps or margin
  bool flag1 = false;  // batchmean, log_input, full (gaussian)
  bool flag2 = false;  // log_target, full (poisson)
  bool has_w = false, has_z = false;
};

// One element's loss and derivatives (before weight and upstream gradient), from the references.
Elem element(Kind k, const Opts& o, double x, double y, double z) {
  Elem e;
  if (k <= Kind::huber) {
    static constexpr lfref::PwLoss kBasic[] = {lfref::PwLoss::mse, lfref::PwLoss::l1, lfref::PwLoss::smooth_l1,
                                               lfref::PwLoss::huber};
    const lfref::PwElem b = lfref::pw_elem(kBasic[static_cast<int>(k)], x - y, o.param);
    e.l = b.value, e.ml = b.tol_u / 2 + std::fabs(b.value), e.dx = b.grad, e.dy = -b.grad;
    e.mdx = e.mdy = std::fabs(b.grad);
    return e;
  }
  lfref::PwOpts p;
  lfref::PwExtraLoss x_kind = lfref::PwExtraLoss::bce;
  switch (k) {
    case Kind::bce: break;
    case Kind::bce_with_logits: x_kind = lfref::PwExtraLoss::bce_with_logits, p.pos_weight = o.has_z; break;
    case Kind::kl_div: x_kind = lfref::PwExtraLoss::kl_div, p.log_target = o.flag2; break;
    case Kind::poisson_nll:
      x_kind = lfref::PwExtraLoss::poisson_nll, p.log_input = o.flag1, p.full = o.flag2, p.eps = o.param;
      break;
    case Kind::gaussian_nll: x_kind = lfref::PwExtraLoss::gaussian_nll, p.full = o.flag1, p.eps = o.param; break;
    case Kind::hinge: x_kind = lfref::PwExtraLoss::hinge_embedding, p.margin = o.param; break;
    default: x_kind = lfref::PwExtraLoss::margin_ranking, p.margin = o.param; break;
  }
  const lfref::PwExtraElem r = lfref::pointwise_extra(x_kind, p, x, y, z);
  e.l = r.l, e.ml = r.ml, e.dx = r.dx, e.mdx = r.mdx, e.dy = r.dy, e.mdy = r.mdy, e.dz = r.dz, e.mdz = r.mdz;
  return e;
}

// A gradient element: want, its error budget from the magnitude m of its terms in unit roundoff u.
void expect_grad(DType t, double got, double want, double m, double u, const char* what) {
  expect_stored(t, got, want, 32 * u * m, what);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Bytes b{data, size};
  const auto k = static_cast<Kind>(b.below(kKinds));
  const DType dt = b.pick(kDtypes);
  const bool backward = b.chance(2);
  const auto reduction = static_cast<Reduction>(b.below(4));  // 3: out of range
  std::vector<std::int64_t> shape(static_cast<std::size_t>(b.below(4)));
  for (auto& s : shape) s = b.below(5);

  Opts o;
  bool valid = reduction != static_cast<Reduction>(3);
  switch (k) {
    case Kind::smooth_l1:
      o.param = b.pick({1.0, 0.0, 0.5, 2.0, -1.0, kNaN});
      valid &= o.param >= 0;
      break;
    case Kind::huber:
      o.param = b.pick({1.0, 0.5, 2.0, 0.0, -1.0, kNaN});
      valid &= o.param > 0;
      break;
    case Kind::poisson_nll:
      o.param = b.pick({1e-8, 0.25, kNaN, kInf});
      valid &= std::isfinite(o.param);
      break;
    case Kind::gaussian_nll:
      o.param = b.pick({1e-6, 0.5, kNaN, kInf});
      valid &= std::isfinite(o.param);
      break;
    case Kind::hinge:
    case Kind::ranking:
      o.param = b.pick({1.0, 0.5, -0.25, 0.0, kNaN, kInf});
      valid &= std::isfinite(o.param);
      break;
    default: break;
  }
  o.flag1 = b.chance(2), o.flag2 = b.chance(2);
  if (k == Kind::kl_div && o.flag1) valid &= reduction == Reduction::mean;  // batchmean
  o.has_w = (k == Kind::mse || k == Kind::l1 || k == Kind::huber || k == Kind::bce || k == Kind::bce_with_logits) &&
            b.chance(2);
  o.has_z = k == Kind::gaussian_nll || k == Kind::ranking || (k == Kind::bce_with_logits && b.chance(2));

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
  if (o.has_z) z = Buf(dt, shape, &b, true), zv = z.fill(value);
  if (o.has_w) w = Buf(dt, shape, &b, true), wv = w.fill(value);
  const std::int64_t n = x.numel;
  bool finite = true;
  for (std::int64_t i = 0; i < n; ++i) {
    finite &= std::isfinite(xv[i]) && (bad == 0 || std::isfinite(yv[i])) && (!o.has_z || std::isfinite(zv[i])) &&
              (!o.has_w || std::isfinite(wv[i]));
    if (k == Kind::bce) valid &= xv[i] >= 0 && xv[i] <= 1;
    if (k == Kind::gaussian_nll) valid &= !(zv[i] < 0);
  }

  valid &= !sabotage(b, x.view) && !sabotage(b, y.view);
  const bool none = reduction == Reduction::none;
  const DType acc = acc_of(dt);
  const DType loss_dt = bad == 2 ? (acc == DType::f32 ? DType::f64 : DType::f32) : acc;
  valid &= !(bad == 2 && !backward);
  Buf loss = Buf::canary(loss_dt, none ? shape : std::vector<std::int64_t>{});
  Buf gl;
  std::vector<double> glv;
  const bool has_gl = backward && b.chance(2);
  if (has_gl) {
    gl = Buf(acc, none ? shape : std::vector<std::int64_t>{}, &b, true);
    glv = gl.fill([&](std::int64_t) { return b.pick({1.0, -2.0, 0.5, 0.0}); });
  }
  // the gradients asked for: input always; target where the loss gives one; the third operand's where it has one
  const bool y_grad_ok = k != Kind::hinge, z_grad_ok = k == Kind::gaussian_nll || k == Kind::ranking;
  const bool want_y = b.chance(2) && (y_grad_ok || bad == 3), want_z = z_grad_ok && b.chance(2);
  if (bad == 3) valid &= y_grad_ok || !want_y || !backward;
  Buf gx = Buf::canary(dt, shape), gy = Buf::canary(dt, shape), gz = Buf::canary(dt, shape);
  lossfuse::PointwiseGrads grads;
  grads.input = gx.view;
  if (want_y) grads.target = gy.view;
  if (want_z) grads.var = gz.view;
  if (bad == 4 && backward && n > 0) grads.input = y.view, valid = false;  // aliases the target
  lossfuse::MarginRankingGrads rgrads{grads.input, grads.target, grads.var};
  const std::optional<TensorView> glo = has_gl ? std::optional<TensorView>(gl.view) : std::nullopt;

  if (verbose) {
    trace("kind %d dtype %s backward %d reduction %d bad %d param %g flags %d %d want_y %d want_z %d valid %d\n",
          static_cast<int>(k), lossfuse::dtype_name(dt).data(), backward, static_cast<int>(reduction), bad, o.param,
          o.flag1, o.flag2, want_y, want_z, valid);
    show("input", x), show("target", y);
    if (o.has_z) show("third", z);
    if (o.has_w) show("weight", w);
    if (has_gl) show("grad_loss", gl);
  }
  const auto red = reduction;
  const bool ok = attempt({&x, &y, &z, &w, &loss, &gl, &gx, &gy, &gz}, [&] {
    const TensorView &X = x.view, &Y = y.view, &L = loss.view;
    const std::optional<TensorView> W = o.has_w ? std::optional<TensorView>(w.view) : std::nullopt;
    switch (k) {
      case Kind::mse: {
        lossfuse::MseOptions op{red, W};
        backward ? lossfuse::mse_backward(X, Y, glo, op, grads) : lossfuse::mse_forward(X, Y, op, L);
        break;
      }
      case Kind::l1: {
        lossfuse::L1Options op{red, W};
        backward ? lossfuse::l1_backward(X, Y, glo, op, grads) : lossfuse::l1_forward(X, Y, op, L);
        break;
      }
      case Kind::smooth_l1: {
        lossfuse::SmoothL1Options op{red, o.param};
        backward ? lossfuse::smooth_l1_backward(X, Y, glo, op, grads) : lossfuse::smooth_l1_forward(X, Y, op, L);
        break;
      }
      case Kind::huber: {
        lossfuse::HuberOptions op{red, o.param, W};
        backward ? lossfuse::huber_backward(X, Y, glo, op, grads) : lossfuse::huber_forward(X, Y, op, L);
        break;
      }
      case Kind::bce: {
        lossfuse::BceOptions op{red, W};
        backward ? lossfuse::bce_backward(X, Y, glo, op, grads) : lossfuse::bce_forward(X, Y, op, L);
        break;
      }
      case Kind::bce_with_logits: {
        lossfuse::BceWithLogitsOptions op{red, W, o.has_z ? std::optional<TensorView>(z.view) : std::nullopt};
        backward ? lossfuse::bce_with_logits_backward(X, Y, glo, op, grads)
                 : lossfuse::bce_with_logits_forward(X, Y, op, L);
        break;
      }
      case Kind::kl_div: {
        lossfuse::KlDivOptions op{red, o.flag1, o.flag2};
        backward ? lossfuse::kl_div_backward(X, Y, glo, op, grads) : lossfuse::kl_div_forward(X, Y, op, L);
        break;
      }
      case Kind::poisson_nll: {
        lossfuse::PoissonNllOptions op{red, o.flag1, o.flag2, o.param};
        backward ? lossfuse::poisson_nll_backward(X, Y, glo, op, grads) : lossfuse::poisson_nll_forward(X, Y, op, L);
        break;
      }
      case Kind::gaussian_nll: {
        lossfuse::GaussianNllOptions op{red, o.flag1, o.param};
        backward ? lossfuse::gaussian_nll_backward(X, Y, z.view, glo, op, grads)
                 : lossfuse::gaussian_nll_forward(X, Y, z.view, op, L);
        break;
      }
      case Kind::hinge: {
        lossfuse::HingeEmbeddingOptions op{red, o.param};
        backward ? lossfuse::hinge_embedding_backward(X, Y, glo, op, grads)
                 : lossfuse::hinge_embedding_forward(X, Y, op, L);
        break;
      }
      default: {
        lossfuse::MarginRankingOptions op{red, o.param};
        backward ? lossfuse::margin_ranking_backward(X, Y, z.view, glo, op, rgrads)
                 : lossfuse::margin_ranking_forward(X, Y, z.view, op, L);
        break;
      }
    }
  });
  if (!ok) return 0;
  if (!valid) fail("accepted an invalid argument");
  if (!finite) return 0;
  ++stats.checked;

  // the reference: w l per element, the reduction's divisor, the gradients
  const double u = unit_of(dt);
  double sum = 0, mag = 0, wsum = 0;
  std::vector<Elem> el(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    el[i] = element(k, o, xv[i], yv[i], o.has_z ? zv[i] : 0.0);
    const double wi = o.has_w ? wv[i] : 1.0;
    sum += wi * el[i].l, mag += std::fabs(wi) * el[i].ml, wsum += wi;
  }
  double denom = static_cast<double>(n);
  if (o.has_w && (k == Kind::mse || k == Kind::l1)) denom = wsum;
  if (k == Kind::kl_div && o.flag1) denom = shape.empty() ? 1.0 : static_cast<double>(shape[0]);  // batchmean
  const bool mean = reduction == Reduction::mean;
  const double sum_tol = u * (32 + lfref::pw_sum_condition(n)) * mag + 1e-6;
  if (!backward) {
    if (none) {
      for (std::int64_t i = 0; i < n; ++i) {
        const double wi = o.has_w ? wv[i] : 1.0;
        expect_close(loss.get(i), wi * el[i].l, 32 * u * std::fabs(wi) * el[i].ml + 1e-6, "element loss");
      }
    } else if (!(mean && denom == 0 && o.has_w)) {  // (a weighted mean over weights summing to 0: inf or NaN)
      expect_close(loss.get(0), mean ? sum / denom : sum,
                   mean ? sum_tol / std::fabs(denom) + 4 * u * std::fabs(sum / denom) : sum_tol, "reduced loss");
    }
    return 0;
  }
  if (mean && denom == 0) return 0;
  for (std::int64_t i = 0; i < n; ++i) {
    double g = has_gl ? (none ? glv[i] : glv[0]) : 1.0;
    if (mean) g /= denom;
    const double s = (o.has_w ? wv[i] : 1.0) * g;
    const auto check = [&](const Buf& out, double d, double md, const char* what) {
      expect_grad(dt, out.get(i), d * s, (md + std::fabs(d)) * std::fabs(s), u, what);
    };
    check(gx, el[i].dx, el[i].mdx, "input gradient");
    if (want_y) check(gy, el[i].dy, el[i].mdy, "target gradient");
    if (want_z) check(gz, el[i].dz, el[i].mdz, "third gradient");
  }
  return 0;
}
