// The retention policies (retention.hpp): each queue against a model of its rule over random
// operations, the sketch's counting, and the policies inside a manager (pin_prefix, a TTL in steps,
// a scan that TinyLFU survives and LRU does not).
#include <pagedkv/kv_cache_manager.hpp>
#include <pagedkv/retention.hpp>

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>
#include <optional>
#include <vector>

namespace pagedkv {
namespace {

// ---- TTL ----

TEST(TtlEviction, BlocksStayForTheirTtlThenGoInTheInnerOrder) {
  ttl_eviction<>::queue queue(8);
  queue.set_ttl(steps{2});
  queue.push(3, 0);
  queue.push(5, 0);
  EXPECT_TRUE(queue.contains(3));
  EXPECT_EQ(queue.size(), 0);
  EXPECT_EQ(queue.pop(), std::nullopt) << "within its TTL a block must not be evicted";
  queue.clock().advance();
  queue.push(1, 0);
  EXPECT_EQ(queue.pop(), std::nullopt);
  queue.clock().advance();
  EXPECT_EQ(queue.size(), 2);
  EXPECT_EQ(queue.num_protected(), 1);
  EXPECT_EQ(queue.pop(), 3);
  queue.erase(5);  // hit again before its eviction
  EXPECT_FALSE(queue.contains(5));
  EXPECT_EQ(queue.pop(), std::nullopt);
  queue.clock().advance();
  EXPECT_EQ(queue.pop(), 1);
}

TEST(TtlEviction, ZeroTtlIsTheInnerPolicyAndANegativeOneIsRefused) {
  ttl_eviction<priority_eviction>::queue queue(4);
  queue.push(0, 5);
  queue.push(1, 1);
  EXPECT_EQ(queue.pop(), 1);
  EXPECT_EQ(queue.pop(), 0);
  try {
    queue.set_ttl(steps{-1});
    FAIL() << "a negative TTL was accepted";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument);
  }
  EXPECT_EQ(queue.ttl(), steps{0});
}

TEST(TtlEviction, SecondsWithTheSteadyClock) {
  ttl_eviction<lru_eviction, std::chrono::steady_clock>::queue queue(2);
  queue.set_ttl(std::chrono::hours(1));
  queue.push(0, 0);
  EXPECT_EQ(queue.pop(), std::nullopt);
  queue.set_ttl(std::chrono::seconds(0));
  EXPECT_EQ(queue.pop(), 0);
}

/// The rule: an idle block becomes evictable once it has been idle ttl ticks (checked after every
/// change of time or TTL, in the order blocks went idle); evictable blocks go lowest priority
/// first, then in the order they became evictable; pinned_priority ones never.
RC_GTEST_PROP(TtlEvictionProperty, MatchesModel, ()) {
  const auto capacity = *rc::gen::inRange(1, 12);
  ttl_eviction<priority_eviction>::queue queue(capacity);
  struct idle {
    std::int64_t since;
    std::int32_t priority;
    std::uint64_t pushed;
    std::optional<std::uint64_t> evictable;  // when it became evictable
  };
  std::map<block_id, idle> model;
  std::int64_t now = 0;
  std::int64_t ttl = 0;
  std::uint64_t order = 0;
  const auto expire = [&] {
    std::vector<std::pair<std::uint64_t, block_id>> due;
    for (auto& [id, b] : model) {
      if (!b.evictable && now - b.since >= ttl) due.emplace_back(b.pushed, id);
    }
    std::sort(due.begin(), due.end());
    for (auto [pushed, id] : due) model.at(id).evictable = ++order;
  };
  const auto ops = *rc::gen::container<std::vector<std::pair<int, int>>>(
      rc::gen::pair(rc::gen::inRange(0, 6), rc::gen::inRange(0, 1000)));
  for (auto [op, arg] : ops) {
    const block_id id = arg % capacity;
    switch (op) {
      case 0: {  // push
        if (model.contains(id)) break;
        const std::int32_t priority = std::vector<std::int32_t>{0, 1, 2, pinned_priority}[static_cast<std::size_t>(arg % 4)];
        queue.push(id, priority);
        model.emplace(id, idle{now, priority, ++order, std::nullopt});
        expire();
        break;
      }
      case 1:  // erase (a hit)
        if (!model.contains(id)) break;
        queue.erase(id);
        model.erase(id);
        break;
      case 2: {  // pop
        std::optional<block_id> expected;
        for (const auto& [b, e] : model) {
          if (!e.evictable || e.priority == pinned_priority) continue;
          const idle& best = expected ? model.at(*expected) : e;
          if (!expected || std::pair(e.priority, *e.evictable) < std::pair(best.priority, *best.evictable)) expected = b;
        }
        RC_ASSERT(queue.pop() == expected);
        if (expected) model.erase(*expected);
        break;
      }
      case 3:  // time passes
        now += arg % 3;
        queue.clock().advance(steps{arg % 3});
        expire();
        break;
      case 4:  // a new TTL
        expire();
        ttl = arg % 5;
        queue.set_ttl(steps{ttl});
        expire();
        break;
      default: {
        const auto evictable = std::count_if(model.begin(), model.end(), [](const auto& e) {
          return e.second.evictable && e.second.priority != pinned_priority;
        });
        const auto waiting = std::count_if(model.begin(), model.end(), [](const auto& e) { return !e.second.evictable; });
        RC_ASSERT(queue.size() == evictable);
        RC_ASSERT(queue.num_protected() == waiting);
      }
    }
    for (block_id b = 0; b < capacity; ++b) RC_ASSERT(queue.contains(b) == model.contains(b));
  }
}

// ---- pin budget ----

TEST(PinBudgetEviction, PinnedBlocksStayAndTheBudgetRefusesMore) {
  pin_budget_eviction<>::queue queue(6);
  queue.set_pin_budget(2);
  queue.push(0, 0);
  queue.push(1, 0);
  queue.pin(0);  // idle: leaves the evictable set
  queue.pin(4);  // in use: pinned for when it goes idle
  EXPECT_EQ(queue.num_pinned(), 2);
  try {
    queue.pin(1);
    FAIL() << "a pin beyond the budget was accepted";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::pin_budget_exceeded);
  }
  EXPECT_FALSE(queue.is_pinned(1));
  queue.push(4, 0);
  EXPECT_EQ(queue.size(), 1);
  EXPECT_EQ(queue.pop(), 1);
  EXPECT_EQ(queue.pop(), std::nullopt) << "pinned blocks must never be evicted";
  queue.unpin(0);
  EXPECT_EQ(queue.pop(), 0);
  queue.forget(4);  // the cache dropped it (reset_prefix_cache): its pin goes with it
  EXPECT_EQ(queue.num_pinned(), 0);
}

