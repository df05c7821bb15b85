// prefix_cache: finds blocks whose KV another sequence already computed for the same prefix.
//
// A full block's hash is chained to its parent's: hash_i = Hash(hash_{i-1}, tokens of block i),
// and the root's parent is a hash of the seed and the request's prefix_key (adapter, cache salt),
// so equal blocks after different prefixes, adapters or tenants never match. Hashes only find
// candidates: every hit is verified against the stored tokens, the stored parent and the stored
// key, so a hash collision can cost a hit but never hand back the wrong KV.
//
// The cache deals in block ids. It does not touch a pool; its owner (kv_cache_manager) holds one
// pool reference for each cached block, marks a block idle when that hold is its last reference,
// and releases the hold of each block evict() or clear() returns.
#pragma once

#include <pagedkv/error.hpp>
#include <pagedkv/eviction.hpp>
#include <pagedkv/hash.hpp>
#include <pagedkv/types.hpp>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace pagedkv {

namespace detail {

/// A multimap from a 64-bit key to block ids, each id at most once, in arrays sized at
/// construction: a bucket per block (a power of two), chained through the blocks. No allocation
/// after construction, so it does not scatter the prefix cache's other nodes.
class block_index {
 public:
  explicit block_index(std::int32_t num_blocks)
      : mask_(std::bit_ceil(static_cast<std::size_t>(std::max(num_blocks, 1))) - 1),
        heads_(mask_ + 1, null_block),
        next_(static_cast<std::size_t>(num_blocks), null_block),
        keys_(static_cast<std::size_t>(num_blocks), 0) {}

  /// The first block of `key`'s bucket (null_block if none); next() walks the rest, key() tells
  /// which belong to `key`.
  [[nodiscard]] block_id head(std::uint64_t key) const noexcept { return heads_[key & mask_]; }
  [[nodiscard]] block_id next(block_id id) const noexcept { return next_[static_cast<std::size_t>(id)]; }
  [[nodiscard]] std::uint64_t key(block_id id) const noexcept { return keys_[static_cast<std::size_t>(id)]; }

  void insert(block_id id, std::uint64_t key) noexcept {
    keys_[static_cast<std::size_t>(id)] = key;
    next_[static_cast<std::size_t>(id)] = std::exchange(heads_[key & mask_], id);
  }
  /// Removes `id`, which must be in the index.
  void erase(block_id id) noexcept {
    block_id* link = &heads_[keys_[static_cast<std::size_t>(id)] & mask_];
    while (*link != id) link = &next_[static_cast<std::size_t>(*link)];
    *link = next_[static_cast<std::size_t>(id)];
  }
  void clear() noexcept { std::fill(heads_.begin(), heads_.end(), null_block); }

 private:
  std::size_t mask_;
  std::vector<block_id> heads_;
  std::vector<block_id> next_;
  std::vector<std::uint64_t> keys_;
};

}  // namespace detail

/// Extra keys mixed into the root block's hash and checked on every hit.
struct prefix_key {
  std::int64_t adapter_id = 0;       ///< LoRA adapter, 0 for the base model
  std::string_view cache_salt = {};  ///< per-tenant salt: tenants with different salts share nothing
};

/// A verified position in a chain: a cached block and the generation it had when it was stored.
/// A block id that was evicted and cached again gets a new generation, so a stale link never
/// matches the block's new content.
struct chain_link {
  block_id block = null_block;
  std::uint32_t generation = 0;
  friend bool operator==(const chain_link&, const chain_link&) = default;
};

/// What the cache reports to an engine that publishes KV events (e.g. to a cache-aware router).
struct cache_event {
  enum class kind { stored, removed, cleared };
  kind type = kind::stored;
  block_id block = null_block;           ///< stored, removed
  block_hash hash = 0;                   ///< stored, removed
  std::optional<block_hash> parent_hash;  ///< stored, removed: the parent's hash, none for a root block
  std::span<const token_id> tokens{};    ///< stored, removed: the block's tokens, valid during the callback
  std::uint32_t generation = 0;           ///< stored, removed: with `block`, the block's chain_link
  chain_link parent{};                    ///< stored, removed: the parent's link, a default one for a root
  prefix_key key{};                       ///< stored, removed: a root block's key (salt valid during the callback)
};

