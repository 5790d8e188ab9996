// What every libFuzzer target (fuzz/<stem>_fuzz.cpp) shares: the fuzzer's bytes as choices, values stored in and
// read back from any dtype, strided views whose every reachable element lies in their own buffer (the view's
// promise; strides may be negative, zero or padded), canary-filled outputs, and the rule every call is held to:
// throw lossfuse::Error with every guarded byte as it was, or succeed. A broken rule traps (libFuzzer saves the
// input).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "dtype_io.hpp"
#include "lossfuse/lossfuse.hpp"
#include "reference/reference.hpp"

namespace lffuzz {

using lossfuse::DType;
using lossfuse::TensorView;

inline constexpr double kInf = INFINITY, kNaN = NAN;
// The dtypes a choice picks from: floating (first: float32) and integer (targets, lengths).
inline constexpr DType kDtypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16};
inline constexpr DType kInts[] = {DType::u8, DType::i8, DType::i16, DType::i32, DType::i64};
inline constexpr std::uint8_t kCanary = 0xA5;

// The fuzzer's bytes, read front to back; past the end every choice is 0 (the first entry).
struct Bytes {
  const std::uint8_t* p;
  std::size_t n;
  std::uint8_t next() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
  bool chance(int one_in) { return next() % one_in == 0; }           // true past the end
  bool rarely(int one_in) { return next() % one_in == one_in - 1; }  // false past the end: for broken arguments
  std::int64_t below(std::int64_t k) { return k <= 0 ? 0 : static_cast<std::int64_t>(next()) % k; }
  template <class T, std::size_t K>
  T pick(const T (&table)[K]) {
    return table[next() % K];
  }
};

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "fuzz target: %s\n", what);
  std::fflush(stderr);
  __builtin_trap();
}

