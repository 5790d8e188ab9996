// The CPU runner of the fused linear cross-entropy (src/core/linear_cross_entropy_params.hpp): chunks of rows, each
// chunk's logits made by the GEMM hook into one reused buffer, reduced (and turned into their gradient, in place) by
// the cross-entropy kernel (cross_entropy_rows, through its params), then multiplied back into dx, dW and db. With
// vocabulary tiles the buffer holds one tile of a chunk's logits, reduced here by the formulas of
// src/math/vocab_tile_math.hpp and the float32 row kernels of linear_tiles.cpp.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/class_problem.hpp"
#include "core/cross_entropy_params.hpp"
#include "core/linear_cross_entropy_params.hpp"
#include "core/targets.hpp"
#include "cpu/kernels.hpp"
#include "cpu/linear_tile_kernels.hpp"
#include "lossfuse/error.hpp"
#include "lossfuse/gemm.hpp"
#include "lossfuse/parallel.hpp"
#include "math/storage.hpp"
#include "math/vocab_tile_math.hpp"

namespace lossfuse::cpu {
namespace {

template <class T>
std::unique_ptr<T[]> uninit(std::int64_t n) {
  return std::unique_ptr<T[]>(new T[static_cast<std::size_t>(std::max<std::int64_t>(n, 1))]);
}

TensorView sub_rows(const TensorView& t, std::int64_t r0, std::int64_t rows) {
  TensorView v = t;
  v.shape[0] = rows;
  if (rows > 0)
    v.data = static_cast<char*>(t.data) + r0 * t.strides[0] * static_cast<std::int64_t>(dtype_size(t.dtype));
  return v;
}

// A leading dimension for a GEMM operand: any value serves a single row, but GEMMs want one >= the row length.
std::int64_t ld(std::int64_t stride, std::int64_t rows, std::int64_t cols) {
  return rows <= 1 ? std::max(stride, cols) : stride;
}

void gemm_or_throw(GemmCall c) {
  c.lda = ld(c.lda, c.trans_a ? c.k : c.m, c.trans_a ? c.m : c.k);
  c.ldb = ld(c.ldb, c.trans_b ? c.n : c.k, c.trans_b ? c.k : c.n);
  c.ldc = ld(c.ldc, c.m, c.n);
  if (!run_gemm(c)) {
    throw Error(ErrorCode::not_implemented, "gemm", "a GEMM for " + std::string(dtype_name(c.ab_dtype)) + " operands",
                "a hook that declined the call");
  }
}

// A value in the accumulation type of storage type T (float64 values only meet double storage).
template <class T>
typename math::Io<T>::Acc narrow(double v) {
  return static_cast<typename math::Io<T>::Acc>(v);
}

// The storage type of a float dtype, for the element loops (bias, conversions).
template <class F>
void with_storage(DType t, F&& f) {
  math::visit_float_dtype(t, std::forward<F>(f));
}

// Calls f(std::true_type) when the softcap is on, else f(std::false_type): element loops take it as kCap.
template <class F>
void with_cap(bool cap, F&& f) {
  if (cap) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

// Rows of a chunk per parallel task in the element loops: about 16K elements each.
std::int64_t row_grain(std::int64_t cols) { return std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(cols, 1)); }

// A row's lse saved in double, taken apart for Acc arithmetic: hi = lse rounded to Acc, and exp(-(lse - hi)), the
// factor by which q_c = exp(z_c - lse) = exp(z_c - hi) exp(-(lse - hi)) differs from exp(z_c - hi). z_c - hi keeps
// the precision of the logits' differences near the row max, which lse rounded to Acc alone would not (at z ~ 1e3
// in float32 every probability would be off by up to 3e-5 relative). For Acc = double the factor is 1.
template <class Acc>
struct SplitLse {
  Acc hi;
  Acc exp_neg_lo;
};

template <class Acc>
SplitLse<Acc> split_lse(double lse) {
  const Acc hi = static_cast<Acc>(lse);
  return {hi, std::isfinite(hi) ? static_cast<Acc>(std::exp(-(lse - static_cast<double>(hi)))) : Acc(1)};
}

// The gradient filter's test (math::grad_filter_keeps) against the whole lse: the tile's largest probability is
// exp(tile max - hi) exp(-(lse - hi)). With hi alone a tile whose largest probability is at or above the threshold
// could be dropped (float32 at 2^20: hi is off by up to 1/16).
template <class Acc>
bool filter_keeps(Acc tile_max, const SplitLse<Acc>& lse, Acc threshold) {
  return !(std::exp(tile_max - lse.hi) * lse.exp_neg_lo < threshold);
}

template <class Acc>
class Runner {
 public:
  explicit Runner(const core::LceParams& lp)
      : lp_(lp),
        p_(lp.problem),
        x_(*lp.x),
        w_(*lp.w),
        target_(*lp.target),
        o_(*lp.options),
        g_(*lp.grads),
        R_(lp.chunk_rows),
        wts_(static_cast<const Acc*>(lp.class_weight)) {
    const core::LceProblem& p = p_;
    const TensorView* b = lp.b;
    const LinearCrossEntropyGrads& g = g_;
    logits_ = uninit<Acc>(R_ * p.Vt);
    tiles_ = p.V == 0 ? 0 : (p.V + p.Vt - 1) / p.Vt;
    if (b) {
      bias_.resize(static_cast<std::size_t>(p.V));
      with_storage(b->dtype, [&](auto t) {
        using T = decltype(t);
        const T* bp = static_cast<const T*>(b->data);
        for (std::int64_t v = 0; v < p.V; ++v) bias_[v] = static_cast<Acc>(math::Io<T>::load(bp, v * b->strides[0]));
      });
    }
    if (p.tiled) init_tiled();
    wants_grads_ = g.x || g.w || g.b;
    if (!wants_grads_) return;
    if (p.dt != p.pb.acc) g16_ = uninit<std::uint16_t>(R_ * p.Vt);
    // dW in 16 bits (or strided) needs an accumulator. Chunk-major, it is V x H (every tile accumulates over every
    // chunk); with vocabulary tiles the backward runs tile-major instead (every chunk of one tile, then the next
    // tile), so the accumulator is one tile's Vt x H, and dx (accumulated over the tiles) is kept in full: N x H.
    const bool dw_scratch = g.w && !(g.w->dtype == p.pb.acc && g.w->strides[1] == 1);
    tile_major_ = p.tiled && dw_scratch;
    if (g.x && !(g.x->dtype == p.pb.acc && g.x->strides[1] == 1)) dx_ = uninit<Acc>((tile_major_ ? p.N : R_) * p.H);
    if (dw_scratch) dw_ = uninit<Acc>((tile_major_ ? p.Vt : p.V) * p.H);
    if (g.b) db_.assign(static_cast<std::size_t>(p.V), 0.0);
    dw_tile_written_.assign(static_cast<std::size_t>(tiles_), false);
  }

