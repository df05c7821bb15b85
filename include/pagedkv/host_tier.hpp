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
//
// A third level (Store, a prefix_store such as file_tier) is optional: with one attached, a host
// block the tier evicts is stored down to it (from the engine's host buffer, before the block is
// reused), and fetch() brings a prompt's blocks that neither the device nor the host holds from
// the store into host blocks, from which load() plans them as any host hit.
#pragma once

#include <pagedkv/error.hpp>
#include <pagedkv/eviction.hpp>
#include <pagedkv/kv_cache_manager.hpp>
#include <pagedkv/prefix_cache.hpp>
#include <pagedkv/prefix_store.hpp>
#include <pagedkv/types.hpp>

#include <algorithm>
#include <cstddef>
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
  std::int64_t dropped_blocks = 0;   ///< offers refused: every host block busy, or the hash held busy
  std::int64_t evicted_blocks = 0;   ///< host blocks reused for other content
  std::int64_t loaded_blocks = 0;    ///< loads planned
  std::int64_t stored_down_blocks = 0;  ///< evicted blocks handed to the store
  std::int64_t unstorable_blocks = 0;   ///< evicted blocks whose prefix the tier no longer knows
  std::int64_t fetched_blocks = 0;      ///< blocks the store loaded into host blocks
  std::int64_t failed_fetches = 0;      ///< store loads that completed as misses
  std::int64_t replaced_blocks = 0;     ///< held blocks that no longer verified, replaced by the device's
  friend bool operator==(const host_tier_stats&, const host_tier_stats&) = default;
};

