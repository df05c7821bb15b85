// prefix_lookup: what a prompt found in the prefix cache, and the reason each other token missed
// (kv_cache_manager and hybrid_kv_cache_manager: lookup(), the allocation's lookup, miss_totals();
// scheduler: request_output::cache_lookup, miss_totals()).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace pagedkv {

/// Why prompt tokens were not served from the prefix cache. Each missed token has one reason: the
/// one at the block where the hit stopped, or where the anchor's chain stopped.
enum class miss_reason {
  caching_off,         ///< prefix caching is disabled
  never_stored,        ///< no block of this prefix is cached, and none was dropped lately
  evicted,             ///< the block was cached, then evicted by the eviction policy to make room
  evicted_on_request,  ///< the block was cached, then evicted by evict_cached_blocks
  cache_reset,         ///< the block was cached, then dropped by reset_prefix_cache
  other_key,           ///< the first block is cached under another adapter or cache salt
  hash_collision,      ///< a block under the prefix's hash verified false (other tokens, parent or group)
  group_missing,       ///< the anchor had the prefix; another group lacked a block its next query reads
  partial_block,       ///< below the hit granularity: the prompt's last partial block and its last
                       ///< token (whose logits the engine must compute), and the first tokens of a
                       ///< cached block that a partial hit would serve with partial reuse off
};
inline constexpr std::size_t num_miss_reasons = 9;

constexpr std::string_view to_string(miss_reason r) noexcept {
  switch (r) {
    case miss_reason::caching_off: return "caching_off";
    case miss_reason::never_stored: return "never_stored";
    case miss_reason::evicted: return "evicted";
    case miss_reason::evicted_on_request: return "evicted_on_request";
    case miss_reason::cache_reset: return "cache_reset";
    case miss_reason::other_key: return "other_key";
    case miss_reason::hash_collision: return "hash_collision";
    case miss_reason::group_missing: return "group_missing";
    case miss_reason::partial_block: return "partial_block";
  }
  return "unknown";
}

/// A prompt's lookup in the prefix cache: tokens served, and the others by reason. Also the sum
/// over every allocation (miss_totals()).
struct prefix_lookup {
  std::int64_t num_prompt_tokens = 0;
  std::int64_t num_hit_tokens = 0;          ///< served by whole cached blocks
  std::int64_t num_partial_hit_tokens = 0;  ///< served by a partial hit (a copied block's first tokens)
  std::int64_t num_shared_tokens = 0;       ///< shared with a request of the same burst still computing
                                            ///< them (kv_cache_manager::allocate_shared)
  std::array<std::int64_t, num_miss_reasons> missed_tokens{};  ///< indexed by miss_reason

  [[nodiscard]] std::int64_t missed(miss_reason r) const noexcept { return missed_tokens[static_cast<std::size_t>(r)]; }
  prefix_lookup& operator+=(const prefix_lookup& o) noexcept {
    num_prompt_tokens += o.num_prompt_tokens;
    num_hit_tokens += o.num_hit_tokens;
    num_partial_hit_tokens += o.num_partial_hit_tokens;
    num_shared_tokens += o.num_shared_tokens;
    for (std::size_t i = 0; i < num_miss_reasons; ++i) missed_tokens[i] += o.missed_tokens[i];
    return *this;
  }
};

}  // namespace pagedkv
