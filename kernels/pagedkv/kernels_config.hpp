// Build-wide switches of the kernel headers. Every kernel header includes this one first.
#pragma once

// Functions that the host reference and the CUDA kernels share (layout arithmetic, params
// accessors) are marked with this, so one definition serves both compilers.
#if defined(__CUDACC__)
#define PAGEDKV_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define PAGEDKV_HOST_DEVICE inline
#endif
