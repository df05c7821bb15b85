// kv_cache_manager: the sequence-level KV cache an engine drives. It composes a device block_pool,
// an optional host block_pool (for swapping), one block_table per sequence and a prefix_cache.
//
// Reference counting: a block's refcount is the number of tables that reference it plus one if the
// prefix cache holds it. A cached block that only the cache references is idle: it still counts as
// available (num_free_blocks) and is evicted lazily, when an allocation finds the free list empty.
#pragma once

#include <pagedkv/block_pool.hpp>
#include <pagedkv/block_table.hpp>
#include <pagedkv/error.hpp>
#include <pagedkv/prefix_cache.hpp>
#include <pagedkv/types.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace pagedkv {

struct kv_cache_options {
  std::int32_t block_size = 16;         ///< tokens per block, 1..max_block_size
  std::int32_t num_device_blocks = 0;   ///< device pool capacity, >= 1
  std::int32_t num_host_blocks = 0;     ///< host pool capacity for swapping, 0 for none
  bool enable_prefix_caching = true;
  std::int32_t watermark_blocks = 0;    ///< blocks can_allocate keeps free for running sequences
  block_hash hash_seed = 0x5bd1e9955bd1e995ULL;  ///< prefix_cache seed: make it secret per process
  /// With extent_free_list: blocks of one extent, best the blocks of one 2 MiB page of a KV pool
  /// (kernels' kv_cache_layout::blocks_per_page); 0 for the policy's default. Other free lists: 0.
  std::int32_t extent_blocks = 0;
};

/// Per-sequence settings given at allocate().
struct sequence_options {
  prefix_key key{};                 ///< adapter id and cache salt: only equal keys share blocks
  std::int32_t cache_priority = 0;  ///< for priority_eviction: higher stays cached longer
};

enum class location { device, host };

/// A block to copy: copy-on-write (device -> device) or a swap (device <-> host).
struct block_copy {
  block_id src = null_block;
  block_id dst = null_block;
  friend bool operator==(const block_copy&, const block_copy&) = default;
};

struct allocation {
  std::int32_t num_cached_tokens = 0;  ///< prompt tokens whose KV came from the prefix cache
  std::vector<slot_id> slots{};        ///< slots of the remaining prompt tokens, in order
};

struct kv_cache_usage {
  std::int32_t num_blocks = 0;            ///< device capacity
  std::int32_t num_free_blocks = 0;       ///< free or idle-cached: what allocations may take
  std::int32_t num_used_blocks = 0;       ///< referenced by at least one live device sequence
  std::int32_t num_cached_blocks = 0;     ///< in the prefix cache, idle or not
  std::int32_t num_evictable_blocks = 0;  ///< idle cached blocks eviction may take
  std::int32_t num_host_used_blocks = 0;
  std::int64_t num_live_tokens = 0;       ///< filled slots of the used blocks (shared slots once)
  double utilization = 0.0;               ///< num_live_tokens / (num_used_blocks * block_size)
  double prefix_hit_rate = 0.0;           ///< prompt tokens served from the cache / prompt tokens
};

/// See the file comment and docs/concepts.md. Not thread-safe: one scheduler thread drives it.
///
/// Every fallible call checks everything before it changes anything: when it throws pagedkv::error
/// the manager is unchanged.
template <free_list_policy FreeList = lifo_free_list, hash_policy Hash = xxh3_hash,
          eviction_policy Eviction = lru_eviction>
class kv_cache_manager {
 public:
  using pool_type = block_pool<FreeList, no_lock>;
  using cache_type = prefix_cache<Hash, Eviction>;

  /// Errors: invalid_argument for a block size or pool capacity out of range.
  explicit kv_cache_manager(const kv_cache_options& options)
      : options_(checked(options)),
        device_(device_pool(options)),
        host_(std::max(options.num_host_blocks, 1)),
        cache_(options.num_device_blocks, options.block_size, options.hash_seed) {}

  // ---- queries ----

