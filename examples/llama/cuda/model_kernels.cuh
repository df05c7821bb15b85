// The CUDA model's small kernels, one launch each: the embedding gather, RMSNorm fused with the
// residual add, RoPE (Hugging Face's rotate_half pairing, every scaling the CPU path supports, via
// the config's inverse frequencies) fused with the K/V cache write (scalar, for small steps; in
// 16-byte pieces, for large ones), SwiGLU, the logit rows'
// gather, random weights for timing and the bf16 conversion of loaded weights. Activations: the
// residual stream in f32, everything a GEMM reads in bf16. Every kernel is a template, so that
// several units may include this header (a plain __global__ function defined here would be defined
// once a unit, and their link would fail).
//
// The kernels of a forward's layers (RMSNorm, RoPE with the K/V write, SwiGLU) may be launched as
// programmatic dependents (pagedkv/cuda/dependent_launch.cuh; the backend does so for steps of
// few tokens, see dependent_launch_max_tokens): each may start while the grid before it
// (a cuBLASLt product, mostly) drains, reads only weights and the step's inputs before
// wait_for_the_grid_before() (nothing of the forward writes those: the inputs are copied before
// the step's first kernel, after the previous step's last), and reads or writes nothing else
// before it. That wait returns once the grid before has ended and its writes are visible; as every
// grid of the forward either waits so or is an ordinary launch, that grid's end implies the end of
// every grid before it, so the activations any kernel reads are complete.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <pagedkv/cuda/check.cuh>
#include <pagedkv/cuda/dependent_launch.cuh>
#include <pagedkv/cuda/vec.cuh>
#include <pagedkv/kv_layout.hpp>
#include <pagedkv/types.hpp>

namespace pagedkv::llama::cuda {

using ::pagedkv::kernels::cuda::detail::let_dependents_launch;
using ::pagedkv::kernels::cuda::detail::wait_for_the_grid_before;

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
  const std::int64_t r = blockIdx.x, src = rows ? std::int64_t(rows[r]) : r;  // rows: a step input
  wait_for_the_grid_before();  // x and delta: the product before, and the grids before it
  let_dependents_launch();     // a product follows: it starts after this grid's end regardless
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

/// A thread's Vec groups of 4 of a row of `groups` groups (groups threadIdx.x, + row_threads, ...),
/// as the vector row kernels keep them in registers.
template <int Vec>
__device__ __forceinline__ void load_row_groups(float4 (&to)[Vec], const float* row, int groups) {
  const auto* from = reinterpret_cast<const float4*>(row);
#pragma unroll
  for (int k = 0; k < Vec; ++k)
    if (threadIdx.x + k * row_threads < groups) to[k] = from[threadIdx.x + k * row_threads];
}

/// The end of a vector RMSNorm row, every thread of the CTA at once (block_sum): out_row = v / rms
/// * gain in bf16, where ss is this thread's sum of squares of its groups of v.
template <int Vec>
__device__ __forceinline__ void store_rmsnorm_row(__nv_bfloat16* out_row, const float4 (&v)[Vec],
                                                  const float4 (&gain)[Vec], float ss, std::int64_t dim, float eps) {
  const int groups = int(dim / 4);
  const float scale = rsqrtf(block_sum(ss) / float(dim) + eps);
  auto* orow = reinterpret_cast<uint2*>(out_row);
#pragma unroll
  for (int k = 0; k < Vec; ++k) {
    const int g = threadIdx.x + k * row_threads;
    if (g >= groups) continue;
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v[k].x * scale * gain[k].x, v[k].y * scale * gain[k].y);
    const __nv_bfloat162 hi = __floats2bfloat162_rn(v[k].z * scale * gain[k].z, v[k].w * scale * gain[k].w);
    orow[g] = make_uint2(*reinterpret_cast<const unsigned*>(&lo), *reinterpret_cast<const unsigned*>(&hi));
  }
}

