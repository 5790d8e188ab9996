// Tests of bce, bce_with_logits, kl_div, poisson_nll, gaussian_nll, hinge_embedding and margin_ranking
// (include/lossfuse/pointwise.hpp) against the float64 reference of tests/reference/pointwise_extra_reference.hpp:
// every option, reduction and dtype; sizes 0-d, 0, 1, 7, 31, 1271, 100003; broadcast and strided operands;
// extreme values (probabilities 0 and 1, logits +-100, var = 0); central finite differences in float64; error
// paths with untouched outputs; determinism across thread counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "reference/pointwise_extra_reference.hpp"
#include "test_util.hpp"

namespace {

using namespace lftest;
using lfref::PwExtraLoss;
using lfref::PwOpts;

// One configuration of one loss.
struct Cfg {
  PwExtraLoss loss;
  PwOpts o;
  bool weight = false;     // bce, bce_with_logits
  bool batchmean = false;  // kl_div (with reduction mean)
  std::string name;
};

bool has_z(const Cfg& c) {
  return (c.loss == PwExtraLoss::bce_with_logits && c.o.pos_weight) || c.loss == PwExtraLoss::gaussian_nll ||
         c.loss == PwExtraLoss::margin_ranking;
}
bool y_diff(const Cfg& c) { return c.loss != PwExtraLoss::hinge_embedding; }
bool z_diff(const Cfg& c) { return c.loss == PwExtraLoss::gaussian_nll || c.loss == PwExtraLoss::margin_ranking; }

std::vector<Cfg> all_configs() {
  std::vector<Cfg> v;
  auto add = [&](PwExtraLoss l, PwOpts o, bool w, bool bm, std::string n) { v.push_back({l, o, w, bm, std::move(n)}); };
  add(PwExtraLoss::bce, {}, false, false, "bce");
  add(PwExtraLoss::bce, {}, true, false, "bce_w");
  for (bool pw : {false, true})
    for (bool w : {false, true}) {
      PwOpts o;
      o.pos_weight = pw;
      add(PwExtraLoss::bce_with_logits, o, w, false, std::string("bcel") + (pw ? "_pw" : "") + (w ? "_w" : ""));
    }
  for (bool lt : {false, true})
    for (bool bm : {false, true}) {
      PwOpts o;
      o.log_target = lt;
      add(PwExtraLoss::kl_div, o, false, bm, std::string("kl") + (lt ? "_logt" : "") + (bm ? "_batchmean" : ""));
    }
  for (bool li : {false, true})
    for (bool full : {false, true}) {
      PwOpts o;
      o.log_input = li;
      o.full = full;
      o.eps = li ? 1e-8 : 0.25;  // a visible eps where it is used
      add(PwExtraLoss::poisson_nll, o, false, false,
          std::string("poisson") + (li ? "_log" : "_lin") + (full ? "_full" : ""));
    }
  for (bool full : {false, true}) {
    PwOpts o;
    o.full = full;
    o.eps = 1e-6;
    add(PwExtraLoss::gaussian_nll, o, false, false, std::string("gaussian") + (full ? "_full" : ""));
  }
  {
    PwOpts o;
    o.eps = 0.5;  // a large eps: many elements are clamped
    add(PwExtraLoss::gaussian_nll, o, false, false, "gaussian_eps0.5");
  }
  for (double m : {1.0, 0.5, -0.25}) {
    PwOpts o;
    o.margin = m;
    add(PwExtraLoss::hinge_embedding, o, false, false, "hinge_m" + std::to_string(m));
  }
  for (double m : {0.0, 0.5}) {
    PwOpts o;
    o.margin = m;
    add(PwExtraLoss::margin_ranking, o, false, false, "ranking_m" + std::to_string(m));
  }
  return v;
}

// Operands of one problem; each value is stored in the dtype (rounded) and the reference reads it back.
struct Data {
  Tensor x, y, z, w;
  bool hz = false, hw = false;
};

// Values in each loss's domain (kinks avoided where `smooth`: finite differences).
void fill(const Cfg& c, Data& d, Rng& rng, bool smooth) {
  auto fill_t = [&](Tensor& t, auto gen) {
    const std::int64_t m = t.numel();
    for (std::int64_t i = 0; i < m; ++i) t.set(i, gen(i));
  };
  switch (c.loss) {
    case PwExtraLoss::bce:
      fill_t(d.x, [&](std::int64_t) { return rng.uniform(smooth ? 0.05 : 0.0, smooth ? 0.95 : 1.0); });
      fill_t(d.y, [&](std::int64_t) { return rng.uniform(); });
      break;
    case PwExtraLoss::bce_with_logits:
      fill_t(d.x, [&](std::int64_t) { return 4 * rng.normal(); });
      fill_t(d.y, [&](std::int64_t) { return rng.uniform(); });
      if (d.hz) fill_t(d.z, [&](std::int64_t) { return rng.uniform(0.25, 3.0); });
      break;
    case PwExtraLoss::kl_div:
      fill_t(d.x, [&](std::int64_t) { return std::log(rng.uniform(0.01, 1.0)); });
      if (c.o.log_target) {
        fill_t(d.y, [&](std::int64_t) { return std::log(rng.uniform(0.01, 1.0)); });
      } else {
        fill_t(d.y, [&](std::int64_t i) { return !smooth && i % 11 == 3 ? 0.0 : rng.uniform(0.05, 1.0); });
      }
      break;
    case PwExtraLoss::poisson_nll:
      if (c.o.log_input) {
        fill_t(d.x, [&](std::int64_t) { return 2 * rng.normal(); });
      } else {
        fill_t(d.x, [&](std::int64_t) { return rng.uniform(0.05, 4.0); });
      }
      // counts 0..6 (0 and 1 exercise the Stirling mask), or smooth positive values
      fill_t(d.y, [&](std::int64_t) { return smooth ? rng.uniform(0.2, 6.0) : static_cast<double>(rng.index(7)); });
      break;
    case PwExtraLoss::gaussian_nll:
      fill_t(d.x, [&](std::int64_t) { return rng.normal(); });
      fill_t(d.y, [&](std::int64_t) { return rng.normal(); });
      fill_t(d.z, [&](std::int64_t i) {
        return smooth ? rng.uniform(std::max(0.1, 2 * c.o.eps), 2.0) : (i % 13 == 5 ? 0.0 : rng.uniform(0.0, 2.0));
      });
      break;
    case PwExtraLoss::hinge_embedding:
      fill_t(d.x, [&](std::int64_t) {
        double v;
        do v = 2 * rng.normal();
        while (smooth && std::fabs(v - c.o.margin) < 0.05);
        return v;
      });
      fill_t(d.y, [&](std::int64_t i) { return i % 9 == 4 ? (i % 2 ? 0.0 : 2.0) : (rng.index(2) ? 1.0 : -1.0); });
      break;
    case PwExtraLoss::margin_ranking:
      fill_t(d.x, [&](std::int64_t) { return rng.normal(); });
      fill_t(d.y, [&](std::int64_t) { return rng.normal(); });
      fill_t(d.z, [&](std::int64_t) { return rng.index(2) ? 1.0 : -1.0; });
      if (smooth) {  // keep away from the kink
        for (std::int64_t i = 0; i < d.x.numel(); ++i) {
          const double zv = d.z.numel() == d.x.numel() ? d.z.get(i) : d.z.get(0);
          while (std::fabs(c.o.margin - zv * (d.x.get(i) - d.y.get(i))) < 0.05) d.x.set(i, d.x.get(i) + 0.1);
        }
      }
      break;
  }
  if (d.hw) fill_t(d.w, [&](std::int64_t) { return rng.uniform(0.0, 2.0); });
}

// A stride-0 view of `shape` expanded from a tensor with size 1 in the dims listed `bdims`.
Tensor broadcast_tensor(DType t, const std::vector<std::int64_t>& shape, const std::vector<int>& bdims) {
  std::vector<std::int64_t> small = shape;
  for (int b : bdims) small[b] = 1;
  Tensor s = Tensor::make(t, small);
  for (int b : bdims) s.strides[b] = 0;
  s.shape = shape;
  s.rebind();
  return s;
}

Data make_data(const Cfg& c, DType dt, const std::vector<std::int64_t>& shape, Layout xl, int zbcast,
               std::uint64_t seed, bool smooth = false) {
  Data d;
  d.x = Tensor::make(dt, shape, xl);
  d.y = Tensor::make(dt, shape);
  d.hz = has_z(c);
  d.hw = c.weight;
  if (d.hz) {
    const int nd = static_cast<int>(shape.size());
    if (zbcast == 1 && nd >= 2) {
      d.z = broadcast_tensor(dt, shape, {0});  // pos_weight-like: varies along the last dim only
    } else if (zbcast == 2 && nd >= 1) {
      d.z = broadcast_tensor(dt, shape, {nd - 1});  // var of the input's shape minus the last dim
    } else {
      d.z = Tensor::make(dt, shape, Layout::padded);
    }
  }
  if (d.hw) d.w = Tensor::make(dt, shape);
  Rng rng(seed);
  fill(c, d, rng, smooth);
  return d;
}

// Storage of a broadcast tensor holds fewer elements than its numel: its values read through get(i).
struct Ref {
  std::vector<double> l, dx, dy, dz, ml, mdx, mdy, mdz, w;
};
Ref reference(const Cfg& c, const Data& d) {
  const std::int64_t n = d.x.numel();
  Ref r;
  for (auto* v : {&r.l, &r.dx, &r.dy, &r.dz, &r.ml, &r.mdx, &r.mdy, &r.mdz, &r.w}) v->resize(n);
  for (std::int64_t i = 0; i < n; ++i) {
    const double z = d.hz ? d.z.get(i) : 0.0;
    const lfref::PwExtraElem e = lfref::pointwise_extra(c.loss, c.o, d.x.get(i), d.y.get(i), z);
    const double w = d.hw ? d.w.get(i) : 1.0;
    r.w[i] = w;
    r.l[i] = w * e.l, r.ml[i] = std::fabs(w) * e.ml;
    r.dx[i] = w * e.dx, r.mdx[i] = std::fabs(w) * e.mdx;
    r.dy[i] = w * e.dy, r.mdy[i] = std::fabs(w) * e.mdy;
    r.dz[i] = w * e.dz, r.mdz[i] = std::fabs(w) * e.mdz;
  }
  return r;
}

void forward(const Cfg& c, const Data& d, Reduction red, const TensorView& loss) {
  namespace lf = lossfuse;
  const std::optional<TensorView> w = d.hw ? std::optional<TensorView>(d.w.view) : std::nullopt;
  switch (c.loss) {
    case PwExtraLoss::bce: lf::bce_forward(d.x.view, d.y.view, {red, w}, loss); return;
    case PwExtraLoss::bce_with_logits: {
      lf::BceWithLogitsOptions o{red, w, std::nullopt};
      if (c.o.pos_weight) o.pos_weight = d.z.view;
      lf::bce_with_logits_forward(d.x.view, d.y.view, o, loss);
      return;
    }
    case PwExtraLoss::kl_div: lf::kl_div_forward(d.x.view, d.y.view, {red, c.batchmean, c.o.log_target}, loss); return;
    case PwExtraLoss::poisson_nll:
      lf::poisson_nll_forward(d.x.view, d.y.view, {red, c.o.log_input, c.o.full, c.o.eps}, loss);
      return;
    case PwExtraLoss::gaussian_nll:
      lf::gaussian_nll_forward(d.x.view, d.y.view, d.z.view, {red, c.o.full, c.o.eps}, loss);
      return;
    case PwExtraLoss::hinge_embedding: lf::hinge_embedding_forward(d.x.view, d.y.view, {red, c.o.margin}, loss); return;
    case PwExtraLoss::margin_ranking:
      lf::margin_ranking_forward(d.x.view, d.y.view, d.z.view, {red, c.o.margin}, loss);
      return;
  }
}

// Gradient outputs: each optional (nullptr: not requested).
void backward(const Cfg& c, const Data& d, Reduction red, const std::optional<TensorView>& go, Tensor* gx, Tensor* gy,
              Tensor* gz) {
  namespace lf = lossfuse;
  auto opt = [](Tensor* t) { return t ? std::optional<TensorView>(t->view) : std::nullopt; };
  const std::optional<TensorView> w = d.hw ? std::optional<TensorView>(d.w.view) : std::nullopt;
  const lf::PointwiseGrads g{opt(gx), opt(gy), opt(gz)};
  switch (c.loss) {
    case PwExtraLoss::bce: lf::bce_backward(d.x.view, d.y.view, go, {red, w}, g); return;
    case PwExtraLoss::bce_with_logits: {
      lf::BceWithLogitsOptions o{red, w, std::nullopt};
      if (c.o.pos_weight) o.pos_weight = d.z.view;
      lf::bce_with_logits_backward(d.x.view, d.y.view, go, o, g);
      return;
    }
    case PwExtraLoss::kl_div:
      lf::kl_div_backward(d.x.view, d.y.view, go, {red, c.batchmean, c.o.log_target}, g);
      return;
    case PwExtraLoss::poisson_nll:
      lf::poisson_nll_backward(d.x.view, d.y.view, go, {red, c.o.log_input, c.o.full, c.o.eps}, g);
      return;
    case PwExtraLoss::gaussian_nll:
      lf::gaussian_nll_backward(d.x.view, d.y.view, d.z.view, go, {red, c.o.full, c.o.eps}, g);
      return;
    case PwExtraLoss::hinge_embedding:
      lf::hinge_embedding_backward(d.x.view, d.y.view, go, {red, c.o.margin}, g);
      return;
    case PwExtraLoss::margin_ranking:
      lf::margin_ranking_backward(d.x.view, d.y.view, d.z.view, go, {red, c.o.margin}, {opt(gx), opt(gy), opt(gz)});
      return;
  }
}

double mean_denominator(const Cfg& c, const std::vector<std::int64_t>& shape, std::int64_t n) {
  if (c.batchmean) return shape.empty() ? 1.0 : static_cast<double>(shape[0]);
  return static_cast<double>(n);
}

constexpr double kK = 32;  // error budget multiple of u * magnitude per element

// Forward and backward of one problem against the reference.
void check_problem(const Cfg& c, DType dt, const std::vector<std::int64_t>& shape, Reduction red, Layout xl, int zbcast,
                   std::uint64_t seed) {
  SCOPED_TRACE(c.name + " " + dname(dt) + " " + std::string(lossfuse::reduction_name(red)) + " shape " +
               ::testing::PrintToString(shape) + " " + layout_name(xl) + " zb" + std::to_string(zbcast));
  const Data d = make_data(c, dt, shape, xl, zbcast, seed);
  const Ref r = reference(c, d);
  const std::int64_t n = d.x.numel();
  const DType acc = acc_dtype(dt);
  const double u = compute_unit(dt);
  const double denom = mean_denominator(c, shape, n);
  // forward
  if (red == Reduction::none) {
    Tensor loss = Tensor::make(acc, shape);
    forward(c, d, red, loss.view);
    std::vector<double> tol(n);
    for (std::int64_t i = 0; i < n; ++i) tol[i] = kK * u * r.ml[i];
    EXPECT_TRUE(close_all("loss", loss.values(), r.l, tol, acc));
  } else {
    Tensor loss = Tensor::make(acc, {});
    forward(c, d, red, loss.view);
    double sum = 0, mag = 0, abs_sum = 0;
    for (std::int64_t i = 0; i < n; ++i) sum += r.l[i], mag += r.ml[i], abs_sum += std::fabs(r.l[i]);
    const double tiles = static_cast<double>(std::min<std::int64_t>(n, 16384));
    double tol = kK * u * mag + tiles * u * abs_sum;
    double expect = sum;
    if (red == Reduction::mean) expect /= denom, tol /= denom;
    EXPECT_TRUE(close_one("reduced loss", loss.get(0), expect, tol, acc));
  }
  // backward: random upstream gradients
  Rng rng(seed + 99);
  std::optional<TensorView> go;
  Tensor go_t;
  std::vector<double> g(n, 1.0);
  if (red == Reduction::none) {
    go_t = Tensor::make(acc, shape);
    for (std::int64_t i = 0; i < n; ++i) go_t.set(i, rng.uniform(-2, 2)), g[i] = go_t.get(i);
  } else {
    go_t = Tensor::make(acc, {});
    go_t.set(0, rng.uniform(0.5, 2));
    const double s = go_t.get(0) / (red == Reduction::mean ? denom : 1.0);
    std::fill(g.begin(), g.end(), s);
  }
  go = go_t.view;
  Tensor gx = Tensor::make(dt, shape, xl == Layout::transposed ? Layout::transposed : Layout::contiguous, kSentinel);
  Tensor gy = Tensor::make(dt, shape, Layout::padded, kSentinel);
  Tensor gz = Tensor::make(dt, shape, Layout::contiguous, kSentinel);
  const bool want_y = y_diff(c), want_z = has_z(c) && z_diff(c);
  backward(c, d, red, go, &gx, want_y ? &gy : nullptr, want_z ? &gz : nullptr);
  auto check_grad = [&](const char* what, const Tensor& t, const std::vector<double>& ref,
                        const std::vector<double>& mag) {
    std::vector<double> e(n), tol(n);
    for (std::int64_t i = 0; i < n; ++i) {
      e[i] = g[i] * ref[i];
      if (g[i] == 0 && std::isinf(ref[i])) e[i] = std::nan("");
      if (std::isfinite(e[i])) e[i] = round_to(dt, e[i]);  // overflows to inf in 16-bit, as torch
      tol[i] = kK * u * std::fabs(g[i]) * mag[i];
    }
    EXPECT_TRUE(close_all(what, t.values(), e, tol, dt)) << what;
    EXPECT_TRUE(t.outside_untouched(kSentinel)) << what << " written outside its view";
  };
  check_grad("grad_input", gx, r.dx, r.mdx);
  if (want_y) check_grad("grad_target", gy, r.dy, r.mdy);
  if (want_z) check_grad("grad_z", gz, r.dz, r.mdz);
}

// Forward (none) and backward (none, upstream 1) of prepared data against the reference, NaN for NaN.
void check_special(const Cfg& c, const Data& d, DType dt) {
  Ref r = reference(c, d);
  // a result beyond the output type's range is inf there (e.g. exp(100) in float32), as in torch
  for (double& v : r.l) v = std::isfinite(v) ? round_to(acc_dtype(dt), v) : v;
  for (auto* g : {&r.dx, &r.dy, &r.dz})
    for (double& v : *g) v = std::isfinite(v) ? round_to(dt, v) : v;
  const std::int64_t n = d.x.numel();
  const DType acc = acc_dtype(dt);
  const double u = compute_unit(dt);
  Tensor loss = Tensor::make(acc, {n});
  forward(c, d, Reduction::none, loss.view);
  std::vector<double> tol(n);
  for (std::int64_t i = 0; i < n; ++i) tol[i] = kK * u * (std::isfinite(r.ml[i]) ? r.ml[i] : 0.0);
  EXPECT_TRUE(close_all("loss", loss.values(), r.l, tol, acc));
  Tensor go = Tensor::make(acc, {n});
  for (std::int64_t i = 0; i < n; ++i) go.set(i, 1.0);
  Tensor gx = Tensor::make(dt, {n}), gy = Tensor::make(dt, {n}), gz = Tensor::make(dt, {n});
  const bool want_y = y_diff(c), want_z = has_z(c) && z_diff(c);
  backward(c, d, Reduction::none, go.view, &gx, want_y ? &gy : nullptr, want_z ? &gz : nullptr);
  auto grad_tol = [&](const std::vector<double>& m) {
    std::vector<double> t(n);
    for (std::int64_t i = 0; i < n; ++i) t[i] = kK * u * (std::isfinite(m[i]) ? m[i] : 0.0);
    return t;
  };
  EXPECT_TRUE(close_all("grad_input", gx.values(), r.dx, grad_tol(r.mdx), dt));
  if (want_y) {
    EXPECT_TRUE(close_all("grad_target", gy.values(), r.dy, grad_tol(r.mdy), dt));
  }
  if (want_z) {
    EXPECT_TRUE(close_all("grad_z", gz.values(), r.dz, grad_tol(r.mdz), dt));
  }
}

TEST(PointwiseExtra, AllConfigsDtypesReductionsSizes) {
  const std::vector<std::vector<std::int64_t>> shapes = {{1}, {7}, {31}, {1271}, {3, 37}, {2, 3, 5}};
  std::uint64_t seed = 1;
  for (const Cfg& c : all_configs())
    for (DType dt : lossfuse::kFloatDTypes)
      for (Reduction red : {Reduction::none, Reduction::mean, Reduction::sum})
        for (const auto& s : shapes) {
          if (c.batchmean && red != Reduction::mean) continue;
          check_problem(c, dt, s, red, Layout::contiguous, 0, ++seed);
        }
}

TEST(PointwiseExtra, LargeSize) {
  std::uint64_t seed = 1000;
  for (const Cfg& c : all_configs()) {
    for (Reduction red : {Reduction::none, Reduction::mean}) {
      if (c.batchmean && red != Reduction::mean) continue;
      check_problem(c, DType::f32, {100003}, red, Layout::contiguous, 0, ++seed);
    }
    check_problem(c, DType::bf16, {100003}, c.batchmean ? Reduction::mean : Reduction::sum, Layout::contiguous, 0,
                  ++seed);
  }
}

TEST(PointwiseExtra, ZeroDimAndEmpty) {
  std::uint64_t seed = 2000;
  for (const Cfg& c : all_configs())
    for (DType dt : {DType::f32, DType::f64, DType::f16})
      for (Reduction red : {Reduction::none, Reduction::mean, Reduction::sum}) {
        if (c.batchmean && red != Reduction::mean) continue;
        check_problem(c, dt, {}, red, Layout::contiguous, 0, ++seed);
        check_problem(c, dt, {0}, red, Layout::contiguous, 0, ++seed);
        check_problem(c, dt, {3, 0}, red, Layout::contiguous, 0, ++seed);
      }
}

TEST(PointwiseExtra, EmptyMeanIsNanSumIsZero) {
  for (const Cfg& c : all_configs()) {
    SCOPED_TRACE(c.name);
    const Data d = make_data(c, DType::f32, {0}, Layout::contiguous, 0, 5);
    Tensor loss = Tensor::make(DType::f32, {});
    forward(c, d, Reduction::mean, loss.view);
    EXPECT_TRUE(std::isnan(loss.get(0)));
    if (!c.batchmean) {
      forward(c, d, Reduction::sum, loss.view);
      EXPECT_EQ(loss.get(0), 0.0);
    }
  }
}

TEST(PointwiseExtra, StridedAndBroadcastOperands) {
  std::uint64_t seed = 3000;
  for (const Cfg& c : all_configs())
    for (DType dt : lossfuse::kFloatDTypes)
      for (Reduction red : {Reduction::none, Reduction::sum}) {
        if (c.batchmean && red != Reduction::mean) continue;
        check_problem(c, dt, {5, 33}, red, Layout::transposed, 0, ++seed);
        check_problem(c, dt, {4, 3, 19}, red, Layout::padded, 0, ++seed);
        if (has_z(c)) {
          check_problem(c, dt, {6, 37}, red, Layout::contiguous, 1, ++seed);
          check_problem(c, dt, {6, 37}, red, Layout::contiguous, 2, ++seed);
        }
      }
}

// torch's 'batchmean' divides by input.size(0): 1-D by C, 0-d by 1.
TEST(PointwiseExtra, KlBatchmeanDenominators) {
  Cfg c = all_configs()[0];
  for (const Cfg& k : all_configs())
    if (k.loss == PwExtraLoss::kl_div && k.batchmean && !k.o.log_target) c = k;
  for (const auto& shape : std::vector<std::vector<std::int64_t>>{{}, {5}, {4, 3}, {2, 3, 4}}) {
    const Data d = make_data(c, DType::f64, shape, Layout::contiguous, 0, 17);
    const Ref r = reference(c, d);
    double sum = 0;
    for (double v : r.l) sum += v;
    Tensor loss = Tensor::make(DType::f64, {});
    forward(c, d, Reduction::mean, loss.view);
    const double div = shape.empty() ? 1.0 : static_cast<double>(shape[0]);
    EXPECT_NEAR(loss.get(0), sum / div, 1e-13 * (1 + std::fabs(sum)));
  }
}

// bce_with_logits where y = 1 and x is large: the loss is softplus(-x) = log1p(e^-x), below the normal range for
// x > 87.3 (subnormal, down to 0 past about 103.9). The SIMD kernels take a cheaper exp that flushes there unless a
// lane of the vector needs it: vectors with none, some and all lanes in that range, reduction none and sum, checked
// against the float64 formula rounded to float32 (fails if the tiny results are flushed to 0).
TEST(PointwiseExtra, BceWithLogitsSubnormalLosses) {
  namespace lf = lossfuse;
  const int n = 48;  // three vectors of 16 float lanes: ordinary, mixed, all tiny
  Tensor x = Tensor::make(DType::f32, {n}), y = Tensor::make(DType::f32, {n});
  std::vector<double> want(n);
  for (int i = 0; i < n; ++i) {
    const bool tiny = i >= 32 || (i >= 16 && i % 3 == 0);
    const double xv = tiny ? static_cast<double>(static_cast<float>(87.5 + 0.37 * (i % 17))) : 0.25 * (i % 9) - 1.0;
    x.set(i, xv);
    y.set(i, 1.0);
    want[i] = static_cast<double>(static_cast<float>(std::log1p(std::exp(-xv))));
  }
  Tensor loss = Tensor::make(DType::f32, {n});
  lf::bce_with_logits_forward(x.view, y.view, {Reduction::none, std::nullopt, std::nullopt}, loss.view);
  double tiny_sum = 0;
  for (int i = 0; i < n; ++i) {
    if (i >= 32) tiny_sum += want[i];
    // 1 ulp of a normal result; 2^-148 (one float subnormal ulp, twice) below
    EXPECT_NEAR(loss.get(i), want[i], std::max(std::fabs(want[i]) * 2.4e-7, 2.9e-45)) << i << " x " << x.get(i);
    if (i >= 32 && x.get(i) < 103) EXPECT_GT(loss.get(i), 0.0) << i;
  }
  Tensor tail_x = Tensor::make(DType::f32, {16}), tail_y = Tensor::make(DType::f32, {16});
  for (int i = 0; i < 16; ++i) tail_x.set(i, x.get(32 + i)), tail_y.set(i, 1.0);
  Tensor sum = Tensor::make(DType::f32, {});
  lf::bce_with_logits_forward(tail_x.view, tail_y.view, {Reduction::sum, std::nullopt, std::nullopt}, sum.view);
  EXPECT_GT(tiny_sum, 0.0);
  EXPECT_NEAR(sum.get(0), tiny_sum, tiny_sum * 1e-5 + 2e-44);
}

// Values checked against torch 2.15 (CPU, float64) by hand.
TEST(PointwiseExtra, ExtremeValuesMatchTorch) {
  namespace lf = lossfuse;
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    SCOPED_TRACE(dname(dt));
    const DType acc = acc_dtype(dt);
    // 31 elements so the pattern lands in vector bodies and tails: bce with x, y in {0, 1}
    const double xs[4] = {0, 1, 0, 1}, ys[4] = {0, 1, 1, 0};
    const double l_t[4] = {0, 0, 100, 100}, dx_t[4] = {0, 0, -1e12, 1e12};
    const double dy_t[4] = {INFINITY, -INFINITY, INFINITY, -INFINITY};
    Tensor x = Tensor::make(dt, {31}), y = Tensor::make(dt, {31});
    for (int i = 0; i < 31; ++i) x.set(i, xs[i % 4]), y.set(i, ys[i % 4]);
    Tensor loss = Tensor::make(acc, {31});
    lf::bce_forward(x.view, y.view, {Reduction::none, std::nullopt}, loss.view);
    Tensor gx = Tensor::make(dt, {31}), gy = Tensor::make(dt, {31});
    lf::bce_backward(x.view, y.view, std::nullopt, {Reduction::sum, std::nullopt}, {gx.view, gy.view, std::nullopt});
    for (int i = 0; i < 31; ++i) {
      EXPECT_EQ(loss.get(i), l_t[i % 4]) << i;
      EXPECT_NEAR(gx.get(i), dx_t[i % 4], std::fabs(dx_t[i % 4]) * 1e-2) << i;
      EXPECT_EQ(gy.get(i), dy_t[i % 4]) << i;
    }
    // bce_with_logits at x = +-100: 100 (200 with pos_weight 2 where y = 1), gradients +-1 (-2)
    Tensor xl = Tensor::make(dt, {31}), yl = Tensor::make(dt, {31}), pw = Tensor::make(dt, {31});
    for (int i = 0; i < 31; ++i) xl.set(i, i % 2 ? -100 : 100), yl.set(i, i % 2 ? 1 : 0), pw.set(i, 2);
    lf::bce_with_logits_forward(xl.view, yl.view, {Reduction::none, std::nullopt, std::nullopt}, loss.view);
    for (int i = 0; i < 31; ++i) EXPECT_EQ(loss.get(i), 100) << i;
    lf::bce_with_logits_forward(xl.view, yl.view, {Reduction::none, std::nullopt, pw.view}, loss.view);
    for (int i = 0; i < 31; ++i) EXPECT_EQ(loss.get(i), i % 2 ? 200 : 100) << i;
    lf::bce_with_logits_backward(xl.view, yl.view, std::nullopt, {Reduction::sum, std::nullopt, pw.view},
                                 {gx.view, gy.view, std::nullopt});
    for (int i = 0; i < 31; ++i) {
      EXPECT_EQ(gx.get(i), i % 2 ? -2 : 1) << i;
      EXPECT_NEAR(gy.get(i), i % 2 ? 200 : -100, 1.0) << i;
    }
    // gaussian_nll with var = 0: clamped to eps; d/dvar taken at eps and passed through (torch: -1.25e11)
    Tensor gxx = Tensor::make(dt, {31}), gyy = Tensor::make(dt, {31}), var = Tensor::make(dt, {31});
    for (int i = 0; i < 31; ++i) gxx.set(i, 0.5), gyy.set(i, 0), var.set(i, 0);
    lf::gaussian_nll_forward(gxx.view, gyy.view, var.view, {Reduction::none, true, 1e-6}, loss.view);
    const double eps_c = dt == DType::f64 ? 1e-6 : static_cast<double>(1e-6f);
    const double lv = 0.5 * (std::log(eps_c) + 0.25 / eps_c) + 0.5 * std::log(2 * M_PI);
    Tensor gv = Tensor::make(dt, {31});
    lf::gaussian_nll_backward(gxx.view, gyy.view, var.view, std::nullopt, {Reduction::sum, true, 1e-6},
                              {gx.view, gy.view, gv.view});
    for (int i = 0; i < 31; ++i) {
      EXPECT_NEAR(loss.get(i), lv, lv * 1e-6) << i;
      EXPECT_NEAR(gv.get(i), -1.25e11, 1.25e11 * 1e-2) << i;
      EXPECT_NEAR(gx.get(i), 5e5, 5e5 * 1e-2) << i;
    }
    // kl_div: y = 0 gives 0 (target gradient NaN, as torch's autograd); y < 0 gives NaN
    Tensor kx = Tensor::make(dt, {31}), ky = Tensor::make(dt, {31});
    for (int i = 0; i < 31; ++i) kx.set(i, -1), ky.set(i, i % 3 == 0 ? 0.0 : (i % 3 == 1 ? -0.125 : 0.5));
    lf::kl_div_forward(kx.view, ky.view, {Reduction::none, false, false}, loss.view);
    lf::kl_div_backward(kx.view, ky.view, std::nullopt, {Reduction::sum, false, false}, {gx.view, gy.view, {}});
    for (int i = 0; i < 31; ++i) {
      if (i % 3 == 0) {
        EXPECT_EQ(loss.get(i), 0.0) << i;
      }
      if (i % 3 == 1) {
        EXPECT_TRUE(std::isnan(loss.get(i))) << i;
      }
      if (i % 3 == 2) {
        EXPECT_NEAR(loss.get(i), 0.5 * (std::log(0.5) + 1), 1e-6) << i;
      }
      EXPECT_EQ(gx.get(i), -ky.get(i)) << i;
      if (i % 3 != 2) {
        EXPECT_TRUE(std::isnan(gy.get(i))) << i;
      }
    }
    // poisson_nll full: target gradient NaN for y <= 0 (torch), 0 Stirling contribution for 0 < y <= 1
    Tensor px = Tensor::make(dt, {31}), py = Tensor::make(dt, {31});
    for (int i = 0; i < 31; ++i) px.set(i, 0.5), py.set(i, i % 3 == 0 ? 0.0 : (i % 3 == 1 ? 1.0 : 3.0));
    lf::poisson_nll_backward(px.view, py.view, std::nullopt, {Reduction::sum, true, true, 1e-8},
                             {gx.view, gy.view, {}});
    for (int i = 0; i < 31; ++i) {
      if (i % 3 == 0) {
        EXPECT_TRUE(std::isnan(gy.get(i))) << i;
      }
      if (i % 3 == 1) {
        EXPECT_EQ(gy.get(i), -0.5) << i;
      }
      if (i % 3 == 2) {
        EXPECT_NEAR(gy.get(i), -0.5 + std::log(3.0) + 0.5 / 3, 1e-2) << i;
      }
    }
  }
}

