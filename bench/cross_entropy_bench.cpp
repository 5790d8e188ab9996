// lossfuse bench: cross-entropy over large vocabularies.
//
// What it measures, per (N, V) shape and dtype (f32, bf16), on logits (N, V) ~ N(0, 2) and int64 targets (N)
// from a fixed seed:
//   forward  lossfuse::cross_entropy_forward, reduction mean, lse (N) saved;
//            bytes moved = N*V*elem read.
//   fwd+bwd  lossfuse::cross_entropy_forward_backward, GradWrite::separate into a preallocated grad (N, V);
//            bytes moved = N*V*elem read + N*V*elem written. O(N) bytes (targets, lse, loss) are ignored.
// Each is compared with the read (forward) or copy (fwd+bwd) bandwidth probe at the same byte size, and with
// the plain two-pass scalar baseline below, run by lossfuse::parallel_for over rows on the same threads so
// that the speedup isolates the kernel. Before timing, lossfuse's loss and lse must agree with the baseline's
// to a relative 1e-3 and sampled gradient rows elementwise; a disagreement is reported as a FAIL row.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "lossfuse/cross_entropy.hpp"
#include "lossfuse/parallel.hpp"
#include "lossfuse/tensor.hpp"

namespace lossfuse::bench {
namespace {

constexpr std::uint64_t kLogitSeed = 0x1f05e5eedULL;
constexpr std::uint64_t kTargetSeed = 0x7a59e7ULL;
constexpr double kLogitStddev = 2.0;
constexpr double kLossRtol = 1e-3;

// ---- the scalar baseline ------------------------------------------------------------------------------

inline float load(const float* p, std::int64_t i) { return p[i]; }
inline float load(const std::uint16_t* p, std::int64_t i) { return bf16_to_float(p[i]); }
inline void store(float* p, std::int64_t i, float v) { p[i] = v; }
inline void store(std::uint16_t* p, std::int64_t i, float v) { p[i] = float_to_bf16(v); }

// Plain two-pass cross-entropy with index targets and reduction mean, T = float or bfloat16 bits.
// Per row of x (N, V): pass 1 m = max x; pass 2 s = sum exp(x - m) in float; lse = m + log s;
// loss_r = lse - x[y_r]. With a gradient, pass 3 writes grad[c] = (exp(x[c] - m) / s - [c == y]) / N.
template <class T>
struct ScalarBaseline {
  const T* x;             // (N, V)
  const std::int64_t* y;  // (N)
  std::int64_t n, v;
  float* lse;       // (N)
  float* row_loss;  // (N)

  struct RowStats {
    float max, sum;
  };
  RowStats stats(std::int64_t r) const {
    const T* row = x + r * v;
    float m = -std::numeric_limits<float>::infinity();
    for (std::int64_t c = 0; c < v; ++c) {
      m = std::max(m, load(row, c));
    }
    float s = 0.0f;
    for (std::int64_t c = 0; c < v; ++c) {
      s += std::exp(load(row, c) - m);
    }
    return {m, s};
  }

  // One gradient row in float (before rounding to T): the reference for the gradient check.
  void grad_row(std::int64_t r, std::vector<float>& out) const {
    const RowStats st = stats(r);
    const T* row = x + r * v;
    const float inv_s = 1.0f / st.sum, inv_n = 1.0f / static_cast<float>(n);
    out.resize(static_cast<std::size_t>(v));
    for (std::int64_t c = 0; c < v; ++c) {
      out[c] = (std::exp(load(row, c) - st.max) * inv_s - (c == y[r] ? 1.0f : 0.0f)) * inv_n;
    }
  }

