// lossfuse bench: CTC loss.
//
// What it measures, per (T, N, C, S) shape (default 200x32x64x50) in float32: log_probs (T, N, C) =
// log_softmax of N(0, 2) logits, padded int64 targets (N, S) with labels in [1, C) (blank 0) and target lengths
// S - (b mod 8), input lengths T - (b mod 5), from a fixed seed:
//   forward  lossfuse::ctc_forward, reduction mean;
//   fwd+bwd  ctc_forward saving log_alpha (T, N, 2S+1), then ctc_backward from it into a preallocated grad.
// The baseline is the plain scalar recursion below (PyTorch's CPU loop: log-space alpha, then beta and the
// gradient, std::exp/std::log per term), run by lossfuse::parallel_for over samples on the same threads, so the
// speedup isolates the kernel. Before timing, the mean loss must agree with the baseline's to a relative 1e-4
// and 3 samples' gradients elementwise (atol 1e-6 + rtol 1e-4); a disagreement is a FAIL row.
// GB/s counts T*N*C*4 bytes read (forward), read + written (fwd+bwd); the recursion, not memory, bounds it.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "lossfuse/ctc.hpp"
#include "lossfuse/parallel.hpp"
#include "lossfuse/tensor.hpp"

namespace lossfuse::bench {
namespace {

constexpr std::uint64_t kLogitSeed = 0xc7c5eedULL;
constexpr std::uint64_t kTargetSeed = 0x7a6e75ULL;

// ---- the scalar baseline ------------------------------------------------------------------------------

// Per sample: alpha (T, 2S+1) in log space, nll; with a gradient, beta row by row and the per-class log
// occupancy, then grad = g (exp(lp) - exp(occ + nll - lp)) for t < il, 0 past il. Blank 0, reduction mean.
struct ScalarBaseline {
  const float* lp;             // (T, N, C)
  const std::int64_t* target;  // (N, S)
  const std::int64_t* il;      // (N)
  const std::int64_t* tl;      // (N)
  std::int64_t T, N, C, S;
  std::vector<float>* alpha;  // per sample (T, 2S+1)
  std::vector<float>* beta;   // per sample (2, 2S+1)
  std::vector<float>* occ;    // per sample (C)
  double* nll;                // (N)

  static float lae(float a, float b, float c) {
    float m = std::max(a, std::max(b, c));
    if (m == -std::numeric_limits<float>::infinity()) m = 0;
    return std::log(std::exp(a - m) + std::exp(b - m) + std::exp(c - m)) + m;
  }

  void sample(std::int64_t b, float* grad, float g) const {
    const float ninf = -std::numeric_limits<float>::infinity();
    const std::int64_t L = 2 * S + 1, n = tl[b], len = 2 * n + 1, in = il[b];
    auto lab = [&](std::int64_t s) { return s % 2 == 0 ? std::int64_t{0} : target[b * S + s / 2]; };
    auto x = [&](std::int64_t t, std::int64_t c) { return lp[(t * N + b) * C + c]; };
    float* a = alpha[b].data();
    std::fill(a, a + T * L, ninf);
    a[0] = x(0, 0);
    if (n > 0) a[1] = x(0, lab(1));
    for (std::int64_t t = 1; t < in; ++t) {
      for (std::int64_t s = 0; s < len; ++s) {
        const float a1 = a[(t - 1) * L + s], a2 = s > 0 ? a[(t - 1) * L + s - 1] : ninf;
        const float a3 = s > 1 && lab(s) != lab(s - 2) ? a[(t - 1) * L + s - 2] : ninf;
        a[t * L + s] = lae(a1, a2, a3) + x(t, lab(s));
      }
    }
    const float* last = a + (in - 1) * L;
    const float ll = n == 0 ? last[0] : lae(last[len - 1], last[len - 2], ninf);
    nll[b] = -static_cast<double>(ll);
    if (grad == nullptr) return;
    const float nl = -ll;
    float* bt = beta[b].data();
    float* oc = occ[b].data();
    auto write_row = [&](std::int64_t t) {
      for (std::int64_t c = 0; c < C; ++c) {
        const float v = x(t, c);
        grad[(t * N + b) * C + c] = (std::exp(v) - std::exp(oc[c] + nl - v)) * g;
      }
    };
    float* next = bt;
    std::fill(next, next + L, ninf);
    std::fill(oc, oc + C, ninf);
    next[len - 1] = x(in - 1, 0);
    oc[0] = last[len - 1] + next[len - 1];
    if (n > 0) {
      next[len - 2] = x(in - 1, lab(len - 2));
      oc[lab(len - 2)] = last[len - 2] + next[len - 2];
    }
    write_row(in - 1);
    for (std::int64_t t = in - 2; t >= 0; --t) {
      float* cur = bt + ((in - 1 - t) % 2) * L;
      std::fill(oc, oc + C, ninf);
      for (std::int64_t s = len - 1; s >= 0; --s) {
        const float b1 = next[s], b2 = s + 1 < len ? next[s + 1] : ninf;
        const float b3 = s + 2 < len && lab(s + 2) != lab(s) ? next[s + 2] : ninf;
        cur[s] = lae(b1, b2, b3) + x(t, lab(s));
        float& o = oc[lab(s)];
        o = lae(o, a[t * L + s] + cur[s], ninf);
      }
      write_row(t);
      next = cur;
    }
    for (std::int64_t t = in; t < T; ++t)
      for (std::int64_t c = 0; c < C; ++c) grad[(t * N + b) * C + c] = 0.0f;
  }