/// add_rmsnorm_kernel for dim a multiple of 4 up to 4 * Vec * row_threads: each thread keeps its
/// Vec groups of 4 in registers, so every load of the row is issued before the first use (the
/// scalar kernel's dependent loop took 13 us a 220 x 4096 row set, 5x its bytes' time; profile in
/// docs/journal/engine-gpu.md).
template <int Vec>
__global__ void add_rmsnorm_vec_kernel(__nv_bfloat16* __restrict__ out, float* __restrict__ x,
                                       const __nv_bfloat16* __restrict__ delta, const float* __restrict__ gain,
                                       const std::int32_t* __restrict__ rows, std::int64_t dim, float eps) {
  const std::int64_t r = blockIdx.x, src = rows ? std::int64_t(rows[r]) : r;  // rows: a step input
  const int groups = int(dim / 4);
  // The gain (a weight) is loaded before the wait, while the grid before drains.
  float4 w[Vec];
  load_row_groups(w, gain, groups);
  wait_for_the_grid_before();  // x and delta: the product before, and the grids before it
  let_dependents_launch();     // a product follows: it starts after this grid's end regardless
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
  store_rmsnorm_row(out + r * dim, v, w, ss, dim, eps);
}

/// Launches `kernel`: as a programmatic dependent of the grid before, or (dependent false) as an
/// ordinary launch after its end.
template <class... Params, class... Args>
void launch_model_kernel(bool dependent, void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream,
                         const Args&... args) {
  if (dependent) {
    ::pagedkv::kernels::cuda::detail::launch_dependent(kernel, grid, block, 0, stream, args...);
  } else {
    kernel<<<grid, block, 0, stream>>>(args...);
    PAGEDKV_CUDA_CHECK(cudaGetLastError());
  }
}

/// Launches add_rmsnorm over num_rows rows, a programmatic dependent of the grid before where
/// `dependent`: the vector kernel with the fewest registers that holds dim, or the scalar one (dim
/// not a multiple of 4, or beyond 8 groups of 4 a thread).
inline void add_rmsnorm(__nv_bfloat16* out, float* x, const __nv_bfloat16* delta, const float* gain,
                        const std::int32_t* rows, std::int64_t num_rows, std::int64_t dim, float eps, bool dependent,
                        cudaStream_t stream) {
  const std::int64_t per_thread = (dim / 4 + row_threads - 1) / row_threads;
  const dim3 grid{unsigned(num_rows)};
  const auto launch = [&](auto kernel) {
    launch_model_kernel(dependent, kernel, grid, dim3(row_threads), stream, out, x, delta, gain, rows, dim, eps);
  };
  if (dim % 4 != 0 || per_thread > 8) launch(&add_rmsnorm_kernel<void>);
  else if (per_thread <= 1) launch(&add_rmsnorm_vec_kernel<1>);
  else if (per_thread <= 2) launch(&add_rmsnorm_vec_kernel<2>);
  else if (per_thread <= 4) launch(&add_rmsnorm_vec_kernel<4>);
  else launch(&add_rmsnorm_vec_kernel<8>);
}

/// What rope_write_kv_kernel reads and writes for one layer.
struct rope_write_kv_params {
  __nv_bfloat16* q_out;         // [tokens, num_q_heads * head_dim]: q rotated, the attention's input
  __nv_bfloat16* qkv;           // [tokens, row_pitch]: the QKV product's rows, [q heads | k heads | v heads]
  const std::int32_t* positions;  // [tokens]
  const slot_id* slots;         // [tokens]: the cache slot of each token's K and V; < 0 writes none
  const float* inv_freq;        // [rope_dim / 2]
  float attention_factor = 1.0f;
  std::int64_t row_pitch = 0;
  int num_q_heads = 0, num_kv_heads = 0, head_dim = 0, rope_dim = 0;
  void* pool = nullptr;         // the KV cache, laid out as `layout`; bf16 or fp8 e4m3 elements
  kernels::kv_cache_layout layout{};
  std::int32_t layer = 0;
  float k_inv_scale = 1.0f, v_inv_scale = 1.0f;  // an fp8 cache stores value / scale
};

