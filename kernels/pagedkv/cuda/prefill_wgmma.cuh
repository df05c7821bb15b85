// Paged prefill on Hopper's warpgroup tensor-core instructions (wgmma, sm_90a), head_dim 128,
// 16-bit q and KV of the same type. The CTA's rows are those of prefill_mma.cuh (query tile of one
// sequence, one KV head: row r is token r / group, head r % group); its 2 warpgroups own 64 rows
// each. Per KV tile of 128 keys: S = Q K^T as 8 wgmma m64n128k16 with both operands in shared
// memory (Q and K tiles K-major in the 128-byte swizzle), the online softmax on S's accumulators
// (mma.sync's m16n8 fragment layout: a row's keys in the 4 lanes of a quad), O += P V as 8 wgmma
// with P from registers and V (stored [key][dim]) through the transpose bit. The GEMMs of one
// tile overlap the softmax of the next (FlashAttention-3's intra-warpgroup pipelining): iteration
// t issues S_t and O += P_(t-1) V_(t-1) together, waits for S_t only, and runs S_t's softmax while
// the tensor cores do the P V product. K/V tiles come through the block table by cp.async (any
// block size, pages not tile-aligned), K of tile t + 1 and V of tile t in flight during the
// math of iteration t; the causal mask, the window and the range's end only on tiles that reach
// them; soft-cap and ALiBi behind one uniform branch, as in the mma.sync kernel.
#pragma once

#include <cstdint>

#include "../attention_params.hpp"
#include "../prefill_plan.hpp"
#include "cp_async.cuh"
#include "dependent_launch.cuh"
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
  static constexpr prefill_tile_shape tile() { return {q_rows, kv_tokens}; }
};

