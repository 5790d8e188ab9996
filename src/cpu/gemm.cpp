// The GEMM hook of the fused linear losses and the built-in GEMM: oneDNN's matmul primitive when built with
// LOSSFUSE_ONEDNN (float32 and bfloat16 natively, the others through float32 copies), else a blocked loop nest.
#include "lossfuse/gemm.hpp"

#include <algorithm>
#include <atomic>
#include <utility>
#include <vector>

#include "math/storage.hpp"
#include "lossfuse/parallel.hpp"

#if defined(LOSSFUSE_WITH_ONEDNN)
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace lossfuse {
namespace {

std::atomic<GemmHook> g_hook{nullptr};
std::atomic<void*> g_hook_ctx{nullptr};

// Element (i, j) of op(M) for a row-major M with leading dimension ld.
template <class T>
auto at(const T* m, std::int64_t ld, bool trans, std::int64_t i, std::int64_t j) {
  return math::Io<T>::load(m, trans ? j * ld + i : i * ld + j);
}

// Portable: rows of C over threads, k in blocks so a block of B stays in cache.
template <class T, class Acc>
void loop_gemm(const GemmCall& g) {
  const T* A = static_cast<const T*>(g.a);
  const T* B = static_cast<const T*>(g.b);
  Acc* C = static_cast<Acc*>(g.c);
  parallel_for(0, g.m, 4, [&](std::int64_t i0, std::int64_t i1) {
    std::vector<Acc> row(static_cast<std::size_t>(g.n));
    for (std::int64_t i = i0; i < i1; ++i) {
      std::fill(row.begin(), row.end(), Acc(0));
      for (std::int64_t p = 0; p < g.k; ++p) {
        const Acc a = at(A, g.lda, g.trans_a, i, p);
        if (a == Acc(0)) continue;
        for (std::int64_t j = 0; j < g.n; ++j) row[j] += a * static_cast<Acc>(at(B, g.ldb, g.trans_b, p, j));
      }
      Acc* c = C + i * g.ldc;
      for (std::int64_t j = 0; j < g.n; ++j) {
        const Acc v = static_cast<Acc>(g.alpha) * row[j];
        c[j] = g.beta == 0.0 ? v : v + static_cast<Acc>(g.beta) * c[j];
      }
    }
  });
}

bool loop_gemm_any(const GemmCall& g) {
  switch (g.ab_dtype) {
    case DType::f32: loop_gemm<float, float>(g); return true;
    case DType::f64: loop_gemm<double, double>(g); return true;
    case DType::bf16: loop_gemm<math::Bf16, float>(g); return true;
    case DType::f16: loop_gemm<math::F16, float>(g); return true;
    default: return false;
  }
}

#if defined(LOSSFUSE_WITH_ONEDNN)
dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// oneDNN matmul on the call's own strides; false when oneDNN has no kernel for it (e.g. bfloat16 on a CPU without
// AVX-512) or fails in any way.
bool onednn_gemm(const GemmCall& g, DType ab) {
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  const dt t = ab == DType::bf16 ? dt::bf16 : ab == DType::f16 ? dt::f16 : dt::f32;
  try {
    const dnnl::memory::desc a_md(dims{g.m, g.k}, t, g.trans_a ? dims{1, g.lda} : dims{g.lda, 1});
    const dnnl::memory::desc b_md(dims{g.k, g.n}, t, g.trans_b ? dims{1, g.ldb} : dims{g.ldb, 1});
    const dnnl::memory::desc c_md(dims{g.m, g.n}, dt::f32, dims{g.ldc, 1});
    dnnl::primitive_attr attr;
    if (g.alpha != 1.0) attr.set_output_scales(0, {static_cast<float>(g.alpha)});
    if (g.beta != 0.0) {
      dnnl::post_ops po;
      po.append_sum(static_cast<float>(g.beta));
      attr.set_post_ops(po);
    }
    dnnl::engine& eng = engine();
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr, eng);
    dnnl::memory a(a_md, eng, const_cast<void*>(g.a));
    dnnl::memory b(b_md, eng, const_cast<void*>(g.b));
    dnnl::memory c(c_md, eng, g.c);
    dnnl::stream s(eng);
    dnnl::matmul(pd).execute(s, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    s.wait();
    return true;
  } catch (...) {
    return false;
  }
}

// A 16-bit operand copied to float32 (dense, same layout).
std::vector<float> widen(const void* p, DType t, std::int64_t rows, std::int64_t cols, std::int64_t ld) {
  std::vector<float> out(static_cast<std::size_t>(rows * cols));
  parallel_for(0, rows, 16, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      for (std::int64_t c = 0; c < cols; ++c) {
        out[static_cast<std::size_t>(r * cols + c)] =
            t == DType::bf16 ? math::Io<math::Bf16>::load(static_cast<const math::Bf16*>(p), r * ld + c)
                             : math::Io<math::F16>::load(static_cast<const math::F16*>(p), r * ld + c);
      }
    }
  });
  return out;
}
#endif

}  // namespace

bool builtin_gemm(const GemmCall& g) {
  if (g.m <= 0 || g.n <= 0) return true;
#if defined(LOSSFUSE_WITH_ONEDNN)
  if (g.k > 0 && g.ab_dtype != DType::f64) {
    if (onednn_gemm(g, g.ab_dtype)) return true;
    if (g.ab_dtype == DType::bf16 || g.ab_dtype == DType::f16) {
      // No native 16-bit kernel: multiply float32 copies (memory of both operands in float32).
      const std::int64_t ar = g.trans_a ? g.k : g.m, ac = g.trans_a ? g.m : g.k;
      const std::int64_t br = g.trans_b ? g.n : g.k, bc = g.trans_b ? g.k : g.n;
      const std::vector<float> a = widen(g.a, g.ab_dtype, ar, ac, g.lda);
      const std::vector<float> b = widen(g.b, g.ab_dtype, br, bc, g.ldb);
      GemmCall f = g;
      f.ab_dtype = DType::f32;
      f.a = a.data();
      f.lda = ac;
      f.b = b.data();
      f.ldb = bc;
      if (onednn_gemm(f, DType::f32)) return true;
    }
  }
#endif
  return loop_gemm_any(g);
}

void set_gemm_hook(GemmHook hook, void* ctx) noexcept {
  g_hook_ctx.store(ctx);
  g_hook.store(hook);
}

bool run_gemm(const GemmCall& g) {
  const GemmHook h = g_hook.load();
  return h != nullptr ? h(g, g_hook_ctx.load()) : builtin_gemm(g);
}

}  // namespace lossfuse
