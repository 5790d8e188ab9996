// The five margin and embedding losses on CUDA tensors against the float64 reference: the CPU suite's spec tables
// (tests/cpu/margin_harness.hpp) run through device copies of every operand (tests/device_mirror.hpp), plus what only
// a device shows: a bad class target in device memory named with nothing written, rows long enough for the block
// kernels (over 1024 elements) and label masks in device scratch, and bitwise-repeatable reductions. Without a CUDA
// device every test is skipped (main exits 77).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cpu/margin_harness.hpp"
#include "cuda/cuda_memory.hpp"

namespace lftest::margin {
namespace {

constexpr LossKind kKinds[] = {LossKind::triplet_margin, LossKind::cosine_embedding, LossKind::multi_margin,
                               LossKind::multilabel_margin, LossKind::multilabel_soft_margin};

class MarginCuda : public ::testing::TestWithParam<Spec> {};
TEST_P(MarginCuda, MatchesReference) { check_case(GetParam(), &kCuda); }

// Rows past the warp kernels' 1024 elements (the block kernels), every loss, dtype and reduction; multilabel_margin
// also with 400000 classes, whose label mask (50 KB) no longer fits shared memory.
std::vector<Spec> long_row_specs() {
  std::vector<Spec> v;
  std::uint64_t k = 900;
  for (LossKind kind : kKinds)
    for (DType dt : kFloats)
      for (Reduction red : kReds) {
        Spec s;
        s.kind = kind, s.dt = dt, s.red = red, s.shape = {3, 5003}, s.seed = ++k, s.weight = true;
        s.swap = (k % 2) == 0, s.mp = 1 + static_cast<int>(k % 2), s.p = (k % 3 == 0) ? kInf : 2.0;
        s.name = "long_" + case_name(s);
        v.push_back(s);
      }
  Spec s;
  s.kind = LossKind::multilabel_margin, s.dt = DType::f32, s.red = Reduction::sum, s.shape = {2, 400000};
  s.seed = ++k, s.name = "multilabel_margin_global_mask";
  v.push_back(s);
  return v;
}

auto spec_name = [](const auto& i) { return i.param.name; };
INSTANTIATE_TEST_SUITE_P(Options, MarginCuda, ::testing::ValuesIn(option_specs()), spec_name);
INSTANTIATE_TEST_SUITE_P(Layouts, MarginCuda, ::testing::ValuesIn(layout_specs()), spec_name);
INSTANTIATE_TEST_SUITE_P(TargetDtypes, MarginCuda, ::testing::ValuesIn(target_specs()), spec_name);
INSTANTIATE_TEST_SUITE_P(Edge, MarginCuda, ::testing::ValuesIn(edge_specs()), spec_name);
INSTANTIATE_TEST_SUITE_P(LongRows, MarginCuda, ::testing::ValuesIn(long_row_specs()), spec_name);

// A class target out of range in device memory: index_error naming its position and value (core scans a host copy),
// and neither the loss nor the gradient written.
TEST(MarginCudaErrors, BadTargetNamesThePositionAndWritesNothing) {
  for (LossKind kind : {LossKind::multi_margin, LossKind::multilabel_margin}) {
    SCOPED_TRACE(kind_name(kind));
    Spec s;
    s.kind = kind, s.shape = {6, 9}, s.red = Reduction::sum;
    Problem p = build(s);
    p.target->set_int(kind == LossKind::multi_margin ? 4 : 4 * 9 + 2, 9);
    Tensor loss = Tensor::make(p.acc(), {}, Layout::contiguous, kSentinel);
    Tensor grad = Tensor::make(s.dt, s.shape, Layout::contiguous, kSentinel);
    const auto loss_before = loss.storage, grad_before = grad.storage;
    Mirror m(&kCuda);
    const Views v = views(m, p);
    const std::string where = kind == LossKind::multi_margin ? "9 at position [4]" : "9 at position [4, 2]";
    try {
      call_forward(p, v, m(loss));
      ADD_FAILURE() << "no error for a target of 9";
    } catch (const lossfuse::Error& e) {
      EXPECT_EQ(e.code(), lossfuse::ErrorCode::index_error);
      EXPECT_NE(std::string(e.what()).find(where), std::string::npos) << e.what();
    }
    const std::optional<TensorView> g[3] = {m(grad), std::nullopt, std::nullopt};
    EXPECT_THROW(call_backward(p, v, g), lossfuse::Error);
    m.download();
    EXPECT_TRUE(loss.storage == loss_before) << "loss written despite the error";
    EXPECT_TRUE(grad.storage == grad_before) << "gradient written despite the error";
  }
}

// The same reduced call twice gives the same bits (a fixed combining order per row, rows summed in order).
TEST(MarginCudaDeterminism, BitwiseAcrossRuns) {
  for (LossKind kind : kKinds)
    for (const std::vector<std::int64_t>& shape : {std::vector<std::int64_t>{300, 37}, {7, 3001}}) {
      SCOPED_TRACE(kind_name(kind) + " " + shape_name(shape));
      Spec s;
      s.kind = kind, s.shape = shape, s.red = Reduction::mean, s.weight = true, s.swap = true;
      Problem p = build(s);
      const Outputs a = run_lib(p, &kCuda), b = run_lib(p, &kCuda);
      EXPECT_TRUE(a.loss.storage == b.loss.storage);
      for (int k = 0; k < 3; ++k) {
        if (a.grads[k]) EXPECT_TRUE(a.grads[k]->storage == b.grads[k]->storage) << "grad " << k;
      }
    }
}

}  // namespace
}  // namespace lftest::margin

int main(int argc, char** argv) { return lftest::run_cuda_tests(argc, argv); }
