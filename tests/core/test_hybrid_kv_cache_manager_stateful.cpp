// RapidCheck stateful test of hybrid_kv_cache_manager against a model. Each case draws a model of
// 1-3 groups (full attention, sliding windows and chunked local attention of odd sizes), a tiny
// pool, an odd block size, caching and window freeing on or off, then runs random commands:
// allocate (fresh prompts, prompts of three shared families, next turns of live sequences, with
// partial reuse on or off; some computed later, some in part; or sharing a live sequence's blocks
// in flight, allocate_shared), append (with copy-on-write), compute, fork, free, truncate, swap
// out and in (alone or with every sequence in the same pool), evict and reset the cache. After every command it checks:
// - reads: simulated KV per slot is stamped with (group, token, position, context), context
//   hashing the adapter and every token up to the position; each live sequence reads back, group
//   by group and as a kernel addresses it, exactly what its next query reads (a windowed group:
//   its window or chunk), and every block wholly before that is null_block in the table; a
//   partial hit's copies run at allocation (each group's source into its fresh block), and each
//   source stays held, its KV unchanged, until the sequence is computed, freed, cut or swapped out;
// - counts: refcount(b) = table entries holding b + (b cached), free + used = capacity, a freed
//   window block is back in the pool (or idle in the cache), no block serves two groups;
// - hits: a hit is never longer than the ideal one, computed from the cached blocks' stamps (the
//   longest prefix for which every group's needed blocks hold the right KV), and equal to it while
//   nothing was ever evicted; a partial hit is never longer than what every group's cached blocks
//   hold of the next tokens; a freed sequence keeps exactly its last, partly filled block of each
//   group cached, holding its computed tokens there; a refused call changes nothing.
// RC_PARAMS sets the number of cases (tests/core/CMakeLists.txt); the coverage each run must reach
// is checked after it.
#include <pagedkv/hybrid_kv_cache_manager.hpp>
#include <pagedkv/testing/colliding_hash.hpp>
#include <pagedkv/testing/kv_cache_manager_commands.hpp>

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/detail/Configuration.h>
#include <rapidcheck/state.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace pagedkv {
namespace {

struct stamp {
  std::int32_t group = -1;
  token_id token = -1;
  std::int32_t position = -1;
  std::uint64_t context = 0;
  friend bool operator==(const stamp&, const stamp&) = default;
};
constexpr stamp poison{-99, -99, -99, 0};

using testing::contexts;

struct coverage {
  std::int64_t cases = 0;
  std::int64_t hits = 0;                ///< allocations that attached cached blocks
  std::int64_t window_hits = 0;         ///< ... with null entries before a group's window
  std::int64_t group_limited_hits = 0;  ///< the anchor had more than another group could serve
  std::int64_t exact_hit_checks = 0;    ///< hits compared equal to the ideal (nothing evicted yet)
  std::int64_t released_blocks = 0;     ///< table entries a window released
  std::int64_t copies_on_write = 0;
  std::int64_t evictions = 0;
  std::int64_t refused_truncates = 0;   ///< below blocks a window had released
  std::int64_t forks_in_a_block = 0;    ///< forks at a position inside a block, short of the end
  std::int64_t refused_forks = 0;       ///< forks at a position whose window a parent had released
  std::int64_t swaps_out = 0;
  std::int64_t group_missing_tokens = 0;  ///< misses blamed on a group lacking a block
  std::int64_t evicted_tokens = 0;        ///< misses blamed on an eviction
  std::int64_t swaps_in = 0;
  std::int64_t partial_hits = 0;        ///< allocations that copied a partial block in every group
  std::int64_t held_sources = 0;        ///< checks that found a partial hit's sources still held
  std::int64_t cached_tails = 0;        ///< freed sequences whose partly filled blocks stayed cached
  std::int64_t shared_allocations = 0;  ///< allocate_shared on blocks in flight
  std::int64_t refused_shares = 0;      ///< ... refused for a window the source had released
};

struct live_sequence {
  std::vector<token_id> tokens;
  std::int64_t adapter = 0;
};

template <class Manager>
struct model {
  Manager manager;
  coverage& seen;
  std::int32_t block_size;
  std::vector<stamp> kv;       // device pool, by slot
  std::vector<stamp> host_kv;  // host pool, by slot
  std::map<seq_id, live_sequence> live;
  std::int64_t removals = 0;  // blocks the cache ever dropped: hits may then fall short of the ideal
  /// Partial hits not computed since: each group's source block and the KV it held at allocation.
  std::map<seq_id, std::vector<std::pair<block_id, std::vector<stamp>>>> pending_sources;

  model(const hybrid_kv_cache_options& o, coverage& c)
      : manager(o),
        seen(c),
        block_size(o.block_size),
        kv(static_cast<std::size_t>(o.num_device_blocks * o.block_size), poison),
        host_kv(static_cast<std::size_t>(std::max(o.num_host_blocks, 1) * o.block_size), poison) {
    manager.cache().set_event_callback([this](const cache_event& e) {
      if (e.type != cache_event::kind::stored) ++removals;
    });
  }
  model(const model&) = delete;  // the callback holds this

  [[nodiscard]] std::int32_t groups() const { return manager.num_groups(); }
  [[nodiscard]] const hybrid_kv_cache_options& options() const { return manager.options(); }
  std::vector<stamp>& memory(location where) { return where == location::device ? kv : host_kv; }

  /// The first block group g's next query reads, for a sequence computed up to `computed`.
  [[nodiscard]] std::int32_t first_needed_block(std::int32_t g, std::int32_t computed) const {
    if (!options().free_outside_window) return 0;
    return manager.spec(g).first_needed_position(computed) / block_size;
  }

  /// Stamps the KV of live[seq]'s tokens [first, first + n) at slots [groups, n].
  void write(seq_id seq, std::int32_t first, std::span<const slot_id> slots) {
    const live_sequence& s = live.at(seq);
    const std::vector<std::uint64_t> context = contexts(s.adapter, s.tokens);
    const std::size_t n = slots.size() / static_cast<std::size_t>(groups());
    std::vector<stamp>& to = memory(manager.where(seq));
    for (std::int32_t g = 0; g < groups(); ++g) {
      for (std::size_t i = 0; i < n; ++i) {
        const auto position = static_cast<std::size_t>(first) + i;
        to.at(static_cast<std::size_t>(slots[static_cast<std::size_t>(g) * n + i])) = {
            g, s.tokens[position], static_cast<std::int32_t>(position), context[position]};
      }
    }
  }

