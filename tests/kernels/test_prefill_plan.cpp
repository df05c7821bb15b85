// The CUDA prefill's host planner (prefill_plan.hpp): the grid of query tiles, when and how the KV
// splits, the workspace it needs, and the q_indptr it refuses. No GPU needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <pagedkv/prefill_plan.hpp>

namespace pk = pagedkv::kernels;
using pk::cuda::plan_prefill;
using pk::cuda::prefill_tile_of;

namespace {

constexpr int h100_sms = 132;

/// Params of num_seqs sequences, `kv_heads` KV heads of `group` query heads, head_dim 128 bf16;
/// pointers set to a dummy (the planner reads no memory).
pk::attention_params params(std::int32_t num_seqs, std::int32_t kv_heads, std::int32_t group, std::int32_t max_kv_len) {
  static const std::int32_t dummy[1] = {0};
  pk::attention_params p;
  p.q = p.k = p.v = dummy;
  p.o = const_cast<std::int32_t*>(dummy);
  p.table.indices = dummy;
  p.table.kv_lens = dummy;
  p.q_indptr = dummy;
  p.num_seqs = num_seqs;
  p.num_kv_heads = kv_heads;
  p.num_qo_heads = kv_heads * group;
  p.head_dim = 128;
  p.max_kv_len = max_kv_len;
  return p;
}

std::vector<std::int32_t> indptr(std::vector<std::int32_t> v) { return v; }

std::string error_of(const pk::attention_params& p, const std::vector<std::int32_t>& q_indptr) {
  try {
    (void)plan_prefill(p, q_indptr, h100_sms, prefill_tile_of(p.head_dim), 2);
  } catch (const pagedkv::error& e) {
    EXPECT_EQ(e.code(), pagedkv::errc::invalid_argument);
    return e.what();
  }
  return "no error";
}

/// A fresh seed each run, printed by the caller's SCOPED_TRACE; PAGEDKV_TEST_SEED replays one.
std::uint32_t fresh_seed() {
  if (const char* replay = std::getenv("PAGEDKV_TEST_SEED")) return std::uint32_t(std::strtoul(replay, nullptr, 10));
  return std::random_device{}();
}

}  // namespace

TEST(PrefillPlan, TilesCoverEveryRowOfTheLongestSequence) {
  // 16 prompts of 1k tokens, Llama-3-8B heads (8 KV heads of 4): 1024 * 4 rows a sequence in tiles
  // of the shipped shape (128 rows of head_dim 128).
  const auto tile = prefill_tile_of(128);
  const std::int64_t rows = tile.q_rows;
  ASSERT_EQ(rows, 128);
  std::vector<std::int32_t> q_indptr = {0};
  for (int i = 0; i < 16; ++i) q_indptr.push_back(q_indptr.back() + 1024);
  const auto plan = plan_prefill(params(16, 8, 4, 1024), q_indptr, h100_sms, tile, 2);
  EXPECT_EQ(plan.q_tile_rows, rows);
  EXPECT_EQ(plan.kv_tile_tokens, 64);
  EXPECT_EQ(plan.q_tiles_per_seq, 1024 * 4 / rows);
  EXPECT_EQ(plan.num_q_tokens, 16 * 1024);
  EXPECT_EQ(plan.max_q_len, 1024);
  EXPECT_EQ(plan.live_ctas, 16 * (1024 * 4 / rows) * 8);
  EXPECT_EQ(plan.num_splits, 1) << "hundreds of CTAs: no split";
  EXPECT_EQ(plan.workspace_bytes, 0u);
  // Ragged: the grid is sized by the longest, the live CTAs by each one's own rows.
  const auto ragged = plan_prefill(params(3, 2, 5, 5000), indptr({0, 1, 14, 214}), h100_sms, tile, 2);
  const auto tiles = [&](std::int64_t r) { return (r + rows - 1) / rows; };
  EXPECT_EQ(ragged.q_tiles_per_seq, tiles(200 * 5));
  const std::int64_t ctas = (tiles(1 * 5) + tiles(13 * 5) + tiles(200 * 5)) * 2;
  EXPECT_EQ(ragged.live_ctas, ctas * ragged.num_splits);
  // 20 CTAs over 5000 tokens: as many splits as the minimum split allows, still one wave.
  EXPECT_EQ(ragged.num_splits, 5000 / pk::cuda::prefill_min_split_tokens);
  EXPECT_LE(ragged.live_ctas, 2 * h100_sms);
  EXPECT_EQ(prefill_tile_of(256).kv_tokens, 32);
}

