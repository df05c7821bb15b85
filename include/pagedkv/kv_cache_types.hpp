// The vocabulary of the KV cache managers (kv_cache_manager, hybrid_kv_cache_manager) and what
// drives them: where a sequence's blocks are, a block copy to run, a manager's occupancy.
#pragma once

#include <pagedkv/types.hpp>

#include <cstdint>

namespace pagedkv {

/// Where a sequence's blocks are: a manager swaps sequences between its device and host pools.
enum class location { device, host };

/// A block to copy: copy-on-write (device -> device) or a swap (device <-> host).
struct block_copy {
  block_id src = null_block;
  block_id dst = null_block;
  friend bool operator==(const block_copy&, const block_copy&) = default;
};

/// A manager's occupancy (kv_cache_manager::usage, hybrid_kv_cache_manager::usage).
struct kv_cache_usage {
  std::int32_t num_blocks = 0;            ///< device capacity
  std::int32_t num_free_blocks = 0;       ///< free or idle-cached: what allocations may take
  std::int32_t num_used_blocks = 0;       ///< referenced by at least one live device sequence
  std::int32_t num_cached_blocks = 0;     ///< in the prefix cache, idle or not
  std::int32_t num_evictable_blocks = 0;  ///< idle cached blocks eviction may take
  std::int32_t num_host_used_blocks = 0;
  std::int64_t num_live_tokens = 0;       ///< filled slots of the used blocks (shared slots once)
  double utilization = 0.0;               ///< num_live_tokens / (num_used_blocks * block_size)
  double prefix_hit_rate = 0.0;           ///< prompt tokens served by whole cached blocks / prompt tokens
  double partial_hit_rate = 0.0;          ///< ... served by partial hits (copied blocks) / prompt tokens
  double shared_hit_rate = 0.0;           ///< ... shared with blocks in flight (allocate_shared) / prompt tokens
};

}  // namespace pagedkv
