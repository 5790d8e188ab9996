// The CUDA runner of the fused linear cross-entropy (src/core/linear_cross_entropy_params.hpp): the CPU runner's
// chunk-major way on the device, as one device call (LceParams::device_call). First the class weights and the scan of
// every target (CeDeviceRows); an eager call reads back its first bad target there, before anything is written, and
// synchronises nowhere else. Per chunk of rows: the logits (rc x V, Acc) made by one cuBLAS GEMM (plus the bias),
// reduced and turned into their gradient in place by the cross-entropy row kernel, rounded once to 16 bits for 16-bit
// inputs, then multiplied into the chunk's dx rows (one GEMM, written) and into dW (float32 accumulation over the
// chunks: beta 1 after the first); db sums the gradient's columns in double, in row order; 'mean' / 'sum' are summed
// on the device in a fixed tree. No floating-point atomics: the same bits on every run on one stream (cuBLAS's
// reproducibility guarantee for a given GPU and library); capturable in a CUDA graph, where a bad target's row is
// NaN. Vocabulary tiles are not served here (refused before anything is written). cuBLAS is loaded at first use
// (dlopen), so the library links nothing beyond the CUDA runtime.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "core/linear_cross_entropy_params.hpp"
#include "cuda/kernels.hpp"
#include "cuda/runtime.hpp"
#include "lossfuse/error.hpp"
#include "math/storage.hpp"

#ifndef LOSSFUSE_CUBLAS_SONAME
#define LOSSFUSE_CUBLAS_SONAME "libcublas.so.13"
#endif
#ifndef LOSSFUSE_CUBLAS_DIR
#define LOSSFUSE_CUBLAS_DIR "/usr/local/cuda/lib64"
#endif

namespace lossfuse::cuda {
namespace {

using std::int64_t;

// ---- cuBLAS, loaded at first use -------------------------------------------------------------------------------

struct Cublas {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasGemmEx_64) gemm = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
};

// The process's cuBLAS (the one torch loaded, when it did: same soname), else the toolkit's this build found.
Cublas load_cublas() {
  void* lib = nullptr;
  std::string why;
  for (const std::string& name :
       {std::string(LOSSFUSE_CUBLAS_SONAME), std::string(LOSSFUSE_CUBLAS_DIR) + "/" + LOSSFUSE_CUBLAS_SONAME}) {
    lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib != nullptr) break;
    const char* e = dlerror();
    why += (why.empty() ? "" : "; ") + std::string(e != nullptr ? e : name);
  }
  if (lib == nullptr) {
    throw Error(ErrorCode::device_error, "cublas",
                std::string(LOSSFUSE_CUBLAS_SONAME) + " loadable (the fused linear loss's GEMMs on cuda)", why);
  }
  auto sym = [&](const char* name) {
    void* f = dlsym(lib, name);
    if (f == nullptr) {
      dlclose(lib);
      throw Error(ErrorCode::device_error, "cublas", std::string(name) + " in " + LOSSFUSE_CUBLAS_SONAME, "absent");
    }
    return f;
  };
  Cublas c;
  c.create = reinterpret_cast<decltype(c.create)>(sym("cublasCreate_v2"));
  c.set_math_mode = reinterpret_cast<decltype(c.set_math_mode)>(sym("cublasSetMathMode"));
  c.set_stream = reinterpret_cast<decltype(c.set_stream)>(sym("cublasSetStream_v2"));
  c.gemm = reinterpret_cast<decltype(c.gemm)>(sym("cublasGemmEx_64"));
  c.status_string = reinterpret_cast<decltype(c.status_string)>(sym("cublasGetStatusString"));
  return c;
}

const Cublas& cublas() {
  static const Cublas api = load_cublas();  // a failed load throws, and is tried again by the next call
  return api;
}

void blas_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    throw Error(ErrorCode::device_error, what, "CUBLAS_STATUS_SUCCESS", cublas().status_string(s));
  }
}

