// The host planner of the CUDA prefill (cuda/prefill.cuh): the grid of query tiles and whether the
// KV splits, from the host copy of q_indptr. Plain C++ over host values only, so that planning is
// apart from running (a run allocates nothing, never synchronises and can be captured in a CUDA
// graph) and is tested without a GPU (tests/kernels/test_prefill_plan.cpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include <pagedkv/error.hpp>

#include "attention_params.hpp"
#include "prefill_tuning.hpp"

namespace pagedkv::kernels::cuda {

/// Which kernel body a prefill plan runs: automatic (planning only) lets plan_prefill choose;
/// mma is the mma.sync kernel (every compiled case); wgmma the Hopper kernel (sm_90a, head_dim
/// 128, q and KV of one 16-bit type; warp-specialised).
enum class prefill_kernel : std::int32_t { automatic = 0, mma = 1, wgmma = 2 };

/// n / divisor and n % divisor for 0 <= n < 2^31 by a multiply-high, an add and a shift, the
/// multiplier made once on the host (the round-up method of Granlund and Montgomery, as
/// FlashInfer's uint_fastdiv and CUTLASS's FastDivmod): with l = ceil(log2 divisor) and
/// m = floor(2^32 (2^l - divisor) / divisor) + 1, n / divisor = (umulhi(n, m) + n) >> l, the sum
/// within 32 bits while n < 2^31. The wgmma prefill splits its packed rows (token, head of the
/// group) by it, where a run-time division costs about 20 instructions a row.
struct fast_divmod {
  std::uint32_t divisor = 1, multiplier = 0;  ///< the default divides by 1
  std::int32_t shift = 0;

  fast_divmod() = default;
  /// Throws errc::invalid_argument for a divisor below 1.
  explicit fast_divmod(std::int32_t d) {
    if (d < 1) pagedkv::detail::fail(errc::invalid_argument, "fast_divmod: divisor ", d, " must be >= 1");
    divisor = std::uint32_t(d);
    while ((std::uint64_t(1) << shift) < divisor) ++shift;
    multiplier = std::uint32_t(((std::uint64_t(1) << 32) * ((std::uint64_t(1) << shift) - divisor)) / divisor + 1);
  }
  [[nodiscard]] PAGEDKV_HOST_DEVICE std::int32_t div(std::int32_t n) const {
    const auto hi = std::uint32_t((std::uint64_t(std::uint32_t(n)) * multiplier) >> 32);
    return std::int32_t((hi + std::uint32_t(n)) >> shift);
  }
  [[nodiscard]] PAGEDKV_HOST_DEVICE std::int32_t mod(std::int32_t n) const {
    return n - div(n) * std::int32_t(divisor);
  }
};

/// How a prefill launch covers its batch. The grid is (num_seqs * q_tiles_per_seq, num_kv_heads,
/// num_splits); a CTA whose query tile lies past its sequence's rows exits at once, so the plan
/// stays valid while each sequence's q_len stays at most max_q_len and the batch's total of query
/// tokens stays num_q_tokens.
struct prefill_plan {
  std::int32_t num_seqs = 0;
  prefill_kernel kernel = prefill_kernel::mma;  ///< the body the plan was made for (its tile below)
  std::int32_t group = 0;            ///< query heads a KV head, as planned
  fast_divmod group_div;             ///< division by group (the wgmma body's packed rows)
  /// Divisions by num_seqs (1 without sequences), num_kv_heads and num_splits: the wgmma CTA's
  /// place in the grid split into (query tile, KV head, sequence, split) without a run-time division.
  fast_divmod seq_div, kv_head_div, split_div;
  std::int32_t head_dim = 0;         ///< as planned
  std::int32_t q_first = 0;          ///< host q_indptr[0]: the first query token's row of q and o
  std::int32_t num_q_tokens = 0;     ///< q_indptr[num_seqs] - q_indptr[0]
  std::int32_t max_q_len = 0;
  std::int32_t q_tile_rows = 0;      ///< (query token, query head of the group) rows a CTA
  std::int32_t kv_tile_tokens = 0;
  std::int32_t q_tiles_per_seq = 0;  ///< ceil(max_q_len * group / q_tile_rows)
  std::int32_t num_splits = 1;       ///< KV splits of each CTA's range; > 1: partials merged by merge_states
  std::int32_t split_tokens = 0;     ///< KV positions a split covers, a multiple of kv_tile_tokens (0: one split)
  std::int64_t live_ctas = 0;        ///< CTAs with rows to compute, across every split
  /// The wgmma body's CTA order: false, each KV head's query tiles (longest causal range first)
  /// before the next head's; true, every head's longest tiles first (prefill_wgmma_cta::make;
  /// where prefill_tiles_across_heads holds). The mma.sync body ignores it.
  bool tiles_across_heads = false;
  std::size_t workspace_bytes = 0;   ///< the splits' partial outputs and LSEs (0 with one split)