  // Returns the mean loss (mean over b of nll_b / max(tl_b, 1)); grad (T, N, C) is written when not null.
  double run(float* grad) const {
    lossfuse::parallel_for(0, N, 1, [&](std::int64_t b0, std::int64_t b1) {
      for (std::int64_t b = b0; b < b1; ++b) {
        const float g = 1.0f / static_cast<float>(N) / static_cast<float>(std::max<std::int64_t>(tl[b], 1));
        sample(b, grad, g);
      }
    });
    double total = 0.0;
    for (std::int64_t b = 0; b < N; ++b) total += nll[b] / static_cast<double>(std::max<std::int64_t>(tl[b], 1));
    return total / static_cast<double>(N);
  }
};

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// ---- one shape: forward and fwd+bwd -------------------------------------------------------------------

void run_group(Run& run, std::int64_t T, std::int64_t N, std::int64_t C, std::int64_t S) {
  const std::vector<std::int64_t> shape = {T, N, C, S};
  const std::string tag = "f32 " + shape_string(shape);
  const std::int64_t L = 2 * S + 1;
  const std::size_t bytes = static_cast<std::size_t>(T * N * C) * sizeof(float);

  Buffer lp(bytes), grad(bytes), base_grad(bytes), alpha(static_cast<std::size_t>(T * N * L) * sizeof(float));
  Buffer target(static_cast<std::size_t>(N * S) * sizeof(std::int64_t));
  fill_normal(lp.data(), DType::f32, T * N * C, 2.0, kLogitSeed);
  float* x = lp.as<float>();
  for (std::int64_t r = 0; r < T * N; ++r) {  // log_softmax over C
    float m = -std::numeric_limits<float>::infinity(), s = 0;
    for (std::int64_t c = 0; c < C; ++c) m = std::max(m, x[r * C + c]);
    for (std::int64_t c = 0; c < C; ++c) s += std::exp(x[r * C + c] - m);
    const float l = m + std::log(s);
    for (std::int64_t c = 0; c < C; ++c) x[r * C + c] -= l;
  }
  fill_uniform_index(target.as<std::int64_t>(), N * S, C - 1, kTargetSeed);
  for (std::int64_t i = 0; i < N * S; ++i) target.as<std::int64_t>()[i] += 1;  // labels in [1, C)
  std::vector<std::int64_t> il(static_cast<std::size_t>(N)), tl(static_cast<std::size_t>(N));
  for (std::int64_t b = 0; b < N; ++b) {
    il[b] = std::max<std::int64_t>(1, T - b % 5);
    tl[b] = std::max<std::int64_t>(0, S - b % 8);
  }
  const Bandwidth& bw = run.bandwidth(lp.data(), grad.data(), bytes);
  (void)bw;

  float loss = 0.0f;
  const TensorView X = TensorView::contiguous(lp.data(), DType::f32, {T, N, C});
  const TensorView Y = TensorView::contiguous(target.data(), DType::i64, {N, S});
  const TensorView IL = TensorView::contiguous(il.data(), DType::i64, {N});
  const TensorView TL = TensorView::contiguous(tl.data(), DType::i64, {N});
  const TensorView G = TensorView::contiguous(grad.data(), DType::f32, {T, N, C});
  const TensorView A = TensorView::contiguous(alpha.data(), DType::f32, {T, N, L});
  const CtcOptions opt;  // blank 0, mean
  CtcOutputs fwd_only{TensorView::contiguous(&loss, DType::f32, nullptr, 0), std::nullopt, std::nullopt};
  CtcOutputs fwd_alpha{TensorView::contiguous(&loss, DType::f32, nullptr, 0), std::nullopt, A};

  std::vector<std::vector<float>> b_alpha(static_cast<std::size_t>(N),
                                          std::vector<float>(static_cast<std::size_t>(T * L)));
  std::vector<std::vector<float>> b_beta(static_cast<std::size_t>(N),
                                         std::vector<float>(static_cast<std::size_t>(2 * L)));
  std::vector<std::vector<float>> b_occ(static_cast<std::size_t>(N), std::vector<float>(static_cast<std::size_t>(C)));
  std::vector<double> b_nll(static_cast<std::size_t>(N));
  const ScalarBaseline base{x,
                            target.as<std::int64_t>(),
                            il.data(),
                            tl.data(),
                            T,
                            N,
                            C,
                            S,
                            b_alpha.data(),
                            b_beta.data(),
                            b_occ.data(),
                            b_nll.data()};

  for (const bool backward : {false, true}) {
    const std::string direction = backward ? "fwd+bwd" : "forward";
    run.step(std::string(direction).append(" ").append(tag));
    Row row;
    row.loss = "ctc";
    row.shape = shape;
    row.dtype = "f32";
    row.direction = direction;
    const double moved = static_cast<double>(bytes) * (backward ? 2.0 : 1.0);
    auto kernel = [&] {
      if (backward) {
        ctc_forward(X, Y, IL, TL, opt, fwd_alpha);
        ctc_backward(X, Y, IL, TL, std::nullopt, opt, G, A);
      } else {
        ctc_forward(X, Y, IL, TL, opt, fwd_only);
      }
    };
    auto baseline = [&] { return base.run(backward ? base_grad.as<float>() : nullptr); };
    auto check = [&]() -> std::string {
      const double want = baseline();
      std::string problem;
      if (!(std::abs(loss - want) <= 1e-4 * std::abs(want))) {
        problem = "loss " + fixed(loss, 7) + " vs baseline " + fixed(want, 7);
      }
      if (backward && problem.empty()) {
        for (std::int64_t b : {std::int64_t{0}, N / 2, N - 1}) {
          for (std::int64_t t = 0; t < T && problem.empty(); ++t)
            for (std::int64_t c = 0; c < C; ++c) {
              const std::int64_t i = (t * N + b) * C + c;
              const double got = grad.as<float>()[i], ref = base_grad.as<float>()[i];
              if (!(std::abs(got - ref) <= 1e-6 + 1e-4 * std::abs(ref))) {
                problem = "grad[" + std::to_string(t) + ", " + std::to_string(b) + ", " + std::to_string(c) + "] " +
                          fixed(got, 9) + " vs baseline " + fixed(ref, 9);
                break;
              }
            }
        }
      }
      return problem;
    };
    const std::function<void()> base_fn = [&] { (void)baseline(); };
    check_and_time(run, std::move(row), kernel, check, {backward, lp.data(), grad.data(), bytes}, moved, &base_fn);
  }
}

Suite make_suite() {
  Suite s;
  s.name = "ctc";
  // NOLINTBEGIN(bugprone-suspicious-missing-comma)
  s.notes = {
      "ctc: forward = ctc_forward (reduction mean); fwd+bwd = ctc_forward saving log_alpha, then ctc_backward "
      "from it into a preallocated grad",
      "  inputs: log_softmax of N(0, 2) logits (T, N, C), padded int64 targets (N, S) labels in [1, C), "
      "lengths T - b%5 and S - b%8, fixed seed",
      "  baseline: plain scalar log-space recursion (torch's CPU loop: std::exp/std::log per term), by "
      "lossfuse::parallel_for over samples on the same threads; ms is per batch",
      "  check before timing: mean loss within a relative 1e-4 of the baseline, 3 samples' gradients "
      "elementwise (atol 1e-6, rtol 1e-4)",
  };
  // NOLINTEND(bugprone-suspicious-missing-comma)
  s.shape_rank = 4;
  s.shape_help = "TxNxCxS";
  s.default_shapes = {{200, 32, 64, 50}};
  s.quick_shapes = {{200, 32, 64, 50}};
  s.dtypes = {DType::f32};
  s.default_dtypes = {DType::f32};
  s.plan = [](const Options&, const std::vector<std::vector<std::int64_t>>& shapes, const std::vector<DType>&) {
    std::vector<Group> groups;
    for (const auto& shape : shapes) {
      const std::int64_t T = shape[0], N = shape[1], C = shape[2], S = shape[3];
      groups.push_back({2, [T, N, C, S](Run& run) { run_group(run, T, N, C, S); }});
    }
    return groups;
  };
  return s;
}

}  // namespace

LOSSFUSE_BENCH_SUITE(make_suite());

}  // namespace lossfuse::bench
