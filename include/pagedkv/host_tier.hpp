// host_prefix_tier: the second level of the prefix cache, in host memory. A computed block that
// the device cache evicts (or, write-through, every block it stores) is copied to a host block
// keyed by the same chained hash; a later prompt whose prefix continues in the host tier gets its
// blocks copied back into its fresh device blocks before its prefill, in swap_in's form.
//
// Like prefix_cache, the tier deals in block ids: its host block ids index the engine's pinned
// host buffer, as a device block id indexes the device KV pool, and the copies it plans are
// (src, dst) pairs the engine runs with its swap kernels. It listens to the device cache's events
// (observe) and never touches the manager's pools, so a manager works the same with or without it.
//
// Hits are verified exactly, as in the device cache: a host block is used after a prefix only if
// it holds the prompt's tokens and was stored after that very prefix. A block's parent is recorded
// as a link (device block id + generation, or host block id + generation); the tier remembers
// which device links hold the same KV as which host blocks (a device block offloaded to the tier,
// a host block loaded into a device block), so a chain may cross between the tiers. A forgotten
// correspondence costs a hit, never the wrong KV.
//
// Copy order within a step: the offloads (device -> host) first, before anything else writes the
// device blocks the allocations just took from the cache; then swaps; then loads (host -> device);
// then copy-on-write copies; then the forward. After the copies ran, complete() frees the host
// blocks they used for eviction.
#pragma once

#include <pagedkv/error.hpp>
#include <pagedkv/eviction.hpp>
#include <pagedkv/kv_cache_manager.hpp>
#include <pagedkv/prefix_cache.hpp>
#include <pagedkv/types.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace pagedkv {

/// A run of consecutive blocks to copy: src..src+num_blocks-1 to dst..dst+num_blocks-1.
struct copy_run {
  block_id src = null_block;
  block_id dst = null_block;
  std::int32_t num_blocks = 0;
  friend bool operator==(const copy_run&, const copy_run&) = default;
};

/// Merges block copies whose sources and destinations both continue the previous copy's into
/// runs, in src order: one cudaMemcpy (or one kernel row) per run instead of one per block. The
/// copies must not depend on each other's order (distinct destinations, no destination that is
/// also a source), as the copies of one kind in a step do not.
inline std::vector<copy_run> merge_copies(std::span<const block_copy> copies) {
  std::vector<block_copy> sorted(copies.begin(), copies.end());
  std::sort(sorted.begin(), sorted.end(), [](const block_copy& a, const block_copy& b) { return a.src < b.src; });
  std::vector<copy_run> runs;
  for (const block_copy& c : sorted) {
    if (!runs.empty() && runs.back().src + runs.back().num_blocks == c.src &&
        runs.back().dst + runs.back().num_blocks == c.dst) {
      ++runs.back().num_blocks;
    } else {
      runs.push_back({c.src, c.dst, 1});
    }
  }
  return runs;
}

struct host_tier_options {
  std::int32_t num_blocks = 0;  ///< host blocks, >= 1
  std::int32_t block_size = 16;  ///< tokens per block: the device cache's
  /// Copy every block the device cache stores, not only those it evicts: a device eviction then
  /// costs no copy, and a block is in the tier however the device cache loses it (reset included).
  bool write_through = false;
};

/// What a load asks of the engine: copy `copies` (host src, device dst) before the prefill, whose
/// first `num_loaded_tokens` tokens after the device hit are then computed.
struct tier_load {
  std::vector<block_copy> copies{};
  std::int32_t num_loaded_tokens = 0;
};

/// Counters of a tier, since construction.
struct host_tier_stats {
  std::int64_t stored_blocks = 0;    ///< offloads planned
  std::int64_t dropped_blocks = 0;   ///< offers refused: every host block busy, or a hash collision
  std::int64_t evicted_blocks = 0;   ///< host blocks reused for other content
  std::int64_t loaded_blocks = 0;    ///< loads planned
};