  /// The longest hit every group could be served from the cached blocks' KV; the anchor needs its
  /// whole chain, as the manager verifies prefixes through it.
  std::int32_t ideal_hit_blocks(std::span<const token_id> prompt, std::int64_t adapter, bool& group_limited) const {
    group_limited = false;
    if (!options().enable_prefix_caching) return 0;
    std::set<std::tuple<std::int32_t, std::int32_t, std::uint64_t>> cached;  // (group, block index, last context)
    for (block_id b = 0; b < manager.device_pool().capacity(); ++b) {
      if (!manager.cache().contains(b) || manager.cache().num_tokens_of(b) < block_size) continue;
      const stamp& last = kv[static_cast<std::size_t>((b + 1) * block_size - 1)];
      cached.emplace(last.group, last.position / block_size, last.context);
    }
    const std::vector<std::uint64_t> context = contexts(adapter, prompt);
    const auto present = [&](std::int32_t g, std::int32_t j) {
      return cached.contains({g, j, context[static_cast<std::size_t>((j + 1) * block_size - 1)]});
    };
    const std::int32_t limit = (static_cast<std::int32_t>(prompt.size()) - 1) / block_size;
    const std::int32_t anchor = manager.anchor_group();
    std::int32_t walked = 0;
    while (walked < limit && present(anchor, walked)) ++walked;
    for (std::int32_t k = walked; k > 0; --k) {
      bool served = true;
      for (std::int32_t g = 0; g < groups() && served; ++g) {
        if (g == anchor) continue;
        for (std::int32_t j = first_needed_block(g, k * block_size); j < k && served; ++j) served = present(g, j);
      }
      if (served) return k;
      group_limited = true;
    }
    return 0;
  }

  /// The longest partial hit after `hit` whole blocks that every group could copy: per group, the
  /// most leading tokens of the prompt's next (short of its last) that one of its cached blocks
  /// holds the KV of.
  std::int32_t ideal_partial_tokens(std::span<const token_id> prompt, std::int64_t adapter, std::int32_t hit) const {
    const std::int32_t first = hit * block_size;
    const std::int32_t most = std::min(block_size - 1, static_cast<std::int32_t>(prompt.size()) - 1 - first);
    if (!options().enable_prefix_caching || most <= 0) return 0;
    const std::vector<std::uint64_t> context = contexts(adapter, prompt);
    std::vector<std::int32_t> best(static_cast<std::size_t>(groups()), 0);
    for (block_id b = 0; b < manager.device_pool().capacity(); ++b) {
      if (!manager.cache().contains(b)) continue;
      const std::int32_t g = manager.cached_group(b);
      std::int32_t matched = 0;
      for (; matched < std::min(most, manager.cache().num_tokens_of(b)); ++matched) {
        const auto position = static_cast<std::size_t>(first + matched);
        const stamp expected{g, prompt[position], first + matched, context[position]};
        if (kv[static_cast<std::size_t>(b * block_size + matched)] != expected) break;
      }
      best[static_cast<std::size_t>(g)] = std::max(best[static_cast<std::size_t>(g)], matched);
    }
    return *std::min_element(best.begin(), best.end());
  }

  /// The manager let go of `seq`'s partial hit sources (mark_computed, free, truncate, swap out).
  void drop_pending(seq_id seq) {
    pending_sources.erase(seq);
    if (manager.contains(seq) && manager.has_partial_hit(seq)) RC_FAIL("sequence " + std::to_string(seq) + " still holds its partial hit's sources");
  }

  /// Frees `seq` (and forgets it). The blocks the manager keeps cached for partial hits must be
  /// its last, partly filled block of each group, holding its computed tokens there.
  void free_sequence(seq_id seq) {
    const std::int32_t computed = manager.num_computed_tokens(seq);
    const std::int32_t full = computed / block_size;
    const bool on_device = manager.where(seq) == location::device;
    std::vector<block_id> tails;
    for (std::int32_t g = 0; g < groups() && on_device && computed % block_size != 0; ++g) {
      tails.push_back(manager.table(seq, g).block(full));
    }
    std::vector<bool> was_cached(static_cast<std::size_t>(manager.device_pool().capacity()));
    for (block_id b = 0; b < manager.device_pool().capacity(); ++b) was_cached[static_cast<std::size_t>(b)] = manager.cache().contains(b);
    const std::vector<token_id> tokens = live.at(seq).tokens;
    manager.free(seq);
    live.erase(seq);
    drop_pending(seq);
    std::int32_t kept = 0;
    for (block_id b = 0; b < manager.device_pool().capacity(); ++b) {
      if (was_cached[static_cast<std::size_t>(b)] || !manager.cache().contains(b)) continue;
      const auto tail = std::find(tails.begin(), tails.end(), b);
      if (tail == tails.end()) RC_FAIL("block " + std::to_string(b) + " was cached when sequence " + std::to_string(seq) + " was freed");
      RC_ASSERT(options().enable_partial_reuse);
      RC_ASSERT(manager.cached_group(b) == static_cast<std::int32_t>(tail - tails.begin()));
      RC_ASSERT(manager.cache().num_tokens_of(b) == computed % block_size);
      const std::span<const token_id> stored = manager.cache().tokens_of(b);
      RC_ASSERT(std::equal(tokens.begin() + std::ptrdiff_t{full} * block_size, tokens.begin() + computed, stored.begin()));
      ++kept;
    }
    seen.cached_tails += kept > 0 ? 1 : 0;
  }

