// libFuzzer target: the five margin and embedding losses' forward and backward entry points (triplet_margin,
// cosine_embedding, multi_margin, multilabel_margin, multilabel_soft_margin) on inputs the bytes choose: the
// float dtype, (R, D) with R in [0, 5] and D in [0, 8], strides per operand (negative, padded, 0), every option
// (p, margin, eps, swap, class weights), class targets of every integer dtype in and out of range, the reduction
// (an out-of-range one too), an upstream gradient, values (inf and NaN among them), and now and then one bad
// argument: a mismatched shape or dtype, a loss output of the wrong dtype, a gradient aliasing an input. A call
// either throws lossfuse::Error leaving every buffer as it was, or succeeds on valid arguments and, where every
// input is finite, agrees with the float64 reference (tests/reference/margin_reference.hpp) within its budget.
#include "fuzz_util.hpp"
#include "reference/margin_reference.hpp"

using namespace lffuzz;
using lossfuse::Reduction;

namespace {

enum class Kind { triplet, cosine, multi, multilabel, soft };

std::optional<TensorView> opt(bool on, const Buf& b) { return on ? std::optional<TensorView>(b.view) : std::nullopt; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Bytes b{data, size};
  const auto k = static_cast<Kind>(b.below(5));
  const DType dt = b.pick(kDtypes);
  const bool backward = b.chance(2);
  const auto reduction = static_cast<Reduction>(b.below(4));  // 3: out of range
  const std::int64_t R = b.below(6), D = b.below(9);
  bool valid = reduction != static_cast<Reduction>(3);
  const int bad = b.rarely(4) ? static_cast<int>(b.below(4)) : -1;  // 0 shape, 1 dtype, 2 alias, 3 loss dtype

  // options
  const double margin = b.pick({1.0, 0.5, 0.0, -0.5});
  double p = 2;
  const double eps = b.pick({1e-6, 0.0, 0.1});
  const bool swap = b.chance(2);
  if (k == Kind::triplet) p = b.pick({2.0, 1.0, 0.0, 3.0, kInf, -1.0}), valid &= p >= 0;
  if (k == Kind::multi) p = b.pick({1.0, 2.0, 3.0}), valid &= p != 3;

  static constexpr double kValues[] = {0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -3.5, 7.25, -20.0, 30.0, 0.1, kInf, -kInf, kNaN};
  const auto value = [&](std::int64_t) { return b.pick(kValues); };
  const std::vector<std::int64_t> shape{R, D};
  const std::vector<std::int64_t> bad_shape{R, D + 1};
  const DType other_dt = dt == DType::f32 ? DType::f64 : DType::f32;

  // operands: in[0..2] the floating inputs (triplet a, p, n; cosine x1, x2; soft x, y; others x), t the target
  const int n_in = k == Kind::triplet ? 3 : (k == Kind::cosine || k == Kind::soft) ? 2 : 1;
  Buf in[3], t, w;
  std::vector<double> iv[3], tv, wv;
  for (int i = 0; i < n_in; ++i) {
    const bool off = i == 1;
    in[i] = Buf(off && bad == 1 ? other_dt : dt, off && bad == 0 ? bad_shape : shape, &b, true);
    iv[i] = in[i].fill(value);
  }
  if (n_in > 1 && bad <= 1 && bad >= 0) valid = false;
  DType tdt = b.pick(kInts);
  if (k == Kind::cosine) {
    if (b.chance(2)) tdt = dt;
    t = Buf(tdt, {bad == 0 ? R + 1 : R}, &b, true);
    tv = t.fill([&](std::int64_t) { return b.pick({1.0, -1.0, 1.0, -1.0, 0.0, 2.0}); });
    valid &= bad != 0;
  } else if (k == Kind::multi || k == Kind::multilabel) {
    if (bad == 1) tdt = dt, valid = false;
    t = Buf(tdt, k == Kind::multi ? std::vector<std::int64_t>{bad == 0 ? R + 1 : R} : (bad == 0 ? bad_shape : shape),
            &b, true);
    tv = t.fill([&](std::int64_t) { return static_cast<double>(b.below(D + 3) - (k == Kind::multi ? 1 : 2)); });
    if (bad == 0) valid = false;
    if (bad != 1 && bad != 0) {
      for (double v : tv) valid &= k == Kind::multi ? (v >= 0 && v < D) : (v >= -1 && v < D);
    }
  }
  const bool has_w = (k == Kind::multi || k == Kind::soft) && b.chance(2);
  if (has_w) w = Buf(b.chance(3) ? DType::f64 : dt, {D}, &b), wv = w.fill(value);

  bool finite = true;
  for (int i = 0; i < n_in; ++i) {
    for (double v : iv[i]) finite &= std::isfinite(v);
  }
  for (double v : wv) finite &= std::isfinite(v);

  valid &= !sabotage(b, in[0].view);
  const bool none = reduction == Reduction::none;
  const DType acc = acc_of(dt);
  const std::vector<std::int64_t> loss_shape = none ? std::vector<std::int64_t>{R} : std::vector<std::int64_t>{};
  Buf loss = Buf::canary(bad == 3 && !backward ? (acc == DType::f32 ? DType::f64 : DType::f32) : acc, loss_shape);
  if (bad == 3 && !backward) valid = false;
  Buf gl;
  std::vector<double> glv;
  const bool has_gl = backward && b.chance(2);
  if (has_gl)
    gl = Buf(acc, loss_shape, &b, true), glv = gl.fill([&](std::int64_t) { return b.pick({1.0, -2.0, 0.5}); });
  Buf g[3];
  bool want[3] = {false, false, false};
  for (int i = 0; i < n_in; ++i) g[i] = Buf::canary(dt, shape), want[i] = !b.chance(3);
  if (bad == 2 && backward && R * D > 0) {  // the first gradient over the first input
    g[0].view = in[0].view, want[0] = true, valid = false;
  }
  const std::optional<TensorView> glo = opt(has_gl, gl);
  const auto G = [&](int i) { return opt(want[i], g[i]); };

  if (verbose) {
    trace("kind %d dtype %s backward %d R %lld D %lld reduction %d bad %d margin %g p %g eps %g swap %d\n",
          static_cast<int>(k), lossfuse::dtype_name(dt).data(), backward, static_cast<long long>(R),
          static_cast<long long>(D), static_cast<int>(reduction), bad, margin, p, eps, swap);
    for (int i = 0; i < n_in; ++i) show("input", in[i]);
    show("target", t);
    if (has_w) show("weight", w);
    if (has_gl) show("grad_loss", gl);
  }
  const bool ok = attempt({&in[0], &in[1], &in[2], &t, &w, &loss, &gl, &g[0], &g[1], &g[2]}, [&] {
    switch (k) {
      case Kind::triplet: {
        lossfuse::TripletMarginOptions o{margin, p, eps, swap, reduction};
        backward ? lossfuse::triplet_margin_backward(in[0].view, in[1].view, in[2].view, glo, o, G(0), G(1), G(2))
                 : lossfuse::triplet_margin_forward(in[0].view, in[1].view, in[2].view, o, loss.view);
        break;
      }
      case Kind::cosine: {
        lossfuse::CosineEmbeddingOptions o{margin, reduction};
        backward ? lossfuse::cosine_embedding_backward(in[0].view, in[1].view, t.view, glo, o, G(0), G(1))
                 : lossfuse::cosine_embedding_forward(in[0].view, in[1].view, t.view, o, loss.view);
        break;
      }
      case Kind::multi: {
        lossfuse::MultiMarginOptions o{static_cast<int>(p), margin, opt(has_w, w), reduction};
        backward ? lossfuse::multi_margin_backward(in[0].view, t.view, glo, o, G(0))
                 : lossfuse::multi_margin_forward(in[0].view, t.view, o, loss.view);
        break;
      }
      case Kind::multilabel: {
        lossfuse::MultilabelMarginOptions o{reduction};
        backward ? lossfuse::multilabel_margin_backward(in[0].view, t.view, glo, o, G(0))
                 : lossfuse::multilabel_margin_forward(in[0].view, t.view, o, loss.view);
        break;
      }
      default: {
        lossfuse::MultilabelSoftMarginOptions o{opt(has_w, w), reduction};
        backward ? lossfuse::multilabel_soft_margin_backward(in[0].view, in[1].view, glo, o, G(0), G(1))
                 : lossfuse::multilabel_soft_margin_forward(in[0].view, in[1].view, o, loss.view);
        break;
      }
    }
  });
  if (!ok) return 0;
  if (!valid) fail("accepted an invalid argument");
  if (!finite) return 0;
  ++stats.checked;

  lfref::MarginCommon c;
  c.rows = R, c.D = D, c.reduction = reduction, c.u = unit_of(dt), c.upstream = glv;
  lfref::MarginResult ref;
  std::vector<std::int64_t> ti(tv.size());
  for (std::size_t i = 0; i < tv.size(); ++i) ti[i] = static_cast<std::int64_t>(tv[i]);
  switch (k) {
    case Kind::triplet: {
      // eps as the computation holds it (float32 but for float64 inputs): at a norm of 0 its rounding decides
      const double eps_c = dt == DType::f64 ? eps : static_cast<double>(static_cast<float>(eps));
      lfref::TripletInput r{c, iv[0], iv[1], iv[2], margin, p, eps_c, swap};
      ref = lfref::triplet_margin(r);
      break;
    }
    case Kind::cosine: ref = lfref::cosine_embedding({c, iv[0], iv[1], tv, margin}); break;
    case Kind::multi: ref = lfref::multi_margin({c, iv[0], ti, wv, margin, static_cast<int>(p)}); break;
    case Kind::multilabel: ref = lfref::multilabel_margin({c, iv[0], ti}); break;
    default: ref = lfref::multilabel_soft_margin({c, iv[0], iv[1], wv}); break;
  }
  if (!backward) {
    if (none) {
      for (std::int64_t r = 0; r < R; ++r) expect_close(loss.get(r), ref.rows[r], ref.rows_tol[r] + 1e-6, "row loss");
    } else {
      expect_close(loss.get(0), ref.loss, ref.loss_tol + 1e-6, "reduced loss");
    }
    return 0;
  }
  for (int i = 0; i < n_in; ++i) {
    if (!want[i]) continue;
    for (std::int64_t e = 0; e < R * D; ++e) {
      const double want_v = ref.grad[i][e];
      expect_stored(dt, g[i].get(e), want_v, ref.grad_tol[i][e], "gradient");
    }
  }
  return 0;
}