TEST(PrefillPlan, FewQueriesOverLongContextsSplitTheKv) {
  // One sequence, 16 queries, one KV head of 4: one CTA; 20000 tokens split to fill the SMs.
  auto p = params(1, 1, 4, 20000);
  const auto plan = plan_prefill(p, indptr({0, 16}), h100_sms, prefill_tile_of(128), 2);
  EXPECT_GT(plan.num_splits, 1);
  EXPECT_LE(plan.num_splits, pk::cuda::max_prefill_splits);
  EXPECT_GE(plan.split_tokens, pk::cuda::prefill_min_split_tokens);
  EXPECT_EQ(plan.split_tokens % plan.kv_tile_tokens, 0);
  EXPECT_GE(std::int64_t(plan.num_splits) * plan.split_tokens, 20000) << "every position in a split";
  EXPECT_LT(std::int64_t(plan.num_splits - 1) * plan.split_tokens, 20000) << "no split wholly past the end";
  EXPECT_EQ(plan.live_ctas, plan.num_splits);
  // Partial rows of type T (2 bytes) and their LSEs, the LSEs 256-byte aligned after the rows.
  const std::size_t rows = 16 * 4;
  EXPECT_EQ(plan.lse_offset(4, 2) % 256, 0u);
  EXPECT_GE(plan.lse_offset(4, 2), plan.num_splits * rows * 128 * 2);
  EXPECT_EQ(plan.workspace_bytes, plan.lse_offset(4, 2) + plan.num_splits * rows * sizeof(float));
  // A cap, and no split at all.
  p.max_splits = 3;
  EXPECT_EQ(plan_prefill(p, indptr({0, 16}), h100_sms, prefill_tile_of(128), 2).num_splits, 3);
  p.max_splits = 1;
  const auto one = plan_prefill(p, indptr({0, 16}), h100_sms, prefill_tile_of(128), 2);
  EXPECT_EQ(one.num_splits, 1);
  EXPECT_EQ(one.split_tokens, 0);
  EXPECT_EQ(one.workspace_bytes, 0u);
  // Short contexts never split below the minimum.
  EXPECT_EQ(plan_prefill(params(1, 1, 4, 600), indptr({0, 16}), h100_sms, prefill_tile_of(128), 2).num_splits, 1);
}

TEST(PrefillPlan, OnlyAFewWavePromptTakesEveryHeadsLongestTilesFirst) {
  const pk::cuda::prefill_tile_shape wgmma{128, 128, 1};
  // The 4k prompt, 32/32 and 32/8: 1024 CTAs, 7.8 waves on 132 SMs.
  for (const int kv_heads : {32, 8}) {
    const auto plan = plan_prefill(params(1, kv_heads, 32 / kv_heads, 4096), indptr({0, 4096}), h100_sms, wgmma, 2);
    EXPECT_EQ(plan.live_ctas, 1024);
    EXPECT_TRUE(plan.tiles_across_heads) << kv_heads;
    // One CTA more than 8 waves: head by head.
    EXPECT_FALSE(plan_prefill(params(1, kv_heads, 32 / kv_heads, 4096), indptr({0, 4096}), 127, wgmma, 2)
                     .tiles_across_heads);
  }
  EXPECT_TRUE(plan_prefill(params(1, 32, 1, 4224), indptr({0, 4224}), h100_sms, wgmma, 2).tiles_across_heads)
      << "33 tiles a head: exactly 8 waves";
  EXPECT_FALSE(plan_prefill(params(1, 32, 1, 4225), indptr({0, 4225}), h100_sms, wgmma, 2).tiles_across_heads);
  // The 16k prompt (31 waves), 16 x 1k, 512 over 8k at batch 8 and (split on 100 SMs) 1: head by head.
  EXPECT_FALSE(plan_prefill(params(1, 32, 1, 16384), indptr({0, 16384}), h100_sms, wgmma, 2).tiles_across_heads);
  std::vector<std::int32_t> sixteen = {0};
  for (int i = 0; i < 16; ++i) sixteen.push_back(sixteen.back() + 1024);
  EXPECT_FALSE(plan_prefill(params(16, 32, 1, 1024), sixteen, h100_sms, wgmma, 2).tiles_across_heads);
  const auto chunk = plan_prefill(params(1, 32, 1, 8704), indptr({0, 512}), 100, wgmma, 2);
  EXPECT_GT(chunk.num_splits, 1) << "two waves on 100 SMs: split";
  EXPECT_FALSE(chunk.tiles_across_heads);
  auto one_split = params(1, 32, 1, 8704);
  one_split.max_splits = 1;
  EXPECT_FALSE(plan_prefill(one_split, indptr({0, 512}), h100_sms, wgmma, 2).tiles_across_heads)
      << "a chunk over a cache twice its length";
  EXPECT_TRUE(plan_prefill(params(1, 32, 1, 1000), indptr({0, 600}), h100_sms, wgmma, 2).tiles_across_heads)
      << "queries more than half the context";
}