  std::string fingerprint() const {
    std::ostringstream out;
    for (const auto& [seq, s] : live) {
      out << seq << (manager.where(seq) == location::device ? 'd' : 'h') << manager.num_tokens(seq) << '/' << manager.num_computed_tokens(seq) << ':';
      for (std::int32_t g = 0; g < groups(); ++g) {
        for (block_id id : manager.table(seq, g).blocks()) out << id << ',';
        out << '|';
      }
    }
    for (block_id id = 0; id < manager.device_pool().capacity(); ++id) out << manager.device_pool().ref_count(id) << ',';
    out << manager.num_free_blocks() << '|' << manager.num_free_host_blocks() << '|' << manager.cache().num_cached_blocks();
    return out.str();
  }
  template <class Call>
  void expect_refused(errc code, Call&& call) {
    testing::expect_refused(code, [this] { return fingerprint(); }, std::forward<Call>(call));
  }

  void check_sequence(seq_id seq, const live_sequence& s, std::vector<std::int32_t>& refs, std::vector<std::int32_t>& host_refs,
                      std::vector<std::int32_t>& group_of, std::vector<std::int32_t>& held) {
    RC_ASSERT(manager.contains(seq));
    const std::span<const token_id> tokens = manager.tokens(seq);
    RC_ASSERT(std::equal(tokens.begin(), tokens.end(), s.tokens.begin(), s.tokens.end()));
    const auto n = static_cast<std::int32_t>(s.tokens.size());
    const std::int32_t computed = manager.num_computed_tokens(seq);
    RC_ASSERT(computed >= 0 && computed <= n);
    const std::vector<std::uint64_t> context = contexts(s.adapter, s.tokens);
    const bool on_device = manager.where(seq) == location::device;
    const std::vector<stamp>& read_from = memory(manager.where(seq));
    for (std::int32_t g = 0; g < groups(); ++g) {
      const block_table& table = manager.table(seq, g);
      RC_ASSERT(table.num_tokens() == n);
      RC_ASSERT(table.num_blocks() == (n + block_size - 1) / block_size);
      const std::int32_t first = std::min(first_needed_block(g, computed), table.num_blocks());
      for (std::int32_t j = 0; j < table.num_blocks(); ++j) {
        const block_id id = table.block(j);
        if (j < first) {
          if (id != null_block) RC_FAIL("group " + std::to_string(g) + " holds block " + std::to_string(j) + " outside its window");
          continue;
        }
        RC_ASSERT(id != null_block);
        if (!on_device) {
          ++host_refs[static_cast<std::size_t>(id)];
        } else {
          ++refs[static_cast<std::size_t>(id)];
          std::int32_t& owner = group_of[static_cast<std::size_t>(id)];
          if (owner != -1 && owner != g) RC_FAIL("block " + std::to_string(id) + " serves groups " + std::to_string(owner) + " and " + std::to_string(g));
          if (owner == -1) ++held[static_cast<std::size_t>(g)];
          owner = g;
        }
        for (std::int32_t i = j * block_size; i < std::min(n, (j + 1) * block_size); ++i) {
          // As a kernel reads it: the block table and the offset in the block.
          const stamp& read = read_from[static_cast<std::size_t>(slot_id{id} * block_size + i % block_size)];
          const stamp expected{g, s.tokens[static_cast<std::size_t>(i)], i, context[static_cast<std::size_t>(i)]};
          if (read != expected) {
            RC_FAIL("sequence " + std::to_string(seq) + " group " + std::to_string(g) + " reads a wrong KV at position " +
                    std::to_string(i) + ": group " + std::to_string(read.group) + " token " + std::to_string(read.token) +
                    " position " + std::to_string(read.position) + (read.context != expected.context ? " (other prefix)" : ""));
          }
        }
      }
    }
  }

  void check_invariants() {
    const std::int32_t capacity = manager.device_pool().capacity();
    for (block_id id = 0; id < capacity; ++id) {
      if (manager.device_pool().is_free(id)) std::fill_n(kv.begin() + std::ptrdiff_t{id} * block_size, block_size, poison);
    }
    const std::int32_t host_capacity = manager.host_pool().capacity();
    for (block_id id = 0; id < host_capacity; ++id) {
      if (manager.host_pool().is_free(id)) std::fill_n(host_kv.begin() + std::ptrdiff_t{id} * block_size, block_size, poison);
    }
    RC_ASSERT(manager.num_sequences() == live.size());
    std::vector<std::int32_t> refs(static_cast<std::size_t>(capacity), 0);
    std::vector<std::int32_t> host_refs(static_cast<std::size_t>(host_capacity), 0);
    std::vector<std::int32_t> group_of(static_cast<std::size_t>(capacity), -1);
    std::vector<std::int32_t> held(static_cast<std::size_t>(groups()), 0);
    for (const auto& [seq, s] : live) check_sequence(seq, s, refs, host_refs, group_of, held);
    std::vector<std::int32_t> source_refs(static_cast<std::size_t>(capacity), 0);  // partial hits' held sources
    for (const auto& [seq, sources] : pending_sources) {
      const std::span<const block_id> held_now = manager.partial_sources(seq);
      RC_ASSERT(held_now.size() == sources.size());
      for (std::size_t g = 0; g < sources.size(); ++g) {
        const auto& [source, before] = sources[g];
        RC_ASSERT(held_now[g] == source);
        ++source_refs[static_cast<std::size_t>(source)];
        RC_ASSERT(std::equal(before.begin(), before.end(), kv.begin() + std::ptrdiff_t{source} * block_size));
      }
      ++seen.held_sources;
    }
    if (options().num_host_blocks > 0) {
      std::int32_t free_host = 0;
      for (block_id id = 0; id < host_capacity; ++id) {
        RC_ASSERT(manager.host_pool().ref_count(id) == host_refs[static_cast<std::size_t>(id)]);
        free_host += host_refs[static_cast<std::size_t>(id)] == 0 ? 1 : 0;
      }
      RC_ASSERT(manager.num_free_host_blocks() == free_host);
    }
    std::int32_t free_blocks = 0;
    for (block_id id = 0; id < capacity; ++id) {
      const bool cached = manager.cache().contains(id);
      const std::int32_t expected = refs[static_cast<std::size_t>(id)] + source_refs[static_cast<std::size_t>(id)] + (cached ? 1 : 0);
      RC_ASSERT(manager.device_pool().ref_count(id) == expected);
      RC_ASSERT(manager.cache().is_idle(id) == (cached && expected == 1));
      if (cached && group_of[static_cast<std::size_t>(id)] != -1) RC_ASSERT(manager.cached_group(id) == group_of[static_cast<std::size_t>(id)]);
      if (cached) {  // a cached block holds the KV of its tokens, for its group
        const std::span<const token_id> tokens = manager.cache().tokens_of(id);
        for (std::int32_t o = 0; o < manager.cache().num_tokens_of(id); ++o) {
          const stamp& st = kv[static_cast<std::size_t>(id * block_size + o)];
          RC_ASSERT(st.group == manager.cached_group(id));
          RC_ASSERT(st.token == tokens[static_cast<std::size_t>(o)]);
        }
      }
      free_blocks += expected == 0 ? 1 : 0;
    }
    RC_ASSERT(manager.device_pool().num_free_blocks() == free_blocks);
    RC_ASSERT(manager.device_pool().num_free_blocks() + manager.device_pool().num_used_blocks() == capacity);
    RC_ASSERT(manager.num_free_blocks() == free_blocks + manager.cache().num_evictable_blocks());
    for (std::int32_t g = 0; g < groups(); ++g) RC_ASSERT(manager.num_held_blocks(g) == held[static_cast<std::size_t>(g)]);
    const kv_cache_usage u = manager.usage();
    RC_ASSERT(u.num_used_blocks == static_cast<std::int32_t>(std::count_if(refs.begin(), refs.end(), [](std::int32_t r) { return r > 0; })));
  }

