// lossfuse tests: deterministic data, owning strided tensors of any dtype, comparisons against the reference.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "dtype_io.hpp"
#include "lossfuse/lossfuse.hpp"
#include "reference/reference.hpp"

namespace lftest {

using lossfuse::DType;
using lossfuse::Error;
using lossfuse::ErrorCode;
using lossfuse::Reduction;
using lossfuse::TensorView;

// ------------------------------------------------------------------------------------------------------------
// Deterministic random numbers (splitmix64; the same on every platform and run).
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ull + 0x1234567ull) {}
  std::uint64_t next() {
    std::uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1p-53; }  // [0, 1)
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  double normal() {  // Box-Muller
    const double a = uniform(), b = uniform();
    return std::sqrt(-2.0 * std::log(1.0 - a)) * std::cos(6.283185307179586 * b);
  }
  std::int64_t index(std::int64_t n) { return static_cast<std::int64_t>(next() % static_cast<std::uint64_t>(n)); }

 private:
  std::uint64_t s_;
};

// ------------------------------------------------------------------------------------------------------------
// dtypes

inline lfref::FloatFormat format_of(DType t) {
  switch (t) {
    case DType::f64: return lfref::kF64;
    case DType::f16: return lfref::kF16;
    case DType::bf16: return lfref::kBF16;
    default: return lfref::kF32;
  }
}
inline double round_to(DType t, double v) { return t == DType::f64 ? v : lfref::round_to(v, format_of(t)); }
inline double ulp_of(DType t, double v) { return lfref::ulp(v, format_of(t)); }
// Unit roundoff of the type the library computes in for these logits (float64 for float64, else float32).
inline double compute_unit(DType logits) { return logits == DType::f64 ? 0x1p-53 : 0x1p-24; }
// Losses, lse and upstream gradients: float32, float64 for float64 inputs.
inline DType acc_dtype(DType logits) { return logits == DType::f64 ? DType::f64 : DType::f32; }
// Class weights: float32 or float64 (float64 for float64 logits).
inline DType weight_dtype(DType logits) { return acc_dtype(logits); }

inline std::string dname(DType t) { return std::string(lossfuse::dtype_name(t)); }

// ------------------------------------------------------------------------------------------------------------
// Owning strided tensors.

// How a tensor is laid out in memory. padded: every dim has gaps (like a slice x[:, :C] of a wider tensor)
// and the view starts a few elements into its storage; transposed: dim 0 is innermost (like x.t());
// class_last: the class dim is innermost (channels-last for (N, C, d1, d2)).
enum class Layout { contiguous, transposed, padded, class_last };

inline std::string layout_name(Layout l) {
  switch (l) {
    case Layout::contiguous: return "contig";
    case Layout::transposed: return "transposed";
    case Layout::padded: return "padded";
    case Layout::class_last: return "classlast";
  }
  return "?";
}

inline constexpr std::uint8_t kSentinel = 0xA5;

struct Tensor {
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  std::int64_t base = 0;              // element offset of the view's first element in storage
  std::vector<std::uint8_t> storage;  // operator new alignment (16) suits every dtype
  TensorView view;

  Tensor() = default;
  Tensor(const Tensor& o) : dtype(o.dtype), shape(o.shape), strides(o.strides), base(o.base), storage(o.storage) {
    rebind();
  }
  Tensor& operator=(const Tensor& o) {
    dtype = o.dtype, shape = o.shape, strides = o.strides, base = o.base, storage = o.storage;
    rebind();
    return *this;
  }
  Tensor(Tensor&& o) noexcept
      : dtype(o.dtype),
        shape(std::move(o.shape)),
        strides(std::move(o.strides)),
        base(o.base),
        storage(std::move(o.storage)) {
    rebind();
  }
  Tensor& operator=(Tensor&& o) noexcept {
    dtype = o.dtype, shape = std::move(o.shape), strides = std::move(o.strides), base = o.base;
    storage = std::move(o.storage);
    rebind();
    return *this;
  }

  static Tensor make(DType t, std::vector<std::int64_t> shape, Layout layout = Layout::contiguous,
                     std::uint8_t fill = 0) {
    Tensor x;
    x.dtype = t;
    x.shape = std::move(shape);
    const int nd = static_cast<int>(x.shape.size());
    std::vector<int> order(nd);  // outermost .. innermost
    for (int d = 0; d < nd; ++d) order[d] = d;
    if (layout == Layout::transposed) std::reverse(order.begin(), order.end());
    if (layout == Layout::class_last && nd >= 3) {
      order.erase(order.begin() + 1);
      order.push_back(1);
    }
    x.strides.assign(nd, 0);
    std::int64_t acc = 1;
    for (int k = nd - 1; k >= 0; --k) {
      const int d = order[k];
      x.strides[d] = acc;
      const std::int64_t pad = layout == Layout::padded ? (k == nd - 1 ? 3 : 1) : 0;
      acc *= x.shape[d] + pad;
    }
    x.base = layout == Layout::padded ? 2 : 0;
    const std::int64_t elems = x.base + std::max<std::int64_t>(acc, 1);
    x.storage.assign(static_cast<std::size_t>(elems) * lossfuse::dtype_size(t), fill);
    x.rebind();
    return x;
  }