template <eviction_policy Eviction = lru_eviction>
class host_prefix_tier {
 public:
  /// Errors: invalid_argument for a capacity or block size out of range.
  explicit host_prefix_tier(const host_tier_options& options)
      : options_(checked(options)),
        entries_(static_cast<std::size_t>(options.num_blocks)),
        tokens_(static_cast<std::size_t>(options.num_blocks) * static_cast<std::size_t>(options.block_size)),
        idle_(options.num_blocks) {
    for (block_id id = options.num_blocks - 1; id >= 0; --id) free_.push_back(id);
  }

  [[nodiscard]] const host_tier_options& options() const noexcept { return options_; }
  [[nodiscard]] std::int32_t capacity() const noexcept { return options_.num_blocks; }
  [[nodiscard]] std::int32_t num_stored_blocks() const noexcept { return num_stored_; }
  [[nodiscard]] std::int32_t num_busy_blocks() const noexcept { return static_cast<std::int32_t>(busy_.size()); }
  [[nodiscard]] const host_tier_stats& stats() const noexcept { return stats_; }
  /// Whether host block `id` holds a stored block. Errors: invalid_block if out of range.
  [[nodiscard]] bool contains(block_id id) const { return entry_at(id, "contains").stored; }
  [[nodiscard]] block_hash hash_of(block_id id) const { return stored_at(id, "hash_of").hash; }
  [[nodiscard]] std::span<const token_id> tokens_of(block_id id) const {
    stored_at(id, "tokens_of");
    return stored_tokens(id);
  }
  /// The host block stored under `hash`, if any.
  [[nodiscard]] std::optional<block_id> find(block_hash hash) const {
    const auto it = by_hash_.find(hash);
    return it == by_hash_.end() ? std::nullopt : std::optional(it->second);
  }

  /// Called when the tier stores a block (block: the host block; hash, parent_hash, tokens and a
  /// root's key as the device cache reported them), drops one (removed) and on clear(), on the
  /// calling thread: a kv_event_recorder with medium "CPU" turns these into vLLM's events.
  void set_event_callback(std::function<void(const cache_event&)> callback) { on_event_ = std::move(callback); }

  // ---- offload ----

  /// Feeds a device cache event to the tier (install with the cache's set_event_callback, chained
  /// with any other listener). A removed block, or with write_through a stored one, is planned for
  /// a copy to a host block unless the tier holds it already; cleared does nothing here (a weight
  /// update clears the tier with clear()).
  void observe(const cache_event& e) {
    if (e.type == cache_event::kind::removed || (e.type == cache_event::kind::stored && options_.write_through)) {
      offer(e);
    }
  }

  /// The planned offloads (device src, host dst) not yet taken. The engine runs them first in the
  /// step, then calls complete().
  [[nodiscard]] std::vector<block_copy> take_offloads() { return std::exchange(offloads_, {}); }
  [[nodiscard]] std::span<const block_copy> pending_offloads() const noexcept { return offloads_; }

  // ---- lookup and load ----

  /// Appends to `out` the host blocks that continue a verified device prefix: `device_chain` are
  /// the device cache's links for the first device_chain.size() blocks of `tokens` (what
  /// prefix_cache::match found), `hashes` the chained hashes of tokens' full blocks. Stops at
  /// `max_blocks` blocks in all (device and host). Returns how many it appended.
  std::int32_t match(std::span<const token_id> tokens, const prefix_key& key, std::span<const block_hash> hashes,
                     std::span<const chain_link> device_chain, std::int32_t max_blocks,
                     std::vector<block_id>& out) const {
    const auto limit = std::min<std::int64_t>(static_cast<std::int64_t>(hashes.size()), max_blocks);
    auto i = static_cast<std::int64_t>(device_chain.size());
    link parent = device_chain.empty() ? link{} : device_link(device_chain.back());
    std::int32_t matched = 0;
    for (; i < limit; ++i, ++matched) {
      const auto it = by_hash_.find(hashes[static_cast<std::size_t>(i)]);
      if (it == by_hash_.end()) break;
      const std::span<const token_id> wanted = tokens.subspan(static_cast<std::size_t>(i * block_size()),
                                                             static_cast<std::size_t>(block_size()));
      if (!holds(it->second, wanted, parent, key)) break;
      parent = host_link(it->second);
      out.push_back(it->second);
    }
    return matched;
  }

