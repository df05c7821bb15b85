// run_bench on the tiny random-weight model: the counts it reports are the workload's (every
// request generates exactly its drawn length, EOS ignored), the KV figures are the engine's, and the
// progress lines and the printed report have the shape the CLI's smoke test expects.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdio>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include <pagedkv/error.hpp>

#include "bench.hpp"
#include "tiny_llama.hpp"

namespace {

using namespace pagedkv::llama;
using namespace pagedkv::llama::test;

const tiny_model& model() { return shared_tiny_model(); }

std::vector<bench_request> workload() {
  return make_bench_workload({.num_requests = 6, .max_prompt_tokens = 40, .max_output_tokens = 12,
                              .context_tokens = int(model().config.context_length), .shared_prefix_tokens = 8,
                              .vocab_size = int(model().config.vocab_size), .length_scale = 0.25, .seed = 4});
}

/// A pool of 24 blocks of 4 tokens that the six requests overflow (preemption), prefill chunked
/// at 16 tokens a step (so later prompts find the shared prefix cached), and as EOS the first
/// token that request 0 generates greedily, so that only ignoring EOS lets it reach its length.
engine_options options() {
  engine_options o{.block_size = 4, .num_blocks = 24, .max_tokens_per_step = 16};
  engine probe(model().config, model().weights, nullptr, o);
  const auto id = probe.add_request(workload()[0].prompt, {.max_tokens = 1});
  probe.run();
  o.eos_id = probe.result(id).completions.at(0).tokens.at(0);
  return o;
}

// The value on the report line that starts with `label` (the label and the spaces after it cut),
// or "" when no line does. (std::regex here trips GCC 12's -Wmaybe-uninitialized under ASan.)
std::string value_of(const std::string& report, const std::string& label) {
  std::istringstream in(report);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(label + " ", 0) == 0) {
      const std::size_t start = line.find_first_not_of(' ', label.size());
      return start == std::string::npos ? "" : line.substr(start);
    }
  return "";
}

TEST(run_bench, reports_the_workload_and_the_engine) {
  const std::vector<bench_request> w = workload();
  engine e(model().config, model().weights, nullptr, options());
  std::FILE* progress = std::tmpfile();
  ASSERT_NE(progress, nullptr);
  const bench_result r = run_bench(e, w, {}, progress);

  EXPECT_EQ(r.num_requests, 6);
  EXPECT_EQ(r.num_rejected, 0);
  const auto prompt_tokens = std::accumulate(w.begin(), w.end(), std::int64_t{0},
                                             [](std::int64_t n, const bench_request& q) { return n + std::int64_t(q.prompt.size()); });
  const auto output_tokens = std::accumulate(w.begin(), w.end(), std::int64_t{0},
                                             [](std::int64_t n, const bench_request& q) { return n + q.output_tokens; });
  EXPECT_EQ(r.prompt_tokens, prompt_tokens);
  EXPECT_EQ(r.output_tokens, output_tokens);
  std::int32_t longest = 0;
  for (const bench_request& q : w) longest = std::max(longest, q.output_tokens);
  EXPECT_GE(r.num_steps, longest);
  EXPECT_GT(r.seconds, 0.0);
  EXPECT_DOUBLE_EQ(r.output_tokens_per_s(), double(output_tokens) / r.seconds);
  EXPECT_DOUBLE_EQ(r.total_tokens_per_s(), double(prompt_tokens + output_tokens) / r.seconds);

  // Every step is a decode-only step of some batch bucket or a step with prompt tokens; their
  // times add up to at most the run's.
  std::int64_t classified = r.prefill_steps.num_steps;
  double classified_s = r.prefill_steps.seconds;
  for (const bench_result::decode_bucket& b : r.decode_buckets) {
    classified += b.num_steps;
    classified_s += b.mean_step_s * double(b.num_steps);
  }
  EXPECT_EQ(classified, r.num_steps);
  EXPECT_LE(classified_s, r.seconds * (1 + 1e-9));
  EXPECT_GT(r.prefill_steps.num_steps, 0);
  EXPECT_GE(r.prefill_steps.mean_tokens, 1.0);
  EXPECT_GT(r.decode_buckets[0].num_steps, 0);  // the last request's tokens: a batch of 1

  EXPECT_EQ(r.num_kv_blocks, 24);
  EXPECT_GT(r.mean_kv_usage, 0.0);
  EXPECT_LE(r.mean_kv_usage, r.peak_kv_usage);
  EXPECT_LE(r.peak_kv_usage, 1.0);
  EXPECT_GT(r.peak_kv_usage, 0.5);  // six requests of up to 52 tokens in 96 slots
  EXPECT_GT(r.mean_slot_fill, 0.0);
  EXPECT_LE(r.mean_slot_fill, 1.0);
  EXPECT_GT(r.prefix_hit_rate, 0.0);
  const pagedkv::kv_cache_usage u = e.kv_usage();
  EXPECT_EQ(r.prefix_hit_rate, u.prefix_hit_rate + u.partial_hit_rate + u.shared_hit_rate);
  // Every prompt token looked up (re-admissions after a preemption too) is a hit or has a reason.
  std::int64_t explained = r.prefix_misses.num_hit_tokens + r.prefix_misses.num_partial_hit_tokens +
                           r.prefix_misses.num_shared_tokens;
  for (std::int64_t n : r.prefix_misses.missed_tokens) explained += n;
  EXPECT_EQ(explained, r.prefix_misses.num_prompt_tokens);
  EXPECT_GE(r.prefix_misses.num_prompt_tokens, prompt_tokens);
  EXPECT_GT(r.prefix_misses.missed(pagedkv::miss_reason::partial_block), 0);
  EXPECT_GT(r.num_preemptions, 0);
  EXPECT_EQ(r.num_preemptions, e.num_preemptions());

  // Not a terminal: a line per tenth of the requests (here every one), the last one all of them.
  std::rewind(progress);
  std::vector<std::string> lines;
  for (char line[256]; std::fgets(line, sizeof line, progress);) lines.emplace_back(line);
  std::fclose(progress);
  ASSERT_FALSE(lines.empty());
  EXPECT_LE(lines.size(), 6u);
  EXPECT_EQ(lines.back().rfind("bench: 6/6 requests finished, step ", 0), 0u) << lines.back();

  std::ostringstream printed;
  print_bench_result(printed, r);
  for (const char* name : {"requests/s", "output tokens/s", "total tokens/s", "KV slot fill", "prefix hit rate",
                           "preemptions"}) {
    const std::string value = value_of(printed.str(), name);
    EXPECT_TRUE(!value.empty() && std::isdigit(static_cast<unsigned char>(value[0]))) << name << "\n" << printed.str();
  }
  EXPECT_EQ(value_of(printed.str(), "decode batch").rfind("1-7 ", 0), 0u) << printed.str();
  EXPECT_NE(value_of(printed.str(), "prefill steps").find(" of the run"), std::string::npos) << printed.str();
  const std::string misses = value_of(printed.str(), "prefix misses");
  EXPECT_NE(misses.find("partial_block "), std::string::npos) << printed.str();
  const std::string usage = value_of(printed.str(), "KV cache usage");
  EXPECT_EQ(usage.rfind("mean ", 0), 0u) << printed.str();
  EXPECT_NE(usage.find("%, peak "), std::string::npos) << printed.str();
}

TEST(run_bench, needs_an_idle_engine) {
  engine e(model().config, model().weights, nullptr, {.block_size = 4, .num_blocks = 64});
  e.add_request({1, 2, 3}, {});
  EXPECT_THROW(run_bench(e, workload(), {}, nullptr), pagedkv::error);
}

}  // namespace
