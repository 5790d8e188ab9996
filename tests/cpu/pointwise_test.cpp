// mse / l1 / smooth_l1 / huber forward and backward on the CPU against the float64 reference
// (tests/reference/pointwise_reference.hpp; torch.nn.functional.{mse,l1,smooth_l1,huber}_loss).
#include "lossfuse/pointwise.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "error_harness.hpp"
#include "lossfuse/parallel.hpp"
#include "reference/pointwise_reference.hpp"
#include "test_util.hpp"

namespace lftest::pointwise {
namespace {

using lfref::PwLoss;
using lossfuse::PointwiseGrads;

constexpr PwLoss kLosses[] = {PwLoss::mse, PwLoss::l1, PwLoss::smooth_l1, PwLoss::huber};

std::string nm(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    default: return "int";
  }
}
std::string loss_name(PwLoss l) {
  switch (l) {
    case PwLoss::mse: return "mse";
    case PwLoss::l1: return "l1";
    case PwLoss::smooth_l1: return "smoothl1";
    case PwLoss::huber: return "huber";
  }
  return "?";
}
std::string param_name(double p) {
  std::string s = std::to_string(p);
  s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  for (auto& c : s)
    if (c == '.') c = 'p';
  return s;
}
bool takes_weight(PwLoss l) { return l != PwLoss::smooth_l1; }

// ---- calling the library ------------------------------------------------------------------------------------

struct Call {
  PwLoss loss = PwLoss::mse;
  Reduction red = Reduction::mean;
  double param = 1.0;  // beta / delta
  std::optional<TensorView> weight;
};

void forward(const Call& c, const TensorView& x, const TensorView& y, const TensorView& loss) {
  switch (c.loss) {
    case PwLoss::mse: return lossfuse::mse_forward(x, y, lossfuse::MseOptions{c.red, c.weight}, loss);
    case PwLoss::l1: return lossfuse::l1_forward(x, y, lossfuse::L1Options{c.red, c.weight}, loss);
    case PwLoss::smooth_l1: return lossfuse::smooth_l1_forward(x, y, lossfuse::SmoothL1Options{c.red, c.param}, loss);
    case PwLoss::huber: return lossfuse::huber_forward(x, y, lossfuse::HuberOptions{c.red, c.param, c.weight}, loss);
  }
}
void backward(const Call& c, const TensorView& x, const TensorView& y, const std::optional<TensorView>& up,
              const PointwiseGrads& g) {
  switch (c.loss) {
    case PwLoss::mse: return lossfuse::mse_backward(x, y, up, lossfuse::MseOptions{c.red, c.weight}, g);
    case PwLoss::l1: return lossfuse::l1_backward(x, y, up, lossfuse::L1Options{c.red, c.weight}, g);
    case PwLoss::smooth_l1: return lossfuse::smooth_l1_backward(x, y, up, lossfuse::SmoothL1Options{c.red, c.param}, g);
    case PwLoss::huber: return lossfuse::huber_backward(x, y, up, lossfuse::HuberOptions{c.red, c.param, c.weight}, g);
  }
}

// ---- operands: strided and expanded -------------------------------------------------------------------------

// none: the full shape; outer: stored with dim 0 of size 1 and expanded (stride 0); inner: the last dim.
enum class Bcast { none, outer, inner };

struct Operand {
  Tensor store;           // the stored (possibly smaller) tensor
  TensorView view;        // the full-shape view passed to the library
  std::vector<double> v;  // logical row-major values of the full shape
};

std::vector<std::int64_t> small_shape(const std::vector<std::int64_t>& shape, Bcast b) {
  std::vector<std::int64_t> s = shape;
  if (s.empty() || b == Bcast::none) return s;
  s[b == Bcast::outer ? 0 : s.size() - 1] = 1;
  return s;
}

// gen(k) gives the value of stored element k (row-major in the stored shape).
Operand make_operand(DType dt, const std::vector<std::int64_t>& shape, Layout layout, Bcast b,
                     const std::function<double(std::int64_t)>& gen) {
  Operand o;
  const std::vector<std::int64_t> ss = small_shape(shape, b);
  o.store = Tensor::make(dt, ss, layout, kSentinel);
  for (std::int64_t k = 0; k < o.store.numel(); ++k) o.store.set(k, gen(k));
  o.view = o.store.view;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (ss[d] != shape[d]) o.view.shape[d] = shape[d], o.view.strides[d] = 0;
  }
  const std::int64_t n = prod(shape);
  o.v.resize(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {  // full index -> stored index
    std::int64_t r = i, k = 0, mul = 1;
    for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
      const std::int64_t c = r % shape[d];
      r /= shape[d];
      k += (ss[d] == 1 ? 0 : c) * mul;
      mul *= ss[d];
    }
    o.v[i] = o.store.get(k);
  }
  return o;
}

// Logical values of a full-shape strided tensor written by the library.
std::vector<double> values_of(const Tensor& t) { return t.values(); }

// ---- one problem ----------------------------------------------------------------------------------------------

enum class Up { absent, scalar, per_elem, per_elem_expanded, per_elem_transposed };

struct Spec {
  std::string name;
  PwLoss loss = PwLoss::mse;
  DType dt = DType::f32;
  Reduction red = Reduction::mean;
  std::vector<std::int64_t> shape{4, 9};
  double param = 1.0;
  bool weight = false;
  Bcast xb = Bcast::none, tb = Bcast::none, wb = Bcast::none;
  Layout in_layout = Layout::contiguous, grad_layout = Layout::contiguous;
  Up up = Up::absent;
  double up_scalar = -0.75;
  bool want_gx = true, want_gy = true;
  std::uint64_t seed = 1;
  // Edits the stored input and target values (only used with xb == tb == none, so both have the full shape).
  std::function<void(Rng&, std::vector<double>& x, std::vector<double>& y)> edit;
};
void PrintTo(const Spec& s, std::ostream* os) { *os << s.name; }

Up default_up(Reduction r, std::uint64_t k) {
  if (r == Reduction::none) return k % 3 == 0 ? Up::absent : Up::per_elem;
  return k % 2 == 0 ? Up::scalar : Up::absent;
}

// Values on a 1/32 grid in [-4, 4] (exact in every dtype) with probability 1/2, else N(0, 2).
double gen_value(Rng& rng) {
  if (rng.uniform() < 0.5) return static_cast<double>(rng.index(257) - 128) / 32.0;
  return 2.0 * rng.normal();
}