  /// Rows of the merge: every (query token, query head) of the batch.
  [[nodiscard]] PAGEDKV_HOST_DEVICE std::int64_t merge_rows(std::int32_t num_qo_heads) const {
    return std::int64_t(num_q_tokens) * num_qo_heads;
  }
  /// Byte offset of the partial LSEs in the workspace (after the partial outputs, 256-aligned).
  [[nodiscard]] std::size_t lse_offset(std::int32_t num_qo_heads, std::size_t out_elem_bytes) const {
    const std::size_t o_bytes =
        std::size_t(num_splits) * std::size_t(merge_rows(num_qo_heads)) * std::size_t(head_dim) * out_elem_bytes;
    return (o_bytes + 255) / 256 * 256;
  }
};

/// The fewest page rows a K/V copy of the wgmma body takes by the bulk tensor copy (TMA), from its
/// copying warpgroup: runs of 16 tokens (block size 16) measured 1.05-1.15x its cp.async gathers
/// on the issue-21 shapes in run k and 0.97-1.09x in run l (below 1.0 on 16 x 1k 32/32 only;
/// docs/journal/prefill-kernel.md, session 4), and 1.03-1.16x more since the boxes are spread over
/// the copier's four warps (run bs-1, session 5). Shorter runs (one box each) stay with cp.async.
inline constexpr std::int32_t prefill_tma_min_rows = 16;

/// Rows of the page runs a tile of tile_tokens tokens is copied in by TMA (one box of 64 dims
/// each): the block size up to the tile, where runs split the tile and the page evenly (block
/// sizes 16, 32, 64, 128 and multiples of 128 for a 128-token tile); 0 (cp.async) for other block
/// sizes, head_dim other than 128, and KV other than bf16 and f16.
[[nodiscard]] inline std::int32_t prefill_tma_page_rows(std::int32_t block_size, std::int32_t head_dim,
                                                        dtype kv_dtype, std::int32_t tile_tokens) {
  if (head_dim != 128 || (kv_dtype != dtype::bf16 && kv_dtype != dtype::f16) || tile_tokens <= 0) return 0;
  const std::int32_t rows = std::min(block_size, tile_tokens);
  if (rows < prefill_tma_min_rows || rows > 256 || tile_tokens % rows != 0 || block_size % rows != 0) return 0;
  return rows;
}

/// The tokens of the wgmma body's q or o box (TMA) for tiles of q_rows packed rows (token, query
/// head of the group): a tile is q_rows / group whole tokens where the group divides it (one box:
/// the group's heads, those tokens, 64 dims); 0 (copies a thread) for other groups, head_dim other
/// than 128, q other than bf16 and f16. Q by the copier's TMA: run qt-1 (docs/journal/prefill-kernel.md).
[[nodiscard]] inline std::int32_t prefill_tma_q_tokens(std::int32_t group, std::int32_t head_dim, dtype q_dtype,
                                                       std::int32_t q_rows) {
  if (head_dim != 128 || (q_dtype != dtype::bf16 && q_dtype != dtype::f16) || group < 1 || q_rows % group != 0)
    return 0;
  return group <= 256 && q_rows / group <= 256 ? q_rows / group : 0;  // a box's dimensions: at most 256
}

/// The most CTAs an SM (waves) of a grid whose wgmma CTAs take every KV head's longest query tiles
/// first (prefill_plan::tiles_across_heads). Where each head's tiles come in turn, the last head's
/// longest tile starts near the grid's end: on the 4k prompt (1024 CTAs, 7.8 waves) the SMs were
/// busy 87% of the kernel (Nsight Compute, run ws2-a), and the order across heads gave 1.07x
/// (32/32) and 1.03x (32/8) in run ws2-b. On the 16k prompt (31 waves) it lost 0.93x and 0.99x:
/// the CTAs at work at once share a head's K/V in L2 only in the head-by-head order, and the tail
/// is a smaller part of a longer grid (docs/journal/prefill-kernel.md, session 4).
inline constexpr std::int64_t prefill_across_heads_max_waves = 8;

/// Whether plan's wgmma CTAs take every KV head's longest query tiles first: one sequence whose
/// queries are more than half of its context (its tiles' causal ranges differ most), no KV split
/// (a chunk over a long cache: ranges alike; 0.88x and 0.95x at batch 1 in run ws2-b), and at
/// most prefill_across_heads_max_waves CTAs an SM. Several sequences keep the head-by-head order:
/// the CTAs at work share each sequence's K/V in L2 only there (16 x 1k: 0.86x, 0.84x; 512 over
/// 8k at batch 8: 0.79x, 0.93x across heads in run ws2-b).
[[nodiscard]] inline bool prefill_tiles_across_heads(const prefill_plan& plan, std::int32_t max_kv_len, int num_sms) {
  return plan.num_seqs == 1 && plan.num_splits == 1 && 2 * std::int64_t(plan.max_q_len) > max_kv_len &&
         plan.live_ctas <= prefill_across_heads_max_waves * num_sms;
}

namespace detail {

/// Sets plan's KV splits to `wanted` or fewer (whole KV tiles a split, as even as tiles allow, none
/// wholly past p.max_kv_len) and the live CTAs and workspace with them; plan's grid (live_ctas of
/// one split) already planned. Returns the split count.
inline std::int32_t set_prefill_splits(prefill_plan& plan, const attention_params& p, std::int64_t ctas,
                                       std::int64_t wanted, std::size_t out_elem_bytes) {
  const std::int32_t max_len = std::max(p.max_kv_len, 1);
  plan.num_splits = 1;
  plan.split_tokens = 0;
  plan.live_ctas = ctas;
  plan.workspace_bytes = 0;
  if (wanted > 1) {
    const std::int32_t kv_tiles = (max_len + plan.kv_tile_tokens - 1) / plan.kv_tile_tokens;
    const auto per_split = std::int32_t((kv_tiles + wanted - 1) / wanted);
    plan.split_tokens = per_split * plan.kv_tile_tokens;
    plan.num_splits = (max_len + plan.split_tokens - 1) / plan.split_tokens;
  }
  if (plan.num_splits > 1) {
    plan.live_ctas = ctas * plan.num_splits;
    plan.workspace_bytes = plan.lse_offset(p.num_qo_heads, out_elem_bytes) +
                           std::size_t(plan.num_splits) * std::size_t(plan.merge_rows(p.num_qo_heads)) * sizeof(float);
  } else {
    plan.split_tokens = 0;
  }
  return plan.num_splits;
}

}  // namespace detail

/// The most workspace a plan_prefill plan takes for at most max_q_tokens query tokens of
/// num_qo_heads heads over contexts of at most max_kv_len tokens, on any tile and SM count: at
/// most min(max_prefill_splits, max_kv_len / prefill_min_split_tokens) splits, each with every
/// row's partial output (head_dim x out_elem_bytes) and LSE; 0 where no split can happen. Loose
/// by design (a chosen split fills the SMs' free slots, far fewer rows): a caller that reserves
/// less caps the splits with attention_params::max_splits (tests/kernels/test_prefill_plan.cpp).
inline std::size_t prefill_workspace_bound(std::int64_t max_q_tokens, std::int32_t num_qo_heads, std::int32_t head_dim,
                                           std::int32_t max_kv_len, std::size_t out_elem_bytes) {
  const std::int64_t splits = std::min<std::int64_t>(max_kv_len / prefill_min_split_tokens, max_prefill_splits);
  if (splits < 2 || max_q_tokens < 1) return 0;
  const auto rows = std::size_t(splits) * std::size_t(max_q_tokens) * std::size_t(num_qo_heads);
  return (rows * std::size_t(head_dim) * out_elem_bytes + 255) / 256 * 256 + rows * sizeof(float);
}

/// Plans a prefill of p over `num_sms` SMs with tiles of `tile`. host_q_indptr is the host copy of
/// p.q_indptr (num_seqs + 1 non-decreasing entries). Splits the KV where that ends the grid sooner:
/// of the split counts up to p.max_splits (when set), max_prefill_splits and one split a
/// prefill_min_split_tokens, the one whose waves (tile.ctas_per_sm CTAs an SM) times a split's
/// tokens and prefill_cta_overhead_tokens, plus prefill_merge_overhead_tokens when it splits, are
/// fewest; the fewest splits of equals. So a grid that fills the SMs once without a split (the
/// wgmma body's 128 CTAs of a 512-token chunk over 8k: 1 wave of 68 tiles, against 3 of 23 with
/// 3 splits) does not split (1.08-1.10x in run ws3b-1). Throws errc::invalid_argument naming a bad
/// value. Reads no device memory.
inline prefill_plan plan_prefill(const attention_params& p, std::span<const std::int32_t> host_q_indptr, int num_sms,
                                 prefill_tile_shape tile, std::size_t out_elem_bytes) {
  using pagedkv::detail::fail;
  check(p);
  if (std::int64_t(host_q_indptr.size()) != std::int64_t(p.num_seqs) + 1)
    fail(errc::invalid_argument, "prefill: host_q_indptr has ", host_q_indptr.size(), " entries, num_seqs + 1 = ",
         std::int64_t(p.num_seqs) + 1, " expected");
  if (tile.q_rows < 16 || tile.kv_tokens < 16)
    fail(errc::invalid_argument, "prefill: tile of ", tile.q_rows, " rows and ", tile.kv_tokens, " tokens");
  if (host_q_indptr[0] < 0) fail(errc::invalid_argument, "prefill: q_indptr[0] ", host_q_indptr[0], " must be >= 0");
  prefill_plan plan;
  plan.num_seqs = p.num_seqs;
  plan.group = p.group_size();
  plan.group_div = fast_divmod(plan.group);
  plan.head_dim = p.head_dim;
  plan.q_first = host_q_indptr[0];
  plan.q_tile_rows = tile.q_rows;
  plan.kv_tile_tokens = tile.kv_tokens;
  std::int64_t tiles = 0;
  for (std::int32_t s = 0; s < p.num_seqs; ++s) {
    const std::int32_t q_len = host_q_indptr[std::size_t(s) + 1] - host_q_indptr[std::size_t(s)];
    if (q_len < 0)
      fail(errc::invalid_argument, "prefill: q_indptr decreases at sequence ", s, " (", host_q_indptr[std::size_t(s)],
           " to ", host_q_indptr[std::size_t(s) + 1], ")");
    if (q_len > p.max_kv_len)
      fail(errc::invalid_argument, "prefill: sequence ", s, " has ", q_len, " query tokens, more than max_kv_len ",
           p.max_kv_len);
    plan.max_q_len = std::max(plan.max_q_len, q_len);
    tiles += (std::int64_t(q_len) * plan.group + tile.q_rows - 1) / tile.q_rows;
  }
  plan.num_q_tokens = host_q_indptr[std::size_t(p.num_seqs)] - plan.q_first;
  const std::int64_t tiles_per_seq = (std::int64_t(plan.max_q_len) * plan.group + tile.q_rows - 1) / tile.q_rows;
  if (tiles_per_seq * p.num_seqs > 0x7fffffff)
    fail(errc::invalid_argument, "prefill: ", p.num_seqs, " sequences of up to ", plan.max_q_len,
         " query tokens exceed the grid");
  if (p.num_kv_heads > 65535) fail(errc::invalid_argument, "prefill: num_kv_heads ", p.num_kv_heads, " exceeds the grid");
  plan.seq_div = fast_divmod(std::max(p.num_seqs, 1));
  plan.kv_head_div = fast_divmod(p.num_kv_heads);
  plan.q_tiles_per_seq = std::int32_t(tiles_per_seq);
  const std::int64_t ctas = tiles * p.num_kv_heads;
  plan.live_ctas = ctas;

  // Splits: the count whose grid ends first by the waves' model above.
  const std::int32_t max_len = std::max(p.max_kv_len, 1);
  std::int64_t cap = std::min<std::int64_t>(max_len / prefill_min_split_tokens, max_prefill_splits);
  if (p.max_splits > 0) cap = std::min<std::int64_t>(cap, p.max_splits);
  const std::int64_t slots = std::int64_t(std::max(num_sms, 1)) * std::max(tile.ctas_per_sm, 1);
  std::int64_t best = 1, best_cost = -1;
  for (std::int64_t wanted = 1; ctas > 0 && wanted <= std::max<std::int64_t>(cap, 1); ++wanted) {
    const std::int32_t n = detail::set_prefill_splits(plan, p, ctas, wanted, out_elem_bytes);
    const std::int64_t waves = (ctas * n + slots - 1) / slots;
    const std::int64_t tokens = n > 1 ? plan.split_tokens : max_len;
    const std::int64_t cost =
        waves * (tokens + prefill_cta_overhead_tokens) + (n > 1 ? prefill_merge_overhead_tokens : 0);
    if (best_cost < 0 || cost < best_cost) best = wanted, best_cost = cost;
  }
  detail::set_prefill_splits(plan, p, ctas, best, out_elem_bytes);
  plan.split_div = fast_divmod(plan.num_splits);
  // The wgmma CTA's place in the grid (either order) is an int32 divided by the plan's divisors.
  if (tiles_per_seq * p.num_seqs * p.num_kv_heads * plan.num_splits > 0x7fffffff)
    fail(errc::invalid_argument, "prefill: ", p.num_seqs, " sequences of up to ", plan.max_q_len, " query tokens, ",
         p.num_kv_heads, " KV heads and ", plan.num_splits, " splits exceed the grid");
  plan.tiles_across_heads = prefill_tiles_across_heads(plan, p.max_kv_len, num_sms);
  return plan;
}

}  // namespace pagedkv::kernels::cuda
