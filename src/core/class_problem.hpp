// Checks and layout shared by the losses over a class dim (cross-entropy, NLL): input (C), (N, C) or
// (N, C, d1..dk) with the class dim 1 (0 when unbatched), a target per row or a probability per element,
// optional class weights, the reduced outputs and the gradient. Written once, used by every backend.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "core/check.hpp"
#include "core/cross_entropy_params.hpp"
#include "lossfuse/loss_kind.hpp"
#include "lossfuse/tensor.hpp"

namespace lossfuse::core {

struct ClassProblem {
  int class_dim = 0;
  std::int64_t classes = 0, rows = 0;
  std::int64_t row_shape[kMaxDims] = {};
  int row_ndim = 0;
  bool soft = false;
  DType acc = DType::f32;
  Device device = Device::cpu;  // the input's: every other view must live there too
};

// Input, target and reduction. allow_soft: a floating target of the input's shape means probabilities.
ClassProblem check_class_problem(const TensorView& input, std::string_view input_name, const TensorView& target,
                                 Reduction reduction, bool allow_soft);

// The gradient output: shape and dtype of the input, no overlap with it unless in_place, where it must be the
// input's own buffer and strides.
void check_grad_output(const TensorView& grad, std::string_view grad_name, const TensorView& input,
                       std::string_view input_name, bool in_place);

// The upstream gradient: Acc dtype, the forward loss's shape (any strides).
void check_grad_loss(const std::optional<TensorView>& grad_loss, const ClassProblem& pb, Reduction reduction);

// A row-shaped Acc-typed contiguous output or saved state (lse).
void check_row_output(const TensorView& t, std::string_view name, const ClassProblem& pb);
// A per-row log-sum-exp view: as check_row_output, but float64 is accepted for any logits dtype.
void check_lse_view(const TensorView& t, const ClassProblem& pb);
// Its dtype alone: the accumulation dtype or float64.
void check_lse_dtype(const TensorView& t, const ClassProblem& pb);

// Every pair of (name, view) in `written` is disjoint, each is disjoint from every view in `read`, and no view in
// `written` repeats an element (check_no_self_overlap).
struct NamedView {
  std::string_view name;
  const TensorView* view;
};
void check_disjoint(const std::vector<NamedView>& written, const std::vector<NamedView>& read);

// Fills the layout fields of p: rows, classes, strides, row index for input and target (and grad, grad_loss).
void fill_layout(CeParams& p, const ClassProblem& pb, const TensorView& input, const TensorView& target,
                 const TensorView* grad, const std::optional<TensorView>& grad_loss);

// Reads a one-element Acc-typed (float32 / float64) tensor, on any device with a backend.
double read_scalar(const TensorView& t);

// The upstream gradient in p: a per-row pointer for reduction none, else one scale (1 when absent) with
// 1/denominator folded in for mean.
void set_grad_scale(CeParams& p, Reduction reduction, const std::optional<TensorView>& grad_loss, double denominator);

// The class weights of core's host steps: load_weights on the CPU; on a device, whose backend reads them itself
// (CeDeviceCall), checked (check_weights) and left there: empty.
template <class Acc>
std::vector<Acc> host_class_weights(const std::optional<TensorView>& weight, const ClassProblem& pb) {
  if (pb.device == Device::cpu) return load_weights<Acc>(weight, pb.classes, pb.device);
  check_weights(weight, pb.classes, pb.device);
  return {};
}

// A device backend's call (CeDeviceCall) from the class weights, the reduction, the upstream scalar (mean / sum) and
// the reduced outputs (loss, z_loss: nullptr when not wanted; used for mean / sum).
CeDeviceCall make_device_call(const std::optional<TensorView>& weight, Reduction reduction, bool split_mean,
                              const std::optional<TensorView>& grad_loss, const TensorView* loss,
                              const TensorView* z_loss);

// Runs `entry` on p with make_device_call's call (p.grad_loss: the per-row upstream pointer for none; held: see
// CeDeviceCall::held) and throws the index_error of a bad target it found.
void run_device_call(CeParams& p, void (*entry)(const CeParams&), const std::optional<TensorView>& weight,
                     Reduction reduction, bool split_mean, const std::optional<TensorView>& grad_loss,
                     const TensorView* loss, const TensorView* z_loss, bool held = false);

// Reductions mean/sum: sums the block partials in block order (a fixed order) and divides by `denominator`
// for mean; writes the result to a one-element Acc-typed output (on any device with a backend).
void write_reduced(const TensorView& out, const std::vector<double>& blocks, Reduction reduction, double denominator);

}  // namespace lossfuse::core
