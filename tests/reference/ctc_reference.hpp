// lossfuse tests: the float64 CTC reference, written from the definition (Graves et al. 2006) and PyTorch's
// documented gradient, never from the library code. For tiny problems, ctc_brute_force sums over every path
// and validates the recursion itself.
//
// One sample: lp (T, C) row-major float64 log-probabilities, il frames used, labels l (no blanks).
//   p(l | x) = sum over paths pi in [0, C)^il with B(pi) = l of prod_t exp(lp[t, pi_t]),
//   B = merge repeats, then drop blanks. nll = -log p (inf when no path).
//   occupancy occ[t, c] = sum over those paths with pi_t = c of their probability / p.
//   PyTorch's gradient: grad[t, c] = exp(lp[t, c]) - occ[t, c] for t < il, 0 for t >= il; zero_infinity
//   zeroes it for an impossible sample, else an impossible sample's t < il entries are nan (as are entries
//   with lp = -inf: torch forms occ as exp(log(sum alpha beta) - log p - lp)).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

namespace lfref {

struct CtcSampleResult {
  double nll = 0;
  std::vector<double> grad;  // (T, C): PyTorch's gradient for an upstream gradient of 1 (before zero_infinity)
  std::vector<std::vector<double>> log_alpha;  // (il, 2 n + 1)
};

// log(sum exp(v)) over a list; -inf for an empty list or all -inf.
inline double ctc_logsumexp(const std::vector<double>& v) {
  double m = -std::numeric_limits<double>::infinity();
  for (double x : v) m = std::max(m, x);
  if (m == -std::numeric_limits<double>::infinity()) return m;
  double s = 0;
  for (double x : v) s += std::exp(x - m);
  return m + std::log(s);
}

// The alpha/beta recursion over l' = (b, l1, b, ..., l_n, b), written as "which positions may precede s".
inline CtcSampleResult ctc_sample(const std::vector<double>& lp, std::int64_t T, std::int64_t C, std::int64_t il,
                                  const std::vector<std::int64_t>& labels, std::int64_t blank) {
  const double ninf = -std::numeric_limits<double>::infinity();
  const auto n = static_cast<std::int64_t>(labels.size());
  const std::int64_t len = 2 * n + 1;
  std::vector<std::int64_t> ext(static_cast<std::size_t>(len));
  for (std::int64_t s = 0; s < len; ++s) ext[s] = s % 2 == 0 ? blank : labels[(s - 1) / 2];
  // predecessors of s: s, s-1, and s-2 when l'_s is a label different from l'_{s-2}
  auto preds = [&](std::int64_t s) {
    std::vector<std::int64_t> p = {s};
    if (s >= 1) p.push_back(s - 1);
    if (s >= 2 && ext[s] != blank && ext[s] != ext[s - 2]) p.push_back(s - 2);
    return p;
  };
  auto y = [&](std::int64_t t, std::int64_t c) { return lp[t * C + c]; };
  CtcSampleResult r;
  r.grad.assign(static_cast<std::size_t>(T * C), 0.0);
  if (il == 0) {
    r.nll = n == 0 ? 0.0 : std::numeric_limits<double>::infinity();
    return r;
  }
  std::vector<std::vector<double>> alpha(il, std::vector<double>(len, ninf)), beta = alpha;
  for (std::int64_t s = 0; s < std::min<std::int64_t>(2, len); ++s) alpha[0][s] = y(0, ext[s]);
  for (std::int64_t t = 1; t < il; ++t)
    for (std::int64_t s = 0; s < len; ++s) {
      std::vector<double> terms;
      for (std::int64_t q : preds(s)) terms.push_back(alpha[t - 1][q]);
      alpha[t][s] = ctc_logsumexp(terms) + y(t, ext[s]);
    }
  for (std::int64_t s = std::max<std::int64_t>(0, len - 2); s < len; ++s) beta[il - 1][s] = y(il - 1, ext[s]);
  for (std::int64_t t = il - 2; t >= 0; --t)
    for (std::int64_t s = 0; s < len; ++s) {
      std::vector<double> terms;
      for (std::int64_t q = s; q < len; ++q) {  // successors: the q whose predecessors include s
        const auto pq = preds(q);
        if (std::find(pq.begin(), pq.end(), s) != pq.end()) terms.push_back(beta[t + 1][q]);
      }
      beta[t][s] = ctc_logsumexp(terms) + y(t, ext[s]);
    }
  r.log_alpha = alpha;
  std::vector<double> fin = {alpha[il - 1][len - 1]};
  if (len >= 2) fin.push_back(alpha[il - 1][len - 2]);
  const double logp = ctc_logsumexp(fin);
  r.nll = -logp;
  // torch's form of exp(lp) - occupancy: exp(lp) - exp(log sum_{s: l'_s = c} alpha beta - log p - lp). It is
  // nan where log p = -inf (impossible) or lp = -inf (exp(-inf + inf)), as torch's gradient is.
  for (std::int64_t t = 0; t < il; ++t)
    for (std::int64_t c = 0; c < C; ++c) {
      std::vector<double> terms;
      for (std::int64_t s = 0; s < len; ++s)
        if (ext[s] == c) terms.push_back(alpha[t][s] + beta[t][s]);
      r.grad[t * C + c] = std::exp(y(t, c)) - std::exp(ctc_logsumexp(terms) - logp - y(t, c));
    }
  return r;
}

// Every path in [0, C)^il (il <= 8, C^il <= ~1e6): p and the occupancy, then the same outputs.
inline CtcSampleResult ctc_brute_force(const std::vector<double>& lp, std::int64_t T, std::int64_t C, std::int64_t il,
                                       const std::vector<std::int64_t>& labels, std::int64_t blank) {
  CtcSampleResult r;
  r.grad.assign(static_cast<std::size_t>(T * C), 0.0);
  std::vector<double> occ(static_cast<std::size_t>(T * C), 0.0);
  double p = 0;
  std::vector<std::int64_t> path(static_cast<std::size_t>(il), 0);
  std::int64_t total = 1;
  for (std::int64_t t = 0; t < il; ++t) total *= C;
  for (std::int64_t k = 0; k < total; ++k) {
    std::int64_t v = k;
    for (std::int64_t t = 0; t < il; ++t) path[t] = v % C, v /= C;
    std::vector<std::int64_t> collapsed;
    for (std::int64_t t = 0; t < il; ++t) {
      if (path[t] == blank) continue;
      if (t > 0 && path[t] == path[t - 1]) continue;
      collapsed.push_back(path[t]);
    }
    if (collapsed != labels) continue;
    double logq = 0;
    for (std::int64_t t = 0; t < il; ++t) logq += lp[t * C + path[t]];
    const double q = std::exp(logq);
    p += q;
    for (std::int64_t t = 0; t < il; ++t) occ[t * C + path[t]] += q;
  }
  r.nll = -std::log(p);
  for (std::int64_t t = 0; t < il; ++t)
    for (std::int64_t c = 0; c < C; ++c)
      r.grad[t * C + c] =
          std::exp(lp[t * C + c]) - (p > 0 ? occ[t * C + c] / p : std::numeric_limits<double>::quiet_NaN());
  return r;
}

}  // namespace lfref
