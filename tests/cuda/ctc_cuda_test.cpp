// ctc_forward / ctc_backward on CUDA tensors against the float64 reference (tests/cpu/ctc_harness.hpp: loss, nll,
// the log_alpha workspace and the gradient, with and without the saved workspace), through device copies of every
// operand: each dtype, reduction and target form, every integer dtype of targets and lengths, impossible and empty
// alignments, -inf log-probabilities, extended label sequences longer than a block (2 S + 1 > 256) and more classes
// than a block, lengths on the host, bad inputs refused with nothing written, bitwise repeats, CUDA-graph capture
// (eager bits, NaN for a bad sample, host values refused). Without a CUDA device every test is skipped (main
// exits 77).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <functional>
#include <string>
#include <utility>
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

// The CPU's table of bad inputs (ctc_harness.hpp): on CUDA the lengths and labels are checked on the device, and the
// first bad one in core's order is named, its value read back; nothing is written. Also with the lengths on the host.
TEST(CtcCuda, BadInputsAreNamedAndNothingIsWritten) {
  check_bad_inputs(&kCuda);
  check_bad_inputs(&kCuda, true);
}

// More samples than the check kernel's grid (4096 blocks, each then strides over samples): the last one's bad label.
TEST(CtcCuda, BadLabelBeyondTheCheckGrid) {
  Case c;
  c.dt = DType::f32, c.T = 3, c.N = 5000, c.C = 4, c.reduction = Reduction::sum;
  c.labels.assign(5000, {1, 2});
  Problem p = make_problem(c);
  p.targets.set_int(4999 * p.S + 1, 9);
  Tensor loss = Tensor::make(p.acc(), {}, Layout::contiguous, kSentinel);
  Mirror m(&kCuda);
  try {
    lossfuse::ctc_forward(m(p.lp), m(p.targets), m(p.il), m(p.tl), options_of(c),
                          CtcOutputs{m(loss), std::nullopt, std::nullopt});
    ADD_FAILURE() << "no error for a label of 9";
  } catch (const lossfuse::Error& e) {
    EXPECT_NE(e.actual().find("9 at position [4999, 1]"), std::string::npos) << e.what();
  }
  m.download();
  for (auto byte : loss.storage) ASSERT_EQ(byte, kSentinel) << "loss written";
}

TEST(CtcCuda, RepeatsBitwise) {
  Case c;
  c.dt = DType::bf16, c.T = 60, c.N = 9, c.C = 40, c.reduction = Reduction::mean, c.seed = 5;
  Problem p = make_problem(c);
  const Got a = run_lib(p, true, &kCuda), b = run_lib(p, true, &kCuda);
  EXPECT_TRUE(a.loss.storage == b.loss.storage && a.alpha.storage == b.alpha.storage);
  EXPECT_TRUE(a.grad.storage == b.grad.storage && a.grad2.storage == b.grad2.storage);
}

void captured(const std::function<void()>& calls) { run_captured(calls); }
void unchecked(const std::function<void()>& calls) { run_unchecked(calls); }

bool same_bits(const Got& a, const Got& b) {
  return a.loss.storage == b.loss.storage && a.nll.storage == b.nll.storage && a.alpha.storage == b.alpha.storage &&
         a.grad.storage == b.grad.storage && a.grad2.storage == b.grad2.storage;
}

// Padded targets with device lengths: the forward (loss, nll, log_alpha) and both backwards captured into a CUDA graph
// (run_captured: any host synchronisation fails the capture) or run under CudaCheck::nan (run_unchecked: no
// read-back) give the eager calls' bits.
TEST(CtcCudaGraph, CapturedCallsMatchEager) {
  for (DType dt : {DType::f32, DType::bf16, DType::f64})
    for (Reduction r : {Reduction::mean, Reduction::none, Reduction::sum}) {
      Case c;
      c.dt = dt, c.reduction = r, c.zero_infinity = r != Reduction::sum, c.T = 40, c.N = 6, c.C = 20, c.blank = 4;
      c.il = {40, 33, 2, 0, 17, 40};
      c.tdt = DType::i32, c.ildt = DType::u8, c.tldt = DType::i16;
      c.upstream = r == Reduction::none ? 1.25 : 0.5;
      c.seed = static_cast<std::uint64_t>(static_cast<int>(dt) * 3 + static_cast<int>(r));
      SCOPED_TRACE(describe(c));
      Problem p = make_problem(c);
      const Got eager = run_lib(p, true, &kCuda);
      EXPECT_TRUE(same_bits(run_lib(p, true, &kCuda, captured), eager)) << "captured bits differ from eager";
      EXPECT_TRUE(same_bits(run_lib(p, true, &kCuda, unchecked), eager)) << "unchecked bits differ from eager";
    }
}

