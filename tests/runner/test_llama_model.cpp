// The paged, batched forward equals a plain dense float64 forward of each sequence on its own.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "model.hpp"
#include "tiny_llama.hpp"

namespace {

using namespace pagedkv::llama;
using namespace pagedkv::llama::test;
using pagedkv::block_id;
using pagedkv::token_id;

// ---- the dense reference, written out plainly in double ----------------------------------------

std::vector<double> dense_matvec(const std::vector<float>& w, const std::vector<double>& x, std::int64_t out) {
  const auto in = std::int64_t(x.size());
  std::vector<double> y(std::size_t(out), 0.0);
  for (std::int64_t o = 0; o < out; ++o)
    for (std::int64_t i = 0; i < in; ++i) y[std::size_t(o)] += double(w[std::size_t(o * in + i)]) * x[std::size_t(i)];
  return y;
}

std::vector<double> dense_rmsnorm(const std::vector<double>& x, const std::vector<float>& gain, double eps) {
  double ss = 0.0;
  for (double v : x) ss += v * v;
  const double scale = 1.0 / std::sqrt(ss / double(x.size()) + eps);
  std::vector<double> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] * scale * gain[i];
  return y;
}

/// Hugging Face's inverse frequencies and attention factor (modeling_rope_utils.py, transformers
/// 5.17) written out again in double, for every scaling the model supports.
struct dense_rope_table {
  std::vector<double> inv_freq;
  double attention_factor = 1.0;
};

