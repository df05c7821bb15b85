// The pieces of the wgmma prefill (sm_90a, head_dim 128, 16-bit q and KV of the same type) that
// its body (prefill_wgmma_ws.cuh) is built from. The CTA's rows are those of prefill_mma.cuh
// (query tile of one sequence, one KV head: row r is token r / group, head r % group); 2 computing
// warpgroups own 64 rows each. Per KV tile of 128 keys: S = Q K^T as 8 wgmma m64n128k16 with both
// operands in shared memory (Q and K tiles K-major in the 128-byte swizzle), the online softmax on
// S's accumulators (mma.sync's m16n8 fragment layout: a row's keys in the 4 lanes of a quad), O +=
// P V as 8 wgmma with P from registers and V (stored [key][dim]) through the transpose bit; the
// causal mask, the window and the range's end only on tiles that reach them; soft-cap and ALiBi
// behind one uniform branch, as in the mma.sync kernel.
#pragma once

#include <cstdint>

#include "../attention_params.hpp"
#include "../prefill_plan.hpp"
#include "mma.cuh"
#include "prefill_mma.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

namespace pagedkv::kernels::cuda {
namespace detail {

/// The wgmma prefill's CTA: 2 warpgroups of 64 query rows, 128-key tiles, head_dim 128.
struct prefill_wgmma_policy {
  static constexpr int warpgroups = 2;
  static constexpr int threads = 128 * warpgroups;
  static constexpr int q_rows = 64 * warpgroups;
  static constexpr int kv_tokens = 128;
  static constexpr int head_dim = 128;
  static constexpr prefill_tile_shape tile() { return {q_rows, kv_tokens, 1}; }  // one CTA an SM (registers)
};

/// The wgmma prefill's tiles in shared memory, from a 1024-byte aligned base: a tile of rows of 128
/// 16-bit elements is stored as two 128-byte swizzle atom columns ([dims 0-63 of every row][dims
/// 64-127 of every row]); the Q tile (reused for the output rows), then the K and V stages.
struct prefill_wgmma_smem {
  using policy = prefill_wgmma_policy;
  static constexpr unsigned q_bytes = policy::q_rows * 256u;
  static constexpr unsigned tile_bytes = policy::kv_tokens * 256u;

  /// Byte offset of 16-byte chunk c (dims 8c .. 8c + 7) of row r in a tile of `rows` rows.
  __device__ __forceinline__ static unsigned at(int rows, int r, int c) {
    return unsigned((c / 8) * rows * 128 + r * 128 + (((c % 8) ^ (r % 8)) * 16));
  }
};

/// A CTA's work, as prefill_mma_kernel's: its sequence, rows (row r of the tile is token
/// (row0 + r) / group, head (row0 + r) % group) and KV range [begin, end) in tiles of BN keys.
struct prefill_wgmma_cta {
  int seq, kv_head, split, group, q_len, rows_total, row0, kv_len, q_begin, first_pos, last_pos, begin, end, num_tiles;
  const block_id* seq_blocks;

