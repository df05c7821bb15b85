// The tensor-parallel plan and weight slicing (examples/llama/sharding.hpp) on the host: the plan's
// ranges partition every sharded dimension and each rank's query heads find their KV heads; bad
// sizes get errors naming the problem; and the core argument, a sharded forward built only from
// the slices (column-parallel outputs kept per rank, row-parallel partial products summed as the
// all-reduce would, vocabulary slices of the embedding summed and of the logits gathered) gives the
// unsharded CPU model's logits, and Hugging Face's on the tiny goldens, at 1, 2 and 4 ranks. Odd
// shapes: FFN widths and vocabularies that do not split evenly, partial RoPE, MQA and GQA with KV
// heads replicated, tied embeddings.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <pagedkv/error.hpp>

#include "cuda/cuda_backend.hpp"
#include "llama_config.hpp"
#include "llama_weights.hpp"
#include "model.hpp"
#include "rope.hpp"
#include "sharding.hpp"
#include "tiny_llama.hpp"

namespace {

using namespace pagedkv;
using namespace pagedkv::llama;

// ---- a host forward over a tensor-parallel plan ------------------------------------------------

/// y[n, out] = x[n, in] W[out, in]^T, accumulated in double.
std::vector<float> matmul(const std::vector<float>& x, const std::vector<float>& w, std::int64_t n, std::int64_t in,
                          std::int64_t out) {
  std::vector<float> y(std::size_t(n * out));
  for (std::int64_t t = 0; t < n; ++t)
    for (std::int64_t o = 0; o < out; ++o) {
      double acc = 0.0;
      for (std::int64_t i = 0; i < in; ++i) acc += double(x[std::size_t(t * in + i)]) * w[std::size_t(o * in + i)];
      y[std::size_t(t * out + o)] = float(acc);
    }
  return y;
}

std::vector<float> rmsnorm(const std::vector<float>& x, const std::vector<float>& gain, std::int64_t n, std::int64_t dim,
                           float eps) {
  std::vector<float> y(x.size());
  for (std::int64_t t = 0; t < n; ++t) {
    double ss = 0.0;
    for (std::int64_t i = 0; i < dim; ++i) ss += double(x[std::size_t(t * dim + i)]) * x[std::size_t(t * dim + i)];
    const double scale = 1.0 / std::sqrt(ss / double(dim) + eps);
    for (std::int64_t i = 0; i < dim; ++i)
      y[std::size_t(t * dim + i)] = float(x[std::size_t(t * dim + i)] * scale * gain[std::size_t(i)]);
  }
  return y;
}

/// The ranks' partial results summed in rank order: what an all-reduce leaves on every rank.
std::vector<float> all_reduce(const std::vector<std::vector<float>>& partials) {
  std::vector<float> sum(partials.front().size(), 0.0f);
  for (const auto& p : partials)
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += p[i];
  return sum;
}

/// Logits [tokens, vocab] at every position of one prompt, computed rank by rank from the shards'
/// weights only: each rank sees its shard's config and weights, and the ranks meet only in
/// all_reduce (after the embedding, O and down) and in the logits' gather.
std::vector<float> sharded_forward(const llama_config& config, const tensor_parallel_plan& plan,
                                   const std::vector<llama_weights>& shards, const std::vector<token_id>& prompt) {
  const std::int64_t n = std::int64_t(prompt.size()), dim = config.embedding_dim, hd = config.head_dim;
  const std::int64_t group = config.num_heads / config.num_kv_heads;
  const auto ranks = std::size_t(plan.ranks);
  std::vector<std::int32_t> positions(static_cast<std::size_t>(n));
  for (std::int64_t t = 0; t < n; ++t) positions[std::size_t(t)] = std::int32_t(t);
  rope_angles angles;
  compute_rope_angles(make_rope_table(config), positions.data(), n, angles);

  // vocabulary-parallel embedding: a rank fills the rows of the tokens it holds
  std::vector<std::vector<float>> partial(ranks, std::vector<float>(std::size_t(n * dim), 0.0f));
  for (std::size_t r = 0; r < ranks; ++r)
    for (std::int64_t t = 0; t < n; ++t)
      if (const index_range v = plan.shards[r].vocab; v.contains(prompt[std::size_t(t)]))
        std::copy_n(shards[r].token_embedding.begin() + (prompt[std::size_t(t)] - v.begin) * dim, dim,
                    partial[r].begin() + t * dim);
  std::vector<float> x = all_reduce(partial);

  for (std::int64_t l = 0; l < config.num_layers; ++l) {
    for (std::size_t r = 0; r < ranks; ++r) {  // attention, column-parallel Q/K/V, row-parallel O
      const tensor_parallel_shard& s = plan.shards[r];
      const llama_layer_weights& w = shards[r].layers[std::size_t(l)];
      const std::int64_t heads = s.config.num_heads, kv_heads = s.config.num_kv_heads;
      const std::vector<float> xb = rmsnorm(x, w.attn_norm, n, dim, config.rms_norm_eps);
      std::vector<float> q = matmul(xb, w.wq, n, dim, heads * hd);
      std::vector<float> k = matmul(xb, w.wk, n, dim, kv_heads * hd);
      const std::vector<float> v = matmul(xb, w.wv, n, dim, kv_heads * hd);
      apply_rope(q.data(), n, heads, hd, angles);
      apply_rope(k.data(), n, kv_heads, hd, angles);
      std::vector<float> att(std::size_t(n * heads * hd), 0.0f);
      for (std::int64_t h = 0; h < heads; ++h) {
        const std::int64_t kv = (s.q_heads.begin + h) / group - s.kv_heads.begin;  // the rank's own KV head
        EXPECT_TRUE(kv >= 0 && kv < kv_heads) << "rank " << r << " query head " << h << " lacks its KV head";
        if (kv < 0 || kv >= kv_heads) return {};
        for (std::int64_t i = 0; i < n; ++i) {
          std::vector<double> p(std::size_t(i + 1));
          double max = -INFINITY, sum = 0.0;
          for (std::int64_t j = 0; j <= i; ++j) {
            double dot = 0.0;
            for (std::int64_t d = 0; d < hd; ++d)
              dot += double(q[std::size_t((i * heads + h) * hd + d)]) * k[std::size_t((j * kv_heads + kv) * hd + d)];
            p[std::size_t(j)] = dot / std::sqrt(double(hd));
            max = std::max(max, p[std::size_t(j)]);
          }
          for (double& e : p) sum += (e = std::exp(e - max));
          for (std::int64_t d = 0; d < hd; ++d) {
            double o = 0.0;
            for (std::int64_t j = 0; j <= i; ++j) o += p[std::size_t(j)] * v[std::size_t((j * kv_heads + kv) * hd + d)];
            att[std::size_t((i * heads + h) * hd + d)] = float(o / sum);
          }
        }
      }
      partial[r] = matmul(att, w.wo, n, heads * hd, dim);
    }
    std::vector<float> delta = all_reduce(partial);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += delta[i];
    for (std::size_t r = 0; r < ranks; ++r) {  // feed-forward, column-parallel gate/up, row-parallel down
      const llama_layer_weights& w = shards[r].layers[std::size_t(l)];
      const std::int64_t ffn = plan.shards[r].config.ffn_dim;
      const std::vector<float> xb = rmsnorm(x, w.ffn_norm, n, dim, config.rms_norm_eps);
      std::vector<float> g = matmul(xb, w.w_gate, n, dim, ffn);
      const std::vector<float> u = matmul(xb, w.w_up, n, dim, ffn);
      for (std::size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
      partial[r] = matmul(g, w.w_down, n, ffn, dim);
    }
    delta = all_reduce(partial);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += delta[i];
  }

  // vocabulary-parallel LM head: each rank's logit columns, gathered without the padding
  std::vector<float> logits(std::size_t(n * config.vocab_size));
  const std::vector<float> xb = rmsnorm(x, shards.front().output_norm, n, dim, config.rms_norm_eps);
  for (std::size_t r = 0; r < ranks; ++r) {
    const index_range v = plan.shards[r].vocab;
    const std::vector<float> part = matmul(xb, shards[r].output_matrix(), n, dim, plan.vocab_shard);
    for (std::int64_t t = 0; t < n; ++t)
      std::copy_n(part.begin() + t * plan.vocab_shard, v.size(), logits.begin() + t * config.vocab_size + v.begin);
  }
  return logits;
}

/// The unsharded CPU model's logits at every position of one prompt (blocks of 4 tokens).
std::vector<float> cpu_forward(const llama_config& config, const llama_weights& weights,
                               const std::vector<token_id>& prompt) {
  constexpr std::int32_t block_size = 4;
  const auto n = std::int32_t(prompt.size());
  const std::int32_t blocks = (n + block_size - 1) / block_size;
  paged_kv_cache cache = make_paged_kv_cache(config, blocks, block_size);
  forward_batch b;
  b.tokens = prompt;
  for (std::int32_t i = 0; i < blocks; ++i) b.block_table.push_back(blocks - 1 - i);  // reversed
  for (std::int32_t t = 0; t < n; ++t) {
    b.positions.push_back(t);
    b.slot_mapping.push_back(b.block_table[std::size_t(t / block_size)] * block_size + t % block_size);
    b.logit_rows.push_back(t);
  }
  b.q_indptr.push_back(n);
  b.kv_lens.push_back(n);
  b.max_blocks_per_seq = blocks;
  forward_state state;
  state.attention_threads = 1;
  return forward(config, weights, cache, b, state);
}

std::vector<llama_weights> shard_all(const llama_config& config, const llama_weights& weights,
                                     const tensor_parallel_plan& plan) {
  std::vector<llama_weights> shards;
  for (const tensor_parallel_shard& s : plan.shards) shards.push_back(shard_weights(config, weights, s));
  return shards;
}

/// Largest |a - b| over the largest |b|.
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double err = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    err = std::max(err, double(std::abs(a[i] - b[i])));
    scale = std::max(scale, double(std::abs(b[i])));
  }
  return a.size() == b.size() ? err / scale : INFINITY;
}

