// Fused linear + cross-entropy: chunks of rows, each chunk's logits made by the GEMM hook into one reused buffer,
// reduced (and turned into their gradient, in place) by the cross-entropy entries, then multiplied back into dx,
// dW and db. Every argument is checked, and the targets scanned, before anything is written.
#include "lossfuse/linear_cross_entropy.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/check.hpp"
#include "core/class_problem.hpp"
#include "core/row_index.hpp"
#include "core/targets.hpp"
#include "cpu/scalar_io.hpp"
#include "lossfuse/gemm.hpp"
#include "lossfuse/parallel.hpp"

namespace lossfuse {
namespace {

using core::NamedView;

struct Problem {
  std::int64_t N = 0, H = 0, V = 0;
  DType dt = DType::f32;
  core::ClassProblem pb;  // rows N, classes V: for the output checks shared with cross-entropy
};

void check_2d(const TensorView& t, const char* name, const char* dims) {
  core::check_view(t, name);
  if (t.ndim != 2) {
    throw Error(ErrorCode::shape_mismatch, name, std::string("2 dims ") + dims, t.shape_string());
  }
  if (t.shape[1] > 1 && t.strides[1] != 1) {
    throw Error(ErrorCode::invalid_value, std::string(name) + ".stride(1)", "1 (rows of unit stride)",
                std::to_string(t.strides[1]));
  }
}

Problem check_problem(const TensorView& x, const TensorView& w, const std::optional<TensorView>& b,
                      const TensorView& target, const LinearCrossEntropyOptions& o) {
  check_2d(x, "x", "(N, H)");
  core::check_floating(x, "x");
  check_2d(w, "weight", "(V, H)");
  core::check_dtype(w, "weight", x.dtype);
  Problem p;
  p.N = x.shape[0];
  p.H = x.shape[1];
  p.V = w.shape[0];
  p.dt = x.dtype;
  if (w.shape[1] != p.H) {
    throw Error(ErrorCode::shape_mismatch, "weight", "(V, " + std::to_string(p.H) + ") to match x's H",
                w.shape_string());
  }
  if (b) {
    core::check_view(*b, "bias");
    core::check_dtype(*b, "bias", x.dtype);
    const std::int64_t want[1] = {p.V};
    core::check_shape(*b, "bias", want, 1);
  }
  core::check_view(target, "target");
  if (!is_integer(target.dtype)) {
    throw Error(ErrorCode::dtype_mismatch, "target", "class indices of an integer dtype",
                std::string(dtype_name(target.dtype)));
  }
  const std::int64_t rows[1] = {p.N};
  core::check_shape(target, "target", rows, 1);
  core::check_reduction(o.ce.reduction);
  if (o.chunk_rows < 0) throw Error(ErrorCode::invalid_value, "chunk_rows", "0 (auto) or > 0", std::to_string(o.chunk_rows));
  if (o.memory_budget <= 0) {
    throw Error(ErrorCode::invalid_value, "memory_budget", "a byte count > 0", std::to_string(o.memory_budget));
  }
  p.pb.class_dim = 1;
  p.pb.classes = p.V;
  p.pb.rows = p.N;
  p.pb.row_shape[0] = p.N;
  p.pb.row_ndim = 1;
  p.pb.acc = accumulate_dtype(p.dt);
  return p;
}

void check_grads(const LinearCrossEntropyGrads& g, const Problem& p, const TensorView& x, const TensorView& w,
                 const std::optional<TensorView>& b, std::vector<NamedView>& written) {
  const DType acc = p.pb.acc;
  if (g.x) {
    core::check_view(*g.x, "grad_x");
    core::check_dtype(*g.x, "grad_x", x.dtype);
    core::check_shape(*g.x, "grad_x", x.shape.data(), 2);
    written.push_back({"grad_x", &*g.x});
  }
  if (g.w) {
    core::check_view(*g.w, "grad_weight");
    if (g.w->dtype != acc) core::check_dtype(*g.w, "grad_weight", w.dtype);
    core::check_shape(*g.w, "grad_weight", w.shape.data(), 2);
    written.push_back({"grad_weight", &*g.w});
  }
  if (g.b) {
    if (!b) throw Error(ErrorCode::invalid_value, "grad_bias", "absent when there is no bias", "a tensor");
    core::check_view(*g.b, "grad_bias");
    if (g.b->dtype != acc) core::check_dtype(*g.b, "grad_bias", b->dtype);
    core::check_shape(*g.b, "grad_bias", b->shape.data(), 1);
    written.push_back({"grad_bias", &*g.b});
  }
}

std::int64_t chunk_rows(const LinearCrossEntropyOptions& o, const Problem& p) {
  if (p.N == 0) return 1;
  std::int64_t r = o.chunk_rows;
  if (r == 0) {
    const std::int64_t row_bytes = std::max<std::int64_t>(p.V, 1) * static_cast<std::int64_t>(dtype_size(p.pb.acc));
    r = o.memory_budget / row_bytes;
  }
  return std::clamp<std::int64_t>(r, 1, p.N);
}

template <class T>
std::unique_ptr<T[]> uninit(std::int64_t n) {
  return std::unique_ptr<T[]>(new T[static_cast<std::size_t>(std::max<std::int64_t>(n, 1))]);
}

TensorView sub_rows(const TensorView& t, std::int64_t r0, std::int64_t rows) {
  TensorView v = t;
  v.shape[0] = rows;
  if (rows > 0) v.data = static_cast<char*>(t.data) + r0 * t.strides[0] * static_cast<std::int64_t>(dtype_size(t.dtype));
  return v;
}

// A leading dimension for a GEMM operand: any value serves a single row, but GEMMs want one >= the row length.
std::int64_t ld(std::int64_t stride, std::int64_t rows, std::int64_t cols) {
  return rows <= 1 ? std::max(stride, cols) : stride;
}

void gemm_or_throw(GemmCall c) {
  c.lda = ld(c.lda, c.trans_a ? c.k : c.m, c.trans_a ? c.m : c.k);
  c.ldb = ld(c.ldb, c.trans_b ? c.n : c.k, c.trans_b ? c.k : c.n);
  if (!run_gemm(c)) {
    throw Error(ErrorCode::not_implemented, "gemm", "a GEMM for " + std::string(dtype_name(c.ab_dtype)) + " operands",
                "a hook that declined the call");
  }
}

// A value in the accumulation type of storage type T (float64 values only meet double storage).
template <class T>
typename cpu::Io<T>::Acc narrow(double v) {
  return static_cast<typename cpu::Io<T>::Acc>(v);
}

// The storage type of a float dtype, for the element loops (bias, conversions).
template <class F>
void with_storage(DType t, F&& f) {
  cpu::visit_float_dtype(t, std::forward<F>(f));
}

template <class Acc>
class Runner {
 public:
  Runner(const Problem& p, const TensorView& x, const TensorView& w, const std::optional<TensorView>& b,
         const TensorView& target, const LinearCrossEntropyOptions& o, const LinearCrossEntropyGrads& g)
      : p_(p), x_(x), w_(w), b_(b), target_(target), o_(o), g_(g), R_(chunk_rows(o, p)) {
    ce_ = o.ce;
    ce_.reduction = Reduction::none;
    logits_ = uninit<Acc>(R_ * p.V);
    wants_grads_ = g.x || g.w || g.b;
    if (!wants_grads_) return;
    if (p.dt != p.pb.acc) g16_ = uninit<std::uint16_t>(R_ * p.V);
    if (g.x && !(g.x->dtype == p.pb.acc && g.x->strides[1] == 1)) dx_ = uninit<Acc>(R_ * p.H);
    if (g.w && !(g.w->dtype == p.pb.acc && g.w->strides[1] == 1)) dw_ = uninit<Acc>(p.V * p.H);
    if (g.b) db_.assign(static_cast<std::size_t>(p.V), 0.0);
  }