// The calling thread's handle on the current device, on the calling thread's stream. Handles are kept for the
// thread's life and never destroyed: one destroyed at exit, after the CUDA context's teardown, would fault. Their
// reductions stay in the compute type (float32), never the output's 16 bits: a split-K dx is rounded once.
cublasHandle_t handle() {
  thread_local std::vector<cublasHandle_t> handles;
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  if (static_cast<std::size_t>(dev) >= handles.size()) handles.resize(static_cast<std::size_t>(dev) + 1, nullptr);
  cublasHandle_t& h = handles[static_cast<std::size_t>(dev)];
  if (h == nullptr) {
    const RelaxedCapture relaxed;  // the first call may come during a stream capture (a CUDA graph)
    cublasHandle_t made = nullptr;
    blas_check(cublas().create(&made), "cublasCreate");
    h = made;
    blas_check(cublas().set_math_mode(h, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                                                   CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
               "cublasSetMathMode");
  }
  blas_check(cublas().set_stream(h, stream()), "cublasSetStream");
  return h;
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f64: return CUDA_R_64F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: return CUDA_R_32F;
  }
}

// A row-major operand: `rows` x `cols` at leading dimension ld (elements), transposed in the product when trans.
struct Operand2d {
  const void* data;
  int64_t ld;
  bool trans;
};

// C (m x n, row-major, leading dimension ldc, dtype c) = op(A) op(B), or += when accumulate; A and B of dtype ab,
// op(A) m x k. Float32 accumulation (float64 for float64), as lossfuse::GemmCall; no TF32 (cuBLAS's default math).
// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the operands go to cuBLAS swapped.
void gemm(DType ab, DType c, const Operand2d& a, const Operand2d& b, void* cdata, int64_t ldc, int64_t m, int64_t n,
          int64_t k, bool accumulate) {
  const bool f64 = ab == DType::f64;
  const double one_d = 1.0, beta_d = accumulate ? 1.0 : 0.0;
  const float one_f = 1.0f, beta_f = accumulate ? 1.0f : 0.0f;
  const void* alpha = f64 ? static_cast<const void*>(&one_d) : &one_f;
  const void* beta = f64 ? static_cast<const void*>(&beta_d) : &beta_f;
  blas_check(cublas().gemm(handle(), b.trans ? CUBLAS_OP_T : CUBLAS_OP_N, a.trans ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k,
                           alpha, b.data, cuda_type(ab), b.ld, a.data, cuda_type(ab), a.ld, beta, cdata, cuda_type(c),
                           ldc, f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             "cublasGemmEx");
}

// A cuBLAS leading dimension for a 2-D view of unit stride along its columns: its row stride, or at least the
// column count where any stride serves (one row, no column; cuBLAS wants one >= cols, and >= 1); -1 when cuBLAS
// cannot take the view (rows closer than their length).
int64_t leading_dim(const TensorView& t) {
  const int64_t rows = t.shape[0], cols = t.shape[1];
  if (rows <= 1 || cols == 0) return std::max<int64_t>({t.strides[0], cols, 1});
  return t.strides[0] >= cols ? t.strides[0] : -1;
}

// ---- element kernels -------------------------------------------------------------------------------------------

constexpr int kThreads = 256;
unsigned grid_for(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 1 << 16));
}

#define LF_GRID_STRIDE(e, n)                                                             \
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < (n); \
       e += int64_t{gridDim.x} * blockDim.x)

// L[i V + v] += b[v bs] over rows x V Acc logits.
template <class Acc, class B>
__global__ void add_bias_kernel(Acc* L, int64_t n, int64_t V, const B* b, int64_t bs) {
  LF_GRID_STRIDE(e, n) { L[e] += static_cast<Acc>(math::Io<B>::load(b, (e % V) * bs)); }
}

// dst[e] = src[e] rounded once to the 16-bit type H (round to nearest even).
template <class H>
__global__ void round16_kernel(const float* src, H* dst, int64_t n) {
  LF_GRID_STRIDE(e, n) { math::Io<H>::store(dst, e, src[e]); }
}

// db[v] += the sum over rows of G[i V + v], in double, row by row (a fixed order).
template <class Acc>
__global__ void column_sums_kernel(const Acc* G, int64_t rows, int64_t V, double* db) {
  LF_GRID_STRIDE(v, V) {
    double s = db[v];
    for (int64_t i = 0; i < rows; ++i) s += static_cast<double>(G[i * V + v]);
    db[v] = s;
  }
}

