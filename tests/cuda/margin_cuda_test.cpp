// The five margin and embedding losses on CUDA tensors against the float64 reference: the CPU suite's spec tables
// (tests/cpu/margin_harness.hpp) run through device copies of every operand (tests/device_mirror.hpp), plus what only
// a device shows: a bad class target in device memory named with nothing written, rows long enough for the block
// kernels (over 1024 elements) and label masks in device scratch, and bitwise-repeatable reductions. Without a CUDA
// device every test is skipped (main exits 77).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
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
// also with 400000 classes, whose label mask (50 KB) no longer fits shared memory, and with the most classes whose
// mask does (360448: 44 KiB, beside the kernel's static shared memory within a launch's 48 KiB).
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
  s.shape = {2, 360448}, s.red = Reduction::mean, s.seed = ++k, s.name = "multilabel_margin_largest_shared_mask";
  v.push_back(s);
  return v;
}

auto spec_name = [](const auto& i) { return i.param.name; };
INSTANTIATE_TEST_SUITE_P(Options, MarginCuda, ::testing::ValuesIn(option_specs()), spec_name);
INSTANTIATE_TEST_SUITE_P(Layouts, MarginCuda, ::testing::ValuesIn(layout_specs()), spec_name);
INSTANTIATE_TEST_SUITE_P(TargetDtypes, MarginCuda, ::testing::ValuesIn(target_specs()), spec_name);
INSTANTIATE_TEST_SUITE_P(Edge, MarginCuda, ::testing::ValuesIn(edge_specs()), spec_name);
INSTANTIATE_TEST_SUITE_P(LongRows, MarginCuda, ::testing::ValuesIn(long_row_specs()), spec_name);

// A class target out of range in device memory: index_error naming its position and value (the device call's check,
// read back), and neither the loss nor the gradient written; a backward asking for no gradient still checks.
// multilabel_margin: a label past the list's end (-1) counts too, as does a value below -1.
TEST(MarginCudaErrors, BadTargetNamesThePositionAndWritesNothing) {
  struct Case {
    LossKind kind;
    Reduction red;
    std::int64_t at, value;
    const char* where;
  };
  for (const Case& c : {Case{LossKind::multi_margin, Reduction::sum, 4, 9, "9 at position [4]"},
                        Case{LossKind::multi_margin, Reduction::none, 0, -1, "-1 at position [0]"},
                        Case{LossKind::multilabel_margin, Reduction::sum, 4 * 9 + 2, 9, "9 at position [4, 2]"},
                        Case{LossKind::multilabel_margin, Reduction::mean, 5 * 9 + 8, -2, "-2 at position [5, 8]"}}) {
    SCOPED_TRACE(kind_name(c.kind) + " " + c.where);
    Spec s;
    s.kind = c.kind, s.shape = {6, 9}, s.red = c.red;
    Problem p = build(s);
    p.target->set_int(c.at, c.value);
    Tensor loss = Tensor::make(p.acc(), loss_shape(p), Layout::contiguous, kSentinel);
    Tensor grad = Tensor::make(s.dt, s.shape, Layout::contiguous, kSentinel);
    const auto loss_before = loss.storage, grad_before = grad.storage;
    Mirror m(&kCuda);
    const Views v = views(m, p);
    const std::optional<TensorView> g[3] = {m(grad), std::nullopt, std::nullopt};
    const std::optional<TensorView> none[3];
    for (int entry = 0; entry < 3; ++entry) {
      try {
        if (entry == 0) call_forward(p, v, m(loss));
        if (entry == 1) call_backward(p, v, g);
        if (entry == 2) call_backward(p, v, none);
        ADD_FAILURE() << "entry " << entry << ": no error";
      } catch (const lossfuse::Error& e) {
        EXPECT_EQ(e.code(), lossfuse::ErrorCode::index_error);
        EXPECT_NE(std::string(e.what()).find(c.where), std::string::npos) << e.what();
      }
    }
    m.download();
    EXPECT_TRUE(loss.storage == loss_before) << "loss written despite the error";
    EXPECT_TRUE(grad.storage == grad_before) << "gradient written despite the error";
  }
}

// Each loss's reduced forward and backward (a weighted 'mean', the upstream scalar in device memory) captured into a
// CUDA graph (run_captured) or run under CudaCheck::nan (run_unchecked), neither synchronising, give the eager calls'
// bits; neither reads anything back, so a bad class target makes the loss NaN instead of an error (multilabel_margin:
// also one past the list's end).
TEST(MarginCudaGraph, CapturedCallsMatchEager) {
  for (LossKind kind : kKinds)
    for (DType dt : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(kind_name(kind) + " " + dname(dt));
      Spec s;
      s.kind = kind, s.dt = dt, s.shape = {64, 300}, s.red = Reduction::mean, s.weight = true, s.swap = true;
      Problem p = build(s);
      auto bits = [&](RunAs how) {
        Outputs out;
        out.loss = Tensor::make(p.acc(), {}, Layout::contiguous, kSentinel);
        Mirror m(&kCuda);
        const Views v = views(m, p);
        std::optional<TensorView> g[3];
        out.grads.resize(3);
        for (int k = 0; k < num_grads(kind); ++k) {
          if (!s.want_grad[k]) continue;
          out.grads[k] = Tensor::make(dt, s.shape, Layout::contiguous, kSentinel);
          g[k] = m(*out.grads[k]);
        }
        const TensorView loss = m(out.loss);
        run_as(how, [&] {
          call_forward(p, v, loss);
          call_backward(p, v, g);
        });
        m.download();
        std::vector<std::uint8_t> b = out.loss.storage;
        for (const auto& t : out.grads) {
          if (t) b.insert(b.end(), t->storage.begin(), t->storage.end());
        }
        return b;
      };
      const auto eager = bits(RunAs::eager);
      EXPECT_TRUE(bits(RunAs::captured) == eager) << "the captured calls' bits differ from the eager calls'";
      EXPECT_TRUE(bits(RunAs::unchecked) == eager) << "the unchecked calls' bits differ from the eager calls'";
      if (kind != LossKind::multi_margin && kind != LossKind::multilabel_margin) continue;
      // multi_margin: row 7's class; multilabel_margin: a label of row 7, then a value past row 9's terminating -1
      const std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> edits =
          kind == LossKind::multi_margin ? std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>>{{{7, 300}}}
                                         : std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>>{
                                               {{7 * 300, 300}}, {{9 * 300, -1}, {9 * 300 + 5, -4}}};
      for (const auto& edit : edits)
        for (RunAs how : {RunAs::captured, RunAs::unchecked}) {
          Problem q = build(s);
          for (const auto& [at, value] : edit) q.target->set_int(at, value);
          Tensor loss = Tensor::make(q.acc(), {}, Layout::contiguous, kSentinel);
          Mirror m(&kCuda);
          const Views v = views(m, q);
          const TensorView lv = m(loss);
          run_as(how, [&] { call_forward(q, v, lv); });
          m.download();
          EXPECT_TRUE(std::isnan(loss.get(0)))
              << "a bad target, " << run_name(how) << " (" << edit.back().second << ")";
        }
    }
}

// The same reduced call twice gives the same bits (a fixed combining order per row, rows summed in a fixed tree).
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
