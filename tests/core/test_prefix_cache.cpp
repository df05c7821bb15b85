#include <pagedkv/prefix_cache.hpp>

#include "test_support.hpp"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace pagedkv {
namespace {

/// Every block hashes alike: the cache must still never hand back a block with other tokens.
struct colliding_hash {
  block_hash operator()(block_hash, std::span<const std::byte>) const noexcept { return 42; }
};

using test::iota_tokens;

/// Publishes every full block of `tokens` into blocks `ids`, as kv_cache_manager does.
template <class Cache>
std::vector<chain_link> publish(Cache& cache, std::span<const token_id> tokens, std::vector<block_id> ids,
                                const prefix_key& key = {}) {
  std::vector<block_hash> hashes;
  cache.extend_hashes(tokens, key, hashes);
  std::vector<chain_link> links;
  for (std::size_t i = 0; i < hashes.size() && i < ids.size(); ++i) {
    const auto link = cache.insert(ids[i], hashes[i], i == 0 ? chain_link{} : links.back(),
                                   tokens.subspan(i * static_cast<std::size_t>(cache.block_size()),
                                                  static_cast<std::size_t>(cache.block_size())),
                                   key);
    if (!link) break;
    links.push_back(*link);
  }
  return links;
}

template <class Cache>
std::vector<block_id> lookup(const Cache& cache, std::span<const token_id> tokens, const prefix_key& key = {}) {
  std::vector<block_hash> hashes;
  cache.extend_hashes(tokens, key, hashes);
  std::vector<chain_link> links;
  cache.match(tokens, key, hashes, INT32_MAX, links);
  std::vector<block_id> ids;
  for (const chain_link& link : links) ids.push_back(link.block);
  return ids;
}

TEST(PrefixCache, HashesChainThroughParents) {
  prefix_cache<> cache(8, 4);
  const std::vector<token_id> a{1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<token_id> b{9, 9, 9, 9, 5, 6, 7, 8};  // same second block, other first block
  std::vector<block_hash> ha, hb;
  cache.extend_hashes(a, {}, ha);
  cache.extend_hashes(b, {}, hb);
  ASSERT_EQ(ha.size(), 2u);
  EXPECT_NE(ha[1], hb[1]) << "a block's hash must depend on everything before it";
  // Incremental extension hashes only the new blocks and agrees with hashing at once.
  std::vector<block_hash> partial;
  cache.extend_hashes(std::span(a).first(5), {}, partial);
  ASSERT_EQ(partial.size(), 1u);
  cache.extend_hashes(a, {}, partial);
  EXPECT_EQ(partial, ha);
  // A different seed gives different hashes.
  prefix_cache<> other(8, 4, 1234);
  std::vector<block_hash> seeded;
  other.extend_hashes(a, {}, seeded);
  EXPECT_NE(seeded[0], ha[0]);
}

TEST(PrefixCache, MatchFindsTheLongestStoredPrefixOnly) {
  prefix_cache<> cache(8, 4);
  const std::vector<token_id> prompt = iota_tokens(14, 100);
  publish(cache, prompt, {5, 2, 7});
  EXPECT_EQ(cache.num_cached_blocks(), 3);
  EXPECT_EQ(lookup(cache, prompt), (std::vector<block_id>{5, 2, 7}));
  std::vector<token_id> diverging = prompt;
  diverging[9] = -1;  // inside the third block
  EXPECT_EQ(lookup(cache, diverging), (std::vector<block_id>{5, 2}));
  diverging[0] = -1;
  EXPECT_TRUE(lookup(cache, diverging).empty());
  EXPECT_TRUE(lookup(cache, std::span(prompt).first(3)).empty()) << "partial blocks are never matched";
}

TEST(PrefixCache, APartialBlockServesPartialHitsOnlyAndLeavesQuietly) {
  prefix_cache<> cache(8, 4);
  std::vector<cache_event> events;
  cache.set_event_callback([&](const cache_event& e) { events.push_back(e); });
  const std::vector<token_id> prompt = iota_tokens(10, 100);  // two full blocks, then 100+8, 100+9
  const std::vector<chain_link> links = publish(cache, prompt, {5, 2});
  ASSERT_EQ(links.size(), 2u);
  const std::size_t stored_events = events.size();
  EXPECT_THROW(cache.insert_partial(3, links[1], std::span(prompt).subspan(8, 0), {}), error);
  EXPECT_THROW(cache.insert_partial(3, links[1], std::span(prompt).first(4), {}), error) << "a whole block";
  EXPECT_FALSE(cache.insert_partial(5, links[1], std::span(prompt).subspan(8, 2), {})) << "5 is cached";
  ASSERT_TRUE(cache.insert_partial(3, links[1], std::span(prompt).subspan(8, 2), {}));
  EXPECT_FALSE(cache.insert_partial(4, links[1], std::span(prompt).subspan(8, 1), {})) << "block 3 starts so";
  EXPECT_FALSE(cache.contains(4));
  EXPECT_EQ(events.size(), stored_events) << "no event tells of a partial block";
  EXPECT_EQ(cache.num_cached_blocks(), 3);
  EXPECT_EQ(cache.num_tokens_of(3), 2);
  EXPECT_EQ(cache.num_tokens_of(2), 4);
  EXPECT_EQ(cache.parent_of(3), links[1]);
  // A continuation of the prompt matches its two tokens, no more; a full match never finds it.
  std::vector<token_id> next = prompt;
  next.insert(next.end(), {7, 7, 7});
  const auto partial = cache.match_partial(links[1], std::span(next).subspan(8), {});
  ASSERT_TRUE(partial.has_value());
  EXPECT_EQ(partial->link.block, 3);
  EXPECT_EQ(partial->num_tokens, 2);
  EXPECT_EQ(lookup(cache, next), (std::vector<block_id>{5, 2}));
  // Evicted like any idle block, quietly; the same id then caches a whole block as usual.
  cache.make_idle(3);
  EXPECT_EQ(cache.evict(), 3);
  EXPECT_EQ(events.size(), stored_events);
  EXPECT_FALSE(cache.contains(3));
  EXPECT_FALSE(cache.match_partial(links[1], std::span(next).subspan(8), {}).has_value());
  EXPECT_EQ(publish(cache, iota_tokens(4, 500), {3}).size(), 1u);
  EXPECT_EQ(cache.num_tokens_of(3), 4);
}

TEST(PrefixCache, AdapterAndSaltIsolatePrefixes) {
  prefix_cache<> cache(8, 4);
  const std::vector<token_id> prompt = iota_tokens(8, 0);
  publish(cache, prompt, {0, 1}, {.adapter_id = 3, .cache_salt = "tenant-a"});
  EXPECT_EQ(lookup(cache, prompt, {.adapter_id = 3, .cache_salt = "tenant-a"}).size(), 2u);
  EXPECT_TRUE(lookup(cache, prompt, {.adapter_id = 3, .cache_salt = "tenant-b"}).empty());
  EXPECT_TRUE(lookup(cache, prompt, {.adapter_id = 4, .cache_salt = "tenant-a"}).empty());
  EXPECT_TRUE(lookup(cache, prompt).empty());
}

TEST(PrefixCache, CollidingHashNeverReturnsWrongBlocks) {
  prefix_cache<colliding_hash> cache(16, 2);
  const std::vector<token_id> a{1, 2, 3, 4};
  const std::vector<token_id> b{1, 2, 9, 9};
  const std::vector<token_id> c{7, 7, 3, 4};
  publish(cache, a, {0, 1});
  EXPECT_EQ(cache.num_cached_blocks(), 1) << "the second block collides with the first's hash";
  // Every lookup returns only blocks whose stored tokens equal the query's.
  for (const auto& query : {a, b, c}) {
    for (block_id id : lookup(cache, query)) {
      const auto stored = cache.tokens_of(id);
      EXPECT_TRUE(std::equal(stored.begin(), stored.end(), query.begin())) << "block " << id;
    }
  }
  EXPECT_EQ(lookup(cache, a), (std::vector<block_id>{0}));
  EXPECT_TRUE(lookup(cache, c).empty());
  // A colliding insert of different content is refused, not stored over the holder.
  EXPECT_FALSE(cache.insert(5, 42, {}, std::span(c).first(2), {}).has_value());
  EXPECT_FALSE(cache.contains(5));
}

TEST(PrefixCache, CollidingHashWithEqualTokensUnderAnotherParentIsRefused) {
  prefix_cache<colliding_hash> cache(16, 2);
  const std::vector<token_id> a{1, 2, 5, 6};
  publish(cache, a, {0});
  const auto root = cache.insert(0, 42, {}, std::span(a).first(2), {});
  ASSERT_TRUE(root.has_value());
  // Block 3 claims tokens {1, 2} but after parent block 0: same hash, same tokens, other parent.
  EXPECT_FALSE(cache.insert(3, 42, *root, std::span(a).first(2), {}).has_value());
}

TEST(PrefixCache, StaleParentLinksNeverMatchAReusedBlock) {
  // Block 0 is evicted and cached again with other tokens; a child stored under the old block 0
  // must not become reachable through the new one, even when every hash collides.
  prefix_cache<colliding_hash> cache(16, 2);
  const std::vector<token_id> old_root{1, 2};
  const auto old_link = cache.insert(0, 1, {}, old_root, {});
  ASSERT_TRUE(old_link);
  cache.make_idle(0);
  EXPECT_EQ(cache.evict(), 0);
  EXPECT_FALSE(cache.insert(1, 2, *old_link, std::vector<token_id>{3, 4}, {}).has_value())
      << "inserting under an evicted parent must be refused";
  const auto new_link = cache.insert(0, 1, {}, std::vector<token_id>{8, 9}, {});
  ASSERT_TRUE(new_link);
  EXPECT_NE(new_link->generation, old_link->generation);
}

TEST(PrefixCache, DuplicateContentReturnsTheExistingBlock) {
  prefix_cache<> cache(8, 2);
  const std::vector<token_id> t{4, 5};
  std::vector<block_hash> h;
  cache.extend_hashes(t, {}, h);
  const auto first = cache.insert(3, h[0], {}, t, {});
  const auto again = cache.insert(6, h[0], {}, t, {});
  ASSERT_TRUE(first && again);
  EXPECT_EQ(again->block, 3);
  EXPECT_FALSE(cache.contains(6));
  const auto same = cache.insert(3, h[0], {}, t, {});  // a fork re-publishing its shared block
  ASSERT_TRUE(same);
  EXPECT_EQ(*same, *first);
  EXPECT_THROW(cache.insert(1, h[0], {}, std::span(t).first(1), {}), error) << "partial block";
  EXPECT_THROW(cache.insert(8, h[0], {}, t, {}), error) << "out of range";
}

TEST(PrefixCache, IdleBlocksAreEvictedInPolicyOrderWithEvents) {
  prefix_cache<> cache(8, 2);
  std::vector<cache_event> events;
  cache.set_event_callback([&](const cache_event& e) { events.push_back(e); });
  const std::vector<token_id> prompt = iota_tokens(6, 0);
  publish(cache, prompt, {4, 5, 6});
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].type, cache_event::kind::stored);
  EXPECT_FALSE(events[0].parent_hash.has_value());
  EXPECT_EQ(events[1].parent_hash, events[0].hash);
  EXPECT_EQ(std::vector<token_id>(events[2].tokens.begin(), events[2].tokens.end()), (std::vector<token_id>{4, 5}));
  EXPECT_EQ(cache.evict(), std::nullopt) << "blocks in use are not evictable";
  for (block_id id : {6, 5, 4}) cache.make_idle(id);
  EXPECT_EQ(cache.num_evictable_blocks(), 3);
  cache.make_active(5);
  EXPECT_EQ(cache.evict(), 6);
  EXPECT_EQ(events.back().type, cache_event::kind::removed);
  EXPECT_EQ(events.back().block, 6);
  EXPECT_EQ(cache.evict(), 4);
  EXPECT_FALSE(cache.contains(4));
  EXPECT_EQ(lookup(cache, prompt), std::vector<block_id>{}) << "the root is gone, so nothing matches";
  EXPECT_EQ(cache.clear(), std::vector<block_id>{5});
  EXPECT_EQ(events.back().type, cache_event::kind::cleared);
  EXPECT_EQ(cache.num_cached_blocks(), 0);
}

TEST(PrefixCache, CountsHitsAndMissesInTokens) {
  prefix_cache<> cache(4, 2);
  EXPECT_EQ(cache.hit_rate(), 0.0);
  cache.record_lookup(10, 4);
  cache.record_lookup(6, 0);
  EXPECT_EQ(cache.queried_tokens(), 16);
  EXPECT_EQ(cache.hit_tokens(), 4);
  EXPECT_EQ(cache.missed_tokens(), 12);
  EXPECT_DOUBLE_EQ(cache.hit_rate(), 0.25);
}

TEST(PrefixCache, RejectsMisuse) {
  EXPECT_THROW(prefix_cache<>(0, 4), error);
  EXPECT_THROW(prefix_cache<>(4, 0), error);
  prefix_cache<> cache(4, 2);
  EXPECT_THROW(cache.make_idle(1), error) << "not cached";
  EXPECT_THROW((void)cache.hash_of(1), error);
  EXPECT_THROW((void)cache.contains(4), error);
}

}  // namespace
}  // namespace pagedkv