TEST(PinBudgetEviction, PinnedPriorityIsAPinRequestWithinTheBudget) {
  pin_budget_eviction<priority_eviction>::queue queue(4);
  queue.set_pin_budget(1);
  queue.push(0, pinned_priority);
  queue.push(1, pinned_priority);  // over budget: kept at the highest evictable priority
  queue.push(2, 5);
  EXPECT_TRUE(queue.is_pinned(0));
  EXPECT_FALSE(queue.is_pinned(1));
  EXPECT_EQ(queue.refused_pins(), 1);
  EXPECT_EQ(queue.pop(), 2);
  EXPECT_EQ(queue.pop(), 1);
  EXPECT_EQ(queue.pop(), std::nullopt);
  try {
    queue.set_pin_budget(0);
    FAIL() << "a budget below the pinned count was accepted";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument);
  }
}

/// The rule: pins are sticky per block until unpin or forget, at most `budget` at once; idle
/// unpinned blocks leave least recently pushed (or unpinned) first.
RC_GTEST_PROP(PinBudgetEvictionProperty, MatchesModel, ()) {
  const auto capacity = *rc::gen::inRange(1, 12);
  pin_budget_eviction<>::queue queue(capacity);
  std::map<block_id, std::uint64_t> idle;  // idle blocks: when they entered the evictable order
  std::vector<bool> pinned(static_cast<std::size_t>(capacity), false);
  std::int32_t budget = 0;
  std::uint64_t order = 0;
  const auto num_pinned = [&] { return static_cast<std::int32_t>(std::count(pinned.begin(), pinned.end(), true)); };
  const auto ops = *rc::gen::container<std::vector<std::pair<int, int>>>(
      rc::gen::pair(rc::gen::inRange(0, 7), rc::gen::inRange(0, 1000)));
  for (auto [op, arg] : ops) {
    const block_id id = arg % capacity;
    const auto i = static_cast<std::size_t>(id);
    switch (op) {
      case 0:
        if (idle.contains(id)) break;
        queue.push(id, 0);
        idle.emplace(id, ++order);
        break;
      case 1:
        if (!idle.contains(id)) break;
        queue.erase(id);
        idle.erase(id);
        break;
      case 2: {
        std::optional<block_id> expected;
        for (const auto& [b, when] : idle) {
          if (!pinned[static_cast<std::size_t>(b)] && (!expected || when < idle.at(*expected))) expected = b;
        }
        RC_ASSERT(queue.pop() == expected);
        if (expected) idle.erase(*expected);
        break;
      }
      case 3:
        if (!pinned[i] && num_pinned() >= budget) {
          try {
            queue.pin(id);
            RC_FAIL("a pin beyond the budget was accepted");
          } catch (const error& e) {
            RC_ASSERT(e.code() == errc::pin_budget_exceeded);
          }
        } else {
          queue.pin(id);
          pinned[i] = true;
        }
        break;
      case 4:
        queue.unpin(id);
        if (pinned[i] && idle.contains(id)) idle.at(id) = ++order;
        pinned[i] = false;
        break;
      case 5:  // the block leaves the cache: it is not idle there
        if (idle.contains(id)) break;
        queue.forget(id);
        pinned[i] = false;
        break;
      default: {
        const std::int32_t wanted = arg % 5;
        if (wanted < num_pinned()) {
          try {
            queue.set_pin_budget(wanted);
            RC_FAIL("a budget below the pinned count was accepted");
          } catch (const error& e) {
            RC_ASSERT(e.code() == errc::invalid_argument);
          }
        } else {
          queue.set_pin_budget(wanted);
          budget = wanted;
        }
      }
    }
    RC_ASSERT(queue.num_pinned() == num_pinned());
    RC_ASSERT(queue.pin_budget() == budget);
    const auto evictable = std::count_if(idle.begin(), idle.end(), [&](const auto& e) { return !pinned[static_cast<std::size_t>(e.first)]; });
    RC_ASSERT(queue.size() == evictable);
    for (block_id b = 0; b < capacity; ++b) {
      RC_ASSERT(queue.contains(b) == idle.contains(b));
      RC_ASSERT(queue.is_pinned(b) == pinned[static_cast<std::size_t>(b)]);
    }
  }
}

