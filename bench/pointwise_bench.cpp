// lossfuse bench: the elementwise losses, one suite each (so `--loss mse` works): mse, l1, smooth_l1, huber,
// and bce, bce_with_logits, kl_div, poisson_nll, gaussian_nll, hinge_embedding, margin_ranking.
//
// What it measures, per length N (default 16M elements) and dtype (f32, bf16), on k operands (input, target;
// gaussian_nll adds var, margin_ranking is (input1, input2, target): k = 3) from N(0, 1) samples with fixed
// seeds (mapped into each loss's domain for the last seven), stored back to back in one buffer, contiguous,
// no weight, default options (beta = delta = 1):
//   forward   <loss>_forward, reduction mean, into a 0-d float32 loss;
//             bytes moved = k*N*elem read.
//   backward  <loss>_backward, reduction mean, no upstream gradient, the input's gradient only (input1 for
//             margin_ranking) into a preallocated buffer; bytes moved = k*N*elem read + N*elem written.
// Each is timed interleaved with a probe over the same total bytes: forward with the read probe over the k
// operands; backward with the copy probe over (k+1)/2*N*elem (as much read as written: (k+1)*N*elem in all;
// no probe has the kernel's k:1 read:write mix, the copy is the closest).
// Before timing, for mse/l1/smooth_l1/huber the forward loss must agree with a float64 scalar sum to a
// relative 1e-4 (f32) / 1e-3 (bf16) and sampled gradient elements with the formula; for the others the loss
// and sampled gradients must be finite. A failed check is reported as a FAIL row (timed anyway).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "lossfuse/loss_kind.hpp"
#include "lossfuse/parallel.hpp"
#include "lossfuse/pointwise.hpp"
#include "lossfuse/tensor.hpp"

