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
//   fwd+bwd   <loss>_forward_backward: the forward's loss and the backward's gradient in one pass; bytes moved as
//             backward's; its baseline is the forward then the backward (speedup = their time over its).
// Each is timed interleaved with a probe over the same total bytes: forward with the read probe over the k
// operands; backward and fwd+bwd with the copy probe over (k+1)/2*N*elem (as much read as written: (k+1)*N*elem
// in all; no probe has the kernel's k:1 read:write mix, the copy is the closest).
// Before timing, for mse/l1/smooth_l1/huber the forward loss must agree with a float64 scalar sum to a
// relative 1e-4 (f32) / 1e-3 (bf16) and sampled gradient elements with the formula; for the others the loss
// and sampled gradients must be finite. A failed check is reported as a FAIL row (timed anyway).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "lossfuse/loss_kind.hpp"
#include "lossfuse/parallel.hpp"
#include "lossfuse/pointwise.hpp"
#include "lossfuse/tensor.hpp"
#include "pointwise_rows.hpp"

namespace lossfuse::bench {
namespace {

constexpr std::uint64_t kInputSeed = 0x9017e5eedULL;
constexpr std::uint64_t kTargetSeed = 0x7a26e7ULL;
constexpr std::uint64_t kThirdSeed = 0x3e1dULL;

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

void fill_nan(DType t, void* p, std::int64_t n) {
  parallel_for(0, n, 1 << 16, [&](std::int64_t i0, std::int64_t i1) {
    for (std::int64_t i = i0; i < i1; ++i) store(t, p, i, std::numeric_limits<double>::quiet_NaN());
  });
}

void run_group(Run& run, const PwBench& b, std::int64_t n, DType dtype) {
  const std::vector<std::int64_t> shape = {n};
  const std::string name(loss_kind_name(b.kind));
  const std::string tag = name + " " + std::string(short_dtype_name(dtype)) + " " + shape_string(shape);
  const std::size_t elem = dtype_size(dtype), bytes = static_cast<std::size_t>(n) * elem;
  const int k = b.operands;

  // The operands back to back, so that one read probe covers exactly the bytes the forward reads; the gradient
  // buffer is also the copy probe's destination ((k + 1) / 2 operands' worth).
  Buffer ops_buf(static_cast<std::size_t>(k) * bytes), grad((static_cast<std::size_t>(k) + 1) * bytes / 2);
  std::vector<TensorView> ops;
  const std::uint64_t seeds[3] = {kInputSeed, kTargetSeed, kThirdSeed};
  for (int j = 0; j < k; ++j) {
    void* p = static_cast<std::uint8_t*>(ops_buf.data()) + static_cast<std::size_t>(j) * bytes;
    fill_normal(p, dtype, n, 1.0, seeds[j]);
    if (b.domain != nullptr) {
      parallel_for(0, n, 1 << 16, [&](std::int64_t i0, std::int64_t i1) {
        for (std::int64_t i = i0; i < i1; ++i) store(dtype, p, i, b.domain(j, load(dtype, p, i)));
      });
    }
    ops.push_back(TensorView::contiguous(p, dtype, {n}));
  }
  const void* xp = ops[0].data;
  const void* yp = ops[1].data;
  const TensorView g = TensorView::contiguous(grad.data(), dtype, {n});
  float loss = 0.0f;
  const TensorView l = TensorView::contiguous(&loss, DType::f32, nullptr, 0);

  enum class Dir { forward, backward, fused };
  for (const Dir dir : {Dir::forward, Dir::backward, Dir::fused}) {
    const bool bwd = dir != Dir::forward, fwd = dir != Dir::backward;  // writes the gradient / the loss
    const std::string direction = dir == Dir::forward ? "forward" : dir == Dir::backward ? "backward" : "fwd+bwd";
    run.step(direction + " " + tag);
    Row row;
    row.loss = name;
    row.shape = shape;
    row.dtype = std::string(short_dtype_name(dtype));
    row.direction = direction;
    const double moved = static_cast<double>(bytes) * (bwd ? k + 1 : k);
    // every row's outputs start as NaN, so that a check cannot pass on an earlier row's values
    fill_nan(dtype, grad.data(), n);
    loss = std::numeric_limits<float>::quiet_NaN();
    auto kernel = [&] {
      if (dir == Dir::fused) {
        b.fused(ops, l, g);
      } else if (bwd) {
        b.backward(ops, g);
      } else {
        b.forward(ops, l);
      }
    };
    const std::function<void()> separate = [&] {
      b.forward(ops, l);
      b.backward(ops, g);
    };
    auto check = [&]() -> std::string {
      std::string problem;
      if (b.value == nullptr) {
        if (fwd && !std::isfinite(loss)) problem = "loss " + std::to_string(loss) + " is not finite";
        for (std::int64_t i = 0; bwd && i < n && problem.empty(); i += std::max<std::int64_t>(1, n / 4099)) {
          if (!std::isfinite(load(dtype, grad.data(), i))) {
            problem =
                "grad[" + std::to_string(i) + "] " + std::to_string(load(dtype, grad.data(), i)) + " is not finite";
          }
        }
        return problem;
      }
      if (fwd) {
        double sum = 0;
        for (std::int64_t i = 0; i < n; ++i) sum += b.value(load(dtype, xp, i) - load(dtype, yp, i));
        const double want = sum / static_cast<double>(n), rtol = dtype == DType::bf16 ? 1e-3 : 1e-4;
        if (!(std::fabs(loss - want) <= rtol * std::fabs(want))) {
          problem = "loss " + fixed(loss, 7) + " vs float64 " + fixed(want, 7);
        }
      }
      if (bwd) {
        const double rtol = dtype == DType::bf16 ? 1e-2 : 1e-5;
        for (std::int64_t i = 0; i < n && problem.empty(); i += std::max<std::int64_t>(1, n / 4099)) {
          const double want = b.derivative(load(dtype, xp, i) - load(dtype, yp, i)) / static_cast<double>(n);
          const double got = load(dtype, grad.data(), i);
          if (!(std::fabs(got - want) <= rtol * std::fabs(want) + 1e-30)) {
            problem = "grad[" + std::to_string(i) + "] " + std::to_string(got) + " vs " + std::to_string(want);
          }
        }
      }
      return problem;
    };
    check_and_time(run, std::move(row), kernel, check,
                   {bwd, xp, grad.data(),
                    bwd ? (static_cast<std::size_t>(k) + 1) * bytes / 2 : static_cast<std::size_t>(k) * bytes},
                   moved, dir == Dir::fused ? &separate : nullptr);
  }
}

Suite make_suite(const PwBench& b) {
  Suite s;
  s.name = std::string(loss_kind_name(b.kind));
  const std::string k = s.name;
  const bool three = b.operands == 3;
  const Kind kind = b.kind;
  const std::string reads = three ? "3*N*elem" : "2*N*elem";
  s.notes = {
      k + ": forward = " + k + "_forward (reduction mean, 0-d float32 loss, default options); backward = " + k +
          "_backward (reduction mean, no upstream gradient, " + (kind == Kind::margin_ranking ? "input1" : "input") +
          " gradient only into a preallocated buffer); fwd+bwd = " + k +
          "_forward_backward (both in one pass; baseline: forward then backward)" +
          (kind == Kind::smooth_l1 || kind == Kind::huber ? "; beta/delta 1, no weight" : "; no weight"),
      "  inputs: N(0, 1) samples, contiguous, fixed seeds" +
          std::string(b.domain == nullptr ? ""
                                          : ", mapped into the loss's domain (probabilities by a sigmoid, +-1 signs, "
                                            "var 0.5 + |v|, ...)") +
          "; GB/s counts " + reads + " read (" + (three ? "input, target, third operand" : "input, target") +
          ") forward, plus N*elem written backward and fwd+bwd",
      "  % is of a probe timed interleaved over the same total bytes: forward vs the read probe (" + reads +
          "); backward and fwd+bwd vs the copy probe (" + (three ? "2" : "1.5") +
          "*N*elem read + as many written: the "
          "closest to the kernel's " +
          (three ? "3:1" : "2:1") + " read:write mix)",
      b.value != nullptr
          ? "  no scalar baseline; check before timing: loss vs a float64 sum (rtol 1e-4 f32, 1e-3 bf16), "
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
  s.plan = [&b](const Options&, const std::vector<std::vector<std::int64_t>>& shapes,
                const std::vector<DType>& dtypes) {
    std::vector<Group> groups;
    for (const auto& shape : shapes) {
      for (DType t : dtypes) {
        const std::int64_t n = shape[0];
        groups.push_back({3, [&b, n, t](Run& run) { run_group(run, b, n, t); }});
      }
    }
    return groups;
  };
  return s;
}

// One suite per row (so that `--loss mse` works).
bool register_rows() {
  for (const PwBench& b : kRows) register_suite(make_suite(b));
  return true;
}
[[maybe_unused]] const bool kRegistered = register_rows();

}  // namespace

}  // namespace lossfuse::bench
