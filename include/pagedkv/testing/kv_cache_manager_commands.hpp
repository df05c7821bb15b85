// The commands of the kv_cache_manager conformance property (pagedkv::testing): RapidCheck
// stateful commands that drive a kv_cache_manager_model (kv_cache_manager_model.hpp) and check it
// after each, and run_kv_cache_manager_property(), one property over random pools and sequences.
//
// Commands: allocate (fresh prompts, next turns of live sequences, probes built from cached
// chains; a third computed later, as prefills in flight), append (with copy-on-write), compute,
// fork (whole or at a position), free (and a refused double free), truncate, swap out and in (alone or with every sequence
// in the same pool), evict and reset the prefix cache. Pools are tiny (2-23 device blocks) and
// block sizes odd (1, 2, 3, 4, 7), so refusals and evictions are common.
//
// The commands' state (command_state) only knows which sequence ids may be live; whether an
// allocation fits depends on the cache, so a command decides from the manager's own can_* answers
// and checks that a refused call threw out_of_blocks and changed nothing. Commands are generated
// by RapidCheck, so a failure is shrunk to a short sequence and printed with the string that
// reproduces it. Pulls in RapidCheck.
#pragma once

#include <pagedkv/kv_cache_manager.hpp>
#include <pagedkv/testing/kv_cache_manager_model.hpp>

#include <rapidcheck.h>
#include <rapidcheck/state.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <optional>
#include <ostream>
#include <utility>
#include <vector>