  [[nodiscard]] const kv_cache_options& options() const noexcept { return options_; }
  [[nodiscard]] std::int32_t block_size() const noexcept { return options_.block_size; }
  [[nodiscard]] bool contains(seq_id seq) const { return sequences_.contains(seq); }
  [[nodiscard]] std::size_t num_sequences() const noexcept { return sequences_.size(); }
  [[nodiscard]] location where(seq_id seq) const { return get(seq, "where").where; }
  [[nodiscard]] const block_table& table(seq_id seq) const { return get(seq, "table").table; }
  [[nodiscard]] std::span<const token_id> tokens(seq_id seq) const { return get(seq, "tokens").tokens; }
  [[nodiscard]] std::int32_t num_tokens(seq_id seq) const { return get(seq, "num_tokens").table.num_tokens(); }
  [[nodiscard]] std::int32_t num_computed_tokens(seq_id seq) const { return get(seq, "num_computed_tokens").num_computed; }

  /// Calls f(seq_id, const block_table&, location) for every live sequence, in no particular order.
  template <class F>
  void for_each_sequence(F&& f) const {
    for (const auto& [id, s] : sequences_) f(id, s.table, s.where);
  }

  /// Device blocks that allocations may take: free ones plus idle cached ones.
  [[nodiscard]] std::int32_t num_free_blocks() const {
    return device_.num_free_blocks() + cache_.num_evictable_blocks();
  }
  [[nodiscard]] std::int32_t num_free_host_blocks() const {
    return options_.num_host_blocks == 0 ? 0 : host_.num_free_blocks();
  }
  [[nodiscard]] const pool_type& device_pool() const noexcept { return device_; }
  [[nodiscard]] const pool_type& host_pool() const noexcept { return host_; }
  [[nodiscard]] const cache_type& cache() const noexcept { return cache_; }
  /// For the event callback and policy calls (priority_eviction's unpin_all).
  [[nodiscard]] cache_type& cache() noexcept { return cache_; }

  // ---- admission ----

  /// Device blocks allocate(prompt) would take from num_free_blocks(): new blocks for the uncached
  /// part, plus idle cached blocks it would hit (they stop being evictable).
  [[nodiscard]] std::int32_t num_blocks_to_allocate(std::span<const token_id> prompt,
                                                    const sequence_options& opts = {}) const {
    check_prompt(prompt, "num_blocks_to_allocate");
    const prefix_plan plan = plan_prefix(prompt, opts.key);
    return plan.num_new_blocks + plan.num_idle_hits;
  }

  /// Whether allocate(prompt) would succeed and leave watermark_blocks free.
  [[nodiscard]] bool can_allocate(std::span<const token_id> prompt, const sequence_options& opts = {}) const {
    return num_blocks_to_allocate(prompt, opts) + options_.watermark_blocks <= num_free_blocks();
  }

  /// Creates sequence `seq` holding `prompt`, attaching the longest verified cached prefix (at most
  /// all but the prompt's last token, whose logits the engine must compute) and allocating blocks
  /// for the rest. Returns the cached token count and the slots where the engine writes the KV of
  /// prompt[num_cached_tokens..]. The watermark is can_allocate's business, not enforced here.
  /// Errors: duplicate_sequence; invalid_argument for an empty or absurdly long prompt;
  /// out_of_blocks when the blocks are not there.
  allocation allocate(seq_id seq, std::span<const token_id> prompt, const sequence_options& opts = {}) {
    if (contains(seq)) detail::fail(errc::duplicate_sequence, "allocate of sequence ", seq, " which already exists");
    check_prompt(prompt, "allocate");
    prefix_plan plan = plan_prefix(prompt, opts.key);
    const std::int32_t needed = plan.num_new_blocks + plan.num_idle_hits;
    if (needed > num_free_blocks()) {
      detail::fail(errc::out_of_blocks, "allocate of sequence ", seq, " (", prompt.size(),
                   " tokens) needs ", needed, " blocks, ", num_free_blocks(), " free");
    }
    // Claim the hits first, so that making room below cannot evict them.
    for (const chain_link& link : plan.hits) {
      device_.retain(link.block);
      cache_.make_active(link.block);
    }
    sequence s{.table = block_table(block_size()),
               .tokens = {prompt.begin(), prompt.end()},
               .hashes = std::move(plan.hashes),
               .chain = std::move(plan.hits),
               .salt = std::string(opts.key.cache_salt),
               .adapter_id = opts.key.adapter_id,
               .priority = opts.cache_priority};
    for (const chain_link& link : s.chain) s.table.push_block(link.block);
    const std::int32_t num_cached_tokens = s.table.num_blocks() * block_size();
    s.table.extend(num_cached_tokens);
    s.num_computed = num_cached_tokens;
    allocate_device_blocks(plan.num_new_blocks, last_block(s.table), [&](block_id id) { s.table.push_block(id); });

    allocation result{num_cached_tokens, std::vector<slot_id>(prompt.size() - static_cast<std::size_t>(num_cached_tokens))};
    s.table.append(result.slots);
    if (options_.enable_prefix_caching) cache_.record_lookup(static_cast<std::int64_t>(prompt.size()), num_cached_tokens);
    sequences_.emplace(seq, std::move(s));
    return result;
  }

