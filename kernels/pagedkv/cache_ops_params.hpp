// Parameters of the cache operations (write_kv, copy_blocks, swap_blocks), shared by the host
// reference and the CUDA kernels, and the host-side swap plan.
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

/// The copies that move blocks pairs[i].first of a pool laid out as `src` to blocks
/// pairs[i].second of one laid out as `dst`. The pools must have the same geometry (all but
/// num_blocks). Pairs are sorted by source and runs of consecutive source and destination
/// blocks become one range per (layer, kv), or one range in all for block_major pools.
/// Throws errc::invalid_argument on mismatched layouts, errc::invalid_block on a block outside
/// its pool.
inline std::vector<copy_range> plan_swap(const kv_cache_layout& src, const kv_cache_layout& dst,
                                         std::span<const std::pair<block_id, block_id>> pairs) {
  using pagedkv::detail::fail;
  const auto same = [](const kv_cache_layout& a, const kv_cache_layout& b) {
    return a.shape.num_layers == b.shape.num_layers && a.shape.block_size == b.shape.block_size &&
           a.shape.num_kv_heads == b.shape.num_kv_heads && a.shape.head_dim == b.shape.head_dim &&
           a.layout == b.layout && a.order == b.order && a.kv_dtype == b.kv_dtype;
  };
  if (!same(src, dst)) fail(errc::invalid_argument, "swap between pools of different geometry");
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
    if (src.order == layer_order::block_major) {
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

}  // namespace pagedkv::kernels