  // Per chunk: logits -> cross-entropy (forward, forward+backward or backward) -> dx, dW, db; with vocabulary
  // tiles, per chunk the tiled forward and/or the tiled backward.
  // scale[r]: the upstream gradient of row r's loss term (grads only). lse_rows: each row's lse in double, written by
  // the forward (max + log-sum summed in double) and read by the backward, which splits it into a rounded part and a
  // remainder, so that gradients made from it keep the forward's precision at any common offset of the logits (up
  // to 1.1e-16 |lse| per probability).
  void run(Acc* loss_rows, double* lse_rows, Acc* z_rows, const Acc* scale, bool backward) {
    if (tile_major_) {
      run_tile_major(loss_rows, lse_rows, z_rows, scale, backward);
      return;
    }
    for (std::int64_t r0 = 0; r0 < p_.N; r0 += R_) {
      const std::int64_t rc = std::min(R_, p_.N - r0);
      if (p_.tiled) {
        if (!backward) tiled_forward(r0, rc, loss_rows, lse_rows, z_rows);
        if (wants_grads_) tiled_backward(r0, rc, lse_rows, scale);
        continue;
      }
      make_logits(r0, rc, 0, p_.V);
      const core::CeMode mode = backward       ? core::CeMode::backward
                                : wants_grads_ ? core::CeMode::forward_backward
                                               : core::CeMode::forward;
      core::CeParams cp = core::lce_chunk_params(lp_, mode, r0, rc, logits_.get(), scale);
      cp.lse_in = backward ? lse_rows + r0 : nullptr;
      if (!backward) {
        cp.loss_rows = loss_rows + r0;
        cp.lse_rows = lse_rows + r0;
        cp.zloss_rows = z_rows + r0;
      }
      cross_entropy_rows(cp);
      if (wants_grads_) {
        accumulate_grads(r0, rc, 0, p_.V, 0);
        finish_dx_rows(r0, rc);
      }
    }
    if (wants_grads_) finish_grads();
  }

