// Row kernels of the fused linear cross-entropy over vocabulary tiles, float32 (src/cpu/linear_tiles.cpp): the
// element loops between a tile's GEMMs, on Highway vectors. The row formulas are those of
// src/math/vocab_tile_math.hpp; src/core/linear_cross_entropy.cpp keeps the per-row bookkeeping and the float64
// path. Each call handles rows [i0, i1) of one tile and never throws.
#pragma once

#include <cstdint>

namespace lossfuse::cpu {

struct LceTile {
  float* z = nullptr;             // rows x n at row stride ld: the tile's products x W^T, turned into z in place
  std::int64_t n = 0, ld = 0;     // classes in the tile, row stride
  const float* bias = nullptr;    // the tile's n bias values, or nullptr
  float scale = 1, softcap = 0, inv_softcap = 0;  // the logit transform (softcap 0: off)
};

// z = T(z + bias) in place; max[i] = the row's largest z, NaN left out (-inf when the row holds no number).
void lce_tile_transform_max(const LceTile& t, std::int64_t i0, std::int64_t i1, float* max);

// sum[i] = sum_j exp(z_ij - shift[i]) over z already transformed, summed in float32 (NaN propagates).
void lce_tile_sum_exp(const LceTile& t, std::int64_t i0, std::int64_t i1, const float* shift, float* sum);

// Per-row constants of the gradient (math::CeGradCoefs with the row's lse and the target's column in the tile).
struct LceTileGradRows {
  const float* lse = nullptr;
  const float* qa = nullptr;
  const float* wb = nullptr;
  const float* ty = nullptr;
  const std::int64_t* target_col = nullptr;  // y - v0: the target's column (any value outside [0, n): none)
  const float* class_weight = nullptr;       // the tile's n class weights, or nullptr (all 1)
  bool transformed = false;                  // z is T(.) already (else it is made from z + bias first)
};

// z_ij <- (qa_i exp(z_ij - lse_i) - wb_i w_j - [j == y_i] ty_i) dz/dx: d loss / d (x W^T + b) of the tile.
void lce_tile_grad(const LceTile& t, const LceTileGradRows& g, std::int64_t i0, std::int64_t i1);

}  // namespace lossfuse::cpu
