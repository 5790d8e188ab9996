// libFuzzer target: the fused linear + cross-entropy entry points -- forward, forward with gradients (way 1),
// backward from a saved lse (way 2) -- on inputs the bytes choose: the float dtype, N in [0, 5], H in [0, 6],
// V in [0, 12], strides (padded rows, reversed rows), a bias, class targets of every integer dtype (out of range
// ones too), chunk rows, vocabulary tiles, the gradient filter, every cross-entropy option (NaN, inf and
// out-of-range values among them), the reduction, an upstream gradient, float32 weight gradients for 16-bit
// weights, and now and then one bad argument: W of the wrong width, a gradient aliasing x. A call either throws
// lossfuse::Error leaving every buffer as it was, or succeeds on valid arguments and, where every input is finite
// and the filter is off, agrees with the float64 reference (the logits x W^T + b are exact for the values drawn
// here; tests/reference's cross-entropy on them, then dx = dz W, dW = dz^T x, db = sum_r dz).
#include <utility>

#include "fuzz_util.hpp"

using namespace lffuzz;
using lossfuse::Reduction;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Bytes b{data, size};
  const DType dt = b.pick(kDtypes);
  const int mode = static_cast<int>(b.below(3));  // forward, forward with grads, backward from lse
  const std::int64_t N = b.below(6), H = b.below(7), V = b.below(13);
  const bool has_bias = b.chance(2);
  const int bad = b.rarely(5) ? static_cast<int>(b.below(2)) : -1;  // 0 W's width, 1 alias

  lossfuse::LinearCrossEntropyOptions o;
  auto& ce = o.ce;
  // valid options, then now and then one made invalid
  ce.reduction = static_cast<Reduction>(b.below(3));
  ce.ignore_index = b.pick({std::int64_t{-100}, std::int64_t{0}, V - 1, V, std::int64_t{-1}});
  ce.label_smoothing = b.pick({0.0, 0.0, 0.1, 1.0});
  ce.logit_scale = b.pick({1.0, 1.0, 0.5, -2.0});
  ce.softcap = b.pick({0.0, 0.0, 3.0});
  ce.z_loss_scale = b.pick({0.0, 0.0, 1e-2});
  o.chunk_rows = b.pick({std::int64_t{0}, std::int64_t{1}, std::int64_t{2}});
  o.vocab_tile = b.pick({std::int64_t{0}, std::int64_t{0}, std::int64_t{1}, std::int64_t{3}, V});
  o.grad_filter = o.vocab_tile > 0 && b.chance(4) ? 0.5 : 0.0;
  const bool bad_option = b.rarely(4);
  if (bad_option) {
    switch (b.below(9)) {
      case 0: ce.reduction = static_cast<Reduction>(3); break;
      case 1: ce.label_smoothing = b.pick({-0.1, 1.5, kNaN}); break;
      case 2: ce.logit_scale = b.pick({kInf, kNaN}); break;
      case 3: ce.softcap = b.pick({-1.0, kNaN}); break;
      case 4: ce.z_loss_scale = b.pick({-1.0, kInf}); break;
      case 5: o.chunk_rows = -1; break;
      case 6: o.vocab_tile = -2; break;
      case 7: o.grad_filter = b.pick({1.5, -0.5, kNaN}); break;
      default: o.vocab_tile = 0, o.grad_filter = 0.5; break;  // the filter needs tiles
    }
  }
  bool valid = !bad_option;
  Buf wt;
  std::vector<double> wv;
  const bool has_weight = b.chance(3);
  if (has_weight) {
    wt = Buf(acc_of(dt), {V}, &b);
    wv = wt.fill([&](std::int64_t) { return b.pick({1.0, 0.5, 2.0, 0.0}); });
    ce.weight = wt.view;
  }

  // operands; values whose products and sums of up to 6 terms are exact in every dtype, and now and then inf or NaN
  static constexpr double kValues[] = {0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -1.5, 0.25};
  const bool sprinkle = b.rarely(8);  // some inf and NaN among the values
  const auto value = [&](std::int64_t) {
    return sprinkle && b.chance(8) ? b.pick({kInf, -kInf, kNaN}) : b.pick(kValues);
  };
  const auto row_strided = [&](DType t, std::int64_t rows, std::int64_t cols) {
    // unit stride along H (the header's rule); rows padded or reversed
    Buf m(t, {rows, cols});
    const int how = static_cast<int>(b.below(3));
    if (how > 0 && rows > 0) {
      const std::int64_t pitch = cols + 2;
      m.bytes.assign(static_cast<std::size_t>(rows * pitch + 1) * size_of(t), 0);
      const std::int64_t first = how == 2 ? (rows - 1) * pitch : 0;
      m.view = TensorView::contiguous(m.bytes.data() + first * static_cast<std::int64_t>(size_of(t)), t, {rows, cols});
      m.view.strides = {how == 2 ? -pitch : pitch, 1};
    }
    return m;
  };
  Buf x = row_strided(dt, N, H), w = row_strided(dt, V, bad == 0 ? H + 1 : H), bias;
  if (bad == 0) valid = false;
  const std::vector<double> xv = x.fill(value), wgt = w.fill(value);
  std::vector<double> bv;
  if (has_bias) bias = Buf(dt, {V}), bv = bias.fill(value);
  Buf target(b.pick(kInts), {N}, &b, true);
  const std::vector<double> tv = target.fill([&](std::int64_t) {
    return b.chance(8) ? static_cast<double>(ce.ignore_index) : static_cast<double>(b.below(V + 2) - 1);
  });
  std::vector<std::int64_t> classes(static_cast<std::size_t>(N));
  for (std::int64_t r = 0; r < N; ++r) {
    classes[r] = target.get_int(r);
    valid &= classes[r] == ce.ignore_index || (classes[r] >= 0 && classes[r] < V);
  }
  bool finite = true;
  for (const std::vector<double>* v : {&xv, &wgt, static_cast<const std::vector<double>*>(&bv)}) {
    for (double e : *v) finite &= std::isfinite(e);
  }

  // the reference on exact logits
  lfref::CeInput in;
  in.rows = N, in.C = V, in.target = classes, in.weight = wv, in.reduction = ce.reduction;
  in.ignore_index = ce.ignore_index, in.label_smoothing = ce.label_smoothing, in.logit_scale = ce.logit_scale;
  in.softcap = ce.softcap, in.z_loss_scale = ce.z_loss_scale, in.u = unit_of(dt);
  const bool checked = valid && finite && bad < 0;
  if (checked) {
    for (std::int64_t r = 0; r < N; ++r) {
      for (std::int64_t v = 0; v < V; ++v) {
        double z = has_bias ? bv[v] : 0.0;
        for (std::int64_t h = 0; h < H; ++h) z += xv[r * H + h] * wgt[v * H + h];
        in.x.push_back(z);
      }
    }
  }
  const std::vector<double> glv = {b.pick({1.0, -2.0, 0.5})};
  const bool has_gl = mode == 2 && b.chance(2);
  if (has_gl)
    in.grad_loss = ce.reduction == Reduction::none ? std::vector<double>(static_cast<std::size_t>(N), glv[0]) : glv;
  lfref::CeResult ref;
  if (checked) ref = lfref::cross_entropy(in);

  valid &= !sabotage(b, x.view) && !sabotage(b, w.view);
  const DType acc = acc_of(dt);
  const bool none = ce.reduction == Reduction::none;
  const std::vector<std::int64_t> loss_shape = none ? std::vector<std::int64_t>{N} : std::vector<std::int64_t>{};
  Buf loss = Buf::canary(acc, loss_shape), lse = Buf::canary(DType::f64, {N});
  const DType w_grad_dt = b.chance(3) ? DType::f32 : dt;
  Buf gx = Buf::canary(dt, {N, H}), gw = Buf::canary(w_grad_dt, {V, H}), gb = Buf::canary(w_grad_dt, {V});
  Buf lse_in(DType::f64, {N}), gl(acc, loss_shape);
  lse_in.fill([&](std::int64_t r) { return r < static_cast<std::int64_t>(ref.lse.size()) ? ref.lse[r] : 0.0; });
  gl.fill([&](std::int64_t) { return glv[0]; });
  lossfuse::LinearCrossEntropyGrads grads{gx.view, gw.view,
                                          has_bias ? std::optional<TensorView>(gb.view) : std::nullopt};
  if (bad == 1 && mode != 0 && N * H > 0) grads.x = x.view, valid = false;
  const std::optional<TensorView> bias_v = has_bias ? std::optional<TensorView>(bias.view) : std::nullopt;

  if (verbose) {
    trace(
        "dtype %s mode %d N %lld H %lld V %lld reduction %d ignore %lld eps %g scale %g softcap %g zls %g chunk %lld "
        "tile %lld filter %g w_grad %s\n",
        lossfuse::dtype_name(dt).data(), mode, static_cast<long long>(N), static_cast<long long>(H),
        static_cast<long long>(V), static_cast<int>(ce.reduction), static_cast<long long>(ce.ignore_index),
        ce.label_smoothing, ce.logit_scale, ce.softcap, ce.z_loss_scale, static_cast<long long>(o.chunk_rows),
        static_cast<long long>(o.vocab_tile), o.grad_filter, lossfuse::dtype_name(w_grad_dt).data());
    show("x", x), show("W", w), show("target", target);
    if (has_bias) show("bias", bias);
    if (has_weight) show("class weight", wt);
  }
  const bool ok = attempt({&x, &w, &bias, &target, &wt, &loss, &lse, &gx, &gw, &gb}, [&] {
    switch (mode) {
      case 0:
        lossfuse::linear_cross_entropy_forward(x.view, w.view, bias_v, target.view, o,
                                               {loss.view, lse.view, std::nullopt});
        break;
      case 1:
        lossfuse::linear_cross_entropy_forward(x.view, w.view, bias_v, target.view, o,
                                               {loss.view, lse.view, std::nullopt}, grads);
        break;
      default:
        lossfuse::linear_cross_entropy_backward(x.view, w.view, bias_v, target.view, lse_in.view,
                                                has_gl ? std::optional<TensorView>(gl.view) : std::nullopt, o, grads);
        break;
    }
  });
  if (!ok) return 0;
  if (!valid) fail("accepted an invalid argument");
  if (!checked) return 0;
  ++stats.checked;
  if (mode != 2) {
    if (none) {
      for (std::int64_t r = 0; r < N; ++r)
        expect_close(loss.get(r), ref.row_loss[r], ref.row_loss_tol[r] + 1e-6, "row loss");
    } else {
      expect_close(loss.get(0), ref.loss, ref.loss_tol + 1e-6, "reduced loss");
    }
    if (mode == 0 || o.grad_filter != 0) return 0;
  }
  if (o.grad_filter != 0) return 0;
  // dz as the products read it (16-bit inputs: rounded once to the dtype), with its budget
  const double su = store_unit_of(dt), u = unit_of(dt);
  std::vector<double> dz(ref.grad), dzt(ref.grad_tol);
  for (std::size_t i = 0; i < dz.size(); ++i) dzt[i] += 2 * su * std::fabs(dz[i]) + 1e-7;
  // sum over k < K of dz[at(k).first] * at(k).second, and its budget (K + 1 roundings of each product)
  const auto product = [&](std::int64_t K, auto&& at) {
    double want = 0, tol = 0;
    for (std::int64_t k = 0; k < K; ++k) {
      const auto [i, f] = at(k);
      want += dz[i] * f;
      tol += (dzt[i] + 2 * u * static_cast<double>(K + 1) * std::fabs(dz[i])) * std::fabs(f);
    }
    return std::pair{want, tol};
  };
  for (std::int64_t r = 0; r < N; ++r) {
    for (std::int64_t h = 0; h < H; ++h) {
      const auto [want, tol] = product(V, [&](std::int64_t v) { return std::pair{r * V + v, wgt[v * H + h]}; });
      expect_stored(dt, gx.get(r * H + h), want, tol, "dx");
    }
  }
  for (std::int64_t v = 0; v < V; ++v) {
    for (std::int64_t h = 0; h < H; ++h) {
      const auto [want, tol] = product(N, [&](std::int64_t r) { return std::pair{r * V + v, xv[r * H + h]}; });
      expect_stored(w_grad_dt, gw.get(v * H + h), want, tol, "dW");
    }
    if (!has_bias) continue;
    const auto [want, tol] = product(N, [&](std::int64_t r) { return std::pair{r * V + v, 1.0}; });
    expect_stored(w_grad_dt, gb.get(v), want, tol, "db");
  }
  return 0;
}
