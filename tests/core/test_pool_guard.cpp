// pool_guard (include/pagedkv/pool_guard.hpp): the pool's guard mode. It must never poison a block
// whose contents are still read (the scheduler's whole stateful property runs with it poisoning
// the simulated KV), and it must catch planted use-after-free bugs: a free list that hands out a
// used block, a stale plan kept across an abort, and an engine reading through a table copy kept
// after a free.
#include <pagedkv/pool_guard.hpp>
#include <pagedkv/testing/scheduler_commands.hpp>

#include "test_support.hpp"

#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <algorithm>
#include <string>
#include <vector>

namespace pagedkv {
namespace {

template <class Scheduler>
void check_guarded_property() {
  testing::scheduler_coverage seen;
  ASSERT_TRUE(rc::check([&] { testing::run_scheduler_property<Scheduler>(seen, /*guarded=*/true); }));
  std::cout << "coverage over " << seen << '\n';
  EXPECT_GT(seen.poisoned_blocks, seen.cases);  // it poisoned blocks, many per case
  EXPECT_GT(seen.swapped + seen.group_recomputed, 0);
}

// Every step audited and its freed and fresh blocks poisoned in the simulated KV: the read-back of
// every scheduled history still holds, so the guard poisons nothing still read.
TEST(PoolGuard, SchedulerPropertyHoldsUnderPoisoningWithSwaps) {
  check_guarded_property<scheduler<fcfs_admission, preempt_by_swap>>();
}
TEST(PoolGuard, SchedulerPropertyHoldsUnderPoisoningWithRecompute) {
  check_guarded_property<scheduler<priority_admission, preempt_by_recompute, kv_cache_manager<lifo_free_list, xxh3_hash, priority_eviction>>>();
}

/// A free list with a planted bug: every third pop hands out the block it handed out last, which
/// is in use.
struct reusing_free_list {
  class list {
   public:
    explicit list(std::int32_t capacity) : inner_(capacity) {}
    void push(block_id id) { inner_.push(id); }
    block_id pop() {
      if (++pops_ % 3 == 0) return last_;
      return last_ = inner_.pop();
    }
    [[nodiscard]] std::int32_t size() const noexcept { return inner_.size(); }

   private:
    lifo_free_list::list inner_;
    block_id last_ = null_block;
    int pops_ = 0;
  };
};

TEST(PoolGuard, CatchesAFreeListThatHandsOutAUsedBlock) {
  kv_cache_manager<reusing_free_list> m({.block_size = 4, .num_device_blocks = 8, .enable_prefix_caching = false});
  pool_guard guard(m);
  m.allocate(1, test::iota_tokens(4, 0));
  m.allocate(2, test::iota_tokens(4, 100));
  EXPECT_NO_THROW(guard.audit());
  m.allocate(3, test::iota_tokens(4, 200));  // the third pop: sequence 2's block again
  ASSERT_EQ(m.table(3).block(0), m.table(2).block(0));
  try {
    guard.audit();
    FAIL() << "the guard missed a block held by two sequences with one reference";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::no_references);
    const std::string block = "block " + std::to_string(m.table(2).block(0)) + " is held by 2 table entries";
    EXPECT_NE(std::string(e.what()).find(block), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("handed out again"), std::string::npos) << e.what();
  }
}

// The engine keeps a plan across an abort: the plan's rows point at blocks that are free now.
TEST(PoolGuard, CatchesAStalePlanAfterAnAbort) {
  scheduler<> s({.max_tokens_per_step = 64, .max_num_seqs = 4}, {.block_size = 4, .num_device_blocks = 16});
  pool_guard guard(s.kv());
  s.add_request(1, {.prompt = test::iota_tokens(10), .max_new_tokens = 4});
  const step_plan plan = s.schedule();
  EXPECT_NO_THROW(guard.before_step(plan));
  s.abort(1);
  try {
    guard.before_step(plan);
    FAIL() << "the guard passed a plan whose sequence was freed";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::no_references);
    EXPECT_NE(std::string(e.what()).find("which was freed"), std::string::npos) << e.what();
  }
}

