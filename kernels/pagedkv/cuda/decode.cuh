// Paged decode attention on the GPU: one query token per sequence, flash-decoding split-K over
// the sequence's tokens, and a merge kernel for the splits.
//
// Work unit: (sequence, KV head, split). One CTA serves every query head of the KV head's GQA
// group, so each KV byte leaves HBM once per KV head. K and V tiles stream into shared memory
// with cp.async (16-byte copies, `stages` deep); each tile is QK^T (a thread per (token, slice
// of head_dim)), an online-softmax update per query head (CUB warp reductions), then PV (a thread
// per (token group, 4 dims), fp32 accumulators for every head of the group).
//
// Graph safety: the grid depends only on host values (num_seqs, num_kv_heads, max_kv_len, the
// SM count); lengths and tables are read on the device. A graph captured with a capacity
// max_kv_len stays valid while sequences grow below it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <utility>

#include <cub/cub.cuh>
#include <cuda/functional>

#include "../attention_params.hpp"
#include "check.cuh"
#include "cp_async.cuh"
#include "decode_tuning.cuh"
#include "vec.cuh"

namespace pagedkv::kernels::cuda {

/// Most splits of one sequence (the merge kernel keeps one weight a split in shared memory).
inline constexpr std::int32_t max_decode_splits = 1024;

/// How a decode launch splits its work. Depends only on host values.
struct decode_plan {
  std::int32_t num_splits = 1;
  std::int32_t chunk_tokens = 0;  ///< tokens per split, a multiple of the tile
  std::size_t workspace_bytes = 0;
};

/// Chooses the split count: the smallest that fills the SMs' CTA slots to >= 90% in the last
/// wave, never splitting below min_chunk tokens.
inline decode_plan plan_decode(const attention_params& p, int num_sms, int ctas_per_sm, int tile_tokens,
                               int min_chunk) {
  decode_plan plan;
  const std::int64_t units = std::int64_t(p.num_seqs) * p.num_kv_heads;
  const std::int64_t slots = std::int64_t(num_sms) * (ctas_per_sm < 1 ? 1 : ctas_per_sm);
  const std::int32_t max_len = p.max_kv_len < 1 ? 1 : p.max_kv_len;
  const std::int32_t max_splits = std::min((max_len + min_chunk - 1) / min_chunk, max_decode_splits);
  // Efficiency is judged on the split count that results once a split is rounded up to whole
  // tiles, which is what the grid will have.
  const auto splits_of = [&](std::int32_t s) {
    const std::int32_t chunk = ((max_len + s - 1) / s + tile_tokens - 1) / tile_tokens * tile_tokens;
    return std::pair{(max_len + chunk - 1) / chunk, chunk};
  };
  std::int32_t best = 1;
  double best_eff = 0;
  for (std::int32_t s = 1; s <= max_splits && units > 0; ++s) {
    const std::int64_t ctas = units * splits_of(s).first;
    const std::int64_t waves = (ctas + slots - 1) / slots;
    const double eff = double(ctas) / double(waves * slots);
    if (eff > best_eff + 1e-9) { best_eff = eff; best = s; }
    if (eff >= 0.9) break;
  }
  std::tie(plan.num_splits, plan.chunk_tokens) = splits_of(best);
  if (plan.num_splits > 1)
    plan.workspace_bytes = std::size_t(plan.num_splits) * std::size_t(p.num_seqs) * std::size_t(p.num_qo_heads) *
                           (std::size_t(p.head_dim) + 1) * sizeof(float);
  return plan;
}

namespace detail {

inline constexpr float log2e = 1.4426950408889634f;
inline constexpr float ln2 = 0.6931471805599453f;

/// Lets the launch that depends on this grid (the split merge) start once every CTA got here.
__device__ __forceinline__ void let_dependents_launch() {
#if __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();
#endif
}

template <class T>
__device__ __forceinline__ void store_out(void* o, std::int64_t i, float x) {
  static_cast<T*>(o)[i] = from_float<T>(x);
}
__device__ __forceinline__ void store_out(dtype t, void* o, std::int64_t i, float x) {
  switch (t) {
    case dtype::f16: store_out<__half>(o, i, x); break;
    case dtype::bf16: store_out<__nv_bfloat16>(o, i, x); break;
    default: store_out<float>(o, i, x); break;
  }
}
__device__ __forceinline__ float load_q(dtype t, const void* q, std::int64_t i) {
  switch (t) {
    case dtype::f16: return to_float(static_cast<const __half*>(q)[i]);
    case dtype::bf16: return to_float(static_cast<const __nv_bfloat16*>(q)[i]);
    default: return static_cast<const float*>(q)[i];
  }
}

/// Shared-memory map of one decode CTA.
template <class TKV, int D, int GMax>
struct decode_smem {
  using policy = decode_policy<TKV, D>;
  static constexpr int threads = policy::threads;
  static constexpr int tile = policy::tile_tokens;
  static constexpr int stages = policy::stages;
  static constexpr int vec = vec16<TKV>;              // elements per 16-byte chunk
  static constexpr int chunks_per_row = D / vec;
  static constexpr int pitch = D + vec;               // padded row: rows land on different banks
  static constexpr int qk_split = threads / tile;     // threads per token in QK
  static constexpr int qk_dims = D / qk_split;        // dims per thread in QK
  static constexpr int q_pitch = qk_dims + 4;         // padded per-thread slice of q
  static constexpr int pv_row = D / 4;                // threads per token row in PV
  static constexpr int pv_groups = threads / pv_row;  // token groups in PV
  static_assert(D % vec == 0, "head_dim must be a multiple of 16 bytes of KV");
  static_assert(threads % tile == 0 && qk_split <= 32, "tile must divide the CTA");
  static_assert(qk_dims % vec == 0, "each QK thread reads whole 16-byte chunks");
  static_assert(pv_groups >= 1, "head_dim too large for the CTA");
  static constexpr std::size_t kv_bytes = std::size_t(2) * stages * tile * pitch * sizeof(TKV);
  static constexpr std::size_t reduce_bytes = std::size_t(pv_groups) * GMax * D * sizeof(float);
  static constexpr std::size_t kv_region = kv_bytes > reduce_bytes ? kv_bytes : reduce_bytes;
  static constexpr std::size_t q_bytes = std::size_t(GMax) * qk_split * q_pitch * sizeof(float);
  static constexpr std::size_t score_bytes = std::size_t(tile) * GMax * sizeof(float);
  static constexpr std::size_t state_bytes = std::size_t(3) * GMax * sizeof(float);
  static constexpr std::size_t bytes = kv_region + q_bytes + score_bytes + state_bytes;
};

/// The decode body for one (sequence, KV head, split). GMax is the group-size bucket: the CTA
/// computes GMax heads and writes the first group_size() of them.
template <class TKV, int D, int GMax>
__global__ void __launch_bounds__(decode_policy<TKV, D>::threads)
    decode_kernel(const attention_params p, const decode_plan plan, float* part_o, float* part_lse) {
  using smem_t = decode_smem<TKV, D, GMax>;
  constexpr int threads = smem_t::threads, tile = smem_t::tile, stages = smem_t::stages;
  constexpr int vec = smem_t::vec, cpr = smem_t::chunks_per_row, pitch = smem_t::pitch;
  constexpr int qk_split = smem_t::qk_split, qk_dims = smem_t::qk_dims, q_pitch = smem_t::q_pitch;
  constexpr int pv_row = smem_t::pv_row, pv_groups = smem_t::pv_groups;
  constexpr int warps = threads / 32;

  extern __shared__ __align__(16) unsigned char smem[];
  TKV* k_s = reinterpret_cast<TKV*>(smem);
  TKV* v_s = k_s + stages * tile * pitch;
  float* red_s = reinterpret_cast<float*>(smem);  // reused after the last tile
  float* q_s = reinterpret_cast<float*>(smem + smem_t::kv_region);
  float* score_s = q_s + GMax * qk_split * q_pitch;
  float* m_s = score_s + tile * GMax;
  float* l_s = m_s + GMax;
  float* alpha_s = l_s + GMax;
  using warp_reduce = cub::WarpReduce<float>;
  __shared__ typename warp_reduce::TempStorage reduce_storage[warps];

  const int tid = threadIdx.x;
  const int seq = blockIdx.x / p.num_kv_heads;
  const int kv_head = blockIdx.x % p.num_kv_heads;
  const int split = blockIdx.y;
  const int group = p.group_size();
  const int kv_len = p.kv_len(seq);
  int begin = split * plan.chunk_tokens;
  if (p.window_left >= 0) begin = max(begin, kv_len - 1 - p.window_left);
  const int end = min(kv_len, (split + 1) * plan.chunk_tokens);
  const std::int64_t q_row = std::int64_t(p.q_begin(seq)) * p.num_qo_heads + std::int64_t(kv_head) * group;

  if (begin >= end) {  // nothing to attend to in this split
    if (plan.num_splits > 1) {
      const std::int64_t row0 = (std::int64_t(split) * p.num_seqs + seq) * p.num_qo_heads + kv_head * group;
      for (int g = tid; g < group; g += threads) part_lse[row0 + g] = -INFINITY;
      for (int i = tid; i < group * D; i += threads) part_o[row0 * D + i] = 0.0f;  // the merge reads it
    } else {
      for (int i = tid; i < group * D; i += threads) store_out(p.q_dtype, p.o, q_row * D + i, 0.0f);
      if (p.lse)
        for (int g = tid; g < group; g += threads) p.lse[q_row + g] = -INFINITY;
    }
    return;
  }

  const auto* k_g = static_cast<const TKV*>(p.k);
  const auto* v_g = static_cast<const TKV*>(p.v);
  const int bs = p.table.block_size;
  const int num_tiles = (end - begin + tile - 1) / tile;

  // Issues the cp.async copies of tile `t` into stage `t % stages` (zero rows past `end`).
  const auto issue_tile = [&](int t) {
    const int stage = t % stages;
    const int start = begin + t * tile;
#pragma unroll
    for (int c = tid; c < tile * cpr; c += threads) {
      const int row = c / cpr, col = c % cpr;
      const int token = start + row;
      const bool valid = token < end;
      std::int64_t off = 0;
      if (valid) {
        const int j = token / bs;
        off = p.kv_offset(p.table.block(seq, j), token - j * bs, kv_head) + col * vec;
      }
      const int s = (stage * tile + row) * pitch + col * vec;
      cp_async_16(k_s + s, k_g + off, valid);
      cp_async_16(v_s + s, v_g + off, valid);
    }
  };

  // Pipeline prologue first, so the loads fly while q is staged.
#pragma unroll
  for (int t = 0; t < stages - 1; ++t) {
    if (t < num_tiles) issue_tile(t);
    cp_async_commit();
  }
  let_dependents_launch();

  // q of every head of the group, pre-scaled so that a dot product is the logit in log2 units
  // (or in natural units when a soft-cap has to see them).
  const float q_scale = p.sm_scale * p.k_scale_of(kv_head) * (p.logit_soft_cap > 0.0f ? 1.0f : log2e);
  for (int i = tid; i < GMax * D; i += threads) {
    const int g = i / D, d = i % D;
    const float x = g < group ? load_q(p.q_dtype, p.q, (q_row + g) * D + d) * q_scale : 0.0f;
    q_s[(g * qk_split + d / qk_dims) * q_pitch + d % qk_dims] = x;
  }
  if (tid < GMax) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.0f;
    alpha_s[tid] = 1.0f;
  }