struct Problem {
  Spec s;
  Operand x, y;
  std::optional<Operand> w, up;
  lfref::PwResult ref;

  [[nodiscard]] Call call() const {
    Call c{s.loss, s.red, s.param, std::nullopt};
    if (w) c.weight = w->view;
    return c;
  }
  [[nodiscard]] std::optional<TensorView> upv() const {
    if (up) return up->view;
    return std::nullopt;
  }
  [[nodiscard]] DType acc() const { return acc_dtype(s.dt); }
};

Problem build(const Spec& s) {
  Problem p;
  p.s = s;
  const std::int64_t n = prod(s.shape);
  Rng rng(s.seed * 7919 + static_cast<std::uint64_t>(n));
  std::vector<double> xv(static_cast<std::size_t>(prod(small_shape(s.shape, s.xb)))),
      yv(static_cast<std::size_t>(prod(small_shape(s.shape, s.tb))));
  for (auto& v : xv) v = gen_value(rng);
  for (auto& v : yv) v = gen_value(rng);
  if (s.tb == Bcast::none && s.xb == Bcast::none) {
    // Ties (d == 0) and |d| == param exactly, both on the exact grid.
    for (std::int64_t i = 0; i < n; ++i) {
      const double r = rng.uniform();
      if (r < 0.05)
        xv[i] = yv[i] = static_cast<double>(rng.index(129) - 64) / 32.0;
      else if (r < 0.10) {
        yv[i] = static_cast<double>(rng.index(129) - 64) / 32.0;
        const double p = (s.loss == PwLoss::smooth_l1 || s.loss == PwLoss::huber) ? s.param : 1.0;
        xv[i] = yv[i] + (rng.uniform() < 0.5 ? p : -p);
      }
    }
    if (s.edit) s.edit(rng, xv, yv);
  }
  p.x = make_operand(s.dt, s.shape, s.in_layout, s.xb, [&](std::int64_t k) { return xv[k]; });
  p.y = make_operand(s.dt, s.shape, s.in_layout, s.tb, [&](std::int64_t k) { return yv[k]; });
  lfref::PwInput in;
  if (s.weight) {
    p.w = make_operand(s.dt, s.shape, Layout::contiguous, s.wb,
                       [&](std::int64_t) { return lfref::round_to(rng.uniform(0.25, 2.0), lfref::kBF16); });
    in.weight = p.w->v;
  }
  if (s.up == Up::scalar) {
    p.up = make_operand(p.acc(), {}, Layout::contiguous, Bcast::none, [&](std::int64_t) { return s.up_scalar; });
  } else if (s.up != Up::absent) {
    p.up = make_operand(p.acc(), s.shape, s.up == Up::per_elem_transposed ? Layout::transposed : Layout::contiguous,
                        s.up == Up::per_elem_expanded ? Bcast::outer : Bcast::none,
                        [&](std::int64_t) { return lfref::round_to(rng.uniform(-2.0, 2.0), lfref::kBF16); });
  }
  if (p.up) in.grad_loss = p.up->v;
  in.loss = s.loss;
  in.x = p.x.v;
  in.y = p.y.v;
  in.reduction = s.red;
  in.param = s.param;
  in.u = compute_unit(s.dt);
  in.compute = s.dt == DType::f64 ? lfref::kF64 : lfref::kF32;
  in.out = format_of(s.dt);
  p.ref = lfref::pointwise(in);
  return p;
}

// A gradient output. An empty one gets the strides torch gives an empty tensor ((3, 0): (1, 1)), not
// Tensor::make's (0, 1): lossfuse rejects a zero stride on a dim of size > 1 even when there are no elements.
Tensor make_grad(DType dt, const std::vector<std::int64_t>& shape, Layout layout) {
  Tensor g = Tensor::make(dt, shape, layout, kSentinel);
  if (g.numel() == 0) {
    std::int64_t st = 1;
    for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d)
      g.strides[d] = st, st *= std::max<std::int64_t>(shape[d], 1);
    g.rebind();
  }
  return g;
}

void run_all(const Spec& s) {
  SCOPED_TRACE(s.name);
  Problem p = build(s);
  const auto x0 = p.x.store.storage, y0 = p.y.store.storage;
  Tensor loss = Tensor::make(p.acc(), s.red == Reduction::none ? s.shape : std::vector<std::int64_t>{},
                             Layout::contiguous, kSentinel);
  forward(p.call(), p.x.view, p.y.view, loss.view);
  if (s.red == Reduction::none) {
    EXPECT_TRUE(close_all("loss", loss.values(), p.ref.elem_loss, p.ref.elem_loss_tol, p.acc()));
  } else {
    EXPECT_TRUE(close_one("loss", loss.get(0), p.ref.loss, p.ref.loss_tol, p.acc()));
  }
  EXPECT_TRUE(loss.outside_untouched(kSentinel));

  std::optional<Tensor> gx, gy;
  if (s.want_gx) gx = make_grad(s.dt, s.shape, s.grad_layout);
  if (s.want_gy) gy = make_grad(s.dt, s.shape, s.grad_layout);
  PointwiseGrads g;
  if (gx) g.input = gx->view;
  if (gy) g.target = gy->view;
  backward(p.call(), p.x.view, p.y.view, p.upv(), g);
  if (gx) {
    EXPECT_TRUE(close_all("grad_input", values_of(*gx), p.ref.gx, p.ref.gx_tol, s.dt));
    EXPECT_TRUE(gx->outside_untouched(kSentinel)) << "wrote outside grad_input";
  }
  if (gy) {
    EXPECT_TRUE(close_all("grad_target", values_of(*gy), p.ref.gy, p.ref.gy_tol, s.dt));
    EXPECT_TRUE(gy->outside_untouched(kSentinel)) << "wrote outside grad_target";
  }
  EXPECT_TRUE(p.x.store.storage == x0) << "the input was modified";
  EXPECT_TRUE(p.y.store.storage == y0) << "the target was modified";
}

class Pointwise : public ::testing::TestWithParam<Spec> {};
TEST_P(Pointwise, MatchesReference) { run_all(GetParam()); }

auto spec_name = [](const auto& i) { return i.param.name; };

