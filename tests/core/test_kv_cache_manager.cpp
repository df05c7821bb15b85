#include <pagedkv/kv_cache_manager.hpp>
#include <pagedkv/scheduler.hpp>
#include <pagedkv/testing/colliding_hash.hpp>

#include "test_support.hpp"

#include <gtest/gtest.h>

#include <numeric>
#include <optional>
#include <set>
#include <vector>

namespace pagedkv {
namespace {

using test::error_of;
using test::iota_tokens;

kv_cache_options small(std::int32_t device, std::int32_t host = 0, bool caching = true) {
  return {.block_size = 4, .num_device_blocks = device, .num_host_blocks = host, .enable_prefix_caching = caching};
}

/// Appends one token and returns its slot.
template <class Manager>
slot_id append_one(Manager& m, seq_id seq, token_id token, std::optional<block_copy>* copy = nullptr) {
  slot_id slot = -1;
  const auto c = m.append(seq, std::span(&token, 1), std::span(&slot, 1));
  if (copy) *copy = c;
  return slot;
}

TEST(KvCacheManager, AllocateHandsOutSlotsForTheWholePrompt) {
  kv_cache_manager<> m(small(8));
  const auto prompt = iota_tokens(10);
  ASSERT_TRUE(m.can_allocate(prompt));
  EXPECT_EQ(m.num_blocks_to_allocate(prompt), 3);
  const allocation a = m.allocate(7, prompt);
  EXPECT_EQ(a.num_cached_tokens, 0);
  ASSERT_EQ(a.slots.size(), 10u);
  const block_table& t = m.table(7);
  for (std::int32_t i = 0; i < 10; ++i) EXPECT_EQ(a.slots[static_cast<std::size_t>(i)], t.slot(i));
  EXPECT_EQ(m.num_free_blocks(), 5);
  EXPECT_EQ(m.num_tokens(7), 10);
  EXPECT_EQ(m.num_computed_tokens(7), 0);
}

TEST(KvCacheManager, ExtentsKeepEachSequenceInFewExtentsAsTheBatchGrows) {
  // Eight sequences admitted over a pool scattered by earlier ones, then growing a token at a
  // time in turn, as a decode batch does: with extents of 8 blocks each sequence's 12 blocks lie
  // in at most 3 extents (2 at best; one more where the scattered free blocks cut one short).
  // A LIFO free list puts nearly every block of a sequence in another extent than the one before.
  constexpr std::int32_t extent = 8, seqs = 8, tokens = 12 * 4;
  kv_cache_options o = small(256, 0, false);
  o.extent_blocks = extent;
  kv_cache_manager<extent_free_list> m(o);
  kv_cache_manager<> lifo(small(256, 0, false));
  for (seq_id s = 100; s < 140; ++s) {  // churn: 40 sequences of 1-12 blocks, every other one freed
    const auto prompt = iota_tokens(static_cast<std::int32_t>(1 + (s * 37) % 48));
    m.allocate(s, prompt);
    lifo.allocate(s, prompt);
    if (s % 2 == 0) {
      m.free(s);
      lifo.free(s);
    }
  }
  for (seq_id s = 0; s < seqs; ++s) {
    m.allocate(s, iota_tokens(5));
    lifo.allocate(s, iota_tokens(5));
  }
  for (std::int32_t t = 5; t < tokens; ++t)
    for (seq_id s = 0; s < seqs; ++s) {
      append_one(m, s, t);
      append_one(lifo, s, t);
    }
  std::int32_t lifo_neighbours = 0;
  for (seq_id s = 0; s < seqs; ++s) {
    std::set<block_id> extents;
    for (block_id b : m.table(s).blocks()) extents.insert(b / extent);
    EXPECT_LE(extents.size(), 3u) << "sequence " << s;
    const auto blocks = lifo.table(s).blocks();
    for (std::size_t i = 1; i < blocks.size(); ++i) lifo_neighbours += blocks[i] / extent == blocks[i - 1] / extent;
  }
  EXPECT_LE(lifo_neighbours, seqs) << "LIFO: the two blocks of each prompt at most";
}

TEST(KvCacheManager, ExtentBlocksNeedAFreeListWithExtents) {
  kv_cache_options o = small(8);
  o.extent_blocks = 4;
  try {
    kv_cache_manager<> m(o);
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("extent_free_list"), std::string::npos);
  }
  o.extent_blocks = 9;
  try {
    kv_cache_manager<extent_free_list> m(o);
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("extent of 9 blocks"), std::string::npos);
  }
}


