// hybrid_kv_cache_manager: the sequence-level KV cache of a model whose layers do not all attend
// alike. The model declares groups of layers, each with a kv_cache_spec (full attention, a sliding
// window, chunked local attention). One device block_pool and one prefix_cache serve every group;
// each sequence has one block_table per group, exported for the kernels group by group.
//
// A windowed group releases the blocks its next query can no longer read (wholly before
// spec.first_needed_position(num_computed)) and puts null_block in their place; a cached one stays
// in the prefix cache, idle, until evicted. A prefix hit is the longest block-aligned prefix for
// which every group has what its next query reads: every block for full attention, the blocks of
// the last window (or chunk) for a windowed group. With partial reuse on it extends below a
// block: every group copies its cached block of the next position, whose first tokens match the
// prompt's, into the sequence's fresh block (one copy per group).
//
// Cache identity. One group, the anchor (the first full-attention group, else group 0), caches its
// blocks as a verified chain exactly as kv_cache_manager does. Every other group caches its block
// of position j as a child of the anchor's link at j, under the anchor's hash mixed with the group
// index, and the manager records each cached block's group: a hit of group g at j is verified by
// the anchor's chain up to j, the block's tokens and its group. A partly filled block (a freed
// sequence's last) is cached for partial hits the same way: the anchor's after its chain, every
// other group's under the anchor's, each tagged with its group. A windowed group's hit therefore
// needs no block of its own before the window, only the anchor's chain, which for a full-attention
// anchor stays whole as long as its blocks are cached.
//
// Reference counting is kv_cache_manager's: a block's refcount is the number of table entries
// that hold it plus one if the prefix cache holds it; null entries hold nothing.
#pragma once

#include <pagedkv/block_pool.hpp>
#include <pagedkv/block_table.hpp>
#include <pagedkv/detail/kv_block_store.hpp>
#include <pagedkv/error.hpp>
#include <pagedkv/kv_cache_manager.hpp>
#include <pagedkv/kv_cache_spec.hpp>
#include <pagedkv/prefix_cache.hpp>
#include <pagedkv/prefix_lookup.hpp>
#include <pagedkv/types.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace pagedkv {

struct hybrid_kv_cache_options {
  std::int32_t block_size = 16;        ///< tokens per block, 1..max_block_size, the same in every group
  std::int32_t num_device_blocks = 0;  ///< pool capacity shared by all groups, >= 1
  std::int32_t num_host_blocks = 0;    ///< host pool capacity for swapping, 0 for none
  std::vector<kv_cache_spec> groups{kv_cache_spec::full_attention()};  ///< one spec per group of layers
  bool enable_prefix_caching = true;
  /// Partial hits (kv_cache_options::enable_partial_reuse), in every group: when the cached blocks
  /// of the position after a hit match only the prompt's next k < block_size tokens, each group's
  /// is copied into the prompt's fresh block and the k tokens count as cached.
  bool enable_partial_reuse = true;
  /// Off: windowed groups keep every block, as full attention does (to measure what freeing saves).
  bool free_outside_window = true;
  std::int32_t watermark_blocks = 0;  ///< blocks can_allocate keeps free for running sequences
  block_hash hash_seed = 0x5bd1e9955bd1e995ULL;
};

/// allocate()'s result. The engine writes the KV of prompt[num_cached_tokens + i] for the layers of
/// group g at slots[g * num_new_tokens() + i].
struct hybrid_allocation {
  std::int32_t num_cached_tokens = 0;
  prefix_lookup lookup{};        ///< why the other prompt tokens missed the cache
  std::int32_t num_groups = 1;
  std::vector<slot_id> slots{};  ///< [num_groups, num_new_tokens], row-major
  /// A partial hit: per group, in group order, the engine copies the whole cached block src into
  /// the sequence's block dst (the group's table entry at num_cached_tokens / block_size) before it
  /// writes the new slots; the last num_partial_tokens of num_cached_tokens come from them. The
  /// manager holds the sources until the sequence's first mark_computed, free, truncate or swap
  /// out. Empty without one.
  std::vector<block_copy> partial_copies{};
  std::int32_t num_partial_tokens = 0;

  [[nodiscard]] std::int32_t num_new_tokens() const noexcept {
    return static_cast<std::int32_t>(slots.size()) / num_groups;
  }
  [[nodiscard]] std::span<const slot_id> group_slots(std::int32_t group) const {
    const auto n = static_cast<std::size_t>(num_new_tokens());
    return std::span<const slot_id>(slots).subspan(static_cast<std::size_t>(group) * n, n);
  }
};

/// See the file comment and docs/design.md ("KV cache groups"). Not thread-safe. Every fallible
/// call checks everything before it changes anything: when it throws pagedkv::error the manager
/// is unchanged.
template <free_list_policy FreeList = lifo_free_list, hash_policy Hash = xxh3_hash,
          eviction_policy Eviction = lru_eviction>
class hybrid_kv_cache_manager {
 public:
  using pool_type = block_pool<FreeList, no_lock>;
  using cache_type = prefix_cache<Hash, Eviction>;
  using options_type = hybrid_kv_cache_options;

  /// Errors: invalid_argument for no group, a bad spec, a block size or capacity out of range, a
  /// watermark out of [0, num_device_blocks].
  explicit hybrid_kv_cache_manager(hybrid_kv_cache_options options)
      : options_(checked(std::move(options))),
        anchor_(anchor_of(options_.groups)),
        store_(pool_type(options_.num_device_blocks), options_.num_host_blocks, options_.block_size, options_.hash_seed),
        group_of_(static_cast<std::size_t>(options_.num_device_blocks), -1) {}

  // ---- queries ----

