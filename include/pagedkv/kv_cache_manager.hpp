// kv_cache_manager: the sequence-level KV cache an engine drives. It composes a device block_pool,
// an optional host block_pool (for swapping), one block_table per sequence and a prefix_cache.
//
// Reference counting: a block's refcount is the number of tables that reference it plus one if the
// prefix cache holds it. A cached block that only the cache references is idle: it still counts as
// available (num_free_blocks) and is evicted lazily, when an allocation finds the free list empty.
#pragma once

#include <pagedkv/block_pool.hpp>
#include <pagedkv/block_table.hpp>
#include <pagedkv/detail/kv_block_store.hpp>
#include <pagedkv/error.hpp>
#include <pagedkv/prefix_cache.hpp>
#include <pagedkv/prefix_lookup.hpp>
#include <pagedkv/types.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace pagedkv {

struct kv_cache_options {
  std::int32_t block_size = 16;         ///< tokens per block, 1..max_block_size
  std::int32_t num_device_blocks = 0;   ///< device pool capacity, >= 1
  std::int32_t num_host_blocks = 0;     ///< host pool capacity for swapping, 0 for none
  bool enable_prefix_caching = true;
  /// Partial hits: when the next cached block after a hit matches only the prompt's next k <
  /// block_size tokens, copy it into the prompt's fresh block and count the k tokens as cached.
  bool enable_partial_reuse = true;
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
  /// false: no partial hit for this allocation, so that num_blocks_to_allocate of several prompts
  /// that would copy the same idle block is their sum (a scheduler admitting a group).
  bool partial_reuse = true;
};

struct allocation {
  std::int32_t num_cached_tokens = 0;  ///< prompt tokens whose KV came from the prefix cache
  std::vector<slot_id> slots{};        ///< slots of the remaining prompt tokens, in order
  prefix_lookup lookup{};              ///< why the other prompt tokens missed the cache
  /// A partial hit (kv_cache_options::enable_partial_reuse): the engine copies the whole cached
  /// block src into the sequence's block dst before it writes the new slots; the first
  /// num_partial_tokens of num_cached_tokens come from it. The manager holds src until the
  /// sequence's first mark_computed (the step that ran the copy), free, truncate or swap out.
  std::optional<block_copy> partial_copy{};
  std::int32_t num_partial_tokens = 0;
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
  using options_type = kv_cache_options;

  /// Errors: invalid_argument for a block size or pool capacity out of range.
  explicit kv_cache_manager(const kv_cache_options& options)
      : options_(checked(options)),
        store_(device_pool(options), options.num_host_blocks, options.block_size, options.hash_seed) {}

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
  /// Whether `seq` was allocated with a partial hit whose copy has not run yet (no mark_computed).
  [[nodiscard]] bool has_partial_hit(seq_id seq) const { return get(seq, "has_partial_hit").partial_source != null_block; }
  /// The cached block a partial hit of `seq` copies from, which the sequence holds a reference to
  /// until that copy ran; null_block when there is none.
  [[nodiscard]] block_id partial_source(seq_id seq) const { return get(seq, "partial_source").partial_source; }

  /// Calls f(seq_id, const block_table&, location) for every live sequence, in no particular order.
  template <class F>
  void for_each_sequence(F&& f) const {
    for (const auto& [id, s] : sequences_) f(id, s.table, s.where);
  }

  /// Device blocks that allocations may take: free ones plus idle cached ones.
  [[nodiscard]] std::int32_t num_free_blocks() const { return store_.num_free_blocks(); }
  /// Idle cached device blocks a retention policy holds for now (a TTL's): not in
  /// num_free_blocks, but free once their time is up. 0 without such a policy.
  [[nodiscard]] std::int32_t num_held_blocks() const { return store_.cache().num_held_blocks(); }
  [[nodiscard]] std::int32_t num_free_host_blocks() const { return store_.num_free_host_blocks(); }
  [[nodiscard]] const pool_type& device_pool() const noexcept { return store_.device(); }
  [[nodiscard]] const pool_type& host_pool() const noexcept { return store_.host(); }
  [[nodiscard]] const cache_type& cache() const noexcept { return store_.cache(); }
  /// For the event callback and policy calls (priority_eviction's unpin_all).
  [[nodiscard]] cache_type& cache() noexcept { return store_.cache(); }

