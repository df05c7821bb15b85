// Where each K and V element of a paged KV cache lives: one descriptor that host code, the host
// reference and the CUDA kernels share (see docs/concepts.md for block and slot).
//
// A pool is one allocation holding every layer's K and V blocks. Coordinates are
// (layer, kv, block, token, head, dim) with kv = 0 for K and 1 for V. Inside one block of one
// layer's K (or V) the data is packed as NHD [block_size, num_kv_heads, head_dim] or HND
// [num_kv_heads, block_size, head_dim]; the three outer strides are explicit:
//   layer_major: [num_layers, 2, num_blocks, <block>]  per-layer K and V pools
//   block_major: [num_blocks, num_layers, 2, <block>]  one block is contiguous across all layers,
//                so swapping or offloading a block is one copy
#pragma once

#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include <pagedkv/error.hpp>
#include <pagedkv/types.hpp>

#include "kernels_config.hpp"
#include "kv_dtype.hpp"

namespace pagedkv::kernels {

enum class kv_layout : std::uint8_t { nhd, hnd };
enum class layer_order : std::uint8_t { layer_major, block_major };

/// The shape of a pool, without its layout.
struct kv_cache_shape {
  std::int32_t num_layers = 1;
  std::int32_t num_blocks = 0;
  std::int32_t block_size = 16;    ///< tokens per block, 1 to max_kernel_block_size
  std::int32_t num_kv_heads = 1;
  std::int32_t head_dim = 128;
};

/// Largest block the kernels accept: a block of 256 tokens is already larger than any tile.
inline constexpr std::int32_t max_kernel_block_size = 256;

/// The GPU's page of device memory (the large pages cudaMalloc maps): a decode whose block table
/// stays in a page for the page's blocks streams as fast as over contiguous KV (benchmarks.md,
/// "Paging overhead", the engine extents column).
inline constexpr std::size_t gpu_page_bytes = std::size_t(2) << 20;

/// Shape plus strides. Strides are in elements. Trivially copyable: pass it to kernels by value.
struct kv_cache_layout {
  kv_cache_shape shape;
  kv_layout layout = kv_layout::nhd;
  layer_order order = layer_order::layer_major;
  dtype kv_dtype = dtype::bf16;
  std::int64_t layer_stride = 0;
  std::int64_t kv_stride = 0;     ///< from a layer's K to its V
  std::int64_t block_stride = 0;
  std::int64_t token_stride = 0;  ///< inside a block: head_dim * num_kv_heads (NHD) or head_dim (HND)
  std::int64_t head_stride = 0;   ///< inside a block: head_dim (NHD) or head_dim * block_size (HND)

