// lossfuse math: the annotation that lets one function serve the CPU and CUDA backends.
#pragma once

#if defined(__CUDACC__)
#define LF_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define LF_HOST_DEVICE inline
#endif

// A loss formula (src/math/pointwise_losses.inc): always inlined into its kernel, so that what a caller drops (a
// gradient it was not asked for: bce's two logs for the target's) is never computed.
#if defined(__CUDACC__)
#define LF_FORMULA __host__ __device__ __forceinline__
#elif defined(__GNUC__)
#define LF_FORMULA inline __attribute__((always_inline))
#else
#define LF_FORMULA inline
#endif
