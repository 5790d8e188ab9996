// CPU CTC kernels: one sample per task, samples split across threads, each time step's row over the extended
// label sequence computed with Highway vectors.
//
// log_probs: (T, N, C) any strides (lp_st, lp_sn, lp_sc); targets: sample b's labels at
//   target_offset[b] + i * target_stride, any integer dtype; l' = (blank, l1, blank, ..., l_tl, blank), len 2 tl + 1.
// forward:  log alpha_0 = (lp_0(blank), lp_0(l1), -inf, ...);
//           log alpha_t(s) = lae3(alpha_{t-1}(s), alpha_{t-1}(s-1), alpha_{t-1}(s-2) + skip(s)) + lp_t(l'_s),
//           skip(s) = 0 where l'_s is a label other than l'_{s-2}, else -inf (src/math/ctc_math.hpp);
//           nll_b = -log_add2(alpha_{il-1}(2 tl), alpha_{il-1}(2 tl - 1)) (-alpha_{il-1}(0) when tl = 0;
//           0 for il = tl = 0, inf for il = 0 < tl).
// backward: log beta mirrors alpha from t = il - 1 down (s+1, s+2 and skip(s+2)); per step the log occupancy
//           lcab(c) = log sum_{s: l'_s = c} exp(alpha_t(s) + beta_t(s)) (as a max and a sum of exps per class),
//           then grad[t, b, c] = g_b (exp(lp) - exp(lcab(c) + nll_b - lp)) for t < il (PyTorch's formula: an
//           impossible sample or a -inf log-probability gives nan there, as in torch), 0 for t >= il, and 0
//           everywhere for an impossible sample under zero_infinity.
// Rows live in padded per-sample scratch (core/ctc_params.hpp), so the vector loops have no tails: lanes past
// len compute garbage that is never read, except beta's two entries past len, reset to -inf every step.
// All in Acc (float32, float64 for float64 input); 16-bit inputs widened exactly (each time step's row of C
// log-probabilities is converted once), gradients rounded to nearest even.
// +inf in log_probs is outside the contract (the result is inf or nan); nan propagates to the loss. A
// log-probability above 88 (float32) or 709 (float64) takes exp = inf in the gradient.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/ctc.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/ctc_params.hpp"
#include "core/targets.hpp"
#include "cpu/hwy_exp-inl.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "math/ctc_math.hpp"
#include "math/half.hpp"
#include "math/storage.hpp"

HWY_BEFORE_NAMESPACE();
namespace lossfuse::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using math::Bf16;
using math::F16;
using math::Io;

// lae3(a1, a2, a3) + e per lane: the vector form of math::log_add3 (the max term's exp is exactly 1). All -inf
// gives -inf; a nan argument gives nan (the max alone could drop it).
template <class D, class V = hn::Vec<D>>
HWY_INLINE V LogAdd3Emit(D d, V a1, V a2, V a3, V e) {
  using Acc = hn::TFromD<D>;
  const V ninf = hn::Set(d, -std::numeric_limits<Acc>::infinity());
  const V m = hn::Max(hn::Max(a1, a2), a3);
  const auto none = hn::Eq(m, ninf);
  const V ms = hn::IfThenZeroElse(none, m);
  const V s = hn::Add(hn::Add(FastExp(d, hn::Sub(a1, ms)), FastExp(d, hn::Sub(a2, ms))), FastExp(d, hn::Sub(a3, ms)));
  V r = hn::IfThenElse(none, ninf, hn::Add(ms, hn::Log(d, s)));
  const V any_nan = hn::Add(hn::Add(a1, a2), a3);
  r = hn::IfThenElse(hn::IsNaN(any_nan), any_nan, r);
  return hn::Add(r, e);
}

template <class T>
class Sample {
 public:
  using Acc = typename Io<T>::Acc;

