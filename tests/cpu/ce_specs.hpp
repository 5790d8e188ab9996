// lossfuse tests: the cross-entropy spec tables (vocabulary sizes, options, soft targets, shapes, target dtypes,
// adversarial values, edge cases), run against the reference by every backend's test (tests/cpu/cross_entropy_test.cpp,
// tests/cuda/cross_entropy_cuda_test.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "cpu/ce_harness.hpp"

namespace lftest::ce {

// ---- vocabulary sizes, including ones that are not multiples of any vector width ----------------------------
inline std::vector<Spec> vocab_specs() {
  std::vector<Spec> v;
  const std::int64_t vocab[] = {1, 7, 31, 1271, 32000, 50257, 128256};
  std::uint64_t k = 0;
  for (DType dt : kFloats)
    for (std::int64_t V : vocab)
      for (Reduction red : kReds)
        for (int full = 0; full < 2; ++full) {
          Spec s;
          s.dt = dt;
          s.red = red;
          const std::int64_t N = V <= 1271 ? 9 : V <= 32000 ? 3 : 2;
          s.shape = {N, V};
          s.up = default_up(red, k);
          s.seed = ++k;
          if (full) {  // every option at once
            s.weight = true;
            s.ignore_frac = 0.3;
            s.eps = 0.1;
            s.zs = 1e-3;
            s.cap = 15.0;
            s.scale = 0.8;
          }
          s.name = nm(dt) + "_V" + std::to_string(V) + "_" + red_name(red) + (full ? "_alloptions" : "_plain");
          v.push_back(s);
        }
  // bfloat16 rows without label smoothing go two vectors at a time (even and odd classes): every option but
  // smoothing, a vocabulary that is no multiple of 32 and spans several chunks
  for (std::int64_t V : {33, 1271, 50257})
    for (Reduction red : kReds) {
      Spec s;
      s.dt = DType::bf16, s.red = red, s.shape = {V <= 1271 ? 5 : 2, V};
      s.weight = true, s.ignore_frac = 0.3, s.zs = 1e-3, s.cap = 15.0, s.scale = 0.8;
      s.up = default_up(red, k);
      s.seed = 900 + ++k;
      s.name = "bf16_V" + std::to_string(V) + "_" + red_name(red) + "_nosmoothing";
      v.push_back(s);
    }
  return v;
}

// ---- options and their combinations (index targets) ---------------------------------------------------------
inline std::vector<Spec> option_specs() {
  std::vector<Spec> v;
  std::uint64_t k = 0;
  for (DType dt : kFloats)
    for (Reduction red : kReds)
      for (int w = 0; w < 2; ++w)
        for (int ign = 0; ign < 3; ++ign)  // none, default -100 on 30% of rows, a real class (2) as ignore_index
          for (double eps : {0.0, 0.1})
            for (double cap : {0.0, 5.0})
              for (double zs : {0.0, 0.01})
                for (double scale : {1.0, 0.5}) {
                  Spec s;
                  s.dt = dt;
                  s.red = red;
                  s.weight = w;
                  if (ign == 1) s.ignore_frac = 0.3;
                  if (ign == 2) s.ignore_index = 2, s.ignore_frac = 0.3;
                  s.eps = eps, s.cap = cap, s.zs = zs, s.scale = scale;
                  s.shape = {7, 13};
                  s.stdev = 3.0;
                  s.up = default_up(red, k);
                  s.seed = 1000 + ++k;
                  s.name = nm(dt) + "_" + red_name(red) + (w ? "_w" : "") +
                           (ign == 1   ? "_ign"
                            : ign == 2 ? "_ignclass2"
                                       : "") +
                           "_eps" + num_name(eps) + "_cap" + num_name(cap) + "_z" + num_name(zs) + "_s" +
                           num_name(scale);
                  v.push_back(s);
                }
  // label_smoothing at its ends, with weights and ignored rows
  for (DType dt : kFloats)
    for (Reduction red : kReds)
      for (double eps : {1.0, 0.999}) {
        Spec s;
        s.dt = dt, s.red = red, s.weight = true, s.ignore_frac = 0.25, s.eps = eps, s.shape = {8, 10};
        s.up = default_up(red, k);
        s.seed = 5000 + ++k;
        s.name = nm(dt) + "_" + red_name(red) + "_w_ign_eps" + num_name(eps);
        v.push_back(s);
      }
  // weights of another float dtype than the logits; upstream gradient of other signs and sizes
  for (DType dt : kFloats)
    for (DType wdt : kFloats) {
      if (wdt == dt) continue;
      Spec s;
      s.dt = dt, s.wdt = wdt, s.weight = true, s.eps = 0.2, s.ignore_frac = 0.2, s.red = Reduction::mean;
      s.up = Up::scalar, s.up_scalar = -2.5;
      s.seed = 6000 + ++k;
      s.name = nm(dt) + "_weight_" + nm(wdt);
      v.push_back(s);
    }
  // lse or z_loss outputs omitted
  for (Reduction red : kReds)
    for (int which = 0; which < 3; ++which) {
      Spec s;
      s.red = red, s.zs = 0.05, s.eps = 0.1, s.ignore_frac = 0.2;
      s.with_lse = which != 0;
      s.with_z = which != 1;
      if (which == 2) s.with_lse = s.with_z = false;
      s.up = default_up(red, k);
      s.seed = 7000 + ++k;
      s.name = std::string("outputs_") + red_name(red) + (which == 0 ? "_nolse" : which == 1 ? "_noz" : "_lossonly");
      v.push_back(s);
    }
  // large z_loss_scale and logit scales, a negative logit scale, logit_scale 0
  for (double scale : {-1.5, 0.0, 30.0})
    for (Reduction red : kReds) {
      Spec s;
      s.red = red, s.scale = scale, s.zs = 0.5, s.weight = true, s.eps = 0.05;
      s.up = default_up(red, k);
      s.seed = 8000 + ++k;
      s.name = "scale" + num_name(scale) + "_z0p5_" + red_name(red);
      v.push_back(s);
    }
  return v;
}

// ---- soft (probability) targets ------------------------------------------------------------------------------
inline std::vector<Spec> soft_specs() {
  std::vector<Spec> v;
  std::uint64_t k = 0;
  const std::vector<std::vector<std::int64_t>> shapes = {{7}, {6, 11}, {3, 5, 2, 3}, {2, 1271}};
  for (DType dt : kFloats)
    for (Reduction red : kReds)
      for (const auto& shape : shapes)
        for (int w = 0; w < 2; ++w)
          for (double eps : {0.0, 0.2}) {
            Spec s;
            s.dt = dt, s.red = red, s.shape = shape, s.soft = true, s.weight = w, s.eps = eps;
            s.zs = (k % 3 == 0) ? 0.02 : 0.0;
            s.cap = (k % 4 == 1) ? 4.0 : 0.0;
            s.scale = (k % 5 == 2) ? 1.7 : 1.0;
            s.up = default_up(red, k);
            s.seed = 9000 + ++k;
            s.name = nm(dt) + "_" + red_name(red) + "_" + shape_name(shape) + (w ? "_w" : "") + "_eps" + num_name(eps) +
                     (s.zs > 0 ? "_z" : "") + (s.cap > 0 ? "_cap" : "") + (s.scale != 1 ? "_scaled" : "");
            v.push_back(s);
          }
  for (Reduction red : kReds) {  // probabilities that do not sum to 1 are used as given (as torch does)
    Spec s;
    s.red = red, s.soft = true, s.soft_unnormalized = true, s.weight = true, s.eps = 0.1;
    s.up = default_up(red, k);
    s.seed = 9500 + ++k;
    s.name = "unnormalized_" + red_name(red);
    v.push_back(s);
  }
  for (Layout l : {Layout::transposed, Layout::padded}) {  // soft targets with non-contiguous logits
    Spec s;
    s.soft = true, s.layout = l, s.shape = {5, 9}, s.red = Reduction::mean, s.eps = 0.1, s.seed = 9600 + ++k;
    s.name = "logits_" + layout_name(l);
    v.push_back(s);
  }
  return v;
}

// ---- shapes and layouts -------------------------------------------------------------------------------------
inline std::vector<Spec> shape_specs() {
  std::vector<Spec> v;
  std::uint64_t k = 0;
  const std::vector<std::vector<std::int64_t>> shapes = {{7},       {1, 7},       {5, 33},
                                                         {3, 7, 5}, {2, 5, 3, 4}, {2, 3, 1, 2, 2}};
  const Layout layouts[] = {Layout::contiguous, Layout::transposed, Layout::padded, Layout::class_last};
  for (DType dt : kFloats)
    for (Reduction red : kReds)
      for (const auto& shape : shapes)
        for (Layout l : layouts) {
          if (l == Layout::class_last && shape.size() < 3) continue;
          Spec s;
          s.dt = dt, s.red = red, s.shape = shape, s.layout = l;
          s.grad_layout = (k % 2) ? l : Layout::contiguous;
          s.weight = true, s.ignore_frac = 0.2, s.eps = 0.1;
          s.up = default_up(red, k);
          s.seed = 11000 + ++k;
          s.name = nm(dt) + "_" + red_name(red) + "_" + shape_name(shape) + "_" + layout_name(l) +
                   (s.grad_layout != Layout::contiguous ? "_stridedgrad" : "");
          v.push_back(s);
        }
  // a large vocabulary read through a transposed (class stride != 1) view
  for (DType dt : {DType::f32, DType::bf16}) {
    Spec s;
    s.dt = dt, s.shape = {3, 50257}, s.layout = Layout::transposed, s.red = Reduction::sum, s.eps = 0.05;
    s.seed = 11900 + ++k;
    s.name = nm(dt) + "_V50257_transposed";
    v.push_back(s);
  }
  return v;
}

// ---- every integer target dtype -----------------------------------------------------------------------------
inline std::vector<Spec> target_specs() {
  std::vector<Spec> v;
  std::uint64_t k = 0;
  for (DType tdt : {DType::u8, DType::i8, DType::i16, DType::i32, DType::i64})
    for (DType dt : {DType::f32, DType::bf16, DType::f64})
      for (Reduction red : kReds)
        for (int ign = 0; ign < 2; ++ign) {
          Spec s;
          s.dt = dt, s.tdt = tdt, s.red = red;
          const std::int64_t C = (tdt == DType::u8 || tdt == DType::i8) ? 100 : 1271;
          s.shape = {3, C, 2};
          if (ign == 0) {  // the default -100 (representable in every signed type; u8 then has no ignored rows)
            s.ignore_frac = tdt == DType::u8 ? 0.0 : 0.3;
          } else {  // a real class as ignore_index
            s.ignore_index = 3, s.ignore_frac = 0.3;
          }
          s.weight = (k % 2) == 0;
          s.eps = (k % 3) == 0 ? 0.1 : 0.0;
          s.up = default_up(red, k);
          s.seed = 12000 + ++k;
          s.name = nm(tdt) + "_" + nm(dt) + "_" + red_name(red) + (ign ? "_ignclass3" : "_ign100");
          v.push_back(s);
        }
  // u8 targets above 127 (read as unsigned, not sign-extended)
  {
    Spec s;
    s.tdt = DType::u8, s.shape = {6, 250}, s.red = Reduction::none, s.seed = 12900;
    s.edit = [](Rng&, std::int64_t R, std::int64_t, std::vector<double>&, std::vector<std::int64_t>& t) {
      for (std::int64_t r = 0; r < R; ++r) t[r] = 200 + r * 7;
    };
    s.name = "u8_targets_above_127";
    v.push_back(s);
  }
  return v;
}

// ---- adversarial values -------------------------------------------------------------------------------------
using Edit = decltype(Spec::edit);

inline Edit neg_inf_edit() {
  return [](Rng& rng, std::int64_t R, std::int64_t C, std::vector<double>& x, std::vector<std::int64_t>& t) {
    for (std::int64_t r = 0; r < R; ++r)
      for (std::int64_t c = 0; c < C; ++c)
        if (rng.uniform() < 0.3 && c != t[r]) x[r * C + c] = -kInf;
    if (R > 0 && C > 1) {  // row 0: the target on a -inf entry (loss +inf, finite gradient)
      t[0] = 1;
      x[0 * C + 1] = -kInf;
    }
    if (R > 1) {  // row 1: one finite entry, the target (loss 0)
      for (std::int64_t c = 0; c < C; ++c) x[1 * C + c] = c == 0 ? 2.5 : -kInf;
      t[1] = 0;
    }
    if (R > 2 && C > 1) {  // row 2: one finite entry, the target elsewhere (loss +inf)
      for (std::int64_t c = 0; c < C; ++c) x[2 * C + c] = c == 0 ? -1.0 : -kInf;
      t[2] = C - 1;
    }
  };
}
inline Edit ties_edit() {
  return [](Rng&, std::int64_t R, std::int64_t C, std::vector<double>& x, std::vector<std::int64_t>&) {
    const double vals[] = {3.0, 0.0, -50.0, 1000.0};
    for (std::int64_t r = 0; r < R && r < 4; ++r)
      for (std::int64_t c = 0; c < C; ++c) x[r * C + c] = vals[r];
    if (R > 4 && C > 2) {  // two equal maxima
      x[4 * C + 0] = 9.0;
      x[4 * C + C - 1] = 9.0;
    }
  };
}
// NaN, +inf and all -inf rows; the same, ignored (loss 0, gradient NaN: torch's log_softmax backward).
inline Edit nonfinite_edit(std::int64_t ignore_index) {
  return [ignore_index](Rng&, std::int64_t R, std::int64_t C, std::vector<double>& x, std::vector<std::int64_t>& t) {
    if (R < 7) return;
    x[0 * C + C / 2] = kNaN;
    x[1 * C + 0] = kInf;
    for (std::int64_t c = 0; c < C; ++c) x[2 * C + c] = -kInf;
    x[3 * C + C - 1] = kNaN;
    t[3] = ignore_index;
    x[4 * C + C / 3] = kInf;
    t[4] = ignore_index;
    for (std::int64_t c = 0; c < C; ++c) x[5 * C + c] = -kInf;
    t[5] = ignore_index;
    if (t[6] == ignore_index) t[6] = 0;  // row 6 stays an ordinary row
  };
}

inline std::vector<Spec> adversarial_specs() {
  std::vector<Spec> v;
  std::uint64_t k = 0;
  for (DType dt : kFloats)
    for (Reduction red : kReds)
      for (int opt = 0; opt < 2; ++opt) {
        auto base = [&](const std::string& what) {
          Spec s;
          s.dt = dt, s.red = red;
          if (opt) s.weight = true, s.eps = 0.1, s.ignore_frac = 0.15;
          s.up = default_up(red, k);
          s.seed = 13000 + ++k;
          s.name = what + "_" + nm(dt) + "_" + red_name(red) + (opt ? "_w_eps" : "");
          return s;
        };
        {
          Spec s = base("magnitude1e4");
          s.stdev = 1e4;
          s.shape = {6, 1271};
          v.push_back(s);
        }
        if (dt != DType::f16) {
          Spec s = base("magnitude1e30");
          s.stdev = 1e30;
          s.shape = {6, 300};
          v.push_back(s);
        }
        {
          Spec s = base("neginf");
          s.shape = {8, 37};
          s.edit = neg_inf_edit();
          if (opt && red != Reduction::none) s.ignore_frac = 0;  // keep row 0..2 non-ignored
          v.push_back(s);
        }
        {
          Spec s = base("ties");
          s.shape = {6, 40};
          s.edit = ties_edit();
          v.push_back(s);
        }
        {
          Spec s = base("nonfinite_rows");
          s.shape = {9, 23};
          s.edit = nonfinite_edit(s.ignore_index);
          v.push_back(s);
        }
        {
          Spec s = base("nonfinite_rows_ignclass");
          s.shape = {9, 23};
          s.ignore_index = 4;
          s.edit = nonfinite_edit(4);
          v.push_back(s);
        }
        {
          Spec s = base("neginf_V32000");  // a long run of -inf across vector blocks
          s.shape = {2, 32000};
          s.edit = [](Rng&, std::int64_t R, std::int64_t C, std::vector<double>& x, std::vector<std::int64_t>& t) {
            for (std::int64_t r = 0; r < R; ++r) {
              for (std::int64_t c = 100; c < C - 5; ++c) x[r * C + c] = -kInf;
              t[r] = r == 0 ? 7 : C - 1;
            }
          };
          v.push_back(s);
        }
      }
  // a NaN or +inf at every position of a row (vector bodies, tails, chunk boundaries)
  for (DType dt : kFloats)
    for (std::int64_t C : {5, 23, 64, 67, 1271, 5003})
      for (double bad : {kNaN, kInf}) {
        Spec s;
        s.dt = dt, s.red = Reduction::none, s.up = Up::per_row;
        const std::int64_t R = C <= 67 ? C : 41;
        s.shape = {R, C};
        s.seed = 13500 + ++k;
        s.edit = [bad](Rng&, std::int64_t R, std::int64_t C, std::vector<double>& x, std::vector<std::int64_t>&) {
          for (std::int64_t r = 0; r < R; ++r) {
            const std::int64_t pos = R == C ? r : (r == R - 1 ? C - 1 : r * (C / (R - 1)) + r % 7);
            x[r * C + pos] = bad;
          }
        };
        s.name =
            std::string(std::isnan(bad) ? "nan" : "posinf") + "_every_position_" + nm(dt) + "_C" + std::to_string(C);
        v.push_back(s);
      }
  // softcap with huge inputs saturates; z_loss with large lse
  for (DType dt : kFloats) {
    Spec s;
    s.dt = dt, s.stdev = dt == DType::f16 ? 1e4 : 1e6, s.cap = 30.0, s.zs = 1e-3, s.shape = {5, 300};
    s.seed = 14000 + ++k;
    s.name = "softcap_saturated_" + nm(dt);
    v.push_back(s);
  }
  // softcap maps +-inf inputs to +-cap (finite z, zero dz/dx): such rows are ordinary rows
  for (DType dt : kFloats) {
    Spec s;
    s.dt = dt, s.cap = 10.0, s.shape = {4, 50}, s.red = Reduction::sum, s.seed = 14100 + ++k;
    s.edit = [](Rng&, std::int64_t R, std::int64_t C, std::vector<double>& x, std::vector<std::int64_t>& t) {
      for (std::int64_t r = 0; r < R; ++r) {
        x[r * C + 3] = kInf;
        x[r * C + 5] = -kInf;
      }
      t[0] = 3, t[1] = 5;
    };
    s.name = "softcap_infinite_inputs_" + nm(dt);
    v.push_back(s);
  }
  return v;
}

// ---- empty and all-ignored batches --------------------------------------------------------------------------
inline std::vector<Spec> edge_specs() {
  std::vector<Spec> v;
  std::uint64_t k = 0;
  for (DType dt : kFloats)
    for (Reduction red : kReds) {
      for (const auto& shape : std::vector<std::vector<std::int64_t>>{{0, 5}, {0, 5, 3}, {2, 5, 0}}) {
        for (int soft = 0; soft < 2; ++soft) {
          Spec s;
          s.dt = dt, s.red = red, s.shape = shape, s.soft = soft, s.weight = true, s.eps = 0.1, s.zs = 0.01;
          s.seed = 15000 + ++k;
          s.name = "empty_" + shape_name(shape) + (soft ? "_soft_" : "_") + nm(dt) + "_" + red_name(red);
          v.push_back(s);
        }
      }
      for (double eps : {0.0, 0.3}) {
        Spec s;
        s.dt = dt, s.red = red, s.shape = {5, 9}, s.weight = true, s.eps = eps, s.zs = 0.01;
        s.ignore_frac = 1.0;
        s.up = default_up(red, k);
        s.seed = 15000 + ++k;
        s.name = "all_ignored_" + nm(dt) + "_" + red_name(red) + "_eps" + num_name(eps);
        v.push_back(s);
        // rows remain, but every kept target's class weighs 0 (a quarter of the rows ignored): 'mean' is NaN with
        // NaN gradients in the kept rows, with label smoothing too (torch's separate division; not inf)
        s.ignore_frac = 0.25, s.zero_weights = 3;
        s.seed = 15000 + ++k;
        s.name = "zero_target_weights_" + nm(dt) + "_" + red_name(red) + "_eps" + num_name(eps);
        v.push_back(s);
      }
    }
  // a tiny upstream gradient: gradients below float's least normal (1.2e-38), mixed with normal ones in the same
  // vectors, in every dtype (bfloat16 stores must keep the subnormals: see StoreAccPairHw)
  for (DType dt : kFloats)
    for (std::int64_t C : {100, 8200}) {
      Spec s;
      s.dt = dt, s.red = Reduction::sum, s.shape = {3, C};
      s.up = Up::scalar, s.up_scalar = 3e-37 * static_cast<double>(C) / 100;
      s.seed = 16000 + ++k;
      s.name = "subnormal_grads_" + nm(dt) + "_C" + std::to_string(C);
      v.push_back(s);
    }
  return v;
}

}  // namespace lftest::ce