TEST(KvCacheManager, AllocateSharedForksBlocksInFlightAndCountsThemApart) {
  kv_cache_manager<> m(small(16, 4));
  const auto first = iota_tokens(11);  // blocks 0 and 1 full, block 2 partial; nothing computed
  m.allocate(1, first);
  auto second = iota_tokens(8);
  second.insert(second.end(), {50, 51, 52});
  EXPECT_EQ(m.num_blocks_to_allocate_shared(second, 8), 1);
  // Refusals change nothing.
  const std::int32_t free_before = m.num_free_blocks();
  EXPECT_EQ(error_of([&] { m.allocate_shared(2, 1, 6, second); }), errc::invalid_argument) << "not whole blocks";
  EXPECT_EQ(error_of([&] { m.allocate_shared(2, 1, 12, second); }), errc::invalid_argument) << "past the prompt";
  EXPECT_EQ(error_of([&] { m.allocate_shared(2, 1, 8, iota_tokens(11, 1)); }), errc::invalid_argument) << "other tokens";
  EXPECT_EQ(error_of([&] { m.allocate_shared(2, 1, 8, second, {.key = {.adapter_id = 3, .cache_salt = {}}}); }),
            errc::invalid_argument)
      << "another key";
  EXPECT_EQ(error_of([&] { m.allocate_shared(2, 9, 8, second); }), errc::unknown_sequence);
  EXPECT_EQ(error_of([&] { m.allocate_shared(1, 1, 8, second); }), errc::duplicate_sequence);
  EXPECT_FALSE(m.contains(2));
  EXPECT_EQ(m.num_free_blocks(), free_before);

  const allocation a = m.allocate_shared(2, 1, 8, second);
  EXPECT_EQ(a.num_cached_tokens, 8);
  EXPECT_EQ(a.slots.size(), 3u);
  EXPECT_EQ(m.table(2).block(0), m.table(1).block(0));
  EXPECT_EQ(m.table(2).block(1), m.table(1).block(1));
  EXPECT_NE(m.table(2).block(2), m.table(1).block(2));
  EXPECT_EQ(m.num_computed_tokens(2), 0) << "the source has computed nothing yet";
  EXPECT_EQ(a.lookup.num_shared_tokens, 8);
  EXPECT_EQ(a.lookup.missed(miss_reason::partial_block), 3);
  EXPECT_EQ(m.miss_totals().num_shared_tokens, 8);
  EXPECT_DOUBLE_EQ(m.usage().shared_hit_rate, 8.0 / 22.0);
  EXPECT_EQ(m.usage().prefix_hit_rate, 0.0);

  // The source computes; the sharer marks the shared part computed, which publishes nothing new.
  m.mark_computed(1, 11);
  m.mark_computed(2, 8);
  EXPECT_EQ(m.cache().num_cached_blocks(), 2);
  const std::vector<seq_id> source{1};
  m.swap_out(source);
  EXPECT_EQ(error_of([&] { m.allocate_shared(3, 1, 8, second); }), errc::wrong_location);
  m.free(1);
  m.free(2);
  EXPECT_EQ(m.num_free_blocks(), 16);
}