template <hash_policy Hash = xxh3_hash, eviction_policy Eviction = lru_eviction>
class prefix_cache {
 public:
  using hash_type = Hash;
  using eviction_type = Eviction;
  static constexpr block_hash default_seed = 0x5bd1e9955bd1e995ULL;

  /// Errors: invalid_argument if num_blocks or block_size is out of range.
  prefix_cache(std::int32_t num_blocks, std::int32_t block_size, block_hash seed = default_seed)
      : block_size_(checked(block_size, max_block_size, "block size")),
        seed_(seed),
        entries_(static_cast<std::size_t>(checked(num_blocks, max_num_blocks, "capacity"))),
        tokens_(static_cast<std::size_t>(num_blocks) * static_cast<std::size_t>(block_size)),
        children_(num_blocks),
        idle_(num_blocks) {
    by_hash_.reserve(static_cast<std::size_t>(num_blocks));
  }

  [[nodiscard]] std::int32_t block_size() const noexcept { return block_size_; }
  [[nodiscard]] std::int32_t capacity() const noexcept { return static_cast<std::int32_t>(entries_.size()); }

  // ---- hashing ----

  [[nodiscard]] block_hash root_hash(const prefix_key& key) const noexcept {
    block_hash h = hash_(seed_, std::as_bytes(std::span(&key.adapter_id, 1)));
    if (!key.cache_salt.empty()) h = hash_(h, std::as_bytes(std::span(key.cache_salt)));
    return h;
  }
  [[nodiscard]] block_hash hash_block(block_hash parent, std::span<const token_id> tokens) const noexcept {
    return hash_(parent, std::as_bytes(tokens));
  }
  /// Appends to `hashes` (the chained hashes of the first hashes.size() full blocks of `tokens`)
  /// the hashes of the remaining full blocks. Call it as tokens grow; each block is hashed once.
  void extend_hashes(std::span<const token_id> tokens, const prefix_key& key,
                     std::vector<block_hash>& hashes) const {
    const std::size_t full_blocks = tokens.size() / static_cast<std::size_t>(block_size_);
    block_hash parent = hashes.empty() ? root_hash(key) : hashes.back();
    for (std::size_t i = hashes.size(); i < full_blocks; ++i) {
      parent = hash_block(parent, tokens.subspan(i * static_cast<std::size_t>(block_size_),
                                                 static_cast<std::size_t>(block_size_)));
      hashes.push_back(parent);
    }
  }

  // ---- lookup and insertion ----

  /// Appends to `out` the links of the longest verified cached prefix of `tokens`, at most
  /// `max_blocks` blocks, and returns how many it appended. `hashes` are the chained hashes of
  /// tokens' full blocks (extend_hashes). Counts nothing: see record_lookup().
  std::int32_t match(std::span<const token_id> tokens, const prefix_key& key,
                     std::span<const block_hash> hashes, std::int32_t max_blocks,
                     std::vector<chain_link>& out) const {
    const auto limit = std::min<std::int64_t>(
        {static_cast<std::int64_t>(hashes.size()), max_blocks,
         static_cast<std::int64_t>(tokens.size()) / block_size_});
    chain_link parent{};
    std::int32_t matched = 0;
    for (; matched < limit; ++matched) {
      const auto it = by_hash_.find(hashes[static_cast<std::size_t>(matched)]);
      if (it == by_hash_.end()) break;
      const entry& e = entries_[static_cast<std::size_t>(it->second)];
      if (!holds(e, parent, block_tokens(tokens, matched), key)) break;
      parent = {it->second, e.generation};
      out.push_back(parent);
    }
    return matched;
  }

