// lossfuse: the threading hook. Kernels split work with parallel_for; by default it runs on OpenMP, and a host
// framework (e.g. PyTorch's intra-op pool) can install its own so that only one thread pool is used.
#pragma once

#include <cstdint>
#include <type_traits>

namespace lossfuse {

// Runs body(ctx, b, e) over disjoint ranges covering [begin, end), each at least `grain` long where possible.
// body never throws. A hook may run the ranges on any threads in any order.
using ParallelBody = void (*)(void* ctx, std::int64_t begin, std::int64_t end);
using ParallelForHook = void (*)(std::int64_t begin, std::int64_t end, std::int64_t grain, ParallelBody body,
                                 void* ctx);

// nullptr restores the default (OpenMP when built with it, else serial).
void set_parallel_for_hook(ParallelForHook hook) noexcept;

// Threads the default hook uses; n <= 0 restores the OpenMP default.
void set_num_threads(int n) noexcept;
[[nodiscard]] int get_num_threads() noexcept;

void parallel_for_raw(std::int64_t begin, std::int64_t end, std::int64_t grain, ParallelBody body, void* ctx);

template <class F>
void parallel_for(std::int64_t begin, std::int64_t end, std::int64_t grain, F&& f) {
  using Fn = std::remove_reference_t<F>;
  parallel_for_raw(
      begin, end, grain, [](void* ctx, std::int64_t b, std::int64_t e) { (*static_cast<Fn*>(ctx))(b, e); },
      const_cast<void*>(static_cast<const void*>(&f)));
}

}  // namespace lossfuse