double default_param(PwLoss l, std::uint64_t k) {
  if (l == PwLoss::smooth_l1) return std::vector<double>{1.0, 0.5, 0.0, 2.0}[k % 4];
  if (l == PwLoss::huber) return std::vector<double>{1.0, 0.5, 2.0}[k % 3];
  return 1.0;
}

// Every loss x dtype x reduction x shape (0-d, 1-D of 1, 7, 31, 1271, 2-D, 3-D) x weight.
std::vector<Spec> option_specs() {
  std::vector<Spec> v;
  std::uint64_t k = 0;
  const std::vector<std::vector<std::int64_t>> shapes = {{}, {1}, {7}, {31}, {1271}, {4, 9}, {3, 5, 7}};
  for (PwLoss l : kLosses)
    for (DType dt : kFloats)
      for (Reduction red : kReds)
        for (const auto& shape : shapes)
          for (int w = 0; w < (takes_weight(l) ? 2 : 1); ++w) {
            Spec s;
            s.loss = l, s.dt = dt, s.red = red, s.shape = shape, s.weight = w;
            s.param = default_param(l, k);
            s.up = default_up(red, k);
            s.want_gx = k % 5 != 3;  // now and then only one of the two gradients
            s.want_gy = k % 5 != 4;
            s.seed = ++k;
            s.name = loss_name(l) + "_" + nm(dt) + "_" + red_name(red) + "_" + shape_name(shape) + (w ? "_w" : "") +
                     (l == PwLoss::smooth_l1 || l == PwLoss::huber ? "_p" + param_name(s.param) : "") +
                     (!s.want_gx ? "_nogx" : "") + (!s.want_gy ? "_nogy" : "");
            v.push_back(s);
          }
  return v;
}
INSTANTIATE_TEST_SUITE_P(Options, Pointwise, ::testing::ValuesIn(option_specs()), spec_name);

// beta (incl. 0) and delta sweeps, ties |d| == beta / delta built into every problem.
std::vector<Spec> param_specs() {
  std::vector<Spec> v;
  std::uint64_t k = 0;
  for (PwLoss l : {PwLoss::smooth_l1, PwLoss::huber})
    for (double prm : l == PwLoss::smooth_l1 ? std::vector<double>{0.0, 0.25, 0.3, 1.0, 3.0}
                                             : std::vector<double>{0.25, 0.3, 1.0, 1.5, 3.0})
      for (DType dt : kFloats)
        for (Reduction red : kReds) {
          Spec s;
          s.loss = l, s.dt = dt, s.red = red, s.shape = {5, 31}, s.param = prm;
          s.weight = l == PwLoss::huber && (k % 2 == 0);
          s.up = default_up(red, k);
          s.seed = 300 + ++k;
          s.name = loss_name(l) + "_p" + param_name(prm) + "_" + nm(dt) + "_" + red_name(red) + (s.weight ? "_w" : "");
          v.push_back(s);
        }
  return v;
}
INSTANTIATE_TEST_SUITE_P(Params, Pointwise, ::testing::ValuesIn(param_specs()), spec_name);

// Long sums: 100003 elements (several tiles), and rows longer than a tile.
std::vector<Spec> large_specs() {
  std::vector<Spec> v;
  std::uint64_t k = 0;
  for (PwLoss l : kLosses)
    for (DType dt : kFloats)
      for (Reduction red : kReds) {
        Spec s;
        s.loss = l, s.dt = dt, s.red = red, s.param = default_param(l, k);
        s.shape = (k % 2 == 0) ? std::vector<std::int64_t>{100003} : std::vector<std::int64_t>{3, 20011};
        s.weight = takes_weight(l) && (k % 3 != 2);
        s.up = default_up(red, k);
        s.seed = 500 + ++k;
        s.name = loss_name(l) + "_" + nm(dt) + "_" + red_name(red) + "_" + shape_name(s.shape) + (s.weight ? "_w" : "");
        v.push_back(s);
      }
  return v;
}
INSTANTIATE_TEST_SUITE_P(Large, Pointwise, ::testing::ValuesIn(large_specs()), spec_name);

// Non-contiguous inputs, expanded target / weight / upstream gradient, strided gradient outputs.
std::vector<Spec> layout_specs() {
  std::vector<Spec> v;
  std::uint64_t k = 0;
  struct L {
    const char* name;
    std::vector<std::int64_t> shape;
    Layout in, grad;
    Bcast tb, wb;
    bool exp_up;
    Bcast xb = Bcast::none;
    Up up_none = Up::per_elem;  // the upstream gradient for reduction none, when not expanded
  };
  const std::vector<L> ls = {
      {"transposed", {13, 37}, Layout::transposed, Layout::contiguous, Bcast::none, Bcast::none, false},
      {"padded", {6, 5, 19}, Layout::padded, Layout::contiguous, Bcast::none, Bcast::none, false},
      {"stridedgrad_t", {13, 37}, Layout::contiguous, Layout::transposed, Bcast::none, Bcast::none, false},
      {"stridedgrad_p", {6, 5, 19}, Layout::contiguous, Layout::padded, Bcast::none, Bcast::none, false},
      {"bcast_target_outer", {9, 41}, Layout::contiguous, Layout::contiguous, Bcast::outer, Bcast::none, false},
      {"bcast_target_inner", {9, 41}, Layout::contiguous, Layout::contiguous, Bcast::inner, Bcast::none, false},
      {"bcast_target_1d", {33}, Layout::contiguous, Layout::contiguous, Bcast::inner, Bcast::none, false},
      {"bcast_weight", {7, 23}, Layout::contiguous, Layout::contiguous, Bcast::none, Bcast::outer, false},
      {"bcast_all_padded", {4, 3, 35}, Layout::padded, Layout::padded, Bcast::outer, Bcast::inner, true},
      {"transposed_bcast", {17, 10}, Layout::transposed, Layout::transposed, Bcast::inner, Bcast::outer, true},
      {"bcast_input_outer",
       {9, 41},
       Layout::contiguous,
       Layout::contiguous,
       Bcast::none,
       Bcast::none,
       false,
       Bcast::outer},
      {"bcast_input_inner_padded",
       {5, 4, 21},
       Layout::padded,
       Layout::transposed,
       Bcast::outer,
       Bcast::none,
       false,
       Bcast::inner},
      {"strided_up",
       {11, 29},
       Layout::contiguous,
       Layout::padded,
       Bcast::none,
       Bcast::none,
       false,
       Bcast::none,
       Up::per_elem_transposed},
      {"8d_padded",
       {2, 1, 3, 1, 2, 2, 1, 19},
       Layout::padded,
       Layout::padded,
       Bcast::none,
       Bcast::none,
       false,
       Bcast::none,
       Up::per_elem_transposed},
      {"8d_transposed_bcast",
       {2, 3, 1, 2, 2, 1, 2, 5},
       Layout::transposed,
       Layout::contiguous,
       Bcast::inner,
       Bcast::outer,
       true},
  };
  for (PwLoss l : kLosses)
    for (DType dt : kFloats)
      for (const L& c : ls)
        for (Reduction red : kReds) {
          Spec s;
          s.loss = l, s.dt = dt, s.red = red, s.shape = c.shape, s.in_layout = c.in, s.grad_layout = c.grad;
          s.tb = c.tb, s.xb = c.xb, s.param = default_param(l, k);
          s.weight = takes_weight(l) && (c.wb != Bcast::none || k % 2 == 0);
          s.wb = s.weight ? c.wb : Bcast::none;
          s.up = red == Reduction::none ? (c.exp_up || k % 2 ? Up::per_elem_expanded : c.up_none) : default_up(red, k);
          s.seed = 700 + ++k;
          s.name = loss_name(l) + "_" + nm(dt) + "_" + c.name + "_" + red_name(red) + (s.weight ? "_w" : "") +
                   (s.up == Up::per_elem_expanded     ? "_expup"
                    : s.up == Up::per_elem_transposed ? "_stridedup"
                                                      : "");
          v.push_back(s);
        }
  return v;
}
INSTANTIATE_TEST_SUITE_P(Layouts, Pointwise, ::testing::ValuesIn(layout_specs()), spec_name);

