// The CUDA decode's host planner (decode_plan.hpp): split counts, CTA shapes and pairs, from host
// values alone. Plain C++: it runs in every build, without nvcc or a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

#include <pagedkv/decode_plan.hpp>

namespace pk = pagedkv::kernels;

TEST(DecodePlan, AboutOneCtaAnSmInEvenWholeTileChunks) {
  constexpr int sms = 132, tile = 64, min_chunk = 256;
  for (const int num_seqs : {1, 2, 7, 16, 64, 300})
    for (const int kv_heads : {1, 2, 8, 32})
      for (const int max_len : {1, 63, 64, 65, 1000, 8192, 40000})
        for (const int cap : {0, 1, 3, 64}) {
          pk::attention_params p;
          p.num_seqs = num_seqs; p.num_kv_heads = kv_heads; p.num_qo_heads = kv_heads; p.head_dim = 128;
          p.max_kv_len = max_len; p.max_splits = cap;
          const auto plan = pk::cuda::plan_decode(p, sms, tile, min_chunk);
          SCOPED_TRACE(::testing::Message() << "seqs " << num_seqs << " kv_heads " << kv_heads << " max_len " << max_len
                                          << " cap " << cap << ": " << plan.num_splits << " x " << plan.chunk_tokens);
          EXPECT_EQ(plan.chunk_tokens % tile, 0);
          EXPECT_GE(std::int64_t(plan.num_splits) * plan.chunk_tokens, max_len);     // covers every token
          EXPECT_LT(std::int64_t(plan.num_splits - 1) * plan.chunk_tokens, max_len);  // no empty split
          if (cap > 0) {
            EXPECT_LE(plan.num_splits, cap);
          }
          if (plan.num_splits > 1) {
            EXPECT_GE(plan.chunk_tokens, min_chunk);
          }
          const std::int64_t units = std::int64_t(num_seqs) * kv_heads, target = sms * 9 / 10;
          const std::int64_t wanted = (target + units - 1) / units;  // splits for about one CTA an SM
          if (plan.num_splits > 1) {
            EXPECT_LE(plan.num_splits, 2 * wanted) << "at most twice the splits it needs";
          }
          if (cap == 0 && plan.chunk_tokens > min_chunk) {  // not held back by the smallest chunk
            EXPECT_GE(units * plan.num_splits, std::min(target, units * wanted)) << "fills the SMs";
          }
        }
  pk::attention_params p;  // GQA 32/8, batch 1, ctx 8k: 16 even splits of 512, not 15 of 576 and one of 128
  p.num_seqs = 1; p.num_kv_heads = 8; p.num_qo_heads = 32; p.head_dim = 128; p.max_kv_len = 8192;
  const auto plan = pk::cuda::plan_decode(p, sms, tile, min_chunk);
  EXPECT_EQ(plan.num_splits, 16);
  EXPECT_EQ(plan.chunk_tokens, 512);
}

