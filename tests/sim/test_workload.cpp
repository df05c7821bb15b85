#include "sim/beam_model.hpp"
#include "sim/workload.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

namespace pagedkv::sim {
namespace {

struct sample_stats {
  double mean_input = 0, mean_output = 0;
  std::int32_t max_input = 0, max_total = 0, min_input = INT32_MAX, min_output = INT32_MAX;
};

sample_stats stats_of(const trace& requests) {
  sample_stats s;
  for (const auto& r : requests) {
    s.mean_input += r.prompt_len();
    s.mean_output += r.output_len;
    s.max_input = std::max(s.max_input, r.prompt_len());
    s.max_total = std::max(s.max_total, r.prompt_len() + r.output_len);
    s.min_input = std::min(s.min_input, r.prompt_len());
    s.min_output = std::min(s.min_output, r.output_len);
  }
  s.mean_input /= double(requests.size());
  s.mean_output /= double(requests.size());
  return s;
}

// The fitted log-normals hit the paper's means: within 2% over 40k requests (the heavy tails'
// standard error at this size is under 1%).
TEST(Workload, LengthMeansMatchThePaper) {
  for (auto profile : {sharegpt_profile, alpaca_profile}) {
    workload_config config{.profile = profile, .num_requests = 40000, .seed = 7};
    auto s = stats_of(generate(config));
    EXPECT_NEAR(s.mean_input, profile.input.mean_tokens, 0.02 * profile.input.mean_tokens)
        << profile.name;
    EXPECT_NEAR(s.mean_output, profile.output.mean_tokens, 0.02 * profile.output.mean_tokens)
        << profile.name;
    EXPECT_LE(s.max_input, config.max_prompt_len);
    EXPECT_LE(s.max_total, config.max_context_len);
    EXPECT_GE(s.min_input, 1);
    EXPECT_GE(s.min_output, 1);
  }
}

TEST(Workload, FitMatchesItsOwnFormula) {
  auto fit = fit_lengths(sharegpt_profile, 1024, 2048);
  EXPECT_NEAR(detail::clamped_lognormal_mean(fit.mu_input, fit.sigma_input, 1024), 161.31, 1e-6);
  // Without the clamp the log-normal mean would be higher: the cap matters for ShareGPT.
  EXPECT_GT(std::exp(fit.mu_input + fit.sigma_input * fit.sigma_input / 2), 161.31);
}

TEST(Workload, SameSeedSameTraceOtherSeedOtherTrace) {
  workload_config config{.profile = alpaca_profile, .num_requests = 200, .arrival_rate_per_step = 0.5};
  auto a = generate(config), b = generate(config);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].prompt, b[i].prompt);
    EXPECT_EQ(a[i].output_len, b[i].output_len);
    EXPECT_EQ(a[i].arrival_step, b[i].arrival_step);
    EXPECT_EQ(a[i].seed, b[i].seed);
  }
  config.seed = 2;
  EXPECT_NE(generate(config)[0].prompt, a[0].prompt);
}

TEST(Workload, PoissonArrivalsHaveTheRequestedRate) {
  workload_config config{.profile = alpaca_profile, .num_requests = 20000, .arrival_rate_per_step = 0.25};
  auto requests = generate(config);
  EXPECT_TRUE(std::ranges::is_sorted(requests, {}, &request::arrival_step));
  double rate = double(requests.size()) / double(requests.back().arrival_step + 1);
  EXPECT_NEAR(rate, 0.25, 0.01);
  // Saturation: rate 0 puts everything at step 0.
  config.arrival_rate_per_step = 0;
  for (const auto& r : generate(config)) ASSERT_EQ(r.arrival_step, 0);
}

TEST(Workload, SharedPrefixAndGroups) {
  workload_config config{.profile = sharegpt_profile, .num_requests = 500,
                         .shared_prefix_len = 80, .num_samples = 4};
  auto requests = generate(config);
  for (const auto& r : requests) {
    ASSERT_GT(r.prompt_len(), 80);
    ASSERT_TRUE(std::equal(r.prompt.begin(), r.prompt.begin() + 80, requests[0].prompt.begin()));
    ASSERT_LE(r.prompt_len(), config.max_prompt_len);
    ASSERT_LE(r.prompt_len() + r.max_output_len, config.max_context_len);
    ASSERT_EQ(r.num_sequences(), 4);
  }
  // Distinct requests do not share anything past the prefix (32000-token vocabulary).
  EXPECT_NE(requests[0].prompt[80], requests[1].prompt[80]);

  // The prefix variant is its base workload with the prefix prepended.
  workload_config base = config;
  base.shared_prefix_len = 0;
  auto plain = generate(base);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    if (plain[i].prompt_len() + 80 > config.max_prompt_len) continue;  // clamped differently
    ASSERT_TRUE(std::equal(plain[i].prompt.begin(), plain[i].prompt.end(),
                           requests[i].prompt.begin() + 80));
    ASSERT_EQ(plain[i].seed, requests[i].seed);
  }

  auto split = split_groups(requests);
  ASSERT_EQ(split.size(), 4 * requests.size());
  for (std::size_t i = 0; i < split.size(); ++i) {
    EXPECT_EQ(split[i].id, i);
    EXPECT_EQ(split[i].num_sequences(), 1);
    EXPECT_EQ(split[i].prompt, requests[i / 4].prompt);
  }
}

