// The CUDA stream, check and allocator settings (include/lossfuse/device.hpp): per thread and scoped for the stream
// and the check, process-wide for the allocator; CPU calls always report a bad value. What the CUDA backend does with
// them runs only on a GPU (tests/cuda: RunAs::unchecked).
#include "lossfuse/device.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

#include "lossfuse/cross_entropy.hpp"
#include "lossfuse/error.hpp"

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

TEST(DeviceSettings, CheckIsPerThreadAndScoped) {
  using lossfuse::CudaCheck;
  EXPECT_EQ(lossfuse::cuda_check(), CudaCheck::report);
  {
    const lossfuse::CudaCheckScope outer(CudaCheck::nan);
    EXPECT_EQ(lossfuse::cuda_check(), CudaCheck::nan);
    CudaCheck seen = CudaCheck::nan;
    std::thread([&] { seen = lossfuse::cuda_check(); }).join();
    EXPECT_EQ(seen, CudaCheck::report) << "another thread sees its own (default) check";
    {
      const lossfuse::CudaCheckScope inner(CudaCheck::report);
      EXPECT_EQ(lossfuse::cuda_check(), CudaCheck::report);
    }
    EXPECT_EQ(lossfuse::cuda_check(), CudaCheck::nan);
  }
  EXPECT_EQ(lossfuse::cuda_check(), CudaCheck::report);
}

// CudaCheck::nan is the CUDA backend's: a CPU call still names a bad target (its check costs no synchronisation),
// writes nothing, and counts no host synchronisation.
TEST(DeviceSettings, CpuCallsReportUnderCheckNan) {
  std::vector<float> logits(3 * 4, 0.5F), loss(1, -7.0F);
  std::vector<std::int32_t> target = {1, 4, 2};
  using lossfuse::DType;
  using lossfuse::TensorView;
  const TensorView x = TensorView::contiguous(logits.data(), DType::f32, {3, 4});
  const TensorView t = TensorView::contiguous(target.data(), DType::i32, {3});
  const TensorView l = TensorView::contiguous(loss.data(), DType::f32, {});
  const std::uint64_t syncs = lossfuse::cuda_host_syncs();
  const lossfuse::CudaCheckScope scope(lossfuse::CudaCheck::nan);
  try {
    lossfuse::cross_entropy_forward(x, t, {}, {l, std::nullopt, std::nullopt});
    ADD_FAILURE() << "no error for target 4 of 4 classes";
  } catch (const lossfuse::Error& e) {
    EXPECT_EQ(e.code(), lossfuse::ErrorCode::index_error) << e.what();
  }
  EXPECT_EQ(loss[0], -7.0F) << "the loss was written";
  EXPECT_EQ(lossfuse::cuda_host_syncs(), syncs);
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
