// The mutex-policy pool, hammered from several threads (run under ThreadSanitizer in CI).
#include <pagedkv/block_pool.hpp>

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <random>
#include <thread>
#include <vector>

namespace pagedkv {
namespace {

template <class FreeList>
void hammer() {
  constexpr std::int32_t capacity = 64;
  constexpr int num_threads = 4;
  constexpr int rounds = 20000;
  block_pool<FreeList, mutex_lock> pool(capacity);
  std::atomic<std::int64_t> refused{0};
  // Each thread owns what it allocated; a block id must never be handed to two owners at once.
  std::array<std::atomic<int>, capacity> owners{};
  auto worker = [&](unsigned seed) {
    std::mt19937 rng(seed);
    std::vector<block_id> mine;
    for (int i = 0; i < rounds; ++i) {
      switch (rng() % 4) {
        case 0:
          if (auto id = pool.try_allocate()) {
            EXPECT_EQ(owners[static_cast<std::size_t>(*id)].fetch_add(1), 0) << "block " << *id << " handed out twice";
            mine.push_back(*id);
          } else {
            refused.fetch_add(1);
          }
          break;
        case 1: {
          std::array<block_id, 3> bulk{};
          if (pool.try_allocate(bulk)) {
            for (block_id id : bulk) {
              EXPECT_EQ(owners[static_cast<std::size_t>(id)].fetch_add(1), 0);
              mine.push_back(id);
            }
          }
          break;
        }
        case 2:
          if (!mine.empty()) {  // share and unshare: the count must come back to 1
            pool.retain(mine.back());
            EXPECT_FALSE(pool.release(mine.back()));
          }
          break;
        default:
          if (!mine.empty()) {
            const block_id id = mine.back();
            mine.pop_back();
            owners[static_cast<std::size_t>(id)].fetch_sub(1);
            EXPECT_TRUE(pool.release(id));
          }
      }
    }
    for (block_id id : mine) owners[static_cast<std::size_t>(id)].fetch_sub(1);
    pool.release(mine);
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < num_threads; ++t) threads.emplace_back(worker, 1234u + static_cast<unsigned>(t));
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(pool.num_free_blocks(), capacity);
  for (block_id id = 0; id < capacity; ++id) EXPECT_EQ(pool.ref_count(id), 0);
}

TEST(BlockPoolThreads, LifoMutexPoolStaysConsistent) { hammer<lifo_free_list>(); }
TEST(BlockPoolThreads, FifoMutexPoolStaysConsistent) { hammer<fifo_free_list>(); }
TEST(BlockPoolThreads, LruMutexPoolStaysConsistent) { hammer<lru_free_list>(); }
TEST(BlockPoolThreads, ExtentMutexPoolStaysConsistent) { hammer<extent_free_list>(); }

}  // namespace
}  // namespace pagedkv