/// Of the largest |logit|: float32 (the CPU model, transformers) against this forward's double
/// accumulation; measured at most 4.8e-7 against the CPU model and 1.9e-6 against transformers.
constexpr double forward_tolerance = 1e-5;

// ---- configurations ----------------------------------------------------------------------------

llama_config shape(std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim, std::int64_t ffn,
                   std::int64_t vocab) {
  llama_config c = test::tiny_config();
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.rope_dim = head_dim;
  c.embedding_dim = 24;
  c.ffn_dim = ffn;
  c.vocab_size = vocab;
  return c;
}

std::string error_of(const llama_config& config, std::int32_t ranks) {
  try {
    (void)make_tensor_parallel_plan(config, ranks);
  } catch (const pagedkv::error& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument);
    return e.what();
  }
  return "";
}

// ---- the plan ----------------------------------------------------------------------------------

TEST(TensorParallelPlan, RangesPartitionEveryShardedDimension) {
  const std::vector<llama_config> configs = {shape(4, 2, 8, 48, 41), shape(8, 8, 4, 37, 43), shape(8, 1, 4, 13, 7),
                                             shape(12, 4, 2, 64, 80), shape(16, 2, 8, 11, 5)};
  for (const llama_config& c : configs)
    for (const std::int32_t ranks : supported_tensor_parallel_sizes) {
      if (c.num_heads % ranks != 0) continue;
      SCOPED_TRACE("heads " + std::to_string(c.num_heads) + " kv " + std::to_string(c.num_kv_heads) + " ranks " +
                   std::to_string(ranks));
      const tensor_parallel_plan plan = make_tensor_parallel_plan(c, ranks);
      ASSERT_EQ(plan.shards.size(), std::size_t(ranks));
      EXPECT_EQ(plan.vocab_shard, (c.vocab_size + ranks - 1) / ranks);
      std::vector<int> q_owner(std::size_t(c.num_heads)), ffn_owner(std::size_t(c.ffn_dim)),
          vocab_owner(std::size_t(c.vocab_size)), kv_holders(std::size_t(c.num_kv_heads));
      for (const tensor_parallel_shard& s : plan.shards) {
        for (std::int64_t h = s.q_heads.begin; h < s.q_heads.end; ++h) ++q_owner[std::size_t(h)];
        for (std::int64_t i = s.ffn.begin; i < s.ffn.end; ++i) ++ffn_owner[std::size_t(i)];
        for (std::int64_t i = s.vocab.begin; i < s.vocab.end; ++i) ++vocab_owner[std::size_t(i)];
        for (std::int64_t h = s.kv_heads.begin; h < s.kv_heads.end; ++h) ++kv_holders[std::size_t(h)];
        for (std::int64_t h = s.q_heads.begin; h < s.q_heads.end; ++h)
          EXPECT_TRUE(s.kv_heads.contains(h / c.queries_per_kv_head())) << "query head " << h;
        EXPECT_EQ(s.q_heads.size(), c.num_heads / ranks);
        EXPECT_LE(s.vocab.size(), plan.vocab_shard);
        EXPECT_EQ(s.config.num_heads, s.q_heads.size());
        EXPECT_EQ(s.config.num_kv_heads, s.kv_heads.size());
        EXPECT_EQ(s.config.queries_per_kv_head() * s.config.num_kv_heads, s.config.num_heads);
        EXPECT_EQ(s.config.ffn_dim, s.ffn.size());
        EXPECT_GE(s.ffn.size(), c.ffn_dim / ranks);
        EXPECT_EQ(s.config.vocab_size, plan.vocab_shard);
        EXPECT_EQ(s.config.embedding_dim, c.embedding_dim);
      }
      EXPECT_TRUE(std::ranges::all_of(q_owner, [](int o) { return o == 1; }));
      EXPECT_TRUE(std::ranges::all_of(ffn_owner, [](int o) { return o == 1; }));
      EXPECT_TRUE(std::ranges::all_of(vocab_owner, [](int o) { return o == 1; }));
      EXPECT_TRUE(std::ranges::all_of(kv_holders, [&](int o) { return o == plan.kv_head_replicas; }));
      EXPECT_EQ(plan.kv_head_replicas, c.num_kv_heads >= ranks ? 1 : ranks / c.num_kv_heads);
      EXPECT_EQ(plan.all_reduce_elements(5), 5 * c.embedding_dim);
    }
}

