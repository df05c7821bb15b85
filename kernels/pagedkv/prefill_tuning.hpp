// Tile shapes of the CUDA prefill (cuda/prefill.cuh), shared by its host planner and its kernels.
// Not tuned yet: FlashAttention-2's mma.sync shape for head_dim 128 (4 warps of 16 query rows,
// 64-token KV tiles, two stages), halved in KV tokens for head_dim 256 so that two CTAs fit an SM.
// bench/kernels/bench_prefill.cu is what a change here is measured with.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pagedkv::kernels::cuda {

/// A prefill CTA's tile: q_rows (query token, query head of the group) rows, kv_tokens KV
/// tokens a step.
struct prefill_tile_shape {
  std::int32_t q_rows = 0;
  std::int32_t kv_tokens = 0;
};

/// The tile of head_dim d: each of 4 warps owns 16 rows (one m16n8k16 m-tile).
constexpr prefill_tile_shape prefill_tile_of(std::int32_t head_dim) { return {64, head_dim <= 128 ? 64 : 32}; }

/// A split covers at least this many KV tokens (8 tiles of 64): below it the query tile's load
/// and the merge cost more than the parallelism gains. Not measured yet.
inline constexpr std::int32_t prefill_min_split_tokens = 512;

/// Most splits of one (sequence, query tile, KV head).
inline constexpr std::int32_t max_prefill_splits = 128;

/// Compile-time form for the kernels.
template <int D>
struct prefill_policy {
  static constexpr int warps = 4;
  static constexpr int threads = 32 * warps;
  static constexpr int q_rows = prefill_tile_of(D).q_rows;
  static constexpr int kv_tokens = prefill_tile_of(D).kv_tokens;
  static constexpr int stages = 2;
  static_assert(q_rows == 16 * warps, "a warp owns one m-tile of 16 rows");
  static_assert(kv_tokens % 16 == 0 && kv_tokens <= threads, "whole k-steps; a thread looks up each row");
};

}  // namespace pagedkv::kernels::cuda
