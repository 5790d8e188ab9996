// lossfuse bench: the margin and embedding losses (include/lossfuse/margin.hpp).
//
// What it measures, per (N, D) shape (default 4096 x 1024, D the feature or class dim) and dtype (f32 by default;
// bf16 on request), for each of triplet_margin, cosine_embedding, multi_margin, multilabel_margin and
// multilabel_soft_margin, on inputs ~ N(0, 1) from a fixed seed (triplet: positive/negative = anchor + noise;
// int64 targets: a class per row, or 8 labels then -1 per row; soft targets in {0, 1}), reduction mean:
//   forward  <loss>_forward;
//   fwd+bwd  <loss>_forward then <loss>_backward into preallocated gradients of every floating input
//            (multilabel_soft_margin: grad_input only).
// GB/s counts the bytes a fused single pass must move: every input (and per-element target) read, plus for
// fwd+bwd every gradient written; it is compared, in the same run, with the read probe (forward) or the copy
// probe (fwd+bwd) over the same byte count, interleaved with the kernel. No scalar baseline is timed; before
// timing, the mean loss must agree to a relative 1e-3 with the plain double loop below (a FAIL row otherwise).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "lossfuse/margin.hpp"
#include "lossfuse/tensor.hpp"

namespace lossfuse::bench {
namespace {

constexpr std::uint64_t kSeed = 0x3a7915eedULL;
constexpr std::int64_t kLabels = 8;  // multilabel_margin labels per row

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

double value(const Buffer& b, DType t, std::int64_t i) {
  return t == DType::bf16 ? bf16_to_float(b.as<std::uint16_t>()[i]) : b.as<float>()[i];
}

// The mean loss in plain double loops, straight from the definitions (the check before timing).
double check_mean(LossKind kind, const std::vector<Buffer>& x, const Buffer& target, DType t, std::int64_t n,
                  std::int64_t d) {
  double total = 0;
  for (std::int64_t r = 0; r < n; ++r) {
    auto X = [&](int k, std::int64_t c) { return value(x[k], t, r * d + c); };
    double l = 0;
    switch (kind) {
      case LossKind::triplet_margin: {
        double sp = 0, sn = 0;
        for (std::int64_t c = 0; c < d; ++c) {
          const double vp = X(0, c) - X(1, c) + 1e-6, vn = X(0, c) - X(2, c) + 1e-6;
          sp += vp * vp, sn += vn * vn;
        }
        l = std::max(0.0, 1.0 + std::sqrt(sp) - std::sqrt(sn));
        break;
      }
      case LossKind::cosine_embedding: {
        double s12 = 0, s11 = 0, s22 = 0;
        for (std::int64_t c = 0; c < d; ++c)
          s12 += X(0, c) * X(1, c), s11 += X(0, c) * X(0, c), s22 += X(1, c) * X(1, c);
        const double cos = s12 / std::sqrt((s11 + 1e-12) * (s22 + 1e-12));
        l = target.as<std::int64_t>()[r] == 1 ? 1 - cos : std::max(0.0, cos);
        break;
      }
      case LossKind::multi_margin: {
        const std::int64_t y = target.as<std::int64_t>()[r];
        for (std::int64_t c = 0; c < d; ++c)
          if (c != y) l += std::max(0.0, 1.0 - X(0, y) + X(0, c));
        l /= static_cast<double>(d);
        break;
      }
      case LossKind::multilabel_margin: {
        const std::int64_t* y = target.as<std::int64_t>() + r * d;
        std::vector<char> is(static_cast<std::size_t>(d), 0);
        std::int64_t L = 0;
        while (L < d && y[L] >= 0) is[y[L++]] = 1;
        for (std::int64_t j = 0; j < L; ++j)
          for (std::int64_t c = 0; c < d; ++c)
            if (!is[c]) l += std::max(0.0, 1.0 - X(0, y[j]) + X(0, c));
        l /= static_cast<double>(d);
        break;
      }
      case LossKind::multilabel_soft_margin: {
        for (std::int64_t c = 0; c < d; ++c) {
          const double v = X(0, c), y = value(target, t, r * d + c);
          const double ls = std::min(v, 0.0) - std::log1p(std::exp(-std::fabs(v)));
          const double lm = std::min(-v, 0.0) - std::log1p(std::exp(-std::fabs(v)));
          l -= y * ls + (1 - y) * lm;
        }
        l /= static_cast<double>(d);
        break;
      }
      default: break;
    }
    total += l;
  }
  return total / static_cast<double>(n);
}

void run_group(Run& run, LossKind kind, std::int64_t n, std::int64_t d, DType dtype) {
  const std::vector<std::int64_t> shape = {n, d};
  const std::string name(loss_kind_name(kind));
  const std::string tag = name + " " + std::string(short_dtype_name(dtype)) + " " + shape_string(shape);
  const std::size_t elem = dtype_size(dtype), plane = static_cast<std::size_t>(n * d) * elem;
  const int inputs = kind == LossKind::triplet_margin ? 3 : kind == LossKind::cosine_embedding ? 2 : 1;
  const int grads = inputs;

  std::vector<Buffer> x, g;
  for (int k = 0; k < inputs; ++k) {
    x.emplace_back(plane);
    g.emplace_back(plane);
    fill_normal(x[k].data(), dtype, n * d, 1.0, kSeed + static_cast<std::uint64_t>(k));
  }
  if (kind == LossKind::triplet_margin) {  // positive and negative near the anchor: both sides of the hinge
    Buffer noise(plane);
    for (int k = 1; k < 3; ++k) {
      fill_normal(noise.data(), dtype, n * d, 0.6 + 0.2 * k, kSeed + 10 + static_cast<std::uint64_t>(k));
      for (std::int64_t i = 0; i < n * d; ++i) {
        if (dtype == DType::bf16) {
          x[k].as<std::uint16_t>()[i] =
              float_to_bf16(bf16_to_float(x[0].as<std::uint16_t>()[i]) + bf16_to_float(noise.as<std::uint16_t>()[i]));
        } else {
          x[k].as<float>()[i] = x[0].as<float>()[i] + noise.as<float>()[i];
        }
      }
    }
  }
  std::size_t target_bytes = 0;  // per-element targets count as traffic
  Buffer target;
  TensorView tv;
  switch (kind) {
    case LossKind::cosine_embedding:
    case LossKind::multi_margin: {
      target = Buffer(static_cast<std::size_t>(n) * sizeof(std::int64_t));
      auto* y = target.as<std::int64_t>();
      fill_uniform_index(y, n, kind == LossKind::multi_margin ? d : 2, kSeed + 20);
      if (kind == LossKind::cosine_embedding)
        for (std::int64_t r = 0; r < n; ++r) y[r] = y[r] ? 1 : -1;
      tv = TensorView::contiguous(target.data(), DType::i64, {n});
      break;
    }
    case LossKind::multilabel_margin: {
      target_bytes = static_cast<std::size_t>(n * d) * sizeof(std::int64_t);
      target = Buffer(target_bytes);
      auto* y = target.as<std::int64_t>();
      fill_uniform_index(y, n * d, d, kSeed + 21);
      for (std::int64_t r = 0; r < n; ++r)
        if (kLabels < d) y[r * d + kLabels] = -1;
      tv = TensorView::contiguous(target.data(), DType::i64, {n, d});
      break;
    }
    case LossKind::multilabel_soft_margin: {
      target_bytes = plane;
      target = Buffer(plane);
      std::vector<std::int64_t> bits(static_cast<std::size_t>(n * d));
      fill_uniform_index(bits.data(), n * d, 2, kSeed + 22);
      for (std::int64_t i = 0; i < n * d; ++i) {
        if (dtype == DType::bf16)
          target.as<std::uint16_t>()[i] = float_to_bf16(static_cast<float>(bits[i]));
        else
          target.as<float>()[i] = static_cast<float>(bits[i]);
      }
      tv = TensorView::contiguous(target.data(), dtype, {n, d});
      break;
    }
    default: break;
  }

  std::vector<TensorView> X, G;
  for (int k = 0; k < inputs; ++k) {
    X.push_back(TensorView::contiguous(x[k].data(), dtype, {n, d}));
    G.push_back(TensorView::contiguous(g[k].data(), dtype, {n, d}));
  }
  float loss = 0.0f;
  const TensorView L = TensorView::contiguous(&loss, DType::f32, nullptr, 0);
  auto forward = [&] {
    switch (kind) {
      case LossKind::triplet_margin: return triplet_margin_forward(X[0], X[1], X[2], {}, L);
      case LossKind::cosine_embedding: return cosine_embedding_forward(X[0], X[1], tv, {}, L);
      case LossKind::multi_margin: return multi_margin_forward(X[0], tv, {}, L);
      case LossKind::multilabel_margin: return multilabel_margin_forward(X[0], tv, {}, L);
      case LossKind::multilabel_soft_margin: return multilabel_soft_margin_forward(X[0], tv, {}, L);
      default: return;
    }
  };
  auto backward = [&] {
    switch (kind) {
      case LossKind::triplet_margin:
        return triplet_margin_backward(X[0], X[1], X[2], std::nullopt, {}, G[0], G[1], G[2]);
      case LossKind::cosine_embedding: return cosine_embedding_backward(X[0], X[1], tv, std::nullopt, {}, G[0], G[1]);
      case LossKind::multi_margin: return multi_margin_backward(X[0], tv, std::nullopt, {}, G[0]);
      case LossKind::multilabel_margin: return multilabel_margin_backward(X[0], tv, std::nullopt, {}, G[0]);
      case LossKind::multilabel_soft_margin:
        return multilabel_soft_margin_backward(X[0], tv, std::nullopt, {}, G[0], std::nullopt);
      default: return;
    }
  };

  const std::size_t read_bytes = plane * static_cast<std::size_t>(inputs) + target_bytes;
  const std::size_t written_bytes = plane * static_cast<std::size_t>(grads);
  Buffer probe_src(read_bytes), probe_dst(read_bytes);
  std::fill_n(probe_src.as<unsigned char>(), read_bytes, static_cast<unsigned char>(1));
  for (const bool with_backward : {false, true}) {
    const std::string direction = with_backward ? "fwd+bwd" : "forward";
    run.step(std::string(direction).append(" ").append(tag));
    Row row;
    row.loss = name;
    row.shape = shape;
    row.dtype = std::string(short_dtype_name(dtype));
    row.direction = direction;
    const std::size_t moved = read_bytes + (with_backward ? written_bytes : 0);
    auto kernel = [&] {
      forward();
      if (with_backward) backward();
    };
    auto check = [&]() -> std::string {
      const double want = check_mean(kind, x, target, dtype, n, d);
      if (std::abs(loss - want) <= 1e-3 * std::max(std::abs(want), 1e-6)) return "";
      return "loss " + fixed(loss, 7) + " vs double loop " + fixed(want, 7);
    };
    // fwd+bwd is compared with a copy of half the bytes each way (read + written = moved)
    check_and_time(run, std::move(row), kernel, check,
                   {with_backward, probe_src.data(), probe_dst.data(), with_backward ? moved / 2 : moved},
                   static_cast<double>(moved));
  }
}

Suite make_suite() {
  Suite s;
  s.name = "margin";
  // NOLINTBEGIN(bugprone-suspicious-missing-comma)
  s.notes = {
      "margin: triplet_margin, cosine_embedding, multi_margin, multilabel_margin (8 labels/row), "
      "multilabel_soft_margin; forward = <loss>_forward (mean), fwd+bwd = forward then <loss>_backward",
      "  GB/s counts every input and per-element target read (+ every gradient written for fwd+bwd); "
      "compared with the read / copy probe of the same bytes, interleaved",
      "  check before timing: mean loss within a relative 1e-3 of a plain double loop; no baseline timed",
  };
  // NOLINTEND(bugprone-suspicious-missing-comma)
  s.shape_rank = 2;
  s.shape_help = "NxD";
  s.default_shapes = {{4096, 1024}};
  s.quick_shapes = {{512, 1024}};
  s.dtypes = {DType::f32, DType::bf16};
  s.default_dtypes = {DType::f32};
  s.plan = [](const Options&, const std::vector<std::vector<std::int64_t>>& shapes, const std::vector<DType>& dtypes) {
    std::vector<Group> groups;
    for (const auto& shape : shapes)
      for (DType t : dtypes)
        for (LossKind kind : {LossKind::triplet_margin, LossKind::cosine_embedding, LossKind::multi_margin,
                              LossKind::multilabel_margin, LossKind::multilabel_soft_margin}) {
          const std::int64_t n = shape[0], d = shape[1];
          groups.push_back({2, [kind, n, d, t](Run& run) { run_group(run, kind, n, d, t); }});
        }
    return groups;
  };
  return s;
}

}  // namespace

LOSSFUSE_BENCH_SUITE(make_suite());

}  // namespace lossfuse::bench