  /// The link of the block cached under `hash` that verifies as holding `tokens` (one block) after
  /// `parent` under `key`, as one step of match(); nothing if there is none. Counts nothing.
  [[nodiscard]] std::optional<chain_link> find(block_hash hash, chain_link parent, std::span<const token_id> tokens,
                                               const prefix_key& key) const {
    const auto it = by_hash_.find(hash);
    if (it == by_hash_.end()) return std::nullopt;
    const entry& e = entries_[static_cast<std::size_t>(it->second)];
    if (!holds(e, parent, tokens, key)) return std::nullopt;
    return chain_link{it->second, e.generation};
  }

  /// A partial hit: among the cached blocks stored after `parent` (a default link for the first
  /// block) under `key`, the one whose first tokens match the most of `tokens` (the prompt from
  /// that position on, at most one block), with how many match; nothing if none matches a token.
  /// Only blocks stored under the same `tag` count (hybrid_kv_cache_manager: the KV cache group).
  /// The children index finds the candidates, those after this parent that start with tokens[0],
  /// without a scan of the cache. Counts nothing.
  struct partial_match {
    chain_link link{};
    std::int32_t num_tokens = 0;
  };
  [[nodiscard]] std::optional<partial_match> match_partial(chain_link parent, std::span<const token_id> tokens,
                                                           const prefix_key& key, std::int32_t tag = 0) const {
    if (tokens.empty() || (parent.block != null_block && !is_current(parent))) return std::nullopt;
    tokens = tokens.first(std::min(tokens.size(), static_cast<std::size_t>(block_size_)));
    std::optional<partial_match> best;
    const block_hash wanted = child_key(parent, key, tokens.front(), tag);
    for (block_id id = children_.head(wanted); id != null_block; id = children_.next(id)) {
      if (children_.key(id) != wanted) continue;  // another key in the same bucket
      const entry& e = entries_[static_cast<std::size_t>(id)];
      if (e.parent != parent || e.tag != tag || (parent.block == null_block && (e.adapter_id != key.adapter_id || e.cache_salt != key.cache_salt))) {
        continue;  // a stale or colliding index entry
      }
      const std::span<const token_id> stored = stored_tokens(id).first(static_cast<std::size_t>(e.num_tokens));
      const auto matched = static_cast<std::int32_t>(
          std::mismatch(tokens.begin(), tokens.end(), stored.begin(), stored.end()).first - tokens.begin());
      if (!best || matched > best->num_tokens) best = partial_match{{id, e.generation}, matched};
    }
    return best;
  }

  /// The block cached under `hash`, unverified (to tell a collision from a miss); nothing if none.
  [[nodiscard]] std::optional<block_id> block_of(block_hash hash) const {
    const auto it = by_hash_.find(hash);
    if (it == by_hash_.end()) return std::nullopt;
    return it->second;
  }