  /// False where the CTA's query tile lies past its sequence's rows (nothing to do).
  /// The longest causal ranges first (blockIdx.x's order); with plan.tiles_across_heads, the CTA's
  /// place in the grid's order (x, then y, then z) counts (query tile, KV head, sequence, split)
  /// with the sequence fastest, so that every head's longest tiles come before any head's shorter.
  __device__ __forceinline__ bool make(const attention_params& p, const prefill_plan& plan, int BM, int BN) {
    int longest;
    if (plan.tiles_across_heads) {  // place < 2^31: plan_prefill's grid check
      const int place = int(blockIdx.x) + int(gridDim.x) * (int(blockIdx.y) + int(gridDim.y) * int(blockIdx.z));
      const int seq_place = plan.seq_div.div(place), head_place = plan.kv_head_div.div(seq_place);
      seq = place - seq_place * plan.num_seqs;
      kv_head = seq_place - head_place * p.num_kv_heads;
      longest = plan.split_div.div(head_place);
      split = head_place - longest * plan.num_splits;
    } else {
      longest = plan.seq_div.div(int(blockIdx.x));
      seq = int(blockIdx.x) - longest * plan.num_seqs;
      kv_head = int(blockIdx.y);
      split = int(blockIdx.z);
    }
    const int tile = plan.q_tiles_per_seq - 1 - longest;
    group = plan.group;
    q_len = p.q_len(seq);
    rows_total = q_len * group;
    row0 = tile * BM;
    if (row0 >= rows_total) return false;
    kv_len = p.kv_len(seq);
    q_begin = p.q_begin(seq);
    first_pos = kv_len - q_len + plan.group_div.div(row0);
    last_pos = kv_len - q_len + plan.group_div.div(min(row0 + BM, rows_total) - 1);
    begin = p.window_left >= 0 ? max(0, first_pos - p.window_left) : 0;
    end = last_pos + 1;
    if (plan.num_splits > 1) {
      begin = max(begin, split * plan.split_tokens);
      end = min(end, (split + 1) * plan.split_tokens);
    }
    num_tiles = end > begin ? (end - begin + BN - 1) / BN : 0;
    seq_blocks = p.table.is_csr() ? p.table.indices + p.table.indptr[seq]
                                  : p.table.indices + std::int64_t(seq) * p.table.max_blocks_per_seq;
    return true;
  }
  /// The (token, query head) rows of o of tile rows r, r + 2, .., r + 2 (N - 1): one fast
  /// division for row r, then steps of two rows (token += 2 / group, head += 2 % group, carried).
  template <int N>
  __device__ __forceinline__ void out_rows(const attention_params& p, const prefill_plan& plan, int r,
                                           std::int64_t (&rows)[N]) const {
    const int packed = row0 + r, token = plan.group_div.div(packed);
    int head = packed - token * group;
    const int step_token = group == 1 ? 2 : group == 2 ? 1 : 0, step_head = group > 2 ? 2 : 0;
    const std::int64_t step = std::int64_t(step_token) * p.num_qo_heads + step_head, carry = p.num_qo_heads - group;
    std::int64_t row = std::int64_t(q_begin + token) * p.num_qo_heads + std::int64_t(kv_head) * group + head;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      rows[i] = row;
      head += step_head;
      row += step;
      if (head >= group) head -= group, row += carry;
    }
  }
  /// Pool offset of row `row` of KV tile t, -1 past the range: one block-table read.
  __device__ __forceinline__ std::int64_t row_offset(const attention_params& p, int t, int row, int BN) const {
    const int token = begin + t * BN + row;
    if (token >= end) return -1;
    const int j = token / p.table.block_size;
    return p.kv_offset(seq_blocks[j], token - j * p.table.block_size, kv_head);
  }
};

/// One thread's two rows of a warpgroup's accumulators (rows gid and gid + 8 of its warp's 16):
/// the online softmax of S tiles in mma.sync's m16n8 layout (s[4 nt + e]: row e / 2, key
/// 8 nt + 2 tig + e % 2), in log2 units with the logit scale folded into the exponent's FFMA on
/// the plain path; soft-cap and ALiBi in a pass of their own (as in prefill_mma_kernel).
struct prefill_wgmma_softmax {
  int pos[2], lowest[2];
  float slope[2], m[2], l[2], alpha[2];
  float scale, cap, inv_cap, fold;
  bool transform;

