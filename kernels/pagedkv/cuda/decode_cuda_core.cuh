// The CUDA-core decode body: fp32 KV, and fp8 KV under an fp32 q (16-bit KV and fp8 under a 16-bit
// q run on tensor cores, decode_mma.cuh). Each warp owns a slice of every tile's rows and runs
// them alone: QK^T (a few lanes per token), an online-softmax update per query head (warp
// shuffles), PV (a lane per 4-dim chunk, fp32 accumulators for every head of the group); the
// warps merge their softmax states once, at the end.
#pragma once

#include <cmath>
#include <cstdint>

#include "../attention_params.hpp"
#include "../decode_plan.hpp"
#include "../decode_tuning.hpp"
#include "cp_async.cuh"
#include "decode_common.cuh"
#include "decode_launch.cuh"
#include "vec.cuh"

namespace pagedkv::kernels::cuda {
namespace detail {

/// Shared-memory map of one decode CTA. Each warp owns `warp_tokens` rows of every tile, from
/// the copy into shared memory to PV, so the main loop has no CTA-wide barrier.
template <class TKV, int D, int GMax>
struct decode_smem {
  using policy = decode_policy<TKV, D>;
  static constexpr int threads = policy::threads;
  static constexpr int warps = threads / 32;
  static constexpr int tile = policy::tile_tokens;
  static constexpr int stages = policy::stages;
  static constexpr int vec = vec16<TKV>;              // elements per 16-byte chunk
  static constexpr int chunks_per_row = D / vec;
  // Swizzled where rows are whole 128-byte segments, for fp8 KV (decode-kernel.md, "Swizzled
  // rows"); fp32 rows, a reference-speed path, stay padded (swizzled, the head_dim 256 group 16
  // body spills).
  using rows = kv_smem_rows<TKV, D, sizeof(TKV) == 1 && (D * sizeof(TKV)) % 128 == 0>;
  static constexpr int pitch = rows::pitch;
  static constexpr int warp_tokens = tile / warps;    // rows of a tile that one warp owns
  static constexpr int qk_split = threads / tile;     // lanes per token in QK
  static constexpr int qk_dims = D / qk_split;        // dims per lane in QK
  static constexpr int q_pitch = qk_dims + 4;         // padded per-lane slice of q
  static constexpr int pv_chunks = D / 4;             // 4-dim chunks of a V row
  static constexpr int pv_per_lane = (pv_chunks + 31) / 32;  // chunks a lane accumulates in PV
  static_assert(D % vec == 0, "head_dim must be a multiple of 16 bytes of KV");
  static_assert(tile % warps == 0 && qk_split * warp_tokens == 32, "a warp's rows must fill its lanes");
  static_assert(qk_dims % vec == 0, "each QK lane reads whole 16-byte chunks");
  static_assert(D % 4 == 0, "PV reads V in 4-element chunks");
  static_assert(tile % 8 == 0, "a row's swizzle key is the same in every stage");
  static constexpr std::size_t kv_bytes = std::size_t(2) * stages * tile * pitch * sizeof(TKV);
  /// After the last tile: every warp's (m, l) and accumulators, merged across warps.
  static constexpr std::size_t reduce_bytes = std::size_t(warps) * GMax * (D + 2) * sizeof(float);
  static constexpr std::size_t kv_region = kv_bytes > reduce_bytes ? kv_bytes : reduce_bytes;
  static constexpr std::size_t q_bytes = std::size_t(GMax) * qk_split * q_pitch * sizeof(float);
  static constexpr std::size_t bytes = kv_region + q_bytes + alibi_slots<GMax>::bytes;
};

/// The decode body for one (sequence, KV head, split). GMax is the group-size bucket: the CTA
/// computes GMax heads and writes the first group_size() of them.
///
/// Warp w owns rows [w * warp_tokens, (w + 1) * warp_tokens) of every tile: it copies them
/// (cp.async, its own commit groups), computes their logits (qk_split lanes a token), keeps its own
/// online-softmax state (m, l per head, in registers) and accumulates PV over them (lane holds
/// 4-dim chunks of every head). Warps meet once, after the last tile, to merge their states: a
/// CTA-wide barrier per tile cost the large shapes bandwidth (decode-kernel.md, "CUDA-core body").
template <class TKV, int D, int GMax>
__global__ void __launch_bounds__(decode_policy<TKV, D>::threads)
    decode_kernel(const attention_params p, const decode_plan plan, float* part_o, float* part_lse) {
  using smem_t = decode_smem<TKV, D, GMax>;
  constexpr int threads = smem_t::threads, warps = smem_t::warps, tile = smem_t::tile, stages = smem_t::stages;
  using rows = typename smem_t::rows;
  constexpr int vec = smem_t::vec, pitch = smem_t::pitch;
  constexpr int warp_tokens = smem_t::warp_tokens, qk_split = smem_t::qk_split, qk_dims = smem_t::qk_dims;
  constexpr int q_pitch = smem_t::q_pitch, pv_chunks = smem_t::pv_chunks, pv_per_lane = smem_t::pv_per_lane;

  extern __shared__ __align__(128) unsigned char smem[];
  TKV* k_s = reinterpret_cast<TKV*>(smem);
  TKV* v_s = k_s + stages * tile * pitch;
  float* q_s = reinterpret_cast<float*>(smem + smem_t::kv_region);
  float* alibi_s = reinterpret_cast<float*>(smem + smem_t::kv_region + smem_t::q_bytes);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int row0 = warp * warp_tokens;  // this warp's first row in a tile
  // Pipeline prologue first, so the loads fly while q is staged.
  warp_copies<TKV, D, rows, warp_tokens, tile, stages> copies{.row0 = row0, .lane = lane, .k_s = k_s, .v_s = v_s};
  if (!copies.start(p, plan, part_o, part_lse)) return;
  const decode_unit& u = copies.u;
  const int kv_head = u.kv_head, group = u.group, begin = u.begin, end = u.end, num_tiles = copies.num_tiles;
  const std::int64_t q_row = u.q_row;

  // q of every head of the group, pre-scaled so that a dot product is the logit in log2 units
  // (or in natural units when a soft-cap has to see them).
  const float q_scale = p.sm_scale * p.k_scale_of(kv_head) * (p.logit_soft_cap > 0.0f ? 1.0f : log2e);
  for (int i = tid; i < GMax * D; i += threads) {
    const int g = i / D, d = i % D;
    const float x = g < group ? load_q(p.q_dtype, p.q, (q_row + g) * D + d) * q_scale : 0.0f;
    q_s[(g * qk_split + d / qk_dims) * q_pitch + d % qk_dims] = x;
  }
  if (p.alibi_slopes) alibi_slots<GMax>::stage(alibi_s, p, u);
  __syncthreads();  // q (and ALiBi) is read by every warp; the only barrier before the merge

  float m[GMax], l[GMax], acc[GMax][pv_per_lane][4];
#pragma unroll
  for (int g = 0; g < GMax; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int c = 0; c < pv_per_lane; ++c)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[g][c][e] = 0.0f;
  }
  const int qk_token = lane / qk_split, qk_part = lane % qk_split;

