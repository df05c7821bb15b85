// The one definition of sampling (examples/llama/sampling.hpp), which model_backend's default runs
// on the host and the CUDA backend on the GPU: greedy is the argmax with the lowest id on a tie;
// top-k, then top-p, keep what the engine's sampler always kept; the inverse CDF over the kept
// tokens gives each exactly its probability; candidates are the ranking's head. Checked against a
// reference written here from the definition's words (a full stable sort), on random rows of odd
// sizes, rows of ties, and the edges (top_k 1, top_k past the vocabulary, a tiny top_p).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include <pagedkv/error.hpp>

#include "sampling.hpp"

namespace {

using namespace pagedkv::llama;
using pagedkv::token_id;

/// Random logits; with `levels` > 0 they take only that many values, so ties are everywhere.
std::vector<float> random_row(std::mt19937& rng, std::int64_t vocab, int levels = 0) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_int_distribution<int> level(0, std::max(levels - 1, 0));
  std::vector<float> row(static_cast<std::size_t>(vocab));
  for (float& x : row) x = levels > 0 ? float(level(rng)) * 0.5f : normal(rng);
  return row;
}

/// The kept tokens and their probabilities, from the definition's words: stable-sort by logit
/// (ties stay in id order), cut to top_k, then to the shortest prefix reaching top_p.
std::map<token_id, double> reference_kept(const std::vector<float>& l, const row_sampling& s) {
  std::vector<token_id> order(l.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](token_id a, token_id b) { return l[a] > l[b]; });
  if (s.temperature <= 0.0f || s.top_k == 1) return {{order[0], 1.0}};
  if (s.top_k > 0 && std::size_t(s.top_k) < order.size()) order.resize(std::size_t(s.top_k));
  std::vector<double> w;
  for (const token_id t : order) w.push_back(std::exp((double(l[t]) - double(l[order[0]])) / s.temperature));
  const double all = std::accumulate(w.begin(), w.end(), 0.0);
  std::size_t cut = 0;
  for (double mass = 0.0; cut < order.size() && (cut == 0 || mass < double(s.top_p) * all); ++cut) mass += w[cut];
  double kept = 0.0;
  for (std::size_t i = 0; i < cut; ++i) kept += w[i];
  std::map<token_id, double> p;
  for (std::size_t i = 0; i < cut; ++i) p[order[i]] = w[i] / kept;
  return p;
}

double log_sum_exp(const std::vector<float>& l) {
  const double m = *std::max_element(l.begin(), l.end());
  double sum = 0.0;
  for (const float x : l) sum += std::exp(double(x) - m);
  return m + std::log(sum);
}

/// Draws the row at `grid` evenly spaced uniforms; returns how often each token came.
std::map<token_id, int> draw_grid(const std::vector<float>& l, const row_sampling& s, int grid) {
  std::vector<double> u(static_cast<std::size_t>(grid));
  for (int i = 0; i < grid; ++i) u[std::size_t(i)] = (i + 0.5) / grid;
  std::vector<sampled_token> draws(u.size());
  sample_row(l, s, u, draws, {});
  const double lse = log_sum_exp(l);
  std::map<token_id, int> counts;
  for (const sampled_token& d : draws) {
    ++counts[d.token];
    EXPECT_NEAR(d.logprob, double(l[std::size_t(d.token)]) - lse, 1e-9) << "at temperature 1 over the whole row";
  }
  return counts;
}

/// Every kept token comes as often as its probability says (within the grid's step), no other.
void expect_distribution(const std::vector<float>& l, const row_sampling& s) {
  constexpr int grid = 20000;
  const std::map<token_id, double> p = reference_kept(l, s);
  const std::map<token_id, int> counts = draw_grid(l, s, grid);
  for (const auto& [token, n] : counts) EXPECT_TRUE(p.contains(token)) << "token " << token << " is not kept";
  for (const auto& [token, prob] : p) {
    const auto it = counts.find(token);
    const double freq = it == counts.end() ? 0.0 : double(it->second) / grid;
    EXPECT_NEAR(freq, prob, 1.5 / grid) << "token " << token;
  }
}

