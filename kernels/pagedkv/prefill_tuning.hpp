// Tile shapes of the CUDA prefill (cuda/prefill.cuh), shared by its host planner and its kernels.
// A CTA has `warps` warps of `m_tiles` m16n8k16 m-tiles (16 query rows) each, and streams KV tiles
// of kv_tokens tokens, two stages deep. bench/kernels/bench_prefill.cu is what a change here is
// measured with: its `variant` rows time the candidate shapes of head_dim 128 side by side.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pagedkv::kernels::cuda {

/// A prefill CTA's tile: q_rows (query token, query head of the group) rows, kv_tokens KV
/// tokens a step; ctas_per_sm: how many of its CTAs an SM holds at once (the planner's waves).
struct prefill_tile_shape {
  std::int32_t q_rows = 0;
  std::int32_t kv_tokens = 0;
  std::int32_t ctas_per_sm = 2;
};

/// A CTA's shape at compile time: Warps warps of MTiles m-tiles each, KvTokens keys a step.
template <int Warps, int MTiles, int KvTokens>
struct prefill_config {
  static constexpr int warps = Warps;
  static constexpr int m_tiles = MTiles;
  static constexpr int threads = 32 * Warps;
  static constexpr int q_rows = 16 * Warps * MTiles;
  static constexpr int kv_tokens = KvTokens;
  static constexpr int stages = 2;
  static constexpr prefill_tile_shape tile() { return {q_rows, kv_tokens, 2}; }
  static_assert(MTiles == 1 || MTiles == 2, "a warp owns one or two m-tiles of 16 rows");
  static_assert(KvTokens % 16 == 0 && KvTokens <= threads, "whole k-steps; a thread looks up each row");
};

/// The shipped shape of each head_dim. head_dim <= 128: 8 warps of one m-tile, 128 query rows
/// over 64-key tiles: each K/V tile read from L2 serves 128 rows, half the L2 traffic of 64-row
/// tiles (bench_prefill's variant rows; docs/journal/prefill-kernel.md). head_dim 256: 32-key tiles
/// so that the tiles fit shared memory twice.
template <int D>
using prefill_policy = prefill_config<8, 1, (D <= 128 ? 64 : 32)>;

/// The tile of head_dim d (the host planner's view of prefill_policy<d>).
constexpr prefill_tile_shape prefill_tile_of(std::int32_t head_dim) {
  return head_dim <= 128 ? prefill_policy<128>::tile() : prefill_policy<256>::tile();
}

/// A split covers at least this many KV tokens (8 tiles of 64): below it the query tile's load
/// and the merge cost more than the parallelism gains. Not measured yet.
inline constexpr std::int32_t prefill_min_split_tokens = 512;

/// What the planner's split count weighs besides the keys a CTA streams, in KV tokens of a CTA's
/// time: a CTA's start and end (its Q load, the first K/V tiles' latency, its store) and the split
/// merge. Nsight Compute in run ws3b-1 (512 over 8k at batch 1, wgmma body): a CTA start and end
/// about 2 to 4 of its 128-key tiles, the merge 11 us (3 tiles) less what the dependent launch
/// overlaps; with these the chunk runs unsplit, 1.08-1.10x its 3 splits (docs/benchmarks.md).
inline constexpr std::int32_t prefill_cta_overhead_tokens = 256;
inline constexpr std::int32_t prefill_merge_overhead_tokens = 256;

/// Most splits of one (sequence, query tile, KV head).
inline constexpr std::int32_t max_prefill_splits = 128;

}  // namespace pagedkv::kernels::cuda