  /// Plans the load of the host blocks that continue sequence `seq`'s device hit in `manager`
  /// (call it right after manager.allocate(seq, prompt), before anything is computed): copies
  /// into the sequence's fresh device blocks that follow its cached prefix, and marks the loaded
  /// tokens computed, which publishes them to the device cache. The host blocks stay busy (not
  /// evictable) until complete(). Returns the copies, in table order, and the tokens loaded.
  /// Errors: unknown_sequence; invalid_argument if the sequence has computed tokens past its hit.
  template <class Manager>
  tier_load load(Manager& manager, seq_id seq, const prefix_key& key = {}) {
    const std::span<const token_id> tokens = manager.tokens(seq);
    const std::int32_t computed = manager.num_computed_tokens(seq);
    if (computed % block_size() != 0) {
      detail::fail(errc::invalid_argument, "host tier load of sequence ", seq, ": ", computed,
                   " computed tokens are not its cached prefix");
    }
    std::vector<block_hash> hashes;
    manager.cache().extend_hashes(tokens, key, hashes);
    std::vector<chain_link> device_chain;
    const std::int32_t num_device = computed / block_size();
    manager.cache().match(tokens, key, hashes, num_device, device_chain);
    if (static_cast<std::int32_t>(device_chain.size()) != num_device) {
      detail::fail(errc::invalid_argument, "host tier load of sequence ", seq, ": its first ", num_device,
                   " blocks are not the device cache's");
    }
    const auto last_token_block = (static_cast<std::int32_t>(tokens.size()) - 1) / block_size();
    std::vector<block_id> hits;
    match(tokens, key, hashes, device_chain, last_token_block, hits);
    tier_load result;
    if (hits.empty()) return result;
    for (std::size_t j = 0; j < hits.size(); ++j) {
      const block_id dst = manager.table(seq).block(num_device + static_cast<std::int32_t>(j));
      result.copies.push_back({hits[j], dst});
      make_busy(hits[j]);
    }
    result.num_loaded_tokens = static_cast<std::int32_t>(hits.size()) * block_size();
    stats_.loaded_blocks += static_cast<std::int64_t>(hits.size());
    manager.mark_computed(seq, computed + result.num_loaded_tokens);
    // The device blocks now cached hold the same KV as the host blocks: remember it, so that host
    // blocks stored after them (or after the host blocks) chain across the tiers.
    std::vector<chain_link> published;
    manager.cache().match(tokens, key, hashes, num_device + static_cast<std::int32_t>(hits.size()), published);
    for (std::size_t j = 0; j < hits.size(); ++j) {
      const std::size_t position = static_cast<std::size_t>(num_device) + j;
      if (position < published.size() && published[position].block == result.copies[j].dst) {
        alias(published[position], hits[j]);
      }
    }
    return result;
  }

  /// Says the copies taken so far (offloads and loads) have run: their host blocks may be evicted
  /// again.
  void complete() {
    for (block_id id : busy_) {
      entry& e = entries_[static_cast<std::size_t>(id)];
      e.busy = false;
      if (e.stored) idle_.push(id, 0);
    }
    busy_.clear();
  }

  /// Drops every stored block (after a weight update). Errors: invalid_argument while copies are
  /// pending (complete() first).
  void clear() {
    if (!busy_.empty() || !offloads_.empty()) {
      detail::fail(errc::invalid_argument, "host tier clear with ", busy_.size(), " blocks in copies not completed");
    }
    for (block_id id = 0; id < capacity(); ++id) {
      if (entries_[static_cast<std::size_t>(id)].stored) drop(id);
    }
    if (on_event_) on_event_({.type = cache_event::kind::cleared, .block = null_block, .hash = 0, .parent_hash = {}});
  }

 private:
  /// Where a block's parent KV is: nowhere (a root), a device block, or a host block, each with the
  /// generation that block had, so a reused id never matches.
  struct link {
    enum where_kind : std::uint8_t { none, device, host };
    where_kind where = none;
    block_id block = null_block;
    std::uint32_t generation = 0;
    friend bool operator==(const link&, const link&) = default;
  };
  struct link_hash {
    std::size_t operator()(const link& l) const noexcept {
      return std::hash<std::uint64_t>{}((std::uint64_t{static_cast<std::uint32_t>(l.block)} << 32) ^ l.generation ^
                                        (std::uint64_t{l.where} << 62));
    }
  };
  static constexpr std::size_t max_aliases = 4;  // per host block; a forgotten one costs a hit only