// Central differences in float64 of sum(g * loss) against the backward.
TEST(PointwiseExtra, FiniteDifferences) {
  std::uint64_t seed = 4000;
  for (Cfg c : all_configs()) {
    SCOPED_TRACE(c.name);
    c.batchmean = false;  // reduction none here
    const std::vector<std::int64_t> shape = {2, 5};
    Data d = make_data(c, DType::f64, shape, Layout::contiguous, 0, ++seed, /*smooth=*/true);
    const std::int64_t n = d.x.numel();
    Tensor go = Tensor::make(DType::f64, shape);
    Rng rng(seed);
    for (std::int64_t i = 0; i < n; ++i) go.set(i, rng.uniform(0.5, 1.5));
    Tensor loss = Tensor::make(DType::f64, shape);
    auto total = [&]() {
      forward(c, d, Reduction::none, loss.view);
      double s = 0;
      for (std::int64_t i = 0; i < n; ++i) s += go.get(i) * loss.get(i);
      return s;
    };
    Tensor gx = Tensor::make(DType::f64, shape), gy = Tensor::make(DType::f64, shape),
           gz = Tensor::make(DType::f64, shape);
    const bool want_y = y_diff(c), want_z = has_z(c) && z_diff(c);
    backward(c, d, Reduction::none, go.view, &gx, want_y ? &gy : nullptr, want_z ? &gz : nullptr);
    auto fd = [&](Tensor& t, const Tensor& g, const char* what) {
      for (std::int64_t i = 0; i < n; ++i) {
        const double v = t.get(i), h = 1e-6 * std::max(1.0, std::fabs(v));
        t.set(i, v + h);
        const double lp = total();
        t.set(i, v - h);
        const double lm = total();
        t.set(i, v);
        const double num = (lp - lm) / (2 * h);
        EXPECT_NEAR(g.get(i), num, 1e-5 * (1 + std::fabs(num))) << what << " [" << i << "]";
      }
    };
    fd(d.x, gx, "input");
    if (want_y) fd(d.y, gy, "target");
    if (want_z) fd(d.z, gz, "z");
  }
}