 private:
  double class_weight_sum() const { return core::lce_class_weight_sum(lp_); }

  void init_tiled() {
    wc_.assign(static_cast<std::size_t>(p_.V), Acc(1));
    if (wts_ != nullptr) std::copy(wts_, wts_ + p_.V, wc_.begin());
    const double sum_w = class_weight_sum();
    rp_.eps = static_cast<Acc>(o_.ce.label_smoothing);
    rp_.eps_over_c = p_.V > 0 ? static_cast<Acc>(o_.ce.label_smoothing / static_cast<double>(p_.V)) : Acc(0);
    rp_.sum_w = static_cast<Acc>(sum_w);
    rp_.z_loss_scale = static_cast<Acc>(o_.ce.z_loss_scale);
    xf_.scale = static_cast<Acc>(o_.ce.logit_scale);
    xf_.softcap = static_cast<Acc>(o_.ce.softcap);
    xf_.inv_softcap = o_.ce.softcap > 0 ? static_cast<Acc>(1.0 / o_.ce.softcap) : Acc(0);
    filter_ = static_cast<Acc>(o_.grad_filter);
    const auto rows = static_cast<std::size_t>(R_);
    y_.resize(rows);
    wy_.resize(rows);
    state_.resize(rows);
    live_.resize(rows);
    weighted_ = wts_ != nullptr;
    if (kVec) {
      for (auto* a : {&row_max_, &row_shift_, &row_sum_, &row_qa_, &row_wb_, &row_ty_, &row_lse_}) a->resize(rows);
      row_col_.resize(rows);
    }
  }

  // Targets of rows [r0, r0 + rc): y_ (ignore_index for ignored rows) and w_y.
  void load_targets(std::int64_t r0, std::int64_t rc) {
    for (std::int64_t i = 0; i < rc; ++i) {
      const std::int64_t y = core::read_target(target_.data, target_.dtype, (r0 + i) * target_.strides[0]);
      y_[i] = y;
      wy_[i] = ignored(y) ? Acc(0) : wc_[y];
    }
  }
  bool ignored(std::int64_t y) const { return y == o_.ce.ignore_index; }

  // Tiled forward of rows [r0, r0 + rc): every tile's logits folded into the rows' running statistics, then the
  // rows' loss, lse and z-loss.
  void tiled_forward(std::int64_t r0, std::int64_t rc, Acc* loss_rows, double* lse_rows, Acc* z_rows) {
    load_targets(r0, rc);
    std::fill(state_.begin(), state_.begin() + rc, math::TileRowState<Acc>{});
    for (std::int64_t t = 0; t < tiles_; ++t) {
      const std::int64_t v0 = t * p_.Vt, vn = std::min(p_.Vt, p_.V - v0);
      make_logits(r0, rc, v0, vn, !kVec);
      if constexpr (kVec) {
        parallel_for(0, rc, row_grain(vn), [&](std::int64_t i0, std::int64_t i1) {
          const LceTile tile = tile_view(v0, vn);
          lce_tile_transform_max(tile, i0, i1, row_max_.data());
          for (std::int64_t i = i0; i < i1; ++i) {
            row_shift_[i] = math::tile_shift(row_max_[i]);
            if (t == 0) state_[i].ref = row_shift_[i];
          }
          lce_tile_sum_exp(tile, i0, i1, row_shift_.data(), row_sum_.data());
          for (std::int64_t i = i0; i < i1; ++i) fold_tile_sums(i, v0, vn, row_max_[i], row_sum_[i]);
        });
      } else {
        with_cap(xf_.softcap > 0, [&](auto cap) {
          parallel_for(0, rc, row_grain(vn), [&](std::int64_t i0, std::int64_t i1) {
            for (std::int64_t i = i0; i < i1; ++i) fold_tile_row<decltype(cap)::value>(i, v0, vn, t == 0);
          });
        });
      }
    }
    for (std::int64_t i = 0; i < rc; ++i) {
      const math::CeRowResult<Acc> res = math::tile_row_finish(rp_, state_[i], ignored(y_[i]), wy_[i]);
      loss_rows[r0 + i] = res.loss;
      lse_rows[r0 + i] = std::isnan(res.lse)
                             ? static_cast<double>(res.lse)
                             : static_cast<double>(state_[i].lse.m) + static_cast<double>(std::log(state_[i].lse.s));
      z_rows[r0 + i] = res.z_loss;
    }
  }

