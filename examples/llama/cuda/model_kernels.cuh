// The CUDA model's small kernels, one launch each: the embedding gather, RMSNorm fused with the
// residual add, RoPE (Hugging Face's rotate_half pairing, every scaling the CPU path supports, via
// the config's inverse frequencies), SwiGLU, the logit rows' gather, random weights for timing and
// the bf16 conversion of loaded weights. Activations: the residual stream in f32, everything a
// GEMM reads in bf16. Every kernel is a template, so that several units may include this header (a
// plain __global__ function defined here would be defined once a unit, and their link would fail).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <pagedkv/cuda/dependent_launch.cuh>
#include <pagedkv/types.hpp>

namespace pagedkv::llama::cuda {

/// Threads of the row kernels (one CTA a token row).
inline constexpr int row_threads = 256;

/// x[t, :] = embedding[tokens[t] - first, :] for the tokens of [first, first + count), zero for
/// the others: the whole table on one GPU (first 0, count the vocabulary; Out f32, the residual
/// stream), a rank's vocabulary slice under tensor parallelism (Out bf16: the ranks' rows are
/// summed by an all-reduce, exactly, as each element has one nonzero term).
template <class Out>
__global__ void embed_kernel(Out* x, const __nv_bfloat16* embedding, const token_id* tokens, std::int64_t dim,
                             std::int64_t first, std::int64_t count) {
  const std::int64_t t = blockIdx.x, id = std::int64_t(tokens[t]) - first;
  const bool mine = id >= 0 && id < count;
  const __nv_bfloat16* row = embedding + (mine ? id : 0) * dim;
  for (std::int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const __nv_bfloat16 v = mine ? row[i] : __float2bfloat16(0.0f);
    if constexpr (std::is_same_v<Out, float>) x[t * dim + i] = __bfloat162float(v);
    else x[t * dim + i] = v;
  }
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
/// then out[r] = x[s] / rms * gain in bf16. The rows must be distinct. Any dim; add_rmsnorm()
/// below picks the vector kernel where dim allows.
template <class = void>
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

/// add_rmsnorm_kernel for dim a multiple of 4 up to 4 * Vec * row_threads: each thread keeps its
/// Vec groups of 4 in registers, so every load of the row is issued before the first use (the
/// scalar kernel's dependent loop took 13 us a 220 x 4096 row set, 5x its bytes' time; profile in
/// docs/journal/engine-gpu.md).
template <int Vec>
__global__ void add_rmsnorm_vec_kernel(__nv_bfloat16* __restrict__ out, float* __restrict__ x,
                                       const __nv_bfloat16* __restrict__ delta, const float* __restrict__ gain,
                                       const std::int32_t* __restrict__ rows, std::int64_t dim, float eps) {
  const std::int64_t r = blockIdx.x, src = rows ? std::int64_t(rows[r]) : r;
  const int groups = int(dim / 4);
  auto* xr = reinterpret_cast<float4*>(x + src * dim);
  const auto* dr = delta ? reinterpret_cast<const uint2*>(delta + src * dim) : nullptr;
  float4 v[Vec];
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < Vec; ++k) {
    const int g = threadIdx.x + k * row_threads;
    if (g >= groups) continue;
    v[k] = xr[g];
    if (dr) {
      const uint2 raw = dr[g];
      const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
      const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
      v[k].x += lo.x, v[k].y += lo.y, v[k].z += hi.x, v[k].w += hi.y;
      xr[g] = v[k];
    }
    ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
  }
  const float scale = rsqrtf(block_sum(ss) / float(dim) + eps);
  const auto* gr = reinterpret_cast<const float4*>(gain);
  auto* orow = reinterpret_cast<uint2*>(out + r * dim);
#pragma unroll
  for (int k = 0; k < Vec; ++k) {
    const int g = threadIdx.x + k * row_threads;
    if (g >= groups) continue;
    const float4 w = gr[g];
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v[k].x * scale * w.x, v[k].y * scale * w.y);
    const __nv_bfloat162 hi = __floats2bfloat162_rn(v[k].z * scale * w.z, v[k].w * scale * w.w);
    orow[g] = make_uint2(*reinterpret_cast<const unsigned*>(&lo), *reinterpret_cast<const unsigned*>(&hi));
  }
}

