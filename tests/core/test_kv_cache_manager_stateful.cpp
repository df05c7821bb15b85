// RapidCheck stateful test of kv_cache_manager, for every policy combination: the conformance kit
// (include/pagedkv/testing/) run over pagedkv's own policies. A sanitizer build
// (PAGEDKV_TEST_EVERY_PAIRING off) runs 9 of the 18, which still hold every policy once. The model, the commands and the
// coverage each property must reach are the kit's; docs/design.md's testing section says what
// they reach. Runs: RC_PARAMS sets the number of command sequences (CMakeLists sets max_success,
// and PAGEDKV_RC_CASES to the same number); the seed is printed at start and a failure prints the
// string that reproduces it.
#include <pagedkv/kv_cache_manager.hpp>
#include <pagedkv/retention.hpp>
#include <pagedkv/testing/colliding_hash.hpp>
#include <pagedkv/testing/conformance_gtest.hpp>

#include <gtest/gtest.h>
#include <rapidcheck/detail/Configuration.h>

namespace pagedkv {
namespace {

using testing::depth_hash;
using testing::expect_kv_cache_manager_conformance;
using testing::last_block_hash;
using testing::modulus_hash;

// Every free-list x eviction pair with the real hash.
TEST(KvCacheManagerStateful, LifoFreeListLruEviction) {
  expect_kv_cache_manager_conformance<lifo_free_list, xxh3_hash, lru_eviction>();
}
#if PAGEDKV_TEST_EVERY_PAIRING  // a sanitizer build runs each policy once
TEST(KvCacheManagerStateful, FifoFreeListLruEviction) {
  expect_kv_cache_manager_conformance<fifo_free_list, xxh3_hash, lru_eviction>();
}
TEST(KvCacheManagerStateful, LruFreeListLruEviction) {
  expect_kv_cache_manager_conformance<lru_free_list, xxh3_hash, lru_eviction>();
}
TEST(KvCacheManagerStateful, ExtentFreeListLruEviction) {
  expect_kv_cache_manager_conformance<extent_free_list, xxh3_hash, lru_eviction>();
}
TEST(KvCacheManagerStateful, LifoFreeListPriorityEviction) {
  expect_kv_cache_manager_conformance<lifo_free_list, xxh3_hash, priority_eviction>();
}
TEST(KvCacheManagerStateful, FifoFreeListPriorityEviction) {
  expect_kv_cache_manager_conformance<fifo_free_list, xxh3_hash, priority_eviction>();
}
TEST(KvCacheManagerStateful, LruFreeListPriorityEviction) {
  expect_kv_cache_manager_conformance<lru_free_list, xxh3_hash, priority_eviction>();
}
#endif
TEST(KvCacheManagerStateful, ExtentFreeListPriorityEviction) {
  expect_kv_cache_manager_conformance<extent_free_list, xxh3_hash, priority_eviction>();
}

// Colliding hashes, each with both eviction policies: the cache's verification alone keeps hits right.
#if PAGEDKV_TEST_EVERY_PAIRING  // a sanitizer build runs each policy once
TEST(KvCacheManagerStateful, DepthHashLruEviction) {
  expect_kv_cache_manager_conformance<lifo_free_list, depth_hash, lru_eviction>(
      {.rejections = {.tokens = true, .parent = false, .key = true}});
}
#endif
TEST(KvCacheManagerStateful, DepthHashPriorityEviction) {
  expect_kv_cache_manager_conformance<fifo_free_list, depth_hash, priority_eviction>(
      {.rejections = {.tokens = true, .parent = false, .key = true}});
}
TEST(KvCacheManagerStateful, ModulusHashLruEviction) {
  expect_kv_cache_manager_conformance<lru_free_list, modulus_hash, lru_eviction>(
      {.rejections = {.tokens = true, .parent = true, .key = true}});
}
#if PAGEDKV_TEST_EVERY_PAIRING  // a sanitizer build runs each policy once
TEST(KvCacheManagerStateful, ModulusHashPriorityEviction) {
  expect_kv_cache_manager_conformance<extent_free_list, modulus_hash, priority_eviction>(
      {.rejections = {.tokens = true, .parent = true, .key = true}});
}
#endif
TEST(KvCacheManagerStateful, LastBlockHashLruEviction) {
  expect_kv_cache_manager_conformance<extent_free_list, last_block_hash, lru_eviction>(
      {.rejections = {.tokens = false, .parent = true, .key = true}});
}
#if PAGEDKV_TEST_EVERY_PAIRING  // a sanitizer build runs each policy once
TEST(KvCacheManagerStateful, LastBlockHashPriorityEviction) {
  expect_kv_cache_manager_conformance<lifo_free_list, last_block_hash, priority_eviction>(
      {.rejections = {.tokens = false, .parent = true, .key = true}});
}
#endif

// The retention policies (retention.hpp), each set up so that its rule acts during the run: a TTL
// of 3 on a clock that ticks each time a block goes idle (time that only successful calls move,
// so a refused call still changes nothing), a pin budget of 3 that the pinned_priority
// sequences spend, and the three composed.
template <class Inner>
struct ticking_ttl_eviction {
  class queue : public ttl_eviction<Inner>::queue {
    using base = typename ttl_eviction<Inner>::queue;

   public:
    explicit queue(std::int32_t capacity) : base(capacity) { base::set_ttl(steps{3}); }
    void push(block_id id, std::int32_t priority) { push(id, priority, 0); }
    void push(block_id id, std::int32_t priority, block_hash hash) {
      base::clock().advance();
      base::push(id, priority, hash);
    }
  };
};
template <class Inner>
struct budget3_pin_eviction {
  class queue : public pin_budget_eviction<Inner>::queue {
   public:
    explicit queue(std::int32_t capacity) : pin_budget_eviction<Inner>::queue(capacity) { this->set_pin_budget(3); }
  };
};

TEST(KvCacheManagerStateful, TtlOverPriorityEviction) {
  expect_kv_cache_manager_conformance<lifo_free_list, xxh3_hash, ticking_ttl_eviction<priority_eviction>>();
}
TEST(KvCacheManagerStateful, PinBudgetOverPriorityEviction) {
  expect_kv_cache_manager_conformance<fifo_free_list, xxh3_hash, budget3_pin_eviction<priority_eviction>>();
}
TEST(KvCacheManagerStateful, TinyLfuEviction) {
  expect_kv_cache_manager_conformance<extent_free_list, xxh3_hash, tinylfu_eviction>();
}
TEST(KvCacheManagerStateful, PinBudgetOverTtlOverTinyLfuWithModulusHash) {
  expect_kv_cache_manager_conformance<lru_free_list, modulus_hash,
                                      budget3_pin_eviction<ticking_ttl_eviction<tinylfu_eviction>>>(
      {.rejections = {.tokens = true, .parent = true, .key = true}});
}

// RC_PARAMS is set per test by ctest (tests/core/CMakeLists.txt); without it every property above
// would quietly run RapidCheck's default of 100 cases.
TEST(KvCacheManagerStateful, RcParamsReachTheTests) {
  EXPECT_EQ(rc::detail::configuration().testParams.maxSuccess, PAGEDKV_RC_CASES)
      << "RC_PARAMS did not reach the test: run it through ctest, or set RC_PARAMS=max_success="
      << PAGEDKV_RC_CASES;
}

}  // namespace
}  // namespace pagedkv
