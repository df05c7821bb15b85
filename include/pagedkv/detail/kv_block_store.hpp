// detail::kv_block_store: the block bookkeeping that kv_cache_manager and hybrid_kv_cache_manager
// share: the device and host pools, the prefix cache, the record of why hashes left the cache (for
// miss reasons), and the operations over a manager's sequences that only need their block tables
// (swap, usage, fork's references). A manager's sequence type provides `where` (a location),
// `priority` and `tables()` (a span of its block tables, null_block entries holding nothing).
#pragma once

#include <pagedkv/block_pool.hpp>
#include <pagedkv/block_table.hpp>
#include <pagedkv/error.hpp>
#include <pagedkv/kv_cache_types.hpp>
#include <pagedkv/prefix_cache.hpp>
#include <pagedkv/prefix_lookup.hpp>
#include <pagedkv/types.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

namespace pagedkv::detail {

inline constexpr std::size_t max_sequence_tokens = std::size_t{1} << 30;

inline void check_prompt(std::span<const token_id> prompt, const char* operation) {
  if (prompt.empty() || prompt.size() > max_sequence_tokens) {
    fail(errc::invalid_argument, operation, " of a prompt of ", prompt.size(), " tokens: must be 1..", max_sequence_tokens);
  }
}

/// Errors: invalid_argument for a host capacity or watermark out of range (the device capacity
/// and block size are the pool's and the cache's to check).
inline void check_capacities(std::int32_t num_device_blocks, std::int32_t num_host_blocks, std::int32_t watermark_blocks) {
  if (num_host_blocks < 0 || num_host_blocks > max_num_blocks) {
    fail(errc::invalid_argument, "num_host_blocks ", num_host_blocks, " is not in [0, ", max_num_blocks, "]");
  }
  if (watermark_blocks < 0 || watermark_blocks > num_device_blocks) {
    fail(errc::invalid_argument, "watermark_blocks ", watermark_blocks, " is not in [0, num_device_blocks]");
  }
}

/// The sequence `seq` of a manager's map. Errors: unknown_sequence.
template <class Map>
auto& find_sequence(Map& sequences, seq_id seq, const char* operation) {
  const auto it = sequences.find(seq);
  if (it == sequences.end()) fail(errc::unknown_sequence, operation, " of unknown sequence ", seq);
  return it->second;
}

/// allocate_shared's checks: `num_shared_tokens` are whole blocks in [block_size, prompt size - 1],
/// within the source's `source_tokens`, the same tokens, under the same key (the source's
/// `source_key`). Errors: invalid_argument.
inline void check_shared(seq_id source, std::span<const token_id> source_tokens, const prefix_key& source_key,
                         std::int32_t num_shared_tokens, std::span<const token_id> prompt, const prefix_key& key,
                         std::int32_t block_size) {
  const auto shared = static_cast<std::size_t>(std::max(num_shared_tokens, 0));
  if (num_shared_tokens < block_size || num_shared_tokens % block_size != 0 || shared >= prompt.size() ||
      shared > source_tokens.size() || !std::equal(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(shared), source_tokens.begin()) ||
      source_key.adapter_id != key.adapter_id || source_key.cache_salt != key.cache_salt) {
    fail(errc::invalid_argument, "allocate_shared of ", num_shared_tokens, " tokens of sequence ", source,
         " to a prompt of ", prompt.size(), ": not whole blocks of the same prefix under the same key");
  }
}

/// Counts a prompt's tokens past a hit of `hit` whole blocks into `lookup`, by reason: the anchor's
/// (the one group's) chain verified `walked` >= hit blocks, the blocks between lacked another
/// group's (group_missing), then it stopped for `stop` short of `limit`, the blocks before the
/// prompt's last token, whose rest misses below the hit granularity. A cached block after the hit
/// matched the prompt's next `found` tokens, `served` of them in every group: they are a partial
/// hit if `taken`, else below the hit granularity, and the rest of `found` group_missing.
inline void count_misses(prefix_lookup& lookup, std::int32_t block_size, std::int32_t num_tokens, std::int32_t hit,
                         std::int32_t walked, std::int32_t limit, miss_reason stop, std::int32_t found,
                         std::int32_t served, bool taken) {
  const std::int32_t found_from = hit * block_size;
  const std::int32_t found_to = found_from + found;
  const auto missed = [&](miss_reason r, std::int32_t from, std::int32_t to) {
    const std::int32_t in_found = std::max(0, std::min(to, found_to) - std::max(from, found_from));
    lookup.missed_tokens[static_cast<std::size_t>(r)] += to - from - in_found;
  };
  missed(miss_reason::group_missing, hit * block_size, walked * block_size);
  missed(stop, walked * block_size, limit * block_size);
  missed(miss_reason::partial_block, limit * block_size, num_tokens);
  lookup.missed_tokens[static_cast<std::size_t>(miss_reason::group_missing)] += found - served;
  if (taken) {
    lookup.num_partial_hit_tokens = served;
  } else {
    lookup.missed_tokens[static_cast<std::size_t>(miss_reason::partial_block)] += served;
  }
}

/// The computed tokens of a freed sequence's last, partly filled block, which free() keeps cached
/// for partial hits (kv_block_store::cache_partial) after its chain's last link: none unless
/// `keep` (caching and partial reuse on), the sequence is on the device and every full block
/// before them is published.
template <class Sequence>
std::span<const token_id> freed_tail(const Sequence& s, std::int32_t block_size, bool keep) {
  const std::int32_t full_blocks = s.num_computed / block_size;
  const std::int32_t tail = s.num_computed - full_blocks * block_size;
  if (!keep || s.where != location::device || s.chain_broken || tail == 0 ||
      static_cast<std::int32_t>(s.chain.size()) != full_blocks) {
    return {};
  }
  return {s.tokens.data() + static_cast<std::ptrdiff_t>(full_blocks) * block_size, static_cast<std::size_t>(tail)};
}

/// Cuts a sequence's tokens, computed count, hashes and cache chain to its first `num_tokens` (its
/// tables are cut already): what truncate and fork at a position share, in both managers.
template <class Sequence>
void cut_history(Sequence& s, std::int32_t num_tokens, std::int32_t block_size) {
  s.tokens.resize(static_cast<std::size_t>(num_tokens));
  s.num_computed = std::min(s.num_computed, num_tokens);
  const auto full_blocks = static_cast<std::size_t>(num_tokens / block_size);
  if (s.hashes.size() > full_blocks) s.hashes.resize(full_blocks);
  if (s.chain.size() >= full_blocks) {
    s.chain.resize(full_blocks);
    s.chain_broken = false;
  }
}

template <free_list_policy FreeList, hash_policy Hash, eviction_policy Eviction>
class kv_block_store {
 public:
  using pool_type = block_pool<FreeList, no_lock>;
  using cache_type = prefix_cache<Hash, Eviction>;