// NaN in the input and/or the target, and inf - inf.
Spec nan_spec(PwLoss l, DType dt, Reduction red, double prm, std::uint64_t& k) {
  Spec s;
  s.loss = l, s.dt = dt, s.red = red, s.shape = {3, 11}, s.param = prm;
  s.weight = takes_weight(l) && k % 2 == 0;
  s.up = default_up(red, k);
  s.seed = 1300 + ++k;
  s.edit = [](Rng&, std::vector<double>& x, std::vector<double>& y) {
    x[0] = kNaN;
    y[1] = kNaN;
    x[2] = kInf;
    x[3] = -kInf;
    x[4] = kInf, y[4] = kInf;  // inf - inf = NaN
    y[5] = kInf;
    x[6] = kNaN, y[6] = kNaN;
    x[7] = -kInf, y[7] = kInf;
  };
  return s;
}
// Library bug: torch's l1 gradient at d = NaN is sign(NaN) * g = 0 (torch.sign(nan) == 0), and smooth_l1 with
// beta == 0 is l1 in torch 2.15; lossfuse writes NaN (HwyOps::sign / ScalarOpsNaN::sign keep NaN).
// l1 and smooth_l1 with beta 0 (torch's l1): their NaN cases are the NanSign specs below.
bool nan_grad_is_sign(PwLoss l, double prm) { return l == PwLoss::l1 || (l == PwLoss::smooth_l1 && prm == 0.0); }

// Empty inputs, NaN / inf, huge values, upstream gradients of odd sizes.
std::vector<Spec> edge_specs() {
  std::vector<Spec> v;
  std::uint64_t k = 0;
  for (PwLoss l : kLosses)
    for (DType dt : kFloats)
      for (Reduction red : kReds) {
        const std::string base = loss_name(l) + "_" + nm(dt) + "_" + red_name(red);
        for (const auto& shape : std::vector<std::vector<std::int64_t>>{{0}, {3, 0}, {0, 4}}) {
          Spec s;
          s.loss = l, s.dt = dt, s.red = red, s.shape = shape, s.weight = takes_weight(l);
          s.up = default_up(red, k);
          s.seed = 900 + ++k;
          s.name = "empty_" + shape_name(shape) + "_" + base;
          v.push_back(s);
        }
        {  // infinities in input and target, d never NaN
          Spec s;
          s.loss = l, s.dt = dt, s.red = red, s.shape = {3, 11}, s.param = default_param(l, k);
          s.weight = takes_weight(l) && k % 2 == 0;
          s.up = default_up(red, k);
          s.seed = 900 + ++k;
          s.edit = [](Rng&, std::vector<double>& x, std::vector<double>& y) {
            x[2] = kInf;
            x[3] = -kInf;
            y[5] = kInf;
            x[7] = -kInf, y[7] = kInf;
            y[8] = -kInf;
          };
          s.name = "inf_" + base + (s.weight ? "_w" : "");
          v.push_back(s);
        }
        // NaN in input and/or target, and inf - inf (l1 and smooth_l1 with beta 0: the NanSign specs below).
        for (double prm : l == PwLoss::smooth_l1 ? std::vector<double>{1.0, 0.0} : std::vector<double>{1.0}) {
          Spec s = nan_spec(l, dt, red, prm, k);
          s.name = "nan_" + base + "_p" + param_name(prm) + (s.weight ? "_w" : "");
          if (!nan_grad_is_sign(l, prm)) v.push_back(s);
        }
        {  // huge: per-element mse overflows the float32 loss to inf as torch; the rest stays finite
          Spec s;
          s.loss = l, s.dt = dt, s.red = red, s.shape = {4, 9}, s.param = default_param(l, k);
          s.weight = takes_weight(l) && k % 2 == 1;
          s.up = default_up(red, k);
          s.seed = 900 + ++k;
          const double mag = dt == DType::f16 ? 3e4 : dt == DType::f64 ? 1e200 : 1e30;
          s.edit = [mag](Rng& rng, std::vector<double>& x, std::vector<double>& y) {
            for (std::size_t i = 0; i < x.size(); ++i) {
              x[i] = mag * rng.uniform(-1.0, 1.0);
              if (i % 3 == 0) y[i] = -x[i];
            }
          };
          s.name = "huge_" + base + (s.weight ? "_w" : "");
          v.push_back(s);
        }
      }
  // An upstream scalar of 0 and of a large magnitude.
  for (PwLoss l : kLosses)
    for (double g : {0.0, 3.5e3, -1e-3}) {
      Spec s;
      s.loss = l, s.red = Reduction::sum, s.shape = {31}, s.up = Up::scalar, s.up_scalar = g;
      s.seed = 1100 + ++k;
      s.name = "upscalar_" + loss_name(l) + "_" + std::to_string(k);
      v.push_back(s);
    }
  return v;
}
INSTANTIATE_TEST_SUITE_P(Edge, Pointwise, ::testing::ValuesIn(edge_specs()), spec_name);