// dst[i s0 + j s1] = src[i cols + j] (dense rows x cols), or 0 when src is nullptr, rounded once to T.
template <class S, class T>
__global__ void store_kernel(const S* src, int64_t rows, int64_t cols, T* dst, int64_t s0, int64_t s1) {
  LF_GRID_STRIDE(e, rows * cols) {
    const int64_t i = e / cols, j = e % cols;
    math::Io<T>::store(dst, i * s0 + j * s1, static_cast<math::AccOf<T>>(src != nullptr ? src[e] : S(0)));
  }
}

// dst[e] = src[e stride] in double.
template <class S>
__global__ void gather_kernel(const S* src, int64_t n, int64_t stride, double* dst) {
  LF_GRID_STRIDE(e, n) { dst[e] = static_cast<double>(src[e * stride]); }
}

#undef LF_GRID_STRIDE

void check_launch(const char* what) { check(cudaGetLastError(), what); }

// Stores a dense rows x cols block of S (nullptr: zeros) into the 2-D view dst of any float dtype.
template <class S>
void store_2d(const S* src, int64_t rows, int64_t cols, const TensorView& dst, int64_t s0, int64_t s1) {
  if (rows * cols == 0) return;
  math::visit_float_dtype(dst.dtype, [&](auto t) {
    using T = decltype(t);
    store_kernel<S, T>
        <<<grid_for(rows * cols), kThreads, 0, stream()>>>(src, rows, cols, static_cast<T*>(dst.data), s0, s1);
  });
  check_launch("store_kernel");
}

const char* at_rows(const TensorView& t, int64_t r0) {
  return static_cast<const char*>(t.data) + r0 * t.strides[0] * static_cast<int64_t>(dtype_size(t.dtype));
}

// The saved lse as the chunks' kernel reads it: the caller's, or gathered into `buf` in double when buf has room (a
// strided lse: lse_gathered).
bool lse_gathered(const TensorView& lse) { return lse.shape[0] > 1 && lse.strides[0] != 1; }
template <class Acc>
const void* lse_for_kernel(const TensorView& lse, const Scratch<double>& buf, bool& f64) {
  const int64_t n = lse.shape[0];
  f64 = lse.dtype == DType::f64;
  if (buf.get() == nullptr) return lse.data;
  f64 = true;
  if (lse.dtype == DType::f64) {
    gather_kernel<<<grid_for(n), kThreads, 0, stream()>>>(static_cast<const double*>(lse.data), n, lse.strides[0],
                                                          buf.get());
  } else {
    gather_kernel<<<grid_for(n), kThreads, 0, stream()>>>(static_cast<const Acc*>(lse.data), n, lse.strides[0],
                                                          buf.get());
  }
  check_launch("gather_kernel");
  return buf.get();
}

// Acc element i of a contiguous Acc output, or nullptr.
template <class Acc>
Acc* at_row(const std::optional<TensorView>& t, int64_t i) {
  return t ? static_cast<Acc*>(t->data) + i : nullptr;
}

