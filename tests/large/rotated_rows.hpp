// A (rows, cols) bfloat16 matrix of more than 2^31 elements whose float64 reference stays cheap: row r holds base
// row r % K rotated left by shift * r, so a quantity of a row that ignores the order of its elements (a log-sum-exp,
// a sum) is computed once per base, and every element is still checkable. With K > 1 neighbouring rows differ in
// those quantities too, so a kernel that takes them from the wrong row fails. (An int32 element offset overflows at
// row 2^31 / cols into a negative offset, far outside the buffer: a crash or wrong values, whatever K is.)
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "lossfuse/lossfuse.hpp"
#include "reference/reference.hpp"

namespace lftest {

class RotatedRows {
 public:
  // bases[k](c): the value of base row k at column c, rounded to bfloat16.
  RotatedRows(std::int64_t rows, std::int64_t cols, std::int64_t shift,
              const std::vector<std::function<double(std::int64_t)>>& bases)
      : rows_(rows), cols_(cols), shift_(shift), data_(new std::uint16_t[rows * cols]) {
    std::vector<std::vector<std::uint16_t>> bits;
    for (const auto& f : bases) {
      bits.emplace_back(cols);
      values_.emplace_back(cols);
      for (std::int64_t c = 0; c < cols; ++c) {
        bits.back()[c] = lfref::double_to_bf16_bits(f(c));
        values_.back()[c] = lfref::bf16_bits_to_double(bits.back()[c]);
      }
    }
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::vector<std::uint16_t>& b = bits[base_of(r)];
      const std::int64_t s = (shift * r) % cols;
      std::uint16_t* row = data_.get() + r * cols;
      std::copy(b.begin() + s, b.end(), row);
      std::copy(b.begin(), b.begin() + s, row + (cols - s));
    }
  }

  [[nodiscard]] std::size_t base_of(std::int64_t r) const { return static_cast<std::size_t>(r) % values_.size(); }
  // Base row k's values (as stored, in bfloat16), in base order.
  [[nodiscard]] const std::vector<double>& base(std::size_t k) const { return values_[k]; }
  [[nodiscard]] double at(std::int64_t r, std::int64_t c) const {
    return values_[base_of(r)][(c + shift_ * r) % cols_];
  }
  [[nodiscard]] const std::uint16_t* data() const { return data_.get(); }
  [[nodiscard]] lossfuse::TensorView view() const {
    return lossfuse::TensorView::contiguous(data_.get(), lossfuse::DType::bf16, {rows_, cols_});
  }

 private:
  std::int64_t rows_, cols_, shift_;
  std::vector<std::vector<double>> values_;
  std::unique_ptr<std::uint16_t[]> data_;
};

}  // namespace lftest