// The split count is the one whose grid ends first, in waves of the tile's CTAs an SM: a grid that
// fills the SMs once stays whole (no merge, one start a CTA), one that fills few of them splits
// to about one wave.
TEST(PrefillPlan, SplitsFollowTheWavesOfTheBodysCtas) {
  const pk::cuda::prefill_tile_shape wgmma{128, 128, 1}, two_an_sm{128, 128, 2};
  // 512 over 8k cached at batch 1, 32/32 and 32/8: 128 CTAs of 68 tiles.
  for (const int kv_heads : {32, 8}) {
    const auto p = params(1, kv_heads, 32 / kv_heads, 8704);
    const auto one = plan_prefill(p, indptr({0, 512}), h100_sms, wgmma, 2);
    EXPECT_EQ(one.live_ctas, 128);
    EXPECT_EQ(one.num_splits, 1) << "one wave of 68 tiles, not 3 of 23";
    EXPECT_EQ(one.workspace_bytes, 0u);
    // Two CTAs an SM: two splits make one wave of 34 tiles.
    const auto two = plan_prefill(p, indptr({0, 512}), h100_sms, two_an_sm, 2);
    EXPECT_EQ(two.num_splits, 2);
    EXPECT_EQ(two.live_ctas, 256);
    // On 100 SMs the whole grid is two waves: 3 splits of 23 tiles in 4 waves are 92 tiles, not 136.
    EXPECT_EQ(plan_prefill(p, indptr({0, 512}), 100, wgmma, 2).num_splits, 3);
  }
  // 16 queries over 20000 tokens, one KV head of 4: one CTA split to one wave of 132 SMs at most.
  const auto few = plan_prefill(params(1, 1, 4, 20000), indptr({0, 16}), h100_sms, wgmma, 2);
  EXPECT_GT(few.num_splits, 16);
  EXPECT_LE(few.live_ctas, h100_sms);
  // Hundreds of CTAs over 8k: no split on either shape.
  std::vector<std::int32_t> eight = {0};
  for (int i = 0; i < 8; ++i) eight.push_back(eight.back() + 512);
  EXPECT_EQ(plan_prefill(params(8, 32, 1, 8704), eight, h100_sms, wgmma, 2).num_splits, 1);
  EXPECT_EQ(plan_prefill(params(8, 32, 1, 8704), eight, h100_sms, two_an_sm, 2).num_splits, 1);
}

TEST(PrefillPlan, AChunkAfterDecodeSequencesStartsAtItsFirstRow) {
  const auto plan = plan_prefill(params(2, 8, 4, 8704), indptr({5, 517, 1029}), h100_sms, prefill_tile_of(128), 2);
  EXPECT_EQ(plan.q_first, 5);
  EXPECT_EQ(plan.num_q_tokens, 1024);
  EXPECT_EQ(plan.merge_rows(32), 1024 * 32);
}

