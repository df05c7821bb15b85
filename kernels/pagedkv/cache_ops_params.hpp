// Parameters of the cache operations (write_kv, copy_blocks, swap_blocks, pack_blocks /
// unpack_blocks), shared by the host reference and the CUDA kernels, and the host-side swap plans
// (plan_swap: direct copies; plan_staged_swap: through a device staging buffer).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include <pagedkv/error.hpp>
#include <pagedkv/types.hpp>

#include "kernels_config.hpp"
#include "kv_dtype.hpp"
#include "kv_layout.hpp"

namespace pagedkv::kernels {

/// Scatter new tokens' K and V of one layer into their slots.
struct write_kv_params {
  const void* k_new = nullptr;         ///< [num_tokens, num_kv_heads, head_dim], src_dtype
  const void* v_new = nullptr;         ///< [num_tokens, num_kv_heads, head_dim], src_dtype
  const slot_id* slot_mapping = nullptr; ///< [num_tokens] block * block_size + offset; -1 = padding, skipped
  void* pool = nullptr;                ///< the allocation that `layout` describes
  kv_cache_layout layout;
  std::int64_t src_token_stride = 0;   ///< elements between tokens of k_new/v_new; 0: packed
  std::int32_t num_tokens = 0;
  std::int32_t layer = 0;
  dtype src_dtype = dtype::bf16;       ///< must equal layout.kv_dtype unless that is fp8_e4m3
  float k_scale = 1.0f;                ///< fp8 pools store value / scale
  float v_scale = 1.0f;