  float acc[GMax][4];
#pragma unroll
  for (int g = 0; g < GMax; ++g)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[g][e] = 0.0f;

  const int qk_token = tid / qk_split, qk_part = tid % qk_split;
  const int pv_group = tid / pv_row, pv_col = tid % pv_row;
  const int warp = tid / 32, lane = tid % 32;

  for (int t = 0; t < num_tiles; ++t) {
    cp_async_wait<stages - 2>();
    __syncthreads();  // tile t landed for everyone; stage (t - 1) % stages is free again
    if (t + stages - 1 < num_tiles) issue_tile(t + stages - 1);
    cp_async_commit();
    const int stage = t % stages;

    // QK^T: logits of this thread's token for every head, over its slice of head_dim.
    {
      float dot[GMax];
#pragma unroll
      for (int g = 0; g < GMax; ++g) dot[g] = 0.0f;
      const TKV* k_row = k_s + (stage * tile + qk_token) * pitch + qk_part * qk_dims;
#pragma unroll
      for (int i = 0; i < qk_dims; i += vec) {
        float kf[vec];
        load16_as_float(k_row + i, kf);
#pragma unroll
        for (int g = 0; g < GMax; ++g) {
          const float* qg = q_s + (g * qk_split + qk_part) * q_pitch + i;
#pragma unroll
          for (int e = 0; e < vec; e += 4) {
            const float4 qv = *reinterpret_cast<const float4*>(qg + e);
            dot[g] += qv.x * kf[e] + qv.y * kf[e + 1] + qv.z * kf[e + 2] + qv.w * kf[e + 3];
          }
        }
      }
#pragma unroll
      for (int g = 0; g < GMax; ++g)
#pragma unroll
        for (int off = qk_split / 2; off > 0; off /= 2) dot[g] += __shfl_xor_sync(0xffffffffu, dot[g], off);
      if (qk_part == 0) {
        const bool valid = begin + t * tile + qk_token < end;
#pragma unroll
        for (int g = 0; g < GMax; ++g) {
          float s = dot[g];
          if (p.logit_soft_cap > 0.0f) s = p.logit_soft_cap * tanhf(s / p.logit_soft_cap) * log2e;
          score_s[qk_token * GMax + g] = valid ? s : -INFINITY;
        }
      }
    }
    __syncthreads();

    // Online softmax: a warp per head; scores become probabilities in place.
    for (int g = warp; g < GMax; g += warps) {
      float tile_max = -INFINITY;
      for (int r = lane; r < tile; r += 32) tile_max = fmaxf(tile_max, score_s[r * GMax + g]);
      tile_max = warp_reduce(reduce_storage[warp]).Reduce(tile_max, ::cuda::maximum<float>{});
      tile_max = __shfl_sync(0xffffffffu, tile_max, 0);
      const float m_old = m_s[g];
      const float m_new = fmaxf(m_old, tile_max);
      float sum = 0.0f;
      for (int r = lane; r < tile; r += 32) {
        const float s = score_s[r * GMax + g];
        const float prob = s == -INFINITY ? 0.0f : exp2f(s - m_new);
        score_s[r * GMax + g] = prob;
        sum += prob;
      }
      __syncwarp();
      sum = warp_reduce(reduce_storage[warp]).Sum(sum);
      if (lane == 0) {
        const float alpha = m_old == -INFINITY ? (m_new == -INFINITY ? 1.0f : 0.0f) : exp2f(m_old - m_new);
        alpha_s[g] = alpha;
        l_s[g] = l_s[g] * alpha + sum;
        m_s[g] = m_new;
      }
      __syncwarp();
    }
    __syncthreads();

    // PV: this thread's 4 dims, over its token group, for every head.
    if (pv_group < pv_groups) {
#pragma unroll
      for (int g = 0; g < GMax; ++g) {
        const float alpha = alpha_s[g];
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[g][e] *= alpha;
      }
      const TKV* v_tile = v_s + stage * tile * pitch + pv_col * 4;
#pragma unroll 4
      for (int r = pv_group; r < tile; r += pv_groups) {
        float vf[4];
        load4_as_float(v_tile + r * pitch, vf);
        float prob[GMax];
        if constexpr (GMax % 4 == 0) {
#pragma unroll
          for (int g = 0; g < GMax; g += 4) {
            const float4 p4 = *reinterpret_cast<const float4*>(score_s + r * GMax + g);
            prob[g] = p4.x; prob[g + 1] = p4.y; prob[g + 2] = p4.z; prob[g + 3] = p4.w;
          }
        } else {
#pragma unroll
          for (int g = 0; g < GMax; ++g) prob[g] = score_s[r * GMax + g];
        }
#pragma unroll
        for (int g = 0; g < GMax; ++g)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[g][e] += prob[g] * vf[e];
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every tile consumed: the KV region becomes the reduction buffer

  if (pv_group < pv_groups)
#pragma unroll
    for (int g = 0; g < GMax; ++g)
      *reinterpret_cast<float4*>(red_s + (pv_group * GMax + g) * D + pv_col * 4) =
          make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
  __syncthreads();

  const float v_scale = p.v_scale_of(kv_head);
  for (int i = tid; i < group * D; i += threads) {
    const int g = i / D, d = i % D;
    float sum = 0.0f;
#pragma unroll
    for (int y = 0; y < pv_groups; ++y) sum += red_s[(y * GMax + g) * D + d];
    const float l = l_s[g];
    const float out = l > 0.0f ? sum / l * v_scale : 0.0f;
    const float lse2 = l > 0.0f ? m_s[g] + log2f(l) : -INFINITY;  // log2 units
    if (plan.num_splits == 1) {
      store_out(p.q_dtype, p.o, (q_row + g) * D + d, out);
      if (p.lse && d == 0) p.lse[q_row + g] = lse2 * ln2;
    } else {
      const std::int64_t row = (std::int64_t(split) * p.num_seqs + seq) * p.num_qo_heads + kv_head * group + g;
      part_o[row * D + d] = out;
      if (d == 0) part_lse[row] = lse2;
    }
  }
}

/// Combines the splits of each (sequence, head): o = sum_s w_s o_s / sum_s w_s with
/// w_s = 2^(lse_s - max lse). A CTA per (sequence, head); CUB block reductions over the splits.
template <int D>
__global__ void __launch_bounds__(128)
    merge_splits_kernel(const attention_params p, const decode_plan plan, const float* part_o, const float* part_lse) {
  using block_reduce = cub::BlockReduce<float, 128>;
  __shared__ typename block_reduce::TempStorage storage;
  __shared__ float shared_max, shared_sum;
  __shared__ float weight_s[max_decode_splits];
#if __CUDA_ARCH__ >= 900
  // Launched as a programmatic dependent of the decode kernel: it may start while the decode
  // grid drains, and waits here until the decode's writes are complete and visible.
  cudaGridDependencySynchronize();
#endif
  const int seq = blockIdx.x / p.num_qo_heads;
  const int head = blockIdx.x % p.num_qo_heads;
  const std::int64_t stride = std::int64_t(p.num_seqs) * p.num_qo_heads;
  const std::int64_t row0 = std::int64_t(seq) * p.num_qo_heads + head;
  float local_max = -INFINITY;
  for (int s = threadIdx.x; s < plan.num_splits; s += 128) local_max = fmaxf(local_max, part_lse[s * stride + row0]);
  const float max_all = block_reduce(storage).Reduce(local_max, ::cuda::maximum<float>{});
  if (threadIdx.x == 0) shared_max = max_all;
  __syncthreads();
  const float m = shared_max;
  float local_sum = 0.0f;
  for (int s = threadIdx.x; s < plan.num_splits; s += 128) {
    const float lse = part_lse[s * stride + row0];
    const float w = lse == -INFINITY ? 0.0f : exp2f(lse - m);
    weight_s[s] = w;
    local_sum += w;
  }
  const float sum_all = block_reduce(storage).Sum(local_sum);
  if (threadIdx.x == 0) shared_sum = sum_all;
  __syncthreads();
  const float sum = shared_sum;
  const std::int64_t out_row = std::int64_t(p.q_begin(seq)) * p.num_qo_heads + head;
  for (int d = threadIdx.x; d < D; d += 128) {
    // No branch: empty splits wrote zeros, so the loads can all be in flight at once.
    float acc = 0.0f;
#pragma unroll 8
    for (int s = 0; s < plan.num_splits; ++s) acc += weight_s[s] * part_o[(s * stride + row0) * D + d];
    store_out(p.q_dtype, p.o, out_row * D + d, sum > 0.0f ? acc / sum : 0.0f);
  }
  if (p.lse && threadIdx.x == 0) p.lse[out_row] = sum > 0.0f ? (m + log2f(sum)) * ln2 : -INFINITY;
}

}  // namespace detail

namespace detail {

/// What a launch needs to know about a kernel on the current device: looked up once per
/// (kernel, device), since the lookups cost host time that small decode launches cannot afford.
struct launch_facts {
  int num_sms = 0;
  int ctas_per_sm = 0;
};

/// Tag is a type unique to the kernel (its shared-memory map), so each kernel has its own facts.
template <class Tag, class Kernel>
const launch_facts& facts_of(Kernel kernel, int threads, std::size_t smem_bytes) {
  constexpr int max_devices = 64;
  static launch_facts facts[max_devices];  // one per Tag, i.e. per kernel
  int device = 0;
  PAGEDKV_CUDA_CHECK(cudaGetDevice(&device));
  if (device >= max_devices) pagedkv::detail::fail(errc::invalid_argument, "device ", device, " beyond ", max_devices);
  launch_facts& f = facts[device];
  if (f.num_sms == 0) {
    launch_facts fresh;
    PAGEDKV_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_bytes)));
    PAGEDKV_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fresh.ctas_per_sm, kernel, threads, smem_bytes));
    PAGEDKV_CUDA_CHECK(cudaDeviceGetAttribute(&fresh.num_sms, cudaDevAttrMultiProcessorCount, device));
    f = fresh;
  }
  return f;
}

