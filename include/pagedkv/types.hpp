// The vocabulary types shared by every pagedkv header (see docs/concepts.md).
#pragma once

#include <cstdint>
#include <limits>

namespace pagedkv {

/// Index of a physical KV block in a pool, 0 <= id < capacity. int32 because kernels take int32
/// block tables.
using block_id = std::int32_t;

/// Marks "no block", e.g. the padding of a dense block table.
inline constexpr block_id null_block = -1;

/// A token slot in a pool: block * block_size + offset. 64-bit so that pools of more than 2^31
/// token slots can be addressed; a slot of -1 is padding that kernels skip.
using slot_id = std::int64_t;

/// A token id from the model's vocabulary. Prefix hashes are computed over these raw values.
using token_id = std::int32_t;

/// Identifies a sequence in a kv_cache_manager; chosen by the engine.
using seq_id = std::uint64_t;

/// The chained hash of a full block's tokens (see prefix_cache).
using block_hash = std::uint64_t;

/// Upper bound on a pool's capacity and on a block's size in tokens, so that slot arithmetic and
/// int32 block tables never overflow. Larger values are rejected as absurd.
inline constexpr std::int32_t max_num_blocks = (1 << 30);
inline constexpr std::int32_t max_block_size = 4096;

/// A priority that keeps a block cached until it is unpinned (priority_eviction, tinylfu_eviction,
/// pin_budget_eviction).
inline constexpr std::int32_t pinned_priority = std::numeric_limits<std::int32_t>::max();

}  // namespace pagedkv