  // Row i of the tile [v0, v0 + vn) in logits_: z in place, then its max, sum of exps and smoothing sum folded in.
  template <bool kCap>
  void fold_tile_row(std::int64_t i, std::int64_t v0, std::int64_t vn, bool first) {
    Acc* z = logits_.get() + i * vn;
    math::TileRowState<Acc>& st = state_[i];
    Acc m = math::neg_inf<Acc>();
    for (std::int64_t j = 0; j < vn; ++j) {
      const Acc v = xf_.template apply_as<kCap>(z[j]);
      z[j] = v;
      m = v > m ? v : m;
    }
    const Acc shift = math::tile_shift(m);
    if (first) st.ref = shift;
    // The tile's sums in double: one rounding for s however wide the tile.
    double s = 0;
    for (std::int64_t j = 0; j < vn; ++j) s += static_cast<double>(std::exp(z[j] - shift));
    fold_tile_sums(i, v0, vn, m, static_cast<Acc>(s));
  }

  // Row i of the tile [v0, v0 + vn), z in logits_ with max m and s = sum exp(z - tile_shift(m)): the smoothing sum
  // and the target's z taken, then all folded into the row's state (its ref already set).
  void fold_tile_sums(std::int64_t i, std::int64_t v0, std::int64_t vn, Acc m, Acc s) {
    const Acc* z = logits_.get() + i * vn;
    math::TileRowState<Acc>& st = state_[i];
    double swz = 0;
    if (rp_.eps != Acc(0)) {
      const Acc* w = wc_.data() + v0;
      for (std::int64_t j = 0; j < vn; ++j) swz += static_cast<double>(w[j] * (z[j] - st.ref));
    }
    const std::int64_t y = y_[i];
    if (y >= v0 && y < v0 + vn) st.z_y = z[y - v0];
    math::tile_fold(st, m, s, swz);
  }

  // The tile [v0, v0 + vn) of logits_ for the vector row kernels (float32 only).
  LceTile tile_view(std::int64_t v0, std::int64_t vn) {
    LceTile t;
    if constexpr (kVec) {
      t.z = logits_.get();
      t.n = vn;
      t.ld = vn;
      t.bias = bias_.empty() ? nullptr : bias_.data() + v0;
      t.scale = xf_.scale;
      t.softcap = xf_.softcap;
      t.inv_softcap = xf_.inv_softcap;
    }
    return t;
  }

  // Tiled backward of rows [r0, r0 + rc) from their lse: per tile, logits recomputed, turned into their gradient
  // in place and multiplied into dx, dW and db; a tile whose gradient is zero in every row skips its products.
  void tiled_backward(std::int64_t r0, std::int64_t rc, const double* lse_rows, const Acc* scale) {
    load_targets(r0, rc);
    for (std::int64_t t = 0; t < tiles_; ++t) {
      const std::int64_t v0 = t * p_.Vt, vn = std::min(p_.Vt, p_.V - v0);
      if (grad_tile(r0, rc, v0, vn, lse_rows, scale)) accumulate_grads(r0, rc, v0, vn, t);
    }
    finish_dx_rows(r0, rc);
  }

  // Tile [v0, v0 + vn) of rows [r0, r0 + rc) (targets loaded): logits recomputed and turned into their gradient in
  // logits_. False when that gradient is zero in every row (its products can be skipped).
  bool grad_tile(std::int64_t r0, std::int64_t rc, std::int64_t v0, std::int64_t vn, const double* lse_rows,
                 const Acc* scale) {
    make_logits(r0, rc, v0, vn, !kVec);
    if constexpr (kVec) {
      parallel_for(0, rc, row_grain(vn), [&](std::int64_t i0, std::int64_t i1) {
        grad_tile_rows_vec(i0, i1, v0, vn, lse_rows + r0, scale + r0);
      });
    } else {
      with_cap(xf_.softcap > 0, [&](auto cap) {
        parallel_for(0, rc, row_grain(vn), [&](std::int64_t i0, std::int64_t i1) {
          for (std::int64_t i = i0; i < i1; ++i) {
            live_[i] = grad_tile_row<decltype(cap)::value>(i, v0, vn, lse_rows[r0 + i], scale[r0 + i]);
          }
        });
      });
    }
    return std::find(live_.begin(), live_.begin() + rc, char(1)) != live_.begin() + rc;
  }

