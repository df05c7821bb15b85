// The --bench workload generator: one seed, one workload; every length inside its limits over a
// sweep of odd limits; the means of the simulator's ShareGPT-like fit (docs/simulation.md) within
// 2% over 40k requests, at full and at quarter scale; a shared prefix that leaves the rest alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include <pagedkv/error.hpp>

#include "bench_workload.hpp"

namespace {

using namespace pagedkv::llama;
using pagedkv::token_id;

bool same(const std::vector<bench_request>& a, const std::vector<bench_request>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].prompt != b[i].prompt || a[i].output_tokens != b[i].output_tokens) return false;
  return true;
}

TEST(bench_workload, a_seed_names_one_workload) {
  const bench_workload_options o{.num_requests = 50, .vocab_size = 49152, .seed = 7};
  EXPECT_TRUE(same(make_bench_workload(o), make_bench_workload(o)));
  bench_workload_options other = o;
  other.seed = 8;
  EXPECT_FALSE(same(make_bench_workload(o), make_bench_workload(other)));
  EXPECT_EQ(make_bench_workload(o).size(), 50u);
  EXPECT_TRUE(make_bench_workload({.num_requests = 0}).empty());
}

TEST(bench_workload, lengths_and_tokens_stay_inside_the_limits) {
  for (const std::int32_t max_prompt : {1, 2, 7, 300})
    for (const std::int32_t context : {2, 9, 64, 2048})
      for (const std::int32_t max_output : {1, 5, 2048})
        for (const std::int32_t prefix : {0, 3})
          for (const double scale : {0.25, 1.0, 8.0}) {
            const std::int32_t prompt_cap = std::min(max_prompt, context - 1);
            if (prefix >= prompt_cap) continue;
            const bench_workload_options o{.num_requests = 200, .max_prompt_tokens = max_prompt,
                                           .max_output_tokens = max_output, .context_tokens = context,
                                           .shared_prefix_tokens = prefix, .vocab_size = 17,
                                           .length_scale = scale, .seed = 3};
            const std::vector<bench_request> w = make_bench_workload(o);
            SCOPED_TRACE(testing::Message() << "max_prompt " << max_prompt << ", context " << context
                                            << ", max_output " << max_output << ", prefix " << prefix << ", scale " << scale);
            bool some_at_the_prompt_cap = false;
            for (const bench_request& r : w) {
              const auto len = std::int32_t(r.prompt.size());
              ASSERT_GE(len, prefix + 1);
              ASSERT_LE(len, prompt_cap);
              ASSERT_TRUE(std::equal(w[0].prompt.begin(), w[0].prompt.begin() + prefix, r.prompt.begin()));
              for (const token_id t : r.prompt) ASSERT_TRUE(t >= 0 && t < 17) << t;
              ASSERT_GE(r.output_tokens, 1);
              ASSERT_LE(r.output_tokens, std::min(max_output, context - len));
              some_at_the_prompt_cap |= len == prompt_cap;
            }
            // The clamps are reached, not just respected: a heavy tail hits a small cap.
            if (prompt_cap - prefix <= 7 && scale >= 1.0) {
              EXPECT_TRUE(some_at_the_prompt_cap);
            }
          }
}

struct length_stats {
  double mean_prompt = 0, mean_output = 0, median_prompt = 0;
};

length_stats stats(const std::vector<bench_request>& w) {
  length_stats s;
  std::vector<double> prompts;
  for (const bench_request& r : w) {
    prompts.push_back(double(r.prompt.size()));
    s.mean_prompt += double(r.prompt.size());
    s.mean_output += r.output_tokens;
  }
  s.mean_prompt /= double(w.size());
  s.mean_output /= double(w.size());
  std::nth_element(prompts.begin(), prompts.begin() + std::ptrdiff_t(prompts.size() / 2), prompts.end());
  s.median_prompt = prompts[prompts.size() / 2];
  return s;
}