TEST(KvCacheManager, ComputedFullBlocksAreSharedWithTheNextPrompt) {
  kv_cache_manager<> m(small(8));
  const auto prompt = iota_tokens(10);
  m.allocate(1, prompt);
  EXPECT_EQ(m.allocate(2, prompt).num_cached_tokens, 0) << "nothing is cached before it is computed";
  m.mark_computed(1, 10);
  const allocation hit = m.allocate(3, prompt);
  EXPECT_EQ(hit.num_cached_tokens, 8);
  EXPECT_EQ(hit.slots.size(), 2u);
  EXPECT_EQ(m.table(3).block(0), m.table(1).block(0));
  EXPECT_EQ(m.table(3).block(1), m.table(1).block(1));
  EXPECT_NE(m.table(3).block(2), m.table(1).block(2)) << "the partial last block is private";
  EXPECT_EQ(m.device_pool().ref_count(m.table(1).block(0)), 3) << "two tables plus the cache's hold";
  EXPECT_NEAR(m.usage().prefix_hit_rate, 8.0 / 30.0, 1e-12);
}

TEST(KvCacheManager, AFullyCachedPromptStillComputesItsLastBlock) {
  for (const bool reuse : {false, true}) {
    kv_cache_options o = small(8);
    o.enable_partial_reuse = reuse;
    kv_cache_manager<> m(o);
    const auto prompt = iota_tokens(8);
    m.allocate(1, prompt);
    m.mark_computed(1, 8);
    const allocation hit = m.allocate(2, prompt);
    // The last block is hit whole only up to its last token: a partial hit copies its first three.
    EXPECT_EQ(hit.num_cached_tokens, reuse ? 7 : 4);
    EXPECT_EQ(hit.slots.size(), reuse ? 1u : 4u);
    EXPECT_EQ(hit.partial_copy.has_value(), reuse);
  }
}

TEST(KvCacheManager, FreedCachedBlocksStayReusableUntilEvicted) {
  kv_cache_manager<> m(small(4));
  const auto prompt = iota_tokens(9);
  m.allocate(1, prompt);
  m.mark_computed(1, 9);
  m.free(1);
  kv_cache_usage u = m.usage();
  EXPECT_EQ(u.num_free_blocks, 4);
  EXPECT_EQ(u.num_cached_blocks, 3) << "two full blocks and the tail kept for partial hits";
  EXPECT_EQ(u.num_evictable_blocks, 3);
  EXPECT_EQ(m.allocate(2, prompt).num_cached_tokens, 8) << "idle cached blocks are hit";
  m.free(2);
  // A new prompt needing all four blocks evicts the idle ones.
  const auto other = iota_tokens(16, 1000);
  ASSERT_TRUE(m.can_allocate(other));
  m.allocate(3, other);
  EXPECT_EQ(m.usage().num_cached_blocks, 0);
  EXPECT_EQ(m.num_free_blocks(), 0);
}

TEST(KvCacheManager, LruEvictsTheDeepestBlockOfAFinishedChainFirst) {
  kv_cache_manager<> m(small(4));
  m.allocate(1, iota_tokens(9));
  m.mark_computed(1, 9);
  const block_id root = m.table(1).block(0);
  m.free(1);
  m.allocate(2, iota_tokens(9, 500));  // takes the two free blocks, then evicts one cached block
  EXPECT_EQ(m.usage().num_cached_blocks, 1);
  m.free(2);
  EXPECT_EQ(m.allocate(3, iota_tokens(5)).num_cached_tokens, 4) << "the root survived";
  EXPECT_EQ(m.table(3).block(0), root);
}

TEST(KvCacheManager, ForkSharesEverythingAndCopiesOnWrite) {
  kv_cache_manager<> m(small(8, 0, false));
  m.allocate(1, iota_tokens(6));
  m.fork(1, 2);
  EXPECT_EQ(m.num_free_blocks(), 6) << "fork allocates nothing";
  const block_id shared_last = m.table(1).block(1);
  EXPECT_EQ(m.device_pool().ref_count(shared_last), 2);
  std::optional<block_copy> copy;
  const slot_id slot = append_one(m, 2, 99, &copy);
  ASSERT_TRUE(copy.has_value());
  EXPECT_EQ(copy->src, shared_last);
  EXPECT_EQ(m.table(2).block(1), copy->dst);
  EXPECT_EQ(slot, slot_id{copy->dst} * 4 + 2);
  EXPECT_EQ(m.device_pool().ref_count(shared_last), 1);
  append_one(m, 1, 98, &copy);
  EXPECT_FALSE(copy.has_value()) << "the parent is the last holder: it writes in place";
  EXPECT_EQ(m.tokens(2).back(), 99);
  EXPECT_EQ(m.tokens(1).back(), 98);
}

