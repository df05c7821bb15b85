// Paged decode attention on the GPU: one query token per sequence, flash-decoding split-K over
// the sequence's tokens, and a merge kernel for the splits.
//
// Work unit: (sequence, KV head, split). One CTA serves every query head of the KV head's GQA
// group, so each KV byte leaves HBM once per KV head. K and V tiles stream into shared memory
// with cp.async (16-byte copies, `stages` deep). This file holds the CUDA-core body (fp32 KV, and
// fp8 KV under an fp32 q; 16-bit KV and fp8 under a 16-bit q run on tensor cores, decode_mma.cuh)
// and what both bodies share: the split plan, the unit, the copies, the warp merge, the split
// merge and the launch. Each warp owns a slice of every tile's rows and runs them alone: QK^T
// (a few lanes per token), an online-softmax update per query head (warp shuffles), PV (a lane
// per 4-dim chunk, fp32 accumulators for every head of the group); the warps merge their softmax
// states once, at the end.
//
// Graph safety: the grid depends only on host values (num_seqs, num_kv_heads, max_kv_len, the
// SM count); lengths and tables are read on the device. A graph captured with a capacity
// max_kv_len stays valid while sequences grow below it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>

#include <cub/cub.cuh>
#include <cuda/functional>

#include "../attention_params.hpp"
#include "check.cuh"
#include "cp_async.cuh"
#include "decode_tuning.cuh"
#include "dependent_launch.cuh"
#include "vec.cuh"

namespace pagedkv::kernels::cuda {

/// Most splits of one sequence (the merge kernel keeps one weight a split in shared memory).
inline constexpr std::int32_t max_decode_splits = 1024;

/// How a decode launch splits its work. Depends only on host values.
struct decode_plan {
  std::int32_t num_splits = 1;
  std::int32_t chunk_tokens = 0;  ///< tokens per split, a multiple of the tile
  std::size_t workspace_bytes = 0;
  decode_cta cta = decode_cta::narrow;  ///< the tensor-core body's CTA shape; narrow for the CUDA-core body