  // Per chunk: logits -> cross-entropy (forward, forward+backward or backward) -> dx, dW, db.
  // scale[r]: the upstream gradient of row r's loss term (grads only). lse_in: saved lse (backward only).
  void run(Acc* loss_rows, Acc* lse_rows, Acc* z_rows, const Acc* scale, bool backward) {
    for (std::int64_t r0 = 0; r0 < p_.N; r0 += R_) {
      const std::int64_t rc = std::min(R_, p_.N - r0);
      make_logits(r0, rc);
      const TensorView logits = TensorView::contiguous(logits_.get(), p_.pb.acc, {rc, p_.V});
      const TensorView tgt = sub_rows(target_, r0, rc);
      const TensorView lse = TensorView::contiguous(lse_rows + r0, p_.pb.acc, {rc});
      if (backward) {
        const TensorView gl = TensorView::contiguous(const_cast<Acc*>(scale + r0), p_.pb.acc, {rc});
        cross_entropy_backward(logits, tgt, lse, gl, ce_, logits, GradWrite::in_place);
      } else {
        const CrossEntropyOutputs out{TensorView::contiguous(loss_rows + r0, p_.pb.acc, {rc}), lse,
                                      TensorView::contiguous(z_rows + r0, p_.pb.acc, {rc})};
        if (wants_grads_) {
          const TensorView gl = TensorView::contiguous(const_cast<Acc*>(scale + r0), p_.pb.acc, {rc});
          cross_entropy_forward_backward(logits, tgt, ce_, out, gl, logits, GradWrite::in_place);
        } else {
          cross_entropy_forward(logits, tgt, ce_, out);
        }
      }
      if (wants_grads_) accumulate_grads(r0, rc, r0 == 0);
    }
    if (wants_grads_) finish_grads();
  }