  // Returns the mean loss; grad (N, V) is written when not null.
  double run(T* grad) const {
    lossfuse::parallel_for(0, n, 1, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t r = b; r < e; ++r) {
        const RowStats st = stats(r);
        const T* row = x + r * v;
        lse[r] = st.max + std::log(st.sum);
        row_loss[r] = lse[r] - load(row, y[r]);
        if (grad != nullptr) {
          T* g = grad + r * v;
          const float inv_s = 1.0f / st.sum, inv_n = 1.0f / static_cast<float>(n);
          for (std::int64_t c = 0; c < v; ++c) {
            store(g, c, (std::exp(load(row, c) - st.max) * inv_s - (c == y[r] ? 1.0f : 0.0f)) * inv_n);
          }
        }
      }
    });
    double total = 0.0;
    for (std::int64_t r = 0; r < n; ++r) {
      total += row_loss[r];
    }
    return total / static_cast<double>(n);
  }
};

double rel_err(double a, double ref) { return std::abs(a - ref) / std::max(std::abs(ref), 1e-30); }

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string general(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.7g", v);
  return buf;
}

// ---- one (shape, dtype) group: forward and fwd+bwd ----------------------------------------------------

template <class T>
void run_group(Run& run, std::int64_t n, std::int64_t v, DType dtype) {
  const std::vector<std::int64_t> shape = {n, v};
  const std::string tag = std::string(short_dtype_name(dtype)) + " " + shape_string(shape);
  const auto elems = static_cast<std::size_t>(n * v);
  const std::size_t bytes = elems * dtype_size(dtype);

  Buffer logits(bytes), grad(bytes), target(static_cast<std::size_t>(n) * sizeof(std::int64_t));
  Buffer lse(static_cast<std::size_t>(n) * sizeof(float)), base_lse(lse.bytes()), base_loss(lse.bytes());
  fill_normal(logits.data(), dtype, n * v, kLogitStddev, kLogitSeed);
  fill_uniform_index(target.as<std::int64_t>(), n, v, kTargetSeed);
  const Bandwidth& bw = run.bandwidth(logits.data(), grad.data(), bytes);

  float loss = 0.0f;
  const TensorView x = TensorView::contiguous(logits.data(), dtype, {n, v});
  const TensorView y = TensorView::contiguous(target.data(), DType::i64, {n});
  const TensorView g = TensorView::contiguous(grad.data(), dtype, {n, v});
  const CrossEntropyOutputs out{TensorView::contiguous(&loss, DType::f32, nullptr, 0),
                                TensorView::contiguous(lse.data(), DType::f32, {n}), std::nullopt};
  const CrossEntropyOptions opt;  // reduction mean, no weights, no smoothing
  const ScalarBaseline<T> base{logits.as<T>(),       target.as<std::int64_t>(), n, v,
                               base_lse.as<float>(), base_loss.as<float>()};

  for (const bool backward : {false, true}) {
    const std::string direction = backward ? "fwd+bwd" : "forward";
    run.step(std::string(direction).append(" ").append(tag));
    Row row;
    row.loss = "cross_entropy";
    row.shape = shape;
    row.dtype = std::string(short_dtype_name(dtype));
    row.direction = direction;
    const double moved = static_cast<double>(bytes) * (backward ? 2.0 : 1.0);

    auto kernel = [&] {
      if (backward) {
        cross_entropy_forward_backward(x, y, opt, out, std::nullopt, g, GradWrite::separate);
      } else {
        cross_entropy_forward(x, y, opt, out);
      }
    };
    auto baseline = [&] { return base.run(backward ? grad.as<T>() : nullptr); };

    // Check before timing: one call of each, compared.
    auto check = [&]() -> std::string {
      std::vector<float> got_rows;  // sampled gradient rows from lossfuse, saved before the baseline overwrites
      const std::vector<std::int64_t> sample = {0, n / 2, n - 1};
      if (backward) {
        for (std::int64_t r : sample) {
          for (std::int64_t c = 0; c < v; ++c) {
            got_rows.push_back(load(grad.as<T>() + r * v, c));
          }
        }
      }
      const double want = baseline();
      std::string problem;
      if (!(rel_err(loss, want) <= kLossRtol)) {
        problem = "loss " + fixed(loss, 7) + " vs baseline " + fixed(want, 7);
      }
      double worst_lse = 0.0;
      std::int64_t worst_lse_row = 0;
      for (std::int64_t r = 0; r < n; ++r) {
        const double e = rel_err(lse.as<float>()[r], base_lse.as<float>()[r]);
        if (std::isnan(e) || e > worst_lse) {
          worst_lse = e;
          worst_lse_row = r;
          if (std::isnan(e)) {
            break;
          }
        }
      }
      if (problem.empty() && !(worst_lse <= kLossRtol)) {
        problem = "lse[" + std::to_string(worst_lse_row) + "] " + fixed(lse.as<float>()[worst_lse_row], 6) +
                  " vs baseline " + fixed(base_lse.as<float>()[worst_lse_row], 6);
      }
      if (backward && problem.empty()) {
        const double rtol = dtype == DType::bf16 ? 1e-2 : 1e-3, atol = 1e-7 / static_cast<double>(n);
        std::vector<float> ref;
        for (std::size_t k = 0; k < sample.size() && problem.empty(); ++k) {
          base.grad_row(sample[k], ref);
          for (std::int64_t c = 0; c < v; ++c) {
            const double a = got_rows[k * static_cast<std::size_t>(v) + c], b = ref[c];
            if (!(std::abs(a - b) <= atol + rtol * std::abs(b))) {
              problem = "grad[" + std::to_string(sample[k]) + ", " + std::to_string(c) + "] " + general(a) +
                        " vs baseline " + general(b);
              break;
            }
          }
        }
      }
      return problem;
    };
    const std::function<void()> base_fn = [&] { (void)baseline(); };
    check_and_time(run, std::move(row), kernel, check, {backward, logits.data(), grad.data(), bytes}, moved, &base_fn);
  }
}