  // ---- admission ----

  /// Device blocks allocate(prompt) would take from num_free_blocks(): new blocks for the uncached
  /// part, plus idle cached blocks it would hit (they stop being evictable).
  [[nodiscard]] std::int32_t num_blocks_to_allocate(std::span<const token_id> prompt,
                                                    const sequence_options& opts = {}) const {
    detail::check_prompt(prompt, "num_blocks_to_allocate");
    const prefix_plan plan = plan_prefix(prompt, opts);
    return plan.num_new_blocks + plan.num_idle_hits;
  }

  /// What allocate(prompt) would find in the prefix cache, and why it would miss the rest. Counts
  /// nothing. Errors: invalid_argument for an empty or absurdly long prompt.
  [[nodiscard]] prefix_lookup lookup(std::span<const token_id> prompt, const sequence_options& opts = {}) const {
    detail::check_prompt(prompt, "lookup");
    return plan_prefix(prompt, opts).lookup;
  }
  /// The lookups of every allocation so far, summed.
  [[nodiscard]] const prefix_lookup& miss_totals() const noexcept { return miss_totals_; }
  /// The eviction policy's name, which miss_reason::evicted blames.
  [[nodiscard]] static constexpr std::string_view eviction_name() noexcept { return eviction_policy_name<Eviction>(); }

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
    detail::check_prompt(prompt, "allocate");
    prefix_plan plan = plan_prefix(prompt, opts);
    const std::int32_t needed = plan.num_new_blocks + plan.num_idle_hits;
    if (needed > num_free_blocks()) {
      detail::fail(errc::out_of_blocks, "allocate of sequence ", seq, " (", prompt.size(),
                   " tokens) needs ", needed, " blocks, ", num_free_blocks(), " free");
    }
    // Claim the hits first, so that making room below cannot evict them.
    for (const chain_link& link : plan.hits) store_.claim(link.block);
    sequence s{.table = block_table(block_size()),
               .tokens = {prompt.begin(), prompt.end()},
               .hashes = std::move(plan.hashes),
               .chain = std::move(plan.hits),
               .salt = std::string(opts.key.cache_salt),
               .adapter_id = opts.key.adapter_id,
               .priority = opts.cache_priority};
    if (plan.partial) claim_partial_source(s, plan.partial->link.block);
    for (const chain_link& link : s.chain) s.table.push_block(link.block);
    const std::int32_t num_hit_tokens = s.table.num_blocks() * block_size();
    const std::int32_t num_partial_tokens = plan.partial ? plan.partial->num_tokens : 0;
    const std::int32_t num_cached_tokens = num_hit_tokens + num_partial_tokens;
    s.num_computed = num_cached_tokens;
    store_.allocate_device(plan.num_new_blocks, last_block(s.table), [&](block_id id) { s.table.push_block(id); });
    s.table.extend(num_cached_tokens);

