// Device code that both decode bodies share (decode_cuda_core.cuh, decode_mma.cuh): the CTA's unit
// of work, ALiBi slots, the empty output, the shared-memory rows of K and V tiles and the per-warp
// cp.async pipeline that fills them, and the warps' final merge.
//
// Work unit: (sequence, KV head, split). One CTA serves every query head of the KV head's GQA
// group, so each KV byte leaves HBM once per KV head. K and V tiles stream into shared memory
// with cp.async (16-byte copies, `stages` deep). Each warp owns a slice of every tile's rows and
// runs them alone; the warps merge their softmax states once, at the end.
#pragma once

#include <cmath>
#include <cstdint>

#include "../attention_params.hpp"
#include "../decode_plan.hpp"
#include "cp_async.cuh"
#include "dependent_launch.cuh"
#include "vec.cuh"

namespace pagedkv::kernels::cuda {
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
/// body at compile time: a second division by a run-time value at every CTA's start slowed batch
/// 1; decode-kernel.md, "Paired CTAs").
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
/// it (held in registers, they made bodies near the register limit spill): slots[k * Heads + g]
/// = log2(e) * the slope of head g of the unit's KV head k's group (0 past the group),
/// slots[KvHeads * Heads] = the query's position.
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
/// reads after the wait in a dense table, the sequence's length and the split's first block ids, so
/// that those dependent loads find L2 rather than DRAM: batch 1 rows of the decode table
/// (decode-kernel.md, "Prefetch before the wait"). Prefetches, and one lane's: a load before the
/// wait, or a prefetch a warp, cost more. Nothing is read from the lines before the wait, and a
/// line that the grid before writes after it was prefetched holds the write (L2 is where the GPU's
/// writes meet): the reads after the wait see what they would have seen without it.
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
/// brings in fills one aligned 128-byte segment; into padded rows, whose lines straddle two
/// segments, the copies stream slower (bench_stream; decode-kernel.md, "Swizzled rows").
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
/// shuffle: with a lookup a chunk, block size 1 ran far slower than block size 16 (benchmarks.md,
/// "ALiBi, block size").
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
  /// waits for tile t, so Stages tiles are in flight while the warp waits (waiting first measured
  /// the same; decode-kernel.md, "Copies").
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

  /// The start both bodies share: asks L2 for the lines of its first reads (prefetch_first_reads),
  /// waits for the grid before (dependent_launch.cuh), reads the CTA's unit (this warp's first
  /// block ids in flight beside its length), issues the first Stages - 1 tiles, one commit group
  /// each, and lets the grid after (the split merge, or what follows the decode) launch: a later
  /// trigger slowed the small fp8 rows of the decode table (decode-kernel.md, "Dependent
  /// launches"). A unit without tokens gets its empty output instead: returns false.
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

}  // namespace detail
}  // namespace pagedkv::kernels::cuda
