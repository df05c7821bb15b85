// The host planner of the CUDA decode: how a launch splits its work (split-K chunks) and, for the
// tensor-core body, on which CTA shape. Plain C++ over host values only (batch, KV heads, the
// longest context, the SM count): the plan is the same for every step of a CUDA graph captured
// at a capacity, and its tests need no CUDA compiler (tests/kernels/test_decode_plan.cpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "attention_params.hpp"
#include "decode_tuning.hpp"

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
/// tokens give 16 of 512 rather than 15 of 576 and one of 128); never below min_chunk tokens a
/// split nor beyond p.max_splits (when set). One CTA an SM streams near the wall, and each split
/// beyond that adds merge work and a pipeline ramp (benchmarks.md, "Split-K: the planner's choice
/// against caps"; docs/journal/decode-kernel.md, "Split count").
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

/// The most workspace a plan_decode or plan_decode_mma plan on num_sms SMs takes for at most
/// max_seqs sequences of these heads, at any context length and split cap: a plan splits into at
/// most twice the splits it wants (ceil(T / units), T its target CTAs at up to two an SM; fewer
/// tiles than that split no further), so sequences x splits <= 2 (ceil(T / num_kv_heads) +
/// max_seqs), and no sequence takes more than max_decode_splits. What a caller reserves once so
/// that no decode of up to max_seqs sequences needs more (tests/kernels/test_decode_plan.cpp).
inline std::size_t decode_workspace_bound(std::int32_t max_seqs, std::int32_t num_qo_heads, std::int32_t num_kv_heads,
                                          std::int32_t head_dim, int num_sms) {
  if (max_seqs < 1) return 0;
  const std::int64_t target = std::max<std::int64_t>(1, std::int64_t(num_sms) * 2 * 9 / 10);
  const std::int64_t kv_heads = std::max(num_kv_heads, 1);
  const std::int64_t rows = std::min(2 * ((target + kv_heads - 1) / kv_heads + max_seqs),
                                     std::int64_t(max_decode_splits) * max_seqs);
  return std::size_t(rows) * std::size_t(num_qo_heads) * (std::size_t(head_dim) + 1) * sizeof(float);
}

/// Launches of at least this many CTAs an SM (five waves of three) run shallow CTAs: with fewer
/// waves the last one's quantisation costs more than the overlap gains (decode-kernel.md, "CTA
/// shapes").
inline constexpr int decode_shallow_min_ctas_per_sm = 15;

/// Whether narrow CTAs on both slots of every SM (`both`, planned for two CTAs an SM) beat wide
/// ones alone on `one` (planned for one an SM): twice the splits stream faster and cost the merge
/// more, so both slots when every CTA fits one wave of two an SM in at most 8 splits, and either
/// each keeps 4096 tokens or the launch splits already with groups of 4 or fewer (few partial
/// rows a CTA to merge). Measured on the small bf16 rows of benchmarks.md's decode table
/// (decode-kernel.md, "Both CTA slots").
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
///   SMs, twice the loads in flight per SM at bf16 head_dim 128 (with more CTAs than SMs, one
///   CTA's ramp would leave its SM idle).
/// - shallow (2 stages, three an SM) when the grid has at least decode_shallow_min_ctas_per_sm
///   CTAs an SM: each CTA's ramp and merge overlap two others' streaming.
/// - narrow (two an SM) otherwise, and instead of wide where twice the splits fill both slots of
///   every SM and stay a cheap merge (decode_both_slots_worth).
/// - paired (two adjacent KV heads a CTA, has_paired) before all of these where pairs can be had
///   (decode_pairs_fit) and there are at least as many pairs as SMs: no split, and rows of both
///   heads copied whole.
///
/// benchmarks.md, decode table (batch 1-256, ctx 128-32k); the A/Bs that chose each shape:
/// docs/journal/decode-kernel.md, "CTA shapes".
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

}  // namespace pagedkv::kernels::cuda
