#include "core/check.hpp"

#include "core/backend.hpp"

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>

#include "math/half.hpp"

namespace lossfuse::core {

std::string shape_string(const std::int64_t* shape, int ndim) {
  std::string s = "(";
  for (int i = 0; i < ndim; ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + ")";
}

std::string number_string(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

namespace {

std::int64_t checked_mul(std::int64_t a, std::int64_t b, bool& overflow) {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) overflow = true;
  return r;
}

std::string strides_string(const TensorView& t) {
  std::string s = "(";
  for (int i = 0; i < t.ndim; ++i) s.append(i ? ", " : "").append(std::to_string(t.strides[i]));
  return s + ")";
}

// Byte range [lo, hi] spanned by a view with elements; false when empty.
bool byte_range(const TensorView& t, std::uintptr_t& lo, std::uintptr_t& hi) {
  if (t.numel() == 0) return false;
  std::int64_t last = 0;
  for (int i = 0; i < t.ndim; ++i) last += (t.shape[i] - 1) * t.strides[i];
  const auto elem = static_cast<std::uintptr_t>(dtype_size(t.dtype));
  lo = reinterpret_cast<std::uintptr_t>(t.data);
  hi = lo + static_cast<std::uintptr_t>(last) * elem + elem - 1;
  return true;
}

}  // namespace

void check_view(const TensorView& t, std::string_view name, Device device) {
  const std::string n(name);
  if (t.ndim < 0 || t.ndim > kMaxDims) {
    throw Error(ErrorCode::invalid_value, n, "a number of dims in [0, " + std::to_string(kMaxDims) + "]",
                std::to_string(t.ndim));
  }
  if (dtype_size(t.dtype) == 0) {
    throw Error(ErrorCode::dtype_mismatch, n, "a known dtype",
                "dtype code " + std::to_string(static_cast<int>(t.dtype)));
  }
  if (t.device != device) {
    throw Error(ErrorCode::not_implemented, n, "a tensor on " + std::string(device_name(device)),
                "a tensor on " + std::string(device_name(t.device)));
  }
  bool overflow = false;
  std::int64_t numel = 1;
  std::int64_t last = 0;
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] < 0) {
      throw Error(ErrorCode::invalid_value, n, "sizes >= 0", "shape " + t.shape_string());
    }
    if (t.strides[i] < 0) {
      throw Error(ErrorCode::invalid_value, n, "strides >= 0",
                  "stride " + std::to_string(t.strides[i]) + " in dim " + std::to_string(i));
    }
    numel = checked_mul(numel, t.shape[i], overflow);
  }
  if (!overflow && numel > 0) {
    for (int i = 0; i < t.ndim && !overflow; ++i) {
      const std::int64_t step = checked_mul(t.shape[i] - 1, t.strides[i], overflow);
      if (__builtin_add_overflow(last, step, &last)) overflow = true;
    }
    std::int64_t bytes = 0;
    if (!overflow && __builtin_mul_overflow(last + 1, static_cast<std::int64_t>(dtype_size(t.dtype)), &bytes)) {
      overflow = true;
    }
  }
  if (overflow) {
    throw Error(ErrorCode::invalid_value, n, "an element count and extent that fit in int64",
                "shape " + t.shape_string());
  }
  if (numel > 0) {
    if (t.data == nullptr) throw Error(ErrorCode::bad_pointer, n, "non-null data", "a null pointer");
    const auto addr = reinterpret_cast<std::uintptr_t>(t.data);
    if (addr % dtype_size(t.dtype) != 0) {
      throw Error(ErrorCode::bad_pointer, n,
                  "data aligned to " + std::to_string(dtype_size(t.dtype)) + " bytes (" +
                      std::string(dtype_name(t.dtype)) + ")",
                  "an address " + std::to_string(addr % dtype_size(t.dtype)) + " bytes past that alignment");
    }
  }
}

void check_dtype(const TensorView& t, std::string_view name, DType expected) {
  if (t.dtype != expected) {
    throw Error(ErrorCode::dtype_mismatch, std::string(name), std::string(dtype_name(expected)),
                std::string(dtype_name(t.dtype)));
  }
}

void check_floating(const TensorView& t, std::string_view name) {
  if (!is_floating(t.dtype)) {
    throw Error(ErrorCode::dtype_mismatch, std::string(name), "float32, float64, float16 or bfloat16",
                std::string(dtype_name(t.dtype)));
  }
}

void check_contiguous(const TensorView& t, std::string_view name) {
  if (!t.is_contiguous()) {
    throw Error(ErrorCode::invalid_value, std::string(name), "a contiguous tensor",
                "strides that are not row-major for shape " + t.shape_string());
  }
}

