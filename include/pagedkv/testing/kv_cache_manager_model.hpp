// The reference model of kv_cache_manager that the conformance runs check a manager against
// (pagedkv::testing; conformance.hpp runs it). kv_cache_manager_model<Manager> holds the manager
// under test and, beside it, what it must be equal to:
// - the model's own record of each live sequence (its tokens and prefix key: adapter and tenant
//   salt), which the manager must read back exactly through its block table, addressed as
//   attention kernels address it;
// - simulated KV per pool, indexed by slot: every slot handed out is stamped with (token,
//   position, context), context hashing the adapter and every token up to the position, as real
//   K/V depends on the whole prefix; free blocks are poisoned before every check;
// - a mirror of the prefix cache rebuilt from its events, which checks every stored block and
//   predicts every hit (allocate must attach exactly the blocks its walk verifies); a hash the
//   run does not declare colliding (expected_rejections) must never lead a lookup to a block of
//   other tokens or another key, and an evicted block must be idle (only the cache held it);
// - reference counts: refcount(b) == tables referencing b + (b cached ? 1 : 0), free + used =
//   capacity, and a refused call changes nothing observable;
// - with lru_eviction, that no block idle longer than the victim stays cached.
// The coverage counters say which paths a run reached. Pulls in RapidCheck.
#pragma once

#include <pagedkv/kv_cache_manager.hpp>
#include <pagedkv/testing/checked_eviction.hpp>

#include <rapidcheck.h>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <map>
#include <ostream>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace pagedkv::testing {

// ---- what the model stamps into simulated KV ----

struct stamp {
  token_id token = -1;
  std::int32_t position = -1;
  std::uint64_t context = 0;  ///< the adapter and tokens [0, position]: what the K/V depends on
  friend bool operator==(const stamp&, const stamp&) = default;
};
inline constexpr stamp poison{-99, -99, 0};

/// Asserts that `call` throws pagedkv::error with `code` and leaves `fingerprint()` (a string of
/// everything observable) as it was: a refused call changes nothing.
template <class Fingerprint, class Call>
void expect_refused(errc code, Fingerprint&& fingerprint, Call&& call) {
  const std::string before = fingerprint();
  try {
    call();
    RC_FAIL("call succeeded where it should have thrown");
  } catch (const error& e) {
    RC_ASSERT(e.code() == code);
  }
  RC_ASSERT(fingerprint() == before);
}

/// A sequence's prefix key as one number, key_id: adapter (key_id % 2) and tenant (key_id / 2,
/// an index into tenant_salts). The salts are 7 bytes, not a whole number of 4-byte tokens or
/// 8-byte words, and differ only in the last byte, so a hash that drops a partial tail, or the
/// salt, makes the two tenants' root blocks collide.
inline constexpr std::string_view tenant_salts[] = {"", "tenant1", "tenant2"};
inline constexpr std::int64_t num_key_ids = 2 * std::ssize(tenant_salts);

inline prefix_key key_of(std::int64_t key_id) {
  return {.adapter_id = key_id % 2, .cache_salt = tenant_salts[static_cast<std::size_t>(key_id / 2)]};
}

/// Which hit rejections (a hash that led a lookup to a block that does not verify) a run expects.
/// A hash that does not collide on purpose (xxh3_hash) expects none: meeting a block of other
/// tokens or another key under its hash is a collision, about once in 2^40 runs for a 64-bit
/// hash, so the run fails. A colliding one (colliding_hash.hpp) names those its collisions lead
/// to; conformance.hpp then requires each to be reached.
struct expected_rejections {
  bool tokens = false;  ///< a hash led to a block holding other tokens
  bool parent = false;  ///< ... to a block after another parent block (also met without collisions,
                        ///< when a parent was evicted and cached again elsewhere: never a failure)
  bool key = false;     ///< ... to a root block under another adapter or tenant salt
};

/// context[i] for every position i of a sequence of prefix key `adapter` (a key_id) holding `tokens`.
inline std::vector<std::uint64_t> contexts(std::int64_t adapter, std::span<const token_id> tokens) {
  std::vector<std::uint64_t> out;
  std::uint64_t h = (0x9e3779b97f4a7c15ULL ^ static_cast<std::uint64_t>(adapter)) * 0x100000001b3ULL;
  h ^= h >> 29;  // mixed before the first token: adapter 1, token 0 differs from adapter 0, token 1
  for (token_id t : tokens) {
    h = (h ^ static_cast<std::uint32_t>(t)) * 0x100000001b3ULL;
    h ^= h >> 29;
    out.push_back(h);
  }
  return out;
}