  [[nodiscard]] const hybrid_kv_cache_options& options() const noexcept { return options_; }
  [[nodiscard]] std::int32_t block_size() const noexcept { return options_.block_size; }
  [[nodiscard]] std::int32_t num_groups() const noexcept { return static_cast<std::int32_t>(options_.groups.size()); }
  [[nodiscard]] const kv_cache_spec& spec(std::int32_t group) const { return options_.groups.at(static_cast<std::size_t>(group)); }
  /// The group whose chain identifies cached prefixes (the file comment).
  [[nodiscard]] std::int32_t anchor_group() const noexcept { return anchor_; }
  [[nodiscard]] bool contains(seq_id seq) const { return sequences_.contains(seq); }
  [[nodiscard]] std::size_t num_sequences() const noexcept { return sequences_.size(); }
  /// Group `group`'s table of `seq`: null_block entries are blocks released outside the window.
  /// Errors: unknown_sequence; invalid_argument for a group out of range.
  [[nodiscard]] const block_table& table(seq_id seq, std::int32_t group) const {
    check_group(group, "table");
    return get(seq, "table").group_tables[static_cast<std::size_t>(group)];
  }
  [[nodiscard]] location where(seq_id seq) const { return get(seq, "where").where; }
  [[nodiscard]] std::span<const token_id> tokens(seq_id seq) const { return get(seq, "tokens").tokens; }
  [[nodiscard]] std::int32_t num_tokens(seq_id seq) const { return static_cast<std::int32_t>(get(seq, "num_tokens").tokens.size()); }
  [[nodiscard]] std::int32_t num_computed_tokens(seq_id seq) const { return get(seq, "num_computed_tokens").num_computed; }
  /// Whether `seq` was allocated with a partial hit whose copies have not run yet (no mark_computed).
  [[nodiscard]] bool has_partial_hit(seq_id seq) const { return !get(seq, "has_partial_hit").partial_sources.empty(); }
  /// The cached blocks a partial hit of `seq` copies from, one per group, which the sequence holds
  /// until those copies ran; empty when there is none.
  [[nodiscard]] std::span<const block_id> partial_sources(seq_id seq) const { return get(seq, "partial_sources").partial_sources; }

  /// Device blocks that allocations may take: free ones plus idle cached ones.
  [[nodiscard]] std::int32_t num_free_blocks() const { return store_.num_free_blocks(); }
  [[nodiscard]] std::int32_t num_free_host_blocks() const { return store_.num_free_host_blocks(); }
  [[nodiscard]] const pool_type& device_pool() const noexcept { return store_.device(); }
  [[nodiscard]] const pool_type& host_pool() const noexcept { return store_.host(); }
  [[nodiscard]] const cache_type& cache() const noexcept { return store_.cache(); }
  [[nodiscard]] cache_type& cache() noexcept { return store_.cache(); }
  /// The group a cached block belongs to. Errors: invalid_block if it is not cached.
  [[nodiscard]] std::int32_t cached_group(block_id id) const {
    if (!cache().contains(id)) detail::fail(errc::invalid_block, "cached_group of block ", id, " which is not cached");
    return group_of_[static_cast<std::size_t>(id)];
  }

  /// Distinct device blocks the tables of `group` hold (what the group's layers occupy).
  [[nodiscard]] std::int32_t num_held_blocks(std::int32_t group) const {
    check_group(group, "num_held_blocks");
    std::vector<bool> seen(static_cast<std::size_t>(store_.device().capacity()), false);
    std::int32_t held = 0;
    for (const auto& [id, s] : sequences_) {
      if (s.where != location::device) continue;
      for (block_id b : s.group_tables[static_cast<std::size_t>(group)].blocks()) {
        if (b != null_block && !seen[static_cast<std::size_t>(b)]) {
          seen[static_cast<std::size_t>(b)] = true;
          ++held;
        }
      }
    }
    return held;
  }

  // ---- admission ----

