// lossfuse math: the annotation that lets one function serve the CPU and CUDA backends.
#pragma once

#if defined(__CUDACC__)
#define LF_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define LF_HOST_DEVICE inline
#endif
