// Programmatic dependent launch (Hopper, sm_90): a kernel of the library starts while the grid
// before it in the stream drains, instead of after its end, and waits on the device before it
// reads anything. Every kernel of the library lets its dependents launch early, so a chain of
// them (write_kv, the decode, its split merge, the next layer's write_kv) overlaps each launch
// with the tail of the grid before. The device-side calls are compiled for sm_90 and later only.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "check.cuh"

namespace pagedkv::kernels::cuda {
namespace detail {

/// Lets the grid launched after this one (launch_dependent) start once every CTA got here or
/// exited; it still waits for this grid's end before reading.
__device__ __forceinline__ void let_dependents_launch() {
#if __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();
#endif
}

/// In a grid started by launch_dependent: waits until the grid before it has finished and its
/// writes are visible. Call before the first read of anything that grid may have written.
__device__ __forceinline__ void wait_for_the_grid_before() {
#if __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();
#endif
}

/// Launches `kernel` as a programmatic dependent of the grid before it in the stream (graph
/// capture keeps the dependency). Where that grid never calls let_dependents_launch, this is an
/// ordinary launch after its end.
template <class... Params, class... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem_bytes, cudaStream_t stream,
                      const Args&... args) {
  cudaLaunchAttribute overlap{};
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  config.attrs = &overlap;
  config.numAttrs = 1;
  PAGEDKV_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args...));
}

/// launch_dependent with a one-dimensional CTA of `threads`.
template <class... Params, class... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, int threads, std::size_t smem_bytes, cudaStream_t stream,
                      const Args&... args) {
  launch_dependent(kernel, grid, dim3(unsigned(threads)), smem_bytes, stream, args...);
}

}  // namespace detail
}  // namespace pagedkv::kernels::cuda