TEST(TensorParallelPlan, BadSizesGetErrorsNamingTheProblem) {
  const llama_config c = shape(4, 2, 8, 48, 41);
  for (const std::int32_t ranks : {0, -1, 3, 8})
    EXPECT_NE(error_of(c, ranks).find("tensor-parallel size " + std::to_string(ranks) + " is not supported"),
              std::string::npos)
        << ranks;
  EXPECT_NE(error_of(shape(6, 6, 4, 48, 41), 4).find("does not divide the 6 query heads"), std::string::npos);
  EXPECT_NE(error_of(shape(12, 6, 4, 48, 41), 4).find("the 6 KV heads: one must divide the other"), std::string::npos);
  EXPECT_NE(error_of(shape(6, 4, 4, 48, 41), 2).find("a positive multiple of KV heads (4)"), std::string::npos);
  EXPECT_NE(error_of(shape(4, 2, 8, 3, 41), 4).find("more than the FFN width (3)"), std::string::npos);
  EXPECT_NE(error_of(shape(4, 2, 8, 48, 2), 4).find("the vocabulary (2)"), std::string::npos);
  EXPECT_EQ(error_of(shape(4, 2, 8, 48, 41), 4), "");  // KV heads replicated: accepted
  llama_config windowed = shape(4, 2, 8, 48, 41);
  windowed.layer_windows.assign(std::size_t(windowed.num_layers), 0);
  windowed.layer_windows.back() = 16;
  EXPECT_NE(error_of(windowed, 2).find("sliding windows"), std::string::npos);
}

