// Cross-entropy of a small batch through an installed lossfuse, forward and backward in one pass, checked against
// the formula in double: loss = mean_r (log sum_c exp(z_rc) - z_r,y_r), d loss / d z_rc = (softmax_rc - [c = y_r]) / N.
// Exits 1 when a value is off by more than 1e-5, 2 when lossfuse raises.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <lossfuse/lossfuse.hpp>
#include <vector>

int main() {
  using namespace lossfuse;
  constexpr std::int64_t N = 4, C = 5;
  std::vector<float> logits(N * C), grad(N * C);
  for (std::int64_t i = 0; i < N * C; ++i) logits[i] = std::sin(0.7f * static_cast<float>(i));
  std::vector<std::int64_t> target = {0, 3, 4, 1};
  float loss = 0;
  try {
    const CrossEntropyOutputs out{TensorView::contiguous(&loss, DType::f32, {}), std::nullopt, std::nullopt};
    cross_entropy_forward_backward(TensorView::contiguous(logits.data(), DType::f32, {N, C}),
                                   TensorView::contiguous(target.data(), DType::i64, {N}), CrossEntropyOptions{}, out,
                                   std::nullopt, TensorView::contiguous(grad.data(), DType::f32, {N, C}));
  } catch (const Error& e) {
    std::fprintf(stderr, "lossfuse: %s\n", e.what());
    return 2;
  }
  double want = 0, worst = 0;
  for (std::int64_t r = 0; r < N; ++r) {
    double s = 0;
    for (std::int64_t c = 0; c < C; ++c) s += std::exp(static_cast<double>(logits[r * C + c]));
    want += (std::log(s) - logits[r * C + target[r]]) / N;
    for (std::int64_t c = 0; c < C; ++c) {
      const double g = (std::exp(static_cast<double>(logits[r * C + c])) / s - (c == target[r] ? 1.0 : 0.0)) / N;
      worst = std::fmax(worst, std::fabs(g - grad[r * C + c]));
    }
  }
  worst = std::fmax(worst, std::fabs(want - loss));
  std::printf("cross_entropy: loss %.7f (formula %.7f), largest difference %.2e\n", loss, want, worst);
  return worst <= 1e-5 ? 0 : 1;
}
