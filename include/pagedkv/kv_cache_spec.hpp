// kv_cache_spec: what KV a group of layers keeps, for the hybrid_kv_cache_manager. A model whose
// layers do not all attend alike (Mistral, Gemma 2/3 and GPT-OSS interleave sliding-window layers
// with full-attention ones; Llama 4 has chunked local attention) declares one spec per group of
// layers that attend alike. The manager gives each group its own block table per sequence and,
// from the spec alone, knows which of a sequence's blocks the group's next query can still read.
#pragma once

#include <pagedkv/error.hpp>
#include <pagedkv/types.hpp>

#include <cstdint>
#include <ostream>

namespace pagedkv {

enum class attention_kind {
  full,            ///< a query reads every earlier token
  sliding_window,  ///< a query at position p reads [p - window + 1, p]
  chunked_local,   ///< a query at position p reads [p - p % chunk, p] (Llama 4's local layers)
};

/// The attention of one group of layers. Build one with full_attention(), sliding_window(W) or
/// chunked_local(C).
///
/// Extension point: a fixed-size per-sequence state (a Mamba-style SSM layer) is a fourth kind
/// whose next step reads only the state after the last computed token: first_needed_position(p)
/// = p, and a "block" of it is one state rather than block_size tokens. The manager's rules below
/// already hold for it (a group releases what its next query cannot read; a prefix hit needs the
/// group's blocks from first_needed_position on), except that a state is cached per block
/// boundary, not per token, which needs a state-sized pool of its own: not built yet.
struct kv_cache_spec {
  attention_kind kind = attention_kind::full;
  std::int32_t window_tokens = 0;  ///< sliding_window: W; chunked_local: C; full: 0

  [[nodiscard]] static constexpr kv_cache_spec full_attention() noexcept { return {}; }
  [[nodiscard]] static constexpr kv_cache_spec sliding_window(std::int32_t window_tokens) noexcept {
    return {attention_kind::sliding_window, window_tokens};
  }
  [[nodiscard]] static constexpr kv_cache_spec chunked_local(std::int32_t chunk_tokens) noexcept {
    return {attention_kind::chunked_local, chunk_tokens};
  }

  /// The first position that a query at `position` reads: 0 for full attention. Every later query
  /// reads from there or later too, so the blocks wholly before it can go.
  [[nodiscard]] constexpr std::int32_t first_needed_position(std::int32_t position) const noexcept {
    switch (kind) {
      case attention_kind::sliding_window: return position >= window_tokens ? position - window_tokens + 1 : 0;
      case attention_kind::chunked_local: return position - position % window_tokens;
      case attention_kind::full: break;
    }
    return 0;
  }

  /// The kernels' window_left for a sliding window (attention_params: attend to positions >= pos -
  /// window_left), -1 for full attention. Chunked local attention has no kernel mask yet.
  [[nodiscard]] constexpr std::int32_t kernel_window_left() const noexcept {
    return kind == attention_kind::sliding_window ? window_tokens - 1 : -1;
  }

  /// Errors: invalid_argument for a window or chunk below 1 (or a full spec with one).
  void check() const {
    const bool windowed = kind != attention_kind::full;
    if (windowed ? window_tokens < 1 : window_tokens != 0) {
      detail::fail(errc::invalid_argument, "kv_cache_spec ", *this, ": a window or chunk must be >= 1, full attention 0");
    }
  }

  friend bool operator==(const kv_cache_spec&, const kv_cache_spec&) = default;
  friend std::ostream& operator<<(std::ostream& os, const kv_cache_spec& s) {
    switch (s.kind) {
      case attention_kind::full: return os << "full";
      case attention_kind::sliding_window: return os << "sliding_window(" << s.window_tokens << ")";
      case attention_kind::chunked_local: return os << "chunked_local(" << s.window_tokens << ")";
    }
    return os << "kind " << static_cast<int>(s.kind);
  }
};

}  // namespace pagedkv