namespace lossfuse::bench {
namespace {

constexpr std::uint64_t kInputSeed = 0x9017e5eedULL;
constexpr std::uint64_t kTargetSeed = 0x7a26e7ULL;
constexpr std::uint64_t kThirdSeed = 0x3e1dULL;
constexpr double kParam = 1.0;  // beta / delta

// The loss catalog's kinds (lossfuse/loss_kind.hpp); mse, l1, smooth_l1 and huber are checked against float64
// formulas below, the others checked finite.
using Kind = LossKind;
std::string kind_name(Kind k) { return std::string(loss_kind_name(k)); }
bool checked(Kind k) { return k == Kind::mse || k == Kind::l1 || k == Kind::smooth_l1 || k == Kind::huber; }
// Operands read: input and target, plus var (gaussian_nll) or the second input (margin_ranking: x1, x2, y).
int operands(Kind k) { return k == Kind::gaussian_nll || k == Kind::margin_ranking ? 3 : 2; }

// Operand j's values from a N(0, 1) sample v, for the loss's domain.
double shape_value(Kind k, int j, double v) {
  const auto sigmoid = [](double t) { return 1.0 / (1.0 + std::exp(-t)); };
  switch (k) {
    case Kind::bce: return sigmoid(v);                                         // probabilities, target too
    case Kind::bce_with_logits: return j == 0 ? v : sigmoid(v);                // logits, soft targets
    case Kind::kl_div: return j == 0 ? -std::fabs(v) - 0.1 : sigmoid(v);       // log-probabilities, probabilities
    case Kind::poisson_nll: return j == 0 ? v : std::floor(2 * std::fabs(v));  // log rates, counts
    case Kind::gaussian_nll: return j == 2 ? 0.5 + std::fabs(v) : v;           // var > 0
    case Kind::hinge_embedding: return j == 0 ? v : (v >= 0 ? 1.0 : -1.0);
    case Kind::margin_ranking: return j == 2 ? (v >= 0 ? 1.0 : -1.0) : v;
    default: return v;
  }
}

// ops[j]: operand j (input, target, third).
void forward(Kind k, const std::vector<TensorView>& ops, const TensorView& loss) {
  const TensorView &x = ops[0], &y = ops[1];
  switch (k) {
    case Kind::mse: return mse_forward(x, y, MseOptions{}, loss);
    case Kind::l1: return l1_forward(x, y, L1Options{}, loss);
    case Kind::smooth_l1: return smooth_l1_forward(x, y, SmoothL1Options{Reduction::mean, kParam}, loss);
    case Kind::huber: return huber_forward(x, y, HuberOptions{Reduction::mean, kParam, std::nullopt}, loss);
    case Kind::bce: return bce_forward(x, y, BceOptions{}, loss);
    case Kind::bce_with_logits: return bce_with_logits_forward(x, y, BceWithLogitsOptions{}, loss);
    case Kind::kl_div: return kl_div_forward(x, y, KlDivOptions{}, loss);
    case Kind::poisson_nll: return poisson_nll_forward(x, y, PoissonNllOptions{}, loss);
    case Kind::gaussian_nll: return gaussian_nll_forward(x, y, ops[2], GaussianNllOptions{}, loss);
    case Kind::hinge_embedding: return hinge_embedding_forward(x, y, HingeEmbeddingOptions{}, loss);
    case Kind::margin_ranking: return margin_ranking_forward(x, y, ops[2], MarginRankingOptions{}, loss);
    default: return;  // not an elementwise loss: no suite is made for it
  }
}
void backward(Kind k, const std::vector<TensorView>& ops, const TensorView& gx) {
  const TensorView &x = ops[0], &y = ops[1];
  PointwiseGrads g;
  g.input = gx;
  const std::nullopt_t up = std::nullopt;
  switch (k) {
    case Kind::mse: return mse_backward(x, y, up, MseOptions{}, g);
    case Kind::l1: return l1_backward(x, y, up, L1Options{}, g);
    case Kind::smooth_l1: return smooth_l1_backward(x, y, up, SmoothL1Options{Reduction::mean, kParam}, g);
    case Kind::huber: return huber_backward(x, y, up, HuberOptions{Reduction::mean, kParam, std::nullopt}, g);
    case Kind::bce: return bce_backward(x, y, up, BceOptions{}, g);
    case Kind::bce_with_logits: return bce_with_logits_backward(x, y, up, BceWithLogitsOptions{}, g);
    case Kind::kl_div: return kl_div_backward(x, y, up, KlDivOptions{}, g);
    case Kind::poisson_nll: return poisson_nll_backward(x, y, up, PoissonNllOptions{}, g);
    case Kind::gaussian_nll: return gaussian_nll_backward(x, y, ops[2], up, GaussianNllOptions{}, g);
    case Kind::hinge_embedding: return hinge_embedding_backward(x, y, up, HingeEmbeddingOptions{}, g);
    case Kind::margin_ranking: {
      MarginRankingGrads mg;
      mg.input1 = gx;
      return margin_ranking_backward(x, y, ops[2], up, MarginRankingOptions{}, mg);
    }
    default: return;  // not an elementwise loss: no suite is made for it
  }
}

// The formulas in float64, for the check.
double value(Kind k, double d) {
  const double a = std::fabs(d);
  switch (k) {
    case Kind::mse: return d * d;
    case Kind::l1: return a;
    case Kind::smooth_l1: return a < kParam ? 0.5 * d * d / kParam : a - 0.5 * kParam;
    case Kind::huber: return a < kParam ? 0.5 * d * d : kParam * (a - 0.5 * kParam);
    default: return 0;
  }
}
double derivative(Kind k, double d) {
  const double s = d > 0 ? 1.0 : d < 0 ? -1.0 : 0.0;
  switch (k) {
    case Kind::mse: return 2 * d;
    case Kind::l1: return s;
    case Kind::smooth_l1: return std::fabs(d) < kParam ? d / kParam : s;
    case Kind::huber: return std::fabs(d) <= kParam ? d : kParam * s;
    default: return 0;
  }
}

double load(DType t, const void* p, std::int64_t i) {
  return t == DType::bf16 ? bf16_to_float(static_cast<const std::uint16_t*>(p)[i]) : static_cast<const float*>(p)[i];
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

void store(DType t, void* p, std::int64_t i, double v) {
  if (t == DType::bf16) {
    static_cast<std::uint16_t*>(p)[i] = float_to_bf16(static_cast<float>(v));
  } else {
    static_cast<float*>(p)[i] = static_cast<float>(v);
  }
}

void run_group(Run& run, Kind kind, std::int64_t n, DType dtype) {
  const std::vector<std::int64_t> shape = {n};
  const std::string tag =
      std::string(kind_name(kind)) + " " + std::string(short_dtype_name(dtype)) + " " + shape_string(shape);
  const std::size_t elem = dtype_size(dtype), bytes = static_cast<std::size_t>(n) * elem;
  const int k = operands(kind);

  // The operands back to back, so that one read probe covers exactly the bytes the forward reads; the gradient
  // buffer is also the copy probe's destination ((k + 1) / 2 operands' worth).
  Buffer ops_buf(static_cast<std::size_t>(k) * bytes), grad((static_cast<std::size_t>(k) + 1) * bytes / 2);
  std::vector<TensorView> ops;
  const std::uint64_t seeds[3] = {kInputSeed, kTargetSeed, kThirdSeed};
  for (int j = 0; j < k; ++j) {
    void* p = static_cast<std::uint8_t*>(ops_buf.data()) + static_cast<std::size_t>(j) * bytes;
    fill_normal(p, dtype, n, 1.0, seeds[j]);
    if (!checked(kind)) {
      parallel_for(0, n, 1 << 16, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t i = b; i < e; ++i) store(dtype, p, i, shape_value(kind, j, load(dtype, p, i)));
      });
    }
    ops.push_back(TensorView::contiguous(p, dtype, {n}));
  }
  const void* xp = ops[0].data;
  const void* yp = ops[1].data;
  const TensorView g = TensorView::contiguous(grad.data(), dtype, {n});
  float loss = 0.0f;
  const TensorView l = TensorView::contiguous(&loss, DType::f32, nullptr, 0);