namespace pagedkv::testing {

/// What command generation knows: the sequence ids that may be live (an allocation may have been
/// refused), the next fresh id, and the block size.
struct command_state {
  std::vector<seq_id> ids;
  seq_id next_id = 1;
  std::int32_t block_size = 1;
};

template <class Manager>
using command = rc::state::Command<command_state, kv_cache_manager_model<Manager>>;

namespace detail {

inline seq_id pick(const command_state& s) {
  RC_PRE(!s.ids.empty());
  return *rc::gen::elementOf(s.ids);
}

/// Prompts start with one of three shared "system prompts" (up to prefix_blocks blocks and a bit)
/// often enough to hit the cache, and use a tiny alphabet so that equal blocks under different
/// parents are common.
inline std::vector<token_id> make_tokens(std::int32_t block_size, bool with_prefix, std::int32_t prefix_blocks = 3) {
  std::vector<token_id> tokens;
  if (with_prefix) {
    const auto family = *rc::gen::inRange(0, 3);
    const auto length = *rc::gen::inRange(0, prefix_blocks * block_size + 2);
    for (int i = 0; i < length; ++i) tokens.push_back(family * 1000 + i);
  }
  const auto tail = *rc::gen::inRange(1, 2 * block_size + 2);
  for (int i = 0; i < tail; ++i) tokens.push_back(*rc::gen::inRange(0, 3));
  return tokens;
}

}  // namespace detail

/// Where an allocation's prompt comes from. A next turn is a prefix of a live sequence's history
/// (often whole blocks, so that its last block repeats a cached one without hitting it) and new
/// tokens. A cache probe is the tokens of a cached chain followed by those of another cached block
/// (the chain's child or not), so that lookups reach deep chain positions and meet blocks whose
/// parent is another block, or an earlier generation of the same block.
enum class prompt_origin { fresh, next_turn, cache_probe };

template <class Manager>
struct allocate_cmd : command<Manager> {
  seq_id seq;
  prompt_origin origin;
  std::optional<seq_id> source;  // next turn: the live sequence continued
  std::int32_t keep_percent;     // next turn: how much of its history
  bool whole_blocks;             // next turn: rounded down to whole blocks
  std::uint32_t chain_pick;      // cache probe: which cached chain (resolved when run)
  std::uint32_t block_pick;      // cache probe: which cached block follows it
  std::vector<token_id> tail;
  std::int32_t priority;
  std::int64_t adapter;  // a key_id (key_of) or a shift of one: another adapter or tenant salt must not hit
  bool deferred;         // computed later (compute_cmd), as a prefill still in flight
  explicit allocate_cmd(const command_state& s)
      : seq(s.next_id),
        origin(*rc::gen::element(prompt_origin::fresh, prompt_origin::next_turn, prompt_origin::cache_probe)),
        source(origin != prompt_origin::next_turn || s.ids.empty() ? std::nullopt
                                                                    : std::optional(*rc::gen::elementOf(s.ids))),
        keep_percent(*rc::gen::inRange(0, 101)),
        whole_blocks(*rc::gen::arbitrary<bool>()),
        chain_pick(*rc::gen::arbitrary<std::uint32_t>()),
        block_pick(*rc::gen::arbitrary<std::uint32_t>()),
        tail(origin != prompt_origin::fresh && *rc::gen::arbitrary<bool>()
                 ? std::vector<token_id>{}
                 : detail::make_tokens(s.block_size, origin == prompt_origin::fresh && *rc::gen::arbitrary<bool>())),
        priority(*rc::gen::element(0, 1, 2, pinned_priority)),
        adapter(*rc::gen::weightedElement<std::int64_t>({{10, 0}, {1, 1}, {2, 2}, {2, 4}})),
        deferred(*rc::gen::weightedElement<bool>({{2, false}, {1, true}})) {}
  void apply(command_state& s) const override {
    s.ids.push_back(seq);
    ++s.next_id;
  }
  /// The prompt and its prefix key (a key_id). A fresh prompt's key is this command's `adapter`;
  /// a next turn or a probe keeps the key of what it continues unless `adapter` shifts it (one in
  /// three): to the other adapter, or to another tenant's salt.
  std::pair<std::vector<token_id>, std::int64_t> prompt(const kv_cache_manager_model<Manager>& sut) const {
    std::vector<token_id> tokens;
    std::int64_t key = adapter;
    if (source) {
      if (const auto it = sut.live.find(*source); it != sut.live.end()) {
        auto keep = static_cast<std::int32_t>(it->second.tokens.size()) * keep_percent / 100;
        if (whole_blocks) keep -= keep % sut.block_size;
        tokens.assign(it->second.tokens.begin(), it->second.tokens.begin() + keep);
        key = (it->second.adapter + adapter) % num_key_ids;
      }
    } else if (origin == prompt_origin::cache_probe && !sut.mirror.empty()) {
      // Half the probes aim at a block cached under an earlier generation of a block id that is
      // cached again: its parent's id, now holding something else, then the block's tokens.
      std::vector<block_id> stale;
      for (const auto& [id, b] : sut.mirror) {
        if (b.parent.block != null_block && sut.mirror.contains(b.parent.block) &&
            sut.generation[static_cast<std::size_t>(b.parent.block)] != b.parent.generation) {
          stale.push_back(id);
        }
      }
      block_id chain = std::next(sut.mirror.begin(), chain_pick % sut.mirror.size())->first;
      block_id next = std::next(sut.mirror.begin(), block_pick % sut.mirror.size())->first;
      if (chain_pick % 2 == 0 && !stale.empty()) {
        next = stale[block_pick % stale.size()];
        chain = sut.mirror.at(next).parent.block;
      }
      std::int64_t root_adapter = 0;
      if (sut.chain_tokens(chain, tokens, root_adapter)) key = (root_adapter + adapter) % num_key_ids;
      const std::vector<token_id>& next_tokens = sut.mirror.at(next).tokens;
      tokens.insert(tokens.end(), next_tokens.begin(), next_tokens.end());
      if (tail.empty()) tokens.push_back(0);  // so that the lookup may reach the last block
    }
    tokens.insert(tokens.end(), tail.begin(), tail.end());
    if (tokens.empty()) tokens.push_back(0);
    return {tokens, key};
  }
  void run(const command_state&, kv_cache_manager_model<Manager>& sut) const override {
    const auto [prompt, key] = this->prompt(sut);
    const sequence_options opts{.key = sut.key(key), .cache_priority = priority};
    const bool fits = sut.manager.num_blocks_to_allocate(prompt, opts) <= sut.manager.num_free_blocks();
    RC_ASSERT(sut.manager.can_allocate(prompt, opts) == fits);  // the tests run with no watermark
    if (!fits) {
      sut.expect_refused(errc::out_of_blocks, [&] { sut.manager.allocate(seq, prompt, opts); });
      return;
    }
    chain_link last{};
    const std::int32_t expected_hits = sut.expected_hit_blocks(prompt, key, last);
    const std::int32_t matched = sut.expected_partial_tokens(prompt, key, expected_hits, last);
    std::int32_t expected_partial = sut.manager.options().enable_partial_reuse ? matched : 0;
    const prefix_lookup looked = sut.manager.lookup(prompt, opts);
    const std::int32_t free_before = sut.manager.num_free_blocks();
    sequence_options plain = opts;
    plain.partial_reuse = false;
    const std::int32_t without_partial = sut.manager.num_blocks_to_allocate(prompt, plain);
    const allocation a = sut.manager.allocate(seq, prompt, opts);
    if (expected_partial > 0 && !a.partial_copy) {
      // Left out for room: holding its idle source would not have fitted beside the other blocks.
      RC_ASSERT(without_partial + 1 > free_before);
      ++sut.seen.partial_hits_without_room;
      expected_partial = 0;
    }
    RC_ASSERT(a.num_cached_tokens == expected_hits * sut.block_size + expected_partial);
    RC_ASSERT(a.num_partial_tokens == expected_partial);
    RC_ASSERT(a.partial_copy.has_value() == (expected_partial > 0));
    // Every prompt token is a hit, a partial hit or a miss with a reason; the tokens a partial hit
    // would have served with partial reuse off miss below the hit granularity.
    RC_ASSERT(a.lookup.num_hit_tokens == expected_hits * sut.block_size);
    RC_ASSERT(a.lookup.num_partial_hit_tokens == expected_partial);
    std::int64_t explained = a.lookup.num_hit_tokens + a.lookup.num_partial_hit_tokens;
    for (std::int64_t n : a.lookup.missed_tokens) explained += n;
    RC_ASSERT(explained == static_cast<std::int64_t>(prompt.size()));
    if (sut.manager.options().enable_prefix_caching) {
      RC_ASSERT(a.lookup.missed(miss_reason::partial_block) >= 1 + matched - expected_partial);
    }
    RC_ASSERT(looked.missed_tokens == a.lookup.missed_tokens);  // lookup() predicts allocate()
    RC_ASSERT(looked.num_partial_hit_tokens == a.lookup.num_partial_hit_tokens);
    sut.seen.long_hits += expected_hits >= 2 ? 1 : 0;
    RC_ASSERT(a.num_cached_tokens < static_cast<std::int32_t>(prompt.size()));
    RC_ASSERT(a.slots.size() == prompt.size() - static_cast<std::size_t>(a.num_cached_tokens));
    sut.live.emplace(seq, live_sequence{prompt, key});
    if (a.partial_copy) {
      // The copy runs before the prefill writes (the step plan's order); the source stays held
      // until the sequence is computed.
      RC_ASSERT(a.partial_copy->dst == sut.manager.table(seq).block(expected_hits));
      RC_ASSERT(sut.manager.has_partial_hit(seq));
      const auto src = std::ptrdiff_t{a.partial_copy->src} * sut.block_size;
      sut.pending_copies[seq] = {a.partial_copy->src, {sut.device_kv.begin() + src, sut.device_kv.begin() + src + sut.block_size}};
      sut.copy_block(sut.device_kv, a.partial_copy->src, sut.device_kv, a.partial_copy->dst);
      ++sut.seen.partial_hits;
    }
    sut.write(seq, a.num_cached_tokens, a.slots);
    if (!deferred) sut.mark_computed(seq);
    sut.check_invariants();
  }
  void show(std::ostream& os) const override {
    os << "allocate " << seq << (deferred ? " (computed later)" : "");
    if (source) os << " continuing " << *source << " (" << keep_percent << "%" << (whole_blocks ? " in whole blocks" : "") << ")";
    if (origin == prompt_origin::cache_probe) os << " probing cached chain " << chain_pick << " and block " << block_pick;
    os << " + " << tail.size() << " tokens, key " << (source || origin == prompt_origin::cache_probe ? "shift " : "")
       << adapter;
  }
};

template <class Manager>
struct append_cmd : command<Manager> {
  seq_id seq;
  std::vector<token_id> tokens;
  explicit append_cmd(const command_state& s) : seq(detail::pick(s)), tokens(detail::make_tokens(s.block_size, false)) {}
  void run(const command_state&, kv_cache_manager_model<Manager>& sut) const override {
    std::vector<slot_id> slots(tokens.size());
    if (!sut.manager.contains(seq)) {
      sut.expect_refused(errc::unknown_sequence, [&] { sut.manager.append(seq, tokens, slots); });
      return;
    }
    if (sut.manager.where(seq) == location::host) {
      sut.expect_refused(errc::wrong_location, [&] { sut.manager.append(seq, tokens, slots); });
      return;
    }
    const auto count = static_cast<std::int32_t>(tokens.size());
    if (!sut.manager.can_append(seq, count)) {
      sut.expect_refused(errc::out_of_blocks, [&] { sut.manager.append(seq, tokens, slots); });
      return;
    }
    const std::int32_t first = sut.manager.num_tokens(seq);
    const std::optional<block_copy> copy = sut.manager.append(seq, tokens, slots);
    if (copy) sut.copy_block(sut.device_kv, copy->src, sut.device_kv, copy->dst);
    auto& history = sut.live.at(seq).tokens;
    history.insert(history.end(), tokens.begin(), tokens.end());
    sut.write(seq, first, slots);
    sut.mark_computed(seq);
    sut.check_invariants();
  }
  void show(std::ostream& os) const override { os << "append " << tokens.size() << " to " << seq; }
};

/// Forks a live sequence whole, or at a position (a branch of an agent, a node of a speculative
/// tree): the child holds the parent's first tokens and shares their blocks, the partial one
/// included, until one of them writes into it. A refused position (0, past the end) changes nothing.
template <class Manager>
struct fork_cmd : command<Manager> {
  seq_id parent;
  seq_id child;
  std::optional<std::int32_t> at_percent;  // none: the whole parent
  explicit fork_cmd(const command_state& s)
      : parent(detail::pick(s)),
        child(s.next_id),
        at_percent(*rc::gen::arbitrary<bool>() ? std::nullopt : std::optional(*rc::gen::inRange(0, 101))) {}
  void apply(command_state& s) const override {
    s.ids.push_back(child);
    ++s.next_id;
  }
  void run(const command_state&, kv_cache_manager_model<Manager>& sut) const override {
    if (!sut.manager.contains(parent)) {
      sut.expect_refused(errc::unknown_sequence, [&] { sut.manager.fork(parent, child); });
      return;
    }
    const std::int32_t length = sut.manager.num_tokens(parent);
    const std::int32_t at = at_percent ? std::max(1, length * *at_percent / 100) : length;
    const std::int32_t free_before = sut.manager.num_free_blocks();
    if (at_percent) {
      sut.expect_refused(errc::invalid_argument, [&] { sut.manager.fork(parent, child, 0); });
      sut.expect_refused(errc::invalid_argument, [&] { sut.manager.fork(parent, child, length + 1); });
      sut.manager.fork(parent, child, at);
      sut.seen.forks_in_a_block += at % sut.block_size != 0 && at < length ? 1 : 0;
    } else {
      sut.manager.fork(parent, child);
    }
    RC_ASSERT(sut.manager.num_free_blocks() == free_before);  // sharing allocates nothing
    RC_ASSERT(sut.manager.num_computed_tokens(child) == std::min(at, sut.manager.num_computed_tokens(parent)));
    live_sequence branch = sut.live.at(parent);
    branch.tokens.resize(static_cast<std::size_t>(at));
    sut.live.emplace(child, std::move(branch));
    sut.expect_refused(errc::duplicate_sequence, [&] { sut.manager.fork(parent, child, 1); });
    sut.check_invariants();
  }
  void show(std::ostream& os) const override {
    os << "fork " << parent << " -> " << child;
    if (at_percent) os << " at " << *at_percent << "%";
  }
};

/// Marks a sequence's tokens computed: publishes the full blocks of a deferred prompt. Two equal
/// prompts allocated before either is computed each compute their own blocks, and the second
/// publisher's chain then links to the first's blocks, which it does not hold.
template <class Manager>
struct compute_cmd : command<Manager> {
  seq_id seq;
  explicit compute_cmd(const command_state& s) : seq(detail::pick(s)) {}
  void run(const command_state&, kv_cache_manager_model<Manager>& sut) const override {
    if (!sut.manager.contains(seq)) return;
    sut.mark_computed(seq);
    RC_ASSERT(sut.manager.num_computed_tokens(seq) == sut.manager.num_tokens(seq));
    sut.check_invariants();
  }
  void show(std::ostream& os) const override { os << "compute " << seq; }
};

/// Frees a sequence, and refuses a second free. Over any model with `manager`, `live`,
/// expect_refused() and check_invariants() (the hybrid manager's test uses it too).
template <class Model>
struct free_model_cmd : rc::state::Command<command_state, Model> {
  seq_id seq;
  explicit free_model_cmd(const command_state& s) : seq(detail::pick(s)) {}
  void apply(command_state& s) const override { std::erase(s.ids, seq); }
  void run(const command_state&, Model& sut) const override {
    if (!sut.manager.contains(seq)) {
      sut.expect_refused(errc::unknown_sequence, [&] { sut.manager.free(seq); });
      return;
    }
    if constexpr (requires { sut.free_sequence(seq); }) {
      sut.free_sequence(seq);  // checks a partial block the manager keeps cached
    } else {
      sut.manager.free(seq);
      sut.live.erase(seq);
    }
    sut.expect_refused(errc::unknown_sequence, [&] { sut.manager.free(seq); });  // a double free is refused
    sut.check_invariants();
  }
  void show(std::ostream& os) const override { os << "free " << seq; }
};
template <class Manager>
using free_cmd = free_model_cmd<kv_cache_manager_model<Manager>>;

template <class Manager>
struct truncate_cmd : command<Manager> {
  seq_id seq;
  std::int32_t keep_percent;
  explicit truncate_cmd(const command_state& s) : seq(detail::pick(s)), keep_percent(*rc::gen::inRange(0, 101)) {}
  void run(const command_state&, kv_cache_manager_model<Manager>& sut) const override {
    if (!sut.manager.contains(seq)) return;
    const std::int32_t keep = std::max(1, sut.manager.num_tokens(seq) * keep_percent / 100);
    sut.expect_refused(errc::invalid_argument, [&] { sut.manager.truncate(seq, sut.manager.num_tokens(seq) + 1); });
    sut.manager.truncate(seq, keep);
    sut.live.at(seq).tokens.resize(static_cast<std::size_t>(keep));
    sut.drop_pending_copy(seq);
    sut.check_invariants();
  }
  void show(std::ostream& os) const override { os << "truncate " << seq << " to " << keep_percent << "%"; }
};

/// Swaps a sequence out or in together with its live forks that share its location.
template <class Manager>
struct swap_cmd : command<Manager> {
  seq_id seq;
  bool with_others;
  explicit swap_cmd(const command_state& s) : seq(detail::pick(s)), with_others(*rc::gen::arbitrary<bool>()) {}
  void run(const command_state&, kv_cache_manager_model<Manager>& sut) const override {
    if (!sut.manager.contains(seq)) return;
    const location from = sut.manager.where(seq);
    std::vector<seq_id> group{seq};
    if (with_others) {
      for (const auto& [other, s] : sut.live) {
        if (other != seq && sut.manager.where(other) == from) group.push_back(other);
      }
    }
    if (from == location::device) {
      if (!sut.manager.can_swap_out(group)) {
        sut.expect_refused(errc::out_of_blocks, [&] { sut.manager.swap_out(group); });
        return;
      }
      for (const block_copy& c : sut.manager.swap_out(group)) sut.copy_block(sut.device_kv, c.src, sut.host_kv, c.dst);
      for (seq_id s : group) sut.drop_pending_copy(s);
    } else {
      if (!sut.manager.can_swap_in(group)) {
        sut.expect_refused(errc::out_of_blocks, [&] { sut.manager.swap_in(group); });
        return;
      }
      for (const block_copy& c : sut.manager.swap_in(group)) sut.copy_block(sut.host_kv, c.src, sut.device_kv, c.dst);
    }
    sut.check_invariants();
  }
  void show(std::ostream& os) const override { os << "swap " << seq << (with_others ? " with the rest" : ""); }
};

template <class Manager>
struct evict_cmd : command<Manager> {
  std::int32_t count;
  bool reset;
  explicit evict_cmd(const command_state&) : count(*rc::gen::inRange(0, 4)), reset(*rc::gen::weightedElement<bool>({{9, false}, {1, true}})) {}
  void run(const command_state&, kv_cache_manager_model<Manager>& sut) const override {
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

/// One command sequence against a fresh Manager on a random tiny pool (RapidCheck generates the
/// pool's shape and the commands): the body of the conformance property. Adds to `seen`. A hit
/// rejected for its tokens or key fails unless `collisions` expects it.
template <class Manager>
void run_kv_cache_manager_property(coverage& seen, expected_rejections collisions = {}) {
  ++seen.sequences;
  const auto block_size = *rc::gen::element(1, 2, 3, 4, 7);
  const auto device_blocks = *rc::gen::inRange(2, 24);
  const auto host_blocks = *rc::gen::element(0, 4, 16, 16);
  const bool caching = *rc::gen::weightedElement<bool>({{4, true}, {1, false}});
  const bool partial_reuse = *rc::gen::weightedElement<bool>({{3, true}, {1, false}});
  constexpr bool extents = locality_free_list_policy<typename Manager::pool_type::free_list_type>;
  kv_cache_manager_model<Manager> sut(kv_cache_options{.block_size = block_size,
                                                       .num_device_blocks = device_blocks,
                                                       .num_host_blocks = host_blocks,
                                                       .enable_prefix_caching = caching,
                                                       .enable_partial_reuse = partial_reuse,
                                                       .extent_blocks = extents ? *rc::gen::inRange(1, device_blocks + 1) : 0},
                                      seen, collisions);
  command_state initial;
  initial.block_size = block_size;
  rc::state::check(initial, sut, rc::state::gen::execOneOfWithArgs<
                                   allocate_cmd<Manager>, allocate_cmd<Manager>, append_cmd<Manager>,
                                   append_cmd<Manager>, compute_cmd<Manager>, fork_cmd<Manager>,
                                   free_cmd<Manager>, free_cmd<Manager>, truncate_cmd<Manager>,
                                   swap_cmd<Manager>, swap_cmd<Manager>, evict_cmd<Manager>, evict_cmd<Manager>>());
  // Freeing everything returns every block.
  for (const auto& [seq, s] : sut.live) sut.manager.free(seq);
  sut.live.clear();
  sut.pending_copies.clear();
  sut.manager.reset_prefix_cache();
  sut.check_invariants();
  RC_ASSERT(sut.manager.device_pool().num_free_blocks() == device_blocks);
  RC_ASSERT(sut.manager.num_free_host_blocks() == host_blocks);
}

}  // namespace pagedkv::testing