template <eviction_policy Eviction = lru_eviction, prefix_store Store = no_prefix_store>
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
  /// Host blocks the store is loading into.
  [[nodiscard]] std::int32_t num_fetching_blocks() const noexcept { return static_cast<std::int32_t>(fetches_.size()); }
  [[nodiscard]] const host_tier_stats& stats() const noexcept { return stats_; }
  /// Whether host block `id` holds a stored block. Errors: invalid_block if out of range.
  [[nodiscard]] bool contains(block_id id) const { return entry_at(id, "contains").stored; }
  [[nodiscard]] block_hash hash_of(block_id id) const { return stored_at(id, "hash_of").hash; }
  [[nodiscard]] std::span<const token_id> tokens_of(block_id id) const {
    stored_at(id, "tokens_of");
    return stored_tokens(id);
  }
  /// The eviction policy's queue of idle stored blocks, for its own settings (ttl_eviction's
  /// set_ttl and clock, as prefix_cache::eviction_queue).
  [[nodiscard]] typename Eviction::queue& eviction_queue() noexcept { return idle_; }

  /// The host block stored under `hash`, if any.
  [[nodiscard]] std::optional<block_id> find(block_hash hash) const {
    const auto it = by_hash_.find(hash);
    return it == by_hash_.end() ? std::nullopt : std::optional(it->second);
  }

  /// Called when the tier stores a block (block: the host block; hash, parent_hash, tokens and a
  /// root's key as the device cache reported them), drops one (removed) and on clear(), on the
  /// calling thread: a kv_event_recorder with medium "CPU" turns these into vLLM's events.
  void set_event_callback(std::function<void(const cache_event&)> callback) { on_event_ = std::move(callback); }

  // ---- the third level ----

  /// Puts `store` under the tier. `host_kv` is the engine's host buffer that the tier's block ids
  /// index: capacity() blocks of equal size, the bytes the store keeps and loads. Both must outlive
  /// the tier or a detach_store().
  /// Errors: invalid_argument if host_kv is empty or not capacity() blocks long, or while fetches
  /// are in flight.
  void attach_store(Store& store, std::span<std::byte> host_kv) {
    if (host_kv.empty() || host_kv.size() % static_cast<std::size_t>(capacity()) != 0) {
      detail::fail(errc::invalid_argument, "host tier store buffer of ", host_kv.size(), " bytes is not ",
                   capacity(), " equal blocks");
    }
    if (!fetches_.empty()) {
      detail::fail(errc::invalid_argument, "host tier attach_store with ", fetches_.size(), " fetches in flight");
    }
    store_ = &store;
    host_kv_ = host_kv;
    block_bytes_ = host_kv.size() / static_cast<std::size_t>(capacity());
  }
  /// Errors: invalid_argument while fetches are in flight.
  void detach_store() {
    if (!fetches_.empty()) {
      detail::fail(errc::invalid_argument, "host tier detach_store with ", fetches_.size(), " fetches in flight");
    }
    store_ = nullptr;
    host_kv_ = {};
  }

  /// Starts loading from the store the blocks of `tokens` under `key` that continue the longest
  /// prefix the device cache (`cache`) and the tier hold, up to the block before the last token's
  /// (as load() stops), into host blocks it frees or evicts; then polls. Returns how many of those
  /// blocks are still in flight: 0 means load() now finds every block the store had. A scheduler
  /// keeps the request waiting until it is 0. Blocks already in flight are not fetched again. The
  /// host hits the fetched blocks continue are busy until complete(), as fetched blocks are.
  template <class Cache>
  std::int32_t fetch(const Cache& cache, std::span<const token_id> tokens, const prefix_key& key) {
    if (store_ == nullptr || tokens.empty()) return 0;
    poll();
    std::vector<block_hash> hashes;
    cache.extend_hashes(tokens, key, hashes);
    const auto limit = std::min((static_cast<std::int32_t>(tokens.size()) - 1) / block_size(),
                                static_cast<std::int32_t>(hashes.size()));
    std::vector<chain_link> device_chain;
    cache.match(tokens, key, hashes, limit, device_chain);
    std::vector<block_id> hits;
    match(tokens, key, hashes, device_chain, limit, hits);
    const auto first = static_cast<std::int32_t>(device_chain.size() + hits.size());
    if (first >= limit) return 0;
    std::vector<store_key> keys;
    prefix_digest digest = root_digest(key);
    for (std::int32_t i = 0; i < limit; ++i) {
      digest = chain_digest(digest, block_tokens(tokens, i));
      if (i >= first) keys.push_back({hashes[static_cast<std::size_t>(i)], digest});
    }
    link parent = !hits.empty()           ? host_link(hits.back())
                  : device_chain.empty() ? link{}
                                          : device_link(device_chain.back());
    std::vector<block_id> started;
    std::size_t j = 0;
    // Blocks of this chain in flight already (an earlier call for this prompt, or another's).
    for (; j < keys.size(); ++j) {
      const auto it = fetching_.find(keys[j].hash);
      if (it == fetching_.end() || entries_[static_cast<std::size_t>(it->second)].digest != keys[j].digest) break;
      parent = {link::host, it->second, entries_[static_cast<std::size_t>(it->second)].generation};
      started.push_back(it->second);
    }
    const std::size_t available =
        j + static_cast<std::size_t>(store_->lookup(std::span(keys).subspan(j)));
    // The host hits the fetched blocks continue must not be evicted for them, nor before load().
    if (j < available) {
      for (block_id id : hits) make_busy(id);
    }
    for (; j < available && !by_hash_.contains(keys[j].hash) && !fetching_.contains(keys[j].hash); ++j) {
      const std::optional<block_id> id = take_block();
      if (!id) break;  // every host block busy
      const auto position = static_cast<std::int32_t>(first) + static_cast<std::int32_t>(j);
      entry& slot = entries_[static_cast<std::size_t>(*id)];
      fill(slot, *id, keys[j].hash, parent, key, block_tokens(tokens, position));
      slot.busy = true;
      slot.digest = keys[j].digest;
      slot.has_digest = true;
      const std::optional<block_hash> parent_hash =
          position == 0 ? std::nullopt : std::optional(hashes[static_cast<std::size_t>(position) - 1]);
      const store_ticket ticket = store_->load(keys[j], block_bytes(*id));
      fetches_.emplace(ticket, fetch_record{*id, parent_hash});
      fetching_.emplace(keys[j].hash, *id);
      parent = host_link(*id);
      started.push_back(*id);
    }
    poll();
    return static_cast<std::int32_t>(std::count_if(started.begin(), started.end(), [&](block_id id) {
      return entries_[static_cast<std::size_t>(id)].busy && !entries_[static_cast<std::size_t>(id)].stored;
    }));
  }

  /// Takes the store's completed loads: a block loaded intact is stored in the tier, busy until
  /// the next complete() so that the admission waiting for it loads it before anything evicts it;
  /// a miss frees its host block.
  void poll() {
    if (store_ == nullptr || fetches_.empty()) return;
    completions_.clear();
    store_->poll(completions_);
    for (const store_completion& c : completions_) {
      const auto it = fetches_.find(c.ticket);
      if (it == fetches_.end()) continue;
      const fetch_record record = std::move(it->second);
      fetches_.erase(it);
      entry& e = entries_[static_cast<std::size_t>(record.block)];
      fetching_.erase(e.hash);
      e.busy = false;  // fetching; make_busy below puts it with the copies' blocks
      // A block whose parent's fetch missed, or whose hash another block took meanwhile, is
      // unreachable: free it.
      if (!c.ok || !current(e.parent) || by_hash_.contains(e.hash)) {
        ++stats_.failed_fetches;
        free_.push_back(record.block);
        continue;
      }
      e.stored = true;
      by_hash_.emplace(e.hash, record.block);
      ++num_stored_;
      ++stats_.fetched_blocks;
      make_busy(record.block);  // until complete(): the admission that fetched it loads it first
      if (on_event_) {
        on_event_({.type = cache_event::kind::stored, .block = record.block, .hash = e.hash,
                   .parent_hash = record.parent_hash, .tokens = stored_tokens(record.block),
                   .generation = e.generation, .parent = {},
                   .key = {e.adapter_id, e.cache_salt}});
      }
    }
  }

  // ---- offload ----

  /// Feeds a device cache event to the tier (install with the cache's set_event_callback, chained
  /// with any other listener). A removed block, or with write_through a stored one, is planned for
  /// a copy to a host block unless the tier holds it already; cleared does nothing here (a weight
  /// update clears the tier with clear()).
  void observe(const cache_event& e) {
    if (e.type == cache_event::kind::removed || (e.type == cache_event::kind::stored && options_.write_through)) {
      offer(e);
    } else if (e.type == cache_event::kind::stored) {
      remember_twin(e);
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
  /// A partial hit on the device (kv_cache_options::enable_partial_reuse) ends the prefix there:
  /// its block is being copied, so the tier loads nothing after it.
  /// Errors: unknown_sequence; invalid_argument if the sequence has computed tokens past its hit.
  template <class Manager>
  tier_load load(Manager& manager, seq_id seq, const prefix_key& key = {}) {
    const std::span<const token_id> tokens = manager.tokens(seq);
    const std::int32_t computed = manager.num_computed_tokens(seq);
    if constexpr (requires { manager.has_partial_hit(seq); }) {
      if (manager.has_partial_hit(seq)) return {};
    }
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
      if (e.stored) make_idle(id);
    }
    busy_.clear();
  }

  /// Drops every stored block (after a weight update). Errors: invalid_argument while copies are
  /// pending (complete() first).
  void clear() {
    if (!busy_.empty() || !offloads_.empty() || !fetches_.empty()) {
      detail::fail(errc::invalid_argument, "host tier clear with ", offloads_.size(), " offloads not taken, ",
                   busy_.size(), " blocks in copies not completed and ", fetches_.size(), " fetches in flight");
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
    bool has_digest = false;      // digest is the whole prefix's (prefix_store.hpp), once known
    prefix_digest digest{};
  };
  struct fetch_record {
    block_id block = null_block;
    std::optional<block_hash> parent_hash{};
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
          make_idle(it->second);
        }
        return;
      }
      // The same hash whose parent no longer verifies (the tier forgot which device block held its
      // parent's KV): kept, it would refuse this block, which verifies, for as long as it stays.
      // The device's block replaces it, unless a copy is using it.
      if (entries_[static_cast<std::size_t>(it->second)].busy) {
        ++stats_.dropped_blocks;
        return;
      }
      ++stats_.replaced_blocks;
      drop(it->second);
    }
    const std::optional<block_id> id = take_block();
    if (!id) {
      ++stats_.dropped_blocks;
      return;
    }
    entry& slot = entries_[static_cast<std::size_t>(*id)];
    fill(slot, *id, e.hash, parent_of(e), e.key, e.tokens);
    slot.stored = true;
    by_hash_.emplace(e.hash, *id);
    if (store_ != nullptr) digest_of(*id);  // while its parent is surely in reach
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

  /// A block the device cache stored (computed, or loaded from the tier) whose content the tier
  /// holds: remembers that the device block holds that KV, so that blocks stored after either one
  /// verify after the other (a hot system prompt recomputed on the device, never evicted again,
  /// would otherwise hide every host block stored after its earlier copy). Copies nothing.
  void remember_twin(const cache_event& e) {
    const auto it = by_hash_.find(e.hash);
    if (it != by_hash_.end() && holds(it->second, e.tokens, parent_of(e), e.key)) alias({e.block, e.generation}, it->second);
  }

  /// The parent link of a device block's event: its host twin when the tier knows one, else the
  /// device link itself (resolved through the aliases when that device block is offloaded later).
  [[nodiscard]] link parent_of(const cache_event& e) const {
    if (e.parent.block == null_block) return {};
    const link device = device_link(e.parent);
    if (const std::optional<link> twin = host_alias(device)) return *twin;
    return device;
  }

  /// A host block for new content: a free one, or the least valuable idle one, evicted (and
  /// stored down first, when a store is attached). Nothing when every block is busy.
  std::optional<block_id> take_block() {
    if (free_.empty()) {
      const std::optional<block_id> victim = idle_.pop();
      if (!victim) return std::nullopt;
      ++stats_.evicted_blocks;
      store_down(*victim);
      drop(*victim);  // returns it to free_
    }
    const block_id id = free_.back();
    free_.pop_back();
    return id;
  }

  /// Gives host block `id` new content (not yet stored: the caller stores or fetches it).
  void fill(entry& slot, block_id id, block_hash hash, const link& parent, const prefix_key& key,
            std::span<const token_id> tokens) {
    ++slot.generation;
    slot.hash = hash;
    slot.parent = parent;
    const bool root = parent.where == link::none;
    slot.adapter_id = root ? key.adapter_id : 0;
    slot.cache_salt = root ? std::string(key.cache_salt) : std::string();
    slot.aliases.clear();
    slot.has_digest = false;
    std::copy(tokens.begin(), tokens.end(), tokens_.begin() + static_cast<std::ptrdiff_t>(id) * block_size());
  }

  [[nodiscard]] std::span<std::byte> block_bytes(block_id id) const {
    return host_kv_.subspan(static_cast<std::size_t>(id) * block_bytes_, block_bytes_);
  }
  [[nodiscard]] std::span<const token_id> block_tokens(std::span<const token_id> tokens, std::int32_t i) const {
    return tokens.subspan(static_cast<std::size_t>(i) * static_cast<std::size_t>(block_size()),
                          static_cast<std::size_t>(block_size()));
  }

  /// The digest of stored block `id`'s whole prefix, found by walking its parents through the tier
  /// (host links, and device links through their host twins) and remembered along the way; nothing
  /// when a parent's KV is no longer in the tier.
  std::optional<prefix_digest> digest_of(block_id id) {
    std::vector<block_id> walked;  // deepest first
    prefix_digest digest{};
    for (block_id at = id;;) {
      const entry& e = entries_[static_cast<std::size_t>(at)];
      if (e.has_digest) {
        digest = e.digest;
        break;
      }
      walked.push_back(at);
      if (e.parent.where == link::none) {
        digest = root_digest({e.adapter_id, e.cache_salt});
        break;
      }
      const std::optional<link> parent =
          e.parent.where == link::host ? (current(e.parent) ? std::optional(e.parent) : std::nullopt)
                                       : host_alias(e.parent);
      if (!parent || walked.size() > static_cast<std::size_t>(capacity())) return std::nullopt;
      at = parent->block;
    }
    for (auto it = walked.rbegin(); it != walked.rend(); ++it) {
      entry& e = entries_[static_cast<std::size_t>(*it)];
      digest = chain_digest(digest, stored_tokens(*it));
      e.digest = digest;
      e.has_digest = true;
    }
    return digest;
  }

  /// Hands evicted block `id`'s bytes to the store, while they are still in the host buffer.
  void store_down(block_id id) {
    if (store_ == nullptr) return;
    const std::optional<prefix_digest> digest = digest_of(id);
    if (!digest) {
      ++stats_.unstorable_blocks;
      return;
    }
    store_->store({entries_[static_cast<std::size_t>(id)].hash, *digest}, block_bytes(id));
    ++stats_.stored_down_blocks;
  }

  /// Queues a stored block for eviction, with its hash for a policy that keys by content
  /// (tinylfu_eviction, ttl_eviction over it), as prefix_cache does.
  void make_idle(block_id id) {
    if constexpr (requires { idle_.push(id, 0, block_hash{}); }) {
      idle_.push(id, 0, entries_[static_cast<std::size_t>(id)].hash);
    } else {
      idle_.push(id, 0);
    }
  }

  void drop(block_id id) {
    entry& e = entries_[static_cast<std::size_t>(id)];
    if constexpr (requires { idle_.forget(id); }) idle_.forget(id);
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
  Store* store_ = nullptr;
  std::span<std::byte> host_kv_{};  // the engine's host buffer, [capacity, block_bytes_]
  std::size_t block_bytes_ = 0;
  std::unordered_map<store_ticket, fetch_record> fetches_;  // loads in flight
  std::unordered_map<block_hash, block_id> fetching_;       // their blocks, by hash
  std::vector<store_completion> completions_;               // scratch of poll()
};

}  // namespace pagedkv
