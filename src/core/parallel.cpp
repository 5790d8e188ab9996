// The default parallel_for runs on OpenMP; a host framework may replace it (set_parallel_for_hook).
#include "lossfuse/parallel.hpp"

#include <algorithm>
#include <atomic>

#if defined(LOSSFUSE_WITH_OPENMP)
#include <omp.h>
#endif

namespace lossfuse {
namespace {

std::atomic<ParallelForHook> g_hook{nullptr};
std::atomic<int> g_threads{0};

#if defined(LOSSFUSE_WITH_OPENMP)
void default_parallel_for(std::int64_t begin, std::int64_t end, std::int64_t grain, ParallelBody body, void* ctx) {
  const std::int64_t n = end - begin;
  grain = std::max<std::int64_t>(grain, 1);
  const int max_threads = get_num_threads();
  const auto chunks = std::min<std::int64_t>(max_threads, (n + grain - 1) / grain);
  if (chunks <= 1 || omp_in_parallel()) {
    body(ctx, begin, end);
    return;
  }
  // Static, contiguous ranges: one per thread.
#pragma omp parallel num_threads(static_cast<int>(chunks))
  {
    const std::int64_t t = omp_get_thread_num();
    const std::int64_t nt = omp_get_num_threads();
    const std::int64_t b = begin + n * t / nt;
    const std::int64_t e = begin + n * (t + 1) / nt;
    if (b < e) body(ctx, b, e);
  }
}
#else
// Built without OpenMP (the PyTorch extension, which installs torch's pool as the hook): serial.
void default_parallel_for(std::int64_t begin, std::int64_t end, std::int64_t /*grain*/, ParallelBody body,
                          void* ctx) {
  body(ctx, begin, end);
}
#endif

}  // namespace

void set_parallel_for_hook(ParallelForHook hook) noexcept { g_hook.store(hook); }

void set_num_threads(int n) noexcept { g_threads.store(n > 0 ? n : 0); }

int get_num_threads() noexcept {
  const int n = g_threads.load();
#if defined(LOSSFUSE_WITH_OPENMP)
  return n > 0 ? n : omp_get_max_threads();
#else
  return n > 0 ? n : 1;
#endif
}

void parallel_for_raw(std::int64_t begin, std::int64_t end, std::int64_t grain, ParallelBody body, void* ctx) {
  if (end <= begin) return;
  ParallelForHook hook = g_hook.load();
  if (hook != nullptr) {
    hook(begin, end, grain, body, ctx);
  } else {
    default_parallel_for(begin, end, grain, body, ctx);
  }
}

}  // namespace lossfuse