  // Rows [i0, i1) of the tile [v0, v0 + vn) in logits_ (the GEMM's products, no bias yet) become d loss / d logits
  // by the vector kernels, as grad_tile_row does one row; lse and g: the chunk's rows. With the gradient filter the
  // tile's z and row maxima come first. Rows with a NaN lse or an ignored target are then set whole (NaN, 0).
  void grad_tile_rows_vec(std::int64_t i0, std::int64_t i1, std::int64_t v0, std::int64_t vn, const double* lse_d,
                          const Acc* g) {
    if constexpr (kVec) {
      const LceTile tile = tile_view(v0, vn);
      const bool filter = filter_ > Acc(0);
      if (filter) lce_tile_transform_max(tile, i0, i1, row_max_.data());
      Acc* lse = row_lse_.data();
      for (std::int64_t i = i0; i < i1; ++i) {
        const std::int64_t y = y_[i];
        row_col_[i] = y - v0;
        const SplitLse<Acc> sl = split_lse<Acc>(lse_d[i]);
        lse[i] = sl.hi;
        if (std::isnan(lse[i]) || ignored(y)) {
          row_qa_[i] = row_wb_[i] = row_ty_[i] = Acc(0);
          live_[i] = std::isnan(lse[i]) ? 1 : 0;
          continue;
        }
        const bool keep = !filter || filter_keeps(row_max_[i], sl, filter_);
        const math::CeGradCoefs<Acc> k = math::ce_index_grad_coefs(rp_, lse[i], wy_[i], g[i], keep);
        row_qa_[i] = k.qa * sl.exp_neg_lo, row_wb_[i] = k.wb, row_ty_[i] = k.ty;
        live_[i] = keep || rp_.eps_over_c != Acc(0) || (y >= v0 && y < v0 + vn) ? 1 : 0;
      }
      LceTileGradRows rows;
      rows.lse = lse;
      rows.qa = row_qa_.data();
      rows.wb = row_wb_.data();
      rows.ty = row_ty_.data();
      rows.target_col = row_col_.data();
      rows.class_weight = weighted_ ? wc_.data() + v0 : nullptr;
      rows.transformed = filter;
      lce_tile_grad(tile, rows, i0, i1);
      for (std::int64_t i = i0; i < i1; ++i) {
        if (!std::isnan(lse[i]) && !ignored(y_[i])) continue;
        Acc* z = logits_.get() + i * vn;
        std::fill(z, z + vn, std::isnan(lse[i]) ? std::numeric_limits<Acc>::quiet_NaN() : Acc(0));
      }
    }
  }

  // Tiled with a dW accumulator: the forward chunk by chunk (every row's lse), then the backward tile-major, so
  // dW's accumulator holds one tile (stored, rounded once, when every chunk has added into it) and dx's all rows.
  void run_tile_major(Acc* loss_rows, double* lse_rows, Acc* z_rows, const Acc* scale, bool backward) {
    const std::int64_t chunks = (p_.N + R_ - 1) / R_;
    if (!backward) {
      for (std::int64_t r0 = 0; r0 < p_.N; r0 += R_) {
        tiled_forward(r0, std::min(R_, p_.N - r0), loss_rows, lse_rows, z_rows);
      }
    }
    dx_chunk_written_.assign(static_cast<std::size_t>(chunks), 0);
    for (std::int64_t t = 0; t < tiles_; ++t) {
      const std::int64_t v0 = t * p_.Vt, vn = std::min(p_.Vt, p_.V - v0);
      for (std::int64_t r0 = 0; r0 < p_.N; r0 += R_) {
        const std::int64_t rc = std::min(R_, p_.N - r0);
        load_targets(r0, rc);
        if (grad_tile(r0, rc, v0, vn, lse_rows, scale)) accumulate_grads(r0, rc, v0, vn, t);
      }
      const TensorView dw = sub_rows(*g_.w, v0, vn);
      if (dw_tile_written_[t]) {
        store_rows(dw_.get(), dw, vn, p_.H);
      } else {
        zero_rows(dw, vn);
      }
    }
    if (g_.x) {
      for (std::int64_t c = 0; c < chunks; ++c) {
        const std::int64_t r0 = c * R_, rc = std::min(R_, p_.N - r0);
        const TensorView dx = sub_rows(*g_.x, r0, rc);
        if (!dx_chunk_written_[c]) {
          zero_rows(dx, rc);
        } else if (dx_) {
          store_rows(dx_.get() + r0 * p_.H, dx, rc, p_.H);
        }
      }
    }
    finish_grads();
  }