TEST(TensorParallelPlan, LlamaShapesSplitWithoutPadding) {
  // llama2-13b (40 heads, 40 KV heads, FFN 13824, vocab 32000) and llama3-8b (32 and 8, 14336,
  // 128256): even splits at 2 and 4 ranks, nothing replicated, no vocabulary padding.
  for (const auto& [heads, kv, ffn, vocab] : {std::tuple{40, 40, 13824, 32000}, std::tuple{32, 8, 14336, 128256}})
    for (const std::int32_t ranks : {2, 4}) {
      const tensor_parallel_plan plan = make_tensor_parallel_plan(shape(heads, kv, 128, ffn, vocab), ranks);
      EXPECT_EQ(plan.kv_head_replicas, 1);
      EXPECT_EQ(plan.vocab_shard * ranks, vocab);
      for (const tensor_parallel_shard& s : plan.shards) {
        EXPECT_EQ(s.ffn.size() * ranks, ffn);
        EXPECT_EQ(s.kv_heads.size() * ranks, kv);
      }
    }
}

TEST(TensorParallelPlan, ShardShapesAreRankZerosShard) {
  // NAME@tpN (pagedkv-llama --model-shape): rank 0's shard of a timing shape, run alone on one GPU.
  const llama_config thirteen = *named_model_shape("llama2-13b@tp2");
  EXPECT_EQ(thirteen.num_heads, 20);
  EXPECT_EQ(thirteen.num_kv_heads, 20);
  EXPECT_EQ(thirteen.ffn_dim, 6912);
  EXPECT_EQ(thirteen.vocab_size, 16000);
  EXPECT_EQ(thirteen.embedding_dim, 5120);
  EXPECT_EQ(thirteen.num_layers, 40);
  const llama_config eight = *named_model_shape("llama3-8b@tp2");
  EXPECT_EQ(eight.num_kv_heads, 4);
  EXPECT_EQ(eight.ffn_dim, 7168);
  EXPECT_EQ(eight.vocab_size, 64128);
  EXPECT_EQ(named_model_shape("llama2-13b@tp"), std::nullopt);
  EXPECT_EQ(named_model_shape("llama2-13b@tpx"), std::nullopt);
  EXPECT_EQ(named_model_shape("llama2-70b@tp2"), std::nullopt);
  EXPECT_THROW((void)named_model_shape("llama2-13b@tp3"), pagedkv::error);  // 40 heads over 3 ranks
}