  /// Elements of one block of one layer's K (or V).
  [[nodiscard]] PAGEDKV_HOST_DEVICE std::int64_t block_elems() const {
    return std::int64_t(shape.block_size) * shape.num_kv_heads * shape.head_dim;
  }
  /// Offset in elements of (layer, kv, block, token, head, dim 0).
  [[nodiscard]] PAGEDKV_HOST_DEVICE std::int64_t offset(std::int32_t layer, std::int32_t kv,
                                                        std::int32_t block, std::int32_t token,
                                                        std::int32_t head) const {
    return layer * layer_stride + kv * kv_stride + block * block_stride + token * token_stride +
           head * head_stride;
  }
  /// Offset of slot = block * block_size + token, the token coordinate of write_kv.
  [[nodiscard]] PAGEDKV_HOST_DEVICE std::int64_t slot_offset(std::int32_t layer, std::int32_t kv,
                                                             slot_id slot, std::int32_t head) const {
    const auto block = std::int32_t(slot / shape.block_size);
    const auto token = std::int32_t(slot - std::int64_t(block) * shape.block_size);
    return offset(layer, kv, block, token, head);
  }
  /// Elements of the whole allocation.
  [[nodiscard]] std::int64_t size() const {
    return std::int64_t(shape.num_layers) * 2 * shape.num_blocks * block_elems();
  }
  [[nodiscard]] std::size_t size_bytes() const { return std::size_t(size()) * size_of(kv_dtype); }
  /// Bytes that one block id stands for: all layers, K and V.
  [[nodiscard]] std::size_t bytes_per_block() const {
    return std::size_t(2) * shape.num_layers * std::size_t(block_elems()) * size_of(kv_dtype);
  }
  /// Consecutive block ids whose K (or V) of one layer spans page_bytes: the extent to give
  /// pagedkv::extent_free_list (kv_cache_options::extent_blocks), so that each sequence's blocks
  /// share pages. At least 1, at most num_blocks.
  [[nodiscard]] std::int32_t blocks_per_page(std::size_t page_bytes = gpu_page_bytes) const {
    const std::size_t per_page = page_bytes / (std::size_t(block_stride) * size_of(kv_dtype));
    return per_page < 1 ? 1 : per_page > std::size_t(shape.num_blocks) ? shape.num_blocks : std::int32_t(per_page);
  }
};

namespace detail {
inline void check_shape(const kv_cache_shape& s, bool need_blocks) {
  if (s.num_layers < 1) pagedkv::detail::fail(errc::invalid_argument, "num_layers ", s.num_layers, " must be >= 1");
  if (need_blocks && (s.num_blocks < 1 || s.num_blocks > max_num_blocks))
    pagedkv::detail::fail(errc::invalid_argument, "num_blocks ", s.num_blocks, " must be in [1, ", max_num_blocks, "]");
  if (s.block_size < 1 || s.block_size > max_kernel_block_size)
    pagedkv::detail::fail(errc::invalid_argument, "block_size ", s.block_size, " must be in [1, ",
                          max_kernel_block_size, "]");
  if (s.num_kv_heads < 1) pagedkv::detail::fail(errc::invalid_argument, "num_kv_heads ", s.num_kv_heads, " must be >= 1");
  if (s.head_dim < 1) pagedkv::detail::fail(errc::invalid_argument, "head_dim ", s.head_dim, " must be >= 1");
}
}  // namespace detail

/// The packed layout of `shape`. Throws errc::invalid_argument on a non-positive or absurd size.
inline kv_cache_layout make_kv_cache_layout(const kv_cache_shape& shape, kv_layout layout, dtype kv_dtype,
                                            layer_order order = layer_order::layer_major) {
  detail::check_shape(shape, true);
  kv_cache_layout l;
  l.shape = shape;
  l.layout = layout;
  l.order = order;
  l.kv_dtype = kv_dtype;
  const std::int64_t d = shape.head_dim;
  l.token_stride = layout == kv_layout::nhd ? d * shape.num_kv_heads : d;
  l.head_stride = layout == kv_layout::nhd ? d : d * shape.block_size;
  const std::int64_t block = l.block_elems();
  if (order == layer_order::layer_major) {
    l.block_stride = block;
    l.kv_stride = block * shape.num_blocks;
    l.layer_stride = 2 * l.kv_stride;
  } else {
    l.kv_stride = block;
    l.layer_stride = 2 * block;
    l.block_stride = 2 * block * shape.num_layers;
  }
  return l;
}

/// The most blocks a pool of this shape (num_blocks ignored) can have within budget_bytes.
/// Returns 0 when not even one block fits; never more than max_num_blocks.
inline std::int32_t blocks_for_budget(std::size_t budget_bytes, kv_cache_shape shape, dtype kv_dtype) {
  detail::check_shape(shape, false);
  const std::size_t per_block = std::size_t(2) * shape.num_layers * std::size_t(shape.block_size) *
                                shape.num_kv_heads * shape.head_dim * size_of(kv_dtype);
  const std::size_t blocks = budget_bytes / per_block;
  return blocks > std::size_t(max_num_blocks) ? max_num_blocks : std::int32_t(blocks);
}

/// CuTe-style "shape:stride" over (layer, kv, block, token, head, dim), e.g.
/// "(32,2,1000,16,8,128):(32768000,16384000,16384,1024,128,1)".
inline std::string to_string(const kv_cache_layout& l) {
  std::ostringstream out;
  out << '(' << l.shape.num_layers << ',' << 2 << ',' << l.shape.num_blocks << ',' << l.shape.block_size << ','
      << l.shape.num_kv_heads << ',' << l.shape.head_dim << "):(" << l.layer_stride << ',' << l.kv_stride << ','
      << l.block_stride << ',' << l.token_stride << ',' << l.head_stride << ",1)";
  return out.str();
}

}  // namespace pagedkv::kernels