  Sample(const core::CtcParams& p, std::int64_t b)
      : p_(p),
        b_(b),
        il_(p.input_lengths[b]),
        tl_(p.target_lengths[b]),
        len_(2 * tl_ + 1),
        lp_(static_cast<const T*>(p.log_probs) + b * p.lp_sn),
        lab_(p.label_scratch + b * p.L),
        alpha_(static_cast<Acc*>(p.log_alpha)) {
    const std::int64_t rl = core::ctc_row_stride(p.L), rc = core::ctc_row_stride(p.C);
    Acc* base = static_cast<Acc*>(p.scratch) + b * core::ctc_scratch_elems(p.L, p.C);
    row_a_ = base + 2, row_b_ = base + rl + 2, emit_ = base + 2 * rl + 2, skip_ = base + 3 * rl + 2;
    ab_ = base + 4 * rl + 2, mxs_ = base + 5 * rl + 2;
    Acc* cb = base + core::kCtcLRows * rl;
    lprow_ = cb, mx_ = cb + rc, sum_ = cb + 2 * rc, lcab_ = cb + 3 * rc;
    const Acc ninf = -std::numeric_limits<Acc>::infinity();
    // Every scratch row -inf (pads included). Vector lanes past len then compute -inf too (their emission is
    // -inf), so the pads stay harmless.
    std::fill(base, base + core::ctc_scratch_elems(p.L, p.C), ninf);
    for (std::int64_t s = 0; s < len_; ++s) {
      lab_[s] = (s & 1) ? core::read_target(p.targets, p.target_dtype, p.target_offset[b] + (s >> 1) * p.target_stride)
                        : p.blank;
      skip_[s] = (s > 1 && lab_[s] != lab_[s - 2]) ? Acc(0) : ninf;
    }
  }

  // log alpha over t < il into the rolling rows and the workspace (when there is one); returns nll.
  double forward() {
    const Acc ninf = -std::numeric_limits<Acc>::infinity();
    if (alpha_ != nullptr) {  // everything outside t < il, s < len is -inf
      for (std::int64_t t = 0; t < p_.T; ++t) {
        Acc* row = alpha_row(t);
        std::fill(row + (t < il_ ? len_ : 0), row + p_.L, ninf);
      }
    }
    // Input length 0: the empty alignment, which produces only the empty target (torch does the same).
    if (il_ == 0) return tl_ == 0 ? 0.0 : std::numeric_limits<double>::infinity();
    Acc* prev = row_a_;
    Acc* cur = row_b_;
    load_lp_row(0);
    prev[0] = lprow_[p_.blank];
    if (tl_ > 0) prev[1] = lprow_[lab_[1]];
    if (alpha_ != nullptr) std::memcpy(alpha_row(0), prev, static_cast<std::size_t>(len_) * sizeof(Acc));
    const hn::ScalableTag<Acc> d;
    const auto N = static_cast<std::int64_t>(hn::Lanes(d));
    for (std::int64_t t = 1; t < il_; ++t) {
      load_emit(t);
      for (std::int64_t s = 0; s < len_; s += N) {
        const auto a1 = hn::LoadU(d, prev + s), a2 = hn::LoadU(d, prev + s - 1);
        const auto a3 = hn::Add(hn::LoadU(d, prev + s - 2), hn::LoadU(d, skip_ + s));
        hn::StoreU(LogAdd3Emit(d, a1, a2, a3, hn::LoadU(d, emit_ + s)), d, cur + s);
      }
      if (alpha_ != nullptr) std::memcpy(alpha_row(t), cur, static_cast<std::size_t>(len_) * sizeof(Acc));
      std::swap(prev, cur);
    }
    const Acc ll = tl_ == 0 ? prev[0] : math::log_add2(prev[len_ - 1], prev[len_ - 2]);
    return -static_cast<double>(ll);
  }

  // nll from the final alpha row of the workspace (written by a forward with the same inputs).
  double nll_from_workspace() const {
    if (il_ == 0) return tl_ == 0 ? 0.0 : std::numeric_limits<double>::infinity();
    const Acc* a = alpha_row(il_ - 1);
    return -static_cast<double>(tl_ == 0 ? a[0] : math::log_add2(a[len_ - 1], a[len_ - 2]));
  }

