// The read-stream kernel behind the benchmarks' ceiling: every 16-byte word of data read once
// into registers by a persistent grid-stride loop, four loads in flight a thread.
#pragma once

#include <cstddef>

__global__ void read_stream_kernel(const uint4* data, std::size_t n, unsigned* sink) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned acc = 0;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = data[i], b = data[i + stride], c = data[i + 2 * stride], d = data[i + 3 * stride];
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n; i += stride) acc ^= data[i].x ^ data[i].y ^ data[i].z ^ data[i].w;
  if (acc == 0x9e3779b9u) *sink = acc;  // keeps the loads alive
}