  // Row i of the tile [v0, v0 + vn) in logits_ becomes d loss / d logits. Returns 0 when it is all zero (an ignored
  // row, or a filtered one with no target or smoothing term in the tile).
  template <bool kCap>
  char grad_tile_row(std::int64_t i, std::int64_t v0, std::int64_t vn, double lse_d, Acc g) {
    const SplitLse<Acc> sl = split_lse<Acc>(lse_d);
    const Acc lse = sl.hi;
    Acc* z = logits_.get() + i * vn;
    const std::int64_t y = y_[i];
    if (std::isnan(lse)) {  // a non-finite row: NaN gradient, as PyTorch's log_softmax backward (even if ignored)
      std::fill(z, z + vn, std::numeric_limits<Acc>::quiet_NaN());
      return 1;
    }
    if (ignored(y)) {
      std::fill(z, z + vn, Acc(0));
      return 0;
    }
    Acc m = math::neg_inf<Acc>();
    for (std::int64_t j = 0; j < vn; ++j) {
      const Acc v = xf_.template apply_as<kCap>(z[j]);
      z[j] = v;
      m = v > m ? v : m;
    }
    const bool keep = filter_keeps(m, sl, filter_);
    math::CeGradCoefs<Acc> k = math::ce_index_grad_coefs(rp_, lse, wy_[i], g, keep);
    k.qa *= sl.exp_neg_lo;
    const Acc* w = wc_.data() + v0;
    const std::int64_t yj = y - v0;  // the target's column in the tile (maybe outside it)
    for (std::int64_t j = 0; j < vn; ++j) {
      z[j] = math::ce_index_grad_z(k, z[j], lse, w[j], j == yj) * xf_.template derivative_from_z<kCap>(z[j]);
    }
    return keep || rp_.eps_over_c != Acc(0) || (yj >= 0 && yj < vn) ? 1 : 0;
  }

  // logits_ (rc x vn) = rows [r0, r0 + rc) of x times rows [v0, v0 + vn) of W, transposed, plus the bias (unless
  // add_bias is false: the vector row kernels add it).
  void make_logits(std::int64_t r0, std::int64_t rc, std::int64_t v0, std::int64_t vn, bool add_bias = true) {
    if (rc == 0 || vn == 0) return;
    Acc* L = logits_.get();
    if (p_.H == 0) {
      std::fill(L, L + rc * vn, Acc(0));
    } else {
      GemmCall c;
      c.ab_dtype = p_.dt;
      c.trans_b = true;
      c.m = rc;
      c.n = vn;
      c.k = p_.H;
      c.a = sub_rows(x_, r0, rc).data;
      c.lda = x_.strides[0];
      c.b = sub_rows(w_, v0, vn).data;
      c.ldb = w_.strides[0];
      c.c = L;
      c.ldc = vn;
      gemm_or_throw(c);
    }
    if (bias_.empty() || !add_bias) return;
    const Acc* bias = bias_.data() + v0;
    parallel_for(0, rc, row_grain(vn), [&](std::int64_t i0, std::int64_t i1) {
      for (std::int64_t i = i0; i < i1; ++i) {
        Acc* row = L + i * vn;
        for (std::int64_t j = 0; j < vn; ++j) row[j] += bias[j];
      }
    });
  }