// ---- slicing -----------------------------------------------------------------------------------

TEST(ShardWeights, SlicesHaveTheShardsShapesAndZeroVocabularyPadding) {
  const llama_config c = shape(8, 2, 4, 37, 43);
  const llama_weights w = test::tiny_weights(c, 3);
  const tensor_parallel_plan plan = make_tensor_parallel_plan(c, 4);
  for (const tensor_parallel_shard& s : plan.shards) {
    const llama_weights sw = shard_weights(c, w, s);
    const std::int64_t dim = c.embedding_dim;
    ASSERT_EQ(sw.layers.size(), std::size_t(c.num_layers));
    EXPECT_EQ(sw.layers[0].wq.size(), std::size_t(s.config.num_heads * c.head_dim * dim));
    EXPECT_EQ(sw.layers[0].wk.size(), std::size_t(s.config.kv_dim() * dim));
    EXPECT_EQ(sw.layers[1].wo.size(), std::size_t(dim * s.config.num_heads * c.head_dim));
    EXPECT_EQ(sw.layers[1].w_down.size(), std::size_t(dim * s.ffn.size()));
    ASSERT_EQ(sw.token_embedding.size(), std::size_t(plan.vocab_shard * dim));
    ASSERT_EQ(sw.output.size(), std::size_t(plan.vocab_shard * dim));
    // row v - begin of the slice is token v's row; the padding rows are zero
    for (std::int64_t v = s.vocab.begin; v < s.vocab.end; ++v)
      EXPECT_EQ(sw.output[std::size_t((v - s.vocab.begin) * dim + 5)], w.output[std::size_t(v * dim + 5)]);
    for (std::size_t i = std::size_t(s.vocab.size() * dim); i < sw.output.size(); ++i)
      ASSERT_EQ(sw.output[i], 0.0f) << "rank " << s.rank;
    // wo column j of the slice is column q_heads.begin * head_dim + j of the whole
    const std::int64_t q_dim = c.num_heads * c.head_dim, local = s.config.num_heads * c.head_dim;
    EXPECT_EQ(sw.layers[0].wo[std::size_t(3 * local + 1)],
              w.layers[0].wo[std::size_t(3 * q_dim + s.q_heads.begin * c.head_dim + 1)]);
  }
}

TEST(ShardWeights, MisshapenWeightsAreRefusedByName) {
  const llama_config c = shape(4, 2, 8, 48, 41);
  llama_weights w = test::tiny_weights(c, 3);
  w.layers[1].w_up.pop_back();
  const tensor_parallel_plan plan = make_tensor_parallel_plan(c, 2);
  try {
    (void)shard_weights(c, w, plan.shards[0]);
    FAIL() << "no error";
  } catch (const pagedkv::error& e) {
    EXPECT_NE(std::string(e.what()).find("w_up of layer 1 has 1151 elements, the config needs 1152"), std::string::npos)
        << e.what();
  }
}

// ---- the sharded forward against the unsharded one ----------------------------------------------

struct forward_case {
  const char* name;
  llama_config config;
};

class ShardedForward : public testing::TestWithParam<forward_case> {};