// ---- frequency ----

TEST(FrequencySketch, CountsAndAges) {
  frequency_sketch sketch(64);
  for (int i = 0; i < 3; ++i) sketch.increment(42);
  EXPECT_GE(sketch.estimate(42), 3U);
  for (int i = 0; i < 20; ++i) sketch.increment(7);
  EXPECT_EQ(sketch.estimate(7), frequency_sketch::max_count);
  sketch.age();
  EXPECT_EQ(sketch.estimate(7), frequency_sketch::max_count / 2);
  try {
    frequency_sketch bad(48);
    FAIL() << "a width that is not a power of two was accepted";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument);
  }
}

/// A count-min sketch never undercounts: between agings, estimate(h) >= min(increments of h, 15);
/// and after 10 * width increments it ages by itself.
RC_GTEST_PROP(FrequencySketchProperty, NeverUndercounts, ()) {
  const auto width = std::uint32_t{1} << *rc::gen::inRange(0, 8);
  frequency_sketch sketch(width);
  std::map<block_hash, std::uint32_t> counts;
  const auto keys = *rc::gen::container<std::vector<std::uint64_t>>(rc::gen::arbitrary<std::uint64_t>());
  std::uint64_t since_aging = 0;
  std::uint64_t agings = 0;
  for (std::uint64_t key : keys) {
    const block_hash h = key % 37 * 0x9e3779b97f4a7c15ULL;
    sketch.increment(h);
    if (++since_aging == 10 * std::uint64_t{width}) {
      RC_ASSERT(sketch.agings() == ++agings);
      counts.clear();
      since_aging = 0;
      continue;
    }
    ++counts[h];
    for (const auto& [k, n] : counts) RC_ASSERT(sketch.estimate(k) >= std::min(n, frequency_sketch::max_count));
  }
}