  /// KV heads a CTA: 2 on paired CTAs, else 1.
  [[nodiscard]] PAGEDKV_HOST_DEVICE std::int32_t kv_heads() const { return cta == decode_cta::paired ? 2 : 1; }
  /// CTAs of one sequence in one split.
  [[nodiscard]] PAGEDKV_HOST_DEVICE std::int32_t units_per_seq(const attention_params& p) const {
    return p.num_kv_heads / kv_heads();
  }
};

/// Chooses the split count: enough splits for about ctas_per_sm CTAs an SM (0.9 of them), in chunks
/// of whole tiles, as even as tiles allow (rounding the chunk down: 15 wanted splits of 8192
/// tokens give 16 of 512 rather than 15 of 576 and one of 128, which was 4% slower); never below
/// min_chunk tokens a split nor beyond p.max_splits (when set). One CTA an SM streams near the
/// wall, and each split beyond that adds merge work and a pipeline ramp. On the H100 (2026-11-21,
/// GQA 32/8, tensor-core body): batch 16 ctx 2k unsplit (128 CTAs) 84.4% of the read ceiling,
/// 2 splits (both CTA slots of every SM) 80.9%; batch 1 ctx 8k 16 splits 57.0%, 32 splits 54.3%,
/// 8 splits 49.3%; MHA batch 1 ctx 8k 4 splits 81.0%, 8 splits 82.0%.
inline decode_plan plan_decode(const attention_params& p, int num_sms, int tile_tokens, int min_chunk,
                               int ctas_per_sm = 1) {
  decode_plan plan;
  const std::int64_t units = std::int64_t(p.num_seqs) * p.num_kv_heads;
  const std::int32_t max_len = p.max_kv_len < 1 ? 1 : p.max_kv_len;
  const std::int32_t tiles = (max_len + tile_tokens - 1) / tile_tokens;
  const auto tiles_for = [&](std::int32_t splits) { return (tiles + splits - 1) / splits; };  // at most `splits`
  const std::int64_t target_ctas = std::max<std::int64_t>(1, std::int64_t(num_sms) * ctas_per_sm * 9 / 10);
  const std::int64_t wanted = units > 0 ? (target_ctas + units - 1) / units : 1;
  std::int32_t per_split = std::int32_t(std::max<std::int64_t>(1, tiles / wanted));
  per_split = std::max({per_split, (min_chunk + tile_tokens - 1) / tile_tokens, tiles_for(max_decode_splits)});
  if (p.max_splits > 0) per_split = std::max(per_split, tiles_for(p.max_splits));
  plan.chunk_tokens = per_split * tile_tokens;
  plan.num_splits = (max_len + plan.chunk_tokens - 1) / plan.chunk_tokens;
  if (plan.num_splits > 1)
    plan.workspace_bytes = std::size_t(plan.num_splits) * std::size_t(p.num_seqs) * std::size_t(p.num_qo_heads) *
                           (std::size_t(p.head_dim) + 1) * sizeof(float);
  return plan;
}

/// Launches of at least this many CTAs an SM (five waves of three) run shallow CTAs.
inline constexpr int decode_shallow_min_ctas_per_sm = 15;

/// Whether narrow CTAs on both slots of every SM (`both`, planned for two CTAs an SM) beat wide
/// ones alone on `one` (planned for one an SM), on the H100 (2026-11-25, bf16 head_dim 128, 32
/// query heads over 32 to 2 KV heads, batch 1-64, ctx 2k-32k, every shape whose grid fits one
/// CTA an SM; both twice, alternating; `2026-11-25-ab/both-slots-*`). Twice the splits stream
/// faster, and cost the merge more:
/// - every CTA keeping 4096 tokens or more: 0.960-1.001 of the time (13 shapes; ctx 32k 0.96-0.98);
/// - with fewer, where the launch splits already and groups are of 4 or fewer (few partial rows a
///   CTA to merge): MHA batch 1 ctx 2k-8k 0.964-0.992, batch 2 0.987-1.000, GQA 32/8 batch 4
///   0.993-0.996; groups of 8 and 16 0.982-1.042, five shapes of six slower;
/// - a first split of fewer (the merge's launch): 1.013-1.106 (ctx 2k-4k);
/// - 16 splits or more (the merge slows): 1.007-1.181.
/// So: both slots when every CTA fits one wave of two an SM in at most 8 splits, and either each
/// keeps 4096 tokens or the launch splits already with groups of 4 or fewer.
inline bool decode_both_slots_worth(const attention_params& p, const decode_plan& one, const decode_plan& both,
                                    int num_sms) {
  constexpr std::int32_t max_splits = 8, long_chunk = 4096, small_group = 4;
  const std::int64_t units = std::int64_t(p.num_seqs) * p.num_kv_heads;
  if (both.num_splits <= one.num_splits || both.num_splits > max_splits ||
      units * both.num_splits > 2 * std::int64_t(num_sms))
    return false;
  return both.chunk_tokens >= long_chunk || (one.num_splits > 1 && p.group_size() <= small_group);
}

/// Whether a CTA can take two adjacent KV heads of p's pools as one row: an even number of KV
/// heads, the second head's elements right after the first's (NHD pools).
inline bool decode_pairs_fit(const attention_params& p) {
  return p.num_kv_heads % 2 == 0 && p.head_stride == p.head_dim;
}

/// The tensor-core body's plan: the split plan_decode chooses, on one of three CTA shapes
/// (decode_mma_policy), where the instantiation has them (has_wide, has_shallow):
/// - wide (8 warps, one an SM) when the narrow grid has no more CTAs than SMs and so would leave
///   each SM's second slot empty: the same chunks rounded to the wide tile, never more CTAs than
///   SMs, twice the loads in flight per SM at bf16 head_dim 128. On the H100 (2026-11-21,
///   against 4-warp CTAs): GQA 32/8 batch 1-16 ctx 128-512 3-9% faster, batch 16 ctx 2k 0-3%, but
///   MHA batch 1 ctx 2k 2-4% and GQA batch 16 ctx 32k 1-2% slower; with more CTAs than SMs wide
///   CTAs lost (ctx 128 at batch 64-256 by 21-34%: one CTA's ramp leaves its SM idle).
/// - shallow (2 stages, three an SM) when the grid has at least decode_shallow_min_ctas_per_sm
///   CTAs an SM: each CTA's ramp and merge overlap two others' streaming. With few waves the last
///   one's quantisation costs more than that (batch 16-64 at 512 CTAs, ctx 2k-32k: 3-6% slower).
/// - narrow (two an SM) otherwise, and instead of wide where twice the splits fill both slots of
///   every SM and stay a cheap merge (decode_both_slots_worth).
/// - paired (two adjacent KV heads a CTA, has_paired) before all of these where pairs can be had
///   (decode_pairs_fit) and there are at least as many pairs as SMs: no split, and rows of both
///   heads copied whole.
inline decode_plan plan_decode_mma(const attention_params& p, int num_sms, int narrow_tile, int wide_tile,
                                   int min_chunk, bool has_wide, bool has_shallow, int paired_tile = 0) {
  if (paired_tile > 0 && decode_pairs_fit(p) && std::int64_t(p.num_seqs) * p.num_kv_heads / 2 >= num_sms) {
    decode_plan plan = plan_decode(p, num_sms, paired_tile, min_chunk);  // one split: the units fill the SMs
    plan.cta = decode_cta::paired;
    return plan;
  }
  decode_plan plan = plan_decode(p, num_sms, narrow_tile, min_chunk);
  const std::int64_t units = std::int64_t(p.num_seqs) * p.num_kv_heads, ctas = units * plan.num_splits;
  if (has_shallow && ctas >= std::int64_t(decode_shallow_min_ctas_per_sm) * num_sms) {
    plan.cta = decode_cta::shallow;
    return plan;
  }
  if (!has_wide || ctas > num_sms) return plan;
  const decode_plan both = plan_decode(p, num_sms, narrow_tile, min_chunk, 2);
  if (decode_both_slots_worth(p, plan, both, num_sms)) return both;
  attention_params capped = p;  // whole wide tiles may round to more splits: keep one CTA an SM
  const auto fit = std::int32_t(num_sms / std::max<std::int64_t>(units, 1));
  if (capped.max_splits == 0 || capped.max_splits > fit) capped.max_splits = fit;
  plan = plan_decode(capped, num_sms, wide_tile, min_chunk);
  plan.cta = decode_cta::wide;
  return plan;
}

namespace detail {

inline constexpr float log2e = 1.4426950408889634f;
inline constexpr float ln2 = 0.6931471805599453f;

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

/// The work of one decode CTA: (sequence, KV heads, split) from its block index, and the tokens
/// [begin, end) it attends to (the split's chunk, cut by the sliding window). A unit has
/// plan.kv_heads() adjacent KV heads from kv_head on; their query heads are adjacent too, so the
/// unit's heads() query heads are rows q_row.. of q and o.
struct decode_unit {
  int seq = 0, kv_head = 0, kv_heads = 1, split = 0, group = 0, begin = 0, end = 0;
  int pos = 0;             ///< the query's position: the sequence's last token
  std::int64_t q_row = 0;  ///< the first KV head's group's first row of q and o