dense_rope_table dense_rope_of(const llama_config& c) {
  const rope_scaling_config& r = c.rope_scaling;
  const double pi = 3.14159265358979323846, dim = double(c.rope_dim);
  dense_rope_table t;
  for (std::int64_t i = 0; i < c.rope_dim / 2; ++i) t.inv_freq.push_back(std::pow(c.rope_theta, -2.0 * double(i) / dim));
  switch (r.type) {
    case rope_scaling_type::none: break;
    case rope_scaling_type::linear:
      for (double& f : t.inv_freq) f /= r.factor;
      break;
    case rope_scaling_type::llama3:
      for (double& f : t.inv_freq) {
        const double wavelen = 2.0 * pi / f, old = double(r.original_context_length);
        if (wavelen > old / r.low_freq_factor) {
          f /= r.factor;
        } else if (wavelen >= old / r.high_freq_factor) {
          const double smooth = (old / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
          f = (1.0 - smooth) * f / r.factor + smooth * f;
        }
      }
      break;
    case rope_scaling_type::yarn: {
      const auto correction = [&](double rotations) {
        return dim * std::log(double(r.original_context_length) / (rotations * 2.0 * pi)) / (2.0 * std::log(c.rope_theta));
      };
      double low = std::max(std::floor(correction(r.beta_fast)), 0.0);
      double high = std::min(std::ceil(correction(r.beta_slow)), dim - 1.0);
      if (!r.truncate) {
        low = std::max(correction(r.beta_fast), 0.0);
        high = std::min(correction(r.beta_slow), dim - 1.0);
      }
      if (low == high) high += 0.001;
      for (std::size_t i = 0; i < t.inv_freq.size(); ++i) {
        const double keep = 1.0 - std::clamp((double(i) - low) / (high - low), 0.0, 1.0);  // extrapolation share
        t.inv_freq[i] = t.inv_freq[i] / r.factor * (1.0 - keep) + t.inv_freq[i] * keep;
      }
      t.attention_factor = r.attention_factor;
      break;
    }
  }
  for (std::size_t i = 0; i < r.frequency_divisors.size(); ++i) t.inv_freq[i] /= r.frequency_divisors[i];
  return t;
}

void dense_rope(std::vector<double>& x, std::int64_t heads, std::int64_t head_dim, double pos, const dense_rope_table& rope) {
  const auto half = std::int64_t(rope.inv_freq.size());
  for (std::int64_t h = 0; h < heads; ++h)
    for (std::int64_t i = 0; i < half; ++i) {
      const double angle = pos * rope.inv_freq[std::size_t(i)];
      const double cos = std::cos(angle) * rope.attention_factor, sin = std::sin(angle) * rope.attention_factor;
      double& a = x[std::size_t(h * head_dim + i)];
      double& b = x[std::size_t(h * head_dim + i + half)];
      const double a0 = a, b0 = b;
      a = a0 * cos - b0 * sin;
      b = b0 * cos + a0 * sin;
    }
}

/// Logits [tokens.size(), vocab] of every position of one sequence, causal, no cache.
std::vector<std::vector<double>> dense_forward(const llama_config& c, const llama_weights& w,
                                               const std::vector<token_id>& tokens) {
  const std::int64_t n = std::int64_t(tokens.size()), d = c.embedding_dim, hd = c.head_dim;
  const dense_rope_table rope = dense_rope_of(c);
  std::vector<std::vector<double>> x(static_cast<std::size_t>(n));
  for (std::int64_t t = 0; t < n; ++t)
    x[std::size_t(t)].assign(w.token_embedding.begin() + tokens[std::size_t(t)] * d,
                             w.token_embedding.begin() + (tokens[std::size_t(t)] + 1) * d);
  for (const llama_layer_weights& lw : w.layers) {
    std::vector<std::vector<double>> q(static_cast<std::size_t>(n)), k(static_cast<std::size_t>(n)), v(static_cast<std::size_t>(n));
    for (std::int64_t t = 0; t < n; ++t) {
      const auto xn = dense_rmsnorm(x[std::size_t(t)], lw.attn_norm, c.rms_norm_eps);
      q[std::size_t(t)] = dense_matvec(lw.wq, xn, c.num_heads * hd);
      k[std::size_t(t)] = dense_matvec(lw.wk, xn, c.kv_dim());
      v[std::size_t(t)] = dense_matvec(lw.wv, xn, c.kv_dim());
      dense_rope(q[std::size_t(t)], c.num_heads, hd, double(t), rope);
      dense_rope(k[std::size_t(t)], c.num_kv_heads, hd, double(t), rope);
    }
    for (std::int64_t t = 0; t < n; ++t) {
      std::vector<double> att(std::size_t(c.num_heads * hd), 0.0);
      for (std::int64_t h = 0; h < c.num_heads; ++h) {
        const std::int64_t kvh = h / (c.num_heads / c.num_kv_heads);
        std::vector<double> score(std::size_t(t + 1));
        for (std::int64_t u = 0; u <= t; ++u) {
          double dot = 0.0;
          for (std::int64_t i = 0; i < hd; ++i) dot += q[std::size_t(t)][std::size_t(h * hd + i)] * k[std::size_t(u)][std::size_t(kvh * hd + i)];
          score[std::size_t(u)] = dot / std::sqrt(double(hd));
        }
        const double m = *std::max_element(score.begin(), score.end());
        double sum = 0.0;
        for (double& s : score) sum += (s = std::exp(s - m));
        for (std::int64_t u = 0; u <= t; ++u)
          for (std::int64_t i = 0; i < hd; ++i)
            att[std::size_t(h * hd + i)] += score[std::size_t(u)] / sum * v[std::size_t(u)][std::size_t(kvh * hd + i)];
      }
      const auto o = dense_matvec(lw.wo, att, d);
      for (std::int64_t i = 0; i < d; ++i) x[std::size_t(t)][std::size_t(i)] += o[std::size_t(i)];
      const auto xn = dense_rmsnorm(x[std::size_t(t)], lw.ffn_norm, c.rms_norm_eps);
      auto g = dense_matvec(lw.w_gate, xn, c.ffn_dim);
      const auto up = dense_matvec(lw.w_up, xn, c.ffn_dim);
      for (std::size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * up[i];
      const auto down = dense_matvec(lw.w_down, g, d);
      for (std::int64_t i = 0; i < d; ++i) x[std::size_t(t)][std::size_t(i)] += down[std::size_t(i)];
    }
  }
  std::vector<std::vector<double>> logits;
  for (std::int64_t t = 0; t < n; ++t)
    logits.push_back(dense_matvec(w.output, dense_rmsnorm(x[std::size_t(t)], w.output_norm, c.rms_norm_eps), c.vocab_size));
  return logits;
}

// ---- the paged forward over steps that mix a chunked prefill with decodes -----------------------

struct test_sequence {
  std::vector<token_id> tokens;   // the whole history the test will feed
  std::vector<block_id> blocks;   // its blocks, scattered over the pool
  std::int32_t computed = 0;
};

/// Runs steps that mix a chunked prefill with decodes through the paged forward and checks every
/// logit against the dense float64 forward of each sequence.
void check_paged_equals_dense(const llama_config& config, std::int32_t block_size) {
  const llama_weights weights = tiny_weights(config, 7);
  std::mt19937 rng(11);
  std::uniform_int_distribution<token_id> token(0, token_id(config.vocab_size - 1));

  // A: 13-token prompt prefilled in chunks of 5 and 8, then decodes; B: 6-token prompt, then
  // decodes; C: 1-token prompt, then decodes.
  std::vector<test_sequence> seqs(3);
  const std::vector<std::int32_t> lengths = {15, 8, 3};
  const std::int32_t max_blocks = (15 + block_size - 1) / block_size;
  std::vector<block_id> free_blocks(std::size_t(3 * max_blocks));
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
  paged_kv_cache cache = make_paged_kv_cache(config, std::int32_t(free_blocks.size()), block_size);
  std::fill(cache.data.begin(), cache.data.end(), std::nanf(""));  // poison: unwritten slots must not be read
  for (std::size_t s = 0; s < seqs.size(); ++s) {
    for (std::int32_t i = 0; i < lengths[s]; ++i) seqs[s].tokens.push_back(token(rng));
    for (std::int32_t b = 0; b < max_blocks; ++b) seqs[s].blocks.push_back(free_blocks[s * std::size_t(max_blocks) + std::size_t(b)]);
  }
  std::vector<std::vector<std::vector<double>>> expected;
  for (const auto& s : seqs) expected.push_back(dense_forward(config, weights, s.tokens));

  // tokens each sequence runs in each step
  const std::vector<std::vector<std::int32_t>> steps = {{5, 6, 1}, {8, 1, 1}, {1, 1, 1}, {1, 0, 0}};
  forward_state state;
  double max_err = 0.0;
  for (const auto& step : steps) {
    forward_batch b;
    b.max_blocks_per_seq = max_blocks;
    for (std::size_t s = 0; s < seqs.size(); ++s) {
      if (step[s] == 0) continue;
      test_sequence& seq = seqs[s];
      for (std::int32_t i = 0; i < step[s]; ++i) {
        const std::int32_t pos = seq.computed + i;
        b.logit_rows.push_back(b.num_tokens());  // every row, so every position is checked
        b.tokens.push_back(seq.tokens[std::size_t(pos)]);
        b.positions.push_back(pos);
        b.slot_mapping.push_back(pagedkv::slot_id(seq.blocks[std::size_t(pos / block_size)]) * block_size + pos % block_size);
      }
      seq.computed += step[s];
      b.q_indptr.push_back(b.num_tokens());
      b.kv_lens.push_back(seq.computed);
      b.block_table.insert(b.block_table.end(), seq.blocks.begin(), seq.blocks.end());
    }
    const std::vector<float>& logits = forward(config, weights, cache, b, state);
    ASSERT_EQ(logits.size(), b.tokens.size() * std::size_t(config.vocab_size));
    std::int32_t row = 0;
    for (std::size_t s = 0; s < seqs.size(); ++s)
      for (std::int32_t i = 0; i < step[s]; ++i, ++row) {
        const std::int32_t pos = seqs[s].computed - step[s] + i;
        for (std::int64_t v = 0; v < config.vocab_size; ++v) {
          const double want = expected[s][std::size_t(pos)][std::size_t(v)];
          const double got = logits[std::size_t(row * config.vocab_size + v)];
          const double err = std::abs(got - want) / (1.0 + std::abs(want));
          max_err = std::max(max_err, err);
          ASSERT_LT(err, 1e-4) << "sequence " << s << " position " << pos << " token " << v << ": " << got
                               << " vs " << want;
        }
      }
  }
  EXPECT_GT(max_err, 0.0);  // float32 against double: exact equality would mean the check compared nothing
}

class paged_forward : public ::testing::TestWithParam<std::int32_t> {};

TEST_P(paged_forward, equals_dense_float64_forward) { check_paged_equals_dense(tiny_config(), GetParam()); }

INSTANTIATE_TEST_SUITE_P(block_sizes, paged_forward, ::testing::Values(1, 3, 16),
                         [](const auto& info) { return "block_size_" + std::to_string(info.param); });

// The scalings, on a head_dim of 8 (frequencies 1, 0.1, 0.01, 0.001; wavelengths 6.3 to 6283) and
// positions up to 14, with original contexts small enough that each formula changes some frequency.
TEST(paged_forward, rope_scaling_linear) {
  llama_config c = tiny_config();
  c.rope_scaling.type = rope_scaling_type::linear;
  c.rope_scaling.factor = 2.5;
  check_paged_equals_dense(c, 3);
}

TEST(paged_forward, rope_scaling_llama3) {
  llama_config c = tiny_config();
  c.rope_scaling.type = rope_scaling_type::llama3;
  c.rope_scaling.factor = 8.0;
  c.rope_scaling.low_freq_factor = 1.0;   // wavelengths past 256 divide by 8
  c.rope_scaling.high_freq_factor = 8.0;  // those below 32 stay; 62.8 is smoothed
  c.rope_scaling.original_context_length = 256;
  check_paged_equals_dense(c, 3);
}

TEST(paged_forward, rope_scaling_yarn) {
  llama_config c = tiny_config();
  c.rope_theta = 30.0;  // fast-turning dimensions, so that the interpolated ones still move within 15 positions
  c.rope_scaling.type = rope_scaling_type::yarn;
  c.rope_scaling.factor = 4.0;
  c.rope_scaling.original_context_length = 64;
  c.rope_scaling.beta_fast = 4.0;
  c.rope_scaling.attention_factor = 0.1 * std::log(4.0) + 1.0;
  check_paged_equals_dense(c, 3);
  c.rope_scaling.truncate = false;
  c.rope_scaling.attention_factor = 0.8;
  check_paged_equals_dense(c, 7);
}

TEST(paged_forward, rope_frequency_divisors) {
  llama_config c = tiny_config();
  c.rope_scaling.frequency_divisors = {1.0f, 1.5f, 4.0f, 8.0f};
  check_paged_equals_dense(c, 3);
}

// The attention's heads split over threads: the same logits, bit for bit, as one thread.
TEST(paged_forward, threaded_attention_equals_one_thread) {
  const llama_config config = tiny_config();
  const llama_weights weights = tiny_weights(config, 5);
  std::mt19937 rng(3);
  std::uniform_int_distribution<token_id> token(0, token_id(config.vocab_size - 1));
  // two sequences: a 9-token prefill and a 4-token one, as one step
  forward_batch b;
  b.max_blocks_per_seq = 3;
  for (std::int32_t s = 0; s < 2; ++s) {
    const std::int32_t len = s == 0 ? 9 : 4;
    for (std::int32_t pos = 0; pos < len; ++pos) {
      b.logit_rows.push_back(b.num_tokens());
      b.tokens.push_back(token(rng));
      b.positions.push_back(pos);
      b.slot_mapping.push_back(pagedkv::slot_id(s * 3 + pos / 4) * 4 + pos % 4);
    }
    b.q_indptr.push_back(b.num_tokens());
    b.kv_lens.push_back(len);
    for (block_id blk = 0; blk < 3; ++blk) b.block_table.push_back(s * 3 + blk);
  }
  std::vector<std::vector<float>> results;
  for (const std::int32_t threads : {1, 2, 3, 4, 64}) {
    paged_kv_cache cache = make_paged_kv_cache(config, 6, 4);
    forward_state state;
    state.attention_threads = threads;
    results.push_back(forward(config, weights, cache, b, state));
    results.push_back(forward(config, weights, cache, b, state));  // the pool, reused
  }
  for (const auto& r : results) EXPECT_EQ(r, results.front());
}

TEST(paged_forward, rejects_a_malformed_batch) {
  const llama_config config = tiny_config();
  const llama_weights weights = tiny_weights(config, 1);
  paged_kv_cache cache = make_paged_kv_cache(config, 4, 4);
  forward_state state;
  forward_batch b;
  b.tokens = {1, 2};
  b.positions = {0};
  b.slot_mapping = {0, 1};
  b.q_indptr = {0, 2};
  b.kv_lens = {2};
  b.block_table = {0};
  b.max_blocks_per_seq = 1;
  EXPECT_THROW(forward(config, weights, cache, b, state), pagedkv::error);
  b.positions = {0, 1};
  b.tokens = {1, 99};
  EXPECT_THROW(forward(config, weights, cache, b, state), pagedkv::error);
  b.tokens = {1, 2};
  EXPECT_NO_THROW(forward(config, weights, cache, b, state));
}

}  // namespace
