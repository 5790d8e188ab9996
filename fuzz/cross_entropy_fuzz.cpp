// libFuzzer target: the class losses' C++ entry points -- cross_entropy forward, backward from a saved lse, fused,
// fused in place, and nll forward and backward -- on inputs the bytes choose: the float dtype, class targets of
// every integer dtype or probability targets, (N, C) or (N, C, d) with N, d in [0, 6] and C in [0, 40], strides
// (negative, zero, padded), reductions (an out-of-range one too), ignore_index, label smoothing, logit scale,
// softcap, z-loss (NaN, inf and out-of-range values among them), class weights, values (huge, inf, NaN among
// them). A call either throws lossfuse::Error leaving every buffer as it was, or succeeds on valid inputs and
// agrees with the float64 reference (tests/reference) within its error budget.
#include "fuzz_util.hpp"

using namespace lffuzz;

namespace {

struct Problem {
  std::int64_t N = 0, C = 0, D = 0;  // D == 0: (N, C); else (N, C, D)
  bool spatial = false;
  std::int64_t rows() const { return N * (spatial ? D : 1); }
  std::int64_t D1() const { return spatial ? D : 1; }
  // logical index of (row, class) in the logits' layout
  std::int64_t at(std::int64_t r, std::int64_t c) const { return ((r / D1()) * C + c) * D1() + r % D1(); }
  std::vector<std::int64_t> shape() const {
    return spatial ? std::vector<std::int64_t>{N, C, D} : std::vector<std::int64_t>{N, C};
  }
  std::vector<std::int64_t> row_shape() const {
    return spatial ? std::vector<std::int64_t>{N, D} : std::vector<std::int64_t>{N};
  }
};

void check_grad(const Problem& pb, DType dt, const Buf& g, const std::vector<double>& want,
                const std::vector<double>& tol) {
  for (std::int64_t r = 0; r < pb.rows(); ++r) {
    for (std::int64_t c = 0; c < pb.C; ++c) {
      const double w = want[r * pb.C + c];
      expect_stored(dt, g.get(pb.at(r, c)), w, tol[r * pb.C + c], "gradient");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Bytes b{data, size};
  const DType dt = b.pick(kDtypes);
  const int mode = static_cast<int>(b.below(6));  // CE forward, backward, fused, fused in place; NLL fwd, bwd
  const bool nll = mode >= 4;
  const bool soft = !nll && b.chance(5);
  const DType tdt = soft ? dt : b.pick(kInts);
  Problem pb;
  pb.N = b.below(7);
  pb.C = b.below(41);
  pb.spatial = b.chance(4);
  pb.D = b.below(4);
  const std::int64_t R = pb.rows(), C = pb.C;

  const auto reduction = static_cast<lossfuse::Reduction>(b.below(4));  // 3: out of range
  const std::int64_t ignore_index = soft && !b.chance(4)
                                        ? -100
                                        : b.pick({std::int64_t{-100}, std::int64_t{0}, C - 1, C, std::int64_t{-1},
                                                  std::int64_t{255}, std::int64_t{1} << 40});
  const double label_smoothing = nll ? 0.0 : b.pick({0.0, 0.0, 0.1, 1.0, -0.1, 1.5, kNaN, kInf});
  const double logit_scale = nll ? 1.0 : b.pick({1.0, 1.0, 0.5, -2.0, 0.0, kNaN, kInf});
  const double softcap = nll ? 0.0 : b.pick({0.0, 0.0, 5.0, 0.5, -1.0, kNaN, kInf});
  const double z_loss_scale = nll ? 0.0 : b.pick({0.0, 0.0, 1e-3, -1.0, kInf});

  Buf weight;
  std::vector<double> wv;
  const bool has_weight = b.chance(3);
  if (has_weight) {
    const DType wt = b.chance(4) ? DType::f64 : acc_of(dt);
    weight = Buf(wt, {C}, &b);
    wv = weight.fill([&](std::int64_t) { return b.pick({1.0, 0.5, 2.0, 0.0, -1.0, kNaN}); });
  }

  Buf x(dt, pb.shape(), &b, /*allow_zero=*/true);
  static constexpr double kValues[] = {0.0, 1.0, -1.0, 3.5, -7.25, 20.0, -30.0, 1e4, -1e4, 0.1, kInf, -kInf, kNaN};
  const std::vector<double> xv = x.fill([&](std::int64_t) { return b.pick(kValues); });
  Buf target(tdt, soft ? pb.shape() : pb.row_shape(), &b, true);
  const std::vector<double> tv = target.fill([&](std::int64_t) {
    if (soft) return b.pick({0.0, 0.25, 0.5, 1.0, -0.5, kNaN});
    return b.chance(8) ? static_cast<double>(ignore_index) : static_cast<double>(b.below(C + 3) - 1);
  });

  // the reference, on the values as stored (and, for integer targets, as read back in their dtype)
  lfref::CeInput in;
  in.rows = R;
  in.C = C;
  for (std::int64_t r = 0; r < R; ++r) {
    for (std::int64_t c = 0; c < C; ++c) in.x.push_back(xv[pb.at(r, c)]);
  }
  std::vector<std::int64_t> classes(static_cast<std::size_t>(R));
  for (std::int64_t r = 0; r < R; ++r) {
    if (soft) {
      for (std::int64_t c = 0; c < C; ++c) in.soft.push_back(tv[pb.at(r, c)]);
    } else {
      classes[r] = target.get_int(r);
    }
  }
  if (!soft) in.target = classes;
  in.weight = wv;
  in.reduction = reduction;
  in.ignore_index = ignore_index;
  in.label_smoothing = label_smoothing;
  in.logit_scale = logit_scale;
  in.softcap = softcap;
  in.z_loss_scale = z_loss_scale;
  in.u = unit_of(dt);
  bool valid = reduction != static_cast<lossfuse::Reduction>(3) && std::isfinite(label_smoothing) &&
               label_smoothing >= 0 && label_smoothing <= 1 && std::isfinite(logit_scale) && std::isfinite(softcap) &&
               softcap >= 0 && std::isfinite(z_loss_scale) && z_loss_scale >= 0;
  for (std::int64_t r = 0; r < R && !soft; ++r) {
    valid &= classes[r] == ignore_index || (classes[r] >= 0 && classes[r] < C);
  }
  // Not checked (docs/cpp-api.md, "Precision and determinism"): probability targets with C = 0 (the reference tells
  // them by their values, and there are none); a 'mean' whose nonzero target weights of both signs cancel
  // (lossfuse's infinity where torch may have NaN); probability targets with smoothing and an
  // infinite logit (lossfuse's NaN where torch may have an infinity); a NaN or infinite class weight with smoothing.
  bool infinite_logit = false, nonfinite_weight = false;
  for (double v : xv) infinite_logit |= std::isinf(v);
  for (double v : wv) nonfinite_weight |= !std::isfinite(v);
  bool cancelling = false;
  if (!soft && has_weight && reduction == lossfuse::Reduction::mean) {
    double sum = 0;
    for (std::int64_t r = 0; r < R; ++r) {
      if (classes[r] != ignore_index && classes[r] >= 0 && classes[r] < C)
        sum += wv[classes[r]], cancelling |= wv[classes[r]] != 0;
    }
    cancelling &= sum == 0;
  }
  const bool checked = valid && !(soft && (C == 0 || (label_smoothing != 0 && softcap == 0 && infinite_logit))) &&
                       !cancelling && !(label_smoothing != 0 && nonfinite_weight);
  lfref::CeResult ref;
  if (checked) ref = lfref::cross_entropy(in);

  valid &= !sabotage(b, x.view) && !sabotage(b, target.view);
  const bool none = reduction == lossfuse::Reduction::none;
  const DType acc = acc_of(dt);
  Buf loss = Buf::canary(acc, none ? pb.row_shape() : std::vector<std::int64_t>{});
  Buf lse = Buf::canary(DType::f64, pb.row_shape());
  Buf grad = Buf::canary(dt, pb.shape());
  Buf lse_in(DType::f64, pb.row_shape());  // the reference's lse, for a backward with no forward of its own
  lse_in.fill([&](std::int64_t r) { return r < static_cast<std::int64_t>(ref.lse.size()) ? ref.lse[r] : 0.0; });

  lossfuse::CrossEntropyOptions ce;
  ce.reduction = reduction;
  ce.ignore_index = ignore_index;
  ce.label_smoothing = label_smoothing;
  ce.logit_scale = logit_scale;
  ce.softcap = softcap;
  ce.z_loss_scale = z_loss_scale;
  lossfuse::NllOptions nl;
  nl.reduction = reduction;
  nl.ignore_index = ignore_index;
  if (has_weight) ce.weight = nl.weight = weight.view;
  if (verbose) {
    trace("mode %d dtype %s soft %d reduction %d ignore %lld eps %g scale %g softcap %g zls %g valid %d checked %d\n",
          mode, lossfuse::dtype_name(dt).data(), soft, static_cast<int>(reduction),
          static_cast<long long>(ignore_index), label_smoothing, logit_scale, softcap, z_loss_scale, valid, checked);
    show("logits", x), show("target", target);
    if (has_weight) show("weight", weight);
  }
  const Buf x_before = x;
  const bool ok = attempt({&x, &loss, &lse, &grad}, [&] {
    switch (mode) {
      case 0: lossfuse::cross_entropy_forward(x.view, target.view, ce, {loss.view, lse.view, std::nullopt}); break;
      case 1: lossfuse::cross_entropy_backward(x.view, target.view, lse_in.view, std::nullopt, ce, grad.view); break;
      case 2:
        lossfuse::cross_entropy_forward_backward(x.view, target.view, ce, {loss.view, lse.view, std::nullopt},
                                                 std::nullopt, grad.view);
        break;
      case 3:
        lossfuse::cross_entropy_forward_backward(x.view, target.view, ce, {loss.view, lse.view, std::nullopt},
                                                 std::nullopt, x.view, lossfuse::GradWrite::in_place);
        break;
      case 4: lossfuse::nll_forward(x.view, target.view, nl, loss.view); break;
      default: lossfuse::nll_backward(x.view, target.view, std::nullopt, nl, grad.view); break;
    }
  });
  if (!ok) return 0;
  if (mode != 3 && x.bytes != x_before.bytes) fail("the input changed");
  if (!valid) fail("accepted invalid options or a bad target");
  if (!checked) return 0;
  ++stats.checked;

  if (nll) {
    // loss_r = -w[t_r] x[r, t_r] (0 where ignored); mean divides by the sum of the counted rows' weights
    double sum = 0, wsum = 0, mag = 0;
    std::vector<double> rl(static_cast<std::size_t>(R), 0.0), rw(static_cast<std::size_t>(R), 0.0);
    for (std::int64_t r = 0; r < R; ++r) {
      if (classes[r] == ignore_index) continue;
      rw[r] = has_weight ? wv[classes[r]] : 1.0;
      rl[r] = -rw[r] * xv[pb.at(r, classes[r])];
      sum += rl[r], wsum += rw[r], mag += std::fabs(rl[r]);
    }
    const double u = unit_of(dt), tol = 4 * u * (R + 1) * mag + 1e-6;
    if (mode == 4) {
      if (none) {
        for (std::int64_t r = 0; r < R; ++r) expect_close(loss.get(r), rl[r], 2 * u * std::fabs(rl[r]), "nll row loss");
      } else {
        const double want = reduction == lossfuse::Reduction::mean ? sum / wsum : sum;
        const double t =
            reduction == lossfuse::Reduction::mean ? tol / std::fabs(wsum) + 4 * u * (R + 1) * std::fabs(want) : tol;
        expect_close(loss.get(0), want, std::isfinite(t) ? t : 0.0, "nll loss");
      }
    } else {
      std::vector<double> want(static_cast<std::size_t>(R * C), 0.0), gt(want.size(), 0.0);
      for (std::int64_t r = 0; r < R; ++r) {
        if (classes[r] == ignore_index) continue;
        want[r * C + classes[r]] = -rw[r] / (reduction == lossfuse::Reduction::mean ? wsum : 1.0);
        gt[r * C + classes[r]] = 4 * unit_of(dt) * (R + 1) * std::fabs(want[r * C + classes[r]]);
      }
      check_grad(pb, dt, grad, want, gt);
    }
    return 0;
  }
  if (mode != 1) {
    if (none) {
      for (std::int64_t r = 0; r < R; ++r)
        expect_close(loss.get(r), ref.row_loss[r], ref.row_loss_tol[r] + 1e-6, "row loss");
    } else {
      expect_close(loss.get(0), ref.loss, ref.loss_tol + 1e-6, "reduced loss");
    }
  }
  if (mode != 0) check_grad(pb, dt, mode == 3 ? x : grad, ref.grad, ref.grad_tol);
  return 0;
}