/// Counted over every case of one property (shrinking included) and asserted after its run.
struct coverage {
  std::int64_t sequences = 0;            ///< command sequences run, shrinking included
  std::int64_t max_cached_blocks = 0;    ///< the most blocks cached at once
  std::int64_t children_stored = 0;      ///< blocks cached under a parent
  std::int64_t long_hits = 0;            ///< allocations that attached two or more cached blocks
  std::int64_t rejected_tokens = 0;      ///< a hash led to a block holding other tokens
  std::int64_t rejected_parent = 0;      ///< ... to a block after another parent block
  std::int64_t rejected_generation = 0;  ///< ... after an earlier generation of this parent block
  std::int64_t rejected_key = 0;         ///< ... to a root block under another adapter or salt
  std::int64_t recached_blocks = 0;      ///< block ids cached again after eviction (a new generation)
  std::int64_t lru_order_checks = 0;     ///< evictions with another idle block to compare against
  std::int64_t forks_in_a_block = 0;     ///< forks at a position inside a block, short of the end
  std::int64_t partial_hits = 0;         ///< allocations that copied a cached block's first tokens
  std::int64_t held_partial_sources = 0; ///< checks that found a partial hit's source held, uncomputed
  std::int64_t partial_hits_without_room = 0;  ///< partial hits left out: their idle source did not fit
  std::int64_t cached_tails = 0;         ///< partly filled last blocks kept cached when their sequence was freed

  friend std::ostream& operator<<(std::ostream& os, const coverage& c) {
    return os << c.sequences << " command sequences, max cached " << c.max_cached_blocks << ", children stored " << c.children_stored
              << ", hits of >= 2 blocks " << c.long_hits << ", rejected for tokens " << c.rejected_tokens
              << ", parent " << c.rejected_parent << ", generation " << c.rejected_generation << ", key "
              << c.rejected_key << ", re-cached " << c.recached_blocks << ", LRU order checks "
              << c.lru_order_checks << ", forks inside a block " << c.forks_in_a_block
              << ", partial hits " << c.partial_hits << ", sources held " << c.held_partial_sources
              << ", left out for room " << c.partial_hits_without_room << ", tails cached " << c.cached_tails;
  }
};

struct live_sequence {
  std::vector<token_id> tokens;
  std::int64_t adapter = 0;  ///< the prefix key's key_id (key_of)
};

/// The manager under test and the reference model beside it; commands (kv_cache_manager_commands.hpp)
/// drive both and call check_invariants() after each.
template <class Manager>
struct kv_cache_manager_model {
  using eviction_type = unchecked_eviction_t<typename Manager::cache_type::eviction_type>;
  static constexpr bool lru = std::same_as<eviction_type, lru_eviction>;

  /// What the cache holds, rebuilt from its events.
  struct mirrored_block {
    block_hash hash = 0;
    chain_link parent{};
    std::int32_t depth = 0;
    std::vector<token_id> tokens;
    std::int64_t adapter = 0;  // root blocks
  };

  /// A partly filled block the manager kept cached when its sequence was freed (insert_partial):
  /// no event tells of it, so the model records it at the free and drops it once the cache no
  /// longer holds that generation of the block.
  struct mirrored_partial {
    chain_link parent{};
    std::vector<token_id> tokens;
    std::int64_t adapter = 0;
    std::uint32_t generation = 0;
  };

  Manager manager;
  coverage& seen;
  expected_rejections collisions;  // the rejections this run's hash may lead to
  std::int32_t block_size;
  std::vector<stamp> device_kv;
  std::vector<stamp> host_kv;
  std::map<seq_id, live_sequence> live;  // the model: each live sequence's tokens and adapter
  std::map<block_id, mirrored_block> mirror;
  std::map<block_id, mirrored_partial> partial_mirror;
  std::unordered_map<block_hash, block_id> mirror_by_hash;
  std::vector<std::uint32_t> generation;  // per block id: times it was stored
  seq_id publisher = 0;                   // the sequence whose mark_computed is running
  std::map<block_id, std::int64_t> idle_since;  // LRU: the check at which each idle block was idle
  /// Partial hits whose sequence has not been computed since: the source block, which the manager
  /// must hold (an engine runs the copy in the step), and what it held when the copy was planned.
  struct pending_copy {
    block_id src = null_block;
    std::vector<stamp> kv;
  };
  std::map<seq_id, pending_copy> pending_copies;
  std::int64_t checks = 0;