// A plan whose row was edited to another block (as a stale copy of a table would be).
TEST(PoolGuard, CatchesAPlanRowThatIsNotTheTable) {
  scheduler<> s({.max_tokens_per_step = 64, .max_num_seqs = 4}, {.block_size = 4, .num_device_blocks = 16});
  pool_guard guard(s.kv());
  s.add_request(1, {.prompt = test::iota_tokens(10), .max_new_tokens = 4});
  step_plan plan = s.schedule();
  plan.block_tables.at(1) = 15;  // a free block
  EXPECT_THROW(
      {
        try {
          guard.before_step(plan);
        } catch (const error& e) {
          EXPECT_EQ(e.code(), errc::no_references);
          EXPECT_NE(std::string(e.what()).find("holds block 15 at index 1"), std::string::npos) << e.what();
          throw;
        }
      },
      error);
}

/// A manager whose partial hits name a source block outside the pool, as a corrupted id would.
struct corrupt_partial_source_manager : kv_cache_manager<> {
  using kv_cache_manager<>::kv_cache_manager;
  [[nodiscard]] block_id partial_source(seq_id) const { return 99; }
};

// A partial hit's source is no table entry: the error names it as the source, not by an index.
TEST(PoolGuard, NamesAPartialHitSourceOutsideThePool) {
  corrupt_partial_source_manager m({.block_size = 4, .num_device_blocks = 8});
  pool_guard guard(m);
  m.allocate(1, test::iota_tokens(6));
  try {
    guard.audit();
    FAIL() << "the guard passed a partial hit whose source block is outside the pool";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::invalid_block);
    EXPECT_NE(std::string(e.what()).find("sequence 1's partial hit holds source block 99, outside the pool of 8"),
              std::string::npos)
        << e.what();
  }
}

// Poisoning: freed blocks go to the hook once; a read through a table kept after the free sees
// poison. Fresh blocks go to the hook before the step that writes them; cached ones never do.
TEST(PoolGuard, PoisonsFreedAndFreshBlocksOnce) {
  // Partial reuse off: it would keep the freed sequence's last, partly filled block cached too.
  kv_cache_manager<> m({.block_size = 4, .num_device_blocks = 8, .enable_partial_reuse = false});
  std::vector<int> kv(8 * 4, 0);  // 1 = written, -1 = poison
  std::vector<block_id> handed;
  pool_guard guard(m, [&](std::span<const block_id> blocks) {
    for (block_id b : blocks) {
      handed.push_back(b);
      std::fill_n(kv.begin() + b * 4, 4, -1);
    }
  });
  m.allocate(1, test::iota_tokens(6));
  guard.before_step({});
  std::vector<block_id> fresh = handed;
  std::ranges::sort(fresh);
  std::vector<block_id> table(m.table(1).blocks().begin(), m.table(1).blocks().end());
  std::ranges::sort(table);
  EXPECT_EQ(fresh, table);  // both blocks of the new sequence, before anything wrote them
  for (block_id b : table) std::fill_n(kv.begin() + b * 4, 4, 1);  // the step writes them
  m.mark_computed(1, 6);  // caches the full first block
  handed.clear();
  EXPECT_TRUE(guard.before_step({}).empty());  // nothing changed hands
  const block_table stale = m.table(1);        // the planted bug: a copy kept after the free
  m.free(1);
  handed.clear();
  guard.before_step({});
  ASSERT_EQ(handed.size(), 1u);  // the last block; the first stays cached, its K/V still good
  EXPECT_EQ(handed[0], stale.block(1));
  EXPECT_EQ(kv[static_cast<std::size_t>(stale.slot(5))], -1);  // the stale read sees poison
  EXPECT_EQ(kv[static_cast<std::size_t>(stale.slot(0))], 1);
  handed.clear();
  EXPECT_TRUE(guard.before_step({}).empty());  // poisoned once
}

}  // namespace
}  // namespace pagedkv
