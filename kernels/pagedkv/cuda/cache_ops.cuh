// Cache operations on the GPU: write_kv (scatter by slot mapping), copy_blocks (copy-on-write,
// one launch, pairs read on the device), swap_blocks (device <-> pinned host, one copy per
// contiguous run) and pack_blocks / unpack_blocks (whole blocks to and from a staging buffer, for
// staged_swap.cuh).
#pragma once

#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>

#include <pagedkv/error.hpp>

#include "../cache_ops_params.hpp"
#include "check.cuh"
#include "dependent_launch.cuh"
#include "vec.cuh"

namespace pagedkv::kernels::cuda {

namespace detail {

/// Stores the 16 source bytes `raw` (elements of TS) at dst as elements of TC: a copy, or each
/// element times inv_scale narrowed to TC and the narrow elements stored at once.
template <class TS, class TC>
__device__ __forceinline__ void store_chunk(TC* dst, const uint4& raw, float inv_scale) {
  constexpr int vec = vec16<TS>;
  if constexpr (std::is_same_v<TS, TC>) {
    *reinterpret_cast<uint4*>(dst) = raw;
  } else {
    static_assert(sizeof(TC) == 1 && (vec == 4 || vec == 8), "a narrowing store is to fp8, 4 or 8 bytes");
    const TS* x = reinterpret_cast<const TS*>(&raw);
    union {
      TC e[vec];
      std::conditional_t<vec == 8, uint2, std::uint32_t> word;
    } out;
#pragma unroll
    for (int j = 0; j < vec; ++j) out.e[j] = from_float<TC>(to_float(x[j]) * inv_scale);
    *reinterpret_cast<decltype(out.word)*>(dst) = out.word;
  }
}

/// 16-byte chunks a write_kv thread has in flight at once, of K and of V each.
inline constexpr int write_kv_chunks = 4;

/// A CTA per token: its K and V rows of every head, 16 bytes of the source a chunk, in rounds
/// of write_kv_chunks chunks of K and of V a thread. The first round's loads are issued before
/// the slot's, so that the rows and the slot (is it padding? where to?) come in one round trip,
/// not two: a padded token's row is still a row of the input, reading it is harmless.
template <class TS, class TC>
__global__ void __launch_bounds__(128) write_kv_kernel(const write_kv_params p) {
  constexpr int vec = vec16<TS>;
  wait_for_the_grid_before();
  let_dependents_launch();
  const auto& l = p.layout;
  const int d = l.shape.head_dim;
  const int row_elems = l.shape.num_kv_heads * d, step = int(blockDim.x) * vec;
  const TS* k_src = static_cast<const TS*>(p.k_new) + std::int64_t(blockIdx.x) * p.token_pitch();
  const TS* v_src = static_cast<const TS*>(p.v_new) + std::int64_t(blockIdx.x) * p.token_pitch();
  uint4 k[write_kv_chunks], v[write_kv_chunks];
  const auto load_round = [&](int e0) {
#pragma unroll
    for (int c = 0; c < write_kv_chunks; ++c) {
      if (e0 + c * step < row_elems) {
        k[c] = load16_here(k_src + e0 + c * step);
        v[c] = load16_here(v_src + e0 + c * step);
      }
    }
  };
  int e0 = int(threadIdx.x) * vec;
  if (e0 >= row_elems) return;  // a thread past a short row
  load_round(e0);
  const slot_id slot = load8_here(p.slot_mapping + blockIdx.x);
  if (slot < 0) return;
  TC* pool = static_cast<TC*>(p.pool);
  const float k_inv_scale = 1.0f / p.k_scale, v_inv_scale = 1.0f / p.v_scale;
  for (;;) {
#pragma unroll
    for (int c = 0; c < write_kv_chunks; ++c) {
      const int e = e0 + c * step;
      if (e >= row_elems) break;
      const int h = e / d, i = e % d;
      store_chunk<TS, TC>(pool + l.slot_offset(p.layer, 0, slot, h) + i, k[c], k_inv_scale);
      store_chunk<TS, TC>(pool + l.slot_offset(p.layer, 1, slot, h) + i, v[c], v_inv_scale);
    }
    e0 += write_kv_chunks * step;
    if (e0 >= row_elems) return;
    load_round(e0);
  }
}

/// Threads of a copy_blocks CTA and the 16-byte chunks each has in flight: a CTA copies 32 KiB.
inline constexpr int copy_blocks_threads = 256, copy_blocks_chunks = 8;
inline constexpr std::int64_t copy_blocks_cta_bytes = std::int64_t(16) * copy_blocks_threads * copy_blocks_chunks;

/// This CTA's 32 KiB slice (blockIdx.z) of a copy of n 16-byte chunks from `from` to `to`: every
/// thread loads its copy_blocks_chunks chunks, then stores them.
__device__ __forceinline__ void copy_cta_slice(const unsigned char* from_bytes, unsigned char* to_bytes, std::int64_t n) {
  const auto* from = reinterpret_cast<const uint4*>(from_bytes);
  auto* to = reinterpret_cast<uint4*>(to_bytes);
  const std::int64_t first = std::int64_t(blockIdx.z) * copy_blocks_threads * copy_blocks_chunks + threadIdx.x;
  uint4 chunk[copy_blocks_chunks];
#pragma unroll
  for (int c = 0; c < copy_blocks_chunks; ++c)
    if (first + c * copy_blocks_threads < n) chunk[c] = from[first + c * copy_blocks_threads];
#pragma unroll
  for (int c = 0; c < copy_blocks_chunks; ++c)
    if (first + c * copy_blocks_threads < n) to[first + c * copy_blocks_threads] = chunk[c];
}

/// A CTA per (pair, layer * 2 + kv, 32 KiB slice of the block): every thread loads its
/// copy_blocks_chunks chunks, then stores them. A load-then-store loop keeps one load in flight a
/// thread (the compiler must assume the store may alias the next load), which left copies of a
/// few pairs waiting on DRAM round trips. A template, as every kernel of the library is, so that
/// several translation units may include this header: a plain __global__ function defined here
/// would be defined once a unit, and their link would fail (two_units_link_check).
template <class = void>
__global__ void __launch_bounds__(copy_blocks_threads) copy_blocks_kernel(const copy_blocks_params p) {
  wait_for_the_grid_before();
  let_dependents_launch();
  const auto& l = p.layout;
  const block_id src = p.pairs[2 * blockIdx.x], dst = p.pairs[2 * blockIdx.x + 1];
  const int layer = int(blockIdx.y) / 2, kv = int(blockIdx.y) % 2;
  const std::size_t es = size_of(l.kv_dtype);
  auto* pool = static_cast<unsigned char*>(p.pool);
  copy_cta_slice(pool + std::size_t(l.offset(layer, kv, src, 0, 0)) * es,
                 pool + std::size_t(l.offset(layer, kv, dst, 0, 0)) * es, l.block_elems() * std::int64_t(es) / 16);
}

/// A CTA per (staging slot, layer * 2 + kv, 32 KiB slice of the block), as copy_blocks_kernel:
/// Pack copies the pool's piece into the slot, else the slot's piece into the pool.
template <bool Pack>
__global__ void __launch_bounds__(copy_blocks_threads) stage_blocks_kernel(const stage_blocks_params p) {
  wait_for_the_grid_before();
  let_dependents_launch();
  const auto& l = p.layout;
  const block_id block = p.blocks[blockIdx.x];
  const int piece = int(blockIdx.y), layer = piece / 2, kv = piece % 2;
  const std::size_t es = size_of(l.kv_dtype);
  const std::size_t block_bytes = std::size_t(l.block_elems()) * es;
  unsigned char* in_pool = static_cast<unsigned char*>(p.pool) + std::size_t(l.offset(layer, kv, block, 0, 0)) * es;
  unsigned char* in_staging = static_cast<unsigned char*>(p.staging) +
                              (std::size_t(blockIdx.x) * 2 * std::size_t(l.shape.num_layers) + std::size_t(piece)) * block_bytes;
  copy_cta_slice(Pack ? in_pool : in_staging, Pack ? in_staging : in_pool, std::int64_t(block_bytes / 16));
}

inline void check_16(const void* ptr, std::int64_t elems_pitch, std::size_t es, const char* what) {
  if (reinterpret_cast<std::uintptr_t>(ptr) % 16 || (std::size_t(elems_pitch) * es) % 16)
    pagedkv::detail::fail(errc::invalid_argument, what, " must be 16-byte aligned with a pitch of whole 16 bytes");
}

}  // namespace detail

/// The CUDA write_kv: same effect as reference::write_kv. Slots are read on the device and not
/// range-checked there (the host reference checks them). Throws errc::invalid_argument.
inline void write_kv(const write_kv_params& p, cudaStream_t stream = nullptr) {
  check(p);
  if (p.num_tokens == 0) return;
  const std::size_t es = size_of(p.src_dtype);
  if (reinterpret_cast<std::uintptr_t>(p.pool) % 16)
    pagedkv::detail::fail(errc::invalid_argument, "write_kv: the pool must be 16-byte aligned");
  detail::check_16(p.k_new, p.token_pitch(), es, "k_new");
  detail::check_16(p.v_new, p.token_pitch(), es, "v_new");
  if ((std::size_t(p.layout.shape.head_dim) * es) % 16 || (std::size_t(p.layout.shape.head_dim) * size_of(p.layout.kv_dtype)) % 4)
    pagedkv::detail::fail(errc::invalid_argument, "write_kv: head_dim ", p.layout.shape.head_dim,
                          " must be a multiple of 16 bytes of ", to_string(p.src_dtype));
  const auto launch = [&]<class TS, class TC>() {
    detail::launch_dependent(detail::write_kv_kernel<TS, TC>, dim3(unsigned(p.num_tokens)), 128, 0, stream, p);
  };
  const auto by_src = [&]<class TC>() {
    switch (p.src_dtype) {
      case dtype::f32: launch.template operator()<float, TC>(); break;
      case dtype::f16: launch.template operator()<__half, TC>(); break;
      default: launch.template operator()<__nv_bfloat16, TC>(); break;
    }
  };
  switch (p.layout.kv_dtype) {
    case dtype::fp8_e4m3: by_src.template operator()<__nv_fp8_e4m3>(); break;
    case dtype::f32: launch.template operator()<float, float>(); break;
    case dtype::f16: launch.template operator()<__half, __half>(); break;
    case dtype::bf16: launch.template operator()<__nv_bfloat16, __nv_bfloat16>(); break;
  }
}

/// The CUDA copy_blocks: one launch for every pair, layer and K/V; the pairs are read from
/// device memory, nothing synchronises. Destination blocks must not be any pair's source.
inline void copy_blocks(const copy_blocks_params& p, cudaStream_t stream = nullptr) {
  if (p.num_pairs == 0) return;
  if (p.num_pairs < 0) pagedkv::detail::fail(errc::invalid_argument, "num_pairs ", p.num_pairs, " must be >= 0");
  detail::check_16(p.pool, p.layout.block_elems(), size_of(p.layout.kv_dtype), "the pool");
  if (p.layout.shape.num_layers > 32767)  // grid.y is 2 * num_layers, at most 65535
    pagedkv::detail::fail(errc::invalid_argument, "copy_blocks: num_layers ", p.layout.shape.num_layers,
                          " over 32767");
  const std::int64_t block_bytes = p.layout.block_elems() * std::int64_t(size_of(p.layout.kv_dtype));
  const dim3 grid(unsigned(p.num_pairs), unsigned(2 * p.layout.shape.num_layers),
                  unsigned((block_bytes + detail::copy_blocks_cta_bytes - 1) / detail::copy_blocks_cta_bytes));
  detail::launch_dependent(detail::copy_blocks_kernel<>, grid, detail::copy_blocks_threads, 0, stream, p);
}

namespace detail {
template <bool Pack>
void stage_blocks(const stage_blocks_params& p, cudaStream_t stream) {
  using pagedkv::detail::fail;
  if (p.num_blocks < 0 || p.num_blocks > max_stage_blocks)
    fail(errc::invalid_argument, "stage_blocks num_blocks ", p.num_blocks, " outside [0, ", max_stage_blocks, "]");
  if (p.num_blocks == 0) return;
  const std::size_t es = size_of(p.layout.kv_dtype);
  check_16(p.pool, p.layout.block_elems(), es, "the pool");
  check_16(p.staging, p.layout.block_elems(), es, "the staging buffer");
  if (p.layout.shape.num_layers > 32767)  // grid.y is 2 * num_layers, at most 65535
    fail(errc::invalid_argument, "stage_blocks: num_layers ", p.layout.shape.num_layers, " over 32767");
  const std::int64_t block_bytes = p.layout.block_elems() * std::int64_t(es);
  const dim3 grid(unsigned(p.num_blocks), unsigned(2 * p.layout.shape.num_layers),
                  unsigned((block_bytes + copy_blocks_cta_bytes - 1) / copy_blocks_cta_bytes));
  launch_dependent(stage_blocks_kernel<Pack>, grid, copy_blocks_threads, 0, stream, p);
}
}  // namespace detail

/// The CUDA pack_blocks: same effect as reference::pack_blocks, one launch. Block ids are not
/// range-checked here (the plan that made them was). Throws errc::invalid_argument on a count
/// outside [0, max_stage_blocks] or a pool or staging buffer not 16-byte aligned.
inline void pack_blocks(const stage_blocks_params& p, cudaStream_t stream = nullptr) {
  detail::stage_blocks<true>(p, stream);
}

/// The CUDA unpack_blocks: same effect as reference::unpack_blocks (same errors as pack_blocks).
inline void unpack_blocks(const stage_blocks_params& p, cudaStream_t stream = nullptr) {
  detail::stage_blocks<false>(p, stream);
}

/// Moves blocks between a device pool and a pinned host pool (either direction: src and dst are
/// just pointers, cudaMemcpyDefault resolves them). Runs of consecutive blocks become one copy
/// (see plan_swap). Enqueued on stream; returns the number of copies issued.
inline std::size_t swap_blocks(const kv_cache_layout& src_layout, const void* src, const kv_cache_layout& dst_layout,
                               void* dst, std::span<const std::pair<block_id, block_id>> pairs,
                               cudaStream_t stream = nullptr) {
  const auto ranges = plan_swap(src_layout, dst_layout, pairs);
  for (const copy_range& r : ranges)
    PAGEDKV_CUDA_CHECK(cudaMemcpyAsync(static_cast<unsigned char*>(dst) + r.dst_offset_bytes,
                                       static_cast<const unsigned char*>(src) + r.src_offset_bytes, r.bytes,
                                       cudaMemcpyDefault, stream));
  return ranges.size();
}

}  // namespace pagedkv::kernels::cuda