TEST(DecodePlan, CtaShapeFollowsTheGridSize) {
  // Narrow tile 64 (two CTAs an SM), wide tile 128 (one).
  constexpr int sms = 132, narrow_tile = 64, wide_tile = 128, min_chunk = 256;
  using pk::cuda::decode_cta;
  for (const int num_seqs : {1, 2, 16, 17, 64, 256})
    for (const int kv_heads : {1, 8, 32})
      for (const int max_len : {1, 100, 2048, 8192, 40000})
        for (const int cap : {0, 3})
          for (const int has : {0, 1, 2, 3}) {  // bit 0: wide CTAs exist, bit 1: shallow ones
            const bool has_wide = has & 1, has_shallow = has & 2;
            pk::attention_params p;
            p.num_seqs = num_seqs; p.num_kv_heads = kv_heads; p.num_qo_heads = kv_heads; p.head_dim = 128;
            p.max_kv_len = max_len; p.max_splits = cap;
            const auto narrow = pk::cuda::plan_decode(p, sms, narrow_tile, min_chunk);
            const auto plan =
                pk::cuda::plan_decode_mma(p, sms, narrow_tile, wide_tile, min_chunk, has_wide, has_shallow);
            SCOPED_TRACE(::testing::Message() << "seqs " << num_seqs << " kv_heads " << kv_heads << " max_len " << max_len
                                            << " cap " << cap << " has_wide " << has_wide << " has_shallow "
                                            << has_shallow);
            const std::int64_t units = std::int64_t(num_seqs) * kv_heads, ctas = units * narrow.num_splits;
            const bool many = ctas >= std::int64_t(pk::cuda::decode_shallow_min_ctas_per_sm) * sms;
            const auto both = pk::cuda::plan_decode(p, sms, narrow_tile, min_chunk, 2);  // two CTAs an SM
            const bool both_slots = both.num_splits > narrow.num_splits && units * both.num_splits <= 2 * sms &&
                                    both.num_splits <= 8 && (both.chunk_tokens >= 4096 || narrow.num_splits > 1);
            EXPECT_EQ(plan.cta, has_shallow && many                       ? decode_cta::shallow
                                : has_wide && ctas <= sms && !both_slots ? decode_cta::wide
                                                                         : decode_cta::narrow);
            if (has_wide && ctas <= sms && both_slots) {  // twice the splits, on both slots of every SM
              EXPECT_EQ(plan.num_splits, both.num_splits);
              EXPECT_EQ(plan.chunk_tokens, both.chunk_tokens);
              EXPECT_GT(units * plan.num_splits, sms);
              continue;
            }
            if (plan.cta != decode_cta::wide) {  // the narrow split either way
              EXPECT_EQ(plan.num_splits, narrow.num_splits);
              EXPECT_EQ(plan.chunk_tokens, narrow.chunk_tokens);
              continue;
            }
            EXPECT_EQ(plan.chunk_tokens % wide_tile, 0);
            EXPECT_GE(std::int64_t(plan.num_splits) * plan.chunk_tokens, max_len);
            EXPECT_LT(std::int64_t(plan.num_splits - 1) * plan.chunk_tokens, max_len);
            EXPECT_LE(units * plan.num_splits, sms) << "one CTA an SM at most";
            if (cap > 0) {
              EXPECT_LE(plan.num_splits, cap);
            }
          }
  struct shape {
    int num_seqs, kv_heads, qo_heads, max_len;
    decode_cta cta;
    int splits, chunk;
  };
  // Shapes that decode_both_slots_worth was measured on (bf16 head_dim 128 on the H100).
  for (const shape s : {shape{1, 32, 32, 2048, decode_cta::narrow, 8, 256},    // MHA: 4 wide splits -> 8
                        shape{4, 32, 32, 8192, decode_cta::narrow, 2, 4096},   // a first split of 4096
                        shape{4, 32, 32, 4096, decode_cta::wide, 1, 4096},     // ... not of 2048
                        shape{16, 8, 32, 32768, decode_cta::narrow, 2, 16384}, // GQA 32/8
                        shape{16, 8, 32, 2048, decode_cta::wide, 1, 2048},
                        shape{4, 8, 32, 2048, decode_cta::narrow, 8, 256},     // splits already, group 4
                        shape{16, 4, 32, 4096, decode_cta::wide, 2, 2048},     // ... but not of group 8
                        shape{16, 2, 32, 32768, decode_cta::narrow, 8, 4096},  // group 16, 4096 a CTA
                        shape{1, 8, 32, 8192, decode_cta::wide, 16, 512}}) {   // 32 splits merge slowly
    pk::attention_params p;
    p.num_seqs = s.num_seqs; p.num_kv_heads = s.kv_heads; p.num_qo_heads = s.qo_heads; p.head_dim = 128;
    p.max_kv_len = s.max_len;
    const auto plan = pk::cuda::plan_decode_mma(p, sms, narrow_tile, wide_tile, min_chunk, true, true);
    SCOPED_TRACE(::testing::Message() << "seqs " << s.num_seqs << " heads " << s.qo_heads << "/" << s.kv_heads
                                    << " max_len " << s.max_len);
    EXPECT_EQ(plan.cta, s.cta);
    EXPECT_EQ(plan.num_splits, s.splits);
    EXPECT_EQ(plan.chunk_tokens, s.chunk);
  }
}