/// A K/V element as the cache stores it: the bf16 value itself, or (fp8) the bf16 value times
/// inv_scale narrowed, as write_kv stores a bf16 source.
template <class TC>
__device__ __forceinline__ TC cache_element(__nv_bfloat16 v, float inv_scale) {
  if constexpr (std::is_same_v<TC, __nv_bfloat16>) return v;
  else return ::pagedkv::kernels::cuda::from_float<TC>(__bfloat162float(v) * inv_scale);
}

/// The offset in the cache of slot `slot`'s K row of KV head 0 in `layer` (V's is kv_stride on, KV
/// head h's h head strides on), by a 32-bit division where the slot allows: slot_offset's 64-bit
/// one, made for every head of every thread, cost a llama2-7b prefill step of 2027 tokens 2.8 ms
/// (run p1), so each thread makes this once.
__device__ __forceinline__ std::int64_t slot_k_row(const kernels::kv_cache_layout& layout, std::int32_t layer,
                                                   slot_id slot) {
  const int block_size = layout.shape.block_size;
  std::int32_t block, token;
  if (slot <= 0x7fffffff) {  // the usual case
    block = std::int32_t(unsigned(slot) / unsigned(block_size));
    token = std::int32_t(unsigned(slot) - unsigned(block) * unsigned(block_size));
  } else {
    block = std::int32_t(slot / block_size);
    token = std::int32_t(slot - std::int64_t(block) * block_size);
  }
  return layout.offset(layer, 0, block, token, 0);
}