  kv_cache_manager_model(const kv_cache_options& o, coverage& c, expected_rejections r = {})
      : manager(o),
        seen(c),
        collisions(r),
        block_size(o.block_size),
        device_kv(static_cast<std::size_t>(o.num_device_blocks * o.block_size), poison),
        host_kv(static_cast<std::size_t>(std::max(o.num_host_blocks, 1) * o.block_size), poison),
        generation(static_cast<std::size_t>(o.num_device_blocks), 0) {
    manager.cache().set_event_callback([this](const cache_event& e) { on_cache_event(e); });
  }
  kv_cache_manager_model(const kv_cache_manager_model&) = delete;  // the callback holds this

  std::vector<stamp>& kv(location where) { return where == location::device ? device_kv : host_kv; }
  [[nodiscard]] prefix_key key(std::int64_t key_id) const { return key_of(key_id); }

  void write(seq_id seq, std::int32_t first_position, std::span<const slot_id> slots) {
    std::vector<stamp>& memory = kv(manager.where(seq));
    const live_sequence& s = live.at(seq);
    const std::vector<std::uint64_t> context = contexts(s.adapter, s.tokens);
    for (std::size_t i = 0; i < slots.size(); ++i) {
      const auto position = static_cast<std::size_t>(first_position) + i;
      memory.at(static_cast<std::size_t>(slots[i])) = {s.tokens[position], static_cast<std::int32_t>(position),
                                                       context[position]};
    }
  }

  void copy_block(const std::vector<stamp>& from, block_id src, std::vector<stamp>& to, block_id dst) {
    const auto n = static_cast<std::ptrdiff_t>(block_size);
    std::copy_n(from.begin() + src * n, n, to.begin() + dst * n);
  }

  /// The manager let go of `seq`'s partial hit source (mark_computed, free, truncate, swap out): it
  /// was touched now, so LRU counts it as newest if it went idle.
  void drop_pending_copy(seq_id seq) {
    if (const auto it = pending_copies.find(seq); it != pending_copies.end()) {
      idle_since.erase(it->second.src);
      pending_copies.erase(it);
    }
  }

  /// Frees `seq` (and forgets it). A block the manager keeps cached for partial hits must be the
  /// freed sequence's last, partly filled one, hold its computed tokens there, and sit after the
  /// cached chain of the tokens before them.
  void free_sequence(seq_id seq) {
    prune_partial_mirror();
    const live_sequence s = live.at(seq);
    const std::int32_t computed = manager.num_computed_tokens(seq);
    const std::int32_t full = computed / block_size;
    const std::int32_t tail = computed - full * block_size;
    const bool on_device = manager.where(seq) == location::device;
    const block_id last = on_device && tail > 0 ? manager.table(seq).block(full) : null_block;
    const bool was_cached = last != null_block && manager.cache().contains(last);
    manager.free(seq);
    live.erase(seq);
    drop_pending_copy(seq);
    for (block_id id = 0; id < manager.device_pool().capacity(); ++id) {
      const bool kept = manager.cache().contains(id) && !mirror.contains(id) && !partial_mirror.contains(id);
      if (kept && id != last) RC_FAIL("block " + std::to_string(id) + " was cached when sequence " + std::to_string(seq) + " was freed");
    }
    if (last == null_block || was_cached || !manager.cache().contains(last) || mirror.contains(last)) return;
    RC_ASSERT(manager.options().enable_prefix_caching && manager.options().enable_partial_reuse);
    RC_ASSERT(manager.cache().num_tokens_of(last) == tail);
    const std::vector<token_id> tokens(s.tokens.begin() + std::ptrdiff_t{full} * block_size, s.tokens.begin() + computed);
    const std::span<const token_id> stored = manager.cache().tokens_of(last);
    RC_ASSERT(std::equal(tokens.begin(), tokens.end(), stored.begin()));
    const chain_link parent = manager.cache().parent_of(last);
    if (full == 0) {
      RC_ASSERT(parent.block == null_block);
    } else {
      RC_ASSERT(mirror.contains(parent.block) && generation[static_cast<std::size_t>(parent.block)] == parent.generation);
      const mirrored_block& p = mirror.at(parent.block);
      RC_ASSERT(p.depth == full - 1);
      const auto parent_tokens = s.tokens.begin() + std::ptrdiff_t{full - 1} * block_size;
      RC_ASSERT(std::equal(p.tokens.begin(), p.tokens.end(), parent_tokens, parent_tokens + block_size));
      // The whole chain, where it is still cached (an evicted ancestor leaves it unreachable, as
      // it leaves a whole block stored under the same parent).
      std::vector<token_id> before;
      std::int64_t root_adapter = 0;
      if (chain_tokens(parent.block, before, root_adapter)) {
        RC_ASSERT(std::equal(before.begin(), before.end(), s.tokens.begin(), s.tokens.begin() + std::ptrdiff_t{full} * block_size));
        RC_ASSERT(root_adapter == s.adapter);
      }
    }
    partial_mirror[last] = {parent, tokens, s.adapter, ++generation[static_cast<std::size_t>(last)]};
    ++seen.cached_tails;
  }
  /// Forgets partial blocks the cache no longer holds (evicted, possibly cached again since).
  void prune_partial_mirror() {
    std::erase_if(partial_mirror, [&](const auto& entry) {
      const auto& [id, b] = entry;
      return !manager.cache().contains(id) || mirror.contains(id) || generation[static_cast<std::size_t>(id)] != b.generation;
    });
  }

