// The eleven elementwise losses on CUDA tensors against the float64 reference: the CPU suite's spec tables
// (tests/cpu/pointwise_harness.hpp) run through device copies of every operand (tests/device_mirror.hpp), plus what
// only a device shows: a value check naming its element from device memory with nothing written, graph capture (no
// host synchronisation), and bitwise-repeatable reductions. The spec tables' run_all covers the fused entries too.
// Without a CUDA device every test is skipped (main exits 77).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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

// A spec of loss l's first configuration over (3, 40000), the upstream gradient absent (1).
Spec device_spec(PwLoss l, Reduction red) {
  Spec s;
  s.c = config_of(l, red, 0);
  s.red = red, s.shape = {3, 40000}, s.name = s.c.name + "_device";
  return s;
}

// The three entries of a problem through m on device copies: forward (loss), backward (grad_input, the upstream
// gradient absent) and fused (loss, grad_input); entry 0, 1, 2.
void call_entry(int entry, Mirror& m, Problem& p, Tensor& loss, Tensor& grad) {
  const PwArgs a = device_args(m, p);
  const PointwiseGrads g{m(grad), std::nullopt, std::nullopt};
  if (entry == 0) pw_forward(a, m(loss));
  if (entry == 1) pw_backward(a, std::nullopt, g);
  if (entry == 2) pw_forward_backward(a, m(loss), g);
}

// bce's input outside [0, 1] and gaussian_nll's negative var in device memory: invalid_value naming the element's
// position (core scans a host copy once the device's check has flagged the call), for every entry and reduction, and
// no output written.
TEST(PointwiseCudaErrors, ValueCheckNamesThePositionAndWritesNothing) {
  for (PwLoss l : {PwLoss::bce, PwLoss::gaussian_nll}) {
    for (Reduction red : {Reduction::none, Reduction::sum, Reduction::mean}) {
      for (int entry = 0; entry < 3; ++entry) {
        SCOPED_TRACE(std::string(l == PwLoss::bce ? "bce" : "gaussian_nll") + " entry " + std::to_string(entry) +
                     " reduction " + std::to_string(static_cast<int>(red)));
        Problem p = build(device_spec(l, red));
        if (l == PwLoss::bce) {
          p.x.store.set(1 * 40000 + 31234, 1.5);
        } else {
          p.z->store.set(1 * 40000 + 31234, -0.5);
        }
        Tensor loss = Tensor::make(DType::f32, red == Reduction::none ? p.s.shape : std::vector<std::int64_t>{},
                                   Layout::contiguous, kSentinel);
        Tensor grad = make_grad(p.s.dt, p.s.shape, Layout::contiguous);
        const auto loss0 = loss.storage, grad0 = grad.storage;
        Mirror m(&kCuda);
        try {
          call_entry(entry, m, p, loss, grad);
          ADD_FAILURE() << "no error for a bad value";
        } catch (const lossfuse::Error& e) {
          EXPECT_EQ(e.code(), lossfuse::ErrorCode::invalid_value);
          EXPECT_NE(std::string(e.what()).find("[1, 31234]"), std::string::npos) << e.what();
        }
        m.download();
        EXPECT_TRUE(loss.storage == loss0) << "loss written despite the error";
        EXPECT_TRUE(grad.storage == grad0) << "gradient written despite the error";
      }
    }
  }
}

// Forward, backward (a scalar upstream gradient in device memory) and the fused entry captured into a CUDA graph
// (run_captured) and replayed, or run under CudaCheck::nan (run_unchecked): no host synchronisation in any of them (the
// upstream scalar, the weights' sum, the loss and the value check stay on the device), and the eager calls' bits. A
// weighted 'mean' (mse), a checked 'sum' (bce) and a checked 'mean' (gaussian_nll), float32 and bfloat16. Neither way
// reads anything back, so a bad value makes every output NaN instead of an error.
TEST(PointwiseCudaGraph, CapturedCallsMatchEager) {
  for (PwLoss l : {PwLoss::mse, PwLoss::bce, PwLoss::gaussian_nll}) {
    for (DType dt : {DType::f32, DType::bf16}) {
      for (bool bad : {false, true}) {
        if (bad && l == PwLoss::mse) continue;  // no value check
        Spec s = device_spec(l, l == PwLoss::bce ? Reduction::sum : Reduction::mean);
        s.dt = dt, s.shape = {5, 20011}, s.weight = true, s.up = Up::scalar, s.up_scalar = -0.75;
        SCOPED_TRACE(s.c.name + " " + std::string(lossfuse::dtype_name(dt)) + (bad ? " bad" : ""));
        Problem p = build(s);
        if (bad && l == PwLoss::bce) p.x.store.set(77, -0.25);
        if (bad && l == PwLoss::gaussian_nll) p.z->store.set(77, -0.25);
        auto run = [&](RunAs how) {
          std::vector<Tensor> t = {
              Tensor::make(p.acc(), {}, Layout::contiguous, kSentinel), make_grad(dt, s.shape, Layout::contiguous),
              Tensor::make(p.acc(), {}, Layout::contiguous, kSentinel), make_grad(dt, s.shape, Layout::contiguous)};
          Mirror m(&kCuda);
          const PwArgs a = device_args(m, p);
          const TensorView loss = m(t[0]), grad = m(t[1]), fused_loss = m(t[2]), fused_grad = m(t[3]);
          TensorView up = p.up->view;
          const TensorView d = m(p.up->store);
          up.data = d.data, up.device = d.device;
          run_as(how, [&] {
            pw_forward(a, loss);
            pw_backward(a, up, PointwiseGrads{grad, std::nullopt, std::nullopt});
            pw_forward_backward(a, fused_loss, PointwiseGrads{fused_grad, std::nullopt, std::nullopt});
          });
          m.download();
          return t;
        };
        const std::vector<Tensor> eager = bad ? std::vector<Tensor>{} : run(RunAs::eager);
        for (RunAs how : {RunAs::captured, RunAs::unchecked}) {
          const std::vector<Tensor> got = run(how);
          for (std::size_t i = 0; i < got.size(); ++i) {
            if (bad) {
              const std::vector<double> v = got[i].values();
              EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](double x) { return std::isnan(x); }))
                  << "a bad value, " << run_name(how) << ", leaves output " << i << " not NaN";
            } else {
              EXPECT_TRUE(got[i].storage == eager[i].storage)
                  << "output " << i << ": " << run_name(how) << " bits differ";
            }
          }
        }
      }
    }
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
