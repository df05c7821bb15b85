// Host reference of the cache operations. Same params as the CUDA versions, host pointers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <utility>

#include "../cache_ops_params.hpp"
#include "../kv_dtype.hpp"

namespace pagedkv::kernels::reference {

/// pool[slot of token t] = k_new[t], v_new[t] (divided by the scale into fp8 pools); slots of -1
/// are skipped. Throws errc::invalid_argument on bad params, errc::invalid_block on a slot
/// outside the pool.
inline void write_kv(const write_kv_params& p) {
  check(p);
  const auto& l = p.layout;
  const std::int64_t capacity = std::int64_t(l.shape.num_blocks) * l.shape.block_size;
  for (std::int32_t t = 0; t < p.num_tokens; ++t)
    if (p.slot_mapping[t] < -1 || p.slot_mapping[t] >= capacity)
      pagedkv::detail::fail(errc::invalid_block, "slot ", p.slot_mapping[t], " of token ", t, " outside [0, ", capacity, ")");
  host::visit_dtype(p.src_dtype, [&]<class TS>() {
    host::visit_dtype(l.kv_dtype, [&]<class TC>() {
      if constexpr (std::is_same_v<TS, TC> || std::is_same_v<TC, host::fp8_e4m3>) {
        auto* pool = static_cast<TC*>(p.pool);
        for (std::int32_t t = 0; t < p.num_tokens; ++t) {
          const slot_id slot = p.slot_mapping[t];
          if (slot < 0) continue;
          for (std::int32_t kv = 0; kv < 2; ++kv) {
            const auto* src = static_cast<const TS*>(kv == 0 ? p.k_new : p.v_new) + t * p.token_pitch();
            const float inv_scale = 1.0f / (kv == 0 ? p.k_scale : p.v_scale);
            for (std::int32_t h = 0; h < l.shape.num_kv_heads; ++h) {
              TC* dst = pool + l.slot_offset(p.layer, kv, slot, h);
              for (std::int32_t i = 0; i < l.shape.head_dim; ++i) {
                const TS x = src[std::int64_t(h) * l.shape.head_dim + i];
                if constexpr (std::is_same_v<TS, TC>) dst[i] = x;
                else dst[i] = host::to_fp8_e4m3(host::to_float(x) * inv_scale);
              }
            }
          }
        }
      }
    });
  });
}

/// Copies block pairs[i][0] to block pairs[i][1], every layer, K and V, in pair order.
/// Throws errc::invalid_block on a block outside the pool.
inline void copy_blocks(const copy_blocks_params& p) {
  const auto& l = p.layout;
  const std::size_t es = size_of(l.kv_dtype);
  auto* pool = static_cast<unsigned char*>(p.pool);
  for (std::int32_t i = 0; i < p.num_pairs; ++i)
    for (std::int32_t side = 0; side < 2; ++side)
      if (p.pairs[2 * i + side] < 0 || p.pairs[2 * i + side] >= l.shape.num_blocks)
        pagedkv::detail::fail(errc::invalid_block, "copy_blocks pair ", i, " names block ", p.pairs[2 * i + side],
                              " outside [0, ", l.shape.num_blocks, ")");
  for (std::int32_t i = 0; i < p.num_pairs; ++i)
    for (std::int32_t layer = 0; layer < l.shape.num_layers; ++layer)
      for (std::int32_t kv = 0; kv < 2; ++kv)
        std::memmove(pool + std::size_t(l.offset(layer, kv, p.pairs[2 * i + 1], 0, 0)) * es,
                     pool + std::size_t(l.offset(layer, kv, p.pairs[2 * i], 0, 0)) * es,
                     std::size_t(l.block_elems()) * es);
}

/// Copies pool block blocks[i] into staging slot i, every layer, K and V, in block_major order.
/// Throws errc::invalid_argument / invalid_block as check(stage_blocks_params) does.
inline void pack_blocks(const stage_blocks_params& p) {
  check(p);
  const auto& l = p.layout;
  const std::size_t es = size_of(l.kv_dtype), block_bytes = std::size_t(l.block_elems()) * es;
  const auto* pool = static_cast<const unsigned char*>(p.pool);
  auto* staging = static_cast<unsigned char*>(p.staging);
  for (std::int32_t i = 0; i < p.num_blocks; ++i)
    for (std::int32_t piece = 0; piece < 2 * l.shape.num_layers; ++piece)
      std::memcpy(staging + (std::size_t(i) * 2 * std::size_t(l.shape.num_layers) + std::size_t(piece)) * block_bytes,
                  pool + std::size_t(l.offset(piece / 2, piece % 2, p.blocks[i], 0, 0)) * es, block_bytes);
}

/// Copies staging slot i into pool block blocks[i]: pack_blocks reversed.
inline void unpack_blocks(const stage_blocks_params& p) {
  check(p);
  const auto& l = p.layout;
  const std::size_t es = size_of(l.kv_dtype), block_bytes = std::size_t(l.block_elems()) * es;
  auto* pool = static_cast<unsigned char*>(p.pool);
  const auto* staging = static_cast<const unsigned char*>(p.staging);
  for (std::int32_t i = 0; i < p.num_blocks; ++i)
    for (std::int32_t piece = 0; piece < 2 * l.shape.num_layers; ++piece)
      std::memcpy(pool + std::size_t(l.offset(piece / 2, piece % 2, p.blocks[i], 0, 0)) * es,
                  staging + (std::size_t(i) * 2 * std::size_t(l.shape.num_layers) + std::size_t(piece)) * block_bytes,
                  block_bytes);
}

/// Moves blocks between two host pools (the CUDA version moves between device and pinned host
/// memory with the same plan; between layer orders too, a copy per (block, layer, kv)).
inline void swap_blocks(const kv_cache_layout& src_layout, const void* src, const kv_cache_layout& dst_layout,
                        void* dst, std::span<const std::pair<block_id, block_id>> pairs) {
  for (const copy_range& r : plan_swap(src_layout, dst_layout, pairs))
    std::memcpy(static_cast<unsigned char*>(dst) + r.dst_offset_bytes,
                static_cast<const unsigned char*>(src) + r.src_offset_bytes, r.bytes);
}

}  // namespace pagedkv::kernels::reference