  __device__ __forceinline__ void init(const attention_params& p, const prefill_plan& plan, const prefill_wgmma_cta& c,
                                       int first_row) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int packed = c.row0 + first_row + 8 * r, token = plan.group_div.div(packed);
      pos[r] = c.kv_len - c.q_len + token;
      lowest[r] = p.window_left >= 0 ? pos[r] - p.window_left : -(1 << 30);
      slope[r] = p.alibi_slopes && packed < c.rows_total
                     ? p.alibi_slopes[c.kv_head * c.group + packed - token * c.group] * prefill_log2e
                     : 0.0f;
      m[r] = -INFINITY;
      l[r] = 0.0f;
      alpha[r] = 1.0f;
    }
    cap = p.logit_soft_cap;
    inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
    scale = p.sm_scale * p.k_scale_of(c.kv_head) * (cap > 0.0f ? 1.0f : prefill_log2e);
    transform = cap > 0.0f || p.alibi_slopes != nullptr || !(scale > 0.0f);
    fold = transform ? 1.0f : scale;
  }

  /// S of KV tile t (keys from tb) to its weights in place; alpha: the factor O is to be rescaled by.
  template <int N>
  __device__ __forceinline__ void tile(float (&s)[N], const attention_params& p, const prefill_wgmma_cta& c, int tb,
                                       int tig) {
    constexpr int s_tiles = N / 4, BN = N * 2;
    if (transform) {
#pragma unroll
      for (int nt = 0; nt < s_tiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e / 2, key = tb + nt * 8 + 2 * tig + e % 2;
          float x = s[nt * 4 + e] * scale;
          if (cap > 0.0f) x = cap * tanhf(x * inv_cap) * prefill_log2e;
          s[nt * 4 + e] = x + slope[r] * float(key - pos[r]);
        }
    }
    // The mask, only where some key of the tile is past the range, after a row's position or
    // before its window.
    const bool whole = tb + BN <= c.end && tb + BN - 1 <= c.first_pos &&
                       (p.window_left < 0 || tb >= c.last_pos - p.window_left);
    if (!whole) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int hi = min(c.end - 1, pos[r]) - tb - 2 * tig, lo = lowest[r] - tb - 2 * tig;
#pragma unroll
        for (int nt = 0; nt < s_tiles; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int col = nt * 8 + e;
            if (col > hi || col < lo) s[nt * 4 + 2 * r + e] = -INFINITY;
          }
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < s_tiles; ++nt) mx = fmaxf(mx, fmaxf(s[nt * 4 + 2 * r], s[nt * 4 + 2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[r], mx * fold);
      const float m_ref = m_new == -INFINITY ? 0.0f : m_new;  // no key yet: every weight is 0
      alpha[r] = exp2_approx(m[r] - m_ref);
      m[r] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < s_tiles; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float w = exp2_approx(fmaf(s[nt * 4 + 2 * r + e], fold, -m_ref));
          s[nt * 4 + 2 * r + e] = w;
          sum += w;
        }
      l[r] = l[r] * alpha[r] + sum;
    }
  }

  template <int N>
  __device__ __forceinline__ void rescale(float (&o)[N]) const {
#pragma unroll
    for (int i = 0; i < N; ++i) o[i] *= alpha[(i % 4) / 2];
  }
};

/// P's A fragments (mma.sync's m16n8k16 A layout: S's n-tiles 2 kk and 2 kk + 1) from the weights.
template <class T, int N>
__device__ __forceinline__ void prefill_wgmma_pack_p(std::uint32_t (&pf)[N / 8][4], const float (&s)[N]) {
#pragma unroll
  for (int kk = 0; kk < N / 8; ++kk) {
    pf[kk][0] = pack2<T>(s[(2 * kk) * 4 + 0], s[(2 * kk) * 4 + 1]);
    pf[kk][1] = pack2<T>(s[(2 * kk) * 4 + 2], s[(2 * kk) * 4 + 3]);
    pf[kk][2] = pack2<T>(s[(2 * kk + 1) * 4 + 0], s[(2 * kk + 1) * 4 + 1]);
    pf[kk][3] = pack2<T>(s[(2 * kk + 1) * 4 + 2], s[(2 * kk + 1) * 4 + 3]);
  }
}

