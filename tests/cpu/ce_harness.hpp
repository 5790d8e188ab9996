// lossfuse tests: building cross-entropy problems and checking every entry point against the reference.
#pragma once

#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cpu/class_harness.hpp"
#include "device_mirror.hpp"
#include "test_util.hpp"

namespace lftest::ce {

using lossfuse::CrossEntropyOptions;
using lossfuse::CrossEntropyOutputs;
using lossfuse::GradWrite;

struct Spec : ClassSpec {
  bool soft = false;  // probability targets (the logits' shape and dtype) in place of class indices
  bool soft_unnormalized = false;
  double eps = 0, scale = 1, cap = 0, zs = 0;  // label smoothing, logit_scale, softcap, z_loss_scale
  double stdev = 2.0;                          // of the logits
  bool with_lse = true, with_z = true;         // the optional outputs asked for
  Spec() { shape = {6, 31}, up_scalar = 0.37; }
};

struct Problem : ClassOperands {
  Spec s;
  Tensor logits;
  lfref::CeInput in;
  lfref::CeResult ref;

  [[nodiscard]] CrossEntropyOptions options() const {
    CrossEntropyOptions o;
    o.reduction = s.red;
    o.ignore_index = s.ignore_index;
    o.label_smoothing = s.eps;
    if (weight) o.weight = weight->view;
    o.logit_scale = s.scale;
    o.softcap = s.cap;
    o.z_loss_scale = s.zs;
    return o;
  }
  [[nodiscard]] DType acc() const { return acc_dtype(s.dt); }
  [[nodiscard]] std::vector<std::int64_t> loss_shape() const {
    return s.red == Reduction::none ? rshape : std::vector<std::int64_t>{};
  }
  [[nodiscard]] Tensor new_loss() const { return Tensor::make(acc(), loss_shape(), Layout::contiguous, kSentinel); }
  [[nodiscard]] Tensor new_lse() const { return Tensor::make(acc(), rshape, Layout::contiguous, kSentinel); }
  [[nodiscard]] Tensor new_grad(Layout l) const { return Tensor::make(s.dt, logits.shape, l, kSentinel); }
};

inline Problem build(const Spec& s) {
  Problem p;
  p.s = s;
  init_rows(s, p);
  const std::int64_t R = p.R, C = p.C;
  Rng rng(s.seed * 7919 + static_cast<std::uint64_t>(C) * 31 + static_cast<std::uint64_t>(R));

  std::vector<double> x(static_cast<std::size_t>(R * C));
  for (auto& v : x) v = s.stdev * rng.normal();
  std::vector<std::int64_t> t = draw_targets(s, rng, R, C);
  if (s.edit) s.edit(rng, R, C, x, t);

  p.logits = Tensor::make(s.dt, s.shape, s.layout, kSentinel);
  scatter_rows(p.logits, x);
  p.in.x = gather_rows(p.logits);  // the stored (rounded) values

  if (s.soft) {
    p.target = Tensor::make(s.dt, s.shape, Layout::contiguous);
    std::vector<double> q(static_cast<std::size_t>(R * C));
    for (std::int64_t r = 0; r < R; ++r) {
      double sum = 0;
      for (std::int64_t c = 0; c < C; ++c) {
        const double a = rng.uniform();
        q[r * C + c] = a * a * a;
        sum += q[r * C + c];
      }
      if (!s.soft_unnormalized)
        for (std::int64_t c = 0; c < C; ++c) q[r * C + c] /= sum;
    }
    scatter_rows(p.target, q);
    p.in.soft = gather_rows(p.target);
  } else {
    store_targets(s, t, p, p.in);
  }
  draw_weight_and_up(s, rng, p, p.in);
  p.in.label_smoothing = s.eps;
  p.in.logit_scale = s.scale;
  p.in.softcap = s.cap;
  p.in.z_loss_scale = s.zs;
  p.ref = lfref::cross_entropy(p.in);
  return p;
}

// Checks loss (and lse, z_loss when given) against the reference.
inline void check_forward(const Problem& p, const Tensor& loss, const Tensor* lse, const Tensor* z,
                          const std::string& where) {
  const DType acc = p.acc();
  if (p.s.red == Reduction::none) {
    EXPECT_TRUE(close_all(where + " loss", loss.values(), p.ref.row_loss, p.ref.row_loss_tol, acc));
    if (z) EXPECT_TRUE(close_all(where + " z_loss", z->values(), p.ref.row_z, p.ref.row_z_tol, acc));
  } else {
    EXPECT_TRUE(close_one(where + " loss", loss.get(0), p.ref.loss, p.ref.loss_tol, acc));
    if (z) EXPECT_TRUE(close_one(where + " z_loss", z->get(0), p.ref.z, p.ref.z_tol, acc));
  }
  if (lse) EXPECT_TRUE(close_all(where + " lse", lse->values(), p.ref.lse, p.ref.lse_tol, acc));
}

// The gradient has the logits' dtype: the reference rounded to it, within one ulp of that dtype.
inline void check_grad(const Problem& p, const Tensor& grad, const std::string& where) {
  EXPECT_TRUE(close_all(where + " grad", gather_rows(grad), p.ref.grad, p.ref.grad_tol, p.s.dt));
}

struct Fwd {
  Tensor loss, lse, z;
  CrossEntropyOutputs out;
};
inline Fwd make_outputs(const Problem& p, bool with_lse, bool with_z) {
  Fwd f{p.new_loss(), p.new_lse(), p.new_loss(), {}};
  f.out.loss = f.loss.view;
  if (with_lse) f.out.lse = f.lse.view;
  if (with_z) f.out.z_loss = f.z.view;
  return f;
}

// The outputs `want` names, as views of `f`'s tensors through m.
inline CrossEntropyOutputs mirror_outputs(Mirror& m, Fwd& f, const CrossEntropyOutputs& want) {
  CrossEntropyOutputs out;
  out.loss = m(f.loss);
  if (want.lse) out.lse = m(f.lse);
  if (want.z_loss) out.z_loss = m(f.z);
  return out;
}

// Runs forward, backward (from the forward's lse; separate and in place) and forward_backward (separate and
// in place) and checks every output against the reference. mem: the device the calls run on (nullptr: the CPU;
// tests/device_mirror.hpp).
inline void run_all(const Spec& s, const DeviceMemory* mem = nullptr) {
  SCOPED_TRACE(s.name);
  Problem p = build(s);
  const std::vector<std::uint8_t> logits_before = p.logits.storage;
  const std::vector<std::uint8_t> target_before = p.target.storage;
  auto options = [&](Mirror& m) {
    CrossEntropyOptions o = p.options();
    o.weight = m(p.weight);
    return o;
  };
  auto forward = [&](Fwd& f) {
    Mirror m(mem);
    lossfuse::cross_entropy_forward(m(p.logits), m(p.target), options(m), mirror_outputs(m, f, f.out));
    m.download();
  };

  // forward
  Fwd f = make_outputs(p, true, s.with_z);
  if (!s.with_lse) f.out.lse.reset();
  forward(f);
  check_forward(p, f.loss, s.with_lse ? &f.lse : nullptr, s.with_z ? &f.z : nullptr, "forward");
  EXPECT_TRUE(p.logits.storage == logits_before) << "forward modified the logits";
  EXPECT_TRUE(p.target.storage == target_before) << "forward modified the target";
  if (!s.with_lse) {  // backward needs the saved lse
    Fwd g = make_outputs(p, true, false);
    forward(g);
    f.lse = g.lse;
  }

  // backward, separate
  {
    Tensor grad = p.new_grad(s.grad_layout);
    Mirror m(mem);
    lossfuse::cross_entropy_backward(m(p.logits), m(p.target), m(f.lse), m(p.grad_loss), options(m), m(grad));
    m.download();
    check_grad(p, grad, "backward");
    EXPECT_TRUE(grad.outside_untouched(kSentinel)) << "backward wrote outside grad_logits";
    EXPECT_TRUE(p.logits.storage == logits_before) << "backward modified the logits";
  }
  // backward, in place
  {
    Tensor work = p.logits;
    Mirror m(mem);
    lossfuse::cross_entropy_backward(m(work), m(p.target), m(f.lse), m(p.grad_loss), options(m), m(work),
                                     GradWrite::in_place);
    m.download();
    check_grad(p, work, "backward in_place");
    EXPECT_TRUE(work.outside_untouched(kSentinel)) << "in-place backward wrote outside the logits view";
  }
  // forward_backward, separate
  {
    Fwd g = make_outputs(p, s.with_lse, s.with_z);
    Tensor grad = p.new_grad(s.grad_layout);
    Mirror m(mem);
    lossfuse::cross_entropy_forward_backward(m(p.logits), m(p.target), options(m), mirror_outputs(m, g, g.out),
                                             m(p.grad_loss), m(grad), GradWrite::separate);
    m.download();
    check_forward(p, g.loss, s.with_lse ? &g.lse : nullptr, s.with_z ? &g.z : nullptr, "forward_backward");
    check_grad(p, grad, "forward_backward");
    EXPECT_TRUE(grad.outside_untouched(kSentinel)) << "forward_backward wrote outside grad_logits";
    EXPECT_TRUE(p.logits.storage == logits_before) << "forward_backward modified the logits";
  }
  // forward_backward, in place
  {
    Fwd g = make_outputs(p, s.with_lse, s.with_z);
    Tensor work = p.logits;
    Mirror m(mem);
    lossfuse::cross_entropy_forward_backward(m(work), m(p.target), options(m), mirror_outputs(m, g, g.out),
                                             m(p.grad_loss), m(work), GradWrite::in_place);
    m.download();
    check_forward(p, g.loss, s.with_lse ? &g.lse : nullptr, s.with_z ? &g.z : nullptr, "forward_backward in_place");
    check_grad(p, work, "forward_backward in_place");
    EXPECT_TRUE(work.outside_untouched(kSentinel)) << "in-place forward_backward wrote outside the logits view";
  }
  // forward_backward for an upstream gradient of 1 (separate and in place), then cross_entropy_scale_held to the
  // spec's upstream gradient: each row is the held value times its upstream gradient, rounded once from the
  // accumulation dtype, except where the target is ignored or the upstream gradient is 1 (kept bit for bit; the
  // sign of a zero is compared too).
  for (const GradWrite write : {GradWrite::separate, GradWrite::in_place}) {
    const bool in_place = write == GradWrite::in_place;
    Fwd g = make_outputs(p, s.with_lse, s.with_z);
    Tensor grad = in_place ? p.logits : p.new_grad(s.grad_layout);
    Mirror m(mem);
    const TensorView gv = m(grad);
    lossfuse::cross_entropy_forward_backward(in_place ? gv : m(p.logits), m(p.target), options(m),
                                             mirror_outputs(m, g, g.out), std::nullopt, gv, write);
    m.download();
    const std::vector<double> held = gather_rows(grad);
    lossfuse::cross_entropy_scale_held(gv, m(p.target), options(m), m(p.grad_loss));
    m.download();
    const std::vector<double> got = gather_rows(grad);
    std::int64_t wrong = 0, first = -1;
    for (std::int64_t r = 0; r < p.R; ++r) {
      const bool ignored = !s.soft && p.target.get_int(r) == s.ignore_index;
      const double up = !p.grad_loss ? 1.0 : p.grad_loss->get(p.grad_loss->numel() == 1 ? 0 : r);
      for (std::int64_t c = 0; c < p.C; ++c) {
        const double h = held[r * p.C + c];
        double want = h;
        if (!ignored && up != 1.0) {
          const double product = h * up;  // exact in double for a float32 pair
          want = round_to(s.dt, p.acc() == DType::f64 ? product : static_cast<double>(static_cast<float>(product)));
        }
        const double v = got[r * p.C + c];
        if (!((v == want && std::signbit(v) == std::signbit(want)) || (std::isnan(v) && std::isnan(want)))) {
          if (first < 0) first = r * p.C + c;
          ++wrong;
        }
      }
    }
    EXPECT_EQ(wrong, 0) << "scale_held" << (in_place ? " in_place" : "") << ": " << wrong
                        << " elements differ from held * upstream, the first at " << first;
    EXPECT_TRUE(grad.outside_untouched(kSentinel)) << "scale_held wrote outside grad_logits";
  }
  // Reduced specs: forward_backward for an upstream gradient of 1, then cross_entropy_backward_held to the spec's
  // upstream gradient (1 when it has none): the bits of cross_entropy_backward from the same lse, or, at 1, the held
  // gradient untouched.
  if (s.red != Reduction::none) {
    Tensor one = scalar_tensor(p.acc(), 1.0);
    Tensor& up = p.grad_loss ? *p.grad_loss : one;
    const bool is_one = up.get(0) == 1.0;
    Fwd g = make_outputs(p, s.with_lse, s.with_z);
    Tensor want = p.new_grad(s.grad_layout), grad = p.new_grad(s.grad_layout);
    Mirror m(mem);
    const TensorView gv = m(grad), logits = m(p.logits), target = m(p.target), lse = m(f.lse), u = m(up);
    lossfuse::cross_entropy_backward(logits, target, lse, u, options(m), m(want));
    lossfuse::cross_entropy_forward_backward(logits, target, options(m), mirror_outputs(m, g, g.out), std::nullopt, gv);
    m.download();
    const std::vector<std::uint8_t> held = grad.storage;
    lossfuse::cross_entropy_backward_held(logits, target, lse, u, options(m), gv);
    m.download();
    EXPECT_TRUE(grad.storage == (is_one ? held : want.storage))
        << "backward_held: expected " << (is_one ? "the held gradient" : "cross_entropy_backward's bits");
  }
}

}  // namespace lftest::ce