  void mark_computed(seq_id seq) {
    drop_pending_copy(seq);  // the step that ran the copy is over
    publisher = seq;
    manager.mark_computed(seq, manager.num_tokens(seq));
  }

  // ---- the cache mirror ----

  void on_cache_event(const cache_event& e) {
    switch (e.type) {
      case cache_event::kind::stored: {
        const live_sequence& s = live.at(publisher);
        mirrored_block b{.hash = e.hash, .parent = {}, .depth = 0, .tokens = {e.tokens.begin(), e.tokens.end()},
                         .adapter = s.adapter};
        if (!e.parent_hash) {
          const prefix_key k = key(s.adapter);
          RC_ASSERT(e.key.adapter_id == k.adapter_id);
          RC_ASSERT(e.key.cache_salt == k.cache_salt);
        } else {
          const auto it = mirror_by_hash.find(*e.parent_hash);
          if (it == mirror_by_hash.end()) {
            RC_FAIL("block " + std::to_string(e.block) + " was cached under a parent that is no longer cached");
          }
          b.parent = {it->second, generation[static_cast<std::size_t>(it->second)]};
          b.depth = mirror.at(it->second).depth + 1;
          ++seen.children_stored;
        }
        const auto first = static_cast<std::size_t>(b.depth) * static_cast<std::size_t>(block_size);
        RC_ASSERT(first + b.tokens.size() <= s.tokens.size());
        RC_ASSERT(std::equal(b.tokens.begin(), b.tokens.end(), s.tokens.begin() + static_cast<std::ptrdiff_t>(first)));
        RC_ASSERT(!mirror.contains(e.block));
        RC_ASSERT(mirror_by_hash.emplace(e.hash, e.block).second);  // one block per hash
        if (generation[static_cast<std::size_t>(e.block)]++ > 0) ++seen.recached_blocks;
        mirror.emplace(e.block, std::move(b));
        break;
      }
      case cache_event::kind::removed: {
        // Only evictions remove single blocks, before the manager drops the cache's hold.
        if (const std::int32_t refs = manager.device_pool().ref_count(e.block); refs != 1) {
          RC_FAIL("block " + std::to_string(e.block) + " was evicted while " + std::to_string(refs - 1) +
                  " table entries still referenced it");
        }
        if constexpr (lru) check_lru_victim(e.block);
        const auto it = mirror.find(e.block);
        RC_ASSERT(it != mirror.end());
        RC_ASSERT(it->second.hash == e.hash);
        mirror_by_hash.erase(e.hash);
        mirror.erase(it);
        break;
      }
      case cache_event::kind::cleared:
        mirror.clear();
        partial_mirror.clear();
        mirror_by_hash.clear();
        idle_since.clear();
        break;
    }
  }

