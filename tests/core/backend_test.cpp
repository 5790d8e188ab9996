// The backend boundary (src/core/backend.hpp): the CPU table fills every family's entry, the CUDA slot of a build
// without CUDA kernels is empty, and a call on a device with no table is refused with not_implemented naming its
// first operand, before anything is read or written.
#include "core/backend.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "test_util.hpp"

namespace lftest {
namespace {

using lossfuse::Device;
using lossfuse::Error;
using lossfuse::ErrorCode;
using lossfuse::TensorView;

TEST(Backend, CpuTableFillsEveryFamily) {
  const lossfuse::core::Backend* cpu = lossfuse::core::cpu_backend();
  ASSERT_NE(cpu, nullptr);
  EXPECT_EQ(cpu->device, Device::cpu);
  EXPECT_NE(cpu->cross_entropy, nullptr);
  EXPECT_NE(cpu->nll, nullptr);
  EXPECT_NE(cpu->pointwise, nullptr);
  EXPECT_NE(cpu->value_scan, nullptr);
  ASSERT_NE(cpu->capturing, nullptr);
  EXPECT_FALSE(cpu->capturing());
  EXPECT_NE(cpu->ctc, nullptr);
  EXPECT_NE(cpu->triplet_margin, nullptr);
  EXPECT_NE(cpu->cosine_embedding, nullptr);
  EXPECT_NE(cpu->multi_margin, nullptr);
  EXPECT_NE(cpu->multilabel_margin, nullptr);
  EXPECT_NE(cpu->multilabel_soft_margin, nullptr);
  EXPECT_NE(cpu->linear_cross_entropy, nullptr);
  TensorView v = TensorView::contiguous(nullptr, DType::f32, {0});
  EXPECT_EQ(&lossfuse::core::backend_for(v, "x"), cpu);
}

#if !defined(LOSSFUSE_WITH_CUDA)
// Calls fn(view on cuda) and expects not_implemented naming `argument`, with the output left as it was.
template <class F>
void expect_refused(const char* argument, F fn) {
  try {
    fn();
    ADD_FAILURE() << "no error for a cuda " << argument;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::not_implemented) << e.what();
    EXPECT_EQ(e.argument(), argument) << e.what();
    EXPECT_NE(std::string(e.what()).find("cuda"), std::string::npos) << e.what();
  }
}

TEST(Backend, CudaSlotIsEmptyAndRefusesEveryFamily) {
  EXPECT_EQ(lossfuse::core::cuda_backend(), nullptr);
  std::vector<float> x(6, 0.5f), y(6, 0.25f), grad(6, -7.0f), w(12, 0.1f);
  std::vector<std::int64_t> t = {1, 0};
  float loss = -7.0f;
  const TensorView loss_v = TensorView::contiguous(&loss, DType::f32, {});
  TensorView xc = TensorView::contiguous(x.data(), DType::f32, {2, 3}, Device::cuda);
  const TensorView tv = TensorView::contiguous(t.data(), DType::i64, {2});
  const TensorView yv = TensorView::contiguous(y.data(), DType::f32, {2, 3});

  expect_refused("logits", [&] {
    lossfuse::cross_entropy_forward(xc, tv, {}, lossfuse::CrossEntropyOutputs{loss_v, std::nullopt, std::nullopt});
  });
  expect_refused("input", [&] { lossfuse::nll_forward(xc, tv, {}, loss_v); });
  expect_refused("input", [&] { lossfuse::mse_forward(xc, yv, {}, loss_v); });
  expect_refused("input", [&] { lossfuse::multi_margin_forward(xc, tv, {}, loss_v); });
  expect_refused("anchor", [&] { lossfuse::triplet_margin_forward(xc, yv, yv, {}, loss_v); });
  expect_refused("x", [&] {
    const TensorView wv = TensorView::contiguous(w.data(), DType::f32, {4, 3});
    lossfuse::linear_cross_entropy_forward(xc, wv, std::nullopt, tv, {},
                                           lossfuse::CrossEntropyOutputs{loss_v, std::nullopt, std::nullopt});
  });
  expect_refused("logits", [&] {
    lossfuse::cross_entropy_forward_backward(xc, tv, {},
                                             lossfuse::CrossEntropyOutputs{loss_v, std::nullopt, std::nullopt},
                                             std::nullopt, TensorView::contiguous(grad.data(), DType::f32, {2, 3}));
  });
  EXPECT_EQ(loss, -7.0f);
  for (float g : grad) EXPECT_EQ(g, -7.0f);
}
#endif

}  // namespace
}  // namespace lftest
