// cross_entropy_* and nll_* on CUDA tensors against the float64 reference: the CPU suite's spec tables
// (tests/cpu/ce_specs.hpp, nll_harness.hpp) run through device copies of every operand (tests/device_mirror.hpp),
// plus what only a device shows: bad targets refused before any device output is written, operands on two devices,
// and bitwise-repeatable results. Without a CUDA device every test is skipped
// (main exits 77, which ctest reports as skipped, never passed).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "cpu/ce_specs.hpp"
#include "cpu/nll_harness.hpp"
#include "cuda/cuda_memory.hpp"

namespace lftest {
namespace {

std::string param_name(const auto& i) { return i.param.name; }

}  // namespace

namespace ce {
namespace {

class CrossEntropyCuda : public ::testing::TestWithParam<Spec> {};
TEST_P(CrossEntropyCuda, MatchesReference) { run_all(GetParam(), &kCuda); }
INSTANTIATE_TEST_SUITE_P(Vocab, CrossEntropyCuda, ::testing::ValuesIn(vocab_specs()),
                         [](const auto& i) { return param_name(i); });
INSTANTIATE_TEST_SUITE_P(Options, CrossEntropyCuda, ::testing::ValuesIn(option_specs()),
                         [](const auto& i) { return param_name(i); });
INSTANTIATE_TEST_SUITE_P(Soft, CrossEntropyCuda, ::testing::ValuesIn(soft_specs()),
                         [](const auto& i) { return param_name(i); });
INSTANTIATE_TEST_SUITE_P(Shapes, CrossEntropyCuda, ::testing::ValuesIn(shape_specs()),
                         [](const auto& i) { return param_name(i); });
INSTANTIATE_TEST_SUITE_P(TargetDtypes, CrossEntropyCuda, ::testing::ValuesIn(target_specs()),
                         [](const auto& i) { return param_name(i); });
INSTANTIATE_TEST_SUITE_P(Adversarial, CrossEntropyCuda, ::testing::ValuesIn(adversarial_specs()),
                         [](const auto& i) { return param_name(i); });
INSTANTIATE_TEST_SUITE_P(Edge, CrossEntropyCuda, ::testing::ValuesIn(edge_specs()),
                         [](const auto& i) { return param_name(i); });

Spec base_spec(DType dt, DType tdt) {
  Spec s;
  s.name = "device_misc";
  s.dt = dt;
  s.tdt = tdt;
  s.shape = {64, 1000};
  return s;
}

// A class index out of range is an IndexError naming its position and value; no device output is written.
TEST(CrossEntropyCudaErrors, BadTargetNamesPositionAndWritesNothing) {
  for (DType tdt : {DType::u8, DType::i8, DType::i16, DType::i32, DType::i64}) {
    Spec s = base_spec(DType::bf16, tdt);
    s.shape = {64, 100};
    Problem p = build(s);
    p.target.set_int(37, tdt == DType::u8 ? 200 : -3);
    Fwd f = make_outputs(p, true, true);
    Tensor grad = p.new_grad(Layout::contiguous);
    const auto sentinel_loss = f.loss.storage, sentinel_grad = grad.storage;
    Mirror m(&kCuda);
    try {
      lossfuse::cross_entropy_forward_backward(m(p.logits), m(p.target), p.options(), mirror_outputs(m, f, f.out),
                                               std::nullopt, m(grad));
      ADD_FAILURE() << "no error for a bad target of dtype " << lossfuse::dtype_name(tdt);
    } catch (const lossfuse::Error& e) {
      EXPECT_EQ(e.code(), lossfuse::ErrorCode::index_error);
      EXPECT_NE(std::string(e.what()).find("at position [37]"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(tdt == DType::u8 ? "200" : "-3"), std::string::npos) << e.what();
    }
    m.download();
    EXPECT_TRUE(f.loss.storage == sentinel_loss) << "loss written despite the error";
    EXPECT_TRUE(grad.storage == sentinel_grad) << "gradient written despite the error";
  }
}

// Every operand must live on the logits' device.
TEST(CrossEntropyCudaErrors, MixedDevices) {
  Problem p = build(base_spec(DType::f32, DType::i64));
  Fwd f = make_outputs(p, false, false);
  Mirror m(&kCuda);
  const TensorView logits = m(p.logits);
  try {
    lossfuse::cross_entropy_forward(logits, p.target.view, p.options(), mirror_outputs(m, f, f.out));
    ADD_FAILURE() << "a host target was accepted with device logits";
  } catch (const lossfuse::Error& e) {
    EXPECT_EQ(e.argument(), "target");
  }
  try {
    lossfuse::cross_entropy_forward(logits, m(p.target), p.options(), f.out);
    ADD_FAILURE() << "a host loss output was accepted with device logits";
  } catch (const lossfuse::Error& e) {
    EXPECT_EQ(e.argument(), "loss");
  }
}

// A host pointer in a view that says cuda is refused before any kernel could fault on it.
TEST(CrossEntropyCudaErrors, HostMemoryInACudaView) {
  Problem p = build(base_spec(DType::f32, DType::i64));
  Fwd f = make_outputs(p, false, false);
  Mirror m(&kCuda);
  TensorView logits = p.logits.view;
  logits.device = lossfuse::Device::cuda;
  try {
    lossfuse::cross_entropy_forward(logits, m(p.target), p.options(), mirror_outputs(m, f, f.out));
    ADD_FAILURE() << "host logits in a cuda view were accepted";
  } catch (const lossfuse::Error& e) {
    EXPECT_EQ(e.code(), lossfuse::ErrorCode::bad_pointer) << e.what();
    EXPECT_EQ(e.argument(), "logits");
  }
}

// A masked class (a logit of -1e9, as masked_fill leaves it) must not spoil the label-smoothing sum of the others:
// the sums follow the row's running max. The reference's error budget scales with the largest |z| (1e9), so this
// checks against a tight relative bound of its own: about 2e-3 off when the sums were taken relative to x[0].
TEST(CrossEntropyCudaNumerics, MaskedFirstClassWithLabelSmoothing) {
  Spec s = base_spec(DType::f32, DType::i64);
  s.shape = {8, 32000};
  s.eps = 0.1;
  s.edit = [](Rng&, std::int64_t R, std::int64_t C, std::vector<double>& x, std::vector<std::int64_t>& t) {
    for (std::int64_t r = 0; r < R; ++r) {
      x[static_cast<std::size_t>(r * C)] = -1e9;
      if (t[static_cast<std::size_t>(r)] == 0) t[static_cast<std::size_t>(r)] = 1;
    }
  };
  for (Reduction red : {Reduction::none, Reduction::sum}) {
    s.red = red;
    Problem p = build(s);
    Fwd f = make_outputs(p, false, false);
    Mirror m(&kCuda);
    lossfuse::cross_entropy_forward(m(p.logits), m(p.target), p.options(), mirror_outputs(m, f, f.out));
    m.download();
    const std::vector<double> got = f.loss.values();
    const std::vector<double> want = red == Reduction::none ? p.ref.row_loss : std::vector<double>{p.ref.loss};
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], 1e-4 * std::fabs(want[i])) << "row " << i;
    }
  }
}

// The same call twice gives the same bits (fixed reduction order, no atomics).
TEST(CrossEntropyCudaDeterminism, BitwiseAcrossRuns) {
  for (DType dt : {DType::f32, DType::bf16}) {
    Spec s = base_spec(dt, DType::i32);
    s.shape = {256, 50257};
    s.eps = 0.1;
    s.weight = true;
    Problem p = build(s);
    std::vector<std::vector<std::uint8_t>> runs;
    for (int i = 0; i < 2; ++i) {
      Fwd f = make_outputs(p, true, true);
      Tensor grad = p.new_grad(Layout::contiguous);
      Mirror m(&kCuda);
      CrossEntropyOptions o = p.options();
      o.weight = m(p.weight);
      lossfuse::cross_entropy_forward_backward(m(p.logits), m(p.target), o, mirror_outputs(m, f, f.out), std::nullopt,
                                               m(grad));
      m.download();
      std::vector<std::uint8_t> bits = f.loss.storage;
      bits.insert(bits.end(), f.lse.storage.begin(), f.lse.storage.end());
      bits.insert(bits.end(), grad.storage.begin(), grad.storage.end());
      runs.push_back(bits);
    }
    EXPECT_TRUE(runs[0] == runs[1]) << lossfuse::dtype_name(dt);
  }
}

// A weighted fused call of p (its upstream gradient when `upstream`, else none), run `how`: the loss, lse and gradient
// bytes; seen(loss, grad) looks at the downloaded outputs first.
template <class F>
std::vector<std::uint8_t> weighted_fused_bits(Problem& p, RunAs how, bool upstream, F&& seen) {
  Fwd f = make_outputs(p, true, true);
  Tensor grad = p.new_grad(Layout::contiguous);
  Mirror m(&kCuda);
  CrossEntropyOptions o = p.options();
  o.weight = m(p.weight);
  const TensorView logits = m(p.logits), target = m(p.target), g = m(grad);
  const std::optional<TensorView> up = upstream ? std::optional<TensorView>(m(p.grad_loss)) : std::nullopt;
  const lossfuse::CrossEntropyOutputs out = mirror_outputs(m, f, f.out);
  run_as(how, [&] { lossfuse::cross_entropy_forward_backward(logits, target, o, out, up, g); });
  m.download();
  seen(f.loss, grad);
  std::vector<std::uint8_t> b = f.loss.storage;
  b.insert(b.end(), f.lse.storage.begin(), f.lse.storage.end());
  b.insert(b.end(), grad.storage.begin(), grad.storage.end());
  return b;
}

// A weighted, label-smoothed, fused mean call captured into a CUDA graph on a stream of the caller's (torch's
// capture mode: global) and replayed twice, or run eagerly under CudaCheck::nan: no host synchronisation, and the
// same bits as the eager call. Neither reads anything back, so a bad target makes its row's gradient and the loss NaN
// instead of an error.
TEST(CrossEntropyCudaGraph, CapturedCallMatchesEager) {
  for (bool bad : {false, true}) {
    Spec s = base_spec(DType::bf16, DType::i32);
    s.shape = {512, 32000};
    s.eps = 0.1;
    s.weight = true;
    Problem p = build(s);
    auto bits = [&](RunAs how) {
      return weighted_fused_bits(p, how, false, [&](const Tensor& loss, const Tensor& grad) {
        if (!bad) return;
        EXPECT_TRUE(std::isnan(loss.values()[0])) << "a bad target, " << run_name(how);
        std::int64_t finite = 0;
        for (std::int64_t c = 0; c < s.shape[1]; ++c) finite += std::isnan(grad.get(5 * s.shape[1] + c)) ? 0 : 1;
        EXPECT_EQ(finite, 0) << "the bad row's gradient, " << run_name(how);
      });
    };
    if (bad) {
      p.target.set_int(5, -3);
      (void)bits(RunAs::captured);
      (void)bits(RunAs::unchecked);
    } else {
      const auto eager = bits(RunAs::eager);
      EXPECT_TRUE(bits(RunAs::captured) == eager) << "the captured call's bits differ from the eager call's";
      EXPECT_TRUE(bits(RunAs::unchecked) == eager) << "the unchecked call's bits differ from the eager call's";
    }
  }
}

// Class weights of full float32 mantissas at three scales 2^20 apart, whose sum in double depends on its order: an
// eager small batch scans its targets inside the row kernel and a captured call in the scan kernel, and the two must
// sum in the same order (cross_entropy.cu's inline_scan), so their bits agree.
TEST(CrossEntropyCudaGraph, CapturedMatchesEagerForOrderSensitiveWeights) {
  Spec s = base_spec(DType::f64, DType::i64);  // float64 outputs show the denominator's last bit
  s.shape = {300, 1000};
  s.eps = 0.1;
  s.weight = true;
  Problem p = build(s);
  for (std::int64_t c = 0; c < s.shape[1]; ++c) {  // full float32 mantissas at 2^20, 1 and 2^-20
    const double frac = static_cast<double>((c * 2654435761LL) % (1 << 23)) / (1 << 23);
    p.weight->set(c, std::ldexp(1.0 + frac, static_cast<int>(c % 3) * 20 - 20));
  }
  const auto none = [](const Tensor&, const Tensor&) {};
  const auto eager = weighted_fused_bits(p, RunAs::eager, true, none);
  EXPECT_TRUE(weighted_fused_bits(p, RunAs::captured, true, none) == eager)
      << "the captured call's bits differ from the eager call's";
}

// cross_entropy_scale_held reads the upstream gradient on the device: captured and replayed twice, it gives the bits
// of two eager calls (the held gradient itself for an upstream of 1), so a training step's backward needs no
// read-back.
TEST(CrossEntropyCudaGraph, CapturedScaleHeldMatchesEager) {
  for (double up : {1.0, 0.75}) {
    Spec s = base_spec(DType::bf16, DType::u8);
    s.shape = {300, 5000};
    s.ignore_frac = 0.2;
    s.ignore_index = 7;
    Problem p = build(s);
    Tensor held = p.new_grad(Layout::contiguous);
    {
      Fwd f = make_outputs(p, true, false);
      Mirror m(&kCuda);
      lossfuse::cross_entropy_forward_backward(m(p.logits), m(p.target), p.options(), mirror_outputs(m, f, f.out),
                                               std::nullopt, m(held));
      m.download();
    }
    auto bits = [&](bool captured) {
      Tensor grad = held;
      Tensor scale = scalar_tensor(DType::f32, up);
      Mirror m(&kCuda);
      const TensorView g = m(grad), target = m(p.target), u = m(scale);
      auto call = [&] { lossfuse::cross_entropy_scale_held(g, target, p.options(), u); };
      if (captured) {
        run_captured(call);  // replayed twice
      } else {
        call();
        call();
      }
      m.download();
      return grad.storage;
    };
    const auto eager = bits(false);
    EXPECT_TRUE(bits(true) == eager) << "up " << up << ": the captured calls' bits differ from the eager calls'";
    if (up == 1.0) EXPECT_TRUE(eager == held.storage) << "an upstream gradient of 1 changed the held gradient";
  }
}

// cross_entropy_backward_held reads the upstream gradient on the device and reads nothing back: captured and replayed
// twice, it gives the eager call's bits (cross_entropy_backward's from the same lse; the held gradient for 1).
TEST(CrossEntropyCudaGraph, CapturedBackwardHeldMatchesEager) {
  for (double up : {1.0, 0.75}) {
    Spec s = base_spec(DType::bf16, DType::i32);
    s.shape = {300, 5000};
    s.ignore_frac = 0.2;
    Problem p = build(s);
    Tensor held = p.new_grad(Layout::contiguous), want = p.new_grad(Layout::contiguous);
    Fwd f = make_outputs(p, true, false);
    Tensor scale = scalar_tensor(DType::f32, up);
    {
      Mirror m(&kCuda);
      lossfuse::cross_entropy_forward_backward(m(p.logits), m(p.target), p.options(), mirror_outputs(m, f, f.out),
                                               std::nullopt, m(held));
      m.download();
    }
    {
      Mirror m(&kCuda);
      lossfuse::cross_entropy_backward(m(p.logits), m(p.target), m(f.lse), m(scale), p.options(), m(want));
      m.download();
    }
    auto bits = [&](bool captured) {
      Tensor grad = held;
      Mirror m(&kCuda);
      const TensorView g = m(grad), logits = m(p.logits), target = m(p.target), lse = m(f.lse), u = m(scale);
      auto call = [&] { lossfuse::cross_entropy_backward_held(logits, target, lse, u, p.options(), g); };
      if (captured) {
        run_captured(call);
      } else {
        call();
      }
      m.download();
      return grad.storage;
    };
    const auto eager = bits(false);
    EXPECT_TRUE(bits(true) == eager) << "up " << up << ": the captured call's bits differ from the eager call's";
    EXPECT_TRUE(eager == (up == 1.0 ? held.storage : want.storage)) << "up " << up;
    if (up == 1.0) continue;
    // An eager held call reads nothing back either: a target made bad after the forward is no error, its row NaN.
    p.target.set_int(5, -3);
    Tensor grad = held;
    {
      Mirror m(&kCuda);
      EXPECT_NO_THROW(
          lossfuse::cross_entropy_backward_held(m(p.logits), m(p.target), m(f.lse), m(scale), p.options(), m(grad)));
      m.download();
    }
    for (std::int64_t c = 0; c < p.C; ++c) ASSERT_TRUE(std::isnan(grad.get(5 * p.C + c))) << "row 5, class " << c;
  }
}

}  // namespace
}  // namespace ce

