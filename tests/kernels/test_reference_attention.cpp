// The host reference of paged attention against naive dense attention in double precision, over
// the sweeps: block sizes 1..256, GQA ratios 1..16, every head_dim, every dtype, both
// layouts and table formats, decode and prefill chunks, ragged lengths including 1.
#include <gtest/gtest.h>

#include <pagedkv/reference/attention.hpp>

#include "attention_case.hpp"

namespace pk = pagedkv::kernels;
using pk::testing::attention_case;
using pk::testing::case_config;

namespace {

void check_case(const case_config& cfg, std::mt19937_64& rng) {
  SCOPED_TRACE(cfg.describe());
  attention_case c;
  pk::testing::make_case(c, cfg, rng);
  pk::reference::attention(c.params);
  const auto ref = pk::testing::naive_attention(c);
  const auto cmp = pk::testing::compare(c, c.o.data(), cfg.with_lse ? c.lse.data() : nullptr, ref);
  EXPECT_EQ(cmp.non_finite, 0u);
  EXPECT_LE(cmp.rel_error, pk::testing::tolerance(cfg.q_dtype));
  EXPECT_LE(cmp.max_lse_error, 1e-3);
}

constexpr std::pair<pk::dtype, pk::dtype> dtype_pairs[] = {
    {pk::dtype::f32, pk::dtype::f32},
    {pk::dtype::f16, pk::dtype::f16},
    {pk::dtype::bf16, pk::dtype::bf16},
    {pk::dtype::bf16, pk::dtype::fp8_e4m3},
    {pk::dtype::f16, pk::dtype::fp8_e4m3},
    {pk::dtype::f32, pk::dtype::fp8_e4m3},
};

}  // namespace

// Every (block size, group, head_dim) combination once; the other dimensions rotate with the
// combination's index so that each value of each meets many of the others.
TEST(ReferenceAttention, SweepAgainstDoubleDense) {
  auto rng = pk::testing::seeded_rng();
  int index = 0;
  for (int bs : {1, 3, 7, 16, 17, 64, 256})
    for (int group : {1, 2, 4, 5, 8, 16})
      for (int d : {64, 80, 96, 128, 256}) {
        case_config cfg;
        cfg.block_size = bs;
        cfg.group = group;
        cfg.head_dim = d;
        cfg.num_kv_heads = 1 + index % 2;
        std::uniform_int_distribution<int> len(2, 2 * bs + 40);
        cfg.kv_lens = {1, len(rng), len(rng)};
        if (index % 3 == 0) cfg.kv_lens.push_back(bs);  // exactly one full block
        if (index % 5 == 1) cfg.kv_lens.push_back(0);   // a padded slot: zeros, LSE -inf
        std::tie(cfg.q_dtype, cfg.kv_dtype) = dtype_pairs[index % std::size(dtype_pairs)];
        cfg.layout = index % 2 ? pk::kv_layout::hnd : pk::kv_layout::nhd;
        cfg.order = index % 4 < 2 ? pk::layer_order::layer_major : pk::layer_order::block_major;
        cfg.num_layers = 1 + index % 3;
        cfg.layer = cfg.num_layers - 1;
        cfg.csr = index % 5 < 2;
        cfg.q_len = index % 7 == 3 ? 5 : 1;
        cfg.per_head_scale = index % 2 == 0;
        check_case(cfg, rng);
        ++index;
      }
}

TEST(ReferenceAttention, PrefillChunksAreCausal) {
  auto rng = pk::testing::seeded_rng();
  for (int q_len : {2, 7, 33}) {
    case_config cfg;
    cfg.kv_lens = {q_len, q_len + 5, 3 * q_len + 1};
    cfg.q_len = q_len;
    cfg.group = 4;
    cfg.num_kv_heads = 2;
    cfg.block_size = 7;
    check_case(cfg, rng);
  }
}

TEST(ReferenceAttention, SlidingWindowAndSoftCap) {
  auto rng = pk::testing::seeded_rng();
  for (int window : {0, 1, 5, 40}) {
    case_config cfg;
    cfg.kv_lens = {1, 30, 77};
    cfg.q_len = window % 2 ? 3 : 1;
    cfg.window_left = window;
    cfg.soft_cap = window == 5 ? 10.0f : 0.0f;
    cfg.block_size = 16;
    check_case(cfg, rng);
  }
  case_config cfg;
  cfg.kv_lens = {100};
  cfg.soft_cap = 2.0f;
  cfg.group = 5;
  check_case(cfg, rng);
}

