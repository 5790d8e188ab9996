// lossfuse tests: the margin and embedding losses' harness and spec tables (triplet_margin, cosine_embedding,
// multi_margin, multilabel_margin, multilabel_soft_margin), run against the float64 reference
// (tests/reference/margin_reference.hpp) by every backend's test (tests/cpu/margin_test.cpp,
// tests/cuda/margin_cuda_test.cpp). A Spec names a loss, its options, a dtype, a reduction, a shape, the layouts of
// the inputs and gradients and the gradients asked for; build() draws the inputs and computes the reference on their
// stored values; check_case() runs the forward and backward on a device's copies (tests/device_mirror.hpp) and checks
// the loss and every gradient against the reference's error budget, and that nothing outside the outputs is written.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "device_mirror.hpp"
#include "reference/margin_reference.hpp"
#include "test_util.hpp"

namespace lftest::margin {

using lossfuse::LossKind;

inline std::string kind_name(LossKind k) { return std::string(lossfuse::loss_kind_name(k)); }

// ---- one test case --------------------------------------------------------------------------------------------

struct Data {  // canonical values before they are stored (and rounded) into tensors
  std::vector<double> x[3];
  std::vector<double> ft;        // cosine float targets / soft targets
  std::vector<std::int64_t> it;  // integer targets (per row or per element)
};

struct Spec {
  std::string name;
  LossKind kind = LossKind::triplet_margin;
  DType dt = DType::f32;
  DType tdt = DType::i64;  // integer target dtype; cosine: a float dtype means the input's dtype
  std::vector<std::int64_t> shape{5, 7};
  Layout layout = Layout::contiguous, grad_layout = Layout::contiguous;
  Reduction red = Reduction::mean;
  bool up = true;  // an upstream gradient (per row for none, a scalar otherwise)
  double margin = 1.0, p = 2.0, eps = 1e-6, scale = 1.0;
  int mp = 1;
  bool swap = false, weight = false;
  bool want_grad[3] = {true, true, true};
  bool one_target = false;  // multi_margin (C) input with a (1) target instead of ()
  std::uint64_t seed = 1;
  std::function<void(Rng&, std::int64_t R, std::int64_t D, Data&)> edit;
};
inline void PrintTo(const Spec& s, std::ostream* os) { *os << s.name; }

inline int num_inputs(LossKind k) {
  return k == LossKind::triplet_margin ? 3 : k == LossKind::cosine_embedding ? 2 : 1;
}
inline int num_grads(LossKind k) {
  return k == LossKind::triplet_margin                                                ? 3
         : (k == LossKind::cosine_embedding || k == LossKind::multilabel_soft_margin) ? 2
                                                                                      : 1;
}

struct Problem {
  Spec s;
  std::int64_t R = 0, D = 0;
  std::vector<std::int64_t> rshape, tshape;
  std::vector<Tensor> x;
  std::optional<Tensor> target, weight, grad_loss;
  lfref::MarginResult ref;
  [[nodiscard]] DType acc() const { return acc_dtype(s.dt); }
};

// Fills the tensors from canonical data and computes the reference on the rounded values.
inline Problem build(const Spec& s) {
  Problem p;
  p.s = s;
  p.D = s.shape.back();
  p.rshape = std::vector<std::int64_t>(s.shape.begin(), s.shape.end() - 1);
  p.R = prod(p.rshape);
  const std::int64_t R = p.R, D = p.D;
  Rng rng(s.seed * 7919 + static_cast<std::uint64_t>(R * 31 + D));
  Data d;
  const int ni = num_inputs(s.kind);
  for (int k = 0; k < ni; ++k) {
    d.x[k].resize(R * D);
    for (auto& v : d.x[k]) v = s.scale * rng.normal();
  }
  switch (s.kind) {
    case LossKind::triplet_margin:  // positives near the anchor, negatives a bit further: both hinge sides
      for (std::int64_t i = 0; i < R * D; ++i) {
        d.x[1][i] = d.x[0][i] + 0.6 * s.scale * rng.normal();
        d.x[2][i] = d.x[0][i] + 0.8 * s.scale * rng.normal();
      }
      break;
    case LossKind::cosine_embedding:
      d.ft.resize(R);
      for (auto& v : d.ft) v = rng.uniform() < 0.5 ? 1.0 : -1.0;
      if (R > 3) d.ft[2] = 0, d.ft[3] = s.tdt == DType::u8 ? 2 : -2;  // other values give 0
      break;
    case LossKind::multi_margin:
      d.it.resize(R);
      for (auto& v : d.it) v = rng.index(D);
      break;
    case LossKind::multilabel_margin:
      d.it.assign(R * D, 0);
      for (std::int64_t r = 0; r < R; ++r) {
        // 0..6 labels, may repeat; a uint8 target cannot hold -1, so its rows are full label lists
        const std::int64_t L = s.tdt == DType::u8 ? D : rng.index(std::min<std::int64_t>(D, 6) + 1);
        std::int64_t c = 0;
        for (; c < L; ++c) d.it[r * D + c] = rng.index(D);
        if (c < D) d.it[r * D + c++] = -1;
        for (; c < D; ++c) d.it[r * D + c] = rng.index(D + 1) - 1;  // anything in [-1, D) after the end
      }
      break;
    case LossKind::multilabel_soft_margin:
      d.ft.resize(R * D);
      for (auto& v : d.ft) v = rng.uniform() < 0.3 ? rng.uniform() : (rng.uniform() < 0.5 ? 0.0 : 1.0);
      break;
    default: break;
  }
  if (s.edit) s.edit(rng, R, D, d);

  for (int k = 0; k < ni; ++k) {
    p.x.push_back(Tensor::make(s.dt, s.shape, s.layout, kSentinel));
    for (std::int64_t i = 0; i < R * D; ++i) p.x[k].set(i, d.x[k][i]);
  }
  lfref::MarginCommon c;
  c.rows = R, c.D = D, c.reduction = s.red, c.u = compute_unit(s.dt);
  if (s.up) {
    if (s.red == Reduction::none) {
      p.grad_loss = Tensor::make(
          p.acc(), s.kind == LossKind::multi_margin && s.one_target ? std::vector<std::int64_t>{1} : p.rshape);
      for (std::int64_t r = 0; r < R; ++r) {
        p.grad_loss->set(r, lfref::round_to(rng.uniform(-2.0, 2.0), lfref::kBF16));
        c.upstream.push_back(p.grad_loss->get(r));
      }
    } else {
      p.grad_loss = Tensor::make(p.acc(), {});
      p.grad_loss->set(0, -0.75);
      c.upstream = {-0.75};
    }
  }
  auto vals = [](const Tensor& t) { return t.values(); };
  switch (s.kind) {
    case LossKind::triplet_margin: {
      lfref::TripletInput in;
      in.c = c, in.a = vals(p.x[0]), in.p = vals(p.x[1]), in.n = vals(p.x[2]);
      in.margin = s.margin, in.pnorm = s.p, in.eps = s.eps, in.swap = s.swap;
      p.ref = lfref::triplet_margin(in);
      break;
    }
    case LossKind::cosine_embedding: {
      const DType tdt = lossfuse::is_floating(s.tdt) ? s.dt : s.tdt;
      p.target = Tensor::make(tdt, p.rshape);
      lfref::CosineInput in;
      in.c = c, in.x1 = vals(p.x[0]), in.x2 = vals(p.x[1]), in.margin = s.margin;
      for (std::int64_t r = 0; r < R; ++r) {
        if (lossfuse::is_floating(tdt))
          p.target->set(r, d.ft[r]);
        else
          p.target->set_int(r, static_cast<std::int64_t>(d.ft[r]));
        in.y.push_back(p.target->get(r));
      }
      p.ref = lfref::cosine_embedding(in);
      break;
    }
    case LossKind::multi_margin: {
      p.target = Tensor::make(s.tdt, s.one_target ? std::vector<std::int64_t>{1} : p.rshape);
      lfref::MultiMarginInput in;
      in.c = c, in.x = vals(p.x[0]), in.margin = s.margin, in.p = s.mp;
      for (std::int64_t r = 0; r < R; ++r) p.target->set_int(r, d.it[r]), in.y.push_back(p.target->get_int(r));
      if (s.weight) {
        p.weight = Tensor::make(s.dt, {D});
        for (std::int64_t j = 0; j < D; ++j) p.weight->set(j, lfref::round_to(rng.uniform(0.25, 2.0), lfref::kBF16));
        in.weight = p.weight->values();
      }
      p.ref = lfref::multi_margin(in);
      break;
    }
    case LossKind::multilabel_margin: {
      p.target = Tensor::make(s.tdt, s.shape, s.layout == Layout::transposed ? Layout::transposed : Layout::contiguous);
      lfref::MultilabelMarginInput in;
      in.c = c, in.x = vals(p.x[0]);
      for (std::int64_t i = 0; i < R * D; ++i) p.target->set_int(i, d.it[i]), in.target.push_back(p.target->get_int(i));
      p.ref = lfref::multilabel_margin(in);
      break;
    }
    case LossKind::multilabel_soft_margin: {
      p.target = Tensor::make(s.dt, s.shape, s.layout);
      lfref::SoftMarginInput in;
      in.c = c, in.x = vals(p.x[0]);
      for (std::int64_t i = 0; i < R * D; ++i) p.target->set(i, d.ft[i]);
      in.y = vals(*p.target);
      if (s.weight) {
        p.weight = Tensor::make(s.dt, {D});
        for (std::int64_t j = 0; j < D; ++j) p.weight->set(j, lfref::round_to(rng.uniform(0.25, 2.0), lfref::kBF16));
        in.weight = p.weight->values();
      }
      p.ref = lfref::multilabel_soft_margin(in);
      break;
    }
    default: break;
  }
  return p;
}

inline std::vector<std::int64_t> loss_shape(const Problem& p) {
  if (p.s.red != Reduction::none) return {};
  if (p.s.kind == LossKind::multi_margin && p.s.one_target) return {1};
  return p.rshape;
}

// The views a call takes: the problem's own (host) tensors, or their device copies through a Mirror.
struct Views {
  TensorView x[3];
  std::optional<TensorView> target, weight, grad_loss;
};
inline Views views(Mirror& m, Problem& p) {
  Views v;
  for (std::size_t k = 0; k < p.x.size(); ++k) v.x[k] = m(p.x[k]);
  v.target = m(p.target), v.weight = m(p.weight), v.grad_loss = m(p.grad_loss);
  return v;
}
inline Views host_views(const Problem& p) {
  Views v;
  for (std::size_t k = 0; k < p.x.size(); ++k) v.x[k] = p.x[k].view;
  const auto opt = [](const std::optional<Tensor>& t) { return t ? std::optional<TensorView>(t->view) : std::nullopt; };
  v.target = opt(p.target), v.weight = opt(p.weight), v.grad_loss = opt(p.grad_loss);
  return v;
}

inline void call_forward(const Problem& p, const Views& v, const TensorView& loss) {
  const Spec& s = p.s;
  switch (s.kind) {
    case LossKind::triplet_margin: {
      lossfuse::TripletMarginOptions o;
      o.margin = s.margin, o.p = s.p, o.eps = s.eps, o.swap = s.swap, o.reduction = s.red;
      return lossfuse::triplet_margin_forward(v.x[0], v.x[1], v.x[2], o, loss);
    }
    case LossKind::cosine_embedding: {
      lossfuse::CosineEmbeddingOptions o;
      o.margin = s.margin, o.reduction = s.red;
      return lossfuse::cosine_embedding_forward(v.x[0], v.x[1], *v.target, o, loss);
    }
    case LossKind::multi_margin: {
      lossfuse::MultiMarginOptions o;
      o.p = s.mp, o.margin = s.margin, o.weight = v.weight, o.reduction = s.red;
      return lossfuse::multi_margin_forward(v.x[0], *v.target, o, loss);
    }
    case LossKind::multilabel_margin: {
      lossfuse::MultilabelMarginOptions o;
      o.reduction = s.red;
      return lossfuse::multilabel_margin_forward(v.x[0], *v.target, o, loss);
    }
    case LossKind::multilabel_soft_margin: {
      lossfuse::MultilabelSoftMarginOptions o;
      o.weight = v.weight, o.reduction = s.red;
      return lossfuse::multilabel_soft_margin_forward(v.x[0], *v.target, o, loss);
    }
    default: return;
  }
}

inline void call_backward(const Problem& p, const Views& v, const std::optional<TensorView> g[3]) {
  const Spec& s = p.s;
  const std::optional<TensorView>& up = v.grad_loss;
  switch (s.kind) {
    case LossKind::triplet_margin: {
      lossfuse::TripletMarginOptions o;
      o.margin = s.margin, o.p = s.p, o.eps = s.eps, o.swap = s.swap, o.reduction = s.red;
      return lossfuse::triplet_margin_backward(v.x[0], v.x[1], v.x[2], up, o, g[0], g[1], g[2]);
    }
    case LossKind::cosine_embedding: {
      lossfuse::CosineEmbeddingOptions o;
      o.margin = s.margin, o.reduction = s.red;
      return lossfuse::cosine_embedding_backward(v.x[0], v.x[1], *v.target, up, o, g[0], g[1]);
    }
    case LossKind::multi_margin: {
      lossfuse::MultiMarginOptions o;
      o.p = s.mp, o.margin = s.margin, o.weight = v.weight, o.reduction = s.red;
      return lossfuse::multi_margin_backward(v.x[0], *v.target, up, o, g[0]);
    }
    case LossKind::multilabel_margin: {
      lossfuse::MultilabelMarginOptions o;
      o.reduction = s.red;
      return lossfuse::multilabel_margin_backward(v.x[0], *v.target, up, o, g[0]);
    }
    case LossKind::multilabel_soft_margin: {
      lossfuse::MultilabelSoftMarginOptions o;
      o.weight = v.weight, o.reduction = s.red;
      return lossfuse::multilabel_soft_margin_backward(v.x[0], *v.target, up, o, g[0], g[1]);
    }
    default: return;
  }
}

// The calls on the problem's own tensors.
inline void call_forward(const Problem& p, const TensorView& loss) { call_forward(p, host_views(p), loss); }
inline void call_backward(const Problem& p, const std::optional<TensorView> g[3]) {
  call_backward(p, host_views(p), g);
}

struct Outputs {
  Tensor loss;
  std::vector<std::optional<Tensor>> grads;
};

// The forward and backward on `mem`'s copies of p's tensors (nullptr: on the host), outputs read back.
inline Outputs run_lib(Problem& p, const DeviceMemory* mem = nullptr) {
  const Spec& s = p.s;
  Outputs out;
  out.grads.resize(3);
  Mirror m(mem);
  const Views v = views(m, p);
  out.loss = Tensor::make(p.acc(), loss_shape(p), Layout::contiguous, kSentinel);
  call_forward(p, v, m(out.loss));
  std::optional<TensorView> g[3];
  for (int k = 0; k < num_grads(s.kind); ++k) {
    if (!s.want_grad[k]) continue;
    out.grads[k] = Tensor::make(s.dt, s.shape, s.grad_layout, kSentinel);
    g[k] = m(*out.grads[k]);
  }
  call_backward(p, v, g);
  m.download();
  return out;
}

// The loss and every gradient against the reference, nothing written outside the outputs' views.
inline void check_case(const Spec& s, const DeviceMemory* mem = nullptr) {
  Problem p = build(s);
  const Outputs out = run_lib(p, mem);
  const DType acc = p.acc();
  if (s.red == Reduction::none) {
    EXPECT_TRUE(close_all("loss", out.loss.values(), p.ref.rows, p.ref.rows_tol, acc));
  } else {
    EXPECT_TRUE(close_one("loss", out.loss.get(0), p.ref.loss, p.ref.loss_tol, acc));
  }
  static const char* kGradNames[3] = {"grad0", "grad1", "grad2"};
  for (int k = 0; k < num_grads(s.kind); ++k) {
    if (!s.want_grad[k]) continue;
    const Tensor& g = *out.grads[k];
    // a gradient beyond the output dtype's range is stored as an infinity (e.g. 1/|x| of a zero vector in float16)
    std::vector<double> want = p.ref.grad[k];
    for (double& w : want)
      if (std::isfinite(w) && std::isinf(round_to(s.dt, w))) w = round_to(s.dt, w);
    EXPECT_TRUE(close_all(kGradNames[k], g.values(), want, p.ref.grad_tol[k], s.dt));
    EXPECT_TRUE(g.outside_untouched(kSentinel)) << kGradNames[k] << " written outside its view";
  }
}

// ---- spec tables ----------------------------------------------------------------------------------------------

inline std::string case_name(const Spec& s) {
  return kind_name(s.kind) + "_" + nm(s.dt) + "_" + red_name(s.red) + "_" + shape_name(s.shape);
}

// Every loss x dtype x reduction x a few sizes (last dim 1, 7, 31, 1271), with the options varied.
inline std::vector<Spec> option_specs() {
  std::vector<Spec> v;
  std::uint64_t k = 0;
  const LossKind kinds[] = {LossKind::triplet_margin, LossKind::cosine_embedding, LossKind::multi_margin,
                            LossKind::multilabel_margin, LossKind::multilabel_soft_margin};
  const std::vector<std::vector<std::int64_t>> shapes = {{7}, {9, 1}, {6, 31}, {3, 1271}, {4, 7}};
  for (LossKind kind : kinds)
    for (DType dt : kFloats)
      for (Reduction red : kReds)
        for (const auto& shape : shapes) {
          Spec s;
          s.kind = kind, s.dt = dt, s.red = red, s.shape = shape, s.seed = ++k;
          s.up = (k % 3) != 0;
          std::string extra;
          switch (kind) {
            case LossKind::triplet_margin: {
              const double ps[] = {2.0, 1.0, 3.0, 1.5, kInf};
              s.p = ps[k % 5];
              s.swap = (k % 2) == 0;
              s.margin = (k % 4 == 1) ? 0.5 : 1.0;
              s.eps = (k % 7 == 3) ? 0.25 : 1e-6;
              extra = "_p" + std::to_string(static_cast<int>(std::isinf(s.p) ? 99 : s.p * 10)) +
                      (s.swap ? "_swap" : "") + (s.eps > 0.1 ? "_bigeps" : "");
              break;
            }
            case LossKind::cosine_embedding:
              s.margin = (k % 3 == 0) ? -0.2 : (k % 3 == 1 ? 0.0 : 0.3);
              s.tdt = (k % 2) ? DType::i64 : DType::f32;  // f32 here means: the input's float dtype
              s.want_grad[k % 3 == 2 ? 1 : 2] = false;
              extra = s.tdt == DType::i64 ? "_inttarget" : "_floattarget";
              if (shape.size() == 1) s.tdt = DType::i8;
              break;
            case LossKind::multi_margin:
              s.mp = 1 + static_cast<int>(k % 2);
              s.weight = (k % 3) != 1;
              s.margin = (k % 4 == 0) ? 0.5 : 1.0;
              extra = "_p" + std::to_string(s.mp) + (s.weight ? "_w" : "");
              break;
            case LossKind::multilabel_margin: break;
            case LossKind::multilabel_soft_margin:
              s.weight = (k % 2) == 0;
              s.want_grad[1] = (k % 3) != 0;
              extra = s.weight ? "_w" : "";
              break;
            default: break;
          }
          s.name = case_name(s) + extra;
          v.push_back(s);
        }
  return v;
}

// Strided inputs and gradients, higher-rank inputs where the loss allows them.
inline std::vector<Spec> layout_specs() {
  std::vector<Spec> v;
  std::uint64_t k = 100;
  const LossKind kinds[] = {LossKind::triplet_margin, LossKind::cosine_embedding, LossKind::multi_margin,
                            LossKind::multilabel_margin, LossKind::multilabel_soft_margin};
  for (LossKind kind : kinds)
    for (DType dt : {DType::f32, DType::bf16})
      for (Layout l : {Layout::transposed, Layout::padded}) {
        Spec s;
        s.kind = kind, s.dt = dt, s.layout = l, s.grad_layout = (k % 2) ? l : Layout::padded;
        s.red = kReds[k % 3], s.seed = ++k, s.weight = true, s.swap = true;
        if (kind == LossKind::triplet_margin || kind == LossKind::multilabel_soft_margin)
          s.shape = {3, 4, 9};
        else
          s.shape = {6, 9};
        s.name = case_name(s) + "_" + layout_name(l) + "_grad" + layout_name(s.grad_layout);
        v.push_back(s);
      }
  return v;
}

// Integer target dtypes (and cosine's float target).
inline std::vector<Spec> target_specs() {
  std::vector<Spec> v;
  std::uint64_t k = 200;
  for (LossKind kind : {LossKind::cosine_embedding, LossKind::multi_margin, LossKind::multilabel_margin})
    for (DType tdt : {DType::u8, DType::i8, DType::i16, DType::i32, DType::i64}) {
      if (kind == LossKind::cosine_embedding && tdt == DType::u8) continue;  // -1 does not fit
      Spec s;
      s.kind = kind, s.tdt = tdt, s.dt = (k % 2) ? DType::f32 : DType::f64, s.red = kReds[k % 3];
      s.shape = {8, 13}, s.seed = ++k;
      s.name = case_name(s) + "_" + nm(tdt);
      v.push_back(s);
    }
  return v;
}

// Empty batches, extreme values, special targets and options.
inline std::vector<Spec> edge_specs() {
  std::vector<Spec> v;
  std::uint64_t k = 300;
  const LossKind kinds[] = {LossKind::triplet_margin, LossKind::cosine_embedding, LossKind::multi_margin,
                            LossKind::multilabel_margin, LossKind::multilabel_soft_margin};
  for (LossKind kind : kinds)
    for (DType dt : kFloats)
      for (Reduction red : kReds) {
        {
          Spec s;
          s.kind = kind, s.dt = dt, s.red = red, s.shape = {0, 5}, s.seed = ++k, s.weight = true;
          s.name = "empty_" + case_name(s);
          v.push_back(s);
        }
        {  // large magnitudes: no overflow in the hinge / norms / logs
          Spec s;
          s.kind = kind, s.dt = dt, s.red = red, s.shape = {5, 6}, s.seed = ++k, s.weight = true;
          s.scale = dt == DType::f16 ? 100.0 : dt == DType::f64 ? 1e100 : 1e15;
          // cosine forms (s11 + eps)(s22 + eps) as torch does: it must stay finite in the compute type
          if (kind == LossKind::cosine_embedding) s.scale = dt == DType::f16 ? 100.0 : dt == DType::f64 ? 1e70 : 1e8;
          if (kind == LossKind::triplet_margin) s.scale = dt == DType::f16 ? 30.0 : dt == DType::f64 ? 1e100 : 1e15;
          if (kind == LossKind::multilabel_soft_margin)
            s.scale = dt == DType::f16 ? 1e4 : dt == DType::f64 ? 1e300 : 1e30;
          s.name = "huge_" + case_name(s);
          v.push_back(s);
        }
      }
  // triplet: p = 0 and p = inf with ties, swap ties, identical inputs (zero norms)
  for (DType dt : {DType::f64, DType::f32}) {
    Spec s;
    s.kind = LossKind::triplet_margin, s.dt = dt, s.p = 0, s.shape = {6, 5}, s.red = Reduction::sum, s.seed = ++k;
    s.name = "triplet_p0_" + nm(dt);
    v.push_back(s);
    s.p = kInf, s.eps = 0, s.name = "triplet_pinf_ties_" + nm(dt), s.seed = ++k;
    s.edit = [](Rng&, std::int64_t R, std::int64_t D, Data& d) {
      for (std::int64_t i = 0; i < R * D; ++i)
        d.x[0][i] = 0, d.x[1][i] = (i % 2) ? 1 : -1, d.x[2][i] = (i % 3) ? 2 : -2;
    };
    v.push_back(s);
    s.p = 2, s.swap = true, s.margin = 2, s.name = "triplet_swap_tie_" + nm(dt), s.seed = ++k;
    s.edit = [](Rng&, std::int64_t R, std::int64_t D, Data& d) {
      for (std::int64_t i = 0; i < R * D; ++i) d.x[0][i] = 0, d.x[1][i] = 0, d.x[2][i] = (i % D == 0) ? 1 : 0;
    };
    v.push_back(s);
    s.swap = false, s.eps = 0, s.name = "triplet_zero_norms_" + nm(dt), s.seed = ++k;
    s.edit = [](Rng&, std::int64_t R, std::int64_t D, Data& d) {
      for (std::int64_t i = 0; i < R * D; ++i) d.x[1][i] = d.x[0][i], d.x[2][i] = d.x[0][i];
    };
    v.push_back(s);
    s.p = 0.5, s.eps = 1e-6, s.edit = nullptr, s.name = "triplet_p05_" + nm(dt), s.seed = ++k;
    if (dt == DType::f64) v.push_back(s);
  }
  // triplet: p in {0, 1, 2} over rows long enough for the vector kernels (whole vectors and a tail), with and
  // without swap; and zero norms there (the 2-norm's gradient is 0, not v / 0)
  for (DType dt : kFloats)
    for (double pv : {0.0, 1.0, 2.0})
      for (bool sw : {false, true}) {
        Spec s;
        s.kind = LossKind::triplet_margin, s.dt = dt, s.p = pv, s.swap = sw, s.shape = {5, 37};
        s.red = Reduction::none, s.seed = ++k, s.margin = pv == 0.0 ? 40.0 : 2.0;
        s.name = "triplet_vector_p" + std::to_string(static_cast<int>(pv)) + (sw ? "_swap_" : "_") + nm(dt);
        v.push_back(s);
      }
  for (DType dt : kFloats) {
    Spec s;
    s.kind = LossKind::triplet_margin, s.dt = dt, s.p = 2, s.eps = 0, s.shape = {4, 37}, s.seed = ++k;
    s.red = Reduction::none, s.name = "triplet_vector_zero_norms_" + nm(dt);
    s.edit = [](Rng&, std::int64_t R, std::int64_t D, Data& d) {
      for (std::int64_t i = 0; i < R * D; ++i) d.x[1][i] = d.x[0][i], d.x[2][i] = (i < D) ? d.x[0][i] : d.x[2][i];
    };
    v.push_back(s);
  }
  // cosine: zero vectors, NaN targets, both inputs the same
  for (DType dt : kFloats) {
    Spec s;
    s.kind = LossKind::cosine_embedding, s.dt = dt, s.shape = {6, 9}, s.red = Reduction::none, s.seed = ++k;
    s.tdt = DType::f32, s.margin = -0.5;
    s.edit = [](Rng&, std::int64_t, std::int64_t D, Data& d) {
      for (std::int64_t j = 0; j < D; ++j) d.x[0][0 * D + j] = 0, d.x[1][1 * D + j] = 0, d.x[0][2 * D + j] = 0;
      for (std::int64_t j = 0; j < D; ++j) d.x[1][2 * D + j] = 0, d.x[1][4 * D + j] = d.x[0][4 * D + j];
      d.ft = {1, -1, 1, kNaN, -1, 1};
    };
    s.name = "cosine_zero_vectors_" + nm(dt);
    v.push_back(s);
  }
  // multilabel_margin: every label, no label, a label list filling the row
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    Spec s;
    s.kind = LossKind::multilabel_margin, s.dt = dt, s.shape = {4, 6}, s.red = Reduction::none, s.seed = ++k;
    s.edit = [](Rng&, std::int64_t, std::int64_t D, Data& d) {
      for (std::int64_t j = 0; j < D; ++j) d.it[0 * D + j] = j;                             // all labels, no terminator
      for (std::int64_t j = 0; j < D; ++j) d.it[1 * D + j] = -1;                            // empty list
      for (std::int64_t j = 0; j < D; ++j) d.it[2 * D + j] = (j < 3) ? 2 : -1;              // one label three times
      d.it[3 * D + 0] = 5, d.it[3 * D + 1] = -1, d.it[3 * D + 2] = 0, d.it[3 * D + 3] = 1;  // stops at -1
    };
    s.name = "multilabel_special_lists_" + nm(dt);
    v.push_back(s);
  }
  // multi_margin: (C) input with a () target and a (1) target
  for (bool one : {false, true})
    for (Reduction red : kReds) {
      Spec s;
      s.kind = LossKind::multi_margin, s.shape = {9}, s.red = red, s.one_target = one, s.weight = true, s.mp = 2;
      s.seed = ++k;
      s.name = std::string("multi_margin_1d_target") + (one ? "1" : "0d") + "_" + red_name(red);
      v.push_back(s);
    }
  // soft margin: extreme logits with hard targets
  for (DType dt : kFloats) {
    Spec s;
    s.kind = LossKind::multilabel_soft_margin, s.dt = dt, s.shape = {2, 4}, s.red = Reduction::none, s.seed = ++k;
    s.edit = [dt](Rng&, std::int64_t, std::int64_t, Data& d) {
      const double big = dt == DType::f16 ? 6e4 : dt == DType::f64 ? 1e300 : 1e30;
      d.x[0] = {-200, 200, 100, -100, big, -big, 0, 17};
      d.ft = {1, 0, 1, 0, 0, 1, 0.5, 0.25};
    };
    s.name = "soft_margin_extreme_" + nm(dt);
    v.push_back(s);
  }
  return v;
}

}  // namespace lftest::margin
