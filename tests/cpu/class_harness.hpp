// lossfuse tests: what the class-target harnesses (ce_harness.hpp: cross_entropy; nll_harness.hpp: nll) share: the
// spec fields both take, and drawing the class targets, the class weights and the upstream gradient into tensors and
// into the float64 reference's input (lfref::CeInput or lfref::NllInput, which name these fields alike).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace lftest {

enum class Up { absent, scalar, per_row };

// Per-row upstream gradients for 'none', a scalar for the others (absent for some, to test the default 1).
inline Up default_up(Reduction r, std::uint64_t k) {
  if (r == Reduction::none) return k % 3 == 0 ? Up::absent : Up::per_row;
  return k % 2 == 0 ? Up::scalar : Up::absent;
}

// Edits the generated (rows, C) inputs and class targets before they are stored (adversarial values).
using RowsEdit =
    std::function<void(Rng&, std::int64_t R, std::int64_t C, std::vector<double>& x, std::vector<std::int64_t>& t)>;

struct ClassSpec {
  std::string name;
  DType dt = DType::f32;     // the input (logits, log-probabilities)
  DType tdt = DType::i64;    // class targets
  std::optional<DType> wdt;  // the class weights' dtype (default: the input's)
  std::vector<std::int64_t> shape;
  Layout layout = Layout::contiguous, grad_layout = Layout::contiguous;
  Reduction red = Reduction::mean;
  bool weight = false;
  std::int64_t ignore_index = -100;
  double ignore_frac = 0;         // fraction of rows whose target is ignore_index
  std::int64_t zero_weights = 0;  // with weight: classes [0, zero_weights) weigh 0, and every kept target is one
  Up up = Up::absent;
  double up_scalar = 0;
  std::uint64_t seed = 1;
  RowsEdit edit;
};
inline void PrintTo(const ClassSpec& s, std::ostream* os) { *os << s.name; }

// The class operands of one problem: R rows of C classes (the class dim's size), the index targets, the class
// weights and the upstream gradient.
struct ClassOperands {
  std::int64_t R = 0, C = 0;
  std::vector<std::int64_t> rshape;
  Tensor target;
  std::optional<Tensor> weight, grad_loss;

  [[nodiscard]] std::optional<TensorView> up() const {
    if (grad_loss) return grad_loss->view;
    return std::nullopt;
  }
};

inline void init_rows(const ClassSpec& s, ClassOperands& p) {
  p.C = s.shape[class_dim(s.shape)];
  p.rshape = row_shape(s.shape);
  p.R = prod(p.rshape);
}

// R class indices: ignore_index with probability ignore_frac, else uniform (below zero_weights where set).
inline std::vector<std::int64_t> draw_targets(const ClassSpec& s, Rng& rng, std::int64_t R, std::int64_t C) {
  std::vector<std::int64_t> t(static_cast<std::size_t>(R));
  for (auto& v : t) v = rng.uniform() < s.ignore_frac ? s.ignore_index : rng.index(C);
  if (s.zero_weights > 0)
    for (auto& v : t)
      if (v != s.ignore_index) v %= s.zero_weights;
  return t;
}

// The index targets `t` stored in s.tdt, read back into in.target.
template <class In>
void store_targets(const ClassSpec& s, const std::vector<std::int64_t>& t, ClassOperands& p, In& in) {
  p.target = Tensor::make(s.tdt, p.rshape);
  for (std::int64_t r = 0; r < p.R; ++r) p.target.set_int(r, t[r]);
  for (std::int64_t r = 0; r < p.R; ++r) in.target.push_back(p.target.get_int(r));
}

// The class weights (bfloat16-exact, so every weight dtype holds them; 0 below zero_weights), the upstream gradient,
// and the reference input's shared fields.
template <class In>
void draw_weight_and_up(const ClassSpec& s, Rng& rng, ClassOperands& p, In& in) {
  const DType acc = acc_dtype(s.dt);
  if (s.weight) {
    p.weight = Tensor::make(s.wdt.value_or(s.dt), {p.C});
    for (std::int64_t c = 0; c < p.C; ++c) {
      p.weight->set(c, c < s.zero_weights ? 0.0 : lfref::round_to(rng.uniform(0.25, 2.0), lfref::kBF16));
    }
    in.weight = p.weight->values();
  }
  if (s.up == Up::per_row) {
    p.grad_loss = Tensor::make(acc, p.rshape);
    for (std::int64_t r = 0; r < p.R; ++r) p.grad_loss->set(r, lfref::round_to(rng.uniform(-2.0, 2.0), lfref::kBF16));
    in.grad_loss = p.grad_loss->values();
    if (in.grad_loss.size() == 1) in.grad_loss.push_back(in.grad_loss[0]);  // keep "per row" for R == 1
  } else if (s.up == Up::scalar) {
    p.grad_loss = scalar_tensor(acc, s.up_scalar);
    in.grad_loss = {p.grad_loss->get(0)};
  }
  in.rows = p.R, in.C = p.C;
  in.reduction = s.red;
  in.ignore_index = s.ignore_index;
  in.u = compute_unit(s.dt);
}

}  // namespace lftest