TEST(PrefillPlan, BadQIndptrIsNamed) {
  const auto p = params(2, 1, 1, 100);
  EXPECT_NE(error_of(p, {0, 5}).find("host_q_indptr has 2 entries, num_seqs + 1 = 3 expected"), std::string::npos);
  EXPECT_NE(error_of(p, {0, 5, 4}).find("q_indptr decreases at sequence 1 (5 to 4)"), std::string::npos);
  EXPECT_NE(error_of(p, {0, 5, 200}).find("sequence 1 has 195 query tokens, more than max_kv_len 100"),
            std::string::npos);
  EXPECT_NE(error_of(p, {-1, 5, 6}).find("q_indptr[0] -1 must be >= 0"), std::string::npos);
  EXPECT_EQ(error_of(p, {0, 0, 0}), "no error");
}

// The grid's limits, each named: more KV heads than gridDim.y takes, more query tiles than
// gridDim.x, and a grid whose CTA places (what the wgmma CTA splits by the plan's divisors) pass
// int32.
TEST(PrefillPlan, GridLimitsAreNamed) {
  EXPECT_NE(error_of(params(1, 65536, 1, 128), {0, 1}).find("num_kv_heads 65536 exceeds the grid"), std::string::npos);
  EXPECT_NE(error_of(params(1, 1, 256, 1 << 30), {0, 1 << 30})
                .find("1 sequences of up to 1073741824 query tokens exceed the grid"),
            std::string::npos);
  EXPECT_NE(error_of(params(1, 65535, 1, 1 << 24), {0, 1 << 24})
                .find("1 sequences of up to 16777216 query tokens, 65535 KV heads and 1 splits exceed the grid"),
            std::string::npos)
      << error_of(params(1, 65535, 1, 1 << 24), {0, 1 << 24});
  EXPECT_EQ(error_of(params(1, 8192, 1, 1 << 24), {0, 1 << 24}), "no error") << "2^30 CTA places";
}

// The wgmma body's TMA page runs: the block size up to the 128-token tile where runs split the
// tile and the page evenly and are at least prefill_tma_min_rows long; 0 (cp.async) otherwise.
TEST(PrefillPlan, TmaPageRunsOnlyWherePagesSplitTheTileEvenly) {
  using pk::cuda::prefill_tma_page_rows;
  const auto bf16 = pk::dtype::bf16;
  EXPECT_EQ(pk::cuda::prefill_tma_min_rows, 16);
  for (const int bs : {1, 3, 8, 17, 24, 48, 63, 96, 100, 192, 320}) EXPECT_EQ(prefill_tma_page_rows(bs, 128, bf16, 128), 0) << bs;
  EXPECT_EQ(prefill_tma_page_rows(16, 128, bf16, 128), 16);
  EXPECT_EQ(prefill_tma_page_rows(32, 128, bf16, 128), 32);
  EXPECT_EQ(prefill_tma_page_rows(64, 128, bf16, 128), 64);
  EXPECT_EQ(prefill_tma_page_rows(128, 128, bf16, 128), 128);
  EXPECT_EQ(prefill_tma_page_rows(256, 128, bf16, 128), 128);
  EXPECT_EQ(prefill_tma_page_rows(384, 128, pk::dtype::f16, 128), 128);
  EXPECT_EQ(prefill_tma_page_rows(64, 128, bf16, 64), 64);
  EXPECT_EQ(prefill_tma_page_rows(64, 128, bf16, 192), 64);
  EXPECT_EQ(prefill_tma_page_rows(128, 128, bf16, 192), 0);  // 128-token runs do not split 192
  EXPECT_EQ(prefill_tma_page_rows(64, 80, bf16, 128), 0);
  EXPECT_EQ(prefill_tma_page_rows(64, 256, bf16, 128), 0);
  EXPECT_EQ(prefill_tma_page_rows(64, 128, pk::dtype::fp8_e4m3, 128), 0);
  EXPECT_EQ(prefill_tma_page_rows(64, 128, bf16, 0), 0);
}