  struct entry {
    bool stored = false;
    bool busy = false;
    std::uint32_t generation = 0;
    block_hash hash = 0;
    link parent{};
    std::int64_t adapter_id = 0;  // root blocks only
    std::string cache_salt{};     // root blocks only
    std::vector<link> aliases{};  // device links known to hold this block's KV
  };

  static const host_tier_options& checked(const host_tier_options& o) {
    if (o.num_blocks < 1 || o.num_blocks > max_num_blocks) {
      detail::fail(errc::invalid_argument, "host tier capacity ", o.num_blocks, " is not in [1, ", max_num_blocks, "]");
    }
    if (o.block_size < 1 || o.block_size > max_block_size) {
      detail::fail(errc::invalid_argument, "host tier block size ", o.block_size, " is not in [1, ", max_block_size, "]");
    }
    return o;
  }
  [[nodiscard]] std::int32_t block_size() const noexcept { return options_.block_size; }
  [[nodiscard]] const entry& entry_at(block_id id, const char* operation) const {
    if (id < 0 || id >= capacity()) {
      detail::fail(errc::invalid_block, "host tier ", operation, " of block ", id, ": ids are 0..", capacity() - 1);
    }
    return entries_[static_cast<std::size_t>(id)];
  }
  const entry& stored_at(block_id id, const char* operation) const {
    const entry& e = entry_at(id, operation);
    if (!e.stored) detail::fail(errc::invalid_block, "host tier ", operation, " of block ", id, " which holds nothing");
    return e;
  }
  [[nodiscard]] std::span<const token_id> stored_tokens(block_id id) const {
    return std::span(tokens_).subspan(static_cast<std::size_t>(id) * static_cast<std::size_t>(block_size()),
                                      static_cast<std::size_t>(block_size()));
  }
  static link device_link(chain_link l) { return {link::device, l.block, l.generation}; }
  [[nodiscard]] link host_link(block_id id) const {
    return {link::host, id, entries_[static_cast<std::size_t>(id)].generation};
  }
  [[nodiscard]] bool current(const link& l) const {
    if (l.where != link::host) return true;
    const entry& e = entries_[static_cast<std::size_t>(l.block)];
    return e.stored && e.generation == l.generation;
  }
  /// The host block a device link is known to hold the KV of.
  [[nodiscard]] std::optional<link> host_alias(const link& device) const {
    const auto it = aliases_.find(device);
    if (it == aliases_.end() || !current(it->second)) return std::nullopt;
    return it->second;
  }
  /// Whether `stored` (a block's recorded parent) and `found` (the verified block before it in a
  /// lookup) hold the same KV.
  [[nodiscard]] bool same_kv(const link& stored, const link& found) const {
    if (stored == found) return stored.where != link::host || current(stored);
    if (stored.where == link::device && found.where == link::host) return host_alias(stored) == found;
    if (stored.where == link::host && found.where == link::device) return current(stored) && host_alias(found) == stored;
    if (stored.where == link::device && found.where == link::device) {
      const std::optional<link> a = host_alias(stored);
      return a && a == host_alias(found);
    }
    return false;
  }
  /// Whether host block `id` holds the KV of `tokens` after the block `parent` (a verified link;
  /// a default one for a root) under `key` (checked for a root only): the verification that makes
  /// a hash collision harmless.
  [[nodiscard]] bool holds(block_id id, std::span<const token_id> tokens, const link& parent, const prefix_key& key) const {
    const entry& e = entries_[static_cast<std::size_t>(id)];
    const std::span<const token_id> held = stored_tokens(id);
    if (!std::equal(held.begin(), held.end(), tokens.begin(), tokens.end())) return false;
    if (!same_kv(e.parent, parent)) return false;
    return e.parent.where != link::none || (e.adapter_id == key.adapter_id && e.cache_salt == key.cache_salt);
  }