  [[nodiscard]] PAGEDKV_HOST_DEVICE std::int64_t token_pitch() const {
    return src_token_stride ? src_token_stride
                            : std::int64_t(layout.shape.num_kv_heads) * layout.shape.head_dim;
  }
};
static_assert(std::is_trivially_copyable_v<write_kv_params>);

inline void check(const write_kv_params& p) {
  using pagedkv::detail::fail;
  if (p.num_tokens < 0) fail(errc::invalid_argument, "num_tokens ", p.num_tokens, " must be >= 0");
  if (p.layer < 0 || p.layer >= p.layout.shape.num_layers)
    fail(errc::invalid_argument, "layer ", p.layer, " outside [0, ", p.layout.shape.num_layers, ")");
  if (p.src_dtype != p.layout.kv_dtype && p.layout.kv_dtype != dtype::fp8_e4m3)
    fail(errc::invalid_argument, "src_dtype ", to_string(p.src_dtype), " must equal kv_dtype ",
         to_string(p.layout.kv_dtype), " or the pool must be fp8_e4m3");
  if (p.src_dtype == dtype::fp8_e4m3) fail(errc::invalid_argument, "src_dtype fp8_e4m3 is not supported");
  if (p.num_tokens > 0 && (!p.k_new || !p.v_new || !p.slot_mapping || !p.pool))
    fail(errc::invalid_argument, "k_new, v_new, slot_mapping and pool must be set");
}

/// Copy-on-write: for each (src, dst) pair copy block src to block dst, every layer, K and V.
struct copy_blocks_params {
  const block_id* pairs = nullptr;  ///< [num_pairs, 2] (src, dst), read where the copy runs
  void* pool = nullptr;
  kv_cache_layout layout;
  std::int32_t num_pairs = 0;
};
static_assert(std::is_trivially_copyable_v<copy_blocks_params>);

enum class swap_direction : std::uint8_t { device_to_host, host_to_device };

/// One contiguous byte range of a swap.
struct copy_range {
  std::size_t src_offset_bytes;
  std::size_t dst_offset_bytes;
  std::size_t bytes;
  friend bool operator==(const copy_range&, const copy_range&) = default;
};

namespace detail {
/// Whether two pools hold blocks of the same bytes: all but num_blocks and the layer order.
inline bool same_geometry(const kv_cache_layout& a, const kv_cache_layout& b) {
  return a.shape.num_layers == b.shape.num_layers && a.shape.block_size == b.shape.block_size &&
         a.shape.num_kv_heads == b.shape.num_kv_heads && a.shape.head_dim == b.shape.head_dim &&
         a.layout == b.layout && a.kv_dtype == b.kv_dtype;
}
}  // namespace detail

/// The copies that move blocks pairs[i].first of a pool laid out as `src` to blocks
/// pairs[i].second of one laid out as `dst`. The pools must have the same geometry (all but
/// num_blocks and the layer order). Pairs are sorted by source and runs of consecutive source and
/// destination blocks become one range per (layer, kv), or one range in all for block_major
/// pools; between pools of different layer orders each (block, layer, kv) is a range.
/// Throws errc::invalid_argument on mismatched layouts, errc::invalid_block on a block outside
/// its pool.
inline std::vector<copy_range> plan_swap(const kv_cache_layout& src, const kv_cache_layout& dst,
                                         std::span<const std::pair<block_id, block_id>> pairs) {
  using pagedkv::detail::fail;
  if (!detail::same_geometry(src, dst)) fail(errc::invalid_argument, "swap between pools of different geometry");
  std::vector<std::pair<block_id, block_id>> sorted(pairs.begin(), pairs.end());
  for (const auto& [s, d] : sorted) {
    if (s < 0 || s >= src.shape.num_blocks) fail(errc::invalid_block, "swap source block ", s, " outside [0, ", src.shape.num_blocks, ")");
    if (d < 0 || d >= dst.shape.num_blocks) fail(errc::invalid_block, "swap destination block ", d, " outside [0, ", dst.shape.num_blocks, ")");
  }
  std::sort(sorted.begin(), sorted.end());
  const std::size_t es = size_of(src.kv_dtype);
  const std::size_t block_bytes = std::size_t(src.block_elems()) * es;
  std::vector<copy_range> ranges;
  for (std::size_t i = 0; i < sorted.size();) {
    std::size_t n = 1;
    while (i + n < sorted.size() && sorted[i + n].first == sorted[i].first + block_id(n) &&
           sorted[i + n].second == sorted[i].second + block_id(n))
      ++n;
    const auto [s, d] = sorted[i];
    if (src.order != dst.order) {
      for (std::size_t k = 0; k < n; ++k)
        for (std::int32_t layer = 0; layer < src.shape.num_layers; ++layer)
          for (std::int32_t kv = 0; kv < 2; ++kv)
            ranges.push_back({std::size_t(src.offset(layer, kv, s + block_id(k), 0, 0)) * es,
                              std::size_t(dst.offset(layer, kv, d + block_id(k), 0, 0)) * es, block_bytes});
    } else if (src.order == layer_order::block_major) {
      ranges.push_back({std::size_t(src.offset(0, 0, s, 0, 0)) * es, std::size_t(dst.offset(0, 0, d, 0, 0)) * es,
                        n * std::size_t(src.block_stride) * es});
    } else {
      for (std::int32_t layer = 0; layer < src.shape.num_layers; ++layer)
        for (std::int32_t kv = 0; kv < 2; ++kv)
          ranges.push_back({std::size_t(src.offset(layer, kv, s, 0, 0)) * es,
                            std::size_t(dst.offset(layer, kv, d, 0, 0)) * es, n * block_bytes});
    }
    i += n;
  }
  return ranges;
}

// ---- staged swaps ----
//
// A layer-major pool scatters one block over 2 * num_layers pieces (128 KiB each for LLaMA-2-7B's
// 16-token bf16 blocks), and PCIe copies of pieces that small reach about 40% of one large copy's
// rate (docs/benchmarks.md, "Host tier copies"). A staged swap moves whole blocks instead: on the
// device, pack_blocks gathers a chunk of blocks into a contiguous staging buffer in block-major
// order, and one copy per run of consecutive host blocks takes it to a block_major host pool;
// loads run the other way (copies into staging, unpack_blocks scatters).

/// The most blocks one pack_blocks / unpack_blocks launch moves: their ids travel in the params.
inline constexpr std::int32_t max_stage_blocks = 256;

/// Gathers (pack_blocks) or scatters (unpack_blocks) whole blocks between a pool and a staging
/// buffer that holds them back to back, each as a block_major pool's block: [num_layers, 2,
/// block_elems]. The ids travel by value, so a launch reads nothing the host must upload first
/// and a captured graph replays it as it was.
struct stage_blocks_params {
  void* pool = nullptr;     ///< the allocation that `layout` describes
  void* staging = nullptr;  ///< [num_blocks, num_layers, 2, block_elems] of layout.kv_dtype
  kv_cache_layout layout;
  std::int32_t num_blocks = 0;
  block_id blocks[max_stage_blocks] = {};  ///< staging slot i holds pool block blocks[i]
};
static_assert(std::is_trivially_copyable_v<stage_blocks_params>);

inline void check(const stage_blocks_params& p) {
  using pagedkv::detail::fail;
  if (p.num_blocks < 0 || p.num_blocks > max_stage_blocks)
    fail(errc::invalid_argument, "stage_blocks num_blocks ", p.num_blocks, " outside [0, ", max_stage_blocks, "]");
  for (std::int32_t i = 0; i < p.num_blocks; ++i)
    if (p.blocks[i] < 0 || p.blocks[i] >= p.layout.shape.num_blocks)
      fail(errc::invalid_block, "stage_blocks slot ", i, " names block ", p.blocks[i], " outside [0, ",
           p.layout.shape.num_blocks, ")");
  if (p.num_blocks > 0 && (!p.pool || !p.staging)) fail(errc::invalid_argument, "stage_blocks: pool and staging must be set");
}

/// One copy between a staging buffer and a host pool.
struct staging_range {
  std::size_t staging_offset_bytes;
  std::size_t host_offset_bytes;
  std::size_t bytes;
  friend bool operator==(const staging_range&, const staging_range&) = default;
};

/// What one staging buffer carries: pool blocks in staging-slot order and the copies between the
/// buffer and the host pool.
struct staged_chunk {
  std::vector<block_id> pool_blocks;
  std::vector<staging_range> ranges;
};

/// The staged swap of pairs (pool block, host block) between a pool laid out as `pool` (either
/// order) and a block_major host pool, in chunks of at most blocks_per_chunk blocks (at most
/// max_stage_blocks). Pairs are sorted by host block, so that runs of consecutive host blocks sit
/// in consecutive staging slots and each run is one copy (split only where a chunk ends).
/// Throws errc::invalid_argument on mismatched geometry, a host pool that is not block_major,
/// blocks_per_chunk outside [1, max_stage_blocks] or a host block named twice;
/// errc::invalid_block on a block outside its pool.
inline std::vector<staged_chunk> plan_staged_swap(const kv_cache_layout& pool, const kv_cache_layout& host,
                                                  std::span<const std::pair<block_id, block_id>> pairs,
                                                  std::int32_t blocks_per_chunk) {
  using pagedkv::detail::fail;
  if (!detail::same_geometry(pool, host)) fail(errc::invalid_argument, "staged swap between pools of different geometry");
  if (host.order != layer_order::block_major)
    fail(errc::invalid_argument, "staged swap: the host pool must be block_major, so that a block is one copy");
  if (blocks_per_chunk < 1 || blocks_per_chunk > max_stage_blocks)
    fail(errc::invalid_argument, "staged swap: blocks_per_chunk ", blocks_per_chunk, " outside [1, ", max_stage_blocks, "]");
  std::vector<std::pair<block_id, block_id>> by_host;  // (host, pool)
  by_host.reserve(pairs.size());
  for (const auto& [p, h] : pairs) {
    if (p < 0 || p >= pool.shape.num_blocks) fail(errc::invalid_block, "staged swap pool block ", p, " outside [0, ", pool.shape.num_blocks, ")");
    if (h < 0 || h >= host.shape.num_blocks) fail(errc::invalid_block, "staged swap host block ", h, " outside [0, ", host.shape.num_blocks, ")");
    by_host.emplace_back(h, p);
  }
  std::sort(by_host.begin(), by_host.end());
  for (std::size_t i = 1; i < by_host.size(); ++i)
    if (by_host[i].first == by_host[i - 1].first)
      fail(errc::invalid_argument, "staged swap names host block ", by_host[i].first, " twice");
  const std::size_t block_bytes = host.bytes_per_block();
  std::vector<staged_chunk> chunks;
  for (std::size_t first = 0; first < by_host.size(); first += std::size_t(blocks_per_chunk)) {
    const std::size_t end = std::min(by_host.size(), first + std::size_t(blocks_per_chunk));
    staged_chunk& c = chunks.emplace_back();
    for (std::size_t i = first; i < end; ++i) {
      const block_id h = by_host[i].first;
      c.pool_blocks.push_back(by_host[i].second);
      if (i > first && h == by_host[i - 1].first + 1) {
        c.ranges.back().bytes += block_bytes;
      } else {
        c.ranges.push_back({(i - first) * block_bytes, std::size_t(host.offset(0, 0, h, 0, 0)) * size_of(host.kv_dtype),
                            block_bytes});
      }
    }
  }
  return chunks;
}

}  // namespace pagedkv::kernels