  /// Device blocks allocate(prompt) would take from num_free_blocks(): new blocks of every group
  /// for the uncached part, plus the idle cached blocks it would hit.
  [[nodiscard]] std::int32_t num_blocks_to_allocate(std::span<const token_id> prompt, const sequence_options& opts = {}) const {
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

  /// The most blocks group `group`'s table of one sequence holds at once (non-null entries) while
  /// the sequence is allocated and computed at most `chunk_tokens` tokens a step (allocate with
  /// max_new_tokens, then append chunk by chunk): a chunk's first query reads W - 1 tokens before
  /// it (C - 1 for a chunk of chunked local attention), so W - 1 + chunk_tokens tokens at any
  /// alignment. No bound (INT32_MAX) for full attention, or for any group with freeing off.
  /// Errors: invalid_argument for a group out of range or chunk_tokens < 1.
  [[nodiscard]] std::int32_t max_window_blocks(std::int32_t group, std::int32_t chunk_tokens) const {
    check_group(group, "max_window_blocks");
    if (chunk_tokens < 1) detail::fail(errc::invalid_argument, "max_window_blocks of chunks of ", chunk_tokens, " tokens");
    const kv_cache_spec& s = spec(group);
    if (s.kind == attention_kind::full || !options_.free_outside_window) return std::numeric_limits<std::int32_t>::max();
    const std::int64_t tokens = std::int64_t{s.window_tokens} - 1 + chunk_tokens;
    return static_cast<std::int32_t>(std::min<std::int64_t>((tokens + block_size() - 2) / block_size() + 1, max_num_blocks));
  }

  /// Device blocks to set aside for `prompt` allocated and computed at most `chunk_tokens` tokens
  /// a step (allocate(seq, prompt, opts, chunk_tokens), then appends of chunk_tokens): what
  /// num_blocks_to_allocate counts, except that a windowed group counts at most
  /// max_window_blocks(group, chunk_tokens), plus one block for each hit of its window that
  /// another sequence holds (sharing it makes that block no longer the other's alone, and a
  /// scheduler that reserves a prefill's blocks counts the other's reservation again), plus a
  /// partial hit's source block in each group, idle or not (held until its copy ran).
  /// Errors: invalid_argument for an empty or absurdly long prompt, or chunk_tokens < 1.
  [[nodiscard]] std::int32_t num_blocks_to_prefill(std::span<const token_id> prompt, std::int32_t chunk_tokens,
                                                   const sequence_options& opts = {}) const {
    detail::check_prompt(prompt, "num_blocks_to_prefill");
    if (chunk_tokens < 1) detail::fail(errc::invalid_argument, "num_blocks_to_prefill in chunks of ", chunk_tokens, " tokens");
    const prefix_plan plan = plan_prefix(prompt, opts);
    const std::int32_t num_new = (static_cast<std::int32_t>(prompt.size()) + block_size() - 1) / block_size() - plan.num_hit_blocks;
    std::int32_t needed = 0;
    for (std::int32_t g = 0; g < num_groups(); ++g) {
      std::int32_t idle = 0;
      std::int32_t active = 0;
      for (std::int32_t j = plan.first_hit_block[static_cast<std::size_t>(g)]; j < plan.num_hit_blocks; ++j) {
        (cache().is_idle(plan.hits[static_cast<std::size_t>(g)][static_cast<std::size_t>(j)].block) ? idle : active) += 1;
      }
      const std::int32_t span = max_window_blocks(g, chunk_tokens);
      needed += span == std::numeric_limits<std::int32_t>::max() ? num_new + idle : std::min(num_new + idle, span) + active;
      needed += plan.partial_sources.empty() ? 0 : 1;  // a partial hit's source, held until the copy ran
    }
    return needed;
  }

  /// Whether allocate(prompt) would succeed and leave watermark_blocks free.
  [[nodiscard]] bool can_allocate(std::span<const token_id> prompt, const sequence_options& opts = {}) const {
    return num_blocks_to_allocate(prompt, opts) + options_.watermark_blocks <= num_free_blocks();
  }

  /// Creates sequence `seq` holding `prompt`: attaches the longest cached prefix every group can
  /// serve (at most all but the last token), whole blocks and then a partial hit (partial_copies),
  /// allocates every group's blocks for the rest, all or nothing. A windowed group's table holds
  /// null_block before its window in the hit.
  /// With `max_new_tokens`, the sequence holds only the hit and the next max_new_tokens prompt
  /// tokens (their slots are the allocation's); the engine appends the rest of the prompt chunk by
  /// chunk, so that a windowed group never holds the whole prompt (num_blocks_to_prefill). The
  /// lookup, the statistics and the hit are the whole prompt's.
  /// Errors: duplicate_sequence; invalid_argument for an empty or absurdly long prompt or
  /// max_new_tokens < 1; out_of_blocks when the blocks are not there.
  hybrid_allocation allocate(seq_id seq, std::span<const token_id> prompt, const sequence_options& opts = {},
                             std::int32_t max_new_tokens = std::numeric_limits<std::int32_t>::max()) {
    if (contains(seq)) detail::fail(errc::duplicate_sequence, "allocate of sequence ", seq, " which already exists");
    detail::check_prompt(prompt, "allocate");
    if (max_new_tokens < 1) detail::fail(errc::invalid_argument, "allocate of sequence ", seq, " with max_new_tokens ", max_new_tokens);
    prefix_plan plan = plan_prefix(prompt, opts);
    const std::int32_t num_hit_tokens = plan.num_hit_blocks * block_size();
    const std::int32_t num_cached_tokens = num_hit_tokens + plan.num_partial_tokens;
    const std::int32_t num_new = std::min(static_cast<std::int32_t>(prompt.size()) - num_cached_tokens, max_new_tokens);
    const std::int32_t needed = (num_cached_tokens + num_new + block_size() - 1) / block_size() * num_groups() -
                                plan.num_hit_blocks * num_groups() + plan.num_idle_hits;
    if (needed > num_free_blocks()) {
      detail::fail(errc::out_of_blocks, "allocate of sequence ", seq, " (", prompt.size(), " tokens, ", num_groups(),
                   " groups) needs ", needed, " blocks, ", num_free_blocks(), " free");
    }
    const std::span<const token_id> held = prompt.first(static_cast<std::size_t>(num_cached_tokens + num_new));
    plan.hashes.resize(std::min(plan.hashes.size(), held.size() / static_cast<std::size_t>(block_size())));
    sequence s{.group_tables = {},
               .tokens = {held.begin(), held.end()},
               .hashes = std::move(plan.hashes),
               .chain = {},
               .salt = std::string(opts.key.cache_salt),
               .adapter_id = opts.key.adapter_id,
               .priority = opts.cache_priority};
    const std::int32_t hit_blocks = plan.num_hit_blocks;
    plan.anchor_chain.resize(static_cast<std::size_t>(hit_blocks));
    s.chain = std::move(plan.anchor_chain);
    // Claim the hits first, so that making room below cannot evict them.
    for (std::int32_t g = 0; g < num_groups(); ++g) {
      block_table& table = s.group_tables.emplace_back(block_size());
      const std::int32_t first = plan.first_hit_block[static_cast<std::size_t>(g)];
      for (std::int32_t j = 0; j < hit_blocks; ++j) {
        const block_id id = j < first ? null_block : plan.hits[static_cast<std::size_t>(g)][static_cast<std::size_t>(j)].block;
        if (id != null_block) store_.claim(id);
        table.push_block(id);
      }
      s.released.push_back(first);
    }
    for (const chain_link& source : plan.partial_sources) {
      store_.claim(source.block);
      s.partial_sources.push_back(source.block);
    }
    s.num_computed = num_cached_tokens;
    hybrid_allocation result{num_cached_tokens, plan.lookup, num_groups(),
                             std::vector<slot_id>(static_cast<std::size_t>(num_new) * s.group_tables.size())};
    for (std::int32_t g = 0; g < num_groups(); ++g) {
      block_table& table = s.group_tables[static_cast<std::size_t>(g)];
      table.extend(num_hit_tokens);
      store_.allocate_device(table.blocks_needed(plan.num_partial_tokens + num_new), last_block(table),
                             [&](block_id id) { table.push_block(id); });
      table.extend(plan.num_partial_tokens);
      table.append(std::span(result.slots).subspan(static_cast<std::size_t>(g) * static_cast<std::size_t>(num_new),
                                                   static_cast<std::size_t>(num_new)));
      if (!s.partial_sources.empty()) {
        result.partial_copies.push_back({s.partial_sources[static_cast<std::size_t>(g)], table.block(hit_blocks)});
      }
    }
    result.num_partial_tokens = plan.num_partial_tokens;
    if (plan.num_partial_tokens > 0) cache().record_partial_hit(plan.num_partial_tokens);
    if (options_.enable_prefix_caching) cache().record_lookup(static_cast<std::int64_t>(prompt.size()), num_hit_tokens);
    miss_totals_ += plan.lookup;
    sequences_.emplace(seq, std::move(s));
    return result;
  }

  /// Device blocks allocate_shared(prompt, num_shared_tokens) takes: every group's blocks of the
  /// prompt past the shared ones.
  [[nodiscard]] std::int32_t num_blocks_to_allocate_shared(std::span<const token_id> prompt,
                                                           std::int32_t num_shared_tokens) const {
    detail::check_prompt(prompt, "num_blocks_to_allocate_shared");
    const std::int32_t blocks = (static_cast<std::int32_t>(prompt.size()) + block_size() - 1) / block_size();
    return (blocks - num_shared_tokens / block_size()) * num_groups();
  }

  /// As kv_cache_manager::allocate_shared (prefix sharing inside a burst), in every group: creates
  /// `seq` holding `prompt`, whose first `num_shared_tokens` (whole blocks) are also the first
  /// tokens of `source` under the same key, sharing source's blocks of every group for them (a
  /// fork at that position, null entries before a window included) whether or not source has
  /// computed them, and allocating every group's blocks for the rest. Its computed tokens are
  /// source's, up to num_shared_tokens: the engine must not compute it before source has computed
  /// them, then mark them computed. Returns num_cached_tokens = num_shared_tokens and the slots of
  /// the rest; counts the lookup with the shared tokens apart.
  /// Errors: duplicate_sequence; unknown_sequence for source; wrong_location if source is swapped
  /// out; invalid_argument for an empty or absurdly long prompt, a count that is not whole blocks in
  /// [block_size, prompt size - 1] and within source, tokens that differ, another key, or a window
  /// of source that released a block the shorter sequence's next query reads (as fork); out_of_blocks.
  hybrid_allocation allocate_shared(seq_id seq, seq_id source, std::int32_t num_shared_tokens,
                                    std::span<const token_id> prompt, const sequence_options& opts = {}) {
    if (contains(seq)) detail::fail(errc::duplicate_sequence, "allocate_shared of sequence ", seq, " which already exists");
    detail::check_prompt(prompt, "allocate_shared");
    const sequence& src = get(source, "allocate_shared");
    if (src.where != location::device) {
      detail::fail(errc::wrong_location, "allocate_shared of sequence ", source, " which is swapped out");
    }
    detail::check_shared(source, src.tokens, src.key(), num_shared_tokens, prompt, opts.key, block_size());
    check_cut(src, source, num_shared_tokens, "allocate_shared");
    const std::int32_t needed = num_blocks_to_allocate_shared(prompt, num_shared_tokens);
    if (needed > num_free_blocks()) {
      detail::fail(errc::out_of_blocks, "allocate_shared of sequence ", seq, " (", prompt.size(), " tokens, ",
                   num_groups(), " groups) needs ", needed, " blocks, ", num_free_blocks(), " free");
    }
    prefix_lookup lookup = store_.shared_lookup(prompt, opts.key, num_shared_tokens, options_.enable_prefix_caching,
                                                [&](chain_link link) { return group_of_[static_cast<std::size_t>(link.block)] == anchor_; });
    fork(source, seq, num_shared_tokens);
    sequence& s = sequences_.at(seq);
    s.priority = opts.cache_priority;
    const std::span<const token_id> rest = prompt.subspan(static_cast<std::size_t>(num_shared_tokens));
    hybrid_allocation result{num_shared_tokens, std::move(lookup), num_groups(),
                             std::vector<slot_id>(rest.size() * s.group_tables.size())};
    for (std::size_t g = 0; g < s.group_tables.size(); ++g) {
      block_table& table = s.group_tables[g];
      store_.allocate_device(table.blocks_needed(static_cast<std::int32_t>(rest.size())), last_block(table),
                             [&](block_id id) { table.push_block(id); });
      table.append(std::span(result.slots).subspan(g * rest.size(), rest.size()));
    }
    s.tokens.insert(s.tokens.end(), rest.begin(), rest.end());
    if (options_.enable_prefix_caching) cache().record_lookup(static_cast<std::int64_t>(prompt.size()), 0);
    cache().record_shared_hit(num_shared_tokens);
    miss_totals_ += result.lookup;
    return result;
  }

  // ---- growth ----

  /// Device blocks append(seq, n tokens) would take, over every group: copy-on-write copies and
  /// new blocks (for a swapped-out sequence: once swapped in).
  [[nodiscard]] std::int32_t num_blocks_to_append(seq_id seq, std::int32_t num_new_tokens) const {
    const sequence& s = get(seq, "num_blocks_to_append");
    std::int32_t needed = 0;
    for (const block_table& table : s.tables()) {
      needed += (store_.needs_copy_on_write(table, s.where) ? 1 : 0) + table.blocks_needed(num_new_tokens);
    }
    return needed;
  }
  [[nodiscard]] bool can_append(seq_id seq, std::int32_t num_new_tokens) const {
    return num_blocks_to_append(seq, num_new_tokens) <= num_free_blocks();
  }

  /// Appends `new_tokens` to `seq` and writes their slots into `slots`, [num_groups(),
  /// new_tokens.size()] row-major. A group whose last block is shared and partly filled first gets
  /// a private copy: the returned pairs say which block the engine copies where, before writing.
  /// Errors: unknown_sequence; wrong_location if swapped out; invalid_argument if slots is not
  /// num_groups() x new_tokens long or new_tokens is empty; out_of_blocks.
  std::vector<block_copy> append(seq_id seq, std::span<const token_id> new_tokens, std::span<slot_id> slots) {
    sequence& s = get(seq, "append");
    if (s.where != location::device) detail::fail(errc::wrong_location, "append of sequence ", seq, " which is swapped out");
    const std::size_t count = new_tokens.size();
    if (count == 0 || slots.size() != count * s.group_tables.size() || s.tokens.size() + count > detail::max_sequence_tokens) {
      detail::fail(errc::invalid_argument, "append of ", count, " tokens with ", slots.size(), " slots (", num_groups(),
                   " groups) to sequence ", seq, " of ", s.tokens.size(), " tokens");
    }
    const std::int32_t needed = num_blocks_to_append(seq, static_cast<std::int32_t>(count));
    if (needed > num_free_blocks()) {
      detail::fail(errc::out_of_blocks, "append of ", count, " tokens to sequence ", seq, " needs ", needed, " blocks, ",
                   num_free_blocks(), " free");
    }
    std::vector<block_copy> copies;
    for (std::size_t g = 0; g < s.group_tables.size(); ++g) {
      block_table& table = s.group_tables[g];
      if (store_.needs_copy_on_write(table, location::device)) {
        const std::int32_t last = table.num_blocks() - 1;
        const block_id src = table.block(last);
        store_.allocate_device(1, src, [&](block_id dst) {
          table.replace_block(last, dst);
          copies.push_back({src, dst});
        });
        store_.release_device(src, s.priority);
      }
      store_.allocate_device(table.blocks_needed(static_cast<std::int32_t>(count)), last_block(table),
                             [&](block_id id) { table.push_block(id); });
      table.append(slots.subspan(g * count, count));
    }
    s.tokens.insert(s.tokens.end(), new_tokens.begin(), new_tokens.end());
    return copies;
  }

  /// Records that the KV of the first `num_tokens` tokens of `seq` is written in every group:
  /// publishes the newly complete blocks to the prefix cache, then releases each windowed group's
  /// blocks that the next query (at position num_computed_tokens) cannot read.
  /// Errors: unknown_sequence; invalid_argument if num_tokens is not in [0, num_tokens(seq)].
  void mark_computed(seq_id seq, std::int32_t num_tokens) {
    sequence& s = get(seq, "mark_computed");
    if (num_tokens < 0 || static_cast<std::size_t>(num_tokens) > s.tokens.size()) {
      detail::fail(errc::invalid_argument, "mark_computed of ", num_tokens, " tokens of sequence ", seq, " which holds ",
                   s.tokens.size());
    }
    s.num_computed = std::max(s.num_computed, num_tokens);
    release_partial_sources(s);  // the step that ran the copies is over
    if (options_.enable_prefix_caching && s.where == location::device) publish(s);
    release_outside_window(s);
  }

  /// Sets the token at `position` of `seq`, one whose KV is not computed yet (as
  /// kv_cache_manager::set_token: an engine that schedules ahead of its sampled tokens).
  /// Errors: unknown_sequence; invalid_argument if position is not in [num_computed_tokens(seq),
  /// num_tokens(seq)).
  void set_token(seq_id seq, std::int32_t position, token_id token) {
    sequence& s = get(seq, "set_token");
    if (position < s.num_computed || static_cast<std::size_t>(position) >= s.tokens.size()) {
      detail::fail(errc::invalid_argument, "set_token at position ", position, " of sequence ", seq, ": only its ",
                   s.tokens.size() - static_cast<std::size_t>(s.num_computed), " uncomputed tokens from position ",
                   s.num_computed, " may change");
    }
    s.tokens[static_cast<std::size_t>(position)] = token;
  }

  /// Calls f(seq_id, std::span<const block_table> tables, location) for every live sequence, in
  /// no particular order: its tables, one per group.
  template <class F>
  void for_each_sequence(F&& f) const {
    for (const auto& [id, s] : sequences_) f(id, s.tables(), s.where);
  }

  // ---- sharing ----

  /// Makes `child` a copy of `parent` sharing every block of every group (allocates nothing).
  /// Errors: unknown_sequence for parent; duplicate_sequence if child exists.
  void fork(seq_id parent, seq_id child) {
    const sequence& p = get(parent, "fork");
    if (contains(child)) detail::fail(errc::duplicate_sequence, "fork onto sequence ", child, " which already exists");
    store_.retain_all(p);
    sequences_.emplace(child, p).first->second.partial_sources.clear();  // the parent's to release
  }

  /// Makes `child` a copy of the first `num_tokens` tokens of `parent`, sharing every group's
  /// blocks up to num_tokens, the partial one included (allocates nothing). Whichever of them next
  /// writes into a shared partial block copies it first (append's copy-on-write). The child's
  /// computed tokens are the parent's, up to num_tokens.
  /// Errors: unknown_sequence for parent; duplicate_sequence if child exists; invalid_argument if
  /// num_tokens is not in [1, num_tokens(parent)], or if a windowed group of the parent has already
  /// released a block the child's next query would read.
  void fork(seq_id parent, seq_id child, std::int32_t num_tokens) {
    const sequence& p = get(parent, "fork");
    if (contains(child)) detail::fail(errc::duplicate_sequence, "fork onto sequence ", child, " which already exists");
    if (num_tokens < 1 || static_cast<std::size_t>(num_tokens) > p.tokens.size()) {
      detail::fail(errc::invalid_argument, "fork of sequence ", parent, " at ", num_tokens, " tokens: it holds ",
                   p.tokens.size());
    }
    check_cut(p, parent, num_tokens, "fork");
    sequence c = p;
    c.partial_sources.clear();  // the parent's to release
    // The dropped blocks were never retained for the child.
    for (block_table& table : c.tables()) table.truncate(num_tokens);
    store_.retain_all(c);
    cut_history(c, num_tokens);
    sequences_.emplace(child, std::move(c));
  }

  /// Frees `seq`: drops its references deepest position first and, at one position, the anchor's
  /// block last, so that LRU eviction takes a chain's tail before the links that verify it. With
  /// partial reuse on, the computed part of its last, partly filled block stays cached in every
  /// group for partial hits (a conversation's next turn continues there).
  /// Errors: unknown_sequence.
  void free(seq_id seq) {
    sequence& s = get(seq, "free");
    release_partial_sources(s);
    cache_tail(s);
    std::int32_t longest = 0;
    for (const block_table& table : s.tables()) longest = std::max(longest, table.num_blocks());
    for (std::int32_t j = longest - 1; j >= 0; --j) {
      for (std::int32_t g = 0; g < num_groups(); ++g) {
        if (g != anchor_) release_entry(s, g, j);
      }
      release_entry(s, anchor_, j);
    }
    sequences_.erase(seq);
  }

  /// Keeps the first `new_num_tokens` tokens of `seq` in every group (drops rejected speculative
  /// tokens) and releases the blocks that no longer hold any.
  /// Errors: unknown_sequence; invalid_argument if not in [1, num_tokens(seq)], or if a windowed
  /// group has already released blocks the shorter sequence's next query would read.
  void truncate(seq_id seq, std::int32_t new_num_tokens) {
    sequence& s = get(seq, "truncate");
    if (new_num_tokens < 1 || static_cast<std::size_t>(new_num_tokens) > s.tokens.size()) {
      detail::fail(errc::invalid_argument, "truncate of sequence ", seq, " to ", new_num_tokens, " tokens: it holds ",
                   s.tokens.size(), " (free() drops all)");
    }
    check_cut(s, seq, new_num_tokens, "truncate");
    release_partial_sources(s);
    for (block_table& table : s.tables()) {
      for (block_id id : table.truncate(new_num_tokens)) {
        if (id != null_block) store_.release(s.where, id, s.priority);
      }
    }
    cut_history(s, new_num_tokens);
    release_outside_window(s);  // the next query moved back: what it cannot read goes now
  }

  // ---- swapping ----

  /// Whether swap_out(group) finds enough host blocks.
  [[nodiscard]] bool can_swap_out(std::span<const seq_id> group) const {
    return store_.distinct_blocks(sequences_, group, location::device, "can_swap_out").size() <=
           static_cast<std::size_t>(num_free_host_blocks());
  }
  /// Moves a group of sequences (e.g. the samples of one request) to host blocks, every KV cache
  /// group's table with them. Each distinct device block is copied once: the returned (device src,
  /// host dst) pairs say which; null entries stay null. Cached blocks stay cached.
  /// Errors: unknown_sequence; wrong_location if one is on the host already; invalid_argument for a
  /// repeated id; out_of_blocks when the host pool is short.
  std::vector<block_copy> swap_out(std::span<const seq_id> group) {
    std::vector<block_copy> copies = store_.swap(sequences_, group, location::host, "swap_out");
    for (seq_id seq : group) release_partial_sources(get(seq, "swap_out"));  // the copies ran, or never will
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

  /// Empties the prefix cache. Running sequences keep their KV.
  void reset_prefix_cache() { store_.reset(); }

  /// As kv_cache_manager::usage(), over every group's tables.
  [[nodiscard]] kv_cache_usage usage() const { return store_.usage(sequences_); }

 private:
  struct sequence {
    std::vector<block_table> group_tables;  // one per group
    std::vector<token_id> tokens{};
    std::vector<block_hash> hashes{};    // the anchor's chained hashes of full blocks, computed lazily
    std::vector<chain_link> chain{};     // the anchor's cached link for each of the first chain.size() blocks
    bool chain_broken = false;           // a collision or an evicted parent: publish no further
    std::int32_t num_computed = 0;
    location where = location::device;
    std::vector<std::int32_t> released{};  // per group: entries [0, released) are null_block
    std::string salt{};
    std::int64_t adapter_id = 0;
    std::int32_t priority = 0;
    std::vector<block_id> partial_sources{};  // a partial hit's cached blocks, per group, held until copied

    [[nodiscard]] prefix_key key() const noexcept { return {adapter_id, salt}; }
    [[nodiscard]] std::span<block_table> tables() noexcept { return group_tables; }
    [[nodiscard]] std::span<const block_table> tables() const noexcept { return group_tables; }
  };

  struct prefix_plan {
    prefix_lookup lookup;
    std::vector<block_hash> hashes;
    std::vector<chain_link> anchor_chain;           // the anchor's verified chain, maybe past the hit
    std::vector<std::vector<chain_link>> hits;      // [group][j]: the verified block, or none
    std::vector<std::int32_t> first_hit_block;      // per group: the hit's entries before it are null
    std::int32_t num_hit_blocks = 0;
    std::vector<chain_link> partial_sources;        // per group, for a planned partial hit
    std::int32_t num_partial_tokens = 0;
    std::int32_t num_new_blocks = 0;
    std::int32_t num_idle_hits = 0;                 // the hit's and the partial hit's idle blocks
  };

  static hybrid_kv_cache_options checked(hybrid_kv_cache_options o) {
    if (o.groups.empty()) detail::fail(errc::invalid_argument, "hybrid_kv_cache_manager needs at least one group");
    for (const kv_cache_spec& spec : o.groups) spec.check();
    if (o.num_device_blocks < 1 || o.num_device_blocks > max_num_blocks) {
      detail::fail(errc::invalid_argument, "num_device_blocks ", o.num_device_blocks, " is not in [1, ", max_num_blocks, "]");
    }
    detail::check_capacities(o.num_device_blocks, o.num_host_blocks, o.watermark_blocks);
    return o;  // the block size is checked by the cache and the tables
  }
  static std::int32_t anchor_of(const std::vector<kv_cache_spec>& groups) {
    const auto full = std::find_if(groups.begin(), groups.end(),
                                   [](const kv_cache_spec& s) { return s.kind == attention_kind::full; });
    return full == groups.end() ? 0 : static_cast<std::int32_t>(full - groups.begin());
  }
  void check_group(std::int32_t group, const char* operation) const {
    if (group < 0 || group >= num_groups()) {
      detail::fail(errc::invalid_argument, operation, " of group ", group, ": groups are 0..", num_groups() - 1);
    }
  }
  [[nodiscard]] const sequence& get(seq_id seq, const char* operation) const {
    return detail::find_sequence(sequences_, seq, operation);
  }
  [[nodiscard]] sequence& get(seq_id seq, const char* operation) { return detail::find_sequence(sequences_, seq, operation); }

  /// The first block of `group` that a sequence whose next query is at `position` still reads (0
  /// when windows are not freed).
  [[nodiscard]] std::int32_t first_needed_block(std::int32_t group, std::int32_t position) const {
    if (!options_.free_outside_window) return 0;
    return spec(group).first_needed_position(position) / block_size();
  }

  /// Group g's hash of position j: the anchor's chained hash mixed with the group index, as 3
  /// bytes: a block's tokens are 4 * block_size bytes, so only a true collision makes a group's
  /// hash another block's (and verification, with the group check, catches that).
  [[nodiscard]] block_hash group_hash(block_hash anchor_hash, std::int32_t group) const {
    if (group == anchor_) return anchor_hash;
    const std::array<std::byte, 3> tag{std::byte{0x9e}, static_cast<std::byte>(group & 0xff), static_cast<std::byte>(group >> 8)};
    return hash_(anchor_hash, tag);
  }

  /// The anchor's verified chain for `prompt`, at most max_blocks long: prefix_cache::match with
  /// the group check at every step (another group's block can verify as the anchor's next one).
  /// Returns why it stopped short of max_blocks.
  miss_reason match_anchor(std::span<const token_id> prompt, const prefix_key& key, std::span<const block_hash> hashes,
                           std::int32_t max_blocks, std::vector<chain_link>& out) const {
    chain_link parent{};
    for (std::int32_t j = 0; j < max_blocks; ++j) {
      const block_hash hash = hashes[static_cast<std::size_t>(j)];
      const std::optional<chain_link> link = cache().find(hash, parent, block_tokens(prompt, j), key);
      if (!link || group_of_[static_cast<std::size_t>(link->block)] != anchor_) return why_not_cached(prompt, key, hash, j);
      out.push_back(parent = *link);
    }
    return miss_reason::partial_block;
  }
  /// Why the anchor's block j of `prompt`, under `hash`, is not there.
  [[nodiscard]] miss_reason why_not_cached(std::span<const token_id> prompt, const prefix_key& key, block_hash hash,
                                           std::int32_t j) const {
    return store_.why_missing(prompt, key, hash, j,
                              [&](chain_link link) { return group_of_[static_cast<std::size_t>(link.block)] == anchor_; });
  }
  [[nodiscard]] std::span<const token_id> block_tokens(std::span<const token_id> tokens, std::int32_t j) const {
    return tokens.subspan(static_cast<std::size_t>(j) * static_cast<std::size_t>(block_size()),
                          static_cast<std::size_t>(block_size()));
  }

  [[nodiscard]] prefix_plan plan_prefix(std::span<const token_id> prompt, const sequence_options& opts) const {
    const prefix_key& key = opts.key;
    prefix_plan plan;
    const auto groups = static_cast<std::size_t>(num_groups());
    plan.hits.resize(groups);
    plan.first_hit_block.assign(groups, 0);
    const auto num_tokens = static_cast<std::int32_t>(prompt.size());
    plan.lookup.num_prompt_tokens = num_tokens;
    if (!options_.enable_prefix_caching) plan.lookup.missed_tokens[static_cast<std::size_t>(miss_reason::caching_off)] = num_tokens;
    if (options_.enable_prefix_caching) {
      cache().extend_hashes(prompt, key, plan.hashes);
      // The last prompt token is always computed: the engine needs its logits.
      const std::int32_t limit = (num_tokens - 1) / block_size();
      const miss_reason stop = match_anchor(prompt, key, plan.hashes, limit, plan.anchor_chain);
      const auto walked = static_cast<std::int32_t>(plan.anchor_chain.size());
      // last_missing[g]: the last position < j where group g has no verified block, or -1.
      std::vector<std::int32_t> last_missing(groups, -1);
      std::vector<std::vector<std::int32_t>> missing_before(groups);  // [g][j]: last_missing after j
      for (std::size_t g = 0; g < groups; ++g) {
        plan.hits[g].resize(static_cast<std::size_t>(walked));
        missing_before[g].resize(static_cast<std::size_t>(walked));
        for (std::int32_t j = 0; j < walked; ++j) {
          const chain_link anchor = plan.anchor_chain[static_cast<std::size_t>(j)];
          std::optional<chain_link> link = anchor;
          if (static_cast<std::int32_t>(g) != anchor_) {
            link = cache().find(group_hash(plan.hashes[static_cast<std::size_t>(j)], static_cast<std::int32_t>(g)), anchor,
                               block_tokens(prompt, j), key);
            if (link && group_of_[static_cast<std::size_t>(link->block)] != static_cast<std::int32_t>(g)) link.reset();
          }
          if (link) {
            plan.hits[g][static_cast<std::size_t>(j)] = *link;
          } else {
            last_missing[g] = j;
          }
          missing_before[g][static_cast<std::size_t>(j)] = last_missing[g];
        }
      }
      // The longest hit k <= walked for which no group misses a block its next query reads.
      for (std::int32_t k = walked; k > 0; --k) {
        bool served = true;
        for (std::size_t g = 0; g < groups && served; ++g) {
          served = missing_before[g][static_cast<std::size_t>(k - 1)] < first_needed_block(static_cast<std::int32_t>(g), k * block_size());
        }
        if (served) {
          plan.num_hit_blocks = k;
          break;
        }
      }
      const std::int32_t num_blocks = (num_tokens + block_size() - 1) / block_size();
      plan.num_new_blocks = (num_blocks - plan.num_hit_blocks) * num_groups();
      plan.lookup.num_hit_tokens = plan.num_hit_blocks * block_size();
      std::vector<chain_link> sources;
      std::int32_t found = 0;
      const std::int32_t served = find_partial(prompt, key, plan, sources, found);
      // Holding idle sources takes blocks from num_free_blocks(): only if they fit, so that a prompt
      // that fits without the partial hit is never refused for it.
      if (served > 0 && options_.enable_partial_reuse && opts.partial_reuse &&
          plan.num_new_blocks + count_idle_hits(plan, served, sources) <= num_free_blocks()) {
        plan.partial_sources = std::move(sources);
        plan.num_partial_tokens = served;
      } else {
        count_idle_hits(plan, 0, {});
      }
      detail::count_misses(plan.lookup, block_size(), num_tokens, plan.num_hit_blocks, walked, limit, stop, found, served,
                           plan.num_partial_tokens > 0);
      return plan;
    }
    const std::int32_t num_blocks = (num_tokens + block_size() - 1) / block_size();
    plan.num_new_blocks = num_blocks * num_groups();
    return plan;
  }

  /// Sets plan.first_hit_block for a hit that ends `partial` tokens past the whole blocks (the
  /// entries each group's next query reads from there) and plan.num_idle_hits for it, with the idle
  /// partial `sources`; returns the latter.
  std::int32_t count_idle_hits(prefix_plan& plan, std::int32_t partial, std::span<const chain_link> sources) const {
    const std::int32_t position = plan.num_hit_blocks * block_size() + partial;
    plan.num_idle_hits = 0;
    for (std::size_t g = 0; g < plan.first_hit_block.size(); ++g) {
      plan.first_hit_block[g] = std::min(first_needed_block(static_cast<std::int32_t>(g), position), plan.num_hit_blocks);
      for (std::int32_t j = plan.first_hit_block[g]; j < plan.num_hit_blocks; ++j) {
        plan.num_idle_hits += cache().is_idle(plan.hits[g][static_cast<std::size_t>(j)].block) ? 1 : 0;
      }
    }
    for (const chain_link& source : sources) plan.num_idle_hits += cache().is_idle(source.block) ? 1 : 0;
    return plan.num_idle_hits;
  }

  /// The partial hit after plan's whole blocks: the anchor's cached block of the next position
  /// that matches the most of the prompt's next tokens (short of its last, which is always
  /// computed), and under it each other group's block of that position (prefix_cache tags every
  /// block with its group). Every group needs its block, as a windowed group's next query reads
  /// the block it continues in, and a block is published whole: what a group copied is its KV.
  /// Returns the tokens every group's block matches, below a block (0 for none); sets `found` to
  /// those the anchor's matches and `sources` to each group's block.
  std::int32_t find_partial(std::span<const token_id> prompt, const prefix_key& key, const prefix_plan& plan,
                            std::vector<chain_link>& sources, std::int32_t& found) const {
    const std::int32_t hit = plan.num_hit_blocks;
    const auto first = static_cast<std::size_t>(hit) * static_cast<std::size_t>(block_size());
    if (first + 1 >= prompt.size()) return 0;
    const std::span<const token_id> rest = prompt.subspan(first, prompt.size() - 1 - first);
    const chain_link parent = hit == 0 ? chain_link{} : plan.anchor_chain[static_cast<std::size_t>(hit - 1)];
    const std::optional<typename cache_type::partial_match> anchor = cache().match_partial(parent, rest, key, anchor_);
    if (!anchor) return 0;
    found = anchor->num_tokens;
    std::int32_t served = std::min(found, block_size() - 1);  // whole blocks are the hit's
    sources.assign(static_cast<std::size_t>(num_groups()), anchor->link);
    for (std::int32_t g = 0; g < num_groups() && served > 0; ++g) {
      if (g == anchor_) continue;
      const std::optional<typename cache_type::partial_match> block = cache().match_partial(anchor->link, rest, key, g);
      served = block ? std::min(served, block->num_tokens) : 0;
      if (block) sources[static_cast<std::size_t>(g)] = block->link;
    }
    return served;
  }

  void release_partial_sources(sequence& s) {
    for (block_id source : s.partial_sources) store_.release_device(source, s.priority);
    s.partial_sources.clear();
  }

  /// Keeps the computed tokens of `s`'s last, partly filled block cached for partial hits in every
  /// group (the file comment) when every full block before them is published.
  void cache_tail(const sequence& s) {
    const std::span<const token_id> tokens =
        detail::freed_tail(s, block_size(), options_.enable_prefix_caching && options_.enable_partial_reuse);
    if (tokens.empty()) return;
    const std::int32_t full_blocks = s.num_computed / block_size();
    const auto block = [&](std::int32_t g) { return s.group_tables[static_cast<std::size_t>(g)].block(full_blocks); };
    const std::optional<chain_link> anchor =
        store_.cache_partial(block(anchor_), full_blocks == 0 ? chain_link{} : s.chain.back(), tokens, s.key(), anchor_);
    if (!anchor) return;
    group_of_[static_cast<std::size_t>(anchor->block)] = anchor_;
    for (std::int32_t g = 0; g < num_groups(); ++g) {
      // Never null: a group's next query reads the block it continues in.
      if (g != anchor_ && store_.cache_partial(block(g), *anchor, tokens, s.key(), g)) {
        group_of_[static_cast<std::size_t>(block(g))] = g;
      }
    }
  }

  /// Refuses to cut `s` to its first `num_tokens` (truncate, fork at a position) when a windowed
  /// group has released a block that the shorter sequence keeps and its next query would read.
  void check_cut(const sequence& s, seq_id seq, std::int32_t num_tokens, const char* operation) const {
    const std::int32_t computed = std::min(s.num_computed, num_tokens);
    const std::int32_t kept = (num_tokens + block_size() - 1) / block_size();
    for (std::int32_t g = 0; g < num_groups(); ++g) {
      if (const std::int32_t need = first_needed_block(g, computed);
          need < std::min(kept, s.released[static_cast<std::size_t>(g)])) {
        detail::fail(errc::invalid_argument, operation, " of sequence ", seq, " at ", num_tokens, " tokens: group ", g,
                     " (", spec(g), ") released block ", need, " which the next query would read");
      }
    }
  }
  /// Cuts a sequence's tokens, computed count, hashes, anchor chain and released counts to its
  /// first `num_tokens` (its tables are cut already).
  void cut_history(sequence& s, std::int32_t num_tokens) const {
    for (std::size_t g = 0; g < s.group_tables.size(); ++g) {
      s.released[g] = std::min(s.released[g], s.group_tables[g].num_blocks());
    }
    detail::cut_history(s, num_tokens, block_size());
  }

  static block_id last_block(const block_table& table) {
    return table.num_blocks() > 0 ? table.block(table.num_blocks() - 1) : null_block;
  }

  void release_entry(const sequence& s, std::int32_t group, std::int32_t j) {
    const block_table& table = s.group_tables[static_cast<std::size_t>(group)];
    if (j < table.num_blocks() && table.block(j) != null_block) store_.release(s.where, table.block(j), s.priority);
  }

  /// Releases each windowed group's blocks wholly before what its next query reads.
  void release_outside_window(sequence& s) {
    for (std::int32_t g = 0; g < num_groups(); ++g) {
      block_table& table = s.group_tables[static_cast<std::size_t>(g)];
      std::int32_t& released = s.released[static_cast<std::size_t>(g)];
      const std::int32_t first = std::min(first_needed_block(g, s.num_computed), table.num_blocks());
      for (; released < first; ++released) {
        if (const block_id id = table.block(released); id != null_block) {
          store_.release(s.where, id, s.priority);
          table.replace_block(released, null_block);
        }
      }
    }
  }

  /// Caches the newly computed full blocks: the anchor's as a chain, every other group's block j
  /// as a child of the anchor's link at j.
  void publish(sequence& s) {
    const std::int32_t full_blocks = s.num_computed / block_size();
    if (s.chain_broken || static_cast<std::int32_t>(s.chain.size()) >= full_blocks) return;
    const std::span<const token_id> computed(s.tokens.data(), static_cast<std::size_t>(full_blocks * block_size()));
    cache().extend_hashes(computed, s.key(), s.hashes);
    for (auto j = static_cast<std::int32_t>(s.chain.size()); j < full_blocks; ++j) {
      const block_hash hash = s.hashes[static_cast<std::size_t>(j)];
      const chain_link parent = j == 0 ? chain_link{} : s.chain.back();
      const std::optional<chain_link> link = insert(s, anchor_, j, hash, parent);
      if (!link) {
        s.chain_broken = true;
        return;
      }
      s.chain.push_back(*link);
      for (std::int32_t g = 0; g < num_groups(); ++g) {
        if (g != anchor_) insert(s, g, j, group_hash(hash, g), *link);
      }
    }
  }
  /// Caches group g's block j of `s`. Nothing if a window released it unpublished (computed while
  /// swapped out, where nothing is published).
  std::optional<chain_link> insert(const sequence& s, std::int32_t g, std::int32_t j, block_hash hash, chain_link parent) {
    const block_id id = s.group_tables[static_cast<std::size_t>(g)].block(j);
    if (id == null_block) return std::nullopt;
    const bool was_cached = cache().contains(id);
    const std::optional<chain_link> link = cache().insert(id, hash, parent, block_tokens(s.tokens, j), s.key(), g);
    if (!link) return std::nullopt;
    if (link->block == id && !was_cached) {
      store_.cached(id, hash);
      group_of_[static_cast<std::size_t>(id)] = g;
    }
    // Two groups' blocks of one position look alike to the cache; only the recorded group tells.
    if (group_of_[static_cast<std::size_t>(link->block)] != g) return std::nullopt;
    return link;
  }

  hybrid_kv_cache_options options_;
  std::int32_t anchor_;
  detail::kv_block_store<FreeList, Hash, Eviction> store_;
  [[no_unique_address]] Hash hash_;
  std::vector<std::int32_t> group_of_;  // per block id: the group it was cached for (valid while cached)
  prefix_lookup miss_totals_;
  std::unordered_map<seq_id, sequence> sequences_;
};

}  // namespace pagedkv
