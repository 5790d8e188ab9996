// The eleven elementwise losses on CUDA tensors against the float64 reference: the CPU suite's spec tables
// (tests/cpu/pointwise_harness.hpp) run through device copies of every operand (tests/device_mirror.hpp), plus what
// only a device shows: a value check naming its element from device memory with nothing written, and bitwise-repeatable
// reductions. The spec tables' run_all covers the fused entries too. Without a CUDA device every test is skipped (main
// exits 77).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cpu/pointwise_harness.hpp"
#include "cuda/cuda_memory.hpp"

namespace lftest::pointwise {
namespace {

class PointwiseCuda : public ::testing::TestWithParam<Spec> {};
TEST_P(PointwiseCuda, MatchesReference) { run_all(GetParam(), &kCuda); }

auto spec_name = [](const auto& i) { return i.param.name; };
INSTANTIATE_TEST_SUITE_P(Options, PointwiseCuda, ::testing::ValuesIn(option_specs()), spec_name);
INSTANTIATE_TEST_SUITE_P(Configs, PointwiseCuda, ::testing::ValuesIn(config_specs()), spec_name);
INSTANTIATE_TEST_SUITE_P(Large, PointwiseCuda, ::testing::ValuesIn(large_specs()), spec_name);
INSTANTIATE_TEST_SUITE_P(Layouts, PointwiseCuda, ::testing::ValuesIn(layout_specs()), spec_name);
INSTANTIATE_TEST_SUITE_P(Edge, PointwiseCuda, ::testing::ValuesIn(edge_specs()), spec_name);
INSTANTIATE_TEST_SUITE_P(NonFinite, PointwiseCuda, ::testing::ValuesIn(non_finite_specs()), spec_name);

Spec bce_spec(Reduction red) {
  Spec s;
  for (const Config& c : configs())
    if (c.loss == PwLoss::bce) s.c = c;
  s.red = red, s.shape = {3, 40000}, s.name = "bce_device";
  return s;
}

// bce's input outside [0, 1] in device memory: invalid_value naming the element's position (core scans a host copy,
// or the reduced forward's kernel flags its tile), and no output written.
TEST(PointwiseCudaErrors, ValueCheckNamesThePositionAndWritesNothing) {
  for (Reduction red : {Reduction::none, Reduction::sum}) {
    Problem p = build(bce_spec(red));
    p.x.store.set(1 * 40000 + 31234, 1.5);
    Tensor loss = Tensor::make(DType::f32, red == Reduction::none ? p.s.shape : std::vector<std::int64_t>{},
                               Layout::contiguous, kSentinel);
    const auto before = loss.storage;
    Mirror m(&kCuda);
    try {
      pw_forward(device_args(m, p), m(loss));
      ADD_FAILURE() << "no error for an input of 1.5";
    } catch (const lossfuse::Error& e) {
      EXPECT_EQ(e.code(), lossfuse::ErrorCode::invalid_value);
      EXPECT_NE(std::string(e.what()).find("[1, 31234]"), std::string::npos) << e.what();
    }
    m.download();
    EXPECT_TRUE(loss.storage == before) << "loss written despite the error";
  }
}

// The same reduced calls twice (forward, backward, fused) give the same bits (a fixed tree per tile, tiles summed on
// the host in order).
TEST(PointwiseCudaDeterminism, BitwiseAcrossRuns) {
  for (const Config& c : configs()) {
    Spec s;
    s.c = c, s.red = Reduction::mean, s.shape = {7, 40009}, s.weight = true, s.name = c.name;
    Problem p = build(s);
    std::vector<std::vector<std::uint8_t>> runs;
    for (int i = 0; i < 2; ++i) {
      Tensor loss = Tensor::make(DType::f32, {}), fused_loss = Tensor::make(DType::f32, {});
      Tensor grad = make_grad(s.dt, s.shape, Layout::contiguous);
      Tensor fused_grad = make_grad(s.dt, s.shape, Layout::contiguous);
      Mirror m(&kCuda);
      const PwArgs a = device_args(m, p);
      pw_forward(a, m(loss));
      pw_backward(a, std::nullopt, {m(grad), std::nullopt, std::nullopt});
      pw_forward_backward(a, m(fused_loss), {m(fused_grad), std::nullopt, std::nullopt});
      m.download();
      std::vector<std::uint8_t> bits = loss.storage;
      for (const Tensor* t : {&grad, &fused_loss, &fused_grad})
        bits.insert(bits.end(), t->storage.begin(), t->storage.end());
      runs.push_back(bits);
    }
    EXPECT_TRUE(runs[0] == runs[1]) << c.name;
  }
}

}  // namespace
}  // namespace lftest::pointwise

int main(int argc, char** argv) { return lftest::run_cuda_tests(argc, argv); }