/// RoPE of token t's QKV product row, with WriteCache fused with the K/V write (issue 20: "applied
/// before or fused with the K/V write"): q's heads go rotated to q_out; k's heads rotated and v's
/// heads as they are go to the cache at slots[t] (the write_kv of this row, without k's trip
/// through memory and a launch). Without WriteCache k's heads are rotated in place in qkv, for a
/// write_kv after. The leading rope_dim dimensions of each q and k head rotate, dimension i with
/// i + rope_dim / 2, by angle inv_freq[i] * position (f32, as torch's product rounds it), cos and
/// sin scaled by attention_factor, and are rounded to bf16 (then narrowed, for an fp8 cache); the
/// other dimensions are copied. Grid: x the tokens, y groups of blockDim.y heads of the q, k and
/// v heads (q and k alone without WriteCache), so that a small batch still spreads over many SMs
/// (one CTA a token left a 32-token step's RoPE latency-bound: 7.4 us for 0.5 MB). threadIdx.x
/// walks the pairs i (each thread's sine and cosine made once, before the wait), threadIdx.y the
/// heads of the group.
template <class TC, bool WriteCache>
__global__ void rope_write_kv_kernel(const rope_write_kv_params p) {
  const std::int64_t t = blockIdx.x;
  const int half = p.rope_dim / 2, d = p.head_dim;
  const int i0 = int(threadIdx.x);
  // Step inputs and weights (see the header): read before the product's row is.
  const float pos = float(p.positions[t]);
  const slot_id slot = p.slots[t];
  float s0 = 0.0f, c0 = 0.0f;
  if (i0 < half) sincosf(p.inv_freq[i0] * pos, &s0, &c0);
  wait_for_the_grid_before();  // the QKV product's rows
  // The attention, launched next as a programmatic dependent, may start now: it waits for this
  // grid's end before it reads q or the cache.
  let_dependents_launch();
  __nv_bfloat16* row = p.qkv + t * p.row_pitch;
  __nv_bfloat16* q_row = p.q_out + t * std::int64_t(p.num_q_heads) * d;
  const int rotated = p.num_q_heads + p.num_kv_heads, heads = WriteCache ? rotated + p.num_kv_heads : rotated;
  const int first_head = int(blockIdx.y * blockDim.y + threadIdx.y), head_step = int(gridDim.y * blockDim.y);
  // The slot's K row of head 0 in the cache, found only by threads with a k or v head.
  std::int64_t k_base = -1;
  const auto cache_row = [&](bool is_k, int kv_head) {
    if (k_base < 0) k_base = slot_k_row(p.layout, p.layer, slot);
    return static_cast<TC*>(p.pool) + k_base + (is_k ? 0 : p.layout.kv_stride) + std::int64_t(kv_head) * p.layout.head_stride;
  };
  // Head h's elements i and j (the pair, or two copied dimensions) where they go: q_out, k's row in
  // place, or the cache.
  const auto put = [&](int h, int i, __nv_bfloat16 a, int j, __nv_bfloat16 b) {
    if (h < p.num_q_heads) {
      q_row[std::int64_t(h) * d + i] = a;
      q_row[std::int64_t(h) * d + j] = b;
    } else if constexpr (!WriteCache) {
      row[std::int64_t(h) * d + i] = a;
      row[std::int64_t(h) * d + j] = b;
    } else if (slot >= 0) {
      const bool is_k = h < rotated;
      const float inv_scale = is_k ? p.k_inv_scale : p.v_inv_scale;
      TC* dst = cache_row(is_k, h - (is_k ? p.num_q_heads : rotated));
      dst[i] = cache_element<TC>(a, inv_scale);
      dst[j] = cache_element<TC>(b, inv_scale);
    }
  };
  for (int i = i0; i < half; i += int(blockDim.x)) {
    float s = s0, c = c0;
    if (i != i0) sincosf(p.inv_freq[i] * pos, &s, &c);
    c *= p.attention_factor;
    s *= p.attention_factor;
    for (int h = first_head; h < heads; h += head_step) {
      const __nv_bfloat16* head = row + std::int64_t(h) * d;
      if (h < rotated) {
        const float a = __bfloat162float(head[i]), b = __bfloat162float(head[i + half]);
        put(h, i, __float2bfloat16(a * c - b * s), i + half, __float2bfloat16(b * c + a * s));
      } else {
        put(h, i, head[i], i + half, head[i + half]);
      }
    }
  }
  // The unrotated dimensions [rope_dim, head_dim) of every head that moves (k's stay in place
  // without WriteCache), two at a time (head_dim - rope_dim is even: both are).
  const int moved = WriteCache ? heads : p.num_q_heads;
  for (int i = p.rope_dim + 2 * int(threadIdx.x); i < d; i += 2 * int(blockDim.x))
    for (int h = first_head; h < moved; h += head_step) put(h, i, row[std::int64_t(h) * d + i], i + 1, row[std::int64_t(h) * d + i + 1]);
}

/// rope_write_kv_kernel's CTA: the pairs of a head across x (a whole warp at least), 4 rows of heads.
inline dim3 rope_block(int rope_dim) { return dim3(unsigned(std::min(128, std::max(32, (rope_dim / 2 + 31) / 32 * 32))), 4); }

/// Launches rope_write_kv_kernel over num_tokens tokens: every token, and its heads in groups of
/// the block's rows. With write_cache, fused with the K/V write into the cache (bf16 or fp8 e4m3,
/// the CUDA backend's), a programmatic dependent of the QKV product where `dependent`; without,
/// k rotated in place for a write_kv after, and an ordinary launch (it lets that write_kv launch
/// early). head_dim and rope_dim even.
inline void rope(const rope_write_kv_params& p, std::int64_t num_tokens, bool write_cache, bool dependent,
                 cudaStream_t stream) {
  const dim3 block = rope_block(p.rope_dim);
  const int heads = p.num_q_heads + (write_cache ? 2 : 1) * p.num_kv_heads;
  const dim3 grid(unsigned(num_tokens), unsigned((heads + int(block.y) - 1) / int(block.y)));
  if (!write_cache) launch_model_kernel(false, &rope_write_kv_kernel<__nv_bfloat16, false>, grid, block, stream, p);
  else if (p.layout.kv_dtype == kernels::dtype::fp8_e4m3)
    launch_model_kernel(dependent, &rope_write_kv_kernel<__nv_fp8_e4m3, true>, grid, block, stream, p);
  else launch_model_kernel(dependent, &rope_write_kv_kernel<__nv_bfloat16, true>, grid, block, stream, p);
}

