// RapidCheck stateful test of kv_cache_manager, for every policy combination.
//
// The harness keeps a simulated KV array per pool, indexed by slot, and stamps every slot the
// manager hands out with (token, position); copy-on-write and swap pairs are carried out on it as
// kernels would. After every command each live sequence must read back exactly its token history
// through its block table, and the reference counts must match the tables and the cache.
//
// The command generator's model only knows which sequence ids may be live; whether an allocation
// fits depends on the cache, so the harness decides from the manager's own can_* answers and
// checks that a refused call threw out_of_blocks and changed nothing. Runs: RC_PARAMS sets the
// number of command sequences (CMakeLists sets max_success); the seed is printed at start and a
// failure prints the string that reproduces it.
#include <pagedkv/kv_cache_manager.hpp>

#include "test_support.hpp"

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>
#include <rapidcheck/state.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <vector>

namespace pagedkv {
namespace {

/// Every block hashes alike, so the cache must rely on its verification alone.
struct colliding_hash {
  block_hash operator()(block_hash, std::span<const std::byte>) const noexcept { return 7; }
};

using test::stamp;
constexpr stamp poison{-99, -99};

template <class Manager>
struct harness {
  Manager m;
  std::int32_t block_size;
  std::vector<stamp> device_kv;
  std::vector<stamp> host_kv;
  std::map<seq_id, std::vector<token_id>> live;  // the model: each live sequence's tokens

  harness(const kv_cache_options& o)
      : m(o),
        block_size(o.block_size),
        device_kv(static_cast<std::size_t>(o.num_device_blocks * o.block_size), poison),
        host_kv(static_cast<std::size_t>(std::max(o.num_host_blocks, 1) * o.block_size), poison) {}

  std::vector<stamp>& kv(location where) { return where == location::device ? device_kv : host_kv; }

  void write(seq_id seq, std::int32_t first_position, std::span<const slot_id> slots) {
    std::vector<stamp>& memory = kv(m.where(seq));
    const std::vector<token_id>& tokens = live.at(seq);
    for (std::size_t i = 0; i < slots.size(); ++i) {
      const auto position = first_position + static_cast<std::int32_t>(i);
      memory.at(static_cast<std::size_t>(slots[i])) = {tokens[static_cast<std::size_t>(position)], position};
    }
  }

  void copy_block(const std::vector<stamp>& from, block_id src, std::vector<stamp>& to, block_id dst) {
    test::copy_block(from, src, to, dst, block_size);
  }

  /// Everything observable, to show that a refused call changed nothing.
  std::string fingerprint() const {
    std::ostringstream out;
    for (const auto& [seq, tokens] : live) {
      out << seq << (m.where(seq) == location::device ? 'd' : 'h') << m.num_tokens(seq) << ':';
      for (block_id id : m.table(seq).blocks()) out << id << ',';
      out << ';';
    }
    for (block_id id = 0; id < m.device_pool().capacity(); ++id) out << m.device_pool().ref_count(id) << ',';
    out << '|' << m.num_free_blocks() << '|' << m.num_free_host_blocks() << '|' << m.cache().num_cached_blocks();
    return out.str();
  }

  template <class Call>
  void expect_refused(errc code, Call&& call) {
    const std::string before = fingerprint();
    try {
      call();
      RC_FAIL("call succeeded where it should have thrown");
    } catch (const error& e) {
      RC_ASSERT(e.code() == code);
    }
    RC_ASSERT(fingerprint() == before);
  }

  /// Poisons the slots of free blocks, so that reading a freed block can never pass the check.
  void poison_free_blocks() {
    for (block_id id = 0; id < m.device_pool().capacity(); ++id) {
      if (m.device_pool().is_free(id)) {
        std::fill_n(device_kv.begin() + std::ptrdiff_t{id} * block_size, block_size, poison);
      }
    }
    if (m.options().num_host_blocks == 0) return;
    for (block_id id = 0; id < m.host_pool().capacity(); ++id) {
      if (m.host_pool().is_free(id)) std::fill_n(host_kv.begin() + std::ptrdiff_t{id} * block_size, block_size, poison);
    }
  }

