// lossfuse math: online log-sum-exp, shared by every backend.
//
// A partial log-sum-exp over some of a row's values is (m, s) with m = max and s = sum exp(v - m). Two
// partials combine exactly: M = max(m1, m2), s = s1 exp(m1 - M) + s2 exp(m2 - M). lse = m + log(s).
// Valid range: any finite or -inf m (the state of no values yet is m = -inf, s = 0). Error: one rounding per
// combine in s; the result lse is within a few ulp of the exact value for any number of chunks.
// Rows holding NaN or +inf, or only -inf, are flagged by the caller; see cross_entropy_math.hpp.
#pragma once

#include <cmath>

#include "math/host_device.hpp"

namespace lossfuse::math {

// -inf of Acc, usable in device code (std::numeric_limits is host-only under nvcc).
template <class Acc>
LF_HOST_DEVICE Acc neg_inf() {
  return static_cast<Acc>(-INFINITY);
}

template <class Acc>
struct LseState {
  Acc m = static_cast<Acc>(-INFINITY);
  Acc s = 0;
};

template <class Acc>
LF_HOST_DEVICE LseState<Acc> lse_combine(LseState<Acc> a, LseState<Acc> b) {
  if (b.m == neg_inf<Acc>()) return a;  // b holds nothing (or only -inf)
  if (a.m == neg_inf<Acc>()) return b;
  if (a.m >= b.m) return {a.m, a.s + b.s * std::exp(b.m - a.m)};
  return {b.m, b.s + a.s * std::exp(a.m - b.m)};
}

template <class Acc>
LF_HOST_DEVICE Acc lse_finalize(LseState<Acc> st) {
  return st.m + std::log(st.s);
}

}  // namespace lossfuse::math