  /// Publishes block `id`, whose KV holds `tokens` (one full block) after the chain position
  /// `parent` (a default link for the first block), under `hash`. Returns the link that now
  /// stands for this position: id's own, or that of an identical block cached earlier. Returns
  /// nothing, caching nothing, when the parent link is stale (its block was evicted) or another
  /// block already holds `hash` with different content (a collision).
  /// Inserting a block that is already cached at this very position (a forked sequence sharing
  /// it) returns its link; already cached elsewhere returns nothing. `tag` is the block's for
  /// match_partial (a KV cache group; 0 for one group).
  /// Errors: invalid_block if id is out of range; invalid_argument if tokens is not one block long.
  std::optional<chain_link> insert(block_id id, block_hash hash, chain_link parent,
                                   std::span<const token_id> tokens, const prefix_key& key, std::int32_t tag = 0) {
    check_id(id, "insert");
    if (const entry& e = entries_[static_cast<std::size_t>(id)]; e.cached) {
      if (e.num_tokens != block_size_ || e.hash != hash || !holds(e, parent, tokens, key)) return std::nullopt;
      return chain_link{id, e.generation};
    }
    if (tokens.size() != static_cast<std::size_t>(block_size_)) {
      detail::fail(errc::invalid_argument, "prefix_cache insert of ", tokens.size(),
                   " tokens: only full blocks of ", block_size_, " are cached");
    }
    if (parent.block != null_block && !is_current(parent)) return std::nullopt;
    if (const auto it = by_hash_.find(hash); it != by_hash_.end()) {
      const entry& existing = entries_[static_cast<std::size_t>(it->second)];
      if (!holds(existing, parent, tokens, key)) return std::nullopt;
      return chain_link{it->second, existing.generation};
    }
    entry& e = entries_[static_cast<std::size_t>(id)];
    e.cached = true;
    e.num_tokens = block_size_;
    e.hash = hash;
    e.parent = parent;
    ++e.generation;
    e.adapter_id = parent.block == null_block ? key.adapter_id : 0;
    e.cache_salt = parent.block == null_block ? std::string(key.cache_salt) : std::string();
    e.parent_hash = parent.block == null_block ? 0 : entries_[static_cast<std::size_t>(parent.block)].hash;
    e.tag = tag;
    std::copy(tokens.begin(), tokens.end(), stored_tokens(id).begin());
    by_hash_.emplace(hash, id);
    children_.insert(id, child_key(parent, key, tokens.front(), tag));
    ++num_cached_;
    if (on_event_) on_event_(block_event(cache_event::kind::stored, id));
    return chain_link{id, e.generation};
  }

  /// Keeps block `id`, whose KV holds `tokens` (1 to block_size - 1 of them: the computed part of a
  /// sequence's last, partly filled block) after the chain position `parent`, for partial hits
  /// only: match_partial finds it, match and insert never do (it is under no hash), and no event
  /// tells of it (the events' consumers take whole blocks). It is idle-able and evicted like any
  /// cached block. Returns its link; nothing, keeping nothing, when the parent link is stale, id is
  /// cached, or a cached block of the same `tag` after `parent` already starts with `tokens` (so
  /// that one conversation's turns, or a burst of equal prompts, do not pile up copies that every
  /// partial lookup would walk).
  /// Errors: invalid_block if id is out of range; invalid_argument for a token count out of range.
  std::optional<chain_link> insert_partial(block_id id, chain_link parent, std::span<const token_id> tokens,
                                           const prefix_key& key, std::int32_t tag = 0) {
    check_id(id, "insert_partial");
    if (tokens.empty() || tokens.size() >= static_cast<std::size_t>(block_size_)) {
      detail::fail(errc::invalid_argument, "prefix_cache insert_partial of ", tokens.size(), " tokens: 1 to ",
                   block_size_ - 1, " are a partial block");
    }
    entry& e = entries_[static_cast<std::size_t>(id)];
    if (e.cached || (parent.block != null_block && !is_current(parent))) return std::nullopt;
    if (const std::optional<partial_match> held = match_partial(parent, tokens, key, tag);
        held && held->num_tokens == static_cast<std::int32_t>(tokens.size())) {
      return std::nullopt;
    }
    e.cached = true;
    e.num_tokens = static_cast<std::int32_t>(tokens.size());
    e.parent = parent;
    ++e.generation;
    e.adapter_id = parent.block == null_block ? key.adapter_id : 0;
    e.cache_salt = parent.block == null_block ? std::string(key.cache_salt) : std::string();
    e.parent_hash = parent.block == null_block ? 0 : entries_[static_cast<std::size_t>(parent.block)].hash;
    // A content key for frequency policies, under no hash map: the parent's hash mixed with the tokens.
    e.hash = hash_(parent.block == null_block ? root_hash(key) : e.parent_hash, std::as_bytes(tokens));
    e.tag = tag;
    std::copy(tokens.begin(), tokens.end(), stored_tokens(id).begin());
    children_.insert(id, child_key(parent, key, tokens.front(), tag));
    ++num_cached_;
    return chain_link{id, e.generation};
  }
  /// Whether a cached block is a partial one (insert_partial), and how many tokens it holds.
  [[nodiscard]] std::int32_t num_tokens_of(block_id id) const {
    if (!contains(id)) detail::fail(errc::invalid_block, "num_tokens_of block ", id, " which is not cached");
    return entries_[static_cast<std::size_t>(id)].num_tokens;
  }
  /// The chain position a cached block was stored after. Errors: invalid_block if it is not cached.
  [[nodiscard]] chain_link parent_of(block_id id) const {
    if (!contains(id)) detail::fail(errc::invalid_block, "parent_of block ", id, " which is not cached");
    return entries_[static_cast<std::size_t>(id)].parent;
  }