  // The gradient of every (t, c) of this sample; alpha must be in the workspace.
  void backward(double nll) {
    const bool impossible = nll == std::numeric_limits<double>::infinity();
    const std::int64_t live = p_.zero_infinity && impossible ? 0 : il_;
    for (std::int64_t t = live; t < p_.T; ++t) {
      for (std::int64_t c = 0; c < p_.C; ++c) store_grad(t, c, Acc(0));
    }
    if (live == 0) return;
    const Acc ninf = -std::numeric_limits<Acc>::infinity();
    const hn::ScalableTag<Acc> d;
    const auto N = static_cast<std::int64_t>(hn::Lanes(d));
    const auto g = static_cast<Acc>(p_.grad_scale[b_]);
    const auto nll_acc = static_cast<Acc>(nll);
    // t = il - 1: beta is the emission at the two final positions of l', -inf elsewhere.
    Acc* next = row_a_;
    Acc* cur = row_b_;
    const std::int64_t last = il_ - 1;
    load_lp_row(last);
    std::fill(next, next + len_ + 2, ninf);
    next[len_ - 1] = lprow_[p_.blank];
    if (tl_ > 0) next[len_ - 2] = lprow_[lab_[len_ - 2]];
    grad_row(last, next, g, nll_acc);
    for (std::int64_t t = il_ - 2; t >= 0; --t) {
      load_emit(t);
      for (std::int64_t s = 0; s < len_; s += N) {
        const auto b1 = hn::LoadU(d, next + s), b2 = hn::LoadU(d, next + s + 1);
        const auto b3 = hn::Add(hn::LoadU(d, next + s + 2), hn::LoadU(d, skip_ + s + 2));
        hn::StoreU(LogAdd3Emit(d, b1, b2, b3, hn::LoadU(d, emit_ + s)), d, cur + s);
      }
      cur[len_] = ninf, cur[len_ + 1] = ninf;  // the next step reads s + 1, s + 2 up to len + 1
      grad_row(t, cur, g, nll_acc);            // lprow_ still holds row t (load_emit loaded it)
      std::swap(next, cur);
    }
  }

 private:
  static constexpr Acc kExpMax = sizeof(Acc) == 4 ? Acc(88) : Acc(709);

  Acc* alpha_row(std::int64_t t) const { return alpha_ + (t * p_.N + b_) * p_.L; }

  void load_lp_row(std::int64_t t) {
    const T* x = lp_ + t * p_.lp_st;
    if (p_.lp_sc == 1) {
      for (std::int64_t c = 0; c < p_.C; ++c) lprow_[c] = Io<T>::load(x + c);
    } else {
      for (std::int64_t c = 0; c < p_.C; ++c) lprow_[c] = Io<T>::load(x + c * p_.lp_sc);
    }
  }
  void load_emit(std::int64_t t) {
    load_lp_row(t);
    for (std::int64_t s = 0; s < len_; ++s) emit_[s] = lprow_[lab_[s]];
  }

  void store_grad(std::int64_t t, std::int64_t c, Acc v) const {
    Io<T>::store(static_cast<T*>(p_.grad) + t * p_.g_st + b_ * p_.g_sn + c * p_.g_sc, v);
  }