TEST(sampling, greedy_is_the_first_largest_logit) {
  std::mt19937 rng(11);
  for (const std::int64_t vocab : {1, 2, 7, 33, 1001}) {
    for (const int levels : {0, 2, 3}) {
      const std::vector<float> l = random_row(rng, vocab, levels);
      const auto best = token_id(std::max_element(l.begin(), l.end()) - l.begin());  // the first maximum
      for (const row_sampling s : {row_sampling{.temperature = 0.0f, .num_draws = 2},
                                   row_sampling{.temperature = -1.0f, .top_p = 0.01f, .num_draws = 2},
                                   row_sampling{.temperature = 5.0f, .top_k = 1, .num_draws = 2}}) {
        std::vector<sampled_token> d(2);
        const std::vector<double> u = {0.0, 0.999};
        sample_row(l, s, u, d, {});
        EXPECT_EQ(d[0].token, best);
        EXPECT_EQ(d[1].token, best) << "the uniform does not matter";
        EXPECT_NEAR(d[0].logprob, double(l[std::size_t(best)]) - log_sum_exp(l), 1e-9);
      }
    }
  }
}

TEST(sampling, each_kept_token_comes_with_its_probability) {
  std::mt19937 rng(12);
  for (const std::int64_t vocab : {1, 2, 7, 33, 257}) {
    for (const int levels : {0, 3}) {
      for (const float temperature : {0.4f, 1.0f, 2.5f}) {
        for (const std::int32_t top_k : {0, 2, 5, 1000}) {
          for (const float top_p : {1e-6f, 0.3f, 0.9f, 1.0f}) {
            const std::vector<float> l = random_row(rng, vocab, levels);
            SCOPED_TRACE(testing::Message() << "vocab " << vocab << " levels " << levels << " temperature "
                                            << temperature << " top_k " << top_k << " top_p " << top_p);
            expect_distribution(l, {.temperature = temperature, .top_k = top_k, .top_p = top_p});
          }
        }
      }
    }
  }
}

TEST(sampling, the_edges_keep_what_the_definition_says) {
  const std::vector<float> ties = {1.0f, 5.0f, 5.0f, 5.0f, 2.0f};
  // top_k cuts ties by id: of the three 5s, the first two.
  EXPECT_EQ(draw_grid(ties, {.temperature = 1.0f, .top_k = 2}, 1000), (std::map<token_id, int>{{1, 500}, {2, 500}}));
  // top_p cuts ties by id too: half the mass of three equal tokens (and two tiny ones) needs two.
  const auto half = draw_grid(ties, {.temperature = 0.01f, .top_p = 0.5f}, 1000);
  EXPECT_EQ(half, (std::map<token_id, int>{{1, 500}, {2, 500}}));
  // A tiny top_p keeps the argmax, the first of equal maxima.
  EXPECT_EQ(draw_grid(ties, {.temperature = 3.0f, .top_p = 1e-7f}, 100), (std::map<token_id, int>{{1, 100}}));
  // top_k past the vocabulary keeps everything.
  expect_distribution(ties, {.temperature = 2.0f, .top_k = 99});
  // The inverse CDF walks kept tokens in id order: u = 0 takes the lowest kept id, u near 1 the highest.
  std::vector<sampled_token> d(2);
  const std::vector<double> u = {0.0, 1.0 - 1e-12};
  sample_row(ties, {.temperature = 1.0f, .top_k = 3, .num_draws = 2}, u, d, {});
  EXPECT_EQ(d[0].token, 1);
  EXPECT_EQ(d[1].token, 3);
  // One token: every draw takes it.
  sample_row(std::vector<float>{-3.0f}, {.temperature = 1.0f, .top_p = 0.5f, .num_draws = 2}, u, d, {});
  EXPECT_EQ(d[0].token, 0);
  EXPECT_EQ(d[1].token, 0);
  EXPECT_NEAR(d[0].logprob, 0.0, 1e-12);
}

TEST(sampling, candidates_are_the_head_of_the_ranking) {
  std::mt19937 rng(13);
  for (const std::int64_t vocab : {1, 3, 17, 300}) {
    for (const int levels : {0, 4}) {
      const std::vector<float> l = random_row(rng, vocab, levels);
      std::vector<token_id> order(l.size());
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](token_id a, token_id b) { return l[a] > l[b]; });
      const auto count = std::size_t(std::min<std::int64_t>(vocab, 8));
      std::vector<sampled_token> c(count);
      sample_row(l, {.num_draws = 0, .num_candidates = std::int32_t(count)}, {}, {}, c);
      for (std::size_t i = 0; i < count; ++i) {
        EXPECT_EQ(c[i].token, order[i]) << "vocab " << vocab << " candidate " << i;
        EXPECT_NEAR(c[i].logprob, double(l[std::size_t(order[i])]) - log_sum_exp(l), 1e-9);
      }
    }
  }
}

