// lossfuse math: the per-step pieces of the CTC alpha/beta recursions in log space, host and device.
//
// Over the extended label sequence l' (length 2 S + 1, blanks interleaved), one step of the forward variables is
//   log alpha_t(s) = log_add3(a_{t-1}(s), a_{t-1}(s-1), skip(s) ? a_{t-1}(s-2) : -inf) + lp_t(l'_s)
// where skip(s) holds for s >= 2 with l'_s != l'_{s-2} (a label differing from the label two back; never a
// blank). The backward variables mirror it with s+1, s+2.
//
// log_add2 / log_add3: log(exp(a) + exp(b) [+ exp(c)]) as m + log(sum exp(x - m)), m the largest argument.
// Valid range: finite or -inf arguments (all -inf gives -inf exactly; one finite argument with the rest -inf
// gives it exactly). A +inf argument gives nan and a nan argument gives nan (as PyTorch's loop does).
// Error: with Acc's unit roundoff u and libm exp/log within 1 ulp, |result - exact| <= u * (|m| + 6): one
// rounding of m + log(s), s in [1, 3] carrying <= 4 roundings of the exps and sums.
#pragma once

#include <cmath>

#include "math/host_device.hpp"
#include "math/online_lse.hpp"

namespace lossfuse::math {

template <class Acc>
LF_HOST_DEVICE Acc log_add2(Acc a, Acc b) {
  Acc m = a;
  if (b > m) m = b;
  // All -inf: their sum is -inf; a nan among them is a nan (m == -inf cannot hide it).
  if (m == neg_inf<Acc>()) return a + b;
  return m + std::log(std::exp(a - m) + std::exp(b - m));
}

template <class Acc>
LF_HOST_DEVICE Acc log_add3(Acc a, Acc b, Acc c) {
  Acc m = a;
  if (b > m) m = b;
  if (c > m) m = c;
  if (m == neg_inf<Acc>()) return a + b + c;
  return m + std::log(std::exp(a - m) + std::exp(b - m) + std::exp(c - m));
}

// log alpha_t(s) from the previous step's row `prev` (entries s-2..s valid to read when s >= 2), the label
// row `lab` of l' (any integer type) and the emission lp = log_probs[t, l'_s].
template <class Acc, class Label>
LF_HOST_DEVICE Acc ctc_alpha_step(const Acc* prev, const Label* lab, long long s, Acc lp) {
  const Acc a1 = prev[s];
  const Acc a2 = s > 0 ? prev[s - 1] : neg_inf<Acc>();
  const Acc a3 = (s > 1 && lab[s] != lab[s - 2]) ? prev[s - 2] : neg_inf<Acc>();
  return log_add3(a1, a2, a3) + lp;
}

// log beta_t(s) from the next step's row `next` over l' of length len (= 2 tl + 1).
template <class Acc, class Label>
LF_HOST_DEVICE Acc ctc_beta_step(const Acc* next, const Label* lab, long long s, long long len, Acc lp) {
  const Acc b1 = next[s];
  const Acc b2 = s + 1 < len ? next[s + 1] : neg_inf<Acc>();
  const Acc b3 = (s + 2 < len && lab[s + 2] != lab[s]) ? next[s + 2] : neg_inf<Acc>();
  return log_add3(b1, b2, b3) + lp;
}

// PyTorch's gradient of one element: exp(lp) - exp(log_occ + nll - lp), where log_occ is the log of
// sum_{s: l'_s = c} alpha_t(s) beta_t(s) (both including the emission lp), nll = -log p.
template <class Acc>
LF_HOST_DEVICE Acc ctc_grad(Acc lp, Acc log_occ, Acc nll) {
  return std::exp(lp) - std::exp(log_occ + nll - lp);
}

}  // namespace lossfuse::math