TEST(PointwiseExtra, DeterministicAcrossThreadCounts) {
  for (const Cfg& c : all_configs()) {
    SCOPED_TRACE(c.name);
    const Data d = make_data(c, DType::f32, {3, 100003}, Layout::contiguous, 0, 77);
    Tensor l1 = Tensor::make(DType::f32, {}), l2 = Tensor::make(DType::f32, {});
    Tensor a1 = Tensor::make(DType::f32, {3, 100003}), a2 = Tensor::make(DType::f32, {3, 100003});
    {
      ThreadsGuard g(1);
      forward(c, d, Reduction::mean, l1.view);
      backward(c, d, Reduction::mean, std::nullopt, &a1, nullptr, nullptr);
    }
    {
      ThreadsGuard g(2);
      forward(c, d, Reduction::mean, l2.view);
      backward(c, d, Reduction::mean, std::nullopt, &a2, nullptr, nullptr);
    }
    EXPECT_TRUE(same_bytes(l1, l2));
    EXPECT_TRUE(same_bytes(a1, a2));
  }
}

// ------------------------------------------------------------------------------------------------------------
// Errors: each raised before anything is written.

struct Outputs {
  Tensor loss = Tensor::make(DType::f32, {7}, Layout::contiguous, kSentinel);
  Tensor loss0 = Tensor::make(DType::f32, {}, Layout::contiguous, kSentinel);
  Tensor gx = Tensor::make(DType::f32, {7}, Layout::contiguous, kSentinel);
  Tensor gy = Tensor::make(DType::f32, {7}, Layout::contiguous, kSentinel);
  Tensor gz = Tensor::make(DType::f32, {7}, Layout::contiguous, kSentinel);
  bool untouched() const {
    for (const Tensor* t : {&loss, &loss0, &gx, &gy, &gz})
      for (auto b : t->storage)
        if (b != kSentinel) return false;
    return true;
  }
};