TEST(KvCacheManager, ForkOfAFullLastBlockNeedsNoCopy) {
  kv_cache_manager<> m(small(8, 0, false));
  m.allocate(1, iota_tokens(8));
  m.fork(1, 2);
  std::optional<block_copy> copy;
  append_one(m, 2, 5, &copy);
  EXPECT_FALSE(copy.has_value());
  EXPECT_EQ(m.table(2).num_blocks(), 3);
}

TEST(KvCacheManager, TruncateReleasesEmptiedBlocksAndCopiesACachedLastBlock) {
  kv_cache_manager<> m(small(8));
  m.allocate(1, iota_tokens(12));
  m.mark_computed(1, 12);
  const block_id second = m.table(1).block(1);
  m.truncate(1, 6);
  EXPECT_EQ(m.table(1).num_blocks(), 2);
  EXPECT_EQ(m.num_tokens(1), 6);
  EXPECT_EQ(m.num_computed_tokens(1), 6);
  std::optional<block_copy> copy;
  append_one(m, 1, -3, &copy);
  ASSERT_TRUE(copy.has_value()) << "block 1 is cached: writing into it would corrupt the cache";
  EXPECT_EQ(copy->src, second);
  const auto cached = m.cache().tokens_of(second);
  EXPECT_EQ(std::vector<token_id>(cached.begin(), cached.end()), (std::vector<token_id>{4, 5, 6, 7}));
  EXPECT_THROW(m.truncate(1, 0), error);
  EXPECT_THROW(m.truncate(1, 8), error);
}

TEST(KvCacheManager, SwapOutAndInMoveEachSharedBlockOnce) {
  kv_cache_manager<> m(small(8, 8, false));
  m.allocate(1, iota_tokens(6));
  m.fork(1, 2);
  append_one(m, 2, 50);  // copy-on-write: 3 distinct blocks in the group
  const std::vector<seq_id> group{1, 2};
  ASSERT_TRUE(m.can_swap_out(group));
  const auto out = m.swap_out(group);
  EXPECT_EQ(out.size(), 3u);
  EXPECT_EQ(m.num_free_blocks(), 8);
  EXPECT_EQ(m.num_free_host_blocks(), 5);
  EXPECT_EQ(m.where(1), location::host);
  EXPECT_EQ(m.host_pool().ref_count(m.table(1).block(0)), 2);
  EXPECT_THROW(append_one(m, 1, 0), error) << "swapped out";
  const auto in = m.swap_in(group);
  ASSERT_EQ(in.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(in[i].src, out[i].dst);
  EXPECT_EQ(m.num_free_host_blocks(), 8);
  EXPECT_EQ(m.num_free_blocks(), 5);
  EXPECT_EQ(m.table(1).block(0), m.table(2).block(0));
  EXPECT_EQ(m.device_pool().ref_count(m.table(1).block(0)), 2);
}

TEST(KvCacheManager, SwapErrorsChangeNothing) {
  kv_cache_manager<> m(small(8, 1, false));
  m.allocate(1, iota_tokens(6));
  const std::vector<seq_id> group{1};
  EXPECT_FALSE(m.can_swap_out(group));
  try {
    m.swap_out(group);
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::out_of_blocks);
  }
  EXPECT_EQ(m.where(1), location::device);
  EXPECT_EQ(m.num_free_blocks(), 6);
  const std::vector<seq_id> twice{1, 1};
  EXPECT_THROW(m.swap_out(twice), error);
  EXPECT_THROW(m.swap_in(group), error) << "not swapped out";
  kv_cache_manager<> no_host(small(8));
  no_host.allocate(1, iota_tokens(2));
  EXPECT_FALSE(no_host.can_swap_out(group));
}