  // logits_ now holds d loss / d logits for rows [r0, r0 + rc) and classes [v0, v0 + vn) (tile number `tile`):
  // db[v0:] += its column sums, dx rows += G W[v0:v0+vn] (the chunk's first product overwrites),
  // dW[v0:v0+vn] += G^T x rows (the tile's first product overwrites).
  void accumulate_grads(std::int64_t r0, std::int64_t rc, std::int64_t v0, std::int64_t vn, std::int64_t tile) {
    const Acc* G = logits_.get();
    const std::int64_t H = p_.H;
    if (g_.b) {
      parallel_for(0, vn, 256, [&](std::int64_t j0, std::int64_t j1) {
        for (std::int64_t i = 0; i < rc; ++i) {
          for (std::int64_t j = j0; j < j1; ++j) db_[v0 + j] += static_cast<double>(G[i * vn + j]);
        }
      });
    }
    if (!(g_.x || g_.w) || H == 0 || rc == 0 || vn == 0) return;  // nothing to multiply
    // The GEMM operand: the gradient itself, or rounded once to the inputs' 16-bit type.
    const void* ga = G;
    if (g16_) {
      std::uint16_t* out = g16_.get();
      parallel_for(0, rc, row_grain(vn), [&](std::int64_t i0, std::int64_t i1) {
        for (std::int64_t e = i0 * vn; e < i1 * vn; ++e) {
          out[e] = p_.dt == DType::bf16 ? math::float_to_bf16(static_cast<float>(G[e]))
                                        : math::float_to_f16(static_cast<float>(G[e]));
        }
      });
      ga = out;
    }
    if (g_.x) {  // dx rows (rc x H) += G (rc x vn) @ W rows (vn x H)
      GemmCall c;
      c.ab_dtype = p_.dt;
      c.m = rc;
      c.n = H;
      c.k = vn;
      c.a = ga;
      c.lda = vn;
      c.b = sub_rows(w_, v0, vn).data;
      c.ldb = w_.strides[0];
      // Chunk-major, the scratch holds the chunk's rows; tile-major, every row, and a chunk's rows are started
      // by the first tile whose products reach them.
      char& started = tile_major_ ? dx_chunk_written_[r0 / R_] : dx_started_;
      c.c = dx_ ? static_cast<void*>(dx_.get() + (tile_major_ ? r0 * H : 0)) : sub_rows(*g_.x, r0, rc).data;
      c.ldc = dx_ ? H : g_.x->strides[0];
      c.beta = started ? 1.0 : 0.0;
      gemm_or_throw(c);
      started = 1;
    }
    if (g_.w) {  // dW rows (vn x H) += G^T (vn x rc) @ x rows (rc x H)
      GemmCall c;
      c.ab_dtype = p_.dt;
      c.trans_a = true;
      c.m = vn;
      c.n = H;
      c.k = rc;
      c.a = ga;
      c.lda = vn;
      c.b = sub_rows(x_, r0, rc).data;
      c.ldb = x_.strides[0];
      c.c = dw_ ? static_cast<void*>(dw_.get() + (tile_major_ ? 0 : v0 * H)) : sub_rows(*g_.w, v0, vn).data;
      c.ldc = dw_ ? H : g_.w->strides[0];
      c.beta = dw_tile_written_[tile] ? 1.0 : 0.0;
      gemm_or_throw(c);
      dw_tile_written_[tile] = true;
    }
  }

  // The chunk's dx rows are complete: stored from the scratch buffer, or zeros when no product reached them.
  void finish_dx_rows(std::int64_t r0, std::int64_t rc) {
    if (!g_.x) return;
    const TensorView dx = sub_rows(*g_.x, r0, rc);
    if (!dx_started_) {
      zero_rows(dx, rc);
    } else if (dx_) {
      store_rows(dx_.get(), dx, rc, p_.H);
    }
    dx_started_ = 0;
  }

  void finish_grads() {
    const std::int64_t V = p_.V, H = p_.H;
    if (g_.w && !tile_major_) {                    // tile-major stored each tile already
      for (std::int64_t t = 0; t < tiles_; ++t) {  // rows no product reached (no chunk, or every chunk skipped)
        if (dw_tile_written_[t]) continue;
        const std::int64_t v0 = t * p_.Vt, vn = std::min(p_.Vt, V - v0);
        if (dw_) {
          std::fill(dw_.get() + v0 * H, dw_.get() + (v0 + vn) * H, Acc(0));
        } else {
          zero_rows(sub_rows(*g_.w, v0, vn), vn);
        }
      }
      if (dw_) store_rows(dw_.get(), *g_.w, V, H);
    }
    if (g_.b) {
      with_storage(g_.b->dtype, [&](auto t) {
        using T = decltype(t);
        T* out = static_cast<T*>(g_.b->data);
        for (std::int64_t v = 0; v < V; ++v) math::Io<T>::store(out, v * g_.b->strides[0], narrow<T>(db_[v]));
      });
    }
  }