  /// Query heads of the unit: every head of each of its KV heads' groups.
  [[nodiscard]] __device__ int heads() const { return kv_heads * group; }
  /// Row of query head g (of heads()) of this unit in the split workspace (part_o rows, part_lse entries).
  [[nodiscard]] __device__ std::int64_t partial_row(const attention_params& p, int g) const {
    return (std::int64_t(split) * p.num_seqs + seq) * p.num_qo_heads + std::int64_t(kv_head) * group + g;
  }
};

/// The sequence of this CTA, in a launch of KvHeads KV heads a CTA (plan.kv_heads(), known to the
/// body at compile time: with a second division by a run-time value at every CTA's start, fp8
/// batch 1 ran 1.4% slower on an H200, 2026-11-25).
template <int KvHeads>
__device__ __forceinline__ int seq_of_cta(const attention_params& p) {
  return int(blockIdx.x) / (p.num_kv_heads / KvHeads);
}

template <int KvHeads = 1>
__device__ __forceinline__ decode_unit decode_unit_of(const attention_params& p, const decode_plan& plan) {
  decode_unit u;
  const int units_per_seq = p.num_kv_heads / KvHeads;
  u.seq = int(blockIdx.x) / units_per_seq;
  u.kv_heads = KvHeads;
  u.kv_head = int(blockIdx.x) % units_per_seq * KvHeads;
  u.split = int(blockIdx.y);
  u.group = p.group_size();
  const int kv_len = p.kv_len(u.seq);
  u.begin = u.split * plan.chunk_tokens;
  if (p.window_left >= 0) u.begin = max(u.begin, kv_len - 1 - p.window_left);
  u.end = min(kv_len, (u.split + 1) * plan.chunk_tokens);
  u.pos = kv_len - 1;
  u.q_row = std::int64_t(p.q_begin(u.seq)) * p.num_qo_heads + std::int64_t(u.kv_head) * u.group;
  return u;
}

/// ALiBi for one unit, staged in shared memory once so that the tile loop keeps no registers for
/// it (with them held in registers, ALiBi's mere presence made bodies near the register limit
/// spill up to 128 bytes): slots[k * Heads + g] = log2(e) * the slope of head g of the unit's KV
/// head k's group (0 past the group), slots[KvHeads * Heads] = the query's position.
template <int Heads, int KvHeads = 1>
struct alibi_slots {
  static constexpr int count = KvHeads * Heads;
  static constexpr std::size_t bytes = (count + 1) * sizeof(float);
  /// Every thread of the CTA calls it; a barrier must follow before `bias` is used.
  __device__ static void stage(float* slots, const attention_params& p, const decode_unit& u) {
    for (int i = int(threadIdx.x); i < count; i += int(blockDim.x)) {
      const int k = KvHeads == 1 ? 0 : i / Heads, g = KvHeads == 1 ? i : i % Heads;
      slots[i] = g < u.group ? p.alibi_slopes[(u.kv_head + k) * u.group + g] * log2e : 0.0f;
    }
    if (threadIdx.x == 0) slots[count] = __int_as_float(u.pos);
  }
  /// The bias of slot i's logit (log2 units; i = k * Heads + g) for the token at position `token`.
  __device__ static float bias(const float* slots, int i, int token) {
    return slots[i] * float(token - __float_as_int(slots[count]));
  }
};

/// The output of a unit with no token to attend to: zeros, and an LSE of -inf (the merge gives
/// such a split weight 0, and reads its zeros rather than branching).
template <int D>
__device__ void write_empty_unit(const attention_params& p, const decode_plan& plan, const decode_unit& u,
                                 float* part_o, float* part_lse) {
  const int tid = int(threadIdx.x), threads = int(blockDim.x);
  if (plan.num_splits > 1) {
    const std::int64_t row0 = u.partial_row(p, 0);
    for (int g = tid; g < u.heads(); g += threads) part_lse[row0 + g] = -INFINITY;
    for (int i = tid; i < u.heads() * D; i += threads) part_o[row0 * D + i] = 0.0f;
  } else {
    for (int i = tid; i < u.heads() * D; i += threads) store_out(p.q_dtype, p.o, u.q_row * D + i, 0.0f);
    if (p.lse)
      for (int g = tid; g < u.heads(); g += threads) p.lse[u.q_row + g] = -INFINITY;
  }
}

/// Block ids of a warp's rows of its unit's first Tiles tiles (lane r < Rows: row0 + r of each),
/// read before the unit's length is known so that the two dependent loads at a CTA's start
/// overlap. null_block where that cannot be done: CSR tables (the row start is itself a load),
/// sliding windows (the first row depends on the length), rows past the dense table's pitch.
template <int Rows, int KvHeads, int Tiles>
__device__ __forceinline__ void peek_first_blocks(const attention_params& p, const decode_plan& plan, int tile,
                                                  int row0, int lane, block_id (&ids)[Tiles]) {
  const int seq = seq_of_cta<KvHeads>(p);
  const bool can = !p.table.is_csr() && p.window_left < 0 && lane < Rows;
#pragma unroll
  for (int t = 0; t < Tiles; ++t) {
    const int j = (int(blockIdx.y) * plan.chunk_tokens + t * tile + row0 + lane) / p.table.block_size;
    ids[t] = can && j < p.table.max_blocks_per_seq
                 ? p.table.indices[std::int64_t(seq) * p.table.max_blocks_per_seq + j]
                 : null_block;
  }
}

/// Before a CTA waits for the grid before it: one lane asks L2 for the lines of the CTA's first
/// reads after the wait in a dense table, the sequence's length and the split's first block ids,
/// so that those dependent loads find L2 rather than DRAM. Prefetches, and one lane's: on the
/// H100 (2026-11-25) a table load issued before the wait cost every launch about 3.5 us, a
/// prefetch of each warp's own rows made small shapes 2-13% slower, and these two made batch 1
/// up to 4.5% faster. Nothing is read from the lines before the wait, and a line that the grid
/// before writes after it was prefetched holds the write (L2 is where the GPU's writes meet):
/// the reads after the wait see what they would have seen without it.
template <int KvHeads>
__device__ __forceinline__ void prefetch_first_reads(const attention_params& p, const decode_plan& plan) {
  if (threadIdx.x != 0 || p.table.is_csr()) return;
  const int seq = seq_of_cta<KvHeads>(p);
  const int first = int(blockIdx.y) * plan.chunk_tokens / p.table.block_size;
  prefetch_line_l2(p.table.kv_lens + seq);
  if (first < p.table.max_blocks_per_seq)  // max_kv_len may be a looser bound than the table
    prefetch_line_l2(p.table.indices + std::int64_t(seq) * p.table.max_blocks_per_seq + first);
}

/// Where a body keeps its K and V tile rows in shared memory. Padded (Swizzle false): rows of
/// D + one 16-byte chunk, so that the same chunk of consecutive rows sits on different banks.
/// Swizzled: rows of exactly D elements, a whole number of 128-byte segments, with 16-byte chunk c
/// of row r stored at chunk c ^ (r % 8): chunk c of eight consecutive rows still lands on eight
/// different bank groups (ldmatrix reads conflict-free), and every 128-byte line a cp.async warp
/// brings in fills one aligned 128-byte segment. Into padded rows, whose lines straddle two
/// segments, the same copies alone streamed 3.5% slower on the H100 and 5.5% on an H200
/// (bench_stream, 2026-11-22).
template <class TKV, int D, bool Swizzle>
struct kv_smem_rows {
  static constexpr int vec = vec16<TKV>;  // elements per 16-byte chunk
  static constexpr bool swizzled = Swizzle;
  static constexpr int pitch = Swizzle ? D : D + vec;
  static_assert(!Swizzle || (D * sizeof(TKV)) % 128 == 0, "swizzled rows are whole 128-byte segments");
  /// Element offset of 16-byte chunk `chunk` of row `row`.
  __device__ __forceinline__ static int at(int row, int chunk) {
    return row * pitch + (Swizzle ? chunk ^ key(row) : chunk) * vec;
  }
  /// The same in two steps, for readers that keep a row's start and key: a row's swizzle key,
  /// and where element `elem` (of the row's D) of a row with that key is, from the row's start.
  __device__ __forceinline__ static int key(int row) { return Swizzle ? row & 7 : 0; }
  __device__ __forceinline__ static int in_row(int elem, int key) {
    if constexpr (!Swizzle) return elem;
    return ((elem / vec) ^ key) * vec + elem % vec;
  }
};

/// Issues one warp's cp.async copies of K and V rows [first, first + Rows) of unit u's sequence
/// into shared rows dst_row.. (laid out by Layout, a kv_smem_rows; zeros at and past u.end, whose
/// source is not read). Lane r < Rows looks up row r's block (unless `known`, from
/// peek_first_blocks) and offset once and the lanes copying that row's 16-byte chunks take it by
/// shuffle: with a lookup a chunk, 16-token warp slices at block size 1 ran 16% slower than at
/// block size 16.
template <class TKV, int D, class Layout, int Rows>
__device__ __forceinline__ void issue_kv_rows(const attention_params& p, const decode_unit& u, TKV* k_s, TKV* v_s,
                                              int first, int dst_row, int lane, block_id known = null_block) {
  static_assert(Rows <= 32, "a lane looks up each row");
  constexpr int vec = vec16<TKV>, cpr = D / vec, chunks = Rows * cpr;
  const auto* k_g = static_cast<const TKV*>(p.k);
  const auto* v_g = static_cast<const TKV*>(p.v);
  std::int64_t row_off = 0;
  if (lane < Rows && first + lane < u.end) {
    const int token = first + lane, j = token / p.table.block_size;
    const block_id block = known != null_block ? known : p.table.block(u.seq, j);
    row_off = p.kv_offset(block, token - j * p.table.block_size, u.kv_head);
  }
#pragma unroll
  for (int i = 0; i < (chunks + 31) / 32; ++i) {
    const int c = lane + 32 * i;
    const int row = c / cpr < Rows ? c / cpr : Rows - 1, col = c % cpr;
    const std::int64_t off = __shfl_sync(0xffffffffu, row_off, row) + col * vec;  // every lane shuffles
    if (chunks % 32 == 0 || c < chunks) {
      const bool valid = first + row < u.end;
      const int dst = Layout::at(dst_row + row, col);
      cp_async_16(k_s + dst, k_g + off, valid);
      cp_async_16(v_s + dst, v_g + off, valid);
    }
  }
}

/// Waits at named barrier `id` (1-15; 0 is __syncthreads') for `threads` threads, whole warps.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

/// One warp's share of a decode CTA's copy pipeline: rows [row0, row0 + Rows) of every Tile-token
/// tile of its unit, tile t into stage t % Stages, rows laid out by Layout (a kv_smem_rows) of the
/// unit's KvHeads adjacent KV heads' D elements each. KvHeads = 1: the warp reads only the rows it
/// copies, and waits for no other. KvHeads = 2: two warps, one for each KV head, read the same
/// rows; each copies half of them, both heads' elements, and they meet at named barrier `barrier`
/// every tile.
template <class TKV, int D, class Layout, int Rows, int Tile, int Stages, int KvHeads = 1>
struct warp_copies {
  static_assert(KvHeads == 1 || Stages >= 2, "sharing warps refill a stage after they meet");
  decode_unit u;
  int row0 = 0, lane = 0, num_tiles = 0;
  TKV* k_s = nullptr;
  TKV* v_s = nullptr;
  int barrier = 0;  ///< named barrier of the warps sharing these rows (KvHeads > 1)