// NaN differences for l1 and smooth_l1 with beta 0: torch gives gradient 0 there (torch.sign(nan) = 0).
std::vector<Spec> nan_sign_specs() {
  std::vector<Spec> v;
  std::uint64_t k = 0;
  for (PwLoss l : {PwLoss::l1, PwLoss::smooth_l1})
    for (DType dt : kFloats)
      for (Reduction red : kReds) {
        Spec s = nan_spec(l, dt, red, 0.0, k);
        s.name = "nan_" + loss_name(l) + "_" + nm(dt) + "_" + red_name(red) + (s.weight ? "_w" : "");
        v.push_back(s);
      }
  return v;
}
INSTANTIATE_TEST_SUITE_P(NanSign, Pointwise, ::testing::ValuesIn(nan_sign_specs()), spec_name);

// ---- hand values (from CPU torch 2.15) ------------------------------------------------------------------------

TEST(PointwiseReference, HandValuesFromTorch) {
  lfref::PwInput in;
  in.x = {0, 1, 2, -1, 3};
  in.y = {0, 0, 0, 0, 0};
  in.weight = {1, 2, 3, 4, 5};
  in.u = 0x1p-53, in.compute = lfref::kF64, in.out = lfref::kF64;
  in.loss = PwLoss::mse;
  auto r = lfref::pointwise(in);
  EXPECT_DOUBLE_EQ(r.loss, 4.2);
  EXPECT_DOUBLE_EQ(r.gx[1], 0.26666666666666666);
  in.loss = PwLoss::l1;
  r = lfref::pointwise(in);
  EXPECT_DOUBLE_EQ(r.loss, 1.8);
  EXPECT_DOUBLE_EQ(r.gx[3], -0.26666666666666666);
  EXPECT_EQ(r.gx[0], 0.0);
  in.loss = PwLoss::huber, in.param = 1.0;
  r = lfref::pointwise(in);
  EXPECT_DOUBLE_EQ(r.loss, 4.0);  // mean(w l): divides by numel
  EXPECT_DOUBLE_EQ(r.gx[4], 1.0);
  in.weight.clear();
  in.reduction = Reduction::none, in.param = 2.0;
  r = lfref::pointwise(in);
  EXPECT_EQ(r.elem_loss, (std::vector<double>{0, 0.5, 2, 0.5, 4}));
  EXPECT_EQ(r.gx, (std::vector<double>{0, 1, 2, -1, 2}));
  in.loss = PwLoss::smooth_l1, in.param = 0.0;
  r = lfref::pointwise(in);
  EXPECT_EQ(r.elem_loss, (std::vector<double>{0, 1, 2, 1, 3}));
  EXPECT_EQ(r.gx, (std::vector<double>{0, 1, 1, -1, 1}));  // torch 2.15: 0 at d == 0 with beta == 0
  in.param = 1.0;
  r = lfref::pointwise(in);
  EXPECT_EQ(r.elem_loss, (std::vector<double>{0, 0.5, 1.5, 0.5, 2.5}));
  EXPECT_EQ(r.gx, (std::vector<double>{0, 1, 1, -1, 1}));
  // l1 at NaN: torch's sign(NaN) is 0, so the gradient is 0; smooth_l1 / huber give NaN.
  in.x = {kNaN, 1, kInf}, in.y = {0, kNaN, kInf};
  in.loss = PwLoss::l1;
  r = lfref::pointwise(in);
  EXPECT_EQ(r.gx, (std::vector<double>{0, 0, 0}));
  EXPECT_TRUE(std::isnan(r.elem_loss[0]));
}

// A few torch facts on the library directly, float32.
TEST(PointwiseTorch, HandValues) {
  Tensor x = Tensor::make(DType::f32, {5}), y = Tensor::make(DType::f32, {5}), w = Tensor::make(DType::f32, {5});
  for (int i = 0; i < 5; ++i) x.set(i, std::vector<double>{0, 1, 2, -1, 3}[i]), y.set(i, 0), w.set(i, i + 1);
  Tensor loss = Tensor::make(DType::f32, {});
  lossfuse::mse_forward(x.view, y.view, {Reduction::mean, w.view}, loss.view);
  EXPECT_FLOAT_EQ(static_cast<float>(loss.get(0)), 4.2f);
  lossfuse::huber_forward(x.view, y.view, {Reduction::mean, 1.0, w.view}, loss.view);
  EXPECT_FLOAT_EQ(static_cast<float>(loss.get(0)), 4.0f);
  Tensor g = Tensor::make(DType::f32, {5});
  lossfuse::smooth_l1_backward(x.view, y.view, std::nullopt, {Reduction::sum, 0.0}, {g.view, std::nullopt});
  EXPECT_EQ(g.values(), (std::vector<double>{0, 1, 1, -1, 1}));
}

// torch 2.15 CPU: F.l1_loss(x=[nan, 1, inf], y=[0, nan, inf], reduction='sum') -> grad_input [0, 0, 0],
// grad_target [-0, -0, -0] (and the same for smooth_l1_loss with beta=0).
TEST(PointwiseTorch, L1GradientAtNanDifferenceIsZero) {
  Tensor x = Tensor::make(DType::f32, {3}), y = Tensor::make(DType::f32, {3});
  x.set(0, kNaN), x.set(1, 1), x.set(2, kInf);
  y.set(0, 0), y.set(1, kNaN), y.set(2, kInf);
  Tensor gx = Tensor::make(DType::f32, {3}), gy = Tensor::make(DType::f32, {3});
  lossfuse::l1_backward(x.view, y.view, std::nullopt, {Reduction::sum, std::nullopt}, {gx.view, gy.view});
  EXPECT_EQ(gx.values(), (std::vector<double>{0, 0, 0}));
  EXPECT_EQ(gy.values(), (std::vector<double>{0, 0, 0}));
  lossfuse::smooth_l1_backward(x.view, y.view, std::nullopt, {Reduction::sum, 0.0}, {gx.view, gy.view});
  EXPECT_EQ(gx.values(), (std::vector<double>{0, 0, 0}));
}

// ---- central finite differences in float64 --------------------------------------------------------------------