TEST_P(ShardedForward, MatchesTheUnshardedCpuModelAtEveryRankCount) {
  const llama_config& c = GetParam().config;
  llama_weights w = test::tiny_weights(c, 11);
  if (c.tied_embeddings) w.output.clear();
  const std::vector<token_id> prompt = {1, 0, std::int32_t(c.vocab_size) - 1, 5, 3, 3, 2, std::int32_t(c.vocab_size) / 2,
                                        4, 1, 6};
  const std::vector<float> expected = cpu_forward(c, w, prompt);
  for (const std::int32_t ranks : supported_tensor_parallel_sizes) {
    const tensor_parallel_plan plan = make_tensor_parallel_plan(c, ranks);
    const std::vector<float> got = sharded_forward(c, plan, shard_all(c, w, plan), prompt);
    EXPECT_LT(relative_error(got, expected), forward_tolerance) << ranks << " ranks";
  }
}

llama_config with(llama_config c, auto&& change) {
  change(c);
  return c;
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ShardedForward,
    testing::Values(
        forward_case{"gqa", shape(4, 2, 8, 48, 41)},                 // KV heads replicated at 4 ranks
        forward_case{"mha_odd_ffn_vocab", shape(8, 8, 4, 37, 43)},   // uneven FFN and vocabulary splits
        forward_case{"mqa_tied", with(shape(4, 1, 6, 13, 7), [](llama_config& c) { c.tied_embeddings = true; })},
        forward_case{"gqa_ratio_4_partial_rope",
                     with(shape(8, 2, 6, 30, 50), [](llama_config& c) { c.rope_dim = 4; })}),
    [](const testing::TestParamInfo<forward_case>& info) { return std::string(info.param.name); });

TEST(ShardedForward, DetectsAWrongSlice) {
  // The comparison can fail: the sharded forward with two ranks' O slices swapped (each rank's
  // attention output meets the other's columns of wo) is far from the unsharded model.
  const llama_config c = shape(4, 2, 8, 48, 41);
  const llama_weights w = test::tiny_weights(c, 11);
  const std::vector<token_id> prompt = {1, 2, 3, 4, 5};
  const tensor_parallel_plan plan = make_tensor_parallel_plan(c, 2);
  std::vector<llama_weights> shards = shard_all(c, w, plan);
  std::swap(shards[0].layers[1].wo, shards[1].layers[1].wo);
  EXPECT_GT(relative_error(sharded_forward(c, plan, shards, prompt), cpu_forward(c, w, prompt)), 100 * forward_tolerance);
}

// The tiny Hugging Face models (GQA 4/2, MQA with tied embeddings, every RoPE scaling): the
// sharded forward gives transformers' logits at every position of each golden prompt.
class ShardedGolden : public testing::TestWithParam<std::string> {};

TEST_P(ShardedGolden, MatchesTransformersAtEveryRankCount) {
  const std::filesystem::path dir = std::filesystem::path(PAGEDKV_GOLDEN_DIR) / "hf_tiny" / GetParam();
  const hf_checkpoint model = load_hf_checkpoint(dir);
  std::ifstream golden_file(dir / "golden.json");
  const nlohmann::json golden = nlohmann::json::parse(golden_file);
  std::ifstream logits_file(dir / "logits.f32", std::ios::binary);
  std::vector<float> hf(std::filesystem::file_size(dir / "logits.f32") / sizeof(float));
  logits_file.read(reinterpret_cast<char*>(hf.data()), std::streamsize(hf.size() * sizeof(float)));
  for (const std::int32_t ranks : supported_tensor_parallel_sizes) {
    const tensor_parallel_plan plan = make_tensor_parallel_plan(model.config, ranks);
    const std::vector<llama_weights> shards = shard_all(model.config, model.weights, plan);
    std::vector<float> got;
    for (const nlohmann::json& prompt : golden.at("prompts")) {
      const std::vector<float> logits =
          sharded_forward(model.config, plan, shards, prompt.at("ids").get<std::vector<token_id>>());
      got.insert(got.end(), logits.begin(), logits.end());
    }
    EXPECT_LT(relative_error(got, hf), forward_tolerance) << ranks << " ranks";
  }
}

INSTANTIATE_TEST_SUITE_P(HfTiny, ShardedGolden, testing::Values("gqa", "mqa_tied", "linear", "llama3", "yarn"));

}  // namespace
