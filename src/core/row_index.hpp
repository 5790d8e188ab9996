// Maps a flat row index to element offsets in several strided views that share the row dims
// (N, d1..dk): the logits with the class dim removed, the target, the gradient, the upstream gradient.
#pragma once

#include <cstdint>

#include "lossfuse/tensor.hpp"
#include "math/host_device.hpp"

namespace lossfuse::core {

inline constexpr int kMaxViews = 4;

template <int kViews>
struct RowIndexN {
  int ndim = 0;                                   // number of row dims (0: a single row)
  std::int64_t sizes[kMaxDims] = {};              // row dims, outermost first
  std::int64_t strides[kViews][kMaxDims] = {};    // per view, per row dim

  // Element offset of row r in view v.
  [[nodiscard]] LF_HOST_DEVICE std::int64_t offset(int v, std::int64_t r) const noexcept {
    std::int64_t off = 0;
    for (int i = ndim - 1; i >= 0; --i) {
      const std::int64_t q = r / sizes[i];
      off += (r - q * sizes[i]) * strides[v][i];
      r = q;
    }
    return off;
  }
};

// Four views: logits, target, gradient, upstream gradient (see cross_entropy_params.hpp).
using RowIndex = RowIndexN<kMaxViews>;

// Row dims and strides of `t` with dim `skip` removed (skip < 0: none removed).
template <int kViews>
void set_row_view(RowIndexN<kViews>& idx, int v, const TensorView& t, int skip) {
  int j = 0;
  for (int i = 0; i < t.ndim; ++i) {
    if (i == skip) continue;
    idx.sizes[j] = t.shape[i];
    idx.strides[v][j] = t.strides[i];
    ++j;
  }
  idx.ndim = j;
}

}  // namespace lossfuse::core
