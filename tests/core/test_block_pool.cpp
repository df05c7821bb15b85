#include <pagedkv/block_pool.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <set>
#include <vector>

namespace pagedkv {
namespace {

template <class Pool>
class BlockPoolTest : public ::testing::Test {};

using Pools = ::testing::Types<block_pool<>, block_pool<fifo_free_list>, block_pool<lru_free_list>,
                               block_pool<extent_free_list>, block_pool<lifo_free_list, mutex_lock>,
                               block_pool<lru_free_list, mutex_lock>>;
TYPED_TEST_SUITE(BlockPoolTest, Pools);

TYPED_TEST(BlockPoolTest, FreshPoolHandsOutEveryIdOnceInOrder) {
  TypeParam pool(5);
  EXPECT_EQ(pool.capacity(), 5);
  EXPECT_EQ(pool.num_free_blocks(), 5);
  for (block_id expected = 0; expected < 5; ++expected) {
    EXPECT_EQ(pool.allocate(), expected);
    EXPECT_EQ(pool.ref_count(expected), 1);
  }
  EXPECT_EQ(pool.num_free_blocks(), 0);
  EXPECT_EQ(pool.num_used_blocks(), 5);
  EXPECT_FALSE(pool.try_allocate().has_value());
}

TYPED_TEST(BlockPoolTest, AllocateOnEmptyPoolThrowsOutOfBlocksAndChangesNothing) {
  TypeParam pool(1);
  (void)pool.allocate();
  try {
    (void)pool.allocate();
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::out_of_blocks);
    EXPECT_NE(std::string(e.what()).find("all 1 blocks"), std::string::npos) << e.what();
  }
  EXPECT_EQ(pool.num_free_blocks(), 0);
  EXPECT_EQ(pool.ref_count(0), 1);
}

TYPED_TEST(BlockPoolTest, BulkAllocateIsAllOrNothing) {
  TypeParam pool(4);
  std::array<block_id, 3> three{};
  pool.allocate(three);
  EXPECT_EQ(std::set<block_id>(three.begin(), three.end()).size(), 3u);
  std::array<block_id, 2> two{-7, -7};
  EXPECT_FALSE(pool.try_allocate(two));
  EXPECT_EQ(two[0], -7) << "a failed bulk allocation must not write";
  EXPECT_EQ(pool.num_free_blocks(), 1);
  try {
    pool.allocate(two);
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::out_of_blocks);
  }
  EXPECT_EQ(pool.num_free_blocks(), 1);
  std::span<block_id> none;
  EXPECT_TRUE(pool.try_allocate(none));
}

TYPED_TEST(BlockPoolTest, RetainAndReleaseCountReferences) {
  TypeParam pool(2);
  const block_id id = pool.allocate();
  pool.retain(id);
  pool.retain(id);
  EXPECT_EQ(pool.ref_count(id), 3);
  EXPECT_FALSE(pool.release(id));
  EXPECT_FALSE(pool.release(id));
  EXPECT_EQ(pool.num_free_blocks(), 1);
  EXPECT_TRUE(pool.release(id));
  EXPECT_TRUE(pool.is_free(id));
  EXPECT_EQ(pool.num_free_blocks(), 2);
}

TYPED_TEST(BlockPoolTest, MisuseNamesTheBlockAndLeavesStateUnchanged) {
  TypeParam pool(3);
  const block_id used = pool.allocate();
  auto expect_error = [&](errc code, auto&& call, const char* fragment) {
    try {
      call();
      ADD_FAILURE() << "no error for " << fragment;
    } catch (const error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
    EXPECT_EQ(pool.num_free_blocks(), 2);
    EXPECT_EQ(pool.ref_count(used), 1);
  };
  expect_error(errc::invalid_block, [&] { pool.release(3); }, "release of block 3");
  expect_error(errc::invalid_block, [&] { pool.retain(-1); }, "retain of block -1");
  expect_error(errc::invalid_block, [&] { (void)pool.ref_count(99); }, "block 99");
  expect_error(errc::no_references, [&] { pool.release(2); }, "block 2 which holds no references");
  expect_error(errc::no_references, [&] { pool.retain(1); }, "retain of free block 1");
  const std::array<block_id, 3> twice{used, used, used};
  expect_error(errc::no_references, [&] { pool.release(twice); }, "block 0");
}

TYPED_TEST(BlockPoolTest, BulkReleaseHandlesRepeatedIds) {
  TypeParam pool(3);
  const block_id a = pool.allocate();
  const block_id b = pool.allocate();
  pool.retain(a);
  const std::array<block_id, 3> refs{a, b, a};
  pool.release(refs);
  EXPECT_TRUE(pool.is_free(a));
  EXPECT_TRUE(pool.is_free(b));
  EXPECT_EQ(pool.num_free_blocks(), 3);
  // Every block is on the free list exactly once.
  std::set<block_id> seen;
  for (int i = 0; i < 3; ++i) seen.insert(pool.allocate());
  EXPECT_EQ(seen.size(), 3u);
}

TEST(BlockPool, RejectsAbsurdCapacity) {
  for (std::int32_t bad : {0, -1, max_num_blocks + 1}) {
    try {
      block_pool<> pool(bad);
      FAIL() << bad;
    } catch (const error& e) {
      EXPECT_EQ(e.code(), errc::invalid_argument);
      EXPECT_NE(std::string(e.what()).find(std::to_string(bad)), std::string::npos);
    }
  }
}

TEST(BlockPool, LifoReusesTheMostRecentlyFreedBlock) {
  block_pool<lifo_free_list> pool(4);
  std::array<block_id, 4> all{};
  pool.allocate(all);
  pool.release(1);
  pool.release(3);
  EXPECT_EQ(pool.allocate(), 3);
  EXPECT_EQ(pool.allocate(), 1);
}

TEST(BlockPool, FifoAndLruReuseTheLeastRecentlyFreedBlock) {
  block_pool<fifo_free_list> fifo(4);
  block_pool<lru_free_list> lru(4);
  std::array<block_id, 4> all{};
  fifo.allocate(all);
  lru.allocate(all);
  for (block_id id : {2, 0, 3}) {
    fifo.release(id);
    lru.release(id);
  }
  for (block_id expected : {2, 0, 3}) {
    EXPECT_EQ(fifo.allocate(), expected);
    EXPECT_EQ(lru.allocate(), expected);
  }
}

TEST(BlockPool, FifoRingWrapsAroundManyTimes) {
  block_pool<fifo_free_list> pool(3);
  for (int round = 0; round < 100; ++round) {
    const block_id id = pool.allocate();
    EXPECT_EQ(id, round % 3);
    pool.release(id);
    EXPECT_EQ(pool.num_free_blocks(), 3);
  }
}

TEST(BlockPool, LruTakeRemovesAParticularFreeBlock) {
  block_pool<lru_free_list> pool(4);
  pool.take(2);
  EXPECT_EQ(pool.ref_count(2), 1);
  EXPECT_EQ(pool.num_free_blocks(), 3);
  EXPECT_EQ(pool.allocate(), 0);
  EXPECT_EQ(pool.allocate(), 1);
  EXPECT_EQ(pool.allocate(), 3);
  try {
    pool.take(2);
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("in use"), std::string::npos);
  }
}