  kv_block_store(pool_type device, std::int32_t num_host_blocks, std::int32_t block_size, block_hash seed)
      : device_(std::move(device)),
        host_(std::max(num_host_blocks, 1)),
        num_host_blocks_(num_host_blocks),
        cache_(device_.capacity(), block_size, seed),
        hash_of_(static_cast<std::size_t>(device_.capacity()), 0),
        partial_(static_cast<std::size_t>(device_.capacity()), false) {}

  [[nodiscard]] std::int32_t block_size() const noexcept { return cache_.block_size(); }
  [[nodiscard]] pool_type& device() noexcept { return device_; }
  [[nodiscard]] const pool_type& device() const noexcept { return device_; }
  [[nodiscard]] pool_type& host() noexcept { return host_; }
  [[nodiscard]] const pool_type& host() const noexcept { return host_; }
  [[nodiscard]] pool_type& pool(location where) noexcept { return where == location::device ? device_ : host_; }
  [[nodiscard]] const pool_type& pool(location where) const noexcept { return where == location::device ? device_ : host_; }
  [[nodiscard]] cache_type& cache() noexcept { return cache_; }
  [[nodiscard]] const cache_type& cache() const noexcept { return cache_; }

  /// Device blocks that allocations may take: free ones plus idle cached ones.
  [[nodiscard]] std::int32_t num_free_blocks() const { return device_.num_free_blocks() + cache_.num_evictable_blocks(); }
  [[nodiscard]] std::int32_t num_free_host_blocks() const { return num_host_blocks_ == 0 ? 0 : host_.num_free_blocks(); }