  [[nodiscard]] bool contains(block_id id) const {
    check_id(id, "contains");
    return entries_[static_cast<std::size_t>(id)].cached;
  }
  /// The hash a cached block was stored under. Errors: invalid_block if it is not cached.
  [[nodiscard]] block_hash hash_of(block_id id) const {
    if (!contains(id)) detail::fail(errc::invalid_block, "hash_of block ", id, " which is not cached");
    return entries_[static_cast<std::size_t>(id)].hash;
  }
  /// The tokens a cached block holds. Errors: invalid_block if it is not cached.
  [[nodiscard]] std::span<const token_id> tokens_of(block_id id) const {
    if (!contains(id)) detail::fail(errc::invalid_block, "tokens_of block ", id, " which is not cached");
    return stored_tokens(id);
  }

  // ---- idle blocks and eviction ----

  /// Marks a cached block idle (only the cache still references it): it may now be evicted.
  void make_idle(block_id id, std::int32_t priority = 0) {
    if (!contains(id)) detail::fail(errc::invalid_block, "make_idle of block ", id, " which is not cached");
    if (idle_.contains(id)) return;
    if constexpr (requires { idle_.push(id, priority, block_hash{}); }) {
      idle_.push(id, priority, entries_[static_cast<std::size_t>(id)].hash);  // frequency policies key by content
    } else {
      idle_.push(id, priority);
    }
  }
  /// Marks a block in use again (a hit); no-op if it was not idle.
  void make_active(block_id id) {
    check_id(id, "make_active");
    if (idle_.contains(id)) idle_.erase(id);
  }
  [[nodiscard]] bool is_idle(block_id id) const {
    check_id(id, "is_idle");
    return idle_.contains(id);
  }

  /// Removes the eviction policy's next victim from the cache and returns it (the owner releases
  /// its hold); nothing when no idle block may be evicted.
  std::optional<block_id> evict() {
    const std::optional<block_id> victim = idle_.pop();
    if (victim) remove(*victim);
    return victim;
  }