// The simulator's limits (prompts <= 1024, context 2048) give the paper's means, 161.31 prompt and
// 337.99 output tokens (docs/simulation.md); the standard error of each mean over 40k requests is
// under 0.7%, so 2% is three of them. The median prompt (e^4.6147 = 101) checks sigma as well.
TEST(bench_workload, means_match_the_simulator_fit_within_two_percent) {
  const std::vector<bench_request> w = make_bench_workload(
      {.num_requests = 40000, .max_prompt_tokens = 1024, .max_output_tokens = 2048, .context_tokens = 2048,
       .vocab_size = 49152, .seed = 1});
  const length_stats s = stats(w);
  EXPECT_NEAR(s.mean_prompt, 161.31, 0.02 * 161.31);
  EXPECT_NEAR(s.mean_output, 337.99, 0.02 * 337.99);
  EXPECT_NEAR(s.median_prompt, 101.0, 0.05 * 101.0);
}

// Scaling every length and limit by a quarter scales the clamped means by a quarter (up to rounding
// to whole tokens): the --bench defaults keep the distribution's shape.
TEST(bench_workload, a_quarter_scale_with_quarter_limits_gives_quarter_means) {
  const std::vector<bench_request> w = make_bench_workload(
      {.num_requests = 40000, .max_prompt_tokens = 256, .max_output_tokens = 512, .context_tokens = 512,
       .vocab_size = 49152, .length_scale = 0.25, .seed = 2});
  const length_stats s = stats(w);
  EXPECT_NEAR(s.mean_prompt, 161.31 / 4, 0.02 * 161.31 / 4);
  EXPECT_NEAR(s.mean_output, 337.99 / 4, 0.02 * 337.99 / 4);
  EXPECT_NEAR(s.median_prompt, 101.0 / 4, 0.06 * 101.0 / 4);
}

// The prefix comes from a stream of its own: adding one leaves each request's own tokens and its
// output length as they were, unless a clamp moved them.
TEST(bench_workload, a_shared_prefix_changes_nothing_else) {
  bench_workload_options o{.num_requests = 300, .max_prompt_tokens = 4096, .max_output_tokens = 100000,
                           .context_tokens = 100000, .vocab_size = 49152, .seed = 5};
  const std::vector<bench_request> plain = make_bench_workload(o);
  o.shared_prefix_tokens = 40;
  const std::vector<bench_request> prefixed = make_bench_workload(o);
  for (std::size_t i = 0; i < plain.size(); ++i) {
    ASSERT_EQ(prefixed[i].prompt.size(), plain[i].prompt.size() + 40);
    EXPECT_TRUE(std::equal(plain[i].prompt.begin(), plain[i].prompt.end(), prefixed[i].prompt.begin() + 40));
    EXPECT_TRUE(std::equal(prefixed[0].prompt.begin(), prefixed[0].prompt.begin() + 40, prefixed[i].prompt.begin()));
    EXPECT_EQ(prefixed[i].output_tokens, plain[i].output_tokens);
  }
}

TEST(bench_workload, limits_that_leave_no_room_are_refused) {
  const auto refused = [](bench_workload_options o) {
    try {
      make_bench_workload(o);
    } catch (const pagedkv::error& e) {
      return e.code() == pagedkv::errc::invalid_argument;
    }
    return false;
  };
  EXPECT_TRUE(refused({.max_prompt_tokens = 8, .shared_prefix_tokens = 8}));
  EXPECT_TRUE(refused({.context_tokens = 9, .shared_prefix_tokens = 8}));  // no room for an output after the prefix
  EXPECT_TRUE(refused({.context_tokens = 1}));
  EXPECT_TRUE(refused({.max_prompt_tokens = 0}));
  EXPECT_TRUE(refused({.max_output_tokens = 0}));
  EXPECT_TRUE(refused({.shared_prefix_tokens = -1}));
  EXPECT_TRUE(refused({.vocab_size = 0}));
  EXPECT_TRUE(refused({.length_scale = 0.0}));
  EXPECT_TRUE(refused({.num_requests = -1}));
  EXPECT_FALSE(refused({.max_prompt_tokens = 8, .shared_prefix_tokens = 7}));
}

}  // namespace