  /// Takes `count` device blocks, each near the one before it and the first near `hint` (a device
  /// block or null_block: block_pool::allocate_near), evicting idle cached blocks as the free list
  /// runs dry, and hands each to `take`. The caller has checked count <= num_free_blocks().
  template <class Take>
  void allocate_device(std::int32_t count, block_id hint, Take&& take) {
    for (std::int32_t i = 0; i < count; ++i) {
      std::optional<block_id> id = device_.try_allocate_near(hint);
      if (!id) {
        const std::optional<block_id> victim = cache_.evict();
        dropped(*victim, miss_reason::evicted);
        device_.release(*victim);  // the cache's hold was its last reference
        id = device_.allocate_near(hint);
      }
      take(*id);
      hint = *id;
    }
  }

  /// Takes a reference to cached device block `id` (a hit, a partial hit's source): it stops being
  /// evictable.
  void claim(block_id id) {
    device_.retain(id);
    cache_.make_active(id);
  }

  /// Drops one device reference; a cached block left with only the cache's hold becomes idle.
  void release_device(block_id id, std::int32_t priority) {
    device_.release(id);
    if (device_.ref_count(id) == 1 && cache_.contains(id)) cache_.make_idle(id, priority);
  }
  void release(location where, block_id id, std::int32_t priority) {
    if (where == location::device) {
      release_device(id, priority);
    } else {
      host_.release(id);
    }
  }

  /// Whether the next append must copy the table's last block first: partly filled and shared (in
  /// the pool at `where`: sharing survives a swap).
  [[nodiscard]] bool needs_copy_on_write(const block_table& table, location where) const {
    const std::int32_t fill = table.last_block_len();
    return fill > 0 && fill < block_size() && pool(where).ref_count(table.block(table.num_blocks() - 1)) > 1;
  }

  /// Records that device block `id` was newly cached under `hash` (the cache holds a reference).
  void cached(block_id id, block_hash hash) {
    device_.retain(id);
    hash_of_[static_cast<std::size_t>(id)] = hash;
    partial_[static_cast<std::size_t>(id)] = false;
    dropped_.erase(hash);
  }
  /// Keeps device block `id`, the last, partly filled block of a freed sequence whose KV holds
  /// `tokens` after `parent`, cached for partial hits (prefix_cache::insert_partial, under `tag`).
  /// Returns its link; nothing if it is cached already or the cache keeps an equal one.
  std::optional<chain_link> cache_partial(block_id id, chain_link parent, std::span<const token_id> tokens,
                                          const prefix_key& key, std::int32_t tag = 0) {
    if (cache_.contains(id)) return std::nullopt;
    const std::optional<chain_link> link = cache_.insert_partial(id, parent, tokens, key, tag);
    if (link) {
      device_.retain(id);
      partial_[static_cast<std::size_t>(id)] = true;  // under no hash: its drop explains no miss
    }
    return link;
  }

  /// allocate_shared's lookup of `prompt`, whose first `shared` tokens (whole blocks) are shared
  /// with a sequence still computing them: the rest missed as an allocation past them would, for
  /// the reason of its first block (why_missing, with `serves`), then its last partial block.
  template <class Serves>
  [[nodiscard]] prefix_lookup shared_lookup(std::span<const token_id> prompt, const prefix_key& key, std::int32_t shared,
                                            bool caching, Serves&& serves) const {
    prefix_lookup lookup;
    const auto num_tokens = static_cast<std::int32_t>(prompt.size());
    lookup.num_prompt_tokens = num_tokens;
    lookup.num_shared_tokens = shared;
    const auto missed = [&](miss_reason r, std::int32_t tokens) {
      lookup.missed_tokens[static_cast<std::size_t>(r)] += tokens;
    };
    if (!caching) {
      missed(miss_reason::caching_off, num_tokens - shared);
      return lookup;
    }
    const std::int32_t limit = (num_tokens - 1) / block_size();
    const std::int32_t first = shared / block_size();  // <= limit: shared < num_tokens, whole blocks
    if (first < limit) {
      std::vector<block_hash> hashes;
      cache_.extend_hashes(prompt.first(static_cast<std::size_t>((first + 1) * block_size())), key, hashes);
      missed(why_missing(prompt, key, hashes[static_cast<std::size_t>(first)], first, serves), (limit - first) * block_size());
    }
    missed(miss_reason::partial_block, num_tokens - limit * block_size());
    return lookup;
  }

