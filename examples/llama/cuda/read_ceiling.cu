// The GPU's read ceiling, measured by the binary that is being timed (cuda_backend.hpp:
// cuda_read_bytes_per_s): the denominator of --bench's decode roofline.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include <pagedkv/cuda/check.cuh>
#include <pagedkv/cuda/memory.cuh>
#include <pagedkv/error.hpp>

#include "cuda/cuda_backend.hpp"

namespace pagedkv::llama {

namespace {

/// Sums 16-byte words, so that the compiler keeps every load; one write a CTA.
__global__ void read_kernel(const uint4* data, std::int64_t n, unsigned* sink) {
  unsigned acc = 0;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x) {
    const uint4 v = data[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;  // never true for the zeroed buffer: no write traffic
}

}  // namespace

double cuda_read_bytes_per_s() {
  std::string why;
  if (!cuda_backend_available(&why)) detail::fail(errc::invalid_argument, "--device cuda: ", why);
  constexpr std::size_t bytes = std::size_t(512) << 20;
  auto buffer = kernels::cuda::allocate<kernels::cuda::device_memory>(bytes);
  auto sink = kernels::cuda::allocate<kernels::cuda::device_memory>(1 << 20);
  PAGEDKV_CUDA_CHECK(cudaMemset(buffer.get(), 0, bytes));
  int sms = 0;
  PAGEDKV_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const kernels::cuda::owned_event begin = kernels::cuda::make_event(), end = kernels::cuda::make_event();
  std::vector<float> ms(10);
  for (float& t : ms) {
    PAGEDKV_CUDA_CHECK(cudaEventRecord(begin.get()));
    read_kernel<<<unsigned(sms * 8), 512>>>(static_cast<const uint4*>(buffer.get()), std::int64_t(bytes / 16),
                                            static_cast<unsigned*>(sink.get()));
    PAGEDKV_CUDA_CHECK(cudaGetLastError());
    PAGEDKV_CUDA_CHECK(cudaEventRecord(end.get()));
    PAGEDKV_CUDA_CHECK(cudaEventSynchronize(end.get()));
    PAGEDKV_CUDA_CHECK(cudaEventElapsedTime(&t, begin.get(), end.get()));
  }
  ms.erase(ms.begin());  // the first pass warms up
  std::sort(ms.begin(), ms.end());
  return double(bytes) / (1e-3 * double(ms[ms.size() / 2]));
}

}  // namespace pagedkv::llama
