// lossfuse's PyTorch binding: conversions from at::Tensor to lossfuse views, lossfuse errors turned into the
// exceptions torch raises (ValueError, IndexError, RuntimeError), and new outputs allocated with torch.
#pragma once

#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <utility>

#include "device.hpp"
#include "lossfuse/device.hpp"
#include "lossfuse/error.hpp"
#include "lossfuse/loss_kind.hpp"
#include "lossfuse/tensor.hpp"

// Registers a file's device kernels, `register_fn(torch::Library&)`, for every device this build serves: the CPU, and
// CUDA with the CUDA route (device.hpp). The one place that says which dispatch keys get kernels.
#if defined(LOSSFUSE_TORCH_CUDA)
#define LOSSFUSE_DEVICE_KERNELS(register_fn)               \
  TORCH_LIBRARY_IMPL(lossfuse, CPU, m) { register_fn(m); } \
  TORCH_LIBRARY_IMPL(lossfuse, CUDA, m) { register_fn(m); }
#else
#define LOSSFUSE_DEVICE_KERNELS(register_fn) \
  TORCH_LIBRARY_IMPL(lossfuse, CPU, m) { register_fn(m); }
#endif

namespace lossfuse::torch_binding {

// A view of a CPU tensor (or a CUDA one, in a build with the CUDA route: device.hpp) of a dtype lossfuse knows, with
// at most kMaxDims dims; else a ValueError/RuntimeError naming `arg`.
TensorView view(const at::Tensor& t, const char* arg);
std::optional<TensorView> view(const std::optional<at::Tensor>& t, const char* arg);

// torch's reduction enum (0 none, 1 mean, 2 sum).
Reduction reduction(std::int64_t r);

// float32 for 16-bit and float32 inputs, float64 for float64: the dtype lossfuse stores losses in.
at::ScalarType acc_type(const at::Tensor& input);
at::Tensor new_acc(const at::Tensor& input, at::IntArrayRef shape);
// A saved per-row log-sum-exp, float64 for every logits dtype: the kernels write max + log-sum summed in double, so a
// gradient made from it later keeps the forward's precision (a relative error up to 1.1e-16 |lse| per probability,
// below float32's rounding for |lse| < 5e8) however large the logits' common offset.
at::Tensor new_lse(const at::Tensor& logits, at::IntArrayRef rows);
// The loss of `input` for a reduction: `rows` for none, else a 0-d tensor.
at::Tensor new_loss(const at::Tensor& input, at::IntArrayRef rows, std::int64_t reduction);
// A contiguous tensor of `like`'s shape and dtype, or an empty one when `wanted` is false (a gradient no one
// asked for). Every new output is on its input's device (CPU: the large-block allocator; CUDA: torch's).
at::Tensor new_grad(const at::Tensor& like, bool wanted);
inline std::optional<TensorView> grad_view(const at::Tensor& g, bool wanted, const char* arg) {
  return wanted ? std::optional<TensorView>(view(g, arg)) : std::nullopt;
}

// The upstream gradient in the loss's (accumulation) dtype, which the kernels read; converted only when a caller
// (opcheck, a user calling an op directly) passes another dtype.
at::Tensor acc_grad_output(const at::Tensor& grad_output, const at::Tensor& input);

// The view of a new contiguous output. An empty one gets row-major strides (products of the sizes) instead of
// torch's, which skip 0-size dims (torch gives (5, 0, 7) the strides (7, 7, 1)): nothing is stored through it.
TensorView output_view(const at::Tensor& t, const char* arg);

[[noreturn]] void rethrow(const Error& e);

// Runs f, turning a lossfuse::Error into torch's exception of the same kind.
template <class F>
decltype(auto) guarded(F&& f) {
  try {
    return std::forward<F>(f)();
  } catch (const Error& e) {
    rethrow(e);
  }
}

// guarded, run on `t`'s device (DeviceCall: on CUDA, torch's current stream there).
template <class F>
decltype(auto) guarded_on(const at::Tensor& t, F&& f) {
  const DeviceCall call(t);
  return guarded(std::forward<F>(f));
}

// For the scope of a backward op: the forward checked the inputs the two share (class targets, lengths, values), and
// autograd refuses any changed in place since (saved-tensor versions), so a CUDA call reads no check back again
// (CudaCheck::nan). The backward ops are autograd's: called directly with values no forward checked, a bad one makes
// its outputs NaN on CUDA (the CPU still raises). Tests: test_cuda.py::test_backward_reads_nothing_back.
class BackwardChecks {
 public:
  BackwardChecks() noexcept : scope_(CudaCheck::nan) {}

 private:
  CudaCheckScope scope_;
};

// An elementwise loss's forward: runs `kernel(loss_view)` on a new loss (the input's shape for 'none', else 0-d),
// lossfuse errors turned into torch's.
template <class Kernel>
at::Tensor run_forward(const at::Tensor& input, std::int64_t red, Kernel&& kernel) {
  at::Tensor loss = new_loss(input, input.sizes(), red);
  guarded_on(input, [&] { kernel(output_view(loss, "loss")); });
  return loss;
}

}  // namespace lossfuse::torch_binding