  __device__ __forceinline__ void issue(const attention_params& p, int t, block_id known = null_block) const {
    issue_kv_rows<TKV, KvHeads * D, Layout, Rows>(p, u, k_s, v_s, u.begin + t * Tile + row0,
                                                 (t % Stages) * Tile + row0, lane, known);
  }

  /// Before tile t's math: refills the stage that tile t - 1 used with tile t + Stages - 1, then
  /// waits for tile t, so Stages tiles are in flight while the warp waits. Waiting first (Stages
  /// - 1 in flight) measured the same on the H100 (2026-11-21, every bf16 and fp8 shape of the
  /// bench within 0.5%): the loads in flight are not what holds the large shapes back.
  /// Sharing warps wait first (Stages - 1 tiles in flight during the math, as here): the barrier
  /// that shows them each other's rows of tile t also tells them that all are done with tile t -
  /// 1, whose stage the refill overwrites.
  __device__ __forceinline__ void advance(const attention_params& p, int t) const {
    if constexpr (KvHeads == 1) {
      __syncwarp();  // every lane is done with stage (t - 1) % Stages
      if (t + Stages - 1 < num_tiles) issue(p, t + Stages - 1);
      cp_async_commit();
      cp_async_wait<Stages - 1>();
      __syncwarp();  // this warp's rows of tile t landed
    } else {
      cp_async_wait<Stages - 2>();             // this warp's slice of tile t landed
      named_barrier_sync(barrier, 32 * KvHeads);  // and the other's; both are done with tile t - 1
      if (t + Stages - 1 < num_tiles) issue(p, t + Stages - 1);
      cp_async_commit();
    }
  }