  // Step t's gradient row from beta_t (`beta`) and alpha_t (workspace); lprow_ holds log_probs[t].
  void grad_row(std::int64_t t, const Acc* beta, Acc g, Acc nll) {
    const Acc ninf = -std::numeric_limits<Acc>::infinity();
    const hn::ScalableTag<Acc> d;
    const auto N = static_cast<std::int64_t>(hn::Lanes(d));
    std::memcpy(ab_, alpha_row(t), static_cast<std::size_t>(len_) * sizeof(Acc));
    for (std::int64_t s = 0; s < len_; s += N) {
      hn::StoreU(hn::Add(hn::LoadU(d, ab_ + s), hn::LoadU(d, beta + s)), d, ab_ + s);
    }
    // log sum exp over the positions of each class: max, then the sum of exp(. - max). The blank holds every
    // even position: its max and sum stay in registers (a scatter into one slot would chain through memory);
    // the labels, at odd positions, are scattered.
    std::fill(mx_, mx_ + p_.C, ninf);
    Acc mb = ninf;
    for (std::int64_t s = 0; s < len_; s += 2) mb = ab_[s] > mb ? ab_[s] : mb;
    for (std::int64_t s = 1; s < len_; s += 2) {
      Acc& m = mx_[lab_[s]];
      if (ab_[s] > m) m = ab_[s];
    }
    mx_[p_.blank] = mb;
    for (std::int64_t s = 0; s < len_; ++s) mxs_[s] = (s & 1) ? mx_[lab_[s]] : mb;
    const auto vninf = hn::Set(d, ninf);
    for (std::int64_t s = 0; s < len_; s += N) {
      const auto m = hn::LoadU(d, mxs_ + s);
      const auto e = FastExp(d, hn::Sub(hn::LoadU(d, ab_ + s), m));
      hn::StoreU(hn::IfThenZeroElse(hn::Eq(m, vninf), e), d, mxs_ + s);  // a class with no mass adds 0
    }
    std::fill(sum_, sum_ + p_.C, Acc(0));
    Acc sb = 0;
    for (std::int64_t s = 0; s < len_; s += 2) sb += mxs_[s];
    for (std::int64_t s = 1; s < len_; s += 2) sum_[lab_[s]] += mxs_[s];
    sum_[p_.blank] = sb;
    const auto vg = hn::Set(d, g), vnll = hn::Set(d, nll);
    for (std::int64_t c = 0; c < p_.C; c += N) {
      const auto m = hn::LoadU(d, mx_ + c);
      const auto none = hn::Eq(m, vninf);
      // a class absent from l' (or with no mass) has lcab = -inf; the sum is >= 1 elsewhere
      const auto lcab = hn::IfThenElse(
          none, vninf, hn::Add(m, hn::Log(d, hn::IfThenElse(none, hn::Set(d, Acc(1)), hn::LoadU(d, sum_ + c)))));
      const auto x = hn::LoadU(d, lprow_ + c);
      // exp(lp): FastExp's range ends at 88.3 (float32); larger log-probabilities (not probabilities) give inf
      const auto ex = hn::IfThenElse(hn::Gt(x, hn::Set(d, kExpMax)), hn::Set(d, -ninf), FastExp(d, x));
      const auto gr = hn::Sub(ex, FastExp(d, hn::Sub(hn::Add(lcab, vnll), x)));
      hn::StoreU(hn::Mul(gr, vg), d, lcab_ + c);
    }
    for (std::int64_t c = 0; c < p_.C; ++c) store_grad(t, c, lcab_[c]);
  }

  const core::CtcParams& p_;
  std::int64_t b_, il_, tl_, len_;
  const T* lp_;
  std::int64_t* lab_;
  Acc* alpha_;
  Acc *row_a_, *row_b_, *emit_, *skip_, *ab_, *mxs_, *lprow_, *mx_, *sum_, *lcab_;
};

template <class T>
void SamplesT(const core::CtcParams& p, std::int64_t b0, std::int64_t b1) {
  for (std::int64_t b = b0; b < b1; ++b) {
    Sample<T> sample(p, b);
    if (p.grad == nullptr) {
      p.nll[b] = sample.forward();
      continue;
    }
    const double nll = p.alpha_ready ? sample.nll_from_workspace() : sample.forward();
    if (p.nll != nullptr) p.nll[b] = nll;
    sample.backward(nll);
  }
}

// The one switch point: the dtype becomes a template parameter.
HWY_NOINLINE void CtcSamples(const core::CtcParams& p, std::int64_t b0, std::int64_t b1) {
  math::visit_float_dtype(p.dtype, [&](auto tag) { SamplesT<decltype(tag)>(p, b0, b1); });
}

}  // namespace lossfuse::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "cpu/kernels.hpp"
#include "lossfuse/parallel.hpp"

namespace lossfuse::cpu {

HWY_EXPORT(CtcSamples);

void ctc_samples(const core::CtcParams& p) {
  parallel_for(0, p.N, 1, [&p](std::int64_t b0, std::int64_t b1) { HWY_DYNAMIC_DISPATCH(CtcSamples)(p, b0, b1); });
}

}  // namespace lossfuse::cpu
#endif  // HWY_ONCE