 private:
  void make_logits(std::int64_t r0, std::int64_t rc) {
    GemmCall c;
    c.ab_dtype = p_.dt;
    c.trans_b = true;
    c.m = rc;
    c.n = p_.V;
    c.k = p_.H;
    c.a = sub_rows(x_, r0, rc).data;
    c.lda = x_.strides[0];
    c.b = w_.data;
    c.ldb = w_.strides[0];
    c.c = logits_.get();
    c.ldc = p_.V;
    if (p_.H == 0) {
      std::fill(logits_.get(), logits_.get() + rc * p_.V, Acc(0));
    } else {
      gemm_or_throw(c);
    }
    if (!b_) return;
    with_storage(b_->dtype, [&](auto t) {
      using T = decltype(t);
      const T* bp = static_cast<const T*>(b_->data);
      const std::int64_t bs = b_->strides[0];
      std::vector<Acc> bias(static_cast<std::size_t>(p_.V));
      for (std::int64_t v = 0; v < p_.V; ++v) bias[v] = static_cast<Acc>(cpu::Io<T>::load(bp, v * bs));
      Acc* L = logits_.get();
      parallel_for(0, rc, 1, [&](std::int64_t i0, std::int64_t i1) {
        for (std::int64_t i = i0; i < i1; ++i) {
          Acc* row = L + i * p_.V;
          for (std::int64_t v = 0; v < p_.V; ++v) row[v] += bias[v];
        }
      });
    });
  }

  // The logits buffer now holds d loss / d logits for rows [r0, r0 + rc).
  void accumulate_grads(std::int64_t r0, std::int64_t rc, bool first) {
    const Acc* G = logits_.get();
    const std::int64_t V = p_.V, H = p_.H;
    if (g_.b) {
      parallel_for(0, V, 256, [&](std::int64_t v0, std::int64_t v1) {
        for (std::int64_t i = 0; i < rc; ++i) {
          for (std::int64_t v = v0; v < v1; ++v) db_[v] += static_cast<double>(G[i * V + v]);
        }
      });
    }
    if (g_.w) dw_written_ = true;
    if (!(g_.x || g_.w) || H == 0) return;  // nothing to multiply (x and W have no columns)
    // The GEMM operand: the gradient itself, or rounded once to the inputs' 16-bit type.
    const void* ga = G;
    if (g16_) {
      std::uint16_t* out = g16_.get();
      parallel_for(0, rc, 1, [&](std::int64_t i0, std::int64_t i1) {
        for (std::int64_t i = i0 * V; i < i1 * V; ++i) {
          out[i] = p_.dt == DType::bf16 ? math::float_to_bf16(static_cast<float>(G[i]))
                                        : math::float_to_f16(static_cast<float>(G[i]));
        }
      });
      ga = out;
    }
    if (g_.x) {  // dx rows = G (rc x V) @ W (V x H)
      GemmCall c;
      c.ab_dtype = p_.dt;
      c.m = rc;
      c.n = H;
      c.k = V;
      c.a = ga;
      c.lda = V;
      c.b = w_.data;
      c.ldb = w_.strides[0];
      const TensorView dx = sub_rows(*g_.x, r0, rc);
      c.c = dx_ ? static_cast<void*>(dx_.get()) : dx.data;
      c.ldc = dx_ ? H : g_.x->strides[0];
      if (V == 0) {
        zero_rows(dx, rc);
      } else if (rc > 0 && H > 0) {
        gemm_or_throw(c);
        if (dx_) store_rows(dx_.get(), dx, rc, H);
      }
    }
    if (g_.w && rc > 0) {  // dW (V x H) += G^T (V x rc) @ x rows (rc x H)
      GemmCall c;
      c.ab_dtype = p_.dt;
      c.trans_a = true;
      c.m = V;
      c.n = H;
      c.k = rc;
      c.a = ga;
      c.lda = V;
      c.b = sub_rows(x_, r0, rc).data;
      c.ldb = x_.strides[0];
      c.c = dw_ ? static_cast<void*>(dw_.get()) : g_.w->data;
      c.ldc = dw_ ? H : g_.w->strides[0];
      c.beta = first ? 0.0 : 1.0;
      if (V > 0) gemm_or_throw(c);
    }
  }

