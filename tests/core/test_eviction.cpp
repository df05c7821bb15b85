#include <pagedkv/eviction.hpp>
#include <pagedkv/free_list.hpp>

#include <gtest/gtest.h>

namespace pagedkv {
namespace {

TEST(IntrusiveList, PushRemovePopKeepOrder) {
  detail::intrusive_list list(6);
  for (int id : {4, 1, 5, 0}) list.push_back(id);
  list.push_front(2);
  EXPECT_EQ(list.size(), 5);
  list.remove(5);
  EXPECT_FALSE(list.contains(5));
  EXPECT_TRUE(list.contains(4));
  EXPECT_EQ(list.pop_back(), 0);
  EXPECT_EQ(list.pop_front(), 2);
  EXPECT_EQ(list.pop_front(), 4);
  EXPECT_EQ(list.pop_front(), 1);
  EXPECT_TRUE(list.empty());
  list.push_back(5);
  EXPECT_EQ(list.front(), 5);
  EXPECT_EQ(list.back(), 5);
}

TEST(LruEviction, EvictsLeastRecentlyIdleFirstAndSkipsErased) {
  lru_eviction::queue queue(8);
  for (block_id id : {3, 7, 1, 5}) queue.push(id, 0);
  queue.erase(7);  // hit again
  EXPECT_FALSE(queue.contains(7));
  EXPECT_EQ(queue.size(), 3);
  EXPECT_EQ(queue.pop(), 3);
  queue.push(7, 0);
  EXPECT_EQ(queue.pop(), 1);
  EXPECT_EQ(queue.pop(), 5);
  EXPECT_EQ(queue.pop(), 7);
  EXPECT_EQ(queue.pop(), std::nullopt);
}

TEST(PriorityEviction, LowestPriorityFirstThenLeastRecent) {
  priority_eviction::queue queue(8);
  queue.push(0, 5);
  queue.push(1, 1);
  queue.push(2, 5);
  queue.push(3, 1);
  queue.push(4, 9);
  EXPECT_EQ(queue.pop(), 1);
  EXPECT_EQ(queue.pop(), 3);
  queue.erase(0);
  EXPECT_EQ(queue.pop(), 2);
  EXPECT_EQ(queue.pop(), 4);
  EXPECT_EQ(queue.pop(), std::nullopt);
}

TEST(PriorityEviction, PinnedBlocksStayUntilUnpinned) {
  priority_eviction::queue queue(4);
  queue.push(0, pinned_priority);
  queue.push(1, 3);
  queue.push(2, pinned_priority);
  EXPECT_EQ(queue.size(), 1);
  EXPECT_EQ(queue.num_pinned(), 2);
  EXPECT_TRUE(queue.contains(0));
  EXPECT_EQ(queue.pop(), 1);
  EXPECT_EQ(queue.pop(), std::nullopt) << "pinned blocks must never be evicted";
  queue.erase(2);
  EXPECT_EQ(queue.num_pinned(), 1);
  queue.unpin_all();
  EXPECT_EQ(queue.size(), 1);
  EXPECT_EQ(queue.pop(), 0);
}

}  // namespace
}  // namespace pagedkv