  /// The start both bodies share: asks L2 for the lines of its first reads
  /// (prefetch_first_reads), waits for the grid before (dependent_launch.cuh), reads the CTA's
  /// unit (this warp's first block ids in flight beside its length), issues the first Stages - 1
  /// tiles, one commit group each, and lets the grid after (the split merge, or what follows the
  /// decode) launch: a trigger later in the CTA measured 9-17% slower on small fp8 shapes (H100,
  /// 2026-11-22). A unit without tokens gets its empty output instead: returns false.
  __device__ __forceinline__ bool start(const attention_params& p, const decode_plan& plan, float* part_o,
                                        float* part_lse) {
    prefetch_first_reads<KvHeads>(p, plan);
    wait_for_the_grid_before();
    block_id first_blocks[Stages - 1];
    peek_first_blocks<Rows, KvHeads>(p, plan, Tile, row0, lane, first_blocks);
    u = decode_unit_of<KvHeads>(p, plan);
    if (u.begin >= u.end) {  // nothing to attend to in this split
      write_empty_unit<D>(p, plan, u, part_o, part_lse);
      return false;
    }
    num_tiles = (u.end - u.begin + Tile - 1) / Tile;
#pragma unroll
    for (int t = 0; t < Stages - 1; ++t) {
      if (t < num_tiles) issue(p, t, first_blocks[t]);
      cp_async_commit();
    }
    let_dependents_launch();
    return true;
  }
};

/// The end of a per-warp body: warp w has left its softmax state of head h in
/// ml_s[(w * Heads + h) * 2 + {0, 1}] = (m, l) and its unnormalised output in
/// acc_s[(w * Heads + h) * D + d]; with KvHeads KV heads a unit, warps [k, k + 1) * Warps / KvHeads
/// hold KV head k's. Merges the warps for each of the unit's heads,
/// o = sum_w 2^(m_w - M) acc_w / sum_w 2^(m_w - M) l_w, and writes o and the LSE (one split) or
/// the split's partial row.
template <int D, int Heads, int Warps, int KvHeads = 1>
__device__ void merge_warps_and_store(const attention_params& p, const decode_plan& plan, const decode_unit& u,
                                      const float* acc_s, const float* ml_s, float* part_o, float* part_lse) {
  constexpr int head_warps = Warps / KvHeads;
  float v_scales[KvHeads];
#pragma unroll
  for (int k = 0; k < KvHeads; ++k) v_scales[k] = p.v_scale_of(u.kv_head + k);
  for (int i = int(threadIdx.x); i < u.heads() * D; i += int(blockDim.x)) {
    const int unit_head = i / D, d = i % D;  // unit_head = k * group + g
    const int k = KvHeads == 1 ? 0 : unit_head / u.group, g = KvHeads == 1 ? unit_head : unit_head % u.group;
    float v_scale = v_scales[0];
#pragma unroll
    for (int j = 1; j < KvHeads; ++j) v_scale = k == j ? v_scales[j] : v_scale;
    const float* ml_k = ml_s + k * head_warps * Heads * 2;
    const float* acc_k = acc_s + k * head_warps * Heads * D;
    float m_all = -INFINITY;
#pragma unroll
    for (int w = 0; w < head_warps; ++w) m_all = fmaxf(m_all, ml_k[(w * Heads + g) * 2]);
    float sum = 0.0f, l_all = 0.0f;
    if (m_all != -INFINITY) {
#pragma unroll
      for (int w = 0; w < head_warps; ++w) {
        const float weight = exp2f(ml_k[(w * Heads + g) * 2] - m_all);  // 0 for a warp that saw nothing
        sum += weight * acc_k[(w * Heads + g) * D + d];
        l_all += weight * ml_k[(w * Heads + g) * 2 + 1];
      }
    }
    const float out = l_all > 0.0f ? sum / l_all * v_scale : 0.0f;
    const float lse2 = l_all > 0.0f ? m_all + log2f(l_all) : -INFINITY;  // log2 units
    if (plan.num_splits == 1) {
      store_out(p.q_dtype, p.o, (u.q_row + unit_head) * D + d, out);
      if (p.lse && d == 0) p.lse[u.q_row + unit_head] = lse2 * ln2;
    } else {
      const std::int64_t row = u.partial_row(p, unit_head);
      part_o[row * D + d] = out;
      if (d == 0) part_lse[row] = lse2;
    }
  }
}

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
  // Swizzled where rows are whole 128-byte segments, for fp8 KV (MHA and pairs run here: 3-5%
  // faster on the H100); fp32 rows, a reference-speed path, stay padded (swizzled, the head_dim
  // 256 group 16 body spilled 84 bytes).
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
/// (cp.async, its own commit groups), computes their logits (qk_split lanes a token), keeps its
/// own online-softmax state (m, l per head, in registers) and accumulates PV over them (lane
/// holds 4-dim chunks of every head). Warps meet once, after the last tile, to merge their
/// states. A CTA-wide barrier per tile, with one warp a head doing the softmax while the others
/// waited, cost 5-7% of the bandwidth at large shapes.
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
/// w_s = 2^(lse_s - max lse). A CTA per (sequence, head); CUB block reductions over the splits.
template <int D>
__global__ void __launch_bounds__(128)
    merge_splits_kernel(const attention_params p, const decode_plan plan, const float* part_o, const float* part_lse) {
  using block_reduce = cub::BlockReduce<float, 128>;
  __shared__ typename block_reduce::TempStorage storage;
  __shared__ float shared_max, shared_sum;
  __shared__ float weight_s[max_decode_splits];
  wait_for_the_grid_before();  // the decode's partial rows
  let_dependents_launch();     // the next decode may start waiting beside this merge
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
};

/// Tag is a type unique to the kernel or kernels of one dispatch (a shared-memory map, or the
/// set of CTA shapes), so each has its own facts; prepare() raises their shared-memory limits.
/// Host threads may launch concurrently: each (Tag, device) entry is filled once, under
/// std::call_once; a failed lookup throws and leaves it to be tried again.
template <class Tag, class Prepare>
const launch_facts& facts_of(Prepare&& prepare) {
  constexpr int max_devices = 64;
  static launch_facts facts[max_devices];
  static std::once_flag filled[max_devices];
  int device = 0;
  PAGEDKV_CUDA_CHECK(cudaGetDevice(&device));
  if (device >= max_devices) pagedkv::detail::fail(errc::invalid_argument, "device ", device, " beyond ", max_devices);
  std::call_once(filled[device], [&] {
    launch_facts& f = facts[device];
    prepare();
    PAGEDKV_CUDA_CHECK(cudaDeviceGetAttribute(&f.num_sms, cudaDevAttrMultiProcessorCount, device));
  });
  return facts[device];
}

/// Lets `kernel` use smem_bytes of dynamic shared memory (beyond the default 48 KiB).
template <class Kernel>
void allow_smem(Kernel kernel, std::size_t smem_bytes) {
  PAGEDKV_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_bytes)));
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
  const dim3 grid(unsigned(p.num_seqs * plan.units_per_seq(p)), unsigned(plan.num_splits));
  launch_dependent(kernel, grid, threads, smem_bytes, stream, p, plan, part_o, part_lse);
  if (plan.num_splits > 1) {
    const float* const_part_o = part_o;
    const float* const_part_lse = part_lse;
    launch_dependent(merge_splits_kernel<D>, dim3(unsigned(p.num_seqs * p.num_qo_heads)), 128, 0, stream, p, plan,
                     const_part_o, const_part_lse);
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
  const detail::launch_facts& f = detail::facts_of<smem_t>([&] { detail::allow_smem(kernel, smem_t::bytes); });
  const decode_plan plan = plan_decode(p, f.num_sms, policy::tile_tokens, policy::min_chunk_tokens);
  if (!launch || p.num_seqs == 0) return plan;
  detail::launch_with_merge<D>(kernel, p, plan, policy::threads, smem_t::bytes, workspace, workspace_bytes, stream);
  return plan;
}

}  // namespace pagedkv::kernels::cuda