  /// Records that device link `d` holds host block `id`'s KV.
  void alias(chain_link d, block_id id) {
    const link device = device_link(d);
    entry& e = entries_[static_cast<std::size_t>(id)];
    if (std::find(e.aliases.begin(), e.aliases.end(), device) != e.aliases.end()) return;
    if (e.aliases.size() == max_aliases) {
      aliases_.erase(e.aliases.front());
      e.aliases.erase(e.aliases.begin());
    }
    e.aliases.push_back(device);
    aliases_[device] = host_link(id);
  }

  void make_busy(block_id id) {
    entry& e = entries_[static_cast<std::size_t>(id)];
    if (e.busy) return;
    if (idle_.contains(id)) idle_.erase(id);
    e.busy = true;
    busy_.push_back(id);
  }

  void offer(const cache_event& e) {
    const chain_link self{e.block, e.generation};
    if (const auto it = by_hash_.find(e.hash); it != by_hash_.end()) {
      // Held already (write-through, or stored before and never evicted): refresh it and remember
      // the device block as its twin, if it is the same KV.
      if (holds(it->second, e.tokens, parent_of(e), e.key)) {
        alias(self, it->second);
        if (idle_.contains(it->second)) {
          idle_.erase(it->second);
          idle_.push(it->second, 0);
        }
      } else {
        ++stats_.dropped_blocks;
      }
      return;
    }
    std::optional<block_id> id;
    if (!free_.empty()) {
      id = free_.back();
      free_.pop_back();
    } else if ((id = idle_.pop())) {
      ++stats_.evicted_blocks;
      drop(*id);
      free_.pop_back();  // drop() returned it
    } else {
      ++stats_.dropped_blocks;
      return;
    }
    entry& slot = entries_[static_cast<std::size_t>(*id)];
    slot.stored = true;
    ++slot.generation;
    slot.hash = e.hash;
    slot.parent = parent_of(e);
    slot.adapter_id = e.parent.block == null_block ? e.key.adapter_id : 0;
    slot.cache_salt = e.parent.block == null_block ? std::string(e.key.cache_salt) : std::string();
    slot.aliases.clear();
    std::copy(e.tokens.begin(), e.tokens.end(),
              tokens_.begin() + static_cast<std::ptrdiff_t>(*id) * block_size());
    by_hash_.emplace(e.hash, *id);
    ++num_stored_;
    ++stats_.stored_blocks;
    alias(self, *id);
    offloads_.push_back({e.block, *id});
    make_busy(*id);  // until the offload has run
    if (on_event_) {
      on_event_({.type = cache_event::kind::stored, .block = *id, .hash = e.hash, .parent_hash = e.parent_hash,
                 .tokens = stored_tokens(*id), .generation = slot.generation, .parent = {}, .key = e.key});
    }
  }

  /// The parent link of a device block's event: its host twin when the tier knows one, else the
  /// device link itself (resolved through the aliases when that device block is offloaded later).
  [[nodiscard]] link parent_of(const cache_event& e) const {
    if (e.parent.block == null_block) return {};
    const link device = device_link(e.parent);
    if (const std::optional<link> twin = host_alias(device)) return *twin;
    return device;
  }

  void drop(block_id id) {
    entry& e = entries_[static_cast<std::size_t>(id)];
    by_hash_.erase(e.hash);
    for (const link& a : e.aliases) aliases_.erase(a);
    e.aliases.clear();
    e.stored = false;
    if (idle_.contains(id)) idle_.erase(id);
    --num_stored_;
    free_.push_back(id);
    if (on_event_) on_event_({.type = cache_event::kind::removed, .block = id, .hash = e.hash, .parent_hash = {}});
  }

  host_tier_options options_;
  std::vector<entry> entries_;
  std::vector<token_id> tokens_;  // [capacity, block_size]
  std::unordered_map<block_hash, block_id> by_hash_;
  std::unordered_map<link, link, link_hash> aliases_;  // device link -> host link
  typename Eviction::queue idle_;                       // stored, not busy
  std::vector<block_id> free_;
  std::vector<block_id> busy_;
  std::vector<block_copy> offloads_;
  std::int32_t num_stored_ = 0;
  host_tier_stats stats_{};
  std::function<void(const cache_event&)> on_event_;
};

}  // namespace pagedkv
