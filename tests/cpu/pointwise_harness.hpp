// lossfuse tests: the elementwise losses' harness and spec tables, run against the float64 reference
// (tests/reference/pointwise_reference.hpp) by every backend's test (tests/cpu/pointwise_test.cpp,
// tests/cuda/pointwise_cuda_test.cpp). A Spec names a configuration (a loss and its options), a dtype, a reduction, a
// shape, which operands are broadcast (stride 0) or strided, the upstream gradient and the gradients asked for;
// build() draws the operands in the loss's domain and run_all() checks the loss and every gradient of the forward,
// backward and fused entries against the reference's error budget, that nothing outside the outputs is written and
// that the inputs are unchanged.
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "device_mirror.hpp"
#include "pointwise_call.hpp"
#include "reference/pointwise_reference.hpp"
#include "test_util.hpp"

namespace lftest::pointwise {

using lfref::PwLoss;
using lfref::PwOpts;
using lossfuse::PointwiseGrads;

inline constexpr PwLoss kLosses[] = {PwLoss::mse,           PwLoss::l1,
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

inline std::vector<Config> make_configs() {
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
inline const std::vector<Config>& configs() {
  static const std::vector<Config> v = make_configs();
  return v;
}
inline bool usable(const Config& c, Reduction red) { return !c.o.batchmean || red == Reduction::mean; }
// The k-th configuration of loss l usable with reduction red, cycling.
inline const Config& config_of(PwLoss l, Reduction red, std::uint64_t k) {
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

inline std::vector<std::int64_t> small_shape(const std::vector<std::int64_t>& shape, Bcast b) {
  std::vector<std::int64_t> s = shape;
  if (s.empty() || b == Bcast::none) return s;
  s[b == Bcast::outer ? 0 : s.size() - 1] = 1;
  return s;
}

// gen(k) gives the value of stored element k (row-major in the stored shape).
inline Operand make_operand(DType dt, const std::vector<std::int64_t>& shape, Layout layout, Bcast b,
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
inline void PrintTo(const Spec& s, std::ostream* os) { *os << s.name; }

inline std::string base_name(const Spec& s) {
  return s.c.name + "_" + nm(s.dt) + "_" + red_name(s.red) + "_" + shape_name(s.shape) +
         (s.weight && lfref::pw_takes_weight(s.c.loss) ? "_w" : "");
}
inline bool has_z(const Spec& s) { return lfref::pw_has_z(s.c.loss, s.c.o); }
inline bool full_shapes(const Spec& s) {
  return s.bcast[0] == Bcast::none && s.bcast[1] == Bcast::none && s.bcast[2] == Bcast::none;
}

inline Up default_up(Reduction r, std::uint64_t k) {
  if (r == Reduction::none) return k % 3 == 0 ? Up::absent : Up::per_elem;
  return k % 2 == 0 ? Up::scalar : Up::absent;
}

// Values on a 1/32 grid in [-4, 4] (exact in every dtype) with probability 1/2, else N(0, 2).
inline double grid_or_normal(Rng& rng) {
  if (rng.uniform() < 0.5) return static_cast<double>(rng.index(257) - 128) / 32.0;
  return 2.0 * rng.normal();
}

// Stored element k of operand op (0 x, 1 y, 2 z), in the loss's domain.
inline double gen(const Spec& s, int op, Rng& rng, std::int64_t k) {
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
inline void place_kinks(const Spec& s, Rng& rng, Values& v) {
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
  lfref::PwResult ref_unit;  // for an upstream gradient of 1 (the fused entries'): ref where up is absent

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

inline Problem build(const Spec& s) {
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
  if (p.up) {
    in.grad_loss.clear();
    p.ref_unit = lfref::pointwise(in);
  } else {
    p.ref_unit = p.ref;
  }
  return p;
}

// A gradient output. An empty one gets the strides torch gives an empty tensor ((3, 0): (1, 1)), not
// Tensor::make's (0, 1): lossfuse rejects a zero stride on a dim of size > 1 even when there are no elements.
inline Tensor make_grad(DType dt, const std::vector<std::int64_t>& shape, Layout layout) {
  Tensor g = Tensor::make(dt, shape, layout, kSentinel);
  if (g.numel() == 0) {
    std::int64_t st = 1;
    for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d)
      g.strides[d] = st, st *= std::max<std::int64_t>(shape[d], 1);
    g.rebind();
  }
  return g;
}

// The call's arguments through m: each operand a view of its device copy (the same shape and strides).
inline PwArgs device_args(Mirror& m, Problem& p) {
  const auto on = [&m](Operand& o) {
    TensorView v = o.view;  // o.store's data, with the expanded shape and strides
    const TensorView d = m(o.store);
    v.data = d.data, v.device = d.device;
    return v;
  };
  PwArgs a{p.s.c.loss, p.s.c.o, p.s.red, on(p.x), on(p.y), std::nullopt, std::nullopt};
  if (p.z) a.z = on(*p.z);
  if (p.w) a.weight = on(*p.w);
  return a;
}

// Forward, backward and the fused entry against the reference. mem: the device the calls run on (nullptr: the CPU;
// tests/device_mirror.hpp).
inline void run_all(const Spec& s, const DeviceMemory* mem = nullptr) {
  SCOPED_TRACE(s.name);
  Problem p = build(s);
  const auto x0 = p.x.store.storage, y0 = p.y.store.storage;
  const auto new_loss = [&] {
    return Tensor::make(p.acc(), s.red == Reduction::none ? s.shape : std::vector<std::int64_t>{}, Layout::contiguous,
                        kSentinel);
  };
  const auto check_loss = [&](const Tensor& loss) {
    if (s.red == Reduction::none) {
      EXPECT_TRUE(close_all("loss", loss.values(), p.ref.elem_loss, p.ref.elem_loss_tol, p.acc()));
    } else {
      EXPECT_TRUE(close_one("loss", loss.get(0), p.ref.loss, p.ref.loss_tol, p.acc()));
    }
    EXPECT_TRUE(loss.outside_untouched(kSentinel));
  };
  Tensor loss = new_loss();
  {
    Mirror m(mem);
    pw_forward(device_args(m, p), m(loss));
    m.download();
  }
  check_loss(loss);

  // The gradients asked for, and their check against a reference's.
  struct Grads {
    std::optional<Tensor> x, y, z;
  };
  const PwLoss l = s.c.loss;
  const auto new_grads = [&] {
    Grads g;
    if (s.want_gx) g.x = make_grad(s.dt, s.shape, s.grad_layout);
    if (s.want_gy && lfref::pw_y_grad(l)) g.y = make_grad(s.dt, s.shape, s.grad_layout);
    if (s.want_gz && p.z && lfref::pw_z_grad(l)) g.z = make_grad(s.dt, s.shape, s.grad_layout);
    return g;
  };
  const auto check_grads = [&](const Grads& g, const lfref::PwResult& ref) {
    const auto check = [&](const char* what, const std::optional<Tensor>& t, const std::vector<double>& want,
                           const std::vector<double>& tol) {
      if (!t) return;
      EXPECT_TRUE(close_all(what, t->values(), want, tol, s.dt));
      EXPECT_TRUE(t->outside_untouched(kSentinel)) << "wrote outside " << what;
    };
    check("grad_input", g.x, ref.gx, ref.gx_tol);
    check("grad_target", g.y, ref.gy, ref.gy_tol);
    check("grad_z", g.z, ref.gz, ref.gz_tol);
  };
  // The upstream gradient through m (absent: 1).
  const auto device_up = [&p](Mirror& m) -> std::optional<TensorView> {
    if (!p.up) return std::nullopt;
    TensorView up = p.up->view;
    const TensorView d = m(p.up->store);
    up.data = d.data, up.device = d.device;
    return up;
  };
  Grads g = new_grads();
  {
    Mirror m(mem);
    const PwArgs a = device_args(m, p);
    const std::optional<TensorView> up = device_up(m);
    pw_backward(a, up, PointwiseGrads{m(g.x), m(g.y), m(g.z)});
    m.download();
  }
  check_grads(g, p.ref);
  {
    SCOPED_TRACE("forward_backward");
    Tensor fused_loss = new_loss();
    Grads fg = new_grads();
    {
      Mirror m(mem);
      pw_forward_backward(device_args(m, p), m(fused_loss), PointwiseGrads{m(fg.x), m(fg.y), m(fg.z)});
      m.download();
    }
    check_loss(fused_loss);
    check_grads(fg, p.ref_unit);
    // The held backward over the fused gradients (PointwiseGrads::held): they stand for an upstream gradient of 1
    // (absent, or a scalar 1) of a reduced loss; else it writes the backward's bits over them.
    const bool stand = s.red != Reduction::none && (!p.up || (s.up == Up::scalar && s.up_scalar == 1.0));
    const auto bits = [](const Grads& gr) {
      std::vector<std::uint8_t> b;
      for (const std::optional<Tensor>* t : {&gr.x, &gr.y, &gr.z}) {
        b.push_back(t->has_value() ? 1 : 0);
        if (*t) b.insert(b.end(), (*t)->storage.begin(), (*t)->storage.end());
      }
      return b;
    };
    const std::vector<std::uint8_t> want = bits(stand ? fg : g);
    {
      Mirror m(mem);
      const std::optional<TensorView> up = device_up(m);
      PointwiseGrads held{m(fg.x), m(fg.y), m(fg.z)};
      held.held = true;
      pw_backward(device_args(m, p), up, held);
      m.download();
    }
    EXPECT_TRUE(bits(fg) == want) << "held gradients: expected " << (stand ? "the fused entry's" : "the backward's")
                                  << " bits";
  }
  EXPECT_TRUE(p.x.store.storage == x0) << "the input was modified";
  EXPECT_TRUE(p.y.store.storage == y0) << "the target was modified";
}

// ---- the suites ---------------------------------------------------------------------------------------------------

// Every loss x dtype x reduction x shape (0-d, 1-D of 1, 7, 31, 1271, 2-D, 3-D) x weight, the loss's configurations
// in turn; now and then only some of the gradients.
inline std::vector<Spec> option_specs() {
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

// Every configuration (the beta and delta sweeps among them) x dtype x reduction, on two shapes.
inline std::vector<Spec> config_specs() {
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
          if (s.up == Up::scalar && k % 4 == 0) s.up_scalar = 1.0;  // a held backward's gradients stand (run_all)
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
      if (k % 2 == 1) s.up_scalar = 1.0;  // an unweighted held backward's gradients stand (run_all)
      s.seed = 300 + ++k;
      s.name = "denominator_" + base_name(s);
      v.push_back(s);
    }
  return v;
}

// Long sums: 100003 elements (several tiles), and rows longer than a tile.
inline std::vector<Spec> large_specs() {
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

// Non-contiguous operands, expanded operands / weight / upstream gradient, strided gradient outputs.
inline std::vector<Spec> layout_specs() {
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

// Empty inputs for every loss; infinities, NaN (inf - inf among them) and huge values in both operands of the
// losses of d = x - y; upstream scalars of 0 and of large and small magnitudes.
inline std::vector<Spec> edge_specs() {
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

// NaN, infinities and boundary values in one operand at a time, every third element of 40 (vector bodies and scalar
// tails both see them), for every configuration: where torch propagates them (the values were checked against torch
// 2.15 on these inputs). bce's input range and gaussian_nll's negative var raise instead (pointwise_edges_test.cpp).
inline std::vector<Spec> non_finite_specs() {
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

}  // namespace lftest::pointwise