TEST(BlockPool, ExtentsKeepEachGrowingSequenceTogether) {
  // Two sequences growing in turn, as decode steps do: each gets an extent of its own and moves
  // to a whole one when it fills; a LIFO pool interleaves them.
  block_pool<extent_free_list> pool(32, 4);
  std::vector<block_id> a{pool.allocate_near(null_block)}, b{pool.allocate_near(null_block)};
  for (int step = 1; step < 8; ++step) {
    a.push_back(pool.allocate_near(a.back()));
    b.push_back(pool.allocate_near(b.back()));
  }
  EXPECT_EQ(a, (std::vector<block_id>{0, 1, 2, 3, 8, 9, 10, 11}));
  EXPECT_EQ(b, (std::vector<block_id>{4, 5, 6, 7, 12, 13, 14, 15}));

  block_pool<lifo_free_list> lifo(32);
  std::vector<block_id> c{lifo.allocate_near(null_block)}, d{lifo.allocate_near(null_block)};
  c.push_back(lifo.allocate_near(c.back()));
  d.push_back(lifo.allocate_near(d.back()));
  EXPECT_EQ(c, (std::vector<block_id>{0, 2}));  // no locality: the hint is accepted and unused
  EXPECT_EQ(d, (std::vector<block_id>{1, 3}));
}

TEST(BlockPool, ExtentsFillHolesBeforeWholeExtentsWithoutAHint) {
  block_pool<extent_free_list> pool(12, 4);
  std::array<block_id, 12> all{};
  pool.allocate_near(all, null_block);
  EXPECT_EQ(all, (std::array<block_id, 12>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));
  pool.release(std::array<block_id, 5>{9, 4, 5, 6, 7});  // extent 1 whole again, a hole in extent 2
  EXPECT_EQ(pool.allocate(), 9);                            // no hint: the hole first
  EXPECT_EQ(pool.allocate_near(1), 4);                      // hint's extent full: a whole one
  EXPECT_EQ(pool.allocate_near(4), 5);                      // then near the hint, lowest id first
  pool.release(std::array<block_id, 2>{1, 10});
  EXPECT_EQ(pool.allocate_near(5), 6);
  EXPECT_EQ(pool.allocate_near(0), 1);
  EXPECT_EQ(pool.allocate_near(11), 10);
}

TEST(BlockPool, AllocateNearChecksTheHintAndStaysAllOrNothing) {
  block_pool<extent_free_list> pool(8, 4);
  for (const block_id bad : {-2, 8}) {
    try {
      (void)pool.allocate_near(bad);
      FAIL() << bad;
    } catch (const error& e) {
      EXPECT_EQ(e.code(), errc::invalid_block);
      EXPECT_NE(std::string(e.what()).find("allocate_near of block " + std::to_string(bad)), std::string::npos);
    }
  }
  std::array<block_id, 9> too_many{};
  EXPECT_FALSE(pool.try_allocate_near(too_many, null_block));
  EXPECT_EQ(pool.num_free_blocks(), 8);
  try {
    pool.allocate_near(too_many, 3);
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::out_of_blocks);
  }
  EXPECT_EQ(pool.num_free_blocks(), 8);
  for (const std::int32_t bad : {0, 9}) {
    try {
      block_pool<extent_free_list> p(8, bad);
      FAIL() << bad;
    } catch (const error& e) {
      EXPECT_EQ(e.code(), errc::invalid_argument);
      EXPECT_NE(std::string(e.what()).find("extent of " + std::to_string(bad)), std::string::npos);
    }
  }
}

TEST(BlockPool, ExtentTakeRemovesAParticularFreeBlock) {
  block_pool<extent_free_list> pool(6, 3);
  pool.take(1);
  EXPECT_EQ(pool.allocate(), 0);  // extent 0 is partly free: its lowest free id
  EXPECT_EQ(pool.allocate(), 2);
  EXPECT_EQ(pool.allocate(), 3);
}

template <class Pool>
concept has_take = requires(Pool pool) { pool.take(0); };
static_assert(has_take<block_pool<lru_free_list>>);
static_assert(!has_take<block_pool<lifo_free_list>>, "take() needs a removable free list");
static_assert(!has_take<block_pool<fifo_free_list>>);

}  // namespace
}  // namespace pagedkv
