// Tuning of the decode kernels: one small constexpr policy per (KV type, head_dim), the CTA shapes
// of the tensor-core body, and the limits of the GPU they were tuned on. Plain C++, so that the
// host planner (decode_plan.hpp) and its tests need no CUDA compiler.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pagedkv::kernels::cuda {

namespace detail {
constexpr int floor_pow2(int x) {
  int p = 1;
  while (p * 2 <= x) p *= 2;
  return p;
}
}  // namespace detail

template <class TKV, int HeadDim>
struct decode_policy {
  /// Eight warps: twice the loads in flight of four, on the large MHA shapes of the decode table
  /// (decode-kernel.md, "CUDA-core body").
  static constexpr int threads = 256;
  /// K+V bytes of one pipeline stage. 32 KiB a stage, 3 stages: ~100 KiB a CTA, 2 CTAs an SM,
  /// so up to 128 KiB of loads in flight per SM, about 4x what Little's law asks for at
  /// 3 TB/s / 132 SMs and ~1.5 us loaded latency.
  static constexpr int stage_bytes = 32 * 1024;
  static constexpr int stages = 3;
  /// Tokens a tile: about stage_bytes, a power of two, and large enough that each QK thread
  /// (threads / tile of them a token) reads whole 16-byte chunks.
  static constexpr int tile_tokens = [] {
    constexpr int vec = int(16 / sizeof(TKV));
    int t = detail::floor_pow2(stage_bytes / (2 * HeadDim * int(sizeof(TKV))));
    t = t < 16 ? 16 : t > 128 ? 128 : t;
    while (t < threads && (HeadDim / (threads / t)) % vec != 0) t *= 2;
    return t;
  }();
  /// Smallest split of a sequence worth its own CTA (pipeline ramp-up costs about two tiles).
  static constexpr int min_chunk_tokens = 4 * tile_tokens < 256 ? 256 : 4 * tile_tokens;
};

/// The tensor-core body's CTA shapes; plan_decode_mma picks one for each launch.
enum class decode_cta : std::uint8_t {
  narrow,   ///< 4-8 warps, 3 stages of 32 KiB, two CTAs an SM
  wide,     ///< 8 warps, 3 stages, one CTA an SM: launches of no more CTAs than SMs
  shallow,  ///< narrow's warps, 2 stages, three CTAs an SM: launches of many waves
  paired,   ///< narrow's warps and stages over two adjacent KV heads, half the warps each
};

/// The tensor-core body: each warp owns 16 tokens of every tile (the mma's M), so a tile is 16
/// tokens a warp. Narrow CTAs fill a 32 KiB stage (K+V) with 4 to 8 warps: bf16 head_dim 128 gets 4
/// warps and 64-token tiles, 3 stages, ~104 KiB, 2 CTAs an SM, 128 KiB of loads in flight per SM as
/// in decode_policy. head_dim 256 keeps 4 warps at 64 KiB a stage (one CTA an SM). Wide CTAs have 8
/// warps, for narrow ones of fewer, and run one an SM. Not more than 8: at 16 warps a thread gets
/// 128 registers, and the two-n-tile fp8 body spills. Shallow CTAs have narrow's warps and 2
/// stages, ~70 KiB, and run three an SM. Paired CTAs have narrow's warps and stage bytes over two
/// adjacent KV heads of an NHD pool, half the warps a head, so that each copied row is both heads'
/// 2 x 128 bytes: 128-byte rows alone streamed slower than 256-byte ones (benchmarks.md, "HND vs
/// NHD layout"; decode-kernel.md, "Paired CTAs"). Every shape splits alike: min_chunk_tokens is the
/// narrow one.
template <class TKV, int HeadDim, decode_cta Shape = decode_cta::narrow>
struct decode_mma_policy {
  static constexpr int warp_tokens = 16;
  static constexpr int narrow_warps = [] {
    const int w = 32 * 1024 / (warp_tokens * 2 * HeadDim * int(sizeof(TKV)));
    return w < 4 ? 4 : w > 8 ? 8 : w;
  }();
  static constexpr int warps = Shape == decode_cta::wide ? 8 : narrow_warps;
  static constexpr int threads = 32 * warps;
  static constexpr int stages = Shape == decode_cta::shallow ? 2 : 3;
  static constexpr int kv_heads = Shape == decode_cta::paired ? 2 : 1;
  static constexpr int tile_tokens = warp_tokens * warps / kv_heads;
  static constexpr int min_chunk_tokens = 4 * warp_tokens * narrow_warps < 256 ? 256 : 4 * warp_tokens * narrow_warps;
};

/// Hopper's shared memory (the H100 and H200): 228 KiB an SM, at most 227 KiB a CTA, and 1 KiB of
/// each CTA's reserved by the system.
struct hopper_smem {
  static constexpr std::size_t per_sm = 228 * 1024, per_cta = 227 * 1024, reserved = 1024;
};

}  // namespace pagedkv::kernels::cuda
