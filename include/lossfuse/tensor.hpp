// lossfuse: a non-owning view of a strided tensor. Strides count elements, not bytes.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "lossfuse/dtype.hpp"

namespace lossfuse {

inline constexpr int kMaxDims = 8;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  int ndim = 0;  // 0 is a scalar (one element)
  std::array<std::int64_t, kMaxDims> shape{};
  std::array<std::int64_t, kMaxDims> strides{};

  // A row-major contiguous view. Throws lossfuse::Error when the shape has more than kMaxDims dims.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                               Device device = Device::cpu);
  static TensorView contiguous(void* data, DType dtype, const std::int64_t* shape, int ndim,
                               Device device = Device::cpu);

  // Product of the shape; assumes a validated view (no negative sizes, no overflow).
  [[nodiscard]] std::int64_t numel() const noexcept;
  [[nodiscard]] bool is_contiguous() const noexcept;
  // "(4, 32000)": for error messages.
  [[nodiscard]] std::string shape_string() const;
};

}  // namespace lossfuse