  for (const bool bwd : {false, true}) {
    const std::string direction = bwd ? "backward" : "forward";
    run.step(direction + " " + tag);
    Row row;
    row.loss = kind_name(kind);
    row.shape = shape;
    row.dtype = std::string(short_dtype_name(dtype));
    row.direction = direction;
    const double moved = static_cast<double>(bytes) * (bwd ? k + 1 : k);
    auto kernel = [&] {
      if (bwd) {
        backward(kind, ops, g);
      } else {
        forward(kind, ops, l);
      }
    };
    auto check = [&]() -> std::string {
      std::string problem;
      if (!checked(kind)) {
        if (!bwd && !std::isfinite(loss)) problem = "loss " + std::to_string(loss) + " is not finite";
        for (std::int64_t i = 0; bwd && i < n && problem.empty(); i += std::max<std::int64_t>(1, n / 4099)) {
          if (!std::isfinite(load(dtype, grad.data(), i))) {
            problem = "grad[" + std::to_string(i) + "] " + std::to_string(load(dtype, grad.data(), i)) + " is not finite";
          }
        }
      } else if (!bwd) {
        double sum = 0;
        for (std::int64_t i = 0; i < n; ++i) sum += value(kind, load(dtype, xp, i) - load(dtype, yp, i));
        const double want = sum / static_cast<double>(n), rtol = dtype == DType::bf16 ? 1e-3 : 1e-4;
        if (!(std::fabs(loss - want) <= rtol * std::fabs(want))) {
          problem = "loss " + fixed(loss, 7) + " vs float64 " + fixed(want, 7);
        }
      } else {
        const double rtol = dtype == DType::bf16 ? 1e-2 : 1e-5;
        for (std::int64_t i = 0; i < n && problem.empty(); i += std::max<std::int64_t>(1, n / 4099)) {
          const double want = derivative(kind, load(dtype, xp, i) - load(dtype, yp, i)) / static_cast<double>(n);
          const double got = load(dtype, grad.data(), i);
          if (!(std::fabs(got - want) <= rtol * std::fabs(want) + 1e-30)) {
            problem = "grad[" + std::to_string(i) + "] " + std::to_string(got) + " vs " + std::to_string(want);
          }
        }
      }
      return problem;
    };
    check_and_time(run, std::move(row), kernel, check,
                   {bwd, xp, grad.data(), bwd ? (static_cast<std::size_t>(k) + 1) * bytes / 2
                                              : static_cast<std::size_t>(k) * bytes},
                   moved);
  }
}

Suite make_suite(Kind kind) {
  Suite s;
  s.name = kind_name(kind);
  const std::string k = s.name;
  const bool three = operands(kind) == 3;
  const std::string reads = three ? "3*N*elem" : "2*N*elem";
  s.notes = {
      k + ": forward = " + k + "_forward (reduction mean, 0-d float32 loss, default options); backward = " + k +
          "_backward (reduction mean, no upstream gradient, " + (kind == Kind::margin_ranking ? "input1" : "input") +
          " gradient only into a preallocated buffer)" +
          (kind == Kind::smooth_l1 || kind == Kind::huber ? "; beta/delta 1, no weight" : "; no weight"),
      "  inputs: N(0, 1) samples, contiguous, fixed seeds" +
          std::string(checked(kind) ? ""
                                    : ", mapped into the loss's domain (probabilities by a sigmoid, +-1 signs, "
                                      "var 0.5 + |v|, ...)") +
          "; GB/s counts " + reads + " read (" + (three ? "input, target, third operand" : "input, target") +
          ") forward, plus N*elem written backward",
      "  % is of a probe timed interleaved over the same total bytes: forward vs the read probe (" + reads +
          "); backward vs the copy probe (" + (three ? "2" : "1.5") +
          "*N*elem read + as many written: the "
          "closest to the kernel's " +
          (three ? "3:1" : "2:1") + " read:write mix)",
      checked(kind) ? "  no scalar baseline; check before timing: loss vs a float64 sum (rtol 1e-4 f32, 1e-3 bf16), "
                      "~4096 sampled gradient elements vs the formula"
                    : "  no scalar baseline; check before timing: the loss and ~4096 sampled gradient elements are "
                      "finite (values are checked by the tests, not here)",
  };
  s.shape_rank = 1;
  s.shape_help = "N";
  s.default_shapes = {{std::int64_t{1} << 24}};
  s.quick_shapes = {{std::int64_t{1} << 20}};
  s.dtypes = {DType::f32, DType::bf16};
  s.default_dtypes = {DType::f32, DType::bf16};
  s.plan = [kind](const Options&, const std::vector<std::vector<std::int64_t>>& shapes,
                  const std::vector<DType>& dtypes) {
    std::vector<Group> groups;
    for (const auto& shape : shapes) {
      for (DType t : dtypes) {
        const std::int64_t n = shape[0];
        groups.push_back({2, [kind, n, t](Run& run) { run_group(run, kind, n, t); }});
      }
    }
    return groups;
  };
  return s;
}

}  // namespace

LOSSFUSE_BENCH_SUITE(make_suite(Kind::mse));
LOSSFUSE_BENCH_SUITE(make_suite(Kind::l1));
LOSSFUSE_BENCH_SUITE(make_suite(Kind::smooth_l1));
LOSSFUSE_BENCH_SUITE(make_suite(Kind::huber));
LOSSFUSE_BENCH_SUITE(make_suite(Kind::bce));
LOSSFUSE_BENCH_SUITE(make_suite(Kind::bce_with_logits));
LOSSFUSE_BENCH_SUITE(make_suite(Kind::kl_div));
LOSSFUSE_BENCH_SUITE(make_suite(Kind::poisson_nll));
LOSSFUSE_BENCH_SUITE(make_suite(Kind::gaussian_nll));
LOSSFUSE_BENCH_SUITE(make_suite(Kind::hinge_embedding));
LOSSFUSE_BENCH_SUITE(make_suite(Kind::margin_ranking));

}  // namespace lossfuse::bench