  for (int t = 0; t < num_tiles; ++t) {
    copies.advance(p, t);
    const int stage = t % stages;

    // QK^T: the logit of this lane's token for every head, over its slice of head_dim; after
    // the shuffles every lane of the token holds it.
    float s[GMax];
#pragma unroll
    for (int g = 0; g < GMax; ++g) s[g] = 0.0f;
    const TKV* k_row = k_s + (stage * tile + row0 + qk_token) * pitch;
    const int k_key = rows::key(row0 + qk_token);  // stage * tile is a multiple of 8 rows
#pragma unroll
    for (int i = 0; i < qk_dims; i += vec) {
      float kf[vec];
      load16_as_float(k_row + rows::in_row(qk_part * qk_dims + i, k_key), kf);
#pragma unroll
      for (int g = 0; g < GMax; ++g) {
        const float* qg = q_s + (g * qk_split + qk_part) * q_pitch + i;
#pragma unroll
        for (int e = 0; e < vec; e += 4) {
          const float4 qv = *reinterpret_cast<const float4*>(qg + e);
          s[g] += qv.x * kf[e] + qv.y * kf[e + 1] + qv.z * kf[e + 2] + qv.w * kf[e + 3];
        }
      }
    }
    const bool valid = begin + t * tile + row0 + qk_token < end;
#pragma unroll
    for (int g = 0; g < GMax; ++g) {
#pragma unroll
      for (int off = qk_split / 2; off > 0; off /= 2) s[g] += __shfl_xor_sync(0xffffffffu, s[g], off);
      if (p.logit_soft_cap > 0.0f) s[g] = p.logit_soft_cap * tanhf(s[g] / p.logit_soft_cap) * log2e;
      if (p.alibi_slopes) s[g] += alibi_slots<GMax>::bias(alibi_s, g, begin + t * tile + row0 + qk_token);
      if (!valid) s[g] = -INFINITY;
    }

    // Online softmax over this warp's tokens: reductions across token groups (lane bits at and
    // above qk_split), so each token counts once.
#pragma unroll
    for (int g = 0; g < GMax; ++g) {
      float tile_max = s[g];
#pragma unroll
      for (int off = qk_split; off < 32; off *= 2) tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, off));
      const float m_new = fmaxf(m[g], tile_max);
      const float prob = s[g] == -INFINITY ? 0.0f : exp2f(s[g] - m_new);
      float sum = prob;
#pragma unroll
      for (int off = qk_split; off < 32; off *= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      const float alpha = m[g] == -INFINITY ? (m_new == -INFINITY ? 1.0f : 0.0f) : exp2f(m[g] - m_new);
      l[g] = l[g] * alpha + sum;
      m[g] = m_new;
#pragma unroll
      for (int c = 0; c < pv_per_lane; ++c)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[g][c][e] *= alpha;
      s[g] = prob;
    }

