// The eleven elementwise losses forward and backward on the CPU against the float64 reference
// (tests/reference/pointwise_reference.hpp): one harness filled by tables. A Spec names a configuration (a loss and its
// options), a dtype, a reduction, a shape, which operands are broadcast (stride 0) or strided, the upstream gradient
// and the gradients asked for; build() draws the operands in the loss's domain and run_all() checks the loss and every
// gradient against the reference's error budget, and that nothing outside the outputs is written. Then the generic
// suites over every loss (options, configurations, sizes, layouts, empty / non-finite / huge values, finite
// differences, determinism across thread counts, argument errors); each loss's own edges are in
// pointwise_edges_test.cpp.
#include "lossfuse/pointwise.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "error_harness.hpp"
#include "lossfuse/parallel.hpp"
#include "pointwise_call.hpp"
#include "reference/pointwise_reference.hpp"
#include "test_util.hpp"

namespace lftest::pointwise {
namespace {

using lfref::PwLoss;
using lfref::PwOpts;
using lossfuse::PointwiseGrads;

constexpr PwLoss kLosses[] = {PwLoss::mse,           PwLoss::l1,
                              PwLoss::smooth_l1,     PwLoss::huber,
                              PwLoss::bce,           PwLoss::bce_with_logits,
                              PwLoss::kl_div,        PwLoss::poisson_nll,
                              PwLoss::gaussian_nll,  PwLoss::hinge_embedding,
                              PwLoss::margin_ranking};

// ---- configurations: a loss and its options -------------------------------------------------------------------

struct Config {
  PwLoss loss = PwLoss::mse;
  PwOpts o;
  std::string name;
};

std::vector<Config> make_configs() {
  std::vector<Config> v;
  const auto add = [&v](PwLoss l, std::string name, const std::function<void(PwOpts&)>& set = nullptr) {
    Config c{l, {}, std::move(name)};
    if (set) set(c.o);
    v.push_back(c);
  };
  add(PwLoss::mse, "mse");
  add(PwLoss::l1, "l1");
  for (double beta : {1.0, 0.5, 0.0, 2.0, 0.25, 0.3, 3.0})
    add(PwLoss::smooth_l1, "smoothl1_b" + num_name(beta), [=](PwOpts& o) { o.param = beta; });
  for (double delta : {1.0, 0.5, 2.0, 0.25, 0.3, 1.5, 3.0})
    add(PwLoss::huber, "huber_d" + num_name(delta), [=](PwOpts& o) { o.param = delta; });
  add(PwLoss::bce, "bce");
  for (bool pw : {false, true})
    add(PwLoss::bce_with_logits, pw ? "bcel_pw" : "bcel", [=](PwOpts& o) { o.pos_weight = pw; });
  for (bool lt : {false, true})
    for (bool bm : {false, true})
      add(PwLoss::kl_div, std::string("kl") + (lt ? "_logt" : "") + (bm ? "_batchmean" : ""),
          [=](PwOpts& o) { o.log_target = lt, o.batchmean = bm; });
  for (bool li : {true, false})
    for (bool full : {false, true})
      add(PwLoss::poisson_nll, std::string("poisson") + (li ? "_log" : "_lin") + (full ? "_full" : ""),
          [=](PwOpts& o) { o.log_input = li, o.full = full, o.eps = li ? 1e-8 : 0.25; });  // a visible eps where used
  for (bool full : {false, true})
    add(PwLoss::gaussian_nll, full ? "gaussian_full" : "gaussian", [=](PwOpts& o) { o.full = full, o.eps = 1e-6; });
  add(PwLoss::gaussian_nll, "gaussian_eps0p5", [](PwOpts& o) { o.eps = 0.5; });  // many elements clamped
  for (double m : {1.0, 0.5, -0.25})
    add(PwLoss::hinge_embedding, "hinge_m" + num_name(m), [=](PwOpts& o) { o.margin = m; });
  for (double m : {0.0, 0.5}) add(PwLoss::margin_ranking, "ranking_m" + num_name(m), [=](PwOpts& o) { o.margin = m; });
  return v;
}
const std::vector<Config>& configs() {
  static const std::vector<Config> v = make_configs();
  return v;
}
bool usable(const Config& c, Reduction red) { return !c.o.batchmean || red == Reduction::mean; }
// The k-th configuration of loss l usable with reduction red, cycling.
const Config& config_of(PwLoss l, Reduction red, std::uint64_t k) {
  std::vector<const Config*> of;
  for (const Config& c : configs())
    if (c.loss == l && usable(c, red)) of.push_back(&c);
  return *of[k % of.size()];
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

// ---- one problem ----------------------------------------------------------------------------------------------

enum class Up { absent, scalar, per_elem, per_elem_expanded, per_elem_transposed };

// Stored values of x, y, z (index 0, 1, 2) before they are written to their dtype.
using Values = std::array<std::vector<double>, 3>;

struct Spec {
  std::string name;
  Config c;
  DType dt = DType::f32;
  Reduction red = Reduction::mean;
  std::vector<std::int64_t> shape{4, 9};
  bool weight = false;                                                // where the loss takes one
  std::array<Bcast, 3> bcast{Bcast::none, Bcast::none, Bcast::none};  // x, y, z
  Bcast wb = Bcast::none;
  Layout in_layout = Layout::contiguous, grad_layout = Layout::contiguous;
  Up up = Up::absent;
  double up_scalar = -0.75;
  bool want_gx = true, want_gy = true, want_gz = true;  // each where the loss gives it
  bool smooth = false;                                  // values away from every kink (finite differences)
  std::uint64_t seed = 1;
  // Edits the stored values; only where no operand is broadcast, so each has the full shape.
  std::function<void(Rng&, Values&)> edit;
};
void PrintTo(const Spec& s, std::ostream* os) { *os << s.name; }

std::string base_name(const Spec& s) {
  return s.c.name + "_" + nm(s.dt) + "_" + red_name(s.red) + "_" + shape_name(s.shape) +
         (s.weight && lfref::pw_takes_weight(s.c.loss) ? "_w" : "");
}
bool has_z(const Spec& s) { return lfref::pw_has_z(s.c.loss, s.c.o); }
bool full_shapes(const Spec& s) {
  return s.bcast[0] == Bcast::none && s.bcast[1] == Bcast::none && s.bcast[2] == Bcast::none;
}

Up default_up(Reduction r, std::uint64_t k) {
  if (r == Reduction::none) return k % 3 == 0 ? Up::absent : Up::per_elem;
  return k % 2 == 0 ? Up::scalar : Up::absent;
}

// Values on a 1/32 grid in [-4, 4] (exact in every dtype) with probability 1/2, else N(0, 2).
double grid_or_normal(Rng& rng) {
  if (rng.uniform() < 0.5) return static_cast<double>(rng.index(257) - 128) / 32.0;
  return 2.0 * rng.normal();
}

// Stored element k of operand op (0 x, 1 y, 2 z), in the loss's domain.
double gen(const Spec& s, int op, Rng& rng, std::int64_t k) {
  const PwOpts& o = s.c.o;
  const bool sm = s.smooth;
  switch (s.c.loss) {
    case PwLoss::bce: return op == 0 ? rng.uniform(sm ? 0.05 : 0.0, sm ? 0.95 : 1.0) : rng.uniform();
    case PwLoss::bce_with_logits: return op == 0 ? 4 * rng.normal() : op == 1 ? rng.uniform() : rng.uniform(0.25, 3.0);
    case PwLoss::kl_div:
      if (op == 0 || o.log_target) return std::log(rng.uniform(0.01, 1.0));
      return !sm && k % 11 == 3 ? 0.0 : rng.uniform(0.05, 1.0);
    case PwLoss::poisson_nll:  // counts 0..6 (0 and 1 exercise Stirling's mask), or smooth positive values
      if (op == 0) return o.log_input ? 2 * rng.normal() : rng.uniform(0.05, 4.0);
      return sm ? rng.uniform(0.2, 6.0) : static_cast<double>(rng.index(7));
    case PwLoss::gaussian_nll:  // var 0 now and then: clamped to eps
      if (op < 2) return rng.normal();
      return sm ? rng.uniform(std::max(0.1, 2 * o.eps), 2.0) : (k % 13 == 5 ? 0.0 : rng.uniform(0.0, 2.0));
    case PwLoss::hinge_embedding:  // targets other than +-1 now and then (torch: both terms)
      if (op == 0) return 2 * rng.normal();
      return k % 9 == 4 ? (k % 2 ? 0.0 : 2.0) : (rng.index(2) ? 1.0 : -1.0);
    case PwLoss::margin_ranking: return op < 2 ? rng.normal() : (rng.index(2) ? 1.0 : -1.0);
    default: return sm ? 2 * rng.normal() : grid_or_normal(rng);
  }
}

// With full-shape operands: elements exactly on a kink (on the exact grid): d == 0 and |d| == beta / delta for the
// losses of d = x - y, margin == x (hinge_embedding), margin == z (x - y) (margin_ranking); for smooth specs, x moved
// off every kink instead.
void place_kinks(const Spec& s, Rng& rng, Values& v) {
  const PwLoss l = s.c.loss;
  const double p = l == PwLoss::smooth_l1 || l == PwLoss::huber ? s.c.o.param : 1.0, m = s.c.o.margin;
  for (std::size_t i = 0; i < v[0].size(); ++i) {
    double &x = v[0][i], &y = v[1][i];
    if (!s.smooth && lfref::pw_of_difference(l)) {
      const double r = rng.uniform();
      if (r < 0.05) {
        x = y = static_cast<double>(rng.index(129) - 64) / 32.0;
      } else if (r < 0.10) {
        y = static_cast<double>(rng.index(129) - 64) / 32.0;
        x = y + (rng.uniform() < 0.5 ? p : -p);
      }
    }
    if (!s.smooth && rng.uniform() < 0.05) {  // exactly at the hinge: margin - x == 0, margin - z (x - y) == 0
      if (l == PwLoss::hinge_embedding) x = m;
      if (l == PwLoss::margin_ranking) y = static_cast<double>(rng.index(129) - 64) / 32.0, x = y + v[2][i] * m;
    }
    if (!s.smooth) continue;
    const auto near = [](double a, double b) { return std::fabs(a - b) < 0.05; };
    if (lfref::pw_of_difference(l))
      while (near(x - y, 0) || near(std::fabs(x - y), p)) x += 0.1;
    if (l == PwLoss::hinge_embedding)
      while (near(x, m)) x += 0.1;
    if (l == PwLoss::margin_ranking)
      while (near(m, v[2][i] * (x - y))) x += 0.1;
  }
}

struct Problem {
  Spec s;
  Operand x, y;
  std::optional<Operand> z, w, up;
  lfref::PwResult ref;

  [[nodiscard]] PwArgs args(Reduction red) const {
    PwArgs a{s.c.loss, s.c.o, red, x.view, y.view, std::nullopt, std::nullopt};
    if (z) a.z = z->view;
    if (w) a.weight = w->view;
    return a;
  }
  [[nodiscard]] PwArgs args() const { return args(s.red); }
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
  Values v;
  for (int op = 0; op < (has_z(s) ? 3 : 2); ++op) {
    v[op].resize(static_cast<std::size_t>(prod(small_shape(s.shape, s.bcast[op]))));
    for (std::size_t k = 0; k < v[op].size(); ++k) v[op][k] = gen(s, op, rng, static_cast<std::int64_t>(k));
  }
  if (full_shapes(s)) {
    place_kinks(s, rng, v);
    if (s.edit) s.edit(rng, v);
  }
  const auto operand = [&](int op) {
    return make_operand(s.dt, s.shape, s.in_layout, s.bcast[op], [&](std::int64_t k) { return v[op][k]; });
  };
  p.x = operand(0), p.y = operand(1);
  if (has_z(s)) p.z = operand(2);
  lfref::PwInput in;
  if (s.weight && lfref::pw_takes_weight(s.c.loss)) {
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
  in.loss = s.c.loss, in.opts = s.c.o;
  in.x = p.x.v, in.y = p.y.v;
  if (p.z) in.z = p.z->v;
  in.rows = s.shape.empty() ? 1 : s.shape[0];
  in.reduction = s.red;
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
  pw_forward(p.args(), loss.view);
  if (s.red == Reduction::none) {
    EXPECT_TRUE(close_all("loss", loss.values(), p.ref.elem_loss, p.ref.elem_loss_tol, p.acc()));
  } else {
    EXPECT_TRUE(close_one("loss", loss.get(0), p.ref.loss, p.ref.loss_tol, p.acc()));
  }
  EXPECT_TRUE(loss.outside_untouched(kSentinel));

  const PwLoss l = s.c.loss;
  std::optional<Tensor> gx, gy, gz;
  if (s.want_gx) gx = make_grad(s.dt, s.shape, s.grad_layout);
  if (s.want_gy && lfref::pw_y_grad(l)) gy = make_grad(s.dt, s.shape, s.grad_layout);
  if (s.want_gz && p.z && lfref::pw_z_grad(l)) gz = make_grad(s.dt, s.shape, s.grad_layout);
  PointwiseGrads g;
  if (gx) g.input = gx->view;
  if (gy) g.target = gy->view;
  if (gz) g.var = gz->view;
  pw_backward(p.args(), p.upv(), g);
  const auto check = [&](const char* what, const std::optional<Tensor>& t, const std::vector<double>& ref,
                         const std::vector<double>& tol) {
    if (!t) return;
    EXPECT_TRUE(close_all(what, t->values(), ref, tol, s.dt));
    EXPECT_TRUE(t->outside_untouched(kSentinel)) << "wrote outside " << what;
  };
  check("grad_input", gx, p.ref.gx, p.ref.gx_tol);
  check("grad_target", gy, p.ref.gy, p.ref.gy_tol);
  check("grad_z", gz, p.ref.gz, p.ref.gz_tol);
  EXPECT_TRUE(p.x.store.storage == x0) << "the input was modified";
  EXPECT_TRUE(p.y.store.storage == y0) << "the target was modified";
}

class Pointwise : public ::testing::TestWithParam<Spec> {};
TEST_P(Pointwise, MatchesReference) { run_all(GetParam()); }

auto spec_name = [](const auto& i) { return i.param.name; };

// ---- the suites ---------------------------------------------------------------------------------------------------

// Every loss x dtype x reduction x shape (0-d, 1-D of 1, 7, 31, 1271, 2-D, 3-D) x weight, the loss's configurations
// in turn; now and then only some of the gradients.
std::vector<Spec> option_specs() {
  std::vector<Spec> v;
  std::uint64_t k = 0;
  const std::vector<std::vector<std::int64_t>> shapes = {{}, {1}, {7}, {31}, {1271}, {4, 9}, {3, 5, 7}};
  for (PwLoss l : kLosses)
    for (DType dt : kFloats)
      for (Reduction red : kReds)
        for (const auto& shape : shapes)
          for (int w = 0; w < (lfref::pw_takes_weight(l) ? 2 : 1); ++w) {
            Spec s;
            s.c = config_of(l, red, k), s.dt = dt, s.red = red, s.shape = shape, s.weight = w;
            s.up = default_up(red, k);
            s.want_gx = k % 5 != 3, s.want_gy = k % 5 != 4, s.want_gz = k % 7 != 2;
            s.seed = ++k;
            s.name = base_name(s) + (!s.want_gx ? "_nogx" : "") + (!s.want_gy ? "_nogy" : "");
            v.push_back(s);
          }
  return v;
}
INSTANTIATE_TEST_SUITE_P(Options, Pointwise, ::testing::ValuesIn(option_specs()), spec_name);

// Every configuration (the beta and delta sweeps among them) x dtype x reduction, on two shapes.
std::vector<Spec> config_specs() {
  std::vector<Spec> v;
  std::uint64_t k = 0;
  for (const Config& c : configs())
    for (DType dt : kFloats)
      for (Reduction red : kReds)
        for (const auto& shape : std::vector<std::vector<std::int64_t>>{{5, 31}, {2, 3, 5}}) {
          if (!usable(c, red)) continue;
          Spec s;
          s.c = c, s.dt = dt, s.red = red, s.shape = shape, s.weight = k % 2 == 0;
          s.up = default_up(red, k);
          s.seed = 300 + ++k;
          s.name = base_name(s);
          v.push_back(s);
        }
  // kl_div's batchmean divides by input.size(0): 0-d by 1, 1-D by its length
  for (const auto& shape : std::vector<std::vector<std::int64_t>>{{}, {5}, {4, 3}, {2, 3, 4}})
    for (const Config& c : configs()) {
      if (!c.o.batchmean) continue;
      Spec s;
      s.c = c, s.dt = DType::f64, s.shape = shape, s.up = Up::scalar;
      s.seed = 300 + ++k;
      s.name = "denominator_" + base_name(s);
      v.push_back(s);
    }
  return v;
}
INSTANTIATE_TEST_SUITE_P(Configs, Pointwise, ::testing::ValuesIn(config_specs()), spec_name);

// Long sums: 100003 elements (several tiles), and rows longer than a tile.
std::vector<Spec> large_specs() {
  std::vector<Spec> v;
  std::uint64_t k = 0;
  for (PwLoss l : kLosses)
    for (DType dt : kFloats)
      for (Reduction red : kReds) {
        Spec s;
        s.c = config_of(l, red, k), s.dt = dt, s.red = red;
        s.shape = (k % 2 == 0) ? std::vector<std::int64_t>{100003} : std::vector<std::int64_t>{3, 20011};
        s.weight = k % 3 != 2;
        s.up = default_up(red, k);
        s.seed = 500 + ++k;
        s.name = base_name(s);
        v.push_back(s);
      }
  return v;
}
INSTANTIATE_TEST_SUITE_P(Large, Pointwise, ::testing::ValuesIn(large_specs()), spec_name);

// Non-contiguous operands, expanded operands / weight / upstream gradient, strided gradient outputs.
std::vector<Spec> layout_specs() {
  std::vector<Spec> v;
  std::uint64_t k = 0;
  struct L {
    const char* name;
    std::vector<std::int64_t> shape;
    Layout in, grad;
    Bcast yb, wb;
    bool exp_up;
    Bcast xb = Bcast::none;
    Up up_none = Up::per_elem;  // the upstream gradient for reduction none, when not expanded
  };
  using B = Bcast;
  using Lay = Layout;
  const std::vector<L> ls = {
      {"transposed", {13, 37}, Lay::transposed, Lay::contiguous, B::none, B::none, false},
      {"padded", {6, 5, 19}, Lay::padded, Lay::contiguous, B::none, B::none, false},
      {"stridedgrad_t", {13, 37}, Lay::contiguous, Lay::transposed, B::none, B::none, false},
      {"stridedgrad_p", {6, 5, 19}, Lay::contiguous, Lay::padded, B::none, B::none, false},
      {"bcast_target_outer", {9, 41}, Lay::contiguous, Lay::contiguous, B::outer, B::none, false},
      {"bcast_target_inner", {9, 41}, Lay::contiguous, Lay::contiguous, B::inner, B::none, false},
      {"bcast_target_1d", {33}, Lay::contiguous, Lay::contiguous, B::inner, B::none, false},
      {"bcast_weight", {7, 23}, Lay::contiguous, Lay::contiguous, B::none, B::outer, false},
      {"bcast_all_padded", {4, 3, 35}, Lay::padded, Lay::padded, B::outer, B::inner, true},
      {"transposed_bcast", {17, 10}, Lay::transposed, Lay::transposed, B::inner, B::outer, true},
      {"bcast_input_outer", {9, 41}, Lay::contiguous, Lay::contiguous, B::none, B::none, false, B::outer},
      {"bcast_input_inner_padded", {5, 4, 21}, Lay::padded, Lay::transposed, B::outer, B::none, false, B::inner},
      {"strided_up", {11, 29}, Lay::contiguous, Lay::padded, B::none, B::none, false, B::none, Up::per_elem_transposed},
      {"8d_padded",
       {2, 1, 3, 1, 2, 2, 1, 19},
       Lay::padded,
       Lay::padded,
       B::none,
       B::none,
       false,
       B::none,
       Up::per_elem_transposed},
      {"8d_transposed_bcast", {2, 3, 1, 2, 2, 1, 2, 5}, Lay::transposed, Lay::contiguous, B::inner, B::outer, true},
  };
  for (PwLoss l : kLosses)
    for (DType dt : kFloats)
      for (const L& c : ls)
        for (Reduction red : kReds) {
          Spec s;
          s.c = config_of(l, red, k), s.dt = dt, s.red = red, s.shape = c.shape;
          s.in_layout = c.in, s.grad_layout = c.grad;
          s.bcast = {c.xb, c.yb, std::array<B, 3>{B::none, B::outer, B::inner}[k % 3]};  // z in turn
          s.weight = c.wb != B::none || k % 2 == 0;
          s.wb = c.wb;
          s.up = red == Reduction::none ? (c.exp_up || k % 2 ? Up::per_elem_expanded : c.up_none) : default_up(red, k);
          s.seed = 700 + ++k;
          s.name = s.c.name + "_" + nm(dt) + "_" + c.name + "_" + red_name(red) + (s.weight ? "_w" : "") +
                   (has_z(s) ? "_zb" + std::to_string(k % 3) : "") +
                   (s.up == Up::per_elem_expanded     ? "_expup"
                    : s.up == Up::per_elem_transposed ? "_stridedup"
                                                      : "");
          v.push_back(s);
        }
  return v;
}
INSTANTIATE_TEST_SUITE_P(Layouts, Pointwise, ::testing::ValuesIn(layout_specs()), spec_name);

// Empty inputs for every loss; infinities, NaN (inf - inf among them) and huge values in both operands of the
// losses of d = x - y; upstream scalars of 0 and of large and small magnitudes.
std::vector<Spec> edge_specs() {
  std::vector<Spec> v;
  std::uint64_t k = 0;
  const auto spec = [&k](PwLoss l, DType dt, Reduction red, std::vector<std::int64_t> shape) {
    Spec s;
    s.c = config_of(l, red, k), s.dt = dt, s.red = red, s.shape = std::move(shape);
    s.weight = k % 2 == 0;
    s.up = default_up(red, k);
    s.seed = 900 + ++k;
    return s;
  };
  for (PwLoss l : kLosses)
    for (DType dt : kFloats)
      for (Reduction red : kReds) {
        for (const auto& shape : std::vector<std::vector<std::int64_t>>{{0}, {3, 0}, {0, 4}}) {
          Spec s = spec(l, dt, red, shape);
          s.name = "empty_" + base_name(s);
          v.push_back(s);
        }
        if (!lfref::pw_of_difference(l)) continue;
        Spec inf = spec(l, dt, red, {3, 11});
        inf.edit = [](Rng&, Values& o) {
          o[0][2] = kInf, o[0][3] = -kInf, o[1][5] = kInf, o[0][7] = -kInf, o[1][7] = kInf, o[1][8] = -kInf;
        };
        inf.name = "inf_" + base_name(inf);
        v.push_back(inf);
        Spec nan = spec(l, dt, red, {3, 11});
        nan.edit = [](Rng&, Values& o) {
          o[0][0] = kNaN, o[1][1] = kNaN, o[0][2] = kInf, o[0][3] = -kInf;
          o[0][4] = kInf, o[1][4] = kInf;  // inf - inf = NaN
          o[1][5] = kInf, o[0][6] = kNaN, o[1][6] = kNaN, o[0][7] = -kInf, o[1][7] = kInf;
        };
        nan.name = "nan_" + base_name(nan);
        v.push_back(nan);
        // per-element mse overflows the float32 loss to inf as torch; the rest stays finite
        Spec huge = spec(l, dt, red, {4, 9});
        const double mag = dt == DType::f16 ? 3e4 : dt == DType::f64 ? 1e200 : 1e30;
        huge.edit = [mag](Rng& rng, Values& o) {
          for (std::size_t i = 0; i < o[0].size(); ++i) {
            o[0][i] = mag * rng.uniform(-1.0, 1.0);
            if (i % 3 == 0) o[1][i] = -o[0][i];
          }
        };
        huge.name = "huge_" + base_name(huge);
        v.push_back(huge);
      }
  for (PwLoss l : kLosses)
    for (double g : {0.0, 3.5e3, -1e-3}) {
      Spec s = spec(l, DType::f32, Reduction::sum, {31});
      s.up = Up::scalar, s.up_scalar = g;
      s.name = "upscalar_" + base_name(s) + "_" + std::to_string(k);
      v.push_back(s);
    }
  return v;
}
INSTANTIATE_TEST_SUITE_P(Edge, Pointwise, ::testing::ValuesIn(edge_specs()), spec_name);

// NaN, infinities and boundary values in one operand at a time, every third element of 40 (vector bodies and scalar
// tails both see them), for every configuration: where torch propagates them (the values were checked against torch
// 2.15 on these inputs). bce's input range and gaussian_nll's negative var raise instead (pointwise_edges_test.cpp).
std::vector<Spec> non_finite_specs() {
  std::vector<Spec> v;
  std::uint64_t k = 0;
  for (const Config& c : configs())
    for (DType dt : {DType::f32, DType::f64, DType::bf16})
      for (Reduction red : kReds)
        for (int op = 0; op < 3; ++op) {
          Spec s;
          s.c = c, s.dt = dt, s.red = red, s.shape = {40}, s.weight = k % 2 == 0;
          s.up = default_up(red, k);
          s.seed = 1300 + ++k;
          if (!usable(c, red) || (op == 2 && !has_z(s)) || (c.loss == PwLoss::bce && op == 0)) continue;
          const bool var = c.loss == PwLoss::gaussian_nll && op == 2;  // no negative values
          s.edit = [op, var](Rng&, Values& o) {
            const double all[] = {kNaN, kInf, -kInf, 0.0, 1.0, -1.0, 0.5, 100.0};
            const double nonneg[] = {kNaN, kInf, 0.0, 1.0, 0.5, 100.0};
            for (std::size_t i = 0; i < o[op].size(); i += 3) o[op][i] = var ? nonneg[(i / 3) % 6] : all[(i / 3) % 8];
          };
          s.name = "special_" + std::string("xyz").substr(op, 1) + "_" + base_name(s);
          v.push_back(s);
        }
  return v;
}
INSTANTIATE_TEST_SUITE_P(NonFinite, Pointwise, ::testing::ValuesIn(non_finite_specs()), spec_name);

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
  in.loss = PwLoss::huber, in.opts.param = 1.0;
  r = lfref::pointwise(in);
  EXPECT_DOUBLE_EQ(r.loss, 4.0);  // mean(w l): divides by numel
  EXPECT_DOUBLE_EQ(r.gx[4], 1.0);
  in.weight.clear();
  in.reduction = Reduction::none, in.opts.param = 2.0;
  r = lfref::pointwise(in);
  EXPECT_EQ(r.elem_loss, (std::vector<double>{0, 0.5, 2, 0.5, 4}));
  EXPECT_EQ(r.gx, (std::vector<double>{0, 1, 2, -1, 2}));
  in.loss = PwLoss::smooth_l1, in.opts.param = 0.0;
  r = lfref::pointwise(in);
  EXPECT_EQ(r.elem_loss, (std::vector<double>{0, 1, 2, 1, 3}));
  EXPECT_EQ(r.gx, (std::vector<double>{0, 1, 1, -1, 1}));  // torch 2.15: 0 at d == 0 with beta == 0
  in.opts.param = 1.0;
  r = lfref::pointwise(in);
  EXPECT_EQ(r.elem_loss, (std::vector<double>{0, 0.5, 1.5, 0.5, 2.5}));
  EXPECT_EQ(r.gx, (std::vector<double>{0, 1, 1, -1, 1}));
  // l1 at NaN: torch's sign(NaN) is 0, so the gradient is 0; smooth_l1 / huber give NaN.
  in.x = {kNaN, 1, kInf}, in.y = {0, kNaN, kInf};
  in.loss = PwLoss::l1;
  r = lfref::pointwise(in);
  EXPECT_EQ(r.gx, (std::vector<double>{0, 0, 0}));
  EXPECT_TRUE(std::isnan(r.elem_loss[0]));
  // F.kl_div(x, y, reduction='batchmean') with x = log([0.25, 0.5]) rows [[., .]], y = [[0.5, 0.5]]: size(0) = 1
  in = lfref::PwInput{};
  in.loss = PwLoss::kl_div, in.opts.batchmean = true, in.rows = 1;
  in.x = {std::log(0.25), std::log(0.5)}, in.y = {0.5, 0.5};
  in.u = 0x1p-53, in.compute = lfref::kF64, in.out = lfref::kF64;
  r = lfref::pointwise(in);
  EXPECT_NEAR(r.loss, 0.5 * std::log(2.0), 1e-15);
  // F.margin_ranking_loss(1, 2, target=1, margin=0.5, reduction='sum') = 1.5, d/dinput1 = -1, d/dtarget = 1
  in = lfref::PwInput{};
  in.loss = PwLoss::margin_ranking, in.opts.margin = 0.5, in.reduction = Reduction::sum;
  in.x = {1}, in.y = {2}, in.z = {1};
  r = lfref::pointwise(in);
  EXPECT_EQ(r.loss, 1.5);
  EXPECT_EQ(r.gx[0], -1.0);
  EXPECT_EQ(r.gz[0], 1.0);
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

// Every configuration and reduction: the backward against central differences of sum(g * loss) over each operand
// torch differentiates, values kept off the kinks. Budget: 1e-6 relative, plus the forward's rounding (a few u of the
// sum of |g l|) over the step.
TEST(PointwiseFiniteDifferences, Float64) {
  std::uint64_t k = 0;
  for (const Config& c : configs())
    for (Reduction red : kReds) {
      if (!usable(c, red)) continue;
      Spec s;
      s.c = c, s.dt = DType::f64, s.red = red, s.shape = {2, 5}, s.weight = true, s.smooth = true;
      s.up = red == Reduction::none ? Up::per_elem : Up::scalar, s.up_scalar = 1.7;
      s.seed = 4000 + ++k;
      SCOPED_TRACE(base_name(s));
      Problem p = build(s);
      const std::int64_t n = 10;
      Tensor loss = Tensor::make(DType::f64, red == Reduction::none ? s.shape : std::vector<std::int64_t>{});
      const auto total = [&] {
        pw_forward(p.args(), loss.view);
        double t = 0, mag = 0;
        for (std::int64_t i = 0; i < loss.numel(); ++i) {
          const double g = p.up->v[red == Reduction::none ? i : 0] * loss.get(i);
          t += g, mag += std::fabs(g);
        }
        return std::pair{t, mag};
      };
      Tensor gx = Tensor::make(DType::f64, s.shape), gy = Tensor::make(DType::f64, s.shape);
      Tensor gz = Tensor::make(DType::f64, s.shape);
      const bool want_y = lfref::pw_y_grad(c.loss), want_z = p.z && lfref::pw_z_grad(c.loss);
      PointwiseGrads g{gx.view, std::nullopt, std::nullopt};
      if (want_y) g.target = gy.view;
      if (want_z) g.var = gz.view;
      pw_backward(p.args(), p.upv(), g);
      const auto fd = [&](Operand& op, const Tensor& grad, const char* what) {
        for (std::int64_t i = 0; i < n; ++i) {
          const double v = op.store.get(i), h = 1e-6 * std::max(1.0, std::fabs(v));
          op.store.set(i, v + h);
          const auto [lp, mag] = total();
          op.store.set(i, v - h);
          const double lm = total().first;
          op.store.set(i, v);
          const double num = (lp - lm) / (2 * h);
          EXPECT_NEAR(grad.get(i), num, 1e-6 * (1 + std::fabs(num)) + 16 * 0x1p-53 * mag / h)
              << what << " [" << i << "]";
        }
      };
      fd(p.x, gx, "input");
      if (want_y) fd(p.y, gy, "target");
      if (want_z) fd(*p.z, gz, "z");
    }
}

// ---- determinism across thread counts ------------------------------------------------------------------------

// Every configuration: the reduced losses and the input gradient bitwise the same on 1, 2 and 3 threads.
TEST(PointwiseMisc, DeterministicAcrossThreads) {
  std::uint64_t k = 0;
  for (const Config& c : configs()) {
    Spec s;
    s.c = c, s.red = Reduction::mean, s.shape = {3, 40009}, s.weight = true, s.seed = 5000 + ++k;
    SCOPED_TRACE(base_name(s));
    const Problem p = build(s);
    std::vector<std::uint8_t> sum0, mean0, grad0;
    for (int threads : {1, 2, 3, 1}) {
      ThreadsGuard guard(threads);
      Tensor sum = Tensor::make(DType::f32, {}), mean = Tensor::make(DType::f32, {});
      Tensor grad = Tensor::make(DType::f32, s.shape);
      if (!c.o.batchmean) pw_forward(p.args(Reduction::sum), sum.view);
      pw_forward(p.args(), mean.view);
      pw_backward(p.args(), std::nullopt, {grad.view, std::nullopt, std::nullopt});
      if (mean0.empty()) {
        sum0 = sum.storage, mean0 = mean.storage, grad0 = grad.storage;
        EXPECT_TRUE(close_one("loss", mean.get(0), p.ref.loss, p.ref.loss_tol, DType::f32));
      }
      EXPECT_TRUE(sum.storage == sum0) << threads << " threads";
      EXPECT_TRUE(mean.storage == mean0) << threads << " threads";
      EXPECT_TRUE(grad.storage == grad0) << threads << " threads";
    }
  }
}

// ---- errors ---------------------------------------------------------------------------------------------------

constexpr std::initializer_list<PwLoss> kAll = {PwLoss::mse,           PwLoss::l1,
                                                PwLoss::smooth_l1,     PwLoss::huber,
                                                PwLoss::bce,           PwLoss::bce_with_logits,
                                                PwLoss::kl_div,        PwLoss::poisson_nll,
                                                PwLoss::gaussian_nll,  PwLoss::hinge_embedding,
                                                PwLoss::margin_ranking};
constexpr std::initializer_list<PwLoss> kWeighted = {PwLoss::mse, PwLoss::l1, PwLoss::huber, PwLoss::bce,
                                                     PwLoss::bce_with_logits};
constexpr std::initializer_list<PwLoss> kTargetGrad = {PwLoss::mse,          PwLoss::l1,
                                                       PwLoss::smooth_l1,    PwLoss::huber,
                                                       PwLoss::bce,          PwLoss::bce_with_logits,
                                                       PwLoss::kl_div,       PwLoss::poisson_nll,
                                                       PwLoss::gaussian_nll, PwLoss::margin_ranking};
constexpr std::initializer_list<PwLoss> kThird = {PwLoss::bce_with_logits, PwLoss::gaussian_nll,
                                                  PwLoss::margin_ranking};
constexpr std::initializer_list<PwLoss> kThirdGrad = {PwLoss::gaussian_nll, PwLoss::margin_ranking};

// The arguments' names in the library's messages, by loss.
struct Names {
  const char *x = "input", *y = "target", *z = "", *gx = "grad_input", *gy = "grad_target", *gz = "";
};
Names names_of(PwLoss l) {
  if (l == PwLoss::margin_ranking) return {"input1", "input2", "target", "grad_input1", "grad_input2", "grad_target"};
  if (l == PwLoss::gaussian_nll) return {"input", "target", "var", "grad_input", "grad_target", "grad_var"};
  if (l == PwLoss::bce_with_logits) return {"input", "target", "pos_weight", "grad_input", "grad_target", ""};
  return {};
}
// An argument's name: the same for every loss, or one of Names.
struct Arg {
  Arg(const char* fixed) : fixed_(fixed) {}       // NOLINT(google-explicit-constructor): written as a string
  Arg(const char* Names::*slot) : slot_(slot) {}  // NOLINT(google-explicit-constructor)
  [[nodiscard]] std::string of(PwLoss l) const { return fixed_ != nullptr ? fixed_ : names_of(l).*slot_; }

 private:
  const char* fixed_ = nullptr;
  const char* Names::*slot_ = nullptr;
};

// Valid operands of every loss ((4, 5), float32: x in [0, 0.76], y 0.5, z and the weight 1) and guarded outputs.
struct ErrFixture : GuardedBuffers {
  Tensor input = Tensor::make(DType::f32, {4, 5}, Layout::contiguous, kSentinel);
  Tensor target = Tensor::make(DType::f32, {4, 5}, Layout::contiguous, kSentinel);
  Tensor third = Tensor::make(DType::f32, {4, 5}, Layout::contiguous, kSentinel);
  Tensor weight = Tensor::make(DType::f32, {4, 5}, Layout::contiguous, kSentinel);
  Tensor loss = Tensor::make(DType::f32, {}, Layout::contiguous, kSentinel);
  Tensor gx = Tensor::make(DType::f32, {4, 5}, Layout::contiguous, kSentinel);
  Tensor gy = Tensor::make(DType::f32, {4, 5}, Layout::contiguous, kSentinel);
  Tensor gz = Tensor::make(DType::f32, {4, 5}, Layout::contiguous, kSentinel);
  Tensor up = Tensor::make(DType::f32, {}, Layout::contiguous, kSentinel);
  PwArgs a;
  ErrFixture() {
    for (std::int64_t i = 0; i < 20; ++i) {
      input.set(i, 0.04 * static_cast<double>(i)), target.set(i, 0.5), third.set(i, 1.0), weight.set(i, 1.0);
    }
    up.set(0, 1.0);
    guard("input", input), guard("target", target), guard("third", third), guard("weight", weight);
    guard("loss", loss), guard("grad_input", gx), guard("grad_target", gy), guard("grad_z", gz);
    guard("grad_loss", up);
  }
  // The loss's valid call: pos_weight given to bce_with_logits, every gradient the loss has.
  void set_loss(PwLoss l) {
    a.loss = l, a.opts = PwOpts{}, a.opts.pos_weight = true, a.red = Reduction::mean;
    a.x = input.view, a.y = target.view, a.z = third.view, a.weight = weight.view;
  }
  [[nodiscard]] PointwiseGrads grads() const {
    PointwiseGrads g{gx.view, std::nullopt, std::nullopt};
    if (lfref::pw_y_grad(a.loss)) g.target = gy.view;
    if (lfref::pw_z_grad(a.loss)) g.var = gz.view;
    return g;
  }
};
struct Views {
  std::optional<TensorView> input, target, third, weight, loss, gx, gy, gz, up;
};
enum class Entry { forward, backward };

void expect_error(const std::function<Views(ErrFixture&)>& setup, std::initializer_list<ErrorCode> codes,
                  const Arg& argument, std::initializer_list<Entry> entries = {Entry::forward, Entry::backward},
                  std::initializer_list<PwLoss> losses = kAll) {
  for (PwLoss l : losses) {
    SCOPED_TRACE(names_of(l).x + std::string(" of loss ") + std::to_string(static_cast<int>(l)));
    expect_entry_errors<ErrFixture, Entry, Views>(
        [&](ErrFixture& f) {
          f.set_loss(l);
          return setup(f);
        },
        codes, entries,
        [](const ErrFixture& f, Entry e, const Views& v) {
          PwArgs a = f.a;
          a.x = v.input.value_or(a.x), a.y = v.target.value_or(a.y), a.z = v.third.value_or(*a.z);
          a.weight = v.weight.value_or(*a.weight);
          if (e == Entry::forward) return pw_forward(a, v.loss.value_or(f.loss.view));
          PointwiseGrads g = f.grads();
          g.input = v.gx.value_or(*g.input);
          if (v.gy) g.target = v.gy;
          if (v.gz) g.var = v.gz;
          pw_backward(a, v.up ? v.up : std::optional<TensorView>(f.up.view), g);
        },
        [](Entry e) { return std::string(e == Entry::forward ? "forward" : "backward"); }, argument.of(l));
  }
}
constexpr std::initializer_list<Entry> kBoth = {Entry::forward, Entry::backward};
constexpr std::initializer_list<Entry> kFwd = {Entry::forward}, kBwd = {Entry::backward};
constexpr Reduction kNone = Reduction::none, kMean = Reduction::mean;

// Setups for expect_error: one view of the call replaced, after setting the reduction.
using Slot = std::optional<TensorView> Views::*;
using ErrSetup = std::function<Views(ErrFixture&)>;
// ... by a fixed view.
ErrSetup put(Slot slot, const TensorView& t, Reduction red = kMean) {
  return [slot, t, red](ErrFixture& f) {
    f.a.red = red;
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
// ... by editing the options.
ErrSetup options(const std::function<void(PwArgs&)>& edit) {
  return [edit](ErrFixture& f) {
    edit(f.a);
    return Views{};
  };
}

TEST(PointwiseErrors, ValidFixtureRuns) {
  for (PwLoss l : kAll) {
    ErrFixture f;
    f.set_loss(l);
    EXPECT_NO_THROW(pw_forward(f.a, f.loss.view));
    EXPECT_NO_THROW(pw_backward(f.a, f.up.view, f.grads()));
    EXPECT_NO_THROW(pw_backward(f.a, std::nullopt, {std::nullopt, std::nullopt, std::nullopt}));
  }
}
TEST(PointwiseErrors, OperandDtypeAndShape) {
  static const Tensor t64 = Tensor::make(DType::f64, {4, 5}), t16 = Tensor::make(DType::bf16, {4, 5}),
                      ti = Tensor::make(DType::i64, {4, 5});
  static const Tensor t54 = Tensor::make(DType::f32, {5, 4}), t4 = Tensor::make(DType::f32, {4}),
                      t451 = Tensor::make(DType::f32, {4, 5, 1});
  for (const Tensor* t : {&t64, &t16, &ti}) {
    expect_error(put(&Views::target, t->view), {ErrorCode::dtype_mismatch}, &Names::y);
    expect_error(put(&Views::third, t->view), {ErrorCode::dtype_mismatch}, &Names::z, kBoth, kThird);
  }
  for (const Tensor* t : {&t54, &t4, &t451}) {
    expect_error(put(&Views::target, t->view), {ErrorCode::shape_mismatch}, &Names::y);
    expect_error(put(&Views::third, t->view), {ErrorCode::shape_mismatch}, &Names::z, kBoth, kThird);
  }
  static const Tensor xi = Tensor::make(DType::i32, {4, 5});
  expect_error(put(&Views::input, xi.view), {ErrorCode::dtype_mismatch}, &Names::x);
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
  struct G {
    Slot slot;
    const char* Names::*name;
    std::initializer_list<PwLoss> losses;
  };
  for (const G& s : {G{&Views::gx, &Names::gx, kAll}, G{&Views::gy, &Names::gy, kTargetGrad},
                     G{&Views::gz, &Names::gz, kThirdGrad}}) {
    expect_error(put(s.slot, g64.view), {ErrorCode::dtype_mismatch}, s.name, kBwd, s.losses);
    expect_error(put(s.slot, g54.view), {ErrorCode::shape_mismatch}, s.name, kBwd, s.losses);
    expect_error(put(s.slot, g20.view), {ErrorCode::shape_mismatch}, s.name, kBwd, s.losses);
    // a zero stride on a dim of size > 1: repeated elements
    TensorView rows = g5.view, cols = g4.view;
    rows.shape[0] = 4, rows.strides[0] = 0;
    cols.shape[1] = 5, cols.strides[1] = 0;
    for (const TensorView& t : {rows, cols}) {
      expect_error(put(s.slot, t), {ErrorCode::bad_pointer, ErrorCode::invalid_value}, s.name, kBwd, s.losses);
    }
    // no zero stride, but rows that overlap: strides (1, 1) and (4, 1) over a (4, 5) gradient
    for (std::int64_t row_stride : {1, 4}) {
      TensorView t = g20.view;
      t.ndim = 2, t.shape[0] = 4, t.shape[1] = 5, t.strides[0] = row_stride, t.strides[1] = 1;
      expect_error(put(s.slot, t), {ErrorCode::bad_pointer}, s.name, kBwd, s.losses);
    }
  }
}
TEST(PointwiseErrors, GradientsTheLossDoesNotGive) {
  static const Tensor g = Tensor::make(DType::f32, {4, 5});
  expect_error(put(&Views::gy, g.view), {ErrorCode::invalid_value}, "grad_target", kBwd, {PwLoss::hinge_embedding});
  expect_error(put(&Views::gz, g.view), {ErrorCode::invalid_value}, "", kBwd,
               {PwLoss::mse, PwLoss::bce, PwLoss::bce_with_logits, PwLoss::kl_div, PwLoss::hinge_embedding});
}
TEST(PointwiseErrors, OverlappingBuffers) {
  // a gradient over an operand; two gradients on one buffer
  expect_error(alias(&Views::gx, &ErrFixture::input), {ErrorCode::bad_pointer}, &Names::gx, kBwd);
  expect_error(alias(&Views::gy, &ErrFixture::target), {ErrorCode::bad_pointer}, &Names::gy, kBwd, kTargetGrad);
  expect_error(alias(&Views::gy, &ErrFixture::input), {ErrorCode::bad_pointer}, &Names::gy, kBwd, kTargetGrad);
  expect_error(alias(&Views::gx, &ErrFixture::third), {ErrorCode::bad_pointer}, &Names::gx, kBwd, kThird);
  expect_error(alias(&Views::gz, &ErrFixture::target), {ErrorCode::bad_pointer}, &Names::gz, kBwd, kThirdGrad);
  expect_error(alias(&Views::gy, &ErrFixture::gx), {ErrorCode::bad_pointer}, &Names::gx, kBwd, kTargetGrad);
  expect_error(alias(&Views::gz, &ErrFixture::gy), {ErrorCode::bad_pointer}, &Names::gy, kBwd, kThirdGrad);
  // the two gradients shifted by one element
  static Tensor big = Tensor::make(DType::f32, {64}, Layout::contiguous, kSentinel);
  expect_error(
      [](ErrFixture&) {
        Views v;
        v.gx = TensorView::contiguous(big.storage.data(), DType::f32, {4, 5});
        v.gy = TensorView::contiguous(big.storage.data() + 4 * 19, DType::f32, {4, 5});
        return v;
      },
      {ErrorCode::bad_pointer}, &Names::gx, kBwd, kTargetGrad);
  // a gradient over the weight / the upstream gradient; the loss over an operand
  expect_error(alias(&Views::gx, &ErrFixture::weight), {ErrorCode::bad_pointer}, &Names::gx, kBwd, kWeighted);
  const auto over = [](Slot slot, Tensor ErrFixture::*buffer, Reduction red, std::vector<std::int64_t> shape) {
    return ErrSetup([=](ErrFixture& f) {
      f.a.red = red;
      Views v;
      v.*slot = TensorView::contiguous((f.*buffer).view.data, DType::f32, shape.data(), static_cast<int>(shape.size()));
      return v;
    });
  };
  expect_error(over(&Views::up, &ErrFixture::gx, kMean, {}), {ErrorCode::bad_pointer}, &Names::gx, kBwd);
  expect_error(over(&Views::loss, &ErrFixture::input, kMean, {}), {ErrorCode::bad_pointer}, "loss", kFwd);
  expect_error(over(&Views::loss, &ErrFixture::target, kNone, {4, 5}), {ErrorCode::bad_pointer}, "loss", kFwd);
  expect_error(over(&Views::loss, &ErrFixture::third, kNone, {4, 5}), {ErrorCode::bad_pointer}, "loss", kFwd, kThird);
}
TEST(PointwiseErrors, NullAndMisalignedPointers) {
  static Tensor raw = Tensor::make(DType::f32, {64}, Layout::contiguous, kSentinel);
  const TensorView misaligned = TensorView::contiguous(raw.storage.data() + 2, DType::f32, {4, 5});
  expect_error(null_data(&Views::input, &ErrFixture::input), {ErrorCode::bad_pointer}, &Names::x);
  expect_error(null_data(&Views::target, &ErrFixture::target), {ErrorCode::bad_pointer}, &Names::y);
  expect_error(null_data(&Views::third, &ErrFixture::third), {ErrorCode::bad_pointer}, &Names::z, kBoth, kThird);
  expect_error(put(&Views::input, misaligned), {ErrorCode::bad_pointer}, &Names::x);
  expect_error(put(&Views::target, misaligned), {ErrorCode::bad_pointer}, &Names::y);
  expect_error(put(&Views::third, misaligned), {ErrorCode::bad_pointer}, &Names::z, kBoth, kThird);
  expect_error(put(&Views::weight, misaligned), {ErrorCode::bad_pointer}, "weight", kBoth, kWeighted);
  expect_error(null_data(&Views::loss, &ErrFixture::loss), {ErrorCode::bad_pointer}, "loss", kFwd);
  expect_error(null_data(&Views::gx, &ErrFixture::gx), {ErrorCode::bad_pointer}, &Names::gx, kBwd);
  expect_error(put(&Views::gy, misaligned), {ErrorCode::bad_pointer}, &Names::gy, kBwd, kTargetGrad);
  expect_error(put(&Views::gz, misaligned), {ErrorCode::bad_pointer}, &Names::gz, kBwd, kThirdGrad);
  expect_error(null_data(&Views::up, &ErrFixture::up), {ErrorCode::bad_pointer}, "grad_loss", kBwd);
}
TEST(PointwiseErrors, OptionsAndReduction) {
  for (double beta : {-1.0, -1e-300, kNaN, kInf})
    expect_error(options([=](PwArgs& a) { a.opts.param = beta; }), {ErrorCode::invalid_value}, "beta", kBoth,
                 {PwLoss::smooth_l1});
  for (double delta : {0.0, -0.0, -2.0, kNaN, kInf})
    expect_error(options([=](PwArgs& a) { a.opts.param = delta; }), {ErrorCode::invalid_value}, "delta", kBoth,
                 {PwLoss::huber});
  for (double bad : {kNaN, kInf, -kInf}) {
    expect_error(options([=](PwArgs& a) { a.opts.eps = bad; }), {ErrorCode::invalid_value}, "eps", kBoth,
                 {PwLoss::poisson_nll, PwLoss::gaussian_nll});
    expect_error(options([=](PwArgs& a) { a.opts.margin = bad; }), {ErrorCode::invalid_value}, "margin", kBoth,
                 {PwLoss::hinge_embedding, PwLoss::margin_ranking});
  }
  // batchmean is a mean
  static const Tensor l45 = Tensor::make(DType::f32, {4, 5});
  expect_error(options([](PwArgs& a) { a.opts.batchmean = true, a.red = Reduction::sum; }), {ErrorCode::invalid_value},
               "batchmean", kBoth, {PwLoss::kl_div});
  expect_error(
      [](ErrFixture& f) {
        f.a.opts.batchmean = true, f.a.red = kNone;
        return Views{.loss = l45.view};
      },
      {ErrorCode::invalid_value}, "batchmean", kFwd, {PwLoss::kl_div});
  expect_error(options([](PwArgs& a) { a.red = static_cast<Reduction>(7); }), {ErrorCode::invalid_value}, "reduction");
}

}  // namespace
}  // namespace lftest::pointwise