TEST(PointwiseFiniteDifferences, Float64) {
  for (PwLoss l : kLosses)
    for (Reduction red : {Reduction::mean, Reduction::sum}) {
      SCOPED_TRACE(loss_name(l) + "_" + red_name(red));
      const std::vector<std::int64_t> shape = {3, 7};
      const std::int64_t n = 21;
      Rng rng(42 + static_cast<std::uint64_t>(l));
      Tensor x = Tensor::make(DType::f64, shape), y = Tensor::make(DType::f64, shape);
      Tensor w = Tensor::make(DType::f64, shape);
      const double prm = l == PwLoss::huber ? 0.8 : 1.3;
      for (std::int64_t i = 0; i < n; ++i) {
        double xv, yv;
        do {  // keep away from the kinks (d == 0, |d| == param)
          xv = 2 * rng.normal(), yv = 2 * rng.normal();
        } while (std::fabs(xv - yv) < 0.05 || std::fabs(std::fabs(xv - yv) - prm) < 0.05);
        x.set(i, xv), y.set(i, yv), w.set(i, rng.uniform(0.5, 2.0));
      }
      Call c{l, red, prm, takes_weight(l) ? std::optional<TensorView>(w.view) : std::nullopt};
      Tensor up = scalar_tensor(DType::f64, 1.7);
      Tensor gx = Tensor::make(DType::f64, shape), gy = Tensor::make(DType::f64, shape);
      backward(c, x.view, y.view, up.view, {gx.view, gy.view});
      auto f = [&](Tensor& t, std::int64_t i, double h) {
        const double v0 = t.get(i);
        t.set(i, v0 + h);
        Tensor loss = Tensor::make(DType::f64, {});
        forward(c, x.view, y.view, loss.view);
        t.set(i, v0);
        return 1.7 * loss.get(0);
      };
      const double h = 1e-6;
      for (std::int64_t i = 0; i < n; ++i) {
        const double fdx = (f(x, i, h) - f(x, i, -h)) / (2 * h);
        const double fdy = (f(y, i, h) - f(y, i, -h)) / (2 * h);
        EXPECT_NEAR(gx.get(i), fdx, 1e-7 * (1 + std::fabs(fdx))) << i;
        EXPECT_NEAR(gy.get(i), fdy, 1e-7 * (1 + std::fabs(fdy))) << i;
      }
    }
}

// ---- determinism across thread counts ------------------------------------------------------------------------

TEST(PointwiseMisc, DeterministicAcrossThreads) {
  const std::int64_t n = 1 << 20;
  for (PwLoss l : kLosses) {
    SCOPED_TRACE(loss_name(l));
    Spec s;
    s.loss = l, s.red = Reduction::sum, s.shape = {n}, s.weight = takes_weight(l), s.param = 0.7;
    const Problem p = build(s);
    std::vector<std::uint8_t> loss0, mean0, grad0;
    for (int threads : {1, 2, 3, 1}) {
      ThreadsGuard guard(threads);
      Tensor loss = Tensor::make(DType::f32, {}), mean = Tensor::make(DType::f32, {});
      Tensor grad = Tensor::make(DType::f32, s.shape);
      forward(p.call(), p.x.view, p.y.view, loss.view);
      Call cm = p.call();
      cm.red = Reduction::mean;
      forward(cm, p.x.view, p.y.view, mean.view);
      backward(cm, p.x.view, p.y.view, std::nullopt, {grad.view, std::nullopt});
      if (loss0.empty()) {
        loss0 = loss.storage, mean0 = mean.storage, grad0 = grad.storage;
        EXPECT_TRUE(close_one("loss", loss.get(0), p.ref.loss, p.ref.loss_tol, DType::f32));
      }
      EXPECT_TRUE(loss.storage == loss0) << threads << " threads";
      EXPECT_TRUE(mean.storage == mean0) << threads << " threads";
      EXPECT_TRUE(grad.storage == grad0) << threads << " threads";
    }
  }
}

// ---- errors ---------------------------------------------------------------------------------------------------

struct ErrFixture : GuardedBuffers {
  Tensor input = Tensor::make(DType::f32, {4, 5}, Layout::contiguous, kSentinel);
  Tensor target = Tensor::make(DType::f32, {4, 5}, Layout::contiguous, kSentinel);
  Tensor weight = Tensor::make(DType::f32, {4, 5}, Layout::contiguous, kSentinel);
  Tensor loss = Tensor::make(DType::f32, {}, Layout::contiguous, kSentinel);
  Tensor gx = Tensor::make(DType::f32, {4, 5}, Layout::contiguous, kSentinel);
  Tensor gy = Tensor::make(DType::f32, {4, 5}, Layout::contiguous, kSentinel);
  Tensor up = Tensor::make(DType::f32, {}, Layout::contiguous, kSentinel);
  Call c;
  bool use_weight = false;
  ErrFixture() {
    for (std::int64_t i = 0; i < 20; ++i) input.set(i, 0.1 * static_cast<double>(i)), target.set(i, 0.5);
    for (std::int64_t i = 0; i < 20; ++i) weight.set(i, 1.0);
    up.set(0, 1.0);
    guard("input", input), guard("target", target), guard("weight", weight), guard("loss", loss);
    guard("grad_input", gx), guard("grad_target", gy), guard("grad_loss", up);
  }
};
struct Views {
  std::optional<TensorView> input, target, weight, loss, gx, gy, up;
};
enum class Entry { forward, backward };

void expect_error(const std::function<Views(ErrFixture&)>& setup, std::initializer_list<ErrorCode> codes,
                  const std::string& argument, std::initializer_list<Entry> entries = {Entry::forward, Entry::backward},
                  std::initializer_list<PwLoss> losses = {PwLoss::mse, PwLoss::l1, PwLoss::smooth_l1, PwLoss::huber}) {
  for (PwLoss l : losses) {
    SCOPED_TRACE(loss_name(l));
    expect_entry_errors<ErrFixture, Entry, Views>(
        [&](ErrFixture& f) {
          f.c.loss = l;
          return setup(f);
        },
        codes, entries,
        [](const ErrFixture& f, Entry e, const Views& v) {
          Call c = f.c;
          if (v.weight) c.weight = *v.weight;
          const TensorView in = v.input.value_or(f.input.view), tg = v.target.value_or(f.target.view);
          if (e == Entry::forward) {
            forward(c, in, tg, v.loss.value_or(f.loss.view));
          } else {
            const std::optional<TensorView> up = v.up ? v.up : std::optional<TensorView>(f.up.view);
            backward(c, in, tg, up, PointwiseGrads{v.gx.value_or(f.gx.view), v.gy.value_or(f.gy.view)});
          }
        },
        [](Entry e) { return std::string(e == Entry::forward ? "forward" : "backward"); }, argument);
  }
}
constexpr std::initializer_list<PwLoss> kWeighted = {PwLoss::mse, PwLoss::l1, PwLoss::huber};
constexpr std::initializer_list<Entry> kBoth = {Entry::forward, Entry::backward};
constexpr std::initializer_list<Entry> kFwd = {Entry::forward}, kBwd = {Entry::backward};
constexpr Reduction kNone = Reduction::none, kMean = Reduction::mean;

