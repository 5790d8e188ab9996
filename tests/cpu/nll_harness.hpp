// lossfuse tests: NLL problems, their check against the float64 reference (torch.nn.functional.nll_loss) and
// the spec tables, run by every backend's test (tests/cpu/nll_test.cpp, tests/cuda/cross_entropy_cuda_test.cpp).
#pragma once

#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "cpu/class_harness.hpp"
#include "device_mirror.hpp"
#include "test_util.hpp"

namespace lftest::nll {

using lossfuse::NllOptions;

struct Spec : ClassSpec {
  Spec() { shape = {6, 11}, up_scalar = -0.75; }
};

struct Problem : ClassOperands {
  Spec s;
  Tensor input;
  lfref::NllInput in;
  lfref::NllResult ref;

  [[nodiscard]] NllOptions options() const {
    NllOptions o;
    o.reduction = s.red;
    o.ignore_index = s.ignore_index;
    if (weight) o.weight = weight->view;
    return o;
  }
  [[nodiscard]] DType acc() const { return acc_dtype(s.dt); }
};

inline Problem build(const Spec& s) {
  Problem p;
  p.s = s;
  init_rows(s, p);
  const std::int64_t R = p.R, C = p.C;
  Rng rng(s.seed * 104729 + static_cast<std::uint64_t>(C * 17 + R));
  std::vector<double> x(static_cast<std::size_t>(R * C));
  for (auto& v : x) v = -std::fabs(3.0 * rng.normal());  // log-probability-like (any value is allowed)
  std::vector<std::int64_t> t = draw_targets(s, rng, R, C);
  if (s.edit) s.edit(rng, R, C, x, t);
  p.input = Tensor::make(s.dt, s.shape, s.layout, kSentinel);
  scatter_rows(p.input, x);
  p.in.x = gather_rows(p.input);
  store_targets(s, t, p, p.in);
  draw_weight_and_up(s, rng, p, p.in);
  p.ref = lfref::nll(p.in);
  return p;
}

// Forward and backward against the reference. mem: the device the calls run on (nullptr: the CPU;
// tests/device_mirror.hpp).
inline void run_all(const Spec& s, const DeviceMemory* mem = nullptr) {
  SCOPED_TRACE(s.name);
  Problem p = build(s);
  const auto input_before = p.input.storage;
  auto options = [&](Mirror& m) {
    NllOptions o = p.options();
    o.weight = m(p.weight);
    return o;
  };
  Tensor loss = Tensor::make(p.acc(), s.red == Reduction::none ? p.rshape : std::vector<std::int64_t>{},
                             Layout::contiguous, kSentinel);
  {
    Mirror m(mem);
    lossfuse::nll_forward(m(p.input), m(p.target), options(m), m(loss));
    m.download();
  }
  if (s.red == Reduction::none) {
    EXPECT_TRUE(close_all("loss", loss.values(), p.ref.row_loss, p.ref.row_loss_tol, p.acc()));
  } else {
    EXPECT_TRUE(close_one("loss", loss.get(0), p.ref.loss, p.ref.loss_tol, p.acc()));
  }
  Tensor grad = Tensor::make(s.dt, s.shape, s.grad_layout, kSentinel);
  {
    Mirror m(mem);
    lossfuse::nll_backward(m(p.input), m(p.target), m(p.grad_loss), options(m), m(grad));
    m.download();
  }
  EXPECT_TRUE(close_all("grad", gather_rows(grad), p.ref.grad, p.ref.grad_tol, s.dt));
  EXPECT_TRUE(grad.outside_untouched(kSentinel)) << "nll_backward wrote outside grad_input";
  EXPECT_TRUE(p.input.storage == input_before) << "the input was modified";
}

inline std::vector<Spec> option_specs() {
  std::vector<Spec> v;
  std::uint64_t k = 0;
  const std::vector<std::vector<std::int64_t>> shapes = {{7}, {9, 13}, {3, 6, 4}, {2, 5, 3, 2}, {3, 50257}};
  for (DType dt : kFloats)
    for (Reduction red : kReds)
      for (const auto& shape : shapes)
        for (int w = 0; w < 2; ++w)
          for (int ign = 0; ign < 3; ++ign) {
            Spec s;
            s.dt = dt, s.red = red, s.shape = shape, s.weight = w;
            if (ign == 1) s.ignore_frac = 0.3;
            if (ign == 2) s.ignore_index = 1, s.ignore_frac = 0.3;
            s.up = default_up(red, k);
            s.seed = ++k;
            s.name = nm(dt) + "_" + red_name(red) + "_" + shape_name(shape) + (w ? "_w" : "") +
                     (ign == 1   ? "_ign"
                      : ign == 2 ? "_ignclass1"
                                 : "");
            v.push_back(s);
          }
  return v;
}

inline std::vector<Spec> layout_specs() {
  std::vector<Spec> v;
  std::uint64_t k = 0;
  for (DType dt : kFloats)
    for (Layout l : {Layout::transposed, Layout::padded, Layout::class_last})
      for (Reduction red : kReds) {
        Spec s;
        s.dt = dt, s.layout = l, s.red = red, s.shape = {3, 7, 2, 5}, s.weight = true, s.ignore_frac = 0.2;
        s.grad_layout = (k % 2) ? l : Layout::contiguous;
        s.up = default_up(red, k);
        s.seed = 500 + ++k;
        s.name = nm(dt) + "_" + layout_name(l) + "_" + red_name(red) +
                 (s.grad_layout != Layout::contiguous ? "_stridedgrad" : "");
        v.push_back(s);
      }
  return v;
}

inline std::vector<Spec> target_specs() {
  std::vector<Spec> v;
  std::uint64_t k = 0;
  for (DType tdt : {DType::u8, DType::i8, DType::i16, DType::i32, DType::i64})
    for (DType dt : {DType::f32, DType::bf16})
      for (Reduction red : kReds) {
        Spec s;
        s.dt = dt, s.tdt = tdt, s.red = red;
        s.shape = {4, (tdt == DType::u8 || tdt == DType::i8) ? std::int64_t{120} : std::int64_t{3000}, 3};
        if (tdt == DType::u8) s.ignore_index = 7;
        s.ignore_frac = 0.25;
        s.weight = (k % 2) == 0;
        s.up = default_up(red, k);
        s.seed = 700 + ++k;
        s.name = nm(tdt) + "_" + nm(dt) + "_" + red_name(red);
        v.push_back(s);
      }
  {
    Spec s;
    s.tdt = DType::u8, s.shape = {5, 256}, s.red = Reduction::none;
    s.edit = [](Rng&, std::int64_t R, std::int64_t, std::vector<double>&, std::vector<std::int64_t>& t) {
      for (std::int64_t r = 0; r < R; ++r) t[r] = 251 + r;
    };
    s.name = "u8_targets_above_127";
    v.push_back(s);
  }
  return v;
}

inline std::vector<Spec> edge_specs() {
  std::vector<Spec> v;
  std::uint64_t k = 0;
  for (DType dt : kFloats)
    for (Reduction red : kReds) {
      {
        Spec s;
        s.dt = dt, s.red = red, s.shape = {0, 5}, s.weight = true;
        s.seed = 900 + ++k;
        s.name = "empty_" + nm(dt) + "_" + red_name(red);
        v.push_back(s);
      }
      {
        Spec s;
        s.dt = dt, s.red = red, s.shape = {6, 5}, s.weight = true, s.ignore_frac = 1.0;
        s.up = default_up(red, k);
        s.seed = 900 + ++k;
        s.name = "all_ignored_" + nm(dt) + "_" + red_name(red);
        v.push_back(s);
      }
      {  // NaN / -inf / +inf inputs: only the target entry matters, the gradient never reads the input
        Spec s;
        s.dt = dt, s.red = red, s.shape = {6, 5};
        s.up = default_up(red, k);
        s.seed = 900 + ++k;
        s.edit = [](Rng&, std::int64_t, std::int64_t C, std::vector<double>& x, std::vector<std::int64_t>& t) {
          t[0] = 2, x[0 * C + 2] = -kInf;    // loss +inf
          t[1] = 2, x[1 * C + 3] = kNaN;     // NaN off the target: no effect
          t[2] = 1, x[2 * C + 1] = kNaN;     // NaN at the target: loss NaN
          t[3] = 0, x[3 * C + 4] = kInf;     // +inf off the target: no effect
          t[4] = -100, x[4 * C + 0] = kNaN;  // ignored: 0
        };
        s.name = "nonfinite_" + nm(dt) + "_" + red_name(red);
        v.push_back(s);
      }
      {
        Spec s;
        s.dt = dt, s.red = red, s.shape = {6, 5}, s.weight = true, s.seed = 900 + ++k;
        s.edit = [dt](Rng& rng, std::int64_t R, std::int64_t C, std::vector<double>& x, std::vector<std::int64_t>&) {
          const double mag = dt == DType::f16 ? 6e4 : dt == DType::f64 ? 1e300 : 1e30;
          for (std::int64_t i = 0; i < R * C; ++i) x[i] = mag * rng.uniform(-1.0, 1.0);
        };
        s.name = "huge_" + nm(dt) + "_" + red_name(red);
        v.push_back(s);
      }
    }
  return v;
}

}  // namespace lftest::nll
