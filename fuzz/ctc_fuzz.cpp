// libFuzzer target: ctc_forward and ctc_backward on inputs the bytes choose: the float dtype, (T, N, C) with T in
// [0, 6], N in [0, 3], C in [0, 5], padded (N, S) or concatenated targets of every integer dtype, lengths of any
// integer dtype (out of range ones too), blank (in and out of range), zero_infinity, the reduction (an
// out-of-range one too), an upstream gradient, strides (negative, padded, 0), log-probabilities with -inf and NaN
// among them, and now and then one bad argument: a gradient aliasing the input, lengths that do not sum to the
// concatenated targets. A call either throws lossfuse::Error leaving every buffer as it was, or succeeds on valid
// arguments and, where every log-probability is finite, agrees with the float64 alpha-beta reference
// (tests/reference/ctc_reference.hpp).
#include "fuzz_util.hpp"
#include "reference/ctc_reference.hpp"

using namespace lffuzz;
using lossfuse::Reduction;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Bytes b{data, size};
  const DType dt = b.pick(kDtypes);
  const bool backward = b.chance(2), padded = !b.chance(3);
  const auto reduction = static_cast<Reduction>(b.below(4));
  const std::int64_t T = b.below(7), N = b.below(4), C = b.below(6), S = b.below(5);
  lossfuse::CtcOptions o;
  o.blank = b.pick({std::int64_t{0}, std::int64_t{0}, C - 1, C - 1, C, std::int64_t{-1}});
  o.reduction = reduction;
  o.zero_infinity = b.chance(2);
  const int bad = b.rarely(5) ? static_cast<int>(b.below(2)) : -1;  // 0 alias, 1 lengths' sum
  bool valid = reduction != static_cast<Reduction>(3) && o.blank >= 0 && o.blank < C;

  Buf lp(dt, {T, N, C}, &b, true);
  static constexpr double kValues[] = {0.0, -0.5, -1.0, -2.25, -7.0, -30.0, 0.5, -0.1, -kInf, kNaN};
  const std::vector<double> lpv = lp.fill([&](std::int64_t) { return b.pick(kValues); });
  Buf il(b.pick(kInts), {N}, &b, true), tl(b.pick(kInts), {N}, &b, true);
  const std::vector<double> ilv =
      il.fill([&](std::int64_t) { return static_cast<double>(b.below(T + 2) - (b.chance(8) ? 1 : 0)); });
  const std::vector<double> tlv =
      tl.fill([&](std::int64_t) { return static_cast<double>(b.below(S + 2) - (b.chance(8) ? 1 : 0)); });
  std::int64_t total = 0;
  for (std::int64_t n = 0; n < N; ++n) {
    valid &= ilv[n] >= 0 && ilv[n] <= T && tlv[n] >= 0 && (!padded || tlv[n] <= S);
    total += std::max<std::int64_t>(0, static_cast<std::int64_t>(tlv[n]));
  }
  std::int64_t concat_len = total;
  if (!padded && bad == 1) concat_len += 1, valid = false;
  Buf tg(b.pick(kInts), padded ? std::vector<std::int64_t>{N, S} : std::vector<std::int64_t>{concat_len}, &b, true);
  // labels: mostly valid (in [0, C), not blank), now and then -1, C or blank
  tg.fill([&](std::int64_t) {
    if (b.chance(8) || C < 2) return static_cast<double>(b.pick({std::int64_t{-1}, C, o.blank}));
    return static_cast<double>((std::max<std::int64_t>(o.blank, 0) + 1 + b.below(C - 1)) % C);
  });
  // the labels each sample uses (only where the lengths are valid)
  std::vector<std::vector<std::int64_t>> labels(static_cast<std::size_t>(N));
  if (valid) {
    std::int64_t off = 0;
    for (std::int64_t n = 0; n < N; ++n) {
      const auto len = static_cast<std::int64_t>(tlv[n]);
      for (std::int64_t j = 0; j < len; ++j) {
        const std::int64_t v = tg.get_int(padded ? n * S + j : off + j);
        valid &= v >= 0 && v < C && v != o.blank;
        labels[n].push_back(v);
      }
      off += len;
    }
  }

  valid &= !sabotage(b, lp.view) && !sabotage(b, tg.view);
  const DType acc = acc_of(dt);
  const bool none = reduction == Reduction::none;
  const std::vector<std::int64_t> loss_shape = none ? std::vector<std::int64_t>{N} : std::vector<std::int64_t>{};
  Buf loss = Buf::canary(acc, loss_shape), nll = Buf::canary(acc, {N}), grad = Buf::canary(dt, {T, N, C});
  const bool want_nll = b.chance(2);
  Buf gl;
  std::vector<double> glv;
  const bool has_gl = backward && b.chance(2);
  if (has_gl)
    gl = Buf(acc, loss_shape, &b, true), glv = gl.fill([&](std::int64_t) { return b.pick({1.0, -2.0, 0.5}); });
  if (bad == 0 && backward && T * N * C > 0) grad.view = lp.view, valid = false;

  if (verbose) {
    trace("dtype %s backward %d padded %d reduction %d blank %lld zero_infinity %d bad %d valid %d\n",
          lossfuse::dtype_name(dt).data(), backward, padded, static_cast<int>(reduction),
          static_cast<long long>(o.blank), o.zero_infinity, bad, valid);
    show("log_probs", lp), show("input_lengths", il), show("target_lengths", tl), show("targets", tg);
    if (has_gl) show("grad_loss", gl);
  }
  const bool ok = attempt({&lp, &il, &tl, &tg, &loss, &nll, &gl, &grad}, [&] {
    if (backward) {
      lossfuse::ctc_backward(lp.view, tg.view, il.view, tl.view,
                             has_gl ? std::optional<TensorView>(gl.view) : std::nullopt, o, grad.view);
    } else {
      lossfuse::CtcOutputs out{loss.view, want_nll ? std::optional<TensorView>(nll.view) : std::nullopt, std::nullopt};
      lossfuse::ctc_forward(lp.view, tg.view, il.view, tl.view, o, out);
    }
  });
  if (!ok) return 0;
  if (!valid) fail("accepted an invalid argument");
  for (double v : lpv) {
    if (!std::isfinite(v)) return 0;
  }
  ++stats.checked;

  const double u = unit_of(dt);
  double sum = 0, sum_tol = 0;
  for (std::int64_t n = 0; n < N; ++n) {
    const auto T_n = static_cast<std::int64_t>(ilv[n]);
    std::vector<double> lp_n(static_cast<std::size_t>(T * C));
    for (std::int64_t t = 0; t < T; ++t) {
      for (std::int64_t c = 0; c < C; ++c) lp_n[t * C + c] = lpv[(t * N + n) * C + c];
    }
    const lfref::CtcSampleResult r = lfref::ctc_sample(lp_n, T, C, T_n, labels[n], o.blank);
    const bool zeroed = o.zero_infinity && std::isinf(r.nll);
    const double loss_n = zeroed ? 0.0 : r.nll;
    const double tol_n = 64 * u * static_cast<double>(T + 2) * (std::fabs(std::isfinite(r.nll) ? r.nll : 0.0) + 1);
    const double scale =
        reduction == Reduction::mean ? 1.0 / std::max<double>(1.0, static_cast<double>(labels[n].size())) : 1.0;
    if (!backward) {
      if (want_nll) expect_close(nll.get(n), r.nll, tol_n, "negative log-likelihood");
      if (none) expect_close(loss.get(n), loss_n, tol_n, "sample loss");
      sum += loss_n * scale, sum_tol += tol_n * scale;
      continue;
    }
    double g = has_gl ? (none ? glv[n] : glv[0]) : 1.0;
    if (reduction == Reduction::mean) g *= scale / static_cast<double>(N);
    for (std::int64_t t = 0; t < T; ++t) {
      for (std::int64_t c = 0; c < C; ++c) {
        const double want = zeroed ? 0.0 : g * r.grad[t * C + c];
        const double e = (1 + std::exp(lp_n[t * C + c])) * std::fabs(g);
        expect_stored(dt, grad.get((t * N + n) * C + c), want,
                      64 * u * static_cast<double>(T + 2) * (std::fabs(loss_n) + 1) * e, "gradient");
      }
    }
  }
  if (!backward && !none) {
    const double want = reduction == Reduction::mean ? sum / static_cast<double>(N) : sum;
    expect_close(loss.get(0), want, reduction == Reduction::mean ? sum_tol / static_cast<double>(N) : sum_tol,
                 "reduced loss");
  }
  return 0;
}