TEST(PointwiseExtraErrors, BceInputOutOfRange) {
  namespace lf = lossfuse;
  for (double bad : {1.5, -0.25, static_cast<double>(NAN)}) {
    Tensor x = Tensor::make(DType::f32, {7}), y = Tensor::make(DType::f32, {7});
    for (int i = 0; i < 7; ++i) x.set(i, 0.5);
    x.set(4, bad);
    Outputs o;
    std::string msg;
    EXPECT_TRUE(throws_error(
        [&] {
          lf::bce_forward(x.view, y.view, {Reduction::none, std::nullopt}, o.loss.view);
        },
        {ErrorCode::invalid_value}, &msg));
    EXPECT_NE(msg.find("input"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[0, 1]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[4]"), std::string::npos) << msg;
    EXPECT_TRUE(throws_error(
        [&] {
          lf::bce_forward(x.view, y.view, {Reduction::sum, std::nullopt}, o.loss0.view);
        },
        {ErrorCode::invalid_value}));
    EXPECT_TRUE(throws_error(
        [&] {
          lf::bce_backward(x.view, y.view, std::nullopt, {Reduction::none, std::nullopt},
                           {o.gx.view, o.gy.view, std::nullopt});
        },
        {ErrorCode::invalid_value}));
    EXPECT_TRUE(o.untouched());
  }
  // 2-D position in the message
  Tensor x = Tensor::make(DType::bf16, {3, 4}, Layout::transposed), y = Tensor::make(DType::bf16, {3, 4});
  for (int i = 0; i < 12; ++i) x.set(i, 0.25);
  x.set(6, 2.0);  // [1, 2]
  Tensor loss = Tensor::make(DType::f32, {3, 4}, Layout::contiguous, kSentinel);
  std::string msg;
  EXPECT_TRUE(throws_error(
      [&] {
        lf::bce_forward(x.view, y.view, {Reduction::none, std::nullopt}, loss.view);
      },
      {ErrorCode::invalid_value}, &msg));
  EXPECT_NE(msg.find("2 at position [1, 2]"), std::string::npos) << msg;
  for (auto b : loss.storage) EXPECT_EQ(b, kSentinel);
}

// A reduced forward checks bce's input range and gaussian_nll's var inside its kernel (one pass): a bad element in
// the vector body or in a tail, in any tile, is still reported with its position, and the loss is not written.
// -0 is a valid bce input (-0 >= 0, as torch); the reduced forward's in-kernel check flags it conservatively and
// core's exact scan must let it pass: log(-0) = -inf, clamped to -100.
TEST(PointwiseExtraErrors, BceNegativeZeroInputIsValid) {
  namespace lf = lossfuse;
  for (DType t : {DType::f32, DType::bf16, DType::f64}) {
    SCOPED_TRACE(dtype_name(t));
    const std::int64_t n = 1000;
    Tensor x = Tensor::make(t, {n}), y = Tensor::make(t, {n});
    double want = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const bool nz = i == 3 || i == 500 || i == n - 1;
      x.set(i, nz ? -0.0 : 0.25), y.set(i, 0.5);
      want += nz ? 50.0 : -(0.5 * std::log(0.25) + 0.5 * std::log1p(-0.25));
    }
    EXPECT_TRUE(std::signbit(x.get(3)));
    for (Reduction r : {Reduction::mean, Reduction::sum}) {
      Tensor loss = Tensor::make(t == DType::f64 ? DType::f64 : DType::f32, {});
      lf::bce_forward(x.view, y.view, {r, std::nullopt}, loss.view);
      const double w = r == Reduction::mean ? want / static_cast<double>(n) : want;
      EXPECT_NEAR(loss.get(0), w, std::fabs(w) * 1e-5);
    }
  }
}

TEST(PointwiseExtraErrors, ReducedForwardChecksInKernel) {
  namespace lf = lossfuse;
  for (DType t : {DType::f32, DType::bf16, DType::f64}) {
    for (std::int64_t n : {std::int64_t{1000}, std::int64_t{2 * 16384 + 37}}) {
      for (std::int64_t pos : {std::int64_t{3}, n / 2, n - 1}) {
        for (Reduction r : {Reduction::mean, Reduction::sum}) {
          SCOPED_TRACE(std::string(dtype_name(t)) + " n " + std::to_string(n) + " pos " + std::to_string(pos));
          const DType acc = t == DType::f64 ? DType::f64 : DType::f32;
          Tensor x = Tensor::make(t, {n}), y = Tensor::make(t, {n}), v = Tensor::make(t, {n});
          for (std::int64_t i = 0; i < n; ++i) x.set(i, 0.25), y.set(i, i % 2), v.set(i, 1.0);
          const std::string where = "[" + std::to_string(pos) + "]";
          for (double bad : {1.5, -0.25, static_cast<double>(NAN)}) {
            x.set(pos, bad);
            Tensor loss = Tensor::make(acc, {}, Layout::contiguous, kSentinel);
            std::string msg;
            EXPECT_TRUE(throws_error(
                [&] {
                  lf::bce_forward(x.view, y.view, {r, std::nullopt}, loss.view);
                },
                {ErrorCode::invalid_value}, &msg));
            EXPECT_NE(msg.find(where), std::string::npos) << msg;
            for (auto b : loss.storage) EXPECT_EQ(b, kSentinel);
          }
          x.set(pos, 0.25);
          v.set(pos, -1e-3);
          Tensor loss = Tensor::make(acc, {}, Layout::contiguous, kSentinel);
          std::string msg;
          EXPECT_TRUE(throws_error([&] { lf::gaussian_nll_forward(x.view, y.view, v.view, {r}, loss.view); },
                                   {ErrorCode::invalid_value}, &msg));
          EXPECT_NE(msg.find("var"), std::string::npos) << msg;
          EXPECT_NE(msg.find(where), std::string::npos) << msg;
          for (auto b : loss.storage) EXPECT_EQ(b, kSentinel);
          v.set(pos, NAN);  // passes the check, as torch's any(var < 0), and gives NaN
          lf::gaussian_nll_forward(x.view, y.view, v.view, {r}, loss.view);
          EXPECT_TRUE(std::isnan(loss.get(0)));
          v.set(pos, 1.0);
          lf::bce_forward(x.view, y.view, {r, std::nullopt}, loss.view);  // all valid again: a finite loss
          EXPECT_TRUE(std::isfinite(loss.get(0)));
        }
      }
    }
  }
}

TEST(PointwiseExtraErrors, GaussianNegativeVar) {
  namespace lf = lossfuse;
  Tensor x = Tensor::make(DType::f64, {7}), y = Tensor::make(DType::f64, {7}), v = Tensor::make(DType::f64, {7});
  for (int i = 0; i < 7; ++i) v.set(i, 1.0);
  v.set(6, -1e-3);
  Tensor loss = Tensor::make(DType::f64, {7}, Layout::contiguous, kSentinel);
  Tensor gx = Tensor::make(DType::f64, {7}, Layout::contiguous, kSentinel);
  Tensor gv = Tensor::make(DType::f64, {7}, Layout::contiguous, kSentinel);
  std::string msg;
  EXPECT_TRUE(throws_error([&] { lf::gaussian_nll_forward(x.view, y.view, v.view, {Reduction::none}, loss.view); },
                           {ErrorCode::invalid_value}, &msg));
  EXPECT_NE(msg.find("var"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[6]"), std::string::npos) << msg;
  EXPECT_TRUE(throws_error(
      [&] {
        lf::gaussian_nll_backward(x.view, y.view, v.view, std::nullopt, {Reduction::mean}, {gx.view, {}, gv.view});
      },
      {ErrorCode::invalid_value}));
  for (const Tensor* t : {&loss, &gx, &gv})
    for (auto b : t->storage) EXPECT_EQ(b, kSentinel);
  // NaN var passes the check (torch's any(var < 0)) and gives NaN
  v.set(6, NAN);
  lf::gaussian_nll_forward(x.view, y.view, v.view, {Reduction::none}, loss.view);
  EXPECT_TRUE(std::isnan(loss.get(6)));
}

TEST(PointwiseExtraErrors, OptionsShapesAndGradients) {
  namespace lf = lossfuse;
  Tensor x = Tensor::make(DType::f32, {7}), y = Tensor::make(DType::f32, {7}), z = Tensor::make(DType::f32, {7});
  for (int i = 0; i < 7; ++i) x.set(i, 0.5), y.set(i, 1), z.set(i, 1);
  Tensor z6 = Tensor::make(DType::f32, {6}), zd = Tensor::make(DType::f64, {7});
  Outputs o;
  // Each call must throw `code` (and write nothing: checked once at the end).
  const auto fails = [](ErrorCode code, const std::function<void()>& call) { EXPECT_TRUE(throws_error(call, {code})); };
  // batchmean is a mean
  fails(ErrorCode::invalid_value, [&] {
    lf::kl_div_forward(x.view, y.view, {Reduction::sum, true, false}, o.loss0.view);
  });
  fails(ErrorCode::invalid_value, [&] {
    lf::kl_div_forward(x.view, y.view, {Reduction::none, true, false}, o.loss.view);
  });
  // non-finite options
  fails(ErrorCode::invalid_value, [&] {
    lf::poisson_nll_forward(x.view, y.view, {Reduction::none, true, false, NAN}, o.loss.view);
  });
  fails(ErrorCode::invalid_value, [&] {
    lf::gaussian_nll_forward(x.view, y.view, z.view, {Reduction::none, false, INFINITY}, o.loss.view);
  });
  fails(ErrorCode::invalid_value, [&] {
    lf::hinge_embedding_forward(x.view, y.view, {Reduction::none, NAN}, o.loss.view);
  });
  fails(ErrorCode::invalid_value, [&] {
    lf::margin_ranking_forward(x.view, y.view, z.view, {Reduction::none, INFINITY}, o.loss.view);
  });
  // gradients torch does not give
  fails(ErrorCode::invalid_value, [&] {
    lf::hinge_embedding_backward(x.view, y.view, std::nullopt, {Reduction::sum, 1.0},
                                 {o.gx.view, o.gy.view, std::nullopt});
  });
  fails(ErrorCode::invalid_value, [&] {
    lf::bce_with_logits_backward(x.view, y.view, std::nullopt, {Reduction::sum, std::nullopt, z.view},
                                 {o.gx.view, std::nullopt, o.gz.view});
  });
  fails(ErrorCode::invalid_value, [&] {
    lf::bce_backward(x.view, y.view, std::nullopt, {Reduction::sum, std::nullopt}, {o.gx.view, {}, o.gz.view});
  });
  // third operand of the wrong shape or dtype
  fails(ErrorCode::shape_mismatch, [&] {
    lf::bce_with_logits_forward(x.view, y.view, {Reduction::none, std::nullopt, z6.view}, o.loss.view);
  });
  fails(ErrorCode::dtype_mismatch,
        [&] { lf::gaussian_nll_forward(x.view, y.view, zd.view, {Reduction::none}, o.loss.view); });
  fails(ErrorCode::shape_mismatch, [&] {
    lf::margin_ranking_forward(x.view, y.view, z6.view, {Reduction::none, 0.0}, o.loss.view);
  });
  // weight of the wrong shape; loss of the wrong shape
  fails(ErrorCode::shape_mismatch, [&] { lf::bce_forward(x.view, y.view, {Reduction::none, z6.view}, o.loss.view); });
  fails(ErrorCode::shape_mismatch, [&] { lf::kl_div_forward(x.view, y.view, {Reduction::none}, o.loss0.view); });
  // a gradient that aliases an input
  fails(ErrorCode::bad_pointer, [&] {
    lf::margin_ranking_backward(x.view, y.view, z.view, std::nullopt, {Reduction::sum, 0.0},
                                {o.gx.view, std::nullopt, y.view});
  });
  // a broadcast (stride-0) gradient output
  Tensor gb = broadcast_tensor(DType::f32, {7}, {0});
  fails(ErrorCode::bad_pointer, [&] {
    lf::gaussian_nll_backward(x.view, y.view, z.view, std::nullopt, {Reduction::sum}, {o.gx.view, {}, gb.view});
  });
  EXPECT_TRUE(o.untouched());
}

}  // namespace

namespace {
// NaN and infinities in every operand where torch propagates them (the kernel values were checked against
// torch 2.15 on these inputs): 40 elements, so vector bodies and scalar tails both see them.
TEST(PointwiseExtra, NonFiniteOperands) {
  const double specials[] = {NAN, INFINITY, -INFINITY, 0.0, 1.0, -1.0, 0.5, 100.0};
  for (Cfg c : all_configs()) {
    c.batchmean = false;  // reduction none here
    for (DType dt : {DType::f32, DType::f64}) {
      SCOPED_TRACE(c.name + " " + dname(dt));
      Data d = make_data(c, dt, {40}, Layout::contiguous, 0, 9);
      // one operand special at a time, the others in their domain
      for (int op = 0; op < 3; ++op) {
        if (op == 2 && !d.hz) continue;
        if (c.loss == PwExtraLoss::bce && op == 0) continue;           // the input range is checked (an error)
        if (c.loss == PwExtraLoss::gaussian_nll && op == 2) continue;  // negative var is an error: below
        SCOPED_TRACE("special operand " + std::to_string(op));
        Data e = d;
        Tensor* te = op == 0 ? &e.x : op == 1 ? &e.y : &e.z;
        for (int i = 0; i < 40; i += 3) te->set(i, specials[(i / 3) % 8]);
        check_special(c, e, dt);
      }
    }
  }
}
}  // namespace

// Hard labels (every target exactly 0 or 1) take a one-log path in the SIMD kernels, soft ones two logs: check
// both against the float64 formula over x spanning exact 0 and 1, tiny (subnormal in float32), ordinary and
// next-to-1 values.
TEST(PointwiseExtra, BceHardAndSoftLabelsMatchFormula) {
  namespace lf = lossfuse;
  for (DType dt : {DType::f32, DType::f64, DType::bf16})
    for (bool soft : {false, true}) {
      SCOPED_TRACE(dname(dt));
      SCOPED_TRACE(soft ? "soft labels" : "hard labels");
      const DType acc = acc_dtype(dt);
      const std::int64_t n = 1003;
      Tensor x = Tensor::make(dt, {n}), y = Tensor::make(dt, {n}), loss = Tensor::make(acc, {n});
      Rng rng(77);
      for (std::int64_t i = 0; i < n; ++i) {
        const double u = rng.uniform();
        const double v = i % 5 == 0 ? std::pow(10.0, -40 * u) : i % 5 == 1 ? 1 - std::pow(10.0, -8 * u) : u;
        x.set(i, i % 97 == 3 ? 0.0 : i % 89 == 4 ? 1.0 : v);
        y.set(i, soft ? rng.uniform() : (rng.next() & 1) ? 1.0 : 0.0);
      }
      lf::bce_forward(x.view, y.view, {Reduction::none, std::nullopt}, loss.view);
      const double u = dt == DType::f64 ? 0x1p-52 : 0x1p-23;
      for (std::int64_t i = 0; i < n; ++i) {
        const double xv = x.get(i), yv = y.get(i);
        const double want = -(yv * std::max(std::log(xv), -100.0) + (1 - yv) * std::max(std::log1p(-xv), -100.0));
        EXPECT_NEAR(loss.get(i), want, 4 * u * std::max(std::fabs(want), 1e-30)) << i << " x=" << xv << " y=" << yv;
      }
    }
}

// bce's two logs for soft targets (the s = min(x, 1 - x) kernel on AVX-512, the generic one elsewhere), one at a
// time, over every bfloat16 in [0, 1] and a sweep of float32 bit patterns: each x is placed once with y = 1 (the
// loss is -max(log x, -100)) and once with y = 0 (-max(log1p(-x), -100)) in vectors whose first two lanes hold
// y = 1/2, which keeps the hard-label path out. Checked in ulps of the float32 result against float64.
TEST(PointwiseExtra, BceSoftLabelLogsWithinTwoUlpOverEveryBf16AndAFloatSweep) {
  namespace lf = lossfuse;
  for (DType dt : {DType::bf16, DType::f32}) {
    SCOPED_TRACE(dname(dt));
    std::vector<double> xs;
    auto add_bits = [&xs](std::uint32_t b) {
      float f;
      std::memcpy(&f, &b, sizeof f);
      xs.push_back(static_cast<double>(f));
    };
    if (dt == DType::bf16) {
      for (std::uint32_t b = 0; b <= 0x3f80u; ++b) add_bits(b << 16);
    } else {  // every 997th pattern in [0, 1], and every 13th in [1/2, 1]
      for (std::uint32_t b = 0; b <= 0x3f800000u; b += 997) add_bits(b);
      for (std::uint32_t b = 0x3f000000u; b <= 0x3f800000u; b += 13) add_bits(b);
    }
    // rows of 16: lanes 0 and 1 soft (x = 1/2), then 7 x values with y = 1 and the same 7 with y = 0
    const std::int64_t rows = (static_cast<std::int64_t>(xs.size()) + 6) / 7, n = rows * 16;
    Tensor x = Tensor::make(dt, {n}), y = Tensor::make(dt, {n}), loss = Tensor::make(DType::f32, {n});
    for (std::int64_t r = 0; r < rows; ++r) {
      for (int l = 0; l < 16; ++l) {
        const std::int64_t i = r * 16 + l;
        const auto k = static_cast<std::size_t>(std::min<std::int64_t>(r * 7 + (l + 5) % 7, std::ssize(xs) - 1));
        x.set(i, l < 2 ? 0.5 : xs[k]);
        y.set(i, l < 2 ? 0.5 : l < 9 ? 1.0 : 0.0);
      }
    }
    lf::bce_forward(x.view, y.view, {Reduction::none, std::nullopt}, loss.view);
    double worst = 0;
    std::int64_t worst_i = -1;
    for (std::int64_t i = 0; i < n; ++i) {
      if (i % 16 < 2) continue;
      const double xv = x.get(i);
      const double want = -std::max(y.get(i) == 1.0 ? std::log(xv) : std::log1p(-xv), -100.0);
      const double ulp = want == 0 ? 0x1p-149 : std::ldexp(1.0, std::ilogb(static_cast<float>(want)) - 23);
      const double e = std::fabs(loss.get(i) - want) / ulp;
      if (e > worst) worst = e, worst_i = i;
    }
    EXPECT_LE(worst, 2.0) << "at x = " << x.get(worst_i) << ", y = " << y.get(worst_i);
  }
}

// The reduced forwards of bce and bce_with_logits (their own loops: bce's hard- and soft-label vectors,
// bce_with_logits' log of a product; the per-element formula in tails and on other targets) against a float64 sum
// over the stored values: hard labels only, soft only, blocks of both, confident logits (tiny log1p terms, where a
// product of factors near 1 must keep its multiplies' roundings) and logits of +-1e8 (whose (1 - y) x and
// max(-x, 0) must cancel within the element). Within 1e-4 of the sum of the elements' magnitudes (float32 sums of a
// tile, one lane on the scalar target). Sizes around the 16- and 32-element blocks and past a tile.
TEST(PointwiseExtra, BceReducedForwardsMatchFloat64Sums) {
  namespace lf = lossfuse;
  enum class Kind { hard, soft, mixed, confident, huge };
  for (DType dt : {DType::f32, DType::bf16})
    for (bool logits : {false, true})
      for (Kind kind : {Kind::hard, Kind::soft, Kind::mixed, Kind::confident, Kind::huge})
        for (std::int64_t n : {16, 32, 33, 1000, 16384 * 2 + 37}) {
          if (!logits && (kind == Kind::confident || kind == Kind::huge)) continue;
          SCOPED_TRACE(dname(dt) + (logits ? " bce_with_logits" : " bce") + " kind " +
                       std::to_string(static_cast<int>(kind)) + " n " + std::to_string(n));
          Tensor x = Tensor::make(dt, {n}), y = Tensor::make(dt, {n});
          Rng rng(static_cast<std::uint64_t>(n) * 31 + static_cast<std::uint64_t>(kind));
          for (std::int64_t i = 0; i < n; ++i) {
            const bool hard = kind == Kind::hard || kind == Kind::confident || kind == Kind::huge ||
                              (kind == Kind::mixed && (i / 32) % 2 == 0);
            const double label = (rng.next() & 1) ? 1.0 : 0.0;
            y.set(i, hard ? label : rng.uniform());
            double v = logits ? 3 * rng.normal() : rng.uniform();
            if (kind == Kind::confident) v = (label == 1.0 ? 1 : -1) * (9.0 + 4.0 * rng.uniform());
            if (kind == Kind::huge) v = i % 2 == 0 ? 5.0 : (label == 1.0 ? 1e8 : -1e8);
            x.set(i, v);
          }
          double want = 0, scale = 0;
          for (std::int64_t i = 0; i < n; ++i) {
            const double xv = x.get(i), yv = y.get(i);
            const double l =
                logits ? (1 - yv) * xv + std::max(-xv, 0.0) + std::log1p(std::exp(-std::fabs(xv)))
                       : -(yv * std::max(std::log(xv), -100.0) + (1 - yv) * std::max(std::log1p(-xv), -100.0));
            want += l, scale += std::fabs(l);
          }
          for (Reduction r : {Reduction::sum, Reduction::mean}) {
            Tensor out = Tensor::make(DType::f32, {});
            if (logits) {
              lf::bce_with_logits_forward(x.view, y.view, {r, std::nullopt, std::nullopt}, out.view);
            } else {
              lf::bce_forward(x.view, y.view, {r, std::nullopt}, out.view);
            }
            const double div = r == Reduction::mean ? static_cast<double>(n) : 1.0;
            EXPECT_NEAR(out.get(0), want / div, 1e-4 * scale / div + 1e-30) << (r == Reduction::sum ? "sum" : "mean");
          }
        }
}