TEST(TinyLfuEviction, BlocksSeenAgainOutliveOneOffs) {
  tinylfu_eviction::queue queue(8);
  queue.push(0, 0, 100);  // a system prompt's block, seen once
  queue.erase(0);         // hit
  queue.push(0, 0, 100);  // seen again: protected
  for (block_id id = 1; id < 6; ++id) queue.push(id, 0, 200 + static_cast<block_hash>(id));  // a scan
  EXPECT_TRUE(queue.is_protected(0));
  for (block_id id = 1; id < 6; ++id) EXPECT_EQ(queue.pop(), id) << "one-offs go first, oldest first";
  EXPECT_EQ(queue.pop(), 0);
  // The sketch remembers the hash after the block is gone: recomputed, it is protected at once.
  queue.push(3, 0, 100);
  EXPECT_TRUE(queue.is_protected(3));
}

TEST(TinyLfuEviction, PriorityComesFirstAndPinnedStays) {
  tinylfu_eviction::queue queue(4);
  queue.push(0, 1, 10);
  queue.erase(0);
  queue.push(0, 1, 10);  // protected, priority 1
  queue.push(1, 2, 11);  // probation, priority 2
  queue.push(2, 1, 12);  // probation, priority 1
  queue.push(3, pinned_priority, 13);
  EXPECT_EQ(queue.size(), 3);
  EXPECT_EQ(queue.pop(), 2);
  EXPECT_EQ(queue.pop(), 0);
  EXPECT_EQ(queue.pop(), 1);
  EXPECT_EQ(queue.pop(), std::nullopt);
  queue.unpin_all();
  EXPECT_EQ(queue.pop(), 3);
}

/// The rule, with the sketch as the frequency oracle: lowest priority, then probation (estimate
/// below 2 when the block went idle) before protected, then least recently idle.
RC_GTEST_PROP(TinyLfuEvictionProperty, MatchesModel, ()) {
  const auto capacity = *rc::gen::inRange(1, 12);
  tinylfu_eviction::queue queue(capacity);
  struct idle {
    std::int32_t priority;
    bool frequent;
    std::uint64_t stamp;
  };
  std::map<block_id, idle> model;
  std::uint64_t order = 0;
  const auto ops = *rc::gen::container<std::vector<std::pair<int, int>>>(
      rc::gen::pair(rc::gen::inRange(0, 3), rc::gen::inRange(0, 1000)));
  for (auto [op, arg] : ops) {
    const block_id id = arg % capacity;
    if (op == 0 && !model.contains(id)) {
      const block_hash h = static_cast<block_hash>(arg % 7);
      const std::int32_t priority = std::vector<std::int32_t>{0, 1, pinned_priority}[static_cast<std::size_t>(arg % 3)];
      queue.push(id, priority, h);
      model.emplace(id, idle{priority, queue.sketch().estimate(h) >= 2, ++order});
      RC_ASSERT(queue.is_protected(id) == model.at(id).frequent);
    } else if (op == 1 && model.contains(id)) {
      queue.erase(id);
      model.erase(id);
    } else if (op == 2) {
      std::optional<block_id> expected;
      const auto rank = [](const idle& b) { return std::tuple(b.priority, b.frequent, b.stamp); };
      for (const auto& [b, e] : model) {
        if (e.priority != pinned_priority && (!expected || rank(e) < rank(model.at(*expected)))) expected = b;
      }
      RC_ASSERT(queue.pop() == expected);
      if (expected) model.erase(*expected);
    }
    for (block_id b = 0; b < capacity; ++b) RC_ASSERT(queue.contains(b) == model.contains(b));
  }
}

// ---- in a manager ----