  // ---- growth ----

  /// Device blocks append(seq, n tokens) would take: a copy-on-write copy and new blocks (for a
  /// swapped-out sequence: once swapped in).
  [[nodiscard]] std::int32_t num_blocks_to_append(seq_id seq, std::int32_t num_new_tokens) const {
    const sequence& s = get(seq, "num_blocks_to_append");
    return (needs_copy_on_write(s) ? 1 : 0) + s.table.blocks_needed(num_new_tokens);
  }
  [[nodiscard]] bool can_append(seq_id seq, std::int32_t num_new_tokens) const {
    return num_blocks_to_append(seq, num_new_tokens) <= num_free_blocks();
  }

  /// Appends `new_tokens` to sequence `seq` and writes their slots into `slots` (same length). If
  /// the last block is shared and partly filled, it is first replaced by a private copy: the
  /// returned pair says which block the engine must copy where before writing the new slots.
  /// Errors: unknown_sequence; wrong_location if swapped out; invalid_argument if the lengths
  /// differ or are 0; out_of_blocks.
  std::optional<block_copy> append(seq_id seq, std::span<const token_id> new_tokens, std::span<slot_id> slots) {
    sequence& s = get(seq, "append");
    check_on_device(seq, s, "append");
    if (new_tokens.empty() || new_tokens.size() != slots.size() ||
        s.tokens.size() + new_tokens.size() > max_sequence_tokens) {
      detail::fail(errc::invalid_argument, "append of ", new_tokens.size(), " tokens with ", slots.size(),
                   " slots to sequence ", seq, " of ", s.tokens.size(), " tokens");
    }
    const auto count = static_cast<std::int32_t>(new_tokens.size());
    const bool copy = needs_copy_on_write(s);
    const std::int32_t needed = (copy ? 1 : 0) + s.table.blocks_needed(count);
    if (needed > num_free_blocks()) {
      detail::fail(errc::out_of_blocks, "append of ", count, " tokens to sequence ", seq, " needs ", needed,
                   " blocks, ", num_free_blocks(), " free");
    }
    std::optional<block_copy> copied;
    if (copy) {
      const std::int32_t last = s.table.num_blocks() - 1;
      const block_id src = s.table.block(last);
      allocate_device_blocks(1, last > 0 ? s.table.block(last - 1) : src, [&](block_id dst) {
        s.table.replace_block(last, dst);
        copied = block_copy{src, dst};
      });
      release_device(src, s.priority);
    }
    allocate_device_blocks(s.table.blocks_needed(count), last_block(s.table),
                           [&](block_id id) { s.table.push_block(id); });
    s.table.append(slots);
    s.tokens.insert(s.tokens.end(), new_tokens.begin(), new_tokens.end());
    return copied;
  }

  /// Records that the KV of the first `num_tokens` tokens of `seq` is written, and publishes the
  /// newly complete full blocks to the prefix cache. Blocks are cached only once computed, so no
  /// other sequence can hit a block whose KV is not there yet.
  /// Errors: unknown_sequence; invalid_argument if num_tokens is not in [0, num_tokens(seq)].
  void mark_computed(seq_id seq, std::int32_t num_tokens) {
    sequence& s = get(seq, "mark_computed");
    if (num_tokens < 0 || num_tokens > s.table.num_tokens()) {
      detail::fail(errc::invalid_argument, "mark_computed of ", num_tokens, " tokens of sequence ", seq,
                   " which holds ", s.table.num_tokens());
    }
    s.num_computed = std::max(s.num_computed, num_tokens);
    if (options_.enable_prefix_caching && s.where == location::device) publish(s);
  }

