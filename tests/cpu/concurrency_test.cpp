// Concurrent callers: several threads call every loss family at once, each with its own tensors, and every output
// byte must equal that of the same call made alone (the kernels share no mutable state between calls; their
// reductions run in a fixed order whatever the threads). Runs in every build of the suite; the sanitizer build runs
// it under AddressSanitizer and UndefinedBehaviorSanitizer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "lossfuse/lossfuse.hpp"

namespace {

using lossfuse::DType;
using lossfuse::Reduction;
using lossfuse::TensorView;

std::vector<float> values(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::vector<float> v(n);
  std::uint32_t s = seed * 2654435761u + 1;
  for (float& x : v) {
    s = s * 1664525u + 1013904223u;
    x = scale * (static_cast<float>(s >> 8) / 16777216.0f - 0.5f);
  }
  return v;
}

std::vector<std::int64_t> classes(std::size_t n, std::int64_t C, std::uint32_t seed) {
  std::vector<std::int64_t> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<std::int64_t>((i * 7919 + seed) % C);
  return t;
}

TensorView f32(std::vector<float>& v, std::initializer_list<std::int64_t> shape) {
  return TensorView::contiguous(v.data(), DType::f32, shape);
}
TensorView i64(std::vector<std::int64_t>& v, std::initializer_list<std::int64_t> shape) {
  return TensorView::contiguous(v.data(), DType::i64, shape);
}

// Appends the bytes of each buffer: one job's whole result.
template <class... Vs>
std::vector<std::uint8_t> bytes_of(const Vs&... vs) {
  // Sized first, then copied: GCC 12's -Wstringop-overflow misreads a vector insert of a byte range here.
  std::vector<std::uint8_t> out(((vs.size() * sizeof(vs[0])) + ... + std::size_t{0}));
  std::size_t at = 0;
  auto add = [&](const auto& v) {
    const std::size_t bytes = v.size() * sizeof(v[0]);
    if (bytes > 0) std::memcpy(out.data() + at, v.data(), bytes);
    at += bytes;
  };
  (add(vs), ...);
  return out;
}

struct Job {
  std::string name;
  std::function<std::vector<std::uint8_t>()> run;  // makes its own tensors, calls, returns every output byte
};

std::vector<Job> jobs() {
  return {
      {"cross_entropy fused", [] {
         constexpr std::int64_t N = 48, C = 5000;
         auto x = values(N * C, 1, 8.0f);
         auto t = classes(N, C, 1);
         std::vector<float> loss(1), grad(N * C);
         std::vector<double> lse(N);
         lossfuse::CrossEntropyOptions o;
         o.label_smoothing = 0.1;
         lossfuse::cross_entropy_forward_backward(
             f32(x, {N, C}), i64(t, {N}), o,
             {f32(loss, {}), TensorView::contiguous(lse.data(), DType::f64, {N}), std::nullopt}, std::nullopt,
             f32(grad, {N, C}));
         return bytes_of(loss, lse, grad);
       }},
      {"nll", [] {
         constexpr std::int64_t N = 512, C = 300;
         auto x = values(N * C, 2);
         auto t = classes(N, C, 2);
         std::vector<float> loss(1), grad(N * C);
         lossfuse::NllOptions o;
         lossfuse::nll_forward(f32(x, {N, C}), i64(t, {N}), o, f32(loss, {}));
         lossfuse::nll_backward(f32(x, {N, C}), i64(t, {N}), std::nullopt, o, f32(grad, {N, C}));
         return bytes_of(loss, grad);
       }},
      {"mse", [] {
         constexpr std::int64_t R = 64, D = 4096;
         auto x = values(R * D, 3), y = values(R * D, 4);
         std::vector<float> loss(1), gx(R * D);
         lossfuse::MseOptions o;
         lossfuse::mse_forward(f32(x, {R, D}), f32(y, {R, D}), o, f32(loss, {}));
         lossfuse::PointwiseGrads g;
         g.input = f32(gx, {R, D});
         lossfuse::mse_backward(f32(x, {R, D}), f32(y, {R, D}), std::nullopt, o, g);
         return bytes_of(loss, gx);
       }},
      {"smooth_l1", [] {
         constexpr std::int64_t R = 64, D = 4096;
         auto x = values(R * D, 5), y = values(R * D, 6);
         std::vector<float> loss(R * D);
         lossfuse::SmoothL1Options o;
         o.reduction = Reduction::none;
         o.beta = 0.25;
         lossfuse::smooth_l1_forward(f32(x, {R, D}), f32(y, {R, D}), o, f32(loss, {R, D}));
         return bytes_of(loss);
       }},
      {"triplet_margin", [] {
         constexpr std::int64_t N = 1024, D = 64;
         auto a = values(N * D, 7), p = values(N * D, 8), n = values(N * D, 9);
         std::vector<float> loss(1), ga(N * D), gp(N * D), gn(N * D);
         lossfuse::TripletMarginOptions o;
         lossfuse::triplet_margin_forward(f32(a, {N, D}), f32(p, {N, D}), f32(n, {N, D}), o, f32(loss, {}));
         lossfuse::triplet_margin_backward(f32(a, {N, D}), f32(p, {N, D}), f32(n, {N, D}), std::nullopt, o,
                                           f32(ga, {N, D}), f32(gp, {N, D}), f32(gn, {N, D}));
         return bytes_of(loss, ga, gp, gn);
       }},
      {"multi_margin", [] {
         constexpr std::int64_t N = 512, C = 200;
         auto x = values(N * C, 10);
         auto t = classes(N, C, 10);
         std::vector<float> loss(1), grad(N * C);
         lossfuse::MultiMarginOptions o;
         lossfuse::multi_margin_forward(f32(x, {N, C}), i64(t, {N}), o, f32(loss, {}));
         lossfuse::multi_margin_backward(f32(x, {N, C}), i64(t, {N}), std::nullopt, o, f32(grad, {N, C}));
         return bytes_of(loss, grad);
       }},
      {"ctc", [] {
         constexpr std::int64_t T = 60, N = 8, C = 20, S = 12;
         auto lp = values(T * N * C, 11, 4.0f);
         for (std::int64_t i = 0; i < T * N; ++i) {  // log-softmax rows
           float m = -1e30f, s = 0;
           for (std::int64_t c = 0; c < C; ++c) m = std::max(m, lp[i * C + c]);
           for (std::int64_t c = 0; c < C; ++c) s += std::exp(lp[i * C + c] - m);
           for (std::int64_t c = 0; c < C; ++c) lp[i * C + c] -= m + std::log(s);
         }
         std::vector<std::int64_t> targets(N * S), il(N, T), tl(N, S);
         for (std::int64_t i = 0; i < N * S; ++i) targets[i] = 1 + (i * 5) % (C - 1);
         std::vector<float> loss(1), grad(T * N * C);
         lossfuse::CtcOptions o;
         lossfuse::ctc_forward(f32(lp, {T, N, C}), i64(targets, {N, S}), i64(il, {N}), i64(tl, {N}), o,
                               {f32(loss, {}), std::nullopt, std::nullopt});
         lossfuse::ctc_backward(f32(lp, {T, N, C}), i64(targets, {N, S}), i64(il, {N}), i64(tl, {N}), std::nullopt,
                                o, f32(grad, {T, N, C}));
         return bytes_of(loss, grad);
       }},
      {"linear_cross_entropy", [] {
         constexpr std::int64_t N = 96, H = 32, V = 3000;
         auto x = values(N * H, 12), w = values(V * H, 13);
         auto t = classes(N, V, 12);
         std::vector<float> loss(1), dx(N * H), dw(V * H);
         lossfuse::LinearCrossEntropyOptions o;
         o.chunk_rows = 32;
         lossfuse::linear_cross_entropy_forward(f32(x, {N, H}), f32(w, {V, H}), std::nullopt, i64(t, {N}), o,
                                                {f32(loss, {}), std::nullopt, std::nullopt},
                                                {f32(dx, {N, H}), f32(dw, {V, H}), std::nullopt});
         return bytes_of(loss, dx, dw);
       }},
  };
}

// Each job once alone, then from kThreads threads at once, kRounds each (each thread in its own order); every
// result must equal the lone call's bytes.
void expect_concurrent_calls_as_alone() {
  const std::vector<Job> all = jobs();
  std::vector<std::vector<std::uint8_t>> alone;
  for (const Job& j : all) alone.push_back(j.run());
  constexpr int kThreads = 4, kRounds = 3;
  std::vector<std::vector<std::string>> mismatches(kThreads);
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      for (int round = 0; round < kRounds; ++round) {
        for (std::size_t k = 0; k < all.size(); ++k) {
          const std::size_t j = (k + th + round) % all.size();
          try {
            if (all[j].run() != alone[j]) mismatches[th].push_back(all[j].name + " differs");
          } catch (const std::exception& e) {
            mismatches[th].push_back(all[j].name + " threw: " + e.what());
          }
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int th = 0; th < kThreads; ++th) {
    for (const std::string& m : mismatches[th]) ADD_FAILURE() << "thread " << th << ": " << m;
  }
}

TEST(Concurrency, EveryFamilyFromSeveralThreadsGivesTheBytesOfACallAlone) { expect_concurrent_calls_as_alone(); }

// A parallel_for hook on std::threads (up to three ranges, the caller running the first), as a host framework's pool
// would be: the kernels' own splitting then runs on threads that ThreadSanitizer sees (scripts/tsan.sh builds
// without OpenMP), and each caller's work fans out while the other callers' does.
void thread_hook(std::int64_t begin, std::int64_t end, std::int64_t grain, lossfuse::ParallelBody body, void* ctx) {
  const std::int64_t n = end - begin;
  const std::int64_t parts = std::max<std::int64_t>(1, std::min<std::int64_t>(3, n / std::max<std::int64_t>(grain, 1)));
  std::vector<std::thread> helpers;
  for (std::int64_t k = 1; k < parts; ++k) {
    helpers.emplace_back(body, ctx, begin + n * k / parts, begin + n * (k + 1) / parts);
  }
  body(ctx, begin, begin + n / parts);
  for (std::thread& t : helpers) t.join();
}

TEST(Concurrency, TheSameOnAStdThreadParallelForHook) {
  struct Installed {  // the default hook again however the test ends
    Installed() { lossfuse::set_parallel_for_hook(thread_hook); }
    ~Installed() { lossfuse::set_parallel_for_hook(nullptr); }
  } installed;
  expect_concurrent_calls_as_alone();
}

}  // namespace
