// Tuning of the decode kernel: one small constexpr policy per (KV type, head_dim).
#pragma once

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
  /// Eight warps: with 4, MHA 32/32 (batch 64, context 2k, bf16) reached 84.5% of the read
  /// ceiling; with 8, 93.1% (H100, 2026-11-21; 2 CTAs an SM either way).
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

/// The tensor-core body's tiles need no QK alignment rule, so they stay at 64 tokens or fewer:
/// head_dim 64 and 80 at 128-token tiles held one CTA an SM and reached 46-49% of the read
/// ceiling (GQA 32/8, batch 64, context 2k; H100, 2026-11-21), against 87% at head_dim 128.
template <class T, int HeadDim>
struct decode_mma_policy {
  static constexpr int threads = 256;
  static constexpr int stage_bytes = 32 * 1024;
  static constexpr int stages = 3;
  static constexpr int tile_tokens = [] {
    const int t = detail::floor_pow2(stage_bytes / (2 * HeadDim * int(sizeof(T))));
    return t < 16 ? 16 : t > 64 ? 64 : t;
  }();
  static constexpr int min_chunk_tokens = 4 * tile_tokens < 256 ? 256 : 4 * tile_tokens;
};

}  // namespace pagedkv::kernels::cuda