  void rebind() {
    view = TensorView{};
    view.data =
        storage.empty() ? nullptr : storage.data() + base * static_cast<std::int64_t>(lossfuse::dtype_size(dtype));
    view.dtype = dtype;
    view.ndim = static_cast<int>(shape.size());
    for (int d = 0; d < view.ndim; ++d) view.shape[d] = shape[d], view.strides[d] = strides[d];
  }

  [[nodiscard]] std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto s : shape) n *= s;
    return n;
  }
  // Offset (elements, from view.data) of the logical row-major index i.
  [[nodiscard]] std::int64_t offset(std::int64_t i) const {
    std::int64_t off = 0;
    for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
      off += (i % shape[d]) * strides[d];
      i /= shape[d];
    }
    return off;
  }
  [[nodiscard]] double get(std::int64_t i) const { return load(dtype, view.data, offset(i)); }
  void set(std::int64_t i, double v) { store(dtype, view.data, offset(i), v); }
  [[nodiscard]] std::int64_t get_int(std::int64_t i) const { return load_int(dtype, view.data, offset(i)); }
  void set_int(std::int64_t i, std::int64_t v) { store_int(dtype, view.data, offset(i), v); }
  [[nodiscard]] std::vector<double> values() const {
    std::vector<double> v(static_cast<std::size_t>(numel()));
    for (std::int64_t i = 0; i < numel(); ++i) v[i] = get(i);
    return v;
  }
  void fill_bytes(std::uint8_t b) { std::fill(storage.begin(), storage.end(), b); }

  // True when every storage byte outside the view still equals `b`.
  [[nodiscard]] bool outside_untouched(std::uint8_t b) const {
    std::vector<bool> in(storage.size(), false);
    const auto sz = static_cast<std::int64_t>(lossfuse::dtype_size(dtype));
    for (std::int64_t i = 0; i < numel(); ++i)
      for (std::int64_t k = 0; k < sz; ++k) in[(base + offset(i)) * sz + k] = true;
    for (std::size_t k = 0; k < storage.size(); ++k)
      if (!in[k] && storage[k] != b) return false;
    return true;
  }
};

// A scalar (0-d) tensor.
inline Tensor scalar_tensor(DType t, double v) {
  Tensor x = Tensor::make(t, {});
  x.set(0, v);
  return x;
}

// ------------------------------------------------------------------------------------------------------------
// Class-dim geometry (cross_entropy / nll): class dim 1, or 0 for a 1-D input. Rows enumerate the other dims
// in row-major order, which is the row-major order of the target.

inline int class_dim(const std::vector<std::int64_t>& shape) { return shape.size() == 1 ? 0 : 1; }
inline std::vector<std::int64_t> row_shape(const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> r = shape;
  r.erase(r.begin() + class_dim(shape));
  return r;
}
inline std::int64_t prod(const std::vector<std::int64_t>& s) {
  std::int64_t n = 1;
  for (auto v : s) n *= v;
  return n;
}
// Logical row-major index into `shape` of (row r, class c).
inline std::int64_t row_class_index(const std::vector<std::int64_t>& shape, std::int64_t r, std::int64_t c) {
  const int cd = class_dim(shape);
  const int nd = static_cast<int>(shape.size());
  std::vector<std::int64_t> idx(nd, 0);
  for (int d = nd - 1; d >= 0; --d) {
    if (d == cd) continue;
    idx[d] = r % shape[d];
    r /= shape[d];
  }
  idx[cd] = c;
  std::int64_t flat = 0;
  for (int d = 0; d < nd; ++d) flat = flat * shape[d] + idx[d];
  return flat;
}
// Element offset (from view.data) of row r's class 0, and the class stride.
inline std::int64_t row_offset(const Tensor& t, std::int64_t r) {
  const int cd = class_dim(t.shape);
  std::int64_t off = 0;
  for (int d = static_cast<int>(t.shape.size()) - 1; d >= 0; --d) {
    if (d == cd) continue;
    off += (r % t.shape[d]) * t.strides[d];
    r /= t.shape[d];
  }
  return off;
}
inline std::vector<double> gather_rows(const Tensor& t) {
  const int cd = class_dim(t.shape);
  const std::int64_t C = t.shape[cd], cs = t.strides[cd];
  const std::int64_t R = C == 0 ? 0 : t.numel() / C;
  std::vector<double> v(static_cast<std::size_t>(R * C));
  for (std::int64_t r = 0; r < R; ++r) {
    const std::int64_t off = row_offset(t, r);
    for (std::int64_t c = 0; c < C; ++c) v[r * C + c] = load(t.dtype, t.view.data, off + c * cs);
  }
  return v;
}
inline void scatter_rows(Tensor& t, const std::vector<double>& v) {
  const int cd = class_dim(t.shape);
  const std::int64_t C = t.shape[cd], cs = t.strides[cd];
  const std::int64_t R = C == 0 ? 0 : t.numel() / C;
  for (std::int64_t r = 0; r < R; ++r) {
    const std::int64_t off = row_offset(t, r);
    for (std::int64_t c = 0; c < C; ++c) store(t.dtype, t.view.data, off + c * cs, v[r * C + c]);
  }
}

