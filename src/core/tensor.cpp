#include "lossfuse/tensor.hpp"

#include <string>

#include "lossfuse/error.hpp"

namespace lossfuse {

TensorView TensorView::contiguous(void* data, DType dtype, const std::int64_t* shape, int ndim, Device device) {
  if (ndim < 0 || ndim > kMaxDims) {
    throw Error(ErrorCode::invalid_value, "ndim", "0.." + std::to_string(kMaxDims), std::to_string(ndim));
  }
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.device = device;
  v.ndim = ndim;
  std::int64_t stride = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    v.shape[i] = shape[i];
    v.strides[i] = stride;
    stride *= shape[i] > 0 ? shape[i] : 1;
  }
  return v;
}

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> shape, Device device) {
  return contiguous(data, dtype, shape.begin(), static_cast<int>(shape.size()), device);
}

std::int64_t TensorView::numel() const noexcept {
  std::int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

bool TensorView::is_contiguous() const noexcept {
  if (numel() == 0) return true;  // no element to misplace (torch gives (5, 0, 7) strides (7, 7, 1))
  std::int64_t expected = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

std::string TensorView::shape_string() const {
  std::string s = "(";
  for (int i = 0; i < ndim; ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + ")";
}

}  // namespace lossfuse