TEST(Workload, OutputCapBoundsOutputsAndMaxReservation) {
  workload_config config{.profile = sharegpt_profile, .num_requests = 2000, .max_output_cap = 256};
  for (const auto& r : generate(config)) {
    ASSERT_LE(r.output_len, 256);
    ASSERT_LE(r.max_output_len, 256);
    ASSERT_GE(r.max_output_len, r.output_len);
  }
}

TEST(Workload, InconsistentConfigIsRejected) {
  EXPECT_THROW(generate({.shared_prefix_len = 1024}), error);
  EXPECT_THROW(generate({.num_samples = 2, .beam_width = 2}), error);
  EXPECT_THROW(fit_lengths(sharegpt_profile, 2048, 2048), error);
}

TEST(BeamModel, ParentsAreSortedInRangeAndDeterministic) {
  for (std::int32_t width : {1, 2, 4, 6}) {
    beam_model a(width, 99), b(width, 99);
    auto first = a.step();
    (void)b.step();
    ASSERT_EQ(std::ssize(first), width);
    for (auto p : first) EXPECT_EQ(p, 0);  // everything forks from the prompt
    for (int step = 0; step < 500; ++step) {
      auto pa = a.step();
      auto pb = b.step();
      ASSERT_EQ(std::ssize(pa), width);
      ASSERT_TRUE(std::ranges::equal(pa, pb));
      ASSERT_TRUE(std::ranges::is_sorted(pa));
      ASSERT_GE(pa.front(), 0);
      ASSERT_LT(pa.back(), width);
    }
  }
}

// Beams do fork and die (the point of the model), but not every step: over many steps of width 4
// some steps keep all parents and some collapse onto one.
TEST(BeamModel, BeamsForkAndDie) {
  beam_model model(4, 5);
  (void)model.step();
  int steps_with_death = 0, steps_all_from_one = 0;
  constexpr int steps = 5000;
  for (int step = 0; step < steps; ++step) {
    auto parents = model.step();
    std::set<std::int32_t> distinct(parents.begin(), parents.end());
    steps_with_death += distinct.size() < 4;
    steps_all_from_one += distinct.size() == 1;
  }
  EXPECT_GT(steps_with_death, steps / 10);
  EXPECT_LT(steps_with_death, steps);
  EXPECT_GT(steps_all_from_one, 0);
}

TEST(BeamModel, PlanFreesForksAndContinues) {
  std::vector<std::int32_t> parents{0, 0, 0, 2};  // beam 0 triples, 1 and 3 die, 2 continues
  auto plan = plan_beam_step(parents, 4);
  EXPECT_EQ(plan.continued_from, (std::vector<std::int32_t>{0, -1, -1, 2}));
  EXPECT_EQ(plan.forks, (std::vector<std::pair<std::int32_t, std::int32_t>>{{0, 1}, {0, 2}}));
  EXPECT_EQ(plan.freed, (std::vector<std::int32_t>{1, 3}));
  // Live beams are conserved: continued + forked = new beams, continued + freed = old beams.
  beam_model model(6, 3);
  std::int32_t old = model.num_beams();
  for (int step = 0; step < 200; ++step) {
    auto p = plan_beam_step(model.step(), old);
    auto continued = std::ranges::count_if(p.continued_from, [](auto c) { return c >= 0; });
    ASSERT_EQ(continued + std::ssize(p.forks), 6);
    ASSERT_EQ(continued + std::ssize(p.freed), old);
    old = model.num_beams();
  }
  std::vector<std::int32_t> unsorted{1, 0};
  EXPECT_THROW(plan_beam_step(unsorted, 2), error);
  std::vector<std::int32_t> out_of_range{0, 2};
  EXPECT_THROW(plan_beam_step(out_of_range, 2), error);
}

}  // namespace
}  // namespace pagedkv::sim