TEST(sampling, rows_are_sampled_independently_of_their_batch) {
  std::mt19937 rng(14);
  constexpr std::int64_t vocab = 41;
  sampling_batch batch;
  std::vector<float> logits;
  for (int r = 0; r < 6; ++r) {
    const std::vector<float> row = random_row(rng, vocab, r % 2 ? 5 : 0);
    logits.insert(logits.end(), row.begin(), row.end());
    batch.rows.push_back({.temperature = 0.5f * float(r), .top_k = r, .top_p = r % 3 ? 0.8f : 1.0f,
                          .num_draws = r % 3, .num_candidates = r});
    for (int d = 0; d < r % 3; ++d) batch.uniforms.push_back(request_uniform(std::uint64_t(r), d, 0));
  }
  std::vector<sampled_token> draws, candidates;
  const step_samples all = sample_rows(logits, vocab, batch, draws, candidates);
  ASSERT_EQ(all.draws.size(), batch.uniforms.size());
  std::size_t d = 0, c = 0;
  for (std::size_t r = 0; r < batch.rows.size(); ++r) {  // each row alone gives what it gave in the batch
    const row_sampling& s = batch.rows[r];
    sampling_batch one{.rows = {s}, .uniforms = {batch.uniforms.begin() + std::ptrdiff_t(d),
                                                 batch.uniforms.begin() + std::ptrdiff_t(d) + s.num_draws}};
    std::vector<sampled_token> d1, c1;
    const step_samples alone = sample_rows(std::span(logits).subspan(r * vocab, vocab), vocab, one, d1, c1);
    for (std::size_t i = 0; i < alone.draws.size(); ++i) EXPECT_EQ(alone.draws[i].token, all.draws[d + i].token);
    for (std::size_t i = 0; i < alone.candidates.size(); ++i)
      EXPECT_EQ(alone.candidates[i].token, all.candidates[c + i].token);
    d += std::size_t(s.num_draws);
    c += std::size_t(s.num_candidates);
  }
}

TEST(sampling, request_uniforms_are_a_function_of_their_place) {
  std::set<double> seen;
  double sum = 0.0;
  for (std::int32_t sample = 0; sample < 10; ++sample)
    for (std::int32_t token = 0; token < 1000; ++token) {
      const double u = request_uniform(42, sample, token);
      ASSERT_GE(u, 0.0);
      ASSERT_LT(u, 1.0);
      EXPECT_EQ(u, request_uniform(42, sample, token));
      seen.insert(u);
      sum += u;
    }
  EXPECT_EQ(seen.size(), 10000u) << "every (sample, token) draws its own uniform";
  EXPECT_NEAR(sum / 10000, 0.5, 0.01);  // the mean of 10^4 uniforms: std 0.003
  EXPECT_NE(request_uniform(42, 0, 0), request_uniform(43, 0, 0));
  EXPECT_NE(request_uniform(42, 1, 0), request_uniform(42, 0, 1));
}

TEST(sampling, bad_batches_are_refused_naming_the_problem) {
  const std::vector<float> logits(8, 0.0f);  // two rows of 4
  std::vector<sampled_token> d, c;
  const auto refused = [&](const sampling_batch& b, const char* what) {
    try {
      (void)sample_rows(logits, 4, b, d, c);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const pagedkv::error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  const row_sampling ok{.num_draws = 1};
  refused({.rows = {ok}, .uniforms = {0.5}}, "1 row specs for 2");
  refused({.rows = {ok, ok}, .uniforms = {0.5}}, "1 uniforms for 2 draws");
  refused({.rows = {ok, ok}, .uniforms = {0.5, 1.0}}, "uniform 1 is 1");
  refused({.rows = {ok, {.num_candidates = 5}}, .uniforms = {0.5, 0.5}}, "num_candidates 5 (at most 4)");
  refused({.rows = {ok, {.top_p = 0.0f}}, .uniforms = {0.5, 0.5}}, "sampling row 1");
  refused({.rows = {ok, {.top_k = -1}}, .uniforms = {0.5, 0.5}}, "top_k -1");
  refused({.rows = {ok, {.num_draws = -1}}, .uniforms = {0.5}}, "num_draws -1");
  EXPECT_THROW((void)sample_rows(std::span(logits).first(7), 4, {.rows = {ok, ok}, .uniforms = {0.1, 0.2}}, d, c),
               pagedkv::error);
}

}  // namespace