    // PV over this warp's rows: the token's probability comes from its QK lanes.
    const TKV* v_rows = v_s + (stage * tile + row0) * pitch;
#pragma unroll
    for (int r = 0; r < warp_tokens; ++r) {
      float prob[GMax];
#pragma unroll
      for (int g = 0; g < GMax; ++g) prob[g] = __shfl_sync(0xffffffffu, s[g], r * qk_split);
#pragma unroll
      for (int c = 0; c < pv_per_lane; ++c) {
        const int chunk = lane + 32 * c;
        if (pv_chunks % 32 == 0 || chunk < pv_chunks) {
          float vf[4];
          load4_as_float(v_rows + r * pitch + rows::in_row(chunk * 4, rows::key(row0 + r)), vf);
#pragma unroll
          for (int g = 0; g < GMax; ++g)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[g][c][e] += prob[g] * vf[e];
        }
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with its tiles: the KV region becomes the merge buffer

  // Merge the warps: o = sum_w 2^(m_w - M) acc_w / sum_w 2^(m_w - M) l_w.
  float* acc_s = reinterpret_cast<float*>(smem);       // [warps, GMax, D]
  float* ml_s = acc_s + warps * GMax * D;               // [warps, GMax, 2]
#pragma unroll
  for (int g = 0; g < GMax; ++g) {
#pragma unroll
    for (int c = 0; c < pv_per_lane; ++c) {
      const int chunk = lane + 32 * c;
      if (pv_chunks % 32 == 0 || chunk < pv_chunks)
        *reinterpret_cast<float4*>(acc_s + (warp * GMax + g) * D + chunk * 4) =
            make_float4(acc[g][c][0], acc[g][c][1], acc[g][c][2], acc[g][c][3]);
    }
    if (lane == 0) {
      ml_s[(warp * GMax + g) * 2] = m[g];
      ml_s[(warp * GMax + g) * 2 + 1] = l[g];
    }
  }
  __syncthreads();

  merge_warps_and_store<D, GMax, warps>(p, plan, u, acc_s, ml_s, part_o, part_lse);
}

/// Combines the splits of each (sequence, head): o = sum_s w_s o_s / sum_s w_s with

}  // namespace detail

/// Plans and launches the CUDA-core decode for one (KV type, head_dim, group bucket).
template <class TKV, int D, int GMax>
decode_plan launch_decode(const attention_params& p, void* workspace, std::size_t workspace_bytes,
                          cudaStream_t stream, bool launch) {
  using smem_t = detail::decode_smem<TKV, D, GMax>;
  using policy = decode_policy<TKV, D>;
  const auto kernel = detail::decode_kernel<TKV, D, GMax>;
  const detail::launch_facts& f = detail::facts_of<smem_t>([&] { detail::allow_smem(kernel, smem_t::bytes); });
  const decode_plan plan = plan_decode(p, f.num_sms, policy::tile_tokens, policy::min_chunk_tokens);
  if (!launch || p.num_seqs == 0) return plan;
  detail::launch_with_merge<D>(kernel, p, plan, policy::threads, smem_t::bytes, workspace, workspace_bytes, stream);
  return plan;
}

}  // namespace pagedkv::kernels::cuda