  /// Why block j of `prompt` (of chained hash `hash` under `key`) did not verify as cached:
  /// another block holds the hash (a collision), it was dropped lately (and how), or, for a first
  /// block, it is cached under the default key instead (`serves(link)` says whether that cached
  /// block would have served). Else never stored.
  template <class Serves>
  [[nodiscard]] miss_reason why_missing(std::span<const token_id> prompt, const prefix_key& key, block_hash hash,
                                        std::int32_t j, Serves&& serves) const {
    if (cache_.block_of(hash)) return miss_reason::hash_collision;
    if (const auto it = dropped_.find(hash); it != dropped_.end()) return it->second;
    if (j == 0 && (key.adapter_id != 0 || !key.cache_salt.empty())) {
      std::vector<block_hash> plain;
      const std::span<const token_id> first = prompt.first(static_cast<std::size_t>(block_size()));
      cache_.extend_hashes(first, prefix_key{}, plain);
      const std::optional<chain_link> link = cache_.find(plain[0], chain_link{}, first, prefix_key{});
      if (link && serves(*link)) return miss_reason::other_key;
    }
    return miss_reason::never_stored;
  }

  /// Evicts up to `max_blocks` idle cached blocks now; returns how many.
  std::int32_t evict(std::int32_t max_blocks) {
    std::int32_t evicted = 0;
    for (; evicted < max_blocks; ++evicted) {
      const std::optional<block_id> victim = cache_.evict();
      if (!victim) break;
      dropped(*victim, miss_reason::evicted_on_request);
      device_.release(*victim);
    }
    return evicted;
  }
  /// Empties the prefix cache. Running sequences keep their KV.
  void reset() {
    for (block_id id : cache_.clear()) {
      dropped(id, miss_reason::cache_reset);
      device_.release(id);
    }
  }

  /// Adds a reference to every block of `s` (fork).
  template <class Sequence>
  void retain_all(const Sequence& s) {
    for (const block_table& table : s.tables()) {
      for (block_id id : table.blocks()) {
        if (id != null_block) pool(s.where).retain(id);
      }
    }
  }

  /// The distinct blocks of a group of sequences that must all be at `from`, in order of first
  /// appearance (table by table, in table order).
  template <class Map>
  [[nodiscard]] std::vector<block_id> distinct_blocks(const Map& sequences, std::span<const seq_id> group, location from,
                                                      const char* operation) const {
    std::vector<block_id> blocks;
    std::vector<bool> seen(static_cast<std::size_t>(pool(from).capacity()), false);
    for (std::size_t i = 0; i < group.size(); ++i) {
      const auto& s = find_sequence(sequences, group[i], operation);
      if (s.where != from) {
        fail(errc::wrong_location, operation, " of sequence ", group[i], " which is ",
             s.where == location::device ? "on the device" : "swapped out");
      }
      if (std::find(group.begin(), group.begin() + static_cast<std::ptrdiff_t>(i), group[i]) !=
          group.begin() + static_cast<std::ptrdiff_t>(i)) {
        fail(errc::invalid_argument, operation, ": sequence ", group[i], " is listed twice");
      }
      for (const block_table& table : s.tables()) {
        for (block_id id : table.blocks()) {
          if (id != null_block && !seen[static_cast<std::size_t>(id)]) {
            seen[static_cast<std::size_t>(id)] = true;
            blocks.push_back(id);
          }
        }
      }
    }
    return blocks;
  }