TEST(KvCacheManager, OutOfBlocksIsAllOrNothing) {
  kv_cache_manager<> m(small(3));
  m.allocate(1, iota_tokens(8));
  const auto big = iota_tokens(8, 100);
  EXPECT_FALSE(m.can_allocate(big));
  try {
    m.allocate(2, big);
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::out_of_blocks);
    EXPECT_NE(std::string(e.what()).find("needs 2 blocks, 1 free"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(m.contains(2));
  EXPECT_EQ(m.num_free_blocks(), 1);
  std::vector<token_id> five(5, 1);
  std::vector<slot_id> slots(5, -9);
  EXPECT_FALSE(m.can_append(1, 5));
  EXPECT_THROW(m.append(1, five, slots), error);
  EXPECT_EQ(m.num_tokens(1), 8);
  EXPECT_EQ(slots[0], -9);
}

TEST(KvCacheManager, WatermarkHoldsBackAdmissionOnly) {
  kv_cache_options o = small(4);
  o.watermark_blocks = 1;
  kv_cache_manager<> m(o);
  const auto prompt = iota_tokens(16);
  EXPECT_FALSE(m.can_allocate(prompt)) << "would leave 0 < 1 free";
  EXPECT_TRUE(m.can_allocate(iota_tokens(12)));
  m.allocate(1, iota_tokens(12));
  append_one(m, 1, 1) ;  // growth may dip into the watermark
  EXPECT_EQ(m.num_free_blocks(), 0);
}

TEST(KvCacheManager, MisuseNamesTheSequence) {
  kv_cache_manager<> m(small(4));
  auto expect_error = [](errc code, auto&& call, const char* fragment) {
    try {
      call();
      ADD_FAILURE() << fragment;
    } catch (const error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  m.allocate(1, iota_tokens(3));
  expect_error(errc::unknown_sequence, [&] { m.free(9); }, "sequence 9");
  expect_error(errc::unknown_sequence, [&] { m.fork(9, 10); }, "sequence 9");
  expect_error(errc::duplicate_sequence, [&] { m.allocate(1, iota_tokens(1)); }, "sequence 1");
  expect_error(errc::duplicate_sequence, [&] { m.fork(1, 1); }, "sequence 1");
  expect_error(errc::invalid_argument, [&] { m.allocate(2, std::vector<token_id>{}); }, "0 tokens");
  expect_error(errc::invalid_argument, [&] { m.mark_computed(1, 4); }, "holds 3");
  std::vector<token_id> one{1};
  std::vector<slot_id> two(2);
  expect_error(errc::invalid_argument, [&] { m.append(1, one, two); }, "1 tokens with 2 slots");
  EXPECT_THROW(kv_cache_manager<>(small(0)), error);
  EXPECT_THROW(kv_cache_manager<>(kv_cache_options{.block_size = 0, .num_device_blocks = 4}), error);
  EXPECT_EQ(m.num_sequences(), 1u);
  EXPECT_EQ(m.num_free_blocks(), 3);
}

TEST(KvCacheManager, UsageCountsSharedSlotsOnce) {
  kv_cache_manager<> m(small(8, 0, false));
  m.allocate(1, iota_tokens(6));
  m.fork(1, 2);
  kv_cache_usage u = m.usage();
  EXPECT_EQ(u.num_used_blocks, 2);
  EXPECT_EQ(u.num_live_tokens, 6);
  EXPECT_DOUBLE_EQ(u.utilization, 6.0 / 8.0);
  append_one(m, 2, 1);
  u = m.usage();
  EXPECT_EQ(u.num_used_blocks, 3);
  EXPECT_EQ(u.num_live_tokens, 4 + 2 + 3);
}

TEST(KvCacheManager, PriorityEvictionKeepsPinnedPromptsCached) {
  kv_cache_options o = small(4);
  o.enable_partial_reuse = false;  // else the prompt's last, partly filled block stays pinned too
  kv_cache_manager<lifo_free_list, xxh3_hash, priority_eviction> m(o);
  const auto system = iota_tokens(5);
  m.allocate(1, system, {.cache_priority = pinned_priority});
  m.mark_computed(1, 5);
  m.free(1);
  EXPECT_EQ(m.num_free_blocks(), 3) << "the pinned block is not available for eviction";
  EXPECT_FALSE(m.can_allocate(iota_tokens(16, 100)));
  m.allocate(2, iota_tokens(12, 100));
  m.free(2);
  EXPECT_EQ(m.allocate(3, system).num_cached_tokens, 4);
  m.free(3);
  m.cache().eviction_queue().unpin_all();
  EXPECT_EQ(m.num_free_blocks(), 4);
}

TEST(KvCacheManager, ResetPrefixCacheDropsEveryHold) {
  kv_cache_manager<> m(small(8));
  m.allocate(1, iota_tokens(9));
  m.mark_computed(1, 9);
  EXPECT_EQ(m.device_pool().ref_count(m.table(1).block(0)), 2);
  m.reset_prefix_cache();
  EXPECT_EQ(m.device_pool().ref_count(m.table(1).block(0)), 1);
  EXPECT_EQ(m.allocate(2, iota_tokens(9)).num_cached_tokens, 0);
  m.free(1);
  m.free(2);
  EXPECT_EQ(m.device_pool().num_free_blocks(), 8);
}

// ---- miss reasons ----

/// A prompt's computed blocks, cached and then idle: allocate, compute, free.
template <class Manager>
void cache_prompt(Manager& m, seq_id seq, std::span<const token_id> prompt, const sequence_options& opts = {}) {
  m.allocate(seq, prompt, opts);
  m.mark_computed(seq, static_cast<std::int32_t>(prompt.size()));
  m.free(seq);
}

TEST(KvCacheManagerMisses, EveryPromptTokenIsAHitOrHasOneReason) {
  kv_cache_manager<> m(small(16));
  const auto prompt = iota_tokens(14);
  const prefix_lookup cold = m.lookup(prompt);
  EXPECT_EQ(cold.num_prompt_tokens, 14);
  EXPECT_EQ(cold.num_hit_tokens, 0);
  EXPECT_EQ(cold.missed(miss_reason::never_stored), 12);  // blocks 0..2
  EXPECT_EQ(cold.missed(miss_reason::partial_block), 2);  // tokens 12, 13
  cache_prompt(m, 1, prompt);
  auto longer = iota_tokens(21);
  longer[17] = 99;  // block 4 differs: never stored
  const allocation a = m.allocate(2, longer);
  EXPECT_EQ(a.num_cached_tokens, 14);
  EXPECT_EQ(a.lookup.num_hit_tokens, 12);
  EXPECT_EQ(a.lookup.num_partial_hit_tokens, 2);  // tokens 12 and 13: the first prompt's tail, kept
  EXPECT_EQ(a.lookup.missed(miss_reason::never_stored), 6);  // the rest of blocks 3, and block 4
  EXPECT_EQ(a.lookup.missed(miss_reason::partial_block), 1);
  EXPECT_EQ(a.lookup.missed_tokens, m.lookup(longer).missed_tokens) << "lookup() predicts allocate()";
  const prefix_lookup& totals = m.miss_totals();
  EXPECT_EQ(totals.num_prompt_tokens, 14 + 21);
  EXPECT_EQ(totals.num_hit_tokens, 12);
  EXPECT_EQ(totals.missed(miss_reason::never_stored), 12 + 6);
  EXPECT_EQ(totals.missed(miss_reason::partial_block), 2 + 1);
}

TEST(KvCacheManagerMisses, PartialHitsServeWhatPartialReuseOffMissesBelowTheBlock) {
  for (const bool reuse : {true, false}) {
    SCOPED_TRACE(reuse ? "partial reuse on" : "partial reuse off");
    kv_cache_options o = small(16);
    o.enable_partial_reuse = reuse;
    kv_cache_manager<> m(o);
    cache_prompt(m, 1, iota_tokens(13));  // blocks 0..2 cached
    // A prompt inside the cached block 2: two whole blocks, then tokens 8 and 9 of block 2.
    const allocation inside = m.allocate(2, iota_tokens(11));
    EXPECT_EQ(inside.num_cached_tokens, reuse ? 10 : 8);
    EXPECT_EQ(inside.lookup.num_hit_tokens, 8);
    EXPECT_EQ(inside.lookup.num_partial_hit_tokens, reuse ? 2 : 0);
    EXPECT_EQ(inside.lookup.missed(miss_reason::partial_block), reuse ? 1 : 3);
    ASSERT_EQ(inside.partial_copy.has_value(), reuse);
    if (reuse) {
      EXPECT_TRUE(m.cache().contains(inside.partial_copy->src));
      EXPECT_EQ(inside.partial_copy->dst, m.table(2).block(2));
      EXPECT_TRUE(m.has_partial_hit(2));
    }
    // A prompt that leaves block 2 after two tokens and goes on: block 2's own reason (never
    // stored) keeps the other two tokens and the next block.
    auto diverging = iota_tokens(19);
    diverging[10] = 99;
    const prefix_lookup looked = m.lookup(diverging);
    const allocation a = m.allocate(3, diverging);
    EXPECT_EQ(a.lookup.missed_tokens, looked.missed_tokens) << "lookup() predicts allocate()";
    EXPECT_EQ(a.num_cached_tokens, reuse ? 10 : 8);
    EXPECT_EQ(a.lookup.num_partial_hit_tokens, reuse ? 2 : 0);
    EXPECT_EQ(a.lookup.missed(miss_reason::never_stored), 6);
    EXPECT_EQ(a.lookup.missed(miss_reason::partial_block), reuse ? 3 : 5);
    EXPECT_EQ(m.miss_totals().num_partial_hit_tokens, reuse ? 4 : 0);
    m.mark_computed(2, 11);
    EXPECT_FALSE(m.has_partial_hit(2)) << "the step that ran the copy is over";
    EXPECT_EQ(m.usage().partial_hit_rate > 0.0, reuse);
  }
}

TEST(KvCacheManager, AConversationsNextTurnCopiesThePartlyFilledBlockItEndedIn) {
  for (const bool reuse : {true, false}) {
    SCOPED_TRACE(reuse ? "partial reuse on" : "partial reuse off");
    kv_cache_options o = small(16);
    o.enable_partial_reuse = reuse;
    kv_cache_manager<> m(o);
    // Turn 1: 10 tokens computed (two full blocks and two tokens of the third), then freed.
    const std::vector<token_id> turn1 = iota_tokens(10);
    m.allocate(1, turn1);
    m.mark_computed(1, 10);
    const block_id tail = m.table(1).block(2);
    m.free(1);
    EXPECT_EQ(m.cache().contains(tail), reuse) << "the tail is kept for partial hits only";
    EXPECT_EQ(m.cache().num_cached_blocks(), reuse ? 3 : 2);
    EXPECT_EQ(m.num_free_blocks(), 16) << "a kept tail is idle, so free to take";
    // Turn 2 continues the history: the two full blocks hit, the tail's two tokens are copied.
    std::vector<token_id> turn2 = turn1;
    turn2.insert(turn2.end(), {77, 78, 79});
    const allocation a = m.allocate(2, turn2);
    EXPECT_EQ(a.num_cached_tokens, reuse ? 10 : 8);
    ASSERT_EQ(a.partial_copy.has_value(), reuse);
    if (reuse) {
      EXPECT_EQ(a.partial_copy->src, tail);
      EXPECT_EQ(a.partial_copy->dst, m.table(2).block(2));
    }
    EXPECT_EQ(a.lookup.num_partial_hit_tokens, reuse ? 2 : 0);
    EXPECT_EQ(a.lookup.missed(miss_reason::never_stored), reuse ? 2 : 4) << "off, the tail was never stored";
    EXPECT_EQ(a.lookup.missed(miss_reason::partial_block), 1);
  }
}

TEST(KvCacheManagerMisses, DropsAreBlamedOnHowTheBlockLeft) {
  kv_cache_manager<> m(small(6));
  const auto a = iota_tokens(13), b = iota_tokens(13, 100), c = iota_tokens(13, 200);
  cache_prompt(m, 1, a);
  cache_prompt(m, 2, b);  // 3 blocks free, 4 needed: LRU evicts a's deepest cached block
  EXPECT_EQ(m.lookup(a).num_hit_tokens, 8);
  EXPECT_EQ(m.lookup(a).missed(miss_reason::evicted), 4);
  EXPECT_EQ(kv_cache_manager<>::eviction_name(), "lru");
  EXPECT_EQ((kv_cache_manager<lifo_free_list, xxh3_hash, priority_eviction>::eviction_name()), "priority");
  m.evict_cached_blocks(1000);
  EXPECT_EQ(m.lookup(b).missed(miss_reason::evicted_on_request), 12);
  cache_prompt(m, 3, c);
  m.reset_prefix_cache();
  EXPECT_EQ(m.lookup(c).missed(miss_reason::cache_reset), 12);
  cache_prompt(m, 4, c);
  EXPECT_EQ(m.lookup(c).num_hit_tokens, 12) << "caching a hash again clears its drop";
}

TEST(KvCacheManagerMisses, OtherKeyCollisionAndCachingOff) {
  kv_cache_manager<> m(small(16));
  const auto prompt = iota_tokens(9);
  cache_prompt(m, 1, prompt);
  const sequence_options adapter{.key = {.adapter_id = 7, .cache_salt = {}}, .cache_priority = 0};
  EXPECT_EQ(m.lookup(prompt, adapter).missed(miss_reason::other_key), 8);
  EXPECT_EQ(m.lookup(prompt, {.key = {.adapter_id = 0, .cache_salt = "tenant"}}).missed(miss_reason::other_key), 8);
  // depth_hash: block j of every prompt has one hash, so another prompt finds a block of other tokens.
  kv_cache_manager<lifo_free_list, testing::depth_hash> colliding(small(16));
  cache_prompt(colliding, 1, prompt);
  EXPECT_EQ(colliding.lookup(iota_tokens(9, 100)).missed(miss_reason::hash_collision), 8);
  kv_cache_manager<> off(small(8, 0, false));
  const allocation a = off.allocate(1, prompt);
  EXPECT_EQ(a.lookup.missed(miss_reason::caching_off), 9);
  EXPECT_EQ(off.miss_totals().missed(miss_reason::caching_off), 9);
}

TEST(KvCacheManagerMisses, TheSchedulerReportsEachRequestsLookup) {
  scheduler<> s({.max_tokens_per_step = 64, .max_num_seqs = 4}, small(16));
  const auto prompt = iota_tokens(10);
  s.add_request(1, {.prompt = prompt, .max_new_tokens = 1});
  s.complete(s.schedule(), [](const sampling_request& r) {  // prefill, computed and cached
    return std::vector<continuation>{{r.seqs.front(), 1, true}};
  });
  s.add_request(2, {.prompt = prompt, .max_new_tokens = 1});
  s.schedule();
  EXPECT_EQ(s.output(1).cache_lookup.missed(miss_reason::never_stored), 8);
  EXPECT_EQ(s.output(2).cache_lookup.num_hit_tokens, 8);
  EXPECT_EQ(s.output(2).cache_lookup.num_partial_hit_tokens, 1);  // token 8, of request 1's kept tail
  EXPECT_EQ(s.output(2).cache_lookup.missed(miss_reason::partial_block), 1);
  EXPECT_EQ(s.miss_totals().num_prompt_tokens, 20);
  EXPECT_EQ(s.miss_totals().num_hit_tokens, 8);
}

}  // namespace
}  // namespace pagedkv