  void finish_grads() {
    const std::int64_t V = p_.V, H = p_.H;
    if (g_.w) {
      if (!dw_written_) {
        zero_rows(*g_.w, V);  // no rows at all
      } else if (dw_) {
        store_rows(dw_.get(), *g_.w, V, H);
      }
    }
    if (g_.b) {
      with_storage(g_.b->dtype, [&](auto t) {
        using T = decltype(t);
        T* out = static_cast<T*>(g_.b->data);
        for (std::int64_t v = 0; v < V; ++v) cpu::Io<T>::store(out, v * g_.b->strides[0], narrow<T>(db_[v]));
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
            cpu::Io<T>::store(out, i * dst.strides[0] + j * dst.strides[1], narrow<T>(src[i * cols + j]));
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
        for (std::int64_t j = 0; j < dst.shape[1]; ++j) cpu::Io<T>::store(out, i * dst.strides[0] + j * dst.strides[1], narrow<T>(0.0));
      }
    });
  }

  const Problem& p_;
  const TensorView& x_;
  const TensorView& w_;
  const std::optional<TensorView>& b_;
  const TensorView& target_;
  const LinearCrossEntropyOptions& o_;
  const LinearCrossEntropyGrads& g_;
  const std::int64_t R_;
  CrossEntropyOptions ce_;
  bool wants_grads_ = false;
  bool dw_written_ = false;
  std::unique_ptr<Acc[]> logits_;
  std::unique_ptr<std::uint16_t[]> g16_;
  std::unique_ptr<Acc[]> dx_, dw_;
  std::vector<double> db_;
};

// The 'mean' denominator (sum of w_y over non-ignored rows) after checking every target.
template <class Acc>
double scan(const Problem& p, const TensorView& target, const LinearCrossEntropyOptions& o, std::vector<Acc>& wts) {
  wts = core::load_weights<Acc>(o.ce.weight, p.V);
  core::RowIndex idx;
  core::set_row_view(idx, 0, target, -1);
  return core::scan_targets<Acc>(target.data, target.dtype, idx, 0, p.N, p.V, o.ce.ignore_index,
                                 wts.empty() ? nullptr : wts.data());
}

template <class Acc>
void write_reduced(const TensorView& out, const std::vector<Acc>& rows, Reduction r, double denominator) {
  Acc* dst = static_cast<Acc*>(out.data);
  if (r == Reduction::none) {
    std::copy(rows.begin(), rows.end(), dst);
    return;
  }
  double s = 0;
  for (const Acc v : rows) s += static_cast<double>(v);
  *dst = static_cast<Acc>(r == Reduction::sum ? s : s / denominator);
}

template <class Acc>
void forward(const Problem& p, const TensorView& x, const TensorView& w, const std::optional<TensorView>& b,
             const TensorView& target, const LinearCrossEntropyOptions& o, const CrossEntropyOutputs& out,
             const LinearCrossEntropyGrads& g) {
  std::vector<Acc> wts;
  const double denom = scan<Acc>(p, target, o, wts);
  std::vector<Acc> loss(static_cast<std::size_t>(p.N)), lse(loss.size()), zl(loss.size());
  // Upstream gradient 1 on the reduced loss: each row's term carries 1 (none, sum) or 1 / denominator (mean);
  // with no non-ignored row every row is ignored, and its gradient is 0 whatever the scale.
  const Acc s = o.ce.reduction == Reduction::mean ? (denom != 0 ? static_cast<Acc>(1.0 / denom) : Acc(0)) : Acc(1);
  std::vector<Acc> scale(loss.size(), s);
  Runner<Acc>(p, x, w, b, target, o, g).run(loss.data(), lse.data(), zl.data(), scale.data(), false);
  write_reduced(out.loss, loss, o.ce.reduction, denom);
  if (out.lse) std::copy(lse.begin(), lse.end(), static_cast<Acc*>(out.lse->data));
  if (out.z_loss) write_reduced(*out.z_loss, zl, o.ce.reduction, denom);
}

template <class Acc>
void backward(const Problem& p, const TensorView& x, const TensorView& w, const std::optional<TensorView>& b,
              const TensorView& target, const TensorView& lse_in, const std::optional<TensorView>& grad_loss,
              const LinearCrossEntropyOptions& o, const LinearCrossEntropyGrads& g) {
  std::vector<Acc> wts;
  const double denom = scan<Acc>(p, target, o, wts);
  std::vector<Acc> lse(static_cast<std::size_t>(p.N)), scale(lse.size());
  for (std::int64_t r = 0; r < p.N; ++r) lse[r] = static_cast<const Acc*>(lse_in.data)[r * lse_in.strides[0]];
  const Acc* gl = grad_loss ? static_cast<const Acc*>(grad_loss->data) : nullptr;
  if (o.ce.reduction == Reduction::none) {
    for (std::int64_t r = 0; r < p.N; ++r) scale[r] = gl ? gl[r * grad_loss->strides[0]] : Acc(1);
  } else {
    const double g0 = gl ? static_cast<double>(*gl) : 1.0;
    const double s = o.ce.reduction == Reduction::mean ? (denom != 0 ? g0 / denom : 0.0) : g0;
    std::fill(scale.begin(), scale.end(), static_cast<Acc>(s));
  }
  Runner<Acc>(p, x, w, b, target, o, g).run(nullptr, lse.data(), nullptr, scale.data(), true);
}

}  // namespace

void linear_cross_entropy_forward(const TensorView& x, const TensorView& w, const std::optional<TensorView>& b,
                                  const TensorView& target, const LinearCrossEntropyOptions& options,
                                  const CrossEntropyOutputs& out, const LinearCrossEntropyGrads& grads) {
  const Problem p = check_problem(x, w, b, target, options);
  std::vector<NamedView> written, read = {{"x", &x}, {"weight", &w}, {"target", &target}};
  if (b) read.push_back({"bias", &*b});
  if (options.ce.weight) read.push_back({"class_weight", &*options.ce.weight});
  core::check_view(out.loss, "loss");
  core::check_dtype(out.loss, "loss", p.pb.acc);
  core::check_reduced_shape(out.loss, "loss", options.ce.reduction, p.pb.row_shape, 1);
  core::check_contiguous(out.loss, "loss");
  written.push_back({"loss", &out.loss});
  if (out.lse) {
    core::check_row_output(*out.lse, "lse", p.pb);
    written.push_back({"lse", &*out.lse});
  }
  if (out.z_loss) {
    core::check_view(*out.z_loss, "z_loss");
    core::check_dtype(*out.z_loss, "z_loss", p.pb.acc);
    core::check_reduced_shape(*out.z_loss, "z_loss", options.ce.reduction, p.pb.row_shape, 1);
    core::check_contiguous(*out.z_loss, "z_loss");
    written.push_back({"z_loss", &*out.z_loss});
  }
  check_grads(grads, p, x, w, b, written);
  core::check_disjoint(written, read);
  if (p.pb.acc == DType::f64) {
    forward<double>(p, x, w, b, target, options, out, grads);
  } else {
    forward<float>(p, x, w, b, target, options, out, grads);
  }
}

void linear_cross_entropy_backward(const TensorView& x, const TensorView& w, const std::optional<TensorView>& b,
                                   const TensorView& target, const TensorView& lse,
                                   const std::optional<TensorView>& grad_loss, const LinearCrossEntropyOptions& options,
                                   const LinearCrossEntropyGrads& grads) {
  const Problem p = check_problem(x, w, b, target, options);
  std::vector<NamedView> written, read = {{"x", &x}, {"weight", &w}, {"target", &target}, {"lse", &lse}};
  if (b) read.push_back({"bias", &*b});
  if (options.ce.weight) read.push_back({"class_weight", &*options.ce.weight});
  core::check_view(lse, "lse");
  core::check_dtype(lse, "lse", p.pb.acc);
  core::check_shape(lse, "lse", p.pb.row_shape, 1);
  core::check_grad_loss(grad_loss, p.pb, options.ce.reduction);
  if (grad_loss) read.push_back({"grad_loss", &*grad_loss});
  check_grads(grads, p, x, w, b, written);
  core::check_disjoint(written, read);
  if (p.pb.acc == DType::f64) {
    backward<double>(p, x, w, b, target, lse, grad_loss, options, grads);
  } else {
    backward<float>(p, x, w, b, target, lse, grad_loss, options, grads);
  }
}

}  // namespace lossfuse