    allocation result{num_cached_tokens, std::vector<slot_id>(prompt.size() - static_cast<std::size_t>(num_cached_tokens)),
                      plan.lookup};
    s.table.append(result.slots);
    if (plan.partial) {
      result.partial_copy = block_copy{s.partial_source, s.table.block(num_hit_tokens / block_size())};
      result.num_partial_tokens = num_partial_tokens;
      store_.cache().record_partial_hit(num_partial_tokens);
    }
    if (options_.enable_prefix_caching) store_.cache().record_lookup(static_cast<std::int64_t>(prompt.size()), num_hit_tokens);
    miss_totals_ += plan.lookup;
    sequences_.emplace(seq, std::move(s));
    return result;
  }

  /// Device blocks allocate_shared(prompt, num_shared_tokens) takes: the prompt's blocks past the
  /// shared ones.
  [[nodiscard]] std::int32_t num_blocks_to_allocate_shared(std::span<const token_id> prompt,
                                                           std::int32_t num_shared_tokens) const {
    detail::check_prompt(prompt, "num_blocks_to_allocate_shared");
    return (static_cast<std::int32_t>(prompt.size()) + block_size() - 1) / block_size() - num_shared_tokens / block_size();
  }

  /// Creates sequence `seq` holding `prompt`, whose first `num_shared_tokens` (whole blocks) are
  /// also the first tokens of `source` under the same key: a request admitted beside another with
  /// the same prefix (prefix sharing inside a burst). It shares source's blocks for them, as a fork
  /// at that position, whether or not source has computed them yet, and allocates blocks for the
  /// rest. Its computed tokens are source's, up to num_shared_tokens: the engine must not compute
  /// it before source has computed them, then mark them computed (the scheduler waits for it).
  /// Returns num_cached_tokens = num_shared_tokens and the slots of the rest; counts the lookup,
  /// with the shared tokens apart (kv_cache_usage::shared_hit_rate, prefix_lookup::num_shared_tokens)
  /// and the rest missed for the reason of the first block past them, then the last partial block.
  /// Errors: duplicate_sequence; unknown_sequence for source; wrong_location if source is swapped
  /// out; invalid_argument for an empty or absurdly long prompt, a count that is not whole blocks in
  /// [block_size, prompt size - 1] and within source, tokens that differ, or another key;
  /// out_of_blocks.
  allocation allocate_shared(seq_id seq, seq_id source, std::int32_t num_shared_tokens, std::span<const token_id> prompt,
                             const sequence_options& opts = {}) {
    if (contains(seq)) detail::fail(errc::duplicate_sequence, "allocate_shared of sequence ", seq, " which already exists");
    detail::check_prompt(prompt, "allocate_shared");
    const sequence& src = get(source, "allocate_shared");
    check_on_device(source, src, "allocate_shared");
    detail::check_shared(source, src.tokens, src.key(), num_shared_tokens, prompt, opts.key, block_size());
    const std::int32_t needed = num_blocks_to_allocate_shared(prompt, num_shared_tokens);
    if (needed > num_free_blocks()) {
      detail::fail(errc::out_of_blocks, "allocate_shared of sequence ", seq, " (", prompt.size(), " tokens) needs ", needed,
                   " blocks, ", num_free_blocks(), " free");
    }
    prefix_lookup lookup = store_.shared_lookup(prompt, opts.key, num_shared_tokens, options_.enable_prefix_caching,
                                                [](chain_link) { return true; });
    fork(source, seq, num_shared_tokens);
    sequence& s = sequences_.at(seq);
    s.priority = opts.cache_priority;
    const std::span<const token_id> rest = prompt.subspan(static_cast<std::size_t>(num_shared_tokens));
    store_.allocate_device(s.table.blocks_needed(static_cast<std::int32_t>(rest.size())), last_block(s.table),
                           [&](block_id id) { s.table.push_block(id); });
    allocation result{num_shared_tokens, std::vector<slot_id>(rest.size()), std::move(lookup)};
    s.table.append(result.slots);
    s.tokens.insert(s.tokens.end(), rest.begin(), rest.end());
    if (options_.enable_prefix_caching) store_.cache().record_lookup(static_cast<std::int64_t>(prompt.size()), 0);
    store_.cache().record_shared_hit(num_shared_tokens);
    miss_totals_ += result.lookup;
    return result;
  }

  // ---- growth ----

  /// Device blocks append(seq, n tokens) would take: a copy-on-write copy and new blocks (for a
  /// swapped-out sequence: once swapped in).
  [[nodiscard]] std::int32_t num_blocks_to_append(seq_id seq, std::int32_t num_new_tokens) const {
    const sequence& s = get(seq, "num_blocks_to_append");
    return (store_.needs_copy_on_write(s.table, s.where) ? 1 : 0) + s.table.blocks_needed(num_new_tokens);
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
        s.tokens.size() + new_tokens.size() > detail::max_sequence_tokens) {
      detail::fail(errc::invalid_argument, "append of ", new_tokens.size(), " tokens with ", slots.size(),
                   " slots to sequence ", seq, " of ", s.tokens.size(), " tokens");
    }
    const auto count = static_cast<std::int32_t>(new_tokens.size());
    const bool copy = store_.needs_copy_on_write(s.table, s.where);
    const std::int32_t needed = (copy ? 1 : 0) + s.table.blocks_needed(count);
    if (needed > num_free_blocks()) {
      detail::fail(errc::out_of_blocks, "append of ", count, " tokens to sequence ", seq, " needs ", needed,
                   " blocks, ", num_free_blocks(), " free");
    }
    std::optional<block_copy> copied;
    if (copy) {
      const std::int32_t last = s.table.num_blocks() - 1;
      const block_id src = s.table.block(last);
      store_.allocate_device(1, last > 0 ? s.table.block(last - 1) : src, [&](block_id dst) {
        s.table.replace_block(last, dst);
        copied = block_copy{src, dst};
      });
      store_.release_device(src, s.priority);
    }
    store_.allocate_device(s.table.blocks_needed(count), last_block(s.table), [&](block_id id) { s.table.push_block(id); });
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
    release_partial_source(s);  // the step that ran its copy is over
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
    store_.retain_all(p);
    sequences_.emplace(child, p).first->second.partial_source = null_block;  // the parent's to release
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
    c.partial_source = null_block;  // the parent's to release
    c.table.truncate(num_tokens);  // the dropped blocks were never retained for the child
    store_.retain_all(c);
    cut_history(c, num_tokens);
    sequences_.emplace(child, std::move(c));
  }

  /// Frees sequence `seq`: drops its references, last block first, so that with LRU eviction a
  /// chain's deepest blocks are evicted before the blocks other prompts are likelier to share.
  /// With partial reuse on, the computed part of its last, partly filled block stays cached for
  /// partial hits (a conversation's next turn continues there). Errors: unknown_sequence.
  void free(seq_id seq) {
    sequence& s = get(seq, "free");
    release_partial_source(s);
    cache_tail(s);
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
    release_partial_source(s);
    for (block_id id : s.table.truncate(new_num_tokens)) store_.release(s.where, id, s.priority);
    cut_history(s, new_num_tokens);
  }

  // ---- swapping ----

  /// Whether swap_out(group) finds enough host blocks.
  [[nodiscard]] bool can_swap_out(std::span<const seq_id> group) const {
    return store_.distinct_blocks(sequences_, group, location::device, "can_swap_out").size() <=
           static_cast<std::size_t>(num_free_host_blocks());
  }

  /// Moves a group of sequences (e.g. the samples of one request) to host blocks. Each distinct
  /// device block is copied once; the returned (device src, host dst) pairs say which. The device
  /// references are dropped; cached blocks stay cached.
  /// Errors: unknown_sequence; wrong_location if one is on the host already; invalid_argument for a
  /// repeated id; out_of_blocks when the host pool is short.
  std::vector<block_copy> swap_out(std::span<const seq_id> group) {
    std::vector<block_copy> copies = store_.swap(sequences_, group, location::host, "swap_out");
    for (seq_id seq : group) release_partial_source(get(seq, "swap_out"));  // the copy ran, or never will
    return copies;
  }

  /// Whether swap_in(group) finds enough device blocks.
  [[nodiscard]] bool can_swap_in(std::span<const seq_id> group) const {
    return store_.distinct_blocks(sequences_, group, location::host, "can_swap_in").size() <=
           static_cast<std::size_t>(num_free_blocks());
  }

  /// Moves a swapped-out group back to device blocks; returns (host src, device dst) pairs.
  /// Errors: as swap_out, with the device pool.
  std::vector<block_copy> swap_in(std::span<const seq_id> group) {
    return store_.swap(sequences_, group, location::device, "swap_in");
  }

  // ---- prefix cache control ----

  /// Evicts up to `max_blocks` idle cached blocks now; returns how many.
  std::int32_t evict_cached_blocks(std::int32_t max_blocks) { return store_.evict(max_blocks); }

  /// Empties the prefix cache (e.g. after a weight update). Running sequences keep their KV.
  void reset_prefix_cache() { store_.reset(); }

  [[nodiscard]] kv_cache_usage usage() const { return store_.usage(sequences_); }

 private:
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
    block_id partial_source = null_block;  // a partial hit's cached block, held until its copy ran

    [[nodiscard]] prefix_key key() const noexcept { return {adapter_id, salt}; }
    [[nodiscard]] std::span<block_table> tables() noexcept { return {&table, 1}; }
    [[nodiscard]] std::span<const block_table> tables() const noexcept { return {&table, 1}; }
  };

  struct prefix_plan {
    prefix_lookup lookup;
    std::vector<block_hash> hashes;
    std::vector<chain_link> hits;
    std::int32_t num_new_blocks = 0;
    std::int32_t num_idle_hits = 0;
    std::optional<typename cache_type::partial_match> partial{};
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
    detail::check_capacities(o.num_device_blocks, o.num_host_blocks, o.watermark_blocks);
    return o;
  }

  [[nodiscard]] const sequence& get(seq_id seq, const char* operation) const {
    return detail::find_sequence(sequences_, seq, operation);
  }
  [[nodiscard]] sequence& get(seq_id seq, const char* operation) { return detail::find_sequence(sequences_, seq, operation); }
  static void check_on_device(seq_id seq, const sequence& s, const char* operation) {
    if (s.where != location::device) {
      detail::fail(errc::wrong_location, operation, " of sequence ", seq, " which is swapped out");
    }
  }

  [[nodiscard]] prefix_plan plan_prefix(std::span<const token_id> prompt, const sequence_options& opts) const {
    const prefix_key& key = opts.key;
    prefix_plan plan;
    const auto num_tokens = static_cast<std::int32_t>(prompt.size());
    plan.lookup.num_prompt_tokens = num_tokens;
    if (!options_.enable_prefix_caching) plan.lookup.missed_tokens[static_cast<std::size_t>(miss_reason::caching_off)] = num_tokens;
    if (options_.enable_prefix_caching) {
      store_.cache().extend_hashes(prompt, key, plan.hashes);
      // The last prompt token is always computed: the engine needs its logits.
      const std::int32_t limit = (num_tokens - 1) / block_size();
      const std::int32_t hit = store_.cache().match(prompt, key, plan.hashes, limit, plan.hits);
      for (const chain_link& link : plan.hits) plan.num_idle_hits += store_.cache().is_idle(link.block) ? 1 : 0;
      plan.lookup.num_hit_tokens = hit * block_size();
      // Tokens a cached block after the hits starts with: a partial hit, or with partial reuse
      // off, tokens lost below the hit granularity. Either way the block's own reason skips them.
      const std::int32_t partial = plan_partial_hit(prompt, key, opts.partial_reuse, plan);
      const miss_reason stop = hit < limit ? store_.why_missing(prompt, key, plan.hashes[static_cast<std::size_t>(hit)], hit,
                                                                [](chain_link) { return true; })
                                           : miss_reason::partial_block;
      detail::count_misses(plan.lookup, block_size(), num_tokens, hit, hit, limit, stop, partial, partial,
                           plan.partial.has_value());
    }
    const std::int32_t num_blocks = (num_tokens + block_size() - 1) / block_size();
    plan.num_new_blocks = num_blocks - static_cast<std::int32_t>(plan.hits.size());
    return plan;
  }

  /// Looks for a partial hit after the full-block hits: a cached block after the last hit whose
  /// first tokens match the prompt's next ones, short of the prompt's last token. Returns how many
  /// match; plans the hit (plan.partial) only with partial reuse on and room for its source.
  std::int32_t plan_partial_hit(std::span<const token_id> prompt, const prefix_key& key, bool reuse,
                                prefix_plan& plan) const {
    const std::size_t first = plan.hits.size() * static_cast<std::size_t>(block_size());
    const std::span<const token_id> rest = prompt.subspan(first, prompt.size() - 1 - first);  // the last is computed
    const chain_link parent = plan.hits.empty() ? chain_link{} : plan.hits.back();
    const std::optional<typename cache_type::partial_match> found = store_.cache().match_partial(parent, rest, key);
    if (!found || found->num_tokens == 0) return 0;
    if (!options_.enable_partial_reuse || !reuse) return found->num_tokens;
    if (store_.cache().is_idle(found->link.block)) {
      // Holding an idle source takes one more block from num_free_blocks(): only if it fits, so that
      // a prompt that fits without the partial hit is never refused for it.
      const auto num_blocks = static_cast<std::int32_t>((prompt.size() + static_cast<std::size_t>(block_size()) - 1) /
                                                        static_cast<std::size_t>(block_size()));
      const std::int32_t needed = num_blocks - static_cast<std::int32_t>(plan.hits.size()) + plan.num_idle_hits + 1;
      if (needed > num_free_blocks()) return found->num_tokens;
      ++plan.num_idle_hits;
    }
    plan.partial = found;
    return found->num_tokens;
  }
  void claim_partial_source(sequence& s, block_id source) {
    store_.claim(source);
    s.partial_source = source;
  }
  void release_partial_source(sequence& s) {
    if (s.partial_source == null_block) return;
    store_.release_device(std::exchange(s.partial_source, null_block), s.priority);
  }

  /// Cuts a sequence's tokens, computed count, hashes and cache chain to its first `num_tokens`
  /// (its table is cut already): what truncate and fork at a position share.
  void cut_history(sequence& s, std::int32_t num_tokens) const { detail::cut_history(s, num_tokens, block_size()); }

  static block_id last_block(const block_table& table) {
    return table.num_blocks() > 0 ? table.block(table.num_blocks() - 1) : null_block;
  }

  void release_all(const sequence& s) {
    const std::span<const block_id> blocks = s.table.blocks();
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) store_.release(s.where, *it, s.priority);
  }

  /// Keeps the computed tokens of `s`'s last, partly filled block cached for partial hits
  /// (prefix_cache::insert_partial) when every full block before them is published.
  void cache_tail(const sequence& s) {
    const std::span<const token_id> tokens =
        detail::freed_tail(s, block_size(), options_.enable_prefix_caching && options_.enable_partial_reuse);
    if (tokens.empty()) return;
    const std::int32_t full_blocks = s.num_computed / block_size();
    store_.cache_partial(s.table.block(full_blocks), full_blocks == 0 ? chain_link{} : s.chain.back(), tokens, s.key());
  }

  void publish(sequence& s) {
    const std::int32_t full_blocks = s.num_computed / block_size();
    if (s.chain_broken || static_cast<std::int32_t>(s.chain.size()) >= full_blocks) return;
    const std::span<const token_id> computed(s.tokens.data(), static_cast<std::size_t>(full_blocks * block_size()));
    cache_type& cache = store_.cache();
    cache.extend_hashes(computed, s.key(), s.hashes);
    for (auto i = static_cast<std::int32_t>(s.chain.size()); i < full_blocks; ++i) {
      const block_id id = s.table.block(i);
      const bool was_cached = cache.contains(id);
      const chain_link parent = i == 0 ? chain_link{} : s.chain.back();
      const std::optional<chain_link> link =
          cache.insert(id, s.hashes[static_cast<std::size_t>(i)], parent,
                        computed.subspan(static_cast<std::size_t>(i * block_size()), static_cast<std::size_t>(block_size())),
                        s.key());
      if (!link) {
        s.chain_broken = true;
        return;
      }
      if (link->block == id && !was_cached) store_.cached(id, s.hashes[static_cast<std::size_t>(i)]);
      s.chain.push_back(*link);
    }
  }

  kv_cache_options options_;
  detail::kv_block_store<FreeList, Hash, Eviction> store_;
  prefix_lookup miss_totals_;
  std::unordered_map<seq_id, sequence> sequences_;
};

}  // namespace pagedkv