  /// Removes every entry and returns the blocks (the owner releases their holds). Idle and active
  /// blocks alike: sequences using them keep their KV, which is simply no longer shared.
  std::vector<block_id> clear() {
    std::vector<block_id> removed;
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      if (!entries_[i].cached) continue;
      const auto id = static_cast<block_id>(i);
      if (idle_.contains(id)) idle_.erase(id);
      forget(id);
      entries_[i].cached = false;
      removed.push_back(id);
    }
    by_hash_.clear();
    children_.clear();
    num_cached_ = 0;
    emit({.type = cache_event::kind::cleared, .block = null_block, .hash = 0, .parent_hash = {}, .tokens = {}});
    return removed;
  }

  [[nodiscard]] std::int32_t num_cached_blocks() const noexcept { return num_cached_; }
  [[nodiscard]] std::int32_t num_evictable_blocks() const { return idle_.size(); }
  /// Idle blocks the eviction policy holds for now and releases as its clock moves (a TTL's): not
  /// evictable, so not in num_evictable_blocks, but free once their time is up.
  [[nodiscard]] std::int32_t num_held_blocks() const { return detail::num_held_idle(idle_); }
  /// The eviction policy's queue, for policy-specific calls such as priority_eviction's unpin_all.
  [[nodiscard]] typename Eviction::queue& eviction_queue() noexcept { return idle_; }

  // ---- statistics and events ----

  /// Counts one lookup: `queried_tokens` asked for, `hit_tokens` of them found.
  void record_lookup(std::int64_t queried_tokens, std::int64_t hit_tokens) noexcept {
    queried_tokens_ += queried_tokens;
    hit_tokens_ += hit_tokens;
  }
  [[nodiscard]] std::int64_t queried_tokens() const noexcept { return queried_tokens_; }
  [[nodiscard]] std::int64_t hit_tokens() const noexcept { return hit_tokens_; }
  [[nodiscard]] std::int64_t missed_tokens() const noexcept { return queried_tokens_ - hit_tokens_ - partial_hit_tokens_ - shared_hit_tokens_; }
  /// Counts `tokens` of a prompt served by another sequence's blocks still being computed (a
  /// request admitted beside one with the same prefix), apart from the cache's hits.
  void record_shared_hit(std::int64_t tokens) noexcept { shared_hit_tokens_ += tokens; }
  [[nodiscard]] std::int64_t shared_hit_tokens() const noexcept { return shared_hit_tokens_; }
  [[nodiscard]] double shared_hit_rate() const noexcept {
    return queried_tokens_ == 0 ? 0.0 : static_cast<double>(shared_hit_tokens_) / static_cast<double>(queried_tokens_);
  }
  /// Counts `tokens` served by a partial hit (match_partial), apart from the full-block hits.
  void record_partial_hit(std::int64_t tokens) noexcept { partial_hit_tokens_ += tokens; }
  [[nodiscard]] std::int64_t partial_hit_tokens() const noexcept { return partial_hit_tokens_; }
  /// Full-block hits only: partial_hit_rate() counts the partial ones.
  [[nodiscard]] double partial_hit_rate() const noexcept {
    return queried_tokens_ == 0 ? 0.0 : static_cast<double>(partial_hit_tokens_) / static_cast<double>(queried_tokens_);
  }
  [[nodiscard]] double hit_rate() const noexcept {
    return queried_tokens_ == 0 ? 0.0 : static_cast<double>(hit_tokens_) / static_cast<double>(queried_tokens_);
  }

  /// Called on every store, removal and clear, on the calling thread. Pass {} to stop.
  void set_event_callback(std::function<void(const cache_event&)> callback) { on_event_ = std::move(callback); }

 private:
  struct entry {
    bool cached = false;
    std::int32_t num_tokens = 0;  // block_size, or fewer for a partial block (insert_partial)
    std::uint32_t generation = 0;
    block_hash hash = 0;
    chain_link parent{};
    block_hash parent_hash = 0;   // the parent's hash when this block was stored
    std::int32_t tag = 0;         // match_partial's: a KV cache group
    std::int64_t adapter_id = 0;  // root blocks only
    std::string cache_salt{};     // root blocks only
  };

  /// The children index's key of a block of `tag` stored after `parent` whose first token is
  /// `first`: the parent's hash (the key's root hash for a first block) mixed with both.
  [[nodiscard]] block_hash child_key(chain_link parent, const prefix_key& key, token_id first, std::int32_t tag) const {
    const block_hash p = parent.block == null_block ? root_hash(key) : entries_[static_cast<std::size_t>(parent.block)].hash;
    // A bucket key, not a prefix hash: a collision only costs match_partial a verification, and an
    // xxh3 call here cost decode_append 10% (bench/hot_paths).
    const std::uint64_t mixed = static_cast<std::uint32_t>(first) | static_cast<std::uint64_t>(static_cast<std::uint32_t>(tag)) << 32;
    return (p ^ mixed) * 0x9e3779b97f4a7c15ULL;
  }

  static std::int32_t checked(std::int32_t value, std::int32_t max, const char* what) {
    if (value < 1 || value > max) {
      detail::fail(errc::invalid_argument, "prefix_cache ", what, " ", value, " is not in [1, ", max, "]");
    }
    return value;
  }
  void check_id(block_id id, const char* operation) const {
    if (id < 0 || id >= capacity()) {
      detail::fail(errc::invalid_block, "prefix_cache ", operation, " of block ", id, ": ids are 0..",
                   capacity() - 1);
    }
  }

  [[nodiscard]] std::span<const token_id> block_tokens(std::span<const token_id> tokens, std::int32_t index) const {
    return tokens.subspan(static_cast<std::size_t>(index) * static_cast<std::size_t>(block_size_),
                          static_cast<std::size_t>(block_size_));
  }
  [[nodiscard]] std::span<token_id> stored_tokens(block_id id) {
    return std::span(tokens_).subspan(static_cast<std::size_t>(id) * static_cast<std::size_t>(block_size_),
                                      static_cast<std::size_t>(block_size_));
  }
  [[nodiscard]] std::span<const token_id> stored_tokens(block_id id) const {
    return std::span(tokens_).subspan(static_cast<std::size_t>(id) * static_cast<std::size_t>(block_size_),
                                      static_cast<std::size_t>(block_size_));
  }
  [[nodiscard]] bool is_current(chain_link link) const {
    const entry& e = entries_[static_cast<std::size_t>(link.block)];
    return e.cached && e.generation == link.generation;
  }
  /// Whether `e` is the block for `tokens` after `parent` under `key`: the verification that makes
  /// a hash collision harmless.
  [[nodiscard]] bool holds(const entry& e, chain_link parent, std::span<const token_id> tokens,
                           const prefix_key& key) const {
    const auto id = static_cast<block_id>(&e - entries_.data());
    if (e.parent != parent) return false;
    if (parent.block == null_block && (e.adapter_id != key.adapter_id || e.cache_salt != key.cache_salt)) {
      return false;
    }
    const std::span<const token_id> stored = stored_tokens(id);
    return std::equal(stored.begin(), stored.end(), tokens.begin(), tokens.end());
  }

  /// Tells a policy with per-block state (pin_budget_eviction) that the block left the cache.
  void forget(block_id id) {
    if constexpr (requires { idle_.forget(id); }) idle_.forget(id);
  }

  /// A stored or removed event for block `id`, from its entry.
  [[nodiscard]] cache_event block_event(cache_event::kind type, block_id id) const {
    const entry& e = entries_[static_cast<std::size_t>(id)];
    const bool root = e.parent.block == null_block;
    return {.type = type,
            .block = id,
            .hash = e.hash,
            .parent_hash = root ? std::nullopt : std::optional(e.parent_hash),
            .tokens = stored_tokens(id),
            .generation = e.generation,
            .parent = e.parent,
            .key = root ? prefix_key{e.adapter_id, e.cache_salt} : prefix_key{}};
  }

  void emit(const cache_event& event) const {
    if (on_event_) on_event_(event);
  }

  void remove(block_id id) {
    entry& e = entries_[static_cast<std::size_t>(id)];
    const bool whole = e.num_tokens == block_size_;
    if (whole) by_hash_.erase(e.hash);
    children_.erase(id);
    e.cached = false;
    --num_cached_;
    forget(id);
    if (whole && on_event_) on_event_(block_event(cache_event::kind::removed, id));
  }

  std::int32_t block_size_;
  block_hash seed_;
  [[no_unique_address]] Hash hash_;
  std::vector<entry> entries_;
  std::vector<token_id> tokens_;  // [capacity, block_size]: each cached block's tokens
  std::unordered_map<block_hash, block_id> by_hash_;
  detail::block_index children_;  // child_key -> cached blocks (match_partial)
  typename Eviction::queue idle_;
  std::int32_t num_cached_ = 0;
  std::int64_t queried_tokens_ = 0;
  std::int64_t hit_tokens_ = 0;
  std::int64_t partial_hit_tokens_ = 0;
  std::int64_t shared_hit_tokens_ = 0;
  std::function<void(const cache_event&)> on_event_;
};

}  // namespace pagedkv
