// lossfuse: the matrix-multiply hook the fused linear losses run on.
//
// A GemmCall asks for C = alpha * op(A) op(B) + beta * C with op(A) m x k, op(B) k x n and C m x n, all row-major
// with leading dimensions lda, ldb, ldc (in elements). trans_a: A is stored k x m; trans_b: B is stored n x k.
// A and B share one dtype (float32, float64, bfloat16 or float16); C is float32, or float64 for float64 A and B.
// The built-in GEMM accumulates products in C's dtype; a hook may do otherwise (torch's binding multiplies 16-bit
// operands with torch's matmul in their dtype, then adds the rounded product into C). beta == 0 means C is not read
// (it may hold garbage).
#pragma once

#include <cstdint>

#include "lossfuse/dtype.hpp"

namespace lossfuse {

struct GemmCall {
  DType ab_dtype = DType::f32;
  bool trans_a = false;
  bool trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  std::int64_t lda = 0;
  const void* b = nullptr;
  std::int64_t ldb = 0;
  void* c = nullptr;  // float32, or float64 when ab_dtype is float64
  std::int64_t ldc = 0;
  double alpha = 1.0;
  double beta = 0.0;
};

// A hook runs the call and returns true, or returns false for a call it cannot do (the caller then raises
// ErrorCode::not_implemented). It must not throw. A decline is not an argument error: the products run as the
// computation goes, so a hook that declines a later product (a dW product after the dx ones) leaves the gradients
// computed until then written; the outputs' contents are then unspecified. A hook should decline by the shapes,
// transposes and dtypes it is given, the same for every call of a loss.
using GemmHook = bool (*)(const GemmCall& call, void* ctx);

// Replaces the GEMM the fused linear losses use (a host framework installs its own matmul so that no second BLAS
// is loaded into its process). nullptr restores the built-in one: oneDNN's matmul when lossfuse is built with
// it (LOSSFUSE_ONEDNN), else a portable loop nest (correct, slow: for tests and small problems). Install it
// before any loss runs (it is not meant to change while a call is in flight).
void set_gemm_hook(GemmHook hook, void* ctx = nullptr) noexcept;

// Runs a call on the installed hook (or the built-in GEMM); false when the hook declined.
[[nodiscard]] bool run_gemm(const GemmCall& call);

// The built-in GEMM, usable by a hook that handles only some calls.
[[nodiscard]] bool builtin_gemm(const GemmCall& call);

}  // namespace lossfuse