namespace nll {
namespace {

class NllCuda : public ::testing::TestWithParam<Spec> {};
TEST_P(NllCuda, MatchesReference) { run_all(GetParam(), &kCuda); }
INSTANTIATE_TEST_SUITE_P(Options, NllCuda, ::testing::ValuesIn(option_specs()),
                         [](const auto& i) { return param_name(i); });
INSTANTIATE_TEST_SUITE_P(Layouts, NllCuda, ::testing::ValuesIn(layout_specs()),
                         [](const auto& i) { return param_name(i); });
INSTANTIATE_TEST_SUITE_P(TargetDtypes, NllCuda, ::testing::ValuesIn(target_specs()),
                         [](const auto& i) { return param_name(i); });
INSTANTIATE_TEST_SUITE_P(Edge, NllCuda, ::testing::ValuesIn(edge_specs()), [](const auto& i) { return param_name(i); });

// A bad class index is an index_error naming its position and value, forward and backward; nothing is written.
TEST(NllCudaErrors, BadTargetNamesPositionAndWritesNothing) {
  for (DType tdt : {DType::u8, DType::i32, DType::i64}) {
    Spec s;
    s.dt = DType::f32;
    s.red = Reduction::mean;
    s.tdt = tdt;
    s.shape = {40, 30};
    s.name = "bad_target";
    Problem p = build(s);
    p.target.set_int(17, tdt == DType::u8 ? 200 : -3);
    Tensor loss = Tensor::make(p.acc(), {}, Layout::contiguous, kSentinel);
    Tensor grad = Tensor::make(s.dt, s.shape, Layout::contiguous, kSentinel);
    const auto sentinel_loss = loss.storage, sentinel_grad = grad.storage;
    Mirror m(&kCuda);
    const TensorView input = m(p.input), target = m(p.target);
    for (int backward = 0; backward < 2; ++backward) {
      try {
        if (backward) {
          lossfuse::nll_backward(input, target, std::nullopt, p.options(), m(grad));
        } else {
          lossfuse::nll_forward(input, target, p.options(), m(loss));
        }
        ADD_FAILURE() << "no error for a bad target of dtype " << lossfuse::dtype_name(tdt);
      } catch (const lossfuse::Error& e) {
        EXPECT_EQ(e.code(), lossfuse::ErrorCode::index_error);
        EXPECT_NE(std::string(e.what()).find("at position [17]"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find(tdt == DType::u8 ? "200" : "-3"), std::string::npos) << e.what();
      }
    }
    m.download();
    EXPECT_TRUE(loss.storage == sentinel_loss) << "loss written despite the error";
    EXPECT_TRUE(grad.storage == sentinel_grad) << "gradient written despite the error";
  }
}

// A weighted 'mean' forward and backward captured into a CUDA graph (run_captured) or run under CudaCheck::nan
// (run_unchecked) give the eager calls' bits.
TEST(NllCudaGraph, CapturedCallsMatchEager) {
  Spec s;
  s.dt = DType::f32;
  s.red = Reduction::mean;
  s.shape = {300, 1000};
  s.weight = true;
  s.ignore_frac = 0.2;
  s.name = "graph";
  Problem p = build(s);
  auto bits = [&](RunAs how) {
    Tensor loss = Tensor::make(p.acc(), {}, Layout::contiguous, kSentinel);
    Tensor grad = Tensor::make(s.dt, s.shape, Layout::contiguous, kSentinel);
    Mirror m(&kCuda);
    NllOptions o = p.options();
    o.weight = m(p.weight);
    const TensorView input = m(p.input), target = m(p.target), l = m(loss), g = m(grad);
    const std::optional<TensorView> up = m(p.grad_loss);
    run_as(how, [&] {
      lossfuse::nll_forward(input, target, o, l);
      lossfuse::nll_backward(input, target, up, o, g);
    });
    m.download();
    std::vector<std::uint8_t> b = loss.storage;
    b.insert(b.end(), grad.storage.begin(), grad.storage.end());
    return b;
  };
  const auto eager = bits(RunAs::eager);
  EXPECT_TRUE(bits(RunAs::captured) == eager) << "the captured calls' bits differ from the eager calls'";
  EXPECT_TRUE(bits(RunAs::unchecked) == eager) << "the unchecked calls' bits differ from the eager calls'";
  // unchecked, a bad target is no error: the loss over it is NaN
  p.target.set_int(3, s.shape[1]);
  Tensor loss = Tensor::make(p.acc(), {}, Layout::contiguous, kSentinel);
  {
    Mirror m(&kCuda);
    NllOptions o = p.options();
    o.weight = m(p.weight);
    const TensorView input = m(p.input), target = m(p.target), l = m(loss);
    run_unchecked([&] { lossfuse::nll_forward(input, target, o, l); });
    m.download();
  }
  EXPECT_TRUE(std::isnan(loss.get(0))) << "a bad target under CudaCheck::nan";
}

}  // namespace
}  // namespace nll
}  // namespace lftest

int main(int argc, char** argv) { return lftest::run_cuda_tests(argc, argv); }
