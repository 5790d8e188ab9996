// multilabel_margin entries: checks (every one before any write, every target value scanned first), plain
// params, the backend's kernel, the reduction.
#include <algorithm>
#include <atomic>

#include "core/backend.hpp"
#include "core/margin_problem.hpp"
#include "core/targets.hpp"
#include "lossfuse/margin.hpp"
#include "lossfuse/parallel.hpp"

namespace lossfuse {
namespace {

// Whether every target value of every row lies in [-1, C).
template <class I>
bool rows_in_range(const core::MarginParams& p, const I* t, std::int64_t C) {
  const std::int64_t st = p.inner[core::kMvTarget];
  std::atomic<bool> ok{true};
  parallel_for(0, p.rows, std::max<std::int64_t>(1, 65536 / std::max<std::int64_t>(1, C)),
               [&](std::int64_t r0, std::int64_t r1) {
                 bool bad = false;
                 for (std::int64_t r = r0; r < r1 && !bad; ++r) {
                   const I* row = t + p.index.offset(core::kMvTarget, r);
                   for (std::int64_t c = 0; c < C; ++c) {
                     const auto v = static_cast<std::int64_t>(row[c * st]);
                     bad |= (v < -1) | (v >= C);
                   }
                 }
                 if (bad) ok.store(false, std::memory_order_relaxed);
               });
  return ok.load();
}

bool targets_in_range(const core::MarginParams& p, DType dtype, std::int64_t C) {
  switch (dtype) {
    case DType::u8: return rows_in_range(p, static_cast<const std::uint8_t*>(p.target), C);
    case DType::i8: return rows_in_range(p, static_cast<const std::int8_t*>(p.target), C);
    case DType::i16: return rows_in_range(p, static_cast<const std::int16_t*>(p.target), C);
    case DType::i32: return rows_in_range(p, static_cast<const std::int32_t*>(p.target), C);
    case DType::i64: return rows_in_range(p, static_cast<const std::int64_t*>(p.target), C);
    default: return false;
  }
}

void run(bool backward, const TensorView& input, const TensorView& target, const MultilabelMarginOptions& o,
         const TensorView* loss, const std::optional<TensorView>& grad_loss, const TensorView* grad) {
  const core::Backend& be = core::backend_for(input, "input");
  core::check_reduction(o.reduction);
  core::check_view(input, "input", input.device);
  core::check_floating(input, "input");
  core::check_input_ndim(input, "input", 1, 2, "shape (N, C) or (C)");
  const std::int64_t C = input.shape[input.ndim - 1];
  if (C < 1) {
    throw Error(ErrorCode::shape_mismatch, "input", "at least one class in the last dim",
                "shape " + input.shape_string());
  }
  core::check_view(target, "target", input.device);
  if (!is_integer(target.dtype)) {
    throw Error(ErrorCode::dtype_mismatch, "target", "class indices of an integer dtype",
                std::string(dtype_name(target.dtype)));
  }
  core::check_shape(target, "target", input.shape.data(), input.ndim);
  const DType acc = accumulate_dtype(input.dtype);
  const int row_ndim = input.ndim - 1;
  core::check_margin_outputs(backward, acc, o.reduction, input.shape.data(), row_ndim, loss, grad_loss,
                             {{"grad_input", grad}}, input, {{"input", &input}, {"target", &target}});

  core::MarginParams p;
  core::MarginDeviceCall call;
  core::start_margin_call(p, call, input.device);
  p.backward = backward;
  core::set_margin_rows(p, input);
  p.x[0] = input.data, p.target = target.data, p.target_dtype = target.dtype;
  core::set_margin_view(p, core::kMvX0, input, true);
  core::set_margin_view(p, core::kMvTarget, target, true);
  // torch checks every value, also past the terminating -1: all must lie in [-1, C). On the CPU rows are tested over
  // threads in typed, branch-free loops; only when one fails is the first bad value looked up, in row order. A device
  // call scans on its device.
  auto bad_target = [&](std::int64_t r, std::int64_t c, std::int64_t t) {
    const std::string pos = input.ndim == 2 ? std::to_string(r) + ", " + std::to_string(c) : std::to_string(c);
    return Error(ErrorCode::index_error, "target",
                 "class indices in [0, " + std::to_string(C) + ") or -1 (ends the label list)",
                 std::to_string(t) + " at position [" + pos + "]");
  };
  if (p.device_call != nullptr) {
    call.check = core::MarginCheck::label_list;
  } else if (!targets_in_range(p, target.dtype, C)) {
    for (std::int64_t r = 0; r < p.rows; ++r) {
      const std::int64_t off = p.index.offset(core::kMvTarget, r);
      for (std::int64_t c = 0; c < C; ++c) {
        const std::int64_t t = core::read_target(p.target, target.dtype, off + c * p.inner[core::kMvTarget]);
        if (t < -1 || t >= C) throw bad_target(r, c, t);
      }
    }
  }
  core::run_class_target_call(p, backward, loss, o.reduction, grad_loss, grad, be.multilabel_margin);
  if (call.bad_row >= 0) throw bad_target(call.bad_row, call.bad_col, call.bad_value);
}

}  // namespace

void multilabel_margin_forward(const TensorView& input, const TensorView& target,
                               const MultilabelMarginOptions& options, const TensorView& loss) {
  run(false, input, target, options, &loss, std::nullopt, nullptr);
}

void multilabel_margin_backward(const TensorView& input, const TensorView& target,
                                const std::optional<TensorView>& grad_loss, const MultilabelMarginOptions& options,
                                const std::optional<TensorView>& grad_input) {
  run(true, input, target, options, nullptr, grad_loss, grad_input ? &*grad_input : nullptr);
}

}  // namespace lossfuse
