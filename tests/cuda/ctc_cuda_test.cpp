// ctc_forward / ctc_backward on CUDA tensors against the float64 reference (tests/cpu/ctc_harness.hpp: loss, nll,
// the log_alpha workspace and the gradient, with and without the saved workspace), through device copies of every
// operand: each dtype, reduction and target form, every integer dtype of targets and lengths, impossible and empty
// alignments, -inf log-probabilities, extended label sequences longer than a block (2 S + 1 > 256) and more classes
// than a block, lengths on the host, bad labels refused with nothing written, bitwise repeats. Without a CUDA device
// every test is skipped (main exits 77).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "cpu/ctc_harness.hpp"
#include "cuda/cuda_memory.hpp"

namespace lftest {
namespace {

using namespace ctc;

TEST(CtcCuda, DtypesReductionsAndTargetForms) {
  for (DType dt : lossfuse::kFloatDTypes)
    for (Reduction r : {Reduction::none, Reduction::mean, Reduction::sum})
      for (bool concat : {false, true}) {
        Case c;
        c.dt = dt, c.reduction = r, c.concatenated = concat, c.zero_infinity = !concat, c.strided = concat;
        c.T = 11, c.N = 5, c.C = 7, c.blank = 3, c.il = {11, 9, 2, 0, 6};
        c.labels = {{1, 2, 2, 6}, {5, 5}, {1, 4, 0}, {}, {0, 1, 2}};  // sample 2: impossible; 3: loss 0
        c.upstream = r == Reduction::none ? 1.25 : 0.5;
        c.seed = static_cast<std::uint64_t>(static_cast<int>(dt) * 7 + static_cast<int>(r) * 2 + concat);
        check_case(c, &kCuda);
      }
}

TEST(CtcCuda, IntegerDtypesOfTargetsAndLengths) {
  std::uint64_t seed = 40;
  for (DType tdt : lossfuse::kIntDTypes)
    for (DType ldt : lossfuse::kIntDTypes) {
      Case c;
      c.dt = DType::f32, c.tdt = tdt, c.ildt = ldt, c.tldt = ldt, c.concatenated = (seed % 2) == 1;
      c.T = 10, c.N = 3, c.C = 6, c.blank = 5, c.il = {10, 8, 4}, c.reduction = Reduction::sum, c.seed = ++seed;
      check_case(c, &kCuda);
    }
}

// l' longer than the block (up to 401 positions over 256 threads), more classes than threads (C = 300), labels
// repeated across the sequence (a class with many positions), unbatched and strided layouts.
TEST(CtcCuda, LongSequencesManyClassesAndLayouts) {
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    Case c;
    c.dt = dt, c.T = 420, c.N = 3, c.C = 300, c.blank = 17, c.reduction = Reduction::mean, c.seed = 3;
    c.labels.assign(3, {});
    for (int i = 0; i < 200; ++i) c.labels[0].push_back(i % 3 == 0 ? 5 : 1 + (i * 37) % 299);
    for (int i = 0; i < 120; ++i) c.labels[1].push_back(i % 2 ? 299 : 4);
    c.labels[2] = {2};
    for (auto& l : c.labels)
      for (auto& v : l) v = v == c.blank ? v + 1 : v;
    c.il = {420, 400, 1};
    check_case(c, &kCuda);
  }
  for (bool unbatched : {false, true}) {
    Case c;
    c.dt = DType::f32, c.T = 13, c.N = 2, c.C = 9, c.blank = 8, c.unbatched = unbatched, c.strided = true;
    c.reduction = unbatched ? Reduction::none : Reduction::sum, c.upstream = 2.0, c.seed = 77;
    check_case(c, &kCuda);
  }
}

TEST(CtcCuda, EmptyBatchNoTimeStepsAndNegativeInfinity) {
  {
    Case c;
    c.T = 5, c.N = 0, c.C = 3, c.reduction = Reduction::mean;
    Problem p = make_problem(c);
    const Got g = run_lib(p, true, &kCuda);
    EXPECT_TRUE(std::isnan(g.loss.get(0)));
  }
  {
    Case c;
    c.T = 0, c.N = 2, c.C = 3, c.reduction = Reduction::none, c.upstream = 1.0, c.labels = {{}, {2}}, c.il = {0, 0};
    check_case(c, &kCuda);
  }
  Case c;
  c.dt = DType::f32, c.T = 8, c.N = 2, c.C = 5, c.reduction = Reduction::none;
  c.labels = {{1, 2}, {3, 3}}, c.il = {8, 6};
  Problem p = make_problem(c);
  for (const auto [t, b, k] : {std::array<std::int64_t, 3>{2, 0, 4}, {3, 1, 0}}) {
    p.lp.set(p.idx(t, b, k), -kInf);
    p.lpv[p.idx(t, b, k)] = -kInf;
  }
  check_problem(p, &kCuda);
}

// torch's ctc_loss takes its lengths as CPU tensors beside CUDA log_probs: so does lossfuse.
TEST(CtcCuda, LengthsOnTheHost) {
  Case c;
  c.dt = DType::f32, c.T = 9, c.N = 4, c.C = 6, c.reduction = Reduction::none, c.seed = 9;
  Problem p = make_problem(c);
  const Expected e = expect(p);
  Tensor loss = Tensor::make(DType::f32, {c.N});
  Mirror m(&kCuda);
  lossfuse::ctc_forward(m(p.lp), m(p.targets), p.il.view, p.tl.view, options_of(c),
                        CtcOutputs{m(loss), std::nullopt, std::nullopt});
  m.download();
  EXPECT_TRUE(close_all("loss", loss.values(), e.loss, e.loss_tol, DType::f32));
}

TEST(CtcCuda, BadLabelIsNamedAndNothingIsWritten) {
  Case c;
  c.dt = DType::f32, c.T = 9, c.N = 3, c.C = 6, c.blank = 0, c.reduction = Reduction::none;
  c.labels = {{1, 2}, {3, 4, 5}, {2}};
  Problem p = make_problem(c);
  p.targets.set_int(1 * p.S + 1, 0);  // the blank as a label, sample 1 label 1
  Tensor loss = Tensor::make(DType::f32, {c.N}, Layout::contiguous, kSentinel);
  const auto sentinel = loss.storage;
  Mirror m(&kCuda);
  try {
    lossfuse::ctc_forward(m(p.lp), m(p.targets), m(p.il), m(p.tl), options_of(c),
                          CtcOutputs{m(loss), std::nullopt, std::nullopt});
    ADD_FAILURE() << "no error for a blank label";
  } catch (const lossfuse::Error& e) {
    EXPECT_EQ(e.code(), lossfuse::ErrorCode::index_error) << e.what();
    EXPECT_NE(std::string(e.what()).find("[1, 1]"), std::string::npos) << e.what();
  }
  m.download();
  EXPECT_TRUE(loss.storage == sentinel) << "loss written despite the error";
}

TEST(CtcCuda, RepeatsBitwise) {
  Case c;
  c.dt = DType::bf16, c.T = 60, c.N = 9, c.C = 40, c.reduction = Reduction::mean, c.seed = 5;
  Problem p = make_problem(c);
  const Got a = run_lib(p, true, &kCuda), b = run_lib(p, true, &kCuda);
  EXPECT_TRUE(a.loss.storage == b.loss.storage && a.alpha.storage == b.alpha.storage);
  EXPECT_TRUE(a.grad.storage == b.grad.storage && a.grad2.storage == b.grad2.storage);
}

}  // namespace
}  // namespace lftest

int main(int argc, char** argv) { return lftest::run_cuda_tests(argc, argv); }
