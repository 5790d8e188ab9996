// The fused linear cross-entropy's test harness, for every backend: cases, their data, the float64 reference
// (cross-entropy applied to x W^T + b computed in float64) and one run of both ways through a Mirror
// (tests/device_mirror.hpp) of every operand, checked against the reference. tests/core/linear_cross_entropy_test.cpp
// runs it on the CPU, tests/cuda/linear_cross_entropy_cuda_test.cpp on CUDA.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "device_mirror.hpp"
#include "lossfuse/linear_cross_entropy.hpp"
#include "test_util.hpp"

namespace lftest::lce {

using lossfuse::CrossEntropyOutputs;
using lossfuse::LinearCrossEntropyGrads;
using lossfuse::LinearCrossEntropyOptions;

// Tolerance relative to the largest reference magnitude of an output: 16-bit runs multiply the gradient of the
// logits rounded to 16 bits (as a 16-bit autograd graph would), float32 runs accumulate H-long dot products.
inline double rel_tol(DType t) {
  switch (t) {
    case DType::f64: return 1e-10;
    case DType::f32: return 2e-5;
    case DType::f16: return 4e-3;
    default: return 2e-2;
  }
}

inline ::testing::AssertionResult close_rel(const std::string& what, const std::vector<double>& got,
                                            const std::vector<double>& want, DType t) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << what << ": size " << got.size();
  double scale = 1e-3;
  for (double v : want) scale = std::max(scale, std::abs(v));
  const double tol = rel_tol(t) * scale;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const bool both_nan = std::isnan(got[i]) && std::isnan(want[i]);
    if (!both_nan && !(std::abs(got[i] - want[i]) <= tol)) {
      return ::testing::AssertionFailure()
             << what << "[" << i << "]: got " << got[i] << ", want " << want[i] << " (tol " << tol << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

struct Case {
  DType dt = DType::f32;
  std::int64_t N = 7, H = 5, V = 11;
  Reduction red = Reduction::mean;
  bool bias = true, weight = false;
  double eps = 0, softcap = 0, scale = 1, zls = 0;
  std::int64_t chunk = 0;
  bool all_ignored = false;
  bool zero_target_weights = false;  // every kept target is one of classes 0..2, whose weights are 0
  std::int64_t tile = 0;             // vocab_tile
  double filter = 0;                 // grad_filter
};

inline std::string case_name(const Case& c) {
  return nm(c.dt) + "_" + red_name(c.red) + "_N" + std::to_string(c.N) + "_H" + std::to_string(c.H) + "_V" +
         std::to_string(c.V) + (c.bias ? "_bias" : "") + (c.weight ? "_w" : "") + (c.eps ? "_ls" : "") +
         (c.softcap ? "_cap" : "") + (c.scale != 1 ? "_scale" : "") + (c.zls ? "_z" : "") + "_chunk" +
         std::to_string(c.chunk) + (c.all_ignored ? "_allignored" : "") + (c.zero_target_weights ? "_zerow" : "") +
         (c.tile ? "_tile" + std::to_string(c.tile) : "");
}

struct Data {
  Tensor x, w, b, t, cw;
  std::vector<double> xv, wv, bv;
  std::vector<std::int64_t> tv;
};

inline Data make_data(const Case& c, std::uint64_t seed) {
  Rng rng(seed);
  Data d;
  d.x = Tensor::make(c.dt, {c.N, c.H});
  d.w = Tensor::make(c.dt, {c.V, c.H});
  d.b = Tensor::make(c.dt, {c.V});
  d.t = Tensor::make(DType::i32, {c.N});
  d.cw = Tensor::make(c.dt == DType::f64 ? DType::f64 : DType::f32, {c.V});
  for (std::int64_t i = 0; i < c.N * c.H; ++i) d.x.set(i, rng.uniform(-1, 1));
  for (std::int64_t i = 0; i < c.V * c.H; ++i) d.w.set(i, rng.uniform(-1, 1));
  for (std::int64_t i = 0; i < c.V; ++i) d.b.set(i, rng.uniform(-0.5, 0.5));
  for (std::int64_t i = 0; i < c.V; ++i) d.cw.set(i, c.zero_target_weights && i < 3 ? 0.0 : rng.uniform(0.2, 2.0));
  const std::uint64_t classes = c.zero_target_weights ? 3 : static_cast<std::uint64_t>(c.V);
  for (std::int64_t i = 0; i < c.N; ++i) {
    const bool ignored = c.all_ignored || rng.uniform() < 0.2;
    d.t.set_int(i, ignored ? -100 : static_cast<std::int64_t>(rng.next() % classes));
  }
  d.xv = d.x.values(), d.wv = d.w.values(), d.bv = d.b.values();
  for (std::int64_t i = 0; i < c.N; ++i) d.tv.push_back(d.t.get_int(i));
  return d;
}

struct Expected {
  lfref::CeResult ce;
  std::vector<double> logits;  // N x V, x W^T + b in float64
  std::vector<double> dx, dw, db;
};

inline Expected expected(const Case& c, const Data& d, const std::vector<double>& grad_loss) {
  lfref::CeInput in;
  in.rows = c.N, in.C = c.V;
  in.x.assign(static_cast<std::size_t>(c.N * c.V), 0.0);
  for (std::int64_t r = 0; r < c.N; ++r) {
    for (std::int64_t v = 0; v < c.V; ++v) {
      double s = c.bias ? d.bv[v] : 0.0;
      for (std::int64_t h = 0; h < c.H; ++h) s += d.xv[r * c.H + h] * d.wv[v * c.H + h];
      in.x[r * c.V + v] = s;
    }
  }
  in.target = d.tv;
  if (c.weight) in.weight = d.cw.values();
  in.reduction = c.red, in.label_smoothing = c.eps, in.softcap = c.softcap, in.logit_scale = c.scale;
  in.z_loss_scale = c.zls, in.grad_loss = grad_loss;
  Expected e;
  e.ce = lfref::cross_entropy(in);
  e.logits = in.x;
  e.dx.assign(static_cast<std::size_t>(c.N * c.H), 0.0);
  e.dw.assign(static_cast<std::size_t>(c.V * c.H), 0.0);
  e.db.assign(static_cast<std::size_t>(c.V), 0.0);
  for (std::int64_t r = 0; r < c.N; ++r) {
    for (std::int64_t v = 0; v < c.V; ++v) {
      const double g = e.ce.grad[r * c.V + v];
      e.db[v] += g;
      for (std::int64_t h = 0; h < c.H; ++h) {
        e.dx[r * c.H + h] += g * d.wv[v * c.H + h];
        e.dw[v * c.H + h] += g * d.xv[r * c.H + h];
      }
    }
  }
  return e;
}

inline LinearCrossEntropyOptions options(const Case& c, const Data& d) {
  LinearCrossEntropyOptions o;
  o.ce.reduction = c.red;
  o.ce.label_smoothing = c.eps, o.ce.softcap = c.softcap, o.ce.logit_scale = c.scale, o.ce.z_loss_scale = c.zls;
  if (c.weight) o.ce.weight = d.cw.view;
  o.chunk_rows = c.chunk;
  o.vocab_tile = c.tile;
  o.grad_filter = c.filter;
  return o;
}

inline DType acc_of(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

inline Data case_data(const Case& c) { return make_data(c, 1234 + static_cast<std::uint64_t>(c.N * 31 + c.V)); }

// The outputs of one run, and the upstream gradients it used (empty: forward with grads, upstream 1).
struct Outputs {
  Tensor loss, lse, zl, gx, gw, gb;
  std::vector<double> grad_loss;
};

// One run on the device `mem` gives (nullptr: the CPU): every operand and output goes through a Mirror, and the
// outputs come back to the host tensors.
inline Outputs run_lce(const Case& c, Data& d, bool fused, const DeviceMemory* mem = nullptr) {
  const DType acc = acc_of(c.dt);
  const std::vector<std::int64_t> loss_shape =
      c.red == Reduction::none ? std::vector<std::int64_t>{c.N} : std::vector<std::int64_t>{};
  Outputs r;
  r.loss = Tensor::make(acc, loss_shape), r.lse = Tensor::make(acc, {c.N}), r.zl = Tensor::make(acc, loss_shape);
  r.gx = Tensor::make(c.dt, {c.N, c.H}, Layout::padded), r.gw = Tensor::make(c.dt, {c.V, c.H});
  r.gb = Tensor::make(acc, {c.V});  // float32 bias gradient: accepted for any input dtype
  Mirror m(mem);
  LinearCrossEntropyOptions o = options(c, d);
  if (c.weight) o.ce.weight = m(d.cw);
  const std::optional<TensorView> b = c.bias ? std::optional<TensorView>(m(d.b)) : std::nullopt;
  const TensorView x = m(d.x), w = m(d.w), t = m(d.t);
  LinearCrossEntropyGrads g{m(r.gx), m(r.gw), c.bias ? std::optional<TensorView>(m(r.gb)) : std::nullopt};
  const CrossEntropyOutputs out{m(r.loss), m(r.lse), m(r.zl)};
  Tensor gl = Tensor::make(acc, loss_shape);
  if (fused) {
    lossfuse::linear_cross_entropy_forward(x, w, b, t, o, out, g);
  } else {
    lossfuse::linear_cross_entropy_forward(x, w, b, t, o, out);
    Rng rng(99);
    for (std::int64_t i = 0; i < gl.numel(); ++i) {
      r.grad_loss.push_back(rng.uniform(-2, 2));
      gl.set(i, r.grad_loss.back());
    }
    lossfuse::linear_cross_entropy_backward(x, w, b, t, out.lse.value(), m(gl), o, g);
  }
  m.download();
  return r;
}

// The fused forward's gradients (made for an upstream gradient of 1; 'mean' / 'sum') brought to the upstream
// gradient g by linear_cross_entropy_scale_held, on the device `mem` gives (nullptr: the CPU).
inline Outputs run_held(const Case& c, Data& d, double g, const DeviceMemory* mem = nullptr) {
  const DType acc = acc_of(c.dt);
  Outputs r;
  r.loss = Tensor::make(acc, {}), r.lse = Tensor::make(acc, {c.N}), r.zl = Tensor::make(acc, {});
  r.gx = Tensor::make(c.dt, {c.N, c.H}, Layout::padded), r.gw = Tensor::make(c.dt, {c.V, c.H});
  r.gb = Tensor::make(acc, {c.V});
  Tensor gl = Tensor::make(acc, {});
  gl.set(0, g);
  r.grad_loss = {g};
  Mirror m(mem);
  LinearCrossEntropyOptions o = options(c, d);
  if (c.weight) o.ce.weight = m(d.cw);
  const std::optional<TensorView> b = c.bias ? std::optional<TensorView>(m(d.b)) : std::nullopt;
  const LinearCrossEntropyGrads grads{m(r.gx), m(r.gw), c.bias ? std::optional<TensorView>(m(r.gb)) : std::nullopt};
  const TensorView t = m(d.t);
  lossfuse::linear_cross_entropy_forward(m(d.x), m(d.w), b, t, o, CrossEntropyOutputs{m(r.loss), m(r.lse), m(r.zl)},
                                         grads);
  lossfuse::linear_cross_entropy_scale_held(grads, t, o, m(gl));
  m.download();
  return r;
}

// run_held's gradients against the float64 reference's for the upstream gradient g.
inline void check_held(const Case& c, double g, const DeviceMemory* mem = nullptr) {
  SCOPED_TRACE(case_name(c) + " held, upstream " + std::to_string(g));
  Data d = case_data(c);
  const Outputs run = run_held(c, d, g, mem);
  const Expected e = expected(c, d, run.grad_loss);
  EXPECT_TRUE(close_rel("grad_x", run.gx.values(), e.dx, c.dt));
  EXPECT_TRUE(close_rel("grad_weight", run.gw.values(), e.dw, c.dt));
  if (c.bias) EXPECT_TRUE(close_rel("grad_bias", run.gb.values(), e.db, c.dt));
  EXPECT_TRUE(run.gx.outside_untouched(0));
}

inline void run_case(const Case& c, bool fused, const DeviceMemory* mem = nullptr) {
  SCOPED_TRACE(case_name(c) + (fused ? " forward-with-grads" : " forward+backward"));
  Data d = case_data(c);
  const Outputs run = run_lce(c, d, fused, mem);
  const Tensor &loss = run.loss, &lse = run.lse, &zl = run.zl, &gx = run.gx, &gw = run.gw, &gb = run.gb;
  const Expected e = expected(c, d, run.grad_loss);
  // Logits are made from the rounded inputs in float32 (float64): the loss is as accurate as cross-entropy's.
  const DType loss_t = c.dt == DType::f64 ? DType::f64 : DType::f32;
  if (c.red == Reduction::none) {
    EXPECT_TRUE(close_rel("loss", loss.values(), e.ce.row_loss, loss_t));
    EXPECT_TRUE(close_rel("z_loss", zl.values(), e.ce.row_z, loss_t));
  } else {
    EXPECT_TRUE(close_rel("loss", loss.values(), {e.ce.loss}, loss_t));
    EXPECT_TRUE(close_rel("z_loss", zl.values(), {e.ce.z}, loss_t));
  }
  EXPECT_TRUE(close_rel("lse", lse.values(), e.ce.lse, loss_t));
  EXPECT_TRUE(close_rel("grad_x", gx.values(), e.dx, c.dt));
  EXPECT_TRUE(close_rel("grad_weight", gw.values(), e.dw, c.dt));
  if (c.bias) EXPECT_TRUE(close_rel("grad_bias", gb.values(), e.db, c.dt));
  EXPECT_TRUE(gx.outside_untouched(0));
}

// Whole rows (tile 0) and vocabulary tiles that do not divide V (11 = 4 + 4 + 3; 301 = 4 x 64 + 45).
inline std::vector<Case> cases() {
  std::vector<Case> v;
  for (DType t : kFloats) {
    for (Reduction r : kReds) {
      for (std::int64_t tile : {0, 4}) {
        for (std::int64_t chunk : {0, 1, 3}) {
          Case c;
          c.dt = t, c.red = r, c.chunk = chunk, c.tile = tile;
          v.push_back(c);
          c.weight = true, c.eps = 0.1, c.bias = false;
          v.push_back(c);
          c.softcap = 4.0, c.scale = 0.7, c.zls = 0.01, c.bias = true;
          v.push_back(c);
        }
        Case big;
        big.dt = t, big.red = r, big.N = 37, big.H = 24, big.V = 301, big.weight = true, big.eps = 0.05;
        big.chunk = 5, big.tile = tile ? 64 : 0;
        v.push_back(big);
        Case ign = big;
        ign.all_ignored = true, ign.N = 6, ign.chunk = 4;
        v.push_back(ign);
        // rows remain but their target weights sum to 0: 'mean' is NaN, and so are the gradients (torch's), with
        // and without label smoothing (which alone would make the sum over 0 infinite)
        for (double eps : {0.0, 0.05}) {
          Case zw = big;
          zw.zero_target_weights = true, zw.N = 8, zw.chunk = 3, zw.eps = eps;
          v.push_back(zw);
        }
        // A wider vocabulary: V = 1100, whole rows or tiles of 700 and 400 (the vector row kernels' tails).
        Case wide;
        wide.dt = t, wide.red = r, wide.N = 9, wide.H = 16, wide.V = 1100, wide.chunk = 4, wide.tile = tile ? 700 : 0;
        v.push_back(wide);
      }
      // Tiles of one class, one tile of exactly V, one wider than V; every option at once.
      for (std::int64_t tile : {1, 11, 50}) {
        Case c;
        c.dt = t, c.red = r, c.chunk = 2, c.tile = tile, c.weight = true, c.eps = 0.2, c.softcap = 3.0;
        c.scale = -1.3, c.zls = 0.02;
        v.push_back(c);
        // a negative scale with no soft-cap: a tile's padded lanes (-inf) must not enter its max as +inf
        // (fuzz/linear_cross_entropy_fuzz.cpp found lse NaN)
        c.softcap = 0.0;
        v.push_back(c);
      }
    }
  }
  return v;
}

// The cases whose held gradients have one upstream value ('mean' / 'sum'): linear_cross_entropy_scale_held's.
inline std::vector<Case> reduced_cases() {
  std::vector<Case> v;
  for (const Case& c : cases()) {
    if (c.red != Reduction::none) v.push_back(c);
  }
  return v;
}

}  // namespace lftest::lce