  /// swap_out (to host) or swap_in (to device) of a group: checks, then copies each distinct block
  /// once to a new block at `to`, repoints every table of the group and moves every reference.
  /// Returns the (src, dst) pairs. Errors: as distinct_blocks; out_of_blocks when `to` is short.
  template <class Map>
  std::vector<block_copy> swap(Map& sequences, std::span<const seq_id> group, location to, const char* operation) {
    const location from = to == location::device ? location::host : location::device;
    const std::vector<block_id> blocks = distinct_blocks(sequences, group, from, operation);
    const std::int32_t available = to == location::device ? num_free_blocks() : num_free_host_blocks();
    if (blocks.size() > static_cast<std::size_t>(available)) {
      fail(errc::out_of_blocks, operation, " needs ", blocks.size(), to == location::device ? " device" : " host",
           " blocks, ", available, " free");
    }
    std::unordered_map<block_id, block_id> moved;
    std::vector<block_copy> copies;
    copies.reserve(blocks.size());
    block_id near = null_block;  // the blocks come in table order: each swapped in near the one before
    for (block_id src : blocks) {
      block_id dst = null_block;
      if (to == location::host) {
        dst = host_.allocate();
      } else {
        allocate_device(1, near, [&](block_id id) { dst = id; });
        near = dst;
      }
      moved.emplace(src, dst);
      copies.push_back({src, dst});
    }
    std::vector<bool> referenced(static_cast<std::size_t>(pool(to).capacity()), false);
    for (seq_id seq : group) {
      auto& s = find_sequence(sequences, seq, operation);
      for (block_table& table : s.tables()) {
        for (std::int32_t j = 0; j < table.num_blocks(); ++j) {
          const block_id src = table.block(j);
          if (src == null_block) continue;
          const block_id dst = moved.at(src);
          if (referenced[static_cast<std::size_t>(dst)]) pool(to).retain(dst);  // allocate gave the first
          referenced[static_cast<std::size_t>(dst)] = true;
          release(s.where, src, s.priority);
          table.replace_block(j, dst);
        }
      }
      s.where = to;
    }
    return copies;
  }

  /// kv_cache_manager::usage() over every table of every device sequence.
  template <class Map>
  [[nodiscard]] kv_cache_usage usage(const Map& sequences) const {
    std::vector<std::int32_t> fill(static_cast<std::size_t>(device_.capacity()), 0);
    for (const auto& [id, s] : sequences) {
      if (s.where != location::device) continue;
      for (const block_table& table : s.tables()) {
        const std::span<const block_id> blocks = table.blocks();
        for (std::size_t i = 0; i < blocks.size(); ++i) {
          if (blocks[i] == null_block) continue;
          const std::int32_t filled = i + 1 == blocks.size() ? table.last_block_len() : block_size();
          std::int32_t& f = fill[static_cast<std::size_t>(blocks[i])];
          f = std::max(f, filled);
        }
      }
    }
    kv_cache_usage u;
    u.num_blocks = device_.capacity();
    u.num_free_blocks = num_free_blocks();
    for (std::int32_t f : fill) {
      u.num_used_blocks += f > 0 ? 1 : 0;
      u.num_live_tokens += f;
    }
    u.num_cached_blocks = cache_.num_cached_blocks();
    u.num_evictable_blocks = cache_.num_evictable_blocks();
    u.num_host_used_blocks = num_host_blocks_ == 0 ? 0 : host_.num_used_blocks();
    u.utilization = u.num_used_blocks == 0
                        ? 0.0
                        : static_cast<double>(u.num_live_tokens) / (static_cast<double>(u.num_used_blocks) * block_size());
    u.prefix_hit_rate = cache_.hit_rate();
    u.partial_hit_rate = cache_.partial_hit_rate();
    u.shared_hit_rate = cache_.shared_hit_rate();
    return u;
  }

 private:
  /// Remembers why a cached block's hash left the cache, for miss reasons. Bounded: past four
  /// times the pool's capacity the record starts over, and older drops read as never_stored.
  void dropped(block_id id, miss_reason why) {
    if (partial_[static_cast<std::size_t>(id)]) return;
    if (dropped_.size() >= 4 * static_cast<std::size_t>(device_.capacity())) dropped_.clear();
    dropped_[hash_of_[static_cast<std::size_t>(id)]] = why;
  }

  pool_type device_;
  pool_type host_;  // capacity >= 1 even without swapping; num_free_host_blocks() reports 0 then
  std::int32_t num_host_blocks_;
  cache_type cache_;
  std::vector<block_hash> hash_of_;  // per block id: the hash it was cached under (valid while cached)
  std::vector<bool> partial_;        // per block id: cached as a partial block (insert_partial)
  std::unordered_map<block_hash, miss_reason> dropped_;  // hashes that left the cache, and how
};

}  // namespace pagedkv::detail