// The wgmma body's Q box: the group's heads over the tile's whole tokens where the group divides
// the tile's rows; 0 (cp.async) otherwise.
TEST(PrefillPlan, TmaQBoxOnlyWhereTheGroupDividesTheTile) {
  using pk::cuda::prefill_tma_q_tokens;
  const auto bf16 = pk::dtype::bf16;
  EXPECT_EQ(prefill_tma_q_tokens(1, 128, bf16, 128), 128);
  EXPECT_EQ(prefill_tma_q_tokens(4, 128, bf16, 128), 32);
  EXPECT_EQ(prefill_tma_q_tokens(16, 128, pk::dtype::f16, 128), 8);
  EXPECT_EQ(prefill_tma_q_tokens(128, 128, bf16, 128), 1);
  for (const int group : {3, 5, 6, 7, 12, 256}) EXPECT_EQ(prefill_tma_q_tokens(group, 128, bf16, 128), 0) << group;
  EXPECT_EQ(prefill_tma_q_tokens(256, 128, bf16, 512), 2);
  EXPECT_EQ(prefill_tma_q_tokens(512, 128, bf16, 512), 0);  // a box takes at most 256 heads
  EXPECT_EQ(prefill_tma_q_tokens(1, 128, bf16, 512), 0);    // and at most 256 tokens
  // A computing warp's 16 rows (the output's box).
  EXPECT_EQ(prefill_tma_q_tokens(1, 128, bf16, 16), 16);
  EXPECT_EQ(prefill_tma_q_tokens(16, 128, bf16, 16), 1);
  EXPECT_EQ(prefill_tma_q_tokens(32, 128, bf16, 16), 0);
  EXPECT_EQ(prefill_tma_q_tokens(4, 64, bf16, 128), 0);
  EXPECT_EQ(prefill_tma_q_tokens(4, 128, pk::dtype::fp8_e4m3, 128), 0);
  EXPECT_EQ(prefill_tma_q_tokens(0, 128, bf16, 128), 0);
}

TEST(PrefillPlan, NoPlanNeedsMoreWorkspaceThanTheBound) {
  // Batches of odd chunks (fresh random lengths each run) over contexts up to the bound's, on both
  // tiles and odd SM counts, with and without a cap: prefill_workspace_bound covers each plan.
  const std::uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (PAGEDKV_TEST_SEED replays it)");
  std::mt19937 rng(seed);
  std::size_t most = 0;  // the largest workspace planned: some plan must split, or nothing is checked
  for (const int sms : {1, 13, 132})
    for (const pk::cuda::prefill_tile_shape tile : {pk::cuda::prefill_tile_shape{128, 128, 1}, prefill_tile_of(128)})
      for (const int max_kv_len : {100, 1024, 5000, 70000})
        for (const int max_q_tokens : {1, 16, 333, 2048})
          for (int trial = 0; trial < 8; ++trial) {
            const int num_seqs = 1 + int(rng() % 5);
            std::vector<std::int32_t> q = {0};
            std::int32_t longest = 1;
            for (int s = 0; s < num_seqs; ++s) {
              const auto left = std::int32_t(max_q_tokens) - q.back();
              const std::int32_t len = left > 0 ? 1 + std::int32_t(rng() % std::uint32_t(std::min(left, max_kv_len))) : 0;
              q.push_back(q.back() + len);
              longest = std::max(longest, len);
            }
            const std::int32_t kv_len = longest + std::int32_t(rng() % std::uint32_t(max_kv_len - longest + 1));
            for (const int kv_heads : {1, 8})
              for (const int cap : {0, 5}) {
                auto p = params(num_seqs, kv_heads, 4, kv_len);
                p.max_splits = cap;
                const auto plan = plan_prefill(p, q, sms, tile, 2);
                EXPECT_LE(plan.workspace_bytes, pk::cuda::prefill_workspace_bound(max_q_tokens, 4 * kv_heads, 128, max_kv_len, 2))
                    << "sms " << sms << " tile " << tile.q_rows << " max_kv_len " << max_kv_len << " tokens " << q.back()
                    << " in " << num_seqs << " kv_len " << kv_len << " splits " << plan.num_splits;
                most = std::max(most, plan.workspace_bytes);
              }
          }
  EXPECT_GT(most, 0u) << "no plan split";
  EXPECT_EQ(pk::cuda::prefill_workspace_bound(2048, 32, 128, 1023, 2), 0u) << "contexts too short to split";
}

