// The CUDA model's small kernels, one launch each: the embedding gather, RMSNorm fused with the
// residual add, RoPE (Hugging Face's rotate_half pairing, every scaling the CPU path supports, via
// the config's inverse frequencies), SwiGLU, the logit rows' gather, random weights for timing and
// the bf16 conversion of loaded weights. Activations: the residual stream in f32, everything a
// GEMM reads in bf16.
#pragma once

#include <cstdint>

#include <cub/block/block_reduce.cuh>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <pagedkv/types.hpp>

namespace pagedkv::llama::cuda {

/// Threads of the row kernels (one CTA a token row).
inline constexpr int row_threads = 256;

/// x[t, :] = embedding[tokens[t], :] (bf16 table, f32 residual stream).
__global__ void embed_kernel(float* x, const __nv_bfloat16* embedding, const token_id* tokens, std::int64_t dim) {
  const std::int64_t t = blockIdx.x;
  const __nv_bfloat16* row = embedding + std::int64_t(tokens[t]) * dim;
  for (std::int64_t i = threadIdx.x; i < dim; i += blockDim.x) x[t * dim + i] = __bfloat162float(row[i]);
}

/// Sum of v over the CTA, returned to every thread.
__device__ inline float block_sum(float v) {
  __shared__ float partial[row_threads / 32];
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < row_threads / 32; ++w) total += partial[w];
  __syncthreads();  // partial is reused by the next call
  return total;
}

/// Per row r, with s = rows[r] (or r when rows is null): x[s] += delta[s] (when delta is set),
/// then out[r] = x[s] / rms * gain in bf16. The rows must be distinct.
__global__ void add_rmsnorm_kernel(__nv_bfloat16* out, float* x, const __nv_bfloat16* delta, const float* gain,
                                   const std::int32_t* rows, std::int64_t dim, float eps) {
  const std::int64_t r = blockIdx.x, src = rows ? std::int64_t(rows[r]) : r;
  float* xr = x + src * dim;
  float ss = 0.0f;
  for (std::int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = xr[i];
    if (delta) {
      v += __bfloat162float(delta[src * dim + i]);
      xr[i] = v;
    }
    ss += v * v;
  }
  const float scale = rsqrtf(block_sum(ss) / float(dim) + eps);
  for (std::int64_t i = threadIdx.x; i < dim; i += blockDim.x) out[r * dim + i] = __float2bfloat16(xr[i] * scale * gain[i]);
}

/// Rotates q and k of token t in place: the leading rope_dim dimensions of each head, dimension i
/// with i + rope_dim / 2, by angle inv_freq[i] * position (f32, as torch's product rounds it), cos
/// and sin scaled by attention_factor. qkv row: [q heads | k heads | v heads], row_pitch elements.
__global__ void rope_kernel(__nv_bfloat16* qkv, const std::int32_t* positions, const float* inv_freq,
                            float attention_factor, std::int64_t row_pitch, int num_q_heads, int num_kv_heads,
                            int head_dim, int rope_dim) {
  const std::int64_t t = blockIdx.x;
  const int half = rope_dim / 2;
  const float pos = float(positions[t]);
  __nv_bfloat16* row = qkv + t * row_pitch;
  const int heads = num_q_heads + num_kv_heads;
  for (int idx = threadIdx.x; idx < heads * half; idx += blockDim.x) {
    const int h = idx / half, i = idx % half;
    const float angle = inv_freq[i] * pos;
    float s, c;
    sincosf(angle, &s, &c);
    c *= attention_factor;
    s *= attention_factor;
    __nv_bfloat16* head = row + std::int64_t(h) * head_dim;
    const float a = __bfloat162float(head[i]), b = __bfloat162float(head[i + half]);
    head[i] = __float2bfloat16(a * c - b * s);
    head[i + half] = __float2bfloat16(b * c + a * s);
  }
}

/// h[t, i] = silu(gu[t, i]) * gu[t, ffn + i] (gu row: [gate | up]).
__global__ void swiglu_kernel(__nv_bfloat16* h, const __nv_bfloat16* gu, std::int64_t ffn) {
  const std::int64_t t = blockIdx.y;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < ffn; i += std::int64_t(gridDim.x) * blockDim.x) {
    const float g = __bfloat162float(gu[t * 2 * ffn + i]);
    const float u = __bfloat162float(gu[t * 2 * ffn + ffn + i]);
    h[t * ffn + i] = __float2bfloat16(g / (1.0f + __expf(-g)) * u);
  }
}

/// One thread's or one CTA's view of a logits row: the largest logit, where it is first, and the
/// sum of exp(logit - max) over what it has seen (0 for nothing seen).
struct row_max_sum {
  float max;
  int index;
  float sum;
};

struct merge_row_max_sum {
  __device__ row_max_sum operator()(const row_max_sum& a, const row_max_sum& b) const {
    if (a.sum == 0.0f) return b;
    if (b.sum == 0.0f) return a;
    const float m = fmaxf(a.max, b.max);
    const int index = a.max > b.max ? a.index : b.max > a.max ? b.index : min(a.index, b.index);
    return {m, index, a.sum * __expf(a.max - m) + b.sum * __expf(b.max - m)};
  }
};

inline constexpr int greedy_threads = 1024;

/// Per row r of logits [rows, vocab]: the argmax (lowest id among equal maxima) and its
/// log-probability, -log(sum exp(logit - max)), into tokens[r] and logprobs[r]. One CTA a row.
__global__ void greedy_kernel(const float* logits, std::int64_t vocab, std::int32_t* tokens, double* logprobs) {
  using reduce = cub::BlockReduce<row_max_sum, greedy_threads>;
  __shared__ typename reduce::TempStorage storage;
  const float* row = logits + std::int64_t(blockIdx.x) * vocab;
  row_max_sum mine{-INFINITY, 0, 0.0f};
  for (std::int64_t i = threadIdx.x; i < vocab; i += greedy_threads) {  // ascending: the first maximum stays
    const float x = row[i];
    if (mine.sum == 0.0f || x > mine.max) {
      mine.sum = mine.sum * __expf(mine.max - x) + 1.0f;
      mine.max = x;
      mine.index = int(i);
    } else {
      mine.sum += __expf(x - mine.max);
    }
  }
  const row_max_sum all = reduce(storage).Reduce(mine, merge_row_max_sum{});
  if (threadIdx.x == 0) {
    tokens[blockIdx.x] = all.index;
    logprobs[blockIdx.x] = -log(double(all.sum));
  }
}

/// A hash of (seed, i) to a uniform float in [-1, 1): random weights that any launch shape makes alike.
__device__ inline float hash_uniform(std::uint64_t seed, std::uint64_t i) {
  std::uint64_t z = seed + i * 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return float(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

/// w[i] = scale * uniform(-1, 1), for timing-only models.
__global__ void random_bf16_kernel(__nv_bfloat16* w, std::int64_t n, float scale, std::uint64_t seed) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    w[i] = __float2bfloat16(scale * hash_uniform(seed, std::uint64_t(i)));
}

/// dst[i] = bf16(src[i]).
__global__ void to_bf16_kernel(__nv_bfloat16* dst, const float* src, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    dst[i] = __float2bfloat16(src[i]);
}

}  // namespace pagedkv::llama::cuda
