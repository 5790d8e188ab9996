// The op catalog: what it lists, that it agrees with is_implemented, and that listed CPU ops actually run.
#include <gtest/gtest.h>

#include <set>
#include <tuple>

#include "test_util.hpp"

namespace lftest {
namespace {

using lossfuse::Device;
using lossfuse::Direction;
using lossfuse::LossKind;
using lossfuse::OpEntry;

constexpr DType kFloats[] = {DType::f32, DType::f64, DType::f16, DType::bf16};
constexpr Direction kDirs[] = {Direction::forward, Direction::backward, Direction::forward_backward};

auto key(const OpEntry& e) {
  return std::make_tuple(static_cast<int>(e.kind), static_cast<int>(e.dtype), static_cast<int>(e.device),
                         static_cast<int>(e.direction));
}

TEST(Catalog, ListsCrossEntropyAndNllOnCpu) {
  for (DType dt : kFloats) {
    SCOPED_TRACE(dname(dt));
    for (Direction d : kDirs)
      EXPECT_TRUE(lossfuse::is_implemented(LossKind::cross_entropy, dt, Device::cpu, d))
          << "cross_entropy " << lossfuse::direction_name(d);
    EXPECT_TRUE(lossfuse::is_implemented(LossKind::nll, dt, Device::cpu, Direction::forward));
    EXPECT_TRUE(lossfuse::is_implemented(LossKind::nll, dt, Device::cpu, Direction::backward));
  }
}

TEST(Catalog, EntriesAgreeWithIsImplemented) {
  const auto ops = lossfuse::implemented_ops();
  ASSERT_FALSE(ops.empty());
  std::set<decltype(key(ops[0]))> listed;
  for (const OpEntry& e : ops) {
    EXPECT_TRUE(listed.insert(key(e)).second)
        << "duplicate entry " << lossfuse::loss_kind_name(e.kind) << " " << dname(e.dtype);
    EXPECT_TRUE(lossfuse::is_floating(e.dtype)) << "an integer input dtype is listed";
    EXPECT_TRUE(lossfuse::is_implemented(e.kind, e.dtype, e.device, e.direction));
  }
  // and nothing else answers true
  for (int k = 0; k < lossfuse::kNumLossKinds; ++k)
    for (DType dt : lossfuse::kAllDTypes)
      for (Device dev : {Device::cpu, Device::cuda})
        for (Direction d : kDirs) {
          const OpEntry e{static_cast<LossKind>(k), dt, dev, d};
          EXPECT_EQ(lossfuse::is_implemented(e.kind, dt, dev, d), listed.count(key(e)) == 1)
              << lossfuse::loss_kind_name(e.kind) << " " << dname(dt) << " " << lossfuse::device_name(dev) << " "
              << lossfuse::direction_name(d);
        }
}

#ifndef LOSSFUSE_WITH_CUDA
TEST(Catalog, NoCudaEntriesWithoutCudaKernels) {
  for (const OpEntry& e : lossfuse::implemented_ops())
    EXPECT_NE(e.device, Device::cuda) << lossfuse::loss_kind_name(e.kind) << " " << dname(e.dtype)
                                      << " claims a CUDA kernel";
}
#else
// src/cuda/ has every family: cross-entropy, the fused linear loss and the eleven elementwise losses (forward,
// backward, fused), NLL, CTC and the five margin losses (forward, backward), in every float dtype (tests/cuda/ runs
// them).
bool is_margin_family(LossKind k) {
  return k == LossKind::triplet_margin || k == LossKind::cosine_embedding || k == LossKind::multi_margin ||
         k == LossKind::multilabel_margin || k == LossKind::multilabel_soft_margin;
}
TEST(Catalog, CudaEntriesAreEveryFamily) {
  int n = 0;
  for (const OpEntry& e : lossfuse::implemented_ops()) {
    if (e.device != Device::cuda) continue;
    ++n;
    const bool fused = e.kind != LossKind::nll && e.kind != LossKind::ctc && !is_margin_family(e.kind);
    EXPECT_TRUE(fused || e.direction != Direction::forward_backward) << lossfuse::loss_kind_name(e.kind);
  }
  EXPECT_EQ(n, 13 * 4 * 3 + 7 * 4 * 2);
}
#endif

TEST(Catalog, FixedOrder) {  // "every implemented entry, in a fixed order": two calls give the same list
  const auto a = lossfuse::implemented_ops();
  const auto b = lossfuse::implemented_ops();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(key(a[i]), key(b[i]));
}

// Every listed CPU cross_entropy / nll entry runs on a small problem (the catalog does not over-claim).
TEST(Catalog, ListedCpuEntriesRun) {
  int ran = 0;
  for (const OpEntry& e : lossfuse::implemented_ops()) {
    if (e.device != Device::cpu) continue;
    if (e.kind != LossKind::cross_entropy && e.kind != LossKind::nll) continue;
    SCOPED_TRACE(std::string(lossfuse::loss_kind_name(e.kind)) + " " + dname(e.dtype) + " " +
                 std::string(lossfuse::direction_name(e.direction)));
    Tensor x = Tensor::make(e.dtype, {3, 4});
    for (std::int64_t i = 0; i < 12; ++i) x.set(i, -0.25 * static_cast<double>(i % 5));
    Tensor t = Tensor::make(DType::i64, {3});
    for (std::int64_t i = 0; i < 3; ++i) t.set_int(i, i);
    const DType acc = acc_dtype(e.dtype);
    Tensor loss = Tensor::make(acc, {}), lse = Tensor::make(acc, {3}), grad = Tensor::make(e.dtype, {3, 4});
    if (e.kind == LossKind::cross_entropy) {
      lossfuse::CrossEntropyOptions o;
      lossfuse::CrossEntropyOutputs out;
      out.loss = loss.view;
      out.lse = lse.view;
      lossfuse::cross_entropy_forward(x.view, t.view, o, out);  // also fills lse for backward
      if (e.direction == Direction::backward)
        EXPECT_NO_THROW(lossfuse::cross_entropy_backward(x.view, t.view, lse.view, std::nullopt, o, grad.view));
      if (e.direction == Direction::forward_backward)
        EXPECT_NO_THROW(lossfuse::cross_entropy_forward_backward(x.view, t.view, o, out, std::nullopt, grad.view));
    } else {
      lossfuse::NllOptions o;
      if (e.direction == Direction::forward) EXPECT_NO_THROW(lossfuse::nll_forward(x.view, t.view, o, loss.view));
      if (e.direction == Direction::backward)
        EXPECT_NO_THROW(lossfuse::nll_backward(x.view, t.view, std::nullopt, o, grad.view));
    }
    ++ran;
  }
  EXPECT_GE(ran, 20);  // 4 dtypes x (3 cross_entropy + 2 nll)
}

TEST(Catalog, Names) {
  EXPECT_EQ(lossfuse::loss_kind_name(LossKind::cross_entropy), "cross_entropy");
  EXPECT_EQ(lossfuse::loss_kind_name(LossKind::nll), "nll");
  EXPECT_EQ(lossfuse::direction_name(Direction::forward_backward), "forward_backward");
  EXPECT_EQ(lossfuse::dtype_name(DType::bf16), "bfloat16");
  EXPECT_EQ(lossfuse::accumulate_dtype(DType::f16), DType::f32);
  EXPECT_EQ(lossfuse::accumulate_dtype(DType::f64), DType::f64);
}

}  // namespace
}  // namespace lftest