  /// LRU evicts the block idle longest: none still idle became idle before the victim (blocks
  /// that became idle during the current command count as newest).
  void check_lru_victim(block_id victim) {
    const auto it = idle_since.find(victim);
    std::int64_t older = 0;
    std::int64_t others = 0;
    for (const auto& [id, since] : idle_since) {
      if (id == victim || !manager.cache().is_idle(id)) continue;
      ++others;
      if (it == idle_since.end() || since < it->second) ++older;
    }
    if (older > 0) {
      RC_FAIL("LRU evicted block " + std::to_string(victim) + " while " + std::to_string(older) +
              " blocks idle longer stayed");
    }
    seen.lru_order_checks += others > 0 ? 1 : 0;
    if (it != idle_since.end()) idle_since.erase(it);
  }

  /// Appends the tokens of the chain ending at block `id` (cached), root first, and sets the
  /// root's adapter; appends nothing and returns false if a link of the chain is stale.
  bool chain_tokens(block_id id, std::vector<token_id>& tokens, std::int64_t& root_adapter) const {
    std::vector<const mirrored_block*> chain{&mirror.at(id)};
    while (chain.back()->parent.block != null_block) {
      const chain_link link = chain.back()->parent;
      const auto parent = mirror.find(link.block);
      if (parent == mirror.end() || generation[static_cast<std::size_t>(link.block)] != link.generation) return false;
      chain.push_back(&parent->second);
    }
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) tokens.insert(tokens.end(), (*it)->tokens.begin(), (*it)->tokens.end());
    root_adapter = chain.back()->adapter;
    return true;
  }

  /// The tokens a partial hit must add after `hit_blocks` full blocks whose last link is `parent`
  /// (with partial reuse on; off, they miss below the hit granularity): the most of the prompt's
  /// next tokens (short of its last) that a cached block stored after `parent` starts with, found
  /// by scanning the mirror.
  std::int32_t expected_partial_tokens(std::span<const token_id> prompt, std::int64_t adapter,
                                       std::int32_t hit_blocks, chain_link parent) const {
    if (!manager.options().enable_prefix_caching) return 0;
    const auto first = static_cast<std::size_t>(hit_blocks * block_size);
    const std::span<const token_id> rest = prompt.subspan(first, prompt.size() - 1 - first);
    std::int32_t best = 0;
    const auto consider = [&](chain_link after, std::int64_t block_adapter, const std::vector<token_id>& tokens) {
      if (after != parent || (parent.block == null_block && block_adapter != adapter)) return;
      const std::size_t n = std::min(rest.size(), tokens.size());
      const auto matched = std::mismatch(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(n), tokens.begin()).first - rest.begin();
      best = std::max(best, static_cast<std::int32_t>(matched));
    };
    for (const auto& [id, b] : mirror) consider(b.parent, b.adapter, b.tokens);
    for (const auto& [id, b] : partial_mirror) {
      if (manager.cache().contains(id) && !mirror.contains(id) && generation[static_cast<std::size_t>(id)] == b.generation) {
        consider(b.parent, b.adapter, b.tokens);
      }
    }
    return best;
  }

  /// The blocks a lookup of `prompt` must attach: the mirror's own walk of the chain, verifying
  /// what prefix_cache verifies. Counts why a walk stopped at a hash that did lead to a block.
  /// Sets `last` to the last attached block's link (a default one for none).
  std::int32_t expected_hit_blocks(std::span<const token_id> prompt, std::int64_t adapter, chain_link& last) {
    last = {};
    if (!manager.options().enable_prefix_caching) return 0;
    std::vector<block_hash> hashes;
    manager.cache().extend_hashes(prompt, key(adapter), hashes);
    const auto limit = (static_cast<std::int32_t>(prompt.size()) - 1) / block_size;
    chain_link parent{};
    for (std::int32_t i = 0; i < limit; ++i) {
      const auto found = mirror_by_hash.find(hashes[static_cast<std::size_t>(i)]);
      if (found == mirror_by_hash.end()) return i;
      const mirrored_block& b = mirror.at(found->second);
      if (b.parent != parent) {
        ++(b.parent.block == parent.block ? seen.rejected_generation : seen.rejected_parent);
        return i;
      }
      if (i == 0 && b.adapter != adapter) {
        ++seen.rejected_key;
        if (!collisions.key) fail_collision(found->second, i, "another prefix key", adapter, b.adapter);
        return i;
      }
      const auto tokens = prompt.subspan(static_cast<std::size_t>(i * block_size), static_cast<std::size_t>(block_size));
      if (!std::equal(tokens.begin(), tokens.end(), b.tokens.begin(), b.tokens.end())) {
        ++seen.rejected_tokens;
        if (!collisions.tokens) fail_collision(found->second, i, "other tokens", adapter, b.adapter);
        return i;
      }
      parent = {found->second, generation[static_cast<std::size_t>(found->second)]};
      last = parent;
    }
    return limit;
  }

  [[noreturn]] void fail_collision(block_id found, std::int32_t index, const char* what, std::int64_t wanted,
                                   std::int64_t root) const {
    const auto show = [](std::int64_t k) {
      return "(adapter " + std::to_string(key_of(k).adapter_id) + ", salt \"" + std::string(key_of(k).cache_salt) + "\")";
    };
    RC_FAIL("hash collision: block " + std::to_string(index) + " of a prompt under " + show(wanted) +
            " hashed to cached block " + std::to_string(found) + ", which holds " + what +
            (index == 0 ? " (its key " + show(root) + ")" : std::string()) +
            "; the run's options expect no such rejection (conformance_options::rejections)");
  }

  /// Everything observable, to show that a refused call changed nothing.
  std::string fingerprint() const {
    std::ostringstream out;
    for (const auto& [seq, s] : live) {
      out << seq << (manager.where(seq) == location::device ? 'd' : 'h') << manager.num_tokens(seq) << ':';
      for (block_id id : manager.table(seq).blocks()) out << id << ',';
      out << ';';
    }
    for (block_id id = 0; id < manager.device_pool().capacity(); ++id) out << manager.device_pool().ref_count(id) << ',';
    out << '|' << manager.num_free_blocks() << '|' << manager.num_free_host_blocks() << '|' << manager.cache().num_cached_blocks();
    return out.str();
  }

  template <class Call>
  void expect_refused(errc code, Call&& call) {
    testing::expect_refused(code, [this] { return fingerprint(); }, std::forward<Call>(call));
  }

  /// Poisons the slots of free blocks, so that reading a freed block can never pass the check.
  void poison_free_blocks() {
    for (block_id id = 0; id < manager.device_pool().capacity(); ++id) {
      if (manager.device_pool().is_free(id)) {
        std::fill_n(device_kv.begin() + std::ptrdiff_t{id} * block_size, block_size, poison);
      }
    }
    if (manager.options().num_host_blocks == 0) return;
    for (block_id id = 0; id < manager.host_pool().capacity(); ++id) {
      if (manager.host_pool().is_free(id)) std::fill_n(host_kv.begin() + std::ptrdiff_t{id} * block_size, block_size, poison);
    }
  }

  void check_sequence(seq_id seq, const live_sequence& s) {
    RC_ASSERT(manager.contains(seq));
    const std::span<const token_id> held = manager.tokens(seq);
    RC_ASSERT(std::equal(held.begin(), held.end(), s.tokens.begin(), s.tokens.end()));
    const block_table& table = manager.table(seq);
    RC_ASSERT(table.num_tokens() == static_cast<std::int32_t>(s.tokens.size()));
    RC_ASSERT(table.num_blocks() == (table.num_tokens() + block_size - 1) / block_size);
    const std::vector<stamp>& memory = kv(manager.where(seq));
    const std::vector<std::uint64_t> context = contexts(s.adapter, s.tokens);
    for (std::int32_t i = 0; i < table.num_tokens(); ++i) {
      // As a kernel reads it: the block table and the offset in the block.
      const slot_id slot = slot_id{table.blocks()[static_cast<std::size_t>(i / block_size)]} * block_size + i % block_size;
      RC_ASSERT(table.slot(i) == slot);
      const stamp expected{s.tokens[static_cast<std::size_t>(i)], i, context[static_cast<std::size_t>(i)]};
      const stamp& read = memory[static_cast<std::size_t>(slot)];
      if (read != expected) {
        RC_FAIL("sequence " + std::to_string(seq) + " reads a wrong KV at position " + std::to_string(i) +
                ": token " + std::to_string(read.token) + " of position " + std::to_string(read.position) +
                (read.context != expected.context ? " after another prefix" : ""));
      }
    }
  }

  void check_cache() {
    const std::int32_t cached = manager.cache().num_cached_blocks();
    seen.max_cached_blocks = std::max<std::int64_t>(seen.max_cached_blocks, cached);
    prune_partial_mirror();
    RC_ASSERT(static_cast<std::size_t>(cached) == mirror.size() + partial_mirror.size());
    for (const auto& [id, b] : partial_mirror) {
      const std::span<const token_id> tokens = manager.cache().tokens_of(id);
      RC_ASSERT(std::equal(b.tokens.begin(), b.tokens.end(), tokens.begin()));
      RC_ASSERT(manager.cache().num_tokens_of(id) == static_cast<std::int32_t>(b.tokens.size()));
    }
    for (const auto& [id, b] : mirror) {
      RC_ASSERT(manager.cache().contains(id));
      RC_ASSERT(manager.cache().hash_of(id) == b.hash);
      const std::span<const token_id> tokens = manager.cache().tokens_of(id);
      RC_ASSERT(std::equal(tokens.begin(), tokens.end(), b.tokens.begin(), b.tokens.end()));
    }
    if constexpr (lru) {
      for (block_id id = 0; id < manager.device_pool().capacity(); ++id) {
        if (!manager.cache().is_idle(id)) {
          idle_since.erase(id);
        } else {
          idle_since.emplace(id, checks);  // keeps the older entry of a block that stayed idle
        }
      }
    }
    ++checks;
  }

  void check_invariants() {
    poison_free_blocks();
    RC_ASSERT(manager.num_sequences() == live.size());
    std::vector<std::int32_t> device_refs(static_cast<std::size_t>(manager.device_pool().capacity()), 0);
    std::vector<std::int32_t> host_refs(static_cast<std::size_t>(manager.host_pool().capacity()), 0);
    for (const auto& [seq, s] : live) {
      check_sequence(seq, s);
      auto& refs = manager.where(seq) == location::device ? device_refs : host_refs;
      for (block_id id : manager.table(seq).blocks()) ++refs[static_cast<std::size_t>(id)];
    }
    std::vector<std::int32_t> held(device_refs.size(), 0);
    for (const auto& [seq, pending] : pending_copies) {
      // The source still holds what the copy was planned from: it may run at any time until then.
      ++held[static_cast<std::size_t>(pending.src)];
      RC_ASSERT(std::equal(pending.kv.begin(), pending.kv.end(), device_kv.begin() + std::ptrdiff_t{pending.src} * block_size));
      ++seen.held_partial_sources;
    }
    std::int32_t free_blocks = 0;
    for (block_id id = 0; id < manager.device_pool().capacity(); ++id) {
      const bool cached = manager.cache().contains(id);
      const std::int32_t expected =
          device_refs[static_cast<std::size_t>(id)] + held[static_cast<std::size_t>(id)] + (cached ? 1 : 0);
      if (const std::int32_t refs = manager.device_pool().ref_count(id); refs != expected) {
        RC_FAIL("block " + std::to_string(id) + " has refcount " + std::to_string(refs) + " while " +
                std::to_string(device_refs[static_cast<std::size_t>(id)]) + " table entries" +
                (held[static_cast<std::size_t>(id)] > 0 ? ", a partial hit's pending copy" : "") +
                (cached ? " and the cache" : "") + " hold it: a block handed out twice, or a reference leaked");
      }
      RC_ASSERT(manager.cache().is_idle(id) == (cached && expected == 1));
      free_blocks += expected == 0 ? 1 : 0;
    }
    RC_ASSERT(manager.device_pool().num_free_blocks() == free_blocks);
    RC_ASSERT(manager.num_free_blocks() == free_blocks + manager.cache().num_evictable_blocks());
    if (manager.options().num_host_blocks > 0) {
      std::int32_t free_host = 0;
      for (block_id id = 0; id < manager.host_pool().capacity(); ++id) {
        RC_ASSERT(manager.host_pool().ref_count(id) == host_refs[static_cast<std::size_t>(id)]);
        free_host += host_refs[static_cast<std::size_t>(id)] == 0 ? 1 : 0;
      }
      RC_ASSERT(manager.host_pool().num_free_blocks() == free_host);
    }
    check_cache();
    const kv_cache_usage u = manager.usage();
    const auto read_blocks = static_cast<std::int32_t>(std::count_if(device_refs.begin(), device_refs.end(), [](std::int32_t r) { return r > 0; }));
    RC_ASSERT(u.num_used_blocks == read_blocks);
    RC_ASSERT(u.num_live_tokens <= std::int64_t{read_blocks} * block_size);
    RC_ASSERT(u.num_live_tokens >= read_blocks);  // every referenced block holds a token
    RC_ASSERT(u.utilization >= 0.0 && u.utilization <= 1.0);
  }
};

}  // namespace pagedkv::testing
