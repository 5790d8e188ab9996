// The threading hook: parallel_for covers its range, set_num_threads round-trips, and a hook installed with
// set_parallel_for_hook is the one the kernels use, without changing any result bit.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <vector>

#include "cpu/ce_harness.hpp"
#include "test_util.hpp"

namespace lftest {
namespace {

std::atomic<int> g_calls{0};
std::atomic<std::int64_t> g_covered{0};

// Runs everything on the calling thread, in one range.
void serial_hook(std::int64_t begin, std::int64_t end, std::int64_t, lossfuse::ParallelBody body, void* ctx) {
  ++g_calls;
  if (begin < end) {
    body(ctx, begin, end);
    g_covered += end - begin;
  }
}
// Runs grain-sized pieces (at least 1) in reverse order, as a foreign pool might.
void reverse_chunks_hook(std::int64_t begin, std::int64_t end, std::int64_t grain, lossfuse::ParallelBody body,
                         void* ctx) {
  ++g_calls;
  const std::int64_t step = grain > 0 ? grain : 1;
  std::vector<std::pair<std::int64_t, std::int64_t>> pieces;
  for (std::int64_t b = begin; b < end; b += step) pieces.emplace_back(b, std::min(end, b + step));
  for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) {
    body(ctx, it->first, it->second);
    g_covered += it->second - it->first;
  }
}

struct HookGuard {
  explicit HookGuard(lossfuse::ParallelForHook h) { lossfuse::set_parallel_for_hook(h); }
  ~HookGuard() { lossfuse::set_parallel_for_hook(nullptr); }
  HookGuard(const HookGuard&) = delete;
  HookGuard& operator=(const HookGuard&) = delete;
};

TEST(Parallel, ParallelForCoversRangeOnce) {
  for (int threads : {1, 2, 3}) {
    ThreadsGuard tg(threads);
    for (std::int64_t n : {0, 1, 7, 1000, 100003}) {
      for (std::int64_t grain : {1, 64, 5000}) {
        std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
        lossfuse::parallel_for(0, n, grain, [&](std::int64_t b, std::int64_t e) {
          for (std::int64_t i = b; i < e; ++i) ++hits[static_cast<std::size_t>(i)];
        });
        for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n " << n << " grain " << grain << " i " << i;
      }
    }
    // a range that does not start at 0
    std::atomic<std::int64_t> sum{0};
    lossfuse::parallel_for(10, 20, 1, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) sum += i;
    });
    EXPECT_EQ(sum.load(), 145);
  }
}

TEST(Parallel, NumThreadsRoundTrip) {
  lossfuse::set_num_threads(3);
  EXPECT_EQ(lossfuse::get_num_threads(), 3);
  lossfuse::set_num_threads(1);
  EXPECT_EQ(lossfuse::get_num_threads(), 1);
  lossfuse::set_num_threads(0);
  EXPECT_GE(lossfuse::get_num_threads(), 1);
}

TEST(Parallel, HookSeesParallelFor) {
  g_calls = 0, g_covered = 0;
  {
    HookGuard h(serial_hook);
    std::int64_t total = 0;
    lossfuse::parallel_for(0, 100, 10, [&](std::int64_t b, std::int64_t e) { total += e - b; });
    EXPECT_EQ(total, 100);
    EXPECT_EQ(g_calls.load(), 1);
  }
  lossfuse::parallel_for(0, 100, 10, [](std::int64_t, std::int64_t) {});
  EXPECT_EQ(g_calls.load(), 1) << "the hook is still called after set_parallel_for_hook(nullptr)";
}

using ce::Fwd;
using ce::Problem;
using ce::Spec;

struct CeRun {
  Tensor loss, lse, z, grad, grad2;
};
CeRun run_ce(const Problem& p) {
  CeRun r;
  Fwd f = ce::make_outputs(p, true, true);
  lossfuse::cross_entropy_forward(p.logits.view, p.target.view, p.options(), f.out);
  r.loss = f.loss, r.lse = f.lse, r.z = f.z;
  r.grad = p.new_grad(Layout::contiguous);
  lossfuse::cross_entropy_backward(p.logits.view, p.target.view, f.lse.view, p.up(), p.options(), r.grad.view);
  Fwd g = ce::make_outputs(p, true, true);
  r.grad2 = p.new_grad(Layout::contiguous);
  lossfuse::cross_entropy_forward_backward(p.logits.view, p.target.view, p.options(), g.out, p.up(), r.grad2.view);
  return r;
}

class ParallelHook : public ::testing::TestWithParam<int> {};
TEST_P(ParallelHook, UsedByCrossEntropyWithIdenticalResults) {
  const lossfuse::ParallelForHook hook = GetParam() == 0 ? serial_hook : reverse_chunks_hook;
  for (const std::vector<std::int64_t>& shape : {std::vector<std::int64_t>{512, 2000}, {2, 128256}}) {
    Spec s;
    s.shape = shape, s.red = Reduction::mean, s.weight = true, s.eps = 0.1, s.zs = 1e-3, s.ignore_frac = 0.1;
    s.name = "hook";
    const Problem p = ce::build(s);
    CeRun base;
    {
      ThreadsGuard tg(2);
      base = run_ce(p);
    }
    ce::check_forward(p, base.loss, &base.lse, &base.z, "default hook");
    ce::check_grad(p, base.grad, "default hook");

    g_calls = 0, g_covered = 0;
    CeRun hooked;
    {
      HookGuard h(hook);
      Fwd f = ce::make_outputs(p, true, true);
      lossfuse::cross_entropy_forward(p.logits.view, p.target.view, p.options(), f.out);
      EXPECT_GT(g_calls.load(), 0) << "cross_entropy_forward did not use the installed hook";
      EXPECT_GT(g_covered.load(), 0);
      hooked = run_ce(p);
    }
    EXPECT_TRUE(same_bytes(hooked.loss, base.loss)) << "loss bits differ under the hook";
    EXPECT_TRUE(same_bytes(hooked.lse, base.lse)) << "lse bits differ under the hook";
    EXPECT_TRUE(same_bytes(hooked.z, base.z)) << "z_loss bits differ under the hook";
    EXPECT_TRUE(same_bytes(hooked.grad, base.grad)) << "backward grad bits differ under the hook";
    EXPECT_TRUE(same_bytes(hooked.grad2, base.grad2)) << "forward_backward grad bits differ under the hook";

    // restored: the hook is no longer called
    const int calls = g_calls.load();
    (void)run_ce(p);
    EXPECT_EQ(g_calls.load(), calls) << "the hook is still used after set_parallel_for_hook(nullptr)";
  }
}
INSTANTIATE_TEST_SUITE_P(Hooks, ParallelHook, ::testing::Values(0, 1),
                         [](const auto& i) { return i.param == 0 ? std::string("serial") : std::string("reverse_chunks"); });

}  // namespace
}  // namespace lftest