  /// Null entries over every table: what windows released.
  std::int64_t null_entries() const {
    std::int64_t n = 0;
    for (const auto& [seq, s] : live) {
      for (std::int32_t g = 0; g < groups(); ++g) {
        for (block_id id : manager.table(seq, g).blocks()) n += id == null_block ? 1 : 0;
      }
    }
    return n;
  }

  void mark_computed(seq_id seq, std::int32_t num_tokens) {
    const std::int64_t before = null_entries();
    const std::int32_t free_before = manager.num_free_blocks();
    manager.mark_computed(seq, num_tokens);
    drop_pending(seq);  // the step that ran the copies is over
    const std::int64_t released = null_entries() - before;
    seen.released_blocks += released;
    // Released entries go back to the pool or, cached, to the idle cache; publishing takes none.
    RC_ASSERT(manager.num_free_blocks() >= free_before);
  }
};

// The kit's command state, sequence picks and prompts (shared prefixes up to 5 blocks: windows
// and chunks of up to 3 blocks need deeper hits to be served from their own blocks).
using testing::command_state;
using testing::detail::pick;
template <class Manager>
using command = rc::state::Command<command_state, model<Manager>>;

std::vector<token_id> make_tokens(std::int32_t block_size, bool with_prefix) {
  return testing::detail::make_tokens(block_size, with_prefix, 5);
}

template <class Manager>
struct allocate_cmd : command<Manager> {
  seq_id seq;
  std::optional<seq_id> source;  // a next turn of this sequence
  std::int32_t keep_percent;
  std::vector<token_id> tail;
  std::int64_t adapter;
  std::int32_t computed_percent;  // 0: a prefill in flight, its partial hit's copies not run yet
  bool partial_reuse;             // sequence_options::partial_reuse
  bool shared;                    // share the source's blocks in flight (allocate_shared)
  explicit allocate_cmd(const command_state& s)
      : seq(s.next_id),
        source(s.ids.empty() || *rc::gen::arbitrary<bool>() ? std::nullopt : std::optional(*rc::gen::elementOf(s.ids))),
        keep_percent(*rc::gen::inRange(0, 101)),
        tail(make_tokens(s.block_size, *rc::gen::weightedElement<bool>({{3, true}, {1, false}}))),
        adapter(*rc::gen::weightedElement<std::int64_t>({{5, 0}, {1, 1}})),
        computed_percent(*rc::gen::weightedElement<std::int32_t>({{4, 100}, {1, 0}, {1, 50}})),
        partial_reuse(*rc::gen::weightedElement<bool>({{4, true}, {1, false}})),
        shared(*rc::gen::weightedElement<bool>({{3, false}, {1, true}})) {}
  void apply(command_state& s) const override {
    s.ids.push_back(seq);
    ++s.next_id;
  }
  void run(const command_state&, model<Manager>& sut) const override {
    std::vector<token_id> prompt;
    std::int64_t key = adapter;
    std::int32_t num_shared = 0;
    if (source) {
      if (const auto it = sut.live.find(*source); it != sut.live.end()) {
        const auto keep = static_cast<std::int32_t>(it->second.tokens.size()) * keep_percent / 100;
        num_shared = shared ? keep / sut.block_size * sut.block_size : 0;
        prompt.assign(it->second.tokens.begin(), it->second.tokens.begin() + (num_shared > 0 ? num_shared : keep));
        key = num_shared > 0 ? it->second.adapter : it->second.adapter ^ adapter;
      }
    }
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    const sequence_options opts{.key = {.adapter_id = key, .cache_salt = {}}, .cache_priority = 0, .partial_reuse = partial_reuse};
    if (num_shared > 0 && num_shared < static_cast<std::int32_t>(prompt.size())) {
      allocate_shared(sut, prompt, key, num_shared);
      return;
    }
    const bool fits = sut.manager.num_blocks_to_allocate(prompt, opts) <= sut.manager.num_free_blocks();
    RC_ASSERT(sut.manager.can_allocate(prompt, opts) == fits);
    if (!fits) {
      sut.expect_refused(errc::out_of_blocks, [&] { sut.manager.allocate(seq, prompt, opts); });
      return;
    }
    bool group_limited = false;
    const std::int32_t ideal = sut.ideal_hit_blocks(prompt, key, group_limited);
    const std::int32_t free_before = sut.manager.num_free_blocks();
    const std::int32_t predicted = sut.manager.num_blocks_to_allocate(prompt, opts);
    const prefix_lookup looked = sut.manager.lookup(prompt, opts);
    const prefix_lookup totals_before = sut.manager.miss_totals();
    const hybrid_allocation a = sut.manager.allocate(seq, prompt, opts);
    // The lookup explains every token once, agrees with the allocation and adds to the totals.
    std::int64_t explained = a.lookup.num_hit_tokens + a.lookup.num_partial_hit_tokens;
    for (std::int64_t n : a.lookup.missed_tokens) explained += n;
    RC_ASSERT(explained == static_cast<std::int64_t>(prompt.size()));
    RC_ASSERT(looked.missed_tokens == a.lookup.missed_tokens);
    RC_ASSERT(looked.num_partial_hit_tokens == a.lookup.num_partial_hit_tokens);
    RC_ASSERT(a.lookup.num_hit_tokens + a.lookup.num_partial_hit_tokens == a.num_cached_tokens);
    RC_ASSERT(a.lookup.num_partial_hit_tokens == a.num_partial_tokens);
    RC_ASSERT(sut.manager.miss_totals().num_prompt_tokens == totals_before.num_prompt_tokens + static_cast<std::int64_t>(prompt.size()));
    if (sut.removals == 0) {  // nothing ever left the cache: no miss can blame a drop
      RC_ASSERT(a.lookup.missed(miss_reason::evicted) == 0);
      RC_ASSERT(a.lookup.missed(miss_reason::evicted_on_request) == 0);
      RC_ASSERT(a.lookup.missed(miss_reason::cache_reset) == 0);
    }
    sut.seen.group_missing_tokens += a.lookup.missed(miss_reason::group_missing);
    sut.seen.evicted_tokens += a.lookup.missed(miss_reason::evicted) + a.lookup.missed(miss_reason::evicted_on_request);
    RC_ASSERT(sut.manager.num_free_blocks() == free_before - predicted);
    RC_ASSERT(a.num_partial_tokens >= 0 && a.num_partial_tokens < sut.block_size);
    RC_ASSERT((a.num_cached_tokens - a.num_partial_tokens) % sut.block_size == 0);
    const std::int32_t hit = a.num_cached_tokens / sut.block_size;
    RC_ASSERT(hit <= ideal);
    if (sut.removals == 0) {
      RC_ASSERT(hit == ideal);
      ++sut.seen.exact_hit_checks;
    }
    if (hit > 0) {
      ++sut.seen.hits;
      for (std::int32_t g = 0; g < sut.groups(); ++g) sut.seen.window_hits += sut.manager.table(seq, g).block(0) == null_block ? 1 : 0;
    }
    sut.seen.group_limited_hits += group_limited && hit == ideal ? 1 : 0;
    RC_ASSERT(a.num_cached_tokens < static_cast<std::int32_t>(prompt.size()));
    RC_ASSERT(a.slots.size() == (prompt.size() - static_cast<std::size_t>(a.num_cached_tokens)) * static_cast<std::size_t>(sut.groups()));
    // A partial hit: never more than every group's cached blocks hold; each group's copy runs now,
    // before the prefill writes, and its source stays held until the sequence is computed.
    RC_ASSERT(a.num_partial_tokens <= sut.ideal_partial_tokens(prompt, key, hit));
    if (!sut.options().enable_partial_reuse || !partial_reuse) RC_ASSERT(a.num_partial_tokens == 0);
    RC_ASSERT(a.partial_copies.size() == (a.num_partial_tokens > 0 ? static_cast<std::size_t>(sut.groups()) : 0u));
    RC_ASSERT(sut.manager.has_partial_hit(seq) == (a.num_partial_tokens > 0));
    std::vector<std::pair<block_id, std::vector<stamp>>> sources;
    for (std::int32_t g = 0; g < static_cast<std::int32_t>(a.partial_copies.size()); ++g) {
      const block_copy& c = a.partial_copies[static_cast<std::size_t>(g)];
      RC_ASSERT(c.dst == sut.manager.table(seq, g).block(hit));
      RC_ASSERT(sut.manager.cached_group(c.src) == g);
      const auto src = sut.kv.begin() + std::ptrdiff_t{c.src} * sut.block_size;
      sources.emplace_back(c.src, std::vector<stamp>(src, src + sut.block_size));
      std::copy_n(src, sut.block_size, sut.kv.begin() + std::ptrdiff_t{c.dst} * sut.block_size);
    }
    if (!sources.empty()) {
      sut.pending_sources[seq] = std::move(sources);
      ++sut.seen.partial_hits;
    }
    sut.live.emplace(seq, live_sequence{prompt, key});
    sut.write(seq, a.num_cached_tokens, a.slots);
    const auto n = static_cast<std::int32_t>(prompt.size());
    if (computed_percent > 0) sut.mark_computed(seq, std::max(a.num_cached_tokens, n * computed_percent / 100));
    sut.check_invariants();
  }
  /// allocate_shared: the prompt's first `num_shared` tokens (whole blocks) are the source's,
  /// computed or not; refused (changing nothing) when the source is swapped out, the key differs,
  /// or a window of the source released a block the shorter sequence's next query reads.
  void allocate_shared(model<Manager>& sut, std::span<const token_id> prompt, std::int64_t key, std::int32_t num_shared) const {
    const sequence_options opts{.key = {.adapter_id = key, .cache_salt = {}}, .cache_priority = 0};
    if (sut.manager.where(*source) != location::device) {
      sut.expect_refused(errc::wrong_location, [&] { sut.manager.allocate_shared(seq, *source, num_shared, prompt, opts); });
      return;
    }
    const sequence_options other{.key = {.adapter_id = key ^ 1, .cache_salt = {}}, .cache_priority = 0};
    sut.expect_refused(errc::invalid_argument, [&] { sut.manager.allocate_shared(seq, *source, num_shared, prompt, other); });
    const std::int32_t computed = std::min(sut.manager.num_computed_tokens(*source), num_shared);
    bool allowed = true;
    for (std::int32_t g = 0; g < sut.groups(); ++g) {
      const block_table& table = sut.manager.table(*source, g);
      for (std::int32_t j = sut.first_needed_block(g, computed); j < num_shared / sut.block_size; ++j) {
        allowed = allowed && table.block(j) != null_block;
      }
    }
    if (!allowed) {
      sut.expect_refused(errc::invalid_argument, [&] { sut.manager.allocate_shared(seq, *source, num_shared, prompt, opts); });
      ++sut.seen.refused_shares;
      return;
    }
    const std::int32_t needed = sut.manager.num_blocks_to_allocate_shared(prompt, num_shared);
    if (needed > sut.manager.num_free_blocks()) {
      sut.expect_refused(errc::out_of_blocks, [&] { sut.manager.allocate_shared(seq, *source, num_shared, prompt, opts); });
      return;
    }
    const std::int32_t free_before = sut.manager.num_free_blocks();
    const hybrid_allocation a = sut.manager.allocate_shared(seq, *source, num_shared, prompt, opts);
    RC_ASSERT(sut.manager.num_free_blocks() == free_before - needed);
    RC_ASSERT(a.num_cached_tokens == num_shared);
    RC_ASSERT(a.lookup.num_shared_tokens == num_shared);
    std::int64_t explained = a.lookup.num_shared_tokens;
    for (std::int64_t n : a.lookup.missed_tokens) explained += n;
    RC_ASSERT(explained == static_cast<std::int64_t>(prompt.size()));
    RC_ASSERT(sut.manager.num_computed_tokens(seq) == computed);
    for (std::int32_t g = 0; g < sut.groups(); ++g) {
      for (std::int32_t j = 0; j < num_shared / sut.block_size; ++j) {
        RC_ASSERT(sut.manager.table(seq, g).block(j) == sut.manager.table(*source, g).block(j));
      }
    }
    ++sut.seen.shared_allocations;
    sut.live.emplace(seq, live_sequence{{prompt.begin(), prompt.end()}, key});
    sut.write(seq, num_shared, a.slots);
    sut.check_invariants();
  }
  void show(std::ostream& os) const override {
    os << "allocate " << seq;
    if (source) os << (shared ? " sharing " : " continuing ") << *source << " (" << keep_percent << "%)";
    os << " + " << tail.size() << " tokens, adapter " << adapter << ", " << computed_percent << "% computed"
       << (partial_reuse ? "" : ", partial reuse off");
  }
};
template <class Manager>
struct append_cmd : command<Manager> {
  seq_id seq;
  std::vector<token_id> tokens;
  bool compute;
  explicit append_cmd(const command_state& s)
      : seq(pick(s)), tokens(make_tokens(s.block_size, false)), compute(*rc::gen::weightedElement<bool>({{3, true}, {1, false}})) {}
  void run(const command_state&, model<Manager>& sut) const override {
    std::vector<slot_id> slots(tokens.size() * static_cast<std::size_t>(sut.groups()));
    if (!sut.manager.contains(seq)) {
      sut.expect_refused(errc::unknown_sequence, [&] { sut.manager.append(seq, tokens, slots); });
      return;
    }
    if (sut.manager.where(seq) == location::host) {
      sut.expect_refused(errc::wrong_location, [&] { sut.manager.append(seq, tokens, slots); });
      return;
    }
    const auto count = static_cast<std::int32_t>(tokens.size());
    sut.expect_refused(errc::invalid_argument, [&] { sut.manager.append(seq, tokens, std::span(slots).first(slots.size() - 1)); });
    if (!sut.manager.can_append(seq, count)) {
      sut.expect_refused(errc::out_of_blocks, [&] { sut.manager.append(seq, tokens, slots); });
      return;
    }
    const std::int32_t first = sut.manager.num_tokens(seq);
    for (const block_copy& c : sut.manager.append(seq, tokens, slots)) {
      std::copy_n(sut.kv.begin() + std::ptrdiff_t{c.src} * sut.block_size, sut.block_size, sut.kv.begin() + std::ptrdiff_t{c.dst} * sut.block_size);
      ++sut.seen.copies_on_write;
    }
    auto& history = sut.live.at(seq).tokens;
    history.insert(history.end(), tokens.begin(), tokens.end());
    sut.write(seq, first, slots);
    if (compute) sut.mark_computed(seq, sut.manager.num_tokens(seq));
    sut.check_invariants();
  }
  void show(std::ostream& os) const override { os << "append " << tokens.size() << " to " << seq << (compute ? "" : " (not computed)"); }
};

template <class Manager>
struct compute_cmd : command<Manager> {
  seq_id seq;
  std::int32_t percent;
  explicit compute_cmd(const command_state& s) : seq(pick(s)), percent(*rc::gen::inRange(0, 101)) {}
  void run(const command_state&, model<Manager>& sut) const override {
    if (!sut.manager.contains(seq)) return;
    const std::int32_t n = sut.manager.num_tokens(seq);
    sut.expect_refused(errc::invalid_argument, [&] { sut.manager.mark_computed(seq, n + 1); });
    sut.mark_computed(seq, n * percent / 100);
    sut.check_invariants();
  }
  void show(std::ostream& os) const override { os << "compute " << percent << "% of " << seq; }
};

/// Forks whole, or at a position: the child holds the parent's first tokens, sharing their blocks
/// in every group; refused (changing nothing) when a window released a block its next query reads.
template <class Manager>
struct fork_cmd : command<Manager> {
  seq_id parent;
  seq_id child;
  std::optional<std::int32_t> at_percent;  // none: the whole parent
  explicit fork_cmd(const command_state& s)
      : parent(pick(s)),
        child(s.next_id),
        at_percent(*rc::gen::arbitrary<bool>() ? std::nullopt : std::optional(*rc::gen::inRange(0, 101))) {}
  void apply(command_state& s) const override {
    s.ids.push_back(child);
    ++s.next_id;
  }
  void run(const command_state&, model<Manager>& sut) const override {
    if (!sut.manager.contains(parent)) {
      sut.expect_refused(errc::unknown_sequence, [&] { sut.manager.fork(parent, child); });
      return;
    }
    const std::int32_t length = sut.manager.num_tokens(parent);
    const std::int32_t at = at_percent ? std::max(1, length * *at_percent / 100) : length;
    const std::int32_t free_before = sut.manager.num_free_blocks();
    if (at_percent) {
      sut.expect_refused(errc::invalid_argument, [&] { sut.manager.fork(parent, child, length + 1); });
      const std::int32_t computed = std::min(sut.manager.num_computed_tokens(parent), at);
      bool allowed = true;
      for (std::int32_t g = 0; g < sut.groups(); ++g) {
        const block_table& table = sut.manager.table(parent, g);
        const std::int32_t need = sut.first_needed_block(g, computed);
        const std::int32_t kept = (at + table.block_size() - 1) / table.block_size();
        for (std::int32_t j = need; j < kept; ++j) allowed = allowed && table.block(j) != null_block;
      }
      if (!allowed) {
        sut.expect_refused(errc::invalid_argument, [&] { sut.manager.fork(parent, child, at); });
        ++sut.seen.refused_forks;
        return;
      }
      sut.manager.fork(parent, child, at);
      sut.seen.forks_in_a_block += at % sut.manager.block_size() != 0 && at < length ? 1 : 0;
    } else {
      sut.manager.fork(parent, child);
    }
    RC_ASSERT(sut.manager.num_free_blocks() == free_before);
    live_sequence branch = sut.live.at(parent);
    branch.tokens.resize(static_cast<std::size_t>(at));
    sut.live.emplace(child, std::move(branch));
    sut.expect_refused(errc::duplicate_sequence, [&] { sut.manager.fork(parent, child); });
    sut.check_invariants();
  }
  void show(std::ostream& os) const override {
    os << "fork " << parent << " -> " << child;
    if (at_percent) os << " at " << *at_percent << "%";
  }
};

template <class Manager>
using free_cmd = testing::free_model_cmd<model<Manager>>;

template <class Manager>
struct truncate_cmd : command<Manager> {
  seq_id seq;
  std::int32_t keep_percent;
  explicit truncate_cmd(const command_state& s) : seq(pick(s)), keep_percent(*rc::gen::inRange(0, 101)) {}
  void run(const command_state&, model<Manager>& sut) const override {
    if (!sut.manager.contains(seq)) return;
    const std::int32_t keep = std::max(1, sut.manager.num_tokens(seq) * keep_percent / 100);
    const std::int32_t computed = std::min(sut.manager.num_computed_tokens(seq), keep);
    bool allowed = true;
    for (std::int32_t g = 0; g < sut.groups(); ++g) {
      const block_table& table = sut.manager.table(seq, g);
      const std::int32_t need = sut.first_needed_block(g, computed);
      const std::int32_t kept = (keep + table.block_size() - 1) / table.block_size();
      for (std::int32_t j = need; j < kept; ++j) allowed = allowed && table.block(j) != null_block;
    }
    if (!allowed) {
      sut.expect_refused(errc::invalid_argument, [&] { sut.manager.truncate(seq, keep); });
      ++sut.seen.refused_truncates;
      return;
    }
    sut.manager.truncate(seq, keep);
    sut.drop_pending(seq);
    sut.live.at(seq).tokens.resize(static_cast<std::size_t>(keep));
    sut.check_invariants();
  }
  void show(std::ostream& os) const override { os << "truncate " << seq << " to " << keep_percent << "%"; }
};

/// Swaps a sequence out or in, alone or with every other live sequence at the same place.
template <class Manager>
struct swap_cmd : command<Manager> {
  seq_id seq;
  bool with_others;
  explicit swap_cmd(const command_state& s) : seq(pick(s)), with_others(*rc::gen::arbitrary<bool>()) {}
  void run(const command_state&, model<Manager>& sut) const override {
    if (!sut.manager.contains(seq)) return;
    const location from = sut.manager.where(seq);
    std::vector<seq_id> group{seq};
    if (with_others) {
      for (const auto& [other, s] : sut.live) {
        if (other != seq && sut.manager.where(other) == from) group.push_back(other);
      }
    }
    const bool out = from == location::device;
    if (!(out ? sut.manager.can_swap_out(group) : sut.manager.can_swap_in(group))) {
      sut.expect_refused(errc::out_of_blocks, [&] { out ? sut.manager.swap_out(group) : sut.manager.swap_in(group); });
      return;
    }
    std::vector<seq_id> twice = group;
    twice.push_back(seq);
    sut.expect_refused(errc::invalid_argument, [&] { out ? sut.manager.swap_out(twice) : sut.manager.swap_in(twice); });
    const std::vector<block_copy> copies = out ? sut.manager.swap_out(group) : sut.manager.swap_in(group);
    for (seq_id s : group) sut.drop_pending(s);  // swapped out: the copies ran, or never will
    const std::vector<stamp>& src = out ? sut.kv : sut.host_kv;
    std::vector<stamp>& dst = out ? sut.host_kv : sut.kv;
    for (const block_copy& c : copies) {
      std::copy_n(src.begin() + std::ptrdiff_t{c.src} * sut.block_size, sut.block_size, dst.begin() + std::ptrdiff_t{c.dst} * sut.block_size);
    }
    ++(out ? sut.seen.swaps_out : sut.seen.swaps_in);
    sut.check_invariants();
  }
  void show(std::ostream& os) const override { os << "swap " << seq << (with_others ? " with the rest" : ""); }
};

template <class Manager>
struct evict_cmd : command<Manager> {
  std::int32_t count;
  bool reset;
  explicit evict_cmd(const command_state&)
      : count(*rc::gen::inRange(0, 4)), reset(*rc::gen::weightedElement<bool>({{9, false}, {1, true}})) {}
  void run(const command_state&, model<Manager>& sut) const override {
    if (reset) {
      sut.manager.reset_prefix_cache();
      RC_ASSERT(sut.manager.cache().num_cached_blocks() == 0);
    } else {
      const std::int32_t evictable = sut.manager.cache().num_evictable_blocks();
      RC_ASSERT(sut.manager.evict_cached_blocks(count) == std::min(count, evictable));
    }
    sut.check_invariants();
  }
  void show(std::ostream& os) const override { os << (reset ? "reset cache" : "evict ") << count; }
};

kv_cache_spec any_spec(std::int32_t block_size) {
  const auto size = *rc::gen::inRange(1, 3 * block_size + 3);
  switch (*rc::gen::inRange(0, 4)) {
    case 0: return kv_cache_spec::sliding_window(size);
    case 1: return kv_cache_spec::chunked_local(size);
    default: return kv_cache_spec::full_attention();
  }
}

template <class Manager>
void run_property(coverage& seen) {
  ++seen.cases;
  const auto block_size = *rc::gen::element(1, 2, 3, 4, 7);
  const auto num_groups = *rc::gen::inRange(1, 4);
  std::vector<kv_cache_spec> groups;
  for (int g = 0; g < num_groups; ++g) groups.push_back(any_spec(block_size));
  const auto device_blocks = *rc::gen::inRange(2, 16 * num_groups);
  const hybrid_kv_cache_options options{.block_size = block_size,
                                        .num_device_blocks = device_blocks,
                                        .num_host_blocks = *rc::gen::element(0, 8, 32, 32),
                                        .groups = groups,
                                        .enable_prefix_caching = *rc::gen::weightedElement<bool>({{4, true}, {1, false}}),
                                        .enable_partial_reuse = *rc::gen::weightedElement<bool>({{3, true}, {1, false}}),
                                        .free_outside_window = *rc::gen::weightedElement<bool>({{3, true}, {1, false}})};
  model<Manager> sut(options, seen);
  command_state initial;
  initial.block_size = block_size;
  rc::state::check(initial, sut,
                   rc::state::gen::execOneOfWithArgs<allocate_cmd<Manager>, allocate_cmd<Manager>, allocate_cmd<Manager>,
                                                     append_cmd<Manager>, append_cmd<Manager>, compute_cmd<Manager>,
                                                     fork_cmd<Manager>, free_cmd<Manager>, free_cmd<Manager>,
                                                     truncate_cmd<Manager>, swap_cmd<Manager>, swap_cmd<Manager>,
                                                     evict_cmd<Manager>>());
  seen.evictions += sut.removals;
  for (const auto& [seq, s] : sut.live) sut.manager.free(seq);
  sut.live.clear();
  sut.pending_sources.clear();
  sut.manager.reset_prefix_cache();
  sut.check_invariants();
  RC_ASSERT(sut.manager.device_pool().num_free_blocks() == device_blocks);
  RC_ASSERT(sut.manager.num_free_host_blocks() == options.num_host_blocks);
}

template <class Manager>
void check_with_coverage() {
  coverage seen;
  ASSERT_TRUE(rc::check([&] { run_property<Manager>(seen); }));
  std::cout << "coverage over " << seen.cases << " cases: hits " << seen.hits << ", with null entries " << seen.window_hits
            << ", limited by a group " << seen.group_limited_hits << ", checked exact " << seen.exact_hit_checks
            << ", window releases " << seen.released_blocks << ", copies on write " << seen.copies_on_write
            << ", cache removals " << seen.evictions << ", truncates refused for a window " << seen.refused_truncates
            << ", forks inside a block " << seen.forks_in_a_block << ", refused for a window " << seen.refused_forks
            << ", swaps out " << seen.swaps_out << ", in " << seen.swaps_in << ", tokens missed for a group "
            << seen.group_missing_tokens << ", for an eviction " << seen.evicted_tokens << ", partial hits "
            << seen.partial_hits << ", sources held " << seen.held_sources << ", tails cached " << seen.cached_tails
            << ", shared allocations " << seen.shared_allocations << ", refused for a window " << seen.refused_shares << '\n';
  const std::int64_t floor = std::max<std::int64_t>(1, rc::detail::configuration().testParams.maxSuccess / 100);
  EXPECT_GE(seen.hits, floor);
  EXPECT_GE(seen.window_hits, floor);
  // 6-23 a 1000-case run with XXH3 (seeds 10-30), too few for the floor; the same path counted in
  // tokens (group_missing_tokens) clears it.
  EXPECT_GE(seen.group_limited_hits, 1);
  EXPECT_GE(seen.exact_hit_checks, floor);
  EXPECT_GE(seen.released_blocks, floor);
  EXPECT_GE(seen.copies_on_write, floor);
  EXPECT_GE(seen.evictions, floor);
  EXPECT_GE(seen.refused_truncates, floor);
  EXPECT_GE(seen.forks_in_a_block, floor);
  EXPECT_GE(seen.refused_forks, floor);
  EXPECT_GE(seen.swaps_out, floor);
  EXPECT_GE(seen.swaps_in, floor);
  EXPECT_GE(seen.group_missing_tokens, floor);
  EXPECT_GE(seen.evicted_tokens, floor);
  EXPECT_GE(seen.partial_hits, floor);
  EXPECT_GE(seen.held_sources, floor);
  EXPECT_GE(seen.cached_tails, floor);
  // 14-38 a 1000-case run (ModulusHash with priority eviction, seeds 1-40), 9 in one CI run (seed
  // 18319719552245107586): too spread for the floor.
  EXPECT_GE(seen.shared_allocations, 1);
  EXPECT_GE(seen.refused_shares, 1);
}

TEST(HybridKvCacheManagerStateful, LifoFreeListLruEviction) {
  check_with_coverage<hybrid_kv_cache_manager<lifo_free_list, xxh3_hash, lru_eviction>>();
}
TEST(HybridKvCacheManagerStateful, FifoFreeListPriorityEviction) {
  check_with_coverage<hybrid_kv_cache_manager<fifo_free_list, xxh3_hash, priority_eviction>>();
}

// Colliding hashes: group g's hash of position j is then often the anchor's of another position
// (depth_hash: of j + 1, with the same parent), so only the recorded group keeps groups apart.
TEST(HybridKvCacheManagerStateful, DepthHashLruEviction) {
  check_with_coverage<hybrid_kv_cache_manager<lru_free_list, testing::depth_hash, lru_eviction>>();
}
TEST(HybridKvCacheManagerStateful, ModulusHashPriorityEviction) {
  check_with_coverage<hybrid_kv_cache_manager<extent_free_list, testing::modulus_hash, priority_eviction>>();
}

TEST(HybridKvCacheManagerStateful, RcParamsReachTheTests) {
  EXPECT_EQ(rc::detail::configuration().testParams.maxSuccess, PAGEDKV_RC_CASES)
      << "RC_PARAMS did not reach the test: run it through ctest, or set RC_PARAMS=max_success=" << PAGEDKV_RC_CASES;
}

}  // namespace
}  // namespace pagedkv