  /// Sets the token at `position` of `seq`, one whose KV is not computed yet: an engine that
  /// schedules the next step before this one's sampled tokens reach the host appends a stand-in
  /// and sets the real token once it is known. Blocks hash their tokens only when computed, so no
  /// prefix-cache entry ever sees the stand-in. Errors: unknown_sequence; invalid_argument if
  /// position is not in [num_computed_tokens(seq), num_tokens(seq)).
  void set_token(seq_id seq, std::int32_t position, token_id token) {
    sequence& s = get(seq, "set_token");
    if (position < s.num_computed || position >= s.table.num_tokens()) {
      detail::fail(errc::invalid_argument, "set_token at position ", position, " of sequence ", seq, ": only its ",
                   s.table.num_tokens() - s.num_computed, " uncomputed tokens from position ", s.num_computed,
                   " may change");
    }
    s.tokens[static_cast<std::size_t>(position)] = token;
  }

  // ---- sharing ----

  /// Makes `child` a copy of `parent` that shares every block (no allocation, cannot run out).
  /// Errors: unknown_sequence for parent; duplicate_sequence if child exists.
  void fork(seq_id parent, seq_id child) {
    const sequence& p = get(parent, "fork");
    if (contains(child)) detail::fail(errc::duplicate_sequence, "fork onto sequence ", child, " which already exists");
    pool_type& pool = p.where == location::device ? device_ : host_;
    for (block_id id : p.table.blocks()) pool.retain(id);
    sequences_.emplace(child, p);
  }

  /// Makes `child` a copy of the first `num_tokens` tokens of `parent` (a branch point of an agent,
  /// a node of a speculative tree): it shares the parent's blocks up to num_tokens, the partial one
  /// included, and allocates nothing. Whichever of them next writes into a shared partial block
  /// copies it first (append's copy-on-write). The child's computed tokens are the parent's, up to
  /// num_tokens. Errors: unknown_sequence for parent; duplicate_sequence if child exists;
  /// invalid_argument if num_tokens is not in [1, num_tokens(parent)].
  void fork(seq_id parent, seq_id child, std::int32_t num_tokens) {
    const sequence& p = get(parent, "fork");
    if (contains(child)) detail::fail(errc::duplicate_sequence, "fork onto sequence ", child, " which already exists");
    if (num_tokens < 1 || num_tokens > p.table.num_tokens()) {
      detail::fail(errc::invalid_argument, "fork of sequence ", parent, " at ", num_tokens, " tokens: it holds ",
                   p.table.num_tokens());
    }
    sequence c = p;
    c.table.truncate(num_tokens);  // the dropped blocks were never retained for the child
    pool_type& pool = p.where == location::device ? device_ : host_;
    for (block_id id : c.table.blocks()) pool.retain(id);
    cut_history(c, num_tokens);
    sequences_.emplace(child, std::move(c));
  }

  /// Frees sequence `seq`: drops its references, last block first, so that with LRU eviction a
  /// chain's deepest blocks are evicted before the blocks other prompts are likelier to share.
  /// Errors: unknown_sequence.
  void free(seq_id seq) {
    const sequence& s = get(seq, "free");
    release_all(s);
    sequences_.erase(seq);
  }

  /// Keeps the first `new_num_tokens` tokens of `seq` (drops rejected speculative tokens) and
  /// releases the blocks that no longer hold any. The next append copies the new last block first
  /// if it is shared. Errors: unknown_sequence; invalid_argument if not in [1, num_tokens(seq)].
  void truncate(seq_id seq, std::int32_t new_num_tokens) {
    sequence& s = get(seq, "truncate");
    if (new_num_tokens < 1 || new_num_tokens > s.table.num_tokens()) {
      detail::fail(errc::invalid_argument, "truncate of sequence ", seq, " to ", new_num_tokens,
                   " tokens: it holds ", s.table.num_tokens(), " (free() drops all)");
    }
    for (block_id id : s.table.truncate(new_num_tokens)) release(s.where, id, s.priority);
    cut_history(s, new_num_tokens);
  }

  // ---- swapping ----

  /// Whether swap_out(group) finds enough host blocks.
  [[nodiscard]] bool can_swap_out(std::span<const seq_id> group) const {
    return distinct_blocks(group, location::device, "can_swap_out").size() <=
           static_cast<std::size_t>(num_free_host_blocks());
  }

