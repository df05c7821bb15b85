// The read streams behind the benchmarks' ceiling: every byte of a buffer read once, by 16-byte
// loads into registers or by 16-byte cp.async copies into shared memory (the decode's copies,
// without the paging). The ceiling is the faster of them: on the H100 the cp.async stream moved
// 1.5-2.3% more than the loads (bench_stream, 2026-11-22).
#pragma once

#include <cstddef>

#include <pagedkv/cuda/cp_async.cuh>

/// 16-byte loads, a persistent grid-stride loop, four loads in flight a thread.
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

/// 16-byte cp.async copies: each warp streams 8 KiB slices (16 copies of 512 contiguous bytes a
/// slice) through Stages shared-memory stages of its own; slice s of the buffer goes to warp
/// s % (warps in the grid). Dynamic shared memory: warps * Stages * 8 KiB.
template <int Stages>
__global__ void copy_stream_kernel(const char* data, std::size_t slices) {
  namespace cu = pagedkv::kernels::cuda;
  extern __shared__ __align__(128) char ring[];
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  char* mine_s = ring + warp * Stages * 8192;
  const std::size_t warps = std::size_t(gridDim.x) * (blockDim.x / 32);
  const std::size_t first = std::size_t(blockIdx.x) * (blockDim.x / 32) + warp;
  const std::size_t mine = first < slices ? (slices - first + warps - 1) / warps : 0;
  const auto issue = [&](std::size_t i) {
    const char* src = data + (first + i * warps) * 8192;
    char* dst = mine_s + (i % Stages) * 8192;
#pragma unroll
    for (int c = 0; c < 16; ++c) cu::cp_async_16(dst + c * 512 + lane * 16, src + c * 512 + lane * 16, true);
  };
  for (int i = 0; i < Stages - 1; ++i) {
    if (std::size_t(i) < mine) issue(i);
    cu::cp_async_commit();
  }
  for (std::size_t i = 0; i < mine; ++i) {
    if (i + Stages - 1 < mine) issue(i + Stages - 1);
    cu::cp_async_commit();
    cu::cp_async_wait<Stages - 1>();
  }
  cu::cp_async_wait<0>();
}
