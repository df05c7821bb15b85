// Cache operations on the GPU: write_kv (scatter by slot mapping), copy_blocks (copy-on-write,
// one launch, pairs read on the device) and swap_blocks (device <-> pinned host, one copy per
// contiguous run).
#pragma once

#include <cstdint>
#include <span>
#include <utility>

#include <pagedkv/error.hpp>

#include "../cache_ops_params.hpp"
#include "check.cuh"
#include "dependent_launch.cuh"
#include "vec.cuh"

namespace pagedkv::kernels::cuda {

namespace detail {

/// A CTA per token: its K and V rows of every head, 16 bytes of the source at a time.
template <class TS, class TC>
__global__ void __launch_bounds__(128) write_kv_kernel(const write_kv_params p) {
  constexpr int vec = vec16<TS>;
  wait_for_the_grid_before();
  let_dependents_launch();
  const slot_id slot = p.slot_mapping[blockIdx.x];
  if (slot < 0) return;
  const auto& l = p.layout;
  const int d = l.shape.head_dim;
  const int row_elems = l.shape.num_kv_heads * d;
  for (int kv = 0; kv < 2; ++kv) {
    const TS* src = static_cast<const TS*>(kv == 0 ? p.k_new : p.v_new) + std::int64_t(blockIdx.x) * p.token_pitch();
    TC* pool = static_cast<TC*>(p.pool);
    const float inv_scale = 1.0f / (kv == 0 ? p.k_scale : p.v_scale);
    for (int e = threadIdx.x * vec; e < row_elems; e += blockDim.x * vec) {
      const int h = e / d, i = e % d;
      TC* dst = pool + l.slot_offset(p.layer, kv, slot, h) + i;
      const uint4 raw = *reinterpret_cast<const uint4*>(src + e);
      if constexpr (std::is_same_v<TS, TC>) {
        *reinterpret_cast<uint4*>(dst) = raw;
      } else {
        const TS* x = reinterpret_cast<const TS*>(&raw);
#pragma unroll
        for (int j = 0; j < vec; ++j) dst[j] = from_float<TC>(to_float(x[j]) * inv_scale);
      }
    }
  }
}

/// A CTA per (pair, layer * 2 + kv): one block region, 16 bytes at a time.
__global__ void __launch_bounds__(256) copy_blocks_kernel(const copy_blocks_params p) {
  wait_for_the_grid_before();
  let_dependents_launch();
  const auto& l = p.layout;
  const block_id src = p.pairs[2 * blockIdx.x], dst = p.pairs[2 * blockIdx.x + 1];
  const int layer = blockIdx.y / 2, kv = blockIdx.y % 2;
  const std::size_t es = size_of(l.kv_dtype);
  auto* pool = static_cast<unsigned char*>(p.pool);
  const auto* from = reinterpret_cast<const uint4*>(pool + std::size_t(l.offset(layer, kv, src, 0, 0)) * es);
  auto* to = reinterpret_cast<uint4*>(pool + std::size_t(l.offset(layer, kv, dst, 0, 0)) * es);
  const std::int64_t n = l.block_elems() * std::int64_t(es) / 16;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) to[i] = from[i];
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
  const dim3 grid(unsigned(p.num_pairs), unsigned(2 * p.layout.shape.num_layers));
  detail::launch_dependent(detail::copy_blocks_kernel, grid, 256, 0, stream, p);
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
