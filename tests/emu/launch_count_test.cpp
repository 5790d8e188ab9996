// What a cross-entropy, NLL, elementwise or margin call asks of the CUDA runtime, counted by the emulator
// (lfemu::counts): a small batch's forward, fused or NLL call is one kernel launch and no memset
// (src/cuda/cross_entropy.cu's inline scan and folded reduction), eagerly with its one read-back and under
// CudaCheck::nan with none; a large batch takes the general path (a memset, the scan kernel, the row kernel). Each
// call's values are checked against the float64 reference too, so a launch saved at the cost of a wrong value fails
// here.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "cpu/ce_specs.hpp"
#include "cpu/margin_harness.hpp"
#include "cpu/nll_harness.hpp"
#include "cpu/pointwise_harness.hpp"
#include "cuda/cuda_memory.hpp"

namespace lftest::ce {
namespace {

struct Asked {
  std::uint64_t kernels, memsets, copies;
};

Asked since(const lfemu::Counts& before) {
  const lfemu::Counts now = lfemu::counts();
  return {now.kernels - before.kernels, now.memsets - before.memsets, now.copies - before.copies};
}

Spec seed_spec(std::int64_t rows, std::int64_t classes, DType dt, Reduction red) {
  Spec s;
  s.name = "launch_count";
  s.dt = dt;
  s.tdt = DType::i64;
  s.shape = {rows, classes};
  s.red = red;
  s.with_z = false;
  return s;
}

// The call's runtime requests, forward (fused: forward_backward with a separate gradient), its outputs checked.
Asked run(const Spec& s, bool fused, bool checked) {
  Problem p = build(s);
  Fwd f = make_outputs(p, s.with_lse, s.with_z);
  Tensor grad = p.new_grad(Layout::contiguous);
  Mirror m(&kCuda);
  const TensorView logits = m(p.logits), target = m(p.target), g = m(grad);
  const lossfuse::CrossEntropyOutputs out = mirror_outputs(m, f, f.out);
  const std::optional<TensorView> up = fused ? std::optional<TensorView>(m(p.grad_loss)) : std::nullopt;
  const lossfuse::CudaCheckScope check(checked ? lossfuse::CudaCheck::report : lossfuse::CudaCheck::nan);
  const lfemu::Counts before = lfemu::counts();
  if (fused) {
    lossfuse::cross_entropy_forward_backward(logits, target, p.options(), out, up, g, GradWrite::separate);
  } else {
    lossfuse::cross_entropy_forward(logits, target, p.options(), out);
  }
  const Asked asked = since(before);
  m.download();
  check_forward(p, f.loss, s.with_lse ? &f.lse : nullptr, nullptr, fused ? "forward_backward" : "forward");
  if (fused) check_grad(p, grad, "forward_backward");
  return asked;
}

std::string describe(const Spec& s, bool fused) {
  return std::to_string(s.shape[0]) + " x " + std::to_string(s.shape[1]) + " " +
         std::string(lossfuse::dtype_name(s.dt)) + " " +
         (s.red == Reduction::mean  ? "mean"
          : s.red == Reduction::sum ? "sum"
                                    : "none") +
         (fused ? " fused" : " forward");
}

// The stream's first small call also zeroes its counter (stream_counter): a warm-up call takes that memset, before any
// test in any order.
class LaunchCount : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {  // at most the counter's memset (none under --gtest_repeat's later rounds)
    EXPECT_LE(run(seed_spec(4, 64, DType::f32, Reduction::mean), false, true).memsets, 1u);
  }
};

// The seed shapes (float32 forward) and others: one kernel launch, no memset; one copy (the 8-byte check
// record's read-back) when checked, none unchecked.
TEST_F(LaunchCount, SmallBatchIsOneLaunch) {
  struct Case {
    std::int64_t rows, classes;
    DType dt;
    Reduction red;
    bool fused;
  };
  const std::vector<Case> cases = {
      {32, 32000, DType::f32, Reduction::mean, false}, {128, 32000, DType::f32, Reduction::mean, false},
      {32, 50257, DType::f32, Reduction::mean, false}, {32, 32000, DType::f32, Reduction::sum, false},
      {32, 32000, DType::f32, Reduction::none, false}, {32, 32000, DType::bf16, Reduction::mean, true},
      {128, 32000, DType::f32, Reduction::sum, true},  {64, 8192, DType::bf16, Reduction::none, true},
      {1024, 600, DType::f32, Reduction::mean, false}, {1024, 600, DType::bf16, Reduction::mean, true},
  };
  for (const Case& c : cases) {
    const Spec s = seed_spec(c.rows, c.classes, c.dt, c.red);
    SCOPED_TRACE(describe(s, c.fused));
    for (const bool checked : {true, false}) {
      const Asked a = run(s, c.fused, checked);
      EXPECT_EQ(a.kernels, 1u) << (checked ? "checked" : "unchecked");
      EXPECT_EQ(a.memsets, 0u) << (checked ? "checked" : "unchecked");
      EXPECT_EQ(a.copies, checked ? 1u : 0u) << (checked ? "checked" : "unchecked");
    }
  }
}

// Past kInlineScanRows: a memset of the scan record, the scan kernel and the row kernel (the reduction folded into
// its last block up to 32 rows a thread).
TEST_F(LaunchCount, LargeBatchTakesTheScan) {
  const Spec s = seed_spec(1025, 300, DType::f32, Reduction::mean);
  SCOPED_TRACE(describe(s, false));
  const Asked a = run(s, false, true);
  EXPECT_EQ(a.kernels, 2u);
  EXPECT_EQ(a.memsets, 1u);
}

// Class weights add their conversion kernel, and nothing else.
TEST_F(LaunchCount, WeightsAddTheirConversion) {
  Spec s = seed_spec(64, 4096, DType::f32, Reduction::mean);
  s.weight = true;
  SCOPED_TRACE(describe(s, true));
  Problem p = build(s);
  Fwd f = make_outputs(p, true, false);
  Mirror m(&kCuda);
  CrossEntropyOptions o = p.options();
  o.weight = m(p.weight);
  const TensorView logits = m(p.logits), target = m(p.target);
  const lossfuse::CrossEntropyOutputs out = mirror_outputs(m, f, f.out);
  const lfemu::Counts before = lfemu::counts();
  lossfuse::cross_entropy_forward(logits, target, o, out);
  const Asked a = since(before);
  m.download();
  check_forward(p, f.loss, &f.lse, nullptr, "forward");
  EXPECT_EQ(a.kernels, 2u);
  EXPECT_EQ(a.memsets, 0u);
}

// nll_forward and nll_backward, checked: each one launch and no memset up to kInlineScanRows rows (the forward one
// block), in every layout and target dtype; beyond, the general path's memset, scan, row kernel (and reduction).
TEST_F(LaunchCount, NllSmallBatchIsOneLaunch) {
  struct Case {
    std::vector<std::int64_t> shape;
    DType dt, tdt;
    Reduction red;
    std::uint64_t forward_kernels, backward_kernels, memsets;
  };
  const std::vector<Case> cases = {
      {{32, 32000}, DType::f32, DType::i64, Reduction::mean, 1, 1, 0},
      {{1024, 100}, DType::bf16, DType::u8, Reduction::sum, 1, 1, 0},
      {{300, 50}, DType::f64, DType::i32, Reduction::none, 1, 1, 0},
      {{7, 3, 5}, DType::f16, DType::i16, Reduction::mean, 1, 1, 0},
      {{1025, 20}, DType::f32, DType::i64, Reduction::mean, 3, 2, 1},
  };
  for (const Case& c : cases) {
    nll::Spec s;
    s.name = "nll_launch_count";
    s.dt = c.dt;
    s.tdt = c.tdt;
    s.shape = c.shape;
    s.red = c.red;
    s.ignore_frac = c.tdt == DType::u8 ? 0.0 : 0.1;  // ignore_index -100 is no uint8 value
    SCOPED_TRACE(s.name + " " + std::to_string(c.shape[0]) + " rows, " + std::string(lossfuse::dtype_name(c.dt)));
    nll::Problem p = nll::build(s);
    Tensor loss = Tensor::make(p.acc(), s.red == Reduction::none ? p.rshape : std::vector<std::int64_t>{},
                               Layout::contiguous, kSentinel);
    Tensor grad = Tensor::make(s.dt, s.shape, Layout::contiguous, kSentinel);
    Mirror m(&kCuda);
    const TensorView input = m(p.input), target = m(p.target), l = m(loss), g = m(grad);
    const std::optional<TensorView> up = m(p.grad_loss);
    lfemu::Counts before = lfemu::counts();
    lossfuse::nll_forward(input, target, p.options(), l);
    const Asked fwd = since(before);
    before = lfemu::counts();
    lossfuse::nll_backward(input, target, up, p.options(), g);
    const Asked bwd = since(before);
    m.download();
    EXPECT_EQ(fwd.kernels, c.forward_kernels);
    EXPECT_EQ(bwd.kernels, c.backward_kernels);
    EXPECT_EQ(fwd.memsets, c.memsets);
    EXPECT_EQ(bwd.memsets, c.memsets);
    EXPECT_EQ(fwd.copies, 1u);
    EXPECT_EQ(bwd.copies, 1u);
    if (s.red == Reduction::none) {
      EXPECT_TRUE(close_all("loss", loss.values(), p.ref.row_loss, p.ref.row_loss_tol, p.acc()));
    } else {
      EXPECT_TRUE(close_one("loss", loss.get(0), p.ref.loss, p.ref.loss_tol, p.acc()));
    }
    EXPECT_TRUE(close_all("grad", gather_rows(grad), p.ref.grad, p.ref.grad_tol, s.dt));
  }
}

// The elementwise losses (src/cuda/pointwise.cu): an unchecked, unweighted forward, backward or fused call is one
// launch and no memset at any reduction (the reduction folded into the pass, a reduced backward's scale computed in
// it); a value-checked one (bce) adds the record's memset and, when it writes a gradient, the check's own pass first.
TEST_F(LaunchCount, PointwiseUncheckedIsOneLaunch) {
  using lfref::PwLoss;
  struct Case {
    PwLoss loss;
    Reduction red;
    DType dt;
    pointwise::Up up;
    std::uint64_t forward_kernels, grad_kernels, memsets, copies;  // grad: the backward's and the fused entry's
  };
  const std::vector<Case> cases = {
      {PwLoss::mse, Reduction::mean, DType::f32, pointwise::Up::absent, 1, 1, 0, 0},
      {PwLoss::l1, Reduction::sum, DType::bf16, pointwise::Up::scalar, 1, 1, 0, 0},
      {PwLoss::huber, Reduction::none, DType::f16, pointwise::Up::absent, 1, 1, 0, 0},
      {PwLoss::kl_div, Reduction::mean, DType::f64, pointwise::Up::scalar, 1, 1, 0, 0},
      {PwLoss::bce, Reduction::mean, DType::f32, pointwise::Up::absent, 1, 2, 1, 1},
  };
  for (const Case& c : cases) {
    pointwise::Spec s;
    s.c = pointwise::config_of(c.loss, c.red, 0);
    s.red = c.red, s.dt = c.dt, s.up = c.up, s.shape = {3, 4000};
    s.name = pointwise::base_name(s);
    SCOPED_TRACE(s.name);
    pointwise::Problem p = pointwise::build(s);
    Tensor loss = Tensor::make(p.acc(), c.red == Reduction::none ? s.shape : std::vector<std::int64_t>{},
                               Layout::contiguous, kSentinel);
    Tensor fused_loss = loss, grad = pointwise::make_grad(s.dt, s.shape, Layout::contiguous), fused_grad = grad;
    Mirror m(&kCuda);
    const PwArgs a = pointwise::device_args(m, p);
    std::optional<TensorView> up;
    if (p.up) {
      up = p.up->view;
      const TensorView d = m(p.up->store);
      up->data = d.data, up->device = d.device;
    }
    const TensorView l = m(loss), g = m(grad), fl = m(fused_loss), fg = m(fused_grad);
    lfemu::Counts before = lfemu::counts();
    pw_forward(a, l);
    const Asked fwd = since(before);
    before = lfemu::counts();
    pw_backward(a, up, lossfuse::PointwiseGrads{g, std::nullopt, std::nullopt});
    const Asked bwd = since(before);
    before = lfemu::counts();
    pw_forward_backward(a, fl, lossfuse::PointwiseGrads{fg, std::nullopt, std::nullopt});
    const Asked fused = since(before);
    m.download();
    for (const auto& [what, asked, kernels] :
         {std::tuple{"forward", fwd, c.forward_kernels}, std::tuple{"backward", bwd, c.grad_kernels},
          std::tuple{"fused", fused, c.grad_kernels}}) {
      EXPECT_EQ(asked.kernels, kernels) << what;
      EXPECT_EQ(asked.memsets, c.memsets) << what;
      EXPECT_EQ(asked.copies, c.copies) << what;
    }
    for (const Tensor* t : {&loss, &fused_loss}) {
      if (c.red == Reduction::none) {
        EXPECT_TRUE(close_all("loss", t->values(), p.ref.elem_loss, p.ref.elem_loss_tol, p.acc()));
      } else {
        EXPECT_TRUE(close_one("loss", t->get(0), p.ref.loss, p.ref.loss_tol, p.acc()));
      }
    }
    EXPECT_TRUE(close_all("grad_input", grad.values(), p.ref.gx, p.ref.gx_tol, s.dt));
    EXPECT_TRUE(close_all("fused grad_input", fused_grad.values(), p.ref_unit.gx, p.ref_unit.gx_tol, s.dt));
  }
}

// The margin losses (src/cuda/margin.cu): a reduced forward is the row kernel alone, its last block summing the loss
// (fold_loss); class weights add their conversion, and a target check (multi_margin, multilabel_margin: eager and
// CudaCheck::report) adds the record's memset, the check kernel and the record's read-back.
TEST_F(LaunchCount, MarginReducedForwardIsOneLaunch) {
  using lossfuse::LossKind;
  struct Case {
    LossKind kind;
    Reduction red;
    DType dt;
    bool weight, checked;
    std::uint64_t kernels, memsets, copies;
  };
  const std::vector<Case> cases = {
      {LossKind::triplet_margin, Reduction::mean, DType::f32, false, true, 1, 0, 0},
      {LossKind::cosine_embedding, Reduction::sum, DType::bf16, false, true, 1, 0, 0},
      {LossKind::multilabel_soft_margin, Reduction::mean, DType::f64, true, true, 2, 0, 0},
      {LossKind::multi_margin, Reduction::mean, DType::f32, false, true, 2, 1, 1},
      {LossKind::multi_margin, Reduction::sum, DType::f16, false, false, 1, 0, 0},
      {LossKind::multilabel_margin, Reduction::mean, DType::f32, false, true, 2, 1, 1},
  };
  for (const Case& c : cases) {
    margin::Spec s;
    s.kind = c.kind, s.red = c.red, s.dt = c.dt, s.weight = c.weight, s.shape = {37, 300};  // five blocks of rows
    s.name = margin::case_name(s);
    SCOPED_TRACE(s.name + (c.checked ? " checked" : " unchecked"));
    margin::Problem p = margin::build(s);
    Tensor loss = Tensor::make(p.acc(), {}, Layout::contiguous, kSentinel);
    Mirror m(&kCuda);
    const margin::Views v = margin::views(m, p);
    const TensorView l = m(loss);
    const lossfuse::CudaCheckScope check(c.checked ? lossfuse::CudaCheck::report : lossfuse::CudaCheck::nan);
    const lfemu::Counts before = lfemu::counts();
    margin::call_forward(p, v, l);
    const Asked asked = since(before);
    m.download();
    EXPECT_EQ(asked.kernels, c.kernels);
    EXPECT_EQ(asked.memsets, c.memsets);
    EXPECT_EQ(asked.copies, c.copies);
    EXPECT_TRUE(close_one("loss", loss.get(0), p.ref.loss, p.ref.loss_tol, p.acc()));
  }
}

}  // namespace
}  // namespace lftest::ce

int main(int argc, char** argv) { return lftest::run_cuda_tests(argc, argv); }
