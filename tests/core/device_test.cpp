// The CUDA stream and allocator settings (include/lossfuse/device.hpp): per thread and scoped for the stream,
// process-wide for the allocator. What the CUDA backend does with them runs only on a GPU (tests/cuda).
#include "lossfuse/device.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <thread>

namespace {

using lossfuse::CudaAllocator;
using lossfuse::CudaStream;

CudaStream fake_stream(std::size_t k) { return reinterpret_cast<CudaStream>(0x1000 * k); }

TEST(DeviceSettings, StreamIsPerThreadAndScoped) {
  EXPECT_EQ(lossfuse::cuda_stream(), nullptr);  // the legacy default stream
  lossfuse::set_cuda_stream(fake_stream(1));
  CudaStream seen = fake_stream(9);
  std::thread([&] { seen = lossfuse::cuda_stream(); }).join();
  EXPECT_EQ(seen, nullptr) << "another thread sees its own (default) stream";
  {
    const lossfuse::CudaStreamScope outer(fake_stream(2));
    EXPECT_EQ(lossfuse::cuda_stream(), fake_stream(2));
    {
      const lossfuse::CudaStreamScope inner(nullptr);
      EXPECT_EQ(lossfuse::cuda_stream(), nullptr);
    }
    EXPECT_EQ(lossfuse::cuda_stream(), fake_stream(2));
  }
  EXPECT_EQ(lossfuse::cuda_stream(), fake_stream(1));
  lossfuse::set_cuda_stream(nullptr);
}

void* no_alloc(std::size_t, CudaStream, void*) { return nullptr; }
void no_release(void*, CudaStream, void*) {}

TEST(DeviceSettings, AllocatorIsProcessWideAndResettable) {
  EXPECT_EQ(lossfuse::cuda_allocator().allocate, nullptr);  // lossfuse's own pool
  int ctx = 0;
  lossfuse::set_cuda_allocator({no_alloc, no_release, &ctx});
  CudaAllocator seen;
  std::thread([&] { seen = lossfuse::cuda_allocator(); }).join();
  EXPECT_EQ(seen.allocate, &no_alloc);
  EXPECT_EQ(seen.release, &no_release);
  EXPECT_EQ(seen.ctx, &ctx);
  lossfuse::set_cuda_allocator({no_alloc, nullptr, &ctx});  // half an allocator: the pool again
  EXPECT_EQ(lossfuse::cuda_allocator().allocate, nullptr);
  lossfuse::set_cuda_allocator({no_alloc, no_release, nullptr});
  lossfuse::set_cuda_allocator({});
  EXPECT_EQ(lossfuse::cuda_allocator().allocate, nullptr);
  EXPECT_EQ(lossfuse::cuda_allocator().ctx, nullptr);
}

}  // namespace