Suite make_suite() {
  Suite s;
  s.name = "cross_entropy";
  // Adjacent literals below are deliberate: one note per entry, split to fit the line limit.
  // NOLINTBEGIN(bugprone-suspicious-missing-comma)
  s.notes = {
      "cross_entropy: forward = cross_entropy_forward (reduction mean, lse saved); fwd+bwd = "
      "cross_entropy_forward_backward (GradWrite::separate into a preallocated grad buffer)",
      "  inputs: logits ~ N(0, 2), int64 targets, fixed seed; GB/s counts N*V*elem read (forward), "
      "read + written (fwd+bwd)",
      "  baseline: plain two-pass scalar cross-entropy (per row max, then sum of std::exp(x - max) in float; "
      "fwd+bwd adds a pass writing (softmax - onehot)/N; bf16 by scalar shifts),",
      "  run by lossfuse::parallel_for over rows on the same threads, so the speedup isolates the kernel",
      "  check before timing: loss and lse within a relative 1e-3 of the baseline, 3 gradient rows "
      "elementwise (rtol 1e-3 f32, 1e-2 bf16)",
  };
  // NOLINTEND(bugprone-suspicious-missing-comma)
  s.shape_rank = 2;
  s.shape_help = "NxV";
  s.default_shapes = {{32, 32000}, {128, 32000}, {32, 50257}, {4096, 32000}, {4096, 128256}};
  s.quick_shapes = {{32, 32000}, {128, 32000}, {32, 50257}};
  s.dtypes = {DType::f32, DType::bf16};
  s.default_dtypes = {DType::f32, DType::bf16};
  s.plan = [](const Options&, const std::vector<std::vector<std::int64_t>>& shapes, const std::vector<DType>& dtypes) {
    std::vector<Group> groups;
    for (const auto& shape : shapes) {
      for (DType t : dtypes) {
        const std::int64_t n = shape[0], v = shape[1];
        groups.push_back({2, [n, v, t](Run& run) {
                            if (t == DType::bf16) {
                              run_group<std::uint16_t>(run, n, v, t);
                            } else {
                              run_group<float>(run, n, v, t);
                            }
                          }});
      }
    }
    return groups;
  };
  return s;
}

}  // namespace

LOSSFUSE_BENCH_SUITE(make_suite());

}  // namespace lossfuse::bench
