// lossfuse's CUDA emulator (tests/emu/): the cuBLAS calls src/cuda/linear_cross_entropy.cu makes, served by the
// emulator's library (liblfemu.so, which that file opens as it would libcublas): a plain loop nest over column-major
// operands, float32 accumulation (float64 for CUBLAS_COMPUTE_64F), queued on the handle's stream.
#pragma once

#include <cstdint>

#include "cuda_runtime.h"

struct cublasContext;
using cublasHandle_t = cublasContext*;
enum cublasStatus_t {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_NOT_SUPPORTED = 15
};
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cublasMath_t { CUBLAS_DEFAULT_MATH = 0, CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION = 16 };
enum cublasComputeType_t { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_64F = 70 };
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1 };
enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_64F = 1, CUDA_R_16F = 2, CUDA_R_16BF = 14 };
using cudaDataType = cudaDataType_t;

extern "C" {
cublasStatus_t cublasCreate_v2(cublasHandle_t* handle);
cublasStatus_t cublasDestroy_v2(cublasHandle_t handle);
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasGemmEx_64(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                               std::int64_t m, std::int64_t n, std::int64_t k, const void* alpha, const void* A,
                               cudaDataType_t Atype, std::int64_t lda, const void* B, cudaDataType_t Btype,
                               std::int64_t ldb, const void* beta, void* C, cudaDataType_t Ctype, std::int64_t ldc,
                               cublasComputeType_t compute, cublasGemmAlgo_t algo);
const char* cublasGetStatusString(cublasStatus_t status);
}
#define cublasCreate cublasCreate_v2
#define cublasDestroy cublasDestroy_v2
#define cublasSetStream cublasSetStream_v2