/// Launches add_rmsnorm over num_rows rows: the vector kernel with the fewest registers that holds
/// dim, or the scalar one (dim not a multiple of 4, or beyond 8 groups of 4 a thread).
inline void add_rmsnorm(__nv_bfloat16* out, float* x, const __nv_bfloat16* delta, const float* gain,
                        const std::int32_t* rows, std::int64_t num_rows, std::int64_t dim, float eps,
                        cudaStream_t stream) {
  const std::int64_t per_thread = (dim / 4 + row_threads - 1) / row_threads;
  const auto grid = unsigned(num_rows);
  if (dim % 4 != 0 || per_thread > 8)
    add_rmsnorm_kernel<><<<grid, row_threads, 0, stream>>>(out, x, delta, gain, rows, dim, eps);
  else if (per_thread <= 1)
    add_rmsnorm_vec_kernel<1><<<grid, row_threads, 0, stream>>>(out, x, delta, gain, rows, dim, eps);
  else if (per_thread <= 2)
    add_rmsnorm_vec_kernel<2><<<grid, row_threads, 0, stream>>>(out, x, delta, gain, rows, dim, eps);
  else if (per_thread <= 4)
    add_rmsnorm_vec_kernel<4><<<grid, row_threads, 0, stream>>>(out, x, delta, gain, rows, dim, eps);
  else
    add_rmsnorm_vec_kernel<8><<<grid, row_threads, 0, stream>>>(out, x, delta, gain, rows, dim, eps);
}

/// RoPE of token t's q and k, read from its row of the QKV product ([q heads | k heads | v heads],
/// row_pitch elements): q's heads go rotated to q_out [t, num_q_heads * head_dim], k's heads are
/// rotated in place. The leading rope_dim dimensions of each head rotate, dimension i with
/// i + rope_dim / 2, by angle inv_freq[i] * position (f32, as torch's product rounds it), cos and
/// sin scaled by attention_factor; q's other dimensions are copied. Grid: x the tokens, y groups
/// of blockDim.y heads (rope_grid), so that a small batch still spreads over many SMs (one CTA a
/// token left a 32-token step's launch latency-bound: 7.4 us for 0.5 MB). threadIdx.x walks the
/// pairs i (each thread's sine and cosine made once), threadIdx.y the heads of the group.
template <class = void>
__global__ void rope_qk_kernel(__nv_bfloat16* __restrict__ q_out, __nv_bfloat16* __restrict__ qkv,
                               const std::int32_t* __restrict__ positions, const float* __restrict__ inv_freq,
                               float attention_factor, std::int64_t row_pitch, int num_q_heads, int num_kv_heads,
                               int head_dim, int rope_dim) {
  // write_kv, launched next as a programmatic dependent, may start while this grid drains: it
  // waits for this grid's end before it reads k.
  ::pagedkv::kernels::cuda::detail::let_dependents_launch();
  const std::int64_t t = blockIdx.x;
  const int half = rope_dim / 2;
  const float pos = float(positions[t]);
  __nv_bfloat16* row = qkv + t * row_pitch;
  __nv_bfloat16* q_row = q_out + t * std::int64_t(num_q_heads) * head_dim;
  const int heads = num_q_heads + num_kv_heads;
  const int first_head = int(blockIdx.y * blockDim.y + threadIdx.y), head_step = int(gridDim.y * blockDim.y);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float s, c;
    sincosf(inv_freq[i] * pos, &s, &c);
    c *= attention_factor;
    s *= attention_factor;
    for (int h = first_head; h < heads; h += head_step) {
      const __nv_bfloat16* head = row + std::int64_t(h) * head_dim;
      __nv_bfloat16* dst = h < num_q_heads ? q_row + std::int64_t(h) * head_dim : row + std::int64_t(h) * head_dim;
      const float a = __bfloat162float(head[i]), b = __bfloat162float(head[i + half]);
      dst[i] = __float2bfloat16(a * c - b * s);
      dst[i + half] = __float2bfloat16(b * c + a * s);
    }
  }
  for (int i = rope_dim + threadIdx.x; i < head_dim; i += blockDim.x)  // q's unrotated dimensions
    for (int h = first_head; h < num_q_heads; h += head_step) q_row[h * head_dim + i] = row[h * head_dim + i];
}