TEST(DecodePlan, PairsWhereTwoHeadsMakeOneRowAndFillTheSms) {
  // Paired tile 64: every launch with an even KV head count over NHD pools and at least
  // as many pairs as SMs is paired, unsplit; any other plans as if there were no paired CTAs.
  constexpr int sms = 132, narrow_tile = 128, wide_tile = 128, paired_tile = 64, min_chunk = 512;
  using pk::cuda::decode_cta;
  for (const int num_seqs : {1, 16, 33, 66, 67, 256})
    for (const int kv_heads : {1, 3, 4, 8, 32})
      for (const int max_len : {1, 2048, 40000})
        for (const bool hnd : {false, true})
          for (const int cap : {0, 3}) {
            pk::attention_params p;
            p.num_seqs = num_seqs; p.num_kv_heads = kv_heads; p.num_qo_heads = 4 * kv_heads; p.head_dim = 128;
            p.token_stride = hnd ? 128 : kv_heads * 128;
            p.head_stride = hnd ? 16 * 128 : 128;
            p.max_kv_len = max_len; p.max_splits = cap;
            SCOPED_TRACE(::testing::Message() << "seqs " << num_seqs << " kv_heads " << kv_heads << " max_len "
                                            << max_len << " hnd " << hnd << " cap " << cap);
            const auto plan =
                pk::cuda::plan_decode_mma(p, sms, narrow_tile, wide_tile, min_chunk, true, true, paired_tile);
            const auto unpaired = pk::cuda::plan_decode_mma(p, sms, narrow_tile, wide_tile, min_chunk, true, true);
            EXPECT_EQ(unpaired.kv_heads(), 1);
            if (kv_heads % 2 == 0 && !hnd && num_seqs * kv_heads / 2 >= sms) {
              EXPECT_EQ(plan.cta, decode_cta::paired);
              EXPECT_EQ(plan.kv_heads(), 2);
              EXPECT_EQ(plan.units_per_seq(p), kv_heads / 2);
              EXPECT_EQ(plan.num_splits, 1);
              EXPECT_EQ(plan.chunk_tokens % paired_tile, 0);
              EXPECT_GE(plan.chunk_tokens, max_len);
              EXPECT_EQ(plan.workspace_bytes, 0u);
            } else {
              EXPECT_EQ(plan.cta, unpaired.cta);
              EXPECT_EQ(plan.kv_heads(), 1);
              EXPECT_EQ(plan.num_splits, unpaired.num_splits);
              EXPECT_EQ(plan.chunk_tokens, unpaired.chunk_tokens);
            }
          }
}

TEST(DecodePlan, NoPlanNeedsMoreWorkspaceThanTheBound) {
  // Every planner (one or two CTAs an SM, the tensor-core shapes with and without wide, shallow and
  // paired CTAs) at every batch up to the bound's, odd SM counts, contexts and caps: what a caller
  // reserves once with decode_workspace_bound covers each plan.
  for (const int sms : {1, 7, 78, 132})
    for (const int kv_heads : {1, 2, 3, 8, 32})
      for (const int group : {1, 4, 5})
        for (const int max_seqs : {1, 2, 9, 64, 256}) {
          const std::size_t bound = pk::cuda::decode_workspace_bound(max_seqs, kv_heads * group, kv_heads, 128, sms);
          std::size_t most = 0;
          for (int num_seqs = 1; num_seqs <= max_seqs; num_seqs += num_seqs < 10 ? 1 : 7)
            for (const int max_len : {1, 65, 1000, 4097, 40000, 300000})
              for (const int cap : {0, 3}) {
                pk::attention_params p;
                p.num_seqs = num_seqs; p.num_kv_heads = kv_heads; p.num_qo_heads = kv_heads * group; p.head_dim = 128;
                p.token_stride = kv_heads * 128; p.head_stride = 128;
                p.max_kv_len = max_len; p.max_splits = cap;
                SCOPED_TRACE(::testing::Message() << "sms " << sms << " kv_heads " << kv_heads << " group " << group
                                                << " seqs " << num_seqs << " max_len " << max_len << " cap " << cap);
                for (const auto& plan : {pk::cuda::plan_decode(p, sms, 16, 16), pk::cuda::plan_decode(p, sms, 64, 256, 2),
                                         pk::cuda::plan_decode_mma(p, sms, 64, 128, 256, true, true, 64),
                                         pk::cuda::plan_decode_mma(p, sms, 32, 64, 32, true, false)}) {
                  EXPECT_LE(plan.workspace_bytes, bound) << plan.num_splits << " splits";
                  most = std::max(most, plan.workspace_bytes);
                }
              }
          if (sms >= 78) {
            EXPECT_GT(most, 0u) << "some plan splits";
          }
        }
  EXPECT_EQ(pk::cuda::decode_workspace_bound(0, 32, 8, 128, 132), 0u);
}