/// A warp's 16 output rows: each row's sum over its 4 lanes, O staged as T in the warp's own rows
/// of the Q tile (q_tile: its shared base, BM rows), stored a 16-byte chunk a lane (rows
/// warp_row0 + lane / 16 + 2 i, chunk lane % 16: two whole rows an instruction), and the LSE (the
/// rows' tokens from the softmax's positions). With plan.num_splits > 1 into the split's partials.
/// o_map (the output's tensor map, boxes of a warp's 16 rows; nullptr: none): where set and the
/// warp's rows lie within the sequence, its first lane stores them by two TMA boxes instead.
template <class T, int BM>
__device__ __forceinline__ void prefill_wgmma_store(const attention_params& p, const prefill_plan& plan,
                                                    const prefill_wgmma_cta& c, prefill_wgmma_softmax& sm,
                                                    const float (&o)[64], unsigned char* q_tile, int warp_row0,
                                                    int lane, T* part_o, float* part_lse, const CUtensorMap* o_map) {
  constexpr int D = 128, chunks = D / 8;
  const int gid = lane / 4, tig = lane % 4;
  const float v_scale = p.v_scale_of(c.kv_head);
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    sm.l[r] += __shfl_xor_sync(0xffffffffu, sm.l[r], 1);
    sm.l[r] += __shfl_xor_sync(0xffffffffu, sm.l[r], 2);
    inv[r] = sm.l[r] > 0.0f ? v_scale / sm.l[r] : 0.0f;
  }
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      *reinterpret_cast<std::uint32_t*>(q_tile + prefill_wgmma_smem::at(BM, warp_row0 + gid + 8 * r, dt) + 4 * tig) =
          pack2<T>(o[dt * 4 + 2 * r] * inv[r], o[dt * 4 + 2 * r + 1] * inv[r]);
  const bool partial = plan.num_splits > 1;
  const std::int64_t split_rows = plan.merge_rows(p.num_qo_heads);
  const auto dest_row = [&](std::int64_t row) {  // row of o, or of this split's partials
    return partial ? std::int64_t(c.split) * split_rows + row - std::int64_t(plan.q_first) * p.num_qo_heads : row;
  };
  const int warp_packed0 = c.row0 + warp_row0;
  if (o_map && !partial && warp_packed0 + 16 <= c.rows_total) {
    fence_proxy_async_shared();  // this thread's rows visible to the bulk copy
    __syncwarp();
    if (lane == 0) {
      const unsigned src = static_cast<unsigned>(__cvta_generic_to_shared(q_tile)) + unsigned(warp_row0) * 128;
      const int token = c.q_begin + plan.group_div.div(warp_packed0), head = c.kv_head * c.group;
      tma_store_3d(o_map, src, 0, head, token);
      tma_store_3d(o_map, src + BM * 128, 64, head, token);
      tma_store_commit_and_wait_read();  // the CTA's shared memory stays until the boxes are read
    }
  } else {
    __syncwarp();
    T* o_g = partial ? part_o : static_cast<T*>(p.o);
    constexpr int per_lane = 16 * chunks / 32;
    const int r_first = warp_row0 + lane / chunks, ch = lane % chunks;
    std::int64_t rows[per_lane];
    c.out_rows(p, plan, r_first, rows);
#pragma unroll
    for (int i = 0; i < per_lane; ++i) {
      const int r = r_first + 2 * i;
      if (c.row0 + r < c.rows_total)
        *reinterpret_cast<uint4*>(o_g + dest_row(rows[i]) * D + ch * 8) =
            *reinterpret_cast<const uint4*>(q_tile + prefill_wgmma_smem::at(BM, r, ch));
    }
  }
  float* lse_g = partial ? part_lse : p.lse;
  if (lse_g && tig == 0)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int packed = c.row0 + warp_row0 + gid + 8 * r, token = sm.pos[r] - (c.kv_len - c.q_len);
      const std::int64_t row = std::int64_t(c.q_begin + token) * p.num_qo_heads + std::int64_t(c.kv_head) * c.group +
                               (packed - token * c.group);
      if (packed < c.rows_total)
        lse_g[dest_row(row)] = sm.l[r] > 0.0f ? (sm.m[r] + log2f(sm.l[r])) * prefill_ln2 : -INFINITY;
    }
}

/// The base of a kernel's dynamic shared memory rounded up to 1024 bytes: the swizzle is of
/// address bits 4-6 by bits 7-9, so atoms start 1024-byte aligned (the smem maps reserve 1 KiB).
__device__ __forceinline__ unsigned char* prefill_wgmma_smem_base(unsigned char* raw) {
  const unsigned raw_addr = static_cast<unsigned>(__cvta_generic_to_shared(raw));
  return raw + ((1024u - raw_addr % 1024u) % 1024u);
}

}  // namespace detail
}  // namespace pagedkv::kernels::cuda