  /// Moves a group of sequences (e.g. the samples of one request) to host blocks. Each distinct
  /// device block is copied once; the returned (device src, host dst) pairs say which. The device
  /// references are dropped; cached blocks stay cached.
  /// Errors: unknown_sequence; wrong_location if one is on the host already; invalid_argument for a
  /// repeated id; out_of_blocks when the host pool is short.
  std::vector<block_copy> swap_out(std::span<const seq_id> group) {
    std::vector<block_id> blocks = distinct_blocks(group, location::device, "swap_out");
    if (blocks.size() > static_cast<std::size_t>(num_free_host_blocks())) {
      detail::fail(errc::out_of_blocks, "swap_out needs ", blocks.size(), " host blocks, ",
                   num_free_host_blocks(), " free");
    }
    return move_group(group, blocks, location::host);
  }

  /// Whether swap_in(group) finds enough device blocks.
  [[nodiscard]] bool can_swap_in(std::span<const seq_id> group) const {
    return distinct_blocks(group, location::host, "can_swap_in").size() <=
           static_cast<std::size_t>(num_free_blocks());
  }

  /// Moves a swapped-out group back to device blocks; returns (host src, device dst) pairs.
  /// Errors: as swap_out, with the device pool.
  std::vector<block_copy> swap_in(std::span<const seq_id> group) {
    std::vector<block_id> blocks = distinct_blocks(group, location::host, "swap_in");
    if (blocks.size() > static_cast<std::size_t>(num_free_blocks())) {
      detail::fail(errc::out_of_blocks, "swap_in needs ", blocks.size(), " device blocks, ",
                   num_free_blocks(), " free");
    }
    return move_group(group, blocks, location::device);
  }

  // ---- prefix cache control ----

  /// Evicts up to `max_blocks` idle cached blocks now; returns how many.
  std::int32_t evict_cached_blocks(std::int32_t max_blocks) {
    std::int32_t evicted = 0;
    for (; evicted < max_blocks; ++evicted) {
      const std::optional<block_id> victim = cache_.evict();
      if (!victim) break;
      device_.release(*victim);
    }
    return evicted;
  }

  /// Empties the prefix cache (e.g. after a weight update). Running sequences keep their KV.
  void reset_prefix_cache() {
    for (block_id id : cache_.clear()) device_.release(id);
  }