/// Shared memory of the wgmma prefill, from a 1024-byte aligned base: the Q tile (reused for the
/// output rows), two K and two V stages, each a tile of rows of 128 16-bit elements stored as two
/// 128-byte swizzle atoms columns ([dims 0-63 of every row][dims 64-127 of every row]), and three
/// stages of row offsets into the pool.
struct prefill_wgmma_smem {
  using policy = prefill_wgmma_policy;
  static constexpr unsigned q_bytes = policy::q_rows * 256u;
  static constexpr unsigned tile_bytes = policy::kv_tokens * 256u;
  static constexpr unsigned k_offset = q_bytes;
  static constexpr unsigned v_offset = k_offset + 2 * tile_bytes;
  static constexpr unsigned rows_offset = v_offset + 2 * tile_bytes;
  static constexpr int row_stages = 3;
  static constexpr unsigned bar_offset = rows_offset + row_stages * policy::kv_tokens * sizeof(std::int64_t);
  static constexpr std::size_t bytes = bar_offset + 4 * sizeof(std::uint64_t) + 1024;  // + the K and V mbarriers

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
  __device__ __forceinline__ bool make(const attention_params& p, const prefill_plan& plan, int BM, int BN) {
    seq = int(blockIdx.x) % plan.num_seqs;
    const int tile = plan.q_tiles_per_seq - 1 - int(blockIdx.x) / plan.num_seqs;  // the longest causal ranges first
    kv_head = int(blockIdx.y);
    split = int(blockIdx.z);
    group = p.group_size();
    q_len = p.q_len(seq);
    rows_total = q_len * group;
    row0 = tile * BM;
    if (row0 >= rows_total) return false;
    kv_len = p.kv_len(seq);
    q_begin = p.q_begin(seq);
    first_pos = kv_len - q_len + row0 / group;
    last_pos = kv_len - q_len + (min(row0 + BM, rows_total) - 1) / group;
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
  /// The (token, query head) row of q and o of tile row r.
  __device__ __forceinline__ std::int64_t out_row(const attention_params& p, int r) const {
    const int packed = row0 + r;
    return std::int64_t(q_begin + packed / group) * p.num_qo_heads + std::int64_t(kv_head) * group + packed % group;
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

  __device__ __forceinline__ void init(const attention_params& p, const prefill_wgmma_cta& c, int first_row) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int packed = c.row0 + first_row + 8 * r;
      pos[r] = c.kv_len - c.q_len + packed / c.group;
      lowest[r] = p.window_left >= 0 ? pos[r] - p.window_left : -(1 << 30);
      slope[r] = p.alibi_slopes && packed < c.rows_total
                     ? p.alibi_slopes[c.kv_head * c.group + packed % c.group] * prefill_log2e
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
/// of the Q tile (q_tile: its shared base, BM rows), stored a 16-byte chunk a lane, and the LSE.
/// With plan.num_splits > 1 into the split's partials.
template <class T, int BM>
__device__ __forceinline__ void prefill_wgmma_store(const attention_params& p, const prefill_plan& plan,
                                                    const prefill_wgmma_cta& c, prefill_wgmma_softmax& sm,
                                                    const float (&o)[64], unsigned char* q_tile, int warp_row0,
                                                    int lane, T* part_o, float* part_lse) {
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
  __syncwarp();
  const bool partial = plan.num_splits > 1;
  const std::int64_t split_rows = plan.merge_rows(p.num_qo_heads);
  const auto dest_row = [&](int r) {  // row of o, or of this split's partials
    const std::int64_t row = c.out_row(p, r);
    return partial ? std::int64_t(c.split) * split_rows + row - std::int64_t(plan.q_first) * p.num_qo_heads : row;
  };
  T* o_g = partial ? part_o : static_cast<T*>(p.o);
#pragma unroll
  for (int i = 0; i < 16 * chunks / 32; ++i) {
    const int ci = lane + i * 32;
    const int r = warp_row0 + ci / chunks, ch = ci % chunks;
    if (c.row0 + r < c.rows_total)
      *reinterpret_cast<uint4*>(o_g + dest_row(r) * D + ch * 8) =
          *reinterpret_cast<const uint4*>(q_tile + prefill_wgmma_smem::at(BM, r, ch));
  }
  float* lse_g = partial ? part_lse : p.lse;
  if (lse_g && tig == 0)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = warp_row0 + gid + 8 * r;
      if (c.row0 + row < c.rows_total)
        lse_g[dest_row(row)] = sm.l[r] > 0.0f ? (sm.m[r] + log2f(sm.l[r])) * prefill_ln2 : -INFINITY;
    }
}

/// The base of a kernel's dynamic shared memory rounded up to 1024 bytes: the swizzle is of
/// address bits 4-6 by bits 7-9, so atoms start 1024-byte aligned (the smem maps reserve 1 KiB).
__device__ __forceinline__ unsigned char* prefill_wgmma_smem_base(unsigned char* raw) {
  const unsigned raw_addr = static_cast<unsigned>(__cvta_generic_to_shared(raw));
  return raw + ((1024u - raw_addr % 1024u) % 1024u);
}

/// Whether the shipped wgmma launch copies K/V tiles by TMA where the pool allows
/// (prefill_wgmma_kernel's Tma; bench_prefill's variant 4 times the other).
inline constexpr bool prefill_wgmma_tma_shipped = true;

/// The launch facts' key of prefill_wgmma_kernel<T, Schedule, Tma> (its shared-memory opt-in).
template <class T, int Schedule, bool Tma>
struct prefill_wgmma_tag {};

/// The wgmma prefill body for one (sequence, query tile, KV head, split); outputs as
/// prefill_mma_kernel's. Schedule 1 (shipped): in each iteration the wgmmas first, then O's
/// rescale and the next tiles' copies while they run; 0: copies, wgmmas, the rescale after the
/// P V product (bench_prefill's variant 4). Tma: the K/V tiles whose start is a multiple of
/// maps.rows and that lie wholly before the CTA's range end come by the bulk tensor copy, issued by
/// lanes of warp 0 (one page run of maps.rows tokens a lane, two boxes of 64 dims), completing on
/// an mbarrier a stage; the others (the range's last tile, any tile of a CTA whose range starts
/// mid-run, every tile where maps.rows is 0) by cp.async as without.
template <class T, int Schedule = 1, bool Tma = false>
__global__ void __launch_bounds__(prefill_wgmma_policy::threads, 1)
    prefill_wgmma_kernel(const attention_params p, const prefill_plan plan, T* part_o, float* part_lse,
                         const __grid_constant__ kv_tensor_maps maps) {
#if PAGEDKV_WGMMA_COMPILED
  using policy = prefill_wgmma_policy;
  using smem_t = prefill_wgmma_smem;
  constexpr int BM = policy::q_rows, BN = policy::kv_tokens, D = policy::head_dim, threads = policy::threads;
  constexpr int chunks = D / 8;

  wait_for_the_grid_before();
  let_dependents_launch();
  prefill_wgmma_cta c;
  if (!c.make(p, plan, BM, BN)) return;
  const int num_tiles = c.num_tiles;

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = prefill_wgmma_smem_base(smem_raw);
  const unsigned base = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  auto* offsets_s = reinterpret_cast<std::int64_t*>(smem + smem_t::rows_offset);
  const unsigned q_addr = base, k_addr = base + smem_t::k_offset, v_addr = base + smem_t::v_offset;
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32, tig = lane % 4;
  const int wg = warp / 4;
  const int warp_row0 = warp * 16;  // = 64 wg + 16 (warp % 4): the warp's rows of the accumulators

  // Pool offset of row tid (< BN) of KV tile t, -1 past the range.
  const auto row_offset = [&](int t) -> std::int64_t { return tid < BN ? c.row_offset(p, t, tid, BN) : -1; };
  const auto* k_g = static_cast<const T*>(p.k);
  const auto* v_g = static_cast<const T*>(p.v);
  // Tile t of K (or V) into its stage t % 2, through the offsets of stage t % 3.
  const auto issue_tile = [&](const T* src_g, unsigned dst_base, int t) {
    const std::int64_t* offs = offsets_s + (t % smem_t::row_stages) * BN;
    unsigned char* dst = smem + (dst_base - base) + (t % 2) * smem_t::tile_bytes;
#pragma unroll
    for (int i = 0; i < BN * chunks / threads; ++i) {
      const int ci = tid + i * threads;
      const int r = ci / chunks, ch = ci % chunks;
      const std::int64_t off = offs[r];
      const bool valid = off >= 0;
      cp_async_16(dst + smem_t::at(BN, r, ch), src_g + (valid ? off : 0) + ch * 8, valid);
    }
  };

  // The bulk tensor copies: tile t by TMA where tma_tile(t) (a prefix of the tiles); lane i < runs
  // of warp 0 copies run i (rows i * run_rows ..) and holds its page's block id of tiles t and t + 1.
  const int run_rows = Tma && maps.rows > 0 ? maps.rows : BN;
  const bool tma_cta = Tma && maps.rows > 0 && c.begin % run_rows == 0;
  const auto tma_tile = [&](int t) { return tma_cta && t < num_tiles && c.begin + (t + 1) * BN <= c.end; };
  const unsigned bar_addr = base + smem_t::bar_offset;  // K stages 0, 1; V stages 0, 1
  const bool tma_lane = tma_cta && warp == 0 && lane < BN / run_rows;
  const auto run_block = [&](int t, int& slot) -> int {  // block and slot of lane's run of tile t
    const int token = c.begin + t * BN + lane * run_rows;
    const int j = token / p.table.block_size;
    slot = token - j * p.table.block_size;
    return c.seq_blocks[j];
  };
  int blk[2] = {0, 0}, slot[2] = {0, 0};  // lane's run of tiles t and t + 1 (iteration t)
  const auto issue_tma = [&](const CUtensorMap* map, unsigned dst_base, unsigned bar, int t, int b, int s) {
    if (lane == 0) mbarrier_arrive_expect_tx(bar, smem_t::tile_bytes);
    __syncwarp();
    if (tma_lane) {
      const unsigned dst = dst_base + (t % 2) * smem_t::tile_bytes + lane * run_rows * 128;
      tma_load_4d(dst, map, 0, s, c.kv_head, b, bar);
      tma_load_4d(dst + BN * 128, map, 64, s, c.kv_head, b, bar);
    }
  };

  const auto* q_g = static_cast<const T*>(p.q);
  if (Tma && tid == 0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) mbarrier_init(bar_addr + 8 * i);
  }
  if (num_tiles > 0) {
    for (int ci = tid; ci < BM * chunks; ci += threads) {
      const int r = ci / chunks, ch = ci % chunks;
      const bool valid = c.row0 + r < c.rows_total;
      cp_async_16(smem + smem_t::at(BM, r, ch), q_g + (valid ? c.out_row(p, r) * D + ch * 8 : 0), valid);
    }
    if (tid < BN) {
      offsets_s[tid] = row_offset(0);
      offsets_s[BN + tid] = num_tiles > 1 ? row_offset(1) : -1;
    }
    __syncthreads();  // and the mbarriers initialised
    if (tma_tile(0)) {
      if (warp == 0) {
        if (tma_lane) {
          blk[0] = run_block(0, slot[0]);
          if (tma_tile(1)) blk[1] = run_block(1, slot[1]);
        }
        issue_tma(&maps.k, k_addr, bar_addr, 0, blk[0], slot[0]);
      }
    } else {
      issue_tile(k_g, k_addr, 0);
    }
  }
  cp_async_commit();  // Q and K of tile 0

  prefill_wgmma_softmax sm;
  sm.init(p, c, warp_row0 + lane / 4);
  float o[D / 2];
  float s[BN / 2];
  std::uint32_t pf[BN / 16][4];  // P of the previous tile: the A fragments of O += P V
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;

  // Descriptors: Q's rows of this warpgroup and K's tile as K-major operands (k-step ks: 32 bytes
  // into the atom, then the next atom column); V's tile as the MN-major B of P V (k-step kk: 16
  // key rows on; the second 64 dims an atom column away).
  const auto q_desc = [&](int ks) {
    return wgmma_desc_sw128(q_addr + (ks / 4) * (BM * 128) + wg * 64 * 128 + (ks % 4) * 32, 16, 1024);
  };
  const auto k_desc = [&](int st, int ks) {
    return wgmma_desc_sw128(k_addr + st * smem_t::tile_bytes + (ks / 4) * (BN * 128) + (ks % 4) * 32, 16, 1024);
  };
  const auto v_desc = [&](int st, int kk) {
    return wgmma_desc_sw128(v_addr + st * smem_t::tile_bytes + kk * 16 * 128, BN * 128, 1024);
  };

  // Iteration t: S_t = Q K_t^T (HasS: t < num_tiles) and O += P_(t-1) V_(t-1) (HasPv: t > 0),
  // straight-line code for each pair so that ptxas sees the wgmma pipeline whole.
  const auto iteration = [&]<bool HasS, bool HasPv>(int t) {
    if constexpr (Tma) {  // the tiles copied by TMA: stage s's n-th use completes phase n (parity n % 2)
      if (HasS && tma_tile(t)) mbarrier_wait(bar_addr + 8 * (t % 2), unsigned(t / 2) & 1u);
      if (HasPv && tma_tile(t - 1)) mbarrier_wait(bar_addr + 16 + 8 * ((t - 1) % 2), unsigned((t - 1) / 2) & 1u);
    }
    cp_async_wait<0>();          // K_t and V_(t-1) (and at t = 0 Q) landed for this thread
    fence_proxy_async_shared();  // ... visible to wgmma
    __syncthreads();             // ... for every thread; iteration t - 1's reads are done
    const auto issue_loads = [&] {
      if constexpr (Tma) {
        if (t + 1 < num_tiles) {
          if (tma_tile(t + 1)) {
            if (warp == 0) issue_tma(&maps.k, k_addr, bar_addr + 8 * ((t + 1) % 2), t + 1, blk[1], slot[1]);
          } else {
            issue_tile(k_g, k_addr, t + 1);
          }
        }
        if (HasS) {
          if (tma_tile(t)) {
            if (warp == 0) issue_tma(&maps.v, v_addr, bar_addr + 16 + 8 * (t % 2), t, blk[0], slot[0]);
          } else {
            issue_tile(v_g, v_addr, t);
          }
        }
        if (tma_lane) {  // the runs of tile t + 2 (read now, used at iteration t + 1)
          blk[0] = blk[1];
          slot[0] = slot[1];
          if (tma_tile(t + 2)) blk[1] = run_block(t + 2, slot[1]);
        }
      } else {
        if (t + 1 < num_tiles) issue_tile(k_g, k_addr, t + 1);
        if (HasS) issue_tile(v_g, v_addr, t);
      }
      cp_async_commit();
    };
    if constexpr (Schedule == 0) issue_loads();

    wgmma_fence();  // s read and pf written by the last iteration
    if constexpr (HasS) {
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) wgmma_m64n128k16_ss<T>(s, q_desc(ks), k_desc(t % 2, ks), ks > 0);
      wgmma_commit();
    }
    if constexpr (HasPv) {
      if constexpr (Schedule == 1) {
        sm.rescale(o);  // to tile t - 1's maxima while the tensor cores compute S_t (FlashAttention-3's order)
        wgmma_fence();
      }
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) wgmma_m64n128k16_rs<T>(o, pf[kk], v_desc((t - 1) % 2, kk));
      wgmma_commit();
    }
    // The next tiles' copies issued while the tensor cores work (Schedule 1), and tile t + 2's
    // block-table read, in flight during this tile's math (stored after it).
    if constexpr (Schedule == 1) issue_loads();
    const std::int64_t next_offset = t + 2 < num_tiles && !(Tma && tma_tile(t + 2)) ? row_offset(t + 2) : -1;
    if constexpr (HasS) {
      if constexpr (HasPv) wgmma_wait<1>();
      else wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) wgmma_pin(s[i]);
      sm.tile(s, p, c, c.begin + t * BN, tig);
    }
    if constexpr (HasPv) {
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < D / 2; ++i) wgmma_pin(o[i]);
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
        for (int i = 0; i < 4; ++i) wgmma_pin(pf[kk][i]);  // read by the P V just finished: live until here
    }
    if constexpr (HasS) {
      if constexpr (Schedule == 0) sm.rescale(o);
      prefill_wgmma_pack_p<T>(pf, s);
    }
    // Stage (t + 2) % 3 was last read by the issues of iterations t - 1 (V) and t - 2 (K), before
    // this iteration's barrier.
    if (tid < BN && t + 2 < num_tiles && !(Tma && tma_tile(t + 2))) offsets_s[((t + 2) % smem_t::row_stages) * BN + tid] = next_offset;
  };
  if (num_tiles > 0) {
    iteration.template operator()<true, false>(0);
    for (int t = 1; t < num_tiles; ++t) iteration.template operator()<true, true>(t);
    iteration.template operator()<false, true>(num_tiles);
  }
  // Every wgmma of this warpgroup has finished: its Q rows take the output (the other warpgroup
  // reads only its own rows).
  prefill_wgmma_store<T, BM>(p, plan, c, sm, o, smem, warp_row0, lane, part_o, part_lse);
#else
  (void)p, (void)plan, (void)part_o, (void)part_lse, (void)maps;
  __trap();  // built without sm_90a: plan_prefill never picks this kernel there
#endif
}

}  // namespace detail
}  // namespace pagedkv::kernels::cuda