/// rope_qk_kernel's CTA: the pairs of a head across x (a whole warp at least), 4 rows of heads.
inline dim3 rope_block(int rope_dim) { return dim3(unsigned(std::min(128, std::max(32, (rope_dim / 2 + 31) / 32 * 32))), 4); }

/// rope_qk_kernel's grid: every token, and the q and k heads in groups of the block's rows.
inline dim3 rope_grid(std::int64_t num_tokens, int num_q_heads, int num_kv_heads, dim3 block) {
  return dim3(unsigned(num_tokens), unsigned((num_q_heads + num_kv_heads + int(block.y) - 1) / int(block.y)));
}

/// h[t, i] = silu(gu[t, i]) * gu[t, ffn + i] (gu row: [gate | up]), Width elements a thread
/// (8: one 16-byte load of each half; 1 for an ffn that is not a multiple of 8).
template <int Width>
__global__ void swiglu_kernel(__nv_bfloat16* __restrict__ h, const __nv_bfloat16* __restrict__ gu, std::int64_t ffn) {
  const std::int64_t t = blockIdx.y;
  for (std::int64_t i = (blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x) * Width; i < ffn;
       i += std::int64_t(gridDim.x) * blockDim.x * Width) {
    if constexpr (Width == 8) {
      const uint4 graw = *reinterpret_cast<const uint4*>(gu + t * 2 * ffn + i);
      const uint4 uraw = *reinterpret_cast<const uint4*>(gu + t * 2 * ffn + ffn + i);
      const auto* g2 = reinterpret_cast<const __nv_bfloat162*>(&graw);
      const auto* u2 = reinterpret_cast<const __nv_bfloat162*>(&uraw);
      uint4 oraw;
      auto* o2 = reinterpret_cast<__nv_bfloat162*>(&oraw);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 g = __bfloat1622float2(g2[k]), u = __bfloat1622float2(u2[k]);
        o2[k] = __floats2bfloat162_rn(g.x / (1.0f + __expf(-g.x)) * u.x, g.y / (1.0f + __expf(-g.y)) * u.y);
      }
      *reinterpret_cast<uint4*>(h + t * ffn + i) = oraw;
    } else {
      const float g = __bfloat162float(gu[t * 2 * ffn + i]);
      const float u = __bfloat162float(gu[t * 2 * ffn + ffn + i]);
      h[t * ffn + i] = __float2bfloat16(g / (1.0f + __expf(-g)) * u);
    }
  }
}

/// Launches swiglu_kernel over num_tokens rows: 16-byte accesses where ffn is a multiple of 8.
inline void swiglu(__nv_bfloat16* h, const __nv_bfloat16* gu, std::int64_t num_tokens, std::int64_t ffn,
                   cudaStream_t stream) {
  constexpr int threads = 256;
  const int width = ffn % 8 == 0 ? 8 : 1;
  const auto blocks = unsigned(std::min<std::int64_t>((ffn / width + threads - 1) / threads, 65535));
  if (width == 8) swiglu_kernel<8><<<dim3(blocks, unsigned(num_tokens)), threads, 0, stream>>>(h, gu, ffn);
  else swiglu_kernel<1><<<dim3(blocks, unsigned(num_tokens)), threads, 0, stream>>>(h, gu, ffn);
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
template <class = void>
__global__ void random_bf16_kernel(__nv_bfloat16* w, std::int64_t n, float scale, std::uint64_t seed) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    w[i] = __float2bfloat16(scale * hash_uniform(seed, std::uint64_t(i)));
}

/// dst[i] = bf16(src[i]).
template <class = void>
__global__ void to_bf16_kernel(__nv_bfloat16* dst, const float* src, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    dst[i] = __float2bfloat16(src[i]);
}

}  // namespace pagedkv::llama::cuda
