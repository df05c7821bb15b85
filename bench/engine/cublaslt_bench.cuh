// What the hand-built cuBLASLt benchmarks of bench/engine share (gemm_candidates.cu, gemm_space.cu,
// gemm_forward.cu; CI builds none of them, each builds with nvcc alone as its header says): checks
// that print the failed call and exit, random bf16 fills, the engine's read kernel, an algorithm's
// config attribute and a list of numbers from the command line.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#define PAGEDKV_BENCH_CUDA_CHECK(x)                                                           \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)
#define PAGEDKV_BENCH_LT_CHECK(x)                                                     \
  do {                                                                                \
    cublasStatus_t s_ = (x);                                                          \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                \
      std::fprintf(stderr, "%s:%d %s: status %d\n", __FILE__, __LINE__, #x, int(s_)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

namespace pagedkv::bench {

/// p[i] = scale * a uniform value in [-1, 1) from a hash of (seed, i), for i < n.
__global__ void fill_random(__nv_bfloat16* p, long long n, unsigned long long seed, float scale) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    unsigned long long z = seed + (unsigned long long)i * 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    p[i] = __float2bfloat16(scale * (float(z >> 40) * (2.0f / 16777216.0f) - 1.0f));
  }
}

/// Reads `n` 16-byte words, one write a CTA at most: the engine's read ceiling
/// (examples/llama/cuda/read_ceiling.cu), and a stand-in for the decode attention's reads.
__global__ void read_words(const uint4* data, long long n, unsigned* sink) {
  unsigned acc = 0;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const uint4 v = data[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;
}

/// The value of one of algo's config attributes (T{} where cuBLASLt does not say).
template <class T>
T algo_config(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T v{};
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written);
  return v;
}

/// "64,128,200" -> {64, 128, 200}.
inline std::vector<long long> parse_list(const char* s) {
  std::vector<long long> v;
  for (const char* q = s; q; q = std::strchr(q, ',') ? std::strchr(q, ',') + 1 : nullptr) v.push_back(std::atoll(q));
  return v;
}

}  // namespace pagedkv::bench