// fast_divmod against / and % on divisors 1-300 and a few large ones, over dividends at 0, at the
// divisor's multiples and their neighbours, near 2^31 and fresh random ones; a plan's group_div
// divides by its group; a divisor below 1 is named.
TEST(PrefillPlan, FastDivmodMatchesDivision) {
  using pk::cuda::fast_divmod;
  const std::uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (PAGEDKV_TEST_SEED replays it)");
  std::mt19937 gen(seed);
  std::uniform_int_distribution<std::int32_t> any(0, 0x7fffffff);
  std::vector<std::int32_t> divisors;
  for (std::int32_t d = 1; d <= 300; ++d) divisors.push_back(d);
  for (std::int32_t d : {1023, 1024, 1025, 65535, 65536, 1 << 30, 0x7fffffff}) divisors.push_back(d);
  for (int i = 0; i < 20; ++i) divisors.push_back(std::max(1, any(gen)));
  for (const std::int32_t d : divisors) {
    const fast_divmod f(d);
    std::vector<std::int32_t> ns = {0, 1, d - 1, d, 0x7fffffff, 0x7fffffff - d, 0x7ffffffe};
    for (std::int32_t k : {1, 2, 3, 1000, 0x7fffffff / d}) {
      const std::int64_t m = std::int64_t(k) * d;
      for (std::int64_t n : {m - 1, m, m + 1})
        if (n >= 0 && n <= 0x7fffffff) ns.push_back(std::int32_t(n));
    }
    for (int i = 0; i < 40; ++i) ns.push_back(any(gen));
    for (int i = 0; i < 20; ++i) ns.push_back(any(gen) % 4096);
    for (const std::int32_t n : ns) {
      ASSERT_EQ(f.div(n), n / d) << n << " / " << d;
      ASSERT_EQ(f.mod(n), n % d) << n << " % " << d;
    }
  }
  EXPECT_EQ(fast_divmod().div(12345), 12345);
  for (std::int32_t group : {1, 3, 5, 8, 16}) {
    const auto p = params(2, 2, group, 100);
    const auto plan = plan_prefill(p, indptr({0, 7, 19}), h100_sms, prefill_tile_of(p.head_dim), 2);
    EXPECT_EQ(plan.group_div.divisor, std::uint32_t(group));
    EXPECT_EQ(plan.group_div.div(19 * group + group - 1), 19);
  }
  // The plan's grid divisors, and the wgmma CTA's place split by them (prefill_wgmma_cta::make's
  // order across heads) as by / and %.
  for (const std::int32_t num_seqs : {1, 3, 16}) {
    for (const std::int32_t kv_heads : {1, 5, 8}) {
      auto p = params(num_seqs, kv_heads, 4, 20000);
      std::vector<std::int32_t> q(std::size_t(num_seqs) + 1, 0);
      for (std::int32_t s = 0; s < num_seqs; ++s) q[std::size_t(s) + 1] = q[std::size_t(s)] + 37 + 300 * s;
      const auto plan = plan_prefill(p, q, h100_sms, pk::cuda::prefill_tile_shape{128, 128, 1}, 2);
      EXPECT_EQ(plan.seq_div.divisor, std::uint32_t(num_seqs));
      EXPECT_EQ(plan.kv_head_div.divisor, std::uint32_t(kv_heads));
      EXPECT_EQ(plan.split_div.divisor, std::uint32_t(plan.num_splits));
      const std::int64_t grid = std::int64_t(num_seqs) * plan.q_tiles_per_seq * kv_heads * plan.num_splits;
      for (std::int32_t place = 0; place < grid; ++place) {
        const std::int32_t seq_place = plan.seq_div.div(place), head_place = plan.kv_head_div.div(seq_place);
        ASSERT_EQ(place - seq_place * num_seqs, place % num_seqs) << place;
        ASSERT_EQ(seq_place - head_place * kv_heads, place / num_seqs % kv_heads) << place;
        ASSERT_EQ(plan.split_div.mod(head_place), place / (num_seqs * kv_heads) % plan.num_splits) << place;
        ASSERT_EQ(plan.split_div.div(head_place), place / (std::int64_t(num_seqs) * kv_heads * plan.num_splits))
            << place;
      }
    }
  }
  EXPECT_EQ(plan_prefill(params(0, 2, 1, 100), indptr({0}), h100_sms, prefill_tile_of(128), 2).seq_div.divisor, 1u)
      << "no sequences: divides by 1";
  try {
    (void)fast_divmod(0);
    ADD_FAILURE() << "fast_divmod(0) did not throw";
  } catch (const pagedkv::error& e) {
    EXPECT_EQ(e.code(), pagedkv::errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("fast_divmod: divisor 0 must be >= 1"), std::string::npos);
  }
}
