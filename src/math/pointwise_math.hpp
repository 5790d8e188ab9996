// lossfuse math: elementwise losses, value and gradient, shared by every backend.
//
// Each loss is a struct with two static templates over an "ops" policy O that supplies the arithmetic for a
// value type V: ScalarOps below (host and device, one element) or the SIMD ops of the CPU kernels
// (src/cpu/pointwise.cpp, a vector of lanes). The formulas are written once.
//   value(o, k, x, y, z)            -> loss of one element (x: input, y: target, z: third operand or unused)
//   grad(o, k, x, y, z, g, dx, dy, dz)  with g the upstream gradient (weight and 1/denominator folded in)
// k holds the loss's constants (beta, delta, margin, eps). The valid range and error of each loss are those of
// the ops' log/exp (ScalarOps: the C library's, <= 1 ulp) plus a few roundings; formulas avoid cancellation
// where PyTorch does (see each loss).
#pragma once

#include <cmath>

#include "lossfuse/loss_kind.hpp"
#include "math/host_device.hpp"

namespace lossfuse::math {

template <class Acc>
struct PwConsts {
  Acc a = 0;  // smooth_l1: beta; huber: delta; hinge_embedding, margin_ranking: margin; poisson_nll,
              // gaussian_nll: eps; bce: 1e-12
  Acc b = 0;  // gaussian_nll: 0.5 log(2 pi) when full, else 0; poisson_nll: 2 pi
};

template <class Acc>
struct ScalarOps {
  using V = Acc;
  using M = bool;
  LF_HOST_DEVICE V set(Acc v) const { return v; }
  LF_HOST_DEVICE V add(V a, V b) const { return a + b; }
  LF_HOST_DEVICE V sub(V a, V b) const { return a - b; }
  LF_HOST_DEVICE V mul(V a, V b) const { return a * b; }
  LF_HOST_DEVICE V div(V a, V b) const { return a / b; }
  LF_HOST_DEVICE V div_pos(V a, V b) const { return a / b; }  // b positive and finite
  LF_HOST_DEVICE V neg(V a) const { return -a; }
  LF_HOST_DEVICE V abs(V a) const { return std::fabs(a); }
  LF_HOST_DEVICE V min(V a, V b) const { return a < b ? a : b; }
  LF_HOST_DEVICE V max(V a, V b) const { return a > b ? a : b; }
  LF_HOST_DEVICE V sqrt(V a) const { return std::sqrt(a); }
  LF_HOST_DEVICE V log(V a) const { return std::log(a); }
  LF_HOST_DEVICE V log1p(V a) const { return std::log1p(a); }
  LF_HOST_DEVICE V xlogx(V a) const { return a == V(0) ? V(0) : a * std::log(a); }  // torch.xlogy(a, a)
  LF_HOST_DEVICE V exp(V a) const { return std::exp(a); }
  LF_HOST_DEVICE V sigmoid(V a) const { return V(1) / (V(1) + std::exp(-a)); }
  // sigmoid(a) and sigmoid(-a) = 1 - sigmoid(a), each to full relative accuracy, from one exp: e = e^-|a|,
  // r = 1 / (1 + e) is the one of a's sign and e r the other. NaN gives NaN in both.
  LF_HOST_DEVICE void sigmoid_pair(V a, V& s, V& s_neg) const {
    const V e = std::exp(-std::fabs(a));
    const V r = V(1) / (V(1) + e);
    const V er = e * r;
    s = a < V(0) ? er : r;
    s_neg = a < V(0) ? r : er;
  }
  // Binary cross-entropy's negative log-likelihood for x in [0, 1] (checked by the caller) and any y, each log
  // clamped at -100 as torch: -(y max(log x, -100) + (1 - y) max(log1p(-x), -100)).
  LF_HOST_DEVICE V bce_nll(V x, V y) const {
    const V lx = std::log(x), l1mx = std::log1p(-x);
    return -(y * (lx > V(-100) ? lx : V(-100)) + (V(1) - y) * (l1mx > V(-100) ? l1mx : V(-100)));
  }
  // log(1 + e^a) without overflow: max(a, 0) + log1p(exp(-|a|)); NaN stays NaN, +inf gives inf, -inf 0.
  LF_HOST_DEVICE V softplus(V a) const { return (a > V(0) ? a : V(0)) + log1p_exp_neg_abs(a); }
  // log1p(exp(-|a|)), softplus less its linear part
  LF_HOST_DEVICE V log1p_exp_neg_abs(V a) const { return std::log1p(std::exp(-std::fabs(a))); }
  LF_HOST_DEVICE M lt(V a, V b) const { return a < b; }
  LF_HOST_DEVICE M le(V a, V b) const { return a <= b; }
  LF_HOST_DEVICE M eq(V a, V b) const { return a == b; }
  LF_HOST_DEVICE V select(M m, V a, V b) const { return m ? a : b; }
  // sign(a) in {-1, 0, 1}; 0 for a == 0 and for NaN (torch.sign(nan) = 0)
  LF_HOST_DEVICE V sign(V a) const { return a > V(0) ? V(1) : (a < V(0) ? V(-1) : V(0)); }
};

#include "math/pointwise_losses.inc"  // NOLINT(bugprone-suspicious-include)

}  // namespace lossfuse::math
