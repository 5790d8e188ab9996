// Fused linear + cross-entropy as torch ops, and the GEMM hook that runs lossfuse's products on torch's own
// matmul (no second BLAS in a torch process). The hook serves CPU tensors; on CUDA the runner's products go to
// cuBLAS (the one torch loaded), on torch's current stream.
#include <algorithm>
#include <vector>

#include "binding.hpp"
#include "lossfuse/gemm.hpp"
#include "lossfuse/linear_cross_entropy.hpp"

namespace lossfuse::torch_binding {
namespace {

at::ScalarType scalar_type(DType t) {
  switch (t) {
    case DType::f64: return at::kDouble;
    case DType::bf16: return at::kBFloat16;
    case DType::f16: return at::kHalf;
    default: return at::kFloat;
  }
}

// op(M) as a (rows x cols) strided view over a row-major buffer with leading dimension ld.
at::Tensor operand(const void* p, DType t, bool trans, std::int64_t rows, std::int64_t cols, std::int64_t ld) {
  const auto opts = at::TensorOptions().dtype(scalar_type(t));
  const std::vector<std::int64_t> strides = trans ? std::vector<std::int64_t>{1, ld} : std::vector<std::int64_t>{ld, 1};
  return at::from_blob(const_cast<void*>(p), {rows, cols}, strides, opts);
}

// C = alpha op(A) op(B) + beta C. float32/float64 operands multiply straight into C. 16-bit operands: torch's CPU
// matmul has no float32-output variant, so the product is formed in the operands' dtype (as torch's own 16-bit
// linear layers do) over blocks of C's rows, each block then added into C in float32; the temporary stays under
// 4M elements (8 MB) whatever the call's size.
//
// float32/float64 products of few rows against a transposed B of many columns (a chunk of rows times W^T: the
// fused loss's logits) go out in blocks of kColumnBlock columns. torch's BLAS on x86 (MKL) runs such a call far
// below its rate on the same work in blocks whose rows of W stay in the last-level cache: 128 x 2304 x 64000
// float32 on 2 Zen 4 cores, 87-112 against 159-166 GFLOP/s; 256 rows 142 against 169. (oneDNN, lossfuse's
// standalone GEMM, is the other way round, so the split lives here, not in the core.)
constexpr std::int64_t kColumnBlock = 512;
constexpr std::int64_t kFewRows = 1024;

bool torch_gemm(const GemmCall& g, void*) noexcept {
  try {
    const DType cdt = g.ab_dtype == DType::f64 ? DType::f64 : DType::f32;
    const at::Tensor A = operand(g.a, g.ab_dtype, g.trans_a, g.m, g.k, g.lda);
    const at::Tensor B = operand(g.b, g.ab_dtype, g.trans_b, g.k, g.n, g.ldb);
    at::Tensor C = operand(g.c, cdt, false, g.m, g.n, g.ldc);
    if (g.ab_dtype == DType::f32 || g.ab_dtype == DType::f64) {
      const bool split = g.trans_b && g.m <= kFewRows && g.n >= 2 * kColumnBlock;
      const std::int64_t block = split ? kColumnBlock : std::max<std::int64_t>(g.n, 1);
      for (std::int64_t j0 = 0; j0 < g.n; j0 += block) {
        const std::int64_t j1 = std::min(g.n, j0 + block);
        at::Tensor c = split ? C.slice(1, j0, j1) : C;
        const at::Tensor b = split ? B.slice(1, j0, j1) : B;
        if (g.beta == 0.0 && g.alpha == 1.0) {
          at::mm_out(c, A, b);
        } else {
          at::addmm_out(c, c, A, b, g.beta, g.alpha);
        }
      }
      return true;
    }
    const std::int64_t block = std::max<std::int64_t>(1, (std::int64_t{1} << 22) / std::max<std::int64_t>(g.n, 1));
    for (std::int64_t i0 = 0; i0 < g.m; i0 += block) {
      const std::int64_t i1 = std::min(g.m, i0 + block);
      const at::Tensor prod = at::mm(A.slice(0, i0, i1), B);
      at::Tensor c = C.slice(0, i0, i1);
      if (g.beta == 0.0) {
        c.copy_(prod);
        if (g.alpha != 1.0) c.mul_(g.alpha);
      } else {
        if (g.beta != 1.0) c.mul_(g.beta);
        c.add_(prod, g.alpha);
      }
    }
    return true;
  } catch (...) {
    return false;
  }
}

const bool g_gemm_hook_installed = [] {
  set_gemm_hook(&torch_gemm);
  return true;
}();

LinearCrossEntropyOptions lce_options(const std::optional<at::Tensor>& class_weight, std::int64_t red,
                                      std::int64_t ignore_index, double label_smoothing, double logit_scale,
                                      double softcap, double z_loss_scale, std::int64_t chunk_rows,
                                      std::int64_t memory_budget, std::int64_t vocab_tile, double grad_filter) {
  LinearCrossEntropyOptions o;
  o.ce.reduction = reduction(red);
  o.ce.ignore_index = ignore_index;
  o.ce.label_smoothing = label_smoothing;
  o.ce.weight = view(class_weight, "weight");
  o.ce.logit_scale = logit_scale;
  o.ce.softcap = softcap;
  o.ce.z_loss_scale = z_loss_scale;
  o.chunk_rows = chunk_rows;
  o.memory_budget = memory_budget;
  o.vocab_tile = vocab_tile;
  o.grad_filter = grad_filter;
  return o;
}

LinearCrossEntropyGrads grad_views(const at::Tensor& gx, const at::Tensor& gw, const at::Tensor& gb,
                                   const c10::List<bool>& mask) {
  return {grad_view(gx, mask[0], "grad_input"), grad_view(gw, mask[1], "grad_linear_weight"),
          grad_view(gb, mask[2], "grad_linear_bias")};
}

at::Tensor new_bias_grad(const std::optional<at::Tensor>& bias, const at::Tensor& input, bool wanted) {
  return wanted && bias.has_value() ? new_grad(*bias, true) : new_grad(input, false);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> linear_cross_entropy(
    const at::Tensor& input, const at::Tensor& linear_weight, const at::Tensor& target,
    const std::optional<at::Tensor>& linear_bias, const std::optional<at::Tensor>& weight, std::int64_t red,
    std::int64_t ignore_index, double label_smoothing, double logit_scale, double softcap, double z_loss_scale,
    std::int64_t chunk_rows, std::int64_t memory_budget, std::int64_t vocab_tile, double grad_filter,
    c10::List<bool> grad_mask) {
  const std::int64_t N = input.dim() >= 1 ? input.size(0) : 0;
  at::Tensor loss = new_loss(input, {N}, red);
  at::Tensor lse = new_lse(input, {N});
  at::Tensor z_loss = new_loss(input, {N}, red);
  at::Tensor gx = new_grad(input, grad_mask[0]);
  at::Tensor gw = new_grad(linear_weight, grad_mask[1]);
  at::Tensor gb = new_bias_grad(linear_bias, input, grad_mask[2]);
  guarded_on(input, [&] {
    const auto o = lce_options(weight, red, ignore_index, label_smoothing, logit_scale, softcap, z_loss_scale,
                               chunk_rows, memory_budget, vocab_tile, grad_filter);
    linear_cross_entropy_forward(view(input, "input"), view(linear_weight, "linear_weight"),
                                 view(linear_bias, "linear_bias"), view(target, "target"), o,
                                 CrossEntropyOutputs{view(loss, "loss"), view(lse, "lse"), view(z_loss, "z_loss")},
                                 grad_views(gx, gw, gb, grad_mask));
  });
  return {loss, lse, z_loss, gx, gw, gb};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> linear_cross_entropy_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& linear_weight, const at::Tensor& target,
    const at::Tensor& lse, const std::optional<at::Tensor>& linear_bias, const std::optional<at::Tensor>& weight,
    std::int64_t red, std::int64_t ignore_index, double label_smoothing, double logit_scale, double softcap,
    double z_loss_scale, std::int64_t chunk_rows, std::int64_t memory_budget, std::int64_t vocab_tile,
    double grad_filter, c10::List<bool> grad_mask) {
  const BackwardChecks checked;
  at::Tensor gx = new_grad(input, grad_mask[0]);
  at::Tensor gw = new_grad(linear_weight, grad_mask[1]);
  at::Tensor gb = new_bias_grad(linear_bias, input, grad_mask[2]);
  guarded_on(input, [&] {
    const auto o = lce_options(weight, red, ignore_index, label_smoothing, logit_scale, softcap, z_loss_scale,
                               chunk_rows, memory_budget, vocab_tile, grad_filter);
    lossfuse::linear_cross_entropy_backward(view(input, "input"), view(linear_weight, "linear_weight"),
                                            view(linear_bias, "linear_bias"), view(target, "target"), view(lse, "lse"),
                                            view(grad_output, "grad_output"), o, grad_views(gx, gw, gb, grad_mask));
  });
  return {gx, gw, gb};
}

// The autograd road's hand-over (Python's linear_cross_entropy backward): the gradients the forward made for an
// upstream gradient of 1 brought in place to grad_output (linear_cross_entropy_scale_held: nothing is read back).
void linear_cross_entropy_scale_held_op(const std::optional<at::Tensor>& gx, const std::optional<at::Tensor>& gw,
                                        const std::optional<at::Tensor>& gb, const at::Tensor& grad_output,
                                        const at::Tensor& target, std::int64_t red, std::int64_t ignore_index) {
  const std::optional<at::Tensor>& first = gx ? gx : gw ? gw : gb;
  if (!first) return;
  const at::Tensor up = acc_grad_output(grad_output, *first);
  guarded_on(*first, [&] {
    LinearCrossEntropyOptions o;
    o.ce.reduction = reduction(red);
    o.ce.ignore_index = ignore_index;
    linear_cross_entropy_scale_held(
        {view(gx, "grad_input"), view(gw, "grad_linear_weight"), view(gb, "grad_linear_bias")}, view(target, "target"),
        o, view(up, "grad_output"));
  });
}

}  // namespace
}  // namespace lossfuse::torch_binding

TORCH_LIBRARY_FRAGMENT(lossfuse, m) {
  // Internal: the chunked strategy's held gradients brought to grad_output in place (nothing is read back).
  m.def(
      "_linear_cross_entropy_scale_held_(Tensor(a!)? grad_input, Tensor(b!)? grad_linear_weight, "
      "Tensor(c!)? grad_linear_bias, Tensor grad_output, Tensor target, int reduction, int ignore_index) -> ()");
  m.def(
      "linear_cross_entropy(Tensor input, Tensor linear_weight, Tensor target, Tensor? linear_bias, Tensor? weight, "
      "int reduction, int ignore_index, float label_smoothing, float logit_scale, float softcap, float z_loss_scale, "
      "int chunk_rows, int memory_budget, int vocab_tile, float grad_filter, bool[3] grad_mask) -> (Tensor loss, "
      "Tensor lse, Tensor z_loss, Tensor grad_input, Tensor grad_linear_weight, Tensor grad_linear_bias)");
  m.def(
      "linear_cross_entropy_backward(Tensor grad_output, Tensor input, Tensor linear_weight, Tensor target, "
      "Tensor lse, Tensor? linear_bias, Tensor? weight, int reduction, int ignore_index, float label_smoothing, "
      "float logit_scale, float softcap, float z_loss_scale, int chunk_rows, int memory_budget, int vocab_tile, "
      "float grad_filter, bool[3] grad_mask) "
      "-> (Tensor, Tensor, Tensor)");
}

namespace lossfuse::torch_binding {
namespace {

void register_kernels(torch::Library& m) {
  m.impl("linear_cross_entropy", &linear_cross_entropy);
  m.impl("linear_cross_entropy_backward", &linear_cross_entropy_backward);
  m.impl("_linear_cross_entropy_scale_held_", &linear_cross_entropy_scale_held_op);
}

}  // namespace
}  // namespace lossfuse::torch_binding

LOSSFUSE_DEVICE_KERNELS(lossfuse::torch_binding::register_kernels)