  void check_invariants() {
    poison_free_blocks();
    RC_ASSERT(m.num_sequences() == live.size());
    std::vector<std::int32_t> device_refs(static_cast<std::size_t>(m.device_pool().capacity()), 0);
    std::vector<std::int32_t> host_refs(static_cast<std::size_t>(m.host_pool().capacity()), 0);
    for (const auto& [seq, tokens] : live) {
      RC_ASSERT(m.contains(seq));
      const std::span<const token_id> held = m.tokens(seq);
      RC_ASSERT(std::equal(held.begin(), held.end(), tokens.begin(), tokens.end()));
      const block_table& table = m.table(seq);
      RC_ASSERT(table.num_tokens() == static_cast<std::int32_t>(tokens.size()));
      RC_ASSERT(table.num_blocks() == (table.num_tokens() + block_size - 1) / block_size);
      const std::vector<stamp>& memory = kv(m.where(seq));
      for (std::int32_t i = 0; i < table.num_tokens(); ++i) {
        const stamp expected{tokens[static_cast<std::size_t>(i)], i};
        if (memory[static_cast<std::size_t>(table.slot(i))] != expected) {
          RC_FAIL("sequence " + std::to_string(seq) + " reads a wrong KV at position " + std::to_string(i));
        }
      }
      auto& refs = m.where(seq) == location::device ? device_refs : host_refs;
      for (block_id id : table.blocks()) ++refs[static_cast<std::size_t>(id)];
    }
    std::int32_t free_blocks = 0;
    for (block_id id = 0; id < m.device_pool().capacity(); ++id) {
      const bool cached = m.cache().contains(id);
      const std::int32_t expected = device_refs[static_cast<std::size_t>(id)] + (cached ? 1 : 0);
      RC_ASSERT(m.device_pool().ref_count(id) == expected);
      RC_ASSERT(m.cache().is_idle(id) == (cached && expected == 1));
      free_blocks += expected == 0 ? 1 : 0;
    }
    RC_ASSERT(m.device_pool().num_free_blocks() == free_blocks);
    RC_ASSERT(m.num_free_blocks() == free_blocks + m.cache().num_evictable_blocks());
    if (m.options().num_host_blocks > 0) {
      std::int32_t free_host = 0;
      for (block_id id = 0; id < m.host_pool().capacity(); ++id) {
        RC_ASSERT(m.host_pool().ref_count(id) == host_refs[static_cast<std::size_t>(id)]);
        free_host += host_refs[static_cast<std::size_t>(id)] == 0 ? 1 : 0;
      }
      RC_ASSERT(m.host_pool().num_free_blocks() == free_host);
    }
    const kv_cache_usage u = m.usage();
    const auto read_blocks = static_cast<std::int32_t>(std::count_if(device_refs.begin(), device_refs.end(), [](std::int32_t r) { return r > 0; }));
    RC_ASSERT(u.num_used_blocks == read_blocks);
    RC_ASSERT(u.num_live_tokens <= std::int64_t{read_blocks} * block_size);
    RC_ASSERT(u.num_live_tokens >= read_blocks);  // every referenced block holds a token
    RC_ASSERT(u.utilization >= 0.0 && u.utilization <= 1.0);
  }
};

struct model {
  std::vector<seq_id> ids;  // sequences that may be live (an allocation may have been refused)
  seq_id next_id = 1;
  std::int32_t block_size = 1;
};

template <class Manager>
using command = rc::state::Command<model, harness<Manager>>;

seq_id pick(const model& s) {
  RC_PRE(!s.ids.empty());
  return *rc::gen::elementOf(s.ids);
}

/// Prompts start with one of three shared "system prompts" often enough to hit the cache, and use
/// a tiny alphabet so that equal blocks under different parents are common.
std::vector<token_id> make_tokens(std::int32_t block_size, bool with_prefix) {
  std::vector<token_id> tokens;
  if (with_prefix) {
    const auto family = *rc::gen::inRange(0, 3);
    const auto length = *rc::gen::inRange(0, 3 * block_size + 2);
    for (int i = 0; i < length; ++i) tokens.push_back(family * 1000 + i);
  }
  const auto tail = *rc::gen::inRange(1, 2 * block_size + 2);
  for (int i = 0; i < tail; ++i) tokens.push_back(*rc::gen::inRange(0, 3));
  return tokens;
}

template <class Manager>
struct allocate_cmd : command<Manager> {
  seq_id seq;
  std::vector<token_id> prompt;
  std::int32_t priority;
  explicit allocate_cmd(const model& s)
      : seq(s.next_id),
        prompt(make_tokens(s.block_size, *rc::gen::arbitrary<bool>())),
        priority(*rc::gen::element(0, 1, 2, pinned_priority)) {}
  void apply(model& s) const override {
    s.ids.push_back(seq);
    ++s.next_id;
  }
  void run(const model&, harness<Manager>& h) const override {
    const sequence_options opts{.key = {}, .cache_priority = priority};
    const bool fits = h.m.num_blocks_to_allocate(prompt, opts) <= h.m.num_free_blocks();
    RC_ASSERT(h.m.can_allocate(prompt, opts) == fits);  // the tests run with no watermark
    if (!fits) {
      h.expect_refused(errc::out_of_blocks, [&] { h.m.allocate(seq, prompt, opts); });
      return;
    }
    const allocation a = h.m.allocate(seq, prompt, opts);
    RC_ASSERT(a.num_cached_tokens % h.block_size == 0);
    RC_ASSERT(a.num_cached_tokens < static_cast<std::int32_t>(prompt.size()));
    RC_ASSERT(a.slots.size() == prompt.size() - static_cast<std::size_t>(a.num_cached_tokens));
    h.live.emplace(seq, prompt);
    h.write(seq, a.num_cached_tokens, a.slots);
    h.m.mark_computed(seq, static_cast<std::int32_t>(prompt.size()));
    h.check_invariants();
  }
  void show(std::ostream& os) const override { os << "allocate " << seq << " (" << prompt.size() << " tokens)"; }
};

template <class Manager>
struct append_cmd : command<Manager> {
  seq_id seq;
  std::vector<token_id> tokens;
  explicit append_cmd(const model& s) : seq(pick(s)), tokens(make_tokens(s.block_size, false)) {}
  void run(const model&, harness<Manager>& h) const override {
    std::vector<slot_id> slots(tokens.size());
    if (!h.m.contains(seq)) {
      h.expect_refused(errc::unknown_sequence, [&] { h.m.append(seq, tokens, slots); });
      return;
    }
    if (h.m.where(seq) == location::host) {
      h.expect_refused(errc::wrong_location, [&] { h.m.append(seq, tokens, slots); });
      return;
    }
    const auto count = static_cast<std::int32_t>(tokens.size());
    if (!h.m.can_append(seq, count)) {
      h.expect_refused(errc::out_of_blocks, [&] { h.m.append(seq, tokens, slots); });
      return;
    }
    const std::int32_t first = h.m.num_tokens(seq);
    const std::optional<block_copy> copy = h.m.append(seq, tokens, slots);
    if (copy) h.copy_block(h.device_kv, copy->src, h.device_kv, copy->dst);
    auto& history = h.live.at(seq);
    history.insert(history.end(), tokens.begin(), tokens.end());
    h.write(seq, first, slots);
    h.m.mark_computed(seq, h.m.num_tokens(seq));
    h.check_invariants();
  }
  void show(std::ostream& os) const override { os << "append " << tokens.size() << " to " << seq; }
};

template <class Manager>
struct fork_cmd : command<Manager> {
  seq_id parent;
  seq_id child;
  explicit fork_cmd(const model& s) : parent(pick(s)), child(s.next_id) {}
  void apply(model& s) const override {
    s.ids.push_back(child);
    ++s.next_id;
  }
  void run(const model&, harness<Manager>& h) const override {
    if (!h.m.contains(parent)) {
      h.expect_refused(errc::unknown_sequence, [&] { h.m.fork(parent, child); });
      return;
    }
    const std::int32_t free_before = h.m.num_free_blocks();
    h.m.fork(parent, child);
    RC_ASSERT(h.m.num_free_blocks() == free_before);  // sharing allocates nothing
    h.live.emplace(child, h.live.at(parent));
    h.check_invariants();
  }
  void show(std::ostream& os) const override { os << "fork " << parent << " -> " << child; }
};

template <class Manager>
struct free_cmd : command<Manager> {
  seq_id seq;
  explicit free_cmd(const model& s) : seq(pick(s)) {}
  void apply(model& s) const override { std::erase(s.ids, seq); }
  void run(const model&, harness<Manager>& h) const override {
    if (!h.m.contains(seq)) {
      h.expect_refused(errc::unknown_sequence, [&] { h.m.free(seq); });
      return;
    }
    h.m.free(seq);
    h.live.erase(seq);
    h.expect_refused(errc::unknown_sequence, [&] { h.m.free(seq); });  // a double free is refused
    h.check_invariants();
  }
  void show(std::ostream& os) const override { os << "free " << seq; }
};

template <class Manager>
struct truncate_cmd : command<Manager> {
  seq_id seq;
  std::int32_t keep_percent;
  explicit truncate_cmd(const model& s) : seq(pick(s)), keep_percent(*rc::gen::inRange(0, 101)) {}
  void run(const model&, harness<Manager>& h) const override {
    if (!h.m.contains(seq)) return;
    const std::int32_t keep = std::max(1, h.m.num_tokens(seq) * keep_percent / 100);
    h.expect_refused(errc::invalid_argument, [&] { h.m.truncate(seq, h.m.num_tokens(seq) + 1); });
    h.m.truncate(seq, keep);
    h.live.at(seq).resize(static_cast<std::size_t>(keep));
    h.check_invariants();
  }
  void show(std::ostream& os) const override { os << "truncate " << seq << " to " << keep_percent << "%"; }
};

/// Swaps a sequence out or in together with its live forks that share its location.
template <class Manager>
struct swap_cmd : command<Manager> {
  seq_id seq;
  bool with_others;
  explicit swap_cmd(const model& s) : seq(pick(s)), with_others(*rc::gen::arbitrary<bool>()) {}
  void run(const model&, harness<Manager>& h) const override {
    if (!h.m.contains(seq)) return;
    const location from = h.m.where(seq);
    std::vector<seq_id> group{seq};
    if (with_others) {
      for (const auto& [other, tokens] : h.live) {
        if (other != seq && h.m.where(other) == from) group.push_back(other);
      }
    }
    if (from == location::device) {
      if (!h.m.can_swap_out(group)) {
        h.expect_refused(errc::out_of_blocks, [&] { h.m.swap_out(group); });
        return;
      }
      for (const block_copy& c : h.m.swap_out(group)) h.copy_block(h.device_kv, c.src, h.host_kv, c.dst);
    } else {
      if (!h.m.can_swap_in(group)) {
        h.expect_refused(errc::out_of_blocks, [&] { h.m.swap_in(group); });
        return;
      }
      for (const block_copy& c : h.m.swap_in(group)) h.copy_block(h.host_kv, c.src, h.device_kv, c.dst);
    }
    h.check_invariants();
  }
  void show(std::ostream& os) const override { os << "swap " << seq << (with_others ? " with the rest" : ""); }
};

template <class Manager>
struct evict_cmd : command<Manager> {
  std::int32_t count;
  bool reset;
  explicit evict_cmd(const model&) : count(*rc::gen::inRange(0, 4)), reset(*rc::gen::weightedElement<bool>({{9, false}, {1, true}})) {}
  void run(const model&, harness<Manager>& h) const override {
    if (reset) {
      h.m.reset_prefix_cache();
      RC_ASSERT(h.m.cache().num_cached_blocks() == 0);
    } else {
      const std::int32_t evictable = h.m.cache().num_evictable_blocks();
      RC_ASSERT(h.m.evict_cached_blocks(count) == std::min(count, evictable));
    }
    h.check_invariants();
  }
  void show(std::ostream& os) const override { os << (reset ? "reset cache" : "evict ") << count; }
};

template <class Manager>
void run_stateful_property() {
  const auto block_size = *rc::gen::element(1, 2, 3, 4, 7);
  const auto device_blocks = *rc::gen::inRange(2, 24);
  const auto host_blocks = *rc::gen::element(0, 4, 16);
  const bool caching = *rc::gen::weightedElement<bool>({{4, true}, {1, false}});
  constexpr bool extents = locality_free_list_policy<typename Manager::pool_type::free_list_type>;
  harness<Manager> h(kv_cache_options{.block_size = block_size,
                                      .num_device_blocks = device_blocks,
                                      .num_host_blocks = host_blocks,
                                      .enable_prefix_caching = caching,
                                      .extent_blocks = extents ? *rc::gen::inRange(1, device_blocks + 1) : 0});
  model initial;
  initial.block_size = block_size;
  rc::state::check(initial, h, rc::state::gen::execOneOfWithArgs<
                                   allocate_cmd<Manager>, allocate_cmd<Manager>, append_cmd<Manager>,
                                   append_cmd<Manager>, fork_cmd<Manager>, free_cmd<Manager>,
                                   truncate_cmd<Manager>, swap_cmd<Manager>, evict_cmd<Manager>>());
  // Freeing everything returns every block.
  for (const auto& [seq, tokens] : h.live) h.m.free(seq);
  h.live.clear();
  h.m.reset_prefix_cache();
  h.check_invariants();
  RC_ASSERT(h.m.device_pool().num_free_blocks() == device_blocks);
  RC_ASSERT(h.m.num_free_host_blocks() == host_blocks);
}

RC_GTEST_PROP(KvCacheManagerStateful, LifoFreeListLruEviction, ()) {
  run_stateful_property<kv_cache_manager<lifo_free_list, xxh3_hash, lru_eviction>>();
}
RC_GTEST_PROP(KvCacheManagerStateful, FifoFreeListLruEviction, ()) {
  run_stateful_property<kv_cache_manager<fifo_free_list, xxh3_hash, lru_eviction>>();
}
RC_GTEST_PROP(KvCacheManagerStateful, LruFreeListLruEviction, ()) {
  run_stateful_property<kv_cache_manager<lru_free_list, xxh3_hash, lru_eviction>>();
}
RC_GTEST_PROP(KvCacheManagerStateful, ExtentFreeListLruEviction, ()) {
  run_stateful_property<kv_cache_manager<extent_free_list, xxh3_hash, lru_eviction>>();
}
RC_GTEST_PROP(KvCacheManagerStateful, LifoFreeListPriorityEviction, ()) {
  run_stateful_property<kv_cache_manager<lifo_free_list, xxh3_hash, priority_eviction>>();
}
RC_GTEST_PROP(KvCacheManagerStateful, FifoFreeListPriorityEviction, ()) {
  run_stateful_property<kv_cache_manager<fifo_free_list, xxh3_hash, priority_eviction>>();
}
RC_GTEST_PROP(KvCacheManagerStateful, LruFreeListPriorityEviction, ()) {
  run_stateful_property<kv_cache_manager<lru_free_list, xxh3_hash, priority_eviction>>();
}
RC_GTEST_PROP(KvCacheManagerStateful, CollidingHashLruEviction, ()) {
  run_stateful_property<kv_cache_manager<lifo_free_list, colliding_hash, lru_eviction>>();
}
RC_GTEST_PROP(KvCacheManagerStateful, CollidingHashPriorityEviction, ()) {
  run_stateful_property<kv_cache_manager<fifo_free_list, colliding_hash, priority_eviction>>();
}

}  // namespace
}  // namespace pagedkv