inline std::size_t size_of(DType t) { return lossfuse::dtype_size(t); }
inline bool is_int(DType t) {
  return t == DType::u8 || t == DType::i8 || t == DType::i16 || t == DType::i32 || t == DType::i64;
}
// The unit roundoff of the arithmetic lossfuse uses for a floating dtype (16-bit dtypes compute in float32).
inline double unit_of(DType t) { return t == DType::f64 ? 0x1p-53 : 0x1p-24; }
// Half an ulp, relative, of the dtype a value is stored in.
inline double store_unit_of(DType t) {
  return t == DType::f64 ? 0x1p-53 : t == DType::f32 ? 0x1p-24 : t == DType::bf16 ? 0x1p-8 : 0x1p-11;
}
inline DType acc_of(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

using lftest::load;
using lftest::load_int;
using lftest::store;
using lftest::store_int;

// A view of `shape` (rank <= 4) in its own buffer. Each dim's stride is chosen by the bytes when `strided`:
// row-major, reversed (negative), padded, or 0 (a broadcast operand: every index of that dim is one element).
// Elements are addressed by their row-major logical index.
struct Buf {
  std::vector<std::uint8_t> bytes;
  TensorView view;
  std::int64_t numel = 1;

  Buf() = default;
  Buf(DType t, const std::vector<std::int64_t>& shape, Bytes* b = nullptr, bool allow_zero = false) {
    const int nd = static_cast<int>(shape.size());
    std::vector<std::int64_t> st(shape.size());
    std::int64_t run = 1;
    for (int d = nd - 1; d >= 0; --d) {
      std::int64_t s = run;
      if (b != nullptr) {
        switch (b->next() % 8) {
          case 5: s = -run; break;
          case 6: s = run + 3; break;
          case 7: s = allow_zero ? 0 : run; break;
          default: break;
        }
      }
      st[d] = s;
      run = std::max<std::int64_t>(1, std::llabs(s)) * std::max<std::int64_t>(shape[d], 1);
      numel *= shape[d];
    }
    std::int64_t lo = 0, hi = 0;
    if (numel > 0) {
      for (int d = 0; d < nd; ++d) {
        lo += std::min<std::int64_t>(0, (shape[d] - 1) * st[d]);
        hi += std::max<std::int64_t>(0, (shape[d] - 1) * st[d]);
      }
    }
    bytes.assign(static_cast<std::size_t>(hi - lo + 1) * size_of(t), 0);
    view = TensorView::contiguous(bytes.data() + static_cast<std::size_t>(-lo) * size_of(t), t, shape.data(), nd);
    for (int d = 0; d < nd; ++d) view.strides[d] = st[d];
  }
  // A contiguous output filled with the canary byte.
  static Buf canary(DType t, const std::vector<std::int64_t>& shape) {
    Buf o(t, shape);
    std::fill(o.bytes.begin(), o.bytes.end(), kCanary);
    return o;
  }
  void* at(std::int64_t i) const {
    std::int64_t off = 0;
    for (int d = view.ndim - 1; d >= 0; --d) {
      const std::int64_t n = std::max<std::int64_t>(view.shape[d], 1);
      off += (i % n) * view.strides[d];
      i /= n;
    }
    return static_cast<std::uint8_t*>(view.data) + off * static_cast<std::int64_t>(size_of(view.dtype));
  }
  double get(std::int64_t i) const { return load(view.dtype, at(i)); }
  std::int64_t get_int(std::int64_t i) const { return load_int(view.dtype, at(i)); }
  // Stores v at every logical index in turn (a broadcast element keeps the last value written); returns what reads
  // back, per logical index, once all are written.
  template <class Gen>
  std::vector<double> fill(Gen gen) {
    for (std::int64_t i = 0; i < numel; ++i) {
      if (is_int(view.dtype)) {
        store_int(view.dtype, at(i), static_cast<std::int64_t>(gen(i)));
      } else {
        store(view.dtype, at(i), gen(i));
      }
    }
    std::vector<double> v(static_cast<std::size_t>(numel));
    for (std::int64_t i = 0; i < numel; ++i) v[i] = get(i);  // load() reads integer dtypes too
    return v;
  }
};

// LOSSFUSE_FUZZ_VERBOSE=1 build/fuzz/<stem>_fuzz crash-...: the target prints the problem a saved input describes,
// its options by trace() and each operand by show() (dtype, shape, strides, the first 64 values).
inline const bool verbose = std::getenv("LOSSFUSE_FUZZ_VERBOSE") != nullptr;
__attribute__((format(printf, 1, 2))) inline void trace(const char* fmt, ...) {
  std::va_list args;
  va_start(args, fmt);
  std::vfprintf(stderr, fmt, args);
  va_end(args);
}
inline void show(const char* name, const Buf& b) {
  const TensorView& v = b.view;
  if (b.bytes.empty()) return;  // an operand the call does not take
  trace("%s: %s, shape (", name, lossfuse::dtype_name(v.dtype).data());
  for (int d = 0; d < v.ndim; ++d) trace("%s%lld", d ? ", " : "", static_cast<long long>(v.shape[d]));
  trace("), strides (");
  for (int d = 0; d < v.ndim; ++d) trace("%s%lld", d ? ", " : "", static_cast<long long>(v.strides[d]));
  // sabotage()'s null or shifted pointer: no values
  const bool readable =
      v.data != nullptr &&
      (static_cast<const std::uint8_t*>(v.data) - b.bytes.data()) % static_cast<std::ptrdiff_t>(size_of(v.dtype)) == 0;
  trace("):%s", readable ? "" : " (data null or misaligned)");
  for (std::int64_t i = 0; readable && i < std::min<std::int64_t>(b.numel, 64); ++i) {
    if (is_int(v.dtype)) {
      trace(" %lld", static_cast<long long>(b.get_int(i)));
    } else {
      trace(" %g", b.get(i));
    }
  }
  trace("%s\n", b.numel > 64 ? " ..." : "");
}

// Now and then (one call in `one_in`) breaks view v's promise in one way a caller might: data misaligned by a byte
// (dtypes wider than one byte), data null, or the view on another device. Returns whether it did (the call is then
// invalid). Only views with elements: an empty view's pointer is never read.
inline bool sabotage(Bytes& b, TensorView& v, int one_in = 24) {
  if (!b.rarely(one_in) || v.numel() <= 0) return false;
  switch (b.below(3)) {
    case 0:
      if (size_of(v.dtype) == 1) return false;
      v.data = static_cast<std::uint8_t*>(v.data) + 1;
      return true;
    case 1: v.data = nullptr; return true;
    default: v.device = lossfuse::Device::cuda; return true;
  }
}

// How the calls ended: printed at exit (stderr) where LOSSFUSE_FUZZ_STATS is set, for scripts/fuzz.sh's report.
struct Stats {
  std::uint64_t calls = 0, errors = 0, checked = 0;
  ~Stats() {
    if (std::getenv("LOSSFUSE_FUZZ_STATS") != nullptr) {
      std::fprintf(stderr,
                   "lossfuse-fuzz: %llu calls, %llu rejected with lossfuse::Error, %llu checked against the "
                   "reference\n",
                   static_cast<unsigned long long>(calls), static_cast<unsigned long long>(errors),
                   static_cast<unsigned long long>(checked));
    }
  }
};
inline Stats stats;

// Runs `call`. On lossfuse::Error every guarded buffer must be as it was (returns false); any other exception
// traps; on success returns true.
template <class Call>
bool attempt(std::initializer_list<const Buf*> guarded, Call&& call) {
  std::vector<std::vector<std::uint8_t>> before;
  for (const Buf* g : guarded) before.push_back(g->bytes);
  ++stats.calls;
  try {
    call();
  } catch (const lossfuse::Error&) {
    std::size_t i = 0;
    for (const Buf* g : guarded) {
      if (g->bytes != before[i++]) fail("an error left a buffer written");
    }
    ++stats.errors;
    return false;
  } catch (...) {
    fail("an exception other than lossfuse::Error");
  }
  return true;
}

// got agrees with want: NaN with NaN, an infinity with itself, else within tol.
inline bool close(double got, double want, double tol) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  return std::fabs(got - want) <= tol;
}

inline void expect_close(double got, double want, double tol, const char* what) {
  if (!close(got, want, tol)) {
    std::fprintf(stderr, "%s: got %.17g, want %.17g (tolerance %.3g)\n", what, got, want, tol);
    fail(what);
  }
}

inline lfref::FloatFormat format_of(DType t) {
  return t == DType::f64 ? lfref::kF64 : t == DType::f32 ? lfref::kF32 : t == DType::bf16 ? lfref::kBF16 : lfref::kF16;
}

// An output element stored in dtype t: want within tol before the store's rounding (half an ulp, plus 1e-6 for
// values the 16-bit formats flush), or past the dtype's range where want rounds to an infinity there.
inline void expect_stored(DType t, double got, double want, double tol, const char* what) {
  const double stored = lfref::round_to(want, format_of(t));
  if (std::isinf(stored) && std::isfinite(want)) {
    if (!(std::fabs(got) >= 0.99 * lfref::max_finite(format_of(t)) && (got > 0) == (want > 0))) {
      std::fprintf(stderr, "%s: got %.17g, want %.17g (beyond the dtype's range)\n", what, got, want);
      fail(what);
    }
    return;
  }
  expect_close(got, want, tol + 2 * store_unit_of(t) * std::fabs(want) + 1e-6, what);
}

}  // namespace lffuzz