void check_shape(const TensorView& t, std::string_view name, const std::int64_t* shape, int ndim) {
  bool same = t.ndim == ndim;
  for (int i = 0; same && i < ndim; ++i) same = t.shape[i] == shape[i];
  if (!same) {
    throw Error(ErrorCode::shape_mismatch, std::string(name), "shape " + shape_string(shape, ndim),
                "shape " + t.shape_string());
  }
}

void check_reduction(Reduction r) {
  if (r != Reduction::none && r != Reduction::mean && r != Reduction::sum) {
    throw Error(ErrorCode::invalid_value, "reduction", "none, mean or sum",
                "reduction code " + std::to_string(static_cast<int>(r)));
  }
}

void check_reduced_shape(const TensorView& t, std::string_view name, Reduction r, const std::int64_t* row_shape,
                         int row_ndim) {
  if (r == Reduction::none) {
    check_shape(t, name, row_shape, row_ndim);
  } else if (t.numel() != 1) {
    throw Error(ErrorCode::shape_mismatch, std::string(name),
                "a single element for reduction '" + std::string(reduction_name(r)) + "'", "shape " + t.shape_string());
  }
}

void check_finite_option(double v, std::string_view name) {
  if (!std::isfinite(v)) throw Error(ErrorCode::invalid_value, std::string(name), "a finite value", std::to_string(v));
}

void check_no_self_overlap(const TensorView& t, std::string_view name) {
  if (t.numel() <= 1) return;
  int dims[kMaxDims];
  int n = 0;
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] > 1) dims[n++] = i;
  }
  for (int k = 1; k < n; ++k) {  // insertion sort by stride: at most kMaxDims dims
    for (int j = k; j > 0 && t.strides[dims[j]] < t.strides[dims[j - 1]]; --j) std::swap(dims[j], dims[j - 1]);
  }
  std::int64_t span = 0;  // the largest offset the smaller dims reach (check_view bounds it within int64)
  for (int k = 0; k < n; ++k) {
    const int i = dims[k];
    if (t.strides[i] <= span) {
      throw Error(ErrorCode::bad_pointer, std::string(name),
                  "a view whose elements do not share memory (each stride larger than the span of the smaller ones)",
                  "strides " + strides_string(t) + " for shape " + t.shape_string());
    }
    span += t.strides[i] * (t.shape[i] - 1);
  }
}

void check_no_overlap(const TensorView& a, std::string_view a_name, const TensorView& b, std::string_view b_name) {
  std::uintptr_t alo = 0, ahi = 0, blo = 0, bhi = 0;
  if (!byte_range(a, alo, ahi) || !byte_range(b, blo, bhi)) return;
  if (alo <= bhi && blo <= ahi) {
    throw Error(ErrorCode::bad_pointer, std::string(a_name), "memory disjoint from " + std::string(b_name),
                "overlapping buffers");
  }
}

void check_weights(const std::optional<TensorView>& weight, std::int64_t classes, Device device) {
  if (!weight) return;
  check_view(*weight, "weight", device);
  check_floating(*weight, "weight");
  const std::int64_t want[1] = {classes};
  check_shape(*weight, "weight", want, 1);
}

template <class Acc>
std::vector<Acc> load_weights(const std::optional<TensorView>& weight, std::int64_t classes, Device device) {
  check_weights(weight, classes, device);
  if (!weight) return {};
  const HostCopy host(*weight);
  const TensorView& w = host.view();
  std::vector<Acc> out(static_cast<std::size_t>((classes + 63) / 64 * 64), Acc(0));
  const auto* base = static_cast<const unsigned char*>(w.data);
  const std::int64_t stride = w.strides[0];
  for (std::int64_t c = 0; c < classes; ++c) {
    const unsigned char* p = base + c * stride * static_cast<std::int64_t>(dtype_size(w.dtype));
    Acc v = 0;
    switch (w.dtype) {
      case DType::f32: { float f; std::memcpy(&f, p, 4); v = static_cast<Acc>(f); break; }
      case DType::f64: { double f; std::memcpy(&f, p, 8); v = static_cast<Acc>(f); break; }
      case DType::f16: { std::uint16_t h; std::memcpy(&h, p, 2); v = static_cast<Acc>(math::f16_to_float(h)); break; }
      case DType::bf16: { std::uint16_t h; std::memcpy(&h, p, 2); v = static_cast<Acc>(math::bf16_to_float(h)); break; }
      default: break;
    }
    out[static_cast<std::size_t>(c)] = v;
  }
  return out;
}

template std::vector<float> load_weights<float>(const std::optional<TensorView>&, std::int64_t, Device);
template std::vector<double> load_weights<double>(const std::optional<TensorView>&, std::int64_t, Device);

}  // namespace lossfuse::core
