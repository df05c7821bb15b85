// hybrid_kv_cache_manager by example: a Gemma-like model (full attention and a sliding window),
// what a window releases, hits that need only the window's blocks, and the refusals. The stateful
// test (test_hybrid_kv_cache_manager_stateful.cpp) covers the rest against a model.
#include <pagedkv/hybrid_kv_cache_manager.hpp>
#include <pagedkv/testing/colliding_hash.hpp>

#include "test_support.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <vector>

namespace pagedkv {
namespace {

using test::error_of;
using test::iota_tokens;

constexpr std::int32_t full = 0;
constexpr std::int32_t window = 1;

/// Full attention in group 0, a window of 8 tokens in group 1, blocks of 4.
hybrid_kv_cache_options gemma_like(std::int32_t blocks, bool freeing = true) {
  return {.block_size = 4,
          .num_device_blocks = blocks,
          .groups = {kv_cache_spec::full_attention(), kv_cache_spec::sliding_window(8)},
          .free_outside_window = freeing};
}

std::int32_t num_null(const block_table& table) {
  return static_cast<std::int32_t>(std::count(table.blocks().begin(), table.blocks().end(), null_block));
}

TEST(KvCacheSpec, FirstNeededPosition) {
  EXPECT_EQ(kv_cache_spec::full_attention().first_needed_position(100), 0);
  EXPECT_EQ(kv_cache_spec::sliding_window(8).first_needed_position(7), 0);
  EXPECT_EQ(kv_cache_spec::sliding_window(8).first_needed_position(8), 1);
  EXPECT_EQ(kv_cache_spec::sliding_window(8).first_needed_position(100), 93);
  EXPECT_EQ(kv_cache_spec::chunked_local(8).first_needed_position(15), 8);
  EXPECT_EQ(kv_cache_spec::chunked_local(8).first_needed_position(16), 16);
  EXPECT_EQ(kv_cache_spec::sliding_window(8).kernel_window_left(), 7);
  EXPECT_EQ(kv_cache_spec::full_attention().kernel_window_left(), -1);
}

TEST(HybridKvCacheManager, EachGroupGetsItsOwnSlots) {
  hybrid_kv_cache_manager<> m(gemma_like(32));
  const auto prompt = iota_tokens(10);
  EXPECT_EQ(m.num_blocks_to_allocate(prompt), 6);  // 3 blocks in each group
  const hybrid_allocation a = m.allocate(1, prompt);
  ASSERT_EQ(a.num_new_tokens(), 10);
  for (std::int32_t g = 0; g < 2; ++g) {
    for (std::int32_t i = 0; i < 10; ++i) EXPECT_EQ(a.group_slots(g)[static_cast<std::size_t>(i)], m.table(1, g).slot(i));
  }
  EXPECT_NE(m.table(1, full).block(0), m.table(1, window).block(0));
  EXPECT_EQ(m.num_free_blocks(), 26);
}

TEST(HybridKvCacheManager, AWindowReleasesWhatItsNextQueryCannotRead) {
  hybrid_kv_cache_manager<> m(gemma_like(32));
  m.allocate(1, iota_tokens(40));
  EXPECT_EQ(m.num_held_blocks(window), 10);
  m.mark_computed(1, 40);  // the next query, at 40, reads [33, 40]: blocks 8 and 9
  EXPECT_EQ(num_null(m.table(1, window)), 8);
  EXPECT_EQ(num_null(m.table(1, full)), 0);
  EXPECT_EQ(m.num_held_blocks(window), 2);
  EXPECT_EQ(m.usage().num_used_blocks, 12);
  // The released blocks are cached and idle: back among the free ones, and still hits.
  EXPECT_EQ(m.num_free_blocks(), 32 - 12);
  EXPECT_EQ(m.cache().num_cached_blocks(), 20);
  // Decoding keeps the window at 2-3 blocks however long the sequence grows.
  for (token_id t = 40; t < 80; ++t) {
    std::vector<slot_id> slots(2);
    m.append(1, std::span(&t, 1), slots);
    m.mark_computed(1, t + 1);
    EXPECT_LE(m.num_held_blocks(window), 3);
  }
  EXPECT_EQ(m.num_held_blocks(full), 20);
}

// A 40-token prompt allocated and computed 6 tokens at a time (as the scheduler does where a
// window frees blocks): the window group never holds more than max_window_blocks, the pool never
// gives more than num_blocks_to_prefill, and the lookup is the whole prompt's.
TEST(HybridKvCacheManager, AllocatesAPromptChunkByChunk) {
  hybrid_kv_cache_manager<> m(gemma_like(64));
  const auto prompt = iota_tokens(40);
  constexpr std::int32_t chunk = 6;
  EXPECT_EQ(m.max_window_blocks(window, chunk), 4);  // 8 - 1 + 6 tokens at any alignment
  EXPECT_EQ(m.max_window_blocks(full, chunk), std::numeric_limits<std::int32_t>::max());
  EXPECT_EQ(m.num_blocks_to_allocate(prompt), 20);
  EXPECT_EQ(m.num_blocks_to_prefill(prompt, chunk), 10 + 4);
  EXPECT_THROW((void)m.num_blocks_to_prefill(prompt, 0), error);
  EXPECT_THROW(m.allocate(1, prompt, {}, 0), error);
  EXPECT_FALSE(m.contains(1));
  const hybrid_allocation a = m.allocate(1, prompt, {}, chunk);
  EXPECT_EQ(a.num_new_tokens(), chunk);
  EXPECT_EQ(a.lookup.num_prompt_tokens, 40);
  EXPECT_EQ(m.num_tokens(1), chunk);
  std::int32_t peak = 64 - m.num_free_blocks();
  std::int32_t window_peak = 0;
  for (std::int32_t done = chunk; done < 40; done += chunk) {
    m.mark_computed(1, done);
    const std::int32_t n = std::min(chunk, 40 - done);
    std::vector<slot_id> slots(static_cast<std::size_t>(2 * n));
    m.append(1, std::span(prompt).subspan(static_cast<std::size_t>(done), static_cast<std::size_t>(n)), slots);
    window_peak = std::max(window_peak, m.num_held_blocks(window));
    peak = std::max(peak, 64 - m.num_free_blocks());
  }
  m.mark_computed(1, 40);
  EXPECT_EQ(window_peak, 4);  // after 30 tokens: blocks 5-8 hold [23, 36)
  EXPECT_EQ(peak, 13);        // then the full group holds 9: within num_blocks_to_prefill's 14
  // Freed, the prompt's blocks are cached: a second allocation hits 36 tokens in whole blocks and
  // 3 more copied from block 9 (a partial hit: the last token is always computed), and holds the
  // last one after them.
  m.free(1);
  const hybrid_allocation b = m.allocate(2, prompt, {}, chunk);
  EXPECT_EQ(b.num_cached_tokens, 39);
  EXPECT_EQ(b.num_partial_tokens, 3);
  EXPECT_EQ(b.partial_copies.size(), 2u);
  EXPECT_EQ(b.num_new_tokens(), 1);
  EXPECT_EQ(m.num_tokens(2), 40);
}

TEST(HybridKvCacheManager, WithFreeingOffAWindowKeepsEveryBlock) {
  hybrid_kv_cache_manager<> m(gemma_like(32, false));
  m.allocate(1, iota_tokens(40));
  m.mark_computed(1, 40);
  EXPECT_EQ(num_null(m.table(1, window)), 0);
  EXPECT_EQ(m.num_held_blocks(window), 10);
}

TEST(HybridKvCacheManager, AHitNeedsOnlyTheWindowsBlocks) {
  hybrid_kv_cache_manager<> m(gemma_like(32));
  const auto prompt = iota_tokens(32);
  m.allocate(1, prompt);
  m.mark_computed(1, 32);
  m.free(1);
  // The window's first blocks were released first: LRU evicts them before anything else.
  EXPECT_EQ(m.evict_cached_blocks(5), 5);
  auto next = prompt;
  next.push_back(32);
  const hybrid_allocation a = m.allocate(2, next);
  EXPECT_EQ(a.num_cached_tokens, 32);  // the query at 32 reads [25, 32]: the window's blocks 6, 7
  EXPECT_EQ(num_null(m.table(2, window)), 6);
  EXPECT_EQ(num_null(m.table(2, full)), 0);
  EXPECT_EQ(m.cache().hit_tokens(), 32);
}

TEST(HybridKvCacheManager, AHitStopsWhereAGroupMissesABlockItReads) {
  hybrid_kv_cache_manager<> m(gemma_like(32));
  const auto prompt = iota_tokens(32);
  m.allocate(1, prompt);
  m.mark_computed(1, 32);
  // Only blocks 6 and 7 of the window are held; free() releases them deepest first and the
  // anchor's last: LRU takes window block 7 first once the earlier window blocks are gone.
  m.free(1);
  EXPECT_EQ(m.evict_cached_blocks(7), 7);  // window blocks 0..5, then window block 7
  auto next = prompt;
  next.push_back(32);
  const hybrid_allocation a = m.allocate(2, next);
  // The anchor has all 8 blocks, but a hit of k blocks reads the window's blocks from
  // (4k - 7) / 4 to k - 1: for k = 8 block 7, for every shorter k one of blocks 0..5. No hit.
  EXPECT_EQ(a.num_cached_tokens, 0);
  EXPECT_EQ(m.cache().hit_tokens(), 0);
}

TEST(HybridKvCacheManager, ForkSharesEveryGroupAndCopiesOnWrite) {
  hybrid_kv_cache_manager<> m(gemma_like(32));
  m.allocate(1, iota_tokens(10));
  m.mark_computed(1, 10);
  m.fork(1, 2);
  const token_id t = 10;
  std::vector<slot_id> slots(2);
  const std::vector<block_copy> copies = m.append(2, std::span(&t, 1), slots);
  ASSERT_EQ(copies.size(), 2u);  // the shared partial last block, in each group
  EXPECT_EQ(copies[0].src, m.table(1, full).block(2));
  EXPECT_EQ(copies[1].src, m.table(1, window).block(2));
  EXPECT_EQ(copies[0].dst, m.table(2, full).block(2));
  EXPECT_EQ(slots[1], m.table(2, window).slot(10));
}

TEST(HybridKvCacheManager, ChunkedLocalReleasesWholeChunks) {
  hybrid_kv_cache_manager<> m({.block_size = 4, .num_device_blocks = 32, .groups = {kv_cache_spec::chunked_local(8)}});
  m.allocate(1, iota_tokens(20));
  m.mark_computed(1, 15);  // the next query, at 15, reads [8, 15]
  EXPECT_EQ(num_null(m.table(1, 0)), 2);
  m.mark_computed(1, 16);  // at 16: a new chunk, [16, 16]
  EXPECT_EQ(num_null(m.table(1, 0)), 4);
}

TEST(HybridKvCacheManager, ExportsNullEntriesBeforeTheWindow) {
  hybrid_kv_cache_manager<> m(gemma_like(32));
  m.allocate(1, iota_tokens(20));
  m.mark_computed(1, 20);
  const block_table* tables[] = {&m.table(1, window)};
  std::vector<std::int32_t> dense(5);
  std::vector<std::int32_t> lengths(1);
  export_dense(tables, 5, dense, lengths);
  EXPECT_EQ(dense[0], null_block);
  EXPECT_EQ(dense[2], null_block);
  EXPECT_NE(dense[3], null_block);  // [13, 20]: blocks 3 and 4
  EXPECT_EQ(lengths[0], 20);
}

TEST(HybridKvCacheManager, AnotherGroupsBlockNeverPassesForTheAnchors) {
  // depth_hash makes group 1's hash of position 0 the anchor's of position 1, and with one-token
  // blocks the window's block 0 ([0] after nothing) verifies as the anchor's block 1 ([0] after
  // block 0). Only the recorded group tells them apart.
  hybrid_kv_cache_manager<lifo_free_list, testing::depth_hash> m(
      {.block_size = 1, .num_device_blocks = 16, .groups = {kv_cache_spec::full_attention(), kv_cache_spec::sliding_window(1)}});
  const std::vector<token_id> prompt{0, 0};
  m.allocate(1, prompt);
  m.mark_computed(1, 2);
  m.free(1);
  const hybrid_allocation a = m.allocate(2, std::vector<token_id>{0, 0, 0});
  EXPECT_EQ(a.num_cached_tokens, 1);
  EXPECT_EQ(m.cached_group(m.table(2, full).block(0)), full);
}

std::int64_t missed(const prefix_lookup& l, miss_reason r) { return l.missed(r); }

TEST(HybridKvCacheManager, APartialHitCopiesEveryGroupsBlock) {
  hybrid_kv_cache_manager<> m(gemma_like(64));
  m.allocate(1, iota_tokens(10));  // blocks 0 and 1 full, block 2 holds tokens 8 and 9
  m.mark_computed(1, 10);
  m.free(1);  // keeps block 2 of both groups cached for partial hits
  auto next = iota_tokens(10);
  next.insert(next.end(), {100, 101});
  const std::int32_t free_before = m.num_free_blocks();
  const std::int32_t predicted = m.num_blocks_to_allocate(next);
  const prefix_lookup without = m.lookup(next, {.partial_reuse = false});
  EXPECT_EQ(without.num_partial_hit_tokens, 0);
  EXPECT_EQ(missed(without, miss_reason::partial_block), 4) << "tokens 8, 9 below the hit granularity, then 10, 11";

  const hybrid_allocation a = m.allocate(2, next);
  EXPECT_EQ(m.num_free_blocks(), free_before - predicted);
  EXPECT_EQ(a.num_cached_tokens, 10);
  EXPECT_EQ(a.num_partial_tokens, 2);
  EXPECT_EQ(a.lookup.num_hit_tokens, 8);
  EXPECT_EQ(a.lookup.num_partial_hit_tokens, 2);
  EXPECT_EQ(missed(a.lookup, miss_reason::partial_block), 2) << "tokens 10 and 11";
  EXPECT_EQ(a.num_new_tokens(), 2);
  ASSERT_EQ(a.partial_copies.size(), 2u);
  for (std::int32_t g : {full, window}) {
    const block_copy& copy = a.partial_copies[static_cast<std::size_t>(g)];
    EXPECT_EQ(copy.dst, m.table(2, g).block(2));
    EXPECT_EQ(m.cached_group(copy.src), g);
    EXPECT_EQ(m.cache().num_tokens_of(copy.src), 2);
    EXPECT_EQ(m.partial_sources(2)[static_cast<std::size_t>(g)], copy.src);
    EXPECT_EQ(m.device_pool().ref_count(copy.src), 2) << "the cache's and the sequence's until the copy ran";
  }
  EXPECT_EQ(num_null(m.table(2, window)), 0) << "position 10's window reads from 3, in block 0";
  EXPECT_DOUBLE_EQ(m.usage().partial_hit_rate, 2.0 / 22.0);
  m.mark_computed(2, 12);
  EXPECT_FALSE(m.has_partial_hit(2)) << "the step that ran the copies is over";
  for (const block_copy& copy : a.partial_copies) EXPECT_TRUE(m.cache().is_idle(copy.src));
}

TEST(HybridKvCacheManager, AllocateSharedForksEveryGroupInFlight) {
  hybrid_kv_cache_manager<> m(gemma_like(64));
  m.allocate(1, iota_tokens(19));  // nothing computed
  auto second = iota_tokens(16);
  second.insert(second.end(), {50, 51, 52});
  EXPECT_EQ(m.num_blocks_to_allocate_shared(second, 16), 2) << "block 4 of each group";
  const std::int32_t free_before = m.num_free_blocks();
  EXPECT_EQ(error_of([&] { m.allocate_shared(2, 1, 6, second); }), errc::invalid_argument) << "not whole blocks";
  EXPECT_EQ(error_of([&] { m.allocate_shared(2, 1, 8, second, {.key = {.adapter_id = 3, .cache_salt = {}}}); }),
            errc::invalid_argument)
      << "another key";
  EXPECT_EQ(error_of([&] { m.allocate_shared(2, 9, 8, second); }), errc::unknown_sequence);
  EXPECT_FALSE(m.contains(2));
  EXPECT_EQ(m.num_free_blocks(), free_before);

  const hybrid_allocation a = m.allocate_shared(2, 1, 16, second);
  EXPECT_EQ(a.num_cached_tokens, 16);
  EXPECT_EQ(a.num_new_tokens(), 3);
  EXPECT_EQ(a.lookup.num_shared_tokens, 16);
  EXPECT_EQ(m.num_free_blocks(), free_before - 2);
  for (std::int32_t g : {full, window}) {
    for (std::int32_t j = 0; j < 4; ++j) EXPECT_EQ(m.table(2, g).block(j), m.table(1, g).block(j));
    EXPECT_NE(m.table(2, g).block(4), m.table(1, g).block(4));
  }
  EXPECT_EQ(m.num_computed_tokens(2), 0) << "the source has computed nothing yet";
  // The source computes and its window moves on; the sharer, marked computed, releases its own.
  m.mark_computed(1, 19);
  EXPECT_EQ(m.table(1, window).block(0), null_block);
  EXPECT_NE(m.table(2, window).block(0), null_block) << "the sharer's next query is still at 0";
  m.mark_computed(2, 16);
  EXPECT_EQ(num_null(m.table(2, window)), 2) << "position 16's window starts in block 2";
  EXPECT_EQ(num_null(m.table(2, full)), 0);
  // A window that released what the shorter sequence's next query reads refuses, as fork does.
  m.mark_computed(2, 19);
  auto third = iota_tokens(8);
  third.push_back(7);
  EXPECT_EQ(error_of([&] { m.allocate_shared(3, 2, 8, third); }), errc::invalid_argument);
  m.free(1);
  m.free(2);
}

// ---- miss reasons ----

TEST(HybridKvCacheManagerMisses, EveryTokenHasOneReason) {
  hybrid_kv_cache_manager<> m(gemma_like(64));
  const auto prompt = iota_tokens(30);
  const prefix_lookup first = m.lookup(prompt);
  EXPECT_EQ(first.num_hit_tokens, 0);
  EXPECT_EQ(missed(first, miss_reason::never_stored), 28);   // blocks 0..6: nothing cached
  EXPECT_EQ(missed(first, miss_reason::partial_block), 2);   // tokens 28, 29
  m.allocate(1, prompt);
  m.mark_computed(1, 30);
  const hybrid_allocation a = m.allocate(2, prompt);
  EXPECT_EQ(a.num_cached_tokens, 28);
  EXPECT_EQ(a.lookup.num_hit_tokens, 28);
  EXPECT_EQ(missed(a.lookup, miss_reason::partial_block), 2);
  EXPECT_EQ(m.miss_totals().num_prompt_tokens, 60);
  EXPECT_EQ(m.miss_totals().num_hit_tokens, 28);
  EXPECT_EQ(missed(m.miss_totals(), miss_reason::never_stored), 28);
  EXPECT_EQ(missed(m.miss_totals(), miss_reason::partial_block), 4);
}

TEST(HybridKvCacheManagerMisses, EvictedResetAndGroupMissing) {
  hybrid_kv_cache_manager<> m(gemma_like(64));
  const auto prompt = iota_tokens(33);
  m.allocate(1, prompt);
  m.mark_computed(1, 33);
  m.free(1);
  // Window blocks 0..5, the partly filled blocks of position 8 that free() kept (window's, then
  // anchor's), then window block 7 (see the hit tests above).
  m.evict_cached_blocks(9);
  const prefix_lookup window = m.lookup(prompt);
  EXPECT_EQ(window.num_hit_tokens, 0);
  EXPECT_EQ(missed(window, miss_reason::group_missing), 32);  // the anchor had all 8 blocks
  EXPECT_EQ(missed(window, miss_reason::partial_block), 1);
  m.evict_cached_blocks(1000);
  EXPECT_EQ(missed(m.lookup(prompt), miss_reason::evicted_on_request), 32);
  m.allocate(2, prompt);
  m.mark_computed(2, 33);
  m.free(2);
  m.reset_prefix_cache();
  EXPECT_EQ(missed(m.lookup(prompt), miss_reason::cache_reset), 32);
}

TEST(HybridKvCacheManagerMisses, OtherKeyAndCollision) {
  hybrid_kv_cache_manager<> m(gemma_like(64));
  const auto prompt = iota_tokens(9);
  m.allocate(1, prompt);
  m.mark_computed(1, 9);
  const sequence_options tenant{.key = {.adapter_id = 0, .cache_salt = "tenant"}, .cache_priority = 0};
  EXPECT_EQ(missed(m.lookup(prompt, tenant), miss_reason::other_key), 8);
  // depth_hash: every prompt's block j has one hash, so another prompt meets a block of other tokens.
  hybrid_kv_cache_manager<lifo_free_list, testing::depth_hash> c(gemma_like(64));
  c.allocate(1, prompt);
  c.mark_computed(1, 9);
  EXPECT_EQ(missed(c.lookup(iota_tokens(9, 100)), miss_reason::hash_collision), 8);
  hybrid_kv_cache_manager<> off({.block_size = 4, .num_device_blocks = 8, .enable_prefix_caching = false});
  EXPECT_EQ(missed(off.lookup(prompt), miss_reason::caching_off), 9);
  EXPECT_EQ(to_string(miss_reason::group_missing), "group_missing");
}

TEST(HybridKvCacheManager, RefusalsChangeNothing) {
  EXPECT_THROW(hybrid_kv_cache_manager<>({.block_size = 4, .num_device_blocks = 8, .groups = {}}), error);
  EXPECT_THROW(hybrid_kv_cache_manager<>({.block_size = 4, .num_device_blocks = 8, .groups = {kv_cache_spec::sliding_window(0)}}), error);
  hybrid_kv_cache_manager<> m(gemma_like(6));
  EXPECT_FALSE(m.can_allocate(iota_tokens(13)));  // 4 blocks a group
  try {
    m.allocate(1, iota_tokens(13));
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::out_of_blocks);
  }
  EXPECT_EQ(m.num_free_blocks(), 6);
  m.allocate(1, iota_tokens(12));
  m.mark_computed(1, 12);  // the window releases block 0
  const token_id t = 12;
  std::vector<slot_id> one(1);
  EXPECT_THROW(m.append(1, std::span(&t, 1), one), error);  // 2 groups need 2 slots
  try {
    m.truncate(1, 3);  // its next query would read block 0 again
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument);
  }
  EXPECT_EQ(m.num_tokens(1), 12);
  m.truncate(1, 11);  // the next query at 11 reads [4, 11]: blocks 1 and 2
  EXPECT_EQ(m.table(1, window).num_blocks(), 3);
  EXPECT_THROW((void)m.table(1, 2), error);
}

}  // namespace
}  // namespace pagedkv