/// Whether rope_write_kv_rows_kernel takes p's shape: 16-byte pieces of a head (8 elements) that
/// never straddle the rotated halves or the unrotated rest (head_dim and rope_dim / 2 multiples
/// of 8).
inline bool rope_write_kv_rows_fits(const rope_write_kv_params& p) {
  return p.head_dim % 8 == 0 && p.rope_dim % 16 == 0;
}

/// rope_write_kv_kernel<TC, true>'s work for steps of many tokens (prefill chunks), in 16-byte
/// pieces: one CTA a token, its cosines and sines (scaled by attention_factor) made once into
/// shared memory, then each thread a unit of 8 pairs (elements [i, i + 8) and [i + half, i + half
/// + 8), rotated for q and k heads, copied for v heads) or 8 unrotated elements of a head. The
/// same values as rope_write_kv_kernel (the same float operations on the same inputs), stored
/// with 16-byte (bf16) or 8-byte (fp8) accesses: the scalar kernel took 49 us a layer at 2048
/// tokens beside write_kv's 22 us, 71 us for 67-100 MB (ncu, docs/journal/engine-gpu.md). An
/// ordinary launch; shape as rope_write_kv_rows_fits.
template <class TC>
__global__ void __launch_bounds__(256) rope_write_kv_rows_kernel(const rope_write_kv_params p) {
  extern __shared__ float trig[];  // [half] cosines, then [half] sines
  const std::int64_t t = blockIdx.x;
  const int half = p.rope_dim / 2, d = p.head_dim;
  const float pos = float(p.positions[t]);
  const slot_id slot = p.slots[t];
  for (int i = int(threadIdx.x); i < half; i += int(blockDim.x)) {
    float s = 0.0f, c = 0.0f;
    sincosf(p.inv_freq[i] * pos, &s, &c);
    trig[i] = c * p.attention_factor;
    trig[half + i] = s * p.attention_factor;
  }
  __syncthreads();
  const __nv_bfloat16* row = p.qkv + t * p.row_pitch;
  __nv_bfloat16* q_row = p.q_out + t * std::int64_t(p.num_q_heads) * d;
  const int rotated = p.num_q_heads + p.num_kv_heads, heads = rotated + p.num_kv_heads;
  const int pair_units = half / 8, units = pair_units + (d - p.rope_dim) / 8;  // a head's
  // The slot's K row of head 0 in the cache.
  const std::int64_t k_base = slot >= 0 ? slot_k_row(p.layout, p.layer, slot) : -1;
  // 8 elements (one 16-byte piece) to where head h's go: q_out or the cache (bf16 as they are;
  // fp8 narrowed to an 8-byte piece).
  const auto store = [&](int h, int i, uint4 v) {
    if (h < p.num_q_heads) {
      *reinterpret_cast<uint4*>(q_row + std::int64_t(h) * d + i) = v;
      return;
    }
    if (slot < 0) return;
    const bool is_k = h < rotated;
    TC* dst = static_cast<TC*>(p.pool) + k_base + (is_k ? 0 : p.layout.kv_stride) +
              std::int64_t(h - (is_k ? p.num_q_heads : rotated)) * p.layout.head_stride + i;
    if constexpr (std::is_same_v<TC, __nv_bfloat16>) {
      *reinterpret_cast<uint4*>(dst) = v;
    } else {
      const float inv_scale = is_k ? p.k_inv_scale : p.v_inv_scale;
      const auto* v2 = reinterpret_cast<const __nv_bfloat162*>(&v);
      union {
        uint2 whole;
        TC e[8];
      } out;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        out.e[2 * k] = cache_element<TC>(v2[k].x, inv_scale);
        out.e[2 * k + 1] = cache_element<TC>(v2[k].y, inv_scale);
      }
      *reinterpret_cast<uint2*>(dst) = out.whole;
    }
  };
  for (int w = int(threadIdx.x); w < heads * units; w += int(blockDim.x)) {
    const int h = w / units, u = w - h * units;
    const __nv_bfloat16* head = row + std::int64_t(h) * d;
    if (u < pair_units) {
      const int i = u * 8;
      uint4 a = *reinterpret_cast<const uint4*>(head + i), b = *reinterpret_cast<const uint4*>(head + i + half);
      if (h < rotated) {
        auto* a2 = reinterpret_cast<__nv_bfloat162*>(&a);
        auto* b2 = reinterpret_cast<__nv_bfloat162*>(&b);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float2 x = __bfloat1622float2(a2[k]), y = __bfloat1622float2(b2[k]);
          const float c0 = trig[i + 2 * k], s0 = trig[half + i + 2 * k];
          const float c1 = trig[i + 2 * k + 1], s1 = trig[half + i + 2 * k + 1];
          a2[k] = __nv_bfloat162(__float2bfloat16(x.x * c0 - y.x * s0), __float2bfloat16(x.y * c1 - y.y * s1));
          b2[k] = __nv_bfloat162(__float2bfloat16(y.x * c0 + x.x * s0), __float2bfloat16(y.y * c1 + x.y * s1));
        }
      }
      store(h, i, a);
      store(h, i + half, b);
    } else {
      const int i = p.rope_dim + (u - pair_units) * 8;
      store(h, i, *reinterpret_cast<const uint4*>(head + i));
    }
  }
}

