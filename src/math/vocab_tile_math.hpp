// lossfuse math: cross-entropy over vocabulary tiles, for the fused linear cross-entropy that never holds a row
// of logits whole (tiled over tokens and classes). Shared by every backend.
//
// Forward: a row's z (logits after the LogitTransform) arrives one tile of classes at a time. A tile gives its
// max m and s = sum exp(z_c - tile_shift(m)); tile_fold joins them to the row's running log-sum-exp
// (online_lse.hpp). The caller keeps z_y when the target's tile passes and, for label smoothing, sums
// w_c (z_c - ref) per tile with ref = the first tile's shift, the tiles' sums added in double: relative to a value
// inside the row's range, so no large common offset cancels. After the last tile, tile_row_finish gives lse, the
// loss and the z-loss with the formulas of cross_entropy_math.hpp.
// Backward (index targets): d loss / d z_c = g (q_c A - w_c b_c), q_c = exp(z_c - lse), is split into row
// constants (ce_index_grad_coefs, the upstream gradient g folded in) and one element formula (ce_index_grad_z):
//   d_c = qa q_c - wb w_c - [c == y] ty,  qa = g A,  wb = g eps/C,  ty = g (1 - eps) w_y
// The gradient filter sets qa = 0 for a (row, tile) whose largest q_c is below the threshold (grad_filter_keeps).
// Valid range: as cross_entropy_math.hpp. A NaN or +inf z, or a row of only -inf, makes lse NaN.
#pragma once

#include <cmath>

#include "math/cross_entropy_math.hpp"
#include "math/host_device.hpp"
#include "math/online_lse.hpp"

namespace lossfuse::math {

// One row's running forward statistics over the tiles seen so far.
template <class Acc>
struct TileRowState {
  LseState<Acc> lse;  // running (max, sum exp(z - max))
  Acc ref = 0;        // reference of sum_wz: the first tile's shift
  Acc z_y = 0;        // the target's z, once its tile has passed
  double sum_wz = 0;  // sum_c w_c (z_c - ref) over the tiles seen (label smoothing only)
  bool bad = false;   // a NaN or +inf z was seen
};

// The shift of a tile's exponentials: its max m, or 0 when the tile holds only -inf (and NaN), so that a NaN
// still shows in the sum. m = +inf gives exp(inf - inf) = NaN, flagged like a NaN.
template <class Acc>
LF_HOST_DEVICE Acc tile_shift(Acc m) {
  return m == neg_inf<Acc>() ? Acc(0) : m;
}

// Joins one tile: m its max z (never NaN: NaN z are left out of the max), s = sum exp(z - tile_shift(m)),
// swz = sum w_c (z_c - ref) (0 without label smoothing).
template <class Acc>
LF_HOST_DEVICE void tile_fold(TileRowState<Acc>& r, Acc m, Acc s, double swz) {
  if (s != s || m == -neg_inf<Acc>()) {
    r.bad = true;
    return;
  }
  if (m != neg_inf<Acc>()) r.lse = lse_combine(r.lse, LseState<Acc>{m, s});
  r.sum_wz += swz;
}

template <class Acc>
struct CeRowResult {
  Acc loss;    // including the z-loss term; 0 for an ignored row, NaN for a non-finite one
  Acc z_loss;  // the z-loss term alone
  Acc lse;     // NaN for a non-finite row
};

// The row's results after its last tile; w_y: the target's class weight.
template <class Acc>
LF_HOST_DEVICE CeRowResult<Acc> tile_row_finish(const CeRowParams<Acc>& p, const TileRowState<Acc>& r, bool ignored,
                                                Acc w_y) {
  const Acc nan = static_cast<Acc>(NAN);
  const bool ok = !r.bad && r.lse.m != neg_inf<Acc>();
  CeRowResult<Acc> out{Acc(0), Acc(0), ok ? lse_finalize(r.lse) : nan};
  if (ignored) return out;
  if (!ok) return {nan, nan, nan};  // as PyTorch: NaN or +inf logits, or only -inf, make the loss NaN
  const RowSums<Acc> rs{r.ref, out.lse, static_cast<Acc>(r.sum_wz), Acc(0), Acc(0), r.lse.m, std::log(r.lse.s)};
  out.z_loss = z_loss_row(p, out.lse);
  out.loss = ce_index_row_loss(p, rs, w_y, r.z_y) + out.z_loss;
  return out;
}

// Row constants of the index-target gradient, upstream gradient g folded in. keep_q = false drops the q_c A part
// (the gradient filter).
template <class Acc>
struct CeGradCoefs {
  Acc qa;  // g A, or 0
  Acc wb;  // g eps / C
  Acc ty;  // g (1 - eps) w_y: the target's own term
};

template <class Acc>
LF_HOST_DEVICE CeGradCoefs<Acc> ce_index_grad_coefs(const CeRowParams<Acc>& p, Acc lse, Acc w_y, Acc g, bool keep_q) {
  return {keep_q ? g * ce_index_grad_a(p, lse, w_y) : Acc(0), g * p.eps_over_c, g * (Acc(1) - p.eps) * w_y};
}

// d loss / d z_c of one element; w_c: the class weight (1 when unweighted). Branch-free but for a select.
template <class Acc>
LF_HOST_DEVICE Acc ce_index_grad_z(const CeGradCoefs<Acc>& k, Acc z, Acc lse, Acc w_c, bool is_target) {
  return k.qa * std::exp(z - lse) - k.wb * w_c - (is_target ? k.ty : Acc(0));
}

// The gradient filter's test for one (row, tile): false when the tile's largest softmax probability,
// exp(max z - lse), is below the threshold. Always true for threshold 0 (off) and for a NaN lse.
template <class Acc>
LF_HOST_DEVICE bool grad_filter_keeps(Acc tile_max_z, Acc lse, Acc threshold) {
  return !(std::exp(tile_max_z - lse) < threshold);
}

}  // namespace lossfuse::math
