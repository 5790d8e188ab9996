// Argument checks shared by every loss and backend. Each throws lossfuse::Error naming the argument, what
// was expected and what was given; none writes anything.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lossfuse/error.hpp"
#include "lossfuse/loss_kind.hpp"
#include "lossfuse/tensor.hpp"

namespace lossfuse::core {

// ndim in [0, kMaxDims], sizes and strides >= 0, element count and largest offset within int64, data non-null
// and aligned to the element size when there are elements, device as given.
void check_view(const TensorView& t, std::string_view name, Device device = Device::cpu);

void check_dtype(const TensorView& t, std::string_view name, DType expected);
void check_floating(const TensorView& t, std::string_view name);
void check_contiguous(const TensorView& t, std::string_view name);
void check_shape(const TensorView& t, std::string_view name, const std::int64_t* shape, int ndim);
void check_reduction(Reduction r);
// A scalar (one element) for reductions mean/sum; else the row shape.
void check_reduced_shape(const TensorView& t, std::string_view name, Reduction r, const std::int64_t* row_shape,
                         int row_ndim);
void check_finite_option(double v, std::string_view name);

// Throws when the byte ranges spanned by a and b intersect.
void check_no_overlap(const TensorView& a, std::string_view a_name, const TensorView& b, std::string_view b_name);

// For a view that is written: throws unless its elements are distinct memory. Checked by the usual sufficient rule:
// with the dims of size > 1 in increasing stride order, each stride exceeds the span of the smaller ones (a stride
// of 0, or strides (1, 1), repeat elements; a writer would race on them). Views of no element pass.
void check_no_self_overlap(const TensorView& t, std::string_view name);

std::string shape_string(const std::int64_t* shape, int ndim);
// A double as printf's %g writes it (1e-50, not std::to_string's 0.000000).
std::string number_string(double v);

// Class weights: shape (C), a floating dtype, living on `device`.
void check_weights(const std::optional<TensorView>& weight, std::int64_t classes, Device device);
// Class weights copied into the accumulation type, padded with zeros to a multiple of 64 so SIMD loops
// may read whole vectors, in host memory, after check_weights.
template <class Acc>
std::vector<Acc> load_weights(const std::optional<TensorView>& weight, std::int64_t classes,
                              Device device = Device::cpu);

}  // namespace lossfuse::core