TEST(ReferenceAttention, Alibi) {
  auto rng = pk::testing::seeded_rng();
  for (int variant = 0; variant < 6; ++variant) {
    case_config cfg;
    cfg.kv_lens = {1, 30, 77, 300};
    cfg.q_len = variant % 2 ? 4 : 1;  // prefill chunks too: each query its own distances
    cfg.group = variant < 2 ? 1 : variant < 4 ? 5 : 2;
    cfg.num_kv_heads = 2;
    cfg.block_size = variant == 3 ? 7 : 16;
    cfg.q_dtype = cfg.kv_dtype = variant >= 4 ? pk::dtype::bf16 : pk::dtype::f32;
    cfg.alibi = true;
    cfg.window_left = variant == 2 ? 20 : -1;
    cfg.soft_cap = variant == 5 ? 10.0f : 0.0f;
    check_case(cfg, rng);
  }
}

TEST(ReferenceAttention, EmptyBatchAndNoLse) {
  auto rng = pk::testing::seeded_rng();
  case_config cfg;
  cfg.kv_lens = {9, 1};
  cfg.with_lse = false;
  check_case(cfg, rng);
  attention_case c;
  cfg.kv_lens = {3};
  pk::testing::make_case(c, cfg, rng);
  c.params.num_seqs = 0;
  pk::reference::attention(c.params);  // writes nothing, reads nothing
  SUCCEED();
}

TEST(ReferenceAttention, RejectsBadParamsNamingTheValue) {
  auto rng = pk::testing::seeded_rng();
  case_config cfg;
  cfg.kv_lens = {4};
  cfg.num_kv_heads = 2;
  cfg.group = 2;
  attention_case c;
  pk::testing::make_case(c, cfg, rng);
  auto p = c.params;
  p.num_qo_heads = 3;
  try {
    pk::reference::attention(p);
    FAIL() << "no error";
  } catch (const pagedkv::error& e) {
    EXPECT_EQ(e.code(), pagedkv::errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("num_qo_heads 3"), std::string::npos) << e.what();
  }
  p = c.params;
  p.kv_dtype = pk::dtype::bf16;  // q is f32
  EXPECT_THROW(pk::reference::attention(p), pagedkv::error);
  p = c.params;
  p.table.block_size = 257;
  EXPECT_THROW(pk::reference::attention(p), pagedkv::error);
}

// Head ranges: disjoint ranges together write exactly what one whole call writes, bit for bit
// (each head's arithmetic does not depend on the others), and a range leaves other heads alone.
TEST(ReferenceAttention, HeadRangesComposeToTheWholeCall) {
  auto rng = pk::testing::seeded_rng();
  case_config cfg;
  cfg.kv_lens = {1, 19, 40};
  cfg.q_len = 3;
  cfg.group = 5;
  cfg.num_kv_heads = 2;
  cfg.block_size = 7;
  cfg.q_dtype = cfg.kv_dtype = pk::dtype::f32;
  attention_case c;
  pk::testing::make_case(c, cfg, rng);
  pk::reference::attention(c.params);
  const std::vector<unsigned char> whole_o = c.o;
  const std::vector<float> whole_lse = c.lse;
  std::fill(c.o.begin(), c.o.end(), 0xff);
  std::fill(c.lse.begin(), c.lse.end(), -1.0f);
  for (auto [begin, end] : {std::pair{0, 3}, std::pair{3, 4}, std::pair{4, 4}, std::pair{4, 10}})
    pk::reference::attention_heads(c.params, begin, end);
  EXPECT_EQ(c.o, whole_o);
  EXPECT_EQ(c.lse, whole_lse);

  std::fill(c.o.begin(), c.o.end(), 0xff);
  pk::reference::attention_heads(c.params, 2, 3);
  const std::size_t d = std::size_t(cfg.head_dim), heads = std::size_t(c.num_qo_heads());
  for (std::size_t i = 0; i < c.out_elems(); ++i)
    EXPECT_EQ(c.out(i) == c.out(i), (i / d) % heads == 2) << "element " << i;  // the rest stays NaN (0xff bytes)
  EXPECT_THROW(pk::reference::attention_heads(c.params, 3, 11), pagedkv::error);
  EXPECT_THROW(pk::reference::attention_heads(c.params, 4, 3), pagedkv::error);
}