// Under capture or CudaCheck::nan nothing is read back: a sample with a bad label or length gets a NaN loss, nll and
// gradient (and a reduced loss over it is NaN); the other samples keep their values.
TEST(CtcCudaGraph, BadInputsUnderCaptureMakeTheirSampleNaN) {
  const std::vector<std::pair<const char*, std::function<void(Problem&)>>> edits = {
      {"blank as a label", [](Problem& p) { p.targets.set_int(1 * p.S + 1, p.c.blank); }},
      {"label >= C", [](Problem& p) { p.targets.set_int(1 * p.S, p.c.C); }},
      {"input length > T", [](Problem& p) { p.il.set_int(1, p.c.T + 1); }},
      {"target length > S", [](Problem& p) { p.tl.set_int(1, p.S + 1); }},
  };
  for (const auto& [name, edit] : edits)
    for (Reduction r : {Reduction::none, Reduction::mean})
      for (auto* around : {captured, unchecked}) {
        SCOPED_TRACE(std::string(name) + " " + std::string(lossfuse::reduction_name(r)) +
                     (around == captured ? " captured" : " unchecked"));
        Case c;
        c.dt = DType::f32, c.T = 9, c.N = 3, c.C = 6, c.blank = 0, c.reduction = r, c.upstream = 1.0;
        c.labels = {{1, 2}, {3, 4, 5}, {2}};
        Problem clean = make_problem(c), bad = make_problem(c);
        edit(bad);
        const Got want = run_lib(clean, true, &kCuda), got = run_lib(bad, true, &kCuda, around);
        if (r == Reduction::none) {
          EXPECT_TRUE(std::isnan(got.loss.get(1)));
          EXPECT_EQ(got.loss.get(0), want.loss.get(0));
          EXPECT_EQ(got.loss.get(2), want.loss.get(2));
        } else {
          EXPECT_TRUE(std::isnan(got.loss.get(0)));
        }
        EXPECT_TRUE(std::isnan(got.nll.get(1)));
        for (std::int64_t t = 0; t < c.T; ++t)
          for (std::int64_t k = 0; k < c.C; ++k) {
            ASSERT_TRUE(std::isnan(got.grad.get(bad.idx(t, 1, k))) && std::isnan(got.grad2.get(bad.idx(t, 1, k))));
            ASSERT_EQ(got.grad.get(bad.idx(t, 0, k)), want.grad.get(bad.idx(t, 0, k)));
          }
      }
}

// Host values cannot go into a graph: lengths on the host and concatenated targets (whose lengths core reads) are
// refused under capture, naming the argument, before anything is written or the capture is spoiled.
TEST(CtcCudaGraph, HostValuesAreRefusedUnderCapture) {
  // (concatenated targets with device lengths; padded targets with input, target or both lengths on the host)
  const std::array<std::array<bool, 3>, 4> forms = {
      {{true, false, false}, {false, true, true}, {false, true, false}, {false, false, true}}};
  for (const auto& [concatenated, il_host, tl_host] : forms) {
    Case c;
    c.dt = DType::f32, c.T = 9, c.N = 3, c.C = 6, c.reduction = Reduction::mean, c.concatenated = concatenated;
    Problem p = make_problem(c);
    Tensor loss = Tensor::make(p.acc(), {}, Layout::contiguous, kSentinel);
    Mirror m(&kCuda);
    const TensorView lp = m(p.lp), targets = m(p.targets), out = m(loss);
    const TensorView il = il_host ? p.il.view : m(p.il), tl = tl_host ? p.tl.view : m(p.tl);
    const auto e = error_under_capture([&] {
      lossfuse::ctc_forward(lp, targets, il, tl, options_of(c), CtcOutputs{out, std::nullopt, std::nullopt});
    });
    ASSERT_TRUE(e.has_value()) << "no error under capture";
    EXPECT_EQ(e->argument(), concatenated ? "targets" : il_host ? "input_lengths" : "target_lengths") << e->what();
    m.download();
    for (auto byte : loss.storage) ASSERT_EQ(byte, kSentinel) << "loss written";
  }
}

}  // namespace
}  // namespace lftest

int main(int argc, char** argv) { return lftest::run_cuda_tests(argc, argv); }