// Setups for expect_error: one view of the call replaced, after setting the reduction.
using Slot = std::optional<TensorView> Views::*;
using ErrSetup = std::function<Views(ErrFixture&)>;
// ... by a fixed view.
ErrSetup put(Slot slot, const TensorView& t, Reduction red = kMean) {
  return [slot, t, red](ErrFixture& f) {
    f.c.red = red;
    Views v;
    v.*slot = t;
    return v;
  };
}
// ... by one of the fixture's own buffers (an alias of it).
ErrSetup alias(Slot slot, Tensor ErrFixture::*buffer) {
  return [slot, buffer](ErrFixture& f) {
    Views v;
    v.*slot = (f.*buffer).view;
    return v;
  };
}
// ... by that buffer's view with a null data pointer.
ErrSetup null_data(Slot slot, Tensor ErrFixture::*buffer) {
  return [slot, setup = alias(slot, buffer)](ErrFixture& f) {
    Views v = setup(f);
    (v.*slot)->data = nullptr;
    return v;
  };
}

TEST(PointwiseErrors, ValidFixtureRuns) {
  for (PwLoss l : kLosses) {
    ErrFixture f;
    f.c.loss = l;
    if (takes_weight(l)) f.c.weight = f.weight.view;
    EXPECT_NO_THROW(forward(f.c, f.input.view, f.target.view, f.loss.view));
    EXPECT_NO_THROW(backward(f.c, f.input.view, f.target.view, f.up.view, {f.gx.view, f.gy.view}));
    EXPECT_NO_THROW(backward(f.c, f.input.view, f.target.view, std::nullopt, {std::nullopt, std::nullopt}));
  }
}
TEST(PointwiseErrors, TargetDtypeAndShape) {
  static const Tensor t64 = Tensor::make(DType::f64, {4, 5}), t16 = Tensor::make(DType::bf16, {4, 5}),
                      ti = Tensor::make(DType::i64, {4, 5});
  static const Tensor t54 = Tensor::make(DType::f32, {5, 4}), t4 = Tensor::make(DType::f32, {4}),
                      t451 = Tensor::make(DType::f32, {4, 5, 1});
  for (const Tensor* t : {&t64, &t16, &ti})
    expect_error(put(&Views::target, t->view), {ErrorCode::dtype_mismatch}, "target");
  for (const Tensor* t : {&t54, &t4, &t451})
    expect_error(put(&Views::target, t->view), {ErrorCode::shape_mismatch}, "target");
}
TEST(PointwiseErrors, InputDtype) {
  static const Tensor xi = Tensor::make(DType::i32, {4, 5});
  expect_error(put(&Views::input, xi.view), {ErrorCode::dtype_mismatch}, "input");
}
TEST(PointwiseErrors, WeightDtypeAndShape) {
  static const Tensor w64 = Tensor::make(DType::f64, {4, 5}), w5 = Tensor::make(DType::f32, {5}),
                      w54 = Tensor::make(DType::f32, {5, 4});
  expect_error(put(&Views::weight, w64.view), {ErrorCode::dtype_mismatch}, "weight", kBoth, kWeighted);
  expect_error(put(&Views::weight, w5.view), {ErrorCode::shape_mismatch}, "weight", kBoth, kWeighted);
  expect_error(put(&Views::weight, w54.view), {ErrorCode::shape_mismatch}, "weight", kBoth, kWeighted);
}
TEST(PointwiseErrors, LossDtypeShapeLayout) {
  static const Tensor l64 = Tensor::make(DType::f64, {}), l16 = Tensor::make(DType::f16, {}),
                      l45 = Tensor::make(DType::f32, {4, 5}), l0 = Tensor::make(DType::f32, {}),
                      l54 = Tensor::make(DType::f32, {5, 4}), lt = Tensor::make(DType::f32, {4, 5}, Layout::transposed);
  expect_error(put(&Views::loss, l64.view), {ErrorCode::dtype_mismatch}, "loss", kFwd);
  expect_error(put(&Views::loss, l16.view), {ErrorCode::dtype_mismatch}, "loss", kFwd);
  expect_error(put(&Views::loss, l45.view), {ErrorCode::shape_mismatch}, "loss", kFwd);
  expect_error(put(&Views::loss, l0.view, kNone), {ErrorCode::shape_mismatch}, "loss", kFwd);
  expect_error(put(&Views::loss, l54.view, kNone), {ErrorCode::shape_mismatch}, "loss", kFwd);
  expect_error(put(&Views::loss, lt.view, kNone), {ErrorCode::invalid_value, ErrorCode::bad_pointer}, "loss", kFwd);
}
TEST(PointwiseErrors, GradLossDtypeAndShape) {
  static const Tensor u64 = Tensor::make(DType::f64, {}), u16 = Tensor::make(DType::bf16, {}),
                      u45 = Tensor::make(DType::f32, {4, 5}), u0 = Tensor::make(DType::f32, {}),
                      u5 = Tensor::make(DType::f32, {5});
  expect_error(put(&Views::up, u64.view), {ErrorCode::dtype_mismatch}, "grad_loss", kBwd);
  expect_error(put(&Views::up, u16.view), {ErrorCode::dtype_mismatch}, "grad_loss", kBwd);
  expect_error(put(&Views::up, u45.view), {ErrorCode::shape_mismatch}, "grad_loss", kBwd);
  expect_error(put(&Views::up, u0.view, kNone), {ErrorCode::shape_mismatch}, "grad_loss", kBwd);
  expect_error(put(&Views::up, u5.view, kNone), {ErrorCode::shape_mismatch}, "grad_loss", kBwd);
}
TEST(PointwiseErrors, GradientDtypeShapeStride) {
  static const Tensor g64 = Tensor::make(DType::f64, {4, 5}), g54 = Tensor::make(DType::f32, {5, 4}),
                      g20 = Tensor::make(DType::f32, {20}), g5 = Tensor::make(DType::f32, {1, 5}),
                      g4 = Tensor::make(DType::f32, {4, 1});
  for (const Slot slot : {&Views::gx, &Views::gy}) {
    const std::string name = slot == &Views::gx ? "grad_input" : "grad_target";
    expect_error(put(slot, g64.view), {ErrorCode::dtype_mismatch}, name, kBwd);
    expect_error(put(slot, g54.view), {ErrorCode::shape_mismatch}, name, kBwd);
    expect_error(put(slot, g20.view), {ErrorCode::shape_mismatch}, name, kBwd);
    // a zero stride on a dim of size > 1: repeated elements
    TensorView rows = g5.view, cols = g4.view;
    rows.shape[0] = 4, rows.strides[0] = 0;
    cols.shape[1] = 5, cols.strides[1] = 0;
    for (const TensorView& t : {rows, cols}) {
      expect_error(put(slot, t), {ErrorCode::bad_pointer, ErrorCode::invalid_value}, name, kBwd);
    }
    // no zero stride, but rows that overlap: strides (1, 1) and (4, 1) over a (4, 5) gradient
    for (std::int64_t row_stride : {1, 4}) {
      TensorView t = g20.view;
      t.ndim = 2, t.shape[0] = 4, t.shape[1] = 5, t.strides[0] = row_stride, t.strides[1] = 1;
      expect_error(put(slot, t), {ErrorCode::bad_pointer}, name, kBwd);
    }
  }
}
TEST(PointwiseErrors, OverlappingBuffers) {
  // a gradient over an input; the two gradients on one buffer
  expect_error(alias(&Views::gx, &ErrFixture::input), {ErrorCode::bad_pointer}, "grad_input", kBwd);
  expect_error(alias(&Views::gy, &ErrFixture::target), {ErrorCode::bad_pointer}, "grad_target", kBwd);
  expect_error(alias(&Views::gy, &ErrFixture::input), {ErrorCode::bad_pointer}, "grad_target", kBwd);
  expect_error(alias(&Views::gy, &ErrFixture::gx), {ErrorCode::bad_pointer}, "grad_input", kBwd);
  // the two gradients shifted by one element
  static Tensor big = Tensor::make(DType::f32, {64}, Layout::contiguous, kSentinel);
  expect_error(
      [](ErrFixture&) {
        Views v;
        v.gx = TensorView::contiguous(big.storage.data(), DType::f32, {4, 5});
        v.gy = TensorView::contiguous(big.storage.data() + 4 * 19, DType::f32, {4, 5});
        return v;
      },
      {ErrorCode::bad_pointer}, "grad_input", kBwd);
  // a gradient over the weight / the upstream gradient; the loss over the input / target
  expect_error(
      [](ErrFixture& f) {
        Views v;
        v.weight = f.weight.view;
        v.gx = f.weight.view;
        return v;
      },
      {ErrorCode::bad_pointer}, "grad_input", kBwd, kWeighted);
  const auto over = [](Slot slot, Tensor ErrFixture::*buffer, Reduction red, std::vector<std::int64_t> shape) {
    return ErrSetup([=](ErrFixture& f) {
      f.c.red = red;
      Views v;
      v.*slot = TensorView::contiguous((f.*buffer).view.data, DType::f32, shape.data(), static_cast<int>(shape.size()));
      return v;
    });
  };
  expect_error(over(&Views::up, &ErrFixture::gx, kMean, {}), {ErrorCode::bad_pointer}, "grad_input", kBwd);
  expect_error(over(&Views::loss, &ErrFixture::input, kMean, {}), {ErrorCode::bad_pointer}, "loss", kFwd);
  expect_error(over(&Views::loss, &ErrFixture::target, kNone, {4, 5}), {ErrorCode::bad_pointer}, "loss", kFwd);
}
TEST(PointwiseErrors, NullAndMisalignedPointers) {
  static Tensor raw = Tensor::make(DType::f32, {64}, Layout::contiguous, kSentinel);
  const TensorView misaligned = TensorView::contiguous(raw.storage.data() + 2, DType::f32, {4, 5});
  expect_error(null_data(&Views::input, &ErrFixture::input), {ErrorCode::bad_pointer}, "input");
  expect_error(null_data(&Views::target, &ErrFixture::target), {ErrorCode::bad_pointer}, "target");
  expect_error(put(&Views::input, misaligned), {ErrorCode::bad_pointer}, "input");
  expect_error(put(&Views::target, misaligned), {ErrorCode::bad_pointer}, "target");
  expect_error(put(&Views::weight, misaligned), {ErrorCode::bad_pointer}, "weight", kBoth, kWeighted);
  expect_error(null_data(&Views::loss, &ErrFixture::loss), {ErrorCode::bad_pointer}, "loss", kFwd);
  expect_error(null_data(&Views::gx, &ErrFixture::gx), {ErrorCode::bad_pointer}, "grad_input", kBwd);
  expect_error(put(&Views::gy, misaligned), {ErrorCode::bad_pointer}, "grad_target", kBwd);
  expect_error(null_data(&Views::up, &ErrFixture::up), {ErrorCode::bad_pointer}, "grad_loss", kBwd);
}
TEST(PointwiseErrors, BetaDeltaReduction) {
  const auto param = [](double v) {
    return ErrSetup([v](ErrFixture& f) {
      f.c.param = v;
      return Views{};
    });
  };
  for (double beta : {-1.0, -1e-300, kNaN, kInf}) {
    expect_error(param(beta), {ErrorCode::invalid_value}, "beta", kBoth, {PwLoss::smooth_l1});
  }
  for (double delta : {0.0, -0.0, -2.0, kNaN, kInf}) {
    expect_error(param(delta), {ErrorCode::invalid_value}, "delta", kBoth, {PwLoss::huber});
  }
  expect_error(
      [](ErrFixture& f) {
        f.c.red = static_cast<Reduction>(7);
        return Views{};
      },
      {ErrorCode::invalid_value}, "reduction");
}

}  // namespace
}  // namespace lftest::pointwise