  // Copies a dense rows x cols Acc block into a strided 2-D view of any float dtype.
  static void store_rows(const Acc* src, const TensorView& dst, std::int64_t rows, std::int64_t cols) {
    with_storage(dst.dtype, [&](auto t) {
      using T = decltype(t);
      T* out = static_cast<T*>(dst.data);
      parallel_for(0, rows, 16, [&](std::int64_t i0, std::int64_t i1) {
        for (std::int64_t i = i0; i < i1; ++i) {
          for (std::int64_t j = 0; j < cols; ++j) {
            math::Io<T>::store(out, i * dst.strides[0] + j * dst.strides[1], narrow<T>(src[i * cols + j]));
          }
        }
      });
    });
  }

  static void zero_rows(const TensorView& dst, std::int64_t rows) {
    with_storage(dst.dtype, [&](auto t) {
      using T = decltype(t);
      T* out = static_cast<T*>(dst.data);
      for (std::int64_t i = 0; i < rows; ++i) {
        for (std::int64_t j = 0; j < dst.shape[1]; ++j)
          math::Io<T>::store(out, i * dst.strides[0] + j * dst.strides[1], narrow<T>(0.0));
      }
    });
  }

  const core::LceParams& lp_;
  const core::LceProblem& p_;
  const TensorView& x_;
  const TensorView& w_;
  const TensorView& target_;
  const LinearCrossEntropyOptions& o_;
  const LinearCrossEntropyGrads& g_;
  const std::int64_t R_;
  const Acc* wts_;          // class weights as core::load_weights made them (nullptr: unweighted)
  std::int64_t tiles_ = 0;  // vocabulary tiles of Vt classes (one of V when untiled; none when V = 0)
  bool wants_grads_ = false;
  bool tile_major_ = false;             // tiled with a dW accumulator: the backward runs tile by tile
  char dx_started_ = 0;                 // a product has written the current chunk's dx rows
  std::vector<char> dx_chunk_written_;  // tile-major: a product has written the chunk's dx rows
  std::vector<bool> dw_tile_written_;   // a product has written the tile's rows of dW
  std::unique_ptr<Acc[]> logits_;       // R x Vt: a chunk's logits, then their gradient
  std::vector<Acc> bias_;
  std::unique_ptr<std::uint16_t[]> g16_;
  std::unique_ptr<Acc[]> dx_, dw_;
  std::vector<double> db_;
  // Tiled only: the row formulas' constants, class weights (1 when unweighted), the chunk's rows.
  math::CeRowParams<Acc> rp_;
  math::LogitTransform<Acc> xf_;
  Acc filter_ = 0;
  std::vector<Acc> wc_, wy_;
  std::vector<std::int64_t> y_;
  std::vector<math::TileRowState<Acc>> state_;
  std::vector<char> live_;  // per row of the current tile: its gradient may be nonzero
  bool weighted_ = false;   // class weights given (else wc_ is all 1)
  // float32 tiles (the vector row kernels): per row of the chunk, the tile's max, shift and sum of exps, and the
  // gradient's coefficients, lse (its rounded part) and target column.
  static constexpr bool kVec = std::is_same_v<Acc, float>;
  std::vector<Acc> row_max_, row_shift_, row_sum_, row_qa_, row_wb_, row_ty_, row_lse_;
  std::vector<std::int64_t> row_col_;
};

}  // namespace

void linear_cross_entropy_run(const core::LceParams& p) {
  if (p.scales_held()) {
    for (const core::CeParams* h : p.held) {
      if (h != nullptr) cross_entropy_rows(*h);
    }
    return;
  }
  if (p.problem.pb.acc == DType::f64) {
    Runner<double>(p).run(static_cast<double*>(p.loss_rows), p.lse_rows, static_cast<double*>(p.z_rows),
                          static_cast<const double*>(p.scale), p.backward);
  } else {
    Runner<float>(p).run(static_cast<float*>(p.loss_rows), p.lse_rows, static_cast<float*>(p.z_rows),
                         static_cast<const float*>(p.scale), p.backward);
  }
}

}  // namespace lossfuse::cpu