/// Launches rope_write_kv_rows_kernel over num_tokens tokens (an ordinary launch), for the
/// backend's KV dtype (bf16 or fp8 e4m3). p's shape as rope_write_kv_rows_fits.
inline void rope_write_kv_rows(const rope_write_kv_params& p, std::int64_t num_tokens, cudaStream_t stream) {
  const dim3 grid{unsigned(num_tokens)}, block{256};
  const std::size_t trig_bytes = std::size_t(p.rope_dim) * sizeof(float);
  if (p.layout.kv_dtype == kernels::dtype::fp8_e4m3)
    rope_write_kv_rows_kernel<__nv_fp8_e4m3><<<grid, block, trig_bytes, stream>>>(p);
  else rope_write_kv_rows_kernel<__nv_bfloat16><<<grid, block, trig_bytes, stream>>>(p);
  PAGEDKV_CUDA_CHECK(cudaGetLastError());
}

/// h[t, i] = silu(gu[t, i]) * gu[t, ffn + i] (gu row: [gate | up]), Width elements a thread
/// (8: one 16-byte load of each half; 1 for an ffn that is not a multiple of 8).
template <int Width>
__global__ void swiglu_kernel(__nv_bfloat16* __restrict__ h, const __nv_bfloat16* __restrict__ gu, std::int64_t ffn) {
  wait_for_the_grid_before();  // gu: the gate/up product before
  let_dependents_launch();     // the down product follows: it starts after this grid's end regardless
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

/// Launches swiglu_kernel over num_tokens rows, a programmatic dependent of the grid before where
/// `dependent`: 16-byte accesses where ffn is a multiple of 8.
inline void swiglu(__nv_bfloat16* h, const __nv_bfloat16* gu, std::int64_t num_tokens, std::int64_t ffn, bool dependent,
                   cudaStream_t stream) {
  constexpr int threads = 256;
  const int width = ffn % 8 == 0 ? 8 : 1;
  const dim3 grid(unsigned(std::min<std::int64_t>((ffn / width + threads - 1) / threads, 65535)), unsigned(num_tokens));
  if (width == 8) launch_model_kernel(dependent, &swiglu_kernel<8>, grid, dim3(threads), stream, h, gu, ffn);
  else launch_model_kernel(dependent, &swiglu_kernel<1>, grid, dim3(threads), stream, h, gu, ffn);
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
