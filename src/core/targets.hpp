// Reading integer class targets of any dtype, and the one pass that validates them before any output is
// written.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/row_index.hpp"
#include "lossfuse/dtype.hpp"
#include "lossfuse/error.hpp"
#include "math/half.hpp"
#include "math/host_device.hpp"

namespace lossfuse::core {

// Element `offset` of an integer target of any dtype, in every backend's kernels (0 for a non-integer dtype).
LF_HOST_DEVICE std::int64_t read_target(const void* base, DType dtype, std::int64_t offset) noexcept {
  switch (dtype) {
    case DType::u8: return static_cast<const std::uint8_t*>(base)[offset];
    case DType::i8: return static_cast<const std::int8_t*>(base)[offset];
    case DType::i16: return static_cast<const std::int16_t*>(base)[offset];
    case DType::i32: return static_cast<const std::int32_t*>(base)[offset];
    case DType::i64: return static_cast<const std::int64_t*>(base)[offset];
    default: return 0;
  }
}

// Element `offset` of a view of any dtype (floating, or integer as read_target reads it) widened to double, in every
// backend's code: cosine_embedding's float or integer target, the values error messages name.
LF_HOST_DEVICE double read_as_double(const void* base, DType dtype, std::int64_t offset) noexcept {
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(base)[offset];
    case DType::f64: return static_cast<const double*>(base)[offset];
    case DType::f16: return math::f16_to_float(static_cast<const std::uint16_t*>(base)[offset]);
    case DType::bf16: return math::bf16_to_float(static_cast<const std::uint16_t*>(base)[offset]);
    default: return static_cast<double>(read_target(base, dtype, offset));
  }
}

inline std::string row_position(const RowIndex& idx, std::int64_t r) {
  std::int64_t coords[kMaxDims] = {};
  for (int i = idx.ndim - 1; i >= 0; --i) {
    coords[i] = r % idx.sizes[i];
    r /= idx.sizes[i];
  }
  std::string s = "[";
  for (int i = 0; i < idx.ndim; ++i) {
    if (i) s += ", ";
    s += std::to_string(coords[i]);
  }
  return s + "]";
}

// The index_error of a class target t out of [0, classes) at row r (row_position's coordinates).
inline Error bad_target_error(const RowIndex& idx, std::int64_t r, std::int64_t t, std::int64_t classes,
                              std::int64_t ignore_index) {
  return Error(
      ErrorCode::index_error, "target",
      "a class index in [0, " + std::to_string(classes) + ") or ignore_index (" + std::to_string(ignore_index) + ")",
      std::to_string(t) + " at position " + row_position(idx, r));
}

// Checks every target is in [0, classes) or equals ignore_index; throws index_error naming the first bad
// position (in row-major order) and its value. Returns sum over non-ignored rows of w[target] (1 when
// unweighted), summed in row order in double: the 'mean' denominator. counted (if given): the number of
// non-ignored rows; weighted (if given): how many of them have a target weight other than 0.
template <class Acc>
double scan_targets(const void* target, DType dtype, const RowIndex& idx, int view, std::int64_t rows,
                    std::int64_t classes, std::int64_t ignore_index, const Acc* weight, std::int64_t* counted = nullptr,
                    std::int64_t* weighted = nullptr) {
  double total = 0;
  std::int64_t n = 0, nonzero = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t t = read_target(target, dtype, idx.offset(view, r));
    if (t == ignore_index) continue;
    ++n;
    if (t < 0 || t >= classes) throw bad_target_error(idx, r, t, classes, ignore_index);
    const double w = weight != nullptr ? static_cast<double>(weight[t]) : 1.0;
    total += w;
    nonzero += w != 0;
  }
  if (counted != nullptr) *counted = n;
  if (weighted != nullptr) *weighted = nonzero;
  return total;
}

// The 'mean' denominator of a cross-entropy's loss and gradient, from the sum of target weights: torch divides the
// class term and its label smoothing term by it separately (lossfuse's z-loss term too), so where rows remain but
// every one of their target weights is 0 the class term is 0/0 and the loss NaN, and so is every gradient of a kept
// row: NaN then when such a term is present (the combined sum over 0 would give inf), the sum of weights otherwise.
// Nonzero weights of both signs that cancel give a/0 + s/0, which the sum over 0 matches unless a and s differ in
// sign (then torch has NaN, lossfuse an infinity; fuzz/cross_entropy_fuzz.cpp leaves that case out).
// Device backends evaluate it in their scan kernel.
LF_HOST_DEVICE double split_mean_denominator(double denominator, std::int64_t counted, std::int64_t weighted,
                                             bool other_terms) {
  return denominator == 0 && counted > 0 && weighted == 0 && other_terms ? static_cast<double>(NAN) : denominator;
}

}  // namespace lossfuse::core