/// Launches a decode kernel over (sequence x KV head, split) and, with several splits, the merge.
template <int D, class Kernel>
void launch_with_merge(Kernel kernel, const attention_params& p, const decode_plan& plan, int threads,
                       std::size_t smem_bytes, void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  if (workspace_bytes < plan.workspace_bytes)
    pagedkv::detail::fail(errc::buffer_too_small, "decode workspace of ", workspace_bytes, " bytes, ",
                          plan.workspace_bytes, " needed");
  float* part_o = static_cast<float*>(workspace);
  float* part_lse = part_o + std::size_t(plan.num_splits) * p.num_seqs * p.num_qo_heads * D;
  const dim3 grid(unsigned(p.num_seqs * p.num_kv_heads), unsigned(plan.num_splits));
  kernel<<<grid, threads, smem_bytes, stream>>>(p, plan, part_o, part_lse);
  PAGEDKV_CUDA_CHECK(cudaGetLastError());
  if (plan.num_splits > 1) {
    // Programmatic dependent launch (Hopper): the merge's launch and prologue overlap the decode
    // grid's tail instead of following its end, which small latency-bound shapes feel.
    cudaLaunchAttribute overlap{};
    overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    overlap.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(unsigned(p.num_seqs * p.num_qo_heads));
    config.blockDim = dim3(128);
    config.stream = stream;
    config.attrs = &overlap;
    config.numAttrs = 1;
    const float* const_part_o = part_o;
    const float* const_part_lse = part_lse;
    PAGEDKV_CUDA_CHECK(cudaLaunchKernelEx(&config, merge_splits_kernel<D>, p, plan, const_part_o, const_part_lse));
  }
}

}  // namespace detail

/// Plans and launches the CUDA-core decode for one (KV type, head_dim, group bucket).
template <class TKV, int D, int GMax>
decode_plan launch_decode(const attention_params& p, void* workspace, std::size_t workspace_bytes,
                          cudaStream_t stream, bool launch) {
  using smem_t = detail::decode_smem<TKV, D, GMax>;
  using policy = decode_policy<TKV, D>;
  const auto kernel = detail::decode_kernel<TKV, D, GMax>;
  const detail::launch_facts& f = detail::facts_of<smem_t>(kernel, policy::threads, smem_t::bytes);
  const decode_plan plan = plan_decode(p, f.num_sms, f.ctas_per_sm, policy::tile_tokens, policy::min_chunk_tokens);
  if (!launch || p.num_seqs == 0) return plan;
  detail::launch_with_merge<D>(kernel, p, plan, policy::threads, smem_t::bytes, workspace, workspace_bytes, stream);
  return plan;
}

}  // namespace pagedkv::kernels::cuda