template <class Acc>
void run(const core::LceParams& lp) {
  const core::LceProblem& P = lp.problem;
  const LinearCrossEntropyOptions& o = *lp.options;
  const LinearCrossEntropyGrads& g = *lp.grads;
  const TensorView &x = *lp.x, &w = *lp.w;
  const CrossEntropyOutputs* out = lp.out;
  if (P.tiled) {
    throw Error(ErrorCode::not_implemented, "vocab_tile", "0 on cuda (vocabulary tiles run on the cpu)",
                std::to_string(o.vocab_tile));
  }
  const int64_t ldx = leading_dim(x), ldw = leading_dim(w);
  if (ldx < 0 || ldw < 0) {
    const bool bad_x = ldx < 0;
    throw Error(ErrorCode::not_implemented, bad_x ? "x" : "weight",
                "rows at a stride of at least H on cuda (a cuBLAS leading dimension)",
                "stride " + std::to_string((bad_x ? x : w).strides[0]));
  }
  const auto data = [](const auto& t) -> const void* { return t ? t->data : nullptr; };
  const DeviceScope scope({{x.data, "x"},
                           {w.data, "weight"},
                           {lp.b != nullptr ? lp.b->data : nullptr, "bias"},
                           {lp.target->data, "target"},
                           {data(o.ce.weight), "class_weight"},
                           {out != nullptr ? out->loss.data : nullptr, "loss"},
                           {out != nullptr ? data(out->lse) : nullptr, "lse"},
                           {out != nullptr ? data(out->z_loss) : nullptr, "z_loss"},
                           {lp.lse_in != nullptr ? lp.lse_in->data : nullptr, "lse"},
                           {lp.grad_loss != nullptr ? lp.grad_loss->data : nullptr, "grad_loss"},
                           {lp.device_call->grad_scalar, "grad_loss"},
                           {data(g.x), "grad_x"},
                           {data(g.w), "grad_weight"},
                           {data(g.b), "grad_bias"}});
  const int64_t N = P.N, H = P.H, V = P.V, R = lp.chunk_rows;
  const DType acc = P.pb.acc, dt = P.dt;
  const bool grads = g.x || g.w || g.b, products = (g.x || g.w) && H > 0;
  const core::CeMode mode = lp.backward ? core::CeMode::backward
                            : grads     ? core::CeMode::forward_backward
                                        : core::CeMode::forward;
  // The class weights and the targets' scan first: an eager call reads back its first bad target (the one
  // synchronisation) before anything is written; a backward asked for no gradient still checks them, as the CPU's.
  CeDeviceRows ce(core::lce_chunk_params(lp, mode, 0, N, nullptr, nullptr));
  if (!ce.check() || (lp.backward && !grads)) return;
  // dx rows straight from their GEMM (in x's dtype) where cuBLAS takes the view; dW accumulates in place only in a
  // float32 (float64) grad_weight of unit stride along H.
  const bool dx_direct = g.x && leading_dim(*g.x) >= 0 && (H <= 1 || g.x->strides[1] == 1);
  const bool dw_direct = g.w && g.w->dtype == acc && leading_dim(*g.w) >= 0 && (H <= 1 || g.w->strides[1] == 1);

  const auto n = [](int64_t v) { return static_cast<std::size_t>(v); };
  const Scratch<Acc> logits(n(R * V));
  const Scratch<std::uint16_t> g16(products && dt != acc ? n(R * V) : 0);
  const Scratch<Acc> dw_acc(g.w && !dw_direct ? n(V * H) : 0);
  const Scratch<Acc> dx_buf(g.x && !dx_direct ? n(R * H) : 0);
  const Scratch<double> db(g.b ? n(V) : 0);
  const Scratch<double> lse_buf(lp.backward && lse_gathered(*lp.lse_in) ? n(N) : 0);
  bool lse_f64 = out != nullptr && out->lse && out->lse->dtype == DType::f64;
  const void* lse_in = lp.backward ? lse_for_kernel<Acc>(*lp.lse_in, lse_buf, lse_f64) : nullptr;
  const bool rows_out = out != nullptr && o.ce.reduction == Reduction::none;  // 'none': the loss rows themselves
  if (g.b) check(cudaMemsetAsync(db.get(), 0, n(V) * sizeof(double), stream()), "cudaMemsetAsync (db)");

  void* dw = dw_direct ? g.w->data : dw_acc.get();
  const int64_t ld_dw = dw_direct ? leading_dim(*g.w) : H;
  bool dw_started = false;
  for (int64_t r0 = 0; r0 < N; r0 += R) {
    const int64_t rc = std::min(R, N - r0);
    if (H == 0) {
      check(cudaMemsetAsync(logits.get(), 0, n(rc * V) * sizeof(Acc), stream()), "cudaMemsetAsync (logits)");
    } else {  // logits (rc x V) = x rows (rc x H) W^T
      gemm(dt, acc, {at_rows(x, r0), ldx, false}, {w.data, ldw, true}, logits.get(), V, rc, V, H, false);
    }
    if (lp.b != nullptr) {
      math::visit_float_dtype(lp.b->dtype, [&](auto t) {
        using B = decltype(t);
        add_bias_kernel<Acc, B><<<grid_for(rc * V), kThreads, 0, stream()>>>(
            logits.get(), rc * V, V, static_cast<const B*>(lp.b->data), lp.b->strides[0]);
      });
      check_launch("add_bias_kernel");
    }
    core::CeParams cp = core::lce_chunk_params(lp, mode, r0, rc, logits.get(), nullptr);
    cp.lse_f64 = lse_f64;
    const std::size_t lse_bytes = lse_f64 ? sizeof(double) : sizeof(Acc);
    if (lp.backward) {
      cp.lse_in = static_cast<const char*>(lse_in) + n(r0) * lse_bytes;
    } else {
      if (out->lse) cp.lse_rows = static_cast<char*>(out->lse->data) + n(r0) * lse_bytes;
      if (rows_out) {
        cp.loss_rows = static_cast<Acc*>(out->loss.data) + r0;
        cp.zloss_rows = at_row<Acc>(out->z_loss, r0);
      }
    }
    ce.rows(cp, r0);  // the gradient over the logits when `mode` has one
    if (!grads) continue;
    if (g.b) {
      column_sums_kernel<Acc><<<grid_for(V), kThreads, 0, stream()>>>(logits.get(), rc, V, db.get());
      check_launch("column_sums_kernel");
    }
    if (!products) continue;
    const void* G = logits.get();  // the GEMMs' operand: the gradient, or rounded once to the inputs' 16 bits
    if constexpr (std::is_same_v<Acc, float>) {
      if (g16.get() != nullptr) {
        if (dt == DType::bf16) {
          round16_kernel<<<grid_for(rc * V), kThreads, 0, stream()>>>(logits.get(),
                                                                      reinterpret_cast<math::Bf16*>(g16.get()), rc * V);
        } else {
          round16_kernel<<<grid_for(rc * V), kThreads, 0, stream()>>>(logits.get(),
                                                                      reinterpret_cast<math::F16*>(g16.get()), rc * V);
        }
        check_launch("round16_kernel");
        G = g16.get();
      }
    }
    if (g.x) {  // dx rows (rc x H) = G (rc x V) W (V x H)
      if (dx_direct) {
        gemm(dt, g.x->dtype, {G, V, false}, {w.data, ldw, false}, const_cast<char*>(at_rows(*g.x, r0)),
             leading_dim(*g.x), rc, H, V, false);
      } else {
        gemm(dt, acc, {G, V, false}, {w.data, ldw, false}, dx_buf.get(), H, rc, H, V, false);
        TensorView rows = *g.x;
        rows.data = const_cast<char*>(at_rows(*g.x, r0));
        store_2d(dx_buf.get(), rc, H, rows, g.x->strides[0], g.x->strides[1]);
      }
    }
    if (g.w) {  // dW (V x H) (+)= G^T (V x rc) x rows (rc x H)
      gemm(dt, acc, {G, V, true}, {at_rows(x, r0), ldx, false}, dw, ld_dw, V, H, rc, dw_started);
      dw_started = true;
    }
  }
  ce.reduce();  // forward 'mean' / 'sum': the loss and z-loss
  if (g.w && H > 0) {  // no chunk (N = 0): zeros
    if (!dw_started) {
      store_2d<Acc>(nullptr, V, H, *g.w, g.w->strides[0], g.w->strides[1]);
    } else if (!dw_direct) {
      store_2d(dw_acc.get(), V, H, *g.w, g.w->strides[0], g.w->strides[1]);
    }
  }
  if (g.b) store_2d(db.get(), V, 1, *g.b, g.b->strides[0], 0);
}

}  // namespace

void linear_cross_entropy_run(const core::LceParams& p) {
  if (p.scales_held()) {
    std::vector<Operand> operands;
    for (const core::CeParams* h : p.held) {
      if (h != nullptr) operands.insert(operands.end(), {{h->grad, "grad"}, {h->target, "target"}, {h->grad_loss, "grad_loss"}});
    }
    const DeviceScope scope(operands);  // every operand on one device before anything is written
    for (const core::CeParams* h : p.held) {
      if (h != nullptr) cross_entropy_rows(*h);
    }
    return;
  }
  if (p.problem.pb.acc == DType::f64) {
    run<double>(p);
  } else {
    run<float>(p);
  }
}

}  // namespace lossfuse::cuda