// ------------------------------------------------------------------------------------------------------------
// Comparisons. `actual` matches `ref` when both are NaN, both the same infinity, or
// |actual - ref| <= tol + ulps * ulp_out(ref): tol is the reference's error budget for the computation and
// ulp_out the spacing of the output dtype (rounding of the stored result).

inline ::testing::AssertionResult close_all(const std::string& what, const std::vector<double>& actual,
                                            const std::vector<double>& ref, const std::vector<double>& tol, DType out,
                                            double ulps = 1.0) {
  if (actual.size() != ref.size())
    return ::testing::AssertionFailure() << what << ": size " << actual.size() << " vs reference " << ref.size();
  std::ostringstream os;
  os.precision(17);
  int bad = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double a = actual[i], r = ref[i];
    bool ok;
    double allowed = 0;
    if (std::isnan(r))
      ok = std::isnan(a);
    else if (std::isinf(r))
      ok = a == r;
    else {
      allowed = (tol.empty() ? 0.0 : tol[i]) + ulps * ulp_of(out, r);
      ok = std::isfinite(a) && std::fabs(a - r) <= allowed;
    }
    if (!ok) {
      if (bad < 6)
        os << "\n  [" << i << "] actual " << a << " ref " << r << " |diff| " << std::fabs(a - r) << " allowed "
           << allowed;
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  if (bad > 6) {  // also say where the rest are
    os << "\n  all mismatching indices:";
    int listed = 0;
    for (std::size_t i = 0; i < ref.size() && listed < 64; ++i) {
      const double a = actual[i], r = ref[i];
      const bool ok = std::isnan(r)   ? std::isnan(a)
                      : std::isinf(r) ? a == r
                                      : std::isfinite(a) &&
                                            std::fabs(a - r) <= (tol.empty() ? 0.0 : tol[i]) + ulps * ulp_of(out, r);
      if (!ok) os << " " << i, ++listed;
    }
    if (bad > listed) os << " ...";
  }
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << ref.size() << " mismatches" << os.str();
}
inline ::testing::AssertionResult close_one(const std::string& what, double actual, double ref, double tol, DType out,
                                            double ulps = 1.0) {
  return close_all(what, {actual}, {ref}, {tol}, out, ulps);
}

// Byte-exact equality (determinism).
inline bool same_bytes(const Tensor& a, const Tensor& b) { return a.storage == b.storage; }

// Runs f, expects a lossfuse::Error whose code is one of `codes`; stores the message.
template <class F>
::testing::AssertionResult throws_error(F&& f, std::initializer_list<ErrorCode> codes, std::string* message = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (message) *message = e.what();
    for (auto c : codes)
      if (e.code() == c) {
        if (std::string(e.what()).empty()) return ::testing::AssertionFailure() << "empty error message";
        return ::testing::AssertionSuccess();
      }
    return ::testing::AssertionFailure() << "lossfuse::Error with unexpected code " << static_cast<int>(e.code())
                                         << ": " << e.what();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "a std::exception that is not lossfuse::Error: " << e.what();
  } catch (...) {
    return ::testing::AssertionFailure() << "a non-std exception";
  }
  return ::testing::AssertionFailure() << "no exception";
}

// Thread count guard: restores the default on scope exit.
struct ThreadsGuard {
  explicit ThreadsGuard(int n) { lossfuse::set_num_threads(n); }
  ~ThreadsGuard() { lossfuse::set_num_threads(0); }
  ThreadsGuard(const ThreadsGuard&) = delete;
  ThreadsGuard& operator=(const ThreadsGuard&) = delete;
};

// Names and value lists shared by the parameterized tests.
inline constexpr DType kFloats[] = {DType::f32, DType::f64, DType::f16, DType::bf16};
inline constexpr Reduction kReds[] = {Reduction::none, Reduction::mean, Reduction::sum};
inline constexpr double kInf = std::numeric_limits<double>::infinity();
inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// "f32", "bf16", "i64", ...: dtype names for test names.
inline std::string nm(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::u8: return "u8";
    case DType::i8: return "i8";
    case DType::i16: return "i16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
  }
  return "x";
}
// "4x9", or "scalar" for a 0-d shape.
inline std::string shape_name(const std::vector<std::int64_t>& s) {
  std::string r;
  for (auto v : s) r += (r.empty() ? "" : "x") + std::to_string(v);
  return r.empty() ? "scalar" : r;
}
inline std::string red_name(Reduction r) { return std::string(lossfuse::reduction_name(r)); }
// 0.25 -> "0p25", -0.25 -> "m0p25": option values for test names.
inline std::string num_name(double v) {
  std::string s = std::to_string(v);
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  for (auto& ch : s) {
    if (ch == '.') ch = 'p';
    if (ch == '-') ch = 'm';
  }
  return s;
}

}  // namespace lftest