std::vector<token_id> prompt(token_id first, std::int32_t count) {
  std::vector<token_id> tokens(static_cast<std::size_t>(count));
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

/// Runs a prompt through a manager (allocate, compute, free) so its full blocks end up idle.
template <class Manager>
void serve(Manager& manager, seq_id seq, const std::vector<token_id>& tokens) {
  manager.allocate(seq, tokens);
  manager.mark_computed(seq, static_cast<std::int32_t>(tokens.size()));
  manager.free(seq);
}

TEST(PinPrefix, APinnedSystemPromptSurvivesAFloodAndTheBudgetHolds) {
  kv_cache_manager<lifo_free_list, xxh3_hash, pin_budget_eviction<>> manager(
      {.block_size = 4, .num_device_blocks = 8});
  manager.cache().eviction_queue().set_pin_budget(2);
  const std::vector<token_id> system = prompt(1000, 9);  // two full blocks and one token
  serve(manager, 1, system);
  EXPECT_EQ(pin_prefix(manager.cache(), system), 2);
  EXPECT_EQ(pin_prefix(manager.cache(), system), 2) << "pinning again costs no budget";
  for (seq_id seq = 2; seq < 12; ++seq) serve(manager, seq, prompt(static_cast<token_id>(seq * 100), 17));
  EXPECT_EQ(manager.num_free_blocks(), 6) << "two blocks stay pinned";
  const allocation hit = manager.allocate(99, system);
  EXPECT_EQ(hit.num_cached_tokens, 8);
  manager.free(99);

  const std::vector<token_id> other = prompt(5000, 5);
  serve(manager, 100, other);
  const std::string before = std::to_string(manager.num_free_blocks()) + "/" +
                             std::to_string(manager.cache().eviction_queue().num_pinned());
  try {
    pin_prefix(manager.cache(), other);
    FAIL() << "a pin beyond the budget was accepted";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::pin_budget_exceeded);
  }
  EXPECT_EQ(before, std::to_string(manager.num_free_blocks()) + "/" +
                        std::to_string(manager.cache().eviction_queue().num_pinned()));
  EXPECT_EQ(unpin_prefix(manager.cache(), system), 2);
  EXPECT_EQ(pin_prefix(manager.cache(), other), 1);
  manager.reset_prefix_cache();
  EXPECT_EQ(manager.cache().eviction_queue().num_pinned(), 0) << "a reset drops every pin";
}

TEST(TtlInAManager, ABlockStaysForItsTtlInSteps) {
  // Partial reuse off: the prompt's last, partly filled block would stay cached (and held) too.
  kv_cache_manager<lifo_free_list, xxh3_hash, ttl_eviction<>> manager(
      {.block_size = 2, .num_device_blocks = 4, .enable_partial_reuse = false});
  auto& queue = manager.cache().eviction_queue();
  queue.set_ttl(steps{2});
  serve(manager, 1, prompt(0, 5));  // two cached blocks, idle at step 0
  EXPECT_EQ(manager.num_free_blocks(), 2);
  EXPECT_FALSE(manager.can_allocate(prompt(100, 7)));
  queue.clock().advance();
  EXPECT_FALSE(manager.can_allocate(prompt(100, 7)));
  queue.clock().advance();
  EXPECT_EQ(manager.num_free_blocks(), 4);
  manager.allocate(2, prompt(100, 7));
  EXPECT_EQ(manager.cache().num_cached_blocks(), 0);
}

TEST(TinyLfuInAManager, AReturningPromptSurvivesAScanThatLruEvicts) {
  const auto run = [](auto manager) {
    const std::vector<token_id> shared = prompt(1000, 9);
    serve(manager, 1, shared);
    serve(manager, 2, shared);  // used twice
    for (seq_id seq = 3; seq < 9; ++seq) serve(manager, seq, prompt(static_cast<token_id>(seq * 100), 5));
    const allocation a = manager.allocate(99, shared);
    return a.num_cached_tokens;
  };
  EXPECT_EQ(run(kv_cache_manager<lifo_free_list, xxh3_hash, tinylfu_eviction>({.block_size = 4, .num_device_blocks = 6})), 8);
  EXPECT_EQ(run(kv_cache_manager<lifo_free_list, xxh3_hash, lru_eviction>({.block_size = 4, .num_device_blocks = 6})), 0);
}

}  // namespace
}  // namespace pagedkv