  [[nodiscard]] kv_cache_usage usage() const {
    std::vector<std::int32_t> fill(static_cast<std::size_t>(device_.capacity()), 0);
    for (const auto& [id, s] : sequences_) {
      if (s.where != location::device) continue;
      const std::span<const block_id> blocks = s.table.blocks();
      for (std::size_t i = 0; i < blocks.size(); ++i) {
        const std::int32_t filled = i + 1 == blocks.size() ? s.table.last_block_len() : block_size();
        std::int32_t& f = fill[static_cast<std::size_t>(blocks[i])];
        f = std::max(f, filled);
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
    u.num_host_used_blocks = options_.num_host_blocks == 0 ? 0 : host_.num_used_blocks();
    u.utilization = u.num_used_blocks == 0 ? 0.0
                                           : static_cast<double>(u.num_live_tokens) /
                                                 (static_cast<double>(u.num_used_blocks) * block_size());
    u.prefix_hit_rate = cache_.hit_rate();
    return u;
  }

 private:
  static constexpr std::size_t max_sequence_tokens = std::size_t{1} << 30;

  struct sequence {
    block_table table;
    std::vector<token_id> tokens{};
    std::vector<block_hash> hashes{};  // chained hashes of full blocks, computed lazily
    std::vector<chain_link> chain{};   // the cache's block for each of the first chain.size() blocks
    bool chain_broken = false;       // a collision or an evicted parent: publish no further
    std::int32_t num_computed = 0;
    location where = location::device;
    std::string salt{};  // owns prefix_key::cache_salt
    std::int64_t adapter_id = 0;
    std::int32_t priority = 0;

    [[nodiscard]] prefix_key key() const noexcept { return {adapter_id, salt}; }
  };

  struct prefix_plan {
    std::vector<block_hash> hashes;
    std::vector<chain_link> hits;
    std::int32_t num_new_blocks = 0;
    std::int32_t num_idle_hits = 0;
  };

  static pool_type device_pool(const kv_cache_options& o) {
    if constexpr (locality_free_list_policy<FreeList>) {
      if (o.extent_blocks != 0) return pool_type(o.num_device_blocks, o.extent_blocks);
    } else if (o.extent_blocks != 0) {
      detail::fail(errc::invalid_argument, "extent_blocks ", o.extent_blocks,
                   " needs a free list with extents (extent_free_list); 0 for none");
    }
    return pool_type(o.num_device_blocks);
  }

  static const kv_cache_options& checked(const kv_cache_options& o) {
    if (o.num_host_blocks < 0 || o.num_host_blocks > max_num_blocks) {
      detail::fail(errc::invalid_argument, "num_host_blocks ", o.num_host_blocks, " is not in [0, ", max_num_blocks, "]");
    }
    if (o.watermark_blocks < 0 || o.watermark_blocks > o.num_device_blocks) {
      detail::fail(errc::invalid_argument, "watermark_blocks ", o.watermark_blocks, " is not in [0, num_device_blocks]");
    }
    return o;  // block size and device capacity are checked by the pool and the cache
  }

  static void check_prompt(std::span<const token_id> prompt, const char* operation) {
    if (prompt.empty() || prompt.size() > max_sequence_tokens) {
      detail::fail(errc::invalid_argument, operation, " of a prompt of ", prompt.size(), " tokens: must be 1..",
                   max_sequence_tokens);
    }
  }

  [[nodiscard]] const sequence& get(seq_id seq, const char* operation) const {
    const auto it = sequences_.find(seq);
    if (it == sequences_.end()) detail::fail(errc::unknown_sequence, operation, " of unknown sequence ", seq);
    return it->second;
  }
  [[nodiscard]] sequence& get(seq_id seq, const char* operation) {
    return const_cast<sequence&>(std::as_const(*this).get(seq, operation));
  }
  static void check_on_device(seq_id seq, const sequence& s, const char* operation) {
    if (s.where != location::device) {
      detail::fail(errc::wrong_location, operation, " of sequence ", seq, " which is swapped out");
    }
  }

  [[nodiscard]] prefix_plan plan_prefix(std::span<const token_id> prompt, const prefix_key& key) const {
    prefix_plan plan;
    const auto num_tokens = static_cast<std::int32_t>(prompt.size());
    if (options_.enable_prefix_caching) {
      cache_.extend_hashes(prompt, key, plan.hashes);
      // The last prompt token is always computed: the engine needs its logits.
      cache_.match(prompt, key, plan.hashes, (num_tokens - 1) / block_size(), plan.hits);
      for (const chain_link& link : plan.hits) plan.num_idle_hits += cache_.is_idle(link.block) ? 1 : 0;
    }
    const std::int32_t num_blocks = (num_tokens + block_size() - 1) / block_size();
    plan.num_new_blocks = num_blocks - static_cast<std::int32_t>(plan.hits.size());
    return plan;
  }

  /// Cuts a sequence's tokens, computed count, hashes and cache chain to its first `num_tokens`
  /// (its table is cut already): what truncate and fork at a position share.
  void cut_history(sequence& s, std::int32_t num_tokens) const {
    s.tokens.resize(static_cast<std::size_t>(num_tokens));
    s.num_computed = std::min(s.num_computed, num_tokens);
    const auto full_blocks = static_cast<std::size_t>(num_tokens / block_size());
    if (s.hashes.size() > full_blocks) s.hashes.resize(full_blocks);
    if (s.chain.size() >= full_blocks) {
      s.chain.resize(full_blocks);
      s.chain_broken = false;
    }
  }

  /// Whether the next append must copy the last block first: it is partly filled and shared. For a
  /// swapped-out sequence, whether it will have to once swapped in (sharing is kept by the swap).
  [[nodiscard]] bool needs_copy_on_write(const sequence& s) const {
    const std::int32_t fill = s.table.last_block_len();
    const pool_type& pool = s.where == location::device ? device_ : host_;
    return fill > 0 && fill < block_size() && pool.ref_count(s.table.block(s.table.num_blocks() - 1)) > 1;
  }

  /// Takes `count` device blocks, each near the one before it and the first near `hint` (a
  /// device block or null_block: block_pool::allocate_near), evicting idle cached blocks as the
  /// free list runs dry, and hands each to `take`. The caller has checked count <=
  /// num_free_blocks().
  template <class Take>
  void allocate_device_blocks(std::int32_t count, block_id hint, Take&& take) {
    for (std::int32_t i = 0; i < count; ++i) {
      std::optional<block_id> id = device_.try_allocate_near(hint);
      if (!id) {
        const std::optional<block_id> victim = cache_.evict();
        device_.release(*victim);  // the cache's hold was its last reference
        id = device_.allocate_near(hint);
      }
      take(*id);
      hint = *id;
    }
  }

  static block_id last_block(const block_table& table) {
    return table.num_blocks() > 0 ? table.block(table.num_blocks() - 1) : null_block;
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
  void release_all(const sequence& s) {
    const std::span<const block_id> blocks = s.table.blocks();
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) release(s.where, *it, s.priority);
  }

  void publish(sequence& s) {
    const std::int32_t full_blocks = s.num_computed / block_size();
    if (s.chain_broken || static_cast<std::int32_t>(s.chain.size()) >= full_blocks) return;
    const std::span<const token_id> computed(s.tokens.data(), static_cast<std::size_t>(full_blocks * block_size()));
    cache_.extend_hashes(computed, s.key(), s.hashes);
    for (auto i = static_cast<std::int32_t>(s.chain.size()); i < full_blocks; ++i) {
      const block_id id = s.table.block(i);
      const bool was_cached = cache_.contains(id);
      const chain_link parent = i == 0 ? chain_link{} : s.chain.back();
      const std::optional<chain_link> link =
          cache_.insert(id, s.hashes[static_cast<std::size_t>(i)], parent,
                        computed.subspan(static_cast<std::size_t>(i * block_size()), static_cast<std::size_t>(block_size())),
                        s.key());
      if (!link) {
        s.chain_broken = true;
        return;
      }
      if (link->block == id && !was_cached) device_.retain(id);  // the cache's hold
      s.chain.push_back(*link);
    }
  }

  /// The distinct blocks of a group that must all be at `from`, in order of first appearance.
  [[nodiscard]] std::vector<block_id> distinct_blocks(std::span<const seq_id> group, location from,
                                                      const char* operation) const {
    std::vector<block_id> blocks;
    std::unordered_map<block_id, bool> seen;
    for (std::size_t i = 0; i < group.size(); ++i) {
      const sequence& s = get(group[i], operation);
      if (s.where != from) {
        detail::fail(errc::wrong_location, operation, " of sequence ", group[i], " which is ",
                     s.where == location::device ? "on the device" : "swapped out");
      }
      if (std::find(group.begin(), group.begin() + static_cast<std::ptrdiff_t>(i), group[i]) !=
          group.begin() + static_cast<std::ptrdiff_t>(i)) {
        detail::fail(errc::invalid_argument, operation, ": sequence ", group[i], " is listed twice");
      }
      for (block_id id : s.table.blocks()) {
        if (seen.emplace(id, true).second) blocks.push_back(id);
      }
    }
    return blocks;
  }

  /// Copies each of `blocks` to a new block in the pool at `to`, repoints the group's tables and
  /// moves every reference. The caller has checked capacity.
  std::vector<block_copy> move_group(std::span<const seq_id> group, std::span<const block_id> blocks, location to) {
    std::unordered_map<block_id, block_id> moved;
    std::vector<block_copy> copies;
    copies.reserve(blocks.size());
    block_id near = null_block;  // the blocks come in table order: each swapped in near the one before
    for (block_id src : blocks) {
      block_id dst = null_block;
      if (to == location::host) {
        dst = host_.allocate();
      } else {
        allocate_device_blocks(1, near, [&](block_id id) { dst = id; });
        near = dst;
      }
      moved.emplace(src, dst);
      copies.push_back({src, dst});
    }
    pool_type& to_pool = to == location::device ? device_ : host_;
    std::unordered_map<block_id, bool> first_reference;
    for (seq_id seq : group) {
      sequence& s = get(seq, "move_group");
      for (std::int32_t i = 0; i < s.table.num_blocks(); ++i) {
        const block_id src = s.table.block(i);
        const block_id dst = moved.at(src);
        if (!first_reference.emplace(dst, true).second) to_pool.retain(dst);  // allocate gave the first
        release(s.where, src, s.priority);
        s.table.replace_block(i, dst);
      }
      s.where = to;
    }
    return copies;
  }

  kv_cache_options options_;
  pool_type device_;
  pool_type host_;  // capacity >= 1 even without swapping; num_free_host_blocks() reports 0 then
  cache_type cache_;
  std::unordered_map<seq_id, sequence> sequences_;
};

}  // namespace pagedkv
