// Host long double evaluations of tests/cuda/device_math_evals.hpp: the references of device_math_test's double
// checks. Compiled by the host compiler alone, since nvcc does not allow long double in __host__ __device__ code.
#include <cstdint>
#include <vector>

#include "device_math_evals.hpp"

namespace lossfuse::device_test {

template <class Loss>
std::array<std::vector<long double>, 4> reference_pointwise(const std::vector<long double>& x,
                                                            const std::vector<long double>& y,
                                                            const std::vector<long double>& z,
                                                            const std::vector<long double>& g, long double a,
                                                            long double b) {
  std::array<std::vector<long double>, 4> out;
  for (auto& v : out) v.assign(x.size(), 0.0L);
  run_host(PointwiseEval<Loss, long double>{x.data(), y.data(), z.data(), g.data(), a, b, out[0].data(), out[1].data(),
                                            out[2].data(), out[3].data()},
           static_cast<std::int64_t>(x.size()));
  return out;
}

#define LF_REFERENCE_POINTWISE(...)                                                                      \
  template std::array<std::vector<long double>, 4> reference_pointwise<__VA_ARGS__>(                     \
      const std::vector<long double>&, const std::vector<long double>&, const std::vector<long double>&, \
      const std::vector<long double>&, long double, long double);
LF_DEVICE_TEST_LOSSES(LF_REFERENCE_POINTWISE)

void reference_ce(const CeTileRowEval<long double>& shape, const std::vector<long double>& x,
                  const std::vector<std::int64_t>& y, std::int64_t N, std::vector<long double>& loss,
                  std::vector<long double>& lse, std::vector<long double>& grad) {
  loss.assign(N, 0), lse.assign(N, 0), grad.assign(N * shape.C, 0);
  CeTileRowEval<long double> f = shape;
  f.x = x.data(), f.y = y.data(), f.loss = loss.data(), f.lse = lse.data(), f.grad = grad.data();
  run_host(f, N);
}

void reference_ctc(const std::vector<long double>& lp, const std::vector<std::int64_t>& labels, std::int64_t N,
                   std::int64_t T, std::int64_t C, std::int64_t S, std::vector<long double>& nll,
                   std::vector<long double>& grad) {
  const std::int64_t L = 2 * S + 1;
  nll.assign(N, 0), grad.assign(N * T * C, 0);
  std::vector<std::int64_t> ext(N * L);
  std::vector<long double> alpha(N * T * L), beta(N * T * L);
  run_host(CtcEval<long double>{lp.data(), labels.data(), T, C, S, ext.data(), alpha.data(), beta.data(), nll.data(),
                                grad.data()},
           N);
}

template <class F, int In, int Out>
std::array<std::vector<long double>, Out> reference_io(const F& f, const std::array<std::vector<long double>, In>& in,
                                                       const std::array<std::size_t, Out>& out_sizes, std::int64_t n) {
  return host_io<F, long double, In, Out>(f, in, out_sizes, n);
}
template std::array<std::vector<long double>, 4> reference_io<CeRowSumsEval<long double>, 3, 4>(
    const CeRowSumsEval<long double>&, const std::array<std::vector<long double>, 3>&,
    const std::array<std::size_t, 4>&, std::int64_t);
template std::array<std::vector<long double>, 3> reference_io<CosineEval<long double>, 3, 3>(
    const CosineEval<long double>&, const std::array<std::vector<long double>, 3>&, const std::array<std::size_t, 3>&,
    std::int64_t);
template std::array<std::vector<long double>, 9> reference_io<MarginTermsEval<long double>, 3, 9>(
    const MarginTermsEval<long double>&, const std::array<std::vector<long double>, 3>&,
    const std::array<std::size_t, 9>&, std::int64_t);

void reference_triplet(const std::vector<long double>& a, const std::vector<long double>& p,
                       const std::vector<long double>& n, std::int64_t N, std::int64_t D, double pnorm, bool swap,
                       std::vector<long double>& loss, std::vector<long double>& grad) {
  loss.assign(N, 0), grad.assign(N * D, 0);
  run_host(TripletEval<long double>{a.data(), p.data(), n.data(), D, pnorm, swap, loss.data(), grad.data()}, N);
}

}  // namespace lossfuse::device_test
